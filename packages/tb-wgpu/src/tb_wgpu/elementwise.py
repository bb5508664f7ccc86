"""Elementwise ops: WGSL expression templates keyed by ATen overload.

Each entry turns its arguments into a ``Lazy`` expression; nothing is launched here. The
lowering fuses a chain of them into one generated kernel (see ``lower.Lowerer.materialize``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tb_wgpu.lower import DEV_TYPE, I64, Const, Lazy, Lowerer, LoweringError, Op, cast, const

# op -> WGSL template over the f32 operands {0}, {1}...
UNARY_F32: dict[str, str] = {
    "aten.abs.default": "abs({0})",
    "aten.neg.default": "-{0}",
    "aten.exp.default": "tb_exp({0})",
    "aten.tanh.default": "tb_tanh({0})",
    "aten.sigmoid.default": "tb_sigmoid({0})",
    "aten.relu.default": "tb_relu({0})",
    "aten.silu.default": "tb_silu({0})",
    "aten.sin.default": "sin({0})",
    "aten.cos.default": "cos({0})",
    "aten.erf.default": "tb_erf({0})",
    "aten.floor.default": "floor({0})",
    "aten.ceil.default": "ceil({0})",
    "aten.round.default": "round({0})",
    "aten.trunc.default": "trunc({0})",
    "aten.sign.default": "tb_sign({0})",
    "aten.reciprocal.default": "1.0 / {0}",
    "aten.log.default": "log({0})",
    "aten.sqrt.default": "sqrt({0})",
    "aten.rsqrt.default": "tb_rsqrt({0})",
    "aten.log1p.default": "tb_log1p({0})",
    "aten.expm1.default": "tb_expm1({0})",
}

BINARY_F32: dict[str, str] = {
    "aten.mul.Tensor": "{0} * {1}",
    "aten.div.Tensor": "{0} / {1}",
    "aten.maximum.default": "tb_max({0}, {1})",
    "aten.minimum.default": "tb_min({0}, {1})",
    "aten.pow.Tensor_Tensor": "tb_pow({0}, {1})",
    "aten.pow.Tensor_Scalar": "tb_pow({0}, {1})",
    "aten.mul.Scalar": "{0} * {1}",
    "aten.div.Scalar": "{0} / {1}",
}

COMPARE: dict[str, str] = {
    "gt": ">",
    "lt": "<",
    "ge": ">=",
    "le": "<=",
    "eq": "==",
    "ne": "!=",
}

Lower = Callable[..., Any]
TABLE: dict[str, Lower] = {}


def _lazy(L: Lowerer, ctx: Any, fmt: str, *args: Any, arg_ty: str = "f32") -> Lazy:
    out = ctx.out
    ty = DEV_TYPE[out.dtype]
    exprs = tuple(L.as_expr(a, arg_ty) for a in args)
    return Lazy(Op(ty, fmt, exprs), tuple(out.shape), out.dtype, ctx.uses)


def _unary(fmt: str) -> Lower:
    return lambda L, ctx, x: _lazy(L, ctx, fmt, x)


def _binary(fmt: str) -> Lower:
    return lambda L, ctx, a, b: _lazy(L, ctx, fmt, a, b)


# The ops that also compute on int64 (support.INT64_OPS), with their tb_i64 templates (the
# helpers of shaders/int64_*.wgsl; arithmetic wraps modulo 2^64 like torch's).
UNARY_I64: dict[str, str] = {"aten.neg.default": "tb_i64_neg({0})", "aten.abs.default": "tb_i64_abs({0})"}
BINARY_I64: dict[str, str] = {
    "aten.mul.Tensor": "tb_i64_mul({0}, {1})",
    "aten.mul.Scalar": "tb_i64_mul({0}, {1})",
    "aten.maximum.default": "tb_i64_max({0}, {1})",
    "aten.minimum.default": "tb_i64_min({0}, {1})",
}


def _is_i64(ctx: Any) -> bool:
    return bool(ctx.out.dtype == torch.int64)


def _by_dtype(fmt: str, i64_fmt: str | None) -> Lower:
    def lower(L: Lowerer, ctx: Any, *args: Any) -> Lazy:
        if i64_fmt is not None and _is_i64(ctx):
            return _lazy(L, ctx, i64_fmt, *args, arg_ty=I64)
        return _lazy(L, ctx, fmt, *args)

    return lower


for _op, _fmt in UNARY_F32.items():
    TABLE[_op] = _by_dtype(_fmt, UNARY_I64.get(_op))
for _op, _fmt in BINARY_F32.items():
    TABLE[_op] = _by_dtype(_fmt, BINARY_I64.get(_op))


def _add(L: Lowerer, ctx: Any, a: Any, b: Any, alpha: Any = 1, sign: str = "+") -> Lazy:
    if _is_i64(ctx):
        fn = "tb_i64_add" if sign == "+" else "tb_i64_sub"
        if alpha == 1:
            return _lazy(L, ctx, fn + "({0}, {1})", a, b, arg_ty=I64)
        return _lazy(L, ctx, fn + "({0}, tb_i64_mul({1}, {2}))", a, b, int(alpha), arg_ty=I64)
    if alpha == 1:
        return _lazy(L, ctx, "{0} " + sign + " {1}", a, b)
    return _lazy(L, ctx, "{0} " + sign + " {1} * {2}", a, b, float(alpha))


TABLE["aten.add.Tensor"] = lambda L, ctx, a, b, alpha=1: _add(L, ctx, a, b, alpha)
TABLE["aten.add.Scalar"] = lambda L, ctx, a, b, alpha=1: _add(L, ctx, a, b, alpha)
TABLE["aten.sub.Tensor"] = lambda L, ctx, a, b, alpha=1: _add(L, ctx, a, b, alpha, "-")
TABLE["aten.sub.Scalar"] = lambda L, ctx, a, b, alpha=1: _add(L, ctx, a, b, alpha, "-")


def _rsub(L: Lowerer, ctx: Any, a: Any, b: Any, alpha: Any = 1) -> Lazy:
    if alpha == 1:
        return _add(L, ctx, b, a, alpha, "-")
    if _is_i64(ctx):
        return _lazy(L, ctx, "tb_i64_sub({1}, tb_i64_mul({0}, {2}))", a, b, int(alpha), arg_ty=I64)
    return _lazy(L, ctx, "{1} - {0} * {2}", a, b, float(alpha))


TABLE["aten.rsub.Scalar"] = _rsub


def _div_mode(L: Lowerer, ctx: Any, a: Any, b: Any, rounding_mode: str | None = None) -> Lazy:
    if rounding_mode is None:
        return _lazy(L, ctx, "{0} / {1}", a, b)
    return _lazy(L, ctx, f"{rounding_mode}({{0}} / {{1}})", a, b)


TABLE["aten.div.Tensor_mode"] = _div_mode


def _gelu(L: Lowerer, ctx: Any, x: Any, approximate: str = "none") -> Lazy:
    return _lazy(L, ctx, "tb_gelu_tanh({0})" if approximate == "tanh" else "tb_gelu({0})", x)


TABLE["aten.gelu.default"] = _gelu


def _clamp(L: Lowerer, ctx: Any, x: Any, min: Any = None, max: Any = None) -> Lazy:
    lo = float("-inf") if min is None else float(min)
    hi = float("inf") if max is None else float(max)
    return _lazy(L, ctx, "tb_clamp({0}, {1}, {2})", x, lo, hi)


TABLE["aten.clamp.default"] = _clamp
TABLE["aten.hardtanh.default"] = lambda L, ctx, x, min_val=-1.0, max_val=1.0: _clamp(L, ctx, x, min_val, max_val)
TABLE["aten.leaky_relu.default"] = lambda L, ctx, x, negative_slope=0.01: _lazy(
    L, ctx, "select({0}, {0} * {1}, {0} < 0.0)", x, float(negative_slope)
)
TABLE["aten.elu.default"] = lambda L, ctx, x, alpha=1.0, scale=1.0, input_scale=1.0: _lazy(
    L, ctx, "tb_elu({0}, {1}, {2}, {3})", x, float(alpha), float(scale), float(input_scale)
)


def _compare(name: str, sym: str) -> Lower:
    def lower(L: Lowerer, ctx: Any, a: Any, b: Any) -> Lazy:
        ty = _operand_type(ctx, (a, b))
        fmt = f"tb_b(tb_i64_{name}({{0}}, {{1}}))" if ty == I64 else "tb_b({0} " + sym + " {1})"
        return _lazy(L, ctx, fmt, a, b, arg_ty=ty)

    return lower


def _operand_type(ctx: Any, args: tuple[Any, ...]) -> str:
    """The type a comparison computes in, by torch's promotion: float if a tensor or a Python
    scalar is floating point, else int64 if a tensor is, else int32."""
    if any(m.dtype.is_floating_point for m in ctx.info_inputs) or any(isinstance(a, float) for a in args):
        return "f32"
    return I64 if any(m.dtype == torch.int64 for m in ctx.info_inputs) else "i32"


for _name, _sym in COMPARE.items():
    TABLE[f"aten.{_name}.Tensor"] = _compare(_name, _sym)
    TABLE[f"aten.{_name}.Scalar"] = _compare(_name, _sym)


def _where(L: Lowerer, ctx: Any, cond: Any, a: Any, b: Any) -> Lazy:
    ty = DEV_TYPE[ctx.out.dtype]
    c = L.as_expr(cond, "u32")
    return Lazy(
        Op(ty, "select({2}, {1}, {0} != 0u)", (c, L.as_expr(a, ty), L.as_expr(b, ty))),
        tuple(ctx.out.shape),
        ctx.out.dtype,
        ctx.uses,
    )


TABLE["aten.where.self"] = _where
TABLE["aten.logical_not.default"] = lambda L, ctx, x: _lazy(L, ctx, "tb_b({0} == 0u)", x, arg_ty="u32")
TABLE["aten.bitwise_not.default"] = lambda L, ctx, x: _lazy(L, ctx, "tb_b({0} == 0u)", x, arg_ty="u32")
TABLE["aten.logical_and.default"] = lambda L, ctx, a, b: _lazy(L, ctx, "{0} & {1}", a, b, arg_ty="u32")
TABLE["aten.logical_or.default"] = lambda L, ctx, a, b: _lazy(L, ctx, "{0} | {1}", a, b, arg_ty="u32")
TABLE["aten.bitwise_and.Tensor"] = TABLE["aten.logical_and.default"]
TABLE["aten.bitwise_or.Tensor"] = TABLE["aten.logical_or.default"]


def _copy_like(L: Lowerer, ctx: Any, x: Any, **kwargs: Any) -> Lazy:
    """clone / _to_copy: a cast to the output dtype (layout is the lowering's business)."""
    ty = DEV_TYPE[ctx.out.dtype]
    e = L.as_expr(x)
    e = cast(e, ty) if e.ty != ty else Op(ty, "{0}", (e,))
    return Lazy(e, tuple(ctx.out.shape), ctx.out.dtype, ctx.uses)


TABLE["aten.clone.default"] = _copy_like
TABLE["aten._to_copy.default"] = _copy_like


def _full(L: Lowerer, ctx: Any, size: Any, value: Any, **kwargs: Any) -> Lazy:
    ty = DEV_TYPE[ctx.out.dtype]
    return Lazy(Op(ty, "{0}", (const(value, ty),)), tuple(ctx.out.shape), ctx.out.dtype, ctx.uses)


TABLE["aten.full.default"] = _full
TABLE["aten.scalar_tensor.default"] = lambda L, ctx, value, **kw: _full(L, ctx, (), value)


def _batch_norm_eval(
    L: Lowerer, ctx: Any, x: Any, weight: Any, bias: Any, mean: Any, var: Any, momentum: float, eps: float
) -> tuple[Any, ...]:
    shape = tuple(ctx.info_inputs[0].shape)
    if len(shape) < 2:
        raise LoweringError("batch norm needs a channel dimension")

    def per_channel(v: Any) -> Any:
        tv = L.as_tv(v)
        view_shape = tuple(shape[1] if d == 1 else 1 for d in range(len(shape)))
        stride = tuple(tv.stride[0] if d == 1 else 0 for d in range(len(shape)))
        return tv.with_view(view_shape, stride)

    xe = L.as_expr(x, "f32")
    m = L.as_expr(per_channel(mean), "f32")
    v = L.as_expr(per_channel(var), "f32")
    scale: Any = Op("f32", "1.0 / sqrt({0} + {1})", (v, const(eps, "f32")))
    body: Any = Op("f32", "({0} - {1}) * {2}", (xe, m, scale))
    if weight is not None:
        body = Op("f32", "{0} * {1}", (body, L.as_expr(per_channel(weight), "f32")))
    if bias is not None:
        body = Op("f32", "{0} + {1}", (body, L.as_expr(per_channel(bias), "f32")))
    out = Lazy(body, shape, ctx.out[0].dtype, ctx.uses_of(0))
    empty = [L.new_tv(tuple(m.shape), m.dtype) for m in ctx.out[1:]]
    return (out, *empty)


TABLE["aten._native_batch_norm_legit_no_training.default"] = _batch_norm_eval

__all__ = ["TABLE", "Const"]
