"""What an engine sees of one graph node when it decides whether to take it."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from torchburn.plan import Plan, PlanNode, Ref, TensorMeta, meta_of_value, op_name, size_hint

_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)


@dataclass
class NodeInfo:
    op: str  # "aten.addmm.default"
    target: Any
    args: tuple[Any, ...]  # FX args (Nodes stay Nodes); from a plan, Refs stay Refs
    kwargs: dict[str, Any]
    inputs: list[TensorMeta]  # metas of every tensor argument, in order
    out: Any  # TensorMeta, tuple of them, or None
    symbolic: bool  # a size, stride or scalar argument is symbolic
    node: torch.fx.Node | None = None
    #: Built by ``hinted``: the sizes are one concrete example of a node whose sizes are symbolic.
    #: An engine that takes it is given the partition specialised to each concrete shape it meets
    #: (``torchburn.specialise``), and checked again on those shapes.
    from_hint: bool = False

    @staticmethod
    def of(node: torch.fx.Node) -> NodeInfo:
        inputs: list[TensorMeta] = []
        symbolic = False

        def visit(arg: torch.fx.Node) -> torch.fx.Node:
            nonlocal symbolic
            val = arg.meta.get("val")
            if isinstance(val, torch.Tensor):
                meta = TensorMeta.of(val)
                inputs.append(meta)
                symbolic = symbolic or meta.symbolic
            elif isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)) or val is None:
                symbolic = True
            return arg

        torch.fx.node.map_arg((node.args, node.kwargs), visit)
        out = meta_of_value(node.meta.get("val"))
        metas = out if isinstance(out, tuple) else (out,)
        symbolic = symbolic or any(isinstance(m, TensorMeta) and m.symbolic for m in metas)
        return NodeInfo(
            op_name(node.target),
            node.target,
            tuple(node.args),
            dict(node.kwargs),
            inputs,
            out,
            symbolic,
            node,
        )

    @staticmethod
    def hinted(node: torch.fx.Node) -> NodeInfo | str:
        """A node with symbolic sizes as a static node, its sizes and symbolic scalar arguments
        replaced by their hints (the example the graph was traced with), so an engine decides on
        it as on the static graph's node. The reason instead where that cannot be done."""
        inputs: list[TensorMeta] = []
        problems: list[str] = []

        def visit(arg: torch.fx.Node) -> Any:
            val = arg.meta.get("val")
            if isinstance(val, torch.Tensor):
                meta = TensorMeta.hint_of(val)
                if meta is None:
                    problems.append(f"{arg.name} has a data-dependent size")
                    return arg
                inputs.append(meta)
                return arg
            if isinstance(val, _SYMBOLIC):
                hint = size_hint(val)
                if hint is None:
                    problems.append(f"{arg.name} is a data-dependent size")
                return hint
            if val is None:
                problems.append(f"{arg.name} has no recorded value")
            return arg if val is None else val

        args = torch.fx.node.map_arg(node.args, visit)
        kwargs = torch.fx.node.map_arg(node.kwargs, visit)
        value = node.meta.get("val")
        leaves = value if isinstance(value, (tuple, list)) else (value,)
        if not all(isinstance(v, torch.Tensor) or v is None for v in leaves) or value is None:
            return "computes a size, not a tensor (size arithmetic runs in Python)"
        out = tuple(TensorMeta.hint_of(v) if v is not None else None for v in leaves)
        if any(m is None and v is not None for m, v in zip(out, leaves)):
            problems.append("its result has a data-dependent size")
        if problems:
            return "symbolic shape without a concrete example: " + "; ".join(problems)
        return NodeInfo(
            op_name(node.target),
            node.target,
            tuple(args),
            dict(kwargs),
            inputs,
            out if isinstance(value, (tuple, list)) else out[0],
            False,
            node,
            from_hint=True,
        )

    @staticmethod
    def of_plan_node(plan: Plan, node: PlanNode) -> NodeInfo:
        """What a checker sees of one node of a compiled plan (an engine choosing per node at
        compile time). Tensor arguments are ``Ref``s; their metas come from the plan's slots."""
        inputs: list[TensorMeta] = []
        symbolic = False

        def visit(value: Any) -> None:
            nonlocal symbolic
            if isinstance(value, Ref):
                meta = plan.slot_meta(value.slot)
                if isinstance(meta, TensorMeta):
                    inputs.append(meta)
                    symbolic = symbolic or meta.symbolic
                elif meta is None:
                    symbolic = True  # a non-tensor value of the graph: a SymInt, say
            elif isinstance(value, (list, tuple)):
                for v in value:
                    visit(v)
            elif isinstance(value, dict):
                for v in value.values():
                    visit(v)

        visit(node.args)
        visit(node.kwargs)
        metas = node.out if isinstance(node.out, tuple) else (node.out,)
        symbolic = symbolic or any(isinstance(m, TensorMeta) and m.symbolic for m in metas)
        return NodeInfo(node.op, node.target, tuple(node.args), dict(node.kwargs), inputs, node.out, symbolic)

    @property
    def out_metas(self) -> list[TensorMeta]:
        metas = self.out if isinstance(self.out, tuple) else (self.out,)
        return [m for m in metas if isinstance(m, TensorMeta)]


def accepts(
    dtypes: Iterable[torch.dtype] = (torch.float32,),
    *,
    devices: Iterable[str] = ("cpu",),
    max_rank: int | None = None,
    contiguous: bool = False,
    allow_empty: bool = True,
    extra: Callable[[NodeInfo], str | None] | None = None,
) -> Callable[[NodeInfo], str | None]:
    """Build a checker: which dtypes, devices, ranks and layouts a kernel takes.

    The returned function gives ``None`` for an accepted node and otherwise the reason, which
    ``torchburn.explain`` shows the user.
    """
    dtype_set = frozenset(dtypes)
    device_set = frozenset(devices)

    def check(info: NodeInfo) -> str | None:
        if info.symbolic:
            return "symbolic shape"
        for meta in [*info.inputs, *info.out_metas]:
            if meta.dtype not in dtype_set:
                return f"dtype {meta.dtype} not in {sorted(str(d) for d in dtype_set)}"
            if meta.device not in device_set:
                return f"device {meta.device}"
            if max_rank is not None and len(meta.shape) > max_rank:
                return f"rank {len(meta.shape)} > {max_rank}"
            if not allow_empty and meta.numel == 0:
                return "empty tensor"
        if contiguous and not all(m.is_contiguous for m in info.inputs):
            return "non-contiguous input"
        return extra(info) if extra is not None else None

    return check
