"""Batch norm backward on native_cpu (kernels/reduce/batch_norm.rs, lowering/batch_norm_backward.py)
against PyTorch: ``aten.native_batch_norm_backward`` in training (saved mean / invstd) and eval
(running statistics) mode, 2-d to 5-d inputs, channels_last, non-contiguous, with and without a
weight, every output mask, NaN / inf; and the whole op through autograd of
``F.batch_norm``."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from native_helpers import randn, run_native

TOL: dict[str, Any] = {"rtol": 1e-4, "atol": 1e-4}


def _inputs(shape: tuple[int, ...], seed: int = 0) -> dict[str, torch.Tensor]:
    c = shape[1]
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * 2 + 0.5
    dims = [d for d in range(len(shape)) if d != 1]
    mean = x.mean(dims) if x.numel() else torch.zeros(c)
    var = x.var(dims, unbiased=False) if x.numel() else torch.ones(c)
    return {
        "x": x, "gy": torch.randn(shape, generator=g), "w": torch.rand(c, generator=g) + 0.5,
        "rm": torch.randn(c, generator=g) * 0.1, "rv": torch.rand(c, generator=g) + 0.5,
        "sm": mean, "si": 1 / torch.sqrt(var + 1e-5),
    }  # fmt: skip


def _op(training: bool, mask: list[bool], weight: bool) -> Any:
    def fn(gy: torch.Tensor, x: torch.Tensor, w: torch.Tensor, rm: torch.Tensor, rv: torch.Tensor,
           sm: torch.Tensor, si: torch.Tensor) -> Any:  # fmt: skip
        return torch.ops.aten.native_batch_norm_backward(
            gy, x, w if weight else None, rm, rv, sm, si, training, 1e-5, mask
        )

    return fn


def _check(
    t: dict[str, torch.Tensor], training: bool, mask: list[bool], weight: bool = True, strides: bool = True
) -> None:
    """native against eager; ``strides``: also the layout eager's kernel gives (with mixed input
    layouts PyTorch's meta function and its CPU kernel disagree, and the graph follows the meta)."""
    fn = _op(training, mask, weight)
    args = [t[k] for k in ("gy", "x", "w", "rm", "rv", "sm", "si")]
    want = fn(*[a.clone() for a in args])
    got = run_native(fn, *args, require_native=True)
    for i, flag in enumerate(mask):
        if flag:
            torch.testing.assert_close(got[i], want[i], equal_nan=True, **TOL)
            assert not strides or got[i].stride() == want[i].stride()
        elif got[i] is not None:  # left out by the mask but read by the graph: computed all the same
            full = _op(training, [True, True, True], weight)(*[a.clone() for a in args])
            torch.testing.assert_close(got[i], full[i], equal_nan=True, **TOL)


SHAPES = [(8, 3), (4, 5, 7), (2, 6, 5, 7), (3, 4, 9, 9), (2, 3, 2, 3, 4), (1, 16, 1, 1), (32, 64, 16, 16)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_batch_norm_backward_matches_torch(shape: tuple[int, ...], training: bool) -> None:
    _check(_inputs(shape), training, [True, True, True])


@pytest.mark.parametrize("shape", [(2, 6, 5, 7), (4, 32, 8, 8), (2, 3, 2, 3, 4)])
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_channels_last(shape: tuple[int, ...], training: bool) -> None:
    t = _inputs(shape)
    fmt = torch.channels_last if len(shape) == 4 else torch.channels_last_3d
    t["x"], t["gy"] = t["x"].to(memory_format=fmt), t["gy"].to(memory_format=fmt)
    _check(t, training, [True, True, True])
    t["gy"] = t["gy"].contiguous()  # mixed layouts: the strided path
    _check(t, training, [True, True, True], strides=False)


def test_noncontiguous_and_no_weight() -> None:
    t = _inputs((2, 6, 5, 14))
    t["x"], t["gy"] = t["x"][..., ::2], t["gy"][..., 1::2]
    _check(t, True, [True, True, True])
    _check(t, True, [True, False, False], weight=False)
    _check(_inputs((3, 4, 6)), False, [True, True, True], weight=False)


@pytest.mark.parametrize(
    "mask", [[True, False, False], [False, True, False], [False, False, True], [False, True, True]]
)
def test_output_masks(mask: list[bool]) -> None:
    _check(_inputs((3, 4, 5, 6)), True, mask)


def test_non_finite() -> None:
    # (no empty batch: PyTorch's meta function divides by the element count, and its CPU kernel
    # dies of SIGFPE, so such a node never reaches an engine)
    t = _inputs((2, 4, 5, 5))
    t["gy"][0, 1, 2, 3] = float("nan")
    t["x"][1, 2, 0, 0] = float("inf")
    _check(t, True, [True, True, True])
    _check(t, False, [True, True, True])


def test_through_autograd_of_batch_norm() -> None:
    """The gradients of F.batch_norm in training mode, as AOTAutograd's backward graph computes them."""
    x, gy = randn(4, 5, 6, 7), randn(4, 5, 6, 7, seed=1)
    w, b = torch.rand(5) + 0.5, randn(5, seed=2)

    def grads(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, gy: torch.Tensor) -> Any:
        x, w, b = (v.detach().requires_grad_() for v in (x, w, b))
        y = F.batch_norm(x, None, None, w, b, training=True)
        return torch.autograd.grad(y, (x, w, b), gy)

    want = grads(x, w, b, gy)
    fn = _op(True, [True, True, True], True)
    mean, var = x.mean((0, 2, 3)), x.var((0, 2, 3), unbiased=False)
    got = run_native(fn, gy, x, w, torch.zeros(5), torch.ones(5), mean, 1 / torch.sqrt(var + 1e-5))
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e, **TOL)
