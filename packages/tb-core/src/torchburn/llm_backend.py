"""What an engine offers tb-llm: a named backend with hot kernels for decoder inference.

tb-core only carries these descriptors from plugins to tb-llm; the kernel protocol itself
(quantized matmul, RMSNorm, RoPE, attention over a KV cache, SiLU-gate, or a fused decode
step) is defined and documented by tb-llm (``tb_llm.backends``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LLMBackend:
    name: str  # e.g. "native_cpu"
    engine: str  # the engine that provides it
    device: str  # "cpu" or "gpu"
    load: Callable[[], Any]  # imports the native code and returns the kernel object
    priority: int = 0
    description: str = ""
    #: Version of tb-llm's kernel protocol (tb_llm.backends) the loaded object implements.
    protocol_version: int = 1


def llm_backends() -> list[LLMBackend]:
    """Every LLM backend the installed plugins offer, highest priority first."""
    from torchburn.plugins import state

    found = [b for b in state().llm_backends if isinstance(b, LLMBackend)]
    return sorted(found, key=lambda b: (-b.priority, b.name))
