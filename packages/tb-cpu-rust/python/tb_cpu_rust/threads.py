"""Puts the kernels' parallel loops on PyTorch's own OpenMP team.

PyTorch's eager ops run on libgomp threads that spin for a while after each parallel region. A
second pool with a thread per core (rayon) then shares the cores with those spinning threads
whenever native calls and eager ops alternate (a training step, a graph with fallback nodes),
and pays a wake-up of its sleeping workers otherwise. Given the path of the libgomp that torch
mapped, the Rust loops run on the same team as eager ops instead (``src/core/par.rs``).
"""

from __future__ import annotations

import contextlib
import os

from tb_cpu_rust import _native

_done = False


def _mapped_libgomp() -> str | None:
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.rsplit(None, 1)[-1] if line.count(" ") >= 5 else ""
                name = os.path.basename(path)
                if name.startswith("libgomp") and ".so" in name:
                    return path
    except OSError:
        pass
    return None


def use_torch_openmp() -> str:
    """Registers torch's libgomp with the native module once; returns the pool in force."""
    global _done
    if not _done:
        _done = True
        import torch

        path = _mapped_libgomp() if "OpenMP" in torch.__config__.parallel_info() else None
        if path is not None:
            # the native module looks the entry points up in the already loaded library itself;
            # a library it cannot use leaves the loops on rayon
            with contextlib.suppress(ValueError):
                _native.set_openmp(path)
    return _native.thread_pool()
