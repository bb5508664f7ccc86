"""``sampling.greedy``: numpy's argmax on the calling thread for CPU float32, the same answer as
``torch.argmax`` everywhere (ties, NaN, infinities, strided and empty inputs, other dtypes)."""

from __future__ import annotations

import pytest
import torch

from tb_llm.sampling import SamplingParams, greedy, sample


def _same(x: torch.Tensor) -> None:
    got = greedy(x)
    want = x.argmax(dim=-1)
    assert got.dtype == want.dtype == torch.int64
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("shape", [(1, 1), (1, 49152), (4, 1000), (3, 7), (1, 151936)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_matches_torch_argmax(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(sum(shape))
    _same(torch.randn(shape, generator=gen).to(dtype))


def test_ties_take_the_first_maximum() -> None:
    x = torch.zeros(3, 10)
    x[0, [2, 5]] = 1.0
    x[1] = 7.0  # all equal
    x[2, [9, 0]] = 3.0
    _same(x)
    assert greedy(x).tolist() == [2, 0, 0]


def test_nan_and_infinities() -> None:
    x = torch.randn(4, 64)
    x[0, 10] = float("nan")  # a NaN is the maximum, as in torch
    x[0, 20] = float("inf")
    x[1, 30] = float("inf")
    x[2] = float("-inf")
    x[3, [3, 40]] = float("nan")
    _same(x)
    assert greedy(x).tolist() == [10, 30, 0, 3]


def test_strided_and_inference_inputs() -> None:
    base = torch.randn(8, 300)
    _same(base[::2])  # rows skipped
    _same(base.t().contiguous().t())  # column-major
    _same(base[:, ::3])  # strided last dim
    with torch.inference_mode():
        _same(torch.randn(2, 500))
    _same(torch.randn(2, 50, requires_grad=True))  # detached, not refused
    _same(torch.randn(50))  # one row, 1-d


def test_empty_inputs() -> None:
    _same(torch.empty(0, 10))
    with pytest.raises((RuntimeError, IndexError)):
        greedy(torch.empty(2, 0))  # torch's own error: nothing to choose from


def test_sample_at_temperature_zero_is_greedy() -> None:
    x = torch.randn(3, 2000)
    assert sample(x, SamplingParams(), None).tolist() == x.argmax(-1).tolist()
