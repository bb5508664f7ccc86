"""The backward of 1-d and 2-d convolution (``aten.convolution_backward``, not transposed): one
kernel step that writes the gradients the node's output mask asks for (input, weight, bias),
each in the layout AOTAutograd gave it (channels-last included, no layout copy). A 1-d
convolution's is the 2-d one over a height of 1."""

from __future__ import annotations

from typing import Any

from tb_cpu_rust.lowering import steps as S
from tb_cpu_rust.lowering.checks import kernel_check
from tb_cpu_rust.lowering.conv_pool import masked_results
from tb_cpu_rust.lowering.lowerer import Lowerer
from tb_cpu_rust.lowering.registry import register_lowering

#: grad_out (N, OC, OH, OW), x (N, C, H, W), weight (OC, C / groups, KH, KW) -> the gradients that
#: ``mask`` (input, weight, bias as 1 / 0) asks for, in that order
Conv2dBackward = S.kind(
    "conv2d_backward",
    "grad x weight",
    "*outs",
    "stride:ints=(1, 1) padding:ints=(0, 0) dilation:ints=(1, 1) groups:int=1 mask:ints=(1, 1, 1)",
)


def _check(info: Any) -> str | None:
    if len(info.inputs[1].shape) not in (3, 4):
        return "only the backward of 1-d and 2-d convolution"
    if info.args[7]:
        return "transposed convolution backward"
    return None


@register_lowering("aten.convolution_backward.default", check=kernel_check(float_only=True, extra=_check))
def _convolution_backward(lw: Lowerer, node: Any) -> tuple[int | None, ...]:
    gy_arg, x_arg, w_arg, _bias_sizes, stride, padding, dilation, _transposed, _outpad, groups, mask = node.args
    gy, x, w = lw.value(gy_arg), lw.value(x_arg), lw.value(w_arg)
    one_d = len(stride) == 1
    st, pad, dil = (tuple(int(v) for v in t) for t in (stride, padding, dilation))
    if one_d:
        # a 1-d convolution is a 2-d one over a height of 1
        gy, x, w = (lw.unsqueeze2(v) for v in (gy, x, w))
        st, pad, dil = (1, st[0]), (0, pad[0]), (1, dil[0])
    # grad_bias is (OC,) in both ranks; the others take the height of 1 in 1-d
    outs, kernel_outs, flags = masked_results(lw, node, mask, lambda i, o: lw.unsqueeze2(o) if one_d and i < 2 else o)
    lw.steps.append(Conv2dBackward(grad=gy, x=x, weight=w, outs=kernel_outs, stride=st, padding=pad, dilation=dil,
                                   groups=int(groups), mask=tuple(flags)))  # fmt: skip
    return tuple(outs)
