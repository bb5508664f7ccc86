"""Next-token choice: repetition penalty, temperature, top-k, top-p, min-p; greedy at temperature 0."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p < 1:
            raise ValueError(f"min_p must be in [0, 1), got {self.min_p}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL-style, as in transformers: divide positive logits of seen tokens, multiply negative ones.
    ``seen`` is a bool ``[B, V]``."""
    if penalty == 1.0:
        return logits
    penalized = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalized, logits)


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """``logits.argmax(dim=-1)`` (the first of equal maxima; a NaN counts as the maximum, as in
    torch), found on this thread for CPU float32: torch's argmax of a 50k-150k vocabulary row
    runs on the intra-op pool, whose wake-up costs more than the search (0.07-0.2 ms a token on
    a loaded 2-core VM against 8 us for numpy's) and leaves its threads spinning into the next
    forward pass."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.numel() and logits.shape[-1]:
        return torch.as_tensor(logits.detach().numpy().argmax(axis=-1))
    return logits.argmax(dim=-1)


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> torch.Tensor:
    """``logits`` float32 ``[B, V]`` (penalty applied already) -> token ids ``[B]``."""
    if params.temperature == 0:
        return greedy(logits)
    return torch.multinomial(distribution(logits, params), 1, generator=generator).squeeze(-1)


def distribution(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The probabilities :func:`sample` draws from at ``temperature > 0`` (``[B, V]``, rows sum to
    1 up to rounding): temperature, then top-k, min-p and top-p."""
    logits = logits / params.temperature
    if params.top_k > 0 and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.min_p > 0:
        floor = probs.amax(dim=-1, keepdim=True) * params.min_p
        probs = probs.masked_fill(probs < floor, 0.0)
    if params.top_p < 1.0:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        before = sorted_p.cumsum(dim=-1) - sorted_p  # mass strictly before each token
        sorted_p = sorted_p.masked_fill(before >= params.top_p, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
    return probs
