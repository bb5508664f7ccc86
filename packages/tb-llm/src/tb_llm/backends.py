"""The kernel protocol an engine implements to run tb-llm models, and the PyTorch reference.

An engine offers kernels through tb-core's ``tb_register_llm_backends`` hook, returning
``torchburn.llm_backend.LLMBackend(name, engine, device, load)``. ``load()`` returns an object
that satisfies :class:`KernelBackend` below. tb-llm owns the model logic (which kernel runs
when, the KV cache, sampling); the backend owns the arithmetic.

Tensor conventions (all contiguous unless said otherwise):

* activations ``x``: ``[M, K]`` rows of the compute dtype (``backend.compute_dtype(quant)``);
* ``head_quant(quant) -> str`` (optional): how to store the embedding / output head for a
  model quantized as ``quant`` (default: int8 for int4 models, else ``quant``);
* ``prepare_linear(w: QuantWeight) -> handle``: called once per weight at load time; the handle
  is opaque to tb-llm (repack, move to device, ...). Layouts of ``QuantWeight``: ``tb_llm.quant``.
* ``linear(x, handle, bias) -> [M, N]``: ``x @ W.T + bias`` with W dequantized as documented;
* ``embedding(ids, w: QuantWeight) -> [*ids.shape, K]``: rows of the (unprepared) weight;
* ``rms_norm(x, weight, eps, offset) -> x / rms(x) * (offset + weight)``, the reduction in fp32;
* ``rope(x, cos, sin) -> x``: ``x`` is ``[B, H, T, D]``, ``cos``/``sin`` ``[B, 1, T, R]`` with
  ``R <= D`` even; the first ``R`` dims rotate in "rotate half" order, the rest pass through;
* ``attention(q, k, v, mask, scale, softcap) -> [B, H, T, D]``: ``q`` is ``[B, H, T, D]``,
  ``k``/``v`` are ``[B, KV, S, D]`` views of the KV cache (``H % KV == 0``, grouped-query),
  ``mask`` bool ``[B, 1, T, S]`` (True = may attend); scores are ``q.k * scale``, then
  ``softcap * tanh(s / softcap)`` when ``softcap`` is set, softmax in fp32;
* ``gated_act(gate, up, act) -> act(gate) * up`` with ``act`` one of ``tb_llm.config.ACTIVATIONS``.

Optional, for backends that run a whole step natively (no Python per layer):

* ``compile_model(decoder) -> step | None``: called once after the weights are prepared, with
  the :class:`tb_llm.model.Decoder` (config in ``decoder.cfg``, prepared handles in
  ``decoder.layers`` / ``decoder.lm_head``, RoPE via ``decoder._cos_sin``). When it returns a
  callable, every forward pass becomes ``step(ids [B, T], positions [B, T], cache, last_only)
  -> float32 logits`` with the same contract as ``Decoder.reference_forward`` (it must call
  ``cache.begin(positions)`` first and ``cache.commit(T)`` last, and write this step's keys and
  values through ``cache.write``, or into ``cache.k[i]`` / ``cache.v[i]`` at slots
  ``cache.length .. cache.length + T``). Returning ``None`` keeps the per-kernel path.

Optional, for faster loading and one copy of the embedding:

* ``quantize_linear(weight, quant, group_size) -> handle | None``: the checkpoint tensor
  ``[N, K]`` quantized and prepared in one step; must give the handle ``prepare_linear(
  quantize(weight, quant, group_size))`` would (same numbers). ``None``: tb-llm does that.
* ``embedding_table(handle) -> table | None``: given the prepared embedding weight (the tied
  head), an object whose ``rows(ids, dtype)`` and ``kind`` behave as ``QuantWeight``'s, so the
  model keeps no separate copy for the lookup; ``None``: tb-llm keeps a ``QuantWeight``.

A backend may implement any subset well and inherit the rest from :class:`ReferenceBackend`.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any, Protocol, runtime_checkable

import torch
import torch.nn.functional as F

from tb_llm.errors import BackendError
from tb_llm.quant import QuantWeight

log = logging.getLogger("tb_llm")


@runtime_checkable
class KernelBackend(Protocol):
    name: str
    device: torch.device

    def compute_dtype(self, quant: str) -> torch.dtype: ...

    def prepare_linear(self, w: QuantWeight) -> Any: ...

    def linear(self, x: torch.Tensor, handle: Any, bias: torch.Tensor | None) -> torch.Tensor: ...

    def embedding(self, ids: torch.Tensor, w: QuantWeight) -> torch.Tensor: ...

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float) -> torch.Tensor: ...

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor: ...

    def attention(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float, softcap: float | None
    ) -> torch.Tensor: ...

    def gated_act(self, gate: torch.Tensor, up: torch.Tensor, act: str) -> torch.Tensor: ...


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
        from tb_llm.quant import unpack_int4

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

    def embedding(self, ids: torch.Tensor, w: QuantWeight) -> torch.Tensor:
        return w.rows(ids, self.compute_dtype(w.kind))

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        if offset:  # Gemma: scale in fp32, then cast
            return (h * (offset + weight.float())).to(x.dtype)
        return weight * h.to(x.dtype)

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        r = cos.shape[-1]
        if r == x.shape[-1]:
            return x * cos + _rotate_half(x) * sin
        rot, rest = x[..., :r], x[..., r:]
        return torch.cat((rot * cos + _rotate_half(rot) * sin, rest), dim=-1)

    def attention(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float, softcap: float | None
    ) -> torch.Tensor:
        b, h, t, d = q.shape
        kv = k.shape[1]
        if softcap is None and q.dtype == torch.float32 and t > 1:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=kv != h)
        g = h // kv
        qg = q.reshape(b, kv, g * t, d)  # grouped queries share their KV head without copying it
        s = torch.matmul(qg, k.transpose(-1, -2)).mul_(scale).reshape(b, kv, g, t, -1)
        if softcap is not None:
            s = torch.tanh(s / softcap) * softcap
        s = s.masked_fill(~mask.unsqueeze(1), float("-inf"))
        p = torch.softmax(s.float(), dim=-1).to(v.dtype).reshape(b, kv, g * t, -1)
        return torch.matmul(p, v).reshape(b, h, t, d)

    def gated_act(self, gate: torch.Tensor, up: torch.Tensor, act: str) -> torch.Tensor:
        if act == "silu":
            return F.silu(gate) * up
        if act == "gelu":
            return F.gelu(gate) * up
        return F.gelu(gate, approximate="tanh") * up


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def resolve_device(device: str) -> torch.device:
    """``cpu``, ``gpu`` (CUDA / ROCm / MPS as PyTorch sees them) or ``auto`` (a measured probe).

    ``gpu`` where PyTorch sees no GPU gives the CPU device: the tensors stay in host memory and
    :func:`select_backend` then needs an engine backend that computes on a GPU itself (wgpu).
    """
    if device == "cpu":
        return torch.device("cpu")
    gpu = _gpu_device()
    if device == "gpu":
        return gpu if gpu is not None else torch.device("cpu")
    if device != "auto":
        if device.startswith(("cuda", "mps", "cpu", "xpu")):
            return torch.device(device)
        raise BackendError(f"unknown device {device!r}: use 'auto', 'cpu' or 'gpu'")
    if gpu is None:
        return torch.device("cpu")
    return gpu if _probe(gpu) < _probe(torch.device("cpu")) else torch.device("cpu")


def _gpu_device() -> torch.device | None:
    if torch.cuda.is_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return None


def _probe(device: torch.device) -> float:
    """Seconds for a few decode-shaped GEMVs: what a token costs, not what the spec sheet says."""
    import time

    w = torch.randn(4096, 4096, device=device)
    x = torch.randn(1, 4096, device=device)
    for _ in range(2):
        y = x @ w.T
    _sync(device)
    start = time.perf_counter()
    for _ in range(8):
        y = y @ w.T
        y = y / y.norm()
    _sync(device)
    return time.perf_counter() - start


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()
    elif device.type == "mps":
        torch.mps.synchronize()


def select_backend(device: torch.device, engine: str | None, requested: str = "auto") -> KernelBackend:
    """The backend for ``device``: the named engine's, else the best installed, else the reference.

    ``requested`` is what the user asked for (``auto``/``cpu``/``gpu``). On a PyTorch GPU device
    PyTorch's own kernels run the model unless an engine is named; engine backends of kind
    ``gpu`` (wgpu) take host tensors and serve ``device="gpu"`` where PyTorch has no GPU.
    """
    candidates: list[Any] = []
    if _other_plugins_installed():
        try:
            from torchburn.llm_backend import llm_backends

            candidates = llm_backends()
        except Exception as exc:  # a broken plugin never stops the reference path
            log.debug("listing LLM backends failed: %s", exc)
    if device.type != "cpu" and engine is None:
        return ReferenceBackend(device)  # CUDA / ROCm / MPS through PyTorch
    kind = "gpu" if requested == "gpu" else "cpu"
    if engine is not None and engine not in ("reference", "torch", "eager"):
        named = [b for b in candidates if engine in (b.name, b.engine)]
        if not named:
            have = ", ".join(sorted({b.engine for b in candidates})) or "none"
            raise BackendError(
                f"engine {engine!r} offers no LLM backend (installed engines with one: {have}); "
                "install it, or use engine=None for the PyTorch reference path"
            )
        return _load(named[0], device, strict=True)
    if engine is None:
        for desc in candidates:
            if desc.device == kind:
                backend = _load(desc, device, strict=False)
                if backend is not None:
                    return backend
    if kind == "gpu":
        gpu_engines = ", ".join(sorted({b.engine for b in candidates if b.device == "gpu"})) or "none installed"
        raise BackendError(
            "device='gpu' but PyTorch sees no GPU (CUDA, ROCm or MPS) and no GPU engine backend loaded "
            f"(GPU engines with an LLM backend: {gpu_engines}; e.g. pip install tb-wgpu); "
            "use device='cpu' or 'auto'"
        )
    return ReferenceBackend(device)


def _load(desc: Any, device: torch.device, strict: bool) -> Any:
    try:
        obj = desc.load()
        if isinstance(obj, type):
            obj = obj()
        if not isinstance(obj, KernelBackend):
            missing = (
                [m for m in KernelBackend.__protocol_attrs__ if not hasattr(obj, m)]
                if hasattr(KernelBackend, "__protocol_attrs__")
                else []
            )
            raise BackendError(f"{type(obj).__name__} does not implement tb_llm.backends.KernelBackend {missing}")
        return obj
    except Exception as exc:
        if strict:
            raise BackendError(f"LLM backend {desc.name!r} of engine {desc.engine!r} failed to load: {exc}") from exc
        warnings.warn(
            f"tb-llm: LLM backend {desc.name!r} failed to load ({exc}); using the PyTorch reference", stacklevel=3
        )
        return None


def _other_plugins_installed() -> bool:
    """Whether any ``torchburn`` entry point besides tb-llm's own exists. ``import torchburn``
    pulls in ``torch._dynamo`` (seconds), so with nothing to find it is not worth it."""
    import sys
    from importlib import metadata

    if "torchburn" in sys.modules:  # already paid for; may hold plugins registered in process
        return True
    return any(ep.name != "llm" for ep in metadata.entry_points(group="torchburn"))
