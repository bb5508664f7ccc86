"""GGUF ``general.architecture`` + ``<arch>.*`` metadata -> tb-llm's config, and GGUF tensor
names -> the Hugging Face names the decoder reads.

The mapping follows how llama.cpp's HF -> GGUF converter writes each family: which keys carry
which config value, which tensors are renamed, and the two value changes it makes:

* ``llama``: the rows of ``attn_q`` / ``attn_k`` are permuted per head from HF's rotate-half
  RoPE layout to GGML's interleaved one (HF row ``h*D + j*D/2 + i`` is GGUF row ``h*D + 2i + j``);
  :func:`unpermute_rows` undoes it. Rows stay whole, so quantized blocks move untouched.
* ``gemma`` / ``gemma2``: RMSNorm weights are stored as ``1 + w``; tb-llm's Gemma norm applies the
  ``1 +`` itself, so 1 is subtracted back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from tb_llm.config import ModelConfig, parse_config
from tb_llm.errors import CheckpointError, UnsupportedModelError
from tb_llm.gguf.reader import GGUFFile

#: GGUF architecture -> tb-llm model_type. Mistral checkpoints are written as "llama".
ARCHITECTURES: dict[str, str] = {
    "llama": "llama",
    "mistral": "mistral",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "phi3": "phi3",
    "gemma": "gemma",
    "gemma2": "gemma2",
}
PERMUTED_QK = ("llama", "mistral")  # families whose converter permutes q/k rows
NORM_PLUS_ONE = ("gemma", "gemma2")

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_qkv": "self_attn.qkv_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_norm": "post_attention_layernorm",
}
_GEMMA2_LAYER_NAMES = {
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# Tensors a converter writes that tb-llm reads from the config instead (checked, not loaded).
ROPE_TENSORS = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")


@dataclass(frozen=True)
class TensorPlan:
    gguf_name: str
    hf_name: str
    unpermute_heads: int = 0  # > 0: undo the q/k RoPE row permutation with this many heads
    minus_one: bool = False  # Gemma norm stored as 1 + w


def architecture_of(f: GGUFFile) -> tuple[str, str]:
    arch = f.get("general.architecture")
    if not isinstance(arch, str):
        raise CheckpointError(f.path, "metadata key 'general.architecture' is missing")
    if arch not in ARCHITECTURES:
        raise UnsupportedModelError(
            f"{f.path}: GGUF architecture {arch!r} is not supported; tb-llm reads {', '.join(sorted(ARCHITECTURES))}"
        )
    return arch, ARCHITECTURES[arch]


def config_from_metadata(f: GGUFFile) -> ModelConfig:
    """The ``config.json`` the GGUF metadata implies, parsed by tb-llm's own config code."""
    arch, model_type = architecture_of(f)

    def key(name: str, default: Any = None) -> Any:
        return f.get(f"{arch}.{name}", default)

    def need(name: str) -> Any:
        return f.require(f"{arch}.{name}")

    hidden, heads = int(need("embedding_length")), int(need("attention.head_count"))
    if heads <= 0:
        raise CheckpointError(f.path, f"metadata {arch}.attention.head_count is {heads}")
    kv = key("attention.head_count_kv", heads)
    if isinstance(kv, list):  # per-layer counts: tb-llm needs one value
        if len(set(kv)) != 1:
            raise UnsupportedModelError(f"{f.path}: per-layer KV head counts {sorted(set(kv))} are not supported")
        kv = kv[0]
    head_dim = int(key("attention.key_length", hidden // heads))
    embed = f.tensors.get("token_embd.weight")
    tokens = f.get("tokenizer.ggml.tokens")
    vocab = key("vocab_size") or (len(tokens) if isinstance(tokens, list) else None)
    if vocab is None and embed is not None:
        vocab = embed.shape[0]
    raw: dict[str, Any] = {
        "model_type": model_type,
        "hidden_size": hidden,
        "intermediate_size": int(need("feed_forward_length")),
        "num_hidden_layers": int(need("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(kv),
        "head_dim": head_dim,
        "rms_norm_eps": float(key("attention.layer_norm_rms_epsilon", 1e-6)),
        "max_position_embeddings": int(key("context_length", 4096)),
        "rope_theta": float(key("rope.freq_base", 10000.0)),
        "vocab_size": int(vocab) if vocab is not None else 0,
        "tie_word_embeddings": "output.weight" not in f.tensors,
    }
    rotary = key("rope.dimension_count")
    if rotary is not None and int(rotary) != head_dim:
        raw["partial_rotary_factor"] = int(rotary) / head_dim
    for src, dst in (
        ("tokenizer.ggml.bos_token_id", "bos_token_id"),
        ("tokenizer.ggml.eos_token_id", "eos_token_id"),
        ("tokenizer.ggml.padding_token_id", "pad_token_id"),
    ):
        if isinstance(f.get(src), int):
            raw[dst] = int(f.get(src))
    raw.update(_rope_scaling(f, arch, raw))
    if model_type == "gemma2":
        raw["attn_logit_softcapping"] = key("attn_logit_softcapping")
        raw["final_logit_softcapping"] = key("final_logit_softcapping")
        window = key("attention.sliding_window")
        if window is not None:
            raw["sliding_window"] = int(window)
        # llama.cpp scales Gemma 2 27B's queries by 1/sqrt(hidden/heads), the smaller ones by 1/sqrt(head_dim)
        raw["query_pre_attn_scalar"] = hidden // heads if hidden == 4608 else head_dim
    return parse_config(raw, f.path)


def _rope_scaling(f: GGUFFile, arch: str, raw: dict[str, Any]) -> dict[str, Any]:
    kind = f.get(f"{arch}.rope.scaling.type")
    factor = f.get(f"{arch}.rope.scaling.factor")
    original = f.get(f"{arch}.rope.scaling.original_context_length")
    if "rope_factors_long.weight" in f.tensors or "rope_factors_short.weight" in f.tensors:
        long = _vector(f, "rope_factors_long.weight")
        short = _vector(f, "rope_factors_short.weight") if "rope_factors_short.weight" in f.tensors else long
        scaling: dict[str, Any] = {
            "rope_type": "longrope",
            "long_factor": long.tolist(),
            "short_factor": short.tolist(),
            "original_max_position_embeddings": int(original or raw["max_position_embeddings"]),
        }
        attn = f.get(f"{arch}.rope.scaling.attn_factor")
        if attn is not None:
            scaling["attention_factor"] = float(attn)
        return {"rope_scaling": scaling}
    if "rope_freqs.weight" in f.tensors:
        return {"rope_scaling": _llama3_scaling(f, raw)}
    if kind in (None, "none") or (factor in (None, 0, 1.0) and kind != "yarn"):
        return {}
    if kind not in ("linear", "yarn"):
        raise UnsupportedModelError(f"{f.path}: RoPE scaling type {kind!r} in the GGUF metadata is not supported")
    scaling = {"rope_type": kind, "factor": float(factor or 1.0)}
    if original is not None:
        scaling["original_max_position_embeddings"] = int(original)
    return {"rope_scaling": scaling}


def _vector(f: GGUFFile, name: str) -> npt.NDArray[np.float32]:
    from tb_llm.gguf.dequantize import dequantize

    t = f.tensors[name]
    return dequantize(t.raw, t.type_name).reshape(-1)


def _llama3_scaling(f: GGUFFile, raw: dict[str, Any]) -> dict[str, Any]:
    """Llama 3.1+ GGUFs carry the RoPE frequency divisors as a tensor instead of the config's
    ``rope_scaling``. tb-llm computes them from the config, so the published Llama 3 parameters
    are taken only if they reproduce the stored divisors."""
    stored = _vector(f, "rope_freqs.weight").astype(np.float64)
    head_dim = int(raw["head_dim"])
    theta = float(raw["rope_theta"])
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * np.pi / inv
    for factor, original in ((8.0, 8192), (32.0, 8192), (16.0, 8192)):
        low, high = 1.0, 4.0
        smooth = (original / wavelen - low) / (high - low)
        want = np.where(
            wavelen < original / high,
            1.0,
            np.where(wavelen > original / low, factor, 1.0 / ((1 - smooth) / factor + smooth)),
        )
        if want.shape == stored.shape and np.allclose(want, stored, rtol=1e-4):
            return {
                "rope_type": "llama3",
                "factor": factor,
                "low_freq_factor": low,
                "high_freq_factor": high,
                "original_max_position_embeddings": original,
            }
    raise UnsupportedModelError(
        f"{f.path}: tensor 'rope_freqs.weight' holds RoPE frequency factors that match no Llama 3 rope_scaling "
        "tb-llm knows (factor 8/16/32, original context 8192)"
    )


def tensor_plan(f: GGUFFile, cfg: ModelConfig) -> dict[str, TensorPlan]:
    """HF tensor name -> where it is in the GGUF and how to undo the converter's changes."""
    arch, model_type = architecture_of(f)
    layer_names = dict(_LAYER_NAMES)
    if model_type == "gemma2":
        layer_names.update(_GEMMA2_LAYER_NAMES)
    if model_type == "phi3":
        layer_names["ffn_up"] = "mlp.gate_up_proj"  # Phi-3 keeps gate and up fused in ffn_up
    plan: dict[str, TensorPlan] = {}
    for name in f.tensors:
        if name in ROPE_TENSORS:
            continue
        hf: str | None = _GLOBAL_NAMES.get(name)
        if hf is None and name.startswith("blk."):
            parts = name.split(".")
            if len(parts) == 4 and parts[1].isdigit() and parts[2] in layer_names:
                layer = int(parts[1])
                if layer >= cfg.num_layers:
                    raise CheckpointError(
                        f.path, f"has tensor {name!r} for layer {layer}, but {arch}.block_count is {cfg.num_layers}"
                    )
                hf = f"model.layers.{layer}.{layer_names[parts[2]]}.{parts[3]}"
        if hf is None:
            continue  # tensors tb-llm has no use for
        heads = 0
        if model_type in PERMUTED_QK and arch in PERMUTED_QK:
            if ".self_attn.q_proj." in hf:
                heads = cfg.num_heads
            elif ".self_attn.k_proj." in hf:
                heads = cfg.num_kv_heads
        minus_one = model_type in NORM_PLUS_ONE and hf.endswith("norm.weight")
        plan[hf] = TensorPlan(name, hf, heads, minus_one)
    return plan


def unpermute_rows(rows: npt.NDArray[Any], heads: int) -> npt.NDArray[Any]:
    """GGUF's interleaved per-head row order of q/k -> HF's rotate-half order. ``rows`` is
    ``[n_rows, ...]`` (raw block bytes, floats or a bias vector)."""
    n = rows.shape[0]
    half = n // heads // 2
    return rows.reshape(heads, half, 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)
