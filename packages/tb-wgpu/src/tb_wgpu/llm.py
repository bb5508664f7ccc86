"""The ``wgpu`` LLM backend: a whole decoder forward as ONE command buffer and ONE queue submission.

Loaded by tb-llm through the ``tb_register_llm_backends`` hook (``tb_wgpu.plugin``). It implements
tb-core's kernel protocol (``torchburn.llm.protocol``, version 2) without importing tb-llm: it
prepares weights and runs ``linear`` and the fused step; every other kernel, and a weight it
cannot hold on the device, it declines, and tb-llm's PyTorch reference runs them. Tensors in and
out stay on the CPU; the backend owns everything on the device.

* ``prepare_linear`` uploads each weight once, in its stored format: f32; bf16 as f16 on hardware
  adapters with ``shader-f16`` (every bf16 value in f16's normal range is exact in f16), else as
  packed bf16 pairs that the shader widens with a shift (exact, same bytes); int8 with its
  per-row scales; int4 packed with its group (scale, zero) pairs. The GEMV/GEMM shader
  (``llm_linear.wgsl``) dequantizes in registers; activations are f32 throughout.
* ``compile_model`` records every layer of a forward into one command encoder: RMSNorm, the
  q/k/v projections (+ bias), q/k norm (Qwen3), RoPE and the KV-cache write (``llm_qkv.wgsl``),
  attention over the device KV cache with tb-llm's mask semantics (``llm_attention.wgsl``:
  grouped-query, causal, sliding window, soft-cap), o_proj + residual, the gated MLP, the final
  norm and the LM head. Per forward the host uploads the embedding rows, cos/sin of the
  positions, the cache's slot positions and a few integers, submits once, and reads back the
  logits plus this step's keys and values (which it writes into the host ``KVCache``, so
  the host cache is a faithful mirror). The device copy of the cache is authoritative while the
  host cache it mirrors is the same object with no new slots; a new cache, a grown cache or
  slots written by someone else make it re-upload the host cache first (a chat rewind only
  shortens the cache, which needs nothing).
* ``compile_model`` (given tb-core's ``ModelDescription``) returns ``None`` (tb-llm then uses the
  per-kernel path, where ``linear``
  runs on the GPU one submission per call and the rest is PyTorch) when a weight stayed on the
  CPU because it is larger than the adapter's storage-binding limit, or when the adapter
  allows fewer than 8 storage buffers per shader stage. Every model a description holds (Llama,
  Mistral, Qwen2/3, Phi-3, Gemma, Gemma 2, every RoPE scaling) runs fused. The step declines
  caches other than tb-core's ``KVCache`` (the server's per-row views).

Counters: ``backend.stats`` (``submissions``, ``weight_uploads``, ``weight_bytes``,
``step_uploads``, ``cache_syncs``, ``readbacks``); the engine-wide ``tb_wgpu.stats()`` counts the
submissions too.
"""

from __future__ import annotations

import logging
import os
import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from tb_wgpu import shaders
from tb_wgpu.device import COUNTERS, GpuContext, WgpuError, context
from torchburn.llm import Activation, BackendError, KVCache, ModelDescription, PreparedLinear, QuantWeight

log = logging.getLogger("tb_wgpu")


def _f(value: float) -> str:
    """A WGSL f32 literal that rounds to the same float32 as ``value``."""
    return repr(float(np.float32(value)))


def _align(n: int, to: int = 16) -> int:
    return max(to, -(-n // to) * to)


# Indices into the per-forward ``params`` buffer (u32).
P_ROWS, P_T, P_B, P_START, P_END, P_CAP, P_FROWS, P_FSTRIDE, P_FOFF = range(9)
N_PARAMS = 16


@dataclass
class GpuWeight:
    """A weight on the device in its stored format (the handle ``prepare_linear`` returns)."""

    kind: str  # "f32" | "f16" | "bf16" | "int8" | "int4"
    n: int
    k: int
    buffers: list[Any]  # the weight, then its scales (int8) or (scale, zero) pairs (int4)
    group: int = 0
    nbytes: int = 0
    #: "rows": row-major (the cooperative kernel); "cols": transposed by 4-column blocks,
    #: [K4, N] (the barrier-free kernel for CPU adapters)
    layout: str = "rows"

    @property
    def k4(self) -> int:
        return -(-self.k // 4)


@dataclass
class _Op:
    pipeline: Any
    bindings: list[Any]  # buffers, or names of per-forward buffers resolved at bind time
    grid: Any  # (rows, final_rows) -> (x, y, z)
    group: Any = None


@dataclass
class _Buffers:
    rows: int = 0  # activation buffers hold this many rows
    cache_shape: tuple[int, int] = (0, 0)  # (batch, capacity) of the device KV cache
    named: dict[str, Any] = field(default_factory=dict)


class _LinearKernels:
    """Renders and caches the linear pipelines for one context."""

    def __init__(self, ctx: GpuContext) -> None:
        self.ctx = ctx

    def pipeline(
        self,
        w: GpuWeight,
        bias: bool,
        accumulate: bool = False,
        rows: int = P_ROWS,
        out_stride: int | None = None,
        out_off: int = 0,
    ) -> tuple[Any, int]:
        n_w = len(w.buffers)
        n_in = 2 + n_w + (1 if bias else 0)
        cols = w.layout == "cols"
        gx = min(-(-w.n // 64) if cols else w.n, self.ctx.max_workgroups)
        if w.kind == "int4":
            widx, sidx = (
                ("(k4 / 2u) * N + n", "((k4 * 4u) / G) * N + n")
                if cols
                else (
                    "n * (K4 / 2u) + k4 / 2u",
                    "n * NG + (k4 * 4u) / G",
                )
            )
            weight = shaders.render("llm_w_int4", G=w.group, WIDX=widx, SIDX=sidx)
        else:
            weight = shaders.render(f"llm_w_{w.kind}", WIDX="k4 * N + n" if cols else "n * K4 + k4")
        if w.k % 4 == 0:
            xtype, x4 = "array<vec4<f32>>", "return x[m * K4 + k4];"
        else:  # the stored rows are zero-padded; the activations must not leak the next row in
            xtype = "array<f32>"
            x4 = (
                "let i = m * K + k4 * 4u;\n    let k = k4 * 4u;\n    return vec4<f32>(x[i], select(0.0, x[i + 1u], k + 1u < K), "
                "select(0.0, x[i + 2u], k + 2u < K), select(0.0, x[i + 3u], k + 3u < K));"
            )
        src = shaders.render(
            "llm_linear_direct" if cols else "llm_linear",
            ENABLE="enable f16;" if w.kind == "f16" else "",
            WEIGHT=weight,
            BIAS_DECL=(f"@group(0) @binding({2 + n_w}) var<storage, read> bias: array<f32>;" if bias else ""),
            BIAS=" + bias[n]" if bias else "",
            OUT_BINDING=n_in,
            N=w.n,
            K=w.k,
            K4=w.k4,
            GX=gx,
            OUT_STRIDE=w.n if out_stride is None else out_stride,
            OUT_OFF=out_off,
            ROWS=rows,
            X4=x4,
            XTYPE=xtype,
            STORE="y[o] = y[o] + v;" if accumulate else "y[o] = v;",
        )
        return self.ctx.pipeline(shaders.shader_key(src), src, n_in, 1), gx


def _linear_grid(w: GpuWeight, gx: int, final: bool = False) -> Any:
    gy = -(-(-(-w.n // 64) if w.layout == "cols" else w.n) // gx)

    def grid(rows: int, frows: int) -> tuple[int, int, int]:
        return gx, gy, -(-(frows if final else rows) // 4)

    return grid


class WgpuLLMBackend:
    """LLM kernels on a WebGPU device; see the module docstring."""

    name = "wgpu"
    protocol_version = 2

    def __init__(self, device: str | torch.device = "cpu", f16: bool | None = None, linear: str | None = None) -> None:
        """``f16``: store bf16 weights as f16 (``None``: on hardware adapters with ``shader-f16``;
        ``False``: packed bf16, widened exactly to f32, on any adapter). ``linear``: the GEMV
        kernel, ``"tiled"`` (a workgroup per output, cooperative over K: GPUs) or ``"direct"``
        (an invocation per output, no barriers: CPU adapters); default from
        ``TORCHBURN_WGPU_MATMUL``, else by adapter type."""
        self.device = torch.device("cpu")  # tensors in / out live on the CPU; the device is ours
        self.ctx = context()
        choice = (linear or os.environ.get("TORCHBURN_WGPU_MATMUL", "")).strip().lower()
        if choice not in ("", "tiled", "direct"):
            raise ValueError(f"linear={choice!r}: use 'tiled' or 'direct'")
        self.layout = "cols" if choice == "direct" or (not choice and self.ctx.is_software) else "rows"
        if f16 and not self.ctx.shader_f16:
            raise WgpuError(f"f16=True but {self.ctx.adapter_name} does not offer the shader-f16 feature")
        # lavapipe offers shader-f16 but emulates the conversion: its f16 decode measured ~30%
        # slower than packed bf16 (same bytes), so software adapters default to bf16.
        self.f16 = (self.ctx.shader_f16 and not self.ctx.is_software) if f16 is None else bool(f16)
        self.adapter = self.ctx.adapter_name
        self.stats: dict[str, int] = dict.fromkeys(
            ("submissions", "weight_uploads", "weight_bytes", "step_uploads", "cache_syncs", "readbacks"), 0
        )
        self._kernels = _LinearKernels(self.ctx)

    def compute_dtype(self, quant: str) -> torch.dtype:
        # Weights stay in their stored format on the device; activations, norms and the KV
        # cache are f32 in every mode (the host cache mirrors the device one exactly).
        return torch.float32

    def head_quant(self, quant: str) -> str:
        # The quantized GEMV dequantizes in registers at no extra bandwidth: int8 head for int8 / int4.
        return "int8" if quant in ("int8", "int4") else quant

    # -- weights --------------------------------------------------------------------
    def _upload(self, array: np.ndarray) -> Any:
        data = np.ascontiguousarray(array)
        buffer = self.ctx.create_buffer(_align(data.nbytes), "storage")
        if data.nbytes:
            self.ctx.queue.write_buffer(buffer, 0, data.view(np.uint8).reshape(-1))
        self.stats["weight_uploads"] += 1
        self.stats["weight_bytes"] += data.nbytes
        COUNTERS.uploads += 1
        COUNTERS.upload_bytes += data.nbytes
        return buffer

    def upload_f32(self, t: torch.Tensor) -> Any:
        """A small f32 tensor (a norm weight, a bias) uploaded once."""
        return self._upload(t.detach().float().contiguous().numpy())

    def prepare_linear(self, w: QuantWeight) -> Any:
        n, k = w.shape
        k4 = -(-k // 4)
        if w.kind in ("fp32", "bf16"):
            kind = "f32" if w.kind == "fp32" else ("f16" if self.f16 else "bf16")
            src = w.weight
            assert src is not None
            if kind == "f16":
                wide = src.float()
                if bool((wide.abs() > 65504.0).any()):
                    kind = "bf16"  # out of f16's range: keep the exact packed form
            dtype = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[kind]
            padded = torch.zeros(n, k4 * 4, dtype=dtype)
            padded[:, :k] = src.to(dtype)
            raw = padded.view(torch.int32 if kind == "f32" else torch.int16)
            parts = [self._blocks(raw, 4)]
            group = 0
        elif w.kind == "int8":
            kind = "int8"
            assert w.qweight is not None and w.scales is not None
            padded = torch.zeros(n, k4 * 4, dtype=torch.int8)
            padded[:, :k] = w.qweight
            parts = [self._blocks(padded, 4), w.scales.float().contiguous().numpy()]
            group = 0
        elif w.kind == "int4":
            kind = "int4"
            assert w.qweight is not None and w.scales is not None and w.zeros is not None
            group = int(w.group_size)
            if k % 8 or k % group:
                raise WgpuError(f"int4 weight {w.shape}: K must be a multiple of 8 and of the group size")
            sz = torch.stack((w.scales.float(), w.zeros.float()), dim=-1)
            parts = [self._blocks(w.qweight, 4), self._blocks(sz.reshape(n, -1), 2)]
        else:
            return NotImplemented  # a layout this backend does not know: tb-llm's reference keeps it
        nbytes = sum(p.nbytes for p in parts)
        if max(p.nbytes for p in parts) > self.ctx.max_binding:
            log.warning(
                "wgpu LLM backend: a %s weight %s of %d bytes exceeds %s's storage binding limit (%d); "
                "it stays on the CPU and the model runs kernel by kernel",
                w.kind,
                list(w.shape),
                nbytes,
                self.adapter,
                self.ctx.max_binding,
            )
            return NotImplemented
        with self.ctx.lock:
            buffers = [self._upload(p) for p in parts]
        return GpuWeight(kind, n, k, buffers, group, nbytes, self.layout)

    def _blocks(self, t: torch.Tensor, width: int) -> np.ndarray:
        """``t`` [N, C] as stored: row-major, or [C / width, N, width] for the "cols" layout."""
        if self.layout == "cols":
            n = t.shape[0]
            t = t.reshape(n, -1, width).transpose(0, 1)
        return t.contiguous().numpy()

    # -- the per-kernel path: linear on the GPU, one submission per call -----------
    def linear(self, x: torch.Tensor, handle: Any, bias: torch.Tensor | None) -> torch.Tensor:
        if not isinstance(handle, GpuWeight):
            raise BackendError(f"wgpu LLM backend: not a handle it prepared: {type(handle).__name__}")
        if x.dim() != 2 or x.shape[1] != handle.k:
            raise ValueError(f"linear: x is {list(x.shape)} but the weight has {handle.k} input features")
        m = x.shape[0]
        if m == 0:
            return torch.empty(0, handle.n, dtype=x.dtype)
        ctx = self.ctx
        xs = x.detach().float().contiguous()
        with ctx.lock:
            ctx.ensure_alive()
            pipe, gx = self._kernels.pipeline(handle, bias is not None)
            params = np.zeros(N_PARAMS, dtype=np.uint32)
            params[P_ROWS] = m
            temps = [ctx.acquire(params.nbytes), ctx.acquire(xs.numel() * 4), ctx.acquire(m * handle.n * 4)]
            if bias is not None:
                temps.append(ctx.acquire(handle.n * 4))
            try:
                p_buf, x_buf, y_buf = temps[:3]
                ctx.queue.write_buffer(p_buf, 0, params)
                ctx.queue.write_buffer(x_buf, 0, xs.numpy())
                bound = [p_buf, x_buf, *handle.buffers]
                if bias is not None:
                    ctx.queue.write_buffer(temps[3], 0, bias.detach().float().contiguous().numpy())
                    bound.append(temps[3])
                bound.append(y_buf)
                group = _bind(ctx, pipe, bound)
                readback = ctx.create_buffer(_align(m * handle.n * 4, 256), "readback")
                encoder = ctx.device.create_command_encoder()
                cpass = encoder.begin_compute_pass()
                cpass.set_pipeline(pipe)
                cpass.set_bind_group(0, group)
                cpass.dispatch_workgroups(*_linear_grid(handle, gx)(m, m))
                cpass.end()
                encoder.copy_buffer_to_buffer(y_buf, 0, readback, 0, m * handle.n * 4)
                ctx.queue.submit([encoder.finish()])
                self.stats["submissions"] += 1
                COUNTERS.submissions += 1
                COUNTERS.dispatches += 1
                out = _read(ctx, readback, m * handle.n * 4)
                self.stats["readbacks"] += 1
            finally:
                for t in temps:
                    ctx.release(t)
        y = torch.frombuffer(out, dtype=torch.float32).reshape(m, handle.n)
        return y.to(x.dtype)

    # -- the fused step -------------------------------------------------------------
    def compile_model(self, model: ModelDescription) -> Any:
        if not all(isinstance(lin.handle, GpuWeight) for lin in model.linears()):
            log.info("wgpu LLM backend: some weights stayed on the CPU; using the per-kernel path")
            return None
        if self.ctx.max_storage_buffers < 8:
            log.info("wgpu LLM backend: the adapter allows < 8 storage buffers; using the per-kernel path")
            return None
        return FusedStep(self, model)


def _bind(ctx: GpuContext, pipeline: Any, buffers: list[Any]) -> Any:
    layout = pipeline.get_bind_group_layout(0)
    entries = [{"binding": i, "resource": {"buffer": b, "offset": 0, "size": b.size}} for i, b in enumerate(buffers)]
    return ctx.device.create_bind_group(layout=layout, entries=entries)


def _read(ctx: GpuContext, readback: Any, nbytes: int) -> bytearray:
    readback.map_sync(ctx.wgpu.MapMode.READ)
    try:
        return bytearray(readback.read_mapped(0, _align(nbytes, 4)))[:nbytes]
    finally:
        readback.unmap()


class FusedStep:
    """``step(ids, positions, cache, last_only) -> logits``: one submission per forward."""

    def __init__(self, backend: WgpuLLMBackend, model: ModelDescription) -> None:
        self.be = backend
        self.ctx: GpuContext = backend.ctx
        self.model = model
        self.h, self.nh, self.kv, self.d = model.hidden_size, model.num_heads, model.num_kv_heads, model.head_dim
        self.inter = model.intermediate_size
        self.r = model.rotary_dim
        self.vocab = model.vocab_size
        self.nt = (self.nh + 2 * self.kv) * self.d
        self.layers = len(model.layers)
        self.sandwich = model.sandwich_norms
        self.buf = _Buffers()
        self.submissions = 0
        self._mirror: Any = None  # weakref to the host KVCache the device cache mirrors
        self._dev_len = 0
        self._readback: Any = None
        eps, off = model.rms_norm_eps, float(model.norm_offset)
        lk = backend._kernels
        up = backend.upload_f32
        render = shaders.render
        prelude = shaders.source("llm_prelude") + shaders.source("rows_prelude")
        ctx = self.ctx

        def norm(store_add: bool = False, final: bool = False) -> Any:
            src = render(
                "llm_norm",
                LLM_PRELUDE=prelude,
                H=self.h,
                EPS=_f(eps),
                OFF=_f(off),
                ROWS=P_FROWS if final else P_ROWS,
                STRIDE=f"params[{P_FSTRIDE}]" if final else "1u",
                OFFSET=f"params[{P_FOFF}]" if final else "0u",
                STORE="out[r * H + j] = out[r * H + j] + v;" if store_add else "out[r * H + j] = v;",
            )
            return ctx.pipeline(shaders.shader_key(src), src, 3, 1)

        p_norm, p_norm_add, p_norm_final = norm(), norm(store_add=True), norm(final=True)
        rows_grid = lambda rows, frows: (rows, 1, 1)  # noqa: E731
        ops: list[_Op] = []

        def linear(
            lin: PreparedLinear, inp: str, out: str, accumulate: bool = False, stride: int | None = None, off: int = 0
        ) -> None:
            w: GpuWeight = lin.handle
            pipe, gx = lk.pipeline(w, lin.bias is not None, accumulate, P_ROWS, stride, off)
            bound = ["params", inp, *w.buffers]
            if lin.bias is not None:
                bound.append(up(lin.bias))
            ops.append(_Op(pipe, [*bound, out], _linear_grid(w, gx)))

        act_fn = {Activation.SILU: "tb_silu", Activation.GELU: "tb_gelu"}.get(model.activation, "tb_gelu_tanh")
        src = render("llm_act", I=self.inter, ACT=act_fn)
        p_act = ctx.pipeline(shaders.shader_key(src), src, 2, 1)
        act_grid = lambda rows, frows: (-(-self.inter // 64), rows, 1)  # noqa: E731
        head_grid = lambda rows, frows: (rows, self.nh + 2 * self.kv, 1)  # noqa: E731
        attn_grid = lambda rows, frows: (rows, self.nh, 1)  # noqa: E731
        softcap = model.attn_softcap or 0.0
        for i, layer in enumerate(model.layers):
            ops.append(_Op(p_norm, ["params", "x", up(layer.input_norm), "h"], rows_grid))
            if len(layer.qkv) == 1:
                linear(layer.qkv[0], "h", "qkv")
            else:
                for lin, o in zip(layer.qkv, (0, self.nh * self.d, (self.nh + self.kv) * self.d)):
                    linear(lin, "h", "qkv", stride=self.nt, off=o)
            qk = (
                torch.cat((layer.q_norm.float(), layer.k_norm.float()))
                if layer.q_norm is not None and layer.k_norm is not None
                else torch.zeros(2 * self.d)
            )
            src = render(
                "llm_qkv",
                LLM_PRELUDE=prelude,
                H=self.nh,
                KV=self.kv,
                D=self.d,
                R=self.r,
                LAYER=i,
                QK_NORM="true" if layer.q_norm is not None else "false",
                EPS=_f(eps),
                OFF=_f(off),
            )
            p_qkv = ctx.pipeline(shaders.shader_key(src), src, 4, 4)
            ops.append(_Op(p_qkv, ["params", "qkv", "cs", up(qk), "q", f"k{i}", f"v{i}", "stage"], head_grid))
            window = model.sliding_window if layer.sliding and model.sliding_window else 0
            src = render(
                "llm_attention",
                LLM_PRELUDE=prelude,
                H=self.nh,
                KV=self.kv,
                D=self.d,
                SCALE=_f(model.attn_scale),
                SOFTCAP=_f(softcap),
                WINDOW=int(window),
            )
            p_attn = ctx.pipeline(shaders.shader_key(src), src, 5, 1)
            ops.append(_Op(p_attn, ["params", "q", "pos", f"k{i}", f"v{i}", "o"], attn_grid))
            if self.sandwich:
                assert layer.pre_ff_norm is not None and layer.post_ff_norm is not None
                linear(layer.o, "o", "h2")
                ops.append(_Op(p_norm_add, ["params", "h2", up(layer.post_attn_norm), "x"], rows_grid))
                ops.append(_Op(p_norm, ["params", "x", up(layer.pre_ff_norm), "h"], rows_grid))
            else:
                linear(layer.o, "o", "x", accumulate=True)
                ops.append(_Op(p_norm, ["params", "x", up(layer.post_attn_norm), "h"], rows_grid))
            if len(layer.gate_up) == 1:
                linear(layer.gate_up[0], "h", "gu")
            else:
                linear(layer.gate_up[0], "h", "gu", stride=2 * self.inter, off=0)
                linear(layer.gate_up[1], "h", "gu", stride=2 * self.inter, off=self.inter)
            ops.append(_Op(p_act, ["params", "gu", "a"], act_grid))
            if self.sandwich:
                assert layer.post_ff_norm is not None
                linear(layer.down, "a", "h2")
                ops.append(_Op(p_norm_add, ["params", "h2", up(layer.post_ff_norm), "x"], rows_grid))
            else:
                linear(layer.down, "a", "x", accumulate=True)
        ops.append(_Op(p_norm_final, ["params", "x", up(model.norm), "f"], lambda rows, frows: (frows, 1, 1)))
        head: GpuWeight = model.lm_head.handle
        pipe, gx = lk.pipeline(head, False, False, P_FROWS)
        ops.append(_Op(pipe, ["params", "f", *head.buffers, "logits"], _linear_grid(head, gx, final=True)))
        self.ops = ops
        self.params = ctx.create_buffer(_align(N_PARAMS * 4), "storage")
        self.buf.named["params"] = self.params

    # -- buffers ----------------------------------------------------------------------------
    def _ensure_rows(self, rows: int) -> bool:
        if rows <= self.buf.rows:
            return False
        cap = 1 << max(2, (rows - 1).bit_length())
        ctx = self.ctx
        sizes = {
            "x": cap * self.h,
            "h": cap * self.h,
            "h2": cap * self.h,
            "qkv": cap * self.nt,
            "q": cap * self.nh * self.d,
            "o": cap * self.nh * self.d,
            "gu": cap * 2 * self.inter,
            "a": cap * self.inter,
            "cs": cap * 2 * max(self.r, 1),
            "f": cap * self.h,
            "logits": cap * self.vocab,
            "stage": self.layers * 2 * cap * self.kv * self.d,
        }
        for name, n in sizes.items():
            ctx.check_size(n * 4, f"{name} buffer for {rows} rows")
            self.buf.named[name] = ctx.create_buffer(_align(n * 4), "storage")
        self.buf.rows = cap
        need = _align((sizes["logits"] + sizes["stage"]) * 4, 256)
        self._readback = ctx.create_buffer(need, "readback")
        return True

    def _sync_cache(self, cache: KVCache, start: int) -> bool:
        """Make the device KV cache hold what ``cache`` holds in slots ``0 .. start``."""
        shape = (cache.batch, cache.capacity)
        mirrored = self._mirror is not None and self._mirror() is cache
        realloc = shape != self.buf.cache_shape
        if realloc:
            ctx = self.ctx
            n = cache.batch * self.kv * cache.capacity * self.d * 4
            ctx.check_size(n, f"KV cache of {cache.capacity} slots")
            for i in range(self.layers):
                self.buf.named[f"k{i}"] = ctx.create_buffer(_align(n), "storage")
                self.buf.named[f"v{i}"] = ctx.create_buffer(_align(n), "storage")
            self.buf.named["pos"] = ctx.create_buffer(_align(cache.batch * cache.capacity * 4), "storage")
            self.buf.cache_shape = shape
        if start and (realloc or not mirrored or start > self._dev_len):
            q = self.ctx.queue
            for i in range(self.layers):
                q.write_buffer(self.buf.named[f"k{i}"], 0, cache.keys(i).float().contiguous().numpy())
                q.write_buffer(self.buf.named[f"v{i}"], 0, cache.values(i).float().contiguous().numpy())
            self.be.stats["cache_syncs"] += 1
        self._mirror = weakref.ref(cache)
        self._dev_len = start
        return realloc

    def _bind_all(self) -> None:
        named = self.buf.named
        for op in self.ops:
            op.group = _bind(self.ctx, op.pipeline, [named[b] if isinstance(b, str) else b for b in op.bindings])

    # -- one forward ------------------------------------------------------------------------
    def __call__(self, ids: torch.Tensor, positions: torch.Tensor, cache: Any, last_only: bool = True) -> Any:
        # The device cache mirrors tb-core's KVCache (every row at the same length); other caches
        # (the server's per-row views) are declined before anything is written: per-kernel path.
        if not isinstance(cache, KVCache):
            return NotImplemented
        ctx = self.ctx
        model = self.model
        b, t = ids.shape
        rows = b * t
        frows = b if last_only else rows
        with ctx.lock:
            ctx.ensure_alive()
            cache.begin(positions)
            start = cache.length
            changed = self._ensure_rows(rows)
            changed = self._sync_cache(cache, start) or changed
            if changed or self.ops[0].group is None:
                self._bind_all()
            x = model.embed.rows(ids.cpu(), torch.float32)
            if model.embed_scale is not None:
                x = x * torch.tensor(model.embed_scale, dtype=x.dtype)
            cos, sin = model.rope(positions.cpu())
            cs = torch.cat((cos.reshape(rows, -1), sin.reshape(rows, -1)), dim=1).float().contiguous()
            params = np.zeros(N_PARAMS, dtype=np.uint32)
            params[[P_ROWS, P_T, P_B, P_START, P_END, P_CAP, P_FROWS]] = (
                rows,
                t,
                b,
                start,
                start + t,
                cache.capacity,
                frows,
            )
            params[P_FSTRIDE], params[P_FOFF] = (t, t - 1) if last_only else (1, 0)
            named = self.buf.named
            q = ctx.queue
            q.write_buffer(self.params, 0, params)
            q.write_buffer(named["x"], 0, x.reshape(rows, -1).contiguous().numpy())
            if cs.numel():
                q.write_buffer(named["cs"], 0, cs.numpy())
            q.write_buffer(named["pos"], 0, cache.pos.to(torch.int32).contiguous().numpy())
            self.be.stats["step_uploads"] += 4
            encoder = ctx.device.create_command_encoder()
            cpass = encoder.begin_compute_pass()
            for op in self.ops:
                grid = op.grid(rows, frows)
                if min(grid) <= 0:
                    continue
                cpass.set_pipeline(op.pipeline)
                cpass.set_bind_group(0, op.group)
                cpass.dispatch_workgroups(*grid)
            cpass.end()
            n_logits = frows * self.vocab * 4
            n_stage = self.layers * 2 * rows * self.kv * self.d * 4
            encoder.copy_buffer_to_buffer(named["logits"], 0, self._readback, 0, n_logits)
            encoder.copy_buffer_to_buffer(named["stage"], 0, self._readback, n_logits, n_stage)
            try:
                q.submit([encoder.finish()])
                self.submissions += 1
                self.be.stats["submissions"] += 1
                COUNTERS.submissions += 1
                COUNTERS.dispatches += len(self.ops)
                raw = _read(ctx, self._readback, n_logits + n_stage)
            except WgpuError:
                raise
            except Exception as exc:
                raise ctx.translate(exc, "running an LLM decode step") from exc
            self.be.stats["readbacks"] += 1
        logits = torch.frombuffer(raw, dtype=torch.float32, count=n_logits // 4).reshape(frows, self.vocab)
        stage = torch.frombuffer(raw, dtype=torch.float32, offset=n_logits).reshape(self.layers, 2, b, self.kv, t, -1)
        for i in range(self.layers):
            cache.write(i, stage[i, 0], stage[i, 1])
        cache.commit(t)
        self._dev_len = start + t
        logits = logits if last_only else logits.reshape(b, t, self.vocab)
        if model.final_softcap:
            logits = torch.tanh(logits / model.final_softcap) * model.final_softcap
        return logits


def backend_class() -> type[WgpuLLMBackend]:
    """The backend class (kept for callers written when it was built on first use)."""
    return WgpuLLMBackend
