"""Common-subexpression elimination over a functional ATen FX graph.

The direct inference path leaves its graphs as AOTAutograd does: two calls of the same pure op on
the same arguments become one. torch has such a pass (``torch._functorch.compile_utils``), but
importing it pulls in inductor's pattern matcher and lowering table (~140 modules, a noticeable
part of a first call), so tb-core keeps its own.

Only calls that are safe to merge are merged: ATen overloads whose schema mutates nothing and that
are not random (``nondeterministic_seeded``), and ``operator.getitem``. Literal arguments are
compared by type and exact value, so ``x * 0.0`` and ``x * -0.0``, or ``1`` and ``True``, stay apart;
a call with an argument that cannot be compared exactly (a NaN, an unknown object) is kept as is,
and so is a node the graph returns.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx

_UNHASHABLE = object()


def _pure(target: Any) -> bool:
    if target is operator.getitem:
        return True
    if not isinstance(target, torch._ops.OpOverload):
        return False
    if target._schema.is_mutable or torch.Tag.nondeterministic_seeded in target.tags:
        return False
    return not any(a.alias_info is not None and a.alias_info.is_write for a in target._schema.arguments)


def _key(value: Any) -> Any:
    """A hashable, exact stand-in for an argument (nodes by identity, literals by type and value)."""
    if isinstance(value, fx.Node):
        return ("node", id(value))
    if isinstance(value, (list, tuple)):
        parts = tuple(_key(v) for v in value)
        return _UNHASHABLE if _UNHASHABLE in parts else (type(value).__name__, parts)
    if isinstance(value, dict):
        parts = tuple((k, _key(v)) for k, v in sorted(value.items()))
        return _UNHASHABLE if any(p[1] is _UNHASHABLE for p in parts) else ("dict", parts)
    if isinstance(value, float):
        # repr tells -0.0 from 0.0; a nan argument is left alone rather than compared
        return ("float", repr(value)) if value == value else _UNHASHABLE
    if value is None or isinstance(value, (bool, int, str, torch.dtype, torch.device, torch.layout)):
        return (type(value).__name__, value)
    if isinstance(value, torch.memory_format):
        return ("memory_format", str(value))
    return _UNHASHABLE


def eliminate_common_subexpressions(graph: fx.Graph) -> fx.Graph:
    """A new graph in which repeated pure calls on the same arguments are computed once."""
    new = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    seen: dict[Any, fx.Node] = {}
    # eager returns a tensor of its own for each output: merging one into another would make two
    # outputs share storage (the direct path then refuses the graph)
    returned = {n for n in graph.nodes if n.op == "output" for n in n.all_input_nodes}
    for node in graph.nodes:
        if node.op == "call_function" and _pure(node.target) and node not in returned:
            args = fx.map_arg(node.args, lambda n: env[n])
            kwargs = fx.map_arg(node.kwargs, lambda n: env[n])
            key = (node.target, _key(args), _key(kwargs))
            if _UNHASHABLE not in key:
                hit = seen.get(key)
                if hit is not None:
                    env[node] = hit
                    continue
                env[node] = new.node_copy(node, lambda n: env[n])
                seen[key] = env[node]
                continue
        env[node] = new.node_copy(node, lambda n: env[n])
    return new
