"""Convolution rows: single 2-d convolutions at ResNet / MobileNet / CNN shapes (inference),
torchburn (native_cpu) against eager (oneDNN) and inductor, interleaved in one run, at 1 thread
and at ``--threads``; and the inference Conv+BatchNorm+ReLU block the models are built from.

    python -m benchmarks.bench_conv [--threads 2] [--only resnet3x3,depthwise]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from benchmarks.harness import interleaved


def _conv(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1, bias: bool = False) -> nn.Module:
    return nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=bias)


def _conv_bn_relu(c: int, k: int = 3) -> nn.Module:
    bn = nn.BatchNorm2d(c)
    with torch.no_grad():
        assert bn.running_mean is not None and bn.running_var is not None
        bn.running_mean.uniform_(-0.2, 0.2)
        bn.running_var.uniform_(0.5, 1.5)
    return nn.Sequential(_conv(c, c, k), bn, nn.ReLU())


#: key -> (description, builder of (module, input))
SHAPES: dict[str, tuple[str, Callable[[], tuple[nn.Module, torch.Tensor]]]] = {
    "resnet3x3": ("conv 3×3 64→64, 32×32, batch 8", lambda: (_conv(64, 64, 3), torch.randn(8, 64, 32, 32))),
    "pointwise": ("conv 1×1 64→256, 32×32, batch 8", lambda: (_conv(64, 256, 1), torch.randn(8, 64, 32, 32))),
    "strided": ("conv 3×3 stride 2 64→128, 32×32, batch 8", lambda: (_conv(64, 128, 3, 2), torch.randn(8, 64, 32, 32))),
    "depthwise": (
        "depthwise 3×3 128ch, 32×32, batch 8",
        lambda: (_conv(128, 128, 3, groups=128), torch.randn(8, 128, 32, 32)),
    ),
    "cnn_first": (
        "conv 3×3 3→32 +bias, 32×32, batch 16",
        lambda: (_conv(3, 32, 3, bias=True), torch.randn(16, 3, 32, 32)),
    ),
    "channels_last": (
        "conv 3×3 64→64 channels_last, 32×32, batch 8",
        lambda: (
            _conv(64, 64, 3).to(memory_format=torch.channels_last),
            torch.randn(8, 64, 32, 32).to(memory_format=torch.channels_last),
        ),
    ),
    "conv_bn_relu": (
        "conv 3×3 64→64 + BatchNorm + ReLU (eval), 32×32, batch 8",
        lambda: (_conv_bn_relu(64), torch.randn(8, 64, 32, 32)),
    ),
}


def _call(fn: Callable[[torch.Tensor], Any], x: torch.Tensor) -> Callable[[], Any]:
    return lambda: fn(x)


def run(threads: int = 2, only: set[str] | None = None, repeats: int = 9) -> list[dict[str, Any]]:
    import torchburn

    rows = []
    counts = sorted({1, threads})
    for key, (desc, build) in SHAPES.items():
        if only and key not in only:
            continue
        torch.manual_seed(0)
        model, x = build()
        model.eval()
        torch._dynamo.reset()
        with torch.no_grad():
            tb = torch.compile(model, backend="torchburn", options={"warn": False})
            ind = torch.compile(model, backend="inductor")
            torch.testing.assert_close(tb(x), model(x), rtol=1e-3, atol=1e-3)
            for n in counts:
                torch.set_num_threads(n)
                times = interleaved(
                    {k: _call(f, x) for k, f in (("eager", model), ("torchburn", tb), ("inductor", ind))}, repeats
                )
                rows.append(
                    {
                        "suite": "conv",
                        "model": key,
                        "name": desc,
                        "threads": n,
                        "engines": ",".join(torchburn.active_engines()) or "eager",
                        "eager_s": times["eager"],
                        "torchburn_s": times["torchburn"],
                        "inductor_s": times["inductor"],
                    }
                )
    torch.set_num_threads(threads)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", default=None, help="comma list of shape keys: " + ",".join(SHAPES))
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args()
    for r in run(args.threads, set(args.only.split(",")) if args.only else None, args.repeats):
        print(
            f"{r['model']:<14} {r['threads']}t  eager {1e3 * r['eager_s']:8.3f} ms  "
            f"torchburn {1e3 * r['torchburn_s']:8.3f} ms {r['eager_s'] / r['torchburn_s']:.2f}×  "
            f"inductor {r['eager_s'] / r['inductor_s']:.2f}×"
        )


if __name__ == "__main__":
    main()
