"""Compute in the wide dtypes where it is cheap and exact (src/wide_math.rs): softmax and
log-softmax of float64 values (``softmax(x, dtype=torch.float64)``), exact integer sum / amax /
amin of integer values, and ``gather`` with an empty index of any integer dtype (nothing to read).
Every other node with such operands keeps the main table's rules (ops_table.check)."""

from __future__ import annotations

from typing import Any

import torch
from torchburn.plan import Ref, TensorMeta

F64, I64 = torch.float64, torch.int64
_INTS = frozenset({torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8})
_SOFTMAX = {"aten._softmax.default": "softmax64", "aten._log_softmax.default": "log_softmax64"}
_IRED = {"aten.sum.dim_IntList": 0, "aten.sum.default": 0, "aten.amax.default": 1, "aten.amin.default": 2}
_GATHER = "aten.gather.default"


def _out(out: Any) -> Any:
    return out[0] if isinstance(out, tuple) else out


def _which(op: str, in_dtypes: list[torch.dtype], out: Any, index_numel: int | None) -> str | None:
    """The kernel this module lowers the node to, or None when it is not this module's."""
    o = _out(out)
    if not isinstance(o, TensorMeta) or not in_dtypes:
        return None
    if op in _SOFTMAX and in_dtypes[0] == F64 and o.dtype == F64:
        return _SOFTMAX[op]
    if op in _IRED and in_dtypes[0] in _INTS and o.dtype == I64:
        return "ireduce"
    if op == _GATHER and index_numel == 0 and in_dtypes[1] in _INTS and o.dtype in (torch.float32, I64, torch.bool):
        return "empty"
    return None


def claims(info: Any) -> bool:
    ins = info.inputs
    numel = None
    if info.op == _GATHER and len(ins) > 1:
        numel = 1
        for s in ins[1].shape:
            numel *= s
    return _which(info.op, [m.dtype for m in ins], info.out, numel) is not None


def check(info: Any) -> str | None:
    if info.op in _SOFTMAX and len(info.args) > 2 and info.args[2]:
        return "half_to_float"
    if info.op == "aten.sum.dim_IntList" and info.kwargs.get("dtype") not in (None, I64):
        return "sum dtype"
    return None


def claims_node(lw: Any, node: Any) -> bool:
    if node.op not in _SOFTMAX and node.op not in _IRED and node.op != _GATHER:
        return False
    refs = [a for a in node.args if isinstance(a, Ref)]
    if not refs:
        return False
    dts = [lw.dtype_of_arg(a) for a in refs]
    numel = None
    if node.op == _GATHER:
        if len(refs) < 2:
            return False
        v = lw.slot.get(refs[1].slot)
        shape = lw.values[v]["sizes"] if isinstance(v, int) else list(v.meta.shape)
        numel = 1
        for s in shape:
            numel *= s
    return _which(node.op, dts, node.out, numel) is not None


def lower(lw: Any, node: Any) -> Any:
    op, a, kw, out = node.op, list(node.args), dict(node.kwargs), _out(node.out)
    if op == _GATHER:
        lw.value(a[0])
        lw.value(a[2])
        return lw.fresh(out)  # an empty index gathers nothing: the result is empty too
    x = lw.value(a[0])
    o = lw.fresh(out)
    if op in _SOFTMAX:
        lw.steps.append({"op": _SOFTMAX[op], "ins": [x], "outs": [o], "ints": [int(a[1])]})
        return o
    rank = len(lw.values[x]["sizes"])
    dims = None if op == "aten.sum.default" else (a[1] if len(a) > 1 else kw.get("dim"))
    keep = bool(a[2] if len(a) > 2 else kw.get("keepdim", False))
    if isinstance(dims, int):
        dims = [dims]
    red = set(range(rank)) if not dims else {d % max(rank, 1) for d in dims}
    val = lw.values[o]
    sizes, strides, j = [], [], 0
    for d in range(rank):
        if d in red:
            sizes.append(1)
            strides.append(0)
            j += 1 if keep else 0
        else:
            sizes.append(val["sizes"][j])
            strides.append(val["strides"][j])
            j += 1
    kv = lw.new_value(val["buf"], val["offset"], sizes, strides)
    lw.steps.append({"op": "ireduce", "ins": [x], "outs": [kv], "ints": [_IRED[op]]})
    return o
