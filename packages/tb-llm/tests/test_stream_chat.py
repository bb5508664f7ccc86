"""Streaming (whole UTF-8 characters per delta) and multi-turn chat with a kept KV cache."""

from __future__ import annotations

import io

from tb_llm import LLM
from tb_llm.tokenizer import IncrementalDecoder

TEXT = "日本語 🙂 Grüße — “quotes” 🚀🔥"


def test_incremental_decoder_never_splits_characters(llama: LLM) -> None:
    tok = llama.tokenizer
    assert tok is not None
    ids = tok.encode(TEXT, add_special_tokens=False)
    # The byte-level vocabulary is tiny, so multi-byte characters span several tokens.
    assert len(ids) > len(TEXT)
    dec = IncrementalDecoder(tok)
    deltas = [dec.push(i) for i in ids]
    deltas.append(dec.flush())
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == TEXT
    assert sum(1 for d in deltas if d == "") > 0  # some tokens were held back mid-character


def test_stream_joins_to_generate(llama: LLM) -> None:
    result: list = []
    deltas = list(llama.stream("Grüße 日本", max_new_tokens=40, ignore_eos=True, result=result))
    full = llama.generate("Grüße 日本", max_new_tokens=40, ignore_eos=True)
    assert "".join(deltas) == full.text == result[0].text
    assert result[0].token_ids == full.token_ids
    # (A random model emits invalid byte sequences too; those decode to U+FFFD in both.)


def test_stream_holds_back_possible_stop_string(llama: LLM) -> None:
    full = llama.generate("Hello", max_new_tokens=30, ignore_eos=True).text
    stop = full[10:14]
    deltas = list(llama.stream("Hello", max_new_tokens=30, ignore_eos=True, stop=[stop]))
    assert "".join(deltas) == full[: full.find(stop)]


def test_chat_session_reuses_kv_cache(llama: LLM) -> None:
    session = llama.chat_session(system_prompt="You are terse.")
    first = session.send("Hello there", max_new_tokens=8)
    assert first.timing.prefill_tokens == len(first.prompt_token_ids)
    second = session.send("And again?", max_new_tokens=8)
    # Only the new turn is prefilled; the conversation so far comes from the cache.
    assert second.timing.prefill_tokens < len(second.prompt_token_ids) // 2
    # Same tokens as a fresh model given the whole conversation at once.
    fresh = llama.generate(session.messages[:-1], max_new_tokens=8)
    assert fresh.prompt_token_ids == second.prompt_token_ids
    assert fresh.token_ids == second.token_ids


def test_chat_repl(llama: LLM) -> None:
    lines = iter(["hi", "/reset", "hello again", "/exit"])
    out = io.StringIO()
    llama.chat(system_prompt="sys", max_new_tokens=4, input_fn=lambda _: next(lines), output=out, temperature=0.0)
    assert out.getvalue().count("prompt tokens at") == 2
