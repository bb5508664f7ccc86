"""CNN training rows: the bench CNN's whole training step (forward, cross-entropy loss, backward,
SGD step; batch 32) and single ``aten.convolution_backward`` calls at ResNet / MobileNet / CNN
shapes, torchburn against eager (oneDNN) and inductor, interleaved in one run, medians, at 1
thread and at ``--threads``.

    python -m benchmarks.bench_cnn_training [--threads 2] [--only train_cnn,bwd_resnet3x3]

The training step compiles the model (AOTAutograd's forward and backward graphs); the optimizer
step runs in eager PyTorch for all three, so the rows compare the model's forward and backward.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from benchmarks.bench_models import CNN
from benchmarks.harness import faults_per_call, interleaved

#: the CNN training step's batch (issue 23: batch 32, SGD or Adam)
BATCH = 32


def _training_step(
    model: nn.Module, run: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, t: torch.Tensor
) -> Callable[[], Any]:
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step() -> Any:
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(run(x), t)
        loss.backward()
        opt.step()
        return loss

    return step


#: convolution backward shapes: key -> (description, x shape, out channels, kernel, stride, groups, channels_last)
BACKWARD_SHAPES: dict[str, tuple[str, tuple[int, int, int, int], int, int, int, int, bool]] = {
    "bwd_cnn_first": ("conv bwd 3×3 3→32, 32×32, batch 32 (CNN layer 1)", (32, 3, 32, 32), 32, 3, 1, 1, False),
    "bwd_cnn_second": ("conv bwd 3×3 32→64, 16×16, batch 32 (CNN layer 2)", (32, 32, 16, 16), 64, 3, 1, 1, False),
    "bwd_resnet3x3": ("conv bwd 3×3 64→64, 32×32, batch 8", (8, 64, 32, 32), 64, 3, 1, 1, False),
    "bwd_pointwise": ("conv bwd 1×1 64→256, 32×32, batch 8", (8, 64, 32, 32), 256, 1, 1, 1, False),
    "bwd_strided": ("conv bwd 3×3 stride 2 64→128, 32×32, batch 8", (8, 64, 32, 32), 128, 3, 2, 1, False),
    "bwd_depthwise": ("conv bwd depthwise 3×3 128ch, 32×32, batch 8", (8, 128, 32, 32), 128, 3, 1, 128, False),
    "bwd_channels_last": ("conv bwd 3×3 64→64 channels_last, 32×32, batch 8", (8, 64, 32, 32), 64, 3, 1, 1, True),
}


def _backward_case(
    x_shape: tuple[int, int, int, int], cout: int, k: int, stride: int, groups: int, channels_last: bool
) -> tuple[Callable[..., Any], tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(x_shape, generator=g)
    w = torch.randn(cout, x_shape[1] // groups, k, k, generator=g)
    pad = k // 2
    y = nn.functional.conv2d(x, w, None, stride, pad, 1, groups)
    gy = torch.randn(y.shape, generator=g)
    if channels_last:
        x, w, gy = (v.to(memory_format=torch.channels_last) for v in (x, w, gy))

    def fn(gy: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> Any:
        return torch.ops.aten.convolution_backward(
            gy, x, w, None, [stride] * 2, [pad] * 2, [1, 1], False, [0, 0], groups, [True, True, False]
        )

    return fn, (gy, x, w)


def _bound(f: Callable[..., Any], args: tuple[torch.Tensor, ...]) -> Callable[[], Any]:
    return lambda: f(*args)


def _row(key: str, desc: str, n: int, times: dict[str, float]) -> dict[str, Any]:
    import torchburn

    return {
        "suite": "cnn_training",
        "model": key,
        "name": desc,
        "threads": n,
        "engines": ",".join(torchburn.active_engines()) or "eager",
        "eager_s": times["eager"],
        "torchburn_s": times["torchburn"],
        "inductor_s": times["inductor"],
    }


def run(threads: int = 2, only: set[str] | None = None, repeats: int = 9) -> list[dict[str, Any]]:
    rows = []
    counts = sorted({1, threads})
    if not only or "train_cnn" in only:
        torch._dynamo.reset()
        g = torch.Generator().manual_seed(0)
        x, t = torch.randn(BATCH, 3, 32, 32, generator=g), torch.randint(0, 10, (BATCH,), generator=g)
        steps = {}
        for name, backend in (("eager", None), ("torchburn", "torchburn"), ("inductor", "inductor")):
            torch.manual_seed(0)
            model = CNN()
            opts: dict[str, str | int | bool | Callable[..., Any]] | None = (
                {"warn": False} if backend == "torchburn" else None
            )
            run_fn = torch.compile(model, backend=backend, options=opts) if backend else model
            steps[name] = _training_step(model, run_fn, x, t)
        # the same first loss from the same weights: each step function is what it says
        first = {k: float(f().detach()) for k, f in steps.items()}
        assert abs(first["torchburn"] - first["eager"]) < 1e-3, first
        for n in counts:
            torch.set_num_threads(n)
            row = _row(
                "train_cnn", f"CNN training step (fwd+loss+bwd+SGD), batch {BATCH}", n, interleaved(steps, repeats)
            )
            faults = {name: faults_per_call(fn) for name, fn in steps.items()}
            row["notes"] = "page faults per step: " + ", ".join(f"{k} {v:.0f}" for k, v in faults.items())
            rows.append(row)
    for key, (desc, *case) in BACKWARD_SHAPES.items():
        if only and key not in only:
            continue
        torch._dynamo.reset()
        fn, args = _backward_case(*case)  # type: ignore[arg-type]
        tb = torch.compile(fn, backend="torchburn", options={"warn": False})
        ind = torch.compile(fn, backend="inductor")
        want = fn(*args)
        for got in (tb(*args), ind(*args)):
            for a, b in zip(got[:2], want[:2]):
                torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-3)
        fns = {name: _bound(f, args) for name, f in (("eager", fn), ("torchburn", tb), ("inductor", ind))}
        for n in counts:
            torch.set_num_threads(n)
            rows.append(_row(key, desc, n, interleaved(fns, repeats)))
    torch.set_num_threads(threads)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", default=None, help="comma list: train_cnn," + ",".join(BACKWARD_SHAPES))
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args()
    for r in run(args.threads, set(args.only.split(",")) if args.only else None, args.repeats):
        print(
            f"{r['model']:<18} {r['threads']}t  eager {1e3 * r['eager_s']:8.3f} ms  "
            f"torchburn {1e3 * r['torchburn_s']:8.3f} ms {r['eager_s'] / r['torchburn_s']:.2f}×  "
            f"inductor {1e3 * r['inductor_s']:8.3f} ms {r['eager_s'] / r['inductor_s']:.2f}×"
        )


if __name__ == "__main__":
    main()
