"""Batch norm backward (``aten.native_batch_norm_backward``, what AOTAutograd's backward graph of
a training-mode batch norm holds once tb-core keeps it whole): one ``batch_norm_backward`` step
(kernels/reduce/batch_norm.rs) over (N, C, S) views of the tensors (the spatial dims merged, so
NCHW and channels-last both go without a copy), writing the gradients the output mask asks for."""

from __future__ import annotations

import math
from typing import Any

from tb_cpu_rust.lowering import steps as S
from tb_cpu_rust.lowering.checks import kernel_check
from tb_cpu_rust.lowering.conv_pool import masked_results
from tb_cpu_rust.lowering.lowerer import Lowerer
from tb_cpu_rust.lowering.registry import LoweringError, register_lowering

#: grad, x (N, C, S), weight? (C,), mean (C,), invstd (training) or running var (eval) (C,) -> the
#: gradients ``mask`` (input, weight, bias as 1 / 0) asks for, in that order
BatchNormBackward = S.kind(
    "batch_norm_backward", "grad x weight? mean stat", "*outs", "training:bool=True eps:float=0.0 mask:ints=(1, 1, 1)"
)


def _check(info: Any) -> str | None:
    if len(info.inputs[1].shape) < 2:
        return "batch norm backward of an input without a channel dim"
    return None


@register_lowering("aten.native_batch_norm_backward.default", check=kernel_check(float_only=True, extra=_check))
def _batch_norm_backward(lw: Lowerer, node: Any) -> tuple[int | None, ...]:
    g_arg, x_arg, w_arg, rm_arg, rv_arg, sm_arg, si_arg, training, eps, mask = node.args
    mean_arg, stat_arg = (sm_arg, si_arg) if training else (rm_arg, rv_arg)
    if mean_arg is None or stat_arg is None:
        raise LoweringError("batch norm backward without the statistics it normalised with")
    g, x = lw.value(g_arg), lw.value(x_arg)
    sizes = list(lw.values[x]["sizes"])
    ncs = [sizes[0], sizes[1], math.prod(sizes[2:])]

    def as_ncs(v: int) -> int:
        try:
            return lw.view_of(v, lw.meta_tensor(v).view(ncs))
        except RuntimeError as exc:  # spatial dims that do not merge into one stride
            raise LoweringError(f"batch norm backward layout: {exc}") from exc

    outs, kernel_outs, flags = masked_results(lw, node, mask, lambda i, o: as_ncs(o) if i == 0 else o)
    lw.steps.append(
        BatchNormBackward(
            grad=as_ncs(g), x=as_ncs(x), weight=lw.value(w_arg) if w_arg is not None else None,
            mean=lw.value(mean_arg), stat=lw.value(stat_arg), outs=kernel_outs, training=bool(training),
            eps=float(eps), mask=tuple(flags),
        )
    )  # fmt: skip
    return tuple(outs)
