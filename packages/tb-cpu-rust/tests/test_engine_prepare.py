"""NativeCpuEngine.prepare: the engine's programs as tb-core's PreparedProgram, against eager.

Plans are the ones the engine itself compiles for a set of functions (captured from
``torch.compile``), so ``prepare`` is checked on what the compile path really sees: ``run`` and
``run_into`` must match eager PyTorch and the engine's own compiled program, and every tensor
that does not fit the plan must be refused with an exception naming it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import torchburn
from tb_cpu_rust.engine import NativeCpuEngine
from tb_cpu_rust.program import PreparedNativeProgram
from torchburn.interop import empty_like_meta
from torchburn.plan import Plan, PlanNode, Ref, TensorMeta, resolve_op
from torchburn.testing.interop_conformance import InteropConformance


def _plans(fn: Callable[..., Any], *args: torch.Tensor) -> list[Plan]:
    plans: list[Plan] = []
    original = NativeCpuEngine.compile

    def spy(self: NativeCpuEngine, plan: Plan) -> Any:
        plans.append(plan)
        return original(self, plan)

    NativeCpuEngine.compile = spy  # type: ignore[method-assign]
    try:
        torch._dynamo.reset()
        opts: dict[str, Any] = {
            "engine": "native_cpu",
            "fallback": "error",
            "cache": False,
            "min_partition_size": 1,
            "warn": False,
        }
        with torch.no_grad():
            torch.compile(fn, backend="torchburn", options=opts, dynamic=False)(*args)
    finally:
        NativeCpuEngine.compile = original  # type: ignore[method-assign]
    assert plans
    return plans


def _mlp(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    return torch.relu(x @ w1.t() + b1) @ w2.t()


def _two_outputs(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    s = (x * y).sin()
    return s + 1.0, torch.softmax(s, dim=-1)


def _view_output(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    e = x.exp()
    return e.t(), e[:, 1:]  # outputs that are views of one buffer


def _norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b).tanh()


CASES: list[tuple[str, Callable[..., Any], Callable[[], tuple[torch.Tensor, ...]]]] = [
    ("mlp-1", _mlp, lambda: (torch.randn(1, 8), torch.randn(16, 8), torch.randn(16), torch.randn(4, 16))),
    ("mlp-33", _mlp, lambda: (torch.randn(33, 20), torch.randn(17, 20), torch.randn(17), torch.randn(3, 17))),
    ("two-outputs", _two_outputs, lambda: (torch.randn(5, 7), torch.randn(5, 7))),
    ("two-outputs-strided", _two_outputs, lambda: (torch.randn(7, 5).t(), torch.randn(5, 7))),
    ("view-outputs", _view_output, lambda: (torch.randn(6, 4),)),
    ("layer-norm", _norm, lambda: (torch.randn(2, 3, 16), torch.randn(16), torch.randn(16))),
    ("empty", _two_outputs, lambda: (torch.randn(0, 7), torch.randn(0, 7))),
]


def _inputs(plan: Plan, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    n_user = len(plan.inputs) - len(plan.constants)
    out = []
    for meta in plan.inputs[:n_user]:
        assert meta is not None
        t = empty_like_meta(meta)
        t.copy_(torch.randn(meta.shape, generator=g))
        out.append(t)
    return out


@pytest.mark.parametrize(("name", "fn", "make"), CASES, ids=[c[0] for c in CASES])
def test_prepared_programs_match_eager_and_the_compiled_program(
    name: str, fn: Callable[..., Any], make: Callable[[], tuple[torch.Tensor, ...]]
) -> None:
    engine = NativeCpuEngine()
    for plan in _plans(fn, *make()):
        program = engine.prepare(plan)
        assert isinstance(program, PreparedNativeProgram), plan
        for seed in range(3):
            inputs = _inputs(plan, seed)
            want = torchburn.program.KernelProgram(plan, {op: resolve_op(op) for op in plan.ops()})(*inputs)
            want = want if isinstance(want, tuple) else (want,)
            compiled = engine.compile(plan)(*inputs)
            compiled = compiled if isinstance(compiled, tuple) else (compiled,)
            got = program.run(inputs)
            assert len(got) == len(want) == len(program.output_metas)
            into = [empty_like_meta(m).fill_(123.0) for m in program.output_metas]
            program.run_into(inputs, into)
            for g_, i_, w_, c_, m in zip(got, into, want, compiled, program.output_metas):
                assert g_.shape == m.shape and g_.dtype == m.dtype
                assert all(n < 2 or a == b for n, a, b in zip(m.shape, g_.stride(), m.stride))
                torch.testing.assert_close(g_, w_, rtol=1e-5, atol=1e-5)
                torch.testing.assert_close(i_, w_, rtol=1e-5, atol=1e-5)
                assert torch.equal(g_, c_) and torch.equal(i_, c_)  # the same native program


def test_outputs_that_are_views_take_the_copying_path() -> None:
    plans = _plans(_view_output, torch.randn(6, 4))
    programs = [NativeCpuEngine().prepare(p) for p in plans]
    assert any(isinstance(p, PreparedNativeProgram) and p._order is None for p in programs)


def _mlp_program() -> tuple[PreparedNativeProgram, list[torch.Tensor]]:
    (plan,) = _plans(_mlp, torch.randn(3, 8), torch.randn(16, 8), torch.randn(16), torch.randn(4, 16))
    program = NativeCpuEngine().prepare(plan)
    assert isinstance(program, PreparedNativeProgram)
    return program, _inputs(plan, 0)


def test_bad_tensors_raise_and_touch_nothing() -> None:
    program, inputs = _mlp_program()
    a, rest = inputs[0], inputs[1:]  # the plan's own input order (AOTAutograd's, not the function's)
    out_meta = program.output_metas[0]
    out = torch.full(out_meta.shape, 5.0)
    wrong_shape = torch.randn(a.shape[0] + 1, *a.shape[1:])
    cases: list[tuple[list[Any], list[Any], type[Exception], str]] = [
        (inputs[:-1], [out], ValueError, "expected 4 input"),
        (inputs, [out, out], ValueError, "expected 1 output"),
        ([a.double(), *rest], [out], ValueError, "dtype"),
        ([wrong_shape, *rest], [out], ValueError, "sizes"),
        ([torch.empty(a.shape, device="meta"), *rest], [out], ValueError, "meta"),
        ([a.tolist(), *rest], [out], TypeError, "not a tensor"),
        ([torch._neg_view(a), *rest], [out], ValueError, "negated"),
        (inputs, [torch.empty(out_meta.shape[::-1]).t()], ValueError, "strides"),
        (inputs, [torch.empty(out_meta.shape, dtype=torch.float64)], ValueError, "dtype"),
    ]
    if a.dim() == 2 and min(a.shape) > 1:
        cases.append(([torch.randn(a.shape[::-1]).t(), *rest], [out], ValueError, "strides"))
    for bad_inputs, outputs, error, message in cases:
        with pytest.raises(error, match=message):
            program.run_into(bad_inputs, outputs)
        assert torch.equal(out, torch.full(out_meta.shape, 5.0))
    with pytest.raises(ValueError, match="dtype"):
        program.run([a.double(), *rest])
    with pytest.raises(ValueError, match="expected 4 input"):
        program.run(inputs[:1])


def test_an_output_aliasing_an_input_is_refused() -> None:
    program, inputs = _mlp_program()
    a = inputs[0]
    out_meta = program.output_metas[0]
    n_in, n_out = a.numel(), out_meta.numel
    storage = torch.zeros(2 * (n_in + n_out))
    a_in = storage[:n_in].view(a.shape)
    a_in.copy_(a)
    overlapping = storage[n_in - 1 : n_in - 1 + n_out].view(out_meta.shape)
    with pytest.raises(ValueError, match="overlaps input 0"):
        program.run_into([a_in, *inputs[1:]], [overlapping])
    assert torch.equal(a_in, a)
    beside = storage[n_in : n_in + n_out].view(out_meta.shape)
    program.run_into([a_in, *inputs[1:]], [beside])  # right after it: fine
    torch.testing.assert_close(beside, program.run(inputs)[0])


def test_plans_the_engine_does_not_take_give_none() -> None:
    engine = NativeCpuEngine()
    plan = _plans(_mlp, torch.randn(3, 8), torch.randn(16, 8), torch.randn(16), torch.randn(4, 16))[0]
    assert engine.prepare(Plan(plan.inputs, plan.nodes, [1.0], {}, True)) is None  # a literal output
    symbolic = TensorMeta((-1, 8), (8, 1), torch.float32, "cpu", True)
    assert engine.prepare(Plan([symbolic, *plan.inputs[1:]], plan.nodes, plan.outputs, {}, True)) is None
    meta = TensorMeta((4, 4), (4, 1), torch.float32, "cpu")
    op = "aten._adaptive_avg_pool2d_backward.default"
    unsupported = Plan([meta, meta], [PlanNode(op, (Ref(0), Ref(1)), {}, meta, resolve_op(op))], [Ref(2)], {}, True)
    assert engine.prepare(unsupported) is None


def test_the_engine_is_found_through_tb_core() -> None:
    from torchburn.interop import engines_with

    torchburn.plugins.reload()
    assert "native_cpu" in [e.name for e in engines_with("prepare", device="cpu")]
    assert "native_cpu" in [e.name for e in engines_with("eager_kernel", device="cpu")]
    assert not NativeCpuEngine().runs_registered_kernels()


class TestNativeCpuInterop(InteropConformance):
    """tb-core's interop suite: plans traced by tb-core, the eager kernels turbo_torch uses."""

    engine = "native_cpu"
    eager_ops = frozenset({"aten.sin.default", "aten.cos.default", "aten.tanh.default", "aten.exp.default"})
