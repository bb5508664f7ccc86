"""Speculative decoding: cheap drafts of the next few tokens, verified by the model in one step.

A draft proposes ``k`` tokens; the model runs the last accepted token and the ``k`` drafts as one
``[1, k + 1]`` forward pass (one read of the weights instead of ``k + 1``), which gives its
distribution after each of them. Drafts are accepted left to right while the model agrees, the
first disagreement is replaced by the model's own token, and when all ``k`` agree the last
position gives one token more. The KV cache is then cut back to the accepted tokens.

Two kinds of draft:

* **prompt lookup** (``"ngram"``): the longest suffix of the sequence (``ngram`` tokens down to
  ``min_ngram``, default 2) that occurred earlier in it, and the tokens that followed it there.
  Costs nothing to draft, and pays where the output repeats its input (summaries, code edits,
  extraction, chat that quotes).
* **a draft model** (``draft=LLM``): a smaller checkpoint with the same tokenizer runs ``k``
  steps of its own (with its own KV cache, kept across rounds).

A draft that misses still widens the verify step, so the draft length adapts per sequence
(doubled after a round that accepted every draft, halved after one that accepted none, with
plain steps and an occasional one-token probe once it reaches 0): text that never repeats decodes
at close to the plain rate.

Acceptance is the standard rule (Leviathan et al. 2023; Chen et al. 2023), so the output has the
model's own distribution: greedy (temperature 0) accepts a draft iff it is the model's argmax, so
greedy output is the plain greedy output; sampled, a draft ``d`` drawn from ``q`` is accepted with
probability ``min(1, p(d) / q(d))``, else the token is drawn from ``max(0, p - q)`` renormalised
(a lookup draft is deterministic: ``q`` is one-hot, so ``d`` is kept with probability ``p(d)``).
Sampled output follows the same distribution as plain sampling, but not the same random stream:
the same seed gives other samples than without speculation.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from tb_llm.sampling import SamplingParams, apply_repetition_penalty, distribution, greedy
from torchburn.llm.kv_cache import zeros

if TYPE_CHECKING:
    from tb_llm.llm import LLM

__all__ = ["Speculative", "lookup_draft", "parse_speculative"]

#: Plain decode steps taken after the draft length fell to 0, before one draft is tried again.
PAUSE = 4


@dataclass(frozen=True)
class Speculative:
    """How to draft. ``method``: ``"ngram"`` (prompt lookup) or ``"draft"`` (``draft`` model);
    ``num_tokens``: drafts per step; ``ngram``: the longest suffix looked up (prompt lookup)."""

    method: str = "ngram"
    num_tokens: int = 4
    ngram: int = 3
    draft: Any = None  # an LLM, for method "draft"
    min_ngram: int = 2

    def __post_init__(self) -> None:
        if self.method not in ("ngram", "draft"):
            raise ValueError(f"speculative method must be 'ngram' or 'draft', got {self.method!r}")
        if isinstance(self.num_tokens, bool) or not isinstance(self.num_tokens, int) or not 1 <= self.num_tokens <= 32:
            raise ValueError(f"speculative num_tokens must be an integer in 1..32, got {self.num_tokens!r}")
        if isinstance(self.ngram, bool) or not isinstance(self.ngram, int) or not 1 <= self.ngram <= 16:
            raise ValueError(f"speculative ngram must be an integer in 1..16, got {self.ngram!r}")
        if isinstance(self.min_ngram, bool) or not isinstance(self.min_ngram, int) or self.min_ngram < 1:
            raise ValueError(f"speculative min_ngram must be an integer >= 1, got {self.min_ngram!r}")
        if (self.method == "draft") != (self.draft is not None):
            raise ValueError("a draft model is given with method 'draft', and only then")


def parse_speculative(spec: Any) -> Speculative | None:
    """``None``; ``"ngram"`` / ``"prompt_lookup"``; an ``LLM`` (the draft model); a
    :class:`Speculative`; or a dict of its fields (``{"method": "ngram", "num_tokens": 6}``,
    ``{"draft": llm}``)."""
    from tb_llm.llm import LLM

    if spec is None or isinstance(spec, Speculative):
        return spec
    if isinstance(spec, str):
        if spec in ("ngram", "prompt_lookup"):
            return Speculative("ngram")
        raise ValueError(f"speculative must be 'ngram' (prompt lookup), a draft LLM or a dict, got {spec!r}")
    if isinstance(spec, LLM):
        return Speculative("draft", draft=spec)
    if isinstance(spec, dict):
        fields = dict(spec)
        if fields.get("method") == "prompt_lookup":
            fields["method"] = "ngram"
        if "draft" in fields and "method" not in fields:
            fields["method"] = "draft"
        unknown = set(fields) - {"method", "num_tokens", "ngram", "min_ngram", "draft"}
        if unknown:
            raise ValueError(f"unknown speculative option(s): {', '.join(sorted(unknown))}")
        return Speculative(**fields)
    raise ValueError(f"speculative must be 'ngram', a draft LLM, a dict or None, got {type(spec).__name__}")


def lookup_draft(tokens: list[int], k: int, max_ngram: int, min_ngram: int = 1) -> list[int]:
    """Prompt lookup: for n = ``max_ngram`` .. ``min_ngram``, the latest earlier occurrence of the
    last ``n`` tokens and up to ``k`` tokens that followed it; ``[]`` when no such suffix recurs."""
    length = len(tokens)
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        suffix = tokens[length - n :]
        # latest start first: recent context predicts best; the match must end before the suffix
        for start in range(length - n - 1, -1, -1):
            if tokens[start : start + n] == suffix:
                follow = tokens[start + n : start + n + k]
                if follow:
                    return follow
    return []


class DraftModel:
    """A draft LLM with its own KV cache, reused across rounds (cut back to the common prefix)."""

    def __init__(self, target: LLM, draft: LLM) -> None:
        if draft.config.vocab_size > target.config.vocab_size:
            raise ValueError(
                f"the draft model's vocabulary ({draft.config.vocab_size}) is larger than the model's "
                f"({target.config.vocab_size}): it needs the same tokenizer"
            )
        probe = "Speculative decoding: the same tokenizer?"
        both = target.tokenizer is not None and draft.tokenizer is not None
        if both and target.tokenizer.encode(probe) != draft.tokenizer.encode(probe):  # type: ignore[union-attr]
            raise ValueError("the draft model's tokenizer encodes text differently from the model's")
        self.llm = draft
        self.cache: Any = None
        self.held: list[int] = []  # the tokens whose keys/values the draft cache holds

    def propose(
        self, tokens: list[int], k: int, params: SamplingParams, gen: torch.Generator | None
    ) -> tuple[list[int], list[torch.Tensor | None]]:
        """Up to ``k`` draft tokens after ``tokens`` and, when sampling, the draft distribution
        each was drawn from (``None``: drawn greedily, a one-hot ``q``)."""
        model = self.llm.model
        dev = model.device
        if self.cache is None:
            self.cache = model.new_cache(1, len(tokens) + 64)
        common = 0
        for a, b in zip(self.held, tokens[:-1]):  # always feed at least the last token
            if a != b:
                break
            common += 1
        self.cache.truncate(common)
        self.held = self.held[:common]
        self.cache.reserve(len(tokens) + k + 1)
        feed = tokens[common:]
        out: list[int] = []
        dists: list[torch.Tensor | None] = []
        for _ in range(k):
            ids = torch.tensor([feed], dtype=torch.long)
            pos = torch.arange(len(self.held), len(self.held) + len(feed))[None]
            logits = model.forward(ids.to(dev), pos.to(dev), self.cache).float().cpu()
            self.held += feed
            if params.temperature == 0:
                tok = int(greedy(logits)[0])
                dists.append(None)
            else:
                q = distribution(logits, params)[0]
                tok = int(torch.multinomial(q, 1, generator=gen))
                dists.append(q)
            out.append(tok)
            feed = [tok]
        return out, dists


def verify(
    logits: torch.Tensor,
    draft: list[int],
    dists: list[torch.Tensor | None],
    params: SamplingParams,
    gen: torch.Generator | None,
    seen: torch.Tensor | None,
) -> tuple[list[int], int]:
    """``logits`` ``[m + 1, V]`` after the last accepted token and each of the ``m`` drafts ->
    (the tokens to emit, how many drafts were accepted). ``seen``: the repetition-penalty set of
    the sequence so far (each position also counts the drafts before it)."""
    out: list[int] = []
    seen = seen.clone() if seen is not None else None
    for i in range(len(draft) + 1):
        row = logits[i : i + 1]
        if seen is not None:
            row = apply_repetition_penalty(row, seen, params.repetition_penalty)
        if params.temperature == 0:
            best = int(greedy(row)[0])
            if i < len(draft) and draft[i] == best:
                out.append(best)
            else:
                out.append(best)
                return out, i
        else:
            p = distribution(row, params)[0]
            if i == len(draft):
                out.append(int(torch.multinomial(p, 1, generator=gen)))
                return out, i
            d, q = draft[i], dists[i]
            q_d = 1.0 if q is None else float(q[d])
            ratio = float(p[d]) / q_d if q_d > 0 else 0.0
            if float(torch.rand((), generator=gen)) < min(1.0, ratio):
                out.append(d)
            else:
                residual = p.clone()
                if q is None:
                    residual[d] = 0.0
                else:
                    residual = (p - q).clamp_min(0.0)
                if float(residual.sum()) <= 0.0:  # p == q up to rounding: any draw from p will do
                    residual = p
                out.append(int(torch.multinomial(residual / residual.sum(), 1, generator=gen)))
                return out, i
        if seen is not None:
            seen[0, min(max(out[-1], 0), seen.shape[1] - 1)] = True
    return out, len(draft)


def run(
    llm: LLM,
    seq: Any,
    spec: Speculative,
    params: SamplingParams,
    max_new_tokens: int,
    seed: int | None,
    ignore_eos: bool,
    timing: Any,
    logprobs: int | None,
) -> Iterator[None]:
    """The prefill + speculative decode loop for one sequence; yields after every verified step
    (which may have added several tokens to ``seq``)."""
    import time

    from tb_llm.logprobs import TokenPieces, log_softmax, token_logprob

    model = llm.model
    dev = model.device
    prompt = seq.prompt_ids
    if not prompt:
        raise ValueError("empty prompt: encode at least one token")
    if max_new_tokens <= 0:
        seq.finish("length")
        return
    drafter = DraftModel(llm, spec.draft) if spec.method == "draft" else None
    cache = model.new_cache(1, len(prompt) + max_new_tokens + spec.num_tokens + 1)
    eos = set() if ignore_eos else set(llm.eos_token_ids)
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    vocab = model.cfg.vocab_size
    seen = None
    if params.repetition_penalty != 1.0:
        seen = zeros((1, vocab), torch.bool, "cpu")
        seen[0, torch.tensor(prompt, dtype=torch.long).clamp(0, vocab - 1)] = True
    pieces = TokenPieces(llm.tokenizer) if logprobs is not None else None
    tokens = list(prompt)

    def emit(emitted: list[int], raw: torch.Tensor | None) -> None:
        for j, tok in enumerate(emitted):
            if seq.finish_reason is not None:
                return
            if raw is not None and pieces is not None and logprobs is not None:
                seq.logprobs.append(token_logprob(raw[j], tok, logprobs, pieces))
            seq.add(tok, tok in eos)
            tokens.append(tok)
            if seen is not None:
                seen[0, min(max(tok, 0), vocab - 1)] = True
            if len(seq.ids) >= max_new_tokens:
                seq.finish("length")

    t0 = time.perf_counter()
    ids = torch.tensor([prompt], dtype=torch.long)
    logits = model.forward(ids.to(dev), torch.arange(len(prompt))[None].to(dev), cache).float().cpu()
    first, _ = verify(logits, [], [], params, gen, seen)
    timing.prefill_tokens += len(prompt)
    timing.prefill_seconds += time.perf_counter() - t0
    emit(first, log_softmax(logits) if logprobs is not None else None)
    yield None
    # Drafts that miss cost a wider verify step each round, so the draft length adapts: doubled
    # after a round that accepted every draft, halved after one that accepted none; at 0 the next
    # rounds are plain steps, and one draft is tried again after PAUSE of them.
    width, plain_rounds = spec.num_tokens, 0
    while seq.finish_reason is None:
        t0 = time.perf_counter()
        room = max_new_tokens - len(seq.ids)  # tokens still allowed; the bonus token is one of them
        if width == 0:
            plain_rounds += 1
            if plain_rounds > PAUSE:
                width, plain_rounds = 1, 0
        k = min(width, room - 1)
        draft: list[int] = []
        dists: list[torch.Tensor | None] = []
        if k > 0:
            if drafter is not None:
                draft, dists = drafter.propose(tokens, k, params, gen)
            else:
                draft = lookup_draft(tokens, k, spec.ngram, spec.min_ngram)
                dists = [None] * len(draft)
        held = cache.length  # the cache holds every token but the last emitted one
        feed = [tokens[-1], *draft]
        ids = torch.tensor([feed], dtype=torch.long)
        pos = torch.arange(held, held + len(feed))[None]
        logits = model.forward(ids.to(dev), pos.to(dev), cache, last_only=False)[0].float().cpu()
        emitted, accepted = verify(logits, draft, dists, params, gen, seen)
        cache.truncate(held + 1 + accepted)  # the last emitted token is fed next round
        timing.draft_tokens += len(draft)
        timing.accepted_tokens += accepted
        if draft and accepted == len(draft):
            width = min(spec.num_tokens, 2 * width)
        elif draft and accepted == 0:
            width //= 2
        before = len(seq.ids)
        emit(emitted, log_softmax(logits[: len(emitted)]) if logprobs is not None else None)
        timing.decode_tokens += len(seq.ids) - before
        timing.decode_seconds += time.perf_counter() - t0
        yield None
    llm._last_cache = cache
