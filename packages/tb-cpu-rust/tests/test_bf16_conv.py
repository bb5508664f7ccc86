"""bfloat16 convolutions on native_cpu (lowering/bf16_products.py, kernels/conv/winograd_pairs.rs, kernels/conv/gemm_pairs.rs):
a model converted to bfloat16 (or run under autocast) keeps its convolutions native, computed in
float32 between casts (torchburn.low_precision), the conv + batch norm + activation (+ residual)
chain folded into one ``conv2d`` step, and the 3×3 convolutions marked ``bf16`` so their Winograd
channel sums may multiply bfloat16 values (``vdpbf16ps`` where the CPU has AVX-512 BF16). Against
eager bfloat16 with bfloat16 tolerances, and against a float64 reference next to eager's own
bfloat16 error."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from native_helpers import randn, run_native
from torch import nn

BF16 = torch.bfloat16
#: bfloat16 tolerances for results of size ~1-8 (a unit in the last place is 2^-7 .. 2^-5 there)
TOL = {"rtol": 1.6e-2, "atol": 3e-2}


def _bn(c: int, seed: int) -> nn.BatchNorm2d:
    g = torch.Generator().manual_seed(seed)
    bn = nn.BatchNorm2d(c).eval()
    with torch.no_grad():
        bn.weight.copy_(torch.rand(c, generator=g) + 0.5)
        bn.bias.copy_(torch.randn(c, generator=g) * 0.1)
        bn.running_mean.copy_(torch.randn(c, generator=g) * 0.1)
        bn.running_var.copy_(torch.rand(c, generator=g) + 0.5)
    return bn


class _Block(nn.Module):
    """A ResNet basic block: conv-BN-ReLU, conv-BN, + x, ReLU."""

    def __init__(self, c: int, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.c1, self.b1 = nn.Conv2d(c, c, 3, padding=1, bias=False), _bn(c, seed + 1)
        self.c2, self.b2 = nn.Conv2d(c, c, 3, padding=1, bias=False), _bn(c, seed + 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.b2(self.c2(torch.relu(self.b1(self.c1(x))))) + x)


def _conv_steps(lowered: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [s for spec in lowered for s in spec["steps"] if s["op"] == "conv2d"]


CASES = [
    # (channels, height, width, batch)
    (32, 16, 16, 2),
    (64, 13, 19, 1),  # odd sizes: tiles half outside, runs of tiles across GEMM panels
    (16, 8, 30, 3),
]


@pytest.mark.parametrize(("c", "h", "w", "n"), CASES)
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("mode", ["bf16", "autocast"])
def test_bfloat16_block_runs_native_and_matches_eager(
    lowered: list[dict[str, Any]], c: int, h: int, w: int, n: int, layout: str, mode: str
) -> None:
    model = _Block(c)
    x = randn(n, c, h, w, seed=5)
    if mode == "bf16":
        model, x = model.to(BF16), x.to(BF16)
    if layout == "channels_last":
        model, x = model.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
    ctx: Callable[[], Any] = (
        (lambda: torch.autocast("cpu", dtype=BF16)) if mode == "autocast" else contextlib.nullcontext
    )

    def fn(x: torch.Tensor) -> torch.Tensor:
        with ctx():
            return model(x)

    with torch.no_grad():
        want = fn(x)
        got = run_native(fn, x, require_native=True)
        exact = _Block(c).double()(x.double())
    assert got.dtype == want.dtype  # bfloat16; float32 under autocast (the residual is float32)
    torch.testing.assert_close(got.float(), want.float(), **TOL)
    # as close to the float64 result as eager's bfloat16, within 2x: one rounding per chain
    # instead of one per op, and the bfloat16 products' rounding of the transformed values
    # (measured 1.0-1.4x eager's largest error on AVX-512 BF16; pairs in the wrong halves or
    # panels miss by the size of the result)
    err = (got.double() - exact).abs().max().item()
    eager_err = (want.double() - exact).abs().max().item()
    assert err <= 2 * eager_err, (err, eager_err)
    steps = _conv_steps(lowered)
    # each convolution one step with its norm, activation and residual folded
    assert len(steps) == 2 and all(s["ins"][6] is not None for s in steps), steps
    assert all(s["bf16"] for s in steps), steps


def test_bfloat16_block_nan_and_inf() -> None:
    """NaN / ±inf inputs: the outputs they reach are recomputed as the direct sum (as eager's
    direct convolution gives them), the rest unchanged."""
    model = _Block(32).to(BF16)
    x = randn(1, 32, 12, 12, seed=2).to(BF16)
    x[0, 0, 0, 0] = float("nan")
    x[0, 3, 5, 6] = float("inf")
    x[0, 31, 11, 4] = float("-inf")
    with torch.no_grad():
        want = model(x)
        got = run_native(model, x, require_native=True)
    assert torch.equal(got.isnan(), want.isnan())
    torch.testing.assert_close(got.float(), want.float(), equal_nan=True, **TOL)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_other_dtypes_are_not_marked(lowered: list[dict[str, Any]], dtype: torch.dtype) -> None:
    """float32 convolutions stay float32; float16 ones are widened but never take bfloat16 products
    (they would lose float16's three extra mantissa bits)."""
    model = _Block(16).to(dtype)
    x = randn(1, 16, 10, 10, seed=1).to(dtype)
    with torch.no_grad():
        want = model(x)
        got = run_native(model, x, require_native=True)
    tol = {"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32 else {"rtol": 2e-3, "atol": 4e-3}
    torch.testing.assert_close(got, want, **tol)
    steps = _conv_steps(lowered)
    assert steps and not any(s["bf16"] for s in steps), steps


def test_mixed_input_is_not_marked(lowered: list[dict[str, Any]]) -> None:
    """A float32 input against bfloat16 weights widened by hand is not a bfloat16 convolution."""
    w = randn(16, 16, 3, 3, seed=3).to(BF16)

    def fn(x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, w.float(), padding=1)

    x = randn(1, 16, 9, 9)
    with torch.no_grad():
        got = run_native(fn, x, require_native=True)
    torch.testing.assert_close(got, fn(x), rtol=1e-4, atol=1e-4)
    steps = _conv_steps(lowered)
    assert steps and not any(s["bf16"] for s in steps), steps


class _Inverted(nn.Module):
    """A MobileNet inverted residual: 1×1 expand, 3×3 depthwise, 1×1 project (each with its
    norm, ReLU6 after the first two), + x."""

    def __init__(self, c: int, expand: int = 4) -> None:
        super().__init__()
        torch.manual_seed(1)
        h = c * expand
        self.body = nn.Sequential(
            nn.Conv2d(c, h, 1, bias=False), _bn(h, 1), nn.ReLU6(),
            nn.Conv2d(h, h, 3, padding=1, groups=h, bias=False), _bn(h, 2), nn.ReLU6(),
            nn.Conv2d(h, c, 1, bias=False), _bn(c, 3),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


@pytest.mark.parametrize("mode", ["bf16", "autocast"])
@pytest.mark.parametrize(("c", "h", "w", "n"), [(16, 12, 12, 2), (7, 9, 13, 1)])
def test_bfloat16_inverted_residual(lowered: list[dict[str, Any]], mode: str, c: int, h: int, w: int, n: int) -> None:
    """1×1 convolutions (the pair GEMM on the input planes, an odd channel count included), a
    depthwise one (float32), norms, ReLU6 and the residual folded, against eager bfloat16."""
    model = _Inverted(c)
    x = randn(n, c, h, w, seed=4)
    if mode == "bf16":
        model, x = model.to(BF16), x.to(BF16)
    ctx: Callable[[], Any] = (
        (lambda: torch.autocast("cpu", dtype=BF16)) if mode == "autocast" else contextlib.nullcontext
    )

    def fn(x: torch.Tensor) -> torch.Tensor:
        with ctx():
            return model(x)

    with torch.no_grad():
        want = fn(x)
        got = run_native(fn, x, require_native=True)
        exact = _Inverted(c).double()(x.double())
    torch.testing.assert_close(got.float(), want.float(), **TOL)
    err = (got.double() - exact).abs().max().item()
    eager_err = (want.double() - exact).abs().max().item()
    assert err <= 2 * eager_err, (err, eager_err)
    steps = _conv_steps(lowered)
    assert len(steps) == 3 and all(s["bf16"] for s in steps), steps


@pytest.mark.parametrize("kw", [{"kernel_size": 8, "stride": 8}, {"kernel_size": 3, "stride": 2, "padding": 1}])
def test_bfloat16_strided_convolution(lowered: list[dict[str, Any]], kw: dict[str, Any]) -> None:
    """Through im2col (a ViT's patch embedding, a strided 3×3) on the pair GEMM, with a bias."""
    torch.manual_seed(2)
    conv = nn.Conv2d(3, 32, **kw).to(BF16)
    x = randn(2, 3, 32, 24, seed=6).to(BF16)
    with torch.no_grad():
        want = conv(x)
        got = run_native(conv, x, require_native=True)
        exact = F.conv2d(
            x.double(), conv.weight.double(), conv.bias.double(), **{k: v for k, v in kw.items() if k != "kernel_size"}
        )
    torch.testing.assert_close(got.float(), want.float(), **TOL)
    assert (got.double() - exact).abs().max() <= 2 * (want.double() - exact).abs().max()
    assert all(s["bf16"] for s in _conv_steps(lowered))
