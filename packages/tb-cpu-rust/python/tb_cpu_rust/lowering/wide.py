"""The storage-only dtypes (float64, float16, bfloat16, int8..int32).

Copies and fills that read or write them are one ``cast`` or ``fill`` step. Where it is cheap and
exact, native_cpu also computes in them: softmax and log-softmax of float64 values
(``softmax(x, dtype=torch.float64)``), single float64 elementwise ops (arithmetic, pow, ceil /
floor, comparisons, where: logspace and quantile compute their indices so), exact integer sum /
amax / amin of integer values, and ``gather`` with an empty index of any integer dtype (nothing
to read). Every other node with such operands keeps its own family's rules.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from tb_cpu_rust.lowering import steps as S
from tb_cpu_rust.lowering.dtypes import WIDE_DTYPES
from tb_cpu_rust.lowering.elementwise import WIDE_COPIES, WIDE_FILLS
from tb_cpu_rust.lowering.lowerer import Lowerer
from tb_cpu_rust.lowering.registry import DtypeFamily, LoweringError, register_dtype_family, register_lowering
from torchburn.plan import Ref, TensorMeta

F64, I64 = torch.float64, torch.int64
_INTS = frozenset({torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8})
_SOFTMAX = {"aten._softmax.default": S.Softmax64, "aten._log_softmax.default": S.LogSoftmax64}
_IRED = {"aten.sum.dim_IntList": 0, "aten.sum.default": 0, "aten.amax.default": 1, "aten.amin.default": 2}
_GATHER = "aten.gather.default"
_COMPARISONS = ("lt", "le", "gt", "ge", "eq", "ne")
#: single float64 elementwise ops (the ``ew64`` kernel): op -> its code
_EW64: dict[str, int] = {
    "aten.neg.default": 5, "aten.ceil.default": 6, "aten.floor.default": 7, "aten.where.self": 14,
    "aten.round.default": 15,
    **{f"aten.{name}.{ov}": i for i, name in enumerate(("add", "sub", "mul", "div")) for ov in ("Tensor", "Scalar")},
    **{f"aten.pow.{ov}": 4 for ov in ("Tensor_Tensor", "Tensor_Scalar", "Scalar")},
    **{f"aten.{name}.{ov}": 8 + i for i, name in enumerate(_COMPARISONS) for ov in ("Tensor", "Scalar")},
}  # fmt: skip
_CARRIED = _INTS | {F64, torch.float32, torch.bool}


def _out(out: Any) -> Any:
    return out[0] if isinstance(out, tuple) else out


def _which(op: str, in_dtypes: list[torch.dtype], out: Any, index_numel: int | None) -> str | None:
    """The kernel this module lowers the node to, or None when it is not this module's."""
    o = _out(out)
    if not isinstance(o, TensorMeta) or not in_dtypes:
        return None
    if op in _SOFTMAX and in_dtypes[0] == F64 and o.dtype == F64:
        return _SOFTMAX[op].OP
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
    numel = math.prod(ins[1].shape) if info.op == _GATHER and len(ins) > 1 else None
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


def claims_node(lw: Lowerer, node: Any) -> bool:
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
        if v is None:
            return False
        numel = math.prod(lw.values[v]["sizes"] if isinstance(v, int) else list(v.meta.shape))
    return _which(node.op, dts, node.out, numel) is not None


def lower_wide_math(lw: Lowerer, node: Any) -> Any:
    op, a, kw, out = node.op, list(node.args), dict(node.kwargs), _out(node.out)
    if op == _GATHER:
        lw.value(a[0])
        lw.value(a[2])
        return lw.fresh(out)  # an empty index gathers nothing: the result is empty too
    if op in _EW64:
        o = lw.fresh(out)
        shape = tuple(out.shape)
        ins, kinds, scalars = [], [], []
        for arg in a:
            if isinstance(arg, Ref):
                ins.append(lw.broadcast(lw.value(arg), shape))
                kinds.append(0)
            else:
                scalars.append(float(arg))
                kinds.append(1)
        lw.steps.append(S.Ew64(ins=ins, out=o, code=_EW64[op], kinds=tuple(kinds), scalars=tuple(scalars)))
        return o
    x = lw.value(a[0])
    o = lw.fresh(out)
    if op in _SOFTMAX:
        lw.steps.append(_SOFTMAX[op](x=x, y=o, dim=int(a[1])))
        return o
    rank = len(lw.values[x]["sizes"])
    dims = None if op == "aten.sum.default" else (a[1] if len(a) > 1 else kw.get("dim"))
    keep = bool(a[2] if len(a) > 2 else kw.get("keepdim", False))
    if isinstance(dims, int):
        dims = [dims]
    red = set(range(rank)) if not dims else {d % max(rank, 1) for d in dims}
    kv = lw.reduced_view(o, [1 if d in red else 0 for d in range(rank)], keep)
    lw.steps.append(S.IntReduce(x=x, y=kv, kind=_IRED[op]))
    return o


register_dtype_family(DtypeFamily("wide", claims, check, claims_node, lower_wide_math))


def touches_wide(lw: Lowerer, node: Any) -> bool:
    metas = [node.out] if isinstance(node.out, TensorMeta) else []
    dts = [lw.dtype_of_arg(a) for a in node.args if isinstance(a, Ref)] + [m.dtype for m in metas]
    return any(d in WIDE_DTYPES for d in dts)


@register_lowering(*WIDE_COPIES, *WIDE_FILLS, when=touches_wide)
def lower_wide(lw: Lowerer, node: Any) -> int:
    """A copy or fill that reads or writes float64, float16, int32, ...: one ``cast`` or ``fill`` step."""
    op, a = node.op, list(node.args)
    o = lw.fresh(node.out)
    if op in WIDE_COPIES:
        src = a[1] if op == "aten.copy.default" else a[0]
        lw.copy_into(lw.broadcast(lw.value(src), tuple(node.out.shape)), o)
        return o
    if op in ("aten.full.default", "aten.full_like.default", "aten.fill.Scalar"):
        value = a[1]
    elif op == "aten.scalar_tensor.default":
        value = a[0]
    elif op == "aten.ones_like.default":
        value = 1
    else:
        value = 0  # zeros_like, and empty memory is zero-filled: never leak stale values
    if isinstance(value, Ref):
        raise LoweringError("fill with a tensor value")
    lw.fill_any(o, value)
    return o
