"""KV cache for continuous batching: every batch row keeps its own length.

tb-llm's :class:`~tb_llm.kv_cache.KVCache` fills slots left to right for the whole batch
together, which suits one ``generate`` call but not a server where sequences join and leave at
every step. Here row ``r`` holds one sequence whose token at position ``p`` sits in slot ``p``;
rows grow independently. ``Decoder.forward`` only needs the duck-typed surface ``length``,
``pos``, ``begin``, ``write`` and ``commit``, so two small views adapt this storage to it:

* :class:`PrefillView` feeds one row a whole prompt;
* :class:`DecodeView` feeds rows ``0..n-1`` one token each, at their own positions.

Live rows are kept packed at the front (a finishing row is replaced by the last one), so the
decode view is a plain slice of the buffers rather than a gather.

Keys and values live in one ``[layers, rows, kv_heads, capacity, head_dim]`` buffer each
(``k[i]`` / ``v[i]`` are views of layer ``i``), so the prefix cache copies a run of slots of
every layer in one operation (:meth:`read` / :meth:`load`).
"""

from __future__ import annotations

import torch

from torchburn.llm.kv_cache import zeros


class SlotCache:
    def __init__(
        self,
        num_layers: int,
        rows: int,
        kv_heads: int,
        head_dim: int,
        capacity: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.num_layers, self.rows, self.kv_heads, self.head_dim = num_layers, rows, kv_heads, head_dim
        self.dtype, self.device = dtype, device
        self.capacity = 0
        self.kbuf = torch.empty(0, dtype=dtype, device=device)
        self.vbuf = torch.empty(0, dtype=dtype, device=device)
        self.k: list[torch.Tensor] = []  # layer views of kbuf
        self.v: list[torch.Tensor] = []
        self.pos = torch.empty(rows, 0, dtype=torch.long, device=device)
        self.lens = [0] * rows  # tokens held by each row
        self.reserve(capacity)

    def reserve(self, capacity: int) -> None:
        """Grow every row to at least ``capacity`` slots (doubling, so growth is rare)."""
        if capacity <= self.capacity:
            return
        new = max(capacity, 2 * self.capacity)
        shape = (self.num_layers, self.rows, self.kv_heads, new, self.head_dim)
        keep = max(self.lens) if self.capacity else 0
        k = zeros(shape, self.dtype, self.device)  # calloc'd on the CPU: no parallel fill (see zeros)
        v = zeros(shape, self.dtype, self.device)
        pos = torch.full((self.rows, new), -1, dtype=torch.long, device=self.device)
        if keep:
            k[:, :, :, :keep] = self.kbuf[:, :, :, :keep]
            v[:, :, :, :keep] = self.vbuf[:, :, :, :keep]
            pos[:, :keep] = self.pos[:, :keep]
        self.kbuf, self.vbuf, self.pos, self.capacity = k, v, pos, new
        self.k, self.v = list(k.unbind(0)), list(v.unbind(0))

    def clear(self, row: int) -> None:
        self.pos[row] = -1
        self.lens[row] = 0

    def truncate(self, row: int, length: int) -> None:
        """Forget row ``row``'s slots from ``length`` on (they read as padding: position -1)."""
        if not 0 <= length <= self.lens[row]:
            raise ValueError(f"row {row} holds {self.lens[row]} tokens; cannot keep {length}")
        self.pos[row, length:] = -1
        self.lens[row] = length

    def move(self, src: int, dst: int) -> None:
        """Copy row ``src`` into row ``dst`` and free ``src`` (keeps live rows packed)."""
        if src == dst:
            return
        n = self.lens[src]
        self.kbuf[:, dst, :, :n] = self.kbuf[:, src, :, :n]
        self.vbuf[:, dst, :, :n] = self.vbuf[:, src, :, :n]
        self.pos[dst] = self.pos[src]
        self.lens[dst] = n
        self.clear(src)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.kbuf, self.vbuf))

    def read(self, row: int, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of row ``row``'s keys and values in slots ``start..end``, every layer:
        ``[layers, kv_heads, end - start, head_dim]`` each."""
        if not 0 <= start <= end <= self.lens[row]:
            raise ValueError(f"slots {start}..{end} are not all filled in row {row} ({self.lens[row]} are)")
        return self.kbuf[:, row, :, start:end].clone(), self.vbuf[:, row, :, start:end].clone()

    def load(self, row: int, ks: list[torch.Tensor], vs: list[torch.Tensor]) -> int:
        """Fill the empty row ``row`` with the consecutive runs ``ks`` / ``vs`` (each
        ``[layers, kv_heads, n, head_dim]``) at positions 0.. on; return the tokens it now holds."""
        if self.lens[row]:
            raise ValueError(f"row {row} is not empty")
        total = sum(k.shape[2] for k in ks)
        self.reserve(total)
        at = 0
        for k, v in zip(ks, vs):
            n = k.shape[2]
            self.kbuf[:, row, :, at : at + n] = k
            self.vbuf[:, row, :, at : at + n] = v
            at += n
        self.pos[row, :total] = torch.arange(total, dtype=torch.long, device=self.device)
        self.lens[row] = total
        return total

    def prefill_view(self, row: int) -> PrefillView:
        return PrefillView(self, row)

    def decode_view(self, n: int) -> DecodeView:
        return DecodeView(self, n)


class PrefillView:
    """Row ``row`` as a batch of one, for ``Decoder.forward(ids [1, T], positions [1, T])``."""

    def __init__(self, cache: SlotCache, row: int) -> None:
        self.cache, self.row = cache, row
        self.length = cache.lens[row]

    @property
    def pos(self) -> torch.Tensor:
        return self.cache.pos[self.row : self.row + 1]

    def begin(self, positions: torch.Tensor) -> None:
        t = positions.shape[1]
        self.cache.reserve(self.length + t)
        self.cache.pos[self.row, self.length : self.length + t] = positions[0]

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        c, r = self.cache, self.row
        end = self.length + k.shape[2]
        c.k[layer][r, :, self.length : end] = k[0]
        c.v[layer][r, :, self.length : end] = v[0]
        return c.k[layer][r : r + 1, :, :end], c.v[layer][r : r + 1, :, :end]

    def commit(self, t: int) -> None:
        self.cache.lens[self.row] += t
        self.length += t


class DecodeView:
    """Rows ``0..n-1``, one new token each at the row's own next slot.

    ``length`` is the longest row, so attention reads ``length + 1`` slots of every row; the
    slots a shorter row has not filled hold position -1 and are masked out by the model.
    """

    def __init__(self, cache: SlotCache, n: int) -> None:
        self.cache, self.n = cache, n
        self.length = max(cache.lens[:n])
        self._rows = torch.arange(n, device=cache.device)
        self._cols = torch.tensor(cache.lens[:n], dtype=torch.long, device=cache.device)

    @property
    def pos(self) -> torch.Tensor:
        return self.cache.pos[: self.n]

    def begin(self, positions: torch.Tensor) -> None:
        if positions.shape[1] != 1:
            raise ValueError("a decode step feeds exactly one token per row")
        self.cache.reserve(self.length + 1)
        self.cache.pos[self._rows, self._cols] = positions[:, 0]

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        c, end = self.cache, self.length + 1
        c.k[layer][self._rows, :, self._cols] = k[:, :, 0]
        c.v[layer][self._rows, :, self._cols] = v[:, :, 0]
        return c.k[layer][: self.n, :, :end], c.v[layer][: self.n, :, :end]

    def commit(self, t: int) -> None:
        for i in range(self.n):
            self.cache.lens[i] += t
        self.length += t
