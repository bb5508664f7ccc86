"""The example engine's kernel table: op overload name -> function, and a kernel pack for
another engine.

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


# A kernel pack for another installed engine: ``tb_register_kernels`` adds these to that engine's
# table. Only engines whose ``Engine.runs_registered_kernels()`` holds run them (cython_dispatch
# does: its gelu nodes then run this function instead of PyTorch's ATen entry); tb-core warns about
# a pack for an installed engine that does not, and ignores one for an engine not installed.
KERNEL_PACK: dict[str, dict[str, Callable[..., Any]]] = {
    "cython_dispatch": {"aten.gelu.default": _gelu},
}
