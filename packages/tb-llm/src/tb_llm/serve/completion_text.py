"""The text of one completion as it grows: detokenization, stop strings, and safe deltas.

A delta is released only when it is whole UTF-8 characters (tb-llm's ``IncrementalDecoder``)
and cannot turn out to be the beginning of a stop string; once a stop string appears, the text
ends just before it.
"""

from __future__ import annotations

from collections.abc import Sequence

from tb_llm.tokenizer import IncrementalDecoder, Tokenizer


class CompletionText:
    def __init__(self, tokenizer: Tokenizer | None, stop: Sequence[str]) -> None:
        self.decoder = IncrementalDecoder(tokenizer) if tokenizer is not None else None
        self.stop = [s for s in stop if s]
        self.text = ""
        self.emitted = 0
        self.done = False

    def push(self, token: int) -> bool:
        """Add a generated (non-EOS) token; True when a stop string has just ended the text."""
        if self.decoder is None or self.done:
            return False
        self.text += self.decoder.push(token)
        # Only the tail can hold a new match: search from just before the last emitted point.
        hit = -1
        for s in self.stop:
            at = self.text.find(s, max(0, self.emitted - len(s)))
            if at >= 0 and (hit < 0 or at < hit):
                hit = at
        if hit >= 0:
            self.text = self.text[:hit]
            self.done = True
        return self.done

    def finish(self) -> None:
        if not self.done:
            if self.decoder is not None:
                self.text += self.decoder.flush()
                for s in self.stop:  # a stop string completed by the flushed bytes
                    at = self.text.find(s, max(0, self.emitted - len(s)))
                    if at >= 0:
                        self.text = self.text[:at]
            self.done = True

    def take(self) -> str:
        """Text that is safe to send now (everything, once finished)."""
        end = len(self.text)
        if not self.done:
            for s in self.stop:
                for n in range(min(len(s) - 1, len(self.text)), 0, -1):
                    if self.text.endswith(s[:n]):
                        end = min(end, len(self.text) - n)
                        break
        delta = self.text[self.emitted : end]
        self.emitted = max(self.emitted, end)
        return delta
