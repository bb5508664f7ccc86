"""native_cpu benchmark rows (issue 3): interleaved A/B medians against torch eager.

    python benchmarks/bench_native_cpu.py --threads 2 [--no-inductor] [--repeats 7]

Each row compiles the function with ``torch.compile(backend="torchburn", options={"engine":
"native_cpu"})``, checks the result against eager, then alternates blocks of eager and native
calls and reports the medians, the ratio eager/native (higher is better), GFLOP/s and GB/s.
Only ratios from the same run mean anything on a shared machine. GEMM rows also time both GEMM
crates the engine carries, and numpy's OpenBLAS (in its own process) as the reference. Inductor
(``backend="inductor"``) is compiled and timed on every row in the same run (its own A/B against
eager), with its first call, so the first-call target (native ≤ 25% of inductor's) is measured;
``--no-inductor`` skips it (inductor needs a C++ compiler). Both backends compile a throwaway
function before the rows, so no row's first call carries the one-time imports; each row also
notes the first call of Dynamo alone (a backend that returns Dynamo's graph unchanged), the part
of every backend's first call that no backend can remove.
"""

from __future__ import annotations

import argparse
import contextlib
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

from benchmarks.harness import settle


def _time_block(fn: Callable[[], Any], n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


def _interleaved(
    a: Callable[[], Any], b: Callable[[], Any], repeats: int, budget_s: float = 0.15
) -> tuple[float, float]:
    """Medians of alternating timed blocks of ``a`` and ``b`` (A B A B ...)."""
    a(), b()
    once = max(_time_block(a, 1), _time_block(b, 1), 1e-6)
    n = max(1, min(200, int(budget_s / once)))
    ta, tb = [], []
    for _ in range(repeats):
        ta.append(_time_block(a, n))
        tb.append(_time_block(b, n))
    return statistics.median(ta), statistics.median(tb)


def _compile(fn: Callable[..., Any], engine: str = "native_cpu") -> Callable[..., Any]:
    """torchburn on ``engine``; min_partition_size=1 so a row of one elementwise op (GELU) runs
    natively: by default tb-core keeps a lone cheap op eager, and the row would time eager."""
    torch._dynamo.reset()
    options = {"engine": engine, "warn": False, "fallback": "error", "min_partition_size": 1}
    return torch.compile(fn, backend="torchburn", options=options, dynamic=False)


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
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=True
        )
        return float(out.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError):
        return None


def _chain20(x: torch.Tensor) -> torch.Tensor:
    y = x
    for i in range(5):
        y = torch.sigmoid(y * 1.01 + 0.1 * i)
        y = torch.tanh(y - 0.2) * x
    return y


def _chain6(x: torch.Tensor) -> torch.Tensor:
    return ((((x * 0.5 + 1.0) * 0.7) + 0.3) * 1.1 + 2.0) * 0.9


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
    small = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)).eval()
    return [
        ("gemm 1024^3", torch.mm, lambda: (r(1024, 1024), r(1024, 1024)), 2 * 1024**3, 3 * 4 * 1024**2),
        ("gemm 256^3", torch.mm, lambda: (r(256, 256), r(256, 256)), 2 * 256**3, 3 * 4 * 256**2),
        ("gelu 1024^2", F.gelu, lambda: (r(1024, 1024),), 0, 2 * 4 * 1024**2),
        (
            "sdpa B4 H8 T128 D64",
            F.scaled_dot_product_attention,
            lambda: (r(4, 8, 128, 64), r(4, 8, 128, 64), r(4, 8, 128, 64)),
            4 * 4 * 8 * 128 * 128 * 64,
            4 * 4 * 4 * 8 * 128 * 64,
        ),
        (
            "linear 512->1024 + relu, 128x512",
            lambda x: torch.relu(lin(x)),
            lambda: (r(128, 512),),
            2 * 128 * 512 * 1024,
            4 * (128 * 512 + 512 * 1024 + 128 * 1024),
        ),
        ("softmax 2048^2", lambda x: torch.softmax(x, -1), lambda: (r(2048, 2048),), 0, 2 * 4 * 2048**2),
        (
            "gelu(x*w+b)*sigmoid(x)+x 1024^2",
            lambda x, w, b: F.gelu(x * w + b) * torch.sigmoid(x) + x,
            lambda: (r(1024, 1024), r(1024), r(1024)),
            0,
            2 * 4 * 1024**2,
        ),
        ("20-op chain 64x64", _chain20, lambda: (r(64, 64),), 0, 2 * 4 * 64 * 64),
        # constants and a long contiguous input: the interpreter's per-block work (constants
        # filled once per run, the input read in place) shows here
        ("6-op chain with constants 4x64x1024", _chain6, lambda: (r(4, 64, 1024),), 0, 2 * 4 * 4 * 64 * 1024),
        (
            "README MLP batch 32",
            mlp,
            lambda: (r(32, 512),),
            2 * 32 * (512 * 1024 + 1024 * 256),
            4 * (512 * 1024 + 1024 * 256),
        ),
        (
            "MLP 784-256-10 batch 1",
            small,
            lambda: (r(1, 784),),
            2 * (784 * 256 + 256 * 10),
            4 * (784 * 256 + 256 * 10),
        ),
    ]


def _peak_gflops(threads: int) -> float:
    """float32 FMA peak of `threads` threads running at once, measured by native_cpu's probe
    (`_native.fma_peak_gflops`: independent FMAs on the widest vectors, all threads together, so
    turbo clocks, FMA units per core and logical CPUs sharing a core all show); without the
    extension, 32 FLOP per cycle per thread at the clock /proc/cpuinfo reports."""
    try:
        from tb_cpu_rust import _native

        return float(_native.fma_peak_gflops(threads))
    except ImportError:
        pass
    mhz = 0.0
    try:
        with open("/proc/cpuinfo") as f:
            mhz = max(float(line.split(":")[1]) for line in f if line.startswith("cpu MHz"))
    except (OSError, ValueError):
        pass
    return threads * (mhz or 3000.0) * 32 / 1e3


def _copy_gbps() -> float:
    """Streaming reference: a 64 MiB tensor copy (read + write), same run."""
    x = torch.randn(16 << 20)
    y = torch.empty_like(x)
    y.copy_(x)
    ts = []
    for _ in range(5):
        t0 = time.perf_counter()
        y.copy_(x)
        ts.append(time.perf_counter() - t0)
    return 2 * x.numel() * 4 / statistics.median(ts) / 1e9


class _TrainMLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(784, 512)
        self.fc2 = torch.nn.Linear(512, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def _train_row(threads: int, repeats: int, inductor: bool = True, native_optim: bool = False) -> dict[str, Any]:
    """One Adam step of MLP 784->512->10 on a batch of 64: eager (torch.optim.Adam, its CPU default)
    vs the model compiled on native_cpu. With ``native_optim`` the compiled model is stepped by
    ``tb_cpu_rust.optim.Adam`` (one native call per step), and eager with ``Adam(fused=True)`` is
    timed against it as well (in the notes)."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 784, generator=g), torch.randint(0, 10, (64,), generator=g)

    def make(compiled: bool, backend: str = "torchburn", optim: str = "torch") -> Callable[[], Any]:
        torch.manual_seed(0)
        model = _TrainMLP()
        if optim == "native":
            from tb_cpu_rust.optim import Adam as NativeAdam

            opt: torch.optim.Optimizer = NativeAdam(model.parameters(), lr=1e-3)
        else:
            opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=optim == "fused" or None)
        if not compiled:
            fwd: Callable[..., Any] = model
        elif backend == "torchburn":
            fwd = _compile(model)
        else:
            torch._dynamo.reset()
            fwd = torch.compile(model, backend=backend, dynamic=False)

        def step() -> Any:
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(fwd(x), y)
            loss.backward()
            opt.step()
            return loss

        return step

    eager = make(False)
    t0 = time.perf_counter()
    native = make(True, optim="native" if native_optim else "torch")
    native()
    first = time.perf_counter() - t0
    t_e, t_n = _interleaved(eager, native, repeats)
    flops = 3 * 2 * 64 * (784 * 512 + 512 * 10)
    name = "train step MLP 784-512-10 b64 Adam"
    row: dict[str, Any] = {
        "name": name + (", tb_cpu_rust.optim.Adam" if native_optim else ""),
        "eager_s": t_e,
        "torchburn_s": t_n,
        "torchburn_first_s": first,
        "flops": flops,
        "bytes": 0,
    }
    notes = []
    if native_optim:
        t_f, t_n2 = _interleaved(make(False, optim="fused"), native, repeats)
        notes.append(f"eager with Adam(fused=True) {t_f * 1e6:.0f} µs: {t_f / t_n2:.2f}× of it")
    if inductor:
        try:
            t0 = time.perf_counter()
            ind = make(True, "inductor")
            ind()
            row["inductor_first_s"] = time.perf_counter() - t0
            _, row["inductor_s"] = _interleaved(eager, ind, repeats)
        except Exception as exc:
            notes.append(f"inductor failed: {type(exc).__name__}")
    row["notes"] = "; ".join(notes)
    return row


def _optim_row(repeats: int) -> dict[str, Any]:
    """The Adam step alone on the 784->512->10 MLP's parameters (fixed gradients):
    torch.optim.Adam's default CPU path vs tb_cpu_rust.optim.Adam, and Adam(fused=True) in the notes."""
    from tb_cpu_rust.optim import Adam as NativeAdam

    def opt_of(cls: type, **kw: Any) -> torch.optim.Optimizer:
        torch.manual_seed(0)
        model = _TrainMLP()
        opt = cls(model.parameters(), lr=1e-3, **kw)
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        return opt

    default, fused, native = opt_of(torch.optim.Adam), opt_of(torch.optim.Adam, fused=True), opt_of(NativeAdam)
    t0 = time.perf_counter()
    native.step()
    first = time.perf_counter() - t0
    t_e, t_n = _interleaved(default.step, native.step, repeats)
    t_f, t_n2 = _interleaved(fused.step, native.step, repeats)
    n = sum(p.numel() for p in native.param_groups[0]["params"])
    return {
        "name": "Adam step alone, 407K params (784-512-10 MLP), tb_cpu_rust.optim.Adam",
        "eager_s": t_e,
        "torchburn_s": t_n,
        "torchburn_first_s": first,
        "flops": 0,
        "bytes": 7 * 4 * n,
        "notes": f"Adam(fused=True) {t_f * 1e6:.0f} µs: {t_f / t_n2:.2f}× of it",
    }


def _direct_inference_row(repeats: int) -> dict[str, Any]:
    """The 20-op chain under no_grad compiled twice on native_cpu: through AOTAutograd
    (``direct_inference=False``, A) and without its runtime wrappers (the default, B)."""
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(0))

    def compiled(direct: bool) -> Callable[..., Any]:
        torch._dynamo.reset()
        options = {"engine": "native_cpu", "warn": False, "fallback": "error", "min_partition_size": 1}
        fn = torch.compile(
            _chain20, backend="torchburn", options={**options, "direct_inference": direct}, dynamic=False
        )
        fn(x)
        return fn

    with torch.no_grad():
        via_aot = compiled(False)
        t0 = time.perf_counter()
        direct = compiled(True)
        first = time.perf_counter() - t0
        torch.testing.assert_close(direct(x), via_aot(x))
        t_a, t_b = _interleaved(lambda: via_aot(x), lambda: direct(x), repeats)
    return {
        "name": "20-op chain 64x64: via AOTAutograd (A) vs direct inference (B)",
        "eager_s": t_a,
        "torchburn_s": t_b,
        "torchburn_first_s": first,
        "flops": 0,
        "bytes": 0,
        "notes": f"eager column = the AOTAutograd path; saves {(t_a - t_b) * 1e6:.1f} µs a call",
    }


def _inductor_times(
    row: dict[str, Any], eager: Callable[[], Any], fn: Callable[..., Any], args: tuple[Any, ...], repeats: int
) -> None:
    """inductor_first_s (compile + first call) and inductor_s (A/B against eager) into ``row``."""
    torch._dynamo.reset()
    try:
        t0 = time.perf_counter()
        ind = torch.compile(fn, backend="inductor", dynamic=False)
        ind(*args)
        row["inductor_first_s"] = time.perf_counter() - t0
    except Exception as exc:  # no C++ compiler, or an inductor bug: the row says so
        row["notes"] = (row.get("notes", "") + f"; inductor failed: {type(exc).__name__}").lstrip("; ")
        return
    _, row["inductor_s"] = _interleaved(eager, lambda: ind(*args), repeats)


def _warm_compilers(inductor: bool) -> None:
    """Compiles a throwaway function with each backend first, so the first row's first-call
    figure is that row's compile and not the one-time imports and set-up of Dynamo, AOTAutograd
    and the backend (seconds, whichever backend happens to go first)."""
    x = torch.randn(8, 8)
    backends = ["torchburn"] + (["inductor"] if inductor else [])
    with torch.no_grad():
        for be in backends:
            torch._dynamo.reset()
            fn = (
                _compile(lambda t: torch.relu(t) * 2 + 1)
                if be == "torchburn"
                else torch.compile(lambda t: torch.relu(t) * 3 - 1, backend=be, dynamic=False)
            )
            # inductor without a C++ compiler fails here; its rows say so later
            with contextlib.suppress(Exception):
                fn(x)
    torch._dynamo.reset()


def _dynamo_first_s(fn: Callable[..., Any], args: tuple[Any, ...]) -> float:
    """Compile + first call with a backend that hands Dynamo's graph back unchanged: the part
    of every backend's first call that Dynamo's bytecode tracing takes."""
    torch._dynamo.reset()
    t0 = time.perf_counter()
    torch.compile(fn, backend=lambda gm, _inputs: gm.forward, dynamic=False)(*args)
    return time.perf_counter() - t0


def run(threads: int, repeats: int = 5, inductor: bool = True, gemm_backends: bool = True) -> list[dict[str, Any]]:
    """Measure every row; one dict per row in the shared harness format (times in seconds):
    suite, name, threads, eager_s, torchburn_s, torchburn_first_s, optional inductor_s /
    inductor_first_s, notes; plus ratio, gflops, gbps and peak fractions for this suite's table."""
    os.environ.setdefault("RAYON_NUM_THREADS", str(threads))
    torch.set_num_threads(threads)
    from tb_cpu_rust import _native

    peak = _peak_gflops(threads)
    stream = _copy_gbps()
    results: list[dict[str, Any]] = []
    _warm_compilers(inductor)
    for name, fn, make, flops, nbytes in _rows():
        args = make()
        with torch.no_grad():
            expected = fn(*args)
            t0 = time.perf_counter()
            native = _compile(fn)
            got = native(*args)
            first = time.perf_counter() - t0
            torch.testing.assert_close(got, expected, rtol=1e-3, atol=1e-3)
            settle(lambda native=native, args=args: native(*args))  # time the path routing pinned
            t_eager, t_native = _interleaved(
                lambda fn=fn, args=args: fn(*args), lambda native=native, args=args: native(*args), repeats
            )
            row: dict[str, Any] = {
                "name": name,
                "eager_s": t_eager,
                "torchburn_s": t_native,
                "torchburn_first_s": first,
                "flops": flops,
                "bytes": nbytes,
            }
            notes = []
            if gemm_backends and name.startswith("gemm"):
                # every GEMM candidate interleaved with eager, so each has its own same-run ratio
                before = _native.gemm_backend()
                for be in ("own", "gemm", "matrixmultiply"):
                    try:
                        _native.set_gemm_backend(be)
                    except ValueError:
                        continue
                    te, t_be = _interleaved(
                        lambda fn=fn, args=args: fn(*args),
                        lambda native=native, args=args: native(*args),
                        max(3, repeats // 2),
                    )
                    row[f"{be}_gflops"] = flops / t_be / 1e9
                    notes.append(f"{be} {flops / t_be / 1e9:.0f} GFLOP/s ({te / t_be:.2f}×)")
                _native.set_gemm_backend(before)
                n = int(name.split()[1].split("^")[0])
                ob = _openblas_gflops(n, threads)
                row["openblas_gflops"] = ob
                if ob:
                    notes.append(f"OpenBLAS {ob:.0f} GFLOP/s; native = {flops / t_native / 1e9 / ob:.0%} of it")
                notes.insert(0, f"default={before}")
            row["dynamo_first_s"] = _dynamo_first_s(fn, args)
            notes.append(f"first call of Dynamo alone {row['dynamo_first_s'] * 1e3:.0f} ms")
            row["notes"] = "; ".join(notes)
            if inductor:
                _inductor_times(row, lambda fn=fn, args=args: fn(*args), fn, args, repeats)
        results.append(row)
    results.append(_train_row(threads, repeats, inductor))
    results.append(_train_row(threads, repeats, inductor, native_optim=True))
    results.append(_optim_row(repeats))
    results.append(_direct_inference_row(repeats))
    for row in results:
        row["suite"] = "native_cpu"
        row["threads"] = threads
        row["engines"] = "native_cpu"
        row["native_threads"] = _native.num_threads()
        row["ratio"] = row["eager_s"] / row["torchburn_s"]
        flops, nbytes = row.pop("flops"), row.pop("bytes")
        if flops:
            row["gflops"] = flops / row["torchburn_s"] / 1e9
            row["eager_gflops"] = flops / row["eager_s"] / 1e9
            row["peak_fraction"] = row["gflops"] / peak
        if nbytes:
            row["gbps"] = nbytes / row["torchburn_s"] / 1e9
            row["stream_fraction"] = row["gbps"] / stream
    if results:
        results[0]["notes"] = (
            results[0].get("notes", "") + f"; peak {peak:.0f} GFLOP/s, copy {stream:.0f} GB/s"
        ).lstrip("; ")
    return results


def _fmt(results: list[dict[str, Any]]) -> str:
    lines = [
        "| row | threads | eager | native | eager/native | inductor | eager/inductor | GFLOP/s | GB/s | of peak | first call native / inductor | notes |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        gf = f"{r['gflops']:.1f}" if "gflops" in r else ""
        gb = f"{r['gbps']:.1f}" if "gbps" in r else ""
        frac = (
            f"{r['peak_fraction']:.0%} FMA"
            if "peak_fraction" in r
            else (f"{r['stream_fraction']:.0%} copy" if "stream_fraction" in r else "")
        )
        ind = f"{r['inductor_s'] * 1e6:.0f} µs" if "inductor_s" in r else "-"
        ind_ratio = f"{r['eager_s'] / r['inductor_s']:.2f}×" if "inductor_s" in r else "-"
        ind_first = f"{r['inductor_first_s'] * 1e3:.0f} ms" if "inductor_first_s" in r else "-"
        lines.append(
            f"| {r['name']} | {r['threads']} | {r['eager_s'] * 1e6:.0f} µs | {r['torchburn_s'] * 1e6:.0f} µs | {r['ratio']:.2f}× | "
            f"{ind} | {ind_ratio} | {gf} | {gb} | {frac} | {r['torchburn_first_s'] * 1e3:.0f} ms / {ind_first} | {r.get('notes', '')} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--no-inductor", dest="inductor", action="store_false", help="skip inductor (needs a C++ compiler)"
    )
    parser.add_argument("--json", action="store_true")
    ns = parser.parse_args()
    results = run(ns.threads, ns.repeats, ns.inductor)
    print(json.dumps(results, indent=1) if ns.json else _fmt(results))


if __name__ == "__main__":
    main()
