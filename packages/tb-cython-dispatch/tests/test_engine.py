"""The cython_dispatch engine: conformance suite, plan runner on both implementations."""

from __future__ import annotations

from typing import ClassVar

import pytest
import torch

import torchburn
from tb_cython_dispatch.engine import compile_plan
from tb_cython_dispatch.plugin import CythonDispatchEngine
from torchburn.program import KernelProgram
from torchburn.testing import EngineConformance


def test_engine_is_found_through_its_entry_point() -> None:
    engines = torchburn.plugins.engines()
    assert isinstance(engines["cython_dispatch"], CythonDispatchEngine)
    assert engines["cython_dispatch"].priority == 10
    assert "cython_dispatch" in torchburn.active_engines()


class TestCythonDispatch(EngineConformance):
    engine = "cython_dispatch"
    native_models: ClassVar[frozenset[str]] = frozenset({"readme_mlp", "small_cnn", "transformer_layer"})


def _plans(fn, *args):  # type: ignore[no-untyped-def]
    """The plans the engine was asked to compile for ``fn``."""
    plans = []
    engine = torchburn.plugins.engines()["cython_dispatch"]
    original = type(engine).compile

    def spy(self, plan):  # type: ignore[no-untyped-def]
        plans.append(plan)
        return original(self, plan)

    type(engine).compile = spy  # type: ignore[method-assign]
    try:
        torch._dynamo.reset()
        opts = {
            "engine": "cython_dispatch",
            "fallback": "error",
            "cache": False,
            "min_partition_size": 1,
            "warn": False,
        }
        out = torch.compile(fn, backend="torchburn", options=opts, dynamic=False)(*args)
    finally:
        type(engine).compile = original  # type: ignore[method-assign]
    return plans, out


def _chain(x, w):  # type: ignore[no-untyped-def]
    y = torch.cat([x * 2, x.sin()], dim=1)
    a, b = y.split(3, dim=1)
    return (a @ w).relu() + b.sum(), torch.nn.functional.gelu(a, approximate="tanh")


def test_plan_runner_matches_kernel_program(impl) -> None:  # type: ignore[no-untyped-def]
    x, w = torch.randn(4, 3), torch.randn(3, 3)
    plans, out = _plans(_chain, x, w)
    assert plans
    expected = _chain(x, w)
    torch.testing.assert_close(out, expected)
    for plan in plans:
        runner = compile_plan(plan, impl)
        assert type(runner).__module__ == impl.__name__
        reference = KernelProgram(plan, {n.op: n.target for n in plan.nodes})
        n = len(plan.inputs) - len(plan.constants)
        inputs = [x, w][:n] if n <= 2 else None
        if inputs is None or any(
            m is not None and tuple(m.shape) != tuple(t.shape) for m, t in zip(plan.inputs, inputs)
        ):
            continue
        got, want = runner(*inputs), reference(*inputs)
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_plan_runner_rejects_wrong_arity(impl) -> None:  # type: ignore[no-untyped-def]
    plans, _ = _plans(lambda x: x.sin() + 1, torch.randn(3))
    runner = compile_plan(plans[0], impl)
    with pytest.raises(TypeError, match="takes 1 inputs"):
        runner(torch.randn(3), torch.randn(3))


def test_training_through_the_engine_matches_eager() -> None:
    from torchburn.testing import train_losses

    torch._dynamo.reset()
    eager = train_losses(None, steps=5)
    opts = {"engine": "cython_dispatch", "warn": False, "fallback": "error"}
    compiled = train_losses(lambda m: torch.compile(m, backend="torchburn", options=opts), steps=5)
    assert max(abs(a - b) for a, b in zip(eager, compiled)) <= 1e-5


def test_plugin_module_imports_cheaply() -> None:
    import subprocess
    import sys

    code = "import sys, tb_cython_dispatch.plugin; print('tb_cython_dispatch._dispatch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
