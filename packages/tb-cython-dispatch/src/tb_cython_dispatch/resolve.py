"""Resolution: what a module type, or a Sequential under a dispatch key, maps to.

This is the Python-side work a cache hit skips. Both implementations of the hot loops
(``_dispatch`` and ``_fallback``) call these resolvers on a miss and then run the result.

A module type is bound to an ATen entry only while its ``forward`` is the stock one of a torch
class we know; anything else (a subclass that overrides ``forward``, an unknown module) is
called through its own ``forward``, exactly as ``nn.Module.__call__`` would.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

# Leaf kinds (module_call) and step kinds (run_steps); the values match both implementations.
T_FORWARD, T_LINEAR, T_UNARY, T_UNARY_ATTR, T_SEQUENTIAL = range(5)
K_CALL, K_LINEAR, K_LINEAR_RELU, K_UNARY, K_UNARY_ARG, K_IDENTITY = range(6)

_relu = torch.relu
_relu_ = torch.relu_
_silu = torch._C._nn.silu
_silu_ = torch._C._nn.silu_
_gelu = torch._C._nn.gelu


def _relu_sel(x: torch.Tensor, inplace: bool) -> torch.Tensor:
    # nn.functional.relu without its torch-function check (the caller made sure x is a plain Tensor)
    return _relu_(x) if inplace else _relu(x)


def _silu_sel(x: torch.Tensor, inplace: bool) -> torch.Tensor:
    return _silu_(x) if inplace else _silu(x)


def _gelu_sel(x: torch.Tensor, approximate: str) -> torch.Tensor:
    return _gelu(x, approximate=approximate)


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


# torch class -> leaf handler. The handler is used for a class only if the class's forward is
# the torch class's own (checked per class in resolve_type).
_LEAVES: dict[type, tuple[Any, ...]] = {
    nn.Linear: (T_LINEAR,),
    nn.ReLU: (T_UNARY_ATTR, _relu_sel, "inplace"),
    nn.SiLU: (T_UNARY_ATTR, _silu_sel, "inplace"),
    nn.GELU: (T_UNARY_ATTR, _gelu_sel, "approximate"),
    nn.Tanh: (T_UNARY, torch.tanh),
    nn.Sigmoid: (T_UNARY, torch.sigmoid),
    nn.Identity: (T_UNARY, _identity),
    nn.Sequential: (T_SEQUENTIAL,),
}


def resolve_type(cls: type) -> tuple[Any, ...]:
    """The leaf handler of a module class (T_FORWARD: call its forward)."""
    for base, handler in _LEAVES.items():
        if issubclass(cls, base) and getattr(cls, "forward", None) is getattr(base, "forward", None):
            return handler
    return (T_FORWARD,)


def _ndim(key: Any) -> int | None:
    # key = ((shape, stride, dtype, device, requires_grad), grad_enabled, inference_mode)
    return len(key[0][0])


def resolve_sequential(seq: nn.Sequential, key: Any) -> tuple[tuple[Any, ...], tuple[type, ...], tuple[Any, ...], Any]:
    """(children, their types, steps, native slot) for one Sequential under one dispatch key.

    Linear followed by ReLU on a 2-D input becomes ``relu_(linear(...))``: the intermediate is
    never visible (no hooks, not returned), linear's backward does not read its output, and
    ``relu_`` is the same kernel as ``relu``, so values and gradients are bit-identical.
    On other ranks linear's output may be a view, so the two stay separate steps.

    The native slot (``tb_cython_dispatch.native.NativeSeq``, or None) holds the entry's
    prepared program (an installed engine's, through tb-core's ``Engine.prepare``) and the timed
    decision whether to use it.
    """
    children = tuple(seq._modules.values())
    types = tuple(type(c) for c in children)
    steps: list[tuple[Any, ...]] = []
    ndim = _ndim(key)
    i = 0
    while i < len(children):
        child = children[i]
        handler = resolve_type(type(child))
        kind = handler[0]
        if kind == T_LINEAR:
            nxt = children[i + 1] if i + 1 < len(children) else None
            if ndim == 2 and nxt is not None and resolve_type(type(nxt))[1:2] == (_relu_sel,):
                steps.append((K_LINEAR_RELU, child, child._parameters, nxt))
                i += 2
                continue
            steps.append((K_LINEAR, child, child._parameters))
        elif kind == T_UNARY:
            steps.append((K_UNARY, child, handler[1]))
        elif kind == T_UNARY_ATTR:
            steps.append((K_UNARY_ARG, child, handler[1], handler[2]))
        else:
            steps.append((K_CALL, child))
            ndim = None
        i += 1
    steps_t = tuple(steps)
    from tb_cython_dispatch import _impl, native

    nat = native.for_entry("nn.Sequential", _impl.core.CACHE.epoch, key, steps_t)
    return children, types, steps_t, nat
