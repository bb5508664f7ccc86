"""Inference graphs without AOTAutograd's runtime wrapper.

A graph that cannot produce anything autograd tracks needs none of what AOTAutograd adds at run
time (autograd.Function, input-mutation write-back, output-alias regeneration). That is a graph
Dynamo hands over while grad mode is off, or while it is on but no input requires grad and no
value in the graph does (a plain function of plain tensors, a model's forward with frozen
weights). Dynamo guards on both grad mode and each input's ``requires_grad``, so the compiled
code only ever runs in that situation. For such a graph tb-core traces
the Dynamo graph to ATen itself — functionalized, with the same decomposition table, in fake
mode — and calls the partitioned result directly, which saves AOTAutograd's per-call prologue
and wrappers (about 30 µs a call on a 2-core VM, the whole cost of a small graph).

A graph with symbolic sizes (Dynamo's dynamic shapes: ``SymInt`` inputs, tensors with symbolic
sizes) is traced in Dynamo's own fake mode on Dynamo's symbolic example values, as AOTAutograd
traces it, so the ATen graph keeps its symbols; the partitioner then specialises its partitions
per concrete shape (``torchburn.specialise``). Such a graph is traced without
``torch.func.functionalize``: its C++ wrappers read sizes as plain ints (``linear`` on a 3-D input
guards the sequence length to its example value, and Dynamo would recompile at every length), so a
symbolic graph that writes in place (``relu_``, ``add_``) goes to AOTAutograd, whose functionalization
keeps the symbols.

Graphs this path is not sure about go to AOTAutograd as before: grad mode on with an input or
a value in the graph that requires grad (parameters, ``requires_grad=True`` factories), inputs
other than tensors and symbolic sizes, tensor subclasses, sparse inputs, grad-mode or autocast switches inside the
graph, an input the graph writes to, or an output that is an input or shares an input's (or
another output's) storage.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

_GLOBAL_STATE_CALLS = {
    torch._C._set_grad_enabled,
    torch.amp.autocast_mode._enter_autocast,
    torch.amp.autocast_mode._exit_autocast,
}


_PLAIN = (torch.Tensor, torch.nn.Parameter, getattr(torch.nn, "Buffer", torch.Tensor))


def _plain_tensor(t: Any) -> bool:
    return type(t) in _PLAIN and t.layout == torch.strided and not t.is_sparse


_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)


def eligible(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> bool:
    """Nothing requires grad (grad mode off, or no input or graph value needing it), plain
    tensor inputs and symbolic sizes only, no global-state switches in the graph."""
    if not all(_plain_tensor(t) or isinstance(t, _SYMBOLIC) for t in example_inputs):
        return False
    grad_on = torch.is_grad_enabled()
    if grad_on and any(isinstance(t, torch.Tensor) and t.requires_grad for t in example_inputs):
        return False
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in _GLOBAL_STATE_CALLS:
            return False
        val = node.meta.get("example_value", node.meta.get("val"))
        if grad_on and any(isinstance(v, torch.Tensor) and v.requires_grad for v in _leaves(val)):
            return False
    return True


def symbolic(gm: torch.fx.GraphModule) -> bool:
    """An input of the Dynamo graph is a size or has a symbolic size or stride."""
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        val = node.meta.get("example_value", node.meta.get("val"))
        if isinstance(val, _SYMBOLIC):
            return True
        if isinstance(val, torch.Tensor) and any(
            isinstance(s, torch.SymInt) for s in (*val.shape, *val.stride(), val.storage_offset())
        ):
            return True
    return False


def _symbolic_inputs(gm: torch.fx.GraphModule) -> tuple[Any, list[Any]] | None:
    """The fake mode of Dynamo's example values and its symbolic example value of each input, or
    None. (Not the tracing context's mode: Dynamo hands backends a fresh mode over the same shape
    environment, and fake tensors of two modes do not mix.)"""
    values = []
    modes = set()
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            val = node.meta.get("example_value", node.meta.get("val"))
            if isinstance(val, torch.Tensor):
                mode = getattr(val, "fake_mode", None)
                if mode is None:
                    return None
                modes.add(mode)
            elif not isinstance(val, _SYMBOLIC):
                return None
            values.append(val)
    if len(modes) != 1:
        return None
    (mode,) = modes
    return (mode, values) if mode.shape_env is not None else None


def trace(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], decompositions: dict[Any, Any]
) -> torch.fx.GraphModule | None:
    """The Dynamo graph as a functional ATen graph, or None where AOTAutograd must handle it."""
    from torch._dispatch.python import enable_python_dispatcher
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.multiprocessing.reductions import StorageWeakRef

    from torchburn.cse import eliminate_common_subexpressions

    is_symbolic = symbolic(gm)
    try:
        if is_symbolic:
            # Dynamo's fake mode and shape environment, its example values: the sizes stay
            # symbols (a size the trace needs to decide on adds a guard Dynamo installs)
            found = _symbolic_inputs(gm)
            if found is None:
                return None
            mode, fakes = found
        else:
            # a fresh fake mode without a shape environment: static sizes, as the guards are
            mode = FakeTensorMode()
            fakes = [mode.from_tensor(t) for t in example_inputs]
        # the Python dispatcher, as AOTAutograd traces: CompositeImplicit ops then take torch's
        # Python decompositions (batch_norm -> _native_batch_norm_legit_no_training, ...)
        # eligible() made sure nothing requires grad, so grad mode changes nothing here; off,
        # the trace is the inference graph whatever mode the caller is in
        with mode, enable_python_dispatcher(), torch.no_grad():
            traced = make_fx(
                gm if is_symbolic else torch.func.functionalize(gm, remove="mutations"),
                decomposition_table=decompositions,
                tracing_mode="real",
            )(*fakes)
        # as AOTAutograd leaves its graphs: dead nodes gone (the byte buffer batch norm's
        # reserve output makes), common subexpressions merged
        traced.graph.eliminate_dead_code()
        traced.graph = eliminate_common_subexpressions(traced.graph)
        traced.recompile()
    except Exception:
        return None
    placeholders = [n for n in traced.graph.nodes if n.op == "placeholder"]
    in_storages = set()
    for n in placeholders:
        val = n.meta.get("val")
        if isinstance(val, torch.Tensor):
            in_storages.add(StorageWeakRef(val.untyped_storage()))
    for node in traced.graph.nodes:
        # functionalization leaves only the write-back of a mutated input in place
        if (
            node.op == "call_function"
            and isinstance(node.target, torch._ops.OpOverload)
            and node.target._schema.is_mutable
        ):
            return None
    out_storages: set[Any] = set()
    output = next(n for n in traced.graph.nodes if n.op == "output")
    for leaf in _leaves(output.args):
        if not isinstance(leaf, torch.fx.Node):
            continue
        val = leaf.meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue
        ref = StorageWeakRef(val.untyped_storage())
        if leaf.op == "placeholder" or ref in in_storages or ref in out_storages:
            return None
        out_storages.add(ref)
    return traced


def _leaves(x: Any) -> list[Any]:
    if isinstance(x, (list, tuple)):
        return [y for item in x for y in _leaves(item)]
    if isinstance(x, dict):
        return [y for item in x.values() for y in _leaves(item)]
    return [x]
