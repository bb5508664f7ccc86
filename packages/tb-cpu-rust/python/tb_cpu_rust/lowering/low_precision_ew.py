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


#: the register instruction that rounds a float32 value as a store to the dtype would
ROUND = {torch.bfloat16: "round_bf16", torch.float16: "round_f16"}


def _regs(prog: list[S.Instr]) -> int:
    """Registers a program uses (a store's ``dst`` is an output slot, not a register)."""
    return 1 + max((ins.dst for ins in prog if ins.op != "store"), default=-1)


def merge_rounded_ew_chains(lw: Lowerer, outputs: list[Any]) -> None:
    """Fuses float32 ``ew`` steps that pass a bfloat16 / float16 intermediate through memory.

    Eager rounds every op of a low-precision elementwise chain (GPT-2's GELU: eight ops), so the
    pass leaves a cast pair between each two of them and, once ``fold_casts_into_ew`` folded those,
    one ``ew`` step per op, each a sweep over memory. Where step ``j`` reads, through the very
    view it was written in, a low-precision buffer only step ``i`` writes, and nothing between
    them touches what ``i`` reads or writes, the two become one program at ``j``'s place: ``i``'s
    result is rounded in its register (``round_bf16`` / ``round_f16``: the rounding the store
    made) and ``j`` reads that register instead of loading the buffer. The buffer is still
    written when anything else reads it (or it is an output), else it is dropped."""
    vals, bufs = lw.values, lw.buffers
    out_bufs = {vals[v]["buf"] for kind, v in outputs if kind == "v"}

    def buf(v: int) -> int:
        return int(vals[v]["buf"])

    def same_view(a: int, b: int) -> bool:
        x, y = vals[a], vals[b]
        return bool(x["buf"] == y["buf"] and x["offset"] == y["offset"] and _same_layout(x, y))

    def f32_ew(st: S.Step) -> bool:
        return isinstance(st, S.Ew) and st.compute == "f32"

    def candidate(j: int, ix: _Index) -> tuple[int, int] | None:
        """(i, the slot of step j's input i writes) for the first merge step j takes."""
        sj: Any = lw.steps[j]
        for v in sj.ins:
            if lw.dtype_of(v) not in ROUND:
                continue
            ws = ix.writers.get(buf(v), [])
            if len(ws) != 1 or ws[0] >= j or not f32_ew(lw.steps[ws[0]]):
                continue
            i = ws[0]
            si: Any = lw.steps[i]
            slots = [q for q, o in enumerate(si.outs) if buf(o) == buf(v)]
            if len(slots) != 1 or not same_view(si.outs[slots[0]], v):
                continue
            if vals[si.outs[0]]["sizes"] != vals[sj.outs[0]]["sizes"]:
                continue
            touched = {buf(x) for x in [*si.ins, *si.outs]}
            if {buf(x) for x in sj.outs} & touched:
                continue  # j writes what i reads or writes: per element, in another view perhaps
            written = {buf(x) for x in si.outs}
            if any(buf(x) in written and not same_view(x, si.outs[slots[0]]) for x in sj.ins):
                continue  # j would read what the merged step writes (another result of i)
            if any(
                {buf(x) for x in st.writes()} & touched or {buf(x) for x in st.reads() if x is not None} & written
                for st in lw.steps[i + 1 : j]
            ):
                continue
            return i, slots[0]
        return None

    def merge(i: int, slot: int, j: int, ix: _Index) -> S.Step:
        si: Any = lw.steps[i]
        sj: Any = lw.steps[j]
        b = buf(si.outs[slot])
        dtype = lw.dtype_of(si.outs[slot])
        reg_b = next(ins.a[0] for ins in si.prog if ins.op == "store" and ins.dst == slot)
        ni, nj = _regs(si.prog), _regs(sj.prog)
        rounded = ni + nj
        forwarded = {k for k, v in enumerate(sj.ins) if same_view(v, si.outs[slot])}
        kept_ins = [k for k in range(len(sj.ins)) if k not in forwarded]
        still_read = (
            b in out_bufs
            or bufs[b]["kind"] != "temp"
            or any(r != j for r in ix.readers.get(b, []))
            or any(buf(sj.ins[k]) == b for k in kept_ins)
        )
        i_outs = list(si.outs) if still_read else [o for q, o in enumerate(si.outs) if q != slot]

        def i_store(q: int) -> int:
            return q if still_read or q < slot else q - 1

        prog: list[S.Instr] = [
            replace(ins, dst=i_store(ins.dst)) if ins.op == "store" else ins
            for ins in si.prog
            if still_read or not (ins.op == "store" and ins.dst == slot)
        ]
        prog.append(S.Instr(ROUND[dtype], rounded, (reg_b,)))
        ins_index = {k: len(si.ins) + n for n, k in enumerate(kept_ins)}
        for ins in sj.prog:
            if ins.op == "load" and ins.a[0] in forwarded:
                prog.append(S.Instr("copy", ins.dst + ni, (rounded,)))
            elif ins.op == "load":
                prog.append(S.Instr("load", ins.dst + ni, (ins_index[ins.a[0]],)))
            elif ins.op == "store":
                prog.append(S.Instr("store", ins.dst + len(i_outs), (ins.a[0] + ni,)))
            else:
                prog.append(replace(ins, dst=ins.dst + ni, a=tuple(r + ni for r in ins.a)))
        new: S.Step = replace(sj, ins=[*si.ins, *(sj.ins[k] for k in kept_ins)], outs=[*i_outs, *sj.outs], prog=prog)
        if not still_read and all(val["sizes"] for val in vals if val["buf"] == b):  # 0-d views keep theirs
            for val in vals:
                if val["buf"] == b:
                    val["sizes"] = [0] * len(val["sizes"])
                    val["offset"] = 0
            bufs[b]["numel"] = 0
        return new

    while True:
        ix = _Index(lw)
        found = next(((j, c) for j in range(len(lw.steps)) if f32_ew(lw.steps[j]) and (c := candidate(j, ix))), None)
        if found is None:
            return
        j, (i, slot) = found
        lw.steps[j] = merge(i, slot, j, ix)
        del lw.steps[i]
