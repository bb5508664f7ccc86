"""Convolution (1-d, 2-d, 3-d, transposed), pooling (max / avg / adaptive, 2-d and 3-d, and the
max-pool backward), interpolation and grid sampling: one kernel step each."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tb_cpu_rust.lowering import steps as S
from tb_cpu_rust.lowering.checks import kernel_check, more_check, rank_in
from tb_cpu_rust.lowering.lowerer import Lowerer
from tb_cpu_rust.lowering.registry import LoweringError, register_lowering
from torchburn.plan import GETITEM, Ref

_CONV_RANKS = "only 1-d, 2-d and 3-d convolution, and 1-d and 2-d transposed convolution"


def _check_conv(info: Any) -> str | None:
    rank = len(info.inputs[0].shape)
    return _CONV_RANKS if rank not in (3, 4, 5) or (info.args[6] and rank == 5) else None


def _pair(v: Any) -> list[int]:
    if isinstance(v, int):
        return [v, v]
    v = list(v)
    return v * 2 if len(v) == 1 else v[:2]


def _triple(v: Any) -> list[int]:
    return [int(x) for x in v] * (3 if len(v) == 1 else 1) if isinstance(v, (list, tuple)) else [int(v)] * 3


@register_lowering("aten.convolution.default", check=kernel_check(float_only=True, extra=_check_conv))
def _convolution(lw: Lowerer, node: Any) -> int:
    x, w, b, stride, padding, dilation, transposed, outpad, groups = node.args
    if len(stride) not in (1, 2, 3) or (transposed and len(stride) == 3):
        raise LoweringError(_CONV_RANKS)
    o = lw.fresh(node.out)
    xv, wv = lw.value(x), lw.value(w)
    bv = lw.value(b) if b is not None else None
    if len(stride) == 3:
        lw.steps.append(S.Conv3d(x=xv, weight=wv, bias=bv, y=o, stride=_ints(stride), padding=_ints(padding),
                                 dilation=_ints(dilation), groups=int(groups)))  # fmt: skip
        return o
    target = o
    if len(stride) == 1:
        # a 1-d convolution is a 2-d one over a height of 1
        xv, wv, target = (lw.unsqueeze2(v) for v in (xv, wv, o))
        stride, padding, dilation = [1, stride[0]], [0, padding[0]], [1, dilation[0]]
        outpad = [0, outpad[0]]
    st, pad, dil = _ints(stride[:2]), _ints(padding[:2]), _ints(dilation[:2])
    if transposed:
        lw.steps.append(S.ConvTranspose2d(x=xv, weight=wv, bias=bv, y=target, stride=st, padding=pad, dilation=dil,
                                          groups=int(groups), output_padding=_ints(outpad[:2])))  # fmt: skip
    else:
        step = S.Conv2d(x=xv, weight=wv, bias=bv, res=None, bn_weight=None, bn_bias=None, bn_mean=None, bn_var=None,
                        y=target, stride=st, padding=pad, dilation=dil, groups=int(groups))  # fmt: skip
        lw.steps.append(step)
        if target == o:
            # open for an epilogue: a following eval batch norm (conv_fusion), an activation or a
            # residual add (gemm.fuse_epilogue) folds into the convolution's output tiles
            lw.gemm_open[o] = step
    return o


def _ints(v: Any) -> tuple[int, ...]:
    return tuple(int(x) for x in v)


def _window(a: list[Any], spread: Any) -> tuple[list[int], list[int], list[int]]:
    """Kernel size, stride (the kernel size when empty) and padding of a pooling op."""
    return spread(a[1]), spread(a[2] if len(a) > 2 and a[2] else a[1]), spread(a[3] if len(a) > 3 else 0)


@register_lowering(
    "aten.max_pool2d_with_indices.default", check=kernel_check(extra=rank_in(4, reason="only 4-d pooling input"))
)
def _max_pool2d(lw: Lowerer, node: Any) -> tuple[int, ...]:
    a = list(node.args)
    x = lw.value(a[0])
    k, s, p = _window(a, _pair)
    d = _pair(a[4] if len(a) > 4 else 1)
    y, idx = (lw.fresh(m) for m in node.out)
    lw.steps.append(S.MaxPool(x=x, y=y, indices=idx, kernel=tuple(k), stride=tuple(s), padding=tuple(p),
                              dilation=tuple(d), with_indices=reads_item(lw, 1)))  # fmt: skip
    return y, idx


def reads_item(lw: Lowerer, item: int) -> bool:
    """Whether the plan reads result ``item`` of the node being lowered."""
    return any(
        n.op == GETITEM and isinstance(n.args[0], Ref) and n.args[0].slot == lw.node_slot and n.args[1] == item
        for n in lw.plan.nodes
    )


def masked_results(
    lw: Lowerer, node: Any, mask: Any, kernel_view: Callable[[int, int], int]
) -> tuple[list[int | None], list[int], list[int]]:
    """The results of a backward node with an output mask: (the node's result per slot, None where
    not computed; the values the kernel writes, ``kernel_view(slot, value)``; one flag per slot).
    A result the mask leaves out but the graph still reads (its getitem is an output) is computed
    all the same: the node's meta gives it a tensor where eager gives None."""
    outs: list[int | None] = [None] * len(node.out)
    kernel_outs: list[int] = []
    flags: list[int] = []
    for i, meta in enumerate(node.out):
        want = meta is not None and (bool(mask[i]) or reads_item(lw, i))
        flags.append(int(want))
        if want:
            o = lw.fresh(meta)
            outs[i] = o
            kernel_outs.append(kernel_view(i, o))
    return outs, kernel_outs, flags


@register_lowering(
    "aten.avg_pool2d.default", check=kernel_check(float_only=True, extra=rank_in(4, reason="only 4-d pooling input"))
)
def _avg_pool2d(lw: Lowerer, node: Any) -> int:
    a = list(node.args)
    x = lw.value(a[0])
    k, s, p = _window(a, _pair)
    include = a[5] if len(a) > 5 else True
    div = a[6] if len(a) > 6 and a[6] is not None else 0
    o = lw.fresh(node.out)
    pooled = lw.fresh(node.out) if div < 0 else o
    lw.steps.append(S.AvgPool(x=x, y=pooled, kernel=tuple(k), stride=tuple(s), padding=tuple(p),
                              count_include_pad=bool(include), divisor=abs(int(div))))  # fmt: skip
    if div < 0:  # PyTorch divides by a negative divisor_override as given
        lw.steps.append(S.Ew("f32", [pooled], [o], [S.load(0, 0), S.instr("neg", 1, [0]), S.store(0, 1)]))
    return o


_POOL3D_RANKS = rank_in(4, 5, reason="only 4-d and 5-d 3-d pooling input")


@register_lowering(
    "aten.max_pool3d_with_indices.default",
    "aten.avg_pool3d.default",
    check=kernel_check(float_only=True, extra=_POOL3D_RANKS),
)
def _pool3d(lw: Lowerer, node: Any) -> Any:
    a = list(node.args)
    x = lw.value(a[0])
    k, s, p = _window(a, _triple)
    metas = list(node.out) if isinstance(node.out, (list, tuple)) else [node.out]
    outs = [lw.fresh(m) for m in metas]
    kernel_outs = outs
    if len(lw.values[x]["sizes"]) == 4:  # (C, D, H, W): one volume
        x = lw.unbatched(x)
        kernel_outs = [lw.unbatched(o) for o in outs]
    k3, s3, p3 = tuple(k), tuple(s), tuple(p)
    if node.op == "aten.max_pool3d_with_indices.default":
        d = tuple(_triple(a[4] if len(a) > 4 else 1))
        lw.steps.append(
            S.MaxPool3d(x=x, y=kernel_outs[0], indices=kernel_outs[1], kernel=k3, stride=s3, padding=p3, dilation=d)
        )
        return tuple(outs)
    include = a[5] if len(a) > 5 else True
    div = a[6] if len(a) > 6 and a[6] is not None else 0
    if div < 0:
        raise LoweringError("negative divisor_override")
    lw.steps.append(S.AvgPool3d(x=x, y=kernel_outs[0], kernel=k3, stride=s3, padding=p3,
                                count_include_pad=bool(include), divisor=int(div)))  # fmt: skip
    return outs[0]


#: adaptive pooling op -> (step kind, spatial dims)
ADAPTIVE_POOLS: dict[str, tuple[Any, int]] = {
    "aten._adaptive_avg_pool2d.default": (S.AdaptivePool, 2),
    "aten.adaptive_max_pool2d.default": (S.AdaptiveMaxPool2d, 2),
    "aten._adaptive_avg_pool3d.default": (S.AdaptiveAvgPool3d, 3),
    "aten.adaptive_max_pool3d.default": (S.AdaptiveMaxPool3d, 3),
}


@register_lowering(
    "aten._adaptive_avg_pool2d.default", "aten.adaptive_max_pool2d.default",
    check=kernel_check(float_only=True, extra=rank_in(3, 4, reason="only 3-d and 4-d adaptive pooling input")),
)  # fmt: skip
@register_lowering(
    "aten._adaptive_avg_pool3d.default", "aten.adaptive_max_pool3d.default",
    check=kernel_check(float_only=True, extra=rank_in(4, 5, reason="only 4-d and 5-d adaptive 3-d pooling input")),
)  # fmt: skip
def _adaptive_pool(lw: Lowerer, node: Any) -> Any:
    kind, spatial = ADAPTIVE_POOLS[node.op]
    x = lw.value(node.args[0])
    metas = list(node.out) if isinstance(node.out, (list, tuple)) else [node.out]
    outs = [lw.fresh(m) for m in metas]
    if len(lw.values[x]["sizes"]) == spatial + 1:  # (C, H, W) or (C, D, H, W): unbatched
        x = lw.unbatched(x)
        kernel_outs = [lw.unbatched(o) for o in outs]
    else:
        kernel_outs = outs
    lw.steps.append(kind(x=x, outs=kernel_outs))
    return outs[0] if len(outs) == 1 else tuple(outs)


@register_lowering(
    "aten.max_pool2d_with_indices_backward.default",
    check=more_check(extra=rank_in(3, 4, reason="3-d or 4-d pooling only")),
)
def _max_pool2d_backward(lw: Lowerer, node: Any) -> int:
    g, idx = lw.value(node.args[0]), lw.value(node.args[7])
    gi = lw.fresh(node.out)
    if len(node.out.shape) == 3:
        g, idx, kgi = lw.unbatched(g), lw.unbatched(idx), lw.unbatched(gi)
    else:
        kgi = gi
    lw.steps.append(S.MaxPool2dBwd(grad=g, indices=idx, grad_in=kgi))
    return gi


#: grad (N, C, OH, OW) -> grad_in (N, C, H, W): each cell's gradient spread evenly over its window
AdaptiveAvgPool2dBwd = S.kind("adaptive_avg_pool2d_bwd", "grad", "grad_in", "")


@register_lowering(
    "aten._adaptive_avg_pool2d_backward.default",
    check=kernel_check(float_only=True, extra=rank_in(3, 4, reason="3-d or 4-d pooling only")),
)
def _adaptive_avg_pool2d_backward(lw: Lowerer, node: Any) -> int:
    g = lw.value(node.args[0])  # args[1], the forward's input, gives only grad_in's shape
    gi = lw.fresh(node.out)
    kernel_g, kernel_gi = (lw.unbatched(g), lw.unbatched(gi)) if len(node.out.shape) == 3 else (g, gi)
    lw.steps.append(AdaptiveAvgPool2dBwd(grad=kernel_g, grad_in=kernel_gi))
    return gi


_FOUR_D = rank_in(4, reason="4-d input only")


@register_lowering(
    "aten.upsample_bilinear2d.default", "aten.upsample_bicubic2d.default", check=more_check(extra=_FOUR_D)
)
@register_lowering("aten.upsample_trilinear3d.default", check=more_check(extra=rank_in(5, reason="5-d input only")))
def _upsample(lw: Lowerer, node: Any) -> int:
    op, a, kw = node.op, list(node.args), dict(node.kwargs)

    def arg(i: int, name: str) -> Any:
        return a[i] if len(a) > i else kw.get(name)

    nd = 3 if "3d" in op else 2
    align = bool(arg(2, "align_corners"))
    names = ["scales_d", "scales_h", "scales_w"][3 - nd :]
    scales = [arg(3 + i, nm) for i, nm in enumerate(names)]
    o = lw.fresh(node.out)
    kind = S.UpsampleCubic if "bicubic" in op else S.Upsample
    x = lw.value(a[0])
    lw.steps.append(
        kind(x=x, y=o, align_corners=align, scales=tuple(0.0 if sc is None else float(sc) for sc in scales))
    )
    return o


def _check_grid_3d(info: Any) -> str | None:
    if len(info.inputs[0].shape) != 5 or info.args[2] not in (0, 1):
        return "5-d trilinear or nearest grid sampling only"
    return None


@register_lowering("aten.grid_sampler_2d.default", check=more_check(extra=_FOUR_D))
@register_lowering("aten.grid_sampler_3d.default", check=more_check(extra=_check_grid_3d))
def _grid_sampler(lw: Lowerer, node: Any) -> int:
    a = list(node.args)
    o = lw.fresh(node.out)
    kind = S.GridSampler if node.op == "aten.grid_sampler_2d.default" else S.GridSampler3d
    x, grid = lw.value(a[0]), lw.value(a[1])
    lw.steps.append(kind(x=x, grid=grid, y=o, align_corners=bool(a[4]), interpolation=int(a[2]), padding=int(a[3])))
    return o
