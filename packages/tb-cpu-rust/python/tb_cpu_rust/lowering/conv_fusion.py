"""Inference Conv + BatchNorm (+ ReLU / ReLU6 / hardtanh, + residual add) as one ``conv2d`` step.

A 2-d convolution's step stays open for an epilogue while nothing else has read its result
(``Lowerer.gemm_open``, the GEMM's mechanism). An eval-mode batch norm
(``_native_batch_norm_legit_no_training``) that is the convolution's only reader folds into it:
the step gains the norm's weight, bias, running mean and variance and its eps, and the kernel
scales the weights by ``weight / sqrt(var + eps)`` and shifts each output channel by
``bias - mean * scale`` — computed when the step runs, as the statistics are graph inputs.
Activations and a residual add that follow then fold the same way (``gemm.fuse_epilogue`` for
relu / silu / sigmoid / tanh / gelu / add, and ``hardtanh`` — ReLU6 — here).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tb_cpu_rust.lowering import steps as S
from tb_cpu_rust.lowering.dtypes import F32
from tb_cpu_rust.lowering.elementwise import check_ew
from tb_cpu_rust.lowering.limits import MAX_EPILOGUE
from tb_cpu_rust.lowering.lowerer import Lowerer
from tb_cpu_rust.lowering.norms import stats_materialised
from tb_cpu_rust.lowering.registry import register_lowering
from torchburn.plan import Ref, TensorMeta


def open_conv(lw: Lowerer, arg: Any) -> Any:
    """The open ``conv2d`` step whose result ``arg`` is, when ``arg`` is its only reader."""
    if not isinstance(arg, Ref) or lw.uses.get(arg.slot, 0) != 1:
        return None
    v = lw.slot.get(arg.slot)
    if not isinstance(v, int):
        return None
    step = lw.gemm_open.get(v)
    return step if isinstance(step, S.Conv2d) else None


def _is_f32(meta: Any) -> bool:
    return isinstance(meta, TensorMeta) and meta.dtype == F32


def _foldable_bn(lw: Lowerer, node: Any) -> bool:
    x, w, b, mean, var = node.args[:5]
    step = open_conv(lw, x)
    if step is None or step.epilogue or step.bn_mean is not None or step.res is not None:
        return False
    if not all(_is_f32(m) for m in node.out[:1]) or len(node.out[0].shape) != 4:
        return False
    return stats_materialised(lw, (w, b, mean, var), node.out[0].shape[1])


@register_lowering("aten._native_batch_norm_legit_no_training.default", check=check_ew, when=_foldable_bn)
def _conv_batch_norm(lw: Lowerer, node: Any) -> Any:
    x, w, b, mean, var, _momentum, eps = node.args
    c = lw.value(x)
    step = lw.gemm_open[c]
    opt = [lw.value(a) if a is not None else None for a in (w, b, mean, var)]
    fused = replace(step, bn_weight=opt[0], bn_bias=opt[1], bn_mean=opt[2], bn_var=opt[3], eps=float(eps))
    # the statistics' producers (views of inputs) may be later steps: the convolution moves
    # after them (nothing between reads its result)
    lw.steps.remove(step)
    lw.steps.append(fused)
    lw.gemm_open[c] = fused
    empties = tuple(lw.fresh(m) for m in node.out[1:])
    return (c, *empties)


def _hardtanh_bounds(node: Any) -> tuple[float, float] | None:
    a = list(node.args)
    lo = a[1] if len(a) > 1 else -1.0
    hi = a[2] if len(a) > 2 else 1.0
    if isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and not isinstance(lo, bool):
        return float(lo), float(hi)
    return None


def _foldable_hardtanh(lw: Lowerer, node: Any) -> bool:
    step = open_conv(lw, node.args[0])
    return (
        step is not None
        and len(step.epilogue) < MAX_EPILOGUE
        and _is_f32(node.out)
        and _hardtanh_bounds(node) is not None
        and list(node.out.shape) == lw.values[lw.slot[node.args[0].slot]]["sizes"]
    )


@register_lowering("aten.hardtanh.default", check=check_ew, when=_foldable_hardtanh)
def _conv_hardtanh(lw: Lowerer, node: Any) -> int:
    bounds = _hardtanh_bounds(node)
    assert bounds is not None  # checked by _foldable_hardtanh
    arg = node.args[0]
    c = lw.slot[arg.slot]
    step = lw.gemm_open[c]
    fused = replace(step, epilogue=(*step.epilogue, f"hardtanh:{bounds[0]!r}:{bounds[1]!r}"))
    lw.replace_step(step, fused)
    lw.gemm_open[c] = fused
    lw.used[arg.slot] = lw.used.get(arg.slot, 0) + 1
    return int(c)
