"""Check builders the families share: the dtype gate every kernel passes, then its own conditions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tb_cpu_rust.lowering.dtypes import BOOL, DTYPES, F32, I32, WIDE_DTYPES, core_dtype_reason, float_only_reason
from tb_cpu_rust.lowering.registry import Check

Extra = Callable[[Any], "str | None"]


def kernel_check(
    *, float_only: bool = False, wide: bool = False, int32_index: bool = False, extra: Extra | None = None
) -> Check:
    """The check of a kernel op: core dtypes (plus the storage-only ones where ``wide``: such a
    node is then taken as is), float32 data where ``float_only``, then ``extra``."""

    def check(info: Any) -> str | None:
        reason = core_dtype_reason(info, wide=wide, int32_index=int32_index)
        if reason is not None:
            return reason
        if wide and any(m.dtype in WIDE_DTYPES for m in [*info.inputs, *info.out_metas]):
            return None
        if float_only and (reason := float_only_reason(info)) is not None:
            return reason
        return extra(info) if extra is not None else None

    return check


def more_check(*, float_input: bool = True, extra: Extra | None = None) -> Check:
    """Kernels that take core dtypes and int32 (indices, results with ``out_int32``): with
    ``float_input``, the first input is float32 and no input is bool."""

    def check(info: Any) -> str | None:
        for m in [*info.inputs, *info.out_metas]:
            if m.dtype not in DTYPES and m.dtype != I32:
                return f"dtype {m.dtype} (native_cpu takes float32, int64, bool)"
        if float_input:
            if info.inputs[0].dtype != F32 or any(m.dtype == BOOL for m in info.inputs):
                return "float32 input only"
            int32_out = any(m.dtype == I32 for m in info.out_metas)
            if info.op != "aten.frexp.Tensor" and int32_out and not info.kwargs.get("out_int32"):
                return "int32 result"
        return extra(info) if extra is not None else None

    return check


def rank_in(*ranks: int, reason: str) -> Extra:
    """``extra``: the first input's rank is one of ``ranks``."""

    def extra(info: Any) -> str | None:
        return None if len(info.inputs[0].shape) in ranks else reason

    return extra


def all_float32(info: Any) -> str | None:
    return "float32 only" if any(m.dtype != F32 for m in [*info.inputs, *info.out_metas]) else None


def layout_is_strided(info: Any) -> bool:
    return info.kwargs.get("layout", torch.strided) in (None, torch.strided)
