"""Decode and prefill speed of tb-llm's native_cpu backend (its fused one-call step, and its
per-kernel path over the same weights) against the PyTorch reference backend, in the same run,
interleaved, on the Qwen2.5-0.5B-shaped model of ``bench_llm.py``: tok/s, ms/token, the weight
bytes each streams per token, GB/s and the fraction of this machine's measured read bandwidth.

    python benchmarks/bench_llm_native.py [--threads 2] [--new-tokens 32] [--rounds 3]
        [--prefill-tokens 512] [--quants int4,int8,bf16,fp32] [--no-reference]

Only the ratios within one run mean anything on a shared machine.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def streamed_bytes(llm: Any) -> int:
    """Weight bytes one decode step reads: every linear of every layer plus the output head."""
    m = llm.model
    handles = [lin.handle for layer in m.layers for lin in (*layer.qkv, layer.o, *layer.gate_up, layer.down)]
    handles.append(m.lm_head.handle)
    total = 0
    for h in handles:
        h = getattr(h, "packed", h)  # native dense handles keep the packed copy in .packed
        if hasattr(h, "nbytes") and isinstance(h.nbytes, int):
            total += h.nbytes
            continue
        for name in ("weight", "qweight", "scales", "packed", "scales_zeros"):
            t = getattr(h, name, None)
            if t is not None:
                total += t.numel() * t.element_size()
        if getattr(h, "packed", 1) is None:  # reference int4 without PyTorch's packed kernel
            total += h.w.nbytes()
    return total


def bandwidth_gb_s(threads: int) -> dict[str, float]:
    import torch

    torch.set_num_threads(threads)
    x = torch.ones(256 * 1024 * 1024 // 4 * 4)  # 1 GiB of f32
    y = torch.empty_like(x)
    best_sum = best_copy = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        x.sum()
        t1 = time.perf_counter()
        y.copy_(x)
        t2 = time.perf_counter()
        best_sum, best_copy = min(best_sum, t1 - t0), min(best_copy, t2 - t1)
    nb = x.numel() * 4
    return {"read_gb_s": nb / best_sum / 1e9, "copy_gb_s": 2 * nb / best_copy / 1e9}


def decode_tok_s(llm: Any, prompt: list[int], new_tokens: int) -> float:
    return float(llm.generate(prompt, max_new_tokens=new_tokens, ignore_eos=True).timing.decode_tok_s)


def prefill_tok_s(llm: Any, prompt: list[int]) -> float:
    return float(llm.generate(prompt, max_new_tokens=1, ignore_eos=True).timing.prefill_tok_s)


class _PerKernel:
    """The native backend without its fused step: tb-llm's per-kernel path (one Python call
    per kernel per layer) over the same packed weights."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm

    def __enter__(self) -> None:
        self.saved = self.llm.model._fused
        self.llm.model._fused = None

    def __exit__(self, *exc: object) -> None:
        self.llm.model._fused = self.saved


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=16)
    ap.add_argument(
        "--prefill-tokens", type=int, default=512, help="prompt length of the prefill measurement (0: skip)"
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quants", default="int4,int8,bf16,fp32")
    ap.add_argument("--no-reference", action="store_true", help="skip tb-llm's PyTorch reference backend")
    cache = Path(os.environ.get("TORCHBURN_CACHE_DIR", Path.home() / ".cache" / "torchburn"))
    ap.add_argument("--folder", default=str(cache / "bench-llm" / "qwen2.5-0.5b-shape"))  # bench_llm.py's
    args = ap.parse_args()
    os.environ.setdefault("RAYON_NUM_THREADS", str(args.threads))
    import torch

    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(HERE))
    from bench_llm import make_model

    from tb_cpu_rust import _native
    from tb_llm import LLM

    folder = make_model(Path(args.folder))
    bw = bandwidth_gb_s(args.threads)
    print(f"isa={_native.llm_isa()} threads={args.threads} rayon={_native.num_threads()}")
    print(
        f"memory bandwidth (torch, 1 GiB, best of 5): sum {bw['read_gb_s']:.1f} GB/s, copy {bw['copy_gb_s']:.1f} GB/s"
    )
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 151936, (args.prompt_tokens,), generator=gen).tolist()
    long_prompt = torch.randint(0, 151936, (args.prefill_tokens,), generator=gen).tolist()
    rows = []
    for quant in args.quants.split(","):
        native = LLM.from_pretrained(folder, quant=quant, device="cpu", engine="native_cpu", progress=False)
        runs: dict[str, Any] = {"native_cpu": (native, None), "native_cpu per-kernel": (native, _PerKernel(native))}
        if native.model._fused is None:
            del runs["native_cpu per-kernel"]
        if not args.no_reference:
            ref = LLM.from_pretrained(folder, quant=quant, device="cpu", engine="reference", progress=False)
            runs["reference"] = (ref, None)
        speeds: dict[str, list[float]] = {k: [] for k in runs}
        prefill: dict[str, float] = {}
        for llm, ctx in runs.values():
            with ctx or contextlib.nullcontext():
                llm.generate(prompt, max_new_tokens=2, ignore_eos=True)  # warm-up
        for _ in range(args.rounds):
            for name, (llm, ctx) in runs.items():  # interleaved: all see the same machine state
                with ctx or contextlib.nullcontext():
                    speeds[name].append(decode_tok_s(llm, prompt, args.new_tokens))
        if args.prefill_tokens:
            for name, (llm, _ctx) in runs.items():
                if name.endswith("per-kernel"):
                    continue  # prefill takes the per-kernel path either way
                prefill[name] = prefill_tok_s(llm, long_prompt)
        med = {k: statistics.median(v) for k, v in speeds.items()}
        base = med.get("reference")
        for name, (llm, _) in runs.items():
            gb = streamed_bytes(llm) / 1e9
            row = {
                "quant": quant,
                "backend": name,
                "decode_tok_s": med[name],
                "ms_per_token": 1000.0 / med[name],
                "prefill_tok_s": prefill.get(name),
                "prefill_tokens": args.prefill_tokens,
                "weights_gb_per_token": gb,
                "gb_s": gb * med[name],
                "pct_of_read_bw": 100 * gb * med[name] / bw["read_gb_s"],
                "speedup_vs_reference": med[name] / base if base else None,
                "all_tok_s": speeds[name],
            }
            rows.append(row)
            pre = f"prefill({args.prefill_tokens}) {row['prefill_tok_s']:6.1f} tok/s  " if name in prefill else ""
            vs = f"x{row['speedup_vs_reference']:.2f} vs reference  " if base else ""
            print(
                f"{quant:5s} {name:21s} decode {row['decode_tok_s']:6.1f} tok/s {row['ms_per_token']:6.1f} ms/token  "
                f"{pre}{vs}weights {gb:.3f} GB/token  "
                f"{row['gb_s']:.1f} GB/s ({row['pct_of_read_bw']:.0f}% of measured read bandwidth)  "
                f"runs {[round(s, 1) for s in speeds[name]]}",
                flush=True,
            )
        del runs, native
        gc.collect()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
