"""Rotary position embedding (``x * cos + rotate_half(x) * sin``, as transformers' Llama / Qwen2
``apply_rotary_pos_emb`` writes it) as one elementwise sweep over half the head dim.

In ATen the expression is ``add(mul(x, cos), mul(cat([neg(x[..., h:]), x[..., :h]], -1), sin))``:
lowered node by node it materialises the negated half, copies both halves into the ``cat`` buffer
and runs two more sweeps (five passes over the tensor). Written per half it is one program:
``out[..., :h] = x_lo * cos_lo - x_hi * sin_lo`` and ``out[..., h:] = x_hi * cos_hi + x_lo * sin_hi``
— the same float operations in the same order as the unfused graph (``a + (-b)`` is ``a - b``).

``find_ropes`` matches the pattern on the plan before lowering (float32, each intermediate read
only inside the pattern); the lowerer then skips the intermediate nodes and lowers the final add
with ``lower_rope``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tb_cpu_rust.lowering import steps as S
from tb_cpu_rust.lowering.dtypes import F32
from torchburn.plan import Plan, Ref, TensorMeta

_BIG = 2**62


@dataclass(frozen=True)
class Rope:
    """A matched rotary embedding: the final add's node index, the nodes it replaces, and the
    operands (``x``, ``cos``, ``sin``) with the rotated dim and half size."""

    add: int
    inner: frozenset[int]
    x: Ref
    cos: Ref
    sin: Ref
    dim: int
    half: int


def _meta(plan: Plan, r: Any) -> TensorMeta | None:
    if not isinstance(r, Ref):
        return None
    base = len(plan.inputs)
    m = plan.inputs[r.slot] if r.slot < base else plan.nodes[r.slot - base].out
    return m if isinstance(m, TensorMeta) else None


def find_ropes(plan: Plan, uses: dict[int, int]) -> dict[int, Rope]:
    """Every rotary embedding of the plan, by the node index of its final add."""
    base = len(plan.inputs)

    def node(r: Any) -> tuple[int, Any] | None:
        if isinstance(r, Ref) and r.slot >= base:
            k = r.slot - base
            return k, plan.nodes[k]
        return None

    def only_here(r: Ref) -> bool:
        return uses.get(r.slot, 0) == 1

    def mul_parts(r: Any) -> tuple[int, Any, Any] | None:
        got = node(r)
        if got is None or got[1].op != "aten.mul.Tensor" or got[1].kwargs or not only_here(r):
            return None
        a, b = got[1].args
        return got[0], a, b

    found: dict[int, Rope] = {}
    for k, add in enumerate(plan.nodes):
        if add.op != "aten.add.Tensor" or add.kwargs or len(add.args) != 2 or not isinstance(add.out, TensorMeta):
            continue
        out = add.out
        if out.dtype != F32 or not out.shape or out.shape[-1] % 2:
            continue
        for first, second in (add.args, add.args[::-1]):
            m1, m2 = mul_parts(first), mul_parts(second)
            if m1 is None or m2 is None:
                continue
            match = _match(plan, node, only_here, out, m1, m2)
            if match is not None:
                inner, x, cos, sin, dim, half = match
                found[k] = Rope(k, frozenset(inner), x, cos, sin, dim, half)
                break
    return found


def _match(plan: Plan, node: Any, only_here: Any, out: TensorMeta, m1: Any, m2: Any) -> Any:
    rank = len(out.shape)
    for cat_side in (1, 2):
        k2, a2, b2 = m2
        cat_ref, sin = (a2, b2) if cat_side == 1 else (b2, a2)
        got = node(cat_ref)
        if got is None or got[1].op != "aten.cat.default" or not only_here(cat_ref):
            continue
        kc, cat = got
        parts = cat.args[0]
        dim = (cat.args[1] if len(cat.args) > 1 else cat.kwargs.get("dim", 0)) % rank
        if dim != rank - 1 or len(parts) != 2:
            continue
        neg = node(parts[0])
        if neg is None or neg[1].op != "aten.neg.default" or not only_here(parts[0]):
            continue
        hi = _slice_of(node, only_here, neg[1].args[0], rank)
        lo = _slice_of(node, only_here, parts[1], rank)
        if hi is None or lo is None or hi[1] != lo[1]:
            continue
        x = hi[1]
        half = out.shape[-1] // 2
        if (lo[2], lo[3]) != (0, half) or hi[2] != half or hi[3] < 2 * half:
            continue
        k1, a1, b1 = m1
        cos = b1 if a1 == x else a1 if b1 == x else None
        if cos is None:
            continue
        xm, cm, sm = _meta(plan, x), _meta(plan, cos), _meta(plan, sin)
        if xm is None or cm is None or sm is None or {xm.dtype, cm.dtype, sm.dtype} != {F32}:
            continue
        if (
            tuple(xm.shape) != tuple(out.shape)
            or not _broadcasts(cm.shape, out.shape)
            or not _broadcasts(sm.shape, out.shape)
        ):
            continue
        if cm.shape[-1] != out.shape[-1] or sm.shape[-1] != out.shape[-1]:
            continue  # cos / sin must vary along the rotated dim as x does (no broadcast there)
        inner = {k1, k2, kc, neg[0], hi[0], lo[0]}
        return inner, x, cos, sin, dim, half
    return None


def _slice_of(node: Any, only_here: Any, r: Any, rank: int) -> tuple[int, Any, int, int] | None:
    """(node index, source, start, end) of a step-1 slice of the last dim read only here."""
    got = node(r)
    if got is None or got[1].op != "aten.slice.Tensor" or got[1].kwargs or not only_here(r):
        return None
    a = list(got[1].args)
    src, dim = a[0], a[1] if len(a) > 1 else 0
    start, end, step = (a[2] if len(a) > 2 else 0), (a[3] if len(a) > 3 else _BIG), (a[4] if len(a) > 4 else 1)
    if not isinstance(src, Ref) or dim % rank != rank - 1 or step != 1 or start is None or start < 0:
        return None
    return got[0], src, int(start), int(end) if end is not None else _BIG


def _broadcasts(shape: tuple[int, ...], to: tuple[int, ...]) -> bool:
    if len(shape) > len(to):
        return False
    return all(s in (1, t) for s, t in zip(shape[::-1], to[::-1]))


def lower_rope(lw: Any, rope: Rope, out_meta: TensorMeta) -> int:
    """One sweep over (..., half): loads both halves of x, cos and sin, stores both halves."""
    x, cos, sin = (lw.value(r) for r in (rope.x, rope.cos, rope.sin))
    o = lw.fresh(out_meta)
    shape = tuple(out_meta.shape)
    h = rope.half

    def halves(v: int) -> tuple[int, int]:
        t = lw.meta_tensor(lw.broadcast(v, shape))
        return lw.view_of(v, t.narrow(-1, 0, h)), lw.view_of(v, t.narrow(-1, h, h))

    full = lw.meta_tensor(o)
    o_lo, o_hi = lw.view_of(o, full.narrow(-1, 0, h)), lw.view_of(o, full.narrow(-1, h, h))
    ins = [*halves(x), *halves(cos), *halves(sin)]
    prog = [S.load(i, i) for i in range(6)]
    prog += [
        S.instr("mul", 6, [0, 2]),  # x_lo * cos_lo
        S.instr("mul", 7, [1, 4]),  # x_hi * sin_lo
        S.instr("sub", 8, [6, 7], [1.0]),
        S.instr("mul", 9, [1, 3]),  # x_hi * cos_hi
        S.instr("mul", 10, [0, 5]),  # x_lo * sin_hi
        S.instr("add", 11, [9, 10], [1.0]),
        S.store(0, 8),
        S.store(1, 11),
    ]
    lw.steps.append(S.Ew("f32", ins, [o_lo, o_hi], prog))
    return o
