"""turbo_torch.sin / cos / tanh: cached per element count, native where decided (both implementations).

The eager kernels come from the conftest's fake engine (tb-core's ``Engine.eager_kernel`` in pure
PyTorch, registered in-process), so these tests run with only tb-core beside this package; the
same paths on native_cpu's kernels are in ``integration_tests/test_cython_dispatch_native_unary.py``.
The timed decision is replaced by a fixed one (``native.decide``) so the tests do not depend on the
machine's speed; one test keeps the real timing and checks only that it decided.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
import torch

import torchburn
import turbo_torch
from tb_cython_dispatch import native, native_unary

OPS = native_unary.OPS
CALLS = native.HOT_AFTER + 2 * (native.WARMUP + native.SAMPLES) + 2  # enough to decide


@pytest.fixture
def native_on(impl: ModuleType, fake_engine: Any) -> Iterator[ModuleType]:
    yield impl


@pytest.fixture
def always_native(native_on: ModuleType, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.setattr(native, "decide", lambda native_ns, torch_ns: native.NATIVE)
    return native_on


def _entry(op: str, x: torch.Tensor) -> Any:
    """The native slot of op's entry for x's element count (None when it can never be native)."""
    from turbo_torch import _unary

    return _unary._cells[op][1].lookup(None, x.numel())[0]


def _spy(kernel: Any, seen: list[torch.Tensor]) -> Any:
    """``kernel``, recording each input it is called with."""

    def spy(t: torch.Tensor) -> Any:
        seen.append(t)
        return kernel(t)

    return spy


def _decided(op: str, x: torch.Tensor) -> list[torch.Tensor]:
    fn = getattr(turbo_torch, op)
    return [fn(x) for _ in range(CALLS)]


def _values(shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * 4
    flat = x.view(-1)
    specials = [
        0.0, -0.0, math.nan, math.inf, -math.inf, 1e-30, -1e-30, 1e-8, 20.0, -20.0, 88.0, -88.0,
        math.pi / 2, math.pi, 1e4, -1e4, 65536.0, 1e5, -3e7, 3.4e38, -3.4e38, 1.17e-38,
    ]  # fmt: skip
    k = min(len(specials), flat.numel())
    flat[:k] = torch.tensor(specials[:k])
    return x


SHAPES = [(), (0,), (1,), (7,), (9,), (64, 64), (3, 0, 5), (513, 130), (300, 300)]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_native_matches_torch(always_native: ModuleType, op: str, shape: tuple[int, ...]) -> None:
    x = _values(shape)
    want = getattr(torch, op)(x)
    with torch.no_grad():
        outs = _decided(op, x)
    nat = _entry(op, x)
    assert nat is not None and nat.state == native.NATIVE
    for out in outs:
        assert out.shape == want.shape and out.dtype == want.dtype and out.stride() == want.stride()
        torch.testing.assert_close(out, want, equal_nan=True)
    # signed zeros as PyTorch: sin(-0) = -0, tanh(-0) = -0, cos(-0) = 1
    if x.numel() > 1:
        assert torch.equal(torch.signbit(outs[-1].view(-1)[:2]), torch.signbit(want.view(-1)[:2]))
    assert turbo_torch.cache_info()[f"torch.{op}"]["native"] == 1


@pytest.mark.parametrize("op", OPS)
def test_native_calls_the_kernel_once_per_call(always_native: ModuleType, fake_engine: Any, op: str) -> None:
    x = torch.randn(16, 16)
    _decided(op, x)
    nat = _entry(op, x)
    seen: list[torch.Tensor] = []
    real = nat.kernel
    nat.kernel = _spy(real, seen)
    before = len(fake_engine.runs)
    y = getattr(turbo_torch, op)(x)
    assert len(seen) == 1 and seen[0] is x and fake_engine.runs[before:] == [f"aten.{op}.default"]
    torch.testing.assert_close(y, getattr(torch, op)(x))


@pytest.mark.parametrize("op", OPS)
def test_a_kernel_that_refuses_gives_the_torch_result(always_native: ModuleType, op: str) -> None:
    x = torch.randn(8, 8)
    _decided(op, x)
    nat = _entry(op, x)

    def refusing(t: torch.Tensor) -> torch.Tensor:
        raise ValueError("not this one")

    nat.kernel = refusing
    assert torch.equal(getattr(turbo_torch, op)(x), getattr(torch, op)(x))


@pytest.mark.parametrize("op", OPS)
def test_what_pytorch_must_see_takes_the_torch_function(always_native: ModuleType, op: str) -> None:
    x = torch.randn(8, 8)
    _decided(op, x)
    nat = _entry(op, x)
    calls: list[torch.Tensor] = []
    nat.kernel = _spy(nat.kernel, calls)
    fn, ref = getattr(turbo_torch, op), getattr(torch, op)

    # autograd: an input requiring grad under grad mode records a graph, with the right gradient
    xg = x.clone().requires_grad_(True)
    y = fn(xg)
    assert y.grad_fn is not None
    y.sum().backward()
    xr = x.clone().requires_grad_(True)
    ref(xr).sum().backward()
    torch.testing.assert_close(xg.grad, xr.grad)
    # forward-mode AD
    import torch.autograd.forward_ad as fwad

    with fwad.dual_level():
        dual = fwad.make_dual(x, torch.ones_like(x))
        tangent = fwad.unpack_dual(fn(dual)).tangent
    with fwad.dual_level():
        want = fwad.unpack_dual(ref(fwad.make_dual(x, torch.ones_like(x)))).tangent
    torch.testing.assert_close(tangent, want)
    # functorch transforms
    torch.testing.assert_close(torch.vmap(fn)(x), ref(x))
    torch.testing.assert_close(torch.func.grad(lambda t: fn(t).sum())(x), torch.func.grad(lambda t: ref(t).sum())(x))
    # a __torch_function__ mode sees the call
    seen: list[Any] = []

    class Mode(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            seen.append(func)
            return func(*args, **(kwargs or {}))

    with Mode():
        fn(x)
    assert ref in seen

    # a tensor subclass keeps its __torch_function__
    class Sub(torch.Tensor):
        pass

    assert type(fn(x.as_subclass(Sub))) is Sub
    # non-contiguous, float64, integer, neg-bit views: the torch function, exactly
    xt = torch.randn(8, 6).t()
    assert torch.equal(fn(xt), ref(xt))
    xd = x.double()
    assert torch.equal(fn(xd), ref(xd))
    xi = torch.arange(64).view(8, 8)
    assert torch.equal(fn(xi), ref(xi))
    xn = torch._neg_view(x)
    assert torch.equal(fn(xn), ref(xn))
    # out=
    out = torch.empty_like(x)
    assert fn(x, out=out) is out and torch.equal(out, ref(x))
    # the profiler sees the ATen op
    with torch.profiler.profile() as prof:
        fn(x)
    assert any(e.name == f"aten::{op}" for e in prof.events())
    assert calls == [], "a call PyTorch had to see ran natively"
    # and a plain call after all of that is native again
    fn(x)
    assert len(calls) == 1


def test_inference_mode_and_no_grad_run_natively(always_native: ModuleType) -> None:
    x = torch.randn(4, 4, requires_grad=True)
    _decided("tanh", x.detach())
    nat = _entry("tanh", x)
    calls: list[torch.Tensor] = []
    nat.kernel = _spy(nat.kernel, calls)
    with torch.no_grad():
        y = turbo_torch.tanh(x)
    assert y.grad_fn is None and not y.requires_grad
    with torch.inference_mode():
        z = turbo_torch.tanh(x)
    assert z.is_inference()
    assert len(calls) == 2
    torch.testing.assert_close(y, torch.tanh(x.detach()))
    torch.testing.assert_close(z, torch.tanh(x.detach()))


def test_a_new_element_count_is_a_miss_with_the_right_result(always_native: ModuleType) -> None:
    a, b = torch.randn(10, 10), torch.randn(7, 3)
    _decided("sin", a)
    info = turbo_torch.cache_info()["torch.sin"]
    assert info["misses"] == 1 and info["entries"] == 1
    torch.testing.assert_close(turbo_torch.sin(b), torch.sin(b))
    info = turbo_torch.cache_info()["torch.sin"]
    assert info["misses"] == 2 and info["entries"] == 2
    # same element count, another shape: the same entry (the kernel depends on the count only)
    torch.testing.assert_close(turbo_torch.sin(a.view(4, 25)), torch.sin(a.view(4, 25)))
    assert turbo_torch.cache_info()["torch.sin"]["entries"] == 2
    turbo_torch.clear_cache()
    assert "torch.sin" not in turbo_torch.cache_info()
    torch.testing.assert_close(turbo_torch.sin(a), torch.sin(a))
    assert turbo_torch.cache_info()["torch.sin"]["misses"] == 1


def test_the_real_timing_decides(native_on: ModuleType) -> None:
    x = torch.randn(64, 64)
    with torch.no_grad():
        _decided("tanh", x)
    assert _entry("tanh", x).state in (native.NATIVE, native.TORCH)


@pytest.mark.parametrize("op", OPS)
def test_native_off_is_bit_identical(impl: ModuleType, op: str) -> None:
    x = _values((33, 17))
    for out in _decided(op, x):
        assert torch.equal(out.nan_to_num(7.0), getattr(torch, op)(x).nan_to_num(7.0))
    assert turbo_torch.cache_info()[f"torch.{op}"]["native"] == 0


def test_cache_off_is_the_torch_function(impl: ModuleType) -> None:
    impl.CACHE.enabled = False
    try:
        x = torch.randn(5)
        assert torch.equal(turbo_torch.sin(x), torch.sin(x))
        assert "torch.sin" not in turbo_torch.cache_info()
    finally:
        impl.CACHE.enabled = True


@pytest.mark.parametrize("op", OPS)
def test_compile_script_trace_and_fx_see_the_torch_op(impl: ModuleType, op: str) -> None:
    fn, ref = getattr(turbo_torch, op), getattr(torch, op)
    x = torch.randn(6, 5)

    def f(t: torch.Tensor) -> torch.Tensor:
        return fn(t) * 2

    torch._dynamo.reset()
    compiled = torch.compile(f, backend="eager", fullgraph=True)  # no graph break
    torch.testing.assert_close(compiled(x), ref(x) * 2)
    scripted = torch.jit.script(f)
    assert f"aten::{op}" in str(scripted.graph)
    torch.testing.assert_close(scripted(x), ref(x) * 2)
    traced = torch.jit.trace(f, (x,))
    assert f"aten::{op}" in str(traced.graph)
    gm = torch.fx.symbolic_trace(f)
    assert any(n.target is ref for n in gm.graph.nodes)
    assert fn.__name__ == op and fn.__wrapped__ is ref


def test_without_an_engine_the_torch_function_runs(impl: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHBURN_LOAD_PLUGINS", "cython_dispatch")
    torchburn.plugins.reload()
    native.reset_for_tests()
    native.set_native_enabled(True)
    try:
        x = torch.randn(9, 9)
        assert all(torch.equal(out, torch.sin(x)) for out in _decided("sin", x))
        assert _entry("sin", x) is None and turbo_torch.cache_info()["torch.sin"]["native"] == 0
    finally:
        monkeypatch.delenv("TORCHBURN_LOAD_PLUGINS")
        torchburn.plugins.reload()
        native.reset_for_tests()
