"""Elementwise ops: instructions of a fused register program (one ``ew`` step per group).

``register_pointwise`` is ``register_lowering`` for these: the decorated emitter only writes the
op's instructions into the open group; choosing the compute type, widening narrow integers,
opening the group and folding a GEMM epilogue are done once, here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from tb_cpu_rust.lowering.dtypes import BOOL, DT_NAME, F32, I64, NARROW_INTS, WIDE_DTYPES, core_dtype_reason
from tb_cpu_rust.lowering.lowerer import Group, Lazy, Lowerer
from tb_cpu_rust.lowering.registry import LoweringError, register_lowering
from torchburn.plan import Ref, TensorMeta

# elementwise unary: op -> instruction name
UNARY: dict[str, str] = {
    "aten.abs.default": "abs", "aten.neg.default": "neg", "aten.exp.default": "exp", "aten.exp2.default": "exp2",
    "aten.log.default": "log", "aten.log2.default": "log2", "aten.log1p.default": "log1p", "aten.expm1.default": "expm1",
    "aten.sqrt.default": "sqrt", "aten.rsqrt.default": "rsqrt", "aten.sin.default": "sin", "aten.cos.default": "cos",
    "aten.tan.default": "tan", "aten.atan.default": "atan", "aten.asin.default": "asin", "aten.acos.default": "acos",
    "aten.sinh.default": "sinh", "aten.cosh.default": "cosh", "aten.tanh.default": "tanh",
    "aten.sigmoid.default": "sigmoid", "aten.relu.default": "relu", "aten.silu.default": "silu", "aten.erf.default": "erf",
    "aten.floor.default": "floor", "aten.ceil.default": "ceil", "aten.round.default": "round", "aten.trunc.default": "trunc",
    "aten.frac.default": "frac", "aten.sign.default": "sign", "aten.reciprocal.default": "reciprocal",
    "aten.logical_not.default": "logical_not", "aten.isnan.default": "isnan", "aten.clone.default": "copy",
    "aten._to_copy.default": "copy", "aten.lift_fresh_copy.default": "copy",
    "aten.lgamma.default": "lgamma", "aten.digamma.default": "digamma", "aten.erfc.default": "erfc",
    "aten.erfinv.default": "erfinv", "aten.log10.default": "log10", "aten.asinh.default": "asinh",
    "aten.acosh.default": "acosh", "aten.atanh.default": "atanh", "aten.isinf.default": "isinf",
    "aten.signbit.default": "signbit", "aten.special_erfcx.default": "erfcx",
    "aten.special_spherical_bessel_j0.default": "spherical_j0", "aten.i0.default": "i0", "aten.special_i0e.default": "i0e",
    "aten.special_i1.default": "i1", "aten.special_i1e.default": "i1e", "aten.special_ndtri.default": "ndtri",
    "aten.special_modified_bessel_i0.default": "i0", "aten.special_modified_bessel_i1.default": "i1",
    "aten.special_bessel_j0.default": "bessel_j0", "aten.special_bessel_j1.default": "bessel_j1",
    "aten.special_bessel_y0.default": "bessel_y0", "aten.special_bessel_y1.default": "bessel_y1",
}  # fmt: skip
#: binary ops with a Tensor and a Scalar overload: ATen name -> instruction name
_TENSOR_AND_SCALAR = {
    "add": "add", "sub": "sub", "mul": "mul", "div": "div", "eq": "eq", "ne": "ne", "lt": "lt", "le": "le", "gt": "gt",
    "ge": "ge", "bitwise_and": "and", "bitwise_or": "or", "bitwise_xor": "xor", "fmod": "fmod",
    "remainder": "remainder", "pow": "pow", "copysign": "copysign", "rsub": "rsub",
}  # fmt: skip
#: orthogonal polynomials (x and n, each a tensor or a scalar): ATen name -> instruction name
_POLYNOMIALS = {
    **{f"special_{s}chebyshev_polynomial_{k}": f"poly_{s}chebyshev_{k}" for s in ("", "shifted_") for k in "tuvw"},
    "special_hermite_polynomial_h": "poly_hermite_h", "special_hermite_polynomial_he": "poly_hermite_he",
    "special_laguerre_polynomial_l": "poly_laguerre_l", "special_legendre_polynomial_p": "poly_legendre_p",
}  # fmt: skip
# elementwise binary: op -> instruction name
BINARY: dict[str, str] = {
    **{f"aten.{name}.{ov}": ins for name, ins in _TENSOR_AND_SCALAR.items() for ov in ("Tensor", "Scalar")},
    **{f"aten.{name}.{ov}": ins for name, ins in _POLYNOMIALS.items() for ov in ("default", "x_scalar", "n_scalar")},
    "aten.logical_and.default": "and", "aten.logical_or.default": "or", "aten.logical_xor.default": "xor",
    "aten.maximum.default": "maximum", "aten.minimum.default": "minimum", "aten.atan2.default": "atan2",
    "aten.pow.Tensor_Tensor": "pow", "aten.pow.Tensor_Scalar": "pow_scalar",
    "aten.threshold_backward.default": "threshold_backward",
    "aten.div.Tensor_mode": "div_mode", "aten.div.Scalar_mode": "div_mode", "aten.floor_divide.default": "floor_divide",
    "aten.nextafter.default": "nextafter", "aten.hypot.default": "hypot", "aten.fmax.default": "fmax",
    "aten.fmin.default": "fmin", "aten.special_zeta.default": "zeta", "aten.special_zeta.self_scalar": "zeta",
    "aten.special_zeta.other_scalar": "zeta", "aten.ldexp.Tensor": "ldexp", "aten.igamma.default": "igamma",
    "aten.igammac.default": "igammac",
}  # fmt: skip
#: ops that only write a value (their integer form needs no integer arithmetic)
FILLS = frozenset({
    "aten.full.default", "aten.scalar_tensor.default", "aten.full_like.default", "aten.fill.Scalar",
    "aten.zeros_like.default", "aten.ones_like.default", "aten.masked_fill.Scalar", "aten.masked_fill.Tensor",
    "aten.empty.memory_format", "aten.empty_permuted.default", "aten.empty_strided.default",
})  # fmt: skip
COMPARE = frozenset(
    {"eq", "ne", "lt", "le", "gt", "ge", "and", "or", "xor", "logical_not", "isnan", "isinf", "signbit"}
)
INT_OK = frozenset({
    "copy", "neg", "abs", "add", "sub", "mul", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge", "and",
    "or", "xor", "logical_not", "sign", "rsub", "clamp", "relu", "remainder", "floor_divide", "where", "const", "fmod",
    "bitwise_not",
})  # fmt: skip
#: copies and fills that also convert to or from the storage-only dtypes (wide.py lowers those)
WIDE_COPIES = frozenset(
    {"aten._to_copy.default", "aten.clone.default", "aten.lift_fresh_copy.default", "aten.copy.default"}
)
WIDE_FILLS = frozenset(FILLS - {"aten.masked_fill.Scalar", "aten.masked_fill.Tensor"})


def instruction(op: str) -> str:
    """The instruction name of an elementwise op (its ATen name when it has no table entry)."""
    return UNARY.get(op) or BINARY.get(op) or op.split(".")[1]


def check_ew(info: Any) -> str | None:
    op, kwargs = info.op, info.kwargs
    name = instruction(op)
    wide = op in WIDE_COPIES or op in WIDE_FILLS
    # comparisons of narrow integers: the lowering widens them to int64 first (exact)
    narrow = name in COMPARE and all(m.dtype == BOOL for m in info.out_metas)
    reason = core_dtype_reason(info, wide=wide, narrow_compare=narrow)
    if reason is not None:
        return reason
    layout_ok = kwargs.get("layout", torch.strided) in (None, torch.strided)
    if wide and any(m.dtype in WIDE_DTYPES for m in [*info.inputs, *info.out_metas]):
        return None if op != "aten._to_copy.default" or layout_ok else "layout"
    out = info.out_metas[0] if info.out_metas else None
    dts = {m.dtype for m in info.inputs}
    if out is not None:
        compute_float = (F32 in dts) if name in COMPARE else out.dtype == F32 or (F32 in dts and name == "copy")
        if name == "where":
            compute_float = out.dtype == F32
        if not compute_float and name not in INT_OK and op not in FILLS:
            return f"{name} has no integer kernel"
    if op == "aten.div.Tensor_mode" and kwargs.get("rounding_mode") not in (None, "floor", "trunc"):
        return "rounding mode"
    if op == "aten._to_copy.default" and not layout_ok:
        return "layout"
    return None


@dataclass
class Pointwise:
    """What an emitter sees: the open group, the node's arguments and the chosen compute type."""

    lw: Lowerer
    op: str
    g: Group
    args: list[Any]
    kw: dict[str, Any]
    meta: TensorMeta
    name: str
    compute: str

    def x(self, arg: Any) -> int:
        """A register holding ``arg`` (a tensor argument or a Python scalar)."""
        return self.lw.operand(self.g, arg)

    def emit(self, op: str, a: list[int], f: list[float] | None = None) -> int:
        return self.g.emit(op, a, f)

    def c(self, value: float) -> int:
        return self.g.const(value)

    def arg(self, i: int, name: str, default: Any) -> Any:
        return self.args[i] if len(self.args) > i else self.kw.get(name, default)


Emitter = Callable[[Pointwise], int]


def register_pointwise(*ops: str) -> Callable[[Emitter], Emitter]:
    def deco(emit: Emitter) -> Emitter:
        def lower(lw: Lowerer, node: Any) -> Any:
            return lower_pointwise(lw, node, emit)

        lower.__module__ = emit.__module__
        register_lowering(*ops, check=check_ew)(lower)
        return emit

    return deco


def lower_pointwise(lw: Lowerer, node: Any, emit: Emitter) -> Any:
    from tb_cpu_rust.lowering.gemm import fuse_epilogue

    op, args, kw = node.op, list(node.args), dict(node.kwargs)
    fused = fuse_epilogue(lw, node)
    if fused is not None:
        return fused
    meta = node.out if isinstance(node.out, TensorMeta) else None
    if meta is None:
        raise LoweringError("elementwise op without a tensor result")
    name = instruction(op)
    for a in args:
        if isinstance(a, Ref) and a.slot not in lw.widened and lw.dtype_of_arg(a) in NARROW_INTS:
            if name not in COMPARE:
                raise LoweringError(f"{name} of a narrow integer")
            v = lw.value(a)
            lw.used[a.slot] -= 1  # counted again when the program reads the copy
            wide = lw.temp(list(lw.values[v]["sizes"]), I64)
            lw.copy_into(v, wide)
            lw.widened[a.slot] = wide
    refs = [a for a in args if isinstance(a, Ref)]
    in_dtypes = [I64 if a.slot in lw.widened else lw.dtype_of_arg(a) for a in refs]
    if name in COMPARE:
        compute = "f32" if F32 in in_dtypes or any(isinstance(a, float) for a in args) else "i64"
    elif name == "copy" and F32 in in_dtypes:
        compute = "f32"  # float -> int64/bool conversion happens in the store
    else:
        compute = "f32" if meta.dtype == F32 else "i64"
    if compute == "i64" and name not in INT_OK and op not in FILLS and op != "aten.where.self":
        raise LoweringError(f"{name} has no integer kernel")
    g = lw.open_group(tuple(meta.shape), compute, args)
    r = emit(Pointwise(lw, op, g, args, kw, meta, name, compute))
    lz = Lazy(g, r, meta)
    g.members[lw.node_slot] = lz
    return lz


# -- table ops: one instruction each ------------------------------------------------------------------
@register_pointwise(*(set(UNARY) - {"aten.round.default"}))
def _unary(p: Pointwise) -> int:
    if p.op == "aten._to_copy.default" and p.meta.dtype not in DT_NAME:
        raise LoweringError("_to_copy dtype")
    return p.emit(p.name, [p.x(p.args[0])])


@register_pointwise("aten.round.default")
def _round(p: Pointwise) -> int:
    if p.kw.get("decimals"):
        raise LoweringError("round with decimals")
    return p.emit("round", [p.x(p.args[0])])


_SPECIAL_BINARY = {"add", "sub", "rsub", "div_mode", "pow_scalar", "threshold_backward", "ldexp", "fmod"}


@register_pointwise(*(op for op, name in BINARY.items() if name not in _SPECIAL_BINARY))
def _binary(p: Pointwise) -> int:
    return p.emit(p.name, [p.x(p.args[0]), p.x(p.args[1])])


@register_pointwise(*(op for op, name in BINARY.items() if name in ("add", "sub", "rsub")))
def _add_sub(p: Pointwise) -> int:
    alpha = float(p.kw.get("alpha", p.args[2] if len(p.args) > 2 else 1))
    if p.name == "rsub":
        return p.emit("sub", [p.x(p.args[1]), p.x(p.args[0])], [alpha])
    return p.emit(p.name, [p.x(p.args[0]), p.x(p.args[1])], [alpha])


@register_pointwise("aten.div.Tensor_mode", "aten.div.Scalar_mode")
def _div_mode(p: Pointwise) -> int:
    mode = p.kw.get("rounding_mode")
    q = p.emit("div", [p.x(p.args[0]), p.x(p.args[1])])
    return q if mode is None else p.emit("floor" if mode == "floor" else "trunc", [q])


@register_pointwise("aten.pow.Tensor_Scalar")
def _pow_scalar(p: Pointwise) -> int:
    e = p.args[1]
    if isinstance(e, Ref):
        raise LoweringError("pow exponent")
    return p.emit("pow_scalar", [p.x(p.args[0])], [float(e)])


@register_pointwise("aten.threshold_backward.default")
def _threshold_backward(p: Pointwise) -> int:
    return p.emit("threshold_backward", [p.x(p.args[0]), p.x(p.args[1])], [float(p.args[2])])


@register_pointwise("aten.ldexp.Tensor")
def _ldexp(p: Pointwise) -> int:
    return p.emit("mul", [p.x(p.args[0]), p.emit("exp2", [p.x(p.args[1])])])


@register_pointwise("aten.fmod.Tensor", "aten.fmod.Scalar")
def _fmod(p: Pointwise) -> int:
    a, b = p.x(p.args[0]), p.x(p.args[1])
    if p.compute != "i64":
        return p.emit("fmod", [a, b])
    # C fmod on integers: the remainder takes the dividend's sign
    rem = p.emit("remainder", [a, b])
    zero = p.c(0.0)
    differ = p.emit("xor", [p.emit("lt", [a, zero]), p.emit("lt", [b, zero])])
    fix = p.emit("and", [p.emit("ne", [rem, zero]), differ])
    return p.emit("where", [fix, p.emit("sub", [rem, b], [1.0]), rem])


# -- fills and copies ----------------------------------------------------------------------------------
@register_pointwise("aten.full.default", "aten.full_like.default", "aten.fill.Scalar")
def _full(p: Pointwise) -> int:
    return p.x(p.args[1])


@register_pointwise("aten.scalar_tensor.default")
def _scalar_tensor(p: Pointwise) -> int:
    return p.x(p.args[0])


@register_pointwise(
    "aten.zeros_like.default", "aten.empty.memory_format", "aten.empty_permuted.default", "aten.empty_strided.default"
)
def _zeros(p: Pointwise) -> int:
    return p.x(0)  # empty memory is zero-filled: never leak stale values


@register_pointwise("aten.ones_like.default")
def _ones(p: Pointwise) -> int:
    return p.x(1)


@register_pointwise("aten.copy.default")
def _copy(p: Pointwise) -> int:
    return p.x(p.args[1])  # copy(self, src): src broadcast to self's shape, in self's dtype


@register_pointwise("aten.where.self")
def _where(p: Pointwise) -> int:
    return p.emit("where", [p.x(p.args[0]), p.x(p.args[1]), p.x(p.args[2])])


@register_pointwise("aten.masked_fill.Scalar", "aten.masked_fill.Tensor")
def _masked_fill(p: Pointwise) -> int:
    return p.emit("where", [p.x(p.args[1]), p.x(p.args[2]), p.x(p.args[0])])


@register_pointwise("aten.bitwise_not.default")
def _bitwise_not(p: Pointwise) -> int:
    x = p.x(p.args[0])
    if p.meta.dtype == BOOL:
        return p.emit("logical_not", [x])
    return p.emit("sub", [p.emit("neg", [x]), p.c(1.0)], [1.0])  # two's complement: ~x == -x - 1


# -- clamps and activations ----------------------------------------------------------------------------
@register_pointwise("aten.clamp.Tensor", "aten.clamp_min.Tensor", "aten.clamp_max.Tensor")
def _clamp_tensor(p: Pointwise) -> int:
    lo, hi = _bounds(p)
    r = p.x(p.args[0])
    if lo is not None:
        r = p.emit("maximum", [r, p.x(lo)])
    if hi is not None:
        r = p.emit("minimum", [r, p.x(hi)])
    return r


def _bounds(p: Pointwise) -> tuple[Any, Any]:
    if p.op.startswith("aten.clamp_min."):
        return p.args[1], None
    if p.op.startswith("aten.clamp_max."):
        return None, p.args[1]
    if p.op == "aten.hardtanh.default":
        return (p.args[1] if len(p.args) > 1 else -1.0), (p.args[2] if len(p.args) > 2 else 1.0)
    return p.arg(1, "min", None), p.arg(2, "max", None)


@register_pointwise("aten.clamp.default", "aten.hardtanh.default", "aten.clamp_min.default", "aten.clamp_max.default")
def _clamp(p: Pointwise) -> int:
    lo, hi = _bounds(p)
    if isinstance(lo, Ref) or isinstance(hi, Ref):
        raise LoweringError("clamp with tensor bounds")
    x = p.x(p.args[0])
    if p.compute == "i64" and (isinstance(lo, float) or isinstance(hi, float)):
        raise LoweringError("float clamp bounds on integers")
    return p.emit("clamp", [x], [-math.inf if lo is None else float(lo), math.inf if hi is None else float(hi)])


@register_pointwise("aten.gelu.default")
def _gelu(p: Pointwise) -> int:
    approx = p.kw.get("approximate", p.args[1] if len(p.args) > 1 else "none")
    return p.emit("gelu_tanh" if approx == "tanh" else "gelu", [p.x(p.args[0])])


@register_pointwise("aten.leaky_relu.default")
def _leaky_relu(p: Pointwise) -> int:
    return p.emit("leaky_relu", [p.x(p.args[0])], [float(p.args[1]) if len(p.args) > 1 else 0.01])


@register_pointwise("aten.elu.default")
def _elu(p: Pointwise) -> int:
    params = [float(a) for a in p.args[1:4]] + [1.0] * (3 - len(p.args[1:4]))
    return p.emit("elu", [p.x(p.args[0])], params)


@register_pointwise("aten.softplus.default")
def _softplus(p: Pointwise) -> int:
    beta = float(p.args[1]) if len(p.args) > 1 else 1.0
    threshold = float(p.args[2]) if len(p.args) > 2 else 20.0
    return p.emit("softplus", [p.x(p.args[0])], [beta, threshold])


@register_pointwise("aten.hardsigmoid.default", "aten.hardswish.default")
def _hard(p: Pointwise) -> int:
    x = p.x(p.args[0])
    t = p.emit("clamp", [p.emit("add", [x, p.c(3.0)], [1.0])], [0.0, 6.0])
    if p.name == "hardswish":
        t = p.emit("mul", [x, t])
    return p.emit("div", [t, p.c(6.0)])


@register_pointwise("aten.round.decimals")
def _round_decimals(p: Pointwise) -> int:
    d = int(p.kw.get("decimals", p.args[1] if len(p.args) > 1 else 0))
    scale = p.c(float(10 ** abs(d)))
    x = p.x(p.args[0])
    if d >= 0:
        return p.emit("div", [p.emit("round", [p.emit("mul", [x, scale])]), scale])
    return p.emit("mul", [p.emit("round", [p.emit("div", [x, scale])]), scale])


@register_pointwise("aten.polygamma.default")
def _polygamma(p: Pointwise) -> int:
    n, x = int(p.args[0]), p.x(p.args[1])
    if n == 0:
        return p.emit("digamma", [x])
    # ψ⁽ⁿ⁾(x) = (-1)^(n+1) n! ζ(n+1, x)
    z = p.emit("zeta", [p.c(float(n + 1)), x])
    return p.emit("mul", [z, p.c(float((-1) ** (n + 1) * math.factorial(n)))])


# -- backward of activations ----------------------------------------------------------------------------
@register_pointwise("aten.sigmoid_backward.default")
def _sigmoid_backward(p: Pointwise) -> int:
    gr, y = p.x(p.args[0]), p.x(p.args[1])
    one = p.c(1.0)
    return p.emit("mul", [gr, p.emit("mul", [y, p.emit("sub", [one, y], [1.0])])])


@register_pointwise("aten.tanh_backward.default")
def _tanh_backward(p: Pointwise) -> int:
    gr, y = p.x(p.args[0]), p.x(p.args[1])
    one = p.c(1.0)
    return p.emit("mul", [gr, p.emit("sub", [one, p.emit("mul", [y, y])], [1.0])])


@register_pointwise("aten.silu_backward.default")
def _silu_backward(p: Pointwise) -> int:
    gr, x = p.x(p.args[0]), p.x(p.args[1])
    sg = p.emit("sigmoid", [x])
    one = p.c(1.0)
    inner = p.emit("add", [one, p.emit("mul", [x, p.emit("sub", [one, sg], [1.0])])], [1.0])
    return p.emit("mul", [gr, p.emit("mul", [sg, inner])])


@register_pointwise("aten.gelu_backward.default")
def _gelu_backward(p: Pointwise) -> int:
    gr, x = p.x(p.args[0]), p.x(p.args[1])
    approx = p.kw.get("approximate", p.args[2] if len(p.args) > 2 else "none")
    c = p.c
    half = c(0.5)
    if approx == "tanh":
        beta, kappa = math.sqrt(2.0) * (2.0 / math.sqrt(math.pi)) * 0.5, 0.044715
        x2 = p.emit("mul", [x, x])
        inner = p.emit("mul", [c(beta), p.emit("add", [x, p.emit("mul", [c(kappa), p.emit("mul", [x2, x])])], [1.0])])
        th = p.emit("tanh", [inner])
        left_d = p.emit("mul", [half, p.emit("add", [c(1.0), th], [1.0])])
        sech2 = p.emit("sub", [c(1.0), p.emit("mul", [th, th])], [1.0])
        poly = p.emit("mul", [c(beta), p.emit("add", [c(1.0), p.emit("mul", [c(3 * kappa), x2])], [1.0])])
        right_d = p.emit("mul", [p.emit("mul", [half, x]), p.emit("mul", [sech2, poly])])
        return p.emit("mul", [gr, p.emit("add", [left_d, right_d], [1.0])])
    cdf = p.emit("mul", [half, p.emit("add", [c(1.0), p.emit("erf", [p.emit("mul", [x, c(math.sqrt(0.5))])])], [1.0])])
    pdf = p.emit(
        "mul", [c(1.0 / math.sqrt(2.0 * math.pi)), p.emit("exp", [p.emit("mul", [c(-0.5), p.emit("mul", [x, x])])])]
    )
    return p.emit("mul", [gr, p.emit("add", [cdf, p.emit("mul", [x, pdf])], [1.0])])
