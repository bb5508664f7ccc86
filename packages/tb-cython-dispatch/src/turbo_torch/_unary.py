"""``turbo_torch.sin``, ``cos`` and ``tanh``.

Each is a function with torch's signature (``input, *, out=None``) that goes through a dispatch
site of its own (``cache_info()["torch.sin"]``...), keyed by the input's element count; an entry
may run natively (see ``tb_cython_dispatch.native_unary``). ``out=``, anything PyTorch must
observe, and tracing by ``torch.compile`` (Dynamo sees the torch function) take the torch
function itself. TorchScript compiles them as the ATen op they stand for.
"""

from __future__ import annotations

import atexit
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from tb_cython_dispatch import _impl, native_unary

_is_compiling = torch.compiler.is_compiling
# name -> [unary_call of the implementation in force, that implementation's site for the op]
_cells: dict[str, list[Any]] = {name: [None, None] for name in native_unary.OPS}


def _resolver(op: str) -> Callable[[Any, Any], tuple[Any]]:
    def resolve(owner: Any, key: Any) -> tuple[Any]:
        return (native_unary.for_key(op, _impl.core.CACHE.epoch),)

    return resolve


def _rebind(core: ModuleType) -> None:
    """Sites of the implementation in force (compiled or Python), one per op."""
    for name, cell in _cells.items():
        cell[0] = core.unary_call
        cell[1] = core.Site(f"torch.{name}", _resolver(name))


def _make(name: str) -> Callable[..., Any]:
    torch_fn = getattr(torch, name)
    cell = _cells[name]

    def fn(input: Any, *, out: Any = None) -> Any:
        if out is None and not _is_compiling():
            return cell[0](cell[1], torch_fn, input)
        return torch_fn(input, out=out)

    fn.__name__ = fn.__qualname__ = name
    fn.__module__ = "turbo_torch"
    fn.__doc__ = torch_fn.__doc__
    fn.__wrapped__ = torch_fn  # type: ignore[attr-defined]
    # TorchScript: a scripted function calling turbo_torch.<name> gets the ATen op itself.
    torch.jit._builtins._register_builtin(fn, f"aten::{name}")
    return fn


_impl.on_change(_rebind)


def _drop_sites() -> None:
    """At exit: free the sites while the modules their destructors read are still whole; calls
    made later in the shutdown go straight to the torch function."""
    for cell in _cells.values():
        cell[0], cell[1] = _torch_call, None


def _torch_call(site: Any, fn: Any, x: Any) -> Any:
    return fn(x)


atexit.register(_drop_sites)
FUNCTIONS = {name: _make(name) for name in native_unary.OPS}
