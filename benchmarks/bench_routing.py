"""Routing by measurement (torchburn.routing): small graphs against eager, and what measuring costs.

    python -m benchmarks.bench_routing [--threads 2]
    python -m benchmarks.bench_routing --models [--threads 1] [--only mlp,cnn]

For each workload (inference, direct-inference path): eager, torchburn with ``routing="off"`` (the
engine always) and torchburn with routing by measurement (the default), interleaved medians once
the measurement is over; the decision of each partition; and the cost of measuring: the first
``routing.MAX_CALLS`` calls after the compiling call, with routing on minus with it off (the same
calls run the engine or eager PyTorch, one path each), in a fresh compile each time without the
compile cache (so nothing decided earlier is reused).

``--models``: the model set of ``bench_models``, eager, torchburn with routing off and torchburn with
routing on interleaved in one run (same-run ratios: before and after routing), with each model's
decisions (a fresh compile cache, so every partition measures).
"""

from __future__ import annotations

import argparse
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from benchmarks.harness import interleaved


def _mlp_small() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10)).eval(), (torch.randn(1, 784),)


def _readme(batch: int) -> Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]:
    def build() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
        model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 256)).eval()
        return model, (torch.randn(batch, 512),)

    return build


class _Conv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(32, 32, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x))


WORKLOADS: dict[str, tuple[str, Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]]] = {
    "mlp_b1": ("MLP 784-256-10, batch 1", _mlp_small),
    "readme_b1": ("README model 512→1024→ReLU→256, batch 1", _readme(1)),
    "readme_b32": ("README model 512→1024→ReLU→256, batch 32", _readme(32)),
    "conv": ("Conv2d 32→32 3×3 + ReLU, 32×32, batch 8", lambda: (_Conv().eval(), (torch.randn(8, 32, 32, 32),))),
}


def _compile(model: nn.Module, routing: str, sink: list[Any], cache: bool = True) -> Callable[..., Any]:
    opts = {"warn": False, "routing": routing, "report_sink": sink, "cache": cache}
    return torch.compile(model, backend="torchburn", options=opts)


def _first_calls(model: nn.Module, inputs: tuple[torch.Tensor, ...], routing: str) -> float:
    """Seconds of calls 2 … MAX_CALLS + 1 of a fresh compile (call 1 compiles)."""
    from torchburn import routing as routing_module

    torch._dynamo.reset()
    fn = _compile(model, routing, [], cache=False)  # no decision from an earlier compile: this one measures
    fn(*inputs)
    start = time.perf_counter()
    for _ in range(routing_module.MAX_CALLS):
        fn(*inputs)
    return time.perf_counter() - start


def _decisions(sink: list[Any]) -> str:
    out = []
    for g in sink:
        for p in g.partitions:
            if p.route is not None and p.route.decisions:
                out.extend(d.choice for d in p.route.decisions.values())
    counts = {c: out.count(c) for c in sorted(set(out))}
    return ", ".join(f"{n} {c}" for c, n in counts.items()) or "none measured"


def _row(key: str, desc: str, model: nn.Module, inputs: tuple[torch.Tensor, ...], repeats: int) -> dict[str, Any]:
    import torchburn

    with torch.no_grad():
        # the cost of measuring, off vs on, alternated so both see the machine alike
        costs: dict[str, list[float]] = {"off": [], "measure": []}
        for _ in range(3):
            for mode in ("off", "measure"):
                costs[mode].append(_first_calls(model, inputs, mode))
        torch._dynamo.reset()
        sink: list[Any] = []
        off = _compile(model, "off", [])
        on = _compile(model, "measure", sink)
        expected = model(*inputs)
        for _ in range(40):  # past the measurement
            torch.testing.assert_close(on(*inputs), expected, rtol=1e-4, atol=1e-4)
            off(*inputs)
        times = interleaved(
            {"eager": lambda: model(*inputs), "off": lambda: off(*inputs), "measure": lambda: on(*inputs)},
            repeats=repeats,
        )
    extra = min(costs["measure"]) - min(costs["off"])
    return {
        "suite": "routing",
        "workload": key,
        "name": f"{desc} (routing by measurement)",
        "threads": torch.get_num_threads(),
        "engines": ",".join(torchburn.active_engines()) or "eager",
        "eager_s": times["eager"],
        "torchburn_s": times["measure"],
        "routing_off_s": times["off"],
        "measure_cost_s": extra,
        "notes": (
            f"routing off {times['eager'] / times['off']:.2f}× eager; decided: {_decisions(sink)}; "
            f"measuring cost {extra * 1e3:+.2f} ms over the first calls"
        ),
    }


def run(threads: int = 2, only: set[str] | None = None, repeats: int = 9) -> list[dict[str, Any]]:
    import torchburn

    warnings.filterwarnings("ignore", category=torchburn.TorchburnFallbackWarning)
    previous = torch.get_num_threads()
    rows = []
    for n in sorted({1, threads}):
        torch.set_num_threads(n)
        for key, (desc, build) in WORKLOADS.items():
            if only and key not in only:
                continue
            torch.manual_seed(0)
            model, inputs = build()
            rows.append(_row(key, desc, model, inputs, repeats))
    torch.set_num_threads(previous)
    return rows


def _model_row(key: str, model: nn.Module, inputs: tuple[torch.Tensor, ...], repeats: int) -> dict[str, Any]:
    torch._dynamo.reset()
    sink: list[Any] = []
    with torch.no_grad():
        off = _compile(model, "off", [], cache=False)
        on = _compile(model, "measure", sink, cache=False)
        expected = model(*inputs)
        for _ in range(30):  # past the measurement
            torch.testing.assert_close(on(*inputs), expected, rtol=1e-3, atol=1e-3)
        torch.testing.assert_close(off(*inputs), expected, rtol=1e-3, atol=1e-3)
        times = interleaved(
            {"eager": lambda: model(*inputs), "off": lambda: off(*inputs), "on": lambda: on(*inputs)},
            repeats=repeats,
        )
    return {
        "model": key,
        "threads": torch.get_num_threads(),
        "eager_s": times["eager"],
        "off": times["eager"] / times["off"],
        "on": times["eager"] / times["on"],
        "decided": _decisions(sink),
    }


def models(threads: int = 1, only: set[str] | None = None, repeats: int = 7) -> list[dict[str, Any]]:
    """The model set, routing off vs on, in one interleaved run per model and thread count."""
    import torchburn
    from benchmarks.bench_models import MODELS

    warnings.filterwarnings("ignore", category=torchburn.TorchburnFallbackWarning)
    rows = []
    previous = torch.get_num_threads()
    for key, (_desc, build) in MODELS.items():
        if only and key not in only:
            continue
        torch.manual_seed(0)
        model, inputs = build()
        for n in sorted({1, threads}):
            torch.set_num_threads(n)
            rows.append(_model_row(key, model, inputs, repeats))
    torch.set_num_threads(previous)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", default=None, help="comma list of: " + ",".join(WORKLOADS))
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--models", action="store_true", help="the model set, routing off vs on")
    args = ap.parse_args()
    if args.models:
        import math
        import statistics

        rows = models(args.threads, set(args.only.split(",")) if args.only else None, args.repeats)
        for r in rows:
            print(
                f"{r['model']:<18} {r['threads']}t  eager {r['eager_s'] * 1e3:8.3f} ms  routing off {r['off']:.2f}×  "
                f"routing on {r['on']:.2f}×  decided: {r['decided']}"
            )
        for n in sorted({r["threads"] for r in rows}):
            sel = [r for r in rows if r["threads"] == n]
            geo = {k: math.exp(statistics.fmean(math.log(r[k]) for r in sel)) for k in ("off", "on")}
            print(f"geomean {n}t over {len(sel)} models: routing off {geo['off']:.2f}×, routing on {geo['on']:.2f}×")
        return
    for r in run(args.threads, set(args.only.split(",")) if args.only else None, args.repeats):
        print(
            f"{r['workload']:<11} {r['threads']}t  eager {r['eager_s'] * 1e6:9.1f} µs  "
            f"routed {r['eager_s'] / r['torchburn_s']:.2f}×  off {r['eager_s'] / r['routing_off_s']:.2f}×  "
            f"measuring {r['measure_cost_s'] * 1e3:+.3f} ms  ({r['notes']})"
        )


if __name__ == "__main__":
    main()
