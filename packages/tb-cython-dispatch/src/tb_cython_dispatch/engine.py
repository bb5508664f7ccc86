"""Plan -> PlanRunner: resolve each node's callable and argument slots once.

A node's callable is the kernel a plugin registered for ``cython_dispatch`` (``tb_register_kernels``)
when one is registered for its op and its checker accepts the node; otherwise the op's own ATen
entry, that is PyTorch's kernel (telemetry counts such nodes as "delegated").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tb_cython_dispatch import _impl
from torchburn import NodeInfo, Plan, Ref
from torchburn.plan import GETITEM, PlanNode, resolve_op
from torchburn.registry import Kernel

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


def registered_kernel(plan: Plan, node: PlanNode, kernels: dict[str, Kernel]) -> Callable[..., Any] | None:
    """The registered kernel that runs ``node``, or None (its ATen entry runs it)."""
    kernel = kernels.get(node.op)
    if kernel is None or node.op == GETITEM:
        return None
    if kernel.checker is not None:
        try:
            reason = kernel.checker(NodeInfo.of_plan_node(plan, node))
        except Exception:  # a buggy checker means "no", as in the partitioner
            return None
        if reason is not None:
            return None
    return kernel.fn


def delegated_ops(plan: Plan, kernels: dict[str, Kernel]) -> set[str]:
    """Ops of ``plan`` with a node that runs on its ATen entry (an op counts as delegated when any
    of its nodes is, so telemetry never claims a native kernel that did not run)."""
    return {node.op for node in plan.nodes if node.op != GETITEM and registered_kernel(plan, node, kernels) is None}


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


def compile_plan(plan: Plan, core: Any = None, kernels: dict[str, Kernel] | None = None) -> Callable[..., Any]:
    core = core or _impl.core
    kernels = kernels or {}
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
                registered_kernel(plan, node, kernels) or entry_point(node.target, node.op),
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
