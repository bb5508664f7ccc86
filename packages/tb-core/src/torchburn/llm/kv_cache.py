"""The KV cache a model step reads and writes: one ``[B, KV, capacity, D]`` buffer per layer.

Slots are filled left to right for the whole batch together. ``pos[b, s]`` is the token
position stored in slot ``s`` of row ``b`` (-1: empty or padding), so left-padded batches and
sliding windows are masks over slots, and a chat turn can rewind to a shared prefix.

A forward pass of ``T`` positions follows one protocol, whoever runs it (tb-llm's per-kernel
path or an engine's compiled step, see ``torchburn.llm.protocol``):

1. ``begin(positions)`` claims slots ``length .. length + T`` (it may grow the buffers);
2. the keys and values of layer ``i`` go into those slots, either through ``write(i, k, v)``
   or by writing the buffers ``keys(i)`` / ``values(i)`` in place at exactly those slots;
3. ``commit(T)`` makes them part of the cache.

What a padding slot (position -1) holds is unspecified: attention never reads it.

An engine that binds the buffers once (a native pointer, a device copy) rebinds when
``generation`` changes: ``reserve`` replaces every buffer when it grows. ``capacity``,
``length``, ``pos`` and ``generation`` are for reading; only the methods change the cache.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch


def zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """``torch.zeros(shape)``, but on the CPU without a parallel fill: the memory comes zeroed
    from ``calloc`` (a ``bytearray``). ``torch.zeros`` fills a buffer of more than 32k elements on
    the intra-op thread pool, and on a machine whose cores are busy each such fill waits for the
    pool's threads to be scheduled: 5-15 ms per buffer measured on a loaded 2-core VM, so over a
    second for the 60 buffers of a 30-layer model's cache, at every ``generate``."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    n = math.prod(shape)
    if n == 0:
        return torch.zeros(shape, dtype=dtype)
    return torch.frombuffer(bytearray(n * dtype.itemsize), dtype=dtype).view(shape)


class CacheLike(Protocol):
    """The surface a forward pass uses: :class:`KVCache` and any view that adapts other storage
    (tb-llm's server keeps one row per request, each at its own length)."""

    length: int

    @property
    def pos(self) -> torch.Tensor: ...

    def begin(self, positions: torch.Tensor) -> None: ...

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...

    def commit(self, t: int) -> None: ...


class KVCache:
    def __init__(
        self,
        num_layers: int,
        batch: int,
        num_kv_heads: int,
        head_dim: int,
        capacity: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.num_layers, self.batch, self.kv_heads, self.head_dim = num_layers, batch, num_kv_heads, head_dim
        self.dtype, self.device = dtype, device
        self.capacity = 0
        self.length = 0
        self.generation = 0
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self.pos = torch.empty(batch, 0, dtype=torch.long, device=device)
        # the token id in each slot, kept for LongRoPE models only: lets the model re-encode the
        # cached sequence when its RoPE frequencies change with length (crossing the original context)
        self.tokens = torch.empty(batch, 0, dtype=torch.long, device=device)
        self.reserve(capacity)

    def keys(self, layer: int) -> torch.Tensor:
        """Layer ``layer``'s whole key buffer ``[B, KV, capacity, D]`` (slots past ``length`` unused)."""
        return self.k[layer]

    def values(self, layer: int) -> torch.Tensor:
        return self.v[layer]

    def reserve(self, capacity: int) -> None:
        """Grow to hold at least ``capacity`` slots (doubling, so chats re-allocate rarely)."""
        if capacity <= self.capacity:
            return
        new = max(capacity, 2 * self.capacity)
        shape = (self.batch, self.kv_heads, new, self.head_dim)
        ks, vs = [], []
        for i in range(self.num_layers):
            k = zeros(shape, self.dtype, self.device)
            v = zeros(shape, self.dtype, self.device)
            if self.length:
                k[:, :, : self.length] = self.k[i][:, :, : self.length]
                v[:, :, : self.length] = self.v[i][:, :, : self.length]
            ks.append(k)
            vs.append(v)
        self.k, self.v = ks, vs
        pos = torch.full((self.batch, new), -1, dtype=torch.long, device=self.device)
        pos[:, : self.length] = self.pos[:, : self.length]
        tokens = zeros((self.batch, new), torch.long, self.device)
        tokens[:, : self.length] = self.tokens[:, : self.length]
        self.pos, self.tokens = pos, tokens
        self.capacity = new
        self.generation += 1

    def begin(self, positions: torch.Tensor) -> None:
        """Claim slots for ``positions`` ``[B, T]`` (-1 = padding) before a forward pass."""
        t = positions.shape[1]
        self.reserve(self.length + t)
        self.pos[:, self.length : self.length + t] = positions

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store this step's ``[B, KV, T, D]`` keys/values; return the views attention reads."""
        t = k.shape[2]
        end = self.length + t
        self.k[layer][:, :, self.length : end] = k
        self.v[layer][:, :, self.length : end] = v
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]

    def commit(self, t: int) -> None:
        self.length += t

    def truncate(self, length: int) -> None:
        """Forget every slot from ``length`` on (a chat turn that diverges from the cache)."""
        self.length = min(self.length, length)
        self.pos[:, self.length :] = -1

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)
