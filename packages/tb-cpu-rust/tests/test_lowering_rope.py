"""Rotary position embedding (transformers' ``apply_rotary_pos_emb``: ``x * cos +
rotate_half(x) * sin``) lowered as one elementwise sweep per tensor, against eager PyTorch:
query and key layouts as attention makes them (transposed, grouped-query heads), cos / sin
broadcast over batch and heads, NaN / inf; near misses of the pattern lower node by node."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from native_helpers import randn, run_native


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


def _ew_count(specs: list[dict[str, Any]]) -> int:
    return sum(1 for spec in specs for s in spec["steps"] if s["op"] == "ew")


@pytest.mark.parametrize("b,h,hk,seq,d", [(4, 4, 2, 64, 64), (1, 2, 2, 7, 2), (2, 8, 1, 33, 128), (3, 3, 3, 5, 10)])
def test_rope_matches_eager_in_one_sweep_per_tensor(
    lowered: list[dict[str, Any]], b: int, h: int, hk: int, seq: int, d: int
) -> None:
    # projections viewed as (B, L, H, D) and transposed, as attention layers do
    q = randn(b, seq, h, d, seed=1).transpose(1, 2)
    k = randn(b, seq, hk, d, seed=2).transpose(1, 2)
    cos, sin = randn(1, seq, d, seed=3), randn(1, seq, d, seed=4)
    want = rope(q, k, cos, sin)
    got = run_native(rope, q, k, cos, sin)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)  # the same float operations, in order
    assert _ew_count(lowered) == 2, [s["op"] for spec in lowered for s in spec["steps"]]


def test_rope_with_per_batch_cos_sin_and_operand_order_swapped(lowered: list[dict[str, Any]]) -> None:
    q = randn(3, 4, 9, 16, seed=5)
    cos, sin = randn(3, 9, 16, seed=6), randn(3, 9, 16, seed=7)

    def f(q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        return (s * rotate_half(q)) + (c * q)

    torch.testing.assert_close(run_native(f, q, cos, sin), f(q, cos, sin), rtol=0, atol=0)
    assert _ew_count(lowered) == 1


def test_rope_propagates_nan_and_infinity() -> None:
    q, k = randn(1, 2, 6, 8, seed=8), randn(1, 2, 6, 8, seed=9)
    cos, sin = randn(1, 6, 8, seed=10), randn(1, 6, 8, seed=11)
    q[0, 1, 2, 3] = float("nan")
    k[0, 0, 4, 6] = float("inf")
    sin[0, 1, 5] = float("-inf")
    want = rope(q, k, cos, sin)
    for g, w in zip(run_native(rope, q, k, cos, sin), want):
        torch.testing.assert_close(g, w, equal_nan=True)


def test_near_misses_lower_node_by_node(lowered: list[dict[str, Any]]) -> None:
    """A rotated half read elsewhere too, or halves in the other order: not the pattern, still
    right."""
    q = randn(2, 3, 5, 8, seed=12)
    cos, sin = randn(1, 5, 8, seed=13), randn(1, 5, 8, seed=14)

    def shared(q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        r = rotate_half(q)
        return q * cos + r * sin, r

    def swapped(q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x1, x2 = q[..., :4], q[..., 4:]
        return q * cos + torch.cat((x1, -x2), dim=-1) * sin

    for f in (shared, swapped):
        lowered.clear()
        got, want = run_native(f, q, cos, sin), f(q, cos, sin)
        torch.testing.assert_close(got, want)
        assert _ew_count(lowered) > 1


def test_empty_sequence() -> None:
    q, k = torch.zeros(2, 4, 0, 8), torch.zeros(2, 2, 0, 8)
    cos, sin = torch.zeros(1, 0, 8), torch.zeros(1, 0, 8)
    for g, w in zip(run_native(rope, q, k, cos, sin), rope(q, k, cos, sin)):
        torch.testing.assert_close(g, w)
