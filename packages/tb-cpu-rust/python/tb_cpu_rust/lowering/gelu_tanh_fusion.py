"""The tanh GELU written out in ATen (GPT-2's ``NewGELUActivation``, "gelu_new":
``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x ** 3)))``) as one ``gelu_tanh``.

Node by node it is eight elementwise ops that read ``x`` three times; as one group the
interpreter still runs sixteen instructions per element (1.4 ns / element for GPT-2's 4 × 64 ×
1024 MLP activation, a third of the GEMM before it). ``find_tanh_gelus`` matches the pattern on
the plan before lowering (float32, every intermediate read only inside the pattern, the
constants those of the formula); the lowerer skips the inner nodes and lowers the last
multiplication as ``aten.gelu(x, approximate="tanh")``: one vectorised op, and the GEMM's
epilogue when ``x`` is a GEMM result nothing else reads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tb_cpu_rust.lowering.dtypes import F32
from torchburn.plan import Plan, PlanNode, Ref, TensorMeta

#: sqrt(2 / pi), and the cubic term's coefficient
_K0 = math.sqrt(2.0 / math.pi)
_K1 = 0.044715


@dataclass(frozen=True)
class TanhGeluMatch:
    """A matched tanh GELU: its last node, the nodes it replaces, and x."""

    last: int
    inner: frozenset[int]
    x: Ref


def _is_const(v: Any, want: float, tol: float = 1e-7) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and abs(float(v) - want) <= tol * max(1.0, abs(want))


def find_tanh_gelus(plan: Plan, uses: dict[int, int]) -> dict[int, TanhGeluMatch]:
    """Every written-out tanh GELU of the plan, by the node index of its last multiplication."""
    base = len(plan.inputs)

    def node(r: Any, ops: tuple[str, ...]) -> tuple[int, PlanNode] | None:
        """The node behind ``r`` when it is one of ``ops`` and read only once."""
        if isinstance(r, Ref) and r.slot >= base and uses.get(r.slot, 0) == 1:
            k = r.slot - base
            n = plan.nodes[k]
            if n.op in ops and isinstance(n.out, TensorMeta) and n.out.dtype == F32:
                return k, n
        return None

    def scaled(r: Any, c: float) -> tuple[int, Any] | None:
        """``r`` = ``v * c`` (either order, a single-use node): (its index, v)."""
        got = node(r, ("aten.mul.Tensor", "aten.mul.Scalar"))
        if got is None or len(got[1].args) != 2 or got[1].kwargs:
            return None
        a, b = got[1].args
        if _is_const(b, c):
            return got[0], a
        if _is_const(a, c):
            return got[0], b
        return None

    def plus(r: Any) -> tuple[int, Any, Any] | None:
        got = node(r, ("aten.add.Tensor",))
        if got is None or len(got[1].args) != 2 or float(got[1].kwargs.get("alpha", 1)) != 1.0:
            return None
        return got[0], got[1].args[0], got[1].args[1]

    def inner_of(half_arg: Any, rest: Any) -> tuple[set[int], Ref] | None:
        """``half_arg`` = x * 0.5 and ``rest`` = 1 + tanh(sqrt(2/pi) * (x + 0.044715 * x³))."""
        half = scaled(half_arg, 0.5)
        one = plus(rest)
        if half is None or one is None or not isinstance(half[1], Ref):
            return None
        x = half[1]
        k1, a, b = one
        t = a if _is_const(b, 1.0) else b if _is_const(a, 1.0) else None
        th = node(t, ("aten.tanh.default",))
        if th is None:
            return None
        d = scaled(th[1].args[0], _K0)
        if d is None:
            return None
        c = plus(d[1])
        if c is None:
            return None
        k2, p, q = c
        cube_ref = q if p == x else p if q == x else None
        cube = scaled(cube_ref, _K1)
        if cube is None:
            return None
        pw = node(cube[1], ("aten.pow.Tensor_Scalar",))
        if pw is None or len(pw[1].args) != 2 or pw[1].args[0] != x or not _is_const(pw[1].args[1], 3.0):
            return None
        return {half[0], k1, th[0], d[0], k2, cube[0], pw[0]}, x

    found: dict[int, TanhGeluMatch] = {}
    for k, n in enumerate(plan.nodes):
        if n.op != "aten.mul.Tensor" or n.kwargs or len(n.args) != 2 or not isinstance(n.out, TensorMeta):
            continue
        if n.out.dtype != F32:
            continue
        for a, b in (n.args, n.args[::-1]):
            m = inner_of(a, b)
            if m is not None:
                nodes, x = m
                xm = plan.inputs[x.slot] if x.slot < base else plan.nodes[x.slot - base].out
                if isinstance(xm, TensorMeta) and xm.dtype == F32 and tuple(xm.shape) == tuple(n.out.shape):
                    found[k] = TanhGeluMatch(k, frozenset(nodes), x)
                break
    return found


def lower_tanh_gelu(lw: Any, match: TanhGeluMatch, out_meta: TensorMeta) -> Any:
    # x was read three times inside the pattern and now once
    lw.uses[match.x.slot] = lw.uses.get(match.x.slot, 0) - 2
    gelu = PlanNode("aten.gelu.default", (match.x,), {"approximate": "tanh"}, out_meta)
    return lw.lower_node(gelu, lw.node_slot)
