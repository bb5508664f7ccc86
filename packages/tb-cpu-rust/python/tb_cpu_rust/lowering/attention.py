"""Scaled dot-product attention: one flash-style ``sdpa`` step (online softmax over key blocks)."""

from __future__ import annotations

import math
from typing import Any

import torch

from tb_cpu_rust.lowering import steps as S
from tb_cpu_rust.lowering.checks import kernel_check
from tb_cpu_rust.lowering.lowerer import Lowerer
from tb_cpu_rust.lowering.registry import register_lowering


def _sdpa_check(info: Any) -> str | None:
    """No dropout; key and value heads equal in number and dividing the query heads (grouped-query
    attention: query head ``i`` reads key/value head ``i // (H / Hkv)``)."""
    if len(info.args) > 3 and info.args[3]:
        return "dropout"
    q, k, v = info.inputs[:3]
    if len(q.shape) != 4 or len(k.shape) != 4 or len(v.shape) != 4:
        return "sdpa needs 4-d query, key and value"
    hq, hk = q.shape[1], k.shape[1]
    if v.shape[1] != hk or (hk == 0 and hq != 0) or (hk != 0 and hq % hk != 0):
        return f"{hq} query heads, {hk} key heads and {v.shape[1]} value heads (grouped-query attention needs equal key/value heads dividing the query heads)"
    return None


def eager_nan_row_masked() -> bool:
    """Whether eager's CPU attention turns a query row whose every score is NaN into a fully masked
    row (weights 0: the output row 0, NaN only where a value is infinite) rather than a row of NaN.
    Its kernels compiled for AVX-512 do (their row maximum passes over NaN and finds none, a row
    treated as masked); the AVX2 and baseline ones propagate NaN. Which of them runs is torch's CPU
    capability (the CPU's, or ``ATEN_CPU_CAPABILITY``): measured with torch 2.15 on a Zen 4 under
    ``ATEN_CPU_CAPABILITY=avx512 / avx2 / default``."""
    return str(torch.backends.cpu.get_cpu_capability()).upper().startswith("AVX512")


@register_lowering(
    "aten._scaled_dot_product_flash_attention_for_cpu.default", check=kernel_check(float_only=True, extra=_sdpa_check)
)
def _sdpa(lw: Lowerer, node: Any) -> tuple[int, ...]:
    a, kw = list(node.args), dict(node.kwargs)
    q, k, v = (lw.value(t) for t in a[:3])
    causal = bool(a[4] if len(a) > 4 else kw.get("is_causal", False))
    mask = kw.get("attn_mask")
    scale = kw.get("scale")
    qs = lw.values[q]["sizes"]
    scale = 1.0 / math.sqrt(qs[-1]) if scale is None else float(scale)
    out, lse = (lw.fresh(m) for m in node.out)
    mv = None
    if mask is not None:
        b_, h_, l_ = qs[0], qs[1], qs[2]
        s_ = lw.values[k]["sizes"][2]
        mv = lw.broadcast(lw.value(mask), (b_, h_, l_, s_))
    lw.steps.append(
        S.Sdpa(
            q=q, k=k, v=v, mask=mv, out=out, lse=lse, causal=causal, scale=scale, nan_row_masked=eager_nan_row_masked()
        )
    )
    return out, lse
