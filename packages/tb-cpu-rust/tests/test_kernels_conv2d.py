"""2-d convolution on native_cpu against PyTorch (kernels/conv/conv2d.rs, lowering/conv_pool.py and
lowering/conv_fusion.py): shapes, strides, padding (zeros and the reflect / circular pads the graph
carries), dilation, groups, depthwise with a channel multiplier, channels_last, non-contiguous and
empty inputs, NaN / inf; the inference Conv + BatchNorm (+ ReLU / ReLU6, + residual add) folded into
one ``conv2d`` step (asserted on the plan); and property tests of the step itself at the Rust
boundary (hypothesis), on the CPU's best path and the portable one (``TB_CONV_PORTABLE=1``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from native_helpers import randn, run_native
from torch import nn

from tb_cpu_rust import _native
from tb_cpu_rust.engine import NativeCpuEngine

TOL = {"rtol": 1e-4, "atol": 1e-4}


def _check(fn: Callable[..., Any], *args: torch.Tensor) -> None:
    want = fn(*[a.clone() for a in args])
    got = run_native(fn, *args, require_native=True)
    torch.testing.assert_close(got, want, equal_nan=True, **TOL)
    if isinstance(want, torch.Tensor):
        assert got.stride() == want.stride()  # the layout eager gives (channels_last in, out)


CASES = [
    # (x shape, out channels, kernel, conv kwargs)
    ((2, 4, 9, 9), 6, 1, {}),
    ((2, 4, 9, 9), 6, 3, {"padding": 1}),
    ((1, 3, 11, 10), 5, 5, {"padding": 2}),
    ((2, 3, 17, 17), 8, 7, {"stride": 2, "padding": 3}),
    ((2, 4, 10, 9), 6, 3, {"stride": 2}),
    ((2, 4, 12, 12), 6, 3, {"dilation": 2, "padding": 2}),
    ((2, 4, 8, 8), 6, 3, {"groups": 2, "padding": 1}),
    ((2, 6, 9, 9), 6, 3, {"groups": 6, "padding": 1}),  # depthwise
    ((2, 6, 9, 9), 12, 3, {"groups": 6, "padding": 1}),  # depthwise, channel multiplier 2
    ((2, 8, 11, 11), 8, 5, {"groups": 8, "stride": 2, "padding": 2}),  # depthwise 5x5 stride 2
    ((2, 8, 11, 11), 8, 3, {"groups": 8, "dilation": 2, "padding": 0}),
    ((1, 3, 1, 12), 4, (1, 3), {"padding": (0, 1)}),
    ((3, 2, 5, 5), 3, 3, {"padding": 1, "bias": False}),
    ((2, 64, 8, 8), 32, 3, {"padding": 1}),  # K past one GEMM depth block, several row chunks
    # >= 16 input channels: odd sizes, dilation, no padding, 1-d windows, several chunks
    ((1, 16, 7, 9), 20, 3, {"padding": 1}),  # out channels not a multiple of the kernel's rows
    ((3, 17, 10, 11), 13, 5, {"padding": 2}),
    ((2, 16, 12, 12), 8, 3, {"dilation": 2, "padding": 2}),
    ((2, 16, 9, 9), 24, 3, {}),  # no padding
    ((2, 16, 5, 12), 8, (1, 3), {"padding": (0, 1)}),
    ((2, 16, 12, 5), 8, (3, 1), {"padding": (1, 0)}),
    ((1, 16, 64, 64), 8, 3, {"padding": 1, "bias": False}),  # several row chunks per image
    ((2, 32, 30, 30), 16, 3, {"padding": 1}),
]


#: cases also run channels_last (input and weight): 1x1, 3x3, strided 7x7, grouped, depthwise x2
CHANNELS_LAST = {0, 1, 3, 6, 8, 13, 14}


@pytest.mark.parametrize(
    ("x_shape", "cout", "k", "kw", "layout"),
    [(*case, "contiguous") for case in CASES] + [(*CASES[i], "channels_last") for i in sorted(CHANNELS_LAST)],
)
def test_conv2d_matches_torch(x_shape: tuple[int, ...], cout: int, k: Any, kw: dict[str, Any], layout: str) -> None:
    torch.manual_seed(0)
    conv = nn.Conv2d(x_shape[1], cout, k, **kw)
    x = randn(*x_shape)
    if layout == "channels_last":
        conv = conv.to(memory_format=torch.channels_last)
        x = x.to(memory_format=torch.channels_last)
    _check(conv, x)


def test_conv2d_mixed_layouts_noncontiguous_and_functional() -> None:
    w, b = randn(6, 4, 3, 3, seed=1), randn(6, seed=2)
    x = randn(2, 4, 10, 12)
    _check(lambda t: F.conv2d(t, w.to(memory_format=torch.channels_last), b, padding=1), x)
    xl = x.to(memory_format=torch.channels_last)
    _check(lambda t: F.conv2d(t, w, b, padding=1), xl)
    big = randn(3, 8, 14, 16)
    _check(lambda t: F.conv2d(t[1:, 2:6, 1:11, ::2], w, b, stride=1, padding=1), big)  # a slice
    w16 = randn(6, 16, 3, 3, seed=3)
    wide = randn(3, 20, 14, 16)
    _check(lambda t: F.conv2d(t[1:, 2:18, 1:11, ::2], w16, b, padding=1), wide)  # 16 channels of a slice
    _check(lambda t: F.conv2d(t[:, :4, :, 1:13], w[:, :, :1, :1].contiguous()), big)  # 1x1 on a slice


@pytest.mark.parametrize("mode", ["reflect", "circular", "replicate"])
def test_conv2d_padding_modes(mode: str) -> None:
    conv = nn.Conv2d(3, 4, 3, padding=1, padding_mode=mode)
    _check(conv, randn(2, 3, 7, 8))


@pytest.mark.parametrize("c", [4, 16])
def test_conv2d_empty_batch_single_and_nonfinite(c: int) -> None:
    conv = nn.Conv2d(c, 6, 3, padding=1)
    _check(conv, randn(0, c, 6, 6))
    _check(conv, randn(1, c, 6, 6))
    x = randn(2, c, 6, 6)
    x[0, 1, 2, 3] = float("nan")
    x[1, 2, 0, 0] = float("inf")
    x[1, 3, 5, 5] = -float("inf")
    _check(conv, x)
    x[0, c - 1, 0, 5] = float("nan")  # at a row's end
    _check(conv, x)
    dw = nn.Conv2d(c, c, 3, padding=1, groups=c)
    _check(dw, x)


# -- Conv + BatchNorm (+ activation, + residual) folded --------------------------------------------


@pytest.fixture
def plans(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[list[dict[str, Any]]]]:
    """The executor steps of every partition native_cpu compiles during the test."""
    seen: list[list[dict[str, Any]]] = []
    orig = NativeCpuEngine.compile

    def compile(self: NativeCpuEngine, plan: Any) -> Any:
        prog = orig(self, plan)
        seen.append(json.loads(prog.lowered["json"])["steps"])
        return prog

    monkeypatch.setattr(NativeCpuEngine, "compile", compile)
    yield seen


def _bn(c: int, affine: bool = True) -> nn.BatchNorm2d:
    bn = nn.BatchNorm2d(c, affine=affine, eps=1e-3)
    with torch.no_grad():
        assert bn.running_mean is not None and bn.running_var is not None
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.3, 2.0)
        if affine:
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.5, 0.5)
    return bn.eval()


class _Block(nn.Module):
    def __init__(self, c: int, act: str, residual: bool, groups: int = 1, bias: bool = False, affine: bool = True):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1, groups=groups, bias=bias)
        self.bn = _bn(c, affine)
        self.act, self.residual = act, residual

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn(self.conv(x))
        if self.residual:
            y = y + x
        if self.act == "relu":
            y = torch.relu(y)
        elif self.act == "relu6":
            y = F.relu6(y)
        return y


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize(
    ("act", "residual", "groups", "bias", "affine"),
    [
        ("none", False, 1, False, True),
        ("relu", False, 1, True, True),
        ("relu", True, 1, False, True),
        ("relu6", False, 8, False, True),  # MobileNet's depthwise conv + BN + ReLU6
        ("relu6", True, 2, True, False),
    ],
)
@pytest.mark.parametrize("c", [8, 16])
def test_conv_batchnorm_fused(
    plans: list[list[dict[str, Any]]],
    act: str,
    residual: bool,
    groups: int,
    bias: bool,
    affine: bool,
    layout: str,
    c: int,
) -> None:
    torch.manual_seed(0)
    block = _Block(c, act, residual, groups, bias, affine).eval()
    x = randn(2, c, 9, 9)
    if layout == "channels_last":
        block = block.to(memory_format=torch.channels_last)
        x = x.to(memory_format=torch.channels_last)
    x[0, 0, 0, 0] = float("nan")  # NaN flows through the folded norm and the activation
    _check(block, x)
    steps = [s for p in plans for s in p]
    assert [s["op"] for s in steps] == ["conv2d"], steps  # one step: norm, activation and add folded
    conv = steps[0]
    assert conv["ins"][6] is not None and conv["ins"][7] is not None  # the norm's mean and var
    want = (["add"] if residual else []) + {"none": [], "relu": ["relu"], "relu6": ["hardtanh:0.0:6.0"]}[act]
    assert conv["epilogue"] == want


@pytest.mark.parametrize("w", [5, 16, 17, 40, 64, 70])
@pytest.mark.parametrize(("k", "dil"), [(3, 1), (5, 1), (3, 2)])
@pytest.mark.parametrize("epilogue", ["bn+add+relu6", "bias+relu", "none"])
def test_depthwise_stride1_rows_and_epilogue(
    plans: list[list[dict[str, Any]]], w: int, k: int, dil: int, epilogue: str
) -> None:
    """Stride-1 3×3 / 5×5 depthwise planes (the vector kernel, kernels/conv/depthwise_vector.rs,
    where the CPU has it): output widths below, at and past each block of 16 / 32 / 48 / 64
    columns (a masked last vector), dilation, and the folded norm, residual and activation run on
    the sums; NaN and ±inf in the input."""
    torch.manual_seed(0)
    c = 6
    conv = nn.Conv2d(c, c, k, padding=dil * (k // 2), dilation=dil, groups=c, bias=epilogue == "bias+relu")
    bn = _bn(c)

    def fn(x: torch.Tensor) -> torch.Tensor:
        if epilogue == "bn+add+relu6":
            return F.relu6(bn(conv(x)) + x)
        if epilogue == "bias+relu":
            return torch.relu(conv(x))
        return conv(x)

    x = randn(2, c, 7, w)
    x[0, 0, 0, 0] = float("nan")
    x[1, 1, 3, w - 1] = float("inf")
    x[1, 2, 6, w // 2] = float("-inf")
    _check(fn, x)
    steps = [s for p in plans for s in p]
    assert [s["op"] for s in steps] == ["conv2d"], steps
    want = {"bn+add+relu6": ["add", "hardtanh:0.0:6.0"], "bias+relu": ["relu"], "none": []}[epilogue]
    assert steps[0]["epilogue"] == want


#: 3×3 stride-1 convolutions the Winograd path takes (≥ 16 channels each side, output ≥ 7 wide):
#: (x shape, out channels, padding, input view)
WINOGRAD_CASES = [
    ((2, 16, 8, 8), 16, 1, "contiguous"),
    ((1, 24, 15, 13), 32, 1, "contiguous"),  # odd output: a tile half outside, both ways
    ((2, 32, 12, 40), 16, 0, "contiguous"),  # no padding; 19 tiles a row (a run across panels)
    ((1, 16, 9, 9), 20, 2, "contiguous"),
    ((2, 16, 11, 30), 24, 1, "channel_slice"),  # every other channel of a bigger tensor
    ((1, 16, 10, 12), 16, 1, "transposed"),  # rows not contiguous (the strided input transform)
    ((1, 300, 6, 9), 17, 1, "contiguous"),  # the GEMM's depth in two slices
    ((3, 64, 16, 16), 64, 1, "contiguous"),  # several chunks of tile rows
    ((0, 16, 8, 8), 16, 1, "contiguous"),
    ((2, 16, 8, 8), 16, 1, "channels_last"),  # planes transposed in, the output transposed back
    ((1, 24, 15, 13), 32, 2, "channels_last"),
]


def _winograd_input(shape: tuple[int, ...], view: str) -> torch.Tensor:
    n, c, h, w = shape
    if view == "channel_slice":
        return randn(n, 2 * c, h, w)[:, ::2]
    if view == "transposed":
        return randn(n, c, w, h).transpose(2, 3)
    if view == "channels_last":
        return randn(n, c, h, w).to(memory_format=torch.channels_last)
    return randn(n, c, h, w)


@pytest.mark.parametrize(("x_shape", "cout", "pad", "view"), WINOGRAD_CASES)
@pytest.mark.parametrize("epilogue", ["none", "bn+add+relu", "bias+relu6"])
def test_conv3x3_winograd_matches_torch(
    plans: list[list[dict[str, Any]]], x_shape: tuple[int, ...], cout: int, pad: int, view: str, epilogue: str
) -> None:
    """Winograd F(2×2, 3×3) (kernels/conv/winograd.rs) against eager: odd sizes, padding 0-2,
    strided inputs, empty batch, two depth slices, and the folded norm / residual / activation
    applied to its outputs; NaN and ±inf inputs (the outputs they reach are recomputed as the
    direct sum, so an inf stays ±inf where the transforms would make it inf - inf)."""
    torch.manual_seed(0)
    c = x_shape[1]
    conv = nn.Conv2d(c, cout, 3, padding=pad, bias=epilogue == "bias+relu6")
    bn = _bn(cout)
    res = randn(x_shape[0], cout, x_shape[2] + 2 * pad - 2, x_shape[3] + 2 * pad - 2, seed=1)

    def fn(x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        if epilogue == "bn+add+relu":
            return torch.relu(bn(conv(x)) + r)
        if epilogue == "bias+relu6":
            return F.relu6(conv(x))
        return conv(x)

    x = _winograd_input(x_shape, view)
    _check(fn, x, res)
    if x.numel():
        x = x.clone()
        x[0, 0, 0, 0] = float("nan")
        x[-1, 1, 2, 3] = float("inf")
        x[-1, c - 1, x.shape[2] - 1, x.shape[3] // 2] = float("-inf")
        _check(fn, x, res)
    ops = {s["op"] for p in plans for s in p}
    assert ops == {"conv2d"} if x.numel() else "conv2d" in ops  # norm, add and activation folded


class _ConvPool(nn.Module):
    """conv → [bn] → activation → max pool, as CNNs stack them."""

    def __init__(self, cin: int, cout: int, act: str, k: int = 3, bn: bool = True, pool: tuple[int, int] = (2, 2)):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, padding=k // 2)
        self.bn = _bn(cout) if bn else nn.Identity()
        self.act, self.pool = act, pool

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn(self.conv(x))
        y = {"relu": torch.relu, "relu6": F.relu6, "silu": F.silu, "none": lambda t: t}[self.act](y)
        return F.max_pool2d(y, self.pool[0], self.pool[1])


@pytest.mark.parametrize(
    ("cin", "cout", "hw", "act", "bn", "layout"),
    [
        (16, 16, (8, 8), "relu", True, "contiguous"),  # Winograd: its tiles pooled before the epilogue
        (24, 32, (15, 13), "relu6", True, "contiguous"),  # odd: the last row / column dropped (floor)
        (16, 20, (9, 17), "none", False, "contiguous"),
        (3, 16, (10, 10), "relu", True, "contiguous"),  # im2col: a scratch result pooled
        (16, 16, (8, 10), "relu", True, "channels_last"),
        (32, 64, (16, 16), "relu", True, "contiguous"),  # the bench CNN's second layer
    ],
)
def test_conv_max_pool_folded(
    plans: list[list[dict[str, Any]]], cin: int, cout: int, hw: tuple[int, int], act: str, bn: bool, layout: str
) -> None:
    """A 2×2 stride-2 max pool after conv (+ bn) (+ relu / relu6) folds into the conv2d step
    (pool = 2, no max_pool2d step) and matches eager: NaN wins a window, ±inf stays."""
    torch.manual_seed(0)
    block = _ConvPool(cin, cout, act, bn=bn).eval()
    x = randn(2, cin, *hw)
    if layout == "channels_last":
        block, x = block.to(memory_format=torch.channels_last), x.to(memory_format=torch.channels_last)
    _check(block, x)
    x = x.clone()
    x[0, 0, 1, 1] = float("nan")
    x[1, cin - 1, 3, 2] = float("inf")
    x[1, 1, hw[0] - 1, hw[1] - 1] = -float("inf")
    _check(block, x)
    for p in plans:  # one plan per compiled call
        assert [s["op"] for s in p] == ["conv2d"] and p[0]["pool"] == 2, p


@pytest.mark.parametrize("case", ["silu", "stride1", "kernel3", "ceil", "residual", "indices_read"])
def test_conv_max_pool_not_folded(plans: list[list[dict[str, Any]]], case: str) -> None:
    """A non-monotone activation, other windows, a residual or read indices: the pool stays a step."""
    torch.manual_seed(0)
    conv, bn = nn.Conv2d(16, 16, 3, padding=1), _bn(16)
    x = randn(2, 16, 8, 8)

    def fn(x: torch.Tensor) -> Any:
        y = bn(conv(x))
        if case == "silu":
            return F.max_pool2d(F.silu(y), 2)
        if case == "stride1":
            return F.max_pool2d(torch.relu(y), 2, 1)
        if case == "kernel3":
            return F.max_pool2d(torch.relu(y), 3, 2)
        if case == "ceil":
            return F.max_pool2d(torch.relu(y[..., :7]), 2, 2, ceil_mode=True)
        if case == "residual":
            return F.max_pool2d(torch.relu(y + x), 2)
        return F.max_pool2d(torch.relu(y), 2, return_indices=True)

    _check(fn, x)
    steps = [s for p in plans for s in p]
    assert "max_pool2d" in [s["op"] for s in steps], steps
    assert all(s.get("pool", 0) == 0 for s in steps if s["op"] == "conv2d")


def test_conv3x3_winograd_error_is_the_direct_paths_size() -> None:
    """Against a float64 reference, the transforms' error stays of the size of eager's float32
    direct convolution (256 input channels: the longest sums here)."""
    torch.manual_seed(0)
    x = randn(2, 256, 16, 16)
    w = torch.randn(64, 256, 3, 3, generator=torch.Generator().manual_seed(3)) / 48.0
    ref = F.conv2d(x.double(), w.double(), padding=1)
    eager_err = (F.conv2d(x, w, padding=1).double() - ref).abs().max().item()
    got = run_native(lambda a: F.conv2d(a, w, padding=1), x, require_native=True)
    err = (got.double() - ref).abs().max().item()
    assert err <= 4 * eager_err, (err, eager_err)


def test_conv3x3_winograd_switch() -> None:
    """TB_CONV_WINOGRAD=0 (read once per process) takes im2col instead; both match eager."""
    code = (
        "import test_kernels_conv2d as t\n"
        "for case in t.WINOGRAD_CASES[:4]: t._check(t.nn.Conv2d(case[0][1], case[1], 3, padding=case[2]), "
        "t._winograd_input(case[0], case[3]))\n"
        "print('ok')"
    )
    for flag in ("0", "1"):
        env = {**os.environ, "TB_CONV_WINOGRAD": flag}
        r = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=os.path.dirname(__file__)
        )
        assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout[-3000:] + r.stderr[-3000:]


def test_conv_batchnorm_not_folded_when_conv_result_is_read_twice(plans: list[list[dict[str, Any]]]) -> None:
    conv, bn = nn.Conv2d(4, 4, 3, padding=1, bias=False), _bn(4)

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = conv(x)
        return bn(y), y

    _check(fn, randn(2, 4, 6, 6))
    conv_steps = [s for p in plans for s in p if s["op"] == "conv2d"]
    assert conv_steps and all(s["ins"][6] is None for s in conv_steps)


class _ResNetBlock(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(c, c, 3, padding=1, bias=False),
            _bn(c),
            nn.ReLU(),
            nn.Conv2d(c, c, 3, padding=1, bias=False),
            _bn(c),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + x)


class _InvertedResidual(nn.Module):
    def __init__(self, c: int, h: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(c, h, 1, bias=False), _bn(h), nn.ReLU6(),
            nn.Conv2d(h, h, 3, padding=1, groups=h, bias=False), _bn(h), nn.ReLU6(),
            nn.Conv2d(h, c, 1, bias=False), _bn(c),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


@pytest.mark.parametrize(
    "block", [_ResNetBlock(8), _ResNetBlock(16), _InvertedResidual(8, 32)], ids=["resnet", "resnet16", "mobilenet"]
)
def test_model_blocks_are_one_step_per_conv(plans: list[list[dict[str, Any]]], block: nn.Module) -> None:
    """The model set's ResNet and MobileNet blocks: every norm, activation and add folded."""
    block.eval()
    cin = next(m for m in block.modules() if isinstance(m, nn.Conv2d)).in_channels
    _check(block, randn(2, cin, 10, 10))
    steps = [s["op"] for p in plans for s in p]
    assert steps == ["conv2d"] * sum(isinstance(m, nn.Conv2d) for m in block.modules()), steps


# -- the step at the Rust boundary -----------------------------------------------------------------


def _conv_spec(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor, operands: list[torch.Tensor | None], **p: Any) -> str:
    """A plan of one conv2d step: inputs x, w and the present optional operands, output y."""
    tensors: list[torch.Tensor] = [x, w, *[t for t in operands if t is not None]]
    buffers = [
        {"kind": "input", "dtype": "float32", "numel": 0, "sizes": list(t.shape), "strides": list(t.stride())}
        for t in tensors
    ]
    buffers.append(
        {"kind": "output", "dtype": "float32", "numel": y.numel(), "sizes": list(y.shape), "strides": list(y.stride())}
    )
    values = [
        {"buf": i, "offset": 0, "sizes": list(t.shape), "strides": list(t.stride())} for i, t in enumerate(tensors)
    ]
    values.append({"buf": len(tensors), "offset": 0, "sizes": list(y.shape), "strides": list(y.stride())})
    ins: list[int | None] = [0, 1]
    k = 2
    for t in operands:
        ins.append(k if t is not None else None)
        k += t is not None
    step = {"op": "conv2d", "ins": ins, "outs": [len(tensors)], "epilogue": [], "eps": 1e-5, **p}
    return json.dumps({"buffers": buffers, "values": values, "steps": [step]})


def _run_step(
    n: int, cg: int, ocg: int, groups: int, hw: tuple[int, int], k: tuple[int, int], stride: tuple[int, int],
    pad: tuple[int, int], dil: tuple[int, int], channels_last: bool, fold: bool, residual: bool,
) -> None:  # fmt: skip
    """One conv2d step through the executor against F.conv2d (+ batch_norm, + add and relu)."""
    c, oc = cg * groups, ocg * groups
    eh = [hw[d] + 2 * pad[d] - dil[d] * (k[d] - 1) - 1 for d in (0, 1)]
    if min(eh) < 0:
        return
    oh, ow = eh[0] // stride[0] + 1, eh[1] // stride[1] + 1
    g = torch.Generator().manual_seed(n + 7 * c + 13 * oc + 31 * hw[0] + 61 * hw[1])
    x = torch.randn(n, c, *hw, generator=g)
    w = torch.randn(oc, cg, *k, generator=g)
    bias = torch.randn(oc, generator=g)
    y = torch.empty(n, oc, oh, ow)
    if channels_last:
        x, w, y = (t.to(memory_format=torch.channels_last) for t in (x, w, y))
    want = F.conv2d(x, w, bias, stride, pad, dil, groups)
    operands: list[torch.Tensor | None] = [bias, None, None, None, None, None]
    epilogue: list[str] = []
    if fold:
        bw, bb = torch.rand(oc, generator=g) + 0.5, torch.randn(oc, generator=g)
        mean, var = torch.randn(oc, generator=g), torch.rand(oc, generator=g) + 0.5
        operands[2:] = [bw, bb, mean, var]
        want = F.batch_norm(want, mean, var, bw, bb, False, 0.0, 1e-5)
    if residual:
        r = torch.randn(n, oc, oh, ow, generator=g)
        operands[1] = r
        epilogue = ["add", "relu"]
        want = torch.relu(want + r)
    geo = {"stride": list(stride), "padding": list(pad), "dilation": list(dil), "groups": groups}
    spec = json.loads(_conv_spec(x, w, y, operands, **geo))
    spec["steps"][0]["epilogue"] = epilogue
    _native.Executor(json.dumps(spec)).run([x, w, *[t for t in operands if t is not None]], [y])
    torch.testing.assert_close(y, want, **TOL)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(0, 2),
    cg=st.integers(1, 3),
    ocg=st.integers(1, 3),
    groups=st.integers(1, 3),
    hw=st.tuples(st.integers(1, 7), st.integers(1, 7)),
    k=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    stride=st.tuples(st.integers(1, 2), st.integers(1, 2)),
    pad=st.tuples(st.integers(0, 2), st.integers(0, 2)),
    dil=st.tuples(st.integers(1, 2), st.integers(1, 2)),
    depthwise=st.booleans(),
    channels_last=st.booleans(),
    fold=st.booleans(),
    residual=st.booleans(),
)
def test_conv2d_step_property(
    n: int, cg: int, ocg: int, groups: int, hw: tuple[int, int], k: tuple[int, int], stride: tuple[int, int],
    pad: tuple[int, int], dil: tuple[int, int], depthwise: bool, channels_last: bool, fold: bool, residual: bool,
) -> None:  # fmt: skip
    _run_step(n, 1 if depthwise else cg, ocg, groups, hw, k, stride, pad, dil, channels_last, fold, residual)


#: depthwise (the direct kernel) and general cases the portable-path run repeats
PORTABLE_CASES = [
    (2, 1, 1, 16, (9, 9), (3, 3), (1, 1), (1, 1), (1, 1), False, True, True),
    (1, 1, 2, 8, (11, 10), (5, 5), (2, 2), (2, 2), (1, 1), False, False, False),
    (2, 1, 1, 8, (9, 9), (3, 3), (1, 2), (2, 1), (2, 1), True, True, False),
    (2, 3, 4, 1, (7, 7), (3, 3), (1, 1), (1, 1), (1, 1), True, True, True),
    (1, 2, 2, 2, (6, 5), (1, 1), (1, 1), (0, 0), (1, 1), False, False, True),
]


def portable_cases() -> None:
    for case in PORTABLE_CASES:
        _run_step(*case)


def test_portable_path_matches_torch() -> None:
    """The depthwise kernel's portable path (TB_CONV_PORTABLE=1, read once per process) in a child."""
    env = {**os.environ, "TB_CONV_PORTABLE": "1"}
    code = "import test_kernels_conv2d as t; t.portable_cases(); print('ok')"
    r = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=os.path.dirname(__file__)
    )
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout[-3000:] + r.stderr[-3000:]


def test_best_path_cases() -> None:
    portable_cases()


def test_conv2d_step_refuses_bad_operands() -> None:
    x, w, y = torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3), torch.empty(1, 3, 3, 3)
    mean = torch.randn(3)
    geo = {"stride": [1, 1], "padding": [0, 0], "dilation": [1, 1], "groups": 1}
    with pytest.raises(ValueError, match="mean and var"):
        _native.Executor(_conv_spec(x, w, y, [None, None, None, None, mean, None], **geo))
    with pytest.raises(ValueError, match="residual operand and epilogue disagree"):
        _native.Executor(_conv_spec(x, w, y, [None, torch.randn(1, 3, 3, 3), None, None, None, None], **geo))
    with pytest.raises(ValueError, match="output shape"):
        _native.Executor(_conv_spec(x, w, torch.empty(1, 3, 4, 4), [None] * 6, **geo))
    bad = json.loads(_conv_spec(x, w, y, [None] * 6, **geo))
    bad["steps"][0]["epilogue"] = ["hardtanh:0"]
    with pytest.raises(ValueError, match="epilogue"):
        _native.Executor(json.dumps(bad))
    # pool: only 2, the pooled shape, no residual, relu / clamp only
    with pytest.raises(ValueError, match="pool is 0"):
        _native.Executor(_conv_spec(x, w, y, [None] * 6, **geo, pool=3))
    with pytest.raises(ValueError, match="output shape"):
        _native.Executor(_conv_spec(x, w, y, [None] * 6, **geo, pool=2))
    pooled = json.loads(_conv_spec(x, w, torch.empty(1, 3, 1, 1), [None] * 6, **geo, pool=2))
    _native.Executor(json.dumps(pooled))
    pooled["steps"][0]["epilogue"] = ["sigmoid"]
    with pytest.raises(ValueError, match="non-monotone"):
        _native.Executor(json.dumps(pooled))


@pytest.mark.parametrize(("k", "s", "p", "d"), [(2, 2, 0, 1), (3, 2, 0, 1), (3, 1, 1, 1), (2, 1, 0, 2), (3, 2, 1, 1)])
def test_max_pool_values_and_indices(k: int, s: int, p: int, d: int) -> None:
    """Max pooling (the windows-inside fast path and the padded one): values and indices, NaN."""
    x = randn(2, 3, 9, 8)
    x[0, 0, 1, 1] = float("nan")
    x[1, 2, 4:6, 4:6] = 5.0  # ties: the first maximum's index
    _check(lambda t: F.max_pool2d(t, k, s, p, d, return_indices=True), x)
    _check(lambda t: F.max_pool2d(t[:, :, 1:, ::2], k, s, p, d, return_indices=True), x)


@pytest.mark.parametrize("width", [2, 17, 32, 33, 34, 65, 100])
@pytest.mark.parametrize("indices", [True, False])
def test_max_pool_2x2_rows(width: int, indices: bool) -> None:
    """The 2×2 stride-2 pool's 16-wide rows (AVX-512): widths around the blocks, odd sizes,
    padded row strides, NaN / ±inf / ties at block edges, channels_last (its own path)."""
    x = randn(2, 3, 7, width + 3)[..., :width]
    x[0, 0, 1, min(15, width - 1)] = float("nan")
    x[0, 1, 2, width - 1] = float("inf")
    x[1, 0, 3:5, :] = float("-inf")
    x[1, 2, 4:6, : width // 2] = 5.0  # ties: the first maximum's index
    _check(lambda t: F.max_pool2d(t, 2, 2, return_indices=indices), x)
    _check(lambda t: F.max_pool2d(t, 2, 2, return_indices=indices), x.contiguous(memory_format=torch.channels_last))
