"""The lowering registry: one table from op to lowering, the engine's support read from it, and
the typed step schema that crosses into Rust."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from tb_cpu_rust import lowering
from tb_cpu_rust.engine import NativeCpuEngine
from tb_cpu_rust.lowering import registry
from tb_cpu_rust.lowering import steps as S
from torchburn.testing.conformance import compile_with, native_and_fallback


@pytest.fixture
def scratch_ops() -> Iterator[list[str]]:
    """Op names a test may register; removed from the table afterwards."""
    names: list[str] = []
    yield names
    for op in names:
        registry.LOWERINGS.pop(op, None)


def test_engine_support_is_the_registry() -> None:
    engine = NativeCpuEngine()
    ops = lowering.supported_ops()
    assert engine.covered_ops() == set(ops)
    assert set(engine.kernels()) == set(ops)
    # every supported op names the family module that lowers it
    by_family = lowering.families()
    assert sorted(op for fam in by_family.values() for op in fam) == sorted(ops)
    assert {"elementwise", "gemm", "reductions", "norms", "attention", "conv_pool", "indexing", "linalg"} <= set(
        by_family
    )


def test_an_op_has_one_default_lowering(scratch_ops: list[str]) -> None:
    op = "aten.test_registry_op.default"
    scratch_ops.append(op)

    @registry.register_lowering(op)
    def first(lw: Any, node: Any) -> None:
        return None

    with pytest.raises(ValueError, match="already has a default lowering"):

        @registry.register_lowering(op)
        def second(lw: Any, node: Any) -> None:
            return None


def test_when_variants_are_tried_before_the_default(scratch_ops: list[str]) -> None:
    op = "aten.test_registry_variant.default"
    scratch_ops.append(op)

    def default(lw: Any, node: Any) -> str:
        return "default"

    def variant(lw: Any, node: Any) -> str:
        return "variant"

    registry.register_lowering(op)(default)
    registry.register_lowering(op, when=lambda lw, node: node.args[0] == "wide")(variant)

    class Node:
        def __init__(self, arg: str) -> None:
            self.op, self.args, self.out = op, (arg,), None

    assert registry.lowering_for(None, Node("wide")) is variant  # type: ignore[arg-type]
    assert registry.lowering_for(None, Node("narrow")) is default  # type: ignore[arg-type]
    # a variant alone does not make an op supported
    only_variant = "aten.test_registry_variant_only.default"
    scratch_ops.append(only_variant)
    registry.register_lowering(only_variant, when=lambda lw, node: True)(variant)
    assert only_variant not in lowering.supported_ops()


def test_an_unregistered_op_is_refused_with_a_reason() -> None:
    class Info:
        op = "aten.not_an_op_native_cpu_has.default"

    assert lowering.check(Info()) == "no native kernel"


def test_a_registered_check_decides() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.max_pool2d(x, 2)

    # 3-d input: the pooling family's own check refuses it (only 4-d), so it falls back to eager
    x = torch.randn(2, 6, 6)
    compiled, reports = compile_with("native_cpu", fn, cache=False)
    torch.testing.assert_close(compiled(x), fn(x))
    native, fallback = native_and_fallback(reports)
    assert any("max_pool2d" in op for op in fallback), (native, fallback)


def _dummy(cls: type[S.Step]) -> S.Step:
    values: dict[str, Any] = {}
    for i, f in enumerate(dataclasses.fields(cls)):
        if f.metadata.get("wire"):
            values[f.name] = [10 + i, 20 + i] if f.metadata.get("many") else 10 + i
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            values[f.name] = "f32"
    return cls(**values)


@pytest.mark.parametrize("kind", sorted(S.step_kinds()))
def test_every_step_kind_serialises_its_operands_in_field_order(kind: str) -> None:
    cls = S.step_kinds()[kind]
    step = _dummy(cls)
    obj = json.loads(json.dumps(S.wire(step)))
    assert obj["op"] == kind == cls.OP
    expect_ins: list[Any] = []
    expect_outs: list[Any] = []
    for f in dataclasses.fields(cls):
        target = {"ins": expect_ins, "outs": expect_outs}.get(f.metadata.get("wire", ""))
        if target is not None:
            value = getattr(step, f.name)
            target.extend(value) if f.metadata.get("many") else target.append(value)
    assert obj["ins"] == expect_ins
    assert obj["outs"] == expect_outs
    assert step.reads() == expect_ins and step.writes() == expect_outs


def test_step_kinds_are_unique_and_frozen() -> None:
    kinds = S.step_kinds()
    assert len(kinds) == len(set(kinds.values()))
    gather = S.Gather(x=0, index=1, out=2, dim=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        gather.dim = 0  # type: ignore[misc]


def test_a_gemm_epilogue_is_recorded_on_the_typed_step() -> None:
    lin = torch.nn.Linear(8, 4)

    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(lin(x))

    seen: list[dict[str, Any]] = []
    from tb_cpu_rust import program

    original = program.lower

    def record(plan: Any) -> dict[str, Any]:
        result = original(plan)
        seen.append(result["spec"])
        return result

    mp = pytest.MonkeyPatch()
    mp.setattr(program, "lower", record)
    try:
        compiled, _ = compile_with("native_cpu", fn, cache=False)
        x = torch.randn(5, 8)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), fn(x))
    finally:
        mp.undo()
    gemms = [s for spec in seen for s in spec["steps"] if s["op"] == "gemm"]
    assert len(gemms) == 1 and gemms[0]["epilogue"] == ["relu"]


def test_python_writes_only_step_kinds_the_executor_reads() -> None:
    from tb_cpu_rust import _native

    assert set(S.step_kinds()) <= set(_native.STEP_KINDS)
    assert S.SCHEMA_VERSION == _native.STEP_SCHEMA_VERSION


def _copy_plan(**extra: Any) -> dict[str, Any]:
    """A plan that copies a float32 vector of 3 (``extra``: top-level fields such as the schema)."""
    layout = {"offset": 0, "sizes": [3], "strides": [1]}
    source = {"kind": "input", "dtype": "float32", "numel": 0, "sizes": [3], "strides": [1]}
    buffers = [source, {"kind": "output", "dtype": "float32", "numel": 3}]
    steps = [S.wire(S.Ew("f32", [0], [1], S.copy_program()))]
    return {**extra, "buffers": buffers, "values": [{"buf": b, **layout} for b in (0, 1)], "steps": steps}


def test_a_plan_for_another_step_schema_is_refused_by_name() -> None:
    from tb_cpu_rust import _native

    _native.Executor(json.dumps(_copy_plan(schema=S.SCHEMA_VERSION)))
    with pytest.raises(ValueError, match=f"schema {S.SCHEMA_VERSION + 7}.*schema {S.SCHEMA_VERSION}"):
        _native.Executor(json.dumps(_copy_plan(schema=S.SCHEMA_VERSION + 7)))


@pytest.mark.parametrize(
    ("step", "message"),
    [
        ({"op": "gather", "ins": [0, 0], "outs": [1]}, "missing field `dim`"),
        ({"op": "gather", "ins": [0, 0], "outs": [1], "dim": "0"}, "invalid type"),
        ({"op": "no_such_step", "ins": [0], "outs": [1]}, "no_such_step"),
    ],
)
def test_a_malformed_step_is_refused_at_the_boundary(step: dict[str, Any], message: str) -> None:
    from tb_cpu_rust import _native

    plan = _copy_plan()
    plan["steps"] = [step]
    with pytest.raises(ValueError, match=message):
        _native.Executor(json.dumps(plan))


def _default_step(cls: type[S.Step]) -> S.Step:
    """A step of kind ``cls`` with its parameters' defaults, reading value 0 and writing value 1."""
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        wire = f.metadata.get("wire")
        if wire is not None:
            value = 0 if wire == "ins" else 1
            kwargs[f.name] = [value] if f.metadata.get("many") else value
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            kwargs[f.name] = {"str": "f32", "int": 0, "bool": False, "float": 0.0}[f.metadata["param"]]
    return cls(**kwargs)


@pytest.mark.parametrize("tag", sorted(S.step_kinds()))
def test_the_executor_reads_every_field_python_writes(tag: str) -> None:
    """Python's fields of each kind are the ones its Rust family reads: the family's builder reads
    its parameters before it looks at the operands (here float32 vectors that fit few kernels), so
    a step that fails to build fails on its shapes, never on a missing, unknown or mistyped field."""
    from tb_cpu_rust import _native

    plan = _copy_plan()
    plan["steps"] = [S.wire(_default_step(S.step_kinds()[tag]))]
    try:
        _native.Executor(json.dumps(plan))
    except ValueError as exc:
        assert not any(m in str(exc) for m in ("unknown field", "missing field", "invalid type", "unknown step")), exc


def test_the_engine_version_carries_the_step_schema() -> None:
    assert NativeCpuEngine().version().endswith(f"+steps{S.SCHEMA_VERSION}")
