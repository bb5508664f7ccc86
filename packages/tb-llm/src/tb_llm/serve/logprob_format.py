"""Log-probabilities in OpenAI's response shapes.

Chat (``/v1/chat/completions``): ``{"content": [{"token", "logprob", "bytes", "top_logprobs":
[{"token", "logprob", "bytes"}]}], "refusal": null}``. Completions (``/v1/completions``, the
legacy shape): parallel lists ``tokens``, ``token_logprobs``, ``top_logprobs`` (a token -> log-prob
map per position) and ``text_offset``; with ``echo`` the prompt's tokens come first, the very
first with ``null`` (nothing predicts it). ``text_offset`` counts characters of the choice's
returned text (as vLLM does; OpenAI's counted from the start of the prompt).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tb_llm.logprobs import TokenLogprob

FLOOR = -9999.0  # JSON has no -inf: a token the model rules out entirely (as vLLM reports it)


def _lp(value: float) -> float:
    return value if value > FLOOR else FLOOR


def chat_logprobs(entries: Iterable[TokenLogprob]) -> dict[str, Any]:
    return {"content": [_chat_entry(e) for e in entries], "refusal": None}


def _chat_entry(e: TokenLogprob) -> dict[str, Any]:
    return {
        "token": e.token,
        "logprob": _lp(e.logprob),
        "bytes": list(e.token_bytes),
        "top_logprobs": [{"token": t.token, "logprob": _lp(t.logprob), "bytes": list(t.token_bytes)} for t in e.top],
    }


class CompletionLogprobs:
    """The legacy lists for one choice, built up token by token; :meth:`take` returns what was
    added since the previous call (one streamed chunk's worth) or, called once, everything."""

    def __init__(self) -> None:
        self.offset = 0
        self._fresh: dict[str, list[Any]] = self._empty()

    @staticmethod
    def _empty() -> dict[str, list[Any]]:
        return {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}

    def add_unscored(self, token: str) -> None:
        self._append(token, None, None)

    def extend(self, entries: Iterable[TokenLogprob]) -> None:
        for e in entries:
            top: dict[str, float] = {}
            for t in e.top:
                top.setdefault(t.token, _lp(t.logprob))
            self._append(e.token, _lp(e.logprob), top)

    def _append(self, token: str, logprob: float | None, top: dict[str, float] | None) -> None:
        f = self._fresh
        f["tokens"].append(token)
        f["token_logprobs"].append(logprob)
        f["top_logprobs"].append(top)
        f["text_offset"].append(self.offset)
        self.offset += len(token)

    def take(self) -> dict[str, list[Any]]:
        out, self._fresh = self._fresh, self._empty()
        return out
