"""The compile caches: compiled partitions keyed by BLAKE3 of their canonical plan, and whole
traced graphs keyed by the Dynamo graph they came from.

In memory: an LRU of compiled partitions with a size limit. On disk (the persistent cache, on by
default in ``~/.cache/torchburn/compile``; ``TORCHBURN_CACHE_DIR`` moves it, ``0`` turns it off):

* ``*.tbplan``: an engine's ``serialize()`` bytes of one compiled partition (native_cpu: its
  lowered executor spec), restored by ``deserialize()`` without lowering again;
* ``*.tbroute``: a routing decision (``torchburn.routing``): whether a partition runs on its
  engine or in eager PyTorch at a thread count, and the two times that decided it, keyed
  by the partition's structural key, the engine's cache tag and the thread count;
* ``*.tbgraph``: the ATen graph direct inference traced from a Dynamo graph, as the JSON of a
  ``Plan`` (op names, literal arguments, tensor metas), so a later process skips the
  decomposition table and the trace. Keyed by the Dynamo graph's code, its inputs' shapes,
  strides, dtypes and devices, the global state a trace depends on, the options, the versions
  of torch, tb-core and every selected engine (each engine's ``cache_tag()``: version, step
  schema, ISA) and a fingerprint of their installed source files.

Every entry is a JSON header line (magic, format, key, BLAKE3 of the payload) and the payload;
nothing is unpickled or executed. A corrupt, truncated or foreign entry is refused and rebuilt.
Writers write a temp file and ``os.replace`` it, so concurrent processes only ever read whole
entries. The folder is bounded (``TORCHBURN_CACHE_MAX_MB``, default 256): after a write the
least recently used entries (by mtime, which a read refreshes) are removed.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import os
import pathlib
import platform
import shutil
import sys
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import blake3

from torchburn import autocast_state
from torchburn.engine import Engine
from torchburn.paths import user_cache_dir as user_cache_dir  # re-exported: engines import it from here
from torchburn.plan import Plan

if TYPE_CHECKING:
    import torch

MAGIC = "torchburn-plan"
GRAPH_MAGIC = "torchburn-graph"
ROUTE_MAGIC = "torchburn-route"
MAX_ROUTES = 4096
FORMAT = 2
DEFAULT_MAXSIZE = 512
DEFAULT_MAX_MB = 256


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    disk_hits: int = 0
    disk_writes: int = 0
    disk_rejected: int = 0
    evictions: int = 0
    compiles: int = 0
    graph_hits: int = 0
    graph_misses: int = 0
    graph_writes: int = 0
    graph_rejected: int = 0
    disk_evictions: int = 0
    route_hits: int = 0
    route_writes: int = 0


class GraphCache:
    def __init__(
        self,
        maxsize: int = DEFAULT_MAXSIZE,
        disk_dir: str | os.PathLike[str] | None = None,
        max_bytes: int = DEFAULT_MAX_MB << 20,
    ) -> None:
        self.maxsize = maxsize
        self.disk_dir = pathlib.Path(disk_dir) if disk_dir else None
        self.max_bytes = max_bytes
        self.stats = CacheStats()
        self._entries: OrderedDict[str, Callable[..., Any]] = OrderedDict()
        self._routes: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get_or_compile(self, key: str, engine: Engine, plan: Plan) -> Callable[..., Any]:
        with self._lock:
            compiled = self._entries.get(key)
            if compiled is not None:
                self._entries.move_to_end(key)
                self.stats.hits += 1
                return compiled
            self.stats.misses += 1
        compiled = self._load(key, engine, plan)
        if compiled is None:
            compiled = engine.compile(plan)
            self.stats.compiles += 1
            self._store(key, engine, plan, compiled)
        with self._lock:
            self._entries[key] = compiled
            while len(self._entries) > self.maxsize:
                self._entries.popitem(last=False)
                self.stats.evictions += 1
        return compiled

    def clear(self, disk: bool = False) -> None:
        """Empty the in-memory cache and its counters; ``disk``: remove the disk entries too."""
        with self._lock:
            self._entries.clear()
            self._routes.clear()
            self.stats = CacheStats()
        if disk and self.disk_dir is not None:
            shutil.rmtree(self.disk_dir / f"v{FORMAT}", ignore_errors=True)

    def info(self) -> dict[str, Any]:
        return {
            **asdict(self.stats),
            "entries": len(self._entries),
            "maxsize": self.maxsize,
            "disk_dir": str(self.disk_dir) if self.disk_dir else None,
            "max_bytes": self.max_bytes,
        }

    # -- disk: one entry -----------------------------------------------------------------
    def _entry_path(self, key: str, suffix: str, group: str) -> pathlib.Path:
        assert self.disk_dir is not None
        return self.disk_dir / f"v{FORMAT}" / group / key[:2] / f"{key}.{suffix}"

    def _read_entry(self, path: pathlib.Path, magic: str, key: str) -> tuple[dict[str, Any], bytes] | None:
        """The header and payload of a whole, valid entry; None if absent; ValueError if corrupt."""
        try:
            blob = path.read_bytes()
        except OSError:
            return None
        header_line, sep, payload = blob.partition(b"\n")
        header = json.loads(header_line) if sep else None
        if (
            not isinstance(header, dict)
            or header.get("magic") != magic
            or header.get("format") != FORMAT
            or header.get("key") != key
            or header.get("payload_blake3") != blake3.blake3(payload).hexdigest()
        ):
            raise ValueError(f"corrupt or foreign cache entry {path}")
        with contextlib.suppress(OSError):
            os.utime(path)  # the LRU order of eviction: a read makes the entry recent
        return header, payload

    def _write_entry(self, path: pathlib.Path, header: dict[str, Any], payload: bytes) -> bool:
        header = {**header, "format": FORMAT, "payload_blake3": blake3.blake3(payload).hexdigest()}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(json.dumps(header, sort_keys=True).encode() + b"\n" + payload)
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        except OSError:
            return False  # a read-only or full cache directory only costs the next process a compile
        self._evict()
        return True

    def _evict(self) -> None:
        """Remove the least recently used entries until the folder is within ``max_bytes``."""
        assert self.disk_dir is not None
        root = self.disk_dir / f"v{FORMAT}"
        files = []
        total = 0
        for dirpath, _dirs, names in os.walk(root):
            for name in names:
                path = os.path.join(dirpath, name)
                try:
                    st = os.stat(path)
                except OSError:
                    continue  # removed by another process meanwhile
                files.append((st.st_mtime_ns, st.st_size, path))
                total += st.st_size
        if total <= self.max_bytes:
            return
        files.sort()
        for _mtime, size, path in files:
            if total <= self.max_bytes:
                break
            with contextlib.suppress(OSError):
                os.unlink(path)
                self.stats.disk_evictions += 1
            total -= size

    # -- disk: compiled partitions ---------------------------------------------------------
    def _path(self, key: str, engine: Engine) -> pathlib.Path:
        return self._entry_path(key, "tbplan", engine.name)

    def _load(self, key: str, engine: Engine, plan: Plan) -> Callable[..., Any] | None:
        if self.disk_dir is None:
            return None
        compiled = None
        try:
            entry = self._read_entry(self._path(key, engine), MAGIC, key)
            if entry is None:
                return None
            header, payload = entry
            if (
                header.get("engine") == engine.name
                and header.get("engine_version") == engine.version()
                and header.get("engine_tag") == engine_tag(engine)
            ):
                compiled = engine.deserialize(payload, plan)
        except Exception:  # corrupt bytes, a foreign file, or an engine that cannot read it
            compiled = None
        if compiled is None:
            self.stats.disk_rejected += 1
            return None
        self.stats.disk_hits += 1
        return compiled

    def _store(self, key: str, engine: Engine, plan: Plan, compiled: Callable[..., Any]) -> None:
        if self.disk_dir is None:
            return
        try:
            payload = engine.serialize(compiled, plan)
        except Exception:
            payload = None
        if payload is None:
            return
        header = {
            "magic": MAGIC,
            "key": key,
            "engine": engine.name,
            "engine_version": engine.version(),
            "engine_tag": engine_tag(engine),
        }
        if self._write_entry(self._path(key, engine), header, payload):
            self.stats.disk_writes += 1

    # -- routing decisions (memory and disk) ------------------------------------------------
    def load_route(self, key: str) -> dict[str, Any] | None:
        """The routing decision stored under ``key`` (``routing.route_key``), as its JSON; or None."""
        with self._lock:
            data = self._routes.get(key)
        if data is None and self.disk_dir is not None:
            try:
                entry = self._read_entry(self._entry_path(key, "tbroute", "routes"), ROUTE_MAGIC, key)
                data = json.loads(entry[1]) if entry is not None else None
            except Exception:  # corrupt or foreign: measured again
                data = None
            if not isinstance(data, dict):
                return None
            self._remember_route(key, data)
        if data is not None:
            self.stats.route_hits += 1
        return data

    def store_route(self, key: str, data: dict[str, Any]) -> None:
        """Keep a routing decision in memory and, with a disk folder, on disk."""
        self._remember_route(key, data)
        if self.disk_dir is None:
            return
        payload = json.dumps(data, sort_keys=True).encode()
        if self._write_entry(self._entry_path(key, "tbroute", "routes"), {"magic": ROUTE_MAGIC, "key": key}, payload):
            self.stats.route_writes += 1

    def _remember_route(self, key: str, data: dict[str, Any]) -> None:
        with self._lock:
            self._routes[key] = data
            self._routes.move_to_end(key)
            while len(self._routes) > MAX_ROUTES:
                self._routes.popitem(last=False)

    # -- disk: traced graphs ---------------------------------------------------------------
    def load_graph(self, key: str) -> torch.fx.GraphModule | None:
        """The traced ATen graph stored under ``key`` (``traced_graph_key``), rebuilt; or None."""
        if self.disk_dir is None:
            return None
        try:
            entry = self._read_entry(self._entry_path(key, "tbgraph", "graphs"), GRAPH_MAGIC, key)
            if entry is None:
                self.stats.graph_misses += 1
                return None
            gm = graph_from_json(json.loads(entry[1]))
        except Exception:
            self.stats.graph_rejected += 1
            return None
        self.stats.graph_hits += 1
        return gm

    def store_graph(self, key: str, gm: torch.fx.GraphModule) -> None:
        """Store a traced ATen graph under ``key``; graphs a plan cannot describe are not stored."""
        if self.disk_dir is None:
            return
        try:
            payload = json.dumps(graph_to_json(gm), sort_keys=True, separators=(",", ":")).encode()
        except Exception:
            return
        if self._write_entry(self._entry_path(key, "tbgraph", "graphs"), {"magic": GRAPH_MAGIC, "key": key}, payload):
            self.stats.graph_writes += 1


# -- traced graphs as JSON --------------------------------------------------------------------
def graph_to_json(gm: torch.fx.GraphModule) -> dict[str, Any]:
    """A traced ATen graph (placeholders, ATen calls, one output) as its plan's JSON.

    Raises ``PlanError`` / ``ValueError`` for what a plan cannot describe exactly: constants,
    non-tensor inputs or values, symbolic sizes, other node kinds."""
    from torchburn.plan import PlanError, plan_from_graph_module

    for node in gm.graph.nodes:
        if node.op not in ("placeholder", "call_function", "output"):
            raise PlanError(f"a {node.op} node")
    plan = plan_from_graph_module(gm)
    if plan.constants or any(m is None or m.symbolic for m in plan.inputs):
        raise PlanError("constants, non-tensor or symbolic inputs")
    for node in plan.nodes:
        if not _all_static(node.out):
            raise PlanError(f"{node.op}: a result that is not a static tensor")
    data = plan.to_json()
    data["names"] = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    output = next(n for n in gm.graph.nodes if n.op == "output")
    data["output_kind"] = type(output.args[0]).__name__
    # the JSON must read back to the same plan (a literal the encoding would change is refused)
    if Plan.from_json(json.loads(json.dumps(data))).canonical() != plan.canonical():
        raise PlanError("the plan does not survive JSON")
    return data


def _all_static(out: Any) -> bool:
    if isinstance(out, tuple):
        return all(_all_static(o) for o in out)
    return out is not None and not out.symbolic


def graph_from_json(data: dict[str, Any]) -> torch.fx.GraphModule:
    """``graph_to_json``'s graph rebuilt: the same ATen calls, with fake tensor values as
    ``meta["val"]`` (what the partitioner and the engines' checks read)."""
    import torch
    import torch.fx
    from torch._subclasses.fake_tensor import FakeTensorMode

    from torchburn.plan import Ref, TensorMeta

    plan = Plan.from_json(data)
    mode = FakeTensorMode()

    def fake(meta: Any) -> Any:
        if isinstance(meta, tuple):
            return tuple(fake(m) for m in meta)
        assert isinstance(meta, TensorMeta)
        with mode:
            return torch.empty_strided(meta.shape, meta.stride, dtype=meta.dtype, device=meta.device)

    graph = torch.fx.Graph()
    slots: list[torch.fx.Node] = []
    for name, meta in zip(data["names"], plan.inputs, strict=True):
        node = graph.placeholder(name)
        node.meta["val"] = fake(meta)
        slots.append(node)

    def arg(value: Any) -> Any:
        if isinstance(value, Ref):
            return slots[value.slot]
        if isinstance(value, (list, tuple)):
            return type(value)(arg(v) for v in value)
        if isinstance(value, dict):
            return {k: arg(v) for k, v in value.items()}
        return value

    for pn in plan.nodes:
        node = graph.call_function(pn.target, tuple(arg(pn.args)), arg(pn.kwargs))
        node.meta["val"] = fake(pn.out)
        slots.append(node)
    outputs = arg(list(plan.outputs))
    if plan.single_output:
        graph.output(outputs[0])
    else:
        graph.output(tuple(outputs) if data.get("output_kind") != "list" else outputs)
    return torch.fx.GraphModule(torch.nn.Module(), graph)


# -- keys -------------------------------------------------------------------------------------
@functools.cache
def source_fingerprint(package: str) -> str:
    """BLAKE3 over the names, sizes and mtimes of an installed package's files (a plain module:
    its one file), so an edited (editable-install) source changes the keys without a version bump."""
    try:
        module = sys.modules.get(package) or importlib.import_module(package)
        origin = pathlib.Path(module.__file__ or "")
    except Exception:
        return "unknown"
    if origin.name != "__init__.py":
        files = [origin]
    else:
        files = []
        for dirpath, dirs, names in os.walk(origin.parent):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            files += [pathlib.Path(dirpath, n) for n in sorted(names) if n.endswith(_SOURCE_SUFFIXES)]
    hasher = blake3.blake3()
    for path in files:
        try:
            st = path.stat()
        except OSError:
            continue
        hasher.update(f"{path.name}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return hasher.hexdigest()[:16]


_SOURCE_SUFFIXES = (".py", ".so", ".pyd", ".json", ".wgsl")


def engine_tag(engine: Engine) -> str:
    """What a cached entry of ``engine`` was made by: its ``cache_tag()`` and its source fingerprint."""
    return f"{engine.cache_tag()}@{source_fingerprint(type(engine).__module__.split('.')[0])}"


def traced_graph_key(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], options: Any, engines: Sequence[Engine]
) -> str | None:
    """The persistent key of the ATen graph direct inference traces from a Dynamo graph, or None
    where the Dynamo graph's code does not say everything the trace depends on: sub-modules or
    attributes (their values are not in the code), targets from outside torch, symbolic sizes."""
    import torch

    for node in gm.graph.nodes:
        if node.op in ("get_attr", "call_module"):
            return None
        if node.op == "call_function" and not _torch_target(node.target):
            return None
    inputs = []
    for t in example_inputs:
        if not isinstance(t, torch.Tensor) or any(
            not isinstance(s, int) for s in (*t.shape, *t.stride(), t.storage_offset())
        ):
            return None
        inputs.append(
            [list(t.shape), list(t.stride()), t.storage_offset(), str(t.dtype), str(t.device), t.requires_grad]
        )
    state = [
        torch.is_grad_enabled(),
        torch.is_inference_mode_enabled(),
        torch.get_default_dtype().__repr__(),
        torch.are_deterministic_algorithms_enabled(),
    ]
    state += autocast_state.state()
    from torchburn._version import PLUGIN_API_VERSION, __version__

    material = {
        "code": gm.code,
        "inputs": inputs,
        "state": state,
        "options": repr(options),
        "engines": [[e.name, engine_tag(e)] for e in engines],
        "torch": torch.__version__,
        "tb_core": [__version__, PLUGIN_API_VERSION, source_fingerprint("torchburn")],
        "python": list(sys.version_info[:2]),
        "machine": platform.machine(),
    }
    return blake3.blake3(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()


def _torch_target(target: Any) -> bool:
    import torch

    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return True
    module = getattr(target, "__module__", None) or ""
    return module.split(".")[0] in ("torch", "_operator", "operator", "math", "builtins")


def compile_cache_dir() -> pathlib.Path | None:
    """The persistent compile cache's folder: ``compile`` in ``user_cache_dir()``; None when off."""
    root = user_cache_dir()
    return root / "compile" if root is not None else None


def _max_bytes() -> int:
    raw = os.environ.get("TORCHBURN_CACHE_MAX_MB", "").strip()
    try:
        mb = float(raw) if raw else DEFAULT_MAX_MB
    except ValueError:
        raise ValueError(f"TORCHBURN_CACHE_MAX_MB must be a number of megabytes, not {raw!r}") from None
    return max(0, int(mb * (1 << 20)))


_cache: GraphCache | None = None


def graph_cache() -> GraphCache:
    global _cache
    if _cache is None:
        _cache = GraphCache(
            maxsize=int(os.environ.get("TORCHBURN_CACHE_SIZE", DEFAULT_MAXSIZE)),
            disk_dir=compile_cache_dir(),
            max_bytes=_max_bytes(),
        )
    return _cache


_KEEP = "keep"


def configure(
    maxsize: int | None = None, disk_dir: str | os.PathLike[str] | None = _KEEP, max_bytes: int | None = None
) -> GraphCache:
    """Replace the process-wide cache (a new size limit, a disk directory, None turning disk off,
    or a bound on the disk folder's bytes)."""
    global _cache
    current = graph_cache()
    _cache = GraphCache(
        maxsize=current.maxsize if maxsize is None else maxsize,
        disk_dir=current.disk_dir if disk_dir is _KEEP else disk_dir,
        max_bytes=current.max_bytes if max_bytes is None else max_bytes,
    )
    return _cache
