"""Searching and distances: searchsorted / bucketize, histc, frexp, cdist, pdist and dist."""

from __future__ import annotations

import math
from typing import Any

import torch

from tb_cpu_rust.lowering import steps as S
from tb_cpu_rust.lowering.checks import more_check
from tb_cpu_rust.lowering.dtypes import F32
from tb_cpu_rust.lowering.lowerer import Lowerer, contig
from tb_cpu_rust.lowering.registry import LoweringError, register_lowering


def _check_search(info: Any) -> str | None:
    if info.op == "aten.searchsorted.Tensor" and info.kwargs.get("side") not in (None, "left", "right"):
        return "searchsorted side"
    if any(m.dtype != F32 for m in info.inputs[:2]):
        return "float32 boundaries and values only"
    return None


@register_lowering("aten.searchsorted.Tensor", "aten.bucketize.Tensor", check=more_check(extra=_check_search))
def _searchsorted(lw: Lowerer, node: Any) -> int:
    a, kw = list(node.args), dict(node.kwargs)
    seq, vals = (a[0], a[1]) if node.op == "aten.searchsorted.Tensor" else (a[1], a[0])
    right = bool(kw.get("right", False)) or kw.get("side") == "right"
    sv, vv = lw.value(seq), lw.value(vals)
    if kw.get("sorter") is not None:  # search the sorted copy: positions in sorted order
        srt = lw.value(kw["sorter"])
        ssz = list(lw.values[sv]["sizes"])
        t = lw.temp(ssz)
        lw.steps.append(S.Gather(x=sv, index=srt, out=t, dim=len(ssz) - 1))
        sv = t
    o = lw.fresh(node.out)
    if not lw.values[vv]["sizes"]:
        vv, ko = lw.as_1d(vv), lw.as_1d(o)
    else:
        ko = o
    lw.steps.append(S.Searchsorted(sorted_seq=sv, values=vv, out=ko, right=right))
    return o


def _arg(node: Any, i: int, name: str, default: Any) -> Any:
    return node.args[i] if len(node.args) > i else node.kwargs.get(name, default)


@register_lowering("aten.histc.default", check=more_check())
def _histc(lw: Lowerer, node: Any) -> int:
    o = lw.fresh(node.out)
    lo, hi = float(_arg(node, 2, "min", 0)), float(_arg(node, 3, "max", 0))
    lw.steps.append(S.Histc(x=lw.value(node.args[0]), out=o, min=lo, max=hi))
    return o


@register_lowering("aten.frexp.Tensor", check=more_check())
def _frexp(lw: Lowerer, node: Any) -> tuple[int, ...]:
    outs = [lw.fresh(m) for m in node.out]
    x = lw.as_1d(lw.value(node.args[0]))
    mantissa, exponent = (lw.as_1d(v) for v in outs)
    lw.steps.append(S.Frexp(x=x, mantissa=mantissa, exponent=exponent))
    return tuple(outs)


@register_lowering("aten._cdist_forward.default", check=more_check())
def _cdist(lw: Lowerer, node: Any) -> int:
    a, out = node.args, node.out
    x1, x2, p = lw.value(a[0]), lw.value(a[1]), float(a[2])
    o = lw.fresh(out)
    (pn, r) = out.shape[-2:]
    m = lw.values[x1]["sizes"][-1]
    batch = list(out.shape[:-2])
    b = math.prod(batch)
    t1, t2 = lw.temp([*batch, pn, m]), lw.temp([*batch, r, m])
    lw.copy_into(lw.broadcast(x1, (*batch, pn, m)), t1)
    lw.copy_into(lw.broadcast(x2, (*batch, r, m)), t2)

    def as3(v: int, s: tuple[int, int]) -> int:
        return lw.view_of(v, lw.meta_tensor(v).view(b, *s))

    if list(lw.values[o]["strides"]) != contig(list(out.shape)):
        raise LoweringError("cdist into a non-contiguous result")
    lw.steps.append(S.Cdist(x1=as3(t1, (pn, m)), x2=as3(t2, (r, m)), out=as3(o, (pn, r)), p=p))
    return o


@register_lowering("aten._pdist_forward.default", check=more_check())
def _pdist(lw: Lowerer, node: Any) -> int:
    o = lw.fresh(node.out)
    lw.steps.append(S.Pdist(x=lw.value(node.args[0]), out=o, p=float(_arg(node, 1, "p", 2.0))))
    return o


@register_lowering("aten.dist.default", check=more_check())
def _dist(lw: Lowerer, node: Any) -> int:
    x, y = lw.value(node.args[0]), lw.value(node.args[1])
    shape = tuple(torch.broadcast_shapes(tuple(lw.values[x]["sizes"]), tuple(lw.values[y]["sizes"])))
    o = lw.fresh(node.out)
    xb, yb = lw.broadcast(x, shape), lw.broadcast(y, shape)
    lw.steps.append(S.Dist(x=xb, y=yb, out=o, p=float(_arg(node, 2, "p", 2.0))))
    return o
