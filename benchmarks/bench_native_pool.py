"""native_cpu thread pools A/B: eager vs native on rayon vs native on PyTorch's OpenMP team.

    python benchmarks/bench_native_pool.py --threads 2 [--repeats 7] [--only gemm,train]

The rows of ``bench_native_cpu`` and its training step, each compiled once; the engine's pool is
switched with ``_native.set_thread_pool`` between timed blocks (eager, rayon, openmp, eager, ...),
so the three share every disturbance. Reports wall and CPU-time medians per call (CPU time is
the whole process's: spinning pool threads count) and the ratios eager / native.

On a machine shared with other jobs, ``chrt -f 1 python benchmarks/bench_native_pool.py`` keeps
them from taking the cores mid-measurement (the rows then read like a quiet machine's).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.bench_native_cpu import _compile, _rows, _TrainMLP

POOLS = ("rayon", "openmp")


def _block(fn: Callable[[], Any], n: int) -> tuple[float, float]:
    w0, c0 = time.perf_counter(), time.process_time()
    for _ in range(n):
        fn()
    return (time.perf_counter() - w0) / n, (time.process_time() - c0) / n


def _interleaved(
    fns: dict[str, Callable[[], Any]], repeats: int, budget_s: float = 0.08
) -> dict[str, tuple[float, float]]:
    for fn in fns.values():
        fn()
    n = {k: max(1, min(300, int(budget_s / max(_block(f, 1)[0], 1e-6)))) for k, f in fns.items()}
    wall: dict[str, list[float]] = {k: [] for k in fns}
    cpu: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, f in fns.items():
            w, c = _block(f, n[k])
            wall[k].append(w)
            cpu[k].append(c)
    return {k: (statistics.median(wall[k]), statistics.median(cpu[k])) for k in fns}


def _on(pool: str, fn: Callable[[], Any]) -> Callable[[], Any]:
    from tb_cpu_rust import _native

    def call() -> Any:
        _native.set_thread_pool(pool)
        return fn()

    return call


def _train_step(compiled: bool) -> Callable[[], Any]:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 784, generator=g), torch.randint(0, 10, (64,), generator=g)
    torch.manual_seed(0)
    model = _TrainMLP()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    fwd = _compile(model) if compiled else model

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(fwd(x), y).backward()
        opt.step()

    return step


def run(threads: int, repeats: int, only: list[str]) -> list[dict[str, Any]]:
    os.environ.setdefault("RAYON_NUM_THREADS", str(threads))
    torch.set_num_threads(threads)
    from tb_cpu_rust import _native
    from tb_cpu_rust.threads import use_torch_openmp

    pools = [p for p in POOLS if p == "rayon" or use_torch_openmp() == "openmp"]
    default = _native.thread_pool()
    rows = []
    for name, fn, make, _, _ in _rows():
        if only and not any(o in name for o in only):
            continue
        args = make()
        with torch.no_grad():
            native = _compile(fn)
            native(*args)
            fns = {"eager": lambda fn=fn, args=args: fn(*args)}
            fns.update({p: _on(p, lambda native=native, args=args: native(*args)) for p in pools})
            rows.append({"name": name, **_interleaved(fns, repeats)})
    if not only or any("train" in o for o in only):
        native_step = _train_step(True)
        fns = {"eager": _train_step(False)}
        fns.update({p: _on(p, native_step) for p in pools})
        rows.append({"name": "train step MLP 784-512-10 b64 Adam", **_interleaved(fns, repeats)})
    _native.set_thread_pool(default)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--only", default="", help="comma list of row-name fragments (and 'train')")
    ns = parser.parse_args()
    rows = run(ns.threads, ns.repeats, [s for s in ns.only.split(",") if s])
    pools = [k for k in rows[0] if k in POOLS] if rows else []
    head = "| row | eager wall / CPU | " + " | ".join(f"{p} wall / CPU | eager/{p} wall, CPU" for p in pools) + " |"
    print(f"threads: {ns.threads} (torch {torch.get_num_threads()})")
    print(head)
    print("|" + "---|" * (2 + 2 * len(pools)))
    for r in rows:
        ew, ec = r["eager"]
        cells = [f"{ew * 1e6:.0f} / {ec * 1e6:.0f} µs"]
        for p in pools:
            w, c = r[p]
            cells += [f"{w * 1e6:.0f} / {c * 1e6:.0f} µs", f"{ew / w:.2f}× / {ec / c:.2f}×"]
        print(f"| {r['name']} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
