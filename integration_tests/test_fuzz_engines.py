"""Hypothesis at every engine's entry: random shapes, strides, dtypes and broadcasting vs eager."""

from __future__ import annotations

import pytest
import torch
from conftest import ENGINES
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchburn.testing import compile_with

DTYPES = [torch.float32, torch.float64, torch.int64]
BINARY = [torch.add, torch.mul, torch.sub, torch.maximum]
UNARY = [torch.relu, torch.abs, torch.neg, lambda t: t * 2 + 1]


@st.composite
def layouts(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor]:
    rank = draw(st.integers(0, 3))
    shape = [draw(st.integers(0, 5)) for _ in range(rank)]
    dtype = draw(st.sampled_from(DTYPES))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    base = (torch.randn([s * 2 for s in shape], generator=gen) * 4).to(dtype)
    a = (
        base[tuple(slice(None, None, 2) for _ in shape)]
        if draw(st.booleans()) and rank
        else base[tuple(slice(0, s) for s in shape)]
    )
    if rank >= 2 and draw(st.booleans()):
        a = a.transpose(0, 1)
    # the other operand broadcasts: some dims collapsed to 1, maybe fewer dims
    other_shape = [1 if draw(st.booleans()) else s for s in a.shape][draw(st.integers(0, rank)) :]
    b = (torch.randn(other_shape, generator=gen) * 4).to(dtype)
    return a, b


@pytest.mark.parametrize("engine", ENGINES)
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(data=layouts(), op=st.sampled_from(BINARY), post=st.sampled_from(UNARY))
def test_elementwise_layouts(engine: str, data: tuple[torch.Tensor, torch.Tensor], op: object, post: object) -> None:
    a, b = data

    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return post(op(x, y))  # type: ignore[operator]

    expected = f(a, b)
    compiled, _ = compile_with(engine, f, fallback="eager")
    torch.testing.assert_close(compiled(a, b), expected, rtol=1e-5, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("engine", ENGINES)
@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(m=st.integers(1, 9), k=st.integers(1, 9), n=st.integers(1, 9), transpose=st.booleans(), seed=st.integers(0, 99))
def test_matmul_shapes(engine: str, m: int, k: int, n: int, transpose: bool, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=gen)
    b = torch.randn(n, k, generator=gen).t() if transpose else torch.randn(k, n, generator=gen)
    compiled, _ = compile_with(engine, lambda x, y: torch.relu(x @ y), fallback="eager")
    torch.testing.assert_close(compiled(a, b), torch.relu(a @ b), rtol=1e-4, atol=1e-4)
