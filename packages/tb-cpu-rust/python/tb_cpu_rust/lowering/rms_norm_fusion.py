"""RMS norm written out in ATen (transformers' ``LlamaRMSNorm`` / ``Qwen2RMSNorm``:
``w * (x * rsqrt(mean(x ** 2, -1, keepdim=True) + eps))``) as one ``rms_norm`` step.

Node by node it is an elementwise sweep for the squares, a reduction, a sweep over the row
statistics and one for the scaling: three passes over the tensor and two temporaries. The
``rms_norm`` kernel reads each row once for its mean square and once to scale it, in the same
order of multiplications (``x * rstd``, then ``* w``).

``find_rms_norms`` matches the pattern on the plan before lowering (float32, contiguous result,
each intermediate read only inside the pattern); the lowerer skips the intermediate nodes and
lowers the last multiplication with ``lower_rms_norm``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tb_cpu_rust.lowering import steps as S
from tb_cpu_rust.lowering.dtypes import F32
from tb_cpu_rust.lowering.lowerer import contig
from torchburn.plan import Plan, Ref, TensorMeta


@dataclass(frozen=True)
class RmsNormMatch:
    """A matched RMS norm: its last node, the nodes it replaces, the input, weight and eps."""

    last: int
    inner: frozenset[int]
    x: Ref
    weight: Ref | None
    eps: float


def find_rms_norms(plan: Plan, uses: dict[int, int]) -> dict[int, RmsNormMatch]:
    """Every written-out RMS norm of the plan, by the node index of its last multiplication."""
    base = len(plan.inputs)

    def node(r: Any, op: tuple[str, ...]) -> tuple[int, Any] | None:
        if isinstance(r, Ref) and r.slot >= base and uses.get(r.slot, 0) == 1:
            k = r.slot - base
            if plan.nodes[k].op in op and not plan.nodes[k].kwargs:
                return k, plan.nodes[k]
        return None

    def meta(r: Any) -> TensorMeta | None:
        if not isinstance(r, Ref):
            return None
        m = plan.inputs[r.slot] if r.slot < base else plan.nodes[r.slot - base].out
        return m if isinstance(m, TensorMeta) else None

    def normalised(k: int, mul: Any) -> tuple[set[int], Ref, float] | None:
        """``x * rsqrt(mean(x ** 2) + eps)`` at node ``k``: (its nodes, x, eps)."""
        for x, r in (mul.args, mul.args[::-1]):
            rs = node(r, ("aten.rsqrt.default",))
            if rs is None:
                continue
            add = node(rs[1].args[0], ("aten.add.Tensor", "aten.add.Scalar"))
            if add is None or len(add[1].args) != 2 or not isinstance(add[1].args[1], (int, float)):
                continue
            mean = node(add[1].args[0], ("aten.mean.dim",))
            if not mean or len(mean[1].args) != 3 or mean[1].args[2] is not True:
                continue
            pw = node(mean[1].args[0], ("aten.pow.Tensor_Scalar",))
            if not pw or pw[1].args[0] != x or pw[1].args[1] != 2 or not isinstance(x, Ref):
                continue
            xm = meta(x)
            if xm is None or not xm.shape or list(mean[1].args[1]) not in ([-1], [len(xm.shape) - 1]):
                continue
            return {k, rs[0], add[0], mean[0], pw[0]}, x, float(add[1].args[1])
        return None

    found: dict[int, RmsNormMatch] = {}
    taken: set[int] = set()
    for k, n in enumerate(plan.nodes):
        if n.op != "aten.mul.Tensor" or n.kwargs or len(n.args) != 2 or not isinstance(n.out, TensorMeta):
            continue
        out = n.out
        if out.dtype != F32 or not out.shape or list(out.stride) != contig(out.shape):
            continue
        # with the weight: w * normalised(x) (either order), the normalised product read only here
        for w, inner_ref in (n.args, n.args[::-1]):
            got = node(inner_ref, ("aten.mul.Tensor",))
            wm = meta(w)
            if got is None or wm is None or wm.dtype != F32 or tuple(wm.shape) != (out.shape[-1],):
                continue
            match = normalised(got[0], got[1])
            xm = meta(match[1]) if match is not None else None
            if match is not None and xm is not None and xm.dtype == F32 and tuple(xm.shape) == tuple(out.shape):
                nodes, x, eps = match
                found[k] = RmsNormMatch(k, frozenset(nodes), x, w, eps)
                taken |= nodes
                break
        else:
            if k in taken:
                continue
            match = normalised(k, n)
            if match is not None:
                nodes, x, eps = match
                xm = meta(x)
                if xm is not None and xm.dtype == F32 and tuple(xm.shape) == tuple(out.shape):
                    found[k] = RmsNormMatch(k, frozenset(nodes - {k}), x, None, eps)
    # a bare x * rsqrt(...) matched on its own is also the inner product of a weighted match
    return {k: m for k, m in found.items() if k not in taken}


def lower_rms_norm(lw: Any, match: RmsNormMatch, out_meta: TensorMeta) -> int:
    from tb_cpu_rust.lowering.norms import dense_copy

    x = dense_copy(lw, lw.value(match.x))
    w = dense_copy(lw, lw.value(match.weight)) if match.weight is not None else None
    shape = list(out_meta.shape)
    y = lw.fresh(out_meta)
    rstd = lw.temp([*shape[:-1], 1])
    lw.steps.append(S.RmsNorm(x=x, weight=w, y=y, rstd=rstd, n=shape[-1], eps=match.eps))
    return y
