"""wgpu engine benchmark rows (issue 5): interleaved A/B medians against torch CPU eager.

    python benchmarks/bench_wgpu.py [--threads 2] [--repeats 5] [--json]

Rows: matmul GFLOP/s at 256³ and 1024³ (the right operand is an ``nn.Parameter``, so it stays
resident on the device as a weight would; the left one is uploaded and the result read back on
every call, which is what a partition costs end to end) and the README model's latency. Every
row is labelled with the adapter, because on a CPU-only machine the "GPU" is Mesa's lavapipe,
which runs the shaders on the same cores as eager PyTorch.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn


def _block(fn: Callable[[], Any], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n


def _interleaved(
    a: Callable[[], Any], b: Callable[[], Any], repeats: int, budget_s: float = 0.2
) -> tuple[float, float]:
    a(), b()
    n_a = max(1, min(100, int(budget_s / max(_block(a, 1), 1e-6))))
    n_b = max(1, min(100, int(budget_s / max(_block(b, 1), 1e-6))))
    ta, tb = [], []
    for _ in range(repeats):
        ta.append(_block(a, n_a))
        tb.append(_block(b, n_b))
    return statistics.median(ta), statistics.median(tb)


def _compile(fn: Any) -> Any:
    torch._dynamo.reset()
    return torch.compile(
        fn, backend="torchburn", options={"engine": "wgpu", "warn": False, "fallback": "error"}, dynamic=False
    )


class _MatmulWeight(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(n, n), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.w


def run(threads: int = 2, repeats: int = 5) -> list[dict[str, Any]]:
    """Benchmark rows for the wgpu engine (empty with a note when there is no adapter)."""
    import tb_wgpu

    facts = tb_wgpu.describe()
    if "adapter" not in facts:
        return [{"suite": "wgpu", "name": "-", "threads": threads, "notes": f"skipped: {facts.get('reason')}"}]
    adapter = f"{facts['adapter']} ({facts['backend']})"
    torch.set_num_threads(threads)
    rows: list[dict[str, Any]] = []
    with torch.no_grad():
        for n in (256, 1024):
            torch.manual_seed(0)
            model = _MatmulWeight(n).eval()
            x = torch.randn(n, n)
            fast = _compile(model)
            torch.testing.assert_close(fast(x), model(x), rtol=1e-3, atol=1e-3)
            eager_s, wgpu_s = _interleaved(lambda m=model, a=x: m(a), lambda f=fast, a=x: f(a), repeats)
            flops = 2 * n**3
            rows.append(
                {
                    "suite": "wgpu",
                    "name": f"matmul {n}³ f32",
                    "threads": threads,
                    "engines": "wgpu",
                    "eager_s": eager_s,
                    "torchburn_s": wgpu_s,
                    "eager_gflops": flops / eager_s / 1e9,
                    "wgpu_gflops": flops / wgpu_s / 1e9,
                    "adapter": adapter,
                    "notes": f"{adapter}; wgpu {flops / wgpu_s / 1e9:.1f} GFLOP/s vs eager {flops / eager_s / 1e9:.1f} (incl. upload + readback)",
                }
            )
        from torchburn.testing.models import readme_mlp

        model, (x,) = readme_mlp()
        fast = _compile(model)
        torch.testing.assert_close(fast(x), model(x), rtol=1e-4, atol=1e-4)
        eager_s, wgpu_s = _interleaved(lambda: model(x), lambda: fast(x), repeats)
        rows.append(
            {
                "suite": "wgpu",
                "name": "README MLP 512-1024-256, batch 32",
                "threads": threads,
                "engines": "wgpu",
                "eager_s": eager_s,
                "torchburn_s": wgpu_s,
                "adapter": adapter,
                "notes": f"{adapter}; one submission per call",
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = run(args.threads, args.repeats)
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    for r in rows:
        if "eager_s" not in r:
            print(r["notes"])
            continue
        ratio = r["eager_s"] / r["torchburn_s"]
        print(
            f"{r['name']:<36} eager {r['eager_s'] * 1e3:9.3f} ms   wgpu {r['torchburn_s'] * 1e3:9.3f} ms   eager/wgpu {ratio:5.2f}x   {r['notes']}"
        )


if __name__ == "__main__":
    main()
