"""Compute in the wide dtypes where it is cheap and exact (src/wide_math.rs): softmax and
log-softmax of float64 values (``softmax(x, dtype=torch.float64)``), single float64 elementwise
ops (arithmetic, pow, ceil / floor, comparisons, where: logspace and quantile compute their
indices so), exact integer sum / amax / amin of integer values, and ``gather`` with an empty index
of any integer dtype (nothing to read).
Every other node with such operands keeps the main table's rules (ops_table.check)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torchburn.plan import Ref, TensorMeta

F64, I64 = torch.float64, torch.int64
_INTS = frozenset({torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8})
_SOFTMAX = {"aten._softmax.default": "softmax64", "aten._log_softmax.default": "log_softmax64"}
_IRED = {"aten.sum.dim_IntList": 0, "aten.sum.default": 0, "aten.amax.default": 1, "aten.amin.default": 2}
_GATHER = "aten.gather.default"
#: single float64 elementwise ops (the ``ew64`` kernel): op -> its code
_EW64: dict[str, int] = {"aten.neg.default": 5, "aten.ceil.default": 6, "aten.floor.default": 7, "aten.where.self": 14, "aten.round.default": 15}
for _i, _name in enumerate(["add", "sub", "mul", "div"]):
    _EW64[f"aten.{_name}.Tensor"] = _EW64[f"aten.{_name}.Scalar"] = _i
for _ov in ("Tensor_Tensor", "Tensor_Scalar", "Scalar"):
    _EW64[f"aten.pow.{_ov}"] = 4
for _i, _name in enumerate(["lt", "le", "gt", "ge", "eq", "ne"]):
    _EW64[f"aten.{_name}.Tensor"] = _EW64[f"aten.{_name}.Scalar"] = 8 + _i
_CARRIED = _INTS | {F64, torch.float32, torch.bool}


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
    if op in _EW64 and all(d in _CARRIED for d in in_dtypes):
        cmp = 8 <= _EW64[op] <= 13
        if (o.dtype == F64 and not cmp) or (cmp and o.dtype == torch.bool and F64 in in_dtypes):
            return "ew64"
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
    if info.op in _EW64:
        if info.kwargs.get("alpha", 1) != 1:
            return "alpha"
        scalars = [a for a in info.args if isinstance(a, (bool, int, float))]
        if any(not math.isfinite(a) for a in scalars):
            return "a non-finite scalar"
        return None
    if info.op in _SOFTMAX and len(info.args) > 2 and info.args[2]:
        return "half_to_float"
    if info.op == "aten.sum.dim_IntList" and info.kwargs.get("dtype") not in (None, I64):
        return "sum dtype"
    return None


def claims_node(lw: Any, node: Any) -> bool:
    if node.op not in _SOFTMAX and node.op not in _IRED and node.op != _GATHER and node.op not in _EW64:
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
    if op in _EW64:
        o = lw.fresh(out)
        shape = tuple(out.shape)
        ins, kinds, floats = [], [], []
        for arg in a:
            if isinstance(arg, Ref):
                ins.append(lw.broadcast(lw.value(arg), shape))
                kinds.append(0)
            else:
                floats.append(float(arg))
                kinds.append(1)
        lw.steps.append({"op": "ew64", "ins": ins, "outs": [o], "ints": [_EW64[op], *kinds], "floats": floats})
        return o
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
