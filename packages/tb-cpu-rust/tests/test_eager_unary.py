"""tb_cpu_rust._native.unary_f32: the eager one-op entry (turbo_torch.sin & co.), against PyTorch.

Property-based at the boundary: random lengths, values (NaN/±inf/huge/tiny/signed zeros), in
place or not; every op of the table against the torch function of the same name.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tb_cpu_rust import _native

OPS = list(_native.unary_ops())
FLOATS = st.floats(width=32, allow_nan=True, allow_infinity=True)


def _run(op: str, x: torch.Tensor, inplace: bool = False) -> torch.Tensor:
    y = x if inplace else torch.empty_like(x)
    _native.unary_f32(OPS.index(op), x.data_ptr(), y.data_ptr(), x.numel())
    return y


def test_table_names_torch_functions() -> None:
    assert set(OPS) >= {"sin", "cos", "tanh"}
    for op in OPS:
        assert callable(getattr(torch, op))


@pytest.mark.parametrize("op", OPS)
@settings(max_examples=40, deadline=None)
@given(values=st.lists(FLOATS, max_size=300), inplace=st.booleans())
def test_matches_torch_on_random_values(op: str, values: list[float], inplace: bool) -> None:
    x = torch.tensor(values, dtype=torch.float32)
    want = getattr(torch, op)(x)
    got = _run(op, x.clone(), inplace)
    torch.testing.assert_close(got, want, equal_nan=True)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 255, 4096, 65535, 65536 * 2 + 3])
def test_matches_torch_at_every_length_and_across_threads(op: str, n: int) -> None:
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=g) * 10
    if n > 20:
        x[:12] = torch.tensor([0.0, -0.0, math.nan, math.inf, -math.inf, 1e-30, 3e38, -3e38, 7e4, -1e5, 1.5, 88.0])
    torch.testing.assert_close(_run(op, x), getattr(torch, op)(x), equal_nan=True)
    torch.testing.assert_close(_run(op, x.clone(), inplace=True), getattr(torch, op)(x), equal_nan=True)


@pytest.mark.parametrize("op", ["sin", "cos"])
def test_trig_over_the_reduction_range(op: str) -> None:
    # dense over [-2^17, 2^17]: the vector reduction below 65536 and the scalar path above it
    x = torch.linspace(-(2.0**17), 2.0**17, 1_000_003)
    want = getattr(torch, op)(x.double()).float()
    torch.testing.assert_close(_run(op, x), want, atol=2e-6, rtol=0)


def test_bad_calls_raise() -> None:
    x = torch.randn(4)
    with pytest.raises(ValueError, match="unknown unary op"):
        _native.unary_f32(len(OPS), x.data_ptr(), x.data_ptr(), 4)
    with pytest.raises(ValueError, match="null"):
        _native.unary_f32(0, x.data_ptr(), 0, 4)
    with pytest.raises(ValueError, match="misaligned"):
        _native.unary_f32(0, x.data_ptr(), x.data_ptr() + 1, 1)
    with pytest.raises(OverflowError):
        _native.unary_f32(0, x.data_ptr(), x.data_ptr(), -1)
