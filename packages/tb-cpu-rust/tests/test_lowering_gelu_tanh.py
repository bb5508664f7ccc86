"""The tanh GELU written out in ATen (GPT-2's ``NewGELUActivation``) lowered as one ``gelu_tanh``
(lowering/gelu_tanh_fusion.py): against eager for shapes, argument orders, NaN / ±inf and
large magnitudes; one instruction in the plan (or the GEMM's epilogue when it reads a GEMM result
directly); near misses (another constant, x read differently, an intermediate read twice) lowered
node by node."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from native_helpers import check_native, randn
from torch import nn

K0 = math.sqrt(2.0 / math.pi)


def new_gelu(x: torch.Tensor) -> torch.Tensor:
    """transformers' NewGELUActivation, as GPT-2 writes it."""
    return 0.5 * x * (1.0 + torch.tanh(K0 * (x + 0.044715 * torch.pow(x, 3.0))))


def new_gelu_reordered(x: torch.Tensor) -> torch.Tensor:
    return (1.0 + torch.tanh((0.044715 * torch.pow(x, 3.0) + x) * K0)) * (x * 0.5)


def _instrs(specs: list[dict[str, Any]]) -> list[str]:
    """Every ew instruction and every GEMM epilogue op of the plans, in order."""
    out = []
    for spec in specs:
        for s in spec["steps"]:
            if s["op"] == "ew":
                out += [i["op"] for i in s["prog"] if i["op"] not in ("load", "store")]
            out += list(s.get("epilogue", []))
    return out


@pytest.mark.parametrize("f", [new_gelu, new_gelu_reordered])
@pytest.mark.parametrize("shape", [(7,), (3, 33), (2, 5, 257), (0, 4)])
def test_written_out_tanh_gelu_is_one_op(
    lowered: list[dict[str, Any]], f: Callable[..., Any], shape: tuple[int, ...]
) -> None:
    x = randn(*shape, seed=sum(shape)) * 3.0

    def g(x: torch.Tensor) -> torch.Tensor:
        return f(x + 1.0)  # x an intermediate, as a GEMM's result would be

    check_native(g, x, rtol=1e-5, atol=1e-6)
    if x.numel():
        assert _instrs(lowered).count("gelu_tanh") == 1 and "tanh" not in _instrs(lowered), _instrs(lowered)


def test_tanh_gelu_after_a_linear_and_in_an_mlp(lowered: list[dict[str, Any]]) -> None:
    """GPT-2's MLP: Linear, the written-out GELU, Linear; on a 3-d activation (the GEMM's result
    viewed) and a 2-d one (the GEMM's result itself: the GELU runs in its epilogue)."""
    torch.manual_seed(0)
    fc, proj = nn.Linear(64, 256), nn.Linear(256, 64)
    x = randn(2, 9, 64, seed=3)
    check_native(lambda x: proj(new_gelu(fc(x))), x, rtol=1e-4, atol=1e-5)
    assert _instrs(lowered).count("gelu_tanh") == 1, _instrs(lowered)
    lowered.clear()
    check_native(lambda x: proj(new_gelu(fc(x))), x.reshape(18, 64), rtol=1e-4, atol=1e-5)
    assert _instrs(lowered) == ["gelu_tanh"], _instrs(lowered)


def test_tanh_gelu_nan_inf_and_large_values() -> None:
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-30, 12.0, -12.0, 40.0, -40.0, 3e4])
    check_native(lambda x: new_gelu(x * 1.0), x, rtol=1e-5, atol=1e-6)


def test_tanh_gelu_near_misses_stay_node_by_node(lowered: list[dict[str, Any]]) -> None:
    x = randn(4, 16, seed=5)

    def other_constant(x: torch.Tensor) -> torch.Tensor:
        return 0.5 * x * (1.0 + torch.tanh(K0 * (x + 0.04 * torch.pow(x, 3.0))))

    def square_not_cube(x: torch.Tensor) -> torch.Tensor:
        return 0.5 * x * (1.0 + torch.tanh(K0 * (x + 0.044715 * torch.pow(x, 2.0))))

    def other_operand(x: torch.Tensor) -> torch.Tensor:
        y = x + 1.0
        return 0.5 * x * (1.0 + torch.tanh(K0 * (y + 0.044715 * torch.pow(x, 3.0))))

    def tanh_read_twice(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        t = torch.tanh(K0 * (x + 0.044715 * torch.pow(x, 3.0)))
        return 0.5 * x * (1.0 + t), t

    for f in (other_constant, square_not_cube, other_operand, tanh_read_twice):
        lowered.clear()
        check_native(f, x, rtol=1e-5, atol=1e-6)
        assert "gelu_tanh" not in _instrs(lowered), f.__name__
