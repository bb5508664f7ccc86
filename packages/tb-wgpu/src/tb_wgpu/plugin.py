"""Entry-point module of the ``wgpu`` engine. It imports cheaply: no torch or wgpu at top level."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torchburn

PLUGIN_API_VERSION = 1

# Priority when the adapter is a real GPU, and when it is a CPU rasterizer such as lavapipe
# (slower than the CPU engines, so it is only chosen by name or when nothing else is there).
GPU_PRIORITY = 40
SOFTWARE_PRIORITY = 5


class WgpuEngine(torchburn.Engine):
    name = "wgpu"
    device = "gpu"
    distribution = "tb-wgpu"

    # Selection reads what the adapter is (tb_wgpu.adapters: enumerated once, remembered across
    # processes); the device is opened only when a partition is compiled.
    @property
    def priority(self) -> int:  # type: ignore[override]
        from tb_wgpu.adapters import adapter_info

        adapter, _ = adapter_info()
        if adapter is None:
            return 0
        return SOFTWARE_PRIORITY if adapter.is_software else GPU_PRIORITY

    def is_available(self) -> torchburn.Availability:
        from tb_wgpu.adapters import adapter_info

        adapter, reason = adapter_info()
        return torchburn.Availability(adapter is not None, reason)

    def describe(self) -> dict[str, Any]:
        from tb_wgpu import describe

        return describe()

    def covered_ops(self) -> set[str]:
        from tb_wgpu.support import RULES

        return set(RULES)

    def check(self, node: torchburn.NodeInfo) -> str | None:
        from tb_wgpu.support import check

        return check(node)

    def compile(self, plan: torchburn.Plan) -> Callable[..., Any]:
        from tb_wgpu.compiler import compile_plan

        return compile_plan(plan)

    def serialize(self, compiled: Callable[..., Any], plan: torchburn.Plan) -> bytes | None:
        return None  # pipelines live in the device; the plan is recompiled in a new process

    def deserialize(self, payload: bytes, plan: torchburn.Plan) -> Callable[..., Any] | None:
        return None


@torchburn.hookimpl
def tb_register_engines() -> list[Any]:
    return [WgpuEngine]


@torchburn.hookimpl
def tb_register_llm_backends() -> list[Any]:
    from torchburn.llm import LLMBackend

    return [
        LLMBackend(
            name="wgpu",
            engine="wgpu",
            device="gpu",
            load=_load_llm_backend,
            priority=GPU_PRIORITY,
            description="whole decode step (all layers, int8/int4 dequantized in-shader, device KV cache) "
            "as one WebGPU command buffer per token",
            protocol_version=2,  # torchburn.llm.protocol, the version this backend implements
        )
    ]


def _load_llm_backend() -> Any:
    """Lazy: opens the adapter only when tb-llm picks this backend; raises when there is none."""
    from tb_wgpu.device import WgpuUnavailableError, probe

    ctx, reason = probe()
    if ctx is None:
        raise WgpuUnavailableError(f"the wgpu LLM backend needs a WebGPU adapter: {reason}")
    from tb_wgpu.llm import backend_class

    return backend_class()()
