"""Op coverage telemetry: where each executed ATen op ran, since reset_stats().

Four categories: "native" (a kernel the engine implements itself), "delegated" (an engine took
the node but hands it to PyTorch's own kernel, as ``cython_dispatch`` does; see
``Engine.delegated_ops``), "routed" (an engine took and compiled the node, but its partition runs
in eager PyTorch because eager measured faster: ``torchburn.routing``) and "fallback" (no engine
takes it: eager PyTorch).

Counting is per call of a compiled graph, at the cost of one integer increment: each compiled
graph keeps its static per-op counts, and ``op_coverage()`` multiplies them out when asked.
"""

from __future__ import annotations

import threading
import weakref
from collections import Counter
from typing import Any

CATEGORIES = ("native", "delegated", "routed", "fallback")


class GraphRecord:
    __slots__ = ("__weakref__", "calls", "delegated", "fallback", "native", "routed")

    def __init__(
        self,
        native: Counter[str],
        fallback: Counter[str],
        delegated: Counter[str] | None = None,
        routed: Counter[str] | None = None,
    ) -> None:
        self.native = native  # "engine:op" -> nodes per call
        self.delegated = delegated if delegated is not None else Counter()  # "engine:op" -> nodes per call
        self.routed = routed if routed is not None else Counter()  # "engine:op" -> nodes per call
        self.fallback = fallback  # op -> nodes per call
        self.calls = 0


_records: weakref.WeakSet[GraphRecord] = weakref.WeakSet()
_lock = threading.Lock()


def new_record(
    native: Counter[str],
    fallback: Counter[str],
    delegated: Counter[str] | None = None,
    routed: Counter[str] | None = None,
) -> GraphRecord:
    record = GraphRecord(native, fallback, delegated, routed)
    with _lock:
        _records.add(record)
    return record


def reset_stats() -> None:
    with _lock:
        for record in list(_records):
            record.calls = 0


def op_coverage(by_engine: bool = False) -> dict[str, dict[str, int]]:
    """``{"native": {op: n}, "delegated": {op: n}, "routed": {op: n}, "fallback": {op: n}}`` since
    reset_stats.

    "native": nodes an engine ran with its own kernel; "delegated": nodes an engine took but ran
    with PyTorch's own kernel; "routed": nodes of a partition an engine compiled that ran in eager
    PyTorch because eager measured faster there (``torchburn.routing``); "fallback": nodes no engine
    takes. With ``by_engine=True`` the native, delegated and routed keys are ``"engine:op"``.
    """
    native: Counter[str] = Counter()
    delegated: Counter[str] = Counter()
    routed: Counter[str] = Counter()
    fallback: Counter[str] = Counter()
    with _lock:
        records = list(_records)
    for record in records:
        if not record.calls:
            continue
        for sink, counts in ((native, record.native), (delegated, record.delegated), (routed, record.routed)):
            for key, n in counts.items():
                sink[key if by_engine else key.split(":", 1)[1]] += n * record.calls
        for op, n in record.fallback.items():
            fallback[op] += n * record.calls
    return {"native": dict(native), "delegated": dict(delegated), "routed": dict(routed), "fallback": dict(fallback)}


def summary() -> dict[str, Any]:
    cov = op_coverage()
    counts = {category: sum(cov[category].values()) for category in CATEGORIES}
    total = sum(counts.values())
    return {**counts, "native_fraction": counts["native"] / total if total else 0.0}
