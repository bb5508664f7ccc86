"""Entry-point module. It imports cheaply: torch is only imported inside the hooks."""

from __future__ import annotations

from typing import Any

import torchburn

PLUGIN_API_VERSION = 1


class ExampleEngine(torchburn.Engine):
    name = "example"
    device = "cpu"
    priority = 0
    distribution = "tb-example-engine"


@torchburn.hookimpl
def tb_register_engines() -> list[Any]:
    return [ExampleEngine]


@torchburn.hookimpl
def tb_register_kernels(registry: torchburn.KernelRegistry) -> None:
    from tb_example_engine.kernels import KERNEL_PACK, KERNELS

    checker = torchburn.accepts((_float32(),))
    for op, fn in KERNELS.items():
        registry.register("example", op, fn, checker, source="tb-example-engine")
    # the same hook extends other engines: a kernel pack (see kernels.KERNEL_PACK)
    for engine, kernels in KERNEL_PACK.items():
        for op, fn in kernels.items():
            registry.register(engine, op, fn, checker, source="tb-example-engine")


def _float32() -> Any:
    import torch

    return torch.float32


@torchburn.hookimpl
def tb_register_llm_backends() -> list[Any]:
    from torchburn.llm import LLMBackend

    return [
        LLMBackend(
            name="example",
            engine="example",
            device="cpu",
            load=_load_llm_backend,
            # a template, not a fast path: chosen by name (engine="example") or when no other
            # CPU backend is installed
            priority=-10,
            description="plain-PyTorch dense linear, RMSNorm, RoPE, gated activation (a template)",
            protocol_version=2,  # torchburn.llm.protocol, the version this backend implements
        )
    ]


def _load_llm_backend() -> Any:
    from tb_example_engine.llm import ExampleLLMBackend

    return ExampleLLMBackend()
