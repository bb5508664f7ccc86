"""The structural graph cache: compiled partitions keyed by BLAKE3 of their canonical plan.

In memory: an LRU with a size limit. On disk (``TORCHBURN_CACHE_DIR``): engine payloads that
survive the process, written atomically (temp file + rename, so concurrent writers leave a
whole entry), and validated on read — a corrupt or foreign entry is ignored and rebuilt.
"""

from __future__ import annotations

import json
import os
import pathlib
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import blake3

from torchburn.engine import Engine
from torchburn.plan import Plan

MAGIC = "torchburn-plan"
FORMAT = 1
DEFAULT_MAXSIZE = 512


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    disk_hits: int = 0
    disk_writes: int = 0
    disk_rejected: int = 0
    evictions: int = 0
    compiles: int = 0


class GraphCache:
    def __init__(self, maxsize: int = DEFAULT_MAXSIZE, disk_dir: str | os.PathLike[str] | None = None) -> None:
        self.maxsize = maxsize
        self.disk_dir = pathlib.Path(disk_dir) if disk_dir else None
        self.stats = CacheStats()
        self._entries: OrderedDict[str, Callable[..., Any]] = OrderedDict()
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

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.stats = CacheStats()

    def info(self) -> dict[str, Any]:
        return {
            **asdict(self.stats),
            "entries": len(self._entries),
            "maxsize": self.maxsize,
            "disk_dir": str(self.disk_dir) if self.disk_dir else None,
        }

    # -- disk ----------------------------------------------------------------------------
    def _path(self, key: str, engine: Engine) -> pathlib.Path:
        assert self.disk_dir is not None
        return self.disk_dir / f"v{FORMAT}" / engine.name / key[:2] / f"{key}.tbplan"

    def _load(self, key: str, engine: Engine, plan: Plan) -> Callable[..., Any] | None:
        if self.disk_dir is None:
            return None
        path = self._path(key, engine)
        try:
            blob = path.read_bytes()
        except OSError:
            return None
        try:
            header_line, payload = blob.split(b"\n", 1)
            header = json.loads(header_line)
            valid = (
                header.get("magic") == MAGIC
                and header.get("format") == FORMAT
                and header.get("key") == key
                and header.get("engine") == engine.name
                and header.get("engine_version") == engine.version()
                and header.get("payload_blake3") == blake3.blake3(payload).hexdigest()
            )
            compiled = engine.deserialize(payload, plan) if valid else None
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
            "format": FORMAT,
            "key": key,
            "engine": engine.name,
            "engine_version": engine.version(),
            "payload_blake3": blake3.blake3(payload).hexdigest(),
        }
        path = self._path(key, engine)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            with os.fdopen(fd, "wb") as f:
                f.write(json.dumps(header, sort_keys=True).encode() + b"\n" + payload)
            os.replace(tmp, path)
            self.stats.disk_writes += 1
        except OSError:
            pass  # a read-only or full cache directory only costs the next process a compile


def user_cache_dir() -> pathlib.Path | None:
    """The folder for facts worth keeping across processes (an engine's adapter list, say).

    ``TORCHBURN_CACHE_DIR`` when set (``0`` or ``off``: keep nothing), else ``$XDG_CACHE_HOME/torchburn``
    (``~/.cache/torchburn``). Not created here: a writer makes it when it first stores something.
    """
    raw = os.environ.get("TORCHBURN_CACHE_DIR", "").strip()
    if raw.lower() in ("0", "off", "false", "no"):
        return None
    if raw:
        return pathlib.Path(raw).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "torchburn"


_cache: GraphCache | None = None


def graph_cache() -> GraphCache:
    global _cache
    if _cache is None:
        _cache = GraphCache(
            maxsize=int(os.environ.get("TORCHBURN_CACHE_SIZE", DEFAULT_MAXSIZE)),
            # the graph cache writes to disk only where TORCHBURN_CACHE_DIR names a folder
            disk_dir=os.environ.get("TORCHBURN_CACHE_DIR") if user_cache_dir() is not None else None,
        )
    return _cache


_KEEP = "keep"


def configure(maxsize: int | None = None, disk_dir: str | os.PathLike[str] | None = _KEEP) -> GraphCache:
    """Replace the process-wide cache (a new size limit, or a disk directory; None turns disk off)."""
    global _cache
    current = graph_cache()
    _cache = GraphCache(
        maxsize=current.maxsize if maxsize is None else maxsize,
        disk_dir=current.disk_dir if disk_dir is _KEEP else disk_dir,
    )
    return _cache
