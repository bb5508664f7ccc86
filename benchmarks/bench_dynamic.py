"""Varying batch: the README model called with batch 8…48 after Dynamo marks the batch dynamic,
against one static compile per size and eager, interleaved in one run.

    python -m benchmarks --only dynamic --threads 2     (or: python benchmarks/bench_dynamic.py)

Contenders, each its own compiled function (its own Dynamo cache):

- ``static``: torch.compile with the default settings, called with one size only (a static graph
  per size; the fastest a fixed shape gets: ``dynamic=False`` also patches Dynamo's config on every
  call, a few µs more, so it is the weaker baseline and not the one compared against),
- ``dynamic``: torch.compile with the default settings, warmed with every size (from the second
  size on Dynamo hands over one symbolic graph; torchburn specialises its partitions per shape),
- ``dynamic=True``: symbolic from the first call,
- ``dynamic (AOT)``: the automatic case with ``direct_inference=False`` (the AOTAutograd path the
  symbolic graph took before tb-core traced it directly),
- eager.

The row's torchburn time is ``dynamic``; notes give the others and dynamic ÷ static speed
(the issue's target: ≥ 0.95× at each size).
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.harness import fmt_time, interleaved_samples

SIZES = (8, 16, 24, 32, 48)


def _fresh(model: torch.nn.Module, name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """``lambda x: model(x)`` with a code object of its own, so each contender's Dynamo cache
    entries are its own (compiled frames are cached per code object)."""
    namespace: dict[str, Any] = {"model": model}
    exec(f"def {name}(x):\n    return model(x)\n", namespace)
    return namespace[name]  # type: ignore[no-any-return]


def _interleaved(fns: dict[str, Callable[[], Any]], repeats: int, min_time: float) -> dict[str, tuple[float, float]]:
    """(median, best) seconds per call of each function, sampled in alternation: on a machine
    shared with other work the median moves with the neighbours' load, the best sample much less."""
    return {k: (statistics.median(v), min(v)) for k, v in interleaved_samples(fns, repeats, min_time).items()}


def run(threads: int, repeats: int = 301, min_time: float = 0.0) -> list[dict[str, Any]]:
    import torchburn
    from torchburn.testing.models import readme_mlp

    torch.set_num_threads(threads)
    torch._dynamo.reset()
    model, _ = readme_mlp(batch=SIZES[0])

    def compiled(name: str, dynamic: bool | None = None, **options: Any) -> Any:
        opts = {"warn": False, **options}
        return torch.compile(_fresh(model, name), backend="torchburn", dynamic=dynamic, options=opts)

    dynamic = compiled("dynamic")
    dynamic_true = compiled("dynamic_true", dynamic=True)
    dynamic_aot = compiled("dynamic_aot", direct_inference=False)
    inputs = {b: torch.randn(b, 512) for b in SIZES}
    rows: list[dict[str, Any]] = []
    with torch.no_grad():
        for b in SIZES:  # every size once: the dynamic contenders go symbolic
            for fn in (dynamic, dynamic_true, dynamic_aot):
                fn(inputs[b])
        torchburn.reset_stats()
        for b in SIZES:
            x = inputs[b]
            static = compiled(f"static_{b}")
            contenders = {
                "eager": model,
                "static": static,
                "dynamic": dynamic,
                "dynamic_true": dynamic_true,
                "dynamic_aot": dynamic_aot,
            }
            measured = _interleaved(
                {name: functools.partial(fn, x) for name, fn in contenders.items()},
                repeats=repeats,
                min_time=min_time,  # one call a sample by default: a busy neighbour spoils single samples
            )
            times = {name: median for name, (median, _) in measured.items()}
            best = {name: low for name, (_, low) in measured.items()}
            ratio = times["static"] / times["dynamic"]
            best_ratio = best["static"] / best["dynamic"]
            rows.append(
                {
                    "suite": "dynamic",
                    "name": f"README model, varying batch (dynamic), batch {b}",
                    "engines": ",".join(torchburn.active_engines()) or "eager",
                    "threads": threads,
                    "eager_s": times["eager"],
                    "torchburn_s": times["dynamic"],
                    "static_s": times["static"],
                    "dynamic_true_s": times["dynamic_true"],
                    "dynamic_aot_s": times["dynamic_aot"],
                    "dynamic_vs_static": ratio,
                    "best_s": best,
                    "best_dynamic_vs_static": best_ratio,
                    "notes": (
                        f"static compile {fmt_time(times['static'])}: dynamic {ratio:.2f}× its speed "
                        f"(best samples {best_ratio:.2f}×); "
                        f"dynamic=True {fmt_time(times['dynamic_true'])}, "
                        f"AOT path {fmt_time(times['dynamic_aot'])}"
                    ),
                }
            )
    coverage = torchburn.op_coverage()
    fallback = sum(coverage["fallback"].values())
    for row in rows:
        row["notes"] += f"; fallback ops over the run: {fallback}"
    return rows


def render(rows: list[dict[str, Any]]) -> list[str]:
    """The page's "Varying batch" section (``python -m benchmarks`` calls it)."""
    if not rows:
        return []
    first = rows[0]
    threads = first.get("threads", "-")
    lines = [
        "",
        "## Varying batch (dynamic shapes)",
        "",
        "The README model called with batch 8…48 after Dynamo marks the batch dynamic: one symbolic graph,",
        "its partitions compiled per concrete shape behind a bounded cache (`TORCHBURN_SHAPE_CACHE_SIZE`,",
        'docs/architecture.md "Dynamic shapes"), against a static compile per size (default settings, one',
        f"size each) and eager, interleaved in one run ({threads} thread{'' if threads == 1 else 's'}, "
        f"{first.get('engines', '-')}). Target: dynamic ≥ 0.95× the static compile's speed at each size.",
        "",
        "Times are medians; the ratio is also given for the best samples, which move less with a",
        "neighbour's load on a shared machine.",
        "",
        "| batch | eager | static compile | dynamic (automatic) | dynamic ÷ static speed (best samples) "
        "| dynamic=True | dynamic, AOT path |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        batch = r["name"].rsplit(" ", 1)[-1]
        lines.append(
            f"| {batch} | {fmt_time(r.get('eager_s'))} | {fmt_time(r.get('static_s'))} | {fmt_time(r.get('torchburn_s'))} | "
            f"{r.get('dynamic_vs_static', 0):.2f}× ({r.get('best_dynamic_vs_static', 0):.2f}×) | "
            f"{fmt_time(r.get('dynamic_true_s'))} | {fmt_time(r.get('dynamic_aot_s'))} |"
        )
    return lines


if __name__ == "__main__":
    import argparse
    import json

    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=301)
    parser.add_argument("--min-time", type=float, default=0.0)
    args = parser.parse_args()
    for row in run(args.threads, args.repeats, args.min_time):
        print(json.dumps(row))
