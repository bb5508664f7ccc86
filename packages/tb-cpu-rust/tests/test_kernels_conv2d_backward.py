"""The backward of 1-d and 2-d convolution on native_cpu (kernels/conv/conv2d_backward.rs,
lowering/conv_backward.py) against PyTorch autograd: shapes, strides, padding, dilation, groups,
depthwise with a channel multiplier, channels_last, non-contiguous gradients, empty batch, NaN /
inf, every output mask; and property tests of the ``conv2d_backward`` step at the Rust boundary
(hypothesis), with its refusals of bad operands."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from native_helpers import randn, run_native

from tb_cpu_rust import _native

TOL: dict[str, Any] = {"rtol": 1e-4, "atol": 1e-4}


def _conv_fn(x: torch.Tensor, w: torch.Tensor, kw: dict[str, Any]) -> torch.Tensor:
    return F.conv1d(x, w, **kw) if x.dim() == 3 else F.conv2d(x, w, **kw)


def _autograd(x: torch.Tensor, w: torch.Tensor, gy: torch.Tensor, kw: dict[str, Any], bias: bool) -> list[torch.Tensor]:
    """grad_input, grad_weight (and grad_bias) of the convolution by torch autograd."""
    xr, wr = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    b = torch.zeros(w.shape[0], dtype=w.dtype, requires_grad=True) if bias else None
    y = _conv_fn(xr, wr, {**kw, "bias": b})
    wrt = [xr, wr] + ([b] if b is not None else [])
    return list(torch.autograd.grad(y, wrt, gy))


def _backward_op(kw: dict[str, Any], mask: list[bool], bias: bool, rank: int) -> Any:
    """The graph AOTAutograd's backward holds: one ``aten.convolution_backward`` node."""
    nd = rank - 2

    def spread(v: Any) -> list[int]:
        return [v] * nd if isinstance(v, int) else list(v)

    stride, pad, dil = spread(kw.get("stride", 1)), spread(kw.get("padding", 0)), spread(kw.get("dilation", 1))

    def fn(gy: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> Any:
        return torch.ops.aten.convolution_backward(
            gy, x, w, [w.shape[0]] if bias else None, stride, pad, dil, False, [0] * nd, kw.get("groups", 1), mask
        )

    return fn


def _check(x: torch.Tensor, w: torch.Tensor, kw: dict[str, Any], gy: torch.Tensor | None = None) -> None:
    """Every gradient, native against autograd; the layouts eager gives."""
    y = _conv_fn(x, w, kw)
    if gy is None:
        gy = randn(*y.shape, seed=5)
        if x.is_contiguous(memory_format=torch.channels_last) and x.dim() == 4 and not x.is_contiguous():
            gy = gy.to(memory_format=torch.channels_last)
    want = _autograd(x, w, gy, kw, bias=True)
    got = run_native(_backward_op(kw, [True, True, True], True, x.dim()), gy, x, w, require_native=True)
    for name, g, e in zip(("grad_input", "grad_weight", "grad_bias"), got, want):
        torch.testing.assert_close(g, e, equal_nan=True, **TOL, msg=_named(name))
    eager = torch.ops.aten.convolution_backward(gy, x, w, [w.shape[0]], *_geometry(kw, x.dim()), [True] * 3)
    for g, e in zip(got, eager):
        assert g.shape == e.shape and g.stride() == e.stride()


def _named(name: str) -> Callable[[str], str]:
    """An assert_close message that says which gradient differs."""
    return lambda m: f"{name}: {m}"


def _geometry(kw: dict[str, Any], rank: int) -> tuple[Any, ...]:
    nd = rank - 2

    def spread(v: Any) -> list[int]:
        return [v] * nd if isinstance(v, int) else list(v)

    return (
        spread(kw.get("stride", 1)), spread(kw.get("padding", 0)), spread(kw.get("dilation", 1)), False, [0] * nd,
        kw.get("groups", 1),
    )  # fmt: skip


CASES = [
    # (x shape, out channels, kernel, conv kwargs): the ResNet / MobileNet shapes, scaled down
    ((2, 4, 9, 9), 6, 1, {}),
    ((2, 4, 9, 9), 6, 3, {"padding": 1}),
    ((1, 3, 11, 10), 5, 5, {"padding": 2}),
    ((2, 3, 17, 17), 8, 7, {"stride": 2, "padding": 3}),
    ((2, 4, 10, 9), 6, 3, {"stride": 2}),
    ((2, 4, 9, 9), 6, 1, {"stride": 2}),  # 1x1 strided (ResNet's downsample)
    ((2, 4, 12, 12), 6, 3, {"dilation": 2, "padding": 2}),
    ((2, 4, 8, 8), 6, 3, {"groups": 2, "padding": 1}),
    ((2, 6, 9, 9), 6, 3, {"groups": 6, "padding": 1}),  # depthwise
    ((2, 6, 9, 9), 12, 3, {"groups": 6, "padding": 1}),  # depthwise, channel multiplier 2
    ((2, 8, 11, 11), 8, 5, {"groups": 8, "stride": 2, "padding": 2}),  # depthwise 5x5 stride 2
    ((2, 8, 11, 11), 8, 3, {"groups": 8, "dilation": 2}),
    ((1, 3, 1, 12), 4, (1, 3), {"padding": (0, 1)}),
    ((2, 3, 7, 9), 4, (3, 2), {"stride": (2, 1), "padding": (1, 0), "dilation": (1, 2)}),
    ((3, 2, 5, 5), 3, 3, {"padding": 1}),
    ((2, 64, 8, 8), 32, 3, {"padding": 1}),  # K past one GEMM depth block
    ((4, 32, 16, 16), 64, 3, {"padding": 1}),  # the bench CNN's second layer, several row chunks
    # no more output than input channels at stride 1: grad_input by the forward convolution
    ((2, 8, 12, 12), 6, 3, {"dilation": 2, "padding": 2}),
    ((2, 8, 8, 8), 4, 3, {"groups": 2, "padding": 1}),
    ((2, 8, 9, 7), 8, (3, 5), {"padding": (0, 1)}),
    # a weight gradient past dot_rows' 20 K outputs (64 x 576): the packing GEMM's side
    ((2, 64, 6, 6), 64, 3, {"padding": 1}),
]

#: cases also run channels_last: 1x1, 3x3, strided 7x7, 1x1 strided, grouped, depthwise x2, wide K
CHANNELS_LAST = {0, 1, 3, 5, 7, 9, 15, 17, 18}


@pytest.mark.parametrize(
    ("x_shape", "cout", "k", "kw", "layout"),
    [(*case, "contiguous") for case in CASES] + [(*CASES[i], "channels_last") for i in sorted(CHANNELS_LAST)],
)
def test_conv2d_backward_matches_autograd(
    x_shape: tuple[int, ...], cout: int, k: Any, kw: dict[str, Any], layout: str
) -> None:
    kh, kwd = (k, k) if isinstance(k, int) else k
    x = randn(*x_shape)
    w = randn(cout, x_shape[1] // kw.get("groups", 1), kh, kwd, seed=1)
    if layout == "channels_last":
        x, w = x.to(memory_format=torch.channels_last), w.to(memory_format=torch.channels_last)
    _check(x, w, kw)


@pytest.mark.parametrize(
    "kw", [{}, {"padding": 1}, {"stride": 2, "padding": 2, "dilation": 2}, {"groups": 4, "padding": 1}]
)
def test_conv1d_backward_matches_autograd(kw: dict[str, Any]) -> None:
    _check(randn(2, 4, 13), randn(8, 4 // kw.get("groups", 1), 3, seed=1), kw)


@pytest.mark.parametrize(
    "mask", [[True, False, False], [False, True, False], [False, False, True], [True, True, False], [False, True, True]]
)
@pytest.mark.parametrize("kw", [{"padding": 1}, {"groups": 4, "padding": 1}])
def test_output_mask_variants(mask: list[bool], kw: dict[str, Any]) -> None:
    x, w = randn(2, 4, 7, 8), randn(4, 4 // kw.get("groups", 1), 3, 3, seed=1)
    gy = randn(*_conv_fn(x, w, kw).shape, seed=2)
    want = _autograd(x, w, gy, kw, bias=True)
    got = run_native(_backward_op(kw, mask, True, 4), gy, x, w, require_native=True)
    for i, flag in enumerate(mask):
        if flag:
            torch.testing.assert_close(got[i], want[i], **TOL)
        else:
            assert got[i] is None


def test_mixed_and_noncontiguous_layouts() -> None:
    """grad_out channels_last with an NCHW input, a transposed (permuted) grad_out, a sliced input."""
    kw = {"padding": 1}
    x, w = randn(2, 4, 9, 10), randn(6, 4, 3, 3, seed=1)
    gy = randn(2, 6, 9, 10, seed=2)
    _check(x, w, kw, gy.to(memory_format=torch.channels_last))
    _check(x, w, kw, randn(2, 6, 10, 9, seed=3).transpose(2, 3))  # rows not evenly spaced
    _check(randn(2, 8, 9, 20)[:, ::2, :, 3:13], w, kw, gy)
    # channels_last input, grouped, with an NCHW grad_out
    _check(x.to(memory_format=torch.channels_last), randn(6, 2, 3, 3, seed=4), {"groups": 2, "padding": 1}, gy)


def test_empty_batch() -> None:
    """No images: grad_input empty, grad_weight and grad_bias zero (as autograd)."""
    for kw in ({"padding": 1}, {"groups": 4, "padding": 1}, {}):
        k = 3 if kw else 1
        _check(randn(0, 4, 6, 6), randn(8, 4 // kw.get("groups", 1), k, k, seed=1), kw)


@pytest.mark.parametrize("kw", [{"padding": 1}, {"groups": 4, "padding": 1}, {}])
def test_nan_and_inf_propagate(kw: dict[str, Any]) -> None:
    x, w = randn(2, 4, 6, 6), randn(4, 4 // kw.get("groups", 1), 3 if kw else 1, 3 if kw else 1, seed=1)
    x[0, 1, 2, 3] = float("nan")
    x[1, 2, 0, 0] = float("inf")
    w[1, 0, 0, 0] = float("-inf")
    gy = randn(*_conv_fn(x, w, kw).shape, seed=2)
    gy[0, 3, 1, 1] = float("nan")
    _check(x, w, kw, gy)


@pytest.mark.parametrize("w", [5, 17, 40])
@pytest.mark.parametrize(("k", "dil"), [(3, 1), (5, 1), (3, 2)])
def test_depthwise_stride1_vector_paths(w: int, k: int, dil: int) -> None:
    """Stride-1 depthwise backward (grad_input by the forward's vector planes over grad_out,
    the weight gradient by per-tap vector sums): widths below / past one and two vectors, 3×3
    and 5×5, dilation, padding 0 and k // 2."""
    c = 5
    for pad in (0, dil * (k // 2)):
        x, wt = randn(2, c, 7, w), randn(c, 1, k, k, seed=1)
        _check(x, wt, {"groups": c, "padding": pad, "dilation": dil})


def test_depthwise_stride1_nonfinite_grad_out_at_the_border() -> None:
    """A NaN / infinity in grad_out where the window reaches into the padding: autograd never
    multiplies the padding, so the weight gradient's taps that only meet padding there stay
    finite (the vector tap sums would multiply it by zero: that channel takes the loops)."""
    x, w = randn(2, 4, 6, 6), randn(4, 1, 3, 3, seed=1)
    gy = randn(2, 4, 6, 6, seed=2)
    gy[0, 1, 0, 0] = float("nan")
    gy[1, 2, 5, 5] = float("inf")
    _check(x, w, {"groups": 4, "padding": 1}, gy)


def test_refuses_what_it_does_not_take() -> None:
    """float64 and transposed convolution backward are not taken (they run in eager, correct)."""
    from torchburn.testing.conformance import compile_with, native_and_fallback

    x, w = randn(1, 2, 5, 5).double(), randn(3, 2, 3, 3, seed=1).double()
    gy = randn(1, 3, 3, 3, seed=2).double()
    compiled, reports = compile_with("native_cpu", _backward_op({}, [True, True, True], True, 4), cache=False)
    got = compiled(gy, x, w)
    _, fallback = native_and_fallback(reports)
    assert "aten.convolution_backward.default" in fallback
    torch.testing.assert_close(got[1], _autograd(x, w, gy, {}, bias=True)[1])


# -- the step at the Rust boundary ---------------------------------------------------------------


def _step_spec(ins: list[torch.Tensor], outs: list[torch.Tensor], **p: Any) -> str:
    tensors = [*ins, *outs]
    buffers = [
        {"kind": kind, "dtype": "float32", "numel": t.numel() if kind == "output" else 0, "sizes": list(t.shape),
         "strides": list(t.stride())}
        for kind, t in [*(("input", t) for t in ins), *(("output", t) for t in outs)]
    ]  # fmt: skip
    values = [
        {"buf": i, "offset": 0, "sizes": list(t.shape), "strides": list(t.stride())} for i, t in enumerate(tensors)
    ]
    step = {"op": "conv2d_backward", "ins": [0, 1, 2], "outs": list(range(3, 3 + len(outs))), **p}
    return json.dumps({"buffers": buffers, "values": values, "steps": [step]})


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
    mask=st.tuples(st.booleans(), st.booleans(), st.booleans()),
)
def test_conv2d_backward_step_property(
    n: int, cg: int, ocg: int, groups: int, hw: tuple[int, int], k: tuple[int, int], stride: tuple[int, int],
    pad: tuple[int, int], dil: tuple[int, int], depthwise: bool, channels_last: bool, mask: tuple[bool, bool, bool],
) -> None:  # fmt: skip
    cg = 1 if depthwise else cg
    c, oc = cg * groups, ocg * groups
    eh = [hw[i] + 2 * pad[i] - dil[i] * (k[i] - 1) - 1 for i in (0, 1)]
    if min(eh) < 0:
        return
    oh, ow = eh[0] // stride[0] + 1, eh[1] // stride[1] + 1
    g = torch.Generator().manual_seed(n + 7 * c + 13 * oc + 31 * hw[0] + 61 * hw[1])
    x, w = torch.randn(n, c, *hw, generator=g), torch.randn(oc, cg, *k, generator=g)
    gy = torch.randn(n, oc, oh, ow, generator=g)
    if channels_last:
        x, w, gy = (t.to(memory_format=torch.channels_last) for t in (x, w, gy))
    kw = {"stride": stride, "padding": pad, "dilation": dil, "groups": groups}
    want = _autograd(x, w, gy, kw, bias=True)
    outs = [torch.full_like(t, float("nan")) for t, flag in zip(want, mask) if flag]
    geo = {"stride": list(stride), "padding": list(pad), "dilation": list(dil), "groups": groups}
    spec = _step_spec([gy, x, w], outs, **geo, mask=[int(m) for m in mask])
    _native.Executor(spec).run([gy, x, w], outs)
    for got, e in zip(outs, [t for t, flag in zip(want, mask) if flag]):
        torch.testing.assert_close(got, e, **TOL)


def test_conv2d_backward_step_refuses_bad_operands() -> None:
    gy, x, w = torch.randn(1, 3, 3, 3), torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3)
    geo = {"stride": [1, 1], "padding": [0, 0], "dilation": [1, 1], "groups": 1}
    gx, gw, gb = torch.empty_like(x), torch.empty_like(w), torch.empty(3)
    with pytest.raises(ValueError, match="grad_output shape"):
        _native.Executor(_step_spec([torch.randn(1, 3, 4, 4), x, w], [gx, gw, gb], **geo, mask=[1, 1, 1]))
    with pytest.raises(ValueError, match="grad_weight shape"):
        _native.Executor(_step_spec([gy, x, w], [gx, torch.empty(3, 2, 2, 2), gb], **geo, mask=[1, 1, 1]))
    with pytest.raises(ValueError, match="more results than its mask"):
        _native.Executor(_step_spec([gy, x, w], [gx, gw, gb], **geo, mask=[1, 1, 0]))
    with pytest.raises(ValueError, match="mask"):
        _native.Executor(_step_spec([gy, x, w], [gx, gw], **geo, mask=[1, 2]))
    with pytest.raises(ValueError, match="channel counts"):
        _native.Executor(_step_spec([gy, x, w], [gx, gw, gb], **{**geo, "groups": 2}, mask=[1, 1, 1]))
    with pytest.raises(ValueError, match="positive"):
        _native.Executor(_step_spec([gy, x, w], [gx, gw, gb], **{**geo, "stride": [0, 1]}, mask=[1, 1, 1]))
