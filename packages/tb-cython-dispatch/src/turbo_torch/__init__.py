"""``import turbo_torch as torch``: PyTorch's API with cached eager dispatch.

Every name of ``torch`` resolves here (tensors are real ``torch.Tensor`` objects), and every
submodule imports under this name too (``turbo_torch.utils.data`` is ``torch.utils.data``).
What differs is the functions ``sin``, ``cos`` and ``tanh`` (cached per signature, and run by
an installed engine's eager kernels, native_cpu's SIMD ones from tb-cpu-rust, where that measured
faster; see ``tb_cython_dispatch.native_unary``),
the hot paths of ``turbo_torch.nn`` (module calls without hooks, ``Sequential``
as a cached plan, ``Linear`` and activations bound to their ATen entries) and
``turbo_torch.optim`` (Adam, AdamW and SGD steps as multi-tensor updates). Results are
bit-identical to PyTorch's, except a ``Sequential`` entry that decided (by timing, where an engine
such as native_cpu offers prepared programs) to run as one native program: that one is within float32 reassociation
(``set_native_enabled(False)`` turns it off; see ``tb_cython_dispatch.native``).

    import turbo_torch as torch
    from turbo_torch import nn, optim

``turbo_torch.cache_info()`` / ``turbo_torch.clear_cache()`` show and reset the dispatch cache;
``TORCHBURN_DISPATCH_CACHE=0`` turns the fast paths off (plain PyTorch behaviour, for A/B runs).
"""

from __future__ import annotations

from typing import Any

import torch as _torch

from turbo_torch import _alias, _unary, nn, optim
from turbo_torch._cache import (
    cache_enabled,
    cache_info,
    clear_cache,
    native_available,
    native_enabled,
    set_cache_enabled,
    set_native_enabled,
)

_alias.install()

# sin, cos, tanh: cached, and native where measured faster
globals().update(_unary.FUNCTIONS)

__version__ = _torch.__version__


def __getattr__(name: str) -> Any:
    try:
        value = getattr(_torch, name)
    except AttributeError:
        raise AttributeError(f"module 'turbo_torch' has no attribute {name!r} (nor has torch)") from None
    globals()[name] = value  # the next lookup is a plain module attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(dir(_torch)))


__all__ = [
    "cache_enabled",
    "cache_info",
    "clear_cache",
    "native_available",
    "native_enabled",
    "nn",
    "optim",
    "set_cache_enabled",
    "set_native_enabled",
]
