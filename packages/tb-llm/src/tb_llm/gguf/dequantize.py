"""GGML block formats -> float32, written from the format definitions (ggml's block structs).

Every function takes the raw bytes of a tensor as ``uint8 [rows, bytes_per_row]`` and returns
``float32 [rows, cols]``. The arithmetic is float32 in the order ggml's reference dequantizer
uses (for the K-quants: ``(d * sub_scale) * q - (dmin * sub_min)``), so the results are the
same floats ``gguf.quants.dequantize`` and llama.cpp produce, bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

U8 = npt.NDArray[np.uint8]
F32 = npt.NDArray[np.float32]

QK_K = 256  # elements in one K-quant super-block


def _f16(raw: U8) -> F32:
    """Little-endian float16 fields (the last axis is 2 bytes) as float32 [..., 1]."""
    return np.ascontiguousarray(raw).view("<f2").astype(np.float32)


def _nibbles_split_halves(qs: U8) -> U8:
    """``qs [..., 16]`` -> codes ``[..., 32]``: low nibbles are elements 0..15, high nibbles 16..31
    (the Q4_0 / Q4_1 in-block order)."""
    return np.concatenate((qs & 0x0F, qs >> 4), axis=-1)


def _blocks(raw: U8, block_bytes: int) -> U8:
    rows = raw.shape[0]
    return np.ascontiguousarray(raw).reshape(rows, -1, block_bytes)


def dequantize_f32(raw: U8) -> F32:
    return np.ascontiguousarray(raw).view("<f4").astype(np.float32, copy=True)


def dequantize_f16(raw: U8) -> F32:
    return np.ascontiguousarray(raw).view("<f2").astype(np.float32)


def dequantize_bf16(raw: U8) -> F32:
    # bfloat16 is the top half of a float32
    return (np.ascontiguousarray(raw).view("<u2").astype(np.uint32) << 16).view(np.float32)


def q4_0_parts(raw: U8) -> tuple[F32, U8]:
    """Q4_0 (18 bytes per 32): ``d`` float16, 16 bytes of nibbles; ``w = d * (q - 8)``.
    Returns ``d [rows, blocks, 1]`` and codes ``[rows, blocks, 32]``."""
    b = _blocks(raw, 18)
    return _f16(b[..., 0:2]), _nibbles_split_halves(b[..., 2:18])


def dequantize_q4_0(raw: U8) -> F32:
    d, q = q4_0_parts(raw)
    return (d * (q.astype(np.float32) - np.float32(8))).reshape(raw.shape[0], -1)


def q4_1_parts(raw: U8) -> tuple[F32, F32, U8]:
    """Q4_1 (20 bytes per 32): ``d``, ``m`` float16, 16 bytes of nibbles; ``w = d * q + m``."""
    b = _blocks(raw, 20)
    return _f16(b[..., 0:2]), _f16(b[..., 2:4]), _nibbles_split_halves(b[..., 4:20])


def dequantize_q4_1(raw: U8) -> F32:
    d, m, q = q4_1_parts(raw)
    return (d * q.astype(np.float32) + m).reshape(raw.shape[0], -1)


def dequantize_q8_0(raw: U8) -> F32:
    """Q8_0 (34 bytes per 32): ``d`` float16, 32 int8 codes; ``w = q * d``."""
    b = _blocks(raw, 34)
    d = _f16(b[..., 0:2])
    q = np.ascontiguousarray(b[..., 2:34]).view(np.int8).astype(np.float32)
    return (q * d).reshape(raw.shape[0], -1)


def k_scales_mins(packed: U8) -> tuple[U8, U8]:
    """The 12-byte field of Q4_K / Q5_K: eight 6-bit sub-block scales and eight 6-bit mins.
    Sub-blocks 0..3 take the low 6 bits of bytes 0..3 (scales) and 4..7 (mins); sub-blocks 4..7
    take a nibble of bytes 8..11 plus the top 2 bits of bytes 0..3 (scales) / 4..7 (mins)."""
    lo_sc, lo_m, hi = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    scales = np.concatenate((lo_sc & 63, (hi & 0x0F) | ((lo_sc >> 6) << 4)), axis=-1)
    mins = np.concatenate((lo_m & 63, (hi >> 4) | ((lo_m >> 6) << 4)), axis=-1)
    return scales, mins


def _k_nibbles(qs: U8) -> U8:
    """128 bytes of a 256-element super-block -> codes [..., 8, 32]: byte ``32c + l`` holds element
    ``64c + l`` in its low nibble and ``64c + 32 + l`` in its high nibble."""
    q = qs.reshape(*qs.shape[:-1], 4, 1, 32)
    return np.concatenate((q & 0x0F, q >> 4), axis=-2).reshape(*qs.shape[:-1], 8, 32)


def q4_k_parts(raw: U8) -> tuple[F32, F32, U8]:
    """Q4_K (144 bytes per 256): ``d``, ``dmin`` float16, 12 bytes of 6-bit scales/mins, 128 bytes
    of nibbles; ``w = (d * sc) * q - dmin * m`` per 32-element sub-block. Returns the per
    sub-block float32 ``scale [rows, blocks, 8, 1]``, ``min`` of the same shape, codes
    ``[rows, blocks, 8, 32]``."""
    b = _blocks(raw, 144)
    d, dmin = _f16(b[..., 0:2]), _f16(b[..., 2:4])
    sc, m = k_scales_mins(b[..., 4:16])
    scale = (d * sc.astype(np.float32))[..., None]
    low = (dmin * m.astype(np.float32))[..., None]
    return scale, low, _k_nibbles(b[..., 16:144])


def dequantize_q4_k(raw: U8) -> F32:
    scale, low, q = q4_k_parts(raw)
    return (scale * q.astype(np.float32) - low).reshape(raw.shape[0], -1)


def dequantize_q5_k(raw: U8) -> F32:
    """Q5_K (176 bytes per 256): as Q4_K plus 32 bytes ``qh``: bit ``j`` of ``qh[l]`` is the fifth
    bit of element ``32 j + l``."""
    b = _blocks(raw, 176)
    d, dmin = _f16(b[..., 0:2]), _f16(b[..., 2:4])
    sc, m = k_scales_mins(b[..., 4:16])
    qh = b[..., 16:48]
    high = (qh[..., None, :] >> np.arange(8, dtype=np.uint8)[:, None]) & 1  # [..., 8, 32]
    q = _k_nibbles(b[..., 48:176]) | (high << 4)
    scale = (d * sc.astype(np.float32))[..., None]
    low = (dmin * m.astype(np.float32))[..., None]
    return (scale * q.astype(np.float32) - low).reshape(raw.shape[0], -1)


def dequantize_q6_k(raw: U8) -> F32:
    """Q6_K (210 bytes per 256): 128 bytes ``ql`` (low 4 bits), 64 bytes ``qh`` (high 2 bits),
    16 int8 scales (one per 16 elements), ``d`` float16 last; ``w = (d * sc) * (q - 32)``.

    Each half of 128 elements uses 64 bytes of ``ql`` and 32 of ``qh``: element ``32 j + l``
    (``j`` 0..3) takes the low (j < 2) or high (j >= 2) nibble of ``ql[l + 32 (j % 2)]`` and bits
    ``2j, 2j+1`` of ``qh[l]``."""
    b = _blocks(raw, 210)
    lead = b.shape[:-1]
    ql = b[..., 0:128].reshape(*lead, 2, 2, 32)  # [half, j % 2, l]
    qh = b[..., 128:192].reshape(*lead, 2, 1, 32)
    sc = np.ascontiguousarray(b[..., 192:208]).view(np.int8).astype(np.float32)  # [..., 16]
    d = _f16(b[..., 208:210])
    low = np.concatenate((ql & 0x0F, ql >> 4), axis=-2)  # [half, j, l]
    high = (qh >> (2 * np.arange(4, dtype=np.uint8))[:, None]) & 3  # [half, j, l]
    q = (low | (high << 4)).astype(np.int8) - np.int8(32)
    scale = (d * sc).reshape(*lead, 2, 4, 2, 1)  # 16-element groups: [half, j, l // 16]
    w = scale * q.reshape(*lead, 2, 4, 2, 16).astype(np.float32)
    return w.reshape(raw.shape[0], -1)


#: GGML type name -> (elements per block, bytes per block, dequantizer)
DEQUANTIZERS: dict[str, tuple[int, int, Callable[[U8], F32]]] = {
    "F32": (1, 4, dequantize_f32),
    "F16": (1, 2, dequantize_f16),
    "BF16": (1, 2, dequantize_bf16),
    "Q4_0": (32, 18, dequantize_q4_0),
    "Q4_1": (32, 20, dequantize_q4_1),
    "Q8_0": (32, 34, dequantize_q8_0),
    "Q4_K": (QK_K, 144, dequantize_q4_k),
    "Q5_K": (QK_K, 176, dequantize_q5_k),
    "Q6_K": (QK_K, 210, dequantize_q6_k),
}
SUPPORTED_TYPES = tuple(DEQUANTIZERS)


def dequantize(raw: U8, type_name: str) -> F32:
    """``raw`` uint8 ``[rows, bytes_per_row]`` of GGML type ``type_name`` -> float32 ``[rows, cols]``."""
    return DEQUANTIZERS[type_name][2](raw)
