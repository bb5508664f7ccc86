"""Log-probabilities of chosen tokens and their top-k alternatives, and each token's text and bytes.

A log-probability here is ``log_softmax`` of the model's float32 logits for that position: the
model's own distribution, before temperature, top-k/top-p, penalties or logit bias reshape it
for sampling (vLLM's default ``raw_logprobs``), so the numbers do not depend on how a token was
picked and a greedy token's log-probability is the top-1's.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch

from tb_llm.tokenizer import Tokenizer

MAX_TOP_LOGPROBS = 20  # OpenAI's limit for top_logprobs


@dataclass(frozen=True)
class TokenLogprob:
    """One token with its log-probability; ``top`` holds the ``k`` most likely tokens at that
    position (best first, so it may include this token itself)."""

    token_id: int
    token: str
    logprob: float
    token_bytes: tuple[int, ...] = ()
    top: tuple[TokenLogprob, ...] = ()


class TokenPieces:
    """The text of single tokens, as raw bytes where the tokenizer is byte-level: a token holding
    half of a multi-byte character has bytes but no text of its own (``U+FFFD`` in ``token``)."""

    def __init__(self, tokenizer: Tokenizer | None) -> None:
        self.tokenizer = tokenizer
        self._byte_level = tokenizer is not None and _is_byte_level(tokenizer)

    def text(self, token_id: int) -> str:
        if self.tokenizer is None:
            return f"<{token_id}>"
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def entry(self, token_id: int, logprob: float, top: tuple[TokenLogprob, ...] = ()) -> TokenLogprob:
        return TokenLogprob(token_id, self.text(token_id), logprob, tuple(self.raw_bytes(token_id)), top)

    def raw_bytes(self, token_id: int) -> list[int]:
        if self._byte_level and self.tokenizer is not None:
            piece = self.tokenizer._tok.id_to_token(token_id)
            table = _unicode_to_byte()
            if piece is not None and all(ch in table for ch in piece):
                return [table[ch] for ch in piece]
        return list(self.text(token_id).encode("utf-8"))


def _is_byte_level(tokenizer: Tokenizer) -> bool:
    decoder: Any = getattr(tokenizer._tok, "decoder", None)
    return type(decoder).__name__ == "ByteLevel"


@lru_cache(maxsize=1)
def _unicode_to_byte() -> dict[str, int]:
    # Byte-level BPE spells each byte as one printable character: printable Latin-1 bytes as
    # themselves, the other 68 as the code points from 256 up, in byte order.
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return {c: b for b, c in chars.items()}


def check_top(k: int | None) -> None:
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= MAX_TOP_LOGPROBS):
        raise ValueError(f"logprobs must be None or an integer in [0, {MAX_TOP_LOGPROBS}], got {k!r}")


def log_softmax(logits: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.float(), dim=-1)


def token_logprob(logprobs: torch.Tensor, token_id: int, k: int, pieces: TokenPieces) -> TokenLogprob:
    """``logprobs`` ``[V]`` (already log-softmaxed) -> the entry of ``token_id`` with ``k`` alternatives."""
    top: tuple[TokenLogprob, ...] = ()
    if k > 0:
        values, ids = torch.topk(logprobs, min(k, logprobs.shape[-1]))
        top = tuple(pieces.entry(int(i), float(v)) for v, i in zip(values, ids))
    return pieces.entry(token_id, float(logprobs[token_id]), top)
