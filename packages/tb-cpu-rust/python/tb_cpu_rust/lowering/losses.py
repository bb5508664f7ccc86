"""Losses: negative log-likelihood forward and backward (one kernel step each)."""

from __future__ import annotations

from typing import Any

from tb_cpu_rust.lowering import steps as S
from tb_cpu_rust.lowering.checks import kernel_check
from tb_cpu_rust.lowering.lowerer import Lowerer
from tb_cpu_rust.lowering.registry import register_lowering


@register_lowering("aten.nll_loss_forward.default", check=kernel_check())
def _nll_loss(lw: Lowerer, node: Any) -> tuple[int, ...]:
    x, t, w, red, ignore = node.args
    out, total = (lw.fresh(m) for m in node.out)
    xv, tv = lw.value(x), lw.value(t)
    wv = lw.value(w) if w is not None else None
    lw.steps.append(
        S.NllLoss(x=xv, target=tv, weight=wv, out=out, total_weight=total, reduction=red, ignore_index=ignore)
    )
    return out, total


@register_lowering("aten.nll_loss_backward.default", check=kernel_check())
def _nll_loss_backward(lw: Lowerer, node: Any) -> int:
    g, x, t, w, red, ignore, total = node.args
    o = lw.fresh(node.out)
    gv, xv, tv = lw.value(g), lw.value(x), lw.value(t)
    wv = lw.value(w) if w is not None else None
    lw.steps.append(S.NllLossBwd(grad=gv, x=xv, target=tv, weight=wv, total_weight=lw.value(total), grad_in=o,
                                 reduction=red, ignore_index=ignore))  # fmt: skip
    return o
