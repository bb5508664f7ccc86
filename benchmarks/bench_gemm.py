"""f32 GEMM on native_cpu against eager (MKL) and inductor, at the shapes models use, one process.

    python benchmarks/bench_gemm.py [--threads 1] [--shapes 1024x1024x1024,64x784x512] [--rounds 9]

Each shape (m x k x n) runs two graphs, each compiled on native_cpu and on inductor and run eager,
interleaved in blocks (eager, native, inductor, eager, ...), medians:

- ``mm``: ``a @ b`` with ``b`` a row-major k x n tensor (``aten.mm``);
- ``linear``: ``F.linear(a, w, bias)`` with ``w`` a row-major n x k weight, which a compiled graph
  turns into ``aten.addmm(bias, a, permute(w))``: B is the transposed view of the weight.

With ``--kernel`` the same products run as one ``gemm`` step through the native executor
(``_native.Executor`` on a hand-written plan) against ``torch.mm`` / ``torch.addmm`` with ``out=``:
the kernels alone, without Dynamo's and the compiled wrapper's per-call cost.

Printed per row: milliseconds, GFLOP/s and fraction of the FMA peak for each contender, and
eager/native and inductor/native ratios (> 1: native faster). The peak is measured in the same run by native_cpu's FMA probe
(``_native.fma_peak_gflops``, as ``bench_native_cpu``), or ``--peak``: on the 2-core Sapphire
Rapids development machine it measures 213 GFLOP/s on one thread and 408 on two. Compiled calls
include Dynamo's per-call cost (~10-20 µs), which is most of a call below ~50 µs.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.bench_native_cpu import _peak_gflops
from benchmarks.harness import interleaved

#: 1024^3 and 256^3, the MNIST MLP's layers at batch 64, the transformer's (d=256, seq 64 x batch 4)
#: projections, and batch-1 / small-batch inference of a 784->512 layer.
DEFAULT_SHAPES = (
    "1024x1024x1024,256x256x256,64x784x512,64x512x256,64x256x10,256x256x256,256x256x1024,"
    "256x1024x256,1x784x512,4x784x512,16x784x512,32x1024x256"
)


def _row(shape: str, threads: int, rounds: int, inductor: bool) -> list[str]:
    import torch
    import torch.nn.functional as F

    m, k, n = (int(v) for v in shape.split("x"))
    a, b = torch.randn(m, k), torch.randn(k, n)
    w, bias = torch.randn(n, k), torch.randn(n)
    flops = 2 * m * n * k
    peak = PEAK or _peak_gflops(threads)
    opts: dict[str, str | int | bool | Callable[..., Any]] = {
        "engine": "native_cpu",
        "warn": False,
        "fallback": "error",
        "min_partition_size": 1,
    }
    graphs: dict[str, tuple[Callable[..., Any], tuple[torch.Tensor, ...]]] = {
        "mm": (lambda x, y: x @ y, (a, b)),
        "linear": (lambda x, y, z: F.linear(x, y, z), (a, w, bias)),
    }
    out = []
    for kind, (fn, args) in graphs.items():
        torch._dynamo.reset()
        native = torch.compile(fn, backend="torchburn", options=opts, dynamic=False)
        torch.testing.assert_close(native(*args), fn(*args), rtol=1e-4, atol=1e-3)
        cands: dict[str, Callable[[], object]] = {"eager": partial(fn, *args), "native": partial(native, *args)}
        if inductor:
            cands["inductor"] = partial(torch.compile(fn, backend="inductor", dynamic=False), *args)
        with torch.no_grad():
            times = interleaved(cands, repeats=rounds, min_time=0.05)
        cols = "  ".join(
            f"{c} {t * 1e3:.3f} ms {flops / t / 1e9:.1f} GF/s ({flops / t / 1e9 / peak:.0%})" for c, t in times.items()
        )
        ratios = f"eager/native {times['eager'] / times['native']:.2f}x"
        if inductor:
            ratios += f"  inductor/native {times['inductor'] / times['native']:.2f}x"
        out.append(f"{shape:>16} {kind:<6}  {ratios}  |  {cols}")
    return out


#: GFLOP/s the fractions are of (``--peak``; 0: ``_peak_gflops``)
PEAK = 0.0


def _gemm_plan(ins: list[Any], out: Any, beta: float) -> str:
    """One ``gemm`` step, out = a @ b (+ beta * bias broadcast over rows when a third input is given)."""
    import json

    def desc(t: Any, kind: str) -> dict[str, Any]:
        return {"kind": kind, "dtype": "float32", "numel": 0, "sizes": list(t.shape), "strides": list(t.stride())}

    buffers = [desc(t, "input") for t in ins] + [dict(desc(out, "output"), numel=out.numel())]
    values = [{"buf": i, "offset": 0, "sizes": d["sizes"], "strides": d["strides"]} for i, d in enumerate(buffers)]
    bias = None
    if len(ins) == 3:
        bias = len(values)
        values.append({"buf": 2, "offset": 0, "sizes": list(out.shape), "strides": [0, 1]})
    step = {"op": "gemm", "ins": [0, 1, bias, None], "outs": [len(ins)], "alpha": 1.0, "beta": beta, "epilogue": []}
    from tb_cpu_rust import _native

    return json.dumps({"schema": _native.STEP_SCHEMA_VERSION, "buffers": buffers, "values": values, "steps": [step]})


def _kernel_row(shape: str, threads: int, rounds: int) -> list[str]:
    import torch

    from tb_cpu_rust import _native

    m, k, n = (int(v) for v in shape.split("x"))
    a, b = torch.randn(m, k), torch.randn(k, n)
    w, bias = torch.randn(n, k), torch.randn(n)
    out = torch.empty(m, n)
    flops = 2 * m * n * k
    peak = PEAK or _peak_gflops(threads)
    cases: dict[str, tuple[list[torch.Tensor], Callable[[], object]]] = {
        "mm": ([a, b], partial(torch.mm, a, b, out=out)),
        "linear": ([a, w.t(), bias], partial(torch.addmm, bias, a, w.t(), out=out)),
    }
    lines = []
    for kind, (ins, eager) in cases.items():
        ex = _native.Executor(_gemm_plan(ins, out, 1.0))
        want = eager()
        got = torch.empty_like(out)
        ex.run(ins, [got])
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-3)
        times = interleaved({"eager": eager, "native": partial(ex.run, ins, [out])}, repeats=rounds, min_time=0.05)
        cols = "  ".join(
            f"{c} {t * 1e3:.3f} ms {flops / t / 1e9:.1f} GF/s ({flops / t / 1e9 / peak:.0%})" for c, t in times.items()
        )
        lines.append(f"{shape:>16} {kind:<6}  eager/native {times['eager'] / times['native']:.2f}x  |  {cols}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--shapes", default=DEFAULT_SHAPES)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--no-inductor", action="store_true", help="leave inductor out (its compiles take a while)")
    ap.add_argument("--kernel", action="store_true", help="the gemm step alone through the executor (no Dynamo)")
    ap.add_argument("--peak", type=float, default=0.0, help="measured FMA peak (GFLOP/s) for the fractions")
    args = ap.parse_args()
    global PEAK
    PEAK = args.peak
    os.environ.setdefault("RAYON_NUM_THREADS", str(args.threads))
    import torch

    import torchburn  # noqa: F401  (registers the backend)
    from tb_cpu_rust import _native

    torch.set_num_threads(args.threads)
    print(
        f"{args.threads} thread(s), medians of {args.rounds} interleaved rounds, "
        f"own GEMM backend {_native.gemm_backend()}, peak {PEAK or _peak_gflops(args.threads):.0f} GFLOP/s"
    )
    if args.kernel:
        from tb_cpu_rust.threads import use_torch_openmp

        use_torch_openmp()  # the executor's loops on torch's OpenMP team, as in a compiled graph
    for shape in args.shapes.split(","):
        rows = (
            _kernel_row(shape, args.threads, args.rounds)
            if args.kernel
            else _row(shape, args.threads, args.rounds, not args.no_inductor)
        )
        for line in rows:
            print(line, flush=True)


if __name__ == "__main__":
    main()
