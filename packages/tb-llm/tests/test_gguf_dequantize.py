"""tb-llm's own GGML block decoders against the gguf package's ``gguf.quants.dequantize``, bit for
bit, on random blocks (every code and sub-scale pattern), on blocks the gguf quantizer wrote, and
on every tensor of the real SmolLM2 file; the int4 layout that keeps Q4_0 blocks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import random_blocks

from tb_llm.gguf.dequantize import SUPPORTED_TYPES, dequantize
from tb_llm.gguf.reader import GGUFFile, GGUFTensor
from tb_llm.gguf.weights import bit_equal, int4_candidate

gguf = pytest.importorskip("gguf")

QUANTIZED = ("Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")


def reference(raw: np.ndarray, type_name: str) -> np.ndarray:
    return gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[type_name])


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool(np.array_equal(a.view(np.uint32), b.view(np.uint32)))


def test_types_and_block_sizes_are_gguf_s() -> None:
    from tb_llm.gguf.dequantize import DEQUANTIZERS

    assert set(SUPPORTED_TYPES) == {"F32", "F16", "BF16", *QUANTIZED}
    for name, (block, nbytes, _) in DEQUANTIZERS.items():
        assert gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]] == (block, nbytes), name


@pytest.mark.parametrize("rows", [1, 3, 7])
@pytest.mark.parametrize("type_name", QUANTIZED)
def test_random_blocks(type_name: str, rows: int) -> None:
    block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]][0]
    for seed, blocks in enumerate((1, 2, 5)):
        raw = random_blocks(rows, blocks * block, type_name, seed=seed)
        assert same_bits(dequantize(raw, type_name), reference(raw, type_name))


@pytest.mark.parametrize("type_name", QUANTIZED)
def test_fully_random_bytes(type_name: str) -> None:
    # scales too are random bit patterns: infinities, NaNs, subnormals decode alike
    nbytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]][1]
    raw = np.random.default_rng(1).integers(0, 256, size=(5, 3 * nbytes), dtype=np.uint8)
    with np.errstate(all="ignore"):
        assert same_bits(dequantize(raw, type_name), reference(raw, type_name))


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q8_0", "F16", "BF16"])
@pytest.mark.parametrize("rows", [1, 5])
def test_blocks_written_by_the_gguf_quantizer(type_name: str, rows: int) -> None:
    x = (np.random.default_rng(2).standard_normal((rows, 96)) * 0.05).astype(np.float32)
    x[0, :32] = 0.0  # an all-zero block
    raw = gguf.quants.quantize(x, gguf.GGMLQuantizationType[type_name])
    raw = raw.view(np.uint8).reshape(rows, -1)
    assert same_bits(dequantize(raw, type_name), reference(raw, type_name))


def test_float_types_special_values() -> None:
    special = np.array([[0.0, -0.0, np.inf, -np.inf, np.nan, 1e-8, 65504.0, -3.5]], dtype=np.float32)
    assert same_bits(dequantize(special.view(np.uint8), "F32"), special)
    half = special.astype(np.float16)
    assert same_bits(dequantize(half.view(np.uint8), "F16"), reference(half.view(np.uint8), "F16"))
    bf = (special.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    assert same_bits(dequantize(bf, "BF16"), reference(bf, "BF16"))


def test_every_tensor_of_smollm2(smollm2_gguf: Path) -> None:
    f = GGUFFile(smollm2_gguf)
    seen = set()
    for t in f.tensors.values():
        seen.add(t.type_name)
        want = reference(t.raw, t.type_name).reshape(t.raw.shape[0], -1)
        assert same_bits(dequantize(t.raw, t.type_name), want), t.name
    assert seen == {"F32", "Q4_1", "Q8_0"}


@pytest.mark.parametrize("rows", [1, 7])
def test_q4_0_as_int4_is_exact(rows: int) -> None:
    for seed in range(3):
        raw = random_blocks(rows, 96, "Q4_0", seed=seed)
        t = GGUFTensor("w", "Q4_0", (rows, 96), raw)
        kept = int4_candidate(t, raw)
        assert kept is not None and kept.shape == (rows, 96) and kept.group_size == 32
        want = torch.from_numpy(reference(raw, "Q4_0").reshape(rows, 96).copy())
        assert bit_equal(kept.dequantize(), want)  # -0.0 included


def test_q4_1_and_q4_k_kept_only_when_exact() -> None:
    # d = 2**-6, m = -8 d: m + 8 d = 0 is a float16 value and both forms round alike
    raw = random_blocks(3, 64, "Q4_1", seed=0)
    raw = raw.reshape(3, 2, 20)
    raw[..., 0:2] = np.float16(2.0**-6).reshape(1).view(np.uint8)
    raw[..., 2:4] = np.float16(-8 * 2.0**-6).reshape(1).view(np.uint8)
    raw = raw.reshape(3, 40)
    kept = int4_candidate(GGUFTensor("w", "Q4_1", (3, 64), raw), raw)
    assert kept is not None
    assert bit_equal(kept.dequantize(), torch.from_numpy(reference(raw, "Q4_1").copy()))
    # random scales: zero = m + 8 d is rarely a float16 value -> not kept (requantized instead)
    raw = random_blocks(3, 64, "Q4_1", seed=1)
    assert int4_candidate(GGUFTensor("w", "Q4_1", (3, 64), raw), raw) is None
    raw = random_blocks(2, 256, "Q4_K", seed=1)
    assert int4_candidate(GGUFTensor("w", "Q4_K", (2, 256), raw), raw) is None
    raw = random_blocks(2, 256, "Q6_K", seed=1)
    assert int4_candidate(GGUFTensor("w", "Q6_K", (2, 256), raw), raw) is None
