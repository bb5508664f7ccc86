"""index_put with leading ``None`` indices (index_copy / index_fill on a later dim),
nonzero_static and functional resize, against PyTorch."""

from __future__ import annotations

import pytest
import torch
from native_helpers import randn as _randn
from native_helpers import run_native as _run_native

from torchburn.testing.conformance import compile_with, native_and_fallback


@pytest.mark.parametrize("dim", [1, 2, -1])
def test_index_copy_and_fill_on_a_later_dim(dim: int) -> None:
    x = _randn(3, 4, 5)
    n = x.shape[dim]
    idx = torch.tensor([n - 1, 0, 2])
    src_shape = list(x.shape)
    src_shape[dim] = 3
    src = _randn(*src_shape, seed=1)

    def copy(x: torch.Tensor, i: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return x.index_copy(dim, i, s)

    def fill(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        return x.index_fill(dim, i, -2.5)

    torch.testing.assert_close(_run_native(copy, x, idx, src), copy(x, idx, src))
    torch.testing.assert_close(_run_native(fill, x, idx), fill(x, idx))


def test_index_put_with_leading_none_and_accumulate() -> None:
    x = _randn(2, 6, 3)
    i = torch.tensor([[0, 5], [5, 1]])
    v = _randn(2, 2, 2, 3, seed=2)

    def put(x: torch.Tensor, i: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten.index_put(x, [None, i], v, True)

    torch.testing.assert_close(_run_native(put, x, i, v), put(x, i, v))


@pytest.mark.parametrize(
    "x",
    [
        torch.tensor([[0.0, 1.0, 0.0], [2.0, 0.0, float("nan")]]),
        torch.tensor([0, 3, 0, 4]),
        torch.tensor([[True, False], [True, True]]).mT,
        torch.tensor(1.5),
        torch.zeros(0, 3),
    ],
)
@pytest.mark.parametrize("size", [0, 2, 6])
def test_nonzero_static_matches_torch(x: torch.Tensor, size: int) -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.nonzero_static(x, size=size, fill_value=-7)

    assert torch.equal(_run_native(fn, x), fn(x))


@pytest.mark.parametrize(("shape", "new"), [((4, 5), (2, 10)), ((4, 5), (3, 2)), ((), (1, 1)), ((3, 0), (0,))])
def test_resize_to_at_most_its_size(shape: tuple[int, ...], new: tuple[int, ...]) -> None:
    x = _randn(*shape) if shape else torch.tensor(0.5)

    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten.resize(x + 1, new)

    torch.testing.assert_close(_run_native(fn, x), fn(x))


def test_resize_that_grows_stays_eager() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten.resize(x + 1, (4, 4))[:2]

    compiled, reports = compile_with("native_cpu", fn, cache=False, fallback="eager")
    with torch.no_grad():
        got = compiled(_randn(2, 2))
    _, fallback = native_and_fallback(reports)
    assert "aten.resize.default" in fallback
    assert got.shape == (2, 4)
