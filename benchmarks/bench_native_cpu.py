"""native_cpu benchmark rows (issue 3): interleaved A/B medians against torch eager.

    python benchmarks/bench_native_cpu.py --threads 2 [--inductor] [--repeats 7]

Each row compiles the function with ``torch.compile(backend="torchburn", options={"engine":
"native_cpu"})``, checks the result against eager, then alternates blocks of eager and native
calls and reports the medians, the ratio eager/native (higher is better), GFLOP/s and GB/s.
Only ratios from the same run mean anything on a shared machine. GEMM rows also time both GEMM
crates the engine carries, and numpy's OpenBLAS (in its own process) as the reference.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F


def _time_block(fn: Callable[[], Any], n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


def _interleaved(a: Callable[[], Any], b: Callable[[], Any], repeats: int, budget_s: float = 0.15) -> tuple[float, float]:
    a(), b()
    once = max(_time_block(a, 1), 1e-6)
    n = max(1, min(200, int(budget_s / once)))
    ta, tb = [], []
    for _ in range(repeats):
        ta.append(_time_block(a, n))
        tb.append(_time_block(b, n))
    return statistics.median(ta), statistics.median(tb)


def _compile(fn: Callable[..., Any], engine: str = "native_cpu") -> Callable[..., Any]:
    torch._dynamo.reset()
    return torch.compile(fn, backend="torchburn", options={"engine": engine, "warn": False, "fallback": "error"}, dynamic=False)


def _openblas_gflops(n: int, threads: int) -> float | None:
    """numpy's OpenBLAS in a child process, with the OpenBLAS tuning variables unset for it only."""
    code = (
        "import numpy as np, time, statistics\n"
        f"n={n}\n"
        "a=np.random.rand(n,n).astype(np.float32); b=np.random.rand(n,n).astype(np.float32)\n"
        "a@b\n"
        "ts=[]\n"
        "for _ in range(7):\n"
        "    t=time.perf_counter(); k=max(1,int(0.2/max(1e-6,(lambda s:(a@b, time.perf_counter()-s)[1])(time.perf_counter()))))\n"
        "    t=time.perf_counter()\n"
        "    for _ in range(k): a@b\n"
        "    ts.append((time.perf_counter()-t)/k)\n"
        "print(2*n**3/statistics.median(ts)/1e9)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    env["OPENBLAS_NUM_THREADS"] = str(threads)
    try:
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=True)
        return float(out.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError):
        return None


def _chain20(x: torch.Tensor) -> torch.Tensor:
    y = x
    for i in range(5):
        y = torch.sigmoid(y * 1.01 + 0.1 * i)
        y = torch.tanh(y - 0.2) * x
    return y


class _ReadmeLike(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(512, 1024)
        self.fc2 = torch.nn.Linear(1024, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def _rows() -> list[tuple[str, Callable[..., Any], Callable[[], tuple[Any, ...]], float, float]]:
    """(name, fn, make_inputs, flops, bytes)."""
    g = torch.Generator().manual_seed(0)

    def r(*s: int) -> torch.Tensor:
        return torch.randn(*s, generator=g)

    lin = torch.nn.Linear(512, 1024).eval()
    mlp = _ReadmeLike().eval()
    return [
        ("gemm 1024^3", torch.mm, lambda: (r(1024, 1024), r(1024, 1024)), 2 * 1024**3, 3 * 4 * 1024**2),
        ("gemm 256^3", torch.mm, lambda: (r(256, 256), r(256, 256)), 2 * 256**3, 3 * 4 * 256**2),
        ("gelu 1024^2", F.gelu, lambda: (r(1024, 1024),), 0, 2 * 4 * 1024**2),
        ("sdpa B4 H8 T128 D64", F.scaled_dot_product_attention, lambda: (r(4, 8, 128, 64), r(4, 8, 128, 64), r(4, 8, 128, 64)), 4 * 4 * 8 * 128 * 128 * 64, 4 * 4 * 4 * 8 * 128 * 64),
        ("linear 512->1024 + relu, 128x512", lambda x: torch.relu(lin(x)), lambda: (r(128, 512),), 2 * 128 * 512 * 1024, 4 * (128 * 512 + 512 * 1024 + 128 * 1024)),
        ("softmax 2048^2", lambda x: torch.softmax(x, -1), lambda: (r(2048, 2048),), 0, 2 * 4 * 2048**2),
        ("gelu(x*w+b)*sigmoid(x)+x 1024^2", lambda x, w, b: F.gelu(x * w + b) * torch.sigmoid(x) + x, lambda: (r(1024, 1024), r(1024), r(1024)), 0, 2 * 4 * 1024**2),
        ("20-op chain 64x64", _chain20, lambda: (r(64, 64),), 0, 2 * 4 * 64 * 64),
        ("README MLP batch 32", mlp, lambda: (r(32, 512),), 2 * 32 * (512 * 1024 + 1024 * 256), 4 * (512 * 1024 + 1024 * 256)),
    ]


def run(threads: int, repeats: int = 5, inductor: bool = False, gemm_backends: bool = True) -> list[dict[str, Any]]:
    """Measure every row; returns one dict per row (times in seconds)."""
    os.environ.setdefault("RAYON_NUM_THREADS", str(threads))
    torch.set_num_threads(threads)
    from tb_cpu_rust import _native

    results = []
    for name, fn, make, flops, nbytes in _rows():
        args = make()
        with torch.no_grad():
            expected = fn(*args)
            t0 = time.perf_counter()
            native = _compile(fn)
            got = native(*args)
            first = time.perf_counter() - t0
            torch.testing.assert_close(got, expected, rtol=1e-3, atol=1e-3)
            t_eager, t_native = _interleaved(lambda: fn(*args), lambda: native(*args), repeats)
            row: dict[str, Any] = {
                "row": name,
                "threads": threads,
                "native_threads": _native.num_threads(),
                "eager_s": t_eager,
                "native_s": t_native,
                "ratio": t_eager / t_native,
                "native_first_call_s": first,
                "gemm_backend": _native.gemm_backend(),
            }
            if flops:
                row["eager_gflops"] = flops / t_eager / 1e9
                row["native_gflops"] = flops / t_native / 1e9
            row["native_gbps"] = nbytes / t_native / 1e9
            if gemm_backends and name.startswith("gemm"):
                before = _native.gemm_backend()
                for be in ("gemm", "matrixmultiply"):
                    _native.set_gemm_backend(be)
                    _, t_be = _interleaved(lambda: fn(*args), lambda: native(*args), max(3, repeats // 2))
                    row[f"{be}_gflops"] = flops / t_be / 1e9
                _native.set_gemm_backend(before)
                n = int(name.split()[1].split("^")[0])
                row["openblas_gflops"] = _openblas_gflops(n, threads)
            if inductor:
                torch._dynamo.reset()
                t0 = time.perf_counter()
                ind = torch.compile(fn, backend="inductor", dynamic=False)
                ind(*args)
                row["inductor_first_call_s"] = time.perf_counter() - t0
                _, t_ind = _interleaved(lambda: fn(*args), lambda: ind(*args), repeats)
                row["inductor_s"] = t_ind
        results.append(row)
    return results


def _fmt(results: list[dict[str, Any]]) -> str:
    lines = ["| row | eager | native | eager/native | native GFLOP/s | native GB/s | first call | extra |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        extra = []
        for k in ("gemm_gflops", "matrixmultiply_gflops", "openblas_gflops", "inductor_first_call_s", "inductor_s"):
            if r.get(k) is not None:
                extra.append(f"{k}={r[k]:.4g}")
        gf = f"{r['native_gflops']:.1f}" if "native_gflops" in r else ""
        lines.append(
            f"| {r['row']} | {r['eager_s'] * 1e6:.0f} µs | {r['native_s'] * 1e6:.0f} µs | {r['ratio']:.2f}× | {gf} | "
            f"{r['native_gbps']:.1f} | {r['native_first_call_s'] * 1e3:.0f} ms | {' '.join(extra)} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--inductor", action="store_true")
    parser.add_argument("--json", action="store_true")
    ns = parser.parse_args()
    results = run(ns.threads, ns.repeats, ns.inductor)
    print(json.dumps(results, indent=1) if ns.json else _fmt(results))


if __name__ == "__main__":
    main()
