"""TorchBurn: a torch.compile backend that runs PyTorch graphs on pluggable native engines.

    import torch, torchburn
    fast = torch.compile(model, backend="torchburn")

See ``torchburn engines`` for what is installed and ``torchburn.explain`` for why a model is
not fully native.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
import types
from typing import TYPE_CHECKING, Any

from torchburn._version import PLUGIN_API_VERSION, __version__

if TYPE_CHECKING:
    from torchburn.backend import torchburn_backend
    from torchburn.cache import graph_cache as graph_cache
    from torchburn.engine import Availability, Engine
    from torchburn.explain import Explanation, explain
    from torchburn.hookspecs import hookimpl
    from torchburn.interop import PreparedProgram
    from torchburn.nodeinfo import NodeInfo, accepts
    from torchburn.options import EngineNotFoundError, Options, TorchburnFallbackWarning
    from torchburn.options import select_engines as select_engines
    from torchburn.plan import Plan, PlanNode, Ref, TensorMeta
    from torchburn.plugins import TorchburnPluginWarning, register_plugin, unregister_plugin
    from torchburn.registry import KernelRegistry
    from torchburn.telemetry import op_coverage, reset_stats

# The public names and the module that defines each. They load on first use, not at
# ``import torchburn``: that imports neither torch nor a plugin, so ``torchburn engines``
# can answer from its cached listing without paying for torch (about a second).
_LAZY = {
    "torchburn_backend": "torchburn.backend",
    "graph_cache": "torchburn.cache",
    "Availability": "torchburn.engine",
    "Engine": "torchburn.engine",
    "Explanation": "torchburn.explain",
    "explain": "torchburn.explain",
    "hookimpl": "torchburn.hookspecs",
    "PreparedProgram": "torchburn.interop",
    "NodeInfo": "torchburn.nodeinfo",
    "accepts": "torchburn.nodeinfo",
    "EngineNotFoundError": "torchburn.options",
    "Options": "torchburn.options",
    "TorchburnFallbackWarning": "torchburn.options",
    "select_engines": "torchburn.options",
    "Plan": "torchburn.plan",
    "PlanNode": "torchburn.plan",
    "Ref": "torchburn.plan",
    "TensorMeta": "torchburn.plan",
    "TorchburnPluginWarning": "torchburn.plugins",
    "register_plugin": "torchburn.plugins",
    "unregister_plugin": "torchburn.plugins",
    "KernelRegistry": "torchburn.registry",
    "op_coverage": "torchburn.telemetry",
    "reset_stats": "torchburn.telemetry",
}


def active_engine() -> str:
    """Name of the engine that takes nodes first under the current settings, or "eager"."""
    from torchburn.options import select_engines

    engines = select_engines()
    return engines[0].name if engines else "eager"


def active_engines() -> list[str]:
    """Every engine in force, in priority order (empty: eager only)."""
    from torchburn.options import select_engines

    return [e.name for e in select_engines()]


def cache_info() -> dict[str, Any]:
    """Hits, misses, disk hits, evictions and size of the structural graph cache."""
    from torchburn.cache import graph_cache as graph_cache

    return graph_cache().info()


def clear_cache(disk: bool = True) -> None:
    """Forget every compiled partition: the in-memory cache, and (``disk``) the persistent compile
    cache's entries on disk, so the next compile traces, lowers and compiles again."""
    from torchburn.cache import graph_cache as graph_cache

    graph_cache().clear(disk=disk)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value
    if name == "LLM":
        try:
            from tb_llm import LLM
        except ImportError as exc:
            raise ImportError("torchburn.LLM needs the tb-llm package: pip install tb-llm") from exc
        return LLM
    # a submodule not imported yet: ``import torchburn`` then ``torchburn.plugins.engines()``
    if not name.startswith("__") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'torchburn' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


class _Package(types.ModuleType):
    """Keeps ``torchburn.explain`` the function: importing the ``torchburn.explain`` module, which
    the lazy loading no longer follows with ``from torchburn.explain import explain``, would
    otherwise bind the module over it."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _LAZY and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def _register_backend() -> None:
    """Make ``backend="torchburn"`` resolvable.

    An installed tb-core declares the ``torch_dynamo_backends`` entry point, which Dynamo reads on
    lookup, so nothing needs importing here (importing torch._dynamo costs seconds). Only a source
    tree on ``sys.path`` without dist metadata registers explicitly. tb-core's own metadata is read,
    not every distribution's entry points (tens of ms at each ``import torchburn``).
    """
    from importlib import metadata

    try:
        eps = metadata.distribution("tb-core").entry_points
    except metadata.PackageNotFoundError:
        eps = metadata.EntryPoints(())
    if any(ep.group == "torch_dynamo_backends" and ep.name == "torchburn" for ep in eps):
        return
    from torchburn.backend import register

    # Registered already by an earlier call: both paths are fine.
    with contextlib.suppress(Exception):
        register()


_register_backend()

__all__ = [
    "PLUGIN_API_VERSION",
    "Availability",
    "Engine",
    "EngineNotFoundError",
    "Explanation",
    "KernelRegistry",
    "NodeInfo",
    "Options",
    "Plan",
    "PlanNode",
    "PreparedProgram",
    "Ref",
    "TensorMeta",
    "TorchburnFallbackWarning",
    "TorchburnPluginWarning",
    "__version__",
    "accepts",
    "active_engine",
    "active_engines",
    "cache_info",
    "clear_cache",
    "explain",
    "hookimpl",
    "op_coverage",
    "register_plugin",
    "reset_stats",
    "torchburn_backend",
    "unregister_plugin",
]
