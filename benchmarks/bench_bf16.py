"""bfloat16 rows: the README model, small_cnn, transformer_layer and transformers of the model set
(bench_models: Llama, GPT-2) converted to bfloat16, and the float32 README model under
``torch.autocast("cpu", dtype=torch.bfloat16)``, through the torchburn backend against eager in the
same dtype (and inductor on the README rows), interleaved in one run.

The torchburn column is the default path: bfloat16 graphs computed in float32 between casts at
eager's rounding points (torchburn.low_precision), native_cpu's GEMMs reading and writing the
bfloat16 buffers themselves, or the graph as traced in eager PyTorch where that measured faster in
the first calls (torchburn.low_precision_route); the notes column says how many ops fell back to
eager and how many were routed to eager by measurement (the graph as traced counts as routed).

    python -m benchmarks.bench_bf16 [--threads 2] [--models llama,gpt2]
    python -m benchmarks.bench_bf16 --gemm [--threads 1]   # single bfloat16 Linear layers
"""

from __future__ import annotations

import contextlib
import math
import statistics
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.harness import first_call, interleaved, settle

BF16 = torch.bfloat16


def _row(
    name: str, threads: int, times: dict[str, float], first: float, fallback: int, routed: int, **extra: Any
) -> dict[str, Any]:
    import torchburn

    return {
        "suite": "bf16",
        "name": name,
        "engines": ",".join(torchburn.active_engines()) or "eager",
        "threads": threads,
        "eager_s": times["eager"],
        "torchburn_s": times["torchburn"],
        "inductor_s": times.get("inductor"),
        "torchburn_first_s": first,
        "fallback": fallback,
        "notes": f"{fallback} fallback ops, {routed} ops routed to eager by measurement",
        **extra,
    }


def _case(
    model: torch.nn.Module, args: tuple[Any, ...], autocast: bool, inductor: bool
) -> tuple[dict[str, float], float, int, int]:
    import torchburn

    ctx: Callable[[], Any] = (lambda: torch.autocast("cpu", dtype=BF16)) if autocast else contextlib.nullcontext

    def call(fn: Callable[..., Any]) -> Callable[[], Any]:
        def go() -> Any:
            with ctx():
                return fn(*args)

        return go

    with torch.no_grad():
        torch._dynamo.reset()
        torchburn.reset_stats()
        tb = torch.compile(model, backend="torchburn", options={"warn": False})
        first = first_call(call(tb))
        cov = torchburn.op_coverage()
        # routing by measurement decides first (a user's steady state): the partitions, then the
        # widened graph against the graph as traced
        settle(call(tb))
        torchburn.reset_stats()
        call(tb)()
        cov["routed"] = torchburn.op_coverage().get("routed", {})
        fns = {"eager": call(model), "torchburn": call(tb)}
        if inductor:
            fns["inductor"] = call(torch.compile(model))
        times = interleaved(fns, repeats=15)
    return times, first, sum(cov["fallback"].values()), sum(cov["routed"].values())


def run(threads: int, models: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    """The bfloat16 rows at 1 thread and at ``threads``: README model, small CNN and transformer
    layer, then each model of the model set (``models``: keys of bench_models.MODELS, default all
    of them) converted to bfloat16 and in float32 under autocast."""
    from benchmarks.bench_models import MODELS

    if models is None:
        models = tuple(MODELS)
    rows = []
    for n in sorted({1, threads}):
        rows += _rows_at(n, models)
    torch.set_num_threads(threads)
    return rows


def _rows_at(threads: int, models: tuple[str, ...]) -> list[dict[str, Any]]:
    from benchmarks.bench_models import MODELS
    from torchburn.testing.models import readme_mlp, small_cnn, transformer_layer

    torch.set_num_threads(threads)
    rows = []
    for batch in (32, 1):
        model, (x,) = readme_mlp(batch=batch)
        times, first, fb, rt = _case(model.to(BF16), (x.to(BF16),), autocast=False, inductor=True)
        rows.append(_row(f"README model bf16 (.to(bfloat16)), batch {batch}", threads, times, first, fb, rt))
        model, (x,) = readme_mlp(batch=batch)
        times, first, fb, rt = _case(model, (x,), autocast=True, inductor=True)
        rows.append(_row(f"README model under autocast bf16, batch {batch}", threads, times, first, fb, rt))
    for name, factory in (("small CNN", small_cnn), ("transformer layer", transformer_layer)):
        model, args = factory()
        times, first, fb, rt = _case(model.to(BF16), tuple(a.to(BF16) for a in args), autocast=False, inductor=False)
        rows.append(_row(f"{name} bf16 (.to(bfloat16))", threads, times, first, fb, rt))
    for key in models:
        desc, build = MODELS[key]
        torch.manual_seed(0)
        model, args = build()
        low = tuple(a.to(BF16) if a.is_floating_point() else a for a in args)
        times, first, fb, rt = _case(model.to(BF16), low, autocast=False, inductor=False)
        rows.append(_row(f"{desc} bf16 (.to(bfloat16))", threads, times, first, fb, rt, model=key))
        torch.manual_seed(0)
        model, args = build()
        times, first, fb, rt = _case(model, args, autocast=True, inductor=False)
        rows.append(_row(f"{desc} under autocast bf16", threads, times, first, fb, rt, model=key))
    return rows


def render(rows: list[dict[str, Any]]) -> list[str]:
    """The bfloat16 section of docs/benchmarks.md: per thread count, the geometric mean of the
    speed-ups over eager bfloat16 and the rows below 1.0×."""
    lines = ["", "## bfloat16: geometric means", ""]
    lines += ["Against eager PyTorch in the same dtype (the rows above; model set converted with"]
    lines += ["`.to(bfloat16)` and in float32 under `torch.autocast`)."]
    lines += ["", "| threads | rows | torchburn vs eager bf16 | fallback ops | below 1.0× eager |"]
    lines += ["| --- | --- | --- | --- | --- |"]
    for n in sorted({r["threads"] for r in rows}):
        sel = [r for r in rows if r["threads"] == n]
        geo = math.exp(statistics.fmean(math.log(r["eager_s"] / r["torchburn_s"]) for r in sel))
        fallback = sum(r.get("fallback", 0) for r in sel)
        slow = [f"{r['name']} {r['eager_s'] / r['torchburn_s']:.2f}×" for r in sel if r["eager_s"] < r["torchburn_s"]]
        lines.append(f"| {n} | {len(sel)} | {geo:.2f}× | {fallback} | {'; '.join(slow) or 'none'} |")
    return lines


#: (rows, in_features, out_features) of the single bfloat16 Linear layers ``--gemm`` times
GEMM_SHAPES = ((1, 512, 1024), (32, 512, 1024), (32, 1024, 256), (256, 1024, 1024))


def _pair(eager: Callable[..., Any], compiled: Callable[..., Any], x: torch.Tensor) -> dict[str, float]:
    with torch.no_grad():
        return interleaved({"eager": lambda: eager(x), "torchburn": lambda: compiled(x)}, repeats=15)


def gemm_rows(threads: int) -> list[str]:
    """One bfloat16 ``Linear`` (no bias) per shape, eager against torchburn, interleaved: the
    GEMM's own speed (GFLOP/s) beside oneDNN's."""
    import torchburn

    torch.set_num_threads(threads)
    out = []
    for m, k, n in GEMM_SHAPES:
        torch.manual_seed(0)
        lin = torch.nn.Linear(k, n, bias=False).to(BF16).eval()
        x = torch.randn(m, k).to(BF16)
        torch._dynamo.reset()
        tb = torch.compile(lin, backend="torchburn", options={"warn": False, "low_precision": True})
        times = _pair(lin, tb, x)
        flop = 2 * m * k * n
        out.append(
            f"bf16 Linear {m}x{k}->{n}: eager {times['eager'] * 1e6:.0f} µs ({flop / times['eager'] / 1e9:.0f} GFLOP/s), "
            f"torchburn {times['torchburn'] * 1e6:.0f} µs ({flop / times['torchburn'] / 1e9:.0f} GFLOP/s), "
            f"{times['eager'] / times['torchburn']:.2f}x; engines {','.join(torchburn.active_engines())}; threads {threads}"
        )
    return out


def main() -> None:
    import argparse

    from benchmarks.harness import fmt_time

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--models", default=None, help="comma list of bench_models keys (default: all)")
    parser.add_argument("--gemm", action="store_true", help="time single bfloat16 Linear layers instead")
    a = parser.parse_args()
    if a.gemm:
        print("\n".join(gemm_rows(a.threads)))
        return
    for r in run(a.threads, tuple(m for m in a.models.split(",") if m) if a.models else None):
        ratio = r["eager_s"] / r["torchburn_s"]
        ind = f", inductor {fmt_time(r['inductor_s'])}" if r["inductor_s"] else ""
        print(
            f"{r['name']}: eager {fmt_time(r['eager_s'])}, torchburn {fmt_time(r['torchburn_s'])} "
            f"({ratio:.2f}× eager){ind}; {r['notes']}; threads {r['threads']}"
        )


if __name__ == "__main__":
    main()
