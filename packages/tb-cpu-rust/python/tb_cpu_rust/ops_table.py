"""What native_cpu accepts, read from the lowering registry (``tb_cpu_rust.lowering``): the
supported op set and the per-node checker. Kept as the stable import path for the engine."""

from __future__ import annotations

from tb_cpu_rust.lowering import check, supported_ops

SUPPORTED = supported_ops()

__all__ = ["SUPPORTED", "check"]
