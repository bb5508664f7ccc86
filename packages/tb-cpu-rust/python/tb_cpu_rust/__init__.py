"""tb-cpu-rust: TorchBurn's ``native_cpu`` engine.

Rust kernels (GEMM, fused elementwise sweeps, reductions, norms, attention, convolution,
pooling, losses) behind a prepared-graph executor: a partition is lowered once to a plan of
buffers, strided views and steps, and each call is one FFI crossing with the GIL released.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["NativeCpuEngine", "__version__"]


def __getattr__(name: str) -> object:
    if name == "NativeCpuEngine":
        from tb_cpu_rust.engine import NativeCpuEngine

        return NativeCpuEngine
    raise AttributeError(name)
