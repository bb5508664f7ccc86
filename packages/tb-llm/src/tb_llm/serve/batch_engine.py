"""The model side of continuous batching: prefill one row, decode every live row in one step.

Only the scheduler thread calls into this object; it owns the model and the cache. Every
method runs in inference mode: the cache may be (re)allocated inside the model's forward, and
inference tensors can only be written in that mode.
"""

from __future__ import annotations

import torch

from tb_llm.llm import LLM
from tb_llm.serve.prefix_cache import PrefixCache
from tb_llm.serve.slot_cache import SlotCache


class BatchEngine:
    def __init__(
        self, llm: LLM, max_batch: int, initial_capacity: int = 256, prefix_cache: PrefixCache | None = None
    ) -> None:
        self.llm = llm
        self.model = llm.model
        self.max_batch = max_batch
        self.prefix_cache = prefix_cache if prefix_cache is not None and prefix_cache.enabled else None
        cfg = self.model.cfg
        self.cache = SlotCache(
            cfg.num_layers,
            max_batch,
            cfg.num_kv_heads,
            cfg.head_dim,
            initial_capacity,
            self.model.dtype,
            self.model.device,
        )

    @property
    def device(self) -> torch.device:
        return self.model.device

    @torch.inference_mode()
    def prefill(self, row: int, ids: list[int], all_logits: bool = False) -> torch.Tensor:
        """Run a whole prompt into the (free) row ``row``; return float32 logits ``[V]`` on CPU
        (of the last position; with ``all_logits``, ``[T, V]``: every position's).

        With a prefix cache (and not ``all_logits``, which needs every position run), the
        longest cached block prefix of ``ids`` is copied into the row and only the rest is run."""
        self.cache.clear(row)
        dev = self.device
        t = len(ids)
        start = 0
        if self.prefix_cache is not None and not all_logits:
            blocks = self.prefix_cache.lookup(ids)
            if blocks:
                start = self.cache.load(row, [b.k for b in blocks], [b.v for b in blocks])
        x = torch.tensor([ids[start:]], dtype=torch.long, device=dev)
        pos = torch.arange(start, t, dtype=torch.long, device=dev)[None]
        logits = self.model.forward(x, pos, self.cache.prefill_view(row), last_only=not all_logits)  # type: ignore[arg-type]
        return logits[0].float().cpu()

    @torch.inference_mode()
    def remember(self, row: int, tokens: list[int]) -> int:
        """Offer the sequence in ``row`` (whose tokens are ``tokens``, at least as many as the
        row holds) to the prefix cache; return the blocks it added."""
        if self.prefix_cache is None:
            return 0
        held = self.cache.lens[row]
        if len(tokens) < held:
            raise ValueError(f"row {row} holds {held} tokens but only {len(tokens)} were given")
        return self.prefix_cache.insert(tokens[:held], lambda a, b: self.cache.read(row, a, b))

    @torch.inference_mode()
    def decode(self, tokens: list[int]) -> torch.Tensor:
        """Feed one token to each of rows ``0..len(tokens)-1``; return logits ``[n, V]`` on CPU."""
        n = len(tokens)
        dev = self.device
        x = torch.tensor(tokens, dtype=torch.long, device=dev)[:, None]
        pos = torch.tensor(self.cache.lens[:n], dtype=torch.long, device=dev)[:, None]
        logits = self.model.forward(x, pos, self.cache.decode_view(n))  # type: ignore[arg-type]
        return logits.float().cpu()

    @torch.inference_mode()
    def extend(self, row: int, tokens: list[int]) -> torch.Tensor:
        """Feed ``tokens`` to row ``row`` after what it holds (a speculative verify step: the last
        token and the drafts); return float32 logits ``[len(tokens), V]`` on CPU, one per token."""
        start = self.cache.lens[row]
        x = torch.tensor([tokens], dtype=torch.long, device=self.device)
        pos = torch.arange(start, start + len(tokens), dtype=torch.long, device=self.device)[None]
        logits = self.model.forward(x, pos, self.cache.prefill_view(row), last_only=False)  # type: ignore[arg-type]
        return logits[0].float().cpu()

    @torch.inference_mode()
    def truncate(self, row: int, length: int) -> None:
        """Keep only the first ``length`` tokens of row ``row`` (drafts the model rejected go)."""
        self.cache.truncate(row, length)

    @torch.inference_mode()
    def release(self, row: int, last: int) -> None:
        """Free ``row``; the live row ``last`` (the highest one) moves into it."""
        if row == last:
            self.cache.clear(row)
        else:
            self.cache.move(last, row)

    @property
    def tokens_held(self) -> int:
        return sum(self.cache.lens)

    @property
    def token_capacity(self) -> int:
        """Tokens the cache holds room for now, all rows together (it grows on demand)."""
        return self.cache.capacity * self.max_batch

    @torch.inference_mode()
    def reset(self) -> None:
        for r in range(self.max_batch):
            self.cache.clear(r)
