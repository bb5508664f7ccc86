"""Shared benchmark machinery: interleaved timing, row format, report writing.

Timing is interleaved and summarised by medians, so a neighbour that takes a core for a while
slows every contender alike; only same-run ratios are reported as results. The order of the
contenders changes from round to round (``round_order``): the call right after eager PyTorch runs
with oneDNN's threads just gone idle and the caches holding eager's buffers, which cost a
convolution 10-15 % on this 2-core VM when one contender always took that place.
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


def round_order(names: list[str], r: int) -> list[str]:
    """The order of round ``r``: rotated by r, and reversed in every other cycle of rotations
    (two contenders: A B, B A, B A, A B, …; three: A B C, B C A, C A B, C B A, A C B, B A C, …),
    so each contender takes every place and follows every other one equally often."""
    n = len(names)
    if n == 0:
        return []
    shift = r % n
    order = names[shift:] + names[:shift]
    return order[::-1] if (r // n) % 2 else order


def settle(fn: Callable[[], Any], most: int = 1000) -> int:
    """Calls ``fn`` until a call runs no compiled partition whose route is still being measured
    (``torchburn.routing.measured_calls`` unchanged by it), at most ``most`` times; returns the
    calls made. A torchburn contender measures each partition against eager during its first
    calls (half of them on the eager path; up to routing.MAX_DECISION_CALLS when a close decision
    for eager is measured twice, more for a widened bf16 graph):
    timing those would report the measurement's mix,
    not the path it settles on. Every contender is called at least twice."""
    fn()  # compiles: its partitions may start measuring only from the next call
    try:
        from torchburn.routing import measured_calls
    except ImportError:
        return 1
    for calls in range(2, most + 1):
        before = measured_calls()
        fn()
        if measured_calls() == before:
            return calls
    return most


def interleaved_samples(
    fns: dict[str, Callable[[], Any]], repeats: int = 9, min_time: float = 0.02
) -> dict[str, list[float]]:
    """Every sample (seconds per call) of each function, taken in alternation, the order changing
    each round (``round_order``), after warming each up (``settle``); a sample times enough calls to last
    ``min_time`` (at least one)."""
    inner = {}
    for name, fn in fns.items():
        settle(fn)  # warm-up: compile, and let torchburn's routes finish measuring
        start = time.perf_counter()
        fn()
        one = max(time.perf_counter() - start, 1e-7)
        inner[name] = max(1, int(min_time / one))
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(repeats):
        for name in round_order(list(fns), r):
            fn = fns[name]
            n = inner[name]
            start = time.perf_counter()
            for _ in range(n):
                fn()
            samples[name].append((time.perf_counter() - start) / n)
    return samples


def faults_per_call(fn: Callable[[], Any], calls: int = 10) -> float:
    """Minor page faults the process takes per call of ``fn`` (after one untimed call).

    Eager PyTorch allocates each large intermediate afresh on every call and glibc's malloc hands
    multi-MiB blocks back to the kernel when they are freed, so the next call faults their pages
    in again; a compiled plan that reuses its buffers takes none. Where a fault is dear (some VMs:
    MobileNet block eager 17.5 ms with the default malloc, 4.9 ms with
    ``MALLOC_MMAP_THRESHOLD_=268435456 MALLOC_TRIM_THRESHOLD_=1073741824``), this count says how
    much of a speed-up over eager comes from the machine rather than from the kernels."""
    import resource

    fn()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(calls):
        fn()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / calls


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
