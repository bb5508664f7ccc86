"""``config.json`` -> one normalized :class:`ModelConfig` for every supported decoder family.

Each family differs from Llama in a handful of switches (bias, norms, fused projections,
soft-capping, ...). They are data here, so the model code has no per-architecture branches.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tb_llm.errors import CheckpointError, UnsupportedModelError


@dataclass(frozen=True)
class Family:
    qkv_bias: bool = False  # q/k/v projections carry a bias (Qwen2)
    qk_norm: bool = False  # RMSNorm over head_dim on q and k before RoPE (Qwen3)
    fused_qkv: bool = False  # one qkv_proj (Phi-3)
    fused_gate_up: bool = False  # one gate_up_proj, gate first (Phi-3)
    norm_offset: float = 0.0  # RMSNorm multiplies by (offset + weight): 1.0 for Gemma
    embed_scale: bool = False  # embeddings times sqrt(hidden) (Gemma)
    sandwich_norms: bool = False  # post-attention and pre/post-feed-forward norms (Gemma 2)
    default_act: str = "silu"
    default_tie: bool = False


FAMILIES: dict[str, Family] = {
    "llama": Family(),
    "mistral": Family(),
    "qwen2": Family(qkv_bias=True),
    "qwen3": Family(qk_norm=True),
    "phi3": Family(fused_qkv=True, fused_gate_up=True),
    "gemma": Family(norm_offset=1.0, embed_scale=True, default_act="gelu_pytorch_tanh", default_tie=True),
    "gemma2": Family(
        norm_offset=1.0, embed_scale=True, sandwich_norms=True, default_act="gelu_pytorch_tanh", default_tie=True
    ),
}
SUPPORTED_ROPE = ("default", "linear", "dynamic", "llama3", "yarn", "longrope")
ACTIVATIONS = ("silu", "gelu", "gelu_pytorch_tanh", "gelu_new", "gelu_fast")


@dataclass(frozen=True)
class RopeConfig:
    theta: float = 10000.0
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192
    rotary_dim: int = 0  # dims of each head that rotate (partial rotary)
    # YaRN: the ramp between interpolated and extrapolated frequencies, and the cos/sin scale
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    attention_factor: float = 1.0  # multiplies cos and sin (YaRN's mscale, LongRoPE's scale)
    # LongRoPE (Phi-3 128k): per-frequency divisors below / above the original context length
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    family: Family
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    hidden_act: str
    max_position: int
    tie_word_embeddings: bool
    rope: RopeConfig
    attention_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    attn_scale: float = 0.0
    attn_softcap: float | None = None
    final_softcap: float | None = None
    sliding_window: int | None = None
    sliding_layers: tuple[bool, ...] = ()  # per layer: does the sliding window apply
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


def load_config(path: str | Path) -> ModelConfig:
    path = Path(path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(path, "config.json not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(path, f"not valid JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise CheckpointError(path, "config is not a JSON object")
    return parse_config(raw, path)


def parse_config(raw: dict[str, Any], path: str | Path = "config.json") -> ModelConfig:
    model_type = raw.get("model_type")
    if model_type not in FAMILIES:
        raise UnsupportedModelError(
            f"{path}: model_type {model_type!r} is not supported; tb-llm supports {', '.join(sorted(FAMILIES))}"
        )
    fam = FAMILIES[model_type]

    def need(key: str) -> Any:
        if key not in raw:
            raise CheckpointError(path, f"missing required key {key!r} for model_type {model_type!r}")
        return raw[key]

    hidden = int(need("hidden_size"))
    heads = int(need("num_attention_heads"))
    kv_heads = int(raw.get("num_key_value_heads") or heads)
    head_dim = int(raw.get("head_dim") or hidden // heads)
    if heads % kv_heads:
        raise CheckpointError(path, f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
    layers = int(need("num_hidden_layers"))
    act = raw.get("hidden_activation") or raw.get("hidden_act") or fam.default_act
    if model_type == "gemma" and act == "gelu":
        act = "gelu_pytorch_tanh"  # Gemma checkpoints say "gelu" but were trained with the tanh form
    if act not in ACTIVATIONS:
        raise UnsupportedModelError(f"{path}: hidden_act {act!r} is not supported ({', '.join(ACTIVATIONS)})")

    rope = _rope(raw, head_dim, path)
    window = raw.get("sliding_window")
    if model_type in ("qwen2", "qwen3") and not raw.get("use_sliding_window", False):
        window = None
    layer_types = raw.get("layer_types")
    if window is None:
        sliding = tuple(False for _ in range(layers))
    elif isinstance(layer_types, list) and len(layer_types) == layers:
        sliding = tuple(t == "sliding_attention" for t in layer_types)
    elif model_type == "gemma2":
        sliding = tuple(i % 2 == 0 for i in range(layers))
    elif model_type in ("qwen2", "qwen3"):
        first = int(raw.get("max_window_layers", layers))
        sliding = tuple(i >= first for i in range(layers))
    else:
        sliding = tuple(True for _ in range(layers))

    scale = raw.get("query_pre_attn_scalar") if model_type == "gemma2" else None
    attn_bias = bool(raw.get("attention_bias", False)) or fam.qkv_bias
    eos = raw.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if isinstance(eos, int) else ())
    return ModelConfig(
        model_type=model_type,
        family=fam,
        vocab_size=int(need("vocab_size")),
        hidden_size=hidden,
        intermediate_size=int(need("intermediate_size")),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        hidden_act=act,
        max_position=int(raw.get("max_position_embeddings", 4096)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", fam.default_tie)),
        rope=rope,
        attention_bias=attn_bias,
        o_bias=bool(raw.get("attention_bias", False)) and not fam.qkv_bias,
        mlp_bias=bool(raw.get("mlp_bias", False)),
        attn_scale=float(scale) ** -0.5 if scale else 1.0 / math.sqrt(head_dim),
        attn_softcap=raw.get("attn_logit_softcapping") if model_type == "gemma2" else None,
        final_softcap=raw.get("final_logit_softcapping") if model_type == "gemma2" else None,
        sliding_window=int(window) if window is not None else None,
        sliding_layers=sliding,
        bos_token_id=raw.get("bos_token_id") if isinstance(raw.get("bos_token_id"), int) else None,
        eos_token_ids=eos_ids,
        pad_token_id=raw.get("pad_token_id") if isinstance(raw.get("pad_token_id"), int) else None,
        raw=raw,
    )


def _rope(raw: dict[str, Any], head_dim: int, path: str | Path) -> RopeConfig:
    # transformers >= 5 writes `rope_parameters`; older configs write `rope_theta` + `rope_scaling`.
    params = dict(raw.get("rope_parameters") or {})
    scaling = raw.get("rope_scaling") or {}
    if isinstance(scaling, dict):
        for k, v in scaling.items():
            params.setdefault(k, v)
    theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type") or params.get("type") or "default"
    if rope_type not in SUPPORTED_ROPE:
        raise UnsupportedModelError(
            f"{path}: RoPE type {rope_type!r} is not supported; tb-llm supports {', '.join(SUPPORTED_ROPE)}"
        )
    partial = float(params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0)))
    rotary_dim = int(head_dim * partial)
    max_position = int(raw.get("max_position_embeddings", 8192))
    original = int(
        params.get("original_max_position_embeddings") or raw.get("original_max_position_embeddings") or max_position
    )
    factor = params.get("factor")
    factor = float(factor) if factor is not None else max_position / original
    extra: dict[str, Any] = {}
    if rope_type == "yarn":
        extra.update(
            beta_fast=float(params.get("beta_fast") or 32.0),
            beta_slow=float(params.get("beta_slow") or 1.0),
            truncate=bool(params.get("truncate", True)),
            attention_factor=_yarn_attention_factor(params, factor),
        )
    elif rope_type == "longrope":
        short, long = params.get("short_factor"), params.get("long_factor")
        for name, value in (("short_factor", short), ("long_factor", long)):
            if not isinstance(value, list) or len(value) != rotary_dim // 2:
                raise UnsupportedModelError(
                    f"{path}: longrope {name} must list {rotary_dim // 2} numbers (one per rotary frequency)"
                )
        # LongRoPE's scale depends on how far the context was stretched (a given factor, else
        # max / original positions, as Phi-3 configs state it).
        stretch = float(params["factor"]) if params.get("factor") is not None else max_position / original
        given = params.get("attention_factor")
        extra.update(
            short_factor=tuple(float(v) for v in short),  # type: ignore[union-attr]
            long_factor=tuple(float(v) for v in long),  # type: ignore[union-attr]
            attention_factor=float(given)
            if given is not None
            else (1.0 if stretch <= 1.0 else math.sqrt(1 + math.log(stretch) / math.log(original))),
        )
    return RopeConfig(
        theta=theta,
        rope_type=rope_type,
        factor=factor if rope_type != "default" else 1.0,
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position=original,
        rotary_dim=rotary_dim,
        **extra,
    )


def _yarn_attention_factor(params: dict[str, Any], factor: float) -> float:
    """YaRN's cos/sin scale: ``0.1 ln(s) + 1`` (the paper's sqrt(1/t)), or the ratio of two such
    terms when a config gives ``mscale`` / ``mscale_all_dim``, or the config's own value."""
    if params.get("attention_factor") is not None:
        return float(params["attention_factor"])

    def m(scale: float, weight: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * weight * math.log(scale) + 1.0

    if params.get("mscale") and params.get("mscale_all_dim"):
        return m(factor, float(params["mscale"])) / m(factor, float(params["mscale_all_dim"]))
    return m(factor)
