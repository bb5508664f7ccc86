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

from tb_cython_dispatch._impl import COMPILED_AVAILABLE, core, implementation, set_implementation

__version__ = "0.1.0"

__all__ = ["COMPILED_AVAILABLE", "__version__", "core", "implementation", "set_implementation"]
