"""Op cases of the engine conformance suite: small functions over hand-picked inputs.

Inputs cover what engines get wrong: empty and 0-d tensors, non-contiguous (transposed,
sliced) layouts, broadcasting, NaN and ±inf, and dtypes beyond float32.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

Inputs = Callable[[torch.Generator], tuple[Any, ...]]


@dataclass(frozen=True)
class OpCase:
    id: str
    fn: Callable[..., Any]
    inputs: Inputs
    ops: tuple[str, ...]  # the ATen ops this case is about
    dtype: torch.dtype = torch.float32
    rtol: float | None = None
    atol: float | None = None


def _randn(*shape: int, dtype: torch.dtype = torch.float32) -> Callable[[torch.Generator], torch.Tensor]:
    return lambda g: torch.randn(shape, generator=g).to(dtype)


def _special(g: torch.Generator) -> torch.Tensor:
    x = torch.randn(4, 6, generator=g)
    x[0, 0], x[1, 1], x[2, 2], x[3, 3] = float("nan"), float("inf"), float("-inf"), 0.0
    return x


def _transposed(g: torch.Generator) -> torch.Tensor:
    return torch.randn(6, 5, generator=g).t()


def _sliced(g: torch.Generator) -> torch.Tensor:
    return torch.randn(8, 10, generator=g)[1::2, ::3]


def _positive(g: torch.Generator) -> torch.Tensor:
    return torch.rand(5, 7, generator=g) + 0.05


LAYOUTS: dict[str, Callable[[torch.Generator], torch.Tensor]] = {
    "2d": _randn(5, 7),
    "3d": _randn(2, 3, 4),
    "0d": lambda g: torch.randn((), generator=g),
    "empty": lambda g: torch.randn(0, 3, generator=g),
    "transposed": _transposed,
    "sliced": _sliced,
    "special": _special,
}

UNARY: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], str]] = {
    "abs": (torch.abs, "aten.abs.default"),
    "neg": (torch.neg, "aten.neg.default"),
    "exp": (torch.exp, "aten.exp.default"),
    "tanh": (torch.tanh, "aten.tanh.default"),
    "sigmoid": (torch.sigmoid, "aten.sigmoid.default"),
    "relu": (torch.relu, "aten.relu.default"),
    "gelu": (F.gelu, "aten.gelu.default"),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), "aten.gelu.default"),
    "silu": (F.silu, "aten.silu.default"),
    "sin": (torch.sin, "aten.sin.default"),
    "cos": (torch.cos, "aten.cos.default"),
    "erf": (torch.erf, "aten.erf.default"),
    "floor": (torch.floor, "aten.floor.default"),
    "ceil": (torch.ceil, "aten.ceil.default"),
    "round": (torch.round, "aten.round.default"),
    "sign": (torch.sign, "aten.sign.default"),
    "reciprocal": (torch.reciprocal, "aten.reciprocal.default"),
    "clamp": (lambda x: torch.clamp(x, -0.5, 0.7), "aten.clamp.default"),
    "leaky_relu": (F.leaky_relu, "aten.leaky_relu.default"),
    "elu": (F.elu, "aten.elu.default"),
    "hardtanh": (F.hardtanh, "aten.hardtanh.default"),
}
POSITIVE_UNARY: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], str]] = {
    "log": (torch.log, "aten.log.default"),
    "sqrt": (torch.sqrt, "aten.sqrt.default"),
    "rsqrt": (torch.rsqrt, "aten.rsqrt.default"),
    "log1p": (torch.log1p, "aten.log1p.default"),
}
BINARY: dict[str, tuple[Callable[[torch.Tensor, torch.Tensor], torch.Tensor], str]] = {
    "add": (torch.add, "aten.add.Tensor"),
    "sub": (torch.sub, "aten.sub.Tensor"),
    "mul": (torch.mul, "aten.mul.Tensor"),
    "div": (torch.div, "aten.div.Tensor"),
    "maximum": (torch.maximum, "aten.maximum.default"),
    "minimum": (torch.minimum, "aten.minimum.default"),
    "pow": (lambda a, b: torch.pow(a.abs() + 0.5, b), "aten.pow.Tensor_Tensor"),
    "gt": (torch.gt, "aten.gt.Tensor"),
    "eq": (torch.eq, "aten.eq.Tensor"),
}
BROADCASTS: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "same": ((4, 5), (4, 5)),
    "row": ((4, 5), (5,)),
    "col": ((4, 5), (4, 1)),
    "outer": ((4, 1), (1, 5)),
    "scalar": ((3, 4), ()),
    "empty": ((0, 5), (5,)),
}


def _inputs(*makers: Callable[[torch.Generator], Any]) -> Inputs:
    return lambda g: tuple(make(g) for make in makers)


def _cases() -> list[OpCase]:
    cases: list[OpCase] = []
    for name, (unary, op) in UNARY.items():
        for layout, make in LAYOUTS.items():
            cases.append(OpCase(f"{name}-{layout}", unary, _inputs(make), (op,)))
    for name, (unary, op) in POSITIVE_UNARY.items():
        cases.append(OpCase(f"{name}-positive", unary, _inputs(_positive), (op,)))
        cases.append(OpCase(f"{name}-special", unary, _inputs(_special), (op,)))
    for name, (binary, op) in BINARY.items():
        for bname, (sa, sb) in BROADCASTS.items():
            cases.append(OpCase(f"{name}-{bname}", binary, _inputs(_randn(*sa), _randn(*sb)), (op,)))
        cases.append(OpCase(f"{name}-transposed", binary, _inputs(_transposed, _randn(5, 6)), (op,)))
    cases += [
        OpCase(
            "add-alpha",
            lambda a, b: torch.add(a, b, alpha=2.5),
            lambda g: (_randn(3, 4)(g), _randn(3, 4)(g)),
            ("aten.add.Tensor",),
        ),
        OpCase("add-python-scalar", lambda a: a + 1.5, lambda g: (_randn(3, 4)(g),), ("aten.add.Tensor",)),
        OpCase("mul-special", lambda a, b: a * b, lambda g: (_special(g), _special(g)), ("aten.mul.Tensor",)),
        OpCase(
            "add-int64",
            torch.add,
            lambda g: (torch.randint(-9, 9, (3, 4), generator=g), torch.randint(-9, 9, (3, 4), generator=g)),
            ("aten.add.Tensor",),
            torch.int64,
        ),
        OpCase(
            "add-float64",
            torch.add,
            lambda g: (_randn(3, 4, dtype=torch.float64)(g), _randn(4, dtype=torch.float64)(g)),
            ("aten.add.Tensor",),
            torch.float64,
        ),
        OpCase(
            "add-promote",
            torch.add,
            lambda g: (_randn(3, 4)(g), torch.randint(-9, 9, (3, 4), generator=g)),
            ("aten.add.Tensor",),
            torch.int64,
        ),
        OpCase(
            "where", torch.where, lambda g: (_randn(4, 5)(g) > 0, _randn(4, 5)(g), _randn(5)(g)), ("aten.where.self",)
        ),
        OpCase(
            "chain",
            lambda x, w, b: F.gelu(x * w + b) * torch.sigmoid(x) + x,
            lambda g: (_randn(16, 32)(g), _randn(32)(g), _randn(32)(g)),
            ("aten.mul.Tensor", "aten.add.Tensor", "aten.gelu.default", "aten.sigmoid.default"),
        ),
    ]
    # reductions
    for name, fn, op in (
        ("sum", lambda x: x.sum(dim=-1), "aten.sum.dim_IntList"),
        ("sum-dim0", lambda x: x.sum(dim=0), "aten.sum.dim_IntList"),
        ("sum-keepdim", lambda x: x.sum(dim=(0, 1), keepdim=True), "aten.sum.dim_IntList"),
        ("mean", lambda x: x.mean(dim=-1), "aten.mean.dim"),
        ("amax", lambda x: x.amax(dim=-1), "aten.amax.default"),
        ("amin", lambda x: x.amin(dim=0), "aten.amin.default"),
        ("argmax", lambda x: x.argmax(dim=-1), "aten.argmax.default"),
        ("var", lambda x: x.var(dim=-1), "aten.var.correction"),
        ("prod", lambda x: x.prod(dim=-1), "aten.prod.dim_int"),
        ("cumsum", lambda x: x.cumsum(dim=-1), "aten.cumsum.default"),
        ("softmax", lambda x: torch.softmax(x, dim=-1), "aten._softmax.default"),
        ("softmax-dim0", lambda x: torch.softmax(x, dim=0), "aten._softmax.default"),
        ("log_softmax", lambda x: torch.log_softmax(x, dim=-1), "aten._log_softmax.default"),
        ("logsumexp", lambda x: torch.logsumexp(x, dim=-1), "aten.logsumexp.default"),
    ):
        for layout in ("3d", "transposed", "special"):
            cases.append(OpCase(f"{name}-{layout}", fn, _inputs(LAYOUTS[layout]), (op,)))
    cases.append(
        OpCase(
            "sum-empty", lambda x: x.sum(dim=-1), lambda g: (torch.randn(0, 4, generator=g),), ("aten.sum.dim_IntList",)
        )
    )
    # GEMM family
    cases += [
        OpCase(
            "mm", torch.mm, lambda g: (_randn(17, 33)(g), _randn(33, 9)(g)), ("aten.mm.default",), rtol=1e-4, atol=1e-4
        ),
        OpCase(
            "mm-transposed",
            lambda a, b: a @ b.t(),
            lambda g: (_randn(8, 16)(g), _randn(12, 16)(g)),
            ("aten.mm.default",),
            rtol=1e-4,
            atol=1e-4,
        ),
        OpCase("mm-empty-k", torch.mm, lambda g: (_randn(4, 0)(g), _randn(0, 3)(g)), ("aten.mm.default",)),
        OpCase(
            "bmm",
            torch.bmm,
            lambda g: (_randn(3, 7, 5)(g), _randn(3, 5, 6)(g)),
            ("aten.bmm.default",),
            rtol=1e-4,
            atol=1e-4,
        ),
        OpCase(
            "linear",
            F.linear,
            lambda g: (_randn(6, 20)(g), _randn(10, 20)(g), _randn(10)(g)),
            ("aten.addmm.default",),
            rtol=1e-4,
            atol=1e-4,
        ),
        OpCase(
            "linear-relu",
            lambda x, w, b: torch.relu(F.linear(x, w, b)),
            lambda g: (_randn(6, 20)(g), _randn(10, 20)(g), _randn(10)(g)),
            ("aten.addmm.default", "aten.relu.default"),
            rtol=1e-4,
            atol=1e-4,
        ),
        OpCase(
            "linear-3d",
            F.linear,
            lambda g: (_randn(2, 3, 20)(g), _randn(10, 20)(g), _randn(10)(g)),
            ("aten.addmm.default",),
            rtol=1e-4,
            atol=1e-4,
        ),
        OpCase(
            "matmul-batched",
            torch.matmul,
            lambda g: (_randn(2, 3, 4, 8)(g), _randn(2, 3, 8, 5)(g)),
            ("aten.bmm.default",),
            rtol=1e-4,
            atol=1e-4,
        ),
    ]
    # normalization, attention, conv, pooling, indexing, data movement
    cases += [
        OpCase(
            "layer_norm",
            lambda x, w, b: F.layer_norm(x, (16,), w, b),
            lambda g: (_randn(3, 5, 16)(g), _randn(16)(g), _randn(16)(g)),
            ("aten.native_layer_norm.default",),
            rtol=1e-4,
            atol=1e-4,
        ),
        OpCase(
            "rms_norm",
            lambda x, w: F.rms_norm(x, (16,), w, eps=1e-6),
            lambda g: (_randn(3, 5, 16)(g), _randn(16)(g)),
            # PyTorch has no fused CPU kernel: rms_norm reaches engines as pow/mean/rsqrt/mul.
            ("aten.mean.dim", "aten.rsqrt.default", "aten.mul.Tensor"),
            rtol=1e-4,
            atol=1e-4,
        ),
        OpCase(
            "batch_norm-eval",
            lambda x, m, v, w, b: F.batch_norm(x, m, v, w, b, training=False),
            lambda g: (_randn(2, 4, 5, 5)(g), _randn(4)(g), _positive(g)[0, :4], _randn(4)(g), _randn(4)(g)),
            ("aten._native_batch_norm_legit_no_training.default",),
            rtol=1e-4,
            atol=1e-4,
        ),
        OpCase(
            "sdpa",
            F.scaled_dot_product_attention,
            lambda g: (_randn(2, 4, 8, 16)(g), _randn(2, 4, 8, 16)(g), _randn(2, 4, 8, 16)(g)),
            ("aten._scaled_dot_product_flash_attention_for_cpu.default",),
            rtol=1e-4,
            atol=1e-4,
        ),
        OpCase(
            "sdpa-causal",
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
            lambda g: (_randn(1, 2, 9, 8)(g), _randn(1, 2, 9, 8)(g), _randn(1, 2, 9, 8)(g)),
            ("aten._scaled_dot_product_flash_attention_for_cpu.default",),
            rtol=1e-4,
            atol=1e-4,
        ),
        OpCase(
            "conv2d",
            lambda x, w, b: F.conv2d(x, w, b, padding=1),
            lambda g: (_randn(2, 3, 8, 8)(g), _randn(4, 3, 3, 3)(g), _randn(4)(g)),
            ("aten.convolution.default",),
            rtol=1e-4,
            atol=1e-4,
        ),
        OpCase(
            "conv2d-stride",
            lambda x, w: F.conv2d(x, w, stride=2),
            lambda g: (_randn(1, 2, 9, 9)(g), _randn(3, 2, 3, 3)(g)),
            ("aten.convolution.default",),
            rtol=1e-4,
            atol=1e-4,
        ),
        OpCase(
            "max_pool2d",
            lambda x: F.max_pool2d(x, 2),
            lambda g: (_randn(2, 3, 8, 8)(g),),
            ("aten.max_pool2d_with_indices.default",),
        ),
        OpCase(
            "avg_pool2d", lambda x: F.avg_pool2d(x, 2), lambda g: (_randn(2, 3, 8, 8)(g),), ("aten.avg_pool2d.default",)
        ),
        OpCase(
            "adaptive_avg_pool2d",
            lambda x: F.adaptive_avg_pool2d(x, 1),
            lambda g: (_randn(2, 3, 8, 8)(g),),
            ("aten.mean.dim",),
        ),
        OpCase(
            "embedding",
            F.embedding,
            lambda g: (torch.randint(0, 10, (3, 5), generator=g), _randn(10, 8)(g)),
            ("aten.embedding.default",),
        ),
        OpCase(
            "index_select",
            lambda x, i: x.index_select(0, i),
            lambda g: (_randn(6, 4)(g), torch.tensor([4, 0, 0, 5])),
            ("aten.index_select.default",),
        ),
        OpCase(
            "gather",
            lambda x, i: x.gather(1, i),
            lambda g: (_randn(3, 5)(g), torch.randint(0, 5, (3, 2), generator=g)),
            ("aten.gather.default",),
        ),
        OpCase(
            "cat",
            lambda a, b: torch.cat([a, b], dim=1),
            lambda g: (_randn(3, 4)(g), _randn(3, 2)(g)),
            ("aten.cat.default",),
        ),
        OpCase(
            "permute-contiguous",
            lambda x: x.permute(2, 0, 1).contiguous() * 2,
            lambda g: (_randn(2, 3, 4)(g),),
            ("aten.clone.default", "aten.mul.Tensor"),
        ),
        OpCase(
            "masked_fill",
            lambda x, m: x.masked_fill(m, -1.0),
            lambda g: (_randn(4, 5)(g), _randn(4, 5)(g) > 0),
            ("aten.where.self",),
        ),
        OpCase(
            "cross_entropy",
            lambda x, y: F.cross_entropy(x, y),
            lambda g: (_randn(8, 10)(g), torch.randint(0, 10, (8,), generator=g)),
            ("aten.nll_loss_forward.default",),
            rtol=1e-5,
            atol=1e-5,
        ),
    ]
    return cases


CASES: list[OpCase] = _cases()
