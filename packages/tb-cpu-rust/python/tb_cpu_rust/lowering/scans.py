"""Scans and order statistics: cumsum / cumprod / logcumsumexp / cummax / cummin, sort, topk,
kthvalue, median, nanmedian and mode."""

from __future__ import annotations

import math
from typing import Any

from tb_cpu_rust.lowering import steps as S
from tb_cpu_rust.lowering.checks import kernel_check, more_check
from tb_cpu_rust.lowering.dtypes import BOOL, F32, I64
from tb_cpu_rust.lowering.lowerer import Lowerer, meta
from tb_cpu_rust.lowering.registry import LoweringError, register_lowering

_float_kernel = kernel_check(float_only=True)


def _dim(node: Any, rank_of: Any) -> int:
    return node.args[1] if rank_of else 0


@register_lowering("aten.cumsum.default", check=kernel_check())
def _cumsum(lw: Lowerer, node: Any) -> int:
    x = lw.value(node.args[0])
    o = lw.fresh(node.out)
    lw.steps.append(S.Cumsum(x=lw.as_1d(x), y=lw.as_1d(o), dim=_dim(node, node.out.shape)))
    return o


@register_lowering("aten.cumprod.default", "aten.logcumsumexp.default", check=_float_kernel)
def _scan(lw: Lowerer, node: Any) -> int:
    x = lw.value(node.args[0])
    if lw.dtype_of(x) != F32 or node.out.dtype != F32:
        raise LoweringError("scan of a non-float32 tensor")
    o = lw.fresh(node.out)
    mode = 0 if node.op == "aten.cumprod.default" else 1
    lw.steps.append(S.Scan(x=lw.as_1d(x), y=lw.as_1d(o), dim=_dim(node, node.out.shape), mode=mode))
    return o


@register_lowering("aten.cummax.default", "aten.cummin.default", check=_float_kernel)
def _cum_extreme(lw: Lowerer, node: Any) -> tuple[int, ...]:
    x = lw.value(node.args[0])
    outs = [lw.fresh(m) for m in node.out]
    kind = S.Cummax if node.op == "aten.cummax.default" else S.Cummin
    x1 = lw.as_1d(x)
    values, indices = (lw.as_1d(o) for o in outs)
    lw.steps.append(kind(x=x1, values=values, indices=indices, dim=_dim(node, node.out[0].shape)))
    return tuple(outs)


def _sorted(lw: Lowerer, x: int, d: int, descending: bool) -> tuple[int, int]:
    """Sorted values and their positions along ``d``, in fresh contiguous temporaries."""
    sizes = lw.values[x]["sizes"]
    vals, pos = (lw.fresh(meta(sizes, dt)) for dt in (lw.dtype_of(x), I64))
    lw.steps.append(S.Sort(x=x, values=vals, indices=pos, dim=d, descending=descending))
    return vals, pos


@register_lowering("aten.sort.default", "aten.sort.stable", check=kernel_check())
@register_lowering("aten.topk.default", check=_float_kernel)
def _sort(lw: Lowerer, node: Any) -> tuple[int, ...]:
    op, a, kw, out = node.op, list(node.args), dict(node.kwargs), node.out
    x = lw.as_1d(lw.value(a[0]))
    rank = len(lw.values[x]["sizes"])
    if op == "aten.topk.default":
        k = a[1]
        dim_ = a[2] if len(a) > 2 else kw.get("dim", -1)
        desc = bool(a[3] if len(a) > 3 else kw.get("largest", True))
    elif op == "aten.sort.stable":
        dim_ = kw.get("dim", -1)
        desc = bool(kw.get("descending", False))
    else:
        dim_ = a[1] if len(a) > 1 else kw.get("dim", -1)
        desc = bool(a[2] if len(a) > 2 else kw.get("descending", False))
    d = dim_ % rank
    results = []
    for v, m in zip(_sorted(lw, x, d, desc), out):
        t = lw.meta_tensor(v)
        if op == "aten.topk.default":
            t = t.narrow(d, 0, k)
        t = t.reshape(m.shape) if not m.shape else t
        results.append(lw.view_of(v, t))
    return tuple(results)


@register_lowering("aten.kthvalue.default", check=_float_kernel)
def _kthvalue(lw: Lowerer, node: Any) -> tuple[int, ...]:
    a, kw = list(node.args), dict(node.kwargs)
    x = lw.as_1d(lw.value(a[0]))
    k = a[1]
    dim_ = a[2] if len(a) > 2 else kw.get("dim", -1)
    keep = bool(a[3] if len(a) > 3 else kw.get("keepdim", False))
    d = dim_ % len(lw.values[x]["sizes"])
    results = []
    for v, m in zip(_sorted(lw, x, d, False), node.out):
        t = lw.meta_tensor(v).narrow(d, k - 1, 1)
        t = t.reshape(m.shape) if (not keep or not m.shape) else t
        results.append(lw.view_of(v, t))
    return tuple(results)


@register_lowering("aten.median.default", check=_float_kernel)
def _median(lw: Lowerer, node: Any) -> int:
    """The lower middle of the sorted values, NaN when any value is NaN (as PyTorch)."""
    x = lw.value(node.args[0])
    n = math.prod(lw.values[x]["sizes"])
    if n == 0:
        raise LoweringError("median of an empty tensor")
    flat = lw.temp([n])
    lw.copy_into(x, lw.view_of(flat, lw.meta_tensor(flat).view(lw.values[x]["sizes"])))
    vals, pos = (lw.temp([n], dt) for dt in (F32, I64))
    lw.steps.append(S.Sort(x=flat, values=vals, indices=pos, dim=0, descending=False))
    nan = lw.temp([n])
    lw.steps.append(S.Ew("f32", [flat], [nan], [S.load(0, 0), S.instr("isnan", 1, [0]), S.store(0, 1)]))
    anynan = lw.temp([1], BOOL)
    lw.steps.append(S.Reduce(x=nan, y=anynan, kind=9, mask=(1,)))
    mid = lw.view_of(vals, lw.meta_tensor(vals).narrow(0, (n - 1) // 2, 1))
    o = lw.fresh(node.out)
    # where(any NaN, 0/0, middle): JSON has no NaN literal
    prog = [S.load(0, 0), S.load(1, 1), S.const(2, 0.0), S.instr("div", 3, [2, 2]), S.instr("where", 4, [0, 3, 1]),
            S.store(0, 4)]  # fmt: skip
    lw.steps.append(S.Ew("f32", [anynan, mid], [lw.as_1d(o)], prog))
    return o


_SELECT = {"aten.median.dim": S.MedianDim, "aten.nanmedian.dim": S.NanmedianDim, "aten.mode.default": S.Mode}


@register_lowering(*_SELECT, check=more_check())
def _median_dim(lw: Lowerer, node: Any) -> tuple[int, ...]:
    a, kw = list(node.args), dict(node.kwargs)
    x = lw.value(a[0])
    rank = len(lw.values[x]["sizes"])
    d = (a[1] if len(a) > 1 else kw.get("dim", -1)) % max(rank, 1)
    keep = bool(a[2] if len(a) > 2 else kw.get("keepdim", False))
    outs = [lw.fresh(m) for m in node.out]
    if rank == 0:
        x, kouts = lw.as_1d(x), [lw.as_1d(v) for v in outs]
    elif keep:
        kouts = outs
    else:
        kouts = [lw.view_of(v, lw.meta_tensor(v).unsqueeze(d)) for v in outs]
    lw.steps.append(_SELECT[node.op](x=x, values=kouts[0], indices=kouts[1], dim=d))
    return tuple(outs)


@register_lowering("aten.nanmedian.default", check=more_check())
def _nanmedian(lw: Lowerer, node: Any) -> int:
    x = lw.value(node.args[0])
    if math.prod(lw.values[x]["sizes"]) == 0:
        raise LoweringError("nanmedian of an empty tensor")
    o = lw.fresh(node.out)
    idx = lw.temp([1], I64)
    lw.steps.append(S.NanmedianDim(x=lw.flat(x), values=lw.as_1d(o), indices=idx, dim=0))
    return o
