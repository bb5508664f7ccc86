"""Speculative decoding (prompt lookup and a draft model): greedy output identical to plain
decoding, the acceptance rule gives the model's own distribution, drafts really are accepted."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tb_llm import LLM
from tb_llm.sampling import SamplingParams, distribution
from tb_llm.speculative import Speculative, lookup_draft, parse_speculative, verify

REPEATING = "one two three four one two three four one two three four one two"


def test_lookup_draft_takes_the_latest_longest_match() -> None:
    assert lookup_draft([1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3], k=2, max_ngram=3) == [7, 1]
    # the 3-gram [5, 1, 2] never recurs; the 2-gram [1, 2] does
    assert lookup_draft([1, 2, 8, 8, 5, 1, 2], k=3, max_ngram=3) == [8, 8, 5]
    assert lookup_draft([1, 2, 3, 4], k=4, max_ngram=3) == []
    assert lookup_draft([7], k=4, max_ngram=3) == []
    assert lookup_draft([4, 4, 4], k=5, max_ngram=2) == [4]  # the match must end before the suffix
    assert lookup_draft([1, 2, 3, 1, 2, 3, 1], k=10, max_ngram=1) == [2, 3, 1]
    assert lookup_draft([1, 2, 8, 8, 5, 1, 2], k=3, max_ngram=3, min_ngram=3) == []  # only [1, 2] recurs
    assert lookup_draft([3, 9, 4, 3], k=2, max_ngram=3, min_ngram=2) == []  # a lone token is not enough


def test_parse_speculative(llama: LLM) -> None:
    assert parse_speculative(None) is None
    assert parse_speculative("ngram") == Speculative("ngram")
    assert parse_speculative({"method": "prompt_lookup", "num_tokens": 6}) == Speculative("ngram", 6)
    assert parse_speculative(llama) == Speculative("draft", draft=llama)
    for bad, match in [
        ("medusa", "must be 'ngram'"),
        ({"num_tokens": 0}, "num_tokens"),
        ({"ngram": 40}, "ngram"),
        ({"method": "draft"}, "draft model"),
        ({"lookahead": 3}, "unknown speculative option"),
        (3.5, "must be 'ngram'"),
    ]:
        with pytest.raises(ValueError, match=match):
            parse_speculative(bad)


@pytest.mark.parametrize("num_tokens", [1, 3, 6])
def test_prompt_lookup_greedy_is_plain_greedy(llama: LLM, num_tokens: int) -> None:
    spec = {"method": "ngram", "num_tokens": num_tokens}
    for prompt in (REPEATING, "Hello world", [{"role": "user", "content": "count: a b a b a b"}]):
        plain = llama.generate(prompt, max_new_tokens=24, ignore_eos=True)
        fast = llama.generate(prompt, max_new_tokens=24, ignore_eos=True, speculative=spec)
        assert fast.token_ids == plain.token_ids
        assert fast.text == plain.text
        assert fast.finish_reason == plain.finish_reason == "length"
        assert fast.timing.decode_tokens == 23 and fast.timing.prefill_tokens == len(plain.prompt_token_ids)
    assert fast.timing.accepted_tokens <= fast.timing.draft_tokens


def test_drafts_are_accepted_on_repetitive_output(llama: LLM) -> None:
    out = llama.generate(REPEATING, max_new_tokens=40, ignore_eos=True, speculative="ngram")
    assert out.timing.draft_tokens > 0
    assert out.timing.accepted_tokens > 0, "no draft was ever accepted: the verify path was not exercised"


@pytest.mark.parametrize("arch", ["mistral", "qwen2"])  # mistral: a sliding window
def test_other_architectures_and_quant(make_ckpt: Callable[..., Path], arch: str) -> None:
    llm = LLM.from_pretrained(make_ckpt(arch), device="cpu", quant="int8")
    plain = llm.generate(REPEATING, max_new_tokens=20, ignore_eos=True)
    fast = llm.generate(REPEATING, max_new_tokens=20, ignore_eos=True, speculative={"num_tokens": 4, "ngram": 2})
    assert fast.token_ids == plain.token_ids


def test_draft_model_greedy_is_plain_greedy(llama_dir: Path, llama: LLM) -> None:
    draft = LLM.from_pretrained(llama_dir, device="cpu", quant="int4")
    for prompt in ("Hello world", REPEATING):
        plain = llama.generate(prompt, max_new_tokens=20, ignore_eos=True)
        fast = llama.generate(prompt, max_new_tokens=20, ignore_eos=True, speculative={"draft": draft, "num_tokens": 3})
        assert fast.token_ids == plain.token_ids
    # the int4 copy of the same weights agrees with the model most of the time
    assert fast.timing.accepted_tokens > fast.timing.draft_tokens // 3


def test_stop_eos_logprobs_and_stream(llama: LLM) -> None:
    plain = llama.generate(REPEATING, max_new_tokens=30, logprobs=2)
    fast = llama.generate(REPEATING, max_new_tokens=30, logprobs=2, speculative="ngram")
    assert fast.token_ids == plain.token_ids and fast.finish_reason == plain.finish_reason
    assert fast.logprobs is not None and plain.logprobs is not None
    assert [e.token for e in fast.logprobs] == [e.token for e in plain.logprobs]
    torch.testing.assert_close(
        torch.tensor([e.logprob for e in fast.logprobs]),
        torch.tensor([e.logprob for e in plain.logprobs]),
        atol=1e-3,
        rtol=1e-3,
    )
    words = plain.text.split()
    if len(words) > 3:  # a stop string inside the output cuts both at the same place
        stop = words[2]
        a = llama.generate(REPEATING, max_new_tokens=30, stop=[stop])
        b = llama.generate(REPEATING, max_new_tokens=30, stop=[stop], speculative="ngram")
        assert a.text == b.text and b.finish_reason == "stop"
    streamed = "".join(llama.stream(REPEATING, max_new_tokens=30, ignore_eos=True, speculative="ngram"))
    assert streamed == llama.generate(REPEATING, max_new_tokens=30, ignore_eos=True).text
    assert llama.generate(REPEATING, max_new_tokens=1, speculative="ngram").token_ids == plain.token_ids[:1]


def test_one_prompt_only(llama: LLM) -> None:
    with pytest.raises(ValueError, match="one prompt"):
        llama.generate(["a", "b"], max_new_tokens=4, speculative="ngram")
    with pytest.raises(ValueError, match="one prompt"):
        llama.generate("a", max_new_tokens=4, n=2, temperature=1.0, speculative="ngram")


def _first_token_frequencies(
    p_logits: torch.Tensor, draft: list[int], q: torch.Tensor | None, trials: int
) -> torch.Tensor:
    params = SamplingParams(temperature=1.0)
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros(p_logits.shape[-1])
    logits = p_logits.expand(len(draft) + 1, -1)
    for _ in range(trials):
        emitted, _ = verify(logits, draft, [q] * len(draft), params, gen, None)
        counts[emitted[0]] += 1
    return counts / trials


@pytest.mark.parametrize("kind", ["lookup", "draft_model"])
def test_sampled_acceptance_keeps_the_models_distribution(kind: str) -> None:
    """The first emitted token of a verified step is distributed as the model's p, whatever the draft."""
    torch.manual_seed(1)
    p_logits = torch.randn(1, 6) * 1.5
    p = distribution(p_logits, SamplingParams(temperature=1.0))[0]
    if kind == "lookup":
        q = None
        draft = [int(p.argmin())]  # a poor deterministic draft: mostly rejected, resampled from the rest
    else:
        q = torch.softmax(torch.randn(6), dim=-1)  # a draft model's own distribution
        draft = [int(torch.multinomial(q, 1))]
    freq = _first_token_frequencies(p_logits, draft, q, trials=6000)
    if q is None:
        torch.testing.assert_close(freq, p, atol=0.025, rtol=0)
    else:
        # one fixed draft token d: P(emit d) = min(p_d, q_d) / q_d * q_d ... only averaged over d is it p;
        # check the conditional law instead: accepted w.p. min(1, p_d/q_d), else the residual
        d = draft[0]
        accept = min(1.0, float(p[d] / q[d]))
        residual = (p - q).clamp_min(0)
        residual = residual / residual.sum()
        expected = residual * (1 - accept)
        expected[d] += accept
        torch.testing.assert_close(freq, expected, atol=0.025, rtol=0)


def test_sampled_draft_model_marginal_is_the_models_distribution() -> None:
    torch.manual_seed(2)
    p_logits = torch.randn(1, 5)
    p = distribution(p_logits, SamplingParams(temperature=1.0))[0]
    q = torch.softmax(torch.randn(5) * 2, dim=-1)
    params = SamplingParams(temperature=1.0)
    gen = torch.Generator().manual_seed(3)
    counts = torch.zeros(5)
    trials = 8000
    for _ in range(trials):
        d = int(torch.multinomial(q, 1, generator=gen))
        emitted, _ = verify(p_logits.expand(2, -1), [d], [q], params, gen, None)
        counts[emitted[0]] += 1
    torch.testing.assert_close(counts / trials, p, atol=0.02, rtol=0)


def test_sampled_generation_runs_and_is_seeded(llama: LLM) -> None:
    a = llama.generate(REPEATING, max_new_tokens=16, temperature=0.8, seed=5, ignore_eos=True, speculative="ngram")
    b = llama.generate(REPEATING, max_new_tokens=16, temperature=0.8, seed=5, ignore_eos=True, speculative="ngram")
    assert a.token_ids == b.token_ids and len(a.token_ids) == 16


def test_cli_generate_speculative(llama_dir: Path, llama: LLM, capsys: pytest.CaptureFixture[str]) -> None:
    from tb_llm.cli import main

    base = ["generate", "--model", str(llama_dir), "--device", "cpu", "--tokens", "12", REPEATING]
    assert main([*base, "--speculative", "ngram", "--draft-tokens", "3"]) == 0
    out = capsys.readouterr()
    assert out.out.strip() == llama.generate(REPEATING, max_new_tokens=12).text.strip()
    assert "drafts accepted" in out.err
    assert main([*base, "--speculative", str(llama_dir)]) == 0
    assert main([*base, "--speculative", "ngram", "--draft-tokens", "0"]) == 2
    assert "num_tokens" in capsys.readouterr().err
