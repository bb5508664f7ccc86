"""Views (resolved on meta tensors at compile time: no step at all), their copying and scattering
forms, and the ops that only move data: cat / stack, constant padding, repeat, flip, arange,
resize and as_strided."""

from __future__ import annotations

import math
from typing import Any

import torch

from tb_cpu_rust.lowering import steps as S
from tb_cpu_rust.lowering.checks import kernel_check, more_check
from tb_cpu_rust.lowering.dtypes import CPLX_DTYPES, DTYPES, F32, I64, WIDE_DTYPES
from tb_cpu_rust.lowering.lowerer import Lowerer, contig, meta
from tb_cpu_rust.lowering.registry import LoweringError, register_lowering
from torchburn.plan import Ref

VIEWS = frozenset({
    "aten.view.default", "aten._unsafe_view.default", "aten.reshape.default", "aten.permute.default",
    "aten.expand.default", "aten.slice.Tensor", "aten.select.int", "aten.unsqueeze.default",
    "aten.squeeze.dim", "aten.squeeze.dims", "aten.squeeze.default", "aten.t.default", "aten.transpose.int",
    "aten.alias.default", "aten.diagonal.default", "aten.split.Tensor", "aten.split_with_sizes.default",
    "aten.unbind.int", "aten.detach.default", "aten.unfold.default", "aten.narrow.default",
})  # fmt: skip
#: view-and-copy ops: the view is resolved at compile time, the copy is one elementwise step
COPY_VIEWS: dict[str, str] = {
    "aten.view_copy.default": "aten.view.default", "aten.permute_copy.default": "aten.permute.default",
    "aten.narrow_copy.default": "aten.narrow.default", "aten.unbind_copy.int": "aten.unbind.int",
    "aten.expand_copy.default": "aten.expand.default", "aten.t_copy.default": "aten.t.default",
    "aten.transpose_copy.int": "aten.transpose.int", "aten.unsqueeze_copy.default": "aten.unsqueeze.default",
    "aten.squeeze_copy.dim": "aten.squeeze.dim", "aten.squeeze_copy.dims": "aten.squeeze.dims",
    "aten.diagonal_copy.default": "aten.diagonal.default", "aten.select_copy.int": "aten.select.int",
    "aten.slice_copy.Tensor": "aten.slice.Tensor", "aten.alias_copy.default": "aten.alias.default",
}  # fmt: skip
#: scatter-into-a-view ops: out = copy of self with src written into one view of it
SCATTER_VIEWS: dict[str, str] = {
    "aten.slice_scatter.default": "aten.slice.Tensor", "aten.select_scatter.default": "aten.select.int",
    "aten.diagonal_scatter.default": "aten.diagonal.default",
}  # fmt: skip
_VIEWABLE = DTYPES | WIDE_DTYPES | CPLX_DTYPES


def _check_view(info: Any) -> str | None:
    for m in [*info.inputs, *info.out_metas]:
        if m.dtype not in _VIEWABLE:
            return f"dtype {m.dtype}"
    return None


def _overload(name: str) -> Any:
    _, packet, overload = name.split(".")
    return getattr(getattr(torch.ops.aten, packet), overload)


def _no_tensor_args(args: list[Any]) -> None:
    if any(isinstance(a, Ref) for a in args):
        raise LoweringError("view with tensor arguments")


@register_lowering(*VIEWS, check=_check_view, any_dtype=True)
def _view(lw: Lowerer, node: Any) -> Any:
    args = list(node.args)
    v = lw.value(args[0])
    _no_tensor_args(args[1:])
    result = node.target(lw.meta_tensor(v), *args[1:], **node.kwargs)
    if isinstance(result, (tuple, list)):
        return tuple(lw.view_of(v, r) for r in result)
    return lw.view_of(v, result)


@register_lowering(*COPY_VIEWS, check=kernel_check())
def _copy_view(lw: Lowerer, node: Any) -> Any:
    args = list(node.args)
    v = lw.value(args[0])
    _no_tensor_args(args[1:])
    result = _overload(COPY_VIEWS[node.op])(lw.meta_tensor(v), *args[1:], **node.kwargs)
    views = result if isinstance(result, (tuple, list)) else (result,)
    metas = node.out if isinstance(node.out, tuple) else (node.out,)
    outs = []
    for t, m in zip(views, metas):
        o = lw.fresh(m)
        lw.copy_into(lw.view_of(v, t), o)
        outs.append(o)
    return tuple(outs) if isinstance(result, (tuple, list)) else outs[0]


@register_lowering(*SCATTER_VIEWS, check=kernel_check())
def _scatter_view(lw: Lowerer, node: Any) -> int:
    args = list(node.args)
    base, src = lw.value(args[0]), lw.value(args[1])
    _no_tensor_args(args[2:])
    o = lw.fresh(node.out)
    lw.copy_into(base, o)
    part = _overload(SCATTER_VIEWS[node.op])(lw.meta_tensor(o), *args[2:], **node.kwargs)
    lw.copy_into(src, lw.view_of(o, part))
    return o


@register_lowering("aten.cat.default", "aten.stack.default", check=kernel_check())
def _cat(lw: Lowerer, node: Any) -> int:
    op, a, out = node.op, list(node.args), node.out
    tensors = [lw.value(t) for t in a[0]]
    dim = a[1] if len(a) > 1 else node.kwargs.get("dim", 0)
    o = lw.fresh(out)
    rank = len(out.shape)
    dim = dim % rank
    full = lw.meta_tensor(o)
    pos = 0
    for tv in tensors:
        sizes = lw.values[tv]["sizes"]
        if op == "aten.cat.default" and sizes == [0] and rank > 1:
            continue  # legacy empty inputs of cat
        n = 1 if op == "aten.stack.default" else sizes[dim]
        part = full.narrow(dim, pos, n)
        pos += n
        pv = lw.view_of(o, part)
        src = tv if op == "aten.cat.default" else lw.view_of(tv, lw.meta_tensor(tv).unsqueeze(dim))
        compute = "f32" if lw.dtype_of(o) == F32 else "i64"
        if compute == "i64" and lw.dtype_of(src) == F32:
            raise LoweringError("cat of float into an integer result")
        lw.steps.append(S.Ew(compute, [src], [pv], S.copy_program()))
    return o


@register_lowering("aten.constant_pad_nd.default", check=kernel_check())
def _constant_pad(lw: Lowerer, node: Any) -> int:
    a = list(node.args)
    x = lw.value(a[0])
    pad = list(a[1])
    value = a[2] if len(a) > 2 else node.kwargs.get("value", 0)
    o = lw.fresh(node.out)
    if isinstance(value, float) and math.isnan(value):
        raise LoweringError("NaN padding value")
    lw.fill(o, value)
    windows = lw.pad_windows(x, o, pad)
    if windows is not None:
        lw.copy_into(lw.view_of(x, windows[0]), lw.view_of(o, windows[1]))
    return o


@register_lowering("aten.repeat.default", check=kernel_check())
def _repeat(lw: Lowerer, node: Any) -> int:
    x = lw.value(node.args[0])
    reps = list(node.args[1])
    xs, xst = lw.values[x]["sizes"], lw.values[x]["strides"]
    pad = len(reps) - len(xs)
    xs, xst = [1] * pad + list(xs), [0] * pad + list(xst)
    o = lw.fresh(node.out)
    ov = lw.values[o]
    sizes, ostr, istr = [], [], []
    for r, n, st, os_ in zip(reps, xs, xst, ov["strides"]):
        sizes += [r, n]
        ostr += [n * os_, os_]
        istr += [0, st]
    src = lw.new_value(lw.values[x]["buf"], lw.values[x]["offset"], sizes, istr)
    dst = lw.new_value(ov["buf"], ov["offset"], sizes, ostr)
    lw.copy_into(src, dst)
    return o


@register_lowering("aten.flip.default", check=kernel_check())
def _flip(lw: Lowerer, node: Any) -> int:
    v = lw.value(node.args[0])
    sizes = lw.values[v]["sizes"]
    dims = sorted({d % len(sizes) for d in node.args[1]} if sizes else set())
    dims = [d for d in dims if sizes[d] > 1]
    o = lw.fresh(node.out)
    if not dims:
        lw.copy_into(v, o)
    for j, d in enumerate(dims):
        # no negative strides in a view: gather through a reversed arange instead
        n = sizes[d]
        rev = lw.fresh(meta((n,), I64))
        lw.steps.append(S.Arange(y=rev, start=float(n - 1), step=-1.0))
        nxt = o if j == len(dims) - 1 else lw.fresh(meta(sizes, node.out.dtype))
        lw.steps.append(S.IndexSelect(x=v, index=rev, out=nxt, dim=d))
        v = nxt
    return o


@register_lowering("aten.arange.start_step", "aten.arange.default", "aten.arange.start", check=kernel_check(wide=True))
def _arange(lw: Lowerer, node: Any) -> int:
    op, a = node.op, list(node.args)
    if op == "aten.arange.default":
        start, step = 0, 1
    elif op == "aten.arange.start":
        start, step = a[0], 1
    else:
        start, step = a[0], (a[2] if len(a) > 2 else 1)
    o = lw.fresh(node.out)
    lw.steps.append(S.Arange(y=o, start=float(start), step=float(step)))
    return o


def _check_resize(info: Any) -> str | None:
    # growing exposes uninitialised memory; another memory format restrides the data
    if info.kwargs.get("memory_format") not in (None, torch.contiguous_format):
        return "resize to a non-contiguous memory format"
    if math.prod(info.out_metas[0].shape) > math.prod(info.inputs[0].shape):
        return "resize that grows the tensor"
    return None


@register_lowering("aten.resize.default", check=more_check(float_input=False, extra=_check_resize))
def _resize(lw: Lowerer, node: Any) -> int:
    """Functional resize of a contiguous value to at most its size: the leading elements, read in
    storage order, under the new shape."""
    x = lw.value(node.args[0])
    val = lw.values[x]
    if list(val["strides"]) != contig(list(val["sizes"])):
        raise LoweringError("resize of a non-contiguous value")
    shape = list(node.out.shape)
    o = lw.fresh(node.out)
    if math.prod(shape):
        lw.copy_into(lw.new_value(val["buf"], val["offset"], shape, contig(shape)), o)
    return o


def _core_inputs(info: Any) -> str | None:
    return "dtype" if any(m.dtype not in DTYPES for m in info.inputs) else None


@register_lowering(
    "aten.as_strided_copy.default", "aten.as_strided_scatter.default",
    check=more_check(float_input=False, extra=_core_inputs),
)  # fmt: skip
def _as_strided(lw: Lowerer, node: Any) -> int:
    a, kw = list(node.args), dict(node.kwargs)
    scatter = node.op == "aten.as_strided_scatter.default"
    rest = a[2:] if scatter else a[1:]
    size, stride = rest[0], rest[1]
    offset = rest[2] if len(rest) > 2 else kw.get("storage_offset")
    if offset is not None:
        # the offset counts from the start of eager's storage, which a plan does not see
        raise LoweringError("as_strided with an explicit storage offset")
    x = lw.value(a[0])
    o = lw.fresh(node.out)
    if scatter:
        lw.copy_into(x, o)
        lw.copy_into(lw.value(a[1]), lw.view_of(o, lw.meta_tensor(o).as_strided(size, stride)))
    else:
        lw.copy_into(lw.view_of(x, lw.meta_tensor(x).as_strided(size, stride)), o)
    return o
