"""Where a model's native plan spends its time: each native_cpu partition of a model of the model
set run through ``Executor.run_profiled`` (one clock read per step), summed by step kind, next to
the whole call's eager and torchburn time (same run, interleaved medians).

    python -m benchmarks.profile_native_steps --only qwen2,llama [--threads 1] [--calls 20] [--steps]
    python -m benchmarks.profile_native_steps --train [--threads 1]   # the CNN training step
    python -m benchmarks.profile_native_steps --only resnet_block --bf16   # converted to bfloat16
    python -m benchmarks.profile_native_steps --only transformer_layer --autocast   # autocast bfloat16

``--train``: the bench CNN's training step (``benchmarks.bench_cnn_training``: batch 32, SGD), its
forward and backward programs step by step (training-mode batch norm, pool backward, conv backward).

Routing by measurement is switched off here (``TORCHBURN_ROUTING=off``): this shows the native
path itself. Step times are medians over ``--calls`` profiled calls.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
from collections import defaultdict
from typing import Any

import torch

from benchmarks.bench_models import MODELS
from benchmarks.harness import interleaved


def _programs(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> tuple[Any, list[tuple[Any, list[Any]]]]:
    """The model compiled by torchburn, and each native program it called with its call's tensors."""
    from tb_cpu_rust import program as prog

    seen: list[tuple[Any, list[Any]]] = []
    original = prog.NativeProgram.__call__

    def spy(self: Any, *args: Any) -> Any:
        seen.append((self, [*args, *self._constants]))
        return original(self, *args)

    compiled = torch.compile(model, backend="torchburn", options={"warn": False})
    prog.NativeProgram.__call__ = spy  # type: ignore[method-assign]
    try:
        compiled(*inputs)
        seen.clear()
        compiled(*inputs)
    finally:
        prog.NativeProgram.__call__ = original  # type: ignore[method-assign]
    return compiled, seen


def profile(
    key: str, threads: int, calls: int, steps: bool = False, bf16: bool = False, autocast: bool = False
) -> None:
    desc, build = MODELS[key]
    torch.manual_seed(0)
    model, inputs = build()
    if bf16:
        model = model.to(torch.bfloat16)
        inputs = tuple(a.to(torch.bfloat16) if a.is_floating_point() else a for a in inputs)
        desc += " (bfloat16)"
    if autocast:
        desc += " (under autocast bfloat16)"
    torch._dynamo.reset()
    torch.set_num_threads(threads)
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with torch.no_grad(), ctx:
        compiled, programs = _programs(model, inputs)
        times = interleaved({"eager": lambda: model(*inputs), "torchburn": lambda: compiled(*inputs)}, repeats=7)
        by_kind: dict[str, list[float]] = defaultdict(list)
        counts: dict[str, int] = defaultdict(int)
        in_order: list[tuple[str, float]] = []
        for program, tensors in programs:
            bufs = [torch.empty_strided(s, st, dtype=d) for s, st, d in program._alloc]
            runs = [program.executor.run_profiled(tensors, bufs) for _ in range(calls)]
            for step in range(len(runs[0])):
                kind = runs[0][step][0]
                by_kind[kind].append(statistics.median(r[step][1] for r in runs))
                counts[kind] += 1
                in_order.append((kind, by_kind[kind][-1]))
    total = sum(sum(v) for v in by_kind.values())
    print(f"\n{key}: {desc}, {threads} thread(s), {len(programs)} native partition(s)")
    print(
        f"  eager {1e3 * times['eager']:.3f} ms, torchburn {1e3 * times['torchburn']:.3f} ms, steps {1e3 * total:.3f} ms"
    )
    for kind, ts in sorted(by_kind.items(), key=lambda kv: -sum(kv[1])):
        s = sum(ts)
        print(f"  {kind:<22} x{counts[kind]:<4} {1e3 * s:8.3f} ms  {100 * s / total:5.1f}%")
    if steps:
        for k, (kind, t) in enumerate(in_order):
            print(f"    {k:>3} {kind:<22} {1e3 * t:8.3f} ms")


def profile_training(threads: int, calls: int) -> None:
    """Each native program of the CNN training step (forward, backward), step by step."""
    from benchmarks.bench_cnn_training import BATCH
    from benchmarks.bench_models import CNN
    from tb_cpu_rust import program as prog

    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    x, t = torch.randn(BATCH, 3, 32, 32, generator=g), torch.randint(0, 10, (BATCH,), generator=g)
    torch.manual_seed(0)
    model = CNN()
    run = torch.compile(model, backend="torchburn", options={"warn": False})
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(run(x), t).backward()
        opt.step()

    step()
    seen: list[tuple[Any, list[Any]]] = []
    original = prog.NativeProgram.__call__

    def spy(self: Any, *args: Any) -> Any:
        seen.append((self, [*args, *self._constants]))
        return original(self, *args)

    prog.NativeProgram.__call__ = spy  # type: ignore[method-assign]
    try:
        step()
    finally:
        prog.NativeProgram.__call__ = original  # type: ignore[method-assign]
    print(f"\nCNN training step, batch {BATCH}, {threads} thread(s), {len(seen)} native program(s)")
    for i, (program, tensors) in enumerate(seen):
        bufs = [torch.empty_strided(s, st, dtype=d) for s, st, d in program._alloc]
        runs = [program.executor.run_profiled(tensors, bufs) for _ in range(calls)]
        times = [statistics.median(r[k][1] for r in runs) for k in range(len(runs[0]))]
        print(f"  program {i}: {1e3 * sum(times):.3f} ms")
        for k, ms in enumerate(times):
            print(f"    {k:>3} {runs[0][k][0]:<22} {1e3 * ms:8.3f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="transformer_layer,bert,gpt2,qwen2,llama,vit")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--steps", action="store_true", help="also each step in program order")
    ap.add_argument("--train", action="store_true", help="the CNN training step instead of --only's models")
    ap.add_argument("--bf16", action="store_true", help="the models converted to bfloat16 (their widened plans)")
    ap.add_argument("--autocast", action="store_true", help="the float32 models under autocast to bfloat16")
    args = ap.parse_args()
    os.environ["TORCHBURN_ROUTING"] = "off"
    import warnings

    import torchburn

    warnings.filterwarnings("ignore", category=torchburn.TorchburnFallbackWarning)
    if args.train:
        profile_training(args.threads, args.calls)
        return
    for key in args.only.split(","):
        profile(key, args.threads, args.calls, args.steps, args.bf16, args.autocast)


if __name__ == "__main__":
    main()
