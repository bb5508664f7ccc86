"""generate / stream with logprobs=k against log_softmax of transformers' logits for the same tokens."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tb_llm import LLM, TextDelta, TokenLogprob


def reference_logprobs(hf_model: Any, ids: list[int]) -> torch.Tensor:
    """``[len(ids), V]``: row ``j`` is log p(next token | ids[: j + 1])."""
    with torch.no_grad():
        logits = hf_model(torch.tensor([ids]), use_cache=False).logits[0]
    return torch.log_softmax(logits.float(), dim=-1)


def check_against_reference(
    hf_model: Any, prompt: list[int], tokens: list[int], entries: list[TokenLogprob], k: int
) -> None:
    assert [e.token_id for e in entries] == tokens
    ref = reference_logprobs(hf_model, prompt + tokens)
    for i, e in enumerate(entries):
        row = ref[len(prompt) - 1 + i]
        torch.testing.assert_close(torch.tensor(e.logprob), row[e.token_id], atol=1e-4, rtol=1e-4)
        assert len(e.top) == k
        values, ids = torch.topk(row, k)
        torch.testing.assert_close(torch.tensor([t.logprob for t in e.top]), values, atol=1e-4, rtol=1e-4)
        # Same ids unless two alternatives are tied to within the tolerance.
        for t, want, v in zip(e.top, ids.tolist(), values.tolist()):
            assert t.token_id == want or abs(float(row[t.token_id]) - v) < 1e-4
        assert all(a.logprob >= b.logprob for a, b in zip(e.top, e.top[1:]))


def test_greedy_logprobs_match_reference(llama: LLM, hf_model: Any) -> None:
    g = llama.generate("The quick brown fox", max_new_tokens=12, ignore_eos=True, logprobs=5)
    assert not isinstance(g, list) and g.logprobs is not None
    check_against_reference(hf_model, g.prompt_token_ids, g.token_ids, g.logprobs, 5)
    for e in g.logprobs:  # greedy: the chosen token is the likeliest
        assert e.top[0].token_id == e.token_id or abs(e.top[0].logprob - e.logprob) < 1e-5


def test_sampled_logprobs_are_the_models_and_do_not_change_sampling(llama: LLM, hf_model: Any) -> None:
    kw: dict[str, Any] = dict(
        max_new_tokens=10, temperature=1.3, top_k=20, repetition_penalty=1.2, seed=7, ignore_eos=True
    )
    plain = llama.generate("def main():", **kw)
    g = llama.generate("def main():", logprobs=0, **kw)
    assert not isinstance(g, list) and not isinstance(plain, list) and g.logprobs is not None
    assert g.token_ids == plain.token_ids and plain.logprobs is None
    # Raw model log-probabilities: temperature, top-k and the penalty shape sampling only.
    check_against_reference(hf_model, g.prompt_token_ids, g.token_ids, g.logprobs, 0)


def test_stream_logprobs_cover_every_token_once(llama: LLM) -> None:
    out: list[Any] = []
    deltas = list(llama.stream("Grüße aus München", max_new_tokens=16, ignore_eos=True, logprobs=2, result=out))
    assert all(isinstance(d, TextDelta) for d in deltas)
    (g,) = out
    assert "".join(deltas) == g.text
    streamed = [e for d in deltas for e in d.logprobs]  # type: ignore[attr-defined]
    assert streamed == g.logprobs
    want = llama.generate("Grüße aus München", max_new_tokens=16, ignore_eos=True, logprobs=2)
    assert not isinstance(want, list) and [e.token_id for e in streamed] == want.token_ids
    for a, b in zip(streamed, want.logprobs or []):
        assert a.logprob == pytest.approx(b.logprob, abs=1e-5)
    # Without logprobs, plain strings as before.
    assert all(type(d) is str for d in llama.stream("Hi", max_new_tokens=4))


def test_token_bytes_rebuild_the_text(llama: LLM) -> None:
    # Byte-level BPE splits multi-byte characters across tokens: each token's bytes are its raw
    # bytes, so they join to the UTF-8 text even where one token's own text is U+FFFD.
    ids = llama.encode("日本語 Grüße €")[1:]  # without BOS
    assert llama.tokenizer is not None
    from tb_llm.logprobs import TokenPieces

    pieces = TokenPieces(llama.tokenizer)
    joined = b"".join(bytes(pieces.raw_bytes(t)) for t in ids)
    assert joined.decode("utf-8") == llama.tokenizer.decode(ids)
    assert any("\ufffd" in pieces.text(t) for t in ids)  # the case the bytes are for


def test_bad_logprobs_arguments(llama: LLM) -> None:
    for bad in (-1, 21, 1.5, True):
        with pytest.raises(ValueError, match="logprobs"):
            llama.generate("Hi", max_new_tokens=2, logprobs=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="logprobs"):
        list(llama.stream("Hi", max_new_tokens=2, logprobs=99))


def test_n_samples_are_seeded_per_choice(llama: LLM) -> None:
    kw: dict[str, Any] = dict(max_new_tokens=8, temperature=1.0, ignore_eos=True)
    gs = llama.generate("Hello", n=3, seed=11, **kw)
    assert isinstance(gs, list) and len(gs) == 3
    again = llama.generate("Hello", n=3, seed=11, **kw)
    assert isinstance(again, list) and [g.token_ids for g in gs] == [g.token_ids for g in again]
    for i, g in enumerate(gs):  # choice i is the n=1 sample with seed 11 + i
        one = llama.generate("Hello", seed=11 + i, **kw)
        assert not isinstance(one, list) and one.token_ids == g.token_ids
    assert len({tuple(g.token_ids) for g in gs}) > 1
    with pytest.raises(ValueError, match="n must be"):
        llama.generate("Hello", n=0)
    with pytest.raises(ValueError, match="n > 1"):
        llama.generate(["a", "b"], n=2)  # type: ignore[arg-type]
