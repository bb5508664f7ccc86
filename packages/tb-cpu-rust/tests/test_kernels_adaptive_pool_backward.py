"""aten._adaptive_avg_pool2d_backward on native_cpu against PyTorch: the kernel (kernels/conv/mod.rs,
step ``adaptive_avg_pool2d_bwd``) and its lowering (lowering/conv_pool.py)."""

from __future__ import annotations

import pytest
import torch
from native_helpers import randn, run_native

from torchburn.testing.conformance import compile_with, native_and_fallback

OP = "aten._adaptive_avg_pool2d_backward.default"


def _backward(g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return torch.ops.aten._adaptive_avg_pool2d_backward(g, x)


def _case(shape: tuple[int, ...], out: tuple[int, int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    x = randn(*shape, seed=seed)
    return randn(*shape[:-2], *out, seed=seed + 1), x


@pytest.mark.parametrize(
    ("shape", "out"),
    [
        ((2, 3, 8, 9), (3, 4)),  # windows of 2-3 rows / 2-3 columns, overlapping
        ((2, 3, 8, 9), (1, 1)),  # global average pooling (ResNet's head)
        ((2, 3, 8, 9), (8, 9)),  # the identity
        ((1, 2, 7, 5), (5, 7)),  # fewer inputs than cells along W: one input in several windows
        ((4, 1, 1, 1), (1, 1)),
        ((1, 1, 1, 6), (1, 4)),
        ((3, 7, 6), (2, 4)),  # unbatched (C, H, W)
    ],
)
def test_matches_torch_bit_for_bit(shape: tuple[int, ...], out: tuple[int, int]) -> None:
    g, x = _case(shape, out)
    # the same divisions and additions in the same order as PyTorch's CPU kernel: equal bits
    torch.testing.assert_close(run_native(_backward, g, x), _backward(g, x), rtol=0, atol=0)


def test_strided_grad_and_empty_batch() -> None:
    g, x = _case((2, 3, 6, 10), (4, 5), seed=3)
    channels_last = g.contiguous(memory_format=torch.channels_last)
    transposed = g.transpose(2, 3).contiguous().transpose(2, 3)
    for grad in (channels_last, transposed, g[:, ::2]):
        want = _backward(grad, x[:, : grad.shape[1]])
        torch.testing.assert_close(run_native(_backward, grad, x[:, : grad.shape[1]]), want, rtol=0, atol=0)
    empty_g, empty_x = torch.randn(0, 3, 2, 2), torch.randn(0, 3, 4, 4)
    got = run_native(_backward, empty_g, empty_x)
    assert got.shape == (0, 3, 4, 4)


def test_nan_and_inf_reach_every_input_of_their_window() -> None:
    g, x = _case((1, 2, 5, 5), (3, 3), seed=5)
    g[0, 0, 1, 1] = float("nan")
    g[0, 1, 0, 2] = float("inf")
    g[0, 1, 2, 0] = float("-inf")
    torch.testing.assert_close(run_native(_backward, g, x), _backward(g, x), rtol=0, atol=0, equal_nan=True)


def test_runs_natively_and_float64_falls_back_with_the_same_result() -> None:
    g, x = _case((2, 3, 8, 9), (3, 4), seed=7)
    compiled, reports = compile_with("native_cpu", _backward, cache=False)
    compiled(g, x)
    native, fallback = native_and_fallback(reports)
    assert OP in native and OP not in fallback
    g64, x64 = g.double(), x.double()
    compiled, reports = compile_with("native_cpu", _backward, cache=False, fallback="eager")
    torch.testing.assert_close(compiled(g64, x64), _backward(g64, x64), rtol=0, atol=0)
    assert OP in native_and_fallback(reports)[1]


def test_a_training_step_through_adaptive_average_pooling_matches_eager() -> None:
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d((2, 3)), torch.nn.Flatten())
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d((2, 3)), torch.nn.Flatten())
    model.load_state_dict(ref.state_dict())
    compiled, reports = compile_with("native_cpu", model, cache=False, fallback="eager")
    x = torch.randn(5, 3, 9, 11)
    ref(x).square().sum().backward()
    compiled(x).square().sum().backward()
    for p, q in zip(ref.parameters(), model.parameters()):
        assert q.grad is not None and p.grad is not None
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5)
    assert OP in native_and_fallback(reports)[0]
