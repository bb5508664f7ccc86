"""Kernels that compute in float64 or exactly in integers, against PyTorch: softmax / log-softmax
with ``dtype=torch.float64``, int64 sum / amax / amin (exact beyond 2**24), and gather with an
empty index of a narrow integer dtype; each compiled with native_cpu and no eager fallback."""

from __future__ import annotations

import math

import pytest
import torch
from native_helpers import check_native as _check
from native_helpers import randn as _randn


@pytest.mark.parametrize("shape,dim", [((5,), 0), ((4, 6), 0), ((4, 6), -1), ((3, 5, 7), 1), ((2, 0, 3), 2), ((), 0)])
@pytest.mark.parametrize("name", ["softmax", "log_softmax", "softmin"])
def test_float64_softmax_matches_torch(shape: tuple[int, ...], dim: int, name: str) -> None:
    f = getattr(torch.nn.functional, name)
    x = _randn(*shape) * 10
    # float64 results: compared at float64's own default tolerance
    _check(lambda t: f(t, dim=dim, dtype=torch.float64), x)
    _check(lambda t: f(t.mT if t.dim() == 2 else t, dim=dim, dtype=torch.float64), x)


def test_float64_softmax_special_values() -> None:
    x = torch.tensor([[0.0, -math.inf, 1.0], [math.inf, 0.0, 1.0], [math.nan, 0.0, 1.0], [-math.inf] * 3])
    _check(lambda t: torch.softmax(t, -1, dtype=torch.float64), x)
    _check(lambda t: torch.log_softmax(t, -1, dtype=torch.float64), x)


@pytest.mark.parametrize("dims,keep", [(None, False), ([0], True), ([1], False), ([0, 2], True), ([-1], False)])
@pytest.mark.parametrize("name", ["sum", "amax", "amin"])
def test_int64_reductions_are_exact(dims: list[int] | None, keep: bool, name: str) -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.randint(-(2**40), 2**40, (3, 4, 5), generator=g)
    f = getattr(torch, name)
    if dims is None:
        _check(lambda t: f(t * 1), x)
    else:
        _check(lambda t: f(t * 1, dim=dims, keepdim=keep), x)
    _check(lambda t: f(t.mT * 1, dim=[0], keepdim=keep), x[0])


def test_int_sum_of_narrow_ints_and_empty() -> None:
    x = torch.arange(-20, 20, dtype=torch.int32).reshape(5, 8)
    _check(lambda t: torch.sum(t, dim=1, dtype=torch.int64), x)
    e = torch.zeros(0, 3, dtype=torch.int64)
    _check(lambda t: torch.sum(t * 1, dim=0), e)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16])
def test_gather_with_an_empty_index(dtype: torch.dtype) -> None:
    x = _randn(5)
    _check(lambda t, i: torch.gather(t, 0, i) + 1, x, torch.zeros(0, dtype=dtype))


@pytest.mark.parametrize("steps,base", [(0, 10.0), (1, 2.0), (7, 10.0), (5, 1.1)])
def test_logspace_computes_in_float64(steps: int, base: float) -> None:
    _check(lambda t: torch.logspace(-3, 2, steps, base=base) + t, torch.zeros(()))


@pytest.mark.parametrize("q", [0.0, 0.3, 0.5, 1.0])
@pytest.mark.parametrize("interpolation", ["linear", "lower", "higher", "midpoint", "nearest"])
def test_quantile_matches_torch(q: float, interpolation: str) -> None:
    x = _randn(4, 7)
    _check(lambda t: torch.quantile(t, q, dim=1, interpolation=interpolation), x)
    x[1, 3] = math.nan
    _check(lambda t: torch.nanquantile(t, q, dim=1, interpolation=interpolation), x)


def test_float64_elementwise_ops() -> None:
    a = _randn(3, 4).double()
    b = _randn(3, 4, seed=1).double().abs() + 0.5
    _check(
        lambda x, y: (
            (x + y) * 2 - x / y,
            torch.pow(2.0, x),
            torch.pow(y, x),
            x.ceil(),
            x.floor(),
            -x,
            (x * 4).round(),
        ),
        a,
        b,
    )
    _check(lambda x, y: (x < y, x <= 0.5, x > y, x >= y, x == x, x != y, torch.where(x > 0, x, y)), a, b)
    _check(lambda x: x * torch.tensor([1, 2, 3, 4]), a)  # int64 operand promoted to float64
