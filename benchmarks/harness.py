"""Shared benchmark machinery: interleaved timing, row format, report writing.

Timing is interleaved (A B A B ...) and summarised by medians, so a neighbour that takes a core
for a while slows every contender alike; only same-run ratios are reported as results.
"""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any


def interleaved(fns: dict[str, Callable[[], Any]], repeats: int = 9, min_time: float = 0.02) -> dict[str, float]:
    """Median seconds per call of each function, measured in alternation."""
    return {k: statistics.median(v) for k, v in interleaved_samples(fns, repeats, min_time).items()}


def interleaved_samples(
    fns: dict[str, Callable[[], Any]], repeats: int = 9, min_time: float = 0.02
) -> dict[str, list[float]]:
    """Every sample (seconds per call) of each function, taken in alternation (A B C … A B C …)
    after one warm-up call; a sample times enough calls to last ``min_time`` (at least one)."""
    inner = {}
    for name, fn in fns.items():
        fn()  # warm-up (and compile)
        start = time.perf_counter()
        fn()
        one = max(time.perf_counter() - start, 1e-7)
        inner[name] = max(1, int(min_time / one))
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            n = inner[name]
            start = time.perf_counter()
            for _ in range(n):
                fn()
            samples[name].append((time.perf_counter() - start) / n)
    return samples


def first_call(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def machine() -> dict[str, Any]:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {
        "date": datetime.date.today().isoformat(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }


def fmt_time(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} µs"
