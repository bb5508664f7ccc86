"""KernelProgram: runs a plan by calling one kernel per node, arguments pre-resolved.

This is the default executor for engines whose kernels are Python callables. The per-node
argument shuffling is resolved once at construction, so a call is a flat loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchburn.plan import GETITEM, Plan, Ref


class KernelProgram:
    def __init__(self, plan: Plan, kernels: dict[str, Callable[..., Any]]) -> None:
        self.plan = plan
        self._n_inputs = len(plan.inputs) - len(plan.constants)
        self._constants = [plan.constants[k] for k in sorted(plan.constants)]
        self._steps: list[
            tuple[Callable[..., Any], Callable[[list[Any]], tuple[Any, ...]], Callable[[list[Any]], dict[str, Any]]]
        ] = []
        for node in plan.nodes:
            if node.op == GETITEM:
                fn: Callable[..., Any] = _getitem
            else:
                try:
                    fn = kernels[node.op]
                except KeyError:
                    raise KeyError(f"no kernel for {node.op} in this engine") from None
            self._steps.append((fn, _binder(node.args), _binder(node.kwargs)))
        self._outputs = [o.slot if isinstance(o, Ref) else None for o in plan.outputs]
        self._literal_outputs = list(plan.outputs)

    def __call__(self, *inputs: Any) -> Any:
        values = [*inputs, *self._constants]
        for fn, args, kwargs in self._steps:
            values.append(fn(*args(values), **kwargs(values)))
        out = tuple(
            values[slot] if slot is not None else self._literal_outputs[i] for i, slot in enumerate(self._outputs)
        )
        return out[0] if self.plan.single_output else out


def _getitem(value: Any, index: int) -> Any:
    return value[index]


def _binder(template: Any) -> Callable[[list[Any]], Any]:
    """A function that fills the Refs of ``template`` from the value list."""
    if not _has_ref(template):
        return lambda values: template
    if isinstance(template, Ref):
        slot = template.slot
        return lambda values: values[slot]
    if isinstance(template, tuple):
        parts = [_binder(t) for t in template]
        return lambda values: tuple(p(values) for p in parts)
    if isinstance(template, list):
        parts = [_binder(t) for t in template]
        return lambda values: [p(values) for p in parts]
    if isinstance(template, dict):
        items = [(k, _binder(v)) for k, v in template.items()]
        return lambda values: {k: p(values) for k, p in items}
    return lambda values: template


def _has_ref(template: Any) -> bool:
    if isinstance(template, Ref):
        return True
    if isinstance(template, (tuple, list)):
        return any(_has_ref(t) for t in template)
    if isinstance(template, dict):
        return any(_has_ref(t) for t in template.values())
    return False
