"""tb_cpu_rust._native.unary_f32: the eager one-op entry (turbo_torch.sin & co.), against PyTorch.

Property-based at the boundary: random lengths, values (NaN/±inf/huge/tiny/signed zeros), in
place or not; every op of the table against the torch function of the same name.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tb_cpu_rust import _native

OPS = list(_native.unary_ops())
FLOATS = st.floats(width=32, allow_nan=True, allow_infinity=True)


def _run(op: str, x: torch.Tensor, inplace: bool = False) -> torch.Tensor:
    y = x if inplace else torch.empty_like(x)
    _native.unary_f32(OPS.index(op), x, y)
    return y


def test_table_names_torch_functions() -> None:
    assert set(OPS) >= {"sin", "cos", "tanh"}
    for op in OPS:
        assert callable(getattr(torch, op))


@pytest.mark.parametrize("op", OPS)
@settings(max_examples=40, deadline=None)
@given(values=st.lists(FLOATS, max_size=300), inplace=st.booleans())
def test_matches_torch_on_random_values(op: str, values: list[float], inplace: bool) -> None:
    x = torch.tensor(values, dtype=torch.float32)
    want = getattr(torch, op)(x)
    got = _run(op, x.clone(), inplace)
    torch.testing.assert_close(got, want, equal_nan=True)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 255, 4096, 65535, 65536 * 2 + 3])
def test_matches_torch_at_every_length_and_across_threads(op: str, n: int) -> None:
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=g) * 10
    if n > 20:
        x[:12] = torch.tensor([0.0, -0.0, math.nan, math.inf, -math.inf, 1e-30, 3e38, -3e38, 7e4, -1e5, 1.5, 88.0])
    torch.testing.assert_close(_run(op, x), getattr(torch, op)(x), equal_nan=True)
    torch.testing.assert_close(_run(op, x.clone(), inplace=True), getattr(torch, op)(x), equal_nan=True)


@pytest.mark.parametrize("op", ["sin", "cos"])
def test_trig_over_the_reduction_range(op: str) -> None:
    # dense over [-2^17, 2^17]: the vector reduction below 65536 and the scalar path above it
    x = torch.linspace(-(2.0**17), 2.0**17, 1_000_003)
    want = getattr(torch, op)(x.double()).float()
    torch.testing.assert_close(_run(op, x), want, atol=2e-6, rtol=0)


def test_bad_calls_raise() -> None:
    x = torch.randn(4)
    with pytest.raises(ValueError, match="unknown unary op"):
        _native.unary_f32(len(OPS), x, x)
    with pytest.raises(TypeError, match=r"dst: expected a torch\.Tensor, got int"):
        _native.unary_f32(0, x, x.data_ptr())
    with pytest.raises(ValueError, match="not aligned"):
        _native.unary_f32(0, x, torch.frombuffer(bytearray(17), dtype=torch.float32, offset=1, count=4))
    base = torch.randn(5)
    with pytest.raises(ValueError, match="overlaps"):
        _native.unary_f32(0, base[:4], base[1:])
    with pytest.raises(ValueError, match="3 elements where src has 4"):
        _native.unary_f32(0, x, torch.empty(3))
    with pytest.raises(ValueError, match="contiguous"):
        _native.unary_f32(0, x, torch.empty(8)[::2])
    with pytest.raises(OverflowError):
        _native.unary_f32(-1, x, x)


# -- the checked kernels other engines get (NativeCpuEngine.eager_kernel, torchburn.interop) ----
def _kernel(op: str) -> object:
    from tb_cpu_rust.engine import NativeCpuEngine

    fn = NativeCpuEngine().eager_kernel(f"aten.{op}.default", torch.float32)
    assert fn is not None, op
    return fn


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("shape", [(), (0,), (1,), (9,), (3, 0, 5), (64, 64), (513, 130)], ids=str)
def test_eager_kernel_matches_torch(op: str, shape: tuple[int, ...]) -> None:
    g = torch.Generator().manual_seed(len(shape))
    x = torch.randn(shape, generator=g) * 6
    if x.numel() > 6:
        x.view(-1)[:6] = torch.tensor([0.0, -0.0, math.nan, math.inf, -math.inf, 3e38])
    y = _kernel(op)(x)  # type: ignore[operator]
    want = getattr(torch, op)(x)
    assert y.data_ptr() != x.data_ptr() or x.numel() == 0
    assert y.shape == want.shape and y.stride() == want.stride() and y.dtype == torch.float32
    torch.testing.assert_close(y, want, equal_nan=True)


def test_eager_kernel_is_offered_only_for_its_ops_and_float32() -> None:
    from tb_cpu_rust.engine import NativeCpuEngine

    engine = NativeCpuEngine()
    assert engine.eager_kernel("aten.sin.default", torch.float64) is None
    assert engine.eager_kernel("aten.gelu.default", torch.float32) is None
    assert engine.eager_kernel("aten.sin.out", torch.float32) is None


@pytest.mark.parametrize("op", OPS)
def test_eager_kernel_refuses_what_it_cannot_read(op: str) -> None:
    fn = _kernel(op)

    class Sub(torch.Tensor):
        pass

    x = torch.randn(6, 4)
    cases: list[tuple[object, type[Exception], str]] = [
        (x.double(), ValueError, "dtype torch.float64"),
        (x.t(), ValueError, "non-contiguous"),
        (x[:, ::2], ValueError, "non-contiguous"),
        (torch._neg_view(x), ValueError, "negated"),
        (x.to_sparse(), ValueError, "layout"),
        (torch.empty(6, 4, device="meta"), ValueError, "device meta"),
        (x.as_subclass(Sub), TypeError, "subclass"),
        (x.tolist(), TypeError, "takes a tensor"),
        (torch.arange(4), ValueError, "dtype torch.int64"),
    ]
    for bad, error, message in cases:
        with pytest.raises(error, match=message):
            fn(bad)  # type: ignore[operator]
