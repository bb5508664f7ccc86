"""The ``native_cpu`` LLM backend: the hot decode kernels of a decoder step in Rust.

Loaded by tb-llm through the ``tb_register_llm_backends`` hook (``tb_cpu_rust.plugin``); it
implements tb-core's kernel protocol (``torchburn.llm.protocol``, version 2) without importing
tb-llm, and declines (``NotImplemented``) what it does not speed up: activations that are not
float32, for which tb-llm's PyTorch reference runs the kernel.

* Weights are packed once at load time into Rust-owned layouts (``_native.LLMWeight``):
  int8 per output channel, int4 group-wise (re-laid in 8-row tiles so one byte-multiply gives
  eight rows' dot products in eight lanes), bf16 and fp32. Activations stay float32 for every
  quantization; int8 / int4 GEMVs quantize them to int8 per block of 32 values and use
  integer dot products (int8: AVX-512 VNNI where the CPU has it), multithreaded over output
  rows. int4 prefill runs the same integer kernel, four activation rows per weight tile.
* RMSNorm, the gated MLP activation, RoPE and attention of a few query positions over the KV
  cache are one native call each. Prefill-sized attention (16 queries or more) runs Rust
  ``llm/attn.rs``: keys and values laid out once per KV head as GEMM panels, each block of
  query rows (a KV head's query heads x 4 positions) only over the keys it can see (causal),
  over PyTorch's OpenMP team; with a softcap or a head dim not a multiple of 8, SDPA. Decode
  attention (fewer queries) runs ``llm/attn_decode.rs`` (AVX2; a KV head's query heads share
  each cached row). Prefill linears (16 rows or more) of fp32 / bf16 / int8 weights run a blocked f32
  GEMM over the packed weights (Rust ``llm/panel.rs``: 16 weight rows dequantized at a time,
  6 x 16 FMA register tile), so fp32 / bf16 models keep one copy of their weights.
* ``compile_model`` (given tb-core's ``ModelDescription``) hands tb-llm a step that runs a whole forward pass (every layer, the final
  norm and the head) in one native call with the GIL released (``_native.LLMModel``): no
  Python per layer, for decode steps and whole prompts alike (a prompt's attention takes the
  prefill kernel, its norms / gated activation / residual adds are spread over the pool). The
  per-kernel path above serves caches the native step does not own (the server's slots): the
  step declines those calls.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from tb_cpu_rust import _native
from tb_cpu_rust.threads import use_torch_openmp
from torchburn.llm import GROUP_SIZES, Activation, BackendError, KVCache, ModelDescription, QuantWeight

# prefill GEMMs (called between PyTorch ops) run on PyTorch's OpenMP team, as the engine's kernels do
use_torch_openmp()


def _arg(t: torch.Tensor) -> torch.Tensor:
    # the tensor itself: the native module reads and validates its DLPack description
    return t


class _Dense:
    """A dense weight: the packed copy serves GEMVs and prefill GEMMs alike; ``weight`` (a
    PyTorch tensor for ``F.linear``) is None unless a caller sets it."""

    __slots__ = ("packed", "weight")

    def __init__(self, packed: Any, weight: torch.Tensor | None) -> None:
        self.packed, self.weight = packed, weight


class _PackedRows:
    """The embedding table read from the prepared (packed) weight, so the model holds one copy
    of it: ``rows`` dequantizes the requested rows in Rust, with ``QuantWeight.rows``'s numbers."""

    __slots__ = ("kind", "packed", "shape")

    def __init__(self, packed: Any) -> None:
        self.packed, self.kind, self.shape = packed, packed.kind, packed.shape

    def rows(self, ids: torch.Tensor | None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        flat = torch.arange(self.shape[0]) if ids is None else ids.reshape(-1).to(torch.long).contiguous()
        out = torch.empty(flat.numel(), self.shape[1], dtype=torch.float32)
        self.packed.rows(_arg(flat), _arg(out))
        lead = (self.shape[0],) if ids is None else tuple(ids.shape)
        return out.view(*lead, self.shape[1]).to(dtype)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self.rows(None, dtype)


class NativeLLMBackend:
    name = "native_cpu"
    protocol_version = 2
    #: More activation rows than this: attention with a softcap or an odd head dim is declined (SDPA).
    SMALL_M = 8

    def __init__(self, device: str | torch.device = "cpu") -> None:
        self.device = torch.device(device)
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
            # one copy: the panel GEMM reads the packed weight for prefill too (within a few % of
            # PyTorch's GEMM on the 0.5B shapes, single-thread CPU time), so no tensor is kept
            return _Dense(_native.llm_pack_dense(_arg(w.weight.contiguous())), None)
        if w.kind == "int8":
            assert w.qweight is not None and w.scales is not None
            q, s = w.qweight.contiguous(), w.scales.float().contiguous()
            return _native.llm_pack_int8(_arg(q), _arg(s))
        if w.kind == "int4":
            assert w.qweight is not None and w.scales is not None and w.zeros is not None
            q, s, z = w.qweight.contiguous(), w.scales.float().contiguous(), w.zeros.float().contiguous()
            return _native.llm_pack_int4(_arg(q), _arg(s), _arg(z), w.group_size)
        raise BackendError(f"native_cpu backend: unknown weight kind {w.kind!r}")

    def quantize_linear(self, weight: torch.Tensor, quant: str, group_size: int) -> Any:
        """Quantize and pack in one native pass over rayon's pool (tb-llm's optional hook):
        bit for bit the weight ``prepare_linear(torchburn.llm.quantize(weight, quant, group_size))``
        gives, without PyTorch's elementwise passes. None (the Python path) for other cases."""
        if quant not in ("int8", "int4") or weight.dim() != 2 or weight.device.type != "cpu":
            return None
        if weight.dtype not in (torch.float32, torch.bfloat16):
            return None
        kind = "int4" if quant == "int4" and weight.shape[1] % group_size == 0 else "int8"
        if kind == "int4" and group_size not in GROUP_SIZES:
            return None  # torchburn.llm.quantize raises the user-facing error
        return _native.llm_quantize(_arg(weight.contiguous()), kind, group_size)

    def embedding_table(self, handle: Any) -> Any:
        """The embedding lookup reads rows of the prepared weight (tb-llm's optional hook), so no
        torch copy of the embedding / tied head is kept. A dense head then runs every row count
        on its packed copy too (its torch tensor is dropped)."""
        packed = getattr(handle, "packed", handle)
        if not isinstance(packed, _native.LLMWeight):
            return None
        if isinstance(handle, _Dense):
            handle.weight = None
        return _PackedRows(packed)

    # -- kernels ------------------------------------------------------------------------
    def linear(self, x: torch.Tensor, handle: Any, bias: torch.Tensor | None) -> torch.Tensor:
        x = x.float().contiguous()
        packed = handle
        if isinstance(handle, _Dense):
            if x.shape[0] > self.SMALL_M and handle.weight is not None:
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
            return NotImplemented
        x2 = x.reshape(-1, x.shape[-1]).contiguous()
        out = torch.empty_like(x2)
        _native.llm_rms_norm(_arg(x2), _arg(weight.float().contiguous()), _arg(out), eps, float(offset))
        return out.view(x.shape)

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or x.dim() != 4 or cos.shape[0] != x.shape[0]:
            return NotImplemented
        out = torch.empty(x.shape, dtype=torch.float32)
        _native.llm_rope(_arg(_unit_last(x)), _arg(_unit_last(cos.float())), _arg(_unit_last(sin.float())), _arg(out))
        return out

    def attention(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float, softcap: float | None
    ) -> torch.Tensor:
        if q.dtype != torch.float32 or (q.shape[2] > self.SMALL_M and (softcap is not None or q.shape[3] % 8 != 0)):
            return NotImplemented
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

    def gated_act(self, gate: torch.Tensor, up: torch.Tensor, act: Activation) -> torch.Tensor:
        if gate.dtype != torch.float32 or gate.shape != up.shape:
            return NotImplemented
        g = gate.reshape(-1, gate.shape[-1]).contiguous()
        u = up.reshape(-1, up.shape[-1]).contiguous()
        out = torch.empty_like(g)
        _native.llm_gated_act(_arg(g), _arg(u), _arg(out), _native_act(act))
        return out.view(gate.shape)

    # -- whole step -----------------------------------------------------------------------
    def compile_model(self, model: ModelDescription) -> Callable[..., Any] | None:
        """A step running every layer of ``model`` in one native call (the protocol's
        ``compile_model``): decode steps, batched decode and whole prompts; it declines caches
        other than tb-core's ``KVCache`` (tb-llm then runs the per-kernel path).

        Every model a description can hold maps onto the native step (biases, q/k norms, fused
        projections, Gemma's norm offset / embedding scale / sandwich norms / softcaps, sliding
        windows, partial rotary); RoPE cos/sin come from ``model.rope`` per call, so every RoPE
        type works. Returns None (per-kernel path) when the model does not run in float32 or
        holds a weight this backend did not pack.
        """
        # every weight is packed by now: the loader's freed temporaries (weights widened to
        # float32, quantizer buffers) go back to the system instead of staying in malloc's heap
        # beside the packed copies, which have their own huge-page mappings
        _native.llm_release_free_memory()
        if model.dtype != torch.float32 or model.device.type != "cpu":
            return None

        def w(handle: Any) -> Any:
            return getattr(handle, "packed", handle)

        keep: list[Any] = []  # the tensors behind every descriptor, alive until LLMModel copied them

        def vk(t: torch.Tensor | None) -> Any:
            if t is None:
                return None
            t = t.float().contiguous()
            keep.append(t)
            return _arg(t)

        def link(x: Any) -> tuple[Any, Any]:
            return (w(x.handle), vk(x.bias))

        if not all(isinstance(w(lin.handle), _native.LLMWeight) for lin in model.linears()):
            return None
        layers = [
            (
                vk(layer.input_norm),
                vk(layer.post_attn_norm),
                vk(layer.pre_ff_norm),
                vk(layer.post_ff_norm),
                [link(x) for x in layer.qkv],
                link(layer.o),
                vk(layer.q_norm),
                vk(layer.k_norm),
                [link(x) for x in layer.gate_up],
                link(layer.down),
                bool(layer.sliding),
            )
            for layer in model.layers
        ]
        window = model.sliding_window if any(layer.sliding for layer in model.layers) else None
        config = (
            model.hidden_size,
            model.num_heads,
            model.num_kv_heads,
            model.head_dim,
            model.intermediate_size,
            model.vocab_size,
            float(model.rms_norm_eps),
            float(model.norm_offset),
            float(model.attn_scale),
            None if model.attn_softcap is None else float(model.attn_softcap),
            None if model.final_softcap is None else float(model.final_softcap),
            None if window is None else int(window),
        )
        # the multiplier rounded to float32, as the per-kernel path rounds it to its compute dtype
        embed_scale = None if model.embed_scale is None else float(torch.tensor(model.embed_scale, dtype=torch.float32))
        try:
            native = _native.LLMModel(
                config, _native_act(model.activation), embed_scale, layers, vk(model.norm), w(model.lm_head.handle)
            )
        except ValueError as exc:  # a shape or layout the native step does not take
            import logging

            logging.getLogger("tb_cpu_rust").debug("native_cpu: no fused step (%s)", exc)
            return None
        return _FusedStep(model, native)


class _FusedStep:
    """``step(ids, positions, cache, last_only)`` over ``_native.LLMModel`` (see compile_model)."""

    def __init__(self, model: ModelDescription, native: Any) -> None:
        self.model, self.native = model, native
        # (cache, its generation, LLMKVCache over its buffers): the cache is held so the buffers
        # the native descriptors point at stay alive until another cache is bound
        self._bound: tuple[KVCache, int, Any] | None = None

    def _kv(self, cache: KVCache) -> Any:
        # KVCache.reserve replaces its buffers when it grows (a new generation): bind once per allocation
        if self._bound is None or self._bound[0] is not cache or self._bound[1] != cache.generation:
            layers = range(cache.num_layers)
            native = _native.LLMKVCache([_arg(cache.keys(i)) for i in layers], [_arg(cache.values(i)) for i in layers])
            self._bound = (cache, cache.generation, native)
        return self._bound[2]

    def __call__(self, ids: torch.Tensor, positions: torch.Tensor, cache: Any, last_only: bool = True) -> Any:
        b, t = ids.shape
        model = self.model
        # The native step owns tb-core's KVCache layout (every row at the same length). Other
        # caches (the server's per-slot views, where each row writes at its own offset) are
        # declined before anything is written: tb-llm runs them through the per-kernel path.
        # Prompts of any length run here too (prefill attention and parallel row work inside).
        if not isinstance(cache, KVCache):
            return NotImplemented
        with torch.inference_mode():
            cache.begin(positions)
            kv = self._kv(cache)  # after begin: it may have grown the cache
            x = model.embed.rows(ids.reshape(-1), torch.float32).contiguous()
            cos, sin = model.rope(positions)
            cos, sin = cos.float().contiguous(), sin.float().contiguous()
            pos = positions.to(torch.long).contiguous()
            logits = torch.empty(b if last_only else b * t, model.vocab_size, dtype=torch.float32)
            self.native.step(
                _arg(x), _arg(pos), _arg(cos), _arg(sin), _arg(cache.pos), cache.length, kv, _arg(logits), last_only
            )
            cache.commit(t)
        return logits if last_only else logits.view(b, t, -1)


def _native_act(act: Activation | str) -> str:
    # the protocol's three activations are the native step's three names
    return Activation.from_name(act).value


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()
