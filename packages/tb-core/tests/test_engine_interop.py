"""tb-core's interface between engines (torchburn.interop) and the telemetry categories it feeds.

An engine offers prepared programs and eager kernels by overriding ``Engine.prepare`` /
``Engine.eager_kernel``; callers find it with ``engines_with``. ``delegated_ops`` is how an engine
says which nodes it hands to PyTorch's kernels, and ``op_coverage`` / ``explain`` / ``torchburn ops``
report those as "delegated", never as native.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import pytest
import torch

import torchburn
from torchburn.interop import (
    PreparedProgram,
    byte_span,
    check_no_overlap,
    check_tensors,
    engines_with,
    find_engine,
    installed_engines,
    preparable,
)
from torchburn.nodeinfo import NodeInfo
from torchburn.plan import Plan, PlanNode, Ref, TensorMeta, resolve_op
from torchburn.program import KernelProgram
from torchburn.testing.interop_conformance import InteropConformance

F32 = torch.float32


def meta(shape: tuple[int, ...], dtype: torch.dtype = F32) -> TensorMeta:
    stride: list[int] = []
    n = 1
    for s in reversed(shape):
        stride.insert(0, n)
        n *= max(s, 1)
    return TensorMeta(tuple(shape), tuple(stride), dtype, "cpu")


def linear_relu_plan(rows: int = 3, k: int = 5, n: int = 4) -> Plan:
    """x[rows, k], w[n, k], b[n] -> relu(addmm(b, x, w.t()))."""
    wt = TensorMeta((k, n), (1, k), F32, "cpu")
    out = meta((rows, n))
    nodes = [
        PlanNode("aten.t.default", (Ref(1),), {}, wt, resolve_op("aten.t.default")),
        PlanNode("aten.addmm.default", (Ref(2), Ref(0), Ref(3)), {}, out, resolve_op("aten.addmm.default")),
        PlanNode("aten.relu.default", (Ref(4),), {}, out, resolve_op("aten.relu.default")),
    ]
    return Plan([meta((rows, k)), meta((n, k)), meta((n,))], nodes, [Ref(5)], {}, True)


class TorchProgram(PreparedProgram):
    """The reference PreparedProgram: PyTorch's ops, the interface's checks."""

    def __init__(self, plan: Plan) -> None:
        super().__init__(plan)
        self.program = KernelProgram(plan, {op: resolve_op(op) for op in plan.ops()})

    def run_into(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        check_tensors("input", inputs, self.input_metas)
        check_tensors("output", outputs, self.output_metas)
        check_no_overlap(inputs, outputs)
        result = self.program(*inputs)
        for out, value in zip(outputs, result if isinstance(result, tuple) else (result,)):
            out.copy_(value)


class OfferingEngine(torchburn.Engine):
    name = "offering"
    priority = 7

    def prepare(self, plan: Plan) -> PreparedProgram | None:
        return TorchProgram(plan) if preparable(plan) is None else None

    def eager_kernel(self, op: str, dtype: torch.dtype) -> Callable[..., torch.Tensor] | None:
        return torch.sin if op == "aten.sin.default" and dtype is F32 else None


class KernelOnlyEngine(torchburn.Engine):
    name = "kernel_only"
    priority = 50

    def eager_kernel(self, op: str, dtype: torch.dtype) -> Callable[..., torch.Tensor] | None:
        return torch.cos if op == "aten.cos.default" else None


class GoneEngine(OfferingEngine):
    name = "gone"
    priority = 100

    def is_available(self) -> torchburn.Availability:
        return torchburn.Availability(False, "no device")


class DelegatingEngine(torchburn.Engine):
    """Takes add/relu/addmm; runs addmm with a kernel of its own and hands add/relu to PyTorch."""

    name = "delegating"
    priority = 9
    HANDED: ClassVar[frozenset[str]] = frozenset({"aten.relu.default", "aten.add.Tensor"})

    def delegated_ops(self, plan: Plan) -> set[str]:
        return set(plan.ops()) & self.HANDED

    def native_ops(self) -> set[str]:
        return self.covered_ops() - self.HANDED


class Plugin:
    def __init__(self, *engines: type[torchburn.Engine]) -> None:
        self.engines = engines

    @torchburn.hookimpl
    def tb_register_engines(self) -> list[Any]:
        return list(self.engines)


class DelegatingPlugin(Plugin):
    @torchburn.hookimpl
    def tb_register_kernels(self, registry: torchburn.KernelRegistry) -> None:
        for op in ("aten.add.Tensor", "aten.relu.default", "aten.addmm.default", "aten.t.default"):
            registry.register("delegating", op, resolve_op(op), torchburn.accepts((F32,)))


# -- the Engine defaults ------------------------------------------------------------------------
def test_defaults_offer_nothing_and_delegate_nothing() -> None:
    engine = torchburn.Engine()
    assert engine.prepare(linear_relu_plan()) is None
    assert engine.eager_kernel("aten.sin.default", F32) is None
    assert tuple(engine.delegated_ops(linear_relu_plan())) == ()
    assert engine.runs_registered_kernels()

    class OwnExecutor(torchburn.Engine):
        def compile(self, plan: Plan) -> Any:
            return None

    assert not OwnExecutor().runs_registered_kernels()


# -- finding engines -----------------------------------------------------------------------------
def test_engines_with_lists_available_overriders_by_priority() -> None:
    torchburn.register_plugin(Plugin(OfferingEngine, KernelOnlyEngine, GoneEngine), "offerers")
    assert set(installed_engines()) == {"offering", "kernel_only"}  # "gone" is not available
    assert [e.name for e in engines_with("prepare")] == ["offering"]
    assert [e.name for e in engines_with("eager_kernel")] == ["kernel_only", "offering"]
    assert engines_with("eager_kernel", device="gpu") == []
    assert isinstance(find_engine("offering"), OfferingEngine)
    assert find_engine("gone") is None and find_engine("nope") is None
    with pytest.raises(ValueError, match="unknown capability"):
        engines_with("compile")  # type: ignore[arg-type]


def test_an_engine_whose_availability_raises_is_not_installed() -> None:
    class Raising(OfferingEngine):
        name = "raising"

        def is_available(self) -> torchburn.Availability:
            raise RuntimeError("probe failed")

    torchburn.register_plugin(Plugin(Raising), "raising")
    assert "raising" not in installed_engines() and engines_with("prepare") == []


# -- PreparedProgram -----------------------------------------------------------------------------
@pytest.mark.parametrize(("rows", "k", "n"), [(1, 1, 1), (3, 5, 4), (0, 5, 4), (17, 33, 9)])
def test_prepared_program_matches_eager(rows: int, k: int, n: int) -> None:
    program = OfferingEngine().prepare(linear_relu_plan(rows, k, n))
    assert program is not None
    x, w, b = torch.randn(rows, k), torch.randn(n, k), torch.randn(n)
    want = torch.relu(torch.addmm(b, x, w.t()))
    (out,) = program.run([x, w, b])
    assert out.shape == want.shape and out.stride() == program.output_metas[0].stride
    torch.testing.assert_close(out, want)
    into = torch.full((rows, n), 7.0)
    program.run_into([x, w, b], [into])
    torch.testing.assert_close(into, want)
    assert program.input_metas == tuple(linear_relu_plan(rows, k, n).inputs)


def test_preparable_names_what_a_program_cannot_take() -> None:
    plan = linear_relu_plan()
    assert preparable(plan) is None
    assert "literal" in str(preparable(Plan(plan.inputs, plan.nodes, [3], {}, True)))
    assert "not a tensor" in str(preparable(Plan([None, *plan.inputs[1:]], plan.nodes, plan.outputs, {}, True)))
    symbolic = TensorMeta((-1, 5), (5, 1), F32, "cpu", True)
    assert "symbolic" in str(preparable(Plan([symbolic, *plan.inputs[1:]], plan.nodes, plan.outputs, {}, True)))
    with pytest.raises(ValueError, match="cannot prepare"):
        TorchProgram(Plan(plan.inputs, plan.nodes, [3], {}, True))


def test_bad_tensors_are_refused_with_a_reason() -> None:
    program = OfferingEngine().prepare(linear_relu_plan())
    assert program is not None
    x, w, b = torch.randn(3, 5), torch.randn(4, 5), torch.randn(4)
    out = torch.empty(3, 4)
    cases: list[tuple[list[Any], list[Any], type[Exception], str]] = [
        ([x, w], [out], ValueError, "expected 3 input"),
        ([x, w, b], [], ValueError, "expected 1 output"),
        ([x.double(), w, b], [out], ValueError, "dtype torch.float64"),
        ([torch.randn(5, 3).t(), w, b], [out], ValueError, "strides"),
        ([torch.randn(3, 6), w, b], [out], ValueError, "sizes"),
        ([x, w, 1.0], [out], TypeError, "not a tensor"),
        ([x, w, b], [torch.empty(4, 3).t()], ValueError, "strides"),
        ([torch._neg_view(x), w, b], [out], ValueError, "lazy negated"),
        ([x.to_sparse(), w, b], [out], ValueError, "layout"),
        ([x, w, b], [x[:, :4]], ValueError, "strides"),
    ]
    for inputs, outputs, error, message in cases:
        with pytest.raises(error, match=message):
            program.run_into(inputs, outputs)
    big = torch.empty(3, 9)
    with pytest.raises(ValueError, match="output 0 overlaps input 0"):
        check_no_overlap([big], [big[:, :4]])
    with pytest.raises(ValueError, match="output 1 overlaps output 0"):
        check_no_overlap([], [big[:, :4], big[:, 3:7]])
    check_no_overlap([big[:, :4]], [torch.empty(3, 4), torch.empty(0)])  # distinct memory: fine


def test_byte_span_covers_strided_views() -> None:
    base = torch.empty(4, 6)
    start = base.data_ptr()
    assert byte_span(base) == (start, start + 24 * 4)
    assert byte_span(base[:, 1:3]) == (start + 4, start + 4 * (1 + 3 * 6 + 2))
    first, last = byte_span(base[:0])
    assert first == last  # no elements: no bytes


# -- NodeInfo from a plan ------------------------------------------------------------------------
def test_node_info_of_a_plan_node_sees_the_slot_metas() -> None:
    plan = linear_relu_plan()
    info = NodeInfo.of_plan_node(plan, plan.nodes[1])
    assert info.op == "aten.addmm.default" and info.node is None and not info.symbolic
    assert info.inputs == [plan.inputs[2], plan.inputs[0], plan.nodes[0].out]
    assert info.out == plan.nodes[1].out
    assert torchburn.accepts((F32,))(info) is None
    assert "dtype" in str(torchburn.accepts((torch.float64,))(info))
    with_symint = Plan(
        [None, *plan.inputs], [PlanNode("aten.relu.default", (Ref(1),), {"n": Ref(0)}, plan.inputs[0])], [Ref(4)]
    )
    assert NodeInfo.of_plan_node(with_symint, with_symint.nodes[0]).symbolic


# -- telemetry: delegated is its own category ----------------------------------------------------
def _mlp() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU()).eval(), torch.randn(2, 6)


def test_op_coverage_reports_delegated_nodes_apart() -> None:
    torchburn.register_plugin(DelegatingPlugin(DelegatingEngine), "delegating")
    model, x = _mlp()
    with torch.no_grad():
        out = torch.compile(model, backend="torchburn", options={"engine": "delegating", "warn": False})(x)
    torch.testing.assert_close(out, model(x))
    cov = torchburn.op_coverage()
    assert set(cov) == {"native", "delegated", "routed", "fallback"}
    assert "aten.addmm.default" in cov["native"] and "aten.relu.default" not in cov["native"]
    assert cov["delegated"]["aten.relu.default"] >= 1
    by_engine = torchburn.op_coverage(by_engine=True)
    assert "delegating:aten.relu.default" in by_engine["delegated"]
    assert "delegating:aten.addmm.default" in by_engine["native"]
    from torchburn.telemetry import summary

    s = summary()
    assert s["delegated"] >= 1 and 0 < s["native_fraction"] < 1


def test_explain_lists_delegated_ops_and_is_not_fully_native() -> None:
    torchburn.register_plugin(DelegatingPlugin(DelegatingEngine), "delegating")
    model, x = _mlp()
    with torch.no_grad():
        explanation = torchburn.explain(model, x, options={"engine": "delegating"})
    assert explanation.delegated_ops["aten.relu.default"] == 1
    assert "aten.relu.default" not in explanation.native_ops
    assert explanation.native_ops["aten.addmm.default"] == 1
    assert not explanation.fully_native
    assert "delegated to PyTorch's kernels by delegating: aten.relu.default" in str(explanation)


def test_a_raising_delegated_ops_counts_the_partition_as_delegated() -> None:
    class Broken(DelegatingEngine):
        def delegated_ops(self, plan: Plan) -> set[str]:
            raise RuntimeError("bug")

    torchburn.register_plugin(DelegatingPlugin(Broken), "broken-delegating")
    model, x = _mlp()
    with torch.no_grad():
        explanation = torchburn.explain(model, x, options={"engine": "delegating"})
    assert not explanation.native_ops and explanation.delegated_ops["aten.addmm.default"] == 1


def test_cli_ops_marks_delegated_ops(capsys: pytest.CaptureFixture[str]) -> None:
    from torchburn.cli import main

    torchburn.register_plugin(DelegatingPlugin(DelegatingEngine), "delegating")
    assert main(["ops", "--format", "json", "--engine", "delegating"]) == 0
    rows = {r["op"]: r for r in json.loads(capsys.readouterr().out)["ops"]}
    assert rows["aten.addmm.default"]["delegating"] is True and rows["aten.addmm.default"]["delegated"] == []
    assert rows["aten.relu.default"]["delegating"] is False and rows["aten.relu.default"]["delegated"] == ["delegating"]
    assert main(["ops", "--engine", "delegating"]) == 0
    text = capsys.readouterr().out
    assert "delegated" in text and "(+2 delegated)" in text


# -- tb_register_kernels for an engine that cannot run them --------------------------------------
def test_kernels_for_an_engine_that_does_not_run_them_are_reported() -> None:
    class OwnExecutor(torchburn.Engine):
        name = "own_executor"

        def compile(self, plan: Plan) -> Any:
            return KernelProgram(plan, {op: resolve_op(op) for op in plan.ops()})

    class Pack:
        @torchburn.hookimpl
        def tb_register_kernels(self, registry: torchburn.KernelRegistry) -> None:
            registry.register("own_executor", "aten.relu.default", torch.relu)
            registry.register("not_installed", "aten.relu.default", torch.relu)

    torchburn.register_plugin(Plugin(OwnExecutor), "own")
    torchburn.register_plugin(Pack(), "pack")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        st = torchburn.plugins.state()
    assert st.unused_kernels == [("pack", "own_executor")]
    record = st.record("pack")
    assert record is not None and record.status == "loaded" and "not used" in record.reason
    assert any("pack -> own_executor" in str(w.message) for w in caught)


# -- the interop conformance suite on the reference engine ---------------------------------------
class TorchKernelEngine(OfferingEngine):
    """The reference engine for the suite: programs in PyTorch, eager kernels that check their input."""

    name = "torch_reference"

    def eager_kernel(self, op: str, dtype: torch.dtype) -> Callable[..., torch.Tensor] | None:
        if op not in ("aten.sin.default", "aten.tanh.default") or dtype is not F32:
            return None
        fn = resolve_op(op)

        def kernel(x: torch.Tensor) -> torch.Tensor:
            if not isinstance(x, torch.Tensor):
                raise TypeError("a tensor, please")
            if x.dtype is not F32 or not x.is_contiguous() or x.is_neg():
                raise ValueError("contiguous float32 only")
            return fn(x)  # type: ignore[no-any-return]

        return kernel


class TestReferenceInterop(InteropConformance):
    engine = "torch_reference"
    eager_ops = frozenset({"aten.sin.default", "aten.tanh.default"})

    @pytest.fixture(autouse=True)
    def _registered(self) -> None:
        torchburn.register_plugin(Plugin(TorchKernelEngine), "torch-reference")


def test_the_suite_fails_an_engine_that_declines_everything() -> None:
    class Declining(OfferingEngine):
        name = "declining"

        def prepare(self, plan: Plan) -> PreparedProgram | None:
            return None

    torchburn.register_plugin(Plugin(Declining), "declining")

    class Suite(InteropConformance):
        engine = "declining"

    with pytest.raises(AssertionError, match="declined every plan"):
        Suite().test_prepare_accepts_some_plan()


def test_the_suite_fails_a_program_that_skips_its_checks() -> None:
    class Unchecked(TorchProgram):
        def run_into(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
            result = self.program(*inputs)
            for out, value in zip(outputs, result if isinstance(result, tuple) else (result,)):
                out.copy_(value)

    class Careless(OfferingEngine):
        name = "careless"

        def prepare(self, plan: Plan) -> PreparedProgram | None:
            return Unchecked(plan) if preparable(plan) is None else None

    torchburn.register_plugin(Plugin(Careless), "careless")

    class Suite(InteropConformance):
        engine = "careless"

    with pytest.raises(BaseException) as caught:  # any failure of the case will do
        Suite().test_prepared_program_refuses_tensors_that_do_not_fit()
    assert not isinstance(caught.value, (KeyboardInterrupt, SystemExit))
