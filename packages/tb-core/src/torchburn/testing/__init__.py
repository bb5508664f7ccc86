"""Testing helpers for engine authors: the conformance suite and the tb-core model set."""

from torchburn.testing.cases import CASES, OpCase
from torchburn.testing.conformance import EngineConformance, compile_with, native_and_fallback
from torchburn.testing.models import MODELS, train_losses

__all__ = ["CASES", "MODELS", "EngineConformance", "OpCase", "compile_with", "native_and_fallback", "train_losses"]
