"""Inference Conv + BatchNorm (+ ReLU / ReLU6 / hardtanh, + residual add, or + a 2×2 max pool) as one
``conv2d`` step.

A 2-d convolution's step stays open for an epilogue while nothing else has read its result
(``Lowerer.gemm_open``, the GEMM's mechanism). An eval-mode batch norm
(``_native_batch_norm_legit_no_training``) that is the convolution's only reader folds into it:
the step gains the norm's weight, bias, running mean and variance and its eps, and the kernel
scales the weights by ``weight / sqrt(var + eps)`` and shifts each output channel by
``bias - mean * scale`` — computed when the step runs, as the statistics are graph inputs.
Activations and a residual add that follow then fold the same way (``gemm.fuse_epilogue`` for
relu / silu / sigmoid / tanh / gelu / add, and ``hardtanh`` — ReLU6 — here).

A 2×2 stride-2 max pool whose indices nothing reads (inference) folds last, when the epilogue is
only relu / hardtanh (they and the per-channel shift commute with the max) and has no residual:
the step's ``pool`` is 2 and its result is the pooled tensor. The Winograd 3×3 path takes the
max of each of its 2×2 output tiles before the epilogue and never writes the full result; the
other paths pool a scratch copy.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tb_cpu_rust.lowering import steps as S
from tb_cpu_rust.lowering.checks import kernel_check, rank_in
from tb_cpu_rust.lowering.conv_pool import reads_item
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


def _pool_2x2(node: Any) -> bool:
    """``max_pool2d_with_indices(x, 2, 2 or [], 0, 1, False)``: windows that tile the input."""
    a = list(node.args)
    pair = lambda v: [int(v)] * 2 if isinstance(v, int) else [int(e) for e in v]  # noqa: E731
    k = pair(a[1])
    s = pair(a[2]) if len(a) > 2 and a[2] else k
    p = pair(a[3]) if len(a) > 3 else [0, 0]
    d = pair(a[4]) if len(a) > 4 else [1, 1]
    ceil = bool(a[5]) if len(a) > 5 else bool(node.kwargs.get("ceil_mode", False))
    return k == [2, 2] and s == [2, 2] and p == [0, 0] and d == [1, 1] and not ceil


def _foldable_pool(lw: Lowerer, node: Any) -> bool:
    step = open_conv(lw, node.args[0])
    return (
        step is not None
        and step.res is None
        and step.pool == 0
        and all(e == "relu" or e.startswith("hardtanh:") for e in step.epilogue)
        and set(node.kwargs) <= {"ceil_mode"}
        and _pool_2x2(node)
        and _is_f32(node.out[0])
        and not reads_item(lw, 1)
    )


@register_lowering(
    "aten.max_pool2d_with_indices.default",
    check=kernel_check(extra=rank_in(4, reason="only 4-d pooling input")),
    when=_foldable_pool,
)
def _conv_max_pool(lw: Lowerer, node: Any) -> tuple[int, int]:
    arg = node.args[0]
    c = lw.slot[arg.slot]
    step = lw.gemm_open.pop(c)  # closed: nothing may follow the pool in the epilogue
    y = lw.fresh(node.out[0])
    idx = lw.fresh(node.out[1])  # nothing reads the indices (checked): never written
    lw.replace_step(step, replace(step, y=y, pool=2))
    lw.used[arg.slot] = lw.used.get(arg.slot, 0) + 1
    return y, idx
