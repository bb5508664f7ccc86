"""The weight formats a backend's ``prepare_linear`` receives: dense, int8 per row, int4 group-wise.

``QuantWeight`` holds one matrix of shape ``[N, K]`` (``N`` output features, ``K`` input
features, row-major as in ``nn.Linear``) in one of these layouts (``kind``):

* ``fp32`` / ``bf16``: ``weight`` is ``[N, K]`` in that dtype.
* ``int8``: symmetric, one scale per output row. ``qweight`` int8 ``[N, K]`` in [-127, 127]
  (never -128), ``scales`` float32 ``[N]``; ``w[n, k] = qweight[n, k] * scales[n]``.
* ``int4``: asymmetric, group-wise along ``K`` (group size ``G`` in :data:`GROUP_SIZES`,
  ``K % G == 0``). ``qweight`` uint8 ``[N, K // 2]``: byte ``j`` of row ``n`` holds column ``2j``
  in its low nibble and column ``2j + 1`` in its high nibble; nibbles are unsigned 0..15.
  ``scales`` and ``zeros`` are float32 ``[N, K // G]`` tensors whose values are all float16
  values (the quantizer rounds them), so a backend may store them as float16 and lose nothing;
  ``w[n, k] = (q[n, k] - 8) * scales[n, k // G] + zeros[n, k // G]``. This is the scale / zero
  convention of PyTorch's ``_weight_int4pack_mm``, so a backend can repack without re-rounding.
  A matrix whose ``K`` is not a multiple of ``G`` is stored as int8 (see
  :func:`torchburn.llm.quantize`).

``dequantize`` and ``rows`` are the numerical definition of each layout: a backend's products
must equal ``x @ w.dequantize().T`` up to its documented rounding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

#: Weight storages tb-llm asks for (``quant=``), in order of size.
QUANTS = ("fp32", "bf16", "int8", "int4")
#: int4 group sizes along ``K``.
GROUP_SIZES = (32, 64, 128)


@dataclass
class QuantWeight:
    kind: str  # "fp32" | "bf16" | "int8" | "int4"
    shape: tuple[int, int]  # (N, K)
    weight: torch.Tensor | None = None
    qweight: torch.Tensor | None = None
    scales: torch.Tensor | None = None
    zeros: torch.Tensor | None = None
    group_size: int = 0

    def nbytes(self) -> int:
        return sum(
            t.numel() * t.element_size() for t in (self.weight, self.qweight, self.scales, self.zeros) if t is not None
        )

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self.rows(None, dtype)

    def rows(self, ids: torch.Tensor | None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Rows ``ids`` (all rows when None) as a dense tensor: the embedding lookup."""

        def pick(t: torch.Tensor) -> torch.Tensor:
            return t if ids is None else t[ids]

        if self.kind in ("fp32", "bf16"):
            assert self.weight is not None
            return pick(self.weight).to(dtype)
        assert self.qweight is not None and self.scales is not None
        if self.kind == "int8":
            return (pick(self.qweight).to(torch.float32) * pick(self.scales).unsqueeze(-1)).to(dtype)
        assert self.zeros is not None
        q = unpack_int4(pick(self.qweight)).to(torch.float32)
        g = self.group_size
        q = q.reshape(*q.shape[:-1], q.shape[-1] // g, g)
        w = (q - 8.0) * pick(self.scales).unsqueeze(-1) + pick(self.zeros).unsqueeze(-1)
        return w.reshape(*w.shape[:-2], -1).to(dtype)


class EmbeddingTable(Protocol):
    """What the embedding lookup reads: a :class:`QuantWeight`, or the object a backend's
    ``embedding_table(handle)`` returns to serve rows from its prepared weight."""

    kind: str
    shape: tuple[int, int]

    def rows(self, ids: torch.Tensor | None, dtype: torch.dtype = torch.float32) -> torch.Tensor: ...


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """uint8 [.., K] with values 0..15 -> uint8 [.., K // 2], even column in the low nibble."""
    return (q[..., 0::2] | (q[..., 1::2] << 4)).contiguous()


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    low = packed & 0x0F
    high = packed >> 4
    return torch.stack((low, high), dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)
