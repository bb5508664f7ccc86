"""Steps that may multiply bfloat16 values, marked as such (``mark_bfloat16_products``).

The low-precision pass (torchburn.low_precision) computes a bfloat16 convolution or attention in
float32 between casts: ``cast(x, f32)``, ``cast(w, f32)`` -> ``conv2d`` -> ``cast(bf16)``. Eager
PyTorch multiplies the bfloat16 values themselves there (float32 sums; its bfloat16 flash
attention also rounds the softmax's probabilities to bfloat16 before multiplying V), so the
engine may too: a ``conv2d`` step whose input and weights, or an ``sdpa`` step whose q, k and v,
are each written by nothing but a cast from bfloat16 gets ``bf16=True``, and its kernels then run
their products on bfloat16 pairs (``winograd_pairs.rs``, ``gemm_pairs.rs``,
``attention_pairs.rs``: twice the float32 kernel's multiply-adds per cycle where the CPU has
AVX-512 BF16). float16 steps are not marked (a bfloat16 product would lose float16's extra
mantissa bits). Operates on ``lw.steps`` before the casts are folded anywhere.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from tb_cpu_rust.lowering import steps as S
from tb_cpu_rust.lowering.dtypes import F32
from tb_cpu_rust.lowering.lowerer import Lowerer

#: each step kind that takes ``bf16`` -> the operands that must be bfloat16 values
_OPERANDS: dict[type, tuple[str, ...]] = {S.Conv2d: ("x", "weight"), S.Sdpa: ("q", "k", "v")}


def mark_bfloat16_products(lw: Lowerer) -> None:
    """Sets ``bf16`` on each ``conv2d`` / ``sdpa`` step whose operands (``_OPERANDS``) are
    bfloat16 values widened."""
    if not any(type(st) in _OPERANDS for st in lw.steps):
        return
    writers: dict[int, list[int]] = {}
    for i, st in enumerate(lw.steps):
        for v in st.writes():
            writers.setdefault(lw.values[v]["buf"], []).append(i)

    def widened_bf16(v: int, before: int) -> bool:
        ws = writers.get(lw.values[v]["buf"], [])
        if len(ws) != 1 or ws[0] >= before:
            return False
        cast = lw.steps[ws[0]]
        return isinstance(cast, S.Cast) and lw.dtype_of(cast.y) == F32 and lw.dtype_of(cast.x) == torch.bfloat16

    for i, st in enumerate(lw.steps):
        names = _OPERANDS.get(type(st))
        marked: Any = st  # a Conv2d or Sdpa step (both have ``bf16``)
        if names and not marked.bf16 and all(widened_bf16(getattr(st, n), i) for n in names):
            lw.steps[i] = replace(marked, bf16=True)
