"""bfloat16 attention on native_cpu (lowering/bf16_products.py, kernels/attention_pairs.rs): a
bfloat16 ``scaled_dot_product_attention`` is widened to float32 (torchburn.low_precision) and its
``sdpa`` step marked ``bf16``, so both products take bfloat16 operands (the probabilities rounded
to bfloat16, as eager's bfloat16 flash attention rounds them) on ``vdpbf16ps`` where the CPU has
AVX-512 BF16. Against eager bfloat16 with bfloat16 tolerances, and against float64 next to eager's
own bfloat16 error: query blocks, odd sizes, causal, masks, grouped-query heads, transposed
inputs, a float16 attention left unmarked."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from torchburn.testing import compile_with, native_and_fallback

BF16 = torch.bfloat16


def _sdpa_steps(lowered: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [s for spec in lowered for s in spec["steps"] if s["op"] == "sdpa"]


def _check(
    lowered: list[dict[str, Any]], f: Callable[..., torch.Tensor], *args: torch.Tensor, marked: bool = True
) -> None:
    fn, reports = compile_with("native_cpu", f)
    got = fn(*args)
    want = f(*args)
    assert not native_and_fallback(reports)[1]
    assert got.dtype == want.dtype
    torch.testing.assert_close(got.float(), want.float(), rtol=1.6e-2, atol=1.6e-2, equal_nan=True)
    exact = f(*[a.double() if a.is_floating_point() else a for a in args])
    finite = exact.isfinite()
    err = (got.double() - exact)[finite].abs().max().item()
    eager_err = (want.double() - exact)[finite].abs().max().item()
    assert err <= 2 * eager_err + 1e-6, (err, eager_err)
    steps = _sdpa_steps(lowered)
    assert steps and all(s["bf16"] == marked for s in steps), json.dumps(steps)[:2000]


def _qkv(b: int, h: int, lq: int, lk: int, e: int, ev: int, seed: int, hk: int | None = None) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    hk = h if hk is None else hk
    return [
        t.to(BF16)
        for t in (
            torch.randn(b, h, lq, e, generator=g),
            torch.randn(b, hk, lk, e, generator=g),
            torch.randn(b, hk, lk, ev, generator=g),
        )
    ]


@pytest.mark.parametrize(
    ("lq", "lk", "e", "ev"), [(65, 65, 32, 32), (5, 131, 17, 17), (200, 130, 64, 64), (1, 1, 8, 8)]
)
@pytest.mark.parametrize("causal", [False, True])
def test_bfloat16_attention_matches_eager(
    lowered: list[dict[str, Any]], lq: int, lk: int, e: int, ev: int, causal: bool
) -> None:
    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    _check(lowered, f, *_qkv(2, 3, lq, lk, e, ev, seed=lq + lk))


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_bfloat16_attention_with_a_mask(lowered: list[dict[str, Any]], kind: str) -> None:
    q, k, v = _qkv(1, 2, 70, 70, 16, 16, seed=3)
    g = torch.Generator().manual_seed(4)
    m = torch.rand(70, 70, generator=g) > 0.3 if kind == "bool" else (torch.randn(70, 70, generator=g) * 2).to(BF16)
    if kind == "bool":
        m[5] = False
        m[5, 2] = True

    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.3)

    _check(lowered, f, q, k, v, m)


def test_bfloat16_grouped_query_and_transposed_inputs(lowered: list[dict[str, Any]]) -> None:
    """Two query heads per key / value head; q, k, v as (b, l, h, e) transposed views."""
    g = torch.Generator().manual_seed(9)
    q = torch.randn(2, 40, 4, 32, generator=g).to(BF16).transpose(1, 2)
    k, v = (torch.randn(2, 40, 2, 32, generator=g).to(BF16).transpose(1, 2) for _ in range(2))

    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    _check(lowered, f, q, k, v)


def test_float16_attention_is_not_marked(lowered: list[dict[str, Any]]) -> None:
    q, k, v = (t.to(torch.float16) for t in _qkv(1, 2, 33, 33, 16, 16, seed=1))

    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v)

    fn, _ = compile_with("native_cpu", f)
    torch.testing.assert_close(fn(q, k, v), f(q, k, v), rtol=2e-3, atol=2e-3)
    steps = _sdpa_steps(lowered)
    assert steps and not any(s["bf16"] for s in steps)
