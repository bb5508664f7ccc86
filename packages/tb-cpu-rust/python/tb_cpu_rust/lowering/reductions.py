"""Reductions (sum, mean, amax, var, logsumexp, any, ...) as one ``reduce`` step per result."""

from __future__ import annotations

from typing import Any

from tb_cpu_rust.lowering import steps as S
from tb_cpu_rust.lowering.dtypes import BOOL, F32, I64, core_dtype_reason
from tb_cpu_rust.lowering.lowerer import Lowerer
from tb_cpu_rust.lowering.registry import LoweringError, register_lowering
from torchburn.plan import TensorMeta

#: op -> the ``reduce`` step's kind (see steps.Reduce)
REDUCTIONS: dict[str, int] = {
    "aten.sum.dim_IntList": 0, "aten.sum.default": 0, "aten.mean.dim": 1, "aten.mean.default": 1, "aten.amax.default": 2,
    "aten.amin.default": 3, "aten.argmax.default": 4, "aten.argmin.default": 5, "aten.var.correction": 6,
    "aten.prod.dim_int": 7, "aten.prod.default": 7, "aten.logsumexp.default": 8, "aten.max.dim": 2, "aten.min.dim": 3,
    "aten.var.dim": 6, "aten.std.correction": 6, "aten.var_mean.correction": 6, "aten.max.default": 2,
    "aten.min.default": 3, "aten.any.default": 9, "aten.any.dim": 9, "aten.any.dims": 9,
}  # fmt: skip
#: reductions that may read int64 (compared with zero, which is exact)
INT_INPUT_REDUCTIONS = frozenset({"aten.any.default", "aten.any.dim", "aten.any.dims"})


def check_reduction(info: Any) -> str | None:
    reason = core_dtype_reason(info)
    if reason is not None or not info.inputs:
        return reason
    x = info.inputs[0]
    if x.dtype == BOOL and x.numel >= 1 << 24:
        return "bool reduction over 2**24 elements or more"  # counted in float32
    if x.dtype == I64 and info.op not in INT_INPUT_REDUCTIONS:
        return "float32 or bool input only"
    return None


@register_lowering(*REDUCTIONS, check=check_reduction)
def lower_reduction(lw: Lowerer, node: Any) -> Any:
    op, args, kw = node.op, list(node.args), dict(node.kwargs)
    x = lw.value(args[0])
    xs = lw.values[x]["sizes"]
    rank = len(xs)
    kind = REDUCTIONS[op]
    corr = 0.0
    keep = False
    if lw.dtype_of(x) == BOOL:
        x = lw.convert(x, F32)
    elif lw.dtype_of(x) == I64:
        if kind != 9:
            raise LoweringError("integer input of a float reduction")
        x = lw.convert(x, F32, nonzero=True)
    if op in (
        "aten.sum.default",
        "aten.mean.default",
        "aten.prod.default",
        "aten.any.default",
        "aten.max.default",
        "aten.min.default",
    ):
        dims: Any = None
    elif op in ("aten.argmax.default", "aten.argmin.default"):
        dims = args[1] if len(args) > 1 else kw.get("dim")
        keep = bool(args[2] if len(args) > 2 else kw.get("keepdim", False))
        dims = None if dims is None else [dims]
    elif op in ("aten.max.dim", "aten.min.dim", "aten.prod.dim_int"):
        dims = [args[1]]
        keep = bool(args[2] if len(args) > 2 else kw.get("keepdim", False))
    elif op in ("aten.var.correction", "aten.std.correction", "aten.var.dim", "aten.var_mean.correction"):
        dims = args[1] if len(args) > 1 else kw.get("dim")
        if op == "aten.var.dim":
            unbiased = args[2] if len(args) > 2 else kw.get("unbiased", True)
            corr = 1.0 if unbiased else 0.0
            keep = bool(args[3] if len(args) > 3 else kw.get("keepdim", False))
        else:
            c = kw.get("correction", args[2] if len(args) > 2 else None)
            corr = 1.0 if c is None else float(c)
            keep = bool(kw.get("keepdim", args[3] if len(args) > 3 else False))
        if op == "aten.std.correction":
            raise LoweringError("std")
    else:
        dims = args[1] if len(args) > 1 else kw.get("dim")
        keep = bool(args[2] if len(args) > 2 else kw.get("keepdim", False))
    if op in ("aten.sum.dim_IntList", "aten.mean.dim", "aten.sum.default", "aten.mean.default"):
        dt = kw.get("dtype")
        if dt is not None and dt != F32:
            raise LoweringError("reduction dtype")
    if isinstance(dims, int):
        dims = [dims]
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        red = list(range(rank))
    else:
        red = sorted({d % max(rank, 1) for d in dims}) if rank else []
    mask = [1 if d in red else 0 for d in range(rank)]
    outs = node.out if isinstance(node.out, tuple) else (node.out,)
    results = []
    kinds = [kind] if op not in ("aten.max.dim", "aten.min.dim") else [kind, kind + 2]
    if op == "aten.var_mean.correction":
        kinds = [6, 1]
    for k, meta in zip(kinds, outs):
        final = None
        if k not in (4, 5, 9) and meta.dtype != F32:
            # e.g. the int64 sum of a bool tensor: reduce in float32, then convert (exact below 2**24)
            final = meta
            meta = TensorMeta(meta.shape, meta.stride, F32, meta.device)
        v = lw.fresh(meta)
        kv = lw.reduced_view(v, mask, keep)
        lw.steps.append(S.Reduce(x=x, y=kv, kind=k, mask=tuple(mask), correction=corr))
        results.append(v if final is None else lw.convert(v, final.dtype))
    return results[0] if len(results) == 1 else tuple(results)
