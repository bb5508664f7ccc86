"""What an engine's ``tb_register_llm_backends`` hook returns: a named, lazily loaded backend."""

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
    #: Version of the kernel protocol (``torchburn.llm.protocol``) the loaded object implements.
    #: Write the number you implemented (not ``PROTOCOL_VERSION``, which is whatever tb-core is
    #: installed): tb-llm refuses a backend whose version differs from its own. The default, 1,
    #: is what a backend written before the protocol moved to tb-core implements.
    protocol_version: int = 1


def llm_backends() -> list[LLMBackend]:
    """Every LLM backend the installed plugins offer, highest priority first."""
    from torchburn.plugins import state

    found = [b for b in state().llm_backends if isinstance(b, LLMBackend)]
    return sorted(found, key=lambda b: (-b.priority, b.name))
