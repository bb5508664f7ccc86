"""Every test that takes ``impl`` runs twice: on the Cython extension and on the fallback.

``fake_engine`` registers, through tb-core's public plugin registration, a small engine that
implements tb-core's interop interface (``Engine.prepare``, ``Engine.eager_kernel``) in pure
PyTorch and counts its calls: the native paths of turbo_torch are tested against it without any
other engine package installed. The real ``native_cpu`` is tested in ``integration_tests/``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from types import ModuleType
from typing import Any, ClassVar

import pytest
import torch

import tb_cython_dispatch
import torchburn
from tb_cython_dispatch import _impl, native
from torchburn.interop import PreparedProgram, check_no_overlap, check_tensors
from torchburn.plan import GETITEM, Plan, resolve_op
from torchburn.program import KernelProgram


class FakeProgram(PreparedProgram):
    """A plan run by PyTorch's own ops, with the interface's checks; counts its runs."""

    def __init__(self, plan: Plan) -> None:
        super().__init__(plan)
        self.program = KernelProgram(plan, {op: resolve_op(op) for op in plan.ops() if op != GETITEM})

    def run_into(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        check_tensors("input", inputs, self.input_metas)
        check_tensors("output", outputs, self.output_metas)
        check_no_overlap(inputs, outputs)
        with torch.no_grad():
            result = self.program(*inputs)
        for out, value in zip(outputs, result if isinstance(result, tuple) else (result,)):
            out.copy_(value)
        FakeEngine.runs.append(self)


class FakeEngine(torchburn.Engine):
    """Offers programs for GEMM/ReLU plans and eager float32 sin/cos/tanh; outranks every engine."""

    name = "fake_interop"
    device = "cpu"
    priority = 1000
    PROGRAM_OPS: ClassVar[frozenset[str]] = frozenset(
        {"aten.t.default", "aten.addmm.default", "aten.mm.default", "aten.relu.default"}
    )
    UNARY: ClassVar[dict[str, Callable[..., torch.Tensor]]] = {
        "aten.sin.default": torch.sin,
        "aten.cos.default": torch.cos,
        "aten.tanh.default": torch.tanh,
    }
    program_class: ClassVar[type[FakeProgram]] = FakeProgram
    runs: ClassVar[list[Any]] = []  # every program run and eager kernel call, in order
    prepared: ClassVar[list[Plan]] = []

    def prepare(self, plan: Plan) -> PreparedProgram | None:
        if not set(plan.ops()) <= self.PROGRAM_OPS:
            return None
        FakeEngine.prepared.append(plan)
        return FakeProgram(plan)

    def eager_kernel(self, op: str, dtype: torch.dtype) -> Callable[..., torch.Tensor] | None:
        fn = self.UNARY.get(op)
        if fn is None or dtype is not torch.float32:
            return None

        def kernel(x: torch.Tensor) -> torch.Tensor:
            if type(x) is not torch.Tensor or x.dtype is not torch.float32 or not x.is_contiguous() or x.is_neg():
                raise ValueError(f"fake {op} kernel takes contiguous float32 tensors")
            FakeEngine.runs.append(op)
            with torch.no_grad():
                return fn(x)

        return kernel


class FakePlugin:
    @torchburn.hookimpl
    def tb_register_engines(self) -> list[Any]:
        return [FakeEngine]


@pytest.fixture
def fake_engine() -> Iterator[type[FakeEngine]]:
    """The fake interop engine registered in this process, and turbo_torch's native paths using it."""
    FakeEngine.runs, FakeEngine.prepared = [], []
    torchburn.register_plugin(FakePlugin(), "fake_interop")
    native.reset_for_tests()
    try:
        assert native.native_available() == (True, "engine fake_interop")
        yield FakeEngine
    finally:
        torchburn.unregister_plugin("fake_interop")
        native.reset_for_tests()


IMPLS = ["compiled", "python"]


def pytest_report_header() -> str:
    return f"tb_cython_dispatch: compiled extension available={_impl.COMPILED_AVAILABLE} ({_impl.COMPILED_IMPORT_ERROR or 'ok'})"


@pytest.fixture(params=IMPLS)
def impl(request: pytest.FixtureRequest) -> Iterator[ModuleType]:
    if (
        request.param == "compiled"
        and not _impl.COMPILED_AVAILABLE
        and os.environ.get("TORCHBURN_ALLOW_NO_EXTENSION") == "1"
    ):
        pytest.skip("compiled extension not built (TORCHBURN_ALLOW_NO_EXTENSION=1)")
    previous = tb_cython_dispatch.implementation()
    module = tb_cython_dispatch.set_implementation(request.param)
    module.CACHE.enabled = True
    module.CACHE.clear()
    try:
        yield module
    finally:
        tb_cython_dispatch.set_implementation(previous)


@pytest.fixture(autouse=True)
def _native_off(request: pytest.FixtureRequest) -> Iterator[None]:
    """The suite checks bit-identity with PyTorch, so the (timed, reassociating) native decision is
    off unless a test asks for it with the ``native_on`` fixture (tests/test_native.py)."""
    previous = native.native_enabled()
    native.set_native_enabled("native_on" in request.fixturenames)
    try:
        yield
    finally:
        native.set_native_enabled(previous)


@pytest.fixture
def only_this_package(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Only cython_dispatch's own plugin loads (no kernel pack of another package beside it)."""
    monkeypatch.setenv("TORCHBURN_LOAD_PLUGINS", "cython_dispatch")
    torchburn.plugins.reload()
    yield
    monkeypatch.delenv("TORCHBURN_LOAD_PLUGINS")
    torchburn.plugins.reload()
