"""Complex dtypes and FFTs: which nodes take them, and how they are lowered.

complex64 / complex128 / complex32 values live in executor buffers as interleaved (re, im) pairs.
Views of them are strided views like any other (resolved on meta tensors); copies and fills are the
``cast`` / ``fill`` steps (the executor converts); ``complex``, ``polar``, ``view_as_complex``,
``conj`` and ``angle`` are one complex kernel step each, and the FFTs one ``fft_*`` step.
Nothing else computes in complex: every other node that touches a complex value is refused.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from tb_cpu_rust.lowering import steps as S
from tb_cpu_rust.lowering.dtypes import CPLX_DTYPES, DTYPES, WIDE_DTYPES
from tb_cpu_rust.lowering.lowerer import Lowerer, meta
from tb_cpu_rust.lowering.registry import DtypeFamily, LoweringError, register_dtype_family, register_lowering
from tb_cpu_rust.lowering.views import VIEWS
from torchburn.plan import Ref, TensorMeta

_REAL = frozenset({torch.float32, torch.float64})
#: the FFTs compute in these (complex32 has no transform: ATen's CPU FFT refuses it too)
_FFT_COMPLEX = frozenset({torch.complex64, torch.complex128})

#: op -> the step kind of the complex kernels
KERNEL: dict[str, Any] = {
    "aten.complex.default": S.Complex, "aten.polar.default": S.Polar, "aten.view_as_complex.default": S.Complex,
    "aten._conj.default": S.Conj, "aten._conj_physical.default": S.Conj,
    "aten.conj_physical.default": S.Conj, "aten.angle.default": S.Angle, "aten.view_as_real.default": S.Imag,
    "aten._fft_r2c.default": S.FftR2c, "aten._fft_c2c.default": S.Fft, "aten._fft_c2r.default": S.FftC2r,
}  # fmt: skip
OPS = frozenset(KERNEL)
#: ops of the other families that also move complex values (a converting copy or a fill)
COPIES = frozenset({"aten._to_copy.default", "aten.clone.default", "aten.lift_fresh_copy.default", "aten.copy.default"})
FILLS = frozenset(
    {"aten.zeros_like.default", "aten.full.default", "aten.full_like.default", "aten.scalar_tensor.default"}
)
PAD = "aten.constant_pad_nd.default"


def _outs(info: Any) -> list[Any]:
    metas = info.out if isinstance(info.out, tuple) else (info.out,)
    return [m for m in metas if isinstance(m, TensorMeta)]


def claims(info: Any) -> bool:
    """True for the nodes this module decides on: its own ops and anything with a complex value."""
    return info.op in OPS or any(m.dtype in CPLX_DTYPES for m in [*info.inputs, *_outs(info)])


def check_complex(info: Any) -> str | None:
    op, ins, outs = info.op, info.inputs, _outs(info)
    if op in VIEWS:
        return None
    carried = DTYPES | WIDE_DTYPES | CPLX_DTYPES
    if any(m.dtype not in carried for m in [*ins, *outs]):
        return "dtype"
    if op in COPIES:
        return None if info.kwargs.get("layout", torch.strided) in (None, torch.strided) else "layout"
    if op in FILLS or op == PAD:
        value = _fill_value(op, info.args, info.kwargs)
        if isinstance(value, complex) or not isinstance(value, (bool, int, float)):
            return "complex or tensor fill value"
        if op == PAD and isinstance(value, float) and math.isnan(value):
            return "NaN padding value"
        return None
    if op not in OPS:
        return f"no complex kernel for {op}"
    k = KERNEL[op].OP
    x, y = ins[0], outs[0] if outs else None
    if y is None:
        return "no tensor result"
    if op in ("aten.complex.default", "aten.polar.default"):
        if ins[0].dtype not in _REAL or ins[1].dtype != ins[0].dtype:
            return "complex/polar of two float32 or two float64 tensors only"
    elif op == "aten.view_as_complex.default":
        if x.dtype not in _REAL or not x.shape or x.shape[-1] != 2:
            return "view_as_complex of a float32 or float64 (..., 2) tensor only"
    elif op == "aten.view_as_real.default":
        if x.dtype not in _FFT_COMPLEX:
            return "view_as_real of complex64 or complex128 only"
    elif k == "conj":
        if x.dtype not in CPLX_DTYPES:
            return "conj of a complex tensor only"
    elif k == "angle":
        if x.dtype not in _REAL | CPLX_DTYPES or y.dtype not in _REAL:
            return "angle of a float or complex tensor only"
    elif k == "fft_r2c":
        if x.dtype not in _REAL or y.dtype not in _FFT_COMPLEX:
            return "r2c of float32 or float64 only"
    elif k == "fft_c2c":
        if x.dtype not in _FFT_COMPLEX or y.dtype != x.dtype:
            return "c2c of complex64 or complex128 only"
    elif k == "fft_c2r" and (x.dtype not in _FFT_COMPLEX or y.dtype not in _REAL):
        return "c2r of complex64 or complex128 only"
    if k.startswith("fft") and not info.args[1]:
        return "transform over no dim"
    return None


def _fill_value(op: str, args: Any, kw: dict[str, Any]) -> Any:
    if op == PAD:
        return args[2] if len(args) > 2 else kw.get("value", 0)
    if op == "aten.zeros_like.default":
        return 0
    if op == "aten.scalar_tensor.default":
        return args[0]
    return args[1]


def touches(lw: Lowerer, node: Any) -> bool:
    """True when the lowering of ``node`` belongs here (own op, or a complex operand or result)."""
    if node.op in OPS:
        return True
    metas = node.out if isinstance(node.out, tuple) else (node.out,)
    if any(isinstance(m, TensorMeta) and m.dtype in CPLX_DTYPES for m in metas):
        return True
    return any(isinstance(a, Ref) and lw.dtype_of_arg(a) in CPLX_DTYPES for a in node.args)


@register_lowering(*OPS, check=check_complex)
def lower_complex(lw: Lowerer, node: Any) -> Any:
    """Lowers one node with complex values."""
    op, a, kw, out = node.op, list(node.args), dict(node.kwargs), node.out
    if op in COPIES:
        src = a[1] if op == "aten.copy.default" else a[0]
        o = lw.fresh(out)
        lw.steps.append(S.Cast(x=lw.broadcast(lw.value(src), tuple(out.shape)), y=o))
        return o
    if op in FILLS:
        o = lw.fresh(out)
        lw.fill_any(o, _fill_value(op, a, kw))
        return o
    if op == PAD:
        x = lw.value(a[0])
        o = lw.fresh(out)
        lw.fill_any(o, _fill_value(op, a, kw))
        windows = lw.pad_windows(x, o, list(a[1]))
        if windows is not None:
            lw.steps.append(S.Cast(x=lw.view_of(x, windows[0]), y=lw.view_of(o, windows[1])))
        return o
    if op not in OPS:
        raise LoweringError(f"no complex lowering for {op}")
    kind = KERNEL[op]
    shape = tuple(out.shape)
    # a fresh dense result (a view op's result strides may describe another tensor's memory)
    o = lw.fresh(meta(shape, out.dtype))
    if op == "aten.view_as_real.default":
        # a copy, not a view: the real parts by a converting cast, the imaginary ones by `imag`
        x = lw.value(a[0])
        t = lw.meta_tensor(o)
        lw.steps.append(S.Cast(x=x, y=lw.view_of(o, t.select(-1, 0))))
        lw.steps.append(S.Imag(x=x, out=lw.view_of(o, t.select(-1, 1))))
        return o
    if op == "aten.view_as_complex.default":
        x = lw.value(a[0])
        t = lw.meta_tensor(x)
        lw.steps.append(S.Complex(a=lw.view_of(x, t.select(-1, 0)), b=lw.view_of(x, t.select(-1, 1)), out=o))
    elif kind in (S.Complex, S.Polar):
        re, im = lw.broadcast(lw.value(a[0]), shape), lw.broadcast(lw.value(a[1]), shape)
        lw.steps.append(kind(a=re, b=im, out=o))
    elif kind in (S.Conj, S.Angle):
        lw.steps.append(kind(x=lw.value(a[0]), out=o))
    else:
        x = lw.value(a[0])
        lw.steps.append(kind(x=x, out=o, norm=int(a[2]), flag=int(a[3]), dims=tuple(int(d) for d in a[1])))
    return o


register_dtype_family(DtypeFamily("complex", claims, check_complex, touches, lower_complex))
