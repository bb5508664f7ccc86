"""tb-llm's ``native_cpu`` backend: the hot decode kernels of a decoder step in Rust.

Loaded by tb-llm through the ``tb_register_llm_backends`` hook (``tb_cpu_rust.plugin``); it
implements ``tb_llm.backends.KernelBackend`` and inherits what it does not speed up from
tb-llm's PyTorch ``ReferenceBackend``.

* Weights are packed once at load time into Rust-owned layouts (``_native.LLMWeight``):
  int8 per output channel, int4 group-wise (re-laid so one AND / shift yields 64 in-order
  nibbles), bf16 and fp32. Activations stay float32 for every quantization; int8 / int4
  GEMVs quantize them to int8 per block of 32 values and use integer dot products
  (AVX-512 VNNI where the CPU has it), multithreaded over output rows.
* RMSNorm, the gated MLP activation, RoPE and attention of a few query positions over the KV
  cache are one native call each. Prefill-sized attention and dense GEMMs (more than
  ``SMALL_M`` rows) go to PyTorch, whose GEMMs are made for that.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from tb_cpu_rust import _native
from tb_llm.backends import ReferenceBackend
from tb_llm.errors import BackendError
from tb_llm.quant import QuantWeight


def _arg(t: torch.Tensor) -> tuple[int, tuple[int, ...], tuple[int, ...], str]:
    return (t.data_ptr(), tuple(t.shape), t.stride(), str(t.dtype))


class _Dense:
    """A dense weight: the packed copy for GEMVs, the tensor for prefill GEMMs."""

    __slots__ = ("packed", "weight")

    def __init__(self, packed: Any, weight: torch.Tensor) -> None:
        self.packed, self.weight = packed, weight


class NativeLLMBackend(ReferenceBackend):
    name = "native_cpu"
    #: More activation rows than this: dense weights use PyTorch's GEMM, attention uses SDPA.
    SMALL_M = 8

    def __init__(self, device: str | torch.device = "cpu") -> None:
        super().__init__(device)
        if self.device.type != "cpu":
            raise BackendError(f"native_cpu LLM backend runs on the CPU, not {self.device}")
        self.isa = _native.llm_isa()

    def compute_dtype(self, quant: str) -> torch.dtype:
        # bf16 weights widen exactly to f32 in-register; f32 activations keep every kernel one dtype.
        return torch.float32

    def head_quant(self, quant: str) -> str:
        # The quantized GEMV is fast here, so int4 models keep the head at int8 (llama.cpp's default).
        return "int8" if quant in ("int8", "int4") else quant

    # -- weights ------------------------------------------------------------------------
    def prepare_linear(self, w: QuantWeight) -> Any:
        if w.kind in ("fp32", "bf16"):
            assert w.weight is not None
            weight = w.weight.contiguous()
            return _Dense(_native.llm_pack_dense(_arg(weight)), weight)
        if w.kind == "int8":
            assert w.qweight is not None and w.scales is not None
            q, s = w.qweight.contiguous(), w.scales.float().contiguous()
            return _native.llm_pack_int8(_arg(q), _arg(s))
        if w.kind == "int4":
            assert w.qweight is not None and w.scales is not None and w.zeros is not None
            q, s, z = w.qweight.contiguous(), w.scales.float().contiguous(), w.zeros.float().contiguous()
            return _native.llm_pack_int4(_arg(q), _arg(s), _arg(z), w.group_size)
        raise BackendError(f"native_cpu backend: unknown weight kind {w.kind!r}")

    # -- kernels ------------------------------------------------------------------------
    def linear(self, x: torch.Tensor, handle: Any, bias: torch.Tensor | None) -> torch.Tensor:
        x = x.float().contiguous()
        packed = handle
        if isinstance(handle, _Dense):
            if x.shape[0] > self.SMALL_M:
                # f32 GEMM (bf16 weights widened once per call): the same numbers as the GEMV path
                y = F.linear(x, handle.weight.float())
                return y if bias is None else y + bias
            packed = handle.packed
        if not isinstance(packed, _native.LLMWeight):
            raise BackendError(f"native_cpu backend: not a handle it prepared: {type(handle).__name__}")
        out = torch.empty(x.shape[0], packed.shape[0], dtype=torch.float32)
        packed.linear(_arg(x), _arg(out), None if bias is None else _arg(bias.float().contiguous()))
        return out

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float) -> torch.Tensor:
        if x.dtype != torch.float32:
            return super().rms_norm(x, weight, eps, offset)
        x2 = x.reshape(-1, x.shape[-1]).contiguous()
        out = torch.empty_like(x2)
        _native.llm_rms_norm(_arg(x2), _arg(weight.float().contiguous()), _arg(out), eps, float(offset))
        return out.view(x.shape)

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or x.dim() != 4 or cos.shape[0] != x.shape[0]:
            return super().rope(x, cos, sin)
        out = torch.empty(x.shape, dtype=torch.float32)
        _native.llm_rope(_arg(_unit_last(x)), _arg(_unit_last(cos.float())), _arg(_unit_last(sin.float())), _arg(out))
        return out

    def attention(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float, softcap: float | None
    ) -> torch.Tensor:
        if q.shape[2] > self.SMALL_M or q.dtype != torch.float32:
            return super().attention(q, k, v, mask, scale, softcap)
        out = torch.empty(q.shape, dtype=torch.float32)
        _native.llm_attention(
            _arg(_unit_last(q)),
            _arg(_unit_last(k)),
            _arg(_unit_last(v)),
            _arg(mask.contiguous()),
            _arg(out),
            float(scale),
            None if softcap is None else float(softcap),
        )
        return out

    def gated_act(self, gate: torch.Tensor, up: torch.Tensor, act: str) -> torch.Tensor:
        if gate.dtype != torch.float32 or gate.shape != up.shape:
            return super().gated_act(gate, up, act)
        g = gate.reshape(-1, gate.shape[-1]).contiguous()
        u = up.reshape(-1, up.shape[-1]).contiguous()
        out = torch.empty_like(g)
        _native.llm_gated_act(_arg(g), _arg(u), _arg(out), act)
        return out.view(gate.shape)


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()
