"""What a generated token costs tb-llm besides the model's kernels, on SmolLM2-135M from its GGUF.

    python benchmarks/bench_llm_token_overhead.py [--threads 2] [--rounds 15] [--tokens 256] [--quant int4]

A 135M model decodes in a few milliseconds a token, so the Python around each step — sampling,
detokenizing, stop checks, KV-cache bookkeeping, the engine's own Python wrapper — is a visible
share of it. Three figures, medians over ``rounds`` greedy ``generate`` calls of ``tokens`` tokens
from a 1-token prompt:

* ``loop_us``: tb-llm's decode loop alone, ``model.forward`` replaced by a function that returns
  fixed logits (what ``LLM._run`` costs per token);
* ``python_us``: the loop and the engine's Python step wrapper, only the native step call replaced
  by a no-op (native_cpu's fused step; absent for other engines);
* ``new_cache_ms``: allocating the KV cache each ``generate`` makes (time to first token).

The same process then restores the model and measures real decode tok/s (``decode_tok_s``) for
scale. Run it on two checkouts to compare (``PYTHONPATH`` pointing at the other one's
``packages/tb-llm/src`` and ``packages/tb-core/src``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch


def run(threads: int = 2, rounds: int = 15, tokens: int = 256, quant: str = "int4") -> dict[str, Any]:
    from tb_llm import LLM
    from tb_llm.testing import smollm2_gguf

    torch.set_num_threads(threads)
    llm = LLM.from_pretrained(smollm2_gguf(), quant=quant, device="cpu")
    model = llm.model
    prompt = [1]
    llm.generate(prompt, max_new_tokens=8, ignore_eos=True)

    def per_token_us() -> float:
        out = []
        for _ in range(rounds):
            g = llm.generate(prompt, max_new_tokens=tokens, ignore_eos=True)
            out.append(1e6 * g.timing.decode_seconds / g.timing.decode_tokens)
        return statistics.median(out)

    row: dict[str, Any] = {"quant": quant, "threads": threads, "tokens": tokens, "engine": llm.engine}
    real_forward = model.forward
    logits = torch.randn(1, model.cfg.vocab_size)
    model.forward = lambda *args, **kwargs: logits  # type: ignore[method-assign]
    try:
        row["loop_us"] = per_token_us()
    finally:
        model.forward = real_forward  # type: ignore[method-assign]
    fused = getattr(model, "_fused", None)
    native = getattr(fused, "native", None)
    if native is not None:

        class _NoStep:
            def step(self, *args: Any) -> None:
                return None

        fused.native = _NoStep()
        try:
            row["python_us"] = per_token_us()
        finally:
            fused.native = native
    caches = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        model.new_cache(1, tokens + 1)
        caches.append(1e3 * (time.perf_counter() - t0))
    row["new_cache_ms"] = statistics.median(caches)
    rates = [llm.generate(prompt, max_new_tokens=tokens, ignore_eos=True).timing.decode_tok_s for _ in range(5)]
    row["decode_tok_s"] = statistics.median(rates)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--quant", default="int4", choices=["fp32", "bf16", "int8", "int4"])
    args = parser.parse_args()
    row = run(args.threads, args.rounds, args.tokens, args.quant)
    print(
        f"SmolLM2-135M {row['quant']} on {row['engine']}, {row['threads']} threads: decode loop {row['loop_us']:.1f} us/token, "
        f"with the engine's Python {row.get('python_us', float('nan')):.1f} us/token, KV cache allocation "
        f"{row['new_cache_ms']:.2f} ms per generate, real decode {row['decode_tok_s']:.1f} tok/s"
    )
    print(json.dumps(row))


if __name__ == "__main__":
    main()
