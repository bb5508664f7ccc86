"""What native_cpu accepts: the op table (data) and the per-node checker.

Each entry says how an ATen overload is lowered: ``ew`` ops become instructions of a fused
elementwise program, ``view`` ops become strided views (no step at all), ``kernel`` ops a Rust
kernel step. Nothing here calls back into PyTorch at run time.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from tb_cpu_rust import complex_ops as _cplx
from tb_cpu_rust import wide_ops as _wide
from tb_cpu_rust.decomp import DECOMP, check_decomp

F32, I64, BOOL = torch.float32, torch.int64, torch.bool
DTYPES = frozenset({F32, I64, BOOL})
#: storage-only dtypes: only the ops of WIDE_OPS read or write them (no arithmetic in them)
WIDE_DTYPES = frozenset({torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int16, torch.int8, torch.uint8})
NARROW_INTS = frozenset({torch.int32, torch.int16, torch.int8, torch.uint8})

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
}
# elementwise binary (Tensor and Scalar overloads): op -> instruction name
BINARY: dict[str, str] = {}
for _name, _ins in {
    "add": "add", "sub": "sub", "mul": "mul", "div": "div", "eq": "eq", "ne": "ne", "lt": "lt", "le": "le", "gt": "gt",
    "ge": "ge", "bitwise_and": "and", "bitwise_or": "or", "bitwise_xor": "xor", "logical_and": "and",
    "logical_or": "or", "logical_xor": "xor", "fmod": "fmod", "remainder": "remainder", "pow": "pow",
}.items():
    BINARY[f"aten.{_name}.Tensor"] = _ins
    BINARY[f"aten.{_name}.Scalar"] = _ins
BINARY.update({
    "aten.maximum.default": "maximum", "aten.minimum.default": "minimum", "aten.atan2.default": "atan2",
    "aten.pow.Tensor_Tensor": "pow", "aten.pow.Tensor_Scalar": "pow_scalar", "aten.pow.Scalar": "pow",
    "aten.threshold_backward.default": "threshold_backward", "aten.rsub.Scalar": "rsub", "aten.rsub.Tensor": "rsub",
    "aten.div.Tensor_mode": "div_mode", "aten.floor_divide.default": "floor_divide",
    "aten.copysign.Tensor": "copysign", "aten.copysign.Scalar": "copysign", "aten.nextafter.default": "nextafter",
    "aten.hypot.default": "hypot", "aten.fmax.default": "fmax", "aten.fmin.default": "fmin",
    "aten.special_zeta.default": "zeta", "aten.special_zeta.self_scalar": "zeta", "aten.special_zeta.other_scalar": "zeta",
    "aten.ldexp.Tensor": "ldexp",
    "aten.igamma.default": "igamma", "aten.igammac.default": "igammac",
})
for _poly in ("chebyshev_polynomial_t", "chebyshev_polynomial_u", "chebyshev_polynomial_v", "chebyshev_polynomial_w",
              "hermite_polynomial_h", "hermite_polynomial_he", "laguerre_polynomial_l", "legendre_polynomial_p"):
    for _shift in ("", "shifted_"):
        if _shift and not _poly.startswith("chebyshev"):
            continue
        _ins = "poly_" + _shift + _poly.replace("_polynomial", "")
        for _ov in ("default", "x_scalar", "n_scalar"):
            BINARY[f"aten.special_{_shift}{_poly}.{_ov}"] = _ins
for _name in ("logical_and", "logical_or", "logical_xor"):
    BINARY[f"aten.{_name}.default"] = BINARY.pop(f"aten.{_name}.Tensor")
    BINARY.pop(f"aten.{_name}.Scalar")
BINARY["aten.div.Scalar_mode"] = "div_mode"
SPECIAL_EW = frozenset({
    "aten.gelu.default", "aten.clamp.default", "aten.clamp_min.default", "aten.clamp_max.default",
    "aten.leaky_relu.default", "aten.elu.default", "aten.hardtanh.default", "aten.softplus.default",
    "aten.where.self", "aten.full.default", "aten.scalar_tensor.default", "aten.full_like.default",
    "aten.fill.Scalar", "aten.sigmoid_backward.default", "aten.tanh_backward.default",
    "aten._native_batch_norm_legit_no_training.default", "aten.hardsigmoid.default", "aten.hardswish.default",
    "aten.zeros_like.default", "aten.ones_like.default", "aten.masked_fill.Scalar",
    "aten.clamp.Tensor", "aten.clamp_min.Tensor", "aten.clamp_max.Tensor", "aten.round.decimals",
    "aten.polygamma.default", "aten.empty.memory_format", "aten.empty_permuted.default", "aten.empty_strided.default",
    "aten.masked_fill.Tensor", "aten.copy.default", "aten.bitwise_not.default", "aten.gelu_backward.default",
    "aten.silu_backward.default",
})
#: ops that only write a value (their integer form needs no integer arithmetic)
FILLS = frozenset({
    "aten.full.default", "aten.scalar_tensor.default", "aten.full_like.default", "aten.fill.Scalar",
    "aten.zeros_like.default", "aten.ones_like.default", "aten.masked_fill.Scalar", "aten.masked_fill.Tensor",
    "aten.empty.memory_format", "aten.empty_permuted.default", "aten.empty_strided.default",
})
COMPARE = frozenset({
    "eq", "ne", "lt", "le", "gt", "ge", "and", "or", "xor", "logical_not", "isnan", "isinf", "signbit",
})
INT_OK = frozenset({
    "copy", "neg", "abs", "add", "sub", "mul", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge", "and",
    "or", "xor", "logical_not", "sign", "rsub", "clamp", "relu", "remainder", "floor_divide", "where", "const", "fmod",
    "bitwise_not",
})
VIEWS = frozenset({
    "aten.view.default", "aten._unsafe_view.default", "aten.reshape.default", "aten.permute.default",
    "aten.expand.default", "aten.slice.Tensor", "aten.select.int", "aten.unsqueeze.default",
    "aten.squeeze.dim", "aten.squeeze.dims", "aten.squeeze.default", "aten.t.default", "aten.transpose.int",
    "aten.alias.default", "aten.diagonal.default", "aten.split.Tensor", "aten.split_with_sizes.default",
    "aten.unbind.int", "aten.detach.default", "aten.unfold.default", "aten.narrow.default",
})
#: view-and-copy ops: the view is resolved at compile time, the copy is one elementwise step
COPY_VIEWS: dict[str, str] = {
    "aten.view_copy.default": "aten.view.default", "aten.permute_copy.default": "aten.permute.default",
    "aten.narrow_copy.default": "aten.narrow.default", "aten.unbind_copy.int": "aten.unbind.int",
    "aten.expand_copy.default": "aten.expand.default", "aten.t_copy.default": "aten.t.default",
    "aten.transpose_copy.int": "aten.transpose.int", "aten.unsqueeze_copy.default": "aten.unsqueeze.default",
    "aten.squeeze_copy.dim": "aten.squeeze.dim", "aten.squeeze_copy.dims": "aten.squeeze.dims",
    "aten.diagonal_copy.default": "aten.diagonal.default", "aten.select_copy.int": "aten.select.int",
    "aten.slice_copy.Tensor": "aten.slice.Tensor", "aten.alias_copy.default": "aten.alias.default",
}
#: scatter-into-a-view ops: out = copy of self with src written into one view of it
SCATTER_VIEWS: dict[str, str] = {
    "aten.slice_scatter.default": "aten.slice.Tensor", "aten.select_scatter.default": "aten.select.int",
    "aten.diagonal_scatter.default": "aten.diagonal.default",
}
REDUCTIONS: dict[str, int] = {
    "aten.sum.dim_IntList": 0, "aten.sum.default": 0, "aten.mean.dim": 1, "aten.mean.default": 1, "aten.amax.default": 2,
    "aten.amin.default": 3, "aten.argmax.default": 4, "aten.argmin.default": 5, "aten.var.correction": 6,
    "aten.prod.dim_int": 7, "aten.prod.default": 7, "aten.logsumexp.default": 8, "aten.max.dim": 2, "aten.min.dim": 3,
    "aten.var.dim": 6, "aten.std.correction": 6, "aten.var_mean.correction": 6, "aten.max.default": 2,
    "aten.min.default": 3,
    "aten.any.default": 9, "aten.any.dim": 9, "aten.any.dims": 9,
}
#: reductions that may read int64 (compared with zero, which is exact)
INT_INPUT_REDUCTIONS = frozenset({"aten.any.default", "aten.any.dim", "aten.any.dims"})
KERNELS = frozenset({
    "aten.mm.default", "aten.addmm.default", "aten.bmm.default", "aten.baddbmm.default",
    "aten._softmax.default", "aten._log_softmax.default", "aten._softmax_backward_data.default",
    "aten._log_softmax_backward_data.default", "aten.native_layer_norm.default", "aten._fused_rms_norm.default",
    "aten._scaled_dot_product_flash_attention_for_cpu.default", "aten.embedding.default", "aten.index.Tensor",
    "aten.gather.default", "aten.index_select.default", "aten.cumsum.default", "aten.arange.start_step",
    "aten.arange.default", "aten.arange.start", "aten.convolution.default", "aten.max_pool2d_with_indices.default",
    "aten.avg_pool2d.default", "aten.nll_loss_forward.default", "aten.nll_loss_backward.default", "aten.cat.default",
    "aten.stack.default", "aten.cumprod.default", "aten.logcumsumexp.default", "aten.scatter.src", "aten.scatter.value",
    "aten.scatter_add.default", "aten.scatter_reduce.two", "aten.index_reduce.default", "aten.index_put.default",
    "aten.sort.default", "aten.sort.stable", "aten.topk.default", "aten.constant_pad_nd.default", "aten.repeat.default",
    "aten.flip.default", "aten.kthvalue.default", "aten._adaptive_avg_pool2d.default",
    "aten.adaptive_max_pool2d.default", "aten.max_pool3d_with_indices.default", "aten.avg_pool3d.default",
    "aten.addmv.default", "aten.cummax.default", "aten.cummin.default", "aten._adaptive_avg_pool3d.default",
    "aten.adaptive_max_pool3d.default",
})
FLOAT_ONLY_KERNELS = frozenset(KERNELS - {
    "aten.index.Tensor", "aten.gather.default", "aten.index_select.default", "aten.cumsum.default",
    "aten.arange.start_step", "aten.arange.default", "aten.arange.start", "aten.cat.default", "aten.stack.default",
    "aten.embedding.default", "aten.nll_loss_forward.default", "aten.nll_loss_backward.default",
    "aten.max_pool2d_with_indices.default", "aten.scatter.src", "aten.scatter.value", "aten.scatter_add.default",
    "aten.scatter_reduce.two", "aten.index_put.default", "aten.sort.default", "aten.sort.stable",
    "aten.constant_pad_nd.default", "aten.repeat.default", "aten.flip.default",
})

#: padding by index: each padded dim is one gather through a computed index vector
INDEX_PADS = frozenset({
    "aten.reflection_pad1d.default", "aten.reflection_pad2d.default", "aten.reflection_pad3d.default",
    "aten.replication_pad1d.default", "aten.replication_pad2d.default", "aten.replication_pad3d.default",
})
#: batch norm with batch statistics (training mode), lowered to two reductions and two sweeps
BATCH_NORMS = frozenset({
    "aten._native_batch_norm_legit.default", "aten._native_batch_norm_legit.no_stats",
    "aten._native_batch_norm_legit_functional.default", "aten.native_batch_norm.default",
})
KERNELS = KERNELS | {"aten.scatter.reduce", "aten.scatter.value_reduce", "aten.median.default",
                     "aten.native_group_norm.default"} | INDEX_PADS | BATCH_NORMS
FLOAT_ONLY_KERNELS = FLOAT_ONLY_KERNELS | {"aten.median.default", "aten.native_group_norm.default"} | BATCH_NORMS

#: dense linear algebra (float32 matrices, int32 pivots and info): lowered to the ``linalg`` kernels
LINALG = frozenset({
    "aten.linalg_lu_factor_ex.default", "aten.linalg_lu.default", "aten.lu_unpack.default",
    "aten.linalg_lu_solve.default", "aten._linalg_solve_ex.default", "aten.linalg_inv_ex.default",
    "aten._linalg_det.default", "aten._linalg_slogdet.default", "aten.linalg_cholesky_ex.default",
    "aten.cholesky_solve.default", "aten.cholesky_inverse.default", "aten.linalg_solve_triangular.default",
    "aten.triangular_solve.default",
})
KERNELS = KERNELS | LINALG
#: QR, SVD, symmetric eigen and what is built on them (decomp.py)
KERNELS = KERNELS | DECOMP
#: search, distances, order statistics, resampling, scatter-like copies: one kernel step each
MORE = frozenset({
    "aten.searchsorted.Tensor", "aten.bucketize.Tensor", "aten.histc.default", "aten.frexp.Tensor",
    "aten._cdist_forward.default", "aten._pdist_forward.default", "aten.dist.default",
    "aten.median.dim", "aten.nanmedian.dim", "aten.nanmedian.default", "aten.mode.default",
    "aten.upsample_bilinear2d.default", "aten.upsample_bicubic2d.default", "aten.upsample_trilinear3d.default",
    "aten.grid_sampler_2d.default", "aten._linalg_check_errors.default", "aten.masked_scatter.default",
    "aten.addbmm.default", "aten.put.default", "aten.as_strided_copy.default", "aten.as_strided_scatter.default",
    "aten.segment_reduce.default", "aten.max_pool2d_with_indices_backward.default", "aten.grid_sampler_3d.default",
    "aten._embedding_bag_forward_only.default", "aten.nonzero_static.default", "aten.resize.default",
})
#: indexing ops that also take int32 indices
INT32_INDEX_OPS = frozenset({
    "aten.gather.default", "aten.scatter.src", "aten.scatter.value", "aten.scatter_add.default",
    "aten.scatter_reduce.two", "aten.scatter.reduce", "aten.scatter.value_reduce", "aten.index_put.default",
})
KERNELS = KERNELS | MORE
#: copies and fills that convert to or from the storage-only dtypes (one ``cast`` or ``fill`` step)
WIDE_COPIES = frozenset({
    "aten._to_copy.default", "aten.clone.default", "aten.lift_fresh_copy.default", "aten.copy.default",
})
WIDE_FILLS = frozenset({
    "aten.full.default", "aten.scalar_tensor.default", "aten.full_like.default", "aten.fill.Scalar",
    "aten.zeros_like.default", "aten.ones_like.default", "aten.empty.memory_format", "aten.empty_permuted.default",
    "aten.empty_strided.default",
})
WIDE_OPS = WIDE_COPIES | WIDE_FILLS | {"aten.arange.start_step", "aten.arange.default", "aten.arange.start"}

SUPPORTED = (
    frozenset(UNARY) | frozenset(BINARY) | SPECIAL_EW | VIEWS | frozenset(REDUCTIONS) | KERNELS | frozenset(COPY_VIEWS)
    | frozenset(SCATTER_VIEWS)
)

SUPPORTED = SUPPORTED | _cplx.OPS  # complex dtypes and FFTs: complex_ops.py


def ew_instruction(op: str) -> str | None:
    return UNARY.get(op) or BINARY.get(op)


def check(info: Any) -> str | None:
    """None when native_cpu takes the node, else the reason (shown by ``torchburn.explain``)."""
    op = info.op
    if op not in SUPPORTED:
        return "no native kernel"
    if info.symbolic:
        return "symbolic shape"
    metas = [*info.inputs, *info.out_metas]
    for m in metas:
        if m.device != "cpu":
            return f"device {m.device}"
    kwargs = info.kwargs
    if "device" in kwargs and kwargs["device"] is not None and torch.device(kwargs["device"]).type != "cpu":
        return "not a cpu tensor"
    if _cplx.claims(info):
        return _cplx.check(info)
    if _wide.claims(info):
        return _wide.check(info)
    if op in LINALG:
        return _check_linalg(info)
    if op in DECOMP:
        return check_decomp(info)
    if op in MORE:
        return _check_more(info)
    wide_ok = op in WIDE_OPS or op in VIEWS
    int32_idx = op in INT32_INDEX_OPS and info.inputs[0].dtype in DTYPES and all(m.dtype in DTYPES for m in info.out_metas)
    # comparisons of narrow integers: the lowering widens them to int64 first (exact)
    int_cmp = ew_instruction(op) in COMPARE and all(m.dtype == BOOL for m in info.out_metas)
    for m in metas:
        if (m.dtype == torch.int32 and int32_idx) or (int_cmp and m.dtype in NARROW_INTS):
            continue
        if m.dtype not in DTYPES and not (wide_ok and m.dtype in WIDE_DTYPES):
            return f"dtype {m.dtype} (native_cpu takes float32, int64, bool; {_WIDE_NOTE})"
    if op in WIDE_OPS and any(m.dtype in WIDE_DTYPES for m in metas):
        if op == "aten._to_copy.default" and kwargs.get("layout", torch.strided) not in (None, torch.strided):
            return "layout"
        return None
    if op in REDUCTIONS and info.inputs:
        x = info.inputs[0]
        if x.dtype == BOOL and x.numel >= 1 << 24:
            return "bool reduction over 2**24 elements or more"  # counted in float32
        if x.dtype == I64 and op not in INT_INPUT_REDUCTIONS:
            return "float32 or bool input only"
    if op in FLOAT_ONLY_KERNELS and any(m.dtype != F32 for m in info.inputs[:1]):
        return "float32 input only"
    if op in FLOAT_ONLY_KERNELS and any(m.dtype != F32 for m in info.out_metas if m.dtype != I64):
        return "float32 only"
    ins = ew_instruction(op)
    if ins is not None or op in SPECIAL_EW:
        name = ins or op.split(".")[1]
        out = info.out_metas[0] if info.out_metas else None
        dts = {m.dtype for m in info.inputs}
        if out is not None:
            compute_float = (F32 in dts) if name in COMPARE else out.dtype == F32 or F32 in dts and name == "copy"
            if name == "where":
                compute_float = out.dtype == F32
            if not compute_float and name not in INT_OK and op not in FILLS:
                return f"{name} has no integer kernel"
        if op == "aten.div.Tensor_mode" and kwargs.get("rounding_mode") not in (None, "floor", "trunc"):
            return "rounding mode"
        if op == "aten._to_copy.default" and kwargs.get("layout", torch.strided) not in (None, torch.strided):
            return "layout"
    if op == "aten.convolution.default":
        if len(info.inputs[0].shape) not in (3, 4, 5) or info.args[6] and len(info.inputs[0].shape) == 5:
            return "only 1-d, 2-d and 3-d convolution, and 1-d and 2-d transposed convolution"
    if op in ("aten.max_pool2d_with_indices.default", "aten.avg_pool2d.default") and len(info.inputs[0].shape) != 4:
        return "only 4-d pooling input"
    if op in ("aten.max_pool3d_with_indices.default", "aten.avg_pool3d.default") and len(info.inputs[0].shape) not in (4, 5):
        return "only 4-d and 5-d 3-d pooling input"
    if op in ("aten._adaptive_avg_pool2d.default", "aten.adaptive_max_pool2d.default"):
        if len(info.inputs[0].shape) not in (3, 4):
            return "only 3-d and 4-d adaptive pooling input"
    if op in ("aten._adaptive_avg_pool3d.default", "aten.adaptive_max_pool3d.default"):
        if len(info.inputs[0].shape) not in (4, 5):
            return "only 4-d and 5-d adaptive 3-d pooling input"
    if op == "aten._scaled_dot_product_flash_attention_for_cpu.default":
        if len(info.args) > 3 and info.args[3]:
            return "dropout"
    if op == "aten.index_put.default":
        nones = [i is None for i in info.args[1]]
        if all(nones) or any(nones[nones.index(False):]):
            return "index with None after an index tensor"
        if any(m.dtype not in (I64, torch.int32) for m in info.inputs[1:-1]):
            return "only int64 or int32 indices"
    if op in ("aten.scatter_reduce.two", "aten.index_reduce.default") and info.out_metas[0].dtype != F32:
        return "float32 only"
    if op == "aten.index.Tensor":
        if all(i is None for i in info.args[1]):
            return "index without an index tensor"
        if any(m.dtype != I64 for m in info.inputs[1:]):
            return "only int64 indices"
    if op in ("aten.bmm.default", "aten.baddbmm.default", "aten.mm.default", "aten.addmm.default", "aten.addmv.default"):
        if any(m.dtype != F32 for m in metas):
            return "float32 only"
    return None


_WIDE_NOTE = "float64, float16, bfloat16 and int8..int32 in copies, fills and arange only"
#: linalg ops: (index of the flag that asks for pivoting, which must be true) for the LU family
_NEEDS_PIVOT = {"aten.linalg_lu_factor_ex.default", "aten.linalg_lu.default"}


def _check_linalg(info: Any) -> str | None:
    op = info.op
    for m in info.inputs:
        if m.dtype not in (F32, torch.int32):
            return f"dtype {m.dtype} (linalg takes float32 matrices and int32 pivots)"
    for m in info.out_metas:
        if m.dtype not in (F32, torch.int32):
            return f"dtype {m.dtype} (linalg gives float32 and int32)"
    if not info.inputs or info.inputs[0].dtype != F32 or len(info.inputs[0].shape) < 2:
        return "linalg needs a float32 matrix (or a batch of them) first"
    if op in _NEEDS_PIVOT and not info.kwargs.get("pivot", True):
        return "LU without pivoting"
    if op == "aten.lu_unpack.default" and info.inputs[0].shape[:-2] != info.inputs[1].shape[:-1]:
        return "lu_unpack with broadcast batch dims"
    return None


#: ops of MORE that compute in float32 (their first input and every output but indices are float32)
_FLOAT_MORE = MORE - {
    "aten._linalg_check_errors.default", "aten.masked_scatter.default", "aten.put.default",
    "aten.as_strided_copy.default", "aten.as_strided_scatter.default", "aten.nonzero_static.default",
    "aten.resize.default",
}


def _check_more(info: Any) -> str | None:
    op, kw = info.op, info.kwargs
    if op == "aten._linalg_check_errors.default":
        return None if [m.dtype for m in info.inputs] == [torch.int32] else "info must be int32"
    for m in [*info.inputs, *info.out_metas]:
        if m.dtype not in DTYPES and m.dtype != torch.int32:
            return f"dtype {m.dtype} (native_cpu takes float32, int64, bool)"
    if op in _FLOAT_MORE:
        if info.inputs[0].dtype != F32 or any(m.dtype == BOOL for m in info.inputs):
            return "float32 input only"
        if op != "aten.frexp.Tensor" and any(m.dtype == torch.int32 for m in info.out_metas) and not kw.get("out_int32"):
            return "int32 result"
    if op == "aten.searchsorted.Tensor" and kw.get("side") not in (None, "left", "right"):
        return "searchsorted side"
    if op in ("aten.searchsorted.Tensor", "aten.bucketize.Tensor") and any(m.dtype != F32 for m in info.inputs[:2]):
        return "float32 boundaries and values only"
    if op == "aten.resize.default":
        # growing exposes uninitialised memory; another memory format restrides the data
        if kw.get("memory_format") not in (None, torch.contiguous_format):
            return "resize to a non-contiguous memory format"
        if math.prod(info.out_metas[0].shape) > math.prod(info.inputs[0].shape):
            return "resize that grows the tensor"
    if op == "aten.segment_reduce.default":
        if kw.get("indices") is not None or (kw.get("lengths") is None) == (kw.get("offsets") is None):
            return "segment_reduce by lengths or offsets only"
        if info.args[1] not in ("sum", "mean", "max", "min", "prod"):
            return "segment_reduce reduction"
    if op == "aten._embedding_bag_forward_only.default" and (
        info.inputs[1].dtype != I64 or info.inputs[2].dtype != I64 or len(info.inputs[1].shape) != 1
    ):
        return "1-d int64 indices and offsets only"
    if op == "aten.grid_sampler_3d.default" and (len(info.inputs[0].shape) != 5 or info.args[2] not in (0, 1)):
        return "5-d trilinear or nearest grid sampling only"
    if op == "aten.max_pool2d_with_indices_backward.default" and len(info.inputs[0].shape) not in (3, 4):
        return "3-d or 4-d pooling only"
    four_d = ("aten.upsample_bilinear2d.default", "aten.upsample_bicubic2d.default", "aten.grid_sampler_2d.default")
    if op in four_d and len(info.inputs[0].shape) != 4:
        return "4-d input only"
    if op == "aten.upsample_trilinear3d.default" and len(info.inputs[0].shape) != 5:
        return "5-d input only"
    if op in ("aten.masked_scatter.default", "aten.put.default"):
        base = info.inputs[0].dtype
        if op == "aten.put.default" and info.inputs[1].dtype != I64:
            return "int64 indices only"
        if info.inputs[-1].dtype != base or base not in DTYPES:
            return "source and self differ in dtype"
    if op in ("aten.as_strided_copy.default", "aten.as_strided_scatter.default") and any(
        m.dtype not in DTYPES for m in info.inputs
    ):
        return "dtype"
    return None
