"""Plugin loading: the ``torchburn`` entry-point group, through pluggy.

Loading is lazy (first use, not ``import torchburn``) and defensive: a plugin that raises,
hangs, or was built for another plugin API is recorded with the reason, shown by
``torchburn engines``, reported in one warning, and skipped. The host never fails because of it.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from types import ModuleType
from typing import Any

import pluggy

from torchburn import hookspecs
from torchburn._version import PLUGIN_API_VERSION, __version__
from torchburn.engine import Engine
from torchburn.registry import KernelRegistry

log = logging.getLogger("torchburn.plugins")

ENTRY_POINT_GROUP = "torchburn"
IMPORT_TIMEOUT_ENV = "TORCHBURN_PLUGIN_IMPORT_TIMEOUT"


class TorchburnPluginWarning(UserWarning):
    """A plugin could not be loaded; ``torchburn engines`` says which and why."""


@dataclass
class PluginRecord:
    name: str
    distribution: str
    version: str
    status: str  # "loaded", "broken", "incompatible", "disabled", "not allowed", "timeout"
    reason: str = ""
    engines: list[str] = field(default_factory=list)


@dataclass
class EngineRecord:
    engine: Engine
    plugin: str

    @property
    def name(self) -> str:
        return self.engine.name


class PluginState:
    def __init__(self) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self.pm.add_hookspecs(hookspecs)
        self.records: list[PluginRecord] = []
        self.engines: dict[str, EngineRecord] = {}
        self.registry = KernelRegistry()
        self.commands: list[Any] = []
        self.llm_backends: list[Any] = []
        self.unused_kernels: list[tuple[str, str]] = []  # (plugin, engine) whose kernels nothing runs
        if _env_flag("TORCHBURN_TRACE_PLUGINS"):
            self.pm.trace.root.setwriter(lambda msg: sys.stderr.write(f"[torchburn] {msg}"))
            self.pm.enable_tracing()

    # -- loading -------------------------------------------------------------------------
    def load_entry_points(self) -> None:
        allow = _env_list("TORCHBURN_LOAD_PLUGINS")
        deny = set(_env_list("TORCHBURN_DISABLED_PLUGINS"))
        for ep in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            # one parse of the distribution's metadata (``dist.name`` and ``dist.version`` parse it each)
            meta = ep.dist.metadata if ep.dist is not None else None
            dist = str(meta["Name"]) if meta is not None else "?"
            version = str(meta["Version"]) if meta is not None else "?"
            if ep.name in deny or dist in deny:
                self.records.append(PluginRecord(ep.name, dist, version, "disabled", "in TORCHBURN_DISABLED_PLUGINS"))
                continue
            if allow and ep.name not in allow and dist not in allow:
                self.records.append(
                    PluginRecord(ep.name, dist, version, "not allowed", "not in TORCHBURN_LOAD_PLUGINS")
                )
                continue
            start = time.perf_counter()
            status, reason, module = _load_with_timeout(ep.load, _import_timeout())
            trace(f"loaded entry point {ep.name} ({dist}) in {time.perf_counter() - start:.3f}s: {status}")
            record = PluginRecord(ep.name, dist, version, status, reason)
            self.records.append(record)
            if module is not None:
                self.add(module, record)

    def add(self, module: Any, record: PluginRecord) -> None:
        """Register one plugin object and collect what its hooks provide."""
        required = getattr(module, "PLUGIN_API_VERSION", PLUGIN_API_VERSION)
        if required != PLUGIN_API_VERSION:
            record.status = "incompatible"
            record.reason = _api_mismatch(record.distribution, required)
            return
        try:
            self.pm.register(module, name=record.name)
        except Exception as exc:  # pluggy validates hookimpl signatures here
            record.status, record.reason = "broken", f"{type(exc).__name__}: {exc}"
            return
        for impl in self.pm.hook.tb_register_engines.get_hookimpls():
            if impl.plugin is not module:
                continue
            try:
                provided: list[Any] = list(impl.function() or [])  # type: ignore[call-overload]
                for item in provided:
                    engine = item() if isinstance(item, type) else item
                    if not isinstance(engine, Engine) or not engine.name:
                        raise TypeError(f"{item!r} is not a named torchburn.Engine")
                    if engine.plugin_api_version != PLUGIN_API_VERSION:
                        record.status = "incompatible"
                        record.reason = _api_mismatch(record.distribution, engine.plugin_api_version)
                        continue
                    if engine.name in self.engines:
                        other = self.engines[engine.name].plugin
                        raise ValueError(f"engine {engine.name!r} is already provided by {other!r}")
                    self.engines[engine.name] = EngineRecord(engine, record.name)
                    record.engines.append(engine.name)
            except Exception as exc:
                record.status, record.reason = "broken", f"tb_register_engines: {type(exc).__name__}: {exc}"
        for hook, sink in (("tb_register_commands", self.commands), ("tb_register_llm_backends", self.llm_backends)):
            for impl in getattr(self.pm.hook, hook).get_hookimpls():
                if impl.plugin is module:
                    try:
                        sink.extend(impl.function() or [])
                    except Exception as exc:
                        record.status, record.reason = "broken", f"{hook}: {type(exc).__name__}: {exc}"

    def register_kernels(self) -> None:
        added: dict[str, set[str]] = {}  # plugin -> engines it added kernels to
        for impl in self.pm.hook.tb_register_kernels.get_hookimpls():
            record = self.record(impl.plugin_name)
            before = self.registry.snapshot()
            try:
                impl.function(registry=self.registry)
            except Exception as exc:
                if record is not None:
                    record.status, record.reason = "broken", f"tb_register_kernels: {type(exc).__name__}: {exc}"
            after = self.registry.snapshot()
            changed = {engine for engine, table in after.items() if table != before.get(engine)}
            added.setdefault(impl.plugin_name, set()).update(changed)
        self.unused_kernels = []
        for plugin, targets in added.items():
            for engine_name in sorted(targets):
                rec = self.engines.get(engine_name)
                if rec is None or rec.engine.runs_registered_kernels():
                    continue  # an engine not installed here, or one that runs them
                note = (
                    f"kernels registered for {engine_name!r} are not used: that engine compiles "
                    "partitions into its own executor and does not run registered kernels"
                )
                self.unused_kernels.append((plugin, engine_name))
                record = self.record(plugin)
                if record is not None and record.status == "loaded":
                    record.reason = "; ".join(r for r in (record.reason, note) if r)

    def record(self, name: str) -> PluginRecord | None:
        return next((r for r in self.records if r.name == name), None)

    def problems(self) -> list[PluginRecord]:
        return [r for r in self.records if r.status in ("broken", "incompatible", "timeout")]


_state: PluginState | None = None
_lock = threading.RLock()
_extra: list[tuple[Any, str]] = []  # (plugin object, name)


def state() -> PluginState:
    """The loaded plugin state, loading entry points on first use."""
    global _state
    with _lock:
        if _state is None:
            st = PluginState()
            st.load_entry_points()
            for module, name in _extra:
                record = PluginRecord(name, "(registered in process)", "", "loaded")
                st.records.append(record)
                st.add(module, record)
            st.register_kernels()
            _state = st
            problems = st.problems()
            if problems:
                listing = "; ".join(f"{r.name} ({r.distribution}): {r.reason}" for r in problems)
                warnings.warn(
                    f"torchburn skipped {len(problems)} plugin(s): {listing}. Run `torchburn engines` for details.",
                    TorchburnPluginWarning,
                    stacklevel=3,
                )
            if st.unused_kernels:
                listing = ", ".join(f"{plugin} -> {engine}" for plugin, engine in st.unused_kernels)
                warnings.warn(
                    f"torchburn: kernels registered for engines that do not run registered kernels are "
                    f"ignored ({listing}); see docs/plugins.md",
                    TorchburnPluginWarning,
                    stacklevel=3,
                )
        return _state


def register_plugin(module: Any, name: str | None = None) -> None:
    """Register a plugin object in this process (as if it came from an entry point)."""
    with _lock:
        _extra.append((module, str(name or getattr(module, "__name__", repr(module)))))
        reload()


def unregister_plugin(name: str) -> None:
    with _lock:
        _extra[:] = [(m, n) for m, n in _extra if n != name]
        reload()


def reload() -> None:
    """Forget loaded plugins; the next use loads them again (tests, environment changes)."""
    global _state
    with _lock:
        _state = None


def registry() -> KernelRegistry:
    return state().registry


def engines() -> dict[str, Engine]:
    return {name: rec.engine for name, rec in state().engines.items()}


def trace(message: str) -> None:
    if _env_flag("TORCHBURN_TRACE_PLUGINS"):
        sys.stderr.write(f"[torchburn] {message}\n")


def _load_with_timeout(load: Callable[[], Any], timeout: float) -> tuple[str, str, ModuleType | None]:
    """Import a plugin in a worker thread so a hanging import cannot hang the host."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["module"] = load()
        except BaseException as exc:
            box["error"] = exc

    worker = threading.Thread(target=run, name="torchburn-plugin-import", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        return "timeout", f"import did not finish within {timeout:g}s ({IMPORT_TIMEOUT_ENV})", None
    if "error" in box:
        exc = box["error"]
        return "broken", f"import failed: {type(exc).__name__}: {exc}", None
    return "loaded", "", box["module"]


def _api_mismatch(distribution: str, required: Any) -> str:
    return (
        f"built for torchburn plugin API {required}, but tb-core {__version__} provides API "
        f"{PLUGIN_API_VERSION}: install a release of {distribution} made for plugin API "
        f"{PLUGIN_API_VERSION}, or a tb-core release that provides API {required}"
    )


def _import_timeout() -> float:
    try:
        return float(os.environ.get(IMPORT_TIMEOUT_ENV, "30"))
    except ValueError:
        return 30.0


def _env_list(name: str) -> list[str]:
    return [v.strip() for v in os.environ.get(name, "").split(",") if v.strip()]


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")
