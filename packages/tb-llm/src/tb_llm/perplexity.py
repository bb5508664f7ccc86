"""Scoring a text: per-token log-probabilities and perplexity over windows of the context size.

Text longer than the window is cut the way llama.cpp's ``llama-perplexity`` cuts it, so the two
tools' numbers are comparable on the same tokens:

* without a stride, the tokens are split into ``len // ctx`` back-to-back chunks of ``ctx``
  tokens; each chunk is run on an empty cache at positions ``0..ctx-1`` with its first token
  replaced by BOS (when the tokenizer adds one) and only its second half is scored: the tokens
  at chunk positions ``ctx//2 + 1 .. ctx-1``, each predicted from everything before it in the
  chunk (so at least ``ctx//2`` tokens of context);
* with a stride ``S`` (``--ppl-stride``), windows of ``ctx`` tokens start every ``S`` tokens
  (``ceil((len - ctx) / S)`` of them), run as they are, and each scores its last ``S`` tokens,
  so every scored token has ``ctx - S`` tokens of context or more and no token is scored twice.

Perplexity is ``exp`` of the mean negative log-likelihood of the scored tokens; its error is the
standard error of that mean, times the perplexity (as ``llama-perplexity`` prints it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from tb_llm.logprobs import log_softmax
from tb_llm.model import Decoder


@dataclass(frozen=True)
class Window:
    start: int  # first token of the text in this window
    length: int
    first_scored: int  # window position of the first scored token; every later one is scored
    bos: bool  # the window's first token is replaced by BOS


@dataclass
class Score:
    """``logprobs[i]``: log-probability of ``token_ids[i]`` given the window before it; ``None``
    for tokens not scored (the first token; the first half of each chunk)."""

    token_ids: list[int]
    logprobs: list[float | None]
    ctx: int
    stride: int | None
    windows: int
    chunk_perplexities: list[float]  # running perplexity after each window, as llama.cpp prints it

    @property
    def scored(self) -> int:
        return sum(1 for lp in self.logprobs if lp is not None)

    @property
    def nll(self) -> float:
        """Mean negative log-likelihood (nats per scored token)."""
        values = [-lp for lp in self.logprobs if lp is not None]
        return sum(values) / len(values) if values else float("nan")

    @property
    def perplexity(self) -> float:
        return math.exp(self.nll)

    @property
    def perplexity_stderr(self) -> float:
        values = [-lp for lp in self.logprobs if lp is not None]
        if len(values) < 2:
            return float("nan")
        mean = sum(values) / len(values)
        var = sum(v * v for v in values) / len(values) - mean * mean
        return math.sqrt(max(var, 0.0) / (len(values) - 1)) * math.exp(mean)


def plan_windows(n_tokens: int, ctx: int, stride: int | None, bos: bool) -> list[Window]:
    if ctx < 2:
        raise ValueError(f"the context size must be >= 2 tokens, got {ctx}")
    if n_tokens < 2:
        raise ValueError(f"scoring needs at least 2 tokens, the text has {n_tokens}")
    if n_tokens <= ctx:  # one window: every token but the first is scored
        return [Window(0, n_tokens, 1, False)]
    if stride is None:
        return [Window(i * ctx, ctx, ctx // 2 + 1, bos) for i in range(n_tokens // ctx)]
    if not 0 < stride < ctx:
        raise ValueError(f"the stride must be in [1, ctx - 1] = [1, {ctx - 1}], got {stride}")
    count = (n_tokens - ctx + stride - 1) // stride
    return [Window(i * stride, ctx, ctx - stride, False) for i in range(count)]


def score_tokens(model: Decoder, ids: list[int], ctx: int, stride: int | None, bos_token_id: int | None) -> Score:
    windows = plan_windows(len(ids), ctx, stride, bos_token_id is not None)
    logprobs: list[float | None] = [None] * len(ids)
    running: list[float] = []
    total, count = 0.0, 0
    dev = model.device
    for w in windows:
        chunk = list(ids[w.start : w.start + w.length])
        if w.bos and bos_token_id is not None:
            chunk[0] = bos_token_id
        x = torch.tensor([chunk], dtype=torch.long, device=dev)
        pos = torch.arange(len(chunk), dtype=torch.long, device=dev)[None]
        logits = model.forward(x, pos, model.new_cache(1, len(chunk)), last_only=False)[0]
        # Position j's logits predict token j + 1.
        lp = log_softmax(logits[w.first_scored - 1 : -1]).cpu()
        targets = torch.tensor(ids[w.start + w.first_scored : w.start + w.length], dtype=torch.long)
        picked = lp.gather(1, targets[:, None])[:, 0].tolist()
        for offset, value in enumerate(picked):
            logprobs[w.start + w.first_scored + offset] = value
        total -= sum(picked)
        count += len(picked)
        running.append(math.exp(total / count))
    return Score(list(ids), logprobs, ctx, stride, len(windows), running)
