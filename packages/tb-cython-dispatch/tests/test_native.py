"""The native decision of a Sequential entry (tb_cython_dispatch.native), on both implementations.

The prepared programs come from the conftest's fake engine (tb-core's interop interface in pure
PyTorch, registered in-process), so these tests run with only tb-core beside this package; the
same paths on native_cpu are in ``integration_tests/test_cython_dispatch_native.py``. The timed
decision is replaced by a fixed one (``native.decide``) so the tests do not depend on the
machine's speed; one test keeps the real timing and checks only that it decided.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
import torch

import torchburn
import turbo_torch
from tb_cython_dispatch import native

TOL: dict[str, Any] = {"rtol": 1e-5, "atol": 1e-5}  # float32 reassociation of the GEMM's dot products
CALLS = native.HOT_AFTER + 2 * (native.WARMUP + native.SAMPLES) + 2  # enough to decide


@pytest.fixture
def native_on(impl: ModuleType, fake_engine: Any) -> Iterator[ModuleType]:
    """Native decisions allowed (conftest turns them off for every other test), on the fake engine."""
    yield impl


@pytest.fixture
def always_native(native_on: ModuleType, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.setattr(native, "decide", lambda native_ns, torch_ns: native.NATIVE)
    return native_on


def _mlp(bias: bool = True) -> Any:
    torch.manual_seed(0)
    nn = turbo_torch.nn
    return nn.Sequential(nn.Linear(20, 16, bias=bias), nn.ReLU(), nn.Linear(16, 4, bias=bias))


def _eager(m: Any, x: torch.Tensor) -> torch.Tensor:
    return torch.nn.Sequential.forward(m, x)  # torch's own forward: every child through nn.Module.__call__


def _slot(m: Any, x: torch.Tensor, impl: ModuleType, mode: Any = None) -> Any:
    """The native slot of m's entry for x under ``mode`` (default no_grad: the key has the grad mode)."""
    attr = "_tb_site_compiled" if impl.IMPLEMENTATION == "compiled" else "_tb_site_python"
    with mode if mode is not None else torch.no_grad():
        entry = m.__dict__[attr].lookup(m, impl.call_key(x))
    return entry[3]


def _run(m: Any, x: torch.Tensor, n: int = CALLS) -> list[torch.Tensor]:
    return [m(x) for _ in range(n)]


def test_native_entry_decides_and_matches_eager(always_native: ModuleType) -> None:
    m, x = _mlp(), torch.randn(3, 20)
    with torch.no_grad():
        outs = _run(m, x)
        want = _eager(m, x)
    for out in outs:
        torch.testing.assert_close(out, want, **TOL)
    slot = _slot(m, x, always_native)
    assert slot.state == native.NATIVE and slot.fast is not None and slot.prepares == 1
    assert turbo_torch.cache_info()["nn.Sequential"]["native"] == 1
    assert not outs[-1].requires_grad and outs[-1].is_contiguous() and outs[-1].shape == (3, 4)
    assert outs[-1].data_ptr() != outs[-2].data_ptr()  # a fresh output every call, like eager


def test_real_timing_decides(native_on: ModuleType) -> None:
    m, x = _mlp(), torch.randn(2, 20)
    with torch.no_grad():
        _run(m, x)
        torch.testing.assert_close(m(x), _eager(m, x), **TOL)
    slot = _slot(m, x, native_on)
    assert slot.state in (native.NATIVE, native.TORCH)
    assert len(slot.t_native) >= native.WARMUP + native.SAMPLES
    assert turbo_torch.cache_info()["nn.Sequential"]["native"] == (slot.state == native.NATIVE)


def test_decision_is_per_signature(native_on: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    answers = iter([native.NATIVE, native.TORCH])
    monkeypatch.setattr(native, "decide", lambda native_ns, torch_ns: next(answers))
    m, x1, x2 = _mlp(), torch.randn(1, 20), torch.randn(5, 20)
    with torch.no_grad():
        _run(m, x1)
        _run(m, x2)
        torch.testing.assert_close(m(x1), _eager(m, x1), **TOL)
        assert torch.equal(m(x2), _eager(m, x2))  # decided ATen: bit-identical
    assert _slot(m, x1, native_on).state == native.NATIVE
    assert _slot(m, x2, native_on).state == native.TORCH
    info = turbo_torch.cache_info()["nn.Sequential"]
    assert info["entries"] == 2 and info["native"] == 1


def test_new_shape_or_dtype_is_a_new_entry(always_native: ModuleType) -> None:
    m, x = _mlp(), torch.randn(3, 20)
    with torch.no_grad():
        _run(m, x)
        y = torch.randn(7, 20)
        m(y)
        assert _slot(m, y, always_native).state == native.COLD  # its own decision, not yet made
        m64 = _mlp().double()
        z = torch.randn(3, 20, dtype=torch.float64)
        _run(m64, z)
        assert _slot(m64, z, always_native) is None  # float64: never native
        assert torch.equal(m64(z), _eager(m64, z))
        t = torch.randn(20, 3).t()  # another stride: another key
        _run(m, t)
        torch.testing.assert_close(m(t), _eager(m, t), **TOL)
    assert _slot(m, x, always_native).state == native.NATIVE


def test_parameter_values_are_read_live(always_native: ModuleType) -> None:
    m, x = _mlp(), torch.randn(3, 20)
    with torch.no_grad():
        _run(m, x)
        m[0].weight.mul_(2.0)
        m[2].bias.add_(1.0)
        torch.testing.assert_close(m(x), _eager(m, x), **TOL)
        m.load_state_dict(_mlp().state_dict())
        torch.testing.assert_close(m(x), _eager(m, x), **TOL)
    assert _slot(m, x, always_native).prepares == 1


def test_replaced_parameter_layout_prepares_anew(always_native: ModuleType) -> None:
    m, x = _mlp(), torch.randn(3, 20)
    with torch.no_grad():
        _run(m, x)
        slot = _slot(m, x, always_native)
        # same shape, transposed strides: the prepared program no longer fits
        m[0].weight = torch.nn.Parameter(torch.randn(20, 16).t())
        torch.testing.assert_close(m(x), _eager(m, x), **TOL)
        assert slot.state != native.NATIVE
        _run(m, x)
        assert slot.state == native.NATIVE and slot.prepares == 2
        torch.testing.assert_close(m(x), _eager(m, x), **TOL)
        # a bias removed: prepared again, without it
        m[2].bias = None
        torch.testing.assert_close(m(x), _eager(m, x), **TOL)
        _run(m, x)
        assert slot.state == native.NATIVE and slot.prepares == 3
        torch.testing.assert_close(m(x), _eager(m, x), **TOL)
        # a weight of another dtype: ATen (it raises exactly as eager does)
        m[0].weight = torch.nn.Parameter(torch.randn(16, 20, dtype=torch.float64))
        with pytest.raises(RuntimeError):
            _eager(m, x)
        with pytest.raises(RuntimeError):
            m(x)


def test_parameter_data_swapped_in_place_is_noticed(always_native: ModuleType) -> None:
    """``p.data = ...`` keeps the Parameter object but changes its layout: never read stale layouts."""
    m, x = _mlp(), torch.randn(3, 20)
    with torch.no_grad():
        _run(m, x)
        slot = _slot(m, x, always_native)
        assert slot.state == native.NATIVE
        m[0].weight.data = torch.randn(20, 16).t()  # same shape, transposed strides
        torch.testing.assert_close(m(x), _eager(m, x), **TOL)
        _run(m, x)
        assert slot.state == native.NATIVE and slot.prepares == 2
        torch.testing.assert_close(m(x), _eager(m, x), **TOL)
        m[2].bias.data = torch.randn(3)  # a smaller bias: eager raises, and so must this path
        with pytest.raises(RuntimeError):
            _eager(m, x)
        with pytest.raises(RuntimeError):
            m(x)


def test_autograd_is_never_skipped(always_native: ModuleType) -> None:
    m, x = _mlp(), torch.randn(3, 20)
    outs = _run(m, x)  # grad mode on, parameters require grad: every call records a graph
    assert all(o.grad_fn is not None for o in outs)
    assert all(torch.equal(o, _eager(m, x)) for o in outs[-2:])
    assert _slot(m, x, always_native, contextlib.nullcontext()) is None  # no native option at all
    for p in m.parameters():
        p.requires_grad_(False)
    m2, x2 = m, torch.randn(4, 20)
    outs = _run(m2, x2)  # grad mode on, nothing requires grad: nothing to record, native allowed
    assert _slot(m2, x2, always_native, contextlib.nullcontext()).state == native.NATIVE
    assert outs[-1].grad_fn is None and not outs[-1].requires_grad
    m[0].weight.requires_grad_(True)  # now it must record again
    out = m2(x2)
    assert out.grad_fn is not None
    assert torch.equal(out, _eager(m2, x2))


def test_input_requiring_grad_under_no_grad(always_native: ModuleType) -> None:
    m, x = _mlp(), torch.randn(3, 20, requires_grad=True)
    with torch.no_grad():
        outs = _run(m, x)
    assert _slot(m, x, always_native) is not None
    assert not outs[-1].requires_grad


def test_inference_mode_output_is_an_inference_tensor(always_native: ModuleType) -> None:
    m, x = _mlp(), torch.randn(3, 20)
    with torch.inference_mode():
        outs = _run(m, x)
        want = _eager(m, x)
    assert _slot(m, x, always_native, torch.inference_mode()).state == native.NATIVE
    assert outs[-1].is_inference() == want.is_inference()
    torch.testing.assert_close(outs[-1], want, **TOL)


def test_hooks_and_modes_see_the_aten_path(always_native: ModuleType) -> None:
    m, x = _mlp(), torch.randn(3, 20)
    with torch.no_grad():
        _run(m, x)
        assert _slot(m, x, always_native).state == native.NATIVE
        seen: list[torch.Tensor] = []
        handle = m[1].register_forward_hook(lambda mod, args, out: seen.append(out))
        assert torch.equal(m(x), _eager(m, x)) and len(seen) == 2
        handle.remove()

        class Count(torch.overrides.TorchFunctionMode):
            n = 0

            def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                Count.n += 1
                return func(*args, **(kwargs or {}))

        with Count():
            m(x)
        assert Count.n > 0
        with torch.profiler.profile() as prof:
            m(x)
        assert any("linear" in e.name or "addmm" in e.name for e in prof.events())


def test_other_stacks_stay_on_aten(always_native: ModuleType) -> None:
    nn = turbo_torch.nn
    torch.manual_seed(0)
    x = torch.randn(3, 20)
    for m in (
        nn.Sequential(nn.ReLU(inplace=True), nn.Linear(20, 4)),  # would write the caller's input
        nn.Sequential(nn.Linear(20, 16), nn.Tanh(), nn.Linear(16, 4)),  # tanh is not exact natively
        nn.Sequential(nn.Linear(20, 16), nn.ReLU(), nn.ReLU()),
    ):
        with torch.no_grad():
            _run(m, x.clone())
            assert _slot(m, x, always_native) is None
            assert torch.equal(m(x.clone()), _eager(m, x.clone()))
    x3 = torch.randn(2, 3, 20)  # 3-D input: not a 2-D GEMM stack
    m = _mlp()
    with torch.no_grad():
        _run(m, x3)
        assert _slot(m, x3, always_native) is None


def test_set_native_enabled_false_is_bit_identical(always_native: ModuleType) -> None:
    m, x = _mlp(), torch.randn(3, 20)
    with torch.no_grad():
        _run(m, x)
        assert _slot(m, x, always_native).state == native.NATIVE
        turbo_torch.set_native_enabled(False)
        assert not turbo_torch.native_enabled()
        assert torch.equal(m(x), _eager(m, x))
        m2 = _mlp()
        _run(m2, x)
        assert _slot(m2, x, always_native) is None
        assert torch.equal(m2(x), _eager(m2, x))


def test_without_an_engine_everything_stays_on_aten(impl: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    # Only this package's own plugin loads: no engine offers prepared programs.
    monkeypatch.setenv("TORCHBURN_LOAD_PLUGINS", "cython_dispatch")
    torchburn.plugins.reload()
    native.reset_for_tests()
    native.set_native_enabled(True)
    try:
        m, x = _mlp(), torch.randn(3, 20)
        with torch.no_grad():
            outs = _run(m, x)
            want = _eager(m, x)
        assert all(torch.equal(o, want) for o in outs)
        ok, reason = turbo_torch.native_available()
        assert not ok and "no installed engine offers prepared programs" in reason and "tb-cpu-rust" in reason
        assert turbo_torch.cache_info()["nn.Sequential"]["native"] == 0
        slot = _slot(m, x, impl)
        assert slot is None or slot.state == native.OFF
    finally:
        monkeypatch.delenv("TORCHBURN_LOAD_PLUGINS")
        torchburn.plugins.reload()
        native.reset_for_tests()


def test_program_is_the_engines_and_runs_once_per_call(always_native: ModuleType, fake_engine: Any) -> None:
    m, x = _mlp(), torch.randn(3, 20)
    with torch.no_grad():
        _run(m, x)
        slot = _slot(m, x, always_native)
        assert isinstance(slot.program, fake_engine.program_class)
        (plan,) = fake_engine.prepared
        assert list(plan.ops()) == [
            "aten.t.default", "aten.addmm.default", "aten.relu.default", "aten.t.default", "aten.addmm.default",
        ]  # fmt: skip
        before = len(fake_engine.runs)
        y = m(x)
        assert fake_engine.runs[before:] == [slot.program]
        torch.testing.assert_close(y, _eager(m, x), **TOL)


def test_engine_that_declines_keeps_the_entry_on_aten(
    native_on: ModuleType, fake_engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fake_engine, "PROGRAM_OPS", frozenset())  # prepare() returns None for every plan
    m, x = _mlp(), torch.randn(3, 20)
    with torch.no_grad():
        outs = _run(m, x)
        want = _eager(m, x)
    assert all(torch.equal(o, want) for o in outs)
    assert _slot(m, x, native_on).state == native.OFF
    assert fake_engine.runs == [] and turbo_torch.cache_info()["nn.Sequential"]["native"] == 0


def test_no_tb_cpu_rust_import_in_this_package() -> None:
    import pathlib

    import tb_cython_dispatch

    root = pathlib.Path(tb_cython_dispatch.__file__).parent
    sources = [*root.rglob("*.py"), *root.rglob("*.pyx"), *root.parent.joinpath("turbo_torch").rglob("*.py")]
    assert sources
    offenders = [str(p) for p in sources if "tb_cpu_rust" in p.read_text()]
    assert not offenders, offenders
