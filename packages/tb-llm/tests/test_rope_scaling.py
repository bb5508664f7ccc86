"""RoPE scaling variants against transformers' own frequency tables and cos/sin scales."""

from __future__ import annotations

import math

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the reference RoPE tables come from transformers")
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

from tb_llm.config import parse_config  # noqa: E402
from tb_llm.errors import UnsupportedModelError  # noqa: E402
from tb_llm.model import _inv_freq  # noqa: E402

BASE = {
    "model_type": "llama",
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 1,
    "intermediate_size": 512,
    "vocab_size": 100,
}

YARN = [
    {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 4096},
    {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 32768},
    {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0, "original_max_position_embeddings": 2048,
     "beta_fast": 16.0, "beta_slow": 2.0},
    {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "original_max_position_embeddings": 4096,
     "mscale": 1.0, "mscale_all_dim": 0.707},
    {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 2.0, "original_max_position_embeddings": 512,
     "attention_factor": 1.25},
]  # fmt: skip


def _pair(params: dict, max_position: int, **extra) -> tuple:
    raw = {**BASE, **extra, "max_position_embeddings": max_position, "rope_parameters": params}
    ours = parse_config(raw)
    theirs = transformers.AutoConfig.for_model(**raw)
    return ours, theirs


@pytest.mark.parametrize("params", YARN, ids=lambda p: f"f{p['factor']}-o{p['original_max_position_embeddings']}")
def test_yarn_matches_transformers(params: dict) -> None:
    ours, theirs = _pair(params, max_position=params["original_max_position_embeddings"] * 4)
    inv, scale = ROPE_INIT_FUNCTIONS["yarn"](theirs, "cpu")
    torch.testing.assert_close(_inv_freq(ours), inv.float(), rtol=1e-6, atol=0)
    assert ours.rope.attention_factor == pytest.approx(scale, rel=1e-9)
    assert ours.rope.attention_factor != 1.0 or "attention_factor" in params


@pytest.mark.parametrize("long", [False, True])
def test_longrope_matches_transformers(long: bool) -> None:
    dim = 64
    params = {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "short_factor": [1.0 + 0.01 * i for i in range(dim // 2)],
        "long_factor": [1.0 + 0.5 * i for i in range(dim // 2)],
        "original_max_position_embeddings": 4096,
    }
    ours, theirs = _pair(params, max_position=131072, original_max_position_embeddings=4096)
    seq = 8000 if long else 100
    inv, scale = ROPE_INIT_FUNCTIONS["longrope"](theirs, "cpu", seq_len=seq)
    torch.testing.assert_close(_inv_freq(ours, seq_len=seq), inv.float(), rtol=1e-6, atol=0)
    assert ours.rope.attention_factor == pytest.approx(scale, rel=1e-9)
    assert ours.rope.attention_factor == pytest.approx(math.sqrt(1 + math.log(32) / math.log(4096)))


def test_longrope_factor_list_of_wrong_length_is_a_clear_error() -> None:
    params = {"rope_type": "longrope", "short_factor": [1.0] * 3, "long_factor": [1.0] * 32}
    with pytest.raises(UnsupportedModelError, match="short_factor must list 32 numbers"):
        parse_config({**BASE, "max_position_embeddings": 8192, "rope_parameters": params})


def test_unknown_rope_type_lists_the_supported_ones() -> None:
    with pytest.raises(UnsupportedModelError, match="yarn, longrope"):
        parse_config({**BASE, "rope_parameters": {"rope_type": "mrope-xyz"}})
