"""bfloat16 convolutions marked as such (``mark_bfloat16_convolutions``).

The low-precision pass (torchburn.low_precision) computes a bfloat16 convolution in float32
between casts: ``cast(x, f32)``, ``cast(w, f32)`` -> ``conv2d`` -> ``cast(bf16)``. Eager PyTorch
multiplies the bfloat16 values themselves there (float32 sums), so the engine may too: a
``conv2d`` step whose input and weights are each written by nothing but a cast from bfloat16 gets
``bf16=True``, and its Winograd path then runs the channel sums on bfloat16 pair products
(``winograd_pairs.rs``: twice the float32 kernel's multiply-adds per cycle where the CPU has
AVX-512 BF16). float16 convolutions are not marked (a bfloat16 product would lose float16's
extra mantissa bits). Operates on ``lw.steps`` before the casts are folded anywhere.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from tb_cpu_rust.lowering import steps as S
from tb_cpu_rust.lowering.dtypes import F32
from tb_cpu_rust.lowering.lowerer import Lowerer


def mark_bfloat16_convolutions(lw: Lowerer) -> None:
    """Sets ``bf16`` on each ``conv2d`` step whose input and weights are bfloat16 values widened."""
    if not any(isinstance(st, S.Conv2d) for st in lw.steps):
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
        if isinstance(st, S.Conv2d) and not st.bf16 and widened_bf16(st.x, i) and widened_bf16(st.weight, i):
            lw.steps[i] = replace(st, bf16=True)
