"""scaled_dot_product_attention with grouped-query heads (fewer key/value heads than query heads,
as Qwen2 and Llama use) on native_cpu against eager PyTorch: causal or not, with masks, across
query blocks, non-contiguous operands; heads that do not divide stay eager with their reason.
Also the softmax rows' flush of sub-normal probabilities (very negative additive masks)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from torchburn.testing import compile_with, native_and_fallback


def _qkv(b: int, h: int, hk: int, lq: int, lk: int, e: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(b, h, lq, e, generator=g),
        torch.randn(b, hk, lk, e, generator=g),
        torch.randn(b, hk, lk, e, generator=g),
    )


@pytest.mark.parametrize("h,hk", [(4, 2), (6, 3), (8, 1), (4, 4)])
@pytest.mark.parametrize("lq,lk", [(1, 1), (9, 9), (64, 64), (130, 70), (40, 200)])
@pytest.mark.parametrize("causal", [False, True])
def test_grouped_query_sdpa_matches_eager(h: int, hk: int, lq: int, lk: int, causal: bool) -> None:
    q, k, v = _qkv(2, h, hk, lq, lk, 16, seed=h * 100 + lq + lk)

    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)

    fn, reports = compile_with("native_cpu", f)
    torch.testing.assert_close(fn(q, k, v), f(q, k, v), rtol=1e-4, atol=1e-5)
    native, fallback = native_and_fallback(reports)
    assert not fallback, fallback
    assert "aten._scaled_dot_product_flash_attention_for_cpu.default" in native, native


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_grouped_query_sdpa_with_a_mask_and_non_contiguous_operands(kind: str) -> None:
    g = torch.Generator().manual_seed(21)
    x = torch.randn(2, 33, 4, 16, generator=g)  # (B, L, H, E): heads transposed in, strided
    kv = torch.randn(2, 33, 2, 32, generator=g)
    if kind == "bool":
        m = torch.rand(33, 33, generator=g) > 0.4
        m[5] = False  # a row that sees no key: zeros, as eager gives
    else:
        m = torch.randn(2, 1, 33, 33, generator=g)

    def f(x: torch.Tensor, kv: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        q = x.transpose(1, 2)
        k, v = kv[..., :16].transpose(1, 2), kv[..., 16:].transpose(1, 2)
        return F.scaled_dot_product_attention(torch.tanh(q), k, v, attn_mask=m, enable_gqa=True) * 2.0

    fn, reports = compile_with("native_cpu", f)
    torch.testing.assert_close(fn(x, kv, m), f(x, kv, m), rtol=1e-4, atol=1e-5, equal_nan=True)
    assert not native_and_fallback(reports)[1]


def test_heads_that_do_not_divide_raise_as_eager_does() -> None:
    """3 key/value heads for 4 query heads: eager refuses it, and so does the compiled call."""
    q, k, v = _qkv(1, 4, 3, 5, 5, 8, seed=2)

    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    with pytest.raises(RuntimeError):
        f(q, k, v)
    fn, _ = compile_with("native_cpu", f)
    with pytest.raises(RuntimeError):
        fn(q, k, v)


def test_the_lowering_check_names_head_counts_that_do_not_divide() -> None:
    from types import SimpleNamespace

    from tb_cpu_rust.lowering.attention import _sdpa_check

    def meta(*shape: int) -> SimpleNamespace:
        return SimpleNamespace(shape=shape)

    info = SimpleNamespace(args=(None, None, None), inputs=[meta(1, 4, 5, 8), meta(1, 3, 5, 8), meta(1, 3, 5, 8)])
    reason = _sdpa_check(info)
    assert reason is not None and "4 query heads, 3 key heads" in reason, reason
    info.inputs = [meta(1, 4, 5, 8), meta(1, 2, 5, 8), meta(1, 2, 5, 8)]
    assert _sdpa_check(info) is None
    info.inputs = [meta(1, 4, 5, 8), meta(1, 2, 5, 8), meta(1, 4, 5, 8)]
    assert _sdpa_check(info) is not None


@pytest.mark.parametrize("causal", [False, True])
def test_very_negative_scores_flush_to_zero_probabilities(causal: bool) -> None:
    """An additive mask of -90..-100 makes exp(score - max) sub-normal: those probabilities are
    flushed to 0 (below 1.2e-38 each), which no comparison with eager can tell apart; a row whose
    every score is that low is still normalised by its own maximum, so it is not flushed."""
    q, k, v = _qkv(1, 2, 2, 48, 48, 16, seed=7)
    g = torch.Generator().manual_seed(8)
    m = torch.where(torch.rand(48, 48, generator=g) > 0.5, -90.0 - 10 * torch.rand(48, 48, generator=g), 0.0)
    m[3] = -95.0 - torch.rand(48, generator=g)  # the whole row very negative

    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        return (
            F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=False)
            if not causal
            else (
                F.scaled_dot_product_attention(
                    q, k, v, attn_mask=m + torch.triu(torch.full((48, 48), float("-inf")), 1)
                )
            )
        )

    fn, reports = compile_with("native_cpu", f)
    torch.testing.assert_close(fn(q, k, v, m), f(q, k, v, m), rtol=1e-4, atol=1e-5)
    assert not native_and_fallback(reports)[1]


def test_nan_and_infinite_inputs_propagate_as_in_eager() -> None:
    q, k, v = _qkv(1, 4, 2, 10, 10, 8, seed=9)
    q[0, 1, 3, 2] = float("nan")
    v[0, 0, 4, 1] = float("inf")

    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    fn, _ = compile_with("native_cpu", f)
    torch.testing.assert_close(fn(q, k, v), f(q, k, v), rtol=1e-4, atol=1e-5, equal_nan=True)


_NAN_ROW_SCRIPT = """
import torch, torch.nn.functional as F
from torchburn.testing import compile_with
g = torch.Generator().manual_seed(9)
q, k, v = (torch.randn(1, h, 10, 8, generator=g) for h in (4, 2, 2))
q[0, 1, 3, 2] = float("nan")  # every score of that query row NaN
v[0, 0, 4, 1] = float("inf")
for causal in (True, False):
    f = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    fn, _ = compile_with("native_cpu", f)
    want = f(q, k, v)
    torch.testing.assert_close(fn(q, k, v), want, rtol=1e-4, atol=1e-5, equal_nan=True)
    print(torch.backends.cpu.get_cpu_capability(), causal, int(want[0, 1, 3].isnan().sum()))
"""


@pytest.mark.parametrize("capability", ["avx512", "avx2", "default"])
def test_a_nan_query_row_matches_eager_of_each_cpu_capability(capability: str) -> None:
    """Eager's own answer for a query row whose every score is NaN depends on the kernels torch
    runs: its AVX-512 ones read the row as fully masked (0, NaN where a value is infinite), its
    AVX2 and baseline ones give NaN. Each capability in a fresh process (``ATEN_CPU_CAPABILITY``
    is read once); a CPU without AVX-512 runs its best one under "avx512", still against eager."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "ATEN_CPU_CAPABILITY": capability, "TORCHBURN_CACHE_DIR": "0"}
    out = subprocess.run([sys.executable, "-c", _NAN_ROW_SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.split()
    assert len(lines) == 6, out.stdout
    # the NaN row: all 8 outputs NaN (AVX2 / baseline) or only the infinite value's column (AVX-512)
    assert lines[2] == lines[5] == ("1" if lines[0].upper().startswith("AVX512") else "8"), out.stdout


def test_empty_batch_or_sequence() -> None:
    for b, lq in [(0, 5), (2, 0)]:
        q, k, v = _qkv(b, 4, 2, lq, 6, 8, seed=1)

        def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

        fn, _ = compile_with("native_cpu", f)
        torch.testing.assert_close(fn(q, k, v), f(q, k, v))
