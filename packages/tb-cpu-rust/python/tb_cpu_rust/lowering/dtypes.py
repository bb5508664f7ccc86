"""The dtypes native_cpu carries, their names on the wire, and the dtype gate most ops share."""

from __future__ import annotations

from typing import Any

import torch

F32, I64, BOOL, I32 = torch.float32, torch.int64, torch.bool, torch.int32
#: the dtypes every elementwise program and most kernels compute in
DTYPES = frozenset({F32, I64, BOOL})
#: storage-only dtypes: only copies, fills, arange and the kernels that say so read or write them
WIDE_DTYPES = frozenset({torch.float64, torch.float16, torch.bfloat16, I32, torch.int16, torch.int8, torch.uint8})
NARROW_INTS = frozenset({I32, torch.int16, torch.int8, torch.uint8})
CPLX_DTYPES = frozenset({torch.complex64, torch.complex128, torch.complex32})

DT_NAME = {
    F32: "float32", I64: "int64", BOOL: "bool", torch.float64: "float64", torch.float16: "float16",
    torch.bfloat16: "bfloat16", I32: "int32", torch.int16: "int16", torch.int8: "int8", torch.uint8: "uint8",
    torch.complex64: "complex64", torch.complex128: "complex128", torch.complex32: "complex32",
}  # fmt: skip
DT_OF_NAME = {v: k for k, v in DT_NAME.items()}

WIDE_NOTE = "float64, float16, bfloat16 and int8..int32 in copies, fills and arange only"


def metas_of(info: Any) -> list[Any]:
    return [*info.inputs, *info.out_metas]


def core_dtype_reason(
    info: Any, *, wide: bool = False, int32_index: bool = False, narrow_compare: bool = False
) -> str | None:
    """The reason a node's dtypes are refused, or None: float32 / int64 / bool everywhere, plus the
    storage-only dtypes where ``wide``, int32 indices where ``int32_index`` (when the data and
    results are core dtypes) and narrow integers read by a comparison (``narrow_compare``)."""
    int32_ok = int32_index and info.inputs[0].dtype in DTYPES and all(m.dtype in DTYPES for m in info.out_metas)
    for m in metas_of(info):
        if (m.dtype == I32 and int32_ok) or (narrow_compare and m.dtype in NARROW_INTS):
            continue
        if m.dtype not in DTYPES and not (wide and m.dtype in WIDE_DTYPES):
            return f"dtype {m.dtype} (native_cpu takes float32, int64, bool; {WIDE_NOTE})"
    return None


def float_only_reason(info: Any) -> str | None:
    """Kernels that compute in float32: their first input, and every result but int64 indices."""
    if any(m.dtype != F32 for m in info.inputs[:1]):
        return "float32 input only"
    if any(m.dtype != F32 for m in info.out_metas if m.dtype != I64):
        return "float32 only"
    return None
