"""Helpers the kernel test files share: run a function on native_cpu alone and compare with eager."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from torchburn.testing.conformance import compile_with, native_and_fallback


def run_native(fn: Callable[..., Any], *args: torch.Tensor, require_native: bool = False) -> Any:
    """`fn(*args)` compiled for native_cpu (no cache, grad off); fails if any op fell back to eager.

    ``require_native``: also fail when no op ran natively at all (a graph of views alone, say).
    """
    compiled, reports = compile_with("native_cpu", fn, cache=False)
    with torch.no_grad():
        got = compiled(*args)
    native, fallback = native_and_fallback(reports)
    assert not fallback, fallback
    assert native or not require_native, reports
    return got


def check_native(fn: Callable[..., Any], *args: torch.Tensor, **kw: Any) -> None:
    """native_cpu's `fn(*args)` equals eager's (computed first, on copies), NaN where eager has NaN."""
    want = fn(*[a.clone() for a in args])
    got = run_native(fn, *args, require_native=True)
    torch.testing.assert_close(got, want, equal_nan=True, **kw)


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(tuple(shape), generator=torch.Generator().manual_seed(seed))
