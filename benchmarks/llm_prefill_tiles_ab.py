"""tb-llm prefill on one of native_cpu's prefill paths against the panel GEMM every weight format
shares, in one process: a switch flipped between the two, order alternating per round (A B, B A,
...), medians, on the Qwen2.5-0.5B-shaped random-weight model of ``bench_llm.py``.

- bf16 / int8 / int4: the AMX tiles (``tb_cpu_rust._native.llm_prefill_tiles``); needs a CPU
  with AMX-BF16 (and Linux granting the tile state), elsewhere it says so and skips them.
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

    if not _native.llm_prefill_tiles():
        print("no AMX tiles on this CPU (or switched off): bf16 / int8 / int4 not compared")
        quants = [q for q in quants if q == "fp32"]
    torch.set_num_threads(threads)
    folder = make_model(cache_root() / "qwen2.5-0.5b-shape")
    rows = []
    for quant in quants:
        switch = _native.llm_prefill_engine_gemm if quant == "fp32" else _native.llm_prefill_tiles
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
                    "path": "engine float32 GEMM" if quant == "fp32" else "AMX tiles",
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
