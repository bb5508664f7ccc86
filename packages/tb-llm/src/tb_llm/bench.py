"""Speed measurement shared by ``python -m tb_llm benchmark`` and ``benchmarks/bench_llm.py``."""

from __future__ import annotations

import resource
import statistics
import sys
import time
from typing import Any

import torch


def peak_rss_mb() -> float:
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb / 1024 / 1024 if sys.platform == "darwin" else kb / 1024


def weight_bytes(llm: Any) -> int:
    seen: set[int] = set()
    engine_objects: set[int] = set()
    total = 0

    def add(obj: Any) -> None:
        nonlocal total
        if isinstance(obj, torch.Tensor):
            key = obj.untyped_storage().data_ptr()
            if key not in seen:
                seen.add(key)
                total += obj.untyped_storage().nbytes()
        elif isinstance(getattr(obj, "nbytes", None), int):
            if id(obj) not in engine_objects:  # an engine's own packed weight (not a torch tensor), once
                engine_objects.add(id(obj))
                total += obj.nbytes
        elif hasattr(obj, "__slots__"):
            for s in obj.__slots__:
                add(getattr(obj, s, None))
        elif hasattr(obj, "__dict__"):
            for v in vars(obj).values():
                add(v)
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                add(v)

    model = llm.model
    add(model.embed)
    add(model.lm_head)
    add(model.norm)
    for layer in model.layers:
        add(layer)
    return total


def benchmark(
    llm: Any,
    prompt_tokens: int = 128,
    new_tokens: int = 32,
    repeat: int = 3,
    first_token_from: float | None = None,
    decode_context: int = 1,
) -> dict[str, Any]:
    """Median prefill and decode speed over ``repeat`` runs of random token prompts.

    Prefill is timed on a ``prompt_tokens`` prompt; decode generates ``new_tokens`` after a
    ``decode_context``-token prompt, as llama-bench's ``tg`` test does (from an empty context),
    so the two runtimes' decode rows measure the same thing: weight streaming, not attention
    over a long cache."""
    gen = torch.Generator().manual_seed(0)
    vocab = llm.config.vocab_size
    prompt = torch.randint(0, vocab, (prompt_tokens,), generator=gen).tolist()
    short = torch.randint(0, vocab, (max(1, decode_context),), generator=gen).tolist()
    t0 = time.perf_counter()
    llm.generate(prompt, max_new_tokens=1, ignore_eos=True)  # warm-up + time to first token
    now = time.perf_counter()
    first = llm.load_seconds + now - t0 if first_token_from is None else now - first_token_from
    pre, dec = [], []
    kv = 0
    for _ in range(max(1, repeat)):
        pre.append(llm.generate(prompt, max_new_tokens=1, ignore_eos=True).timing.prefill_tok_s)
        kv = llm._last_cache.nbytes()
        dec.append(llm.generate(short, max_new_tokens=new_tokens, ignore_eos=True).timing.decode_tok_s)
    decode = statistics.median(dec)
    return {
        "engine": llm.engine,
        "device": str(llm.model.device),
        "quant": llm.quant,
        "prompt_tokens": prompt_tokens,
        "new_tokens": new_tokens,
        "decode_context": max(1, decode_context),
        "load_s": llm.load_seconds,
        "first_token_s": first,
        "prefill_tok_s": statistics.median(pre),
        "decode_tok_s": decode,
        "ms_per_token": 1000.0 / decode if decode else 0.0,
        "weight_mb": weight_bytes(llm) / 1e6,
        "kv_mb": kv / 1e6,
        "peak_rss_mb": peak_rss_mb(),
    }
