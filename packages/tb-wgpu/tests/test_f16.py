"""float16 graphs on the wgpu engine (adapters with ``shader-f16``): each op family and the README
MLP match PyTorch, natively (``fallback="error"``); without the feature float16 nodes are refused.

Reference: PyTorch's float16 CPU kernels compute in f32 internally and round each op's result to
float16 (so do ours, except that a fused elementwise chain rounds once at its end instead of after
every op). So the reference here is eager float32 on the SAME f16-rounded inputs and parameters,
cast to float16: the numbers our kernels approximate. Tolerances are float16's: its unit roundoff
is 2**-11 ~ 4.9e-4, so one final rounding differs by ~5e-4 relative; matmuls over K=512..1024
also see their f16 *inputs'* intermediate roundings (e.g. the MLP's hidden layer is stored as
f16) and f32 sums in another order, which for O(1) outputs stays within ~1e-2. rtol=atol=2e-3 for
single elementwise/row ops (a few f16 ulps), 1e-2 where a K>=64 reduction or a stored f16
intermediate feeds the result.
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.nn.functional as F

import torchburn
from tb_wgpu import support
from tb_wgpu.device import probe
from torchburn.testing.models import MODELS

TIGHT = {"rtol": 2e-3, "atol": 2e-3}  # one f16 rounding of an f32-computed result (a few ulps)
LOOSE = {"rtol": 1e-2, "atol": 1e-2}  # f16 intermediates and long f32 sums in a different order


def _has_f16() -> bool:
    ctx, _ = probe()
    return ctx is not None and ctx.shader_f16


pytestmark = pytest.mark.skipif(not _has_f16(), reason="the WebGPU adapter does not offer shader-f16")


def _compile(fn: object, **options: object) -> object:
    torch._dynamo.reset()
    return torch.compile(
        fn, backend="torchburn", options={"engine": "wgpu", "warn": False, "fallback": "error", **options}
    )


def _reference(fn: object, *args: torch.Tensor) -> object:
    """fn in float32 on the float16 inputs, each result rounded to eager float16's result dtype."""
    with torch.no_grad():
        eager = fn(*args)
        out = fn(*[a.float() if a.dtype == torch.float16 else a for a in args])
    if isinstance(out, tuple):
        return tuple(o.to(e.dtype) for o, e in zip(out, eager))
    return out.to(eager.dtype)


def _check(fn: object, *args: torch.Tensor, tol: dict[str, float], native: set[str]) -> None:
    compiled = _compile(fn)
    torchburn.reset_stats()
    with torch.no_grad():
        actual = compiled(*args)
    expected = _reference(fn, *args)
    torch.testing.assert_close(actual, expected, **tol)
    # Same dtype as eager float16 (assert_close checks dtype too).
    with torch.no_grad():
        torch.testing.assert_close(actual, fn(*args), rtol=5e-2, atol=5e-2)
    cov = torchburn.op_coverage(by_engine=True)
    assert not cov["fallback"], cov
    ran = {k.split(":", 1)[1] for k in cov["native"] if k.startswith("wgpu:")}
    assert native <= ran, (native - ran, cov)


def _h(*shape: int, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).half()


def test_unary_binary_broadcast_and_fused_chain() -> None:
    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        # broadcasting (8,1,33) x (5,33), scalars, transcendental math: one fused kernel
        x = a * b + 0.5
        y = torch.exp(-x.abs()) + torch.tanh(x) * torch.sigmoid(b) - torch.nn.functional.gelu(x)
        return torch.maximum(y, b / 3.0) - torch.sqrt(x * x + 1)

    _check(
        f,
        _h(8, 1, 33),
        _h(5, 33, seed=1),
        tol=TIGHT,
        native={"aten.mul.Tensor", "aten.exp.default", "aten.tanh.default", "aten.maximum.default"},
    )


def test_where_compare_and_to_copy() -> None:
    def f(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        m = a > b
        return torch.where(m, a, b * 2), (a + b).float()

    _check(f, _h(7, 19), _h(7, 19, seed=1), tol=TIGHT, native={"aten.where.self", "aten.gt.Tensor"})


@pytest.mark.parametrize("odd", [False, True])
def test_matmul_family(odd: bool) -> None:
    m, k, n = (37, 65, 23) if odd else (64, 128, 96)

    def f(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor, x3: torch.Tensor, y3: torch.Tensor) -> tuple:
        lin = torch.nn.functional.linear(a, w, bias)  # addmm with w.t(), a strided operand
        return torch.relu(lin), a @ w.t(), torch.bmm(x3, y3)

    args = (_h(m, k, scale=0.3), _h(n, k, seed=1, scale=0.3), _h(n, seed=2), _h(3, m, k, seed=3), _h(3, k, n, seed=4))
    _check(f, *args, tol=LOOSE, native={"aten.addmm.default", "aten.mm.default", "aten.bmm.default"})


def test_reductions() -> None:
    def f(x: torch.Tensor) -> tuple:
        return x.sum(dim=1), x.mean(dim=(0, 2), keepdim=True), x.amax(dim=-1), x.sum()

    _check(
        f,
        _h(6, 50, 17, scale=0.5),
        tol=LOOSE,
        native={"aten.sum.dim_IntList", "aten.mean.dim", "aten.amax.default"},
    )


def test_softmax_and_log_softmax() -> None:
    def f(x: torch.Tensor) -> tuple:
        return torch.softmax(x, dim=-1), torch.log_softmax(x, dim=1)

    _check(f, _h(9, 70, 5, scale=2.0), tol=TIGHT, native={"aten._softmax.default", "aten._log_softmax.default"})


def test_layer_norm() -> None:
    def f(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.layer_norm(x, (96,), w, b)

    # The output is O(|weight|) ~ up to 3 after normalizing: a few f16 ulps there is ~5e-3.
    _check(
        f,
        _h(4, 11, 96, scale=3.0),
        _h(96, seed=5),
        _h(96, seed=6),
        tol=LOOSE,
        native={"aten.native_layer_norm.default"},
    )


@pytest.mark.parametrize(
    ("stride", "padding", "dilation", "groups", "bias"),
    [(1, 1, 1, 1, True), (2, 0, 1, 1, False), (1, 2, 2, 2, True), (2, 1, 1, 4, True)],
)
def test_conv2d(stride: int, padding: int, dilation: int, groups: int, bias: bool) -> None:
    def f(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.conv2d(x, w, b if bias else None, stride, padding, dilation, groups)
        return torch.relu(y)  # folded into the conv kernel's epilogue, rounded to f16 once

    # K = 8/groups * 9 products an output: f32 sums of f16 inputs, one final f16 rounding.
    args = (_h(2, 8, 11, 13), _h(12, 8 // groups, 3, 3, seed=1, scale=0.3), _h(12, seed=2))
    _check(f, *args, tol=TIGHT, native={"aten.convolution.default"})


def test_conv2d_non_contiguous_input() -> None:
    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.conv2d(x.permute(0, 3, 1, 2), w, padding=1)

    _check(f, _h(2, 9, 7, 5), _h(6, 5, 3, 3, seed=1, scale=0.3), tol=TIGHT, native={"aten.convolution.default"})


def test_pooling() -> None:
    def f(x: torch.Tensor) -> tuple:
        mx, idx = torch.nn.functional.max_pool2d(x, 3, stride=2, padding=1, return_indices=True)
        avg = torch.nn.functional.avg_pool2d(x, 2, stride=2, padding=1, count_include_pad=False)
        return mx, idx, avg, torch.nn.functional.avg_pool2d(x, 3, stride=1)

    x = _h(2, 5, 9, 10)
    x[0, 0, 0, :3] = x[0, 0, 0, 3]  # ties: the first index wins, as in torch
    _check(
        f,
        x,
        tol=TIGHT,
        native={"aten.max_pool2d_with_indices.default", "aten.avg_pool2d.default"},
    )


def test_batch_norm_inference() -> None:
    def f(x: torch.Tensor, mean: torch.Tensor, var: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.batch_norm(x, mean, var, w, b, training=False, eps=1e-5)

    g = torch.Generator().manual_seed(7)
    stats = [torch.rand(6, generator=g) + lo for lo in (-0.5, 0.5, 0.5, -1.0)]  # mean, var, weight, bias
    _check(
        f,
        _h(3, 6, 5, 7, scale=2.0),
        *[s.half() for s in stats],
        tol=TIGHT,
        native={"aten._native_batch_norm_legit_no_training.default"},
    )


@pytest.mark.parametrize("kind", ["causal", "bool_mask", "float_mask", "plain"])
def test_attention(kind: str) -> None:
    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        sdpa = torch.nn.functional.scaled_dot_product_attention
        if kind == "causal":
            return sdpa(q, k, v, is_causal=True)
        if kind == "plain":
            return sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))  # strided q/k/v
        if kind == "bool_mask":
            return sdpa(q, k, v, attn_mask=m > 0)
        return sdpa(q, k, v, attn_mask=m)

    q, k, v = _h(2, 3, 10, 16, seed=1), _h(2, 3, 10, 16, seed=2), _h(2, 3, 10, 16, seed=3)
    # head dim 16: f32 dot products and online softmax, the output rounded to f16 once.
    _check(
        f,
        q,
        k,
        v,
        _h(1, 1, 10, 10, seed=4),
        tol=TIGHT,
        native={"aten._scaled_dot_product_flash_attention_for_cpu.default"},
    )


def test_embedding_and_gathers() -> None:
    def f(w: torch.Tensor, ids: torch.Tensor, idx: torch.Tensor) -> tuple:
        return (
            torch.nn.functional.embedding(ids, w),
            torch.index_select(w, 1, idx[0]),
            torch.gather(w, 1, idx.expand(w.shape[0], -1)),
            w[ids[:, 0], -1] * 2,
        )

    w = _h(20, 9, scale=100.0)  # values up to f16's hundreds: a gather must move bits exactly
    ids = torch.tensor([[3, 0], [19, 7], [7, 7]])
    idx = torch.tensor([[8, 0, 4, 4]])
    _check(
        f,
        w,
        ids,
        idx,
        tol={"rtol": 0.0, "atol": 0.0},
        native={
            "aten.embedding.default",
            "aten.index_select.default",
            "aten.gather.default",
            "aten.index.Tensor",
        },
    )


@pytest.mark.parametrize("name", ["small_cnn", "transformer_layer", "tiny_causal_lm"])
def test_model_set_in_half(name: str) -> None:
    if name == "tiny_causal_lm":
        pytest.importorskip("transformers")
    model, args = MODELS[name]()
    model = model.half().eval()
    args = tuple(a.half() if a.is_floating_point() else a for a in args)  # token ids stay int64
    compiled = _compile(model)
    torchburn.reset_stats()
    with torch.no_grad():
        actual = compiled(*args)
        eager16 = model(*args)
        expected = model.float()(*[a.float() if a.is_floating_point() else a for a in args]).half()
        model.half()
    assert actual.dtype == torch.float16
    # Several layers, each storing f16 activations (as eager float16 does): LOOSE.
    torch.testing.assert_close(actual, expected, **LOOSE)
    torch.testing.assert_close(actual, eager16, **LOOSE)
    cov = torchburn.op_coverage(by_engine=True)
    assert not cov["fallback"], (name, cov)


def test_readme_mlp_in_half_matches_eager() -> None:
    model, (x,) = MODELS["readme_mlp"]()
    model = model.half().eval()
    x = x.half()
    compiled = _compile(model)
    torchburn.reset_stats()
    with torch.no_grad():
        actual = compiled(x)
        expected = model.float()(x.float()).half()
        model.half()
        eager16 = model(x)
    assert actual.dtype == torch.float16
    # K=512 then K=1024 f32 sums, the hidden layer stored as f16 in both: see LOOSE.
    torch.testing.assert_close(actual, expected, **LOOSE)
    torch.testing.assert_close(actual, eager16, **LOOSE)
    cov = torchburn.op_coverage(by_engine=True)
    assert not cov["fallback"], cov
    native = {k.split(":", 1)[1] for k in cov["native"] if k.startswith("wgpu:")}
    assert {"aten.addmm.default", "aten.relu.default"} <= native, cov


def test_without_shader_f16_float16_nodes_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(support, "f16_available", lambda: False)

    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.relu(a @ b) + 1

    torch._dynamo.reset()
    # low_precision off: the checker's own answer (on, tb-core hands wgpu the float32 form instead)
    options = {"engine": "wgpu", "low_precision": False}
    explanation = torchburn.explain(f, _h(16, 32), _h(32, 8, seed=1), options=options)
    reasons = explanation.fallback_reasons
    assert "aten.mm.default" in reasons, str(explanation)
    assert any("adapter has no shader-f16" in r for r in reasons["aten.mm.default"]), reasons
    # float32 graphs are unaffected.
    torch._dynamo.reset()
    explanation = torchburn.explain(f, _h(16, 32).float(), _h(32, 8, seed=1).float(), options={"engine": "wgpu"})
    assert explanation.fully_native, str(explanation)
    # With the feature, the same float16 graph is accepted.
    monkeypatch.undo()
    torch._dynamo.reset()
    explanation = torchburn.explain(f, _h(16, 32), _h(32, 8, seed=1), options={"engine": "wgpu"})
    assert explanation.fully_native, str(explanation)


def test_ops_without_f16_kernels_still_refuse_float16() -> None:
    """arange into float16 has no float16 path: refused, with why."""

    def f(x: torch.Tensor) -> torch.Tensor:
        return x + torch.arange(8, dtype=torch.float16)

    torch._dynamo.reset()
    explanation = torchburn.explain(f, _h(4, 8), options={"engine": "wgpu"})
    reasons = {r for op, rs in explanation.fallback_reasons.items() if op.startswith("aten.arange") for r in rs}
    assert any("float16" in r for r in reasons), str(explanation)


def test_rms_norm() -> None:
    """torch.compile sees F.rms_norm (and aten._fused_rms_norm, CompositeImplicit) decomposed:
    f32 statistics of the f16 input, f32 x f16 products, one rounding to f16 at the end."""

    def f(x: torch.Tensor, w: torch.Tensor) -> tuple:
        out, rstd = torch.ops.aten._fused_rms_norm.default(x, [64], w, 1e-5)
        return out, rstd, F.rms_norm(x, (11, 64), eps=1e-5), F.rms_norm(x, (64,), w)

    _check(
        f,
        _h(3, 11, 64, scale=2.0),
        _h(64, seed=1),
        tol=TIGHT,
        native={"aten.mean.dim", "aten.rsqrt.default", "aten.mul.Tensor"},
    )


def test_var_std_prod() -> None:
    def f(x: torch.Tensor) -> tuple:
        return (
            x.var(dim=1),
            x.std(dim=-1, keepdim=True),
            torch.var(x, dim=(0, 2), correction=0),
            x.prod(dim=1),
        )

    # prod over 9 values near 1 stays O(1): f16 rounds it once, like eager's f32-then-round
    x = (1.0 + _h(5, 9, 13, scale=0.2).float()).half()
    _check(f, x, tol=TIGHT, native={"aten.var.correction", "aten.prod.dim_int"})


def test_cumsum() -> None:
    def f(x: torch.Tensor) -> tuple:
        return torch.cumsum(x, dim=1), torch.cumsum(x, dim=-1)

    _check(f, _h(4, 40, 7, scale=0.5), tol=LOOSE, native={"aten.cumsum.default"})


def test_argmax_argmin() -> None:
    def f(x: torch.Tensor) -> tuple:
        return x.argmax(dim=1), x.argmin(dim=-1), x.argmax()

    x = _h(6, 70, 5, scale=3.0)
    x[2, 10, 1] = x[2, 40, 1] = 100.0  # ties: the first index wins, as torch
    _check(f, x, tol={"rtol": 0.0, "atol": 0.0}, native={"aten.argmax.default", "aten.argmin.default"})


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss(reduction: str) -> None:
    def f(x: torch.Tensor, t: torch.Tensor, w: torch.Tensor) -> tuple:
        logp = torch.log_softmax(x, dim=1)
        return (
            torch.nn.functional.nll_loss(logp, t, reduction=reduction),
            torch.nn.functional.nll_loss(logp, t, weight=w, reduction=reduction, ignore_index=2),
        )

    t = torch.tensor([0, 4, 2, 1, 6, 6, 3, 0, 5, 2])
    w = (_h(7, seed=2).float().abs() + 0.5).half()
    _check(f, _h(10, 7, scale=2.0), t, w, tol=TIGHT, native={"aten.nll_loss_forward.default"})


def test_f16_vs_f32_timing_is_reported(capsys: pytest.CaptureFixture[str]) -> None:
    """Not an assertion on speed (lavapipe emulates f16 conversions); prints same-run numbers."""
    model, (x,) = MODELS["readme_mlp"](batch=64)
    times = {}
    for dtype in (torch.float32, torch.float16):
        m = model.to(dtype)
        compiled = _compile(m)
        xi = x.to(dtype)
        with torch.no_grad():
            compiled(xi)
            start = time.perf_counter()
            for _ in range(5):
                compiled(xi)
            times[str(dtype)] = (time.perf_counter() - start) / 5
    with capsys.disabled():
        print(f"\nreadme_mlp batch 64 on wgpu, seconds per call: {times}")
