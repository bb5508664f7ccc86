"""tb-wgpu: the TorchBurn ``wgpu`` engine (WGSL compute through wgpu-py on Vulkan / Metal / DX12).

    import torch
    fast = torch.compile(model, backend="torchburn", options={"engine": "wgpu"})

Importing this package is cheap; the GPU is only touched when the engine is first asked
whether it is available or to compile a partition.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def stats() -> dict[str, int]:
    """Engine counters since ``reset_stats()``: submissions, uploads, param_uploads, readbacks..."""
    from tb_wgpu.device import stats as _stats

    return _stats()


def reset_stats() -> None:
    from tb_wgpu.device import reset_stats as _reset

    _reset()


def describe() -> dict[str, Any]:
    """Adapter name, backend, limits and shader-f16 support, or the reason there is no adapter."""
    from tb_wgpu.device import probe

    ctx, reason = probe()
    return ctx.describe() if ctx is not None else {"available": False, "reason": reason}


__all__ = ["__version__", "describe", "reset_stats", "stats"]
