"""GGUF tensors as the weights the decoder reads, and the choice per tensor of how its GGML
blocks become one of tb-llm's layouts (``quant`` = fp32 / bf16 / int8 / int4).

A quantized GGUF matrix is *kept* when tb-llm's layout holds exactly its values: the codes and
scales are carried over and ``QuantWeight.dequantize()`` gives bit for bit the floats GGML's
dequantizer gives (checked on every tensor at load, not assumed). Otherwise it is *dequantized*
(to fp32 / bf16) or *requantized* (dequantized, then tb-llm's own quantizer, to int8 / int4).

int4 (``(q - 8) * scale + zero``, float16 scale and zero, groups of 32 along a row) can keep:

* Q4_0 (``d * (q - 8)``): scale ``d``, zero ``-0.0`` -- always exact (``-0.0`` keeps the sign of
  a zero product as GGML's ``d * 0`` has it).
* Q4_1 (``d * q + m``) and Q4_K (``(d*sc) * q - dmin*m`` per 32): scale ``d`` / ``d*sc``, zero
  ``m + 8d`` / ``8*d*sc - dmin*m`` -- exact only where those are float16 values and float32
  rounds both forms alike, so each tensor is checked and requantized if any value differs.

The check computes the layout's definition, ``(q - 8) * scale + zero`` in float32, in numpy
(tests compare it with ``QuantWeight.dequantize`` itself).

int8 is one scale per row, which no GGML block format is (Q8_0 has one per 32), so int8 always
requantizes a quantized GGUF tensor.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt
import torch

from tb_llm.gguf.architecture import TensorPlan, unpermute_rows
from tb_llm.gguf.dequantize import dequantize, q4_0_parts, q4_1_parts, q4_k_parts
from tb_llm.gguf.reader import GGUFFile, GGUFTensor
from tb_llm.quant import QuantWeight

FLOAT_TYPES = ("F32", "F16", "BF16")
KEPT, DEQUANTIZED, REQUANTIZED, CONVERTED, QUANTIZED = "kept", "dequantized", "requantized", "converted", "quantized"


def action_for(type_name: str, target: str) -> str:
    """What loading a ``type_name`` tensor into layout ``target`` does, when it is not kept."""
    if type_name in FLOAT_TYPES:
        if target in ("int8", "int4"):
            return QUANTIZED
        same = (type_name, target) in (("F32", "fp32"), ("BF16", "bf16"))
        return KEPT if same else CONVERTED
    return DEQUANTIZED if target in ("fp32", "bf16") else REQUANTIZED


def int4_candidate(t: GGUFTensor, raw: npt.NDArray[np.uint8]) -> QuantWeight | None:
    """The int4 group-32 QuantWeight holding ``raw`` (``t``'s blocks, rows already in HF order)
    with its codes and scales as they are, when that layout reproduces GGML's floats bit for bit;
    None otherwise (or for a type int4 cannot carry)."""
    rows = raw.shape[0]
    if t.type_name == "Q4_0":
        d, q = q4_0_parts(raw)
        scale, zero = d, np.full_like(d, -0.0)
    elif t.type_name == "Q4_1":
        d, m, q = q4_1_parts(raw)
        scale, zero = d, m + np.float32(8) * d
    elif t.type_name == "Q4_K":
        scale, low, q = q4_k_parts(raw)
        zero = np.float32(8) * scale - low
    else:
        return None
    if not (_is_f16(scale) and _is_f16(zero)):
        return None
    # QuantWeight's definition, (q - 8) * scale + zero in float32, against GGML's dequantization
    with np.errstate(all="ignore"):
        mine = (q.astype(np.float32) - np.float32(8)) * scale + zero
    if not np.array_equal(mine.reshape(rows, -1).view(np.uint32), dequantize(raw, t.type_name).view(np.uint32)):
        return None
    codes = q.reshape(rows, -1)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)  # pack_int4's layout: even column in the low nibble
    return QuantWeight(
        "int4",
        (rows, codes.shape[1]),
        qweight=torch.from_numpy(np.ascontiguousarray(packed)),
        scales=torch.from_numpy(np.ascontiguousarray(scale.reshape(rows, -1))),
        zeros=torch.from_numpy(np.ascontiguousarray(zero.reshape(rows, -1))),
        group_size=32,
    )


def _is_f16(values: npt.NDArray[np.float32]) -> bool:
    with np.errstate(over="ignore", invalid="ignore"):
        back = values.astype(np.float16).astype(np.float32)
    return bool(np.array_equal(back.view(np.uint32), values.view(np.uint32)))


def bit_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.int32), b.contiguous().view(torch.int32))


class GGUFWeights:
    """The decoder's weight source for a GGUF file: ``get(name)`` (HF name) -> float32 tensor, and
    ``quantized(name, kind, group_size)`` -> the kept QuantWeight, or None to quantize ``get``'s.
    Records, per tensor, the GGML type and what loading did (for ``LLM.info()``)."""

    def __init__(self, f: GGUFFile, plan: dict[str, TensorPlan]) -> None:
        self.file = f
        self.folder = f.path.parent
        self.plan = plan
        self.kept: set[str] = set()

    @property
    def path(self) -> Path:
        return self.file.path

    def __contains__(self, name: object) -> bool:
        return name in self.plan

    def __iter__(self) -> Iterator[str]:
        return iter(self.plan)

    def tensor(self, name: str) -> GGUFTensor:
        return self.file.tensors[self.plan[name].gguf_name]

    def type_of(self, name: str) -> str:
        return self.tensor(name).type_name

    def shape_of(self, name: str) -> tuple[int, ...]:
        return self.tensor(name).shape

    def _raw(self, name: str) -> npt.NDArray[np.uint8]:
        p = self.plan[name]
        raw = self.tensor(name).raw
        return unpermute_rows(raw, p.unpermute_heads) if p.unpermute_heads else raw

    def get(self, name: str) -> torch.Tensor:
        p, t = self.plan[name], self.tensor(name)
        w = dequantize(self._raw(name), t.type_name).reshape(t.shape)
        if p.minus_one:
            w = w - np.float32(1)
        return torch.from_numpy(np.ascontiguousarray(w))

    def quantized(self, name: str, kind: str, group_size: int) -> QuantWeight | None:
        """``name``'s GGUF blocks as a ``kind`` QuantWeight, when that layout holds them exactly."""
        t = self.tensor(name)
        if kind != "int4" or group_size != 32 or len(t.shape) != 2 or self.plan[name].minus_one:
            return None
        candidate = int4_candidate(t, self._raw(name))
        if candidate is None:
            return None
        self.kept.add(name)
        return candidate

    def summary(self, targets: dict[str, str]) -> dict[str, dict[str, int]]:
        """GGML type -> {action: tensor count} over the tensors in ``targets`` (HF name -> layout)."""
        out: dict[str, Counter[str]] = {}
        for name, target in targets.items():
            type_name = self.type_of(name)
            act = KEPT if name in self.kept else action_for(type_name, target)
            out.setdefault(type_name, Counter())[act] += 1
        return {k: dict(sorted(v.items())) for k, v in sorted(out.items())}
