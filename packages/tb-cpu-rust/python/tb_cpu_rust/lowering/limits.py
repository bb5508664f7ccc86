"""Limits the executor enforces, read from the native module so that Python never keeps a copy."""

from __future__ import annotations

from tb_cpu_rust import _native

#: how many unary ops and residual adds one GEMM's epilogue holds (``kernels::gemm::MAX_EPI``)
MAX_EPILOGUE: int = _native.MAX_EPILOGUE
