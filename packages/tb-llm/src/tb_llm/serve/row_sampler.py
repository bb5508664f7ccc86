"""Per-request sampling inside a shared batch.

Each request keeps its own settings and its own seeded generator, so its tokens do not depend
on which other requests share the step: with the same seed, a request samples exactly what
``LLM.generate(..., seed=...)`` samples. On top of tb-llm's sampler (temperature, top-k, top-p,
min-p, repetition penalty) it applies OpenAI's additive ``frequency_penalty`` /
``presence_penalty`` and ``logit_bias``, and last, with a ``response_format`` schema, the
grammar's mask (:mod:`tb_llm.structured`: only tokens the JSON schema allows next).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from tb_llm.sampling import SamplingParams, apply_repetition_penalty, sample
from torchburn.llm.kv_cache import zeros

if TYPE_CHECKING:
    from tb_llm.structured import Grammar


@dataclass(frozen=True)
class RequestSampling:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    seed: int | None = None
    grammar: Grammar | None = None  # structured output: each row gets its own Constraint from it

    @property
    def params(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p, self.min_p, self.repetition_penalty)

    @property
    def plain_greedy(self) -> bool:
        """Argmax of the raw logits: can share one batched argmax with other such rows."""
        return (
            self.temperature == 0
            and self.repetition_penalty == 1.0
            and self.frequency_penalty == 0.0
            and self.presence_penalty == 0.0
            and not self.logit_bias
            and self.grammar is None
        )


class RowSampler:
    """The sampling state of one request: generator, seen tokens, generated-token counts."""

    def __init__(self, s: RequestSampling, prompt_ids: list[int], vocab: int) -> None:
        self.s = s
        self.params = s.params  # validates
        self.vocab = vocab
        self.generator = torch.Generator().manual_seed(s.seed) if s.seed is not None else None
        self.seen: torch.Tensor | None = None
        if s.repetition_penalty != 1.0:
            self.seen = zeros((1, vocab), torch.bool, "cpu")
            self.seen[0, torch.tensor(prompt_ids, dtype=torch.long).clamp(0, vocab - 1)] = True
        self.counts: torch.Tensor | None = None
        if s.frequency_penalty or s.presence_penalty:
            self.counts = zeros((1, vocab), torch.float32, "cpu")
        self.bias: torch.Tensor | None = None
        if s.logit_bias:
            self.bias = zeros((1, vocab), torch.float32, "cpu")
            for tok, b in s.logit_bias.items():
                if 0 <= tok < vocab:
                    self.bias[0, tok] = b
        self.constraint = s.grammar.constraint() if s.grammar is not None else None

    @property
    def complete(self) -> bool:
        """With a grammar: the JSON value is complete (nothing but end-of-sequence may follow)."""
        return self.constraint is not None and self.constraint.done

    def pick(self, logits: torch.Tensor) -> int:
        """``logits`` float32 ``[V]`` (CPU) -> the next token."""
        x = logits[None]
        if self.seen is not None:
            x = apply_repetition_penalty(x, self.seen, self.s.repetition_penalty)
        if self.counts is not None:
            x = x - self.s.frequency_penalty * self.counts - self.s.presence_penalty * (self.counts > 0).float()
        if self.bias is not None:
            x = x + self.bias
        if self.constraint is not None:
            if x.data_ptr() == logits.data_ptr():  # the caller's logits stay the model's (for log-probs)
                x = torch.from_numpy(x.float().numpy().copy())  # numpy: no wake-up of torch's thread pool
            self.constraint.mask(x[0])
        tok = int(sample(x, self.params, self.generator)[0])
        self.observe(tok)
        return tok

    def observe(self, tok: int) -> None:
        if self.constraint is not None and not self.constraint.done:
            self.constraint.advance(tok)
        t = min(max(tok, 0), self.vocab - 1)
        if self.seen is not None:
            self.seen[0, t] = True
        if self.counts is not None:
            self.counts[0, t] += 1
