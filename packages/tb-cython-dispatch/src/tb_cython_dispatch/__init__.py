"""tb-cython-dispatch: cached eager dispatch for PyTorch.

Two faces:

* ``import turbo_torch as torch`` — the drop-in eager API whose module calls, ``nn.Sequential``
  and optimizer steps skip repeated Python-side resolution (see ``turbo_torch``);
* the TorchBurn engine ``cython_dispatch`` (``tb_cython_dispatch.plugin``), which runs compiled
  partitions in a typed Cython loop over pre-resolved ATen callables.

The hot loops live in the Cython extension ``tb_cython_dispatch._dispatch``; the pure-Python
``tb_cython_dispatch._fallback`` implements the same API and is used when the extension is
missing or ``TORCHBURN_DISPATCH_IMPL=python``.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # Lazy, so that the entry-point module (tb_cython_dispatch.plugin) imports neither torch nor
    # the extension: torchburn loads every plugin at startup.
    if name in ("COMPILED_AVAILABLE", "core", "implementation", "set_implementation"):
        from tb_cython_dispatch import _impl

        return getattr(_impl, name)
    raise AttributeError(f"module 'tb_cython_dispatch' has no attribute {name!r}")


__all__ = ["COMPILED_AVAILABLE", "__version__", "core", "implementation", "set_implementation"]
