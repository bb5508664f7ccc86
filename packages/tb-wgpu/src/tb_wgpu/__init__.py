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
    """Adapter name, backend, limits and shader-f16 support, or the reason there is no adapter.

    From the open device when this process has one, else from the adapter facts (no device opened).
    """
    from tb_wgpu import device
    from tb_wgpu.adapters import adapter_info

    if device._CONTEXT is not None:
        return device._CONTEXT.describe()
    adapter, reason = adapter_info()
    if adapter is None:
        return {"available": False, "reason": reason}
    return {
        "adapter": adapter.name,
        "backend": adapter.backend,
        "adapter_type": adapter.adapter_type,
        "shader-f16": adapter.shader_f16,
        "shader-int64": adapter.shader_int64,
        "max_buffer_size": adapter.limits.get("max-buffer-size"),
        "max_storage_buffer_binding_size": adapter.max_binding,
    }


__all__ = ["__version__", "describe", "reset_stats", "stats"]
