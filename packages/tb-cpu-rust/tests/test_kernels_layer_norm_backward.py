"""aten.native_layer_norm_backward on native_cpu against PyTorch: 1-d and 2-d normalised shapes,
with and without weight and bias, non-contiguous inputs, a masked-out input gradient, and the
op running natively (it used to fall back to eager in every training graph with a LayerNorm)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import torchburn

OP = "aten.native_layer_norm_backward.default"


def _grads(ln: torch.nn.LayerNorm, x: torch.Tensor, gy: torch.Tensor, compiled: bool) -> list[torch.Tensor]:
    x = x.detach().clone().requires_grad_(True)
    for p in ln.parameters():
        p.grad = None
    fn: Any = ln
    if compiled:
        torch._dynamo.reset()
        fn = torch.compile(
            ln, backend="torchburn", options={"engine": "native_cpu", "warn": False, "fallback": "error"}
        )
    fn(x).backward(gy)
    assert x.grad is not None
    return [x.grad, *(p.grad for p in ln.parameters() if p.grad is not None)]


@pytest.mark.parametrize(
    ("shape", "normalized"),
    [((4, 6), (6,)), ((2, 3, 8), (8,)), ((2, 3, 4), (3, 4)), ((1, 1), (1,)), ((3, 130), (130,)), ((0, 5), (5,))],
)
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_backward_matches_torch(shape: tuple[int, ...], normalized: tuple[int, ...], affine: bool) -> None:
    g = torch.Generator().manual_seed(11)
    ln = torch.nn.LayerNorm(normalized, elementwise_affine=affine)
    if affine:
        with torch.no_grad():
            ln.weight.copy_(torch.randn(normalized, generator=g))
            ln.bias.copy_(torch.randn(normalized, generator=g))
    x = torch.randn(*shape, generator=g) * 3 + 1
    gy = torch.randn(*shape, generator=g)
    torchburn.reset_stats()
    got = _grads(ln, x, gy, compiled=True)
    cov = torchburn.op_coverage()
    want = _grads(ln, x, gy, compiled=False)
    assert len(got) == len(want) == (3 if affine else 1)
    for a, b in zip(got, want):
        # N == 1: x - mean is eager's rounding error in its mean times rstd = 1/sqrt(eps) (~1e-5)
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-4 if normalized == (1,) else 1e-5)
    if x.numel():
        assert any(op.endswith(OP) for op in cov["native"]), cov
    assert not cov["fallback"], cov["fallback"]


def test_layer_norm_backward_of_a_non_contiguous_input() -> None:
    g = torch.Generator().manual_seed(12)
    ln = torch.nn.LayerNorm(5)

    def fn(x: torch.Tensor) -> torch.Tensor:
        return ln(x.transpose(0, 1))

    x = torch.randn(5, 4, generator=g).requires_grad_(True)
    gy = torch.randn(4, 5, generator=g)
    fn(x).backward(gy)
    want = [x.grad.clone(), ln.weight.grad.clone(), ln.bias.grad.clone()]  # type: ignore[union-attr]
    x.grad = None
    ln.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    torchburn.reset_stats()
    # the forward kernel takes contiguous rows only (it falls back); the backward reads any layout
    compiled = torch.compile(fn, backend="torchburn", options={"engine": "native_cpu", "warn": False})
    compiled(x).backward(gy)
    for a, b in zip([x.grad, ln.weight.grad, ln.bias.grad], want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert any(op.endswith(OP) for op in torchburn.op_coverage()["native"])


def test_only_the_weight_gradients_when_the_input_needs_none() -> None:
    g = torch.Generator().manual_seed(13)
    ln = torch.nn.LayerNorm(7)
    x = torch.randn(3, 7, generator=g)  # no grad: output_mask is [False, True, True]
    gy = torch.randn(3, 7, generator=g)
    ln(x).backward(gy)
    want = [ln.weight.grad.clone(), ln.bias.grad.clone()]  # type: ignore[union-attr]
    ln.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    torchburn.reset_stats()
    compiled = torch.compile(
        ln, backend="torchburn", options={"engine": "native_cpu", "warn": False, "fallback": "error"}
    )
    compiled(x).backward(gy)
    for a, b in zip([ln.weight.grad, ln.bias.grad], want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert any(op.endswith(OP) for op in torchburn.op_coverage()["native"])
