"""Scaled dot-product attention: one flash-style ``sdpa`` step (online softmax over key blocks)."""

from __future__ import annotations

import math
from typing import Any

from tb_cpu_rust.lowering import steps as S
from tb_cpu_rust.lowering.checks import kernel_check
from tb_cpu_rust.lowering.lowerer import Lowerer
from tb_cpu_rust.lowering.registry import register_lowering


def _sdpa_check(info: Any) -> str | None:
    """No dropout, and as many key/value heads as query heads: the kernel has no grouped-query
    (GQA) indexing yet, so such a node stays eager on its own instead of failing the partition."""
    if len(info.args) > 3 and info.args[3]:
        return "dropout"
    q, k, v = info.inputs[:3]
    if len(q.shape) != 4 or len(k.shape) != 4 or len(v.shape) != 4:
        return "sdpa needs 4-d query, key and value"
    if k.shape[1] != q.shape[1] or v.shape[1] != q.shape[1]:
        return f"grouped-query attention ({q.shape[1]} query heads, {k.shape[1]} key/value heads)"
    return None


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
    lw.steps.append(S.Sdpa(q=q, k=k, v=v, mask=mv, out=out, lse=lse, causal=causal, scale=scale))
    return out, lse
