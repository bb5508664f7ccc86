"""scaled_dot_product_attention on native_cpu across query-block boundaries (tasks take 128
query rows), causal with fewer or more keys than queries, masks (boolean with fully masked
rows, additive float), non-contiguous inputs and a custom scale, against eager PyTorch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from torchburn.testing import compile_with, native_and_fallback


@pytest.mark.parametrize("lq,lk", [(1, 1), (5, 300), (127, 127), (128, 129), (257, 90), (300, 300)])
@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_query_blocks_match_eager(lq: int, lk: int, causal: bool) -> None:
    g = torch.Generator().manual_seed(lq * 1000 + lk)
    q = torch.randn(2, 3, lq, 24, generator=g)
    k, v = torch.randn(2, 3, lk, 24, generator=g), torch.randn(2, 3, lk, 20, generator=g)

    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    fn, reports = compile_with("native_cpu", f)
    torch.testing.assert_close(fn(q, k, v), f(q, k, v), rtol=1e-4, atol=1e-5)
    assert not native_and_fallback(reports)[1]


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_sdpa_masks_and_fully_masked_rows_match_eager(kind: str) -> None:
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 200, 16, generator=g) for _ in range(3))
    if kind == "bool":
        m = torch.rand(200, 200, generator=g) > 0.3
        m[7] = False  # a row that sees no key
        m[150, :] = False
        m[150, 3] = True  # one key: its softmax sum is exactly 1
    else:
        m = torch.randn(200, 200, generator=g) * 3

    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.3)

    fn, reports = compile_with("native_cpu", f)
    torch.testing.assert_close(fn(q, k, v, m), f(q, k, v, m), rtol=1e-4, atol=1e-5, equal_nan=True)
    assert not native_and_fallback(reports)[1]


def test_sdpa_non_contiguous_inputs_match_eager() -> None:
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 160, 4, 32, generator=g).transpose(1, 2) for _ in range(3))

    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    fn, _ = compile_with("native_cpu", f)
    torch.testing.assert_close(fn(q, k, v), f(q, k, v), rtol=1e-4, atol=1e-5)
