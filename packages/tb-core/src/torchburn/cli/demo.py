"""``torchburn demo``: compile the README model, check it against eager, time both, show coverage."""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from torchburn.cli.command import Command


def interleaved(fns: dict[str, Callable[[], Any]], repeats: int, inner: int) -> dict[str, float]:
    """Median seconds per call of each fn, measured A B A B ... so drift hits all alike."""
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(inner):
                fn()
            samples[name].append((time.perf_counter() - start) / inner)
    return {k: statistics.median(v) for k, v in samples.items()}


def run(args: argparse.Namespace) -> int:
    import torch

    import torchburn
    from torchburn.options import Options, select_engines
    from torchburn.testing.models import readme_mlp

    if args.threads:
        torch.set_num_threads(args.threads)
    model, (x,) = readme_mlp(batch=32)
    options = {"engine": args.engine} if args.engine else {}
    engines = [e.name for e in select_engines(Options.from_user(options))]
    print(f"README model: Linear(512->1024) -> ReLU -> Linear(1024->256), batch 32, {torch.get_num_threads()} threads")
    print(f"engines in force: {', '.join(engines) or 'none (everything runs in eager PyTorch)'}")
    torchburn.reset_stats()
    with torch.no_grad():
        expected = model(x)
        start = time.perf_counter()
        compiled = torch.compile(model, backend="torchburn", options=options)
        actual = compiled(x)
        first = time.perf_counter() - start
        torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)
        print(f"matches eager (assert_close rtol=atol=1e-4); first call (compile) {first * 1e3:.0f} ms")
        cov = torchburn.op_coverage()
        times = interleaved({"eager": lambda: model(x), "torchburn": lambda: compiled(x)}, args.repeats, 20)
    print(f"eager      {times['eager'] * 1e6:9.1f} us/call (median of {args.repeats})")
    print(f"torchburn  {times['torchburn'] * 1e6:9.1f} us/call  -> {times['eager'] / times['torchburn']:.2f}x eager")
    print("op coverage per call:")
    for kind in ("native", "delegated", "fallback"):
        ops = cov[kind]
        print(f"  {kind:9} " + (", ".join(f"{op}×{n}" for op, n in sorted(ops.items())) or "-"))
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", help="engine name or comma list (default: the engines in force)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    parser.add_argument("--repeats", type=int, default=7)


COMMAND = Command(
    "demo", "Compile the README model, check it against eager, print speed and op coverage.", run, add_arguments
)
