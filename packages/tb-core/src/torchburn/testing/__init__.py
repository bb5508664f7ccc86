"""Testing helpers for engine authors: the conformance suite and the tb-core model set.

The model set needs only torch; the conformance suite needs pytest and is imported on first use,
so ``torchburn demo`` and ``explain`` work on an install without test tools.
"""

from __future__ import annotations

from typing import Any

from torchburn.testing.cases import CASES, OpCase
from torchburn.testing.llm_conformance import LLMBackendConformance as LLMBackendConformance
from torchburn.testing.models import MODELS, train_losses

_CONFORMANCE = ("EngineConformance", "compile_with", "native_and_fallback")


def __getattr__(name: str) -> Any:
    if name in _CONFORMANCE:
        from torchburn.testing import conformance

        return getattr(conformance, name)
    if name == "InteropConformance":
        from torchburn.testing import interop_conformance

        return interop_conformance.InteropConformance
    raise AttributeError(f"module 'torchburn.testing' has no attribute {name!r}")


__all__ = [
    "CASES",
    "MODELS",
    "EngineConformance",
    "InteropConformance",
    "OpCase",
    "compile_with",
    "native_and_fallback",
    "train_losses",
]
