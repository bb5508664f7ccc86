"""Every architecture: greedy tokens identical to transformers for 32 tokens in fp32."""

from __future__ import annotations

import pytest

from tb_llm import LLM
from tb_llm.testing import ARCHS, reference_greedy

PROMPT = "Hello world! How are you"


@pytest.mark.parametrize("arch", list(ARCHS))
def test_greedy_matches_transformers(arch: str, make_ckpt) -> None:
    folder = make_ckpt(arch)
    llm = LLM.from_pretrained(folder, quant="fp32", device="cpu")
    prompt = llm.encode(PROMPT)
    ours = llm.generate(prompt, max_new_tokens=32, ignore_eos=True)
    assert ours.token_ids == reference_greedy(folder, prompt, 32)
    assert ours.finish_reason == "length"
    assert ours.timing.prefill_tok_s > 0 and ours.timing.decode_tok_s > 0


def test_batch_matches_single(llama: LLM) -> None:
    prompts = ["Hello", "The quick brown fox jumps over", "日本語のテキスト"]
    batch = llama.generate(prompts, max_new_tokens=12, ignore_eos=True)
    assert isinstance(batch, list) and len(batch) == 3
    for p, g in zip(prompts, batch):
        single = llama.generate(p, max_new_tokens=12, ignore_eos=True)
        assert g.token_ids == single.token_ids
        assert g.text == single.text


def test_batch_with_sliding_window(make_ckpt) -> None:
    llm = LLM.from_pretrained(make_ckpt("gemma2"), device="cpu")
    prompts = ["Hi", "The quick brown fox jumps over the lazy dog."]
    batch = llm.generate(prompts, max_new_tokens=10, ignore_eos=True)
    for p, g in zip(prompts, batch):
        assert g.token_ids == llm.generate(p, max_new_tokens=10, ignore_eos=True).token_ids


def test_sampling_is_seeded(llama: LLM) -> None:
    kw = dict(
        max_new_tokens=16, temperature=0.9, top_k=50, top_p=0.9, min_p=0.05, repetition_penalty=1.1, ignore_eos=True
    )
    a = llama.generate("Hello", seed=1, **kw)
    b = llama.generate("Hello", seed=1, **kw)
    assert a.token_ids == b.token_ids
    assert len(a.token_ids) == 16


def test_stop_strings_and_eos(llama: LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    full = llama.generate("Hello", max_new_tokens=24, ignore_eos=True)
    text = full.text
    # a stop string of three whole, visible characters from inside the continuation
    usable = [
        text[i : i + 3] for i in range(1, len(text) - 3) if text[i : i + 3].strip().strip("\ufffd") == text[i : i + 3]
    ]
    assert usable, f"the continuation {text!r} has no three visible characters to stop on"
    stop = usable[len(usable) // 2]
    cut = llama.generate("Hello", max_new_tokens=24, ignore_eos=True, stop=[stop])
    assert cut.finish_reason == "stop"
    assert cut.text == text[: text.find(stop)]
    # Make the first greedy token an EOS id: generation stops right there, without text.
    first = full.token_ids[0]
    monkeypatch.setattr(llama.tokenizer, "eos_token_ids", (first,))
    g = llama.generate("Hello", max_new_tokens=24)
    assert g.finish_reason == "stop" and g.token_ids == [first] and g.text == ""
