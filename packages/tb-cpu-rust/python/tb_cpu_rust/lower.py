"""``lower(plan)``: a torchburn ``Plan`` -> the executor spec. Kept as the stable import path;
the lowering itself lives in the ``tb_cpu_rust.lowering`` package."""

from __future__ import annotations

from tb_cpu_rust.lowering import Lowerer, LoweringError, lower

__all__ = ["Lowerer", "LoweringError", "lower"]
