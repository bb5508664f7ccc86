"""Indexing: embedding, ``x[i, j]``, gather / index_select, scatter and index_put in all their
forms, put, masked_scatter, nonzero_static, embedding_bag, segment_reduce, and the
reflection / replication pads (a gather through a computed index)."""

from __future__ import annotations

import math
from typing import Any

import torch

from tb_cpu_rust.lowering import steps as S
from tb_cpu_rust.lowering.checks import kernel_check, more_check
from tb_cpu_rust.lowering.dtypes import DTYPES, F32, I32, I64
from tb_cpu_rust.lowering.lowerer import Lowerer, contig, meta
from tb_cpu_rust.lowering.registry import LoweringError, register_lowering
from torchburn.plan import GETITEM

#: padding by index: each padded dim is one gather through a computed index vector
INDEX_PADS = frozenset({
    "aten.reflection_pad1d.default", "aten.reflection_pad2d.default", "aten.reflection_pad3d.default",
    "aten.replication_pad1d.default", "aten.replication_pad2d.default", "aten.replication_pad3d.default",
})  # fmt: skip


@register_lowering("aten.embedding.default", check=kernel_check())
def _embedding(lw: Lowerer, node: Any) -> int:
    w, idx = lw.value(node.args[0]), lw.value(node.args[1])
    o = lw.fresh(node.out)
    lw.steps.append(S.Embedding(weight=w, index=idx, out=o))
    return o


def _check_index(info: Any) -> str | None:
    if all(i is None for i in info.args[1]):
        return "index without an index tensor"
    if any(m.dtype != I64 for m in info.inputs[1:]):
        return "only int64 indices"
    return None


@register_lowering("aten.index.Tensor", check=kernel_check(extra=_check_index))
def _index(lw: Lowerer, node: Any) -> int:
    """``x[i0, i1, ...]`` (``aten.index.Tensor``) as one gather over broadcast index tensors.

    A ``None`` entry (a full slice, as interpolation's decompositions write
    ``x[None, None, h, w]``) becomes an ``arange`` over its dimension, shaped so that the
    broadcast of every index lands where PyTorch puts that dimension: before the indexed
    dimensions when the index tensors are adjacent, after them when they are not (NumPy's
    rule). Trailing ``None``s are the dimensions the kernel copies whole anyway."""
    entries = list(node.args[1])
    x = lw.value(node.args[0])
    xs = lw.values[x]["sizes"]
    while entries and entries[-1] is None:
        entries.pop()
    pos = [d for d, e in enumerate(entries) if e is not None]
    tens = [lw.value(entries[d]) for d in pos]
    bshape = tuple(torch.broadcast_shapes(*[tuple(lw.values[t]["sizes"]) for t in tens]))
    sliced = [d for d, e in enumerate(entries) if e is None]
    adjacent = pos == list(range(pos[0], pos[-1] + 1))
    nb = len(bshape)
    sliced_sizes = tuple(xs[d] for d in sliced)
    full = sliced_sizes + bshape if adjacent else bshape + sliced_sizes
    at_b = len(sliced) if adjacent else 0  # where the index tensors' broadcast dims start in `full`
    idx: dict[int, int] = {}
    for j, d in enumerate(sliced):
        r = lw.fresh(meta((xs[d],), I64))
        lw.steps.append(S.Arange(y=r, start=0.0, step=1.0))
        at = j if adjacent else nb + j
        sizes, strides = [1] * len(full), [0] * len(full)
        sizes[at], strides[at] = xs[d], 1
        idx[d] = lw.broadcast(lw.new_value(lw.values[r]["buf"], 0, sizes, strides), full)
    for d, t in zip(pos, tens):
        tb = lw.values[lw.broadcast(t, bshape)]
        pad = len(full) - at_b - nb
        sizes = [1] * at_b + list(bshape) + [1] * pad
        strides = [0] * at_b + list(tb["strides"]) + [0] * pad
        idx[d] = lw.broadcast(lw.new_value(tb["buf"], tb["offset"], sizes, strides), full)
    o = lw.fresh(node.out)
    lw.steps.append(S.Index(x=x, indices=[idx[d] for d in range(len(entries))], out=o))
    return o


@register_lowering("aten.gather.default", check=kernel_check(int32_index=True))
def _gather(lw: Lowerer, node: Any) -> int:
    a = node.args
    x, idx = lw.value(a[0]), lw.value(a[2])
    o = lw.fresh(node.out)
    if not lw.values[x]["sizes"] and not lw.values[idx]["sizes"]:
        x, idx, t = lw.as_1d(x), lw.as_1d(idx), lw.as_1d(o)
    else:
        t = o
    lw.steps.append(S.Gather(x=x, index=idx, out=t, dim=a[1]))
    return o


@register_lowering("aten.index_select.default", check=kernel_check())
def _index_select(lw: Lowerer, node: Any) -> int:
    a = node.args
    x, idx = lw.value(a[0]), lw.value(a[2])
    o = lw.fresh(node.out)
    lw.steps.append(S.IndexSelect(x=lw.as_1d(x), index=lw.as_1d(idx), out=lw.as_1d(o), dim=a[1]))
    return o


def _float32_result(info: Any) -> str | None:
    return "float32 only" if info.out_metas[0].dtype != F32 else None


_SCATTER_REDUCE = {"sum": 1, "prod": 2, "amax": 3, "amin": 4, "mean": 5}


@register_lowering(
    "aten.scatter.src", "aten.scatter.value", "aten.scatter_add.default", "aten.scatter.reduce",
    "aten.scatter.value_reduce", check=kernel_check(int32_index=True),
)  # fmt: skip
@register_lowering("aten.scatter_reduce.two", check=kernel_check(int32_index=True, extra=_float32_result))
def _scatter(lw: Lowerer, node: Any) -> int:
    op, a, kw, out = node.op, list(node.args), dict(node.kwargs), node.out
    base, dim_, idx = lw.value(a[0]), a[1], lw.value(a[2])
    if op in ("aten.scatter.value", "aten.scatter.value_reduce"):
        src = lw.fresh(meta(lw.values[idx]["sizes"], out.dtype))
        lw.fill(src, a[3])
    else:
        src = lw.value(a[3])
    how, include = 0, True
    if op == "aten.scatter_add.default":
        how = 1
    elif op == "aten.scatter_reduce.two":
        how = _SCATTER_REDUCE[a[4]]
        include = bool(kw.get("include_self", a[5] if len(a) > 5 else True))
    elif op in ("aten.scatter.reduce", "aten.scatter.value_reduce"):
        how = {"add": 1, "multiply": 2}[str(kw.get("reduce", a[4] if len(a) > 4 else None))]
    o = lw.fresh(out)
    lw.steps.append(S.Scatter(base=lw.as_1d(base), index=lw.as_1d(idx), src=lw.as_1d(src), out=lw.as_1d(o),
                              dim=dim_ if out.shape else 0, how=how, include_self=include))  # fmt: skip
    return o


@register_lowering("aten.index_reduce.default", check=kernel_check(float_only=True, extra=_float32_result))
def _index_reduce(lw: Lowerer, node: Any) -> int:
    a, kw, out = list(node.args), dict(node.kwargs), node.out
    base, dim_, idx, src, red = lw.value(a[0]), a[1], lw.value(a[2]), lw.value(a[3]), a[4]
    include = bool(kw.get("include_self", a[5] if len(a) > 5 else True))
    how = _SCATTER_REDUCE[red]
    o = lw.fresh(out)
    if not out.shape:
        base, src, idx = lw.as_1d(base), lw.as_1d(src), lw.as_1d(idx)
        lw.steps.append(S.Scatter(base=base, index=idx, src=src, out=lw.as_1d(o), dim=0, how=how, include_self=include))
        return o
    ssz = lw.values[src]["sizes"]
    d = dim_ % len(ssz)
    iv = lw.values[idx]
    strides = [0] * len(ssz)
    strides[d] = iv["strides"][0] if iv["sizes"] else 0
    idx_view = lw.new_value(iv["buf"], iv["offset"], list(ssz), strides)
    lw.steps.append(S.Scatter(base=base, index=idx_view, src=src, out=o, dim=d, how=how, include_self=include))
    return o


def _check_index_put(info: Any) -> str | None:
    nones = [i is None for i in info.args[1]]
    if all(nones) or any(nones[nones.index(False) :]):
        return "index with None after an index tensor"
    if any(m.dtype not in (I64, I32) for m in info.inputs[1:-1]):
        return "only int64 or int32 indices"
    return None


@register_lowering("aten.index_put.default", check=kernel_check(int32_index=True, extra=_check_index_put))
def _index_put(lw: Lowerer, node: Any) -> int:
    a, kw, out = list(node.args), dict(node.kwargs), node.out
    base, values = lw.value(a[0]), lw.value(a[2])
    accumulate = bool(kw.get("accumulate", a[3] if len(a) > 3 else False))
    # leading None indices (index_copy / index_fill on a later dim): the kernel indexes the
    # leading dims, so the indexed dims are moved to the front of base, values and result
    lead = next(k for k, i in enumerate(a[1]) if i is not None)
    idx = [lw.value(i) for i in a[1][lead:]]
    bshape = tuple(torch.broadcast_shapes(*[tuple(lw.values[i]["sizes"]) for i in idx]))
    idx = [lw.broadcast(i, bshape) for i in idx]
    rest = tuple(out.shape[lead + len(idx) :])
    vals = lw.broadcast(values, tuple(out.shape[:lead]) + bshape + rest)
    if lw.dtype_of(vals) != out.dtype:
        vals = lw.convert(vals, out.dtype)
    o = lw.fresh(out)
    kb, kx = len(bshape), len(idx)
    if lead:
        nd = len(out.shape)
        perm = [*range(lead, lead + kx), *range(lead), *range(lead + kx, nd)]
        vperm = [*range(lead, lead + kb), *range(lead), *range(lead + kb, lead + kb + len(rest))]
        base = lw.view_of(base, lw.meta_tensor(base).permute(perm))
        vals = lw.view_of(vals, lw.meta_tensor(vals).permute(vperm))
        ov = lw.view_of(o, lw.meta_tensor(o).permute(perm))
    else:
        ov = o
    lw.steps.append(S.IndexPut(base=base, values=vals, indices=idx, out=ov, accumulate=accumulate))
    return o


@register_lowering(*INDEX_PADS, check=kernel_check())
def _index_pad(lw: Lowerer, node: Any) -> int:
    """Reflection / replication padding: per padded dim, an int64 index vector computed by an
    elementwise program over an arange, then index_select."""
    x = lw.value(node.args[0])
    pad = list(node.args[1])
    out = node.out
    reflect = "reflection" in node.op
    sizes = list(lw.values[x]["sizes"])
    rank = len(sizes)
    v = x
    for i in range(len(pad) // 2):
        d = rank - 1 - i
        lo, hi = pad[2 * i], pad[2 * i + 1]
        n = sizes[d]
        m = n + lo + hi
        if reflect and (lo >= n or hi >= n):
            raise LoweringError("reflection padding as large as the input")
        pos = lw.fresh(meta((m,), I64))
        lw.steps.append(S.Arange(y=pos, start=float(-lo), step=1.0))
        idx = lw.fresh(meta((m,), I64))
        prog = [S.load(0, 0)]
        if reflect:  # (n-1) - |(n-1) - |i||
            prog += [S.instr("abs", 1, [0]), S.const(2, float(n - 1)), S.instr("sub", 3, [2, 1], [1.0]),
                     S.instr("abs", 4, [3]), S.instr("sub", 5, [2, 4], [1.0])]  # fmt: skip
        else:  # clamp(i, 0, n-1)
            prog += [S.instr("clamp", 5, [0], [0.0, float(n - 1)])]
        prog.append(S.store(0, 5))
        lw.steps.append(S.Ew("i64", [pos], [idx], prog))
        sizes[d] = m
        last = i == len(pad) // 2 - 1
        nxt = lw.fresh(out) if last else lw.fresh(meta(sizes, out.dtype))
        lw.steps.append(S.IndexSelect(x=v, index=idx, out=nxt, dim=d))
        v = nxt
    return v


def _check_put(info: Any) -> str | None:
    base = info.inputs[0].dtype
    if info.op == "aten.put.default" and info.inputs[1].dtype != I64:
        return "int64 indices only"
    if info.inputs[-1].dtype != base or base not in DTYPES:
        return "source and self differ in dtype"
    return None


@register_lowering("aten.masked_scatter.default", check=more_check(float_input=False, extra=_check_put))
def _masked_scatter(lw: Lowerer, node: Any) -> int:
    a = node.args
    o = lw.fresh(node.out)
    shape = tuple(node.out.shape)
    base, mask = lw.broadcast(lw.value(a[0]), shape), lw.broadcast(lw.value(a[1]), shape)
    lw.steps.append(S.MaskedScatter(base=base, mask=mask, src=lw.flat(lw.value(a[2])), out=o))
    return o


@register_lowering("aten.put.default", check=more_check(float_input=False, extra=_check_put))
def _put(lw: Lowerer, node: Any) -> int:
    a, out = list(node.args), node.out
    accumulate = bool(a[3] if len(a) > 3 else node.kwargs.get("accumulate", False))
    o = lw.fresh(out)
    if list(lw.values[o]["strides"]) != contig(list(out.shape)):
        raise LoweringError("put into a non-contiguous result")
    idx, src = lw.flat(lw.value(a[1])), lw.flat(lw.value(a[2]))
    if lw.values[idx]["sizes"] != lw.values[src]["sizes"]:
        raise LoweringError("put: index and source differ in size")
    base = lw.flat(lw.value(a[0]))
    lw.steps.append(S.IndexPut(base=base, values=src, indices=[idx], out=lw.flat(o), accumulate=accumulate))
    return o


@register_lowering("aten.nonzero_static.default", check=more_check(float_input=False))
def _nonzero_static(lw: Lowerer, node: Any) -> int:
    o = lw.fresh(node.out)
    x = lw.value(node.args[0])
    lw.steps.append(S.NonzeroStatic(x=x, out=o, fill_value=int(node.kwargs.get("fill_value", -1))))
    return o


def _check_embedding_bag(info: Any) -> str | None:
    if info.inputs[1].dtype != I64 or info.inputs[2].dtype != I64 or len(info.inputs[1].shape) != 1:
        return "1-d int64 indices and offsets only"
    return None


@register_lowering("aten._embedding_bag_forward_only.default", check=more_check(extra=_check_embedding_bag))
def _embedding_bag(lw: Lowerer, node: Any) -> tuple[int, ...]:
    base = len(lw.plan.inputs)
    if any(
        n.op == GETITEM and n.args[0].slot == lw.node_slot and n.args[1] > 0 and lw.uses.get(base + k, 0) > 0
        for k, n in enumerate(lw.plan.nodes)
    ):
        # offset2bag, bag_size and max_indices are left as zeros: only the bags themselves are computed
        raise LoweringError("embedding_bag's auxiliary outputs are read")
    a, kw = list(node.args), dict(node.kwargs)

    def arg(i: int, name: str, default: Any) -> Any:
        return a[i] if len(a) > i else kw.get(name, default)

    w, idx, offs = lw.value(a[0]), lw.value(a[1]), lw.value(a[2])
    mode = int(arg(4, "mode", 0))
    psw = arg(6, "per_sample_weights", None)
    include_last = bool(arg(7, "include_last_offset", False))
    padding = int(arg(8, "padding_idx", -1))
    outs = [lw.fresh(m) for m in node.out]
    psv = lw.value(psw) if psw is not None else None
    lw.steps.append(S.EmbeddingBag(weight=w, indices=idx, offsets=offs, per_sample_weights=psv, out=outs[0], mode=mode,
                                   include_last_offset=include_last, padding_idx=padding))  # fmt: skip
    for v in outs[1:]:
        lw.fill_any(v, 0)
    return tuple(outs)


_SEGMENT_REDUCTIONS = {"sum": 0, "mean": 1, "max": 2, "min": 3, "prod": 4}


def _check_segment_reduce(info: Any) -> str | None:
    kw = info.kwargs
    if kw.get("indices") is not None or (kw.get("lengths") is None) == (kw.get("offsets") is None):
        return "segment_reduce by lengths or offsets only"
    if info.args[1] not in _SEGMENT_REDUCTIONS:
        return "segment_reduce reduction"
    return None


@register_lowering("aten.segment_reduce.default", check=more_check(extra=_check_segment_reduce))
def _segment_reduce(lw: Lowerer, node: Any) -> int:
    a, kw, out = list(node.args), dict(node.kwargs), node.out
    data = lw.value(a[0])
    axis = kw.get("axis", 0) % max(len(lw.values[data]["sizes"]), 1)
    offsets = kw.get("offsets") is not None
    bounds = lw.value(kw["offsets"] if offsets else kw["lengths"])
    dsz = list(lw.values[data]["sizes"])
    outer, n, inner = math.prod(dsz[:axis]), dsz[axis], math.prod(dsz[axis + 1 :])
    bsz = list(lw.values[bounds]["sizes"])
    o = lw.fresh(out)
    if list(lw.values[o]["strides"]) != contig(list(out.shape)):
        raise LoweringError("segment_reduce into a non-contiguous result")
    segs = bsz[-1] - int(offsets)

    def as_(v: int, shape: list[int]) -> int:
        f = lw.flat(v)
        return lw.view_of(f, lw.meta_tensor(f).view(shape))

    initial = kw.get("initial")
    if initial is not None and not math.isfinite(float(initial)):
        raise LoweringError("non-finite initial value")
    lw.steps.append(S.SegmentReduce(
        data=as_(data, [outer, n, inner]), bounds=as_(bounds, [outer, bsz[-1]]), out=as_(o, [outer, segs, inner]),
        reduction=_SEGMENT_REDUCTIONS[a[1]], offsets=offsets, has_initial=initial is not None,
        initial=float(initial) if initial is not None else 0.0,
    ))  # fmt: skip
    return o
