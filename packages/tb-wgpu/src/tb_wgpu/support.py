"""What the wgpu engine accepts, node by node (the reason is shown by ``torchburn.explain``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tb_wgpu.elementwise import TABLE as ELEMENTWISE
from tb_wgpu.kernels import TABLE

F32 = torch.float32
F16 = torch.float16
FLOATS = (F32, F16)
I64 = torch.int64
INDEX = (torch.int64, torch.int32)
INTEGER = (torch.int64, torch.int32, torch.bool)
# Elementwise arithmetic that also runs on int64 (wrapping, as torch's; see shaders/int64_*.wgsl).
INT64_OPS = frozenset(
    {
        "aten.add.Tensor",
        "aten.add.Scalar",
        "aten.sub.Tensor",
        "aten.sub.Scalar",
        "aten.rsub.Scalar",
        "aten.mul.Tensor",
        "aten.mul.Scalar",
        "aten.neg.default",
        "aten.abs.default",
        "aten.maximum.default",
        "aten.minimum.default",
    }
)
ARANGE = frozenset({"aten.arange.default", "aten.arange.start", "aten.arange.start_step"})
VIEWS = frozenset(
    {
        "aten.view.default",
        "aten._unsafe_view.default",
        "aten.reshape.default",
        "aten.permute.default",
        "aten.transpose.int",
        "aten.t.default",
        "aten.expand.default",
        "aten.unsqueeze.default",
        "aten.squeeze.dim",
        "aten.squeeze.dims",
        "aten.squeeze.default",
        "aten.slice.Tensor",
        "aten.select.int",
        "aten.alias.default",
        "aten.detach.default",
        "aten.split_with_sizes.default",
        "aten.split.Tensor",
    }
)
COMPARES = frozenset(f"aten.{n}.{k}" for n in ("gt", "lt", "ge", "le", "eq", "ne") for k in ("Tensor", "Scalar"))
LOGICAL = frozenset(
    {
        "aten.logical_not.default",
        "aten.bitwise_not.default",
        "aten.logical_and.default",
        "aten.logical_or.default",
        "aten.bitwise_and.Tensor",
        "aten.bitwise_or.Tensor",
    }
)


def _arg(node: Any, index: int, name: str, default: Any = None) -> Any:
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def _metas(node: Any) -> list[Any]:
    return [*node.inputs, *node.out_metas]


def _dtypes_ok(node: Any, allowed: tuple[torch.dtype, ...]) -> str | None:
    for m in _metas(node):
        if m.dtype == F16 and node.op in F16_OPS:
            continue
        if m.dtype not in allowed:
            if m.dtype == F16:
                return "float16 is not supported by this wgpu kernel (float32 only)"
            return f"dtype {m.dtype} is not supported by this wgpu kernel"
    return None


def f16_available() -> bool:
    """Whether the adapter offers ``shader-f16`` (then the device was opened with it, see device.py).

    The same detection the LLM backend uses (``GpuContext.shader_f16``); tests patch this function.
    """
    from tb_wgpu.adapters import adapter_info

    adapter, _ = adapter_info()  # the adapter's features: no device is opened to check a node
    return bool(adapter is not None and adapter.shader_f16)


def _check_matmul(node: Any) -> str | None:
    for m in node.inputs:
        if len(m.shape) not in (1, 2, 3) or (
            node.op != "aten.addmm.default" and node.op != "aten.baddbmm.default" and len(m.shape) == 1
        ):
            return f"rank {len(m.shape)} operand"
    return None


def _check_conv(node: Any) -> str | None:
    if _arg(node, 6, "transposed", False):
        return "transposed convolution"
    if len(node.inputs[0].shape) != 4:
        return "only 2-d convolution"
    return None


def _check_pool(node: Any) -> str | None:
    ceil_index = 5 if node.op.startswith("aten.max_pool2d") else 4
    if _arg(node, ceil_index, "ceil_mode", False):
        return "ceil_mode"
    if len(node.inputs[0].shape) not in (3, 4):
        return "pooling needs 3-d or 4-d input"
    return None


def _check_sdpa(node: Any) -> str | None:
    if _arg(node, 3, "dropout_p", 0.0):
        return "dropout in attention"
    q = node.inputs[0]
    v = node.inputs[2]
    if len(q.shape) != 4:
        return "attention needs 4-d q/k/v"
    if v.shape[-1] > 256:
        return "value head dim above 256"
    mask = node.kwargs.get("attn_mask")
    if mask is not None and len(node.inputs) > 3 and node.inputs[3].dtype not in (q.dtype, torch.bool):
        return f"mask dtype {node.inputs[3].dtype} with {q.dtype} q/k/v"
    return None


def _check_softmax(node: Any) -> str | None:
    half_to_float = node.op != "aten.logsumexp.default" and _arg(node, 2, "half_to_float", False)
    if half_to_float and node.inputs[0].dtype != F16:
        return "half_to_float"
    return None


def _check_reduce(node: Any) -> str | None:
    dtype = node.kwargs.get("dtype")
    if dtype is not None and dtype not in (*FLOATS, I64):
        return f"accumulation dtype {dtype}"
    return None


Extra = Callable[[Any], "str | None"]
# op -> (allowed dtypes of data tensors, extra checker); index tensors are handled below.
RULES: dict[str, tuple[tuple[torch.dtype, ...], Extra | None]] = {}
for _op in TABLE:
    RULES[_op] = ((F32,), None)
for _op in VIEWS:
    RULES[_op] = ((F32, torch.bool, *INDEX), None)
for _op in ("aten.mm.default", "aten.bmm.default", "aten.addmm.default", "aten.baddbmm.default"):
    RULES[_op] = ((F32,), _check_matmul)
RULES["aten.convolution.default"] = ((F32,), _check_conv)
RULES["aten.max_pool2d_with_indices.default"] = ((F32, torch.int64), _check_pool)
RULES["aten.avg_pool2d.default"] = ((F32,), _check_pool)
RULES["aten._scaled_dot_product_flash_attention_for_cpu.default"] = ((F32, torch.bool), _check_sdpa)
for _op in ("aten._softmax.default", "aten._log_softmax.default", "aten.logsumexp.default"):
    RULES[_op] = ((F32,), _check_softmax)
for _op in ("aten.mean.dim", "aten.mean.default"):
    RULES[_op] = ((F32,), _check_reduce)
# Integer sums (bool / int32 / int64 into int64) and int64 amax / amin: shaders/reduce_i64.wgsl.
INT_REDUCE = frozenset({"aten.sum.dim_IntList", "aten.sum.default", "aten.amax.default", "aten.amin.default"})
for _op in INT_REDUCE:
    RULES[_op] = ((F32, *INTEGER), _check_reduce)
for _op in ("aten.argmax.default", "aten.argmin.default"):
    RULES[_op] = ((F32, torch.int64), None)
for _op in INT64_OPS:
    RULES[_op] = ((F32, *INTEGER), None)
for _op in COMPARES:
    RULES[_op] = ((F32, *INTEGER), None)
for _op in LOGICAL:
    RULES[_op] = ((torch.bool,), None)
RULES["aten.where.self"] = ((F32, *INTEGER), None)
RULES["aten.clone.default"] = ((F32, torch.bool, I64), None)
RULES["aten._to_copy.default"] = ((F32, *INTEGER), None)
RULES["aten.full.default"] = ((F32, torch.bool, I64), None)
RULES["aten.scalar_tensor.default"] = ((F32, torch.bool, I64), None)
RULES["aten.embedding.default"] = ((F32, *INDEX), None)
for _op in ("aten.index_select.default", "aten.gather.default"):  # data of any stored dtype
    RULES[_op] = ((F32, *INTEGER), None)
RULES["aten.index.Tensor"] = ((F32, *INTEGER), None)
RULES["aten.cat.default"] = ((F32, torch.bool, I64), None)
RULES["aten.cumsum.default"] = ((F32, *INTEGER), None)
for _op in ARANGE:
    RULES[_op] = ((*INDEX, F32), None)


# Ops with float16 kernels (used when the adapter offers shader-f16): every kernel computes in f32
# registers (f32 accumulation in matmul, reductions, softmax and layer-norm statistics) and only
# the storage of float16 tensors is f16 (lower.Storage.half, shaders.to_half). The others stay f32.
_F16_ELEMENTWISE = frozenset(ELEMENTWISE) - LOGICAL
F16_OPS: frozenset[str] = (
    frozenset(
        {
            *VIEWS,
            *COMPARES,
            "aten.mm.default",
            "aten.bmm.default",
            "aten.addmm.default",
            "aten.baddbmm.default",
            "aten.sum.dim_IntList",
            "aten.sum.default",
            "aten.mean.dim",
            "aten.mean.default",
            "aten.amax.default",
            "aten.amin.default",
            "aten._softmax.default",
            "aten._log_softmax.default",
            "aten.logsumexp.default",
            "aten.native_layer_norm.default",
            "aten.where.self",
            "aten.clone.default",
            "aten._to_copy.default",
            "aten.full.default",
            "aten.scalar_tensor.default",
            "aten.cat.default",
            # computed in f32 registers (f32 accumulation), f16 loads and stores
            "aten.convolution.default",
            "aten.max_pool2d_with_indices.default",
            "aten.avg_pool2d.default",
            "aten._scaled_dot_product_flash_attention_for_cpu.default",
            "aten._native_batch_norm_legit_no_training.default",
            "aten.embedding.default",
            "aten.index_select.default",
            "aten.gather.default",
            "aten.index.Tensor",
            # row kernels: f32 statistics / running sums / products, f16 loads and stores
            "aten._fused_rms_norm.default",
            "aten.var.correction",
            "aten.prod.dim_int",
            "aten.cumsum.default",
            "aten.argmax.default",
            "aten.argmin.default",
            "aten.nll_loss_forward.default",
        }
    )
    | _F16_ELEMENTWISE
)


def _check_nll(node: Any) -> str | None:
    if len(node.inputs[0].shape) != 2:
        return "nll_loss on (N, C) input only"
    return None


RULES["aten.nll_loss_forward.default"] = ((F32, *INDEX), _check_nll)


def check(node: Any) -> str | None:
    """None if the wgpu engine takes ``node``, else why not."""
    if node.op == "getitem":
        return None
    rule = RULES.get(node.op)
    if rule is None:
        return "no wgpu kernel"
    if node.symbolic:
        return "symbolic shape"
    allowed, extra = rule
    if any(m.dtype == F16 for m in _metas(node)) and node.op in F16_OPS and not f16_available():
        return "adapter has no shader-f16"
    why = _dtypes_ok(node, allowed)
    if why:
        return why
    for m in _metas(node):
        if m.device != "cpu":
            return f"device {m.device}"
    why = _dtype_roles(node)
    if why:
        return why
    why = _size_ok(node)
    if why:
        return why
    return extra(node) if extra is not None else None


def _dtype_roles(node: Any) -> str | None:
    """Integer tensors only where they are indices; bool only where it is a mask or a result."""
    op = node.op
    outs = node.out_metas
    if op in ("aten.embedding.default",):
        if node.inputs[0].dtype not in FLOATS or node.inputs[1].dtype not in INDEX:
            return "embedding needs float32/float16 weights and integer indices"
    elif op == "aten.nll_loss_forward.default":
        if node.inputs[0].dtype not in FLOATS or node.inputs[1].dtype not in INDEX:
            return "needs float32/float16 log-probabilities and integer targets"
        if any(m.dtype != node.inputs[0].dtype for m in (*node.inputs[2:], *outs)):
            return "nll_loss with mixed float dtypes"
    elif op in ("aten.index_select.default", "aten.gather.default"):
        if node.inputs[1].dtype not in INDEX:
            return "needs integer indices"
    elif op in ("aten.argmax.default", "aten.argmin.default") or op == "aten.max_pool2d_with_indices.default":
        if node.inputs[0].dtype not in FLOATS:
            return "needs float32/float16 input"
    elif op == "aten._to_copy.default":
        if outs and outs[0].dtype not in (*FLOATS, torch.bool, I64):
            return f"conversion to {outs[0].dtype}"
        if node.kwargs.get("device") not in (None, torch.device("cpu")):
            return "device transfer"
    elif op in COMPARES:
        if any(m.dtype != torch.bool for m in outs):
            return "comparison to a non-bool result"
        kinds = {m.dtype in FLOATS for m in node.inputs}
        if len(kinds) > 1:
            return "comparison of a floating-point with an integer tensor"
    elif op == "aten.where.self":
        if node.inputs and node.inputs[0].dtype != torch.bool:
            return "where needs a bool condition"
        values = [*node.inputs[1:], *outs]
        out = outs[0].dtype if outs else F32
        if out in FLOATS and any(m.dtype not in FLOATS for m in values):
            return "where of floating-point values mixed with integers"
        if out == I64 and any(m.dtype not in INTEGER for m in values):
            return "int64 where of non-integer values"
        if out == torch.bool and any(m.dtype != torch.bool for m in values):
            return "bool where of non-bool values"
    elif op in INT64_OPS and outs and outs[0].dtype == I64:
        if any(m.dtype not in INTEGER for m in node.inputs) or any(isinstance(a, float) for a in node.args):
            return "int64 arithmetic with a non-integer operand"
    elif op in INT64_OPS and outs and outs[0].dtype == F32:
        # float32 + int64 promotes to float32: torch converts the integers (rounded once) first;
        # float16 operands promote exactly (float16 loads widen to f32).
        if any(m.dtype not in (*FLOATS, *INTEGER) for m in node.inputs):
            return "float32 only"
    elif op in INT_REDUCE and outs and outs[0].dtype == I64:
        ok = INTEGER if op.startswith("aten.sum") else (I64,)
        if node.inputs[0].dtype not in ok:
            return f"{op} of {node.inputs[0].dtype} into int64"
    elif op == "aten.cumsum.default":
        out = outs[0].dtype
        floats = out in FLOATS and node.inputs[0].dtype == out
        if not (floats or (out == I64 and node.inputs[0].dtype in INTEGER)):
            return f"cumsum of {node.inputs[0].dtype} into {out}"
    elif op in ARANGE:
        # Integer start and step: every value is an integer, exact in int64 and rounded once to
        # float32 -- what torch's double-precision arange gives. Fractional steps are not taken.
        if any(isinstance(a, float) and not a.is_integer() for a in node.args):
            return "arange with fractional bounds or step"
    elif op == "aten.index.Tensor":
        if any(m.dtype not in INDEX for m in node.inputs[1:]) or len(node.inputs) < 2:
            return "indexing with bool masks (only integer index tensors)"
    elif (
        op in VIEWS
        or op in LOGICAL
        or op in ("aten.clone.default", "aten.cat.default", "aten.full.default", "aten.scalar_tensor.default")
    ):
        return None
    elif op == "aten._scaled_dot_product_flash_attention_for_cpu.default":
        if len({m.dtype for m in node.inputs[:3]}) != 1 or node.inputs[0].dtype not in FLOATS:
            return "attention of float32 or float16 q/k/v (one dtype)"
    else:  # float16 gets here only for F16_OPS (refused by _dtypes_ok otherwise)
        if any(m.dtype not in FLOATS for m in _metas(node)):
            return "float32 only"
    return None


def _size_ok(node: Any) -> str | None:
    from tb_wgpu.adapters import adapter_info

    adapter, reason = adapter_info()
    if adapter is None:
        return reason
    for m in _metas(node):
        nbytes = m.numel * {F16: 2, I64: 8}.get(m.dtype, 4)
        if nbytes > adapter.max_binding:
            return f"a tensor of {nbytes} bytes exceeds the adapter's {adapter.max_binding}-byte binding limit"
    return None
