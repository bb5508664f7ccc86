"""TorchBurn: a torch.compile backend that runs PyTorch graphs on pluggable native engines.

    import torch, torchburn
    fast = torch.compile(model, backend="torchburn")

See ``torchburn engines`` for what is installed and ``torchburn.explain`` for why a model is
not fully native.
"""

from __future__ import annotations

import contextlib
from typing import Any

from torchburn._version import PLUGIN_API_VERSION, __version__
from torchburn.backend import torchburn_backend
from torchburn.cache import graph_cache
from torchburn.engine import Availability, Engine
from torchburn.explain import Explanation, explain
from torchburn.hookspecs import hookimpl
from torchburn.interop import PreparedProgram
from torchburn.nodeinfo import NodeInfo, accepts
from torchburn.options import EngineNotFoundError, Options, TorchburnFallbackWarning, select_engines
from torchburn.plan import Plan, PlanNode, Ref, TensorMeta
from torchburn.plugins import TorchburnPluginWarning, register_plugin, unregister_plugin
from torchburn.registry import KernelRegistry
from torchburn.telemetry import op_coverage, reset_stats


def active_engine() -> str:
    """Name of the engine that takes nodes first under the current settings, or "eager"."""
    engines = select_engines()
    return engines[0].name if engines else "eager"


def active_engines() -> list[str]:
    """Every engine in force, in priority order (empty: eager only)."""
    return [e.name for e in select_engines()]


def cache_info() -> dict[str, Any]:
    """Hits, misses, disk hits, evictions and size of the structural graph cache."""
    return graph_cache().info()


def clear_cache(disk: bool = True) -> None:
    """Forget every compiled partition: the in-memory cache, and (``disk``) the persistent compile
    cache's entries on disk, so the next compile traces, lowers and compiles again."""
    graph_cache().clear(disk=disk)


def __getattr__(name: str) -> Any:
    if name == "LLM":
        try:
            from tb_llm import LLM
        except ImportError as exc:
            raise ImportError("torchburn.LLM needs the tb-llm package: pip install tb-llm") from exc
        return LLM
    raise AttributeError(f"module 'torchburn' has no attribute {name!r}")


def _register_backend() -> None:
    """Make ``backend="torchburn"`` resolvable.

    Installed distributions declare the ``torch_dynamo_backends`` entry point, which Dynamo reads
    on lookup, so nothing needs importing here (importing torch._dynamo costs seconds). Only a
    source tree on ``sys.path`` without dist metadata registers explicitly.
    """
    from importlib import metadata

    if any(ep.name == "torchburn" for ep in metadata.entry_points(group="torch_dynamo_backends")):
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
