"""The gated-MLP activations a model description names, as an enum instead of checkpoint strings."""

from __future__ import annotations

from enum import Enum


class Activation(str, Enum):
    """``gated_act(gate, up, act) = act(gate) * up``; a ``str`` enum, so ``act == "silu"`` holds."""

    SILU = "silu"
    #: exact (erf) GELU
    GELU = "gelu"
    #: GELU's tanh approximation (``F.gelu(x, approximate="tanh")``)
    GELU_TANH = "gelu_tanh"

    @classmethod
    def from_name(cls, name: str) -> Activation:
        """A Hugging Face ``hidden_act`` name: ``silu``, ``gelu``, or one of the tanh-approximated
        GELUs (``gelu_pytorch_tanh``, ``gelu_new``, ``gelu_fast``, ``gelu_tanh``)."""
        if isinstance(name, Activation):
            return name
        if name == "silu":
            return cls.SILU
        if name == "gelu":
            return cls.GELU
        if name in ("gelu_tanh", "gelu_pytorch_tanh", "gelu_new", "gelu_fast"):
            return cls.GELU_TANH
        raise ValueError(f"unknown activation {name!r}: use silu, gelu or a tanh-approximated gelu")
