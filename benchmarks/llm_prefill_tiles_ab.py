"""tb-llm prefill on one of native_cpu's prefill paths against the panel GEMM every weight format
shares, in one process: a switch flipped between the two, order alternating per round (A B, B A,
...), medians, on the Qwen2.5-0.5B-shaped random-weight model of ``bench_llm.py``.

- bf16 / int8 / int4: the AMX tiles (``tb_cpu_rust._native.llm_prefill_tiles``) where the CPU
  has AMX-BF16 (and Linux grants the tile state); else bf16 / int8 on the bfloat16 pair kernel
  (``tb_cpu_rust._native.llm_prefill_bf16_pairs``, AVX-512 BF16); else it says so and skips them.
- fp32: the engine's own float32 GEMM (``tb_cpu_rust._native.llm_prefill_engine_gemm``).

    python benchmarks/llm_prefill_tiles_ab.py [--threads 2] [--rounds 4] [--prompt-tokens 512]
        [--quants fp32,bf16,int8,int4]

Not part of ``python -m benchmarks``: it compares two paths of one engine, not against eager.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def run(threads: int, rounds: int, prompt_tokens: int, quants: list[str]) -> list[dict[str, Any]]:
    import torch

    sys.path.insert(0, str(ROOT))
    from benchmarks.bench_llama_cpp import cache_root
    from benchmarks.bench_llm import make_model
    from benchmarks.harness import machine
    from tb_cpu_rust import _native
    from tb_llm import LLM

    has_tiles = _native.llm_prefill_tiles()
    pairs = not has_tiles and _native.llm_prefill_bf16_pairs()
    if not has_tiles:
        keep = ("fp32", "bf16", "int8") if pairs else ("fp32",)
        print(
            f"no AMX tiles on this CPU (or switched off): {', '.join(q for q in quants if q not in keep) or 'nothing'} not compared"
        )
        quants = [q for q in quants if q in keep]
    torch.set_num_threads(threads)
    folder = make_model(cache_root() / "qwen2.5-0.5b-shape")
    rows = []
    for quant in quants:
        if quant == "fp32":
            switch, path = _native.llm_prefill_engine_gemm, "engine float32 GEMM"
        elif has_tiles:
            switch, path = _native.llm_prefill_tiles, "AMX tiles"
        else:
            switch, path = _native.llm_prefill_bf16_pairs, "bfloat16 pair kernel"
        was = switch()
        try:
            llm = LLM.from_pretrained(folder, quant=quant, device="cpu")
            gen = torch.Generator().manual_seed(0)
            prompt = torch.randint(0, llm.config.vocab_size, (prompt_tokens,), generator=gen).tolist()
            got: dict[bool, list[float]] = {True: [], False: []}
            for on in (True, False):  # warm-up of both paths
                switch(on)
                llm.generate(prompt, max_new_tokens=1, ignore_eos=True)
            for r in range(rounds):
                for on in (True, False) if r % 2 == 0 else (False, True):
                    switch(on)
                    got[on].append(llm.generate(prompt, max_new_tokens=1, ignore_eos=True).timing.prefill_tok_s)
            tiles, panel = statistics.median(got[True]), statistics.median(got[False])
            rows.append(
                {
                    **machine(),
                    "quant": quant,
                    "path": path,
                    "threads": threads,
                    "rounds": rounds,
                    "prompt_tokens": prompt_tokens,
                    "tiles_tok_s": tiles,
                    "panel_tok_s": panel,
                    "ratio": tiles / panel,
                    "samples": {"tiles": got[True], "panel": got[False]},
                }
            )
            del llm
        finally:
            switch(was)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--quants", default="fp32,bf16,int8,int4")
    args = ap.parse_args()
    rows = run(args.threads, args.rounds, args.prompt_tokens, args.quants.split(","))
    first = rows[0]
    print(
        f"{first['date']}, {first['cpu']}, {args.threads} threads, prefill of {args.prompt_tokens} tokens, {args.rounds} rounds"
    )
    print("| weights | panel GEMM (f32 activations) | path | path tok/s | ratio |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['quant']} | {r['panel_tok_s']:.1f} tok/s | {r['path']} | {r['tiles_tok_s']:.1f} tok/s | {r['ratio']:.2f}× |"
        )
    for r in rows:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
