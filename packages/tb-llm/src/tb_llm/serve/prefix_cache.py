"""Prefix cache: requests (and chat turns) that start with the same tokens reuse their keys and values.

A sequence is cut into blocks of ``block_tokens`` tokens. Block ``i`` is keyed by a chained hash:
``key_i = blake2b(key_{i-1} || tokens of block i)``, so a key names the *whole* prefix up to the
end of its block, not just the block's own tokens. Each entry holds copies of the block's keys
and values for every layer (``[layers, kv_heads, block_tokens, head_dim]`` each), plus its tokens
and its parent's key, which a lookup compares too: a hash collision can never hand a request
another prefix's keys.

Keys and values of a token depend only on the tokens before it and its position, so a block
holds the same keys and values whichever request computed it, as long as it sits at the same
positions, which holds by construction (a prefix always starts at position 0). That is true
with sliding-window attention as well: the batching cache keeps every slot and the window is a
mask over positions, so the prefix's slots are exactly what prefilling it would have written.
It does not hold for RoPE whose frequencies depend on the sequence's length (``dynamic``
NTK scaling, LongRoPE): their keys change with how long the sequence was when they were
computed, so :func:`reuse_blocker` turns the cache off for them.

Bounded by ``budget_bytes``; when full, the least recently used blocks go first. Using a block
also marks every block before it in its chain (deepest first), so a parent is always at least
as recent as its children and eviction takes leaves before the prefixes they hang from.

Only the scheduler thread calls :meth:`lookup` and :meth:`insert`; other threads only read
the counters (plain ints, for ``/metrics``).
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

ROOT = b""  # the parent key of block 0


def block_keys(tokens: Sequence[int], block_tokens: int, blocks: int) -> list[bytes]:
    """The chained keys of the first ``blocks`` full blocks of ``tokens``."""
    keys, parent = [], ROOT
    for i in range(blocks):
        chunk = array("q", tokens[i * block_tokens : (i + 1) * block_tokens]).tobytes()
        parent = hashlib.blake2b(parent + chunk, digest_size=16).digest()
        keys.append(parent)
    return keys


@dataclass
class Block:
    key: bytes
    parent: bytes
    tokens: tuple[int, ...]
    k: torch.Tensor  # [layers, kv_heads, block_tokens, head_dim]
    v: torch.Tensor

    @property
    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()


def reuse_blocker(rope_type: str) -> str | None:
    """Why a model's keys cannot be reused across requests, or ``None`` when they can."""
    if rope_type in ("dynamic", "longrope"):
        return (
            f"{rope_type} RoPE picks its frequencies from the sequence's length, so a prefix's keys "
            "depend on the request that computed them"
        )
    return None


class PrefixCache:
    def __init__(self, budget_bytes: int, block_tokens: int = 32) -> None:
        if budget_bytes < 0:
            raise ValueError(f"the prefix cache budget must be >= 0 bytes, got {budget_bytes}")
        if block_tokens < 1:
            raise ValueError(f"prefix cache blocks must hold >= 1 token, got {block_tokens}")
        self.budget_bytes = budget_bytes
        self.block_tokens = block_tokens
        self._blocks: OrderedDict[bytes, Block] = OrderedDict()  # least recently used first
        self.bytes_held = 0
        # counters (only ever grow)
        self.hits = 0  # lookups that reused at least one block
        self.misses = 0  # lookups that reused none
        self.tokens_reused = 0
        self.tokens_looked_up = 0
        self.inserted_blocks = 0
        self.evictions = 0  # blocks evicted for room

    def __len__(self) -> int:
        return len(self._blocks)

    @property
    def enabled(self) -> bool:
        return self.budget_bytes > 0

    def _touch(self, keys: Sequence[bytes]) -> None:
        # deepest first: the chain's root ends most recent, so eviction takes leaves first
        for key in reversed(keys):
            if key in self._blocks:
                self._blocks.move_to_end(key)

    def lookup(self, tokens: Sequence[int], limit: int | None = None) -> list[Block]:
        """The longest run of cached blocks that ``tokens`` starts with, covering at most
        ``limit`` tokens (default: all but the last token, which must be run for its logits)."""
        if not self.enabled:
            return []
        limit = len(tokens) - 1 if limit is None else min(limit, len(tokens))
        b = self.block_tokens
        n = max(limit, 0) // b
        found: list[Block] = []
        parent = ROOT
        for i, key in enumerate(block_keys(tokens, b, n)):
            block = self._blocks.get(key)
            if block is None or block.parent != parent or block.tokens != tuple(tokens[i * b : (i + 1) * b]):
                break
            found.append(block)
            parent = key
        self._touch([blk.key for blk in found])
        self.tokens_looked_up += len(tokens)
        if found:
            self.hits += 1
            self.tokens_reused += len(found) * b
        else:
            self.misses += 1
        return found

    def insert(self, tokens: Sequence[int], read: Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]) -> int:
        """Cache every full block of ``tokens`` not cached yet; ``read(start, end)`` returns the
        keys and values of slots ``start..end`` (``[layers, kv_heads, n, head_dim]``, copies).
        Returns the blocks added. The chain being inserted is never evicted to make room for
        itself: when the budget cannot hold more, the rest of it is left out."""
        if not self.enabled:
            return 0
        b = self.block_tokens
        keys = block_keys(tokens, b, len(tokens) // b)
        first_new = 0
        parent = ROOT
        for i, key in enumerate(keys):
            block = self._blocks.get(key)
            if block is None or block.parent != parent or block.tokens != tuple(tokens[i * b : (i + 1) * b]):
                break
            first_new, parent = i + 1, key
        if first_new == len(keys):
            self._touch(keys)
            return 0
        # read every new block in one copy, then split it (one clone per block: evicting one
        # block frees its memory)
        k_all, v_all = read(first_new * b, len(keys) * b)
        per_block = (k_all.numel() * k_all.element_size() + v_all.numel() * v_all.element_size()) // (
            len(keys) - first_new
        )
        chain = set(keys[:first_new])
        added = 0
        for j, i in enumerate(range(first_new, len(keys))):
            if not self._make_room(per_block, chain):
                break
            key = keys[i]
            stale = self._blocks.pop(key, None)  # same hash, other prefix: replace it
            if stale is not None:
                self.bytes_held -= stale.nbytes
            block = Block(
                key,
                parent,
                tuple(tokens[i * b : (i + 1) * b]),
                k_all[:, :, j * b : (j + 1) * b].clone(),
                v_all[:, :, j * b : (j + 1) * b].clone(),
            )
            self._blocks[key] = block
            self.bytes_held += block.nbytes
            chain.add(key)
            parent = key
            added += 1
        self.inserted_blocks += added
        self._touch(keys[: first_new + added])
        return added

    def _make_room(self, need: int, keep: set[bytes]) -> bool:
        if need > self.budget_bytes:
            return False
        while self.bytes_held + need > self.budget_bytes:
            victim = next((key for key in self._blocks if key not in keep), None)
            if victim is None:
                return False
            self.bytes_held -= self._blocks.pop(victim).nbytes
            self.evictions += 1
        return True

    def clear(self) -> None:
        self._blocks.clear()
        self.bytes_held = 0

    def stats(self) -> dict[str, Any]:
        return {
            "enabled": self.enabled,
            "block_tokens": self.block_tokens,
            "budget_bytes": self.budget_bytes,
            "bytes_held": self.bytes_held,
            "blocks": len(self._blocks),
            "hits": self.hits,
            "misses": self.misses,
            "tokens_reused": self.tokens_reused,
            "tokens_looked_up": self.tokens_looked_up,
            "evictions": self.evictions,
        }
