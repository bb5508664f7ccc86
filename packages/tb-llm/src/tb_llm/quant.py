"""Load-time weight quantization and its storage layouts (the contract with engine kernels).

``QuantWeight`` is what a backend's ``prepare_linear`` receives. Layouts, for a weight of shape
``[N, K]`` (``N`` output features, ``K`` input features, row-major as in ``nn.Linear``):

* ``fp32`` / ``bf16``: ``weight`` is ``[N, K]`` in that dtype.
* ``int8``: symmetric, one scale per output channel. ``qweight`` int8 ``[N, K]`` in [-127, 127],
  ``scales`` float32 ``[N]``; ``w[n, k] = qweight[n, k] * scales[n]``.
* ``int4``: asymmetric, group-wise along ``K`` (group size ``G`` in 32/64/128, ``K % G == 0``).
  ``qweight`` uint8 ``[N, K // 2]``: byte ``j`` of row ``n`` holds column ``2j`` in its low nibble
  and column ``2j + 1`` in its high nibble; nibbles are unsigned 0..15. ``scales`` and ``zeros``
  are float32 ``[N, K // G]`` tensors whose values are all float16 values (the quantizer rounds
  them), so a backend may store them as float16 and lose nothing (tb-cpu-rust does: 0.625 bytes
  per weight at G = 32 instead of 0.75); ``w[n, k] = (q[n, k] - 8) * scales[n, k // G] +
  zeros[n, k // G]``. (This is the scale/zero convention of PyTorch's ``_weight_int4pack_mm``, so
  a backend can repack without re-rounding.) A matrix whose ``K`` is not a multiple of ``G`` is
  stored as int8.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

QUANTS = ("fp32", "bf16", "int8", "int4")
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


def quantize(weight: torch.Tensor, kind: str, group_size: int = 32) -> QuantWeight:
    shape = (int(weight.shape[0]), int(weight.shape[1]))
    if kind == "fp32":
        return QuantWeight("fp32", shape, weight=weight if weight.dtype == torch.float32 else weight.float())
    if kind == "bf16":
        return QuantWeight("bf16", shape, weight=weight.to(torch.bfloat16))
    if kind == "int8" or (kind == "int4" and shape[1] % group_size):
        return quantize_int8(weight)
    if kind == "int4":
        return quantize_int4(weight, group_size)
    raise ValueError(f"unknown quantization {kind!r}; choose one of {', '.join(QUANTS)}")


def quantize_int8(weight: torch.Tensor) -> QuantWeight:
    w = weight.float()
    scales = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0
    q = torch.round(w / scales[:, None]).clamp_(-127, 127).to(torch.int8)
    return QuantWeight("int8", (w.shape[0], w.shape[1]), qweight=q, scales=scales)


def quantize_int4(weight: torch.Tensor, group_size: int = 32) -> QuantWeight:
    if group_size not in GROUP_SIZES:
        raise ValueError(f"int4 group size must be one of {GROUP_SIZES}, got {group_size}")
    n, k = weight.shape
    w = weight.float().reshape(n, k // group_size, group_size)
    lo = w.amin(dim=-1)
    hi = w.amax(dim=-1)
    # Scale and zero are rounded to float16 values (the scale's floor is float16's smallest,
    # 2**-24, so it never rounds to 0), and the codes are taken against the rounded pair.
    scales = ((hi - lo) / 15.0).clamp(min=2.0**-24).to(torch.float16).float()
    zeros = (lo + 8.0 * scales).to(torch.float16).float()
    if not (torch.isfinite(scales).all() and torch.isfinite(zeros).all()):
        rows = int((~(torch.isfinite(scales) & torch.isfinite(zeros))).any(dim=-1).sum())
        raise ValueError(
            f"int4: {rows} row(s) have a group whose range is beyond float16 (|value| > 65504), which "
            "int4's float16 scales and zeros cannot hold; quantize this weight to int8 or keep it in bf16 / fp32"
        )
    q = (torch.round((w - zeros.unsqueeze(-1)) / scales.unsqueeze(-1)) + 8.0).clamp_(0, 15).to(torch.uint8).reshape(n, k)
    return QuantWeight("int4", (n, k), qweight=pack_int4(q), scales=scales, zeros=zeros, group_size=group_size)


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """uint8 [.., K] with values 0..15 -> uint8 [.., K // 2], even column in the low nibble."""
    return (q[..., 0::2] | (q[..., 1::2] << 4)).contiguous()


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    low = packed & 0x0F
    high = packed >> 4
    return torch.stack((low, high), dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)
