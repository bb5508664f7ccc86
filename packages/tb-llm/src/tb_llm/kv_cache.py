"""The preallocated KV cache: tb-core's :class:`torchburn.llm.kv_cache.KVCache` (engines write to
it without importing tb-llm), under the name tb-llm has always exported."""

from __future__ import annotations

from torchburn.llm.kv_cache import KVCache

__all__ = ["KVCache"]
