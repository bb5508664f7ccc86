"""Op coverage telemetry: which ATen ops ran native and which fell back, since reset_stats().

Counting is per call of a compiled graph, at the cost of one integer increment: each compiled
graph keeps its static per-op counts, and ``op_coverage()`` multiplies them out when asked.
"""

from __future__ import annotations

import threading
import weakref
from collections import Counter
from typing import Any


class GraphRecord:
    __slots__ = ("__weakref__", "calls", "fallback", "native")

    def __init__(self, native: Counter[str], fallback: Counter[str]) -> None:
        self.native = native  # "engine:op" -> nodes per call
        self.fallback = fallback  # op -> nodes per call
        self.calls = 0


_records: weakref.WeakSet[GraphRecord] = weakref.WeakSet()
_lock = threading.Lock()


def new_record(native: Counter[str], fallback: Counter[str]) -> GraphRecord:
    record = GraphRecord(native, fallback)
    with _lock:
        _records.add(record)
    return record


def reset_stats() -> None:
    with _lock:
        for record in list(_records):
            record.calls = 0


def op_coverage(by_engine: bool = False) -> dict[str, dict[str, int]]:
    """``{"native": {op: count}, "fallback": {op: count}}`` for ops executed since reset_stats.

    With ``by_engine=True`` the native keys are ``"engine:op"``.
    """
    native: Counter[str] = Counter()
    fallback: Counter[str] = Counter()
    with _lock:
        records = list(_records)
    for record in records:
        if not record.calls:
            continue
        for key, n in record.native.items():
            native[key if by_engine else key.split(":", 1)[1]] += n * record.calls
        for op, n in record.fallback.items():
            fallback[op] += n * record.calls
    return {"native": dict(native), "fallback": dict(fallback)}


def summary() -> dict[str, Any]:
    cov = op_coverage()
    n_native = sum(cov["native"].values())
    n_fallback = sum(cov["fallback"].values())
    total = n_native + n_fallback
    return {"native": n_native, "fallback": n_fallback, "native_fraction": n_native / total if total else 0.0}
