"""Matrix products: mm / bmm / addmm / baddbmm / addmv / addbmm as one ``gemm`` step, the
epilogue fusion that folds an activation or a residual add into the GEMM's output tiles, and the
folding of bfloat16 / float16 casts into the GEMM (``fold_low_precision_casts``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from tb_cpu_rust.lowering import steps as S
from tb_cpu_rust.lowering.checks import all_float32, kernel_check, more_check
from tb_cpu_rust.lowering.dtypes import F32
from tb_cpu_rust.lowering.lowerer import Lowerer, extent
from tb_cpu_rust.lowering.registry import register_lowering
from torchburn.plan import Ref, TensorMeta

#: unary ops a GEMM applies to its output tiles (names as the executor's epilogue knows them)
EPILOGUE_UNARY = {
    "aten.relu.default": "relu", "aten.silu.default": "silu", "aten.sigmoid.default": "sigmoid", "aten.tanh.default": "tanh",
}  # fmt: skip

_check = kernel_check(float_only=True, extra=all_float32)


def _scalars(a: list[Any], kw: dict[str, Any]) -> tuple[float, float]:
    return float(kw.get("beta", a[3] if len(a) > 3 else 1)), float(kw.get("alpha", a[4] if len(a) > 4 else 1))


@register_lowering("aten.mm.default", "aten.bmm.default", check=_check)
def _mm(lw: Lowerer, node: Any) -> int:
    x, y = lw.value(node.args[0]), lw.value(node.args[1])
    c = lw.fresh(node.out)
    st = S.Gemm(a=x, b=y, bias=None, res=None, c=c)
    lw.steps.append(st)
    lw.gemm_open[c] = st
    return c


@register_lowering("aten.addmm.default", "aten.baddbmm.default", check=_check)
def _addmm(lw: Lowerer, node: Any) -> int:
    a, out = list(node.args), node.out
    bias, x, y = lw.value(a[0]), lw.value(a[1]), lw.value(a[2])
    beta, alpha = _scalars(a, dict(node.kwargs))
    c = lw.fresh(out)
    bb = lw.broadcast(bias, tuple(out.shape))
    st = S.Gemm(a=x, b=y, bias=bb if beta != 0 else None, res=None, c=c, alpha=alpha, beta=beta)
    lw.steps.append(st)
    lw.gemm_open[c] = st
    return c


@register_lowering("aten.addmv.default", check=_check)
def _addmv(lw: Lowerer, node: Any) -> int:
    """beta * bias + alpha * (mat @ vec), as an [N, 1] GEMM."""
    a, out = list(node.args), node.out
    bias, m, v = lw.value(a[0]), lw.value(a[1]), lw.value(a[2])
    beta, alpha = _scalars(a, dict(node.kwargs))
    c = lw.fresh(out)

    def column(val: int) -> int:
        vv = lw.values[val]
        return lw.new_value(vv["buf"], vv["offset"], [vv["sizes"][0], 1], [vv["strides"][0], 0])

    bb = column(lw.broadcast(bias, tuple(out.shape)))
    lw.steps.append(
        S.Gemm(a=m, b=column(v), bias=bb if beta != 0 else None, res=None, c=column(c), alpha=alpha, beta=beta)
    )
    return c


@register_lowering("aten.addbmm.default", check=more_check())
def _addbmm(lw: Lowerer, node: Any) -> int:
    a, kw, out = list(node.args), dict(node.kwargs), node.out
    bias, b1, b2 = lw.value(a[0]), lw.value(a[1]), lw.value(a[2])
    beta, alpha = float(kw.get("beta", 1)), float(kw.get("alpha", 1))
    bsz, n, m = lw.values[b1]["sizes"]
    p = lw.values[b2]["sizes"][2]
    # sum over the batch of b1[i] @ b2[i] == (n, B*m) @ (B*m, p)
    t1 = lw.temp([n, bsz, m])
    lw.copy_into(lw.view_of(b1, lw.meta_tensor(b1).permute(1, 0, 2)), t1)
    t2 = lw.temp([bsz, m, p])
    lw.copy_into(b2, t2)
    lhs = lw.view_of(t1, lw.meta_tensor(t1).view(n, bsz * m))
    rhs = lw.view_of(t2, lw.meta_tensor(t2).view(bsz * m, p))
    c = lw.fresh(out)
    bb = lw.broadcast(bias, tuple(out.shape)) if beta != 0 else None
    lw.steps.append(S.Gemm(a=lhs, b=rhs, bias=bb, res=None, c=c, alpha=alpha, beta=beta))
    return c


def fuse_epilogue(lw: Lowerer, node: Any) -> int | None:
    """Folds an activation or a residual add that is the only reader of a GEMM result into
    the GEMM's epilogue (applied per output tile inside the kernel); returns the GEMM's
    value, or None when the node is lowered as ordinary elementwise code."""
    from tb_cpu_rust.lowering.limits import MAX_EPILOGUE

    op, args, kw = node.op, list(node.args), dict(node.kwargs)
    meta = node.out
    if not isinstance(meta, TensorMeta) or meta.dtype != F32:
        return None
    name = None
    if op == "aten.gelu.default":
        approx = kw.get("approximate", args[1] if len(args) > 1 else "none")
        name = "gelu_tanh" if approx == "tanh" else "gelu"
    elif op in EPILOGUE_UNARY and len(args) == 1:
        name = EPILOGUE_UNARY[op]
    elif op == "aten.add.Tensor" and len(args) == 2 and float(kw.get("alpha", 1)) == 1.0:
        name = "add"
    if name is None:
        return None
    gemm_arg = None
    for a in args[: 2 if name == "add" else 1]:
        only_reader = isinstance(a, Ref) and lw.uses.get(a.slot, 0) == 1
        if only_reader and isinstance(lw.slot.get(a.slot), int) and lw.slot[a.slot] in lw.gemm_open:
            gemm_arg = a
            break
    if gemm_arg is None:
        return None
    c = lw.slot[gemm_arg.slot]
    csizes = lw.values[c]["sizes"]
    if list(meta.shape) != csizes:
        return None
    step = lw.gemm_open[c]
    if len(step.epilogue) >= MAX_EPILOGUE:
        return None
    fused = replace(step, epilogue=(*step.epilogue, name))
    if name == "add":
        other = args[1] if args[0] is gemm_arg else args[0]
        if not isinstance(other, Ref) or lw.dtype_of_arg(other) != F32 or "add" in step.epilogue:
            return None
        r = lw.value(other)  # may flush an open group: its step then lands after the GEMM
        rb = lw.broadcast(r, tuple(csizes))
        if lw.values[rb]["buf"] == lw.values[c]["buf"]:
            return None
        fused = replace(fused, res=rb)
        # nothing between the GEMM and here reads its result, so it may move after the
        # residual's producer
        lw.steps.remove(step)
        lw.steps.append(fused)
    else:
        lw.replace_step(step, fused)
    lw.gemm_open[c] = fused
    lw.used[gemm_arg.slot] = lw.used.get(gemm_arg.slot, 0) + 1
    return c


#: storage dtypes the ``gemm`` step reads and writes itself (float32 compute, src/kernels/gemm/bf16.rs)
LOW = frozenset({torch.bfloat16, torch.float16})


def _same_layout(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Equal sizes and equal strides on every dimension of more than one element."""
    return a["sizes"] == b["sizes"] and all(
        s <= 1 or x == y for s, x, y in zip(a["sizes"], a["strides"], b["strides"], strict=True)
    )


def fold_low_precision_casts(lw: Lowerer, outputs: list[Any]) -> None:
    """Lets ``gemm`` steps read and write bfloat16 / float16 buffers themselves.

    The low-precision pass (torchburn.low_precision) computes a bfloat16 matmul in float32
    between casts: ``cast(x) -> gemm -> cast(bf16)``. Here a GEMM operand (a, b, bias, residual)
    that is a view of a float32 temporary written only by a ``cast`` from bfloat16 / float16 reads
    the same view of the cast's source instead, and a GEMM whose float32 result only a ``cast``
    to bfloat16 / float16 reads writes that cast's result directly (rounded once from the
    float32 tile, as the cast rounded it). Casts nothing reads any more are dropped: a bfloat16
    weight is read as stored, never widened into a copy, and the float32 result is never
    materialised. Operates on ``lw.steps`` before the memory plan."""
    steps = lw.steps
    if not any(isinstance(st, S.Gemm) for st in steps) or not any(isinstance(st, S.Cast) for st in steps):
        return
    vals, bufs = lw.values, lw.buffers
    out_bufs = {vals[v]["buf"] for kind, v in outputs if kind == "v"}

    def buf(v: int) -> int:
        return int(vals[v]["buf"])

    def whole(v: int) -> bool:
        val = vals[v]
        return bool(val["offset"] == 0 and extent(val["sizes"], val["strides"]) == bufs[val["buf"]]["numel"])

    def index(steps: list[S.Step] = steps) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
        readers: dict[int, list[int]] = {}
        writers: dict[int, list[int]] = {}
        for i, st in enumerate(steps):
            for v in st.reads():
                if v is not None:
                    readers.setdefault(buf(v), []).append(i)
            for v in st.writes():
                writers.setdefault(buf(v), []).append(i)
        return readers, writers

    def temp(b: int) -> bool:
        return bool(bufs[b]["kind"] == "temp" and b not in out_bufs)

    readers, writers = index()
    folded: set[int] = set()  # buffers of GEMM results now written in low precision
    for i, st in enumerate(steps):
        if not isinstance(st, S.Gemm):
            continue
        new = st
        for name in ("a", "b", "bias", "res"):
            v = getattr(st, name)
            if v is None or not temp(buf(v)) or writers.get(buf(v), []) != [w := writers[buf(v)][0]] or w >= i:
                continue
            cast = steps[w]
            if not isinstance(cast, S.Cast) or lw.dtype_of(cast.y) != F32 or lw.dtype_of(cast.x) not in LOW:
                continue
            src, dst = vals[cast.x], vals[cast.y]
            if not whole(cast.y) or not _same_layout(src, dst):
                continue
            if any(j in writers.get(buf(cast.x), []) for j in range(w + 1, i)):
                continue  # the source changes between the cast and the GEMM
            view = vals[v]
            new = replace(
                new, **{name: lw.new_value(src["buf"], src["offset"] + view["offset"], view["sizes"], view["strides"])}
            )
        c = st.c
        rd = readers.get(buf(c), [])
        if temp(buf(c)) and whole(c) and len(rd) == 1 and rd[0] > i:
            cast = steps[rd[0]]
            if (
                isinstance(cast, S.Cast)
                and vals[cast.x]["buf"] == vals[c]["buf"]
                and vals[cast.x]["offset"] == vals[c]["offset"]
                and _same_layout(vals[cast.x], vals[c])
                and lw.dtype_of(cast.y) in LOW
                and _same_layout(vals[c], vals[cast.y])
                and writers.get(buf(cast.y)) == [rd[0]]
                and buf(cast.y) not in {buf(x) for x in new.reads() if x is not None}
            ):
                new = replace(new, c=cast.y)
                folded.add(buf(c))
                steps[rd[0]] = S.Cast(x=cast.y, y=cast.y)  # a placeholder, dropped below
        if new is not st:
            steps[i] = new
            readers, writers = index()
    # casts that are no longer read (or were folded into a GEMM's result) are dropped
    readers, _ = index()
    dropped = [
        st
        for st in steps
        if isinstance(st, S.Cast) and (st.x == st.y or (temp(buf(st.y)) and not readers.get(buf(st.y))))
    ]
    if not dropped:
        return
    lw.steps = [st for st in steps if not any(st is d for d in dropped)]
    # the buffers only those casts and the folded GEMMs touched are left empty (no memory)
    readers, writers = index(lw.steps)
    orphans = {buf(v) for st in dropped for v in (st.x, st.y)} | folded
    orphans = {b for b in orphans if temp(b) and b not in readers and b not in writers}
    for val in vals:
        if val["buf"] in orphans:
            val["sizes"] = [0] * len(val["sizes"])
            val["offset"] = 0
    for b in orphans:
        bufs[b]["numel"] = 0
