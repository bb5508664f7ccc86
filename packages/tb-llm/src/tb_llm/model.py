"""The decoder: config-driven, one implementation for every supported family.

Weights are loaded from safetensors, checked against the config, quantized and handed to the
kernel backend; the forward pass calls only backend kernels and cheap tensor glue.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from tb_llm.config import ModelConfig, RopeConfig
from tb_llm.errors import CheckpointError
from tb_llm.safetensors_io import CheckpointWeights
from torchburn.llm.activation import Activation
from torchburn.llm.kv_cache import CacheLike, KVCache
from torchburn.llm.model import DecoderLayer, ModelDescription, PreparedLinear
from torchburn.llm.model_forward import forward as forward_pass
from torchburn.llm.protocol import LLMKernels, default_head_quant
from torchburn.llm.quantize import quantize

# tb-core's types of the model description, under the names tb-llm has always used
Linear = PreparedLinear
Layer = DecoderLayer

__all__ = ["Decoder", "Layer", "Linear", "check_weights", "default_head_quant", "expected_shapes"]


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the config implies, with its shape."""
    h, d, i = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    q, kv = cfg.num_heads * d, cfg.num_kv_heads * d
    fam = cfg.family
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (cfg.vocab_size, h), "model.norm.weight": (h,)}
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = (cfg.vocab_size, h)
    for n in range(cfg.num_layers):
        p = f"model.layers.{n}."
        out[p + "input_layernorm.weight"] = (h,)
        out[p + "post_attention_layernorm.weight"] = (h,)
        if fam.sandwich_norms:
            out[p + "pre_feedforward_layernorm.weight"] = (h,)
            out[p + "post_feedforward_layernorm.weight"] = (h,)
        a = p + "self_attn."
        if fam.fused_qkv:
            out[a + "qkv_proj.weight"] = (q + 2 * kv, h)
        else:
            for name, rows in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
                out[a + name + ".weight"] = (rows, h)
                if cfg.attention_bias:
                    out[a + name + ".bias"] = (rows,)
        out[a + "o_proj.weight"] = (h, q)
        if cfg.o_bias:
            out[a + "o_proj.bias"] = (h,)
        if fam.qk_norm:
            out[a + "q_norm.weight"] = (d,)
            out[a + "k_norm.weight"] = (d,)
        m = p + "mlp."
        if fam.fused_gate_up:
            out[m + "gate_up_proj.weight"] = (2 * i, h)
        else:
            out[m + "gate_proj.weight"] = (i, h)
            out[m + "up_proj.weight"] = (i, h)
            if cfg.mlp_bias:
                out[m + "gate_proj.bias"] = (i,)
                out[m + "up_proj.bias"] = (i,)
        out[m + "down_proj.weight"] = (h, i)
        if cfg.mlp_bias:
            out[m + "down_proj.bias"] = (h,)
    return out


def check_weights(cfg: ModelConfig, weights: CheckpointWeights, config_path: str) -> None:
    want = expected_shapes(cfg)
    for name, shape in want.items():
        if name not in weights:
            raise CheckpointError(
                config_path,
                f"config implies tensor {name!r} {list(shape)}, but no safetensors file in {weights.folder} has it",
            )
        got = weights.info(name).shape
        if got != shape:
            raise CheckpointError(
                weights.path_of(name), f"tensor {name!r} has shape {list(got)} but {config_path} implies {list(shape)}"
            )
    for name in weights:
        if name.startswith("model.layers."):
            idx = int(name.split(".")[2]) if name.split(".")[2].isdigit() else -1
            if idx >= cfg.num_layers:
                raise CheckpointError(
                    weights.path_of(name),
                    f"has tensor {name!r} for layer {idx}, but {config_path} says num_hidden_layers={cfg.num_layers}",
                )


class Decoder:
    def __init__(
        self,
        cfg: ModelConfig,
        weights: CheckpointWeights,
        backend: LLMKernels,
        quant: str,
        group_size: int = 32,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        self.cfg, self.backend, self.quant = cfg, backend, quant
        self.dtype = backend.compute_dtype(quant)
        self.device = backend.device
        dev = self.device

        def small(name: str) -> torch.Tensor:  # norms and biases stay in the compute dtype
            t = weights.get(name)
            return t.to(device=dev, dtype=torch.float32 if cfg.family.norm_offset else self.dtype)

        def bias(name: str) -> torch.Tensor | None:
            return weights.get(name).to(device=dev, dtype=self.dtype) if name in weights else None

        quantize_linear = getattr(backend, "quantize_linear", None)

        def prepared(w: torch.Tensor, kind: str) -> Any:
            # A backend may quantize and pack in one native pass (KernelBackend.quantize_linear:
            # the numbers of tb_llm.quant.quantize); None keeps quantize + prepare_linear.
            handle = quantize_linear(w, kind, group_size) if quantize_linear is not None else None
            return handle if handle is not None else backend.prepare_linear(quantize(w, kind, group_size))

        # A weight source may hand over a matrix already in the requested layout (GGUF blocks that
        # tb-llm's int4 holds exactly, see tb_llm.gguf.weights); None means quantize it here.
        kept_layout = getattr(weights, "quantized", None)

        def linear(name: str) -> Linear:
            kept = kept_layout(name + ".weight", quant, group_size) if kept_layout is not None else None
            if kept is not None:
                handle, rows = backend.prepare_linear(kept), kept.shape[0]
            else:
                w = weights.get(name + ".weight")
                handle, rows = prepared(w, quant), int(w.shape[0])
            if progress:
                progress(1)
            return Linear(handle, bias(name + ".bias"), rows)

        # The backend decides how the embedding / output head is stored (it is the largest
        # matrix and the most quantization-sensitive one); see KernelBackend.head_quant.
        head_quant = backend.head_quant(quant) if hasattr(backend, "head_quant") else default_head_quant(quant)
        embed = weights.get("model.embed_tokens.weight")
        # A backend that reads embedding rows from its own prepared weight (embedding_table) keeps
        # one copy of the matrix; otherwise the lookup reads a QuantWeight of its own.
        table_of = getattr(backend, "embedding_table", None)
        embed_handle = prepared(embed, head_quant) if table_of is not None else None
        self.embed: Any = table_of(embed_handle) if table_of is not None else None  # QuantWeight-like: rows()
        if self.embed is None:
            qembed = quantize(embed, head_quant, group_size)
            for attr in ("weight", "qweight", "scales", "zeros"):  # the lookup runs on the model's device
                t = getattr(qembed, attr)
                if t is not None:
                    setattr(qembed, attr, t.to(dev))
            self.embed = qembed
            if cfg.tie_word_embeddings and embed_handle is None:
                embed_handle = backend.prepare_linear(qembed)
        if cfg.tie_word_embeddings:
            self.lm_head = Linear(embed_handle, None, cfg.vocab_size)
        else:
            w = weights.get("lm_head.weight")
            self.lm_head = Linear(prepared(w, head_quant), None, cfg.vocab_size)
        self.norm = small("model.norm.weight")
        fam = cfg.family
        self.layers: list[Layer] = []
        for n in range(cfg.num_layers):
            p = f"model.layers.{n}."
            a, m = p + "self_attn.", p + "mlp."
            self.layers.append(
                Layer(
                    input_norm=small(p + "input_layernorm.weight"),
                    post_attn_norm=small(p + "post_attention_layernorm.weight"),
                    pre_ff_norm=small(p + "pre_feedforward_layernorm.weight") if fam.sandwich_norms else None,
                    post_ff_norm=small(p + "post_feedforward_layernorm.weight") if fam.sandwich_norms else None,
                    qkv=[linear(a + "qkv_proj")]
                    if fam.fused_qkv
                    else [linear(a + x) for x in ("q_proj", "k_proj", "v_proj")],
                    o=linear(a + "o_proj"),
                    q_norm=small(a + "q_norm.weight") if fam.qk_norm else None,
                    k_norm=small(a + "k_norm.weight") if fam.qk_norm else None,
                    gate_up=[linear(m + "gate_up_proj")]
                    if fam.fused_gate_up
                    else [linear(m + "gate_proj"), linear(m + "up_proj")],
                    down=linear(m + "down_proj"),
                    sliding=cfg.sliding_layers[n] if cfg.sliding_layers else False,
                )
            )
        self._inv_freq = _inv_freq(cfg)
        self._rope_cache: tuple[torch.Tensor, torch.Tensor] | None = None
        self.description = self._describe()
        # A backend may take over the whole step (all layers in one native call): see
        # compile_model in torchburn.llm.protocol. It sees the description, never this object.
        compile_model = getattr(backend, "compile_model", None)
        step = compile_model(self.description) if compile_model is not None else None
        self._fused: Callable[..., Any] | None = None if step is NotImplemented else step

    def _describe(self) -> ModelDescription:
        cfg = self.cfg
        return ModelDescription(
            hidden_size=cfg.hidden_size,
            num_heads=cfg.num_heads,
            num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
            intermediate_size=cfg.intermediate_size,
            vocab_size=cfg.vocab_size,
            rms_norm_eps=float(cfg.rms_norm_eps),
            norm_offset=float(cfg.family.norm_offset),
            attn_scale=float(cfg.attn_scale),
            attn_softcap=None if cfg.attn_softcap is None else float(cfg.attn_softcap),
            final_softcap=float(cfg.final_softcap) if cfg.final_softcap else None,
            sliding_window=None if cfg.sliding_window is None else int(cfg.sliding_window),
            activation=Activation.from_name(cfg.hidden_act),
            embed_scale=math.sqrt(cfg.hidden_size) if cfg.family.embed_scale else None,
            rotary_dim=cfg.rope.rotary_dim,
            rope=self._cos_sin,
            embed=self.embed,
            layers=tuple(self.layers),
            norm=self.norm,
            lm_head=self.lm_head,
            dtype=self.dtype,
            device=self.device,
        )

    @staticmethod
    def linear_count(cfg: ModelConfig) -> int:
        per_layer = (1 if cfg.family.fused_qkv else 3) + 1 + (1 if cfg.family.fused_gate_up else 2) + 1
        return cfg.num_layers * per_layer + (0 if cfg.tie_word_embeddings else 1)

    def new_cache(self, batch: int, capacity: int) -> KVCache:
        c = self.cfg
        return KVCache(c.num_layers, batch, c.num_kv_heads, c.head_dim, capacity, self.dtype, self.device)

    # -- RoPE ---------------------------------------------------------------------------
    def _cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rope = self.cfg.rope
        pos = positions.clamp(min=0)
        scale = rope.attention_factor
        # Frequencies that depend on how long the sequence is (as transformers picks them: by the
        # largest position of this forward pass) are computed per call; the rest are cached.
        if rope.rope_type == "dynamic" or (
            rope.rope_type == "longrope" and int(pos.max()) + 1 > rope.original_max_position
        ):
            inv = _inv_freq(self.cfg, seq_len=int(pos.max()) + 1)
            freqs = pos[..., None].float() * inv.to(pos.device)
            emb = torch.cat((freqs, freqs), dim=-1)
            return (emb.cos() * scale).to(self.dtype), (emb.sin() * scale).to(self.dtype)
        single = pos.numel() == 1  # a one-row decode step: slices, not a gather (per-token cost)
        at = int(pos) if single else 0
        need = at + 1 if single else int(pos.max()) + 1
        if self._rope_cache is None or self._rope_cache[0].shape[0] < need:
            n = max(need, 2 * (self._rope_cache[0].shape[0] if self._rope_cache else 256))
            t = torch.arange(n, dtype=torch.float32)
            freqs = t[:, None] * self._inv_freq[None, :]
            emb = torch.cat((freqs, freqs), dim=-1)
            cos, sin = emb.cos() * scale, emb.sin() * scale
            self._rope_cache = (cos.to(self.device, self.dtype), sin.to(self.device, self.dtype))
        cos, sin = self._rope_cache
        if single:
            return cos[at : at + 1].view(*pos.shape, -1), sin[at : at + 1].view(*pos.shape, -1)
        return cos[pos], sin[pos]

    # -- forward ------------------------------------------------------------------------
    @torch.inference_mode()
    def forward(
        self, ids: torch.Tensor, positions: torch.Tensor, cache: CacheLike, last_only: bool = True
    ) -> torch.Tensor:
        """Run ``ids`` ``[B, T]`` at ``positions`` ``[B, T]`` (-1: padding) through the model,
        appending to ``cache``; return float32 logits ``[B, V]`` (last position) or ``[B, T, V]``."""
        t = ids.shape[1]
        longrope = self.cfg.rope.rope_type == "longrope"
        if longrope and isinstance(cache, KVCache) and self._crosses_original_context(positions, cache):
            # LongRoPE switches every frequency once the sequence outgrows the original context;
            # keys cached with the short factors would no longer match, so the cached sequence is
            # encoded again with this step (as transformers' Phi-3 generation does).
            keep = cache.length
            ids = torch.cat((cache.tokens[:, :keep], ids), dim=1)
            positions = torch.cat((cache.pos[:, :keep], positions), dim=1)
            cache.truncate(0)
        start = cache.length
        logits = self._fused(ids, positions, cache, last_only) if self._fused is not None else NotImplemented
        if logits is NotImplemented:  # no compiled step, or it declined this call (e.g. this cache type)
            logits = self.reference_forward(ids, positions, cache, last_only)
        if longrope and isinstance(cache, KVCache):  # only LongRoPE ever re-encodes the cached tokens
            cache.tokens[:, start : start + ids.shape[1]] = ids
        return logits if last_only else logits[:, -t:]

    def _crosses_original_context(self, positions: torch.Tensor, cache: KVCache) -> bool:
        if not cache.length:
            return False
        limit = self.cfg.rope.original_max_position
        return int(cache.pos[:, : cache.length].max()) + 1 <= limit < int(positions.max()) + 1

    @torch.inference_mode()
    def reference_forward(
        self, ids: torch.Tensor, positions: torch.Tensor, cache: CacheLike, last_only: bool = True
    ) -> torch.Tensor:
        """The step as a sequence of backend kernels, one Python call each."""
        return forward_pass(self.description, self.backend, ids, positions, cache, last_only)


def _inv_freq(cfg: ModelConfig, seq_len: int | None = None) -> torch.Tensor:
    rope = cfg.rope
    dim = rope.rotary_dim
    base = rope.theta
    if rope.rope_type == "dynamic" and seq_len is not None and seq_len > cfg.max_position:
        base = base * ((rope.factor * seq_len / cfg.max_position) - (rope.factor - 1)) ** (dim / (dim - 2))
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    inv = 1.0 / (base**exponents)
    if rope.rope_type == "yarn":
        return _yarn_inv_freq(rope, base**exponents)
    if rope.rope_type == "longrope":
        long = seq_len is not None and seq_len > rope.original_max_position
        divisors = torch.tensor(rope.long_factor if long else rope.short_factor, dtype=torch.float32)
        return 1.0 / (divisors * base**exponents)
    if rope.rope_type == "linear":
        inv = inv / rope.factor
    elif rope.rope_type == "llama3":
        old = rope.original_max_position
        low_wl = old / rope.low_freq_factor
        high_wl = old / rope.high_freq_factor
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wl, inv / rope.factor, inv)
        smooth = (old / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
        smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
        medium = ~(wavelen < high_wl) & ~(wavelen > low_wl)
        inv = torch.where(medium, smoothed, scaled)
    return inv


def _yarn_inv_freq(rope: RopeConfig, wavelength_base: torch.Tensor) -> torch.Tensor:
    """YaRN (arXiv 2309.00071): frequencies that turn many times over the original context keep
    their value (extrapolate); slow ones are divided by the factor (interpolate); a linear ramp
    over the dims between ``beta_fast`` and ``beta_slow`` rotations blends the two."""
    dim = rope.rotary_dim
    old = rope.original_max_position

    def dim_for_rotations(rotations: float) -> float:
        # the dim index whose wavelength fits ``rotations`` times into the original context
        return dim * math.log(old / (rotations * 2 * math.pi)) / (2 * math.log(rope.theta))

    low, high = dim_for_rotations(rope.beta_fast), dim_for_rotations(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # a zero-width ramp would divide by zero
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: extrapolate (keep the frequency), 0: interpolate
    extrapolated = 1.0 / wavelength_base
    interpolated = extrapolated / rope.factor
    return interpolated * (1 - keep) + extrapolated * keep
