"""The example engine's kernel table: op overload name -> function.

Each kernel is written with public torch functions, as a stand-in for a real backend.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def _add(a: Any, b: Any, *, alpha: Any = 1) -> torch.Tensor:
    return torch.add(a, b, alpha=alpha)


def _addmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta: Any = 1, alpha: Any = 1) -> torch.Tensor:
    return torch.addmm(bias, a, b, beta=beta, alpha=alpha)


def _gelu(x: torch.Tensor, *, approximate: str = "none") -> torch.Tensor:
    return torch.nn.functional.gelu(x, approximate=approximate)


KERNELS: dict[str, Callable[..., Any]] = {
    "aten.add.Tensor": _add,
    "aten.mul.Tensor": torch.mul,
    "aten.relu.default": torch.relu,
    "aten.sigmoid.default": torch.sigmoid,
    "aten.tanh.default": torch.tanh,
    "aten.gelu.default": _gelu,
    "aten.mm.default": torch.mm,
    "aten.addmm.default": _addmm,
    "aten.permute.default": torch.permute,
}
