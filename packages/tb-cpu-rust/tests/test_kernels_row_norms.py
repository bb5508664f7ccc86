"""Layer norm, RMS norm and the mean / sum over trailing contiguous dims (the vectorised row passes
of ``reduce/rows.rs``) on native_cpu against eager PyTorch: row lengths around the lane and
block sizes, long rows, weights or none, NaN / inf, empty, non-contiguous inputs."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from native_helpers import check_native, randn

ROW_LENGTHS = [1, 7, 31, 32, 33, 256, 1023, 1025, 4099]


@pytest.mark.parametrize("n", ROW_LENGTHS)
@pytest.mark.parametrize("affine", ["both", "weight", "none"])
def test_layer_norm_rows(n: int, affine: str) -> None:
    x = randn(3, 5, n, seed=n) * 3 + 1.5
    w = randn(n, seed=1) if affine != "none" else None
    b = randn(n, seed=2) if affine == "both" else None
    check_native(lambda x: F.layer_norm(x, (n,), w, b, 1e-5), x, rtol=1e-4, atol=1e-4)


def test_layer_norm_over_two_trailing_dims_and_large_offsets() -> None:
    x = randn(4, 6, 40, seed=3) + 1000.0  # a large mean: the centred second pass keeps the variance
    w, b = randn(6, 40, seed=4), randn(6, 40, seed=5)
    check_native(lambda x: F.layer_norm(x, (6, 40), w, b, 1e-6), x, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("n", ROW_LENGTHS)
def test_rms_norm_rows(n: int) -> None:
    x = randn(2, 9, n, seed=n + 7)
    w = randn(n, seed=6)
    check_native(lambda x: F.rms_norm(x, (n,), w, 1e-6), x, rtol=1e-4, atol=1e-5)
    check_native(lambda x: F.rms_norm(x, (n,), None, 1e-6), x, rtol=1e-4, atol=1e-5)


def test_rms_norm_written_out_as_transformers_writes_it() -> None:
    """pow, mean over the last dim, add eps, rsqrt, mul, mul weight (Qwen2RMSNorm / LlamaRMSNorm)."""
    x, w = randn(4, 64, 256, seed=8), randn(256, seed=9)

    def f(x: torch.Tensor) -> torch.Tensor:
        var = x.pow(2).mean(-1, keepdim=True)
        return w * (x * torch.rsqrt(var + 1e-6))

    check_native(f, x, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("n", ROW_LENGTHS)
def test_mean_and_sum_over_trailing_dims(n: int) -> None:
    x = randn(3, 4, n, seed=n + 11)
    check_native(lambda x: x.mean(-1, keepdim=True), x, rtol=1e-5, atol=1e-5)
    check_native(lambda x: x.sum(-1), x, rtol=1e-5, atol=1e-4)
    check_native(lambda x: x.mean((1, 2)), x, rtol=1e-5, atol=1e-5)


def test_mean_of_a_long_row_is_accurate() -> None:
    """A million elements of mean 1: float32 lanes per 1024-element block, float64 across blocks."""
    x = torch.rand(2, 1_000_003, generator=torch.Generator().manual_seed(0)) * 2
    check_native(lambda x: x.mean(-1), x, rtol=1e-6, atol=1e-6)
    check_native(lambda x: x.sum(-1), x, rtol=1e-6, atol=1e-6)


def test_non_contiguous_inputs() -> None:
    x = randn(8, 70, 3, seed=12).transpose(1, 2)  # rows of 70 at stride 3
    w = randn(70, seed=13)
    check_native(lambda x: F.layer_norm(x, (70,), w, None, 1e-5), x, rtol=1e-4, atol=1e-4)
    check_native(lambda x: x.mean(-1), x, rtol=1e-5, atol=1e-5)
    y = randn(6, 64, seed=14)[:, ::2]  # stride-2 rows
    check_native(lambda y: y.sum(-1), y, rtol=1e-5, atol=1e-5)


def test_nan_and_infinity_propagate() -> None:
    x = randn(4, 100, seed=15)
    x[1, 17] = float("nan")
    x[2, 50] = float("inf")
    x[3, 3] = float("-inf")
    w = randn(100, seed=16)
    check_native(lambda x: F.layer_norm(x, (100,), w, None, 1e-5), x, rtol=1e-4, atol=1e-4)
    check_native(lambda x: F.rms_norm(x, (100,), w, 1e-6), x, rtol=1e-4, atol=1e-5)
    check_native(lambda x: x.mean(-1), x, rtol=1e-5, atol=1e-5)


def test_empty_rows_and_batches() -> None:
    check_native(lambda x: F.layer_norm(x, (8,)) + 1.0, torch.zeros(0, 8))
    check_native(lambda x: x.sum(-1) + 1.0, torch.zeros(5, 0))
    check_native(lambda x: x.mean(-1) + 1.0, torch.zeros(0, 4))


def _ops(specs: list[dict[str, Any]]) -> list[str]:
    return [s["op"] for spec in specs for s in spec["steps"]]


@pytest.mark.parametrize("weighted", ["left", "right", "none"])
@pytest.mark.parametrize("n", [1, 33, 256, 1025])
def test_written_out_rms_norm_becomes_one_step(lowered: list[dict[str, Any]], weighted: str, n: int) -> None:
    x, w = randn(3, 7, n, seed=n), randn(n, seed=17)

    def f(x: torch.Tensor) -> torch.Tensor:
        h = x + 1.0  # the residual add before the norm, as in a decoder layer
        y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return w * y if weighted == "left" else y * w if weighted == "right" else y

    check_native(f, x, rtol=1e-5, atol=1e-6)
    assert _ops(lowered).count("rms_norm") == 1 and "reduce" not in _ops(lowered), _ops(lowered)


def test_rms_norm_pattern_near_misses_stay_node_by_node(lowered: list[dict[str, Any]]) -> None:
    """The mean square read elsewhere, a mean without keepdim, a cube: lowered as written."""
    x = randn(4, 16, seed=18)

    def shared(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ms = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(ms + 1e-6), ms

    def cube(x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(3).mean(-1, keepdim=True) + 1e-6)

    def over_first_dim(x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(0, keepdim=True) + 1e-6)

    for f in (shared, cube, over_first_dim):
        lowered.clear()
        check_native(f, x, rtol=1e-5, atol=1e-6)
        assert "rms_norm" not in _ops(lowered), f.__name__


def test_rms_norm_pattern_propagates_nan_and_inf() -> None:
    x = randn(3, 40, seed=19)
    x[0, 3], x[1, 5] = float("nan"), float("inf")
    w = randn(40, seed=20)
    check_native(lambda x: w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)), x, rtol=1e-5, atol=1e-6)
