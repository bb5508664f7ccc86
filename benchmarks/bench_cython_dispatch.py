# ruff: noqa: B023 - every timed lambda runs inside the iteration that made it
"""tb-cython-dispatch against plain PyTorch, same process, interleaved A/B medians.

    python benchmarks/bench_cython_dispatch.py [--threads 2] [--repeats 7] [--clock wall|thread]

Each row times the same workload written against ``torch`` (A) and ``turbo_torch`` (B); the two
run alternately, round after round, and each side's figure is the median over rounds of the
per-call mean, so drift on a shared machine hits both sides alike. ``ratio`` is A/B (above 1:
turbo_torch is faster). The plan-runner row compares the ``cython_dispatch`` engine's compiled
plan with tb-core's default ``KernelProgram`` on the same plan; the cache row is the cost of one
dispatch-cache lookup (key + inline-cache hit) on its own. The MLP no_grad rows note whether the
entry decided (by timing, where tb-cpu-rust is installed) to run as one native program.

On a machine shared with other jobs, ``--threads 1 --clock thread`` times CPU time of the calling
thread instead of wall time: other jobs then barely move the figures (OpenMP threads that stall
when their core is taken make 2-thread wall-clock figures swing by 10x and more).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

import turbo_torch

Fn = Callable[[], Any]


_clock = time.perf_counter  # --clock thread: time.thread_time (CPU time of this thread, --threads 1 only)


def _per_call(fn: Fn, number: int) -> float:
    start = _clock()
    for _ in range(number):
        fn()
    return (_clock() - start) / number


def _number_for(fn: Fn, budget_s: float = 0.02) -> int:
    fn()
    n = 1
    while True:
        t = _per_call(fn, n) * n
        if t >= budget_s or n >= 1 << 20:
            return n
        n *= 2


def ab(name: str, a: Fn, b: Fn, repeats: int, threads: int, budget_s: float = 0.02) -> dict[str, Any]:
    number = max(_number_for(a, budget_s), 1)
    ta, tb = [], []
    for _ in range(repeats):
        ta.append(_per_call(a, number))
        tb.append(_per_call(b, number))
    ma, mb = statistics.median(ta), statistics.median(tb)
    return {
        "workload": name,
        "torch_us": ma * 1e6,
        "turbo_us": mb * 1e6,
        "ratio": ma / mb,
        "threads": threads,
        "calls": number,
        "rounds": repeats,
    }


def _native_entries() -> int:
    return int(turbo_torch.cache_info().get("nn.Sequential", {}).get("native", 0))


def _mlp(ns: Any) -> Any:
    torch.manual_seed(0)
    return ns.nn.Sequential(ns.nn.Linear(784, 256), ns.nn.ReLU(), ns.nn.Linear(256, 10))


def _train_step(ns: Any) -> Fn:
    torch.manual_seed(0)
    model = ns.nn.Sequential(ns.nn.Linear(784, 512), ns.nn.ReLU(), ns.nn.Linear(512, 10))
    opt = ns.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(64, 784)
    y = torch.randint(0, 10, (64,))
    loss_fn = torch.nn.functional.cross_entropy

    def step() -> None:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()

    return step


def _chain(x: torch.Tensor, ns: Any = torch) -> torch.Tensor:
    """20 elementwise ops; ``ns`` is the namespace the functions come from (torch or turbo_torch)."""
    for _ in range(5):
        x = ns.sin(x)
        x = x * 1.01
        x = x + 0.5
        x = ns.tanh(x)
    return x


def _plan_rows(repeats: int, threads: int) -> list[dict[str, Any]]:
    """The engine: its compiled plan against KernelProgram on the 20-op chain's own plan."""
    from tb_cython_dispatch.engine import compile_plan
    from tb_cython_dispatch.plugin import CythonDispatchEngine
    from torchburn.program import KernelProgram

    plans: list[Any] = []
    original = CythonDispatchEngine.compile

    def spy(self: Any, plan: Any) -> Any:
        plans.append(plan)
        return original(self, plan)

    CythonDispatchEngine.compile = spy  # type: ignore[method-assign]
    try:
        torch._dynamo.reset()
        opts: dict[str, Any] = {"engine": "cython_dispatch", "cache": False, "warn": False}
        x = torch.randn(64, 64)
        compiled = torch.compile(_chain, backend="torchburn", options=opts, dynamic=False)
        with torch.no_grad():
            compiled(x)
    finally:
        CythonDispatchEngine.compile = original  # type: ignore[method-assign]
    if not plans:
        return []
    plan = plans[0]
    runner = compile_plan(plan)
    program = KernelProgram(plan, {n.op: n.target for n in plan.nodes})
    with torch.no_grad():
        rows = [
            ab(
                f"engine: {len(plan.nodes)}-node plan, KernelProgram (A) vs Cython runner (B)",
                lambda: program(x),
                lambda: runner(x),
                repeats,
                threads,
            )
        ]
        rows.append(
            ab(
                "20-op chain: torch.compile(backend=eager) (A) vs torchburn+cython_dispatch (B)",
                _eager_compiled(x),
                lambda: compiled(x),
                repeats,
                threads,
            )
        )
    return rows


def _eager_compiled(x: torch.Tensor) -> Fn:
    fn = torch.compile(_chain, backend="eager", dynamic=False)
    fn(x)
    return lambda: fn(x)


def run(threads: int = 2, repeats: int = 7) -> list[dict[str, Any]]:
    torch.set_num_threads(threads)
    turbo_torch.set_cache_enabled(True)
    rows: list[dict[str, Any]] = []
    ref, fast = _mlp(torch), _mlp(turbo_torch)
    fast.load_state_dict(ref.state_dict())
    for batch in (1, 64):
        x = torch.randn(batch, 784)
        with torch.no_grad():
            before = _native_entries()
            rows.append(
                ab(
                    f"MLP 784-256-ReLU-10 forward, batch {batch}, no_grad",
                    lambda: ref(x),
                    lambda: fast(x),
                    repeats,
                    threads,
                )
            )
            # the entry decides by timing (tb-cpu-rust program or ATen) during its first calls
            rows[-1]["notes"] = "native entry" if _native_entries() > before else "ATen entry"
        rows.append(
            ab(
                f"MLP 784-256-ReLU-10 forward, batch {batch}, grad on",
                lambda: ref(x),
                lambda: fast(x),
                repeats,
                threads,
            )
        )
    rows.append(
        ab("train step MLP 784-512-10, batch 64, Adam", _train_step(torch), _train_step(turbo_torch), repeats, threads)
    )
    x = torch.randn(64, 64)
    with torch.no_grad():
        rows.append(
            ab(
                "20-op elementwise chain on 64x64 (eager, no_grad)",
                lambda: _chain(x, torch),
                lambda: _chain(x, turbo_torch),
                repeats,
                threads,
            )
        )
        for op in ("sin", "cos", "tanh"):  # the functions turbo_torch wraps (native where timed faster)
            ref_fn, fast_fn = getattr(torch, op), getattr(turbo_torch, op)
            rows.append(
                ab(f"torch.{op} on 64x64 (eager, no_grad)", lambda: ref_fn(x), lambda: fast_fn(x), repeats, threads)
            )
            info = turbo_torch.cache_info().get(f"torch.{op}", {})
            rows[-1]["notes"] = "native entry" if info.get("native") else "ATen entry"
    a1, b1 = torch.ones(1), torch.ones(1)
    rows.append(
        ab("lone add, 1-element tensors", lambda: torch.add(a1, b1), lambda: turbo_torch.add(a1, b1), repeats, threads)
    )
    ga, gb = torch.randn(1024, 1024), torch.randn(1024, 1024)
    lin_ref = torch.nn.Linear(1024, 1024, bias=False)
    lin_fast = turbo_torch.nn.Linear(1024, 1024, bias=False)
    lin_fast.load_state_dict(lin_ref.state_dict())
    with torch.no_grad():
        rows.append(
            ab(
                "GEMM 1024^3 (torch.mm vs turbo_torch.mm)",
                lambda: torch.mm(ga, gb),
                lambda: turbo_torch.mm(ga, gb),
                max(3, repeats // 2),
                threads,
                0.2,
            )
        )
        rows.append(
            ab(
                "Linear 1024x1024 on 1024 rows (module call)",
                lambda: lin_ref(ga),
                lambda: lin_fast(ga),
                max(3, repeats // 2),
                threads,
                0.2,
            )
        )
    rows.extend(_plan_rows(repeats, threads))
    rows.extend(_cache_rows(repeats, threads))
    return rows


def _cache_rows(repeats: int, threads: int) -> list[dict[str, Any]]:
    from tb_cython_dispatch import _dispatch, _fallback

    out = []
    x = torch.randn(8, 8)
    for core in (_dispatch, _fallback):
        site = core.Site("bench", lambda owner, key: ("entry",))
        key = core.call_key(x)
        site.lookup(None, key)
        lookup = site.lookup
        call_key = core.call_key
        per = statistics.median(_per_call(lambda: lookup(None, call_key(x)), 20000) for _ in range(repeats))
        only = statistics.median(_per_call(lambda: lookup(None, key), 20000) for _ in range(repeats))
        out.append(
            {
                "workload": f"dispatch-cache lookup ({core.IMPLEMENTATION}): key + hit / hit only",
                "torch_us": None,
                "turbo_us": per * 1e6,
                "hit_only_us": only * 1e6,
                "ratio": None,
                "threads": threads,
            }
        )
    return out


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument(
        "--clock",
        choices=("wall", "thread"),
        default="wall",
        help="thread: CPU time of the calling thread, which other jobs on a shared machine barely move "
        "(only with --threads 1: other threads' work would not be counted)",
    )
    args = parser.parse_args()
    if args.clock == "thread":
        if args.threads != 1:
            parser.error("--clock thread needs --threads 1")
        global _clock
        _clock = time.thread_time
    rows = run(args.threads, args.repeats)
    print(f"torch {torch.__version__}, threads={args.threads}, repeats={args.repeats}, clock={args.clock}")
    print(f"{'workload':<88} {'torch µs':>10} {'turbo µs':>10} {'ratio':>7}")
    for r in rows:
        extra = f"  (hit only {r['hit_only_us']:.3f} µs)" if "hit_only_us" in r else ""
        extra += f"  ({r['notes']})" if r.get("notes") else ""
        print(
            f"{r['workload']:<88} {_fmt(r['torch_us'], '10.2f')} {_fmt(r['turbo_us'], '10.3f')} {_fmt(r['ratio'], '7.2f')}{extra}"
        )


if __name__ == "__main__":
    main()
