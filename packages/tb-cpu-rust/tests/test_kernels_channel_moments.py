"""Sum, mean and variance per channel (the statistics training-mode batch norm takes) on
native_cpu against eager PyTorch: NCHW tensors, whose reduced dims end in one contiguous H × W
plane per image (``reduce/mod.rs`` ``moments_by_runs``), and channels-last tensors, whose kept
channel dim is the contiguous one (``moments_by_kept_rows``); plane sizes below, at and above the
vector pass's threshold, corrections, a large mean, NaN / inf, sliced and empty inputs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from native_helpers import check_native, randn

from torchburn.testing.conformance import compile_with, native_and_fallback

# (N, C, H, W): planes of 1, 9 and 12 elements take the generic walk; 16 and up the vector runs
SHAPES = [(2, 3, 1, 1), (4, 5, 3, 3), (3, 2, 3, 4), (2, 3, 4, 4), (5, 4, 5, 7), (8, 16, 32, 32), (1, 3, 33, 31)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
def test_per_channel_mean_sum_and_variance(shape: tuple[int, int, int, int], layout: str) -> None:
    x = randn(*shape, seed=sum(shape)) * 2 + 0.5
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    dims = (0, 2, 3)
    check_native(lambda x: x.mean(dims, keepdim=True), x, rtol=1e-5, atol=1e-5)
    check_native(lambda x: x.sum(dims), x, rtol=1e-5, atol=1e-4)
    for c in (0, 1):
        check_native(lambda x, c=c: torch.var(x, dims, correction=c), x, rtol=1e-5, atol=1e-5)
        check_native(lambda x, c=c: torch.var_mean(x, dims, correction=c, keepdim=True), x, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dims", [(0, 2), (1, 3), (0, 1, 3), (2, 3), (3,)])
def test_variance_over_other_dim_sets(dims: tuple[int, ...]) -> None:
    x = randn(3, 4, 17, 19, seed=len(dims))
    check_native(lambda x: torch.var(x, dims, correction=1), x, rtol=1e-5, atol=1e-5)
    check_native(lambda x: x.mean(dims), x, rtol=1e-5, atol=1e-5)


def test_variance_of_a_large_mean_is_centred() -> None:
    """Two passes: the deviations are taken from the mean, so 1000 + N(0, 1) keeps its variance of ~1."""
    x = randn(8, 4, 16, 16, seed=3) + 1000.0
    check_native(lambda x: torch.var(x, (0, 2, 3), correction=0), x, rtol=1e-4, atol=1e-4)
    xl = x.contiguous(memory_format=torch.channels_last)
    check_native(lambda x: torch.var(x, (0, 2, 3), correction=0), xl, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
def test_nan_and_infinity_stay_in_their_channel(layout: str) -> None:
    x = randn(4, 5, 8, 8, seed=5)
    x[2, 1, 3, 4] = float("nan")
    x[0, 3, 7, 7] = float("inf")
    x[1, 4, 0, 0] = float("-inf")
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    check_native(lambda x: x.mean((0, 2, 3)), x)
    check_native(lambda x: torch.var(x, (0, 2, 3), correction=1), x)


def test_sliced_and_empty_inputs() -> None:
    x = randn(4, 6, 20, 24, seed=6)
    check_native(lambda x: torch.var(x[:, ::2, :, 2:22], (0, 2, 3), correction=0), x, rtol=1e-5, atol=1e-5)
    check_native(lambda x: torch.var(x[1:3], (0, 2, 3), correction=1), x, rtol=1e-5, atol=1e-5)
    e = randn(0, 3, 8, 8)
    check_native(lambda x: x.sum((0, 2, 3)), e)
    one = randn(1, 3, 1, 1, seed=7)
    check_native(lambda x: torch.var(x, (0, 2, 3), correction=1), one)  # n - 1 = 0: NaN, as in PyTorch


@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
@pytest.mark.parametrize("affine", ["both", "weight", "bias", "none"])
def test_training_mode_batch_norm(layout: str, affine: str) -> None:
    """y = x · scale + shift per channel (scale = rstd · weight, shift = bias − mean · scale), the
    ReLU after it in the same sweep."""
    x = randn(8, 16, 12, 12, seed=8) * 3 - 1
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    w = randn(16, seed=9) if affine in ("both", "weight") else None
    b = randn(16, seed=10) if affine in ("both", "bias") else None
    check_native(lambda x: F.relu(F.batch_norm(x, None, None, w, b, training=True, eps=1e-5)), x, rtol=1e-4, atol=1e-4)
    check_native(lambda x: F.batch_norm(x, None, None, w, b, training=True, eps=1e-3) * 2, x, rtol=1e-4, atol=1e-4)


def test_training_mode_batch_norm_updates_running_statistics() -> None:
    """The functional form's running mean / variance (unbiased) match eager's after a call."""
    x = randn(6, 5, 9, 7, seed=11) * 2 + 0.5
    w, b = randn(5, seed=12), randn(5, seed=13)
    stats = {k: (torch.zeros(5), torch.ones(5)) for k in ("eager", "native")}

    def fn(x: torch.Tensor, rm: torch.Tensor, rv: torch.Tensor) -> torch.Tensor:
        return F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.2, eps=1e-5)

    want = fn(x, *stats["eager"])
    compiled, reports = compile_with("native_cpu", fn, cache=False)
    with torch.no_grad():
        got = compiled(x, *stats["native"])
    native, _ = native_and_fallback(reports)
    assert "aten._native_batch_norm_legit_functional.default" in native, reports  # the write-back copy_ may not be
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    for e, n in zip(stats["eager"], stats["native"]):
        torch.testing.assert_close(n, e, rtol=1e-5, atol=1e-6)
