"""Entry-point module of the native_cpu engine. Imports cheaply: no torch, no native module."""

from __future__ import annotations

from typing import Any

import torchburn

PLUGIN_API_VERSION = 1


@torchburn.hookimpl
def tb_register_engines() -> list[Any]:
    from tb_cpu_rust.engine import NativeCpuEngine

    return [NativeCpuEngine]


@torchburn.hookimpl
def tb_register_llm_backends() -> list[Any]:
    from torchburn.llm import LLMBackend

    return [
        LLMBackend(
            name="native_cpu",
            engine="native_cpu",
            device="cpu",
            load=_load_llm_backend,
            priority=10,
            description="Rust int8/int4 (VNNI) / bf16 / fp32 GEMVs, RMSNorm, RoPE, KV-cache attention",
            protocol_version=2,  # torchburn.llm.protocol, the version this backend implements
        )
    ]


def _load_llm_backend() -> Any:
    from tb_cpu_rust.llm import NativeLLMBackend

    return NativeLLMBackend()
