"""int64 on the wgpu engine, against eager PyTorch, in both representations: WGSL ``i64`` (the
adapter's ``shader-int64`` feature) and the ``vec2<u32>`` emulation used without it (forced here
on the same device). Every case runs natively (``fallback="error"``) and compares exactly:
integer results have no tolerance, and int64 -> float32 conversions are rounded once, as torch's.

Values are chosen where an implementation through 32 bits would be wrong: beyond +-2^31, carries
between the two words, wrapping at +-2^63, and words that compare differently signed/unsigned.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch

import torchburn
from tb_wgpu.device import context

MODES = ["native", "emulated"]
BIG = [
    0,
    1,
    -1,
    2**31 - 1,
    2**31,
    -(2**31),
    -(2**31) - 1,
    2**32 - 1,
    2**32,
    2**32 + 1,
    3_000_000_000,
    -3_000_000_000,
    2**53 + 1,
    -(2**53) - 3,
    2**62 + 12345,
    2**63 - 1,
    -(2**63),
    0x0000_0001_FFFF_FFFF,
    0x7FFF_FFFF_0000_0000,
    -0x0000_0001_0000_0001,
]


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> Iterator[str]:
    ctx = context()
    if request.param == "native" and not ctx.shader_int64:
        pytest.skip("the adapter has no shader-int64; the emulated case covers it")
    saved = ctx.shader_int64
    ctx.shader_int64 = request.param == "native"
    torchburn.clear_cache()  # a cached program would keep the other representation
    try:
        yield request.param
    finally:
        ctx.shader_int64 = saved
        torchburn.clear_cache()


def _run(fn: Callable[..., object], *args: torch.Tensor, native: set[str]) -> None:
    torch._dynamo.reset()
    compiled = torch.compile(
        fn, backend="torchburn", options={"engine": "wgpu", "fallback": "error", "warn": False, "cache": False}
    )
    torchburn.reset_stats()
    actual = compiled(*args)
    expected = fn(*args)
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)
    cov = torchburn.op_coverage(by_engine=True)
    ran = {k.split(":", 1)[1] for k in cov["native"] if k.startswith("wgpu:")}
    assert native <= ran, (native - ran, cov)
    assert not cov["fallback"], cov


def _big(*shape: int, seed: int = 0) -> torch.Tensor:
    """Random int64 over the whole range, with the edge values of BIG at the front."""
    g = torch.Generator().manual_seed(seed)
    n = 1
    for s in shape:
        n *= s
    lo = torch.randint(0, 2**32, (n,), generator=g, dtype=torch.int64)
    hi = torch.randint(-(2**31), 2**31, (n,), generator=g, dtype=torch.int64)
    t = hi * 2**32 + lo
    edge = torch.tensor(BIG[:n], dtype=torch.int64)
    t[: len(edge)] = edge
    return t.reshape(shape)


def test_arithmetic_wraps_like_torch(mode: str) -> None:
    def f(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return a + b, a - b, a * b, -a, torch.abs(a), torch.maximum(a, b), torch.minimum(a, b), a + b * 3

    a = _big(len(BIG))
    b = _big(len(BIG), seed=1).flip(0)
    _run(f, a, b, native={"aten.add.Tensor", "aten.sub.Tensor", "aten.mul.Tensor", "aten.neg.default"})


def test_broadcast_scalars_and_non_contiguous(mode: str) -> None:
    def f(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        at = a.t()  # strided operand
        return at * b + 7_000_000_000, 5 - at, torch.sub(at, b, alpha=3), (at - 1) * -2

    a = _big(6, 9)
    b = _big(9, 1, seed=2)[:, 0].reshape(9, 1)
    _run(f, a, b, native={"aten.mul.Tensor", "aten.add.Tensor", "aten.sub.Tensor"})


def test_comparisons_where_and_logic(mode: str) -> None:
    def f(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, ...]:
        lt = a < b
        return (
            c < a,  # int32 against int64 compares in int64
            c > 5,
            (a > 0) == (b < 0),  # bool against bool
            torch.where(lt, a > 0, b > 0),
            lt,
            a <= b,
            a > b,
            a >= b,
            a == b,
            a != b,
            a > 2**31,
            a <= -3_000_000_000,
            a > 0.5,  # a float scalar compares in float32, as torch promotes
            torch.where(lt & (a != 0), a, b),
        )

    vals = torch.tensor(BIG, dtype=torch.int64)
    # every pair of edge values, including equal ones and words that differ only high or low
    a = vals.repeat_interleave(len(BIG))
    b = vals.repeat(len(BIG))
    c = torch.randint(-(2**31), 2**31, a.shape, generator=torch.Generator().manual_seed(6), dtype=torch.int32)
    _run(f, a, b, c, native={"aten.lt.Tensor", "aten.eq.Tensor", "aten.gt.Scalar", "aten.where.self"})


def test_conversions(mode: str) -> None:
    def f(a: torch.Tensor, x: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return a.float(), x.long(), m.long() + a, a.bool(), (a.float() * 0.25).long(), x + a  # in range: no UB

    a = torch.tensor(
        [*BIG, 16_777_217, 16_777_219, -16_777_217, 2**40 + 2**16 + 1, 2**40 + 2**16, 2**40 + 2**16 * 3, 7, 0],
        dtype=torch.int64,
    )
    n = a.numel()
    g = torch.Generator().manual_seed(3)
    x = torch.cat([torch.tensor([0.5, -0.5, -1.7, 2.9, 3e9, -3e9, 1e18, -1e18, 4294967296.0, -4294967296.0]),
                   torch.randn(n - 10, generator=g) * 1e6])  # fmt: skip
    m = torch.arange(n) % 3 == 0
    _run(f, a, x, m, native={"aten._to_copy.default"})


def test_full_cat_clone_and_empty(mode: str) -> None:
    def f(a: torch.Tensor, e: torch.Tensor) -> tuple[torch.Tensor, ...]:
        full = torch.full((2, 3), -(2**40), dtype=torch.int64)
        return torch.cat([a, full, a[:, :1] + 1], dim=1), e + 1, a.clone() * 2

    _run(f, _big(2, 5), torch.zeros(0, 4, dtype=torch.int64), native={"aten.cat.default", "aten.full.default"})


def test_arange(mode: str) -> None:
    def f(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            torch.arange(13) + x,
            torch.arange(3_000_000_000, 3_000_000_010, 3),
            torch.arange(2**40, 2**40 - 50, -7),
            torch.arange(-5, 0),
            torch.arange(0, dtype=torch.int64),
            torch.arange(-3, 40, 2, dtype=torch.float32) * x,  # float arange with integer steps
            torch.arange(16_777_200, 16_777_230, 1, dtype=torch.float32),  # rounded once past 2^24
            torch.arange(5.0, dtype=torch.float32),
        )

    _run(f, torch.tensor(1, dtype=torch.int64), native={"aten.arange.start_step"})


def test_cumsum_of_bool_and_int64(mode: str) -> None:
    def f(m: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, ...]:
        empty = torch.cumsum(a[:0], dim=0)
        return torch.cumsum(m, dim=-1), torch.cumsum(a, dim=0), torch.cumsum(a.t(), dim=1), empty

    g = torch.Generator().manual_seed(4)
    m = torch.rand(3, 40, generator=g) > 0.3
    a = torch.randint(-(2**40), 2**40, (37, 4), generator=g)
    a[0, 0] = 2**62  # the sums cross 2^62 and wrap past 2^63 where torch does
    a[1, 0] = 2**62
    _run(f, m, a, native={"aten.cumsum.default"})


def test_gathers_and_splits_of_int64_data(mode: str) -> None:
    def f(a: torch.Tensor, idx: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        p, q = a.split([2, 3], dim=1)  # views; gpt2 splits its fused qkv this way
        r, s = x.t().split(3, dim=0)  # split.Tensor of a strided float view
        return (
            torch.gather(a, 1, idx),  # bert gathers its int64 token_type_ids buffer
            torch.index_select(a, 0, idx[:, 1]),
            p * 2,
            q + 1,
            r * 2,
            s + 1,
        )

    a = _big(4, 5)
    idx = torch.tensor([[4, 0], [1, 1], [0, 3], [3, 2]])
    _run(
        f,
        a,
        idx,
        torch.randn(4, 6),
        native={"aten.gather.default", "aten.index_select.default", "aten.split_with_sizes.default"},
    )


def test_integer_reductions(mode: str) -> None:
    def f(m: torch.Tensor, a: torch.Tensor, c: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            x[:0].sum(dim=0),  # float32 over empty rows (its storage is never written)
            m.sum(dim=-1),  # bool counts into int64
            m.sum(),
            a.sum(dim=0),  # wraps past 2^63 like torch
            a.t().sum(dim=1, keepdim=True),
            c.sum(dim=1),  # int32 into int64: no 32-bit overflow
            a.amax(dim=1),
            a.amin(dim=0),
            a[:0].sum(dim=0),  # empty rows sum to 0
        )

    g = torch.Generator().manual_seed(8)
    m = torch.rand(5, 70, generator=g) > 0.4
    a = _big(33, 6)
    c = torch.full((3, 5), 2**31 - 1, dtype=torch.int32)
    _run(f, m, a, c, torch.ones(4, 3), native={"aten.sum.dim_IntList", "aten.amax.default", "aten.amin.default"})


def test_advanced_indexing(mode: str) -> None:
    def f(x: torch.Tensor, big: torch.Tensor, i: torch.Tensor, j: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            x[i, j],  # adjacent index dims, broadcast (4, 1) x (3,)
            x[:, j],  # a leading full slice keeps its place
            x[i, :, j],  # non-adjacent: the index dims lead the result
            big[j],  # int64 data, negative indices count from the end
            big[i[:, 0]] * 2,
            x[i[:0, 0]],  # an empty index
        )

    g = torch.Generator().manual_seed(5)
    x = torch.randn(5, 6, 7, generator=g)
    big = _big(7)
    i = torch.tensor([[0], [4], [-1], [2]])
    j = torch.tensor([1, -2, 5])
    _run(f, x, big, i, j, native={"aten.index.Tensor"})


def test_causal_lm_mask_ops_run_emulated_too() -> None:
    """The tiny LM's causal mask (arange, int64 add/sub, cat, cumsum, index, compares) with no
    shader-int64: the whole model natively, matching eager."""
    pytest.importorskip("transformers")
    from torchburn.testing.models import MODELS

    ctx = context()
    saved = ctx.shader_int64
    ctx.shader_int64 = False
    torchburn.clear_cache()
    try:
        model, args = MODELS["tiny_causal_lm"]()
        torch._dynamo.reset()
        compiled = torch.compile(
            model, backend="torchburn", options={"engine": "wgpu", "fallback": "error", "warn": False, "cache": False}
        )
        torchburn.reset_stats()
        with torch.no_grad():
            torch.testing.assert_close(compiled(*args), model(*args), rtol=1e-4, atol=1e-4)
        cov = torchburn.op_coverage(by_engine=True)
        assert not cov["fallback"], cov
        ran = {k.split(":", 1)[1] for k in cov["native"] if k.startswith("wgpu:")}
        assert {"aten.arange.start_step", "aten.index.Tensor", "aten.cumsum.default", "aten.le.Tensor"} <= ran
    finally:
        ctx.shader_int64 = saved
        torchburn.clear_cache()


def test_device_is_opened_with_shader_int64_when_offered() -> None:
    ctx = context()
    offered = "shader-int64" in ctx.adapter.features
    assert ctx.shader_int64 == offered
    assert ("shader-int64" in ctx.device.features) == offered
    assert ctx.describe()["shader-int64"] == offered


def test_each_mode_compiles_its_own_representation(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The emulated run must not quietly use WGSL i64 (nor the native run the emulation)."""
    ctx = context()
    sources: list[str] = []
    real = ctx.pipeline

    def record(key: str, source: str, n_in: int, n_out: int) -> object:
        sources.append(source)
        return real(key, source, n_in, n_out)

    monkeypatch.setattr(ctx, "pipeline", record)
    _run(lambda a, b: (a * b) > a, _big(9), _big(9, seed=1), native={"aten.mul.Tensor", "aten.gt.Tensor"})
    int64_kernels = [s for s in sources if "tb_i64" in s]
    assert int64_kernels
    alias = "alias tb_i64 = i64;" if mode == "native" else "alias tb_i64 = vec2<u32>;"
    assert all(alias in s for s in int64_kernels), int64_kernels


def test_fractional_arange_is_refused_with_a_reason() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.arange(0.0, 1.0, 0.1) + x

    torch._dynamo.reset()
    explanation = torchburn.explain(f, torch.ones(10), options={"engine": "wgpu"})
    reasons = {r for rs in explanation.fallback_reasons.values() for r in rs}
    assert any("fractional" in r for r in reasons), str(explanation)
