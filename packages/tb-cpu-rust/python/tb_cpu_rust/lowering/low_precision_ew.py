"""Folding of bfloat16 / float16 casts into fused elementwise programs (``fold_casts_into_ew``).

The low-precision pass (torchburn.low_precision) computes a bfloat16 elementwise chain in float32
between casts: ``cast(x, f32) -> ew -> cast(bf16)``, each cast a sweep of its own over memory.
The executor's float32 elementwise programs load bfloat16 / float16 operands widened and store
their float32 results rounded to nearest even (as the cast rounds), so here an ``ew`` step
operand that is a view of a float32 temporary written only by a ``cast`` from bfloat16 /
float16 reads the same view of the cast's source, and an ``ew`` result that only a ``cast`` to
bfloat16 / float16 reads is stored into that cast's result directly. Casts nothing reads any
more are dropped, and so are the float32 temporaries only they touched: the chain reads and
writes bfloat16 in one pass. Operates on ``lw.steps`` before the memory plan, after the GEMMs
took the casts around them (``gemm.fold_low_precision_casts``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from tb_cpu_rust.lowering import steps as S
from tb_cpu_rust.lowering.dtypes import F32
from tb_cpu_rust.lowering.lowerer import Lowerer, extent

LOW = frozenset({torch.bfloat16, torch.float16})


def _same_layout(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Equal sizes and equal strides on every dimension of more than one element."""
    return a["sizes"] == b["sizes"] and all(
        s <= 1 or x == y for s, x, y in zip(a["sizes"], a["strides"], b["strides"], strict=True)
    )


class _Index:
    """Which steps read and write each buffer."""

    def __init__(self, lw: Lowerer) -> None:
        self.readers: dict[int, list[int]] = {}
        self.writers: dict[int, list[int]] = {}
        for i, st in enumerate(lw.steps):
            for v in st.reads():
                if v is not None:
                    self.readers.setdefault(lw.values[v]["buf"], []).append(i)
            for v in st.writes():
                self.writers.setdefault(lw.values[v]["buf"], []).append(i)


def fold_casts_into_ew(lw: Lowerer, outputs: list[Any]) -> None:
    """Lets float32 ``ew`` steps read and write bfloat16 / float16 buffers themselves (see the
    module docstring). Rewrites ``lw.steps``, ``lw.values`` and ``lw.buffers`` in place."""
    if not any(isinstance(st, S.Ew) for st in lw.steps) or not any(isinstance(st, S.Cast) for st in lw.steps):
        return
    vals, bufs = lw.values, lw.buffers
    out_bufs = {vals[v]["buf"] for kind, v in outputs if kind == "v"}

    def buf(v: int) -> int:
        return int(vals[v]["buf"])

    def temp(b: int) -> bool:
        return bool(bufs[b]["kind"] == "temp" and b not in out_bufs)

    def whole(v: int) -> bool:
        val = vals[v]
        return bool(val["offset"] == 0 and extent(val["sizes"], val["strides"]) == bufs[val["buf"]]["numel"])

    def widening_cast(v: int, at: int, ix: _Index) -> Any:
        """The ``cast`` from bfloat16 / float16 that alone writes ``v``'s float32 temporary before
        step ``at``, when the operand may read its source instead."""
        b = buf(v)
        ws = ix.writers.get(b, [])
        if not temp(b) or len(ws) != 1 or ws[0] >= at:
            return None
        cast = lw.steps[ws[0]]
        if not isinstance(cast, S.Cast) or lw.dtype_of(cast.y) != F32 or lw.dtype_of(cast.x) not in LOW:
            return None
        if not whole(cast.y) or not _same_layout(vals[cast.x], vals[cast.y]):
            return None
        if any(ws[0] < j < at for j in ix.writers.get(buf(cast.x), [])):
            return None  # the source changes between the cast and the elementwise step
        return cast

    changed = False
    folded: set[int] = set()  # float32 temporaries no elementwise step writes any more
    ix = _Index(lw)
    for i, st in enumerate(lw.steps):
        if not isinstance(st, S.Ew) or st.compute != "f32":
            continue
        ins = list(st.ins)
        for k, v in enumerate(ins):
            cast = widening_cast(v, i, ix)
            if cast is not None:
                src, view = vals[cast.x], vals[v]
                ins[k] = lw.new_value(src["buf"], src["offset"] + view["offset"], view["sizes"], view["strides"])
        outs = list(st.outs)
        for k, c in enumerate(outs):
            rd = ix.readers.get(buf(c), [])
            if not (temp(buf(c)) and whole(c) and lw.dtype_of(c) == F32 and len(rd) == 1 and rd[0] > i):
                continue
            if len(ix.writers.get(buf(c), [])) != 1:
                continue
            cast = lw.steps[rd[0]]
            if not (
                isinstance(cast, S.Cast)
                and buf(cast.x) == buf(c)
                and vals[cast.x]["offset"] == vals[c]["offset"]
                and _same_layout(vals[cast.x], vals[c])
                and lw.dtype_of(cast.y) in LOW
                and _same_layout(vals[c], vals[cast.y])
                and ix.writers.get(buf(cast.y)) == [rd[0]]
                and buf(cast.y) not in {buf(x) for x in ins}
                and buf(cast.y) not in {buf(x) for x in outs}
                and not any(i < j < rd[0] for j in ix.readers.get(buf(cast.y), []))
            ):
                continue
            folded.add(buf(c))
            outs[k] = cast.y
            lw.steps[rd[0]] = S.Cast(x=cast.y, y=cast.y)  # a placeholder, dropped below
        if ins != list(st.ins) or outs != list(st.outs):
            lw.steps[i] = replace(st, ins=ins, outs=outs)
            changed = True
            ix = _Index(lw)
    if not changed:
        return
    ix = _Index(lw)
    dropped = [
        st
        for st in lw.steps
        if isinstance(st, S.Cast) and (st.x == st.y or (temp(buf(st.y)) and not ix.readers.get(buf(st.y))))
    ]
    lw.steps = [st for st in lw.steps if not any(st is d for d in dropped)]
    # buffers nothing touches any more are left empty (no memory)
    ix = _Index(lw)
    orphans = {buf(v) for st in dropped for v in (st.x, st.y)} | folded
    orphans = {b for b in orphans if temp(b) and b not in ix.readers and b not in ix.writers}
    # a 0-d view always reaches one element: its buffer keeps its (one-element) size
    orphans -= {val["buf"] for val in vals if not val["sizes"]}
    for val in vals:
        if val["buf"] in orphans:
            val["sizes"] = [0] * len(val["sizes"])
            val["offset"] = 0
    for b in orphans:
        bufs[b]["numel"] = 0
