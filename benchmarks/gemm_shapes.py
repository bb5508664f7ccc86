"""Own GEMM against torch eager and numpy's OpenBLAS at the shapes models use, one process.

    python benchmarks/gemm_shapes.py [--threads 1] [--shapes 128x512x1024,64x784x512]

Each shape (m x k x n) runs `a @ b` and `F.linear(a, w)` (w = b.T stored row-major, as a
Linear's weight) compiled on native_cpu, the same two in eager, and numpy's `a @ b` /
`a @ w.T`, interleaved in blocks (A B C ...), and prints the median GFLOP/s of each. With more
than one thread the OpenBLAS columns are left out: its spinning threads and PyTorch's OpenMP team
would share the cores (the suite measures OpenBLAS in its own process for that reason).
Compiled calls include Dynamo's per-call cost (~20 µs), which matters below ~1 ms.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import interleaved


def _measure(shape: str, threads: int, rounds: int, mm: Callable, lin: Callable) -> str:
    import torch
    import torch.nn.functional as F

    m, k, n = (int(v) for v in shape.split("x"))
    a, b = torch.randn(m, k), torch.randn(k, n)
    w = b.t().contiguous()
    an, bn, wn = a.numpy(), b.numpy(), w.numpy()
    torch.testing.assert_close(mm(a, b), a @ b, rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(lin(a, w), F.linear(a, w), rtol=1e-4, atol=1e-3)
    cands: dict[str, Callable[[], object]] = {
        "eager mm": lambda: a @ b,
        "native mm": lambda: mm(a, b),
        "eager linear": lambda: F.linear(a, w),
        "native linear": lambda: lin(a, w),
    }
    if threads == 1:
        cands["OpenBLAS a@b"] = lambda: an @ bn
        cands["OpenBLAS a@w.T"] = lambda: an @ wn.T
    flops = 2 * m * n * k
    times = interleaved(cands, repeats=rounds, min_time=0.05)
    cols = "  ".join(f"{c} {flops / t / 1e9:.1f}" for c, t in times.items())
    return f"{shape}: {cols}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--shapes", default="1024x1024x1024,256x256x256,128x512x1024,64x784x512,32x1024x256")
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)  # before numpy loads OpenBLAS
    import torch
    import torch.nn.functional as F

    import torchburn  # noqa: F401  (registers the backend)

    torch.set_num_threads(args.threads)
    opts = {"engine": "native_cpu", "warn": False, "fallback": "error", "min_partition_size": 1}
    mm = torch.compile(lambda a, b: a @ b, backend="torchburn", options=opts, dynamic=False)
    lin = torch.compile(lambda a, w: F.linear(a, w), backend="torchburn", options=opts, dynamic=False)
    print(f"GFLOP/s, {args.threads} thread(s), medians of {args.rounds} interleaved rounds")
    for shape in args.shapes.split(","):
        print(_measure(shape, args.threads, args.rounds, mm, lin), flush=True)


if __name__ == "__main__":
    main()
