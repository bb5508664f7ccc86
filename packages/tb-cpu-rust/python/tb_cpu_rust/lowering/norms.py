"""Softmax, layer / RMS / batch / group norm: kernel steps, or reductions and elementwise sweeps."""

from __future__ import annotations

import math
from typing import Any

import torch

from tb_cpu_rust.lowering import steps as S
from tb_cpu_rust.lowering.checks import kernel_check
from tb_cpu_rust.lowering.dtypes import F32
from tb_cpu_rust.lowering.elementwise import check_ew
from tb_cpu_rust.lowering.lowerer import Lazy, Lowerer, contig, meta
from tb_cpu_rust.lowering.registry import LoweringError, register_lowering
from torchburn.plan import Ref

_check = kernel_check(float_only=True)
BATCH_NORMS = frozenset({
    "aten._native_batch_norm_legit.default", "aten._native_batch_norm_legit.no_stats",
    "aten._native_batch_norm_legit_functional.default", "aten.native_batch_norm.default",
})  # fmt: skip


@register_lowering("aten._softmax.default", "aten._log_softmax.default", check=_check)
def _softmax(lw: Lowerer, node: Any) -> int:
    x = lw.value(node.args[0])
    y = lw.fresh(node.out)
    kind = S.Softmax if node.op == "aten._softmax.default" else S.LogSoftmax
    lw.steps.append(kind(x=lw.as_1d(x), y=lw.as_1d(y), dim=node.args[1] if node.out.shape else 0))
    return y


@register_lowering("aten._softmax_backward_data.default", "aten._log_softmax_backward_data.default", check=_check)
def _softmax_backward(lw: Lowerer, node: Any) -> int:
    g, y = lw.value(node.args[0]), lw.value(node.args[1])
    gi = lw.fresh(node.out)
    kind = S.LogSoftmaxBwd if "log" in node.op else S.SoftmaxBwd
    lw.steps.append(kind(grad=g, y=y, grad_in=gi, dim=node.args[2]))
    return gi


@register_lowering("aten.native_layer_norm.default", check=_check)
def _layer_norm(lw: Lowerer, node: Any) -> tuple[int, ...]:
    x, shape, w, b, eps = node.args
    y, mean, rstd = (lw.fresh(m) for m in node.out)
    xv = dense_copy(lw, lw.value(x))
    weight, bias = (dense_copy(lw, lw.value(t)) if t is not None else None for t in (w, b))
    lw.steps.append(S.LayerNorm(x=xv, weight=weight, bias=bias, y=y, mean=mean, rstd=rstd,
                                n=math.prod(shape), eps=float(eps)))  # fmt: skip
    return y, mean, rstd


@register_lowering("aten._fused_rms_norm.default", check=_check)
def _rms_norm(lw: Lowerer, node: Any) -> tuple[int, ...]:
    a, kw = list(node.args), dict(node.kwargs)
    x, shape, w = a[0], a[1], a[2]
    eps = a[3] if len(a) > 3 else kw.get("eps")
    eps = torch.finfo(torch.float32).eps if eps is None else float(eps)
    y, rstd = (lw.fresh(m) for m in node.out)
    xv, wv = dense_copy(lw, lw.value(x)), dense_copy(lw, lw.value(w)) if w is not None else None
    lw.steps.append(S.RmsNorm(x=xv, weight=wv, y=y, rstd=rstd, n=math.prod(shape), eps=eps))
    return y, rstd


def _channel_view(lw: Lowerer, v: int, sizes: list[int] | tuple[int, ...]) -> int:
    """A (C,) value broadcast over an (N, C, ...) shape."""
    val = lw.values[v]
    strides = [0] * len(sizes)
    strides[1] = val["strides"][0]
    return lw.new_value(val["buf"], val["offset"], list(sizes), strides)


@register_lowering("aten._native_batch_norm_legit_no_training.default", check=check_ew)
def _batch_norm_eval(lw: Lowerer, node: Any) -> Any:
    """Eval-mode batch norm: part of the open elementwise group (it fuses with its neighbours)."""
    x, w, b, mean, var, _momentum, eps = node.args
    out = node.out
    y_meta = out[0]
    shape = tuple(y_meta.shape)
    if len(shape) < 2 or y_meta.dtype != F32:
        raise LoweringError("batch norm input")
    g = lw.open_group(shape, "f32", node.args)
    c = shape[1]

    def chan(arg: Any) -> int:
        v = lw.value(arg)
        if lw.values[v]["sizes"] != [c]:
            raise LoweringError("batch norm stats shape")
        return g.load(_channel_view(lw, v, shape))

    xr = lw.operand(g, x)
    if stats_materialised(lw, (w, b, mean, var), c):
        # scale and shift per channel first (C values, ATen's CPU form), then two operations per
        # element instead of five and a square root
        rstd = lw.temp([c])
        _rstd(lw, lw.value(var), rstd, eps)
        scale, shift = _scale_shift(lw, lw.value(mean), rstd, w, b, c)
        t = g.emit(
            "add",
            [g.emit("mul", [xr, g.load(_channel_view(lw, scale, shape))]), g.load(_channel_view(lw, shift, shape))],
            [1.0],
        )
        lz = Lazy(g, t, y_meta)
        return (lz, *(lw.fresh(m) for m in out[1:]))
    t = g.emit("sub", [xr, chan(mean)], [1.0])
    inv = g.emit("rsqrt", [g.emit("add", [chan(var), g.const(float(eps))], [1.0])])
    t = g.emit("mul", [t, inv])
    if w is not None:
        t = g.emit("mul", [t, chan(w)])
    if b is not None:
        t = g.emit("add", [t, chan(b)], [1.0])
    lz = Lazy(g, t, y_meta)
    empties = tuple(lw.fresh(m) for m in out[1:])
    return (lz, *empties)


def stats_materialised(lw: Lowerer, args: tuple[Any, ...], c: int) -> bool:
    """Whether the norm's statistics and affine parameters present are float32 (C,) values
    already in buffers (graph inputs or earlier steps' results), not pending in the open
    elementwise group, so per-channel steps can read them before the group runs."""
    for a in args:
        if a is None:
            continue
        if not isinstance(a, Ref) or lw.dtype_of_arg(a) != F32:
            return False
        v = lw.slot.get(a.slot)
        if not isinstance(v, int) or lw.values[v]["sizes"] != [c]:
            return False
    return args[2] is not None and args[3] is not None


def _normalise(lw: Lowerer, x: int, mean: int, rstd: int, weight: int | None, bias: int | None, y: int) -> None:
    """``y = (x - mean) * rstd * weight + bias``, every operand already viewed at ``y``'s shape."""
    ins = [x, mean, rstd]
    prog = [S.load(0, 0), S.load(1, 1), S.load(2, 2), S.instr("sub", 3, [0, 1], [1.0]), S.instr("mul", 4, [3, 2])]
    r = 4
    if weight is not None:
        ins.append(weight)
        prog += [S.load(5, len(ins) - 1), S.instr("mul", 6, [r, 5])]
        r = 6
    if bias is not None:
        ins.append(bias)
        prog += [S.load(7, len(ins) - 1), S.instr("add", 8, [r, 7], [1.0])]
        r = 8
    prog.append(S.store(0, r))
    lw.steps.append(S.Ew("f32", ins, [y], prog))


def _scale_shift(lw: Lowerer, mean: int, rstd: int, w_arg: Any, b_arg: Any, c: int) -> tuple[int, int]:
    """Per channel ``scale = rstd · weight`` and ``shift = bias − mean · scale`` (C,)."""
    scale, shift = lw.temp([c]), lw.temp([c])
    ins, prog, r = [rstd, mean], [S.load(0, 0), S.load(1, 1)], 0
    if w_arg is not None:
        ins.append(lw.value(w_arg))
        prog += [S.load(2, len(ins) - 1), S.instr("mul", 3, [0, 2])]
        r = 3
    prog += [S.store(0, r), S.instr("mul", 4, [1, r])]
    if b_arg is not None:
        ins.append(lw.value(b_arg))
        prog += [S.load(5, len(ins) - 1), S.instr("sub", 6, [5, 4], [1.0])]
    else:
        prog.append(S.instr("neg", 6, [4]))
    prog.append(S.store(1, 6))
    lw.steps.append(S.Ew("f32", ins, [scale, shift], prog))
    return scale, shift


def _rstd(lw: Lowerer, var: int, rstd: int, eps: float) -> None:
    prog = [
        S.load(0, 0),
        S.const(1, float(eps)),
        S.instr("add", 2, [0, 1], [1.0]),
        S.instr("rsqrt", 3, [2]),
        S.store(0, 3),
    ]
    lw.steps.append(S.Ew("f32", [var], [rstd], prog))


@register_lowering(*BATCH_NORMS, check=_check)
def _batch_norm(lw: Lowerer, node: Any) -> tuple[Any, ...]:
    """Batch norm that normalises by the batch's own statistics (or, in eval mode, the running
    ones); the functional form also returns the updated running statistics."""
    op, a = node.op, list(node.args)
    if op == "aten._native_batch_norm_legit.no_stats":
        x_arg, w_arg, b_arg, training, momentum, eps = a
        rm_arg = rv_arg = None
    else:
        x_arg, w_arg, b_arg, rm_arg, rv_arg, training, momentum, eps = a
    outs = node.out
    x = lw.value(x_arg)
    sizes = lw.values[x]["sizes"]
    if len(sizes) < 2:
        raise LoweringError("batch norm input rank")
    c = sizes[1]
    if training:
        mean, var = lw.temp([c]), lw.temp([c])
        mask = [1 if d != 1 else 0 for d in range(len(sizes))]
        for v, kind in ((mean, 1), (var, 6)):
            kv = lw.reduced_view(v, mask, keep=False)
            lw.steps.append(S.Reduce(x=x, y=kv, kind=kind, mask=tuple(mask)))
    else:
        if rm_arg is None or rv_arg is None:
            raise LoweringError("eval-mode batch norm without running statistics")
        mean, var = lw.value(rm_arg), lw.value(rv_arg)
    rstd = lw.temp([c])
    _rstd(lw, var, rstd, eps)
    scale_c, shift_c = _scale_shift(lw, mean, rstd, w_arg, b_arg, c)
    # y = x · scale + shift, as ATen's CPU kernel computes it, left open in the elementwise group:
    # the ReLU after a batch norm fuses into the same sweep and y is never stored
    g = lw.open_group(tuple(sizes), "f32", node.args)
    t = g.emit("mul", [lw.operand(g, x_arg), g.load(_channel_view(lw, scale_c, sizes))])
    t = g.emit("add", [t, g.load(_channel_view(lw, shift_c, sizes))], [1.0])
    results: list[Any] = [Lazy(g, t, outs[0])]
    for m, v in zip(outs[1:3], (mean, rstd)):
        o = lw.fresh(m)
        if training:
            lw.copy_into(v, o)
        elif m.numel:  # PyTorch returns empty save_mean / save_invstd in eval mode
            raise LoweringError("eval-mode batch norm with non-empty saved statistics")
        results.append(o)
    if op == "aten._native_batch_norm_legit_functional.default":
        if not training:
            raise LoweringError("functional batch norm in eval mode")
        n = math.prod(sizes) // max(c, 1)
        unbias = n / (n - 1) if n > 1 else math.inf
        mom = float(momentum)
        for running, stat, scale, m in ((rm_arg, mean, 1.0, outs[3]), (rv_arg, var, unbias, outs[4])):
            o = lw.fresh(m)
            prog = [S.load(0, 0), S.load(1, 1), S.const(2, 1.0 - mom), S.instr("mul", 3, [0, 2]),
                    S.const(4, mom * scale), S.instr("mul", 5, [1, 4]), S.instr("add", 6, [3, 5], [1.0]),
                    S.store(0, 6)]  # fmt: skip
            lw.steps.append(S.Ew("f32", [lw.value(running), stat], [o], prog))
            results.append(o)
    return tuple(results)


@register_lowering("aten.native_group_norm.default", check=_check)
def _group_norm(lw: Lowerer, node: Any) -> tuple[int, ...]:
    """Group norm from two reductions and one elementwise sweep over (N, G, C/G, HxW)."""
    x_arg, w_arg, b_arg, n, c, hw, groups, eps = node.args
    x = lw.value(x_arg)
    cg = c // groups
    try:
        xt = lw.meta_tensor(x)
        xg = lw.view_of(x, xt.view(n, groups, cg * hw))
        x4 = lw.view_of(x, xt.view(n, groups, cg, hw))
    except RuntimeError as exc:
        raise LoweringError(f"group norm input layout: {exc}") from exc
    y_meta, mean_meta, rstd_meta = node.out
    mean, rstd = lw.fresh(mean_meta), lw.fresh(rstd_meta)
    var = lw.fresh(meta((n, groups), F32))
    for v, kind in ((mean, 1), (var, 6)):
        lw.steps.append(S.Reduce(x=xg, y=lw.reduced_view(v, [0, 0, 1], keep=False), kind=kind, mask=(0, 0, 1)))
    _rstd(lw, var, rstd, eps)
    y = lw.fresh(y_meta)
    try:
        y4 = lw.view_of(y, lw.meta_tensor(y).view(n, groups, cg, hw))
    except RuntimeError as exc:
        raise LoweringError(f"group norm output layout: {exc}") from exc

    def per_group(v: int) -> int:
        val = lw.values[v]
        return lw.new_value(val["buf"], val["offset"], [n, groups, cg, hw], [*val["strides"], 0, 0])

    def per_channel(arg: Any) -> int | None:
        if arg is None:
            return None
        val = lw.values[lw.value(arg)]
        st = val["strides"][0]
        return lw.new_value(val["buf"], val["offset"], [n, groups, cg, hw], [0, cg * st, st, 0])

    _normalise(lw, x4, per_group(mean), per_group(rstd), per_channel(w_arg), per_channel(b_arg), y4)
    return y, mean, rstd


@register_lowering("aten.native_layer_norm_backward.default", check=_check)
def _layer_norm_backward(lw: Lowerer, node: Any) -> tuple[int | None, ...]:
    """Layer norm's gradients over (M rows, N normalised elements), from reductions and sweeps:
    dx = rstd * (dy*w - mean(dy*w) - xhat * mean(dy*w * xhat)), dw = sum(dy * xhat), db = sum(dy)."""
    g_arg, x_arg, shape, mean_arg, rstd_arg, w_arg, _b_arg, mask = node.args
    n = math.prod(shape)
    x, g = lw.flat(lw.value(x_arg)), lw.flat(lw.value(g_arg))
    m = lw.values[x]["sizes"][0] // max(n, 1)
    rows = [lw.flat(lw.value(a)) for a in (mean_arg, rstd_arg)]

    def as_rows(v: int, width: int) -> int:  # a flat value as (M, width)
        return lw.view_of(v, lw.meta_tensor(v).view(m, width))

    def per_row(v: int) -> int:  # an (M,) value broadcast along each row
        val = lw.values[v]
        return lw.new_value(val["buf"], val["offset"], [m, n], [1, 0])

    def sweep(ins: list[int], out: int, prog: list[S.Instr]) -> None:
        lw.steps.append(S.Ew("f32", ins, [out], [*(S.load(i, i) for i in range(len(ins))), *prog]))

    def row_mean(v: int) -> int:
        out = lw.temp([m])
        lw.steps.append(S.Reduce(x=v, y=lw.reduced_view(out, [0, 1], keep=False), kind=1, mask=(0, 1)))
        return out

    x2, g2, mean, rstd = as_rows(x, n), as_rows(g, n), per_row(rows[0]), per_row(rows[1])
    xhat = lw.temp([m, n])
    sweep([x2, mean, rstd], xhat, [S.instr("sub", 3, [0, 1], [1.0]), S.instr("mul", 4, [3, 2]), S.store(0, 4)])
    gw = g2
    if w_arg is not None:
        w = lw.flat(lw.value(w_arg))
        wv = lw.values[w]
        gw = lw.temp([m, n])
        sweep(
            [g2, lw.new_value(wv["buf"], wv["offset"], [m, n], [0, 1])], gw, [S.instr("mul", 2, [0, 1]), S.store(0, 2)]
        )
    outs: list[int | None] = [None, None, None]
    metas = node.out
    if mask[0]:
        gwx = lw.temp([m, n])
        sweep([gw, xhat], gwx, [S.instr("mul", 2, [0, 1]), S.store(0, 2)])
        a, b = per_row(row_mean(gw)), per_row(row_mean(gwx))
        dx = lw.fresh(metas[0])
        prog = [S.instr("sub", 5, [0, 2], [1.0]), S.instr("mul", 6, [1, 3]), S.instr("sub", 7, [5, 6], [1.0]),
                S.instr("mul", 8, [7, 4]), S.store(0, 8)]  # fmt: skip
        sweep([gw, xhat, a, b, rstd], as_rows(lw.flat(dx), n) if _dense(lw, dx) else _no_layout(), prog)
        outs[0] = dx
    for k, factor in ((1, xhat), (2, None)):
        if not mask[k] or metas[k] is None:
            continue
        src = g2
        if factor is not None:
            src = lw.temp([m, n])
            sweep([g2, factor], src, [S.instr("mul", 2, [0, 1]), S.store(0, 2)])
        o = lw.fresh(metas[k])
        if not _dense(lw, o):
            _no_layout()
        flat = lw.flat(o)
        lw.steps.append(S.Reduce(x=src, y=lw.reduced_view(flat, [1, 0], keep=False), kind=0, mask=(1, 0)))
        outs[k] = o
    return tuple(outs)


def dense_copy(lw: Lowerer, v: int) -> int:
    """``v`` itself when it is contiguous, else a contiguous copy (the norm kernels read rows)."""
    if _dense(lw, v):
        return v
    t = lw.temp(list(lw.values[v]["sizes"]), lw.dtype_of(v))
    lw.copy_into(v, t)
    return t


def _dense(lw: Lowerer, v: int) -> bool:
    val = lw.values[v]
    return list(val["strides"]) == contig(val["sizes"])


def _no_layout() -> int:
    raise LoweringError("layer norm backward into a non-contiguous gradient")
