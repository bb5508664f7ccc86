"""Backend options and engine selection (``options={...}``, ``TORCHBURN_ENGINE``, ``TORCHBURN_DEVICE``)."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field, fields
from typing import Any

from torchburn.engine import Engine

DEFAULT_SHAPE_CACHE_SIZE = 8
ROUTING_MODES = ("measure", "off")


class EngineNotFoundError(ValueError):
    """The user named an engine that no installed plugin provides."""


class TorchburnFallbackWarning(UserWarning):
    """Part of a graph runs in eager PyTorch; ``torchburn.explain`` says why."""


@dataclass
class Options:
    #: Engine names in priority order; None means TORCHBURN_ENGINE or the default choice.
    engine: tuple[str, ...] | None = None
    #: Partitions with fewer compute ops than this (and no heavy op such as a GEMM) stay eager;
    #: 0 hands the engine even a partition of view ops alone (views of its inputs, no kernel).
    min_partition_size: int = 2
    #: ... unless the partition's work (elements its compute ops write) reaches this: a single
    #: elementwise op over a large tensor (GELU of 1024×1024) is worth a kernel call, a few ops
    #: over a small one are not. 0 turns the work rule off (op count and heavy ops alone decide).
    min_partition_work: int = 1 << 16
    #: Use the structural graph cache.
    cache: bool = True
    #: "eager": fall back on any engine error; "error": raise it (for engine development).
    fallback: str = "eager"
    #: Warn once per op that falls back.
    warn: bool = True
    #: Inference graphs (grad mode off at compile time, no input mutation, no output aliasing an
    #: input) are traced to ATen by tb-core and called without AOTAutograd's runtime wrapper.
    direct_inference: bool = True
    #: Partitions with symbolic sizes (Dynamo's dynamic shapes) are compiled once per concrete
    #: shape and kept in an LRU of this many programs per partition; 0 runs them in eager PyTorch.
    #: None: ``TORCHBURN_SHAPE_CACHE_SIZE``, else 8.
    shape_cache_size: int | None = None
    #: bfloat16 / float16 compute runs on the engines in float32 between casts at eager's rounding
    #: points (``torchburn.low_precision``); an inference graph keeps it only where it measures
    #: faster than the graph as traced (``torchburn.low_precision_route``). None:
    #: ``TORCHBURN_LOW_PRECISION``, else on.
    low_precision: bool | None = None
    #: "measure": each compiled partition times its engine program against its eager sub-graph
    #: during its first calls and keeps the faster (``torchburn.routing``); "off": the engine
    #: always runs (engine tests). None: ``TORCHBURN_ROUTING``, else "measure".
    routing: str | None = None
    #: Collects GraphReports (used by torchburn.explain).
    report_sink: list[Any] | None = field(default=None, repr=False)

    @staticmethod
    def from_user(options: dict[str, Any] | None) -> Options:
        options = dict(options or {})
        known = {f.name for f in fields(Options)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise TypeError(f"unknown torchburn option(s) {unknown}; known options: {sorted(known)}")
        engine = options.get("engine")
        if isinstance(engine, str):
            options["engine"] = _split(engine)
        elif engine is not None:
            options["engine"] = tuple(engine)
        opts = Options(**options)
        if opts.fallback not in ("eager", "error"):
            raise ValueError(f"fallback must be 'eager' or 'error', not {opts.fallback!r}")
        if opts.min_partition_size < 0:
            raise ValueError("min_partition_size must be 0 or more")
        if isinstance(opts.min_partition_work, bool) or not isinstance(opts.min_partition_work, int):
            raise ValueError(f"min_partition_work must be an int, not {opts.min_partition_work!r}")
        if opts.min_partition_work < 0:
            raise ValueError("min_partition_work must be 0 or more")
        if opts.shape_cache_size is not None and (
            isinstance(opts.shape_cache_size, bool)
            or not isinstance(opts.shape_cache_size, int)
            or opts.shape_cache_size < 0
        ):
            raise ValueError(f"shape_cache_size must be an int, 0 or more, not {opts.shape_cache_size!r}")
        if opts.low_precision is not None and not isinstance(opts.low_precision, bool):
            raise ValueError(f"low_precision must be True, False or None, not {opts.low_precision!r}")
        if opts.routing is not None:
            if not isinstance(opts.routing, str):
                raise ValueError(f"routing must be 'measure' or 'off', not {opts.routing!r}")
            routing_mode(opts.routing)
        return opts

    def routing_mode(self) -> str:
        """``measure`` or ``off``: whether compiled partitions are timed against eager and routed."""
        return routing_mode(self.routing)

    def widen_low_precision(self) -> bool:
        """Whether bfloat16 / float16 compute is rewritten to float32 for the engines."""
        if self.low_precision is not None:
            return self.low_precision
        raw = os.environ.get("TORCHBURN_LOW_PRECISION", "").strip().lower()
        if raw in ("", "1", "on", "true"):
            return True
        if raw in ("0", "off", "false"):
            return False
        raise ValueError(f"TORCHBURN_LOW_PRECISION must be 1 or 0, not {raw!r}")

    def shape_cache_bound(self) -> int:
        """Programs kept per partition with symbolic sizes (0: such partitions run eagerly)."""
        if self.shape_cache_size is not None:
            return self.shape_cache_size
        raw = os.environ.get("TORCHBURN_SHAPE_CACHE_SIZE", "").strip()
        if not raw:
            return DEFAULT_SHAPE_CACHE_SIZE
        try:
            bound = int(raw)
        except ValueError:
            bound = -1
        if bound < 0:
            raise ValueError(f"TORCHBURN_SHAPE_CACHE_SIZE must be an int, 0 or more, not {raw!r}")
        return bound


def routing_mode(option: str | None) -> str:
    """``option`` if set, else ``TORCHBURN_ROUTING``, else "measure"; checked."""
    raw = option if option is not None else os.environ.get("TORCHBURN_ROUTING", "")
    mode = raw.strip().lower() or "measure"
    if mode not in ROUTING_MODES:
        source = "the routing option" if option is not None else "TORCHBURN_ROUTING"
        raise ValueError(f"{source} must be 'measure' or 'off', not {raw!r}")
    return mode


def _split(names: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in names.split(",") if n.strip())


def requested_engine_names(opts: Options) -> tuple[str, ...] | None:
    if opts.engine is not None:
        return opts.engine
    env = os.environ.get("TORCHBURN_ENGINE", "").strip()
    return _split(env) if env else None


def select_engines(opts: Options | None = None) -> list[Engine]:
    """The engines in force, in priority order (empty: everything runs eager)."""
    from torchburn import plugins

    opts = opts or Options()
    installed = plugins.engines()
    names = requested_engine_names(opts)
    if names is not None:
        chosen = []
        for name in names:
            if name == "eager":
                continue
            engine = installed.get(name)
            if engine is None:
                raise EngineNotFoundError(
                    f"no engine named {name!r} is installed; installed engines: "
                    f"{sorted(installed) or 'none'} (pip install tb-cpu-rust for native_cpu)"
                )
            available = engine.is_available()
            if not available:
                warnings.warn(
                    f"torchburn engine {name!r} is unavailable ({available.reason}); skipping it",
                    TorchburnFallbackWarning,
                    stacklevel=2,
                )
                continue
            chosen.append(engine)
        return chosen
    device = os.environ.get("TORCHBURN_DEVICE", "auto").strip().lower() or "auto"
    if device not in ("auto", "cpu", "gpu"):
        raise ValueError(f"TORCHBURN_DEVICE must be auto, cpu or gpu, not {device!r}")
    candidates = [e for e in installed.values() if device == "auto" or e.device == device]
    candidates.sort(key=lambda e: (-e.priority, e.name))
    return [e for e in candidates if e.is_available()]
