"""Lowering: a torchburn ``Plan`` -> the executor spec (buffers, strided views, steps).

View ops are resolved here, at compile time, on meta tensors: they cost nothing at run time.
Elementwise ops are fused greedily into register programs that run as one sweep (an
intermediate value gets a buffer only if something outside its program reads it). Every other
op becomes one Rust kernel step. The spec is validated again in Rust before anything runs.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from tb_cpu_rust import complex_ops as _cplx
from tb_cpu_rust import ops_table as T
from tb_cpu_rust import wide_ops as _wide
from tb_cpu_rust.decomp import lower_decomp
from torchburn.plan import GETITEM, Plan, Ref, TensorMeta

F32, I64, BOOL = torch.float32, torch.int64, torch.bool
DT_NAME = {
    F32: "float32", I64: "int64", BOOL: "bool", torch.float64: "float64", torch.float16: "float16",
    torch.bfloat16: "bfloat16", torch.int32: "int32", torch.int16: "int16", torch.int8: "int8", torch.uint8: "uint8",
}
DT_NAME.update(_cplx.DT_NAMES)  # complex64/128/32: complex_ops.py
DT_OF_NAME = {v: k for k, v in DT_NAME.items()}
I32 = torch.int32


# unary ops a GEMM applies to its output tiles (names as the executor's epilogue knows them)
EPILOGUE_UNARY = {
    "aten.relu.default": "relu", "aten.silu.default": "silu", "aten.sigmoid.default": "sigmoid", "aten.tanh.default": "tanh",
}


MAX_EPILOGUE = 4  # the executor's fixed epilogue capacity (gemm::MAX_EPI)


class LoweringError(ValueError):
    pass


def _extent(shape: tuple[int, ...], stride: tuple[int, ...]) -> int:
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((s - 1) * st for s, st in zip(shape, stride))


def _contig(shape: list[int]) -> list[int]:
    out, acc = [0] * len(shape), 1
    for i in range(len(shape) - 1, -1, -1):
        out[i] = acc
        acc *= max(shape[i], 1)
    return out


@dataclass
class Lazy:
    """A value that lives only in a register of the open elementwise group."""

    group: Group
    reg: int
    meta: TensorMeta


@dataclass
class Group:
    shape: tuple[int, ...]
    compute: str
    prog: list[dict[str, Any]] = field(default_factory=list)
    ins: list[int] = field(default_factory=list)
    loads: dict[int, int] = field(default_factory=dict)  # value id -> register
    nregs: int = 0
    members: dict[int, Lazy] = field(default_factory=dict)  # slot -> lazy

    def reg(self) -> int:
        self.nregs += 1
        return self.nregs - 1

    def emit(self, op: str, a: list[int], f: list[float] | None = None) -> int:
        r = self.reg()
        self.prog.append({"op": op, "dst": r, "a": a, "f": f or []})
        return r


class Lowerer:
    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.buffers: list[dict[str, Any]] = []
        self.values: list[dict[str, Any]] = []
        self.steps: list[dict[str, Any]] = []
        self.slot: dict[int, Any] = {}
        self.group: Group | None = None
        # value id of a GEMM result -> its step, while an epilogue may still be fused into it
        self.gemm_open: dict[int, dict[str, Any]] = {}
        self.uses: dict[int, int] = {}
        self.used: dict[int, int] = {}
        # slot -> an int64 copy of a narrow-integer value, for the comparisons that read it
        self.widened: dict[int, int] = {}
        for node in plan.nodes:
            for r in _refs((node.args, node.kwargs)):
                self.uses[r] = self.uses.get(r, 0) + 1
        for r in _refs(plan.outputs):
            self.uses[r] = self.uses.get(r, 0) + 1

    # -- values ---------------------------------------------------------------------------
    def new_buffer(self, kind: str, meta: TensorMeta) -> int:
        self.buffers.append({
            "kind": kind, "dtype": DT_NAME[meta.dtype], "numel": _extent(meta.shape, meta.stride),
            "sizes": list(meta.shape) if kind == "input" else [], "strides": list(meta.stride) if kind == "input" else [],
        })
        return len(self.buffers) - 1

    def new_value(self, buf: int, offset: int, sizes: list[int], strides: list[int]) -> int:
        self.values.append({"buf": buf, "offset": offset, "sizes": list(sizes), "strides": list(strides)})
        return len(self.values) - 1

    def fresh(self, meta: TensorMeta) -> int:
        if meta.dtype not in DT_NAME:
            raise LoweringError(f"dtype {meta.dtype}")
        buf = self.new_buffer("temp", meta)
        return self.new_value(buf, 0, list(meta.shape), list(meta.stride))

    def dtype_of(self, v: int) -> torch.dtype:
        return DT_OF_NAME[self.buffers[self.values[v]["buf"]]["dtype"]]

    def meta_tensor(self, v: int) -> torch.Tensor:
        val = self.values[v]
        buf = self.buffers[val["buf"]]
        base = torch.empty(max(buf["numel"], 1), dtype=self.dtype_of(v), device="meta")
        return base.as_strided(val["sizes"], val["strides"], val["offset"])

    def pad_windows(self, x: int, o: int, pad: list[int]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """constant_pad_nd: the part of ``x`` that survives the (possibly negative) padding and
        where it lands in ``o``, as meta tensors; None when nothing survives."""
        src, dst = self.meta_tensor(x), self.meta_tensor(o)
        rank = dst.dim()
        for i in range(len(pad) // 2):
            d = rank - 1 - i
            lo, hi = pad[2 * i], pad[2 * i + 1]
            n = src.shape[d] - max(0, -lo) - max(0, -hi)
            if n <= 0:
                return None
            src = src.narrow(d, max(0, -lo), n)
            dst = dst.narrow(d, max(0, lo), n)
        return src, dst

    def view_of(self, v: int, t: torch.Tensor) -> int:
        return self.new_value(self.values[v]["buf"], t.storage_offset(), list(t.shape), list(t.stride()))

    def broadcast(self, v: int, shape: tuple[int, ...]) -> int:
        val = self.values[v]
        sizes, strides = val["sizes"], val["strides"]
        pad = len(shape) - len(sizes)
        if pad < 0:
            raise LoweringError("cannot broadcast to a lower rank")
        out = []
        for d, n in enumerate(shape):
            if d < pad:
                out.append(0)
            else:
                s, st = sizes[d - pad], strides[d - pad]
                if s == n:
                    out.append(st if n != 1 else 0)
                elif s == 1:
                    out.append(0)
                else:
                    raise LoweringError(f"cannot broadcast {sizes} to {shape}")
        return self.new_value(val["buf"], val["offset"], list(shape), out)

    # -- the open elementwise group ---------------------------------------------------------
    def flush(self) -> None:
        g, self.group = self.group, None
        if g is None:
            return
        outs = []
        for slot, lz in g.members.items():
            if self.used.get(slot, 0) < self.uses.get(slot, 0):
                v = self.fresh(lz.meta)
                g.prog.append({"op": "store", "dst": len(outs), "a": [lz.reg], "f": []})
                outs.append(v)
                self.slot[slot] = v
            else:
                self.slot[slot] = None  # fully consumed inside the program
        if outs:
            self.steps.append({"op": "ew", "compute": g.compute, "ins": g.ins, "outs": outs, "prog": g.prog})

    def value(self, arg: Any) -> int:
        """A materialised value id for a tensor argument."""
        if not isinstance(arg, Ref):
            raise LoweringError(f"expected a tensor, got {arg!r}")
        self.used[arg.slot] = self.used.get(arg.slot, 0) + 1
        v = self.slot.get(arg.slot)
        if isinstance(v, Lazy):
            self.used[arg.slot] -= 1  # the flush counts it as an outside use
            self.flush()
            self.used[arg.slot] += 1
            v = self.slot[arg.slot]
        if not isinstance(v, int):
            raise LoweringError(f"slot {arg.slot} has no tensor value")
        return v

    def operand(self, g: Group, arg: Any) -> int:
        """A register of ``g`` holding ``arg`` (a Ref or a Python scalar)."""
        if isinstance(arg, Ref):
            v = self.slot.get(arg.slot)
            if isinstance(v, Lazy) and v.group is g:
                self.used[arg.slot] = self.used.get(arg.slot, 0) + 1
                return v.reg
            if arg.slot in self.widened:
                self.used[arg.slot] = self.used.get(arg.slot, 0) + 1
                vid = self.widened[arg.slot]
            else:
                vid = self.value(arg)
            bv = self.broadcast(vid, g.shape)
            if bv not in g.loads:
                g.ins.append(bv)
                r = g.reg()
                g.prog.append({"op": "load", "dst": r, "a": [len(g.ins) - 1], "f": []})
                g.loads[bv] = r
            return g.loads[bv]
        if isinstance(arg, bool):
            return g.emit("const", [], [float(arg)])
        if isinstance(arg, (int, float)):
            if isinstance(arg, float) and g.compute == "i64" and not arg.is_integer():
                raise LoweringError("float scalar in an integer program")
            if isinstance(arg, float) and math.isnan(arg):
                zero = g.emit("const", [], [0.0])
                return g.emit("div", [zero, zero])  # JSON has no NaN literal
            return g.emit("const", [], [float(arg)])
        raise LoweringError(f"unsupported elementwise operand {arg!r}")

    def open_group(self, shape: tuple[int, ...], compute: str, args: Any) -> Group:
        g = self.group
        if g is not None and (g.shape != shape or g.compute != compute):
            # materialise what this node reads from the old group before starting a new one
            self.flush()
        if self.group is None:
            self.group = Group(shape, compute)
        return self.group

    # -- main loop --------------------------------------------------------------------------
    def lower(self) -> dict[str, Any]:
        plan = self.plan
        for i, meta in enumerate(plan.inputs):
            if meta is None or meta.symbolic:
                raise LoweringError("non-tensor or symbolic input")
            buf = self.new_buffer("input", meta)
            self.slot[i] = self.new_value(buf, 0, list(meta.shape), list(meta.stride))
        base = len(plan.inputs)
        for k, node in enumerate(plan.nodes):
            slot = base + k
            if node.op == GETITEM:
                src, idx = node.args
                self.used[src.slot] = self.used.get(src.slot, 0) + 1
                parent = self.slot.get(src.slot)
                if not isinstance(parent, tuple):
                    raise LoweringError("getitem of a non-tuple")
                item = parent[idx]
                if isinstance(item, Lazy):
                    item.group.members[slot] = item
                self.slot[slot] = item
                continue
            self.slot[slot] = self.lower_node(node, slot)
        self.flush()
        outputs = []
        for o in plan.outputs:
            if isinstance(o, Ref):
                outputs.append(("v", self.value(o)))
            else:
                outputs.append(("lit", o))
        return self.finish(outputs)

    def finish(self, outputs: list[Any]) -> dict[str, Any]:
        out_bufs = []
        for kind, v in outputs:
            if kind == "v":
                b = self.values[v]["buf"]
                if self.buffers[b]["kind"] == "temp":
                    self.buffers[b]["kind"] = "output"
                if self.buffers[b]["kind"] == "output" and b not in out_bufs:
                    out_bufs.append(b)
        self.share_temps()
        inputs = [i for i, b in enumerate(self.buffers) if b["kind"] == "input"]
        used = {v["buf"] for v in self.values}
        temps = [i for i, b in enumerate(self.buffers) if b["kind"] == "temp" and i in used]
        order = inputs + out_bufs + temps
        remap = {old: new for new, old in enumerate(order)}
        buffers = [self.buffers[i] for i in order]
        values = [{**v, "buf": remap[v["buf"]]} for v in self.values]
        spec = {"buffers": buffers, "values": values, "steps": self.steps}
        return {"spec": spec, "outputs": outputs, "values": values, "buffers": buffers, "n_inputs": len(inputs)}

    def share_temps(self) -> None:
        """Memory plan: temporaries whose lifetimes (first write .. last read, in step order)
        do not overlap share one workspace slot, so a plan needs as much scratch memory as its
        widest point and not the sum of all intermediates. A slot is never shared by a step's
        input and output (the executor refuses that), so reuse starts one step after a last read."""
        first: dict[int, int] = {}
        last: dict[int, int] = {}
        for i, st in enumerate(self.steps):
            for v in [*(x for x in st.get("ins", []) if x is not None), *st.get("outs", [])]:
                b = self.values[v]["buf"]
                if self.buffers[b]["kind"] != "temp":
                    continue
                first.setdefault(b, i)
                last[b] = i
        slots: list[dict[str, Any]] = []  # {"buf", "dtype", "numel", "free_after"}
        remap: dict[int, int] = {}
        for b in sorted(first, key=lambda b: (first[b], b)):
            buf = self.buffers[b]
            best = None
            for sl in slots:
                if sl["dtype"] == buf["dtype"] and sl["free_after"] < first[b]:
                    # prefer the slot whose size is closest to what is needed
                    if best is None or abs(sl["numel"] - buf["numel"]) < abs(best["numel"] - buf["numel"]):
                        best = sl
            if best is None:
                slots.append({"buf": b, "dtype": buf["dtype"], "numel": buf["numel"], "free_after": last[b]})
                continue
            remap[b] = best["buf"]
            best["numel"] = max(best["numel"], buf["numel"])
            self.buffers[best["buf"]]["numel"] = best["numel"]
            best["free_after"] = last[b]
        for v in self.values:
            v["buf"] = remap.get(v["buf"], v["buf"])

    # -- nodes --------------------------------------------------------------------------------
    def lower_node(self, node: Any, slot: int) -> Any:
        op = node.op
        if op in T.VIEWS:
            return self.lower_view(node)
        if op in T.COPY_VIEWS:
            return self.lower_copy_view(node)
        if op in T.SCATTER_VIEWS:
            return self.lower_scatter_view(node)
        if _cplx.touches(self, node):
            return _cplx.lower(self, node)
        if _wide.claims_node(self, node):
            return _wide.lower(self, node)
        if op in T.WIDE_COPIES | T.WIDE_FILLS and self.touches_wide(node):
            return self.lower_wide(node)
        if op in T.LINALG:
            return self.lower_linalg(node)
        if op in T.DECOMP:
            return lower_decomp(self, node)
        base = len(self.plan.inputs)
        if op == "aten._embedding_bag_forward_only.default" and any(
            n.op == GETITEM and n.args[0].slot == slot and n.args[1] > 0 and self.uses.get(base + k, 0) > 0
            for k, n in enumerate(self.plan.nodes)
        ):
            # offset2bag, bag_size and max_indices are left as zeros: only the bags themselves are computed
            raise LoweringError("embedding_bag's auxiliary outputs are read")
        if op in T.MORE:
            return self.lower_more(node)
        if T.ew_instruction(op) is not None or op in T.SPECIAL_EW:
            return self.lower_ew(node, slot)
        if op in T.REDUCTIONS:
            return self.lower_reduction(node)
        if op in T.KERNELS:
            return self.lower_kernel(node)
        raise LoweringError(f"no lowering for {op}")

    # storage-only dtypes ---------------------------------------------------------------------
    def touches_wide(self, node: Any) -> bool:
        metas = [node.out] if isinstance(node.out, TensorMeta) else []
        dts = [self.dtype_of_arg(a) for a in node.args if isinstance(a, Ref)] + [m.dtype for m in metas]
        return any(d in T.WIDE_DTYPES for d in dts)

    def lower_wide(self, node: Any) -> Any:
        """A copy or fill that reads or writes float64, float16, int32, ...: one ``cast`` or ``fill`` step."""
        op, a = node.op, list(node.args)
        o = self.fresh(node.out)
        if op in T.WIDE_COPIES:
            src = a[1] if op == "aten.copy.default" else a[0]
            self.copy_into(self.broadcast(self.value(src), tuple(node.out.shape)), o)
            return o
        if op in ("aten.full.default", "aten.full_like.default", "aten.fill.Scalar"):
            value = a[1]
        elif op == "aten.scalar_tensor.default":
            value = a[0]
        elif op == "aten.ones_like.default":
            value = 1
        else:
            value = 0  # zeros_like, and empty memory is zero-filled: never leak stale values
        if isinstance(value, Ref):
            raise LoweringError("fill with a tensor value")
        self.fill_any(o, value)
        return o

    def fill_any(self, v: int, value: Any) -> None:
        """A ``fill`` step: integers exactly, floats in f64 (NaN and infinities by mode)."""
        if isinstance(value, (bool, int)):
            ints, floats = [1, int(value)], [0.0]
        elif math.isnan(value):
            ints, floats = [2, 0], [0.0]
        elif math.isinf(value):
            ints, floats = [3 if value > 0 else 4, 0], [0.0]
        else:
            ints, floats = [0, 0], [float(value)]
        self.steps.append({"op": "fill", "outs": [v], "ints": ints, "floats": floats})

    # linear algebra ---------------------------------------------------------------------------
    def mT(self, v: int) -> int:
        val = self.values[v]
        sz, st = list(val["sizes"]), list(val["strides"])
        sz[-2], sz[-1], st[-2], st[-1] = sz[-1], sz[-2], st[-1], st[-2]
        return self.new_value(val["buf"], val["offset"], sz, st)

    def unsq(self, v: int, dim: int) -> int:
        return self.view_of(v, self.meta_tensor(v).unsqueeze(dim))

    def temp(self, shape: list[int], dtype: torch.dtype = F32) -> int:
        return self.fresh(TensorMeta(tuple(shape), tuple(_contig(shape)), dtype, "cpu"))

    def lu_factor(self, a: int, check: bool, outs: list[int] | None = None) -> list[int]:
        """LU, pivots, info of value ``a`` (fresh contiguous temporaries unless ``outs`` is given)."""
        sz = self.values[a]["sizes"]
        batch, k = list(sz[:-2]), min(sz[-2], sz[-1])
        if outs is None:
            outs = [self.temp(list(sz)), self.temp([*batch, k], I32), self.temp(batch, I32)]
        self.steps.append({"op": "lu_factor", "ins": [a], "outs": outs, "ints": [int(check)]})
        return outs

    def lower_linalg(self, node: Any) -> Any:
        op, a, kw = node.op, list(node.args), dict(node.kwargs)
        out = node.out
        step = self.steps.append
        if op == "aten.linalg_lu_factor_ex.default":
            outs = [self.fresh(m) for m in out]
            self.lu_factor(self.value(a[0]), bool(kw.get("check_errors", False)), outs)
            return tuple(outs)
        if op == "aten.linalg_lu.default":
            outs = [self.fresh(m) for m in out]
            step({"op": "lu", "ins": [self.value(a[0])], "outs": outs})
            return tuple(outs)
        if op == "aten.lu_unpack.default":
            unpack_data = bool(a[2] if len(a) > 2 else kw.get("unpack_data", True))
            unpack_piv = bool(a[3] if len(a) > 3 else kw.get("unpack_pivots", True))
            outs = [self.fresh(m) for m in out]
            ints = [int(unpack_data), int(unpack_piv)]
            step({"op": "lu_unpack", "ins": [self.value(a[0]), self.value(a[1])], "outs": outs, "ints": ints})
            return tuple(outs)
        if op == "aten.linalg_lu_solve.default":
            left = bool(kw.get("left", True))
            adjoint = bool(kw.get("adjoint", False))
            x = self.fresh(out)
            self.lu_solve(self.value(a[0]), self.value(a[1]), self.value(a[2]), x, left, adjoint)
            return x
        if op == "aten._linalg_solve_ex.default":
            left = bool(kw.get("left", a[2] if len(a) > 2 else True))
            check = bool(kw.get("check_errors", False))
            av, bv = self.value(a[0]), self.value(a[1])
            res, lu, piv, info = (self.fresh(m) for m in out)
            asz, bsz = self.values[av]["sizes"], self.values[bv]["sizes"]
            vector = len(bsz) == 1 or (len(bsz) == len(asz) - 1 and list(bsz) == list(asz[:-1]))
            # as ATen: factor A^T when A is contiguous and solve with the adjoint
            use_t = _contig(list(asz)) == list(self.values[av]["strides"])
            self.lu_factor(self.mT(av) if use_t else av, check, [lu, piv, info])
            if vector:
                bv, rv = self.unsq(bv, -1 if left else -2), self.unsq(res, -1 if left else -2)
            else:
                rv = res
            self.lu_solve(lu, piv, bv, rv, left, use_t)
            return res, lu, piv, info
        if op == "aten.linalg_inv_ex.default":
            check = bool(kw.get("check_errors", False))
            inv, info = (self.fresh(m) for m in out)
            av = self.value(a[0])
            lu, piv, _ = self.lu_factor(av, check, [*self.lu_factor_temps(av), info])
            step({"op": "lu_solve", "ins": [lu, piv, None], "outs": [inv], "ints": [0]})
            return inv, info
        if op in ("aten._linalg_det.default", "aten._linalg_slogdet.default"):
            outs = [self.fresh(m) for m in out]
            name = "det" if op == "aten._linalg_det.default" else "slogdet"
            step({"op": name, "ins": [self.value(a[0])], "outs": outs})
            return tuple(outs)
        if op == "aten.linalg_cholesky_ex.default":
            upper = bool(kw.get("upper", False))
            check = bool(kw.get("check_errors", False))
            lv, info = (self.fresh(m) for m in out)
            av = self.value(a[0])
            ins, kout = ([self.mT(av)], self.mT(lv)) if upper else ([av], lv)
            step({"op": "cholesky", "ins": ins, "outs": [kout, info], "ints": [int(check)]})
            return lv, info
        if op in ("aten.cholesky_solve.default", "aten.cholesky_inverse.default"):
            inverse = op == "aten.cholesky_inverse.default"
            upper = bool(a[1] if inverse and len(a) > 1 else a[2] if len(a) > 2 else kw.get("upper", False))
            x = self.fresh(out)
            xs = list(out.shape)
            fac = self.value(a[0] if inverse else a[1])
            fac = self.broadcast(fac, (*xs[:-2], xs[-2], xs[-2]))
            b = None if inverse else self.broadcast(self.value(a[0]), tuple(xs))
            y = self.temp(xs)
            # A = L L^T: L y = b, L^T x = y;  A = U^T U: U^T y = b, U x = y
            first, second = (self.mT(fac), fac) if upper else (fac, self.mT(fac))
            step({"op": "tri_solve", "ins": [first, b], "outs": [y], "ints": [0, 0]})
            step({"op": "tri_solve", "ins": [second, y], "outs": [x], "ints": [1, 0]})
            return x
        if op == "aten.linalg_solve_triangular.default":
            upper = bool(kw.get("upper", a[2] if len(a) > 2 else False))
            left = bool(kw.get("left", True))
            unit = bool(kw.get("unitriangular", False))
            x = self.fresh(out)
            xs = list(out.shape)
            n = xs[-2] if left else xs[-1]
            t = self.broadcast(self.value(a[0]), (*xs[:-2], n, n))
            b = self.broadcast(self.value(a[1]), tuple(xs))
            if left:
                step({"op": "tri_solve", "ins": [t, b], "outs": [x], "ints": [int(upper), int(unit)]})
            else:  # X A = B  <=>  A^T X^T = B^T
                step({"op": "tri_solve", "ins": [self.mT(t), self.mT(b)], "outs": [self.mT(x)], "ints": [int(not upper), int(unit)]})
            return x
        if op == "aten.triangular_solve.default":
            upper = bool(a[2] if len(a) > 2 else kw.get("upper", True))
            trans = bool(a[3] if len(a) > 3 else kw.get("transpose", False))
            unit = bool(a[4] if len(a) > 4 else kw.get("unitriangular", False))
            sol, coef = (self.fresh(m) for m in out)
            xs = list(out[0].shape)
            t = self.broadcast(self.value(a[1]), (*xs[:-2], xs[-2], xs[-2]))
            b = self.broadcast(self.value(a[0]), tuple(xs))
            step({"op": "tri_solve", "ins": [self.mT(t) if trans else t, b], "outs": [sol], "ints": [int(upper != trans), int(unit)]})
            self.copy_into(self.broadcast(self.value(a[1]), tuple(out[1].shape)), coef)
            return sol, coef
        raise LoweringError(f"no lowering for {op}")

    # search, distances, order statistics, resampling, scatter-like copies ------------------------
    def flat(self, v: int) -> int:
        """Value ``v`` as a 1-d row-major view (copied into a contiguous temporary when it is not one)."""
        val = self.values[v]
        sizes = list(val["sizes"])
        n = math.prod(sizes)
        if list(val["strides"]) != _contig(sizes):
            t = self.temp(sizes, self.dtype_of(v))
            self.copy_into(v, t)
            val = self.values[t]
        return self.new_value(val["buf"], val["offset"], [n], [1])

    def lower_more(self, node: Any) -> Any:
        op, a, kw = node.op, list(node.args), dict(node.kwargs)
        out = node.out
        step = self.steps.append

        def arg(i: int, name: str, default: Any) -> Any:
            return a[i] if len(a) > i else kw.get(name, default)

        if op in ("aten.searchsorted.Tensor", "aten.bucketize.Tensor"):
            seq, vals = (a[0], a[1]) if op == "aten.searchsorted.Tensor" else (a[1], a[0])
            right = bool(kw.get("right", False)) or kw.get("side") == "right"
            sv, vv = self.value(seq), self.value(vals)
            if kw.get("sorter") is not None:  # search the sorted copy: positions in sorted order
                srt = self.value(kw["sorter"])
                ssz = list(self.values[sv]["sizes"])
                t = self.temp(ssz)
                step({"op": "gather", "ins": [sv, srt], "outs": [t], "ints": [len(ssz) - 1]})
                sv = t
            o = self.fresh(out)
            if not self.values[vv]["sizes"]:
                vv, ko = self.as_1d(vv), self.as_1d(o)
            else:
                ko = o
            step({"op": "searchsorted", "ins": [sv, vv], "outs": [ko], "ints": [int(right)]})
            return o
        if op == "aten.histc.default":
            o = self.fresh(out)
            lo, hi = float(arg(2, "min", 0)), float(arg(3, "max", 0))
            step({"op": "histc", "ins": [self.value(a[0])], "outs": [o], "floats": [lo, hi]})
            return o
        if op == "aten.frexp.Tensor":
            outs = [self.fresh(m) for m in out]
            step({"op": "frexp", "ins": [self.as_1d(self.value(a[0]))], "outs": [self.as_1d(v) for v in outs]})
            return tuple(outs)
        if op == "aten._cdist_forward.default":
            x1, x2, p = self.value(a[0]), self.value(a[1]), float(a[2])
            o = self.fresh(out)
            (pn, r) = out.shape[-2:]
            m = self.values[x1]["sizes"][-1]
            batch = list(out.shape[:-2])
            b = math.prod(batch)
            t1, t2 = self.temp([*batch, pn, m]), self.temp([*batch, r, m])
            self.copy_into(self.broadcast(x1, (*batch, pn, m)), t1)
            self.copy_into(self.broadcast(x2, (*batch, r, m)), t2)
            as3 = lambda v, s: self.view_of(v, self.meta_tensor(v).view(b, *s))  # noqa: E731
            if list(self.values[o]["strides"]) != _contig(list(out.shape)):
                raise LoweringError("cdist into a non-contiguous result")
            step({"op": "cdist", "ins": [as3(t1, (pn, m)), as3(t2, (r, m))], "outs": [as3(o, (pn, r))], "floats": [p]})
            return o
        if op == "aten._pdist_forward.default":
            o = self.fresh(out)
            step({"op": "pdist", "ins": [self.value(a[0])], "outs": [o], "floats": [float(arg(1, "p", 2.0))]})
            return o
        if op == "aten.dist.default":
            x, y = self.value(a[0]), self.value(a[1])
            shape = tuple(torch.broadcast_shapes(tuple(self.values[x]["sizes"]), tuple(self.values[y]["sizes"])))
            o = self.fresh(out)
            ins = [self.broadcast(x, shape), self.broadcast(y, shape)]
            step({"op": "dist", "ins": ins, "outs": [o], "floats": [float(arg(2, "p", 2.0))]})
            return o
        if op in ("aten.median.dim", "aten.nanmedian.dim", "aten.mode.default"):
            x = self.value(a[0])
            rank = len(self.values[x]["sizes"])
            d = arg(1, "dim", -1) % max(rank, 1)
            keep = bool(arg(2, "keepdim", False))
            outs = [self.fresh(mm) for mm in out]
            if rank == 0:
                x, kouts = self.as_1d(x), [self.as_1d(v) for v in outs]
            elif keep:
                kouts = outs
            else:
                kouts = [self.view_of(v, self.meta_tensor(v).unsqueeze(d)) for v in outs]
            name = {"aten.median.dim": "median_dim", "aten.nanmedian.dim": "nanmedian_dim", "aten.mode.default": "mode"}[op]
            step({"op": name, "ins": [x], "outs": kouts, "ints": [d]})
            return tuple(outs)
        if op == "aten.nanmedian.default":
            x = self.value(a[0])
            n = math.prod(self.values[x]["sizes"])
            if n == 0:
                raise LoweringError("nanmedian of an empty tensor")
            o = self.fresh(out)
            idx = self.temp([1], I64)
            step({"op": "nanmedian_dim", "ins": [self.flat(x)], "outs": [self.as_1d(o), idx], "ints": [0]})
            return o
        if op in ("aten.upsample_bilinear2d.default", "aten.upsample_bicubic2d.default", "aten.upsample_trilinear3d.default"):
            nd = 3 if "3d" in op else 2
            align = bool(arg(2, "align_corners", False))
            names = ["scales_d", "scales_h", "scales_w"][3 - nd:]
            scales = [arg(3 + i, nm, None) for i, nm in enumerate(names)]
            o = self.fresh(out)
            name = "upsample_cubic" if "bicubic" in op else "upsample_linear"
            floats = [0.0 if sc is None else float(sc) for sc in scales]
            step({"op": name, "ins": [self.value(a[0])], "outs": [o], "ints": [int(align)], "floats": floats})
            return o
        if op in ("aten.grid_sampler_2d.default", "aten.grid_sampler_3d.default"):
            o = self.fresh(out)
            ints = [int(bool(a[4])), int(a[2]), int(a[3])]
            step({"op": op[5:-8], "ins": [self.value(a[0]), self.value(a[1])], "outs": [o], "ints": ints})
            return o
        if op == "aten.segment_reduce.default":
            data = self.value(a[0])
            axis = kw.get("axis", 0) % max(len(self.values[data]["sizes"]), 1)
            offsets = kw.get("offsets") is not None
            bounds = self.value(kw["offsets"] if offsets else kw["lengths"])
            dsz = list(self.values[data]["sizes"])
            outer, n, inner = math.prod(dsz[:axis]), dsz[axis], math.prod(dsz[axis + 1 :])
            bsz = list(self.values[bounds]["sizes"])
            o = self.fresh(out)
            if list(self.values[o]["strides"]) != _contig(list(out.shape)):
                raise LoweringError("segment_reduce into a non-contiguous result")
            segs = bsz[-1] - int(offsets)

            def as_(v: int, shape: list[int]) -> int:
                f = self.flat(v)
                return self.view_of(f, self.meta_tensor(f).view(shape))

            red = {"sum": 0, "mean": 1, "max": 2, "min": 3, "prod": 4}[a[1]]
            initial = kw.get("initial")
            if initial is not None and not math.isfinite(float(initial)):
                raise LoweringError("non-finite initial value")
            ins = [as_(data, [outer, n, inner]), as_(bounds, [outer, bsz[-1]])]
            ints = [red, int(offsets), int(initial is not None)]
            floats = [float(initial) if initial is not None else 0.0]
            step({"op": "segment_reduce", "ins": ins, "outs": [as_(o, [outer, segs, inner])], "ints": ints, "floats": floats})
            return o
        if op == "aten._embedding_bag_forward_only.default":
            w, idx, offs = self.value(a[0]), self.value(a[1]), self.value(a[2])
            mode = int(arg(4, "mode", 0))
            psw = arg(6, "per_sample_weights", None)
            include_last = bool(arg(7, "include_last_offset", False))
            padding = int(arg(8, "padding_idx", -1))
            outs = [self.fresh(m) for m in out]
            ins = [w, idx, offs, self.value(psw) if psw is not None else None]
            step({"op": "embedding_bag", "ins": ins, "outs": [outs[0]], "ints": [mode, int(include_last), padding]})
            for v in outs[1:]:
                self.fill_any(v, 0)
            return tuple(outs)
        if op == "aten.max_pool2d_with_indices_backward.default":
            g, idx = self.value(a[0]), self.value(a[7])
            gi = self.fresh(out)
            if len(out.shape) == 3:
                g, idx, kgi = self.unbatched(g), self.unbatched(idx), self.unbatched(gi)
            else:
                kgi = gi
            step({"op": "max_pool2d_bwd", "ins": [g, idx], "outs": [kgi]})
            return gi
        if op == "aten._linalg_check_errors.default":
            step({"op": "check_info", "ins": [self.value(a[0])], "outs": []})
            return None
        if op == "aten.masked_scatter.default":
            o = self.fresh(out)
            shape = tuple(out.shape)
            base, mask = self.broadcast(self.value(a[0]), shape), self.broadcast(self.value(a[1]), shape)
            step({"op": "masked_scatter", "ins": [base, mask, self.flat(self.value(a[2]))], "outs": [o]})
            return o
        if op == "aten.put.default":
            accumulate = bool(arg(3, "accumulate", False))
            o = self.fresh(out)
            if list(self.values[o]["strides"]) != _contig(list(out.shape)):
                raise LoweringError("put into a non-contiguous result")
            idx, src = self.flat(self.value(a[1])), self.flat(self.value(a[2]))
            if self.values[idx]["sizes"] != self.values[src]["sizes"]:
                raise LoweringError("put: index and source differ in size")
            step({"op": "index_put", "ins": [self.flat(self.value(a[0])), src, idx], "outs": [self.flat(o)],
                  "ints": [int(accumulate)]})
            return o
        if op == "aten.resize.default":
            # functional resize of a contiguous value to at most its size: the leading elements,
            # read in storage order, under the new shape
            x = self.value(a[0])
            val = self.values[x]
            if list(val["strides"]) != _contig(list(val["sizes"])):
                raise LoweringError("resize of a non-contiguous value")
            shape = list(out.shape)
            o = self.fresh(out)
            if math.prod(shape):
                self.copy_into(self.new_value(val["buf"], val["offset"], shape, _contig(shape)), o)
            return o
        if op == "aten.nonzero_static.default":
            o = self.fresh(out)
            step({"op": "nonzero_static", "ins": [self.value(a[0])], "outs": [o], "ints": [int(kw.get("fill_value", -1))]})
            return o
        if op in ("aten.as_strided_copy.default", "aten.as_strided_scatter.default"):
            scatter = op == "aten.as_strided_scatter.default"
            rest = a[2:] if scatter else a[1:]
            size, stride = rest[0], rest[1]
            offset = rest[2] if len(rest) > 2 else kw.get("storage_offset")
            if offset is not None:
                # the offset counts from the start of eager's storage, which a plan does not see
                raise LoweringError("as_strided with an explicit storage offset")
            x = self.value(a[0])
            o = self.fresh(out)
            if scatter:
                self.copy_into(x, o)
                self.copy_into(self.value(a[1]), self.view_of(o, self.meta_tensor(o).as_strided(size, stride)))
            else:
                self.copy_into(self.view_of(x, self.meta_tensor(x).as_strided(size, stride)), o)
            return o
        if op == "aten.addbmm.default":
            bias, b1, b2 = self.value(a[0]), self.value(a[1]), self.value(a[2])
            beta, alpha = float(kw.get("beta", 1)), float(kw.get("alpha", 1))
            bsz, n, m = self.values[b1]["sizes"]
            p = self.values[b2]["sizes"][2]
            # sum over the batch of b1[i] @ b2[i] == (n, B*m) @ (B*m, p)
            t1 = self.temp([n, bsz, m])
            self.copy_into(self.view_of(b1, self.meta_tensor(b1).permute(1, 0, 2)), t1)
            t2 = self.temp([bsz, m, p])
            self.copy_into(b2, t2)
            lhs = self.view_of(t1, self.meta_tensor(t1).view(n, bsz * m))
            rhs = self.view_of(t2, self.meta_tensor(t2).view(bsz * m, p))
            c = self.fresh(out)
            bb = self.broadcast(bias, tuple(out.shape)) if beta != 0 else None
            step({"op": "gemm", "ins": [lhs, rhs, bb], "outs": [c], "floats": [alpha, beta], "epilogue": []})
            return c
        raise LoweringError(f"no lowering for {op}")

    def lu_factor_temps(self, a: int) -> list[int]:
        sz = self.values[a]["sizes"]
        return [self.temp(list(sz)), self.temp([*sz[:-2], min(sz[-2], sz[-1])], I32)]

    def lu_solve(self, lu: int, piv: int, b: int, x: int, left: bool, adjoint: bool) -> None:
        """X from the LU of A: A X = B (left) or X A = B, with A^T when ``adjoint``; broadcasts the batch."""
        xs = self.values[x]["sizes"]
        n = xs[-2] if left else xs[-1]
        lu = self.broadcast(lu, (*xs[:-2], n, n))
        piv = self.broadcast(piv, (*xs[:-2], n))
        b = self.broadcast(b, tuple(xs))
        if left:
            self.steps.append({"op": "lu_solve", "ins": [lu, piv, b], "outs": [x], "ints": [int(adjoint)]})
        else:  # X A = B  <=>  A^T X^T = B^T
            self.steps.append({"op": "lu_solve", "ins": [lu, piv, self.mT(b)], "outs": [self.mT(x)], "ints": [int(not adjoint)]})

    def lower_view(self, node: Any) -> Any:
        args = list(node.args)
        v = self.value(args[0])
        t = self.meta_tensor(v)
        rest = [a for a in args[1:]]
        if any(isinstance(a, Ref) for a in rest):
            raise LoweringError("view with tensor arguments")
        result = node.target(t, *rest, **node.kwargs)
        if isinstance(result, (tuple, list)):
            return tuple(self.view_of(v, r) for r in result)
        return self.view_of(v, result)

    def lower_copy_view(self, node: Any) -> Any:
        args = list(node.args)
        v = self.value(args[0])
        if any(isinstance(a, Ref) for a in args[1:]):
            raise LoweringError("view with tensor arguments")
        view_op = _overload(T.COPY_VIEWS[node.op])
        result = view_op(self.meta_tensor(v), *args[1:], **node.kwargs)
        views = result if isinstance(result, (tuple, list)) else (result,)
        metas = node.out if isinstance(node.out, tuple) else (node.out,)
        outs = []
        for t, meta in zip(views, metas):
            o = self.fresh(meta)
            self.copy_into(self.view_of(v, t), o)
            outs.append(o)
        return tuple(outs) if isinstance(result, (tuple, list)) else outs[0]

    def lower_scatter_view(self, node: Any) -> Any:
        args = list(node.args)
        base, src = self.value(args[0]), self.value(args[1])
        if any(isinstance(a, Ref) for a in args[2:]):
            raise LoweringError("view with tensor arguments")
        o = self.fresh(node.out)
        self.copy_into(base, o)
        view_op = _overload(T.SCATTER_VIEWS[node.op])
        part = view_op(self.meta_tensor(o), *args[2:], **node.kwargs)
        self.copy_into(src, self.view_of(o, part))
        return o

    # elementwise -----------------------------------------------------------------------------
    def lower_ew(self, node: Any, slot: int) -> Any:
        op, args, kw = node.op, list(node.args), dict(node.kwargs)
        out = node.out
        if op == "aten._native_batch_norm_legit_no_training.default":
            return self.lower_batch_norm(node, slot)
        fused = self.fuse_epilogue(node)
        if fused is not None:
            return fused
        meta = out if isinstance(out, TensorMeta) else None
        if meta is None:
            raise LoweringError("elementwise op without a tensor result")
        name = T.ew_instruction(op) or op.split(".")[1]
        for a in args:
            if isinstance(a, Ref) and a.slot not in self.widened and self.dtype_of_arg(a) in T.NARROW_INTS:
                if name not in T.COMPARE:
                    raise LoweringError(f"{name} of a narrow integer")
                v = self.value(a)
                self.used[a.slot] -= 1  # counted again when the program reads the copy
                wide = self.temp(list(self.values[v]["sizes"]), I64)
                self.copy_into(v, wide)
                self.widened[a.slot] = wide
        in_dtypes = [I64 if isinstance(a, Ref) and a.slot in self.widened else self.dtype_of_arg(a) for a in args if isinstance(a, Ref)]
        if name in T.COMPARE:
            compute = "f32" if F32 in in_dtypes or any(isinstance(a, float) for a in args) else "i64"
        elif name == "copy" and F32 in in_dtypes:
            compute = "f32"  # float -> int64/bool conversion happens in the store
        else:
            compute = "f32" if meta.dtype == F32 else "i64"
        if compute == "i64" and name not in T.INT_OK and op not in T.FILLS and op != "aten.where.self":
            raise LoweringError(f"{name} has no integer kernel")
        g = self.open_group(tuple(meta.shape), compute, args)
        o = self.operand
        if op in ("aten.full.default",):
            r = o(g, args[1])
        elif op == "aten.scalar_tensor.default":
            r = o(g, args[0])
        elif op in ("aten.full_like.default", "aten.fill.Scalar"):
            r = o(g, args[1])
        elif op in ("aten.zeros_like.default", "aten.empty.memory_format", "aten.empty_permuted.default",
                    "aten.empty_strided.default"):
            r = o(g, 0)  # empty memory is zero-filled: never leak stale values
        elif op == "aten.bitwise_not.default":
            x = o(g, args[0])
            if meta.dtype == BOOL:
                r = g.emit("logical_not", [x])
            else:  # two's complement: ~x == -x - 1
                r = g.emit("sub", [g.emit("neg", [x]), g.emit("const", [], [1.0])], [1.0])
        elif op == "aten.silu_backward.default":
            gr, x = o(g, args[0]), o(g, args[1])
            sg = g.emit("sigmoid", [x])
            one = g.emit("const", [], [1.0])
            inner = g.emit("add", [one, g.emit("mul", [x, g.emit("sub", [one, sg], [1.0])])], [1.0])
            r = g.emit("mul", [gr, g.emit("mul", [sg, inner])])
        elif op == "aten.gelu_backward.default":
            gr, x = o(g, args[0]), o(g, args[1])
            approx = kw.get("approximate", args[2] if len(args) > 2 else "none")
            c = lambda v: g.emit("const", [], [v])  # noqa: E731
            half = c(0.5)
            if approx == "tanh":
                beta, kappa = math.sqrt(2.0) * (2.0 / math.sqrt(math.pi)) * 0.5, 0.044715
                x2 = g.emit("mul", [x, x])
                inner = g.emit("mul", [c(beta), g.emit("add", [x, g.emit("mul", [c(kappa), g.emit("mul", [x2, x])])], [1.0])])
                th = g.emit("tanh", [inner])
                left_d = g.emit("mul", [half, g.emit("add", [c(1.0), th], [1.0])])
                sech2 = g.emit("sub", [c(1.0), g.emit("mul", [th, th])], [1.0])
                poly = g.emit("mul", [c(beta), g.emit("add", [c(1.0), g.emit("mul", [c(3 * kappa), x2])], [1.0])])
                right_d = g.emit("mul", [g.emit("mul", [half, x]), g.emit("mul", [sech2, poly])])
                r = g.emit("mul", [gr, g.emit("add", [left_d, right_d], [1.0])])
            else:
                cdf = g.emit("mul", [half, g.emit("add", [c(1.0), g.emit("erf", [g.emit("mul", [x, c(math.sqrt(0.5))])])], [1.0])])
                pdf = g.emit("mul", [c(1.0 / math.sqrt(2.0 * math.pi)), g.emit("exp", [g.emit("mul", [c(-0.5), g.emit("mul", [x, x])])])])
                r = g.emit("mul", [gr, g.emit("add", [cdf, g.emit("mul", [x, pdf])], [1.0])])
        elif op == "aten.copy.default":
            r = o(g, args[1])  # copy(self, src): src broadcast to self's shape, in self's dtype
        elif op == "aten.masked_fill.Tensor":
            r = g.emit("where", [o(g, args[1]), o(g, args[2]), o(g, args[0])])
        elif op in ("aten.clamp.Tensor", "aten.clamp_min.Tensor", "aten.clamp_max.Tensor"):
            if op == "aten.clamp_min.Tensor":
                lo, hi = args[1], None
            elif op == "aten.clamp_max.Tensor":
                lo, hi = None, args[1]
            else:
                lo = args[1] if len(args) > 1 else kw.get("min")
                hi = args[2] if len(args) > 2 else kw.get("max")
            r = o(g, args[0])
            if lo is not None:
                r = g.emit("maximum", [r, o(g, lo)])
            if hi is not None:
                r = g.emit("minimum", [r, o(g, hi)])
        elif op == "aten.round.decimals":
            d = int(kw.get("decimals", args[1] if len(args) > 1 else 0))
            scale = g.emit("const", [], [float(10 ** abs(d))])
            x = o(g, args[0])
            if d >= 0:
                r = g.emit("div", [g.emit("round", [g.emit("mul", [x, scale])]), scale])
            else:
                r = g.emit("mul", [g.emit("round", [g.emit("div", [x, scale])]), scale])
        elif op == "aten.polygamma.default":
            n, x = int(args[0]), o(g, args[1])
            if n == 0:
                r = g.emit("digamma", [x])
            else:
                # ψ⁽ⁿ⁾(x) = (-1)^(n+1) n! ζ(n+1, x)
                z = g.emit("zeta", [g.emit("const", [], [float(n + 1)]), x])
                r = g.emit("mul", [z, g.emit("const", [], [float((-1) ** (n + 1) * math.factorial(n))])])
        elif name == "ldexp":
            r = g.emit("mul", [o(g, args[0]), g.emit("exp2", [o(g, args[1])])])
        elif name == "fmod" and compute == "i64":
            # C fmod on integers: the remainder takes the dividend's sign
            a, b = o(g, args[0]), o(g, args[1])
            rem = g.emit("remainder", [a, b])
            zero = g.emit("const", [], [0.0])
            differ = g.emit("xor", [g.emit("lt", [a, zero]), g.emit("lt", [b, zero])])
            fix = g.emit("and", [g.emit("ne", [rem, zero]), differ])
            r = g.emit("where", [fix, g.emit("sub", [rem, b], [1.0]), rem])
        elif op == "aten.ones_like.default":
            r = o(g, 1)
        elif op == "aten.where.self":
            r = g.emit("where", [o(g, args[0]), o(g, args[1]), o(g, args[2])])
        elif op == "aten.masked_fill.Scalar":
            r = g.emit("where", [o(g, args[1]), o(g, args[2]), o(g, args[0])])
        elif op == "aten.gelu.default":
            approx = kw.get("approximate", args[1] if len(args) > 1 else "none")
            r = g.emit("gelu_tanh" if approx == "tanh" else "gelu", [o(g, args[0])])
        elif op in ("aten.clamp.default", "aten.hardtanh.default", "aten.clamp_min.default", "aten.clamp_max.default"):
            if op == "aten.clamp_min.default":
                lo, hi = args[1], None
            elif op == "aten.clamp_max.default":
                lo, hi = None, args[1]
            elif op == "aten.hardtanh.default":
                lo, hi = (args[1] if len(args) > 1 else -1.0), (args[2] if len(args) > 2 else 1.0)
            else:
                lo = args[1] if len(args) > 1 else kw.get("min")
                hi = args[2] if len(args) > 2 else kw.get("max")
            if isinstance(lo, Ref) or isinstance(hi, Ref):
                raise LoweringError("clamp with tensor bounds")
            x = o(g, args[0])
            if compute == "i64" and (isinstance(lo, float) or isinstance(hi, float)):
                raise LoweringError("float clamp bounds on integers")
            r = g.emit("clamp", [x], [-math.inf if lo is None else float(lo), math.inf if hi is None else float(hi)])
        elif op == "aten.leaky_relu.default":
            r = g.emit("leaky_relu", [o(g, args[0])], [float(args[1]) if len(args) > 1 else 0.01])
        elif op == "aten.elu.default":
            p = [float(a) for a in args[1:4]] + [1.0] * (3 - len(args[1:4]))
            r = g.emit("elu", [o(g, args[0])], p)
        elif op == "aten.softplus.default":
            r = g.emit("softplus", [o(g, args[0])], [float(args[1]) if len(args) > 1 else 1.0, float(args[2]) if len(args) > 2 else 20.0])
        elif op == "aten.hardsigmoid.default":
            x = o(g, args[0])
            t = g.emit("add", [x, g.emit("const", [], [3.0])], [1.0])
            t = g.emit("clamp", [t], [0.0, 6.0])
            r = g.emit("div", [t, g.emit("const", [], [6.0])])
        elif op == "aten.hardswish.default":
            x = o(g, args[0])
            t = g.emit("add", [x, g.emit("const", [], [3.0])], [1.0])
            t = g.emit("clamp", [t], [0.0, 6.0])
            r = g.emit("div", [g.emit("mul", [x, t]), g.emit("const", [], [6.0])])
        elif op == "aten.sigmoid_backward.default":
            gr, y = o(g, args[0]), o(g, args[1])
            one = g.emit("const", [], [1.0])
            r = g.emit("mul", [gr, g.emit("mul", [y, g.emit("sub", [one, y], [1.0])])])
        elif op == "aten.tanh_backward.default":
            gr, y = o(g, args[0]), o(g, args[1])
            one = g.emit("const", [], [1.0])
            r = g.emit("mul", [gr, g.emit("sub", [one, g.emit("mul", [y, y])], [1.0])])
        elif name in ("add", "sub"):
            alpha = float(kw.get("alpha", args[2] if len(args) > 2 else 1))
            r = g.emit(name, [o(g, args[0]), o(g, args[1])], [alpha])
        elif name == "rsub":
            alpha = float(kw.get("alpha", args[2] if len(args) > 2 else 1))
            r = g.emit("sub", [o(g, args[1]), o(g, args[0])], [alpha])
        elif name == "div_mode":
            mode = kw.get("rounding_mode")
            q = g.emit("div", [o(g, args[0]), o(g, args[1])])
            r = q if mode is None else g.emit("floor" if mode == "floor" else "trunc", [q])
        elif name == "pow_scalar":
            e = args[1]
            if isinstance(e, Ref):
                raise LoweringError("pow exponent")
            r = g.emit("pow_scalar", [o(g, args[0])], [float(e)])
        elif name == "threshold_backward":
            r = g.emit("threshold_backward", [o(g, args[0]), o(g, args[1])], [float(args[2])])
        elif op in T.UNARY:
            if op == "aten._to_copy.default":
                if meta.dtype not in DT_NAME:
                    raise LoweringError("_to_copy dtype")
            if op == "aten.round.default" and kw.get("decimals"):
                raise LoweringError("round with decimals")
            r = g.emit(name, [o(g, args[0])])
        else:
            r = g.emit(name, [o(g, args[0]), o(g, args[1])])
        lz = Lazy(g, r, meta)
        g.members[slot] = lz
        return lz

    def fuse_epilogue(self, node: Any) -> int | None:
        """Folds an activation or a residual add that is the only reader of a GEMM result into
        the GEMM's epilogue (applied per output tile inside the kernel); returns the GEMM's
        value, or None when the node is lowered as ordinary elementwise code."""
        op, args, kw = node.op, list(node.args), dict(node.kwargs)
        meta = node.out
        if not isinstance(meta, TensorMeta) or meta.dtype != F32:
            return None
        name = None
        if op == "aten.gelu.default":
            approx = kw.get("approximate", args[1] if len(args) > 1 else "none")
            name = "gelu_tanh" if approx == "tanh" else "gelu"
        elif op in EPILOGUE_UNARY and len(args) == 1:
            name = EPILOGUE_UNARY[op]
        elif op == "aten.add.Tensor" and len(args) == 2 and float(kw.get("alpha", 1)) == 1.0:
            name = "add"
        if name is None:
            return None
        gemm_arg = None
        for a in args[: 2 if name == "add" else 1]:
            if isinstance(a, Ref) and self.uses.get(a.slot, 0) == 1 and isinstance(self.slot.get(a.slot), int):
                if self.slot[a.slot] in self.gemm_open:
                    gemm_arg = a
                    break
        if gemm_arg is None:
            return None
        c = self.slot[gemm_arg.slot]
        csizes = self.values[c]["sizes"]
        if list(meta.shape) != csizes:
            return None
        step = self.gemm_open[c]
        if len(step["epilogue"]) >= MAX_EPILOGUE:
            return None
        if name == "add":
            other = args[1] if args[0] is gemm_arg else args[0]
            if not isinstance(other, Ref) or self.dtype_of_arg(other) != F32 or step["epilogue"].count("add"):
                return None
            r = self.value(other)  # may flush an open group: its step then lands after the GEMM
            rb = self.broadcast(r, tuple(csizes))
            if self.values[rb]["buf"] == self.values[c]["buf"]:
                return None
            step["ins"] = [*step["ins"], *[None] * (3 - len(step["ins"])), rb]
            # nothing between the GEMM and here reads its result, so it may move after the
            # residual's producer
            self.steps.remove(step)
            self.steps.append(step)
        self.used[gemm_arg.slot] = self.used.get(gemm_arg.slot, 0) + 1
        step["epilogue"].append(name)
        return c

    def dtype_of_arg(self, a: Ref) -> torch.dtype:
        v = self.slot.get(a.slot)
        if isinstance(v, Lazy):
            return v.meta.dtype
        if isinstance(v, int):
            return self.dtype_of(v)
        raise LoweringError("argument has no value")

    def lower_batch_norm(self, node: Any, slot: int) -> Any:
        x, w, b, mean, var, _momentum, eps = node.args
        out = node.out
        y_meta = out[0]
        shape = tuple(y_meta.shape)
        if len(shape) < 2 or y_meta.dtype != F32:
            raise LoweringError("batch norm input")
        g = self.open_group(shape, "f32", node.args)
        c = shape[1]

        def chan(arg: Any) -> int:
            v = self.value(arg)
            val = self.values[v]
            if val["sizes"] != [c]:
                raise LoweringError("batch norm stats shape")
            strides = [0] * len(shape)
            strides[1] = val["strides"][0]
            bv = self.new_value(val["buf"], val["offset"], list(shape), strides)
            g.ins.append(bv)
            r = g.reg()
            g.prog.append({"op": "load", "dst": r, "a": [len(g.ins) - 1], "f": []})
            return r

        xr = self.operand(g, x)
        t = g.emit("sub", [xr, chan(mean)], [1.0])
        inv = g.emit("rsqrt", [g.emit("add", [chan(var), g.emit("const", [], [float(eps)])], [1.0])])
        t = g.emit("mul", [t, inv])
        if w is not None:
            t = g.emit("mul", [t, chan(w)])
        if b is not None:
            t = g.emit("add", [t, chan(b)], [1.0])
        lz = Lazy(g, t, y_meta)
        empties = tuple(self.fresh(m) for m in out[1:])
        return (lz, *empties)

    # reductions -------------------------------------------------------------------------------
    def lower_reduction(self, node: Any) -> Any:
        op, args, kw = node.op, list(node.args), dict(node.kwargs)
        x = self.value(args[0])
        xs = self.values[x]["sizes"]
        rank = len(xs)
        kind = T.REDUCTIONS[op]
        corr = 0.0
        keep = False
        if self.dtype_of(x) == BOOL:
            x = self.convert(x, F32)
        elif self.dtype_of(x) == I64:
            if kind != 9:
                raise LoweringError("integer input of a float reduction")
            x = self.convert(x, F32, nonzero=True)
        if op in ("aten.sum.default", "aten.mean.default", "aten.prod.default", "aten.any.default", "aten.max.default",
                  "aten.min.default"):
            dims: Any = None
        elif op in ("aten.argmax.default", "aten.argmin.default"):
            dims = args[1] if len(args) > 1 else kw.get("dim")
            keep = bool(args[2] if len(args) > 2 else kw.get("keepdim", False))
            dims = None if dims is None else [dims]
        elif op in ("aten.max.dim", "aten.min.dim", "aten.prod.dim_int"):
            dims = [args[1]]
            keep = bool(args[2] if len(args) > 2 else kw.get("keepdim", False))
        elif op in ("aten.var.correction", "aten.std.correction", "aten.var.dim", "aten.var_mean.correction"):
            dims = args[1] if len(args) > 1 else kw.get("dim")
            if op == "aten.var.dim":
                unbiased = args[2] if len(args) > 2 else kw.get("unbiased", True)
                corr = 1.0 if unbiased else 0.0
                keep = bool(args[3] if len(args) > 3 else kw.get("keepdim", False))
            else:
                c = kw.get("correction", args[2] if len(args) > 2 else None)
                corr = 1.0 if c is None else float(c)
                keep = bool(kw.get("keepdim", args[3] if len(args) > 3 else False))
            if op == "aten.std.correction":
                raise LoweringError("std")
        else:
            dims = args[1] if len(args) > 1 else kw.get("dim")
            keep = bool(args[2] if len(args) > 2 else kw.get("keepdim", False))
        if op in ("aten.sum.dim_IntList", "aten.mean.dim", "aten.sum.default", "aten.mean.default"):
            dt = kw.get("dtype")
            if dt is not None and dt != F32:
                raise LoweringError("reduction dtype")
        if isinstance(dims, int):
            dims = [dims]
        if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
            red = list(range(rank))
        else:
            red = sorted({d % max(rank, 1) for d in dims}) if rank else []
        mask = [1 if d in red else 0 for d in range(rank)]
        outs = node.out if isinstance(node.out, tuple) else (node.out,)
        results = []
        kinds = [kind] if op not in ("aten.max.dim", "aten.min.dim") else [kind, kind + 2]
        if op == "aten.var_mean.correction":
            kinds = [6, 1]
        for k, meta in zip(kinds, outs):
            final = None
            if k not in (4, 5, 9) and meta.dtype != F32:
                # e.g. the int64 sum of a bool tensor: reduce in float32, then convert (exact below 2**24)
                final = meta
                meta = TensorMeta(meta.shape, meta.stride, F32, meta.device)
            v = self.fresh(meta)
            val = self.values[v]
            # a keepdim view of the output: size 1 and stride 0 on reduced dims
            sizes, strides, j = [], [], 0
            for d in range(rank):
                if mask[d]:
                    sizes.append(1)
                    strides.append(0)
                    if keep:
                        j += 1
                else:
                    sizes.append(val["sizes"][j])
                    strides.append(val["strides"][j])
                    j += 1
            kv = self.new_value(val["buf"], val["offset"], sizes, strides)
            self.steps.append({"op": "reduce", "ins": [x], "outs": [kv], "ints": [k, *mask], "floats": [corr]})
            results.append(v if final is None else self.convert(v, final.dtype))
        return results[0] if len(results) == 1 else tuple(results)

    def convert(self, v: int, dtype: torch.dtype, nonzero: bool = False) -> int:
        """A copy of value ``v`` in a fresh contiguous buffer of ``dtype`` (``nonzero``: x != 0)."""
        sizes = list(self.values[v]["sizes"])
        out = self.fresh(TensorMeta(tuple(sizes), tuple(_contig(sizes)), dtype, "cpu"))
        src = self.dtype_of(v)
        compute = "f32" if F32 in (src, dtype) and not (nonzero and src != F32) else "i64"
        prog = [{"op": "load", "dst": 0, "a": [0], "f": []}]
        if nonzero:
            prog += [{"op": "const", "dst": 1, "a": [], "f": [0.0]}, {"op": "ne", "dst": 2, "a": [0, 1], "f": []}]
        prog.append({"op": "store", "dst": 0, "a": [len(prog) - 1 if nonzero else 0], "f": []})
        self.steps.append({"op": "ew", "compute": compute, "ins": [v], "outs": [out], "prog": prog})
        return out

    def fill(self, v: int, value: float) -> None:
        """Writes ``value`` into every element of value ``v``."""
        compute = "f32" if self.dtype_of(v) == F32 else "i64"
        prog = [{"op": "const", "dst": 0, "a": [], "f": [float(value)]}, {"op": "store", "dst": 0, "a": [0], "f": []}]
        self.steps.append({"op": "ew", "compute": compute, "ins": [], "outs": [v], "prog": prog})

    def copy_into(self, src: int, dst: int) -> None:
        if not {self.dtype_of(src), self.dtype_of(dst)} <= T.DTYPES:
            self.steps.append({"op": "cast", "ins": [src], "outs": [dst]})
            return
        compute = "f32" if F32 in (self.dtype_of(src), self.dtype_of(dst)) else "i64"
        prog = [{"op": "load", "dst": 0, "a": [0], "f": []}, {"op": "store", "dst": 0, "a": [0], "f": []}]
        self.steps.append({"op": "ew", "compute": compute, "ins": [src], "outs": [dst], "prog": prog})

    def unsqueeze2(self, v: int) -> int:
        """(N, C, L) as (N, C, 1, L)."""
        return self.view_of(v, self.meta_tensor(v).unsqueeze(2))

    def unbatched(self, v: int) -> int:
        """A leading batch dimension of 1 on ``v`` (a view: no copy)."""
        val = self.values[v]
        return self.new_value(val["buf"], val["offset"], [1, *val["sizes"]], [0, *val["strides"]])

    def as_1d(self, v: int) -> int:
        """A 0-d value as a 1-element 1-d view (kernels that take a dim need one)."""
        val = self.values[v]
        if val["sizes"]:
            return v
        return self.new_value(val["buf"], val["offset"], [1], [1])

    def lower_index_pad(self, node: Any) -> Any:
        """Reflection / replication padding: per padded dim, an int64 index vector computed by an
        elementwise program over an arange, then index_select."""
        x = self.value(node.args[0])
        pad = list(node.args[1])
        out = node.out
        reflect = "reflection" in node.op
        sizes = list(self.values[x]["sizes"])
        rank = len(sizes)
        v = x
        for i in range(len(pad) // 2):
            d = rank - 1 - i
            lo, hi = pad[2 * i], pad[2 * i + 1]
            n = sizes[d]
            m = n + lo + hi
            if reflect and (lo >= n or hi >= n):
                raise LoweringError("reflection padding as large as the input")
            pos = self.fresh(TensorMeta((m,), (1,), I64, "cpu"))
            self.steps.append({"op": "arange", "outs": [pos], "floats": [float(-lo), 1.0]})
            idx = self.fresh(TensorMeta((m,), (1,), I64, "cpu"))
            prog = [{"op": "load", "dst": 0, "a": [0], "f": []}]
            if reflect:  # (n-1) - |(n-1) - |i||
                prog += [{"op": "abs", "dst": 1, "a": [0], "f": []}, {"op": "const", "dst": 2, "a": [], "f": [float(n - 1)]},
                         {"op": "sub", "dst": 3, "a": [2, 1], "f": [1.0]}, {"op": "abs", "dst": 4, "a": [3], "f": []},
                         {"op": "sub", "dst": 5, "a": [2, 4], "f": [1.0]}]
            else:  # clamp(i, 0, n-1)
                prog += [{"op": "clamp", "dst": 5, "a": [0], "f": [0.0, float(n - 1)]}]
            prog.append({"op": "store", "dst": 0, "a": [5], "f": []})
            self.steps.append({"op": "ew", "compute": "i64", "ins": [pos], "outs": [idx], "prog": prog})
            sizes[d] = m
            last = i == len(pad) // 2 - 1
            nxt = self.fresh(out) if last else self.fresh(TensorMeta(tuple(sizes), tuple(_contig(sizes)), out.dtype, "cpu"))
            self.steps.append({"op": "index_select", "ins": [v, idx], "outs": [nxt], "ints": [d]})
            v = nxt
        return v

    def lower_index(self, src: Any, entries: list[Any], out: TensorMeta, step: Any) -> int:
        """``x[i0, i1, ...]`` (``aten.index.Tensor``) as one gather over broadcast index tensors.

        A ``None`` entry (a full slice, as interpolation's decompositions write
        ``x[None, None, h, w]``) becomes an ``arange`` over its dimension, shaped so that the
        broadcast of every index lands where PyTorch puts that dimension: before the indexed
        dimensions when the index tensors are adjacent, after them when they are not (NumPy's
        rule). Trailing ``None``s are the dimensions the kernel copies whole anyway."""
        x = self.value(src)
        xs = self.values[x]["sizes"]
        while entries and entries[-1] is None:
            entries.pop()
        pos = [d for d, e in enumerate(entries) if e is not None]
        tens = [self.value(entries[d]) for d in pos]
        bshape = tuple(torch.broadcast_shapes(*[tuple(self.values[t]["sizes"]) for t in tens]))
        sliced = [d for d, e in enumerate(entries) if e is None]
        adjacent = pos == list(range(pos[0], pos[-1] + 1))
        ns, nb = len(sliced), len(bshape)
        sliced_sizes = tuple(xs[d] for d in sliced)
        full = sliced_sizes + bshape if adjacent else bshape + sliced_sizes
        at_b = ns if adjacent else 0  # where the index tensors' broadcast dims start in `full`
        idx: dict[int, int] = {}
        for j, d in enumerate(sliced):
            r = self.fresh(TensorMeta((xs[d],), (1,), I64, "cpu"))
            step({"op": "arange", "outs": [r], "floats": [0.0, 1.0]})
            at = j if adjacent else nb + j
            sizes, strides = [1] * len(full), [0] * len(full)
            sizes[at], strides[at] = xs[d], 1
            idx[d] = self.broadcast(self.new_value(self.values[r]["buf"], 0, sizes, strides), full)
        for d, t in zip(pos, tens):
            tb = self.values[self.broadcast(t, bshape)]
            pad = len(full) - at_b - nb
            sizes = [1] * at_b + list(bshape) + [1] * pad
            strides = [0] * at_b + list(tb["strides"]) + [0] * pad
            idx[d] = self.broadcast(self.new_value(tb["buf"], tb["offset"], sizes, strides), full)
        o = self.fresh(out)
        step({"op": "index", "ins": [x, *(idx[d] for d in range(len(entries)))], "outs": [o]})
        return o

    def lower_batch_norm_stats(self, node: Any) -> Any:
        """Batch norm that normalises by the batch's own statistics (or, in eval mode, the running
        ones); the functional form also returns the updated running statistics."""
        op, a = node.op, list(node.args)
        if op == "aten._native_batch_norm_legit.no_stats":
            x_arg, w_arg, b_arg, training, momentum, eps = a
            rm_arg = rv_arg = None
        else:
            x_arg, w_arg, b_arg, rm_arg, rv_arg, training, momentum, eps = a
        outs = node.out
        x = self.value(x_arg)
        sizes = self.values[x]["sizes"]
        if len(sizes) < 2:
            raise LoweringError("batch norm input rank")
        c = sizes[1]
        per_c = TensorMeta((c,), (1,), F32, "cpu")

        def channel_view(v: int) -> int:  # a (C,) value broadcast over x's shape
            val = self.values[v]
            strides = [0] * len(sizes)
            strides[1] = val["strides"][0]
            return self.new_value(val["buf"], val["offset"], list(sizes), strides)

        def ew(ins: list[int], outs_: list[int], prog: list[dict[str, Any]]) -> None:
            self.steps.append({"op": "ew", "compute": "f32", "ins": ins, "outs": outs_, "prog": prog})

        def ld(r: int, i: int) -> dict[str, Any]:
            return {"op": "load", "dst": r, "a": [i], "f": []}

        def ins_(op_: str, r: int, args: list[int], f: list[float] | None = None) -> dict[str, Any]:
            return {"op": op_, "dst": r, "a": args, "f": f or []}

        if training:
            mean, var = self.fresh(per_c), self.fresh(per_c)
            mask = [1 if d != 1 else 0 for d in range(len(sizes))]
            for v, kind in ((mean, 1), (var, 6)):
                val = self.values[v]
                keep = [0] * len(sizes)
                keep[1] = val["strides"][0]
                kv = self.new_value(val["buf"], val["offset"], [1 if m else c for m in mask], keep)
                self.steps.append({"op": "reduce", "ins": [x], "outs": [kv], "ints": [kind, *mask], "floats": [0.0]})
        else:
            if rm_arg is None or rv_arg is None:
                raise LoweringError("eval-mode batch norm without running statistics")
            mean, var = self.value(rm_arg), self.value(rv_arg)
        rstd = self.fresh(per_c)
        ew([var], [rstd], [ld(0, 0), ins_("const", 1, [], [float(eps)]), ins_("add", 2, [0, 1], [1.0]),
                          ins_("rsqrt", 3, [2]), ins_("store", 0, [3])])
        y = self.fresh(outs[0])
        ins = [x, channel_view(mean), channel_view(rstd)]
        prog = [ld(0, 0), ld(1, 1), ld(2, 2), ins_("sub", 3, [0, 1], [1.0]), ins_("mul", 4, [3, 2])]
        r = 4
        if w_arg is not None:
            ins.append(channel_view(self.value(w_arg)))
            prog += [ld(5, len(ins) - 1), ins_("mul", 6, [r, 5])]
            r = 6
        if b_arg is not None:
            ins.append(channel_view(self.value(b_arg)))
            prog += [ld(7, len(ins) - 1), ins_("add", 8, [r, 7], [1.0])]
            r = 8
        prog.append(ins_("store", 0, [r]))
        ew(ins, [y], prog)
        results = [y]
        for meta, v in zip(outs[1:3], (mean, rstd)):
            if training:
                o = self.fresh(meta)
                self.copy_into(v, o)
            else:
                o = self.fresh(meta)  # PyTorch returns empty save_mean / save_invstd in eval mode
                if meta.numel:
                    raise LoweringError("eval-mode batch norm with non-empty saved statistics")
            results.append(o)
        if op == "aten._native_batch_norm_legit_functional.default":
            if not training:
                raise LoweringError("functional batch norm in eval mode")
            n = math.prod(sizes) // max(c, 1)
            unbias = n / (n - 1) if n > 1 else math.inf
            m = float(momentum)
            for running, stat, scale, meta in ((rm_arg, mean, 1.0, outs[3]), (rv_arg, var, unbias, outs[4])):
                o = self.fresh(meta)
                ew([self.value(running), stat], [o], [
                    ld(0, 0), ld(1, 1), ins_("const", 2, [], [1.0 - m]), ins_("mul", 3, [0, 2]),
                    ins_("const", 4, [], [m * scale]), ins_("mul", 5, [1, 4]), ins_("add", 6, [3, 5], [1.0]),
                    ins_("store", 0, [6])])
                results.append(o)
        return tuple(results)

    def lower_group_norm(self, node: Any) -> Any:
        """Group norm from two reductions and one elementwise sweep over (N, G, C/G, HxW)."""
        x_arg, w_arg, b_arg, n, c, hw, groups, eps = node.args
        x = self.value(x_arg)
        cg = c // groups
        try:
            xt = self.meta_tensor(x)
            xg = self.view_of(x, xt.view(n, groups, cg * hw))
            x4 = self.view_of(x, xt.view(n, groups, cg, hw))
        except RuntimeError as exc:
            raise LoweringError(f"group norm input layout: {exc}") from exc
        y_meta, mean_meta, rstd_meta = node.out
        mean, rstd = self.fresh(mean_meta), self.fresh(rstd_meta)
        var = self.fresh(TensorMeta((n, groups), (groups, 1), F32, "cpu"))

        def keep(v: int) -> int:
            val = self.values[v]
            return self.new_value(val["buf"], val["offset"], [n, groups, 1], [*val["strides"], 0])

        self.steps.append({"op": "reduce", "ins": [xg], "outs": [keep(mean)], "ints": [1, 0, 0, 1], "floats": [0.0]})
        self.steps.append({"op": "reduce", "ins": [xg], "outs": [keep(var)], "ints": [6, 0, 0, 1], "floats": [0.0]})
        prog = [{"op": "load", "dst": 0, "a": [0], "f": []}, {"op": "const", "dst": 1, "a": [], "f": [float(eps)]},
                {"op": "add", "dst": 2, "a": [0, 1], "f": [1.0]}, {"op": "rsqrt", "dst": 3, "a": [2], "f": []},
                {"op": "store", "dst": 0, "a": [3], "f": []}]
        self.steps.append({"op": "ew", "compute": "f32", "ins": [var], "outs": [rstd], "prog": prog})
        y = self.fresh(y_meta)
        try:
            y4 = self.view_of(y, self.meta_tensor(y).view(n, groups, cg, hw))
        except RuntimeError as exc:
            raise LoweringError(f"group norm output layout: {exc}") from exc

        def per_group(v: int) -> int:
            val = self.values[v]
            return self.new_value(val["buf"], val["offset"], [n, groups, cg, hw], [*val["strides"], 0, 0])

        def per_channel(arg: Any) -> int:
            val = self.values[self.value(arg)]
            st = val["strides"][0]
            return self.new_value(val["buf"], val["offset"], [n, groups, cg, hw], [0, cg * st, st, 0])

        ins = [x4, per_group(mean), per_group(rstd)]
        prog = [{"op": "load", "dst": i, "a": [i], "f": []} for i in range(3)]
        prog += [{"op": "sub", "dst": 3, "a": [0, 1], "f": [1.0]}, {"op": "mul", "dst": 4, "a": [3, 2], "f": []}]
        r = 4
        if w_arg is not None:
            ins.append(per_channel(w_arg))
            prog += [{"op": "load", "dst": 5, "a": [len(ins) - 1], "f": []}, {"op": "mul", "dst": 6, "a": [r, 5], "f": []}]
            r = 6
        if b_arg is not None:
            ins.append(per_channel(b_arg))
            prog += [{"op": "load", "dst": 7, "a": [len(ins) - 1], "f": []}, {"op": "add", "dst": 8, "a": [r, 7], "f": [1.0]}]
            r = 8
        prog.append({"op": "store", "dst": 0, "a": [r], "f": []})
        self.steps.append({"op": "ew", "compute": "f32", "ins": ins, "outs": [y4], "prog": prog})
        return (y, mean, rstd)

    # kernels ----------------------------------------------------------------------------------
    def lower_kernel(self, node: Any) -> Any:
        op, a, kw = node.op, list(node.args), dict(node.kwargs)
        out = node.out
        step = self.steps.append
        if op in ("aten.mm.default", "aten.bmm.default"):
            x, y = self.value(a[0]), self.value(a[1])
            c = self.fresh(out)
            st = {"op": "gemm", "ins": [x, y], "outs": [c], "floats": [1.0, 1.0], "epilogue": []}
            step(st)
            self.gemm_open[c] = st
            return c
        if op in ("aten.addmm.default", "aten.baddbmm.default"):
            bias, x, y = self.value(a[0]), self.value(a[1]), self.value(a[2])
            beta = float(kw.get("beta", a[3] if len(a) > 3 else 1))
            alpha = float(kw.get("alpha", a[4] if len(a) > 4 else 1))
            c = self.fresh(out)
            bb = self.broadcast(bias, tuple(out.shape))
            st = {"op": "gemm", "ins": [x, y, bb if beta != 0 else None], "outs": [c], "floats": [alpha, beta], "epilogue": []}
            step(st)
            self.gemm_open[c] = st
            return c
        if op == "aten.addmv.default":  # beta * bias + alpha * (mat @ vec), as an [N, 1] GEMM
            bias, m, v = self.value(a[0]), self.value(a[1]), self.value(a[2])
            beta = float(kw.get("beta", a[3] if len(a) > 3 else 1))
            alpha = float(kw.get("alpha", a[4] if len(a) > 4 else 1))
            c = self.fresh(out)

            def column(val: int) -> int:
                vv = self.values[val]
                return self.new_value(vv["buf"], vv["offset"], [vv["sizes"][0], 1], [vv["strides"][0], 0])

            bb = column(self.broadcast(bias, tuple(out.shape)))
            ins = [m, column(v), bb if beta != 0 else None]
            step({"op": "gemm", "ins": ins, "outs": [column(c)], "floats": [alpha, beta], "epilogue": []})
            return c
        if op in ("aten._softmax.default", "aten._log_softmax.default"):
            x = self.value(a[0])
            y = self.fresh(out)
            name = "softmax" if "_softmax" == op[5:13] else "log_softmax"
            step({"op": name, "ins": [self.as_1d(x)], "outs": [self.as_1d(y)], "ints": [a[1] if out.shape else 0]})
            return y
        if op in ("aten._softmax_backward_data.default", "aten._log_softmax_backward_data.default"):
            g, y = self.value(a[0]), self.value(a[1])
            gi = self.fresh(out)
            name = "log_softmax_bwd" if "log" in op else "softmax_bwd"
            step({"op": name, "ins": [g, y], "outs": [gi], "ints": [a[2]]})
            return gi
        if op == "aten.native_layer_norm.default":
            x, shape, w, b, eps = a
            n = math.prod(shape)
            outs = [self.fresh(m) for m in out]
            ins = [self.value(x), self.value(w) if w is not None else None, self.value(b) if b is not None else None]
            step({"op": "layer_norm", "ins": ins, "outs": outs, "ints": [n], "floats": [float(eps)]})
            return tuple(outs)
        if op == "aten._fused_rms_norm.default":
            x, shape, w = a[0], a[1], a[2]
            eps = a[3] if len(a) > 3 else kw.get("eps")
            eps = torch.finfo(torch.float32).eps if eps is None else float(eps)
            outs = [self.fresh(m) for m in out]
            ins = [self.value(x), self.value(w) if w is not None else None]
            step({"op": "rms_norm", "ins": ins, "outs": outs, "ints": [math.prod(shape)], "floats": [eps]})
            return tuple(outs)
        if op == "aten._scaled_dot_product_flash_attention_for_cpu.default":
            q, k, v = (self.value(t) for t in a[:3])
            causal = bool(a[4] if len(a) > 4 else kw.get("is_causal", False))
            mask = kw.get("attn_mask")
            scale = kw.get("scale")
            qs = self.values[q]["sizes"]
            scale = 1.0 / math.sqrt(qs[-1]) if scale is None else float(scale)
            outs = [self.fresh(m) for m in out]
            mv = None
            if mask is not None:
                b_, h_, l_ = qs[0], qs[1], qs[2]
                s_ = self.values[k]["sizes"][2]
                mv = self.broadcast(self.value(mask), (b_, h_, l_, s_))
            step({"op": "sdpa", "ins": [q, k, v, mv], "outs": outs, "ints": [int(causal)], "floats": [scale]})
            return tuple(outs)
        if op == "aten.embedding.default":
            w, idx = self.value(a[0]), self.value(a[1])
            o = self.fresh(out)
            step({"op": "embedding", "ins": [w, idx], "outs": [o]})
            return o
        if op == "aten.index.Tensor":
            return self.lower_index(a[0], list(a[1]), out, step)
        if op == "aten.gather.default":
            x, idx = self.value(a[0]), self.value(a[2])
            o = self.fresh(out)
            if not self.values[x]["sizes"] and not self.values[idx]["sizes"]:
                x, idx, t = self.as_1d(x), self.as_1d(idx), self.as_1d(o)
            else:
                t = o
            step({"op": "gather", "ins": [x, idx], "outs": [t], "ints": [a[1]]})
            return o
        if op == "aten.index_select.default":
            x, idx = self.value(a[0]), self.value(a[2])
            o = self.fresh(out)
            step({"op": "index_select", "ins": [self.as_1d(x), self.as_1d(idx)], "outs": [self.as_1d(o)], "ints": [a[1]]})
            return o
        if op == "aten.cumsum.default":
            x = self.value(a[0])
            o = self.fresh(out)
            step({"op": "cumsum", "ins": [self.as_1d(x)], "outs": [self.as_1d(o)], "ints": [a[1] if out.shape else 0]})
            return o
        if op in ("aten.cummax.default", "aten.cummin.default"):
            x = self.value(a[0])
            outs = [self.fresh(m) for m in out]
            name = "cummax" if op == "aten.cummax.default" else "cummin"
            ins, kouts = [self.as_1d(x)], [self.as_1d(o) for o in outs]
            step({"op": name, "ins": ins, "outs": kouts, "ints": [a[1] if out[0].shape else 0]})
            return tuple(outs)
        if op in ("aten.cumprod.default", "aten.logcumsumexp.default"):
            x = self.value(a[0])
            if self.dtype_of(x) != F32 or out.dtype != F32:
                raise LoweringError("scan of a non-float32 tensor")
            o = self.fresh(out)
            mode = 0 if op == "aten.cumprod.default" else 1
            step({"op": "scan", "ins": [self.as_1d(x)], "outs": [self.as_1d(o)], "ints": [a[1] if out.shape else 0, mode]})
            return o
        if op in ("aten.scatter.src", "aten.scatter.value", "aten.scatter_add.default", "aten.scatter_reduce.two",
                  "aten.scatter.reduce", "aten.scatter.value_reduce"):
            base, dim_, idx = self.value(a[0]), a[1], self.value(a[2])
            if op in ("aten.scatter.value", "aten.scatter.value_reduce"):
                isz = self.values[idx]["sizes"]
                src = self.fresh(TensorMeta(tuple(isz), tuple(_contig(isz)), out.dtype, "cpu"))
                self.fill(src, a[3])
            else:
                src = self.value(a[3])
            how, include = 0, 1
            if op == "aten.scatter_add.default":
                how = 1
            elif op == "aten.scatter_reduce.two":
                how = {"sum": 1, "prod": 2, "amax": 3, "amin": 4, "mean": 5}[a[4]]
                include = int(bool(kw.get("include_self", a[5] if len(a) > 5 else True)))
            elif op in ("aten.scatter.reduce", "aten.scatter.value_reduce"):
                how = {"add": 1, "multiply": 2}[kw.get("reduce", a[4] if len(a) > 4 else None)]
            o = self.fresh(out)
            ins = [self.as_1d(base), self.as_1d(idx), self.as_1d(src)]
            step({"op": "scatter", "ins": ins, "outs": [self.as_1d(o)], "ints": [dim_ if out.shape else 0, how, include]})
            return o
        if op == "aten.index_reduce.default":
            base, dim_, idx, src, red = self.value(a[0]), a[1], self.value(a[2]), self.value(a[3]), a[4]
            include = int(bool(kw.get("include_self", a[5] if len(a) > 5 else True)))
            how = {"prod": 2, "amax": 3, "amin": 4, "mean": 5}[red]
            o = self.fresh(out)
            if not out.shape:
                base, src, idx = self.as_1d(base), self.as_1d(src), self.as_1d(idx)
                step({"op": "scatter", "ins": [base, idx, src], "outs": [self.as_1d(o)], "ints": [0, how, include]})
                return o
            ssz = self.values[src]["sizes"]
            d = dim_ % len(ssz)
            iv = self.values[idx]
            strides = [0] * len(ssz)
            strides[d] = iv["strides"][0] if iv["sizes"] else 0
            idx_view = self.new_value(iv["buf"], iv["offset"], list(ssz), strides)
            step({"op": "scatter", "ins": [base, idx_view, src], "outs": [o], "ints": [d, how, include]})
            return o
        if op == "aten.index_put.default":
            base, values = self.value(a[0]), self.value(a[2])
            accumulate = bool(kw.get("accumulate", a[3] if len(a) > 3 else False))
            # leading None indices (index_copy / index_fill on a later dim): the kernel indexes the
            # leading dims, so the indexed dims are moved to the front of base, values and result
            lead = next(k for k, i in enumerate(a[1]) if i is not None)
            idx = [self.value(i) for i in a[1][lead:]]
            bshape = tuple(torch.broadcast_shapes(*[tuple(self.values[i]["sizes"]) for i in idx]))
            idx = [self.broadcast(i, bshape) for i in idx]
            rest = tuple(out.shape[lead + len(idx):])
            vals = self.broadcast(values, tuple(out.shape[:lead]) + bshape + rest)
            if self.dtype_of(vals) != out.dtype:
                vals = self.convert(vals, out.dtype)
            o = self.fresh(out)
            kb, kx = len(bshape), len(idx)
            if lead:
                nd = len(out.shape)
                perm = [*range(lead, lead + kx), *range(lead), *range(lead + kx, nd)]
                vperm = [*range(lead, lead + kb), *range(lead), *range(lead + kb, lead + kb + len(rest))]
                base = self.view_of(base, self.meta_tensor(base).permute(perm))
                vals = self.view_of(vals, self.meta_tensor(vals).permute(vperm))
                ov = self.view_of(o, self.meta_tensor(o).permute(perm))
            else:
                ov = o
            step({"op": "index_put", "ins": [base, vals, *idx], "outs": [ov], "ints": [int(accumulate)]})
            return o
        if op in T.INDEX_PADS:
            return self.lower_index_pad(node)
        if op in T.BATCH_NORMS:
            return self.lower_batch_norm_stats(node)
        if op == "aten.native_group_norm.default":
            return self.lower_group_norm(node)
        if op == "aten.median.default":
            # the lower middle of the sorted values, NaN when any value is NaN (as PyTorch)
            x = self.value(a[0])
            n = math.prod(self.values[x]["sizes"])
            if n == 0:
                raise LoweringError("median of an empty tensor")
            flat = self.fresh(TensorMeta((n,), (1,), F32, "cpu"))
            self.copy_into(x, self.view_of(flat, self.meta_tensor(flat).view(self.values[x]["sizes"])))
            vals, pos = (self.fresh(TensorMeta((n,), (1,), dt, "cpu")) for dt in (F32, I64))
            step({"op": "sort", "ins": [flat], "outs": [vals, pos], "ints": [0, 0]})
            nan = self.fresh(TensorMeta((n,), (1,), F32, "cpu"))
            prog = [{"op": "load", "dst": 0, "a": [0], "f": []}, {"op": "isnan", "dst": 1, "a": [0], "f": []},
                    {"op": "store", "dst": 0, "a": [1], "f": []}]
            step({"op": "ew", "compute": "f32", "ins": [flat], "outs": [nan], "prog": prog})
            anynan = self.fresh(TensorMeta((1,), (1,), BOOL, "cpu"))
            step({"op": "reduce", "ins": [nan], "outs": [anynan], "ints": [9, 1], "floats": [0.0]})
            mid = self.view_of(vals, self.meta_tensor(vals).narrow(0, (n - 1) // 2, 1))
            o = self.fresh(out)
            o1 = self.as_1d(o)
            prog = [{"op": "load", "dst": 0, "a": [0], "f": []}, {"op": "load", "dst": 1, "a": [1], "f": []},
                    {"op": "const", "dst": 2, "a": [], "f": [0.0]}, {"op": "div", "dst": 3, "a": [2, 2], "f": []},
                    {"op": "where", "dst": 4, "a": [0, 3, 1], "f": []}, {"op": "store", "dst": 0, "a": [4], "f": []}]
            step({"op": "ew", "compute": "f32", "ins": [anynan, mid], "outs": [o1], "prog": prog})
            return o
        if op == "aten.kthvalue.default":
            x = self.as_1d(self.value(a[0]))
            k = a[1]
            dim_ = a[2] if len(a) > 2 else kw.get("dim", -1)
            keep = bool(a[3] if len(a) > 3 else kw.get("keepdim", False))
            sizes = self.values[x]["sizes"]
            d = dim_ % len(sizes)
            metas = [TensorMeta(tuple(sizes), tuple(_contig(sizes)), dt, "cpu") for dt in (self.dtype_of(x), I64)]
            vals, pos = (self.fresh(m) for m in metas)
            step({"op": "sort", "ins": [x], "outs": [vals, pos], "ints": [d, 0]})
            results = []
            for v, meta in zip((vals, pos), out):
                t = self.meta_tensor(v).narrow(d, k - 1, 1)
                t = t.reshape(meta.shape) if (not keep or not meta.shape) else t
                results.append(self.view_of(v, t))
            return tuple(results)
        if op in ("aten.sort.default", "aten.sort.stable", "aten.topk.default"):
            x = self.as_1d(self.value(a[0]))
            rank = len(self.values[x]["sizes"])
            if op == "aten.topk.default":
                k = a[1]
                dim_ = a[2] if len(a) > 2 else kw.get("dim", -1)
                desc = bool(a[3] if len(a) > 3 else kw.get("largest", True))
            elif op == "aten.sort.stable":
                dim_ = kw.get("dim", -1)
                desc = bool(kw.get("descending", False))
            else:
                dim_ = a[1] if len(a) > 1 else kw.get("dim", -1)
                desc = bool(a[2] if len(a) > 2 else kw.get("descending", False))
            d = dim_ % rank
            sizes = self.values[x]["sizes"]
            metas = [TensorMeta(tuple(sizes), tuple(_contig(sizes)), dt, "cpu") for dt in (self.dtype_of(x), I64)]
            vals, pos = (self.fresh(m) for m in metas)
            step({"op": "sort", "ins": [x], "outs": [vals, pos], "ints": [d, int(desc)]})
            results = []
            for v, meta in zip((vals, pos), out):
                t = self.meta_tensor(v)
                if op == "aten.topk.default":
                    t = t.narrow(d, 0, k)
                t = t.reshape(meta.shape) if not meta.shape else t
                results.append(self.view_of(v, t))
            return tuple(results)
        if op == "aten.constant_pad_nd.default":
            x = self.value(a[0])
            pad = list(a[1])
            value = a[2] if len(a) > 2 else kw.get("value", 0)
            o = self.fresh(out)
            if isinstance(value, float) and math.isnan(value):
                raise LoweringError("NaN padding value")
            self.fill(o, value)
            windows = self.pad_windows(x, o, pad)
            if windows is not None:
                self.copy_into(self.view_of(x, windows[0]), self.view_of(o, windows[1]))
            return o
        if op == "aten.repeat.default":
            x = self.value(a[0])
            reps = list(a[1])
            xs, xst = self.values[x]["sizes"], self.values[x]["strides"]
            pad = len(reps) - len(xs)
            xs, xst = [1] * pad + list(xs), [0] * pad + list(xst)
            o = self.fresh(out)
            ov = self.values[o]
            sizes, ostr, istr = [], [], []
            for r, n, st, os_ in zip(reps, xs, xst, ov["strides"]):
                sizes += [r, n]
                ostr += [n * os_, os_]
                istr += [0, st]
            src = self.new_value(self.values[x]["buf"], self.values[x]["offset"], sizes, istr)
            dst = self.new_value(ov["buf"], ov["offset"], sizes, ostr)
            self.copy_into(src, dst)
            return o
        if op == "aten.flip.default":
            v = self.value(a[0])
            sizes = self.values[v]["sizes"]
            dims = sorted({d % len(sizes) for d in a[1]} if sizes else set())
            dims = [d for d in dims if sizes[d] > 1]
            o = self.fresh(out)
            if not dims:
                self.copy_into(v, o)
            for j, d in enumerate(dims):
                # no negative strides in a view: gather through a reversed arange instead
                n = sizes[d]
                rev = self.fresh(TensorMeta((n,), (1,), I64, "cpu"))
                step({"op": "arange", "outs": [rev], "floats": [float(n - 1), -1.0]})
                last = j == len(dims) - 1
                nxt = o if last else self.fresh(TensorMeta(tuple(sizes), tuple(_contig(sizes)), out.dtype, "cpu"))
                step({"op": "index_select", "ins": [v, rev], "outs": [nxt], "ints": [d]})
                v = nxt
            return o
        if op.startswith("aten.arange."):
            if op == "aten.arange.default":
                start, step_ = 0, 1
            elif op == "aten.arange.start":
                start, step_ = a[0], 1
            else:
                start, step_ = a[0], (a[2] if len(a) > 2 else 1)
            o = self.fresh(out)
            step({"op": "arange", "outs": [o], "floats": [float(start), float(step_)]})
            return o
        if op == "aten.convolution.default":
            x, w, b, stride, padding, dilation, transposed, outpad, groups = a
            if len(stride) not in (1, 2, 3) or transposed and len(stride) == 3:
                raise LoweringError("only 1-d, 2-d and 3-d convolution, and 1-d and 2-d transposed convolution")
            o = self.fresh(out)
            ins = [self.value(x), self.value(w), self.value(b) if b is not None else None]
            if len(stride) == 3:
                ints = [*stride, *padding, *dilation, groups]
                step({"op": "conv3d", "ins": ins, "outs": [o], "ints": [int(v) for v in ints]})
                return o
            target = o
            if len(stride) == 1:
                # a 1-d convolution is a 2-d one over a height of 1
                ins[0], ins[1], target = (self.unsqueeze2(v) for v in (ins[0], ins[1], o))
                stride, padding, dilation = [1, stride[0]], [0, padding[0]], [1, dilation[0]]
                outpad = [0, outpad[0]]
            ints = [stride[0], stride[1], padding[0], padding[1], dilation[0], dilation[1], groups]
            if transposed:
                step({"op": "conv_transpose2d", "ins": ins, "outs": [target], "ints": [*ints, *outpad]})
            else:
                step({"op": "conv2d", "ins": ins, "outs": [target], "ints": ints})
            return o
        if op == "aten.max_pool2d_with_indices.default":
            x = self.value(a[0])
            k = _pair(a[1])
            s = _pair(a[2] if len(a) > 2 and a[2] else a[1])
            p = _pair(a[3] if len(a) > 3 else 0)
            d = _pair(a[4] if len(a) > 4 else 1)
            outs = [self.fresh(m) for m in out]
            step({"op": "max_pool2d", "ins": [x], "outs": outs, "ints": [*k, *s, *p, *d]})
            return tuple(outs)
        if op in ("aten.max_pool3d_with_indices.default", "aten.avg_pool3d.default"):
            x = self.value(a[0])
            k = _triple(a[1])
            s = _triple(a[2] if len(a) > 2 and a[2] else a[1])
            p = _triple(a[3] if len(a) > 3 else 0)
            metas = list(out) if isinstance(out, (list, tuple)) else [out]
            outs = [self.fresh(m) for m in metas]
            kernel_outs = outs
            if len(self.values[x]["sizes"]) == 4:  # (C, D, H, W): one volume
                x = self.unbatched(x)
                kernel_outs = [self.unbatched(o) for o in outs]
            if op == "aten.max_pool3d_with_indices.default":
                d = _triple(a[4] if len(a) > 4 else 1)
                step({"op": "max_pool3d", "ins": [x], "outs": kernel_outs, "ints": [*k, *s, *p, *d]})
                return tuple(outs)
            include = a[5] if len(a) > 5 else True
            div = a[6] if len(a) > 6 and a[6] is not None else 0
            if div < 0:
                raise LoweringError("negative divisor_override")
            step({"op": "avg_pool3d", "ins": [x], "outs": kernel_outs, "ints": [*k, *s, *p, int(include), int(div)]})
            return outs[0]
        if op in ADAPTIVE_POOLS:
            name, spatial = ADAPTIVE_POOLS[op]
            x = self.value(a[0])
            metas = list(out) if isinstance(out, (list, tuple)) else [out]
            outs = [self.fresh(m) for m in metas]
            if len(self.values[x]["sizes"]) == spatial + 1:  # (C, H, W) or (C, D, H, W): unbatched
                x = self.unbatched(x)
                kernel_outs = [self.unbatched(o) for o in outs]
            else:
                kernel_outs = outs
            step({"op": name, "ins": [x], "outs": kernel_outs})
            return outs[0] if len(outs) == 1 else tuple(outs)
        if op == "aten.avg_pool2d.default":
            x = self.value(a[0])
            k = _pair(a[1])
            s = _pair(a[2] if len(a) > 2 and a[2] else a[1])
            p = _pair(a[3] if len(a) > 3 else 0)
            include = a[5] if len(a) > 5 else True
            div = a[6] if len(a) > 6 and a[6] is not None else 0
            o = self.fresh(out)
            pooled = self.fresh(out) if div < 0 else o
            step({"op": "avg_pool2d", "ins": [x], "outs": [pooled], "ints": [*k, *s, *p, int(include), abs(int(div))]})
            if div < 0:  # PyTorch divides by a negative divisor_override as given
                prog = [{"op": "load", "dst": 0, "a": [0], "f": []}, {"op": "neg", "dst": 1, "a": [0], "f": []},
                        {"op": "store", "dst": 0, "a": [1], "f": []}]
                step({"op": "ew", "compute": "f32", "ins": [pooled], "outs": [o], "prog": prog})
            return o
        if op == "aten.nll_loss_forward.default":
            x, t, w, red, ignore = a
            outs = [self.fresh(m) for m in out]
            ins = [self.value(x), self.value(t), self.value(w) if w is not None else None]
            step({"op": "nll_loss", "ins": ins, "outs": outs, "ints": [red, ignore]})
            return tuple(outs)
        if op == "aten.nll_loss_backward.default":
            g, x, t, w, red, ignore, total = a
            o = self.fresh(out)
            ins = [self.value(g), self.value(x), self.value(t), self.value(w) if w is not None else None, self.value(total)]
            step({"op": "nll_loss_bwd", "ins": ins, "outs": [o], "ints": [red, ignore]})
            return o
        if op in ("aten.cat.default", "aten.stack.default"):
            tensors = [self.value(t) for t in a[0]]
            dim = a[1] if len(a) > 1 else kw.get("dim", 0)
            o = self.fresh(out)
            rank = len(out.shape)
            dim = dim % rank
            full = self.meta_tensor(o)
            pos = 0
            for tv in tensors:
                sizes = self.values[tv]["sizes"]
                if op == "aten.cat.default" and sizes == [0] and rank > 1:
                    continue  # legacy empty inputs of cat
                n = 1 if op == "aten.stack.default" else sizes[dim]
                part = full.narrow(dim, pos, n)
                pos += n
                pv = self.view_of(o, part)
                src = tv if op == "aten.cat.default" else self.view_of(tv, self.meta_tensor(tv).unsqueeze(dim))
                compute = "f32" if self.dtype_of(o) == F32 else "i64"
                if compute == "i64" and self.dtype_of(src) == F32:
                    raise LoweringError("cat of float into an integer result")
                self.steps.append({
                    "op": "ew", "compute": compute, "ins": [src], "outs": [pv],
                    "prog": [{"op": "load", "dst": 0, "a": [0], "f": []}, {"op": "store", "dst": 0, "a": [0], "f": []}],
                })
            return o
        raise LoweringError(f"no lowering for {op}")


def _overload(name: str) -> Any:
    _, packet, overload = name.split(".")
    return getattr(getattr(torch.ops.aten, packet), overload)


#: adaptive pooling op -> (kernel, spatial dims)
ADAPTIVE_POOLS = {
    "aten._adaptive_avg_pool2d.default": ("adaptive_avg_pool2d", 2),
    "aten.adaptive_max_pool2d.default": ("adaptive_max_pool2d", 2),
    "aten._adaptive_avg_pool3d.default": ("adaptive_avg_pool3d", 3),
    "aten.adaptive_max_pool3d.default": ("adaptive_max_pool3d", 3),
}


def _triple(v: Any) -> list[int]:
    return [int(x) for x in v] * (3 if len(v) == 1 else 1) if isinstance(v, (list, tuple)) else [int(v)] * 3


def _pair(v: Any) -> list[int]:
    if isinstance(v, int):
        return [v, v]
    v = list(v)
    return v * 2 if len(v) == 1 else v[:2]


def _refs(template: Any) -> list[int]:
    if isinstance(template, Ref):
        return [template.slot]
    if isinstance(template, (tuple, list)):
        return [r for t in template for r in _refs(t)]
    if isinstance(template, dict):
        return [r for t in template.values() for r in _refs(t)]
    return []


def _finite(value: Any) -> Any:
    """JSON has no inf: ±3.4e39 is finite in f64 and becomes ±inf when Rust narrows to f32."""
    if isinstance(value, float):
        if math.isnan(value):
            raise LoweringError("NaN literal")
        if math.isinf(value):
            return math.copysign(3.4e39, value)
        return value
    if isinstance(value, list):
        return [_finite(v) for v in value]
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return value


def lower(plan: Plan) -> dict[str, Any]:
    result = Lowerer(plan).lower()
    result["json"] = json.dumps(_finite(result["spec"]), allow_nan=False)
    return result
