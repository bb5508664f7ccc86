"""Plan -> PlanRunner: resolve each node's ATen callable and argument slots once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tb_cython_dispatch import _impl
from torchburn import NodeInfo, Plan, Ref
from torchburn.plan import GETITEM, resolve_op

LITERAL, SLOT, LIST, TUPLE = 0, 1, 2, 3


def check_node(node: NodeInfo) -> str | None:
    if node.op == GETITEM:
        return None
    if node.symbolic:
        return "symbolic shape"
    if not isinstance(node.target, torch._ops.OpOverload):
        return "not an ATen op overload"
    return None


def entry_point(target: Any, op: str) -> Callable[..., Any]:
    """The C++ callable behind an OpOverload: calling it skips OpOverload.__call__'s frame."""
    if op == GETITEM:
        return _getitem
    if target is None:
        target = resolve_op(op)
    fn = getattr(target, "_op", None)
    return fn if callable(fn) else target  # type: ignore[no-any-return]


def _getitem(value: Any, index: Any) -> Any:
    return value[index]


def _spec(value: Any, reads: list[int]) -> tuple[int, Any]:
    if isinstance(value, Ref):
        reads.append(value.slot)
        return SLOT, value.slot
    if isinstance(value, (list, tuple)) and _has_ref(value):
        items = tuple(_spec(v, reads) for v in value)
        return (LIST if isinstance(value, list) else TUPLE), items
    return LITERAL, value


def _has_ref(value: Any) -> bool:
    if isinstance(value, Ref):
        return True
    if isinstance(value, (list, tuple)):
        return any(_has_ref(v) for v in value)
    if isinstance(value, dict):
        return any(_has_ref(v) for v in value.values())
    return False


def compile_plan(plan: Plan, core: Any = None) -> Callable[..., Any]:
    core = core or _impl.core
    n_inputs = len(plan.inputs) - len(plan.constants)
    constants = tuple(plan.constants[k] for k in sorted(plan.constants))
    first = len(plan.inputs)
    raw: list[tuple[Any, ...]] = []
    node_reads: list[list[int]] = []
    for node in plan.nodes:
        reads: list[int] = []
        args = [_spec(a, reads) for a in node.args]
        kw = [(k, *_spec(v, reads)) for k, v in node.kwargs.items()]
        if any(isinstance(v, dict) and _has_ref(v) for v in node.kwargs.values()):
            raise ValueError(f"{node.op}: a dict argument holding tensors is not supported")
        raw.append(
            (
                entry_point(node.target, node.op),
                tuple(k for k, _ in args),
                tuple(v for _, v in args),
                tuple(name for name, _, _ in kw),
                tuple(k for _, k, _ in kw),
                tuple(v for _, _, v in kw),
            )
        )
        node_reads.append(reads)
    out_reads: list[int] = []
    outs = [_spec(o, out_reads) for o in plan.outputs]
    # Release each intermediate after its last reader (never inputs, constants or outputs).
    keep = set(out_reads)
    last: dict[int, int] = {}
    for index, reads in enumerate(node_reads):
        for slot in reads:
            last[slot] = index
    releases: list[list[int]] = [[] for _ in plan.nodes]
    for slot, index in last.items():
        if slot >= first and slot not in keep:
            releases[index].append(slot)
    steps = [(*r, tuple(rel)) for r, rel in zip(raw, releases)]
    return core.PlanRunner(
        steps,
        first + len(plan.nodes),
        n_inputs,
        constants,
        tuple(k for k, _ in outs),
        tuple(v for _, v in outs),
        bool(plan.single_output),
    )
