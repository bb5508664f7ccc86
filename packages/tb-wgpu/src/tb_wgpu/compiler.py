"""Plan -> Program: walk the plan once, lowering each node through the kernel table."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tb_wgpu.device import context
from tb_wgpu.kernels import TABLE
from tb_wgpu.lower import TV, Lazy, Lowered, Lowerer, LoweringError, contiguous_strides
from tb_wgpu.program import Program
from torchburn.plan import GETITEM, Plan, Ref, TensorMeta


@dataclass
class NodeCtx:
    out: Any
    uses: int
    info_inputs: list[TensorMeta]

    def uses_of(self, index: int) -> int:
        return self.uses


def _count_uses(plan: Plan) -> dict[int, int]:
    uses: dict[int, int] = {}

    def visit(value: Any) -> None:
        if isinstance(value, Ref):
            uses[value.slot] = uses.get(value.slot, 0) + 1
        elif isinstance(value, (list, tuple)):
            for v in value:
                visit(v)
        elif isinstance(value, dict):
            for v in value.values():
                visit(v)

    for node in plan.nodes:
        visit(node.args)
        visit(node.kwargs)
    visit(plan.outputs)
    # Outputs count twice: a value that leaves the partition must not be rewritten in place
    # by a later epilogue.
    visit(plan.outputs)
    return uses


def lower_plan(plan: Plan, ctx: Any) -> Lowered:
    uses = _count_uses(plan)
    L = Lowerer(ctx, uses)
    env: dict[int, Any] = {}
    input_tvs: dict[int, TV] = {}
    for slot, meta in enumerate(plan.inputs):
        if meta is None:
            raise LoweringError("a non-tensor partition input")
        sid = L.new_storage(meta.numel, meta.dtype, input_slot=slot)
        tv = TV(sid, 0, tuple(meta.shape), contiguous_strides(tuple(meta.shape)), meta.dtype)
        env[slot] = input_tvs[slot] = tv
    n_in = len(plan.inputs)

    def resolve(value: Any) -> Any:
        if isinstance(value, Ref):
            return env[value.slot]
        if isinstance(value, tuple):
            return tuple(resolve(v) for v in value)
        if isinstance(value, list):
            return [resolve(v) for v in value]
        if isinstance(value, dict):
            return {k: resolve(v) for k, v in value.items()}
        return value

    def metas(value: Any) -> list[TensorMeta]:
        found: list[TensorMeta] = []

        def visit(v: Any) -> None:
            if isinstance(v, Ref):
                m = plan.slot_meta(v.slot)
                if isinstance(m, TensorMeta):
                    found.append(m)
            elif isinstance(v, (list, tuple)):
                for x in v:
                    visit(x)

        visit(value)
        return found

    for index, node in enumerate(plan.nodes):
        slot = n_in + index
        if node.op == GETITEM:
            source, item = node.args
            value = env[source.slot][item]
            if isinstance(value, Lazy):
                value.uses = uses.get(slot, 0)
        else:
            lower = TABLE.get(node.op)
            if lower is None:
                raise LoweringError(f"no wgpu lowering for {node.op}")
            nctx = NodeCtx(node.out, uses.get(slot, 0), metas(node.args))
            value = lower(L, nctx, *resolve(node.args), **resolve(node.kwargs))
        if isinstance(value, TV) and uses.get(slot, 0) != 1:
            L.epilogue_open.pop(value.storage, None)
        env[slot] = value
    outputs: list[Any] = []
    input_storages = {tv.storage for tv in input_tvs.values()}
    for ref in plan.outputs:
        if not isinstance(ref, Ref):
            outputs.append(ref)
            continue
        value = env[ref.slot]
        if value is None:
            outputs.append(None)
            continue
        tv = L.as_tv(value)
        if tv.storage in input_storages:
            # The result would alias an input: copy, so only fresh device storages are read back.
            tv = L.contiguous(tv) if not tv.is_contiguous else L.materialize(L.as_expr(tv), tv.shape, tv.dtype)
        outputs.append(tv)
    return Lowered(L.storages, L.launches, input_tvs, outputs, L.err_storage, L.checks)


def compile_plan(plan: Plan) -> Program:
    ctx = context()
    with ctx.lock:
        lowered = lower_plan(plan, ctx)
        return Program(ctx, lowered, plan)
