"""native_cpu's single-op eager kernels, as ``NativeCpuEngine.eager_kernel`` hands them out.

Each kernel is a function of a tensor that returns a new tensor: it takes a plain strided,
contiguous float32 CPU tensor with no lazy negation or conjugation and raises ``ValueError`` /
``TypeError`` for anything else, with a message that says why. The native module takes the
tensors themselves (``_unary_f32``) and validates them before it reads a byte; the kernel checks
only what the module cannot tell (a subclass, a non-strided layout) and words the refusals.

Numerics: the Rust kernels' polynomial approximations, within float32 tolerance of
``torch.testing.assert_close`` (NaN, ±inf and signed zeros as PyTorch), not bit-identical.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import torch

from tb_cpu_rust import _native

_F32 = torch.float32
_STRIDED = torch.strided
_Tensor = torch.Tensor
_empty_like = torch.empty_like
_CONTIGUOUS = torch.contiguous_format


@cache
def unary_codes() -> dict[str, int]:
    """Native unary op name ("sin") -> the code ``_native.unary_f32`` takes."""
    return {name: code for code, name in enumerate(_native.unary_ops())}


def unary_ops() -> dict[str, str]:
    """ATen overload ("aten.sin.default") -> native unary op name, for what this build has."""
    return {f"aten.{name}.default": name for name in unary_codes()}


def unary_kernel(op: str) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The checked float32 kernel of an ATen unary overload, or None when there is none."""
    name = unary_ops().get(op)
    if name is None:
        return None
    code = unary_codes()[name]

    def kernel(x: torch.Tensor) -> torch.Tensor:
        # dtype, device, contiguity and the negation bit are checked by the native module itself
        # (before it reads anything); only what it cannot see of x is checked here
        if type(x) is not _Tensor or x.layout is not _STRIDED:
            raise _refusal(op, x)
        y = _empty_like(x, memory_format=_CONTIGUOUS)
        try:
            _unary_f32(code, x, y)
        except ValueError as exc:
            raise _refusal(op, x) from exc
        return y

    kernel.__name__ = kernel.__qualname__ = f"native_cpu_{name}_f32"
    kernel.__doc__ = f"{op} on a contiguous float32 CPU tensor by native_cpu's kernel; a new tensor."
    return kernel


def _unary_f32(code: int, src: torch.Tensor, dst: torch.Tensor) -> None:
    """The native call of the eager kernels; Rust validates both tensors again."""
    _native.unary_f32(code, src, dst)


def _refusal(op: str, x: object) -> Exception:
    if not isinstance(x, _Tensor):
        return TypeError(f"native_cpu {op} kernel takes a tensor, not {type(x).__name__}")
    if type(x) is not _Tensor:
        return TypeError(f"native_cpu {op} kernel takes a plain torch.Tensor, not the subclass {type(x).__name__}")
    if x.dtype is not _F32:
        why = f"dtype {x.dtype} (it takes torch.float32)"
    elif x.layout is not _STRIDED:
        why = f"layout {x.layout}"
    elif not x.is_cpu:
        why = f"device {x.device}"
    elif not x.is_contiguous():
        why = f"a non-contiguous tensor (strides {x.stride()})"
    elif x.is_neg() or x.is_conj():
        why = "a lazily negated view (pass x.resolve_neg())"
    else:
        why = "this tensor (the native module refused it)"
    return ValueError(f"native_cpu {op} kernel does not take {why}")
