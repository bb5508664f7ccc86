"""tb-llm's PyTorch backend: every kernel of ``torchburn.llm.protocol``, on any PyTorch device.

It runs models when no engine backend is installed, and whatever an engine backend declines
(see :mod:`tb_llm.composed`). The kernels are tb-core's reference math
(``torchburn.llm.reference``) with faster PyTorch paths where they exist.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.functional as F

from torchburn.llm import reference
from torchburn.llm.activation import Activation
from torchburn.llm.errors import BackendError
from torchburn.llm.protocol import PROTOCOL_VERSION
from torchburn.llm.weights import EmbeddingTable, QuantWeight, unpack_int4

log = logging.getLogger("tb_llm")


class _Dense:
    __slots__ = ("weight",)

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight


class _Int8:
    __slots__ = ("fast", "qweight", "scales")

    def __init__(self, qweight: torch.Tensor, scales: torch.Tensor, fast: bool) -> None:
        self.qweight, self.scales, self.fast = qweight, scales, fast


class _Int4:
    __slots__ = ("group_size", "packed", "scales_zeros", "w")

    def __init__(self, w: QuantWeight, packed: torch.Tensor | None, scales_zeros: torch.Tensor | None) -> None:
        self.w, self.packed, self.scales_zeros, self.group_size = w, packed, scales_zeros, w.group_size


class ReferenceBackend:
    """Every kernel in plain PyTorch; quantized matmuls use PyTorch's packed CPU kernels when
    they exist (``_weight_int8pack_mm``, ``_weight_int4pack_mm_for_cpu``) and dequantize
    otherwise."""

    name = "reference"
    protocol_version = PROTOCOL_VERSION

    def __init__(self, device: str | torch.device = "cpu") -> None:
        self.device = torch.device(device)
        cpu = self.device.type == "cpu"
        self._int8_mm = cpu and hasattr(torch.ops.aten, "_weight_int8pack_mm")
        self._int4_mm = cpu and hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")

    def compute_dtype(self, quant: str) -> torch.dtype:
        return torch.bfloat16 if quant == "bf16" else torch.float32

    def head_quant(self, quant: str) -> str:
        # PyTorch has no fast quantized GEMV: on a 150k-row head, int8 -> bf16 on the fly costs
        # 8x a bf16 GEMV. The reference keeps the head bf16 for int8 / int4 models.
        return "bf16" if quant in ("int8", "int4") else quant

    # -- weights ------------------------------------------------------------------------
    def prepare_linear(self, w: QuantWeight) -> Any:
        if w.kind in ("fp32", "bf16"):
            assert w.weight is not None
            return _Dense(w.weight.to(self.device))
        if w.kind == "int8":
            assert w.qweight is not None and w.scales is not None
            return _Int8(w.qweight.to(self.device), w.scales.to(self.device), self._int8_mm)
        if w.kind == "int4":
            if self._int4_mm:
                try:
                    return self._repack_int4(w)
                except RuntimeError as exc:  # shape constraints of the packed kernel
                    log.debug("int4 packed kernel unavailable for %s: %s", w.shape, exc)
            return _Int4(w, None, None)
        raise BackendError(f"reference backend: unknown weight kind {w.kind!r}")

    def _repack_int4(self, w: QuantWeight) -> _Int4:
        assert w.qweight is not None and w.scales is not None and w.zeros is not None
        q = unpack_int4(w.qweight).to(torch.int32)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
        sz = torch.stack((w.scales, w.zeros), dim=-1).transpose(0, 1).contiguous()
        # The packed layout is private to PyTorch: check it against our own dequantization once.
        probe = torch.randn(2, w.shape[1])
        got = torch.ops.aten._weight_int4pack_mm_for_cpu(probe, packed, w.group_size, sz)
        want = probe @ w.dequantize().T
        if not torch.allclose(got, want, rtol=1e-3, atol=1e-3 * float(want.abs().max()) + 1e-5):
            raise RuntimeError("PyTorch int4 packed kernel disagrees with the documented layout")
        return _Int4(w, packed, sz)

    # -- kernels ------------------------------------------------------------------------
    # Measured on x86 CPUs with PyTorch 2.x: the packed int8/int4 kernels are fine for one row
    # but 10-50x slower than a dense GEMM for prefill, while a bf16 GEMM on freshly dequantized
    # weights is fast for many rows. So: packed int4 kernel for decode rows, dequantize for
    # prefill; int8 always goes through bf16 (int8 -> bf16 is exact, bf16 GEMMs accumulate in fp32).
    SMALL_M = 4

    def linear(self, x: torch.Tensor, handle: Any, bias: torch.Tensor | None) -> torch.Tensor:
        if isinstance(handle, _Dense):
            if x.dtype != handle.weight.dtype:  # a bf16 head in an fp32-activation model
                y = F.linear(x.to(handle.weight.dtype), handle.weight).to(x.dtype)
                return y if bias is None else y + bias
            return F.linear(x, handle.weight, bias)
        if isinstance(handle, _Int8):
            y = (F.linear(x.to(torch.bfloat16), handle.qweight.to(torch.bfloat16)).float() * handle.scales).to(x.dtype)
        elif isinstance(handle, _Int4):
            if handle.packed is not None and x.shape[0] <= self.SMALL_M:
                y = torch.ops.aten._weight_int4pack_mm_for_cpu(
                    x.float(), handle.packed, handle.group_size, handle.scales_zeros
                )
                y = y.to(x.dtype)
            else:
                y = F.linear(x.to(torch.bfloat16), handle.w.dequantize(torch.bfloat16)).to(x.dtype)
        else:
            raise BackendError(f"reference backend: not a handle it prepared: {type(handle).__name__}")
        return y if bias is None else y + bias

    def embedding(self, ids: torch.Tensor, table: EmbeddingTable) -> torch.Tensor:
        return table.rows(ids, self.compute_dtype(table.kind))

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float) -> torch.Tensor:
        return reference.rms_norm(x, weight, eps, offset)

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return reference.rope(x, cos, sin)

    def attention(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float, softcap: float | None
    ) -> torch.Tensor:
        h, kv, t = q.shape[1], k.shape[1], q.shape[2]
        if softcap is None and q.dtype == torch.float32 and t > 1:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=kv != h)
        return reference.attention(q, k, v, mask, scale, softcap)

    def gated_act(self, gate: torch.Tensor, up: torch.Tensor, act: Activation | str) -> torch.Tensor:
        return reference.gated_act(gate, up, act)
