"""The fast ``__call__`` and the module classes made from torch's."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn as _tnn

from tb_cython_dispatch import _impl, resolve

_is_compiling = torch.compiler.is_compiling
_torch_call = _tnn.Module.__call__
_module_call: Any = None
_site_attrs = ("_tb_site_compiled", "_tb_site_python")


def _bind(core: Any) -> None:
    global _module_call
    core.set_resolvers(resolve.resolve_type, resolve.resolve_sequential)
    _module_call = core.module_call


_impl.on_change(_bind)


class Module(_tnn.Module):
    """``torch.nn.Module`` whose calls skip the generic hook machinery when there are no hooks.

    With any hook registered (on the module or globally), while tracing (``torch.jit.trace``),
    under ``torch.compile`` or after ``module.compile()``, the call is ``nn.Module.__call__``
    itself, so hooks, tracing and compilation see exactly what they see in PyTorch.
    """

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if _is_compiling():
            return _torch_call(self, *args, **kwargs)
        return _module_call(self, args, kwargs)

    def __getstate__(self) -> dict[str, Any]:
        # The dispatch cache is per process: never pickle or deep-copy it.
        state = super().__getstate__()
        for attr in _site_attrs:
            state.pop(attr, None)
        return state


_made: dict[type, type] = {_tnn.Module: Module}


def make_class(torch_cls: type) -> type:
    """The turbo_torch.nn class for a torch.nn module class (made once, named as torch's)."""
    cls = _made.get(torch_cls)
    if cls is None:
        cls = type(
            torch_cls.__name__,
            (torch_cls, Module),
            {"__module__": "turbo_torch.nn", "__qualname__": torch_cls.__name__, "__doc__": torch_cls.__doc__},
        )
        _made[torch_cls] = cls
    return cls
