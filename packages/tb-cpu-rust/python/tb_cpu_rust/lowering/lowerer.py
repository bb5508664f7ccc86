"""The lowering engine: a torchburn ``Plan`` -> the executor spec (buffers, strided views, steps).

View ops are resolved at compile time, on meta tensors: they cost nothing at run time.
Elementwise ops are fused greedily into register programs that run as one sweep (an
intermediate value gets a buffer only if something outside its program reads it). Every other
op becomes one or a few Rust kernel steps. Which lowering a node gets is the registry's
business (registry.py); this module holds the state they share and the memory plan. The spec is
validated again in Rust before anything runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from tb_cpu_rust.lowering import steps as S
from tb_cpu_rust.lowering.dtypes import DT_NAME, DT_OF_NAME, DTYPES, F32
from tb_cpu_rust.lowering.registry import LoweringError, lowering_for
from torchburn.plan import GETITEM, Plan, Ref, TensorMeta


def extent(shape: tuple[int, ...] | list[int], stride: tuple[int, ...] | list[int]) -> int:
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((s - 1) * st for s, st in zip(shape, stride))


def contig(shape: list[int] | tuple[int, ...]) -> list[int]:
    out, acc = [0] * len(shape), 1
    for i in range(len(shape) - 1, -1, -1):
        out[i] = acc
        acc *= max(shape[i], 1)
    return out


def meta(shape: list[int] | tuple[int, ...], dtype: torch.dtype) -> TensorMeta:
    """A contiguous cpu TensorMeta (the layout of a fresh temporary)."""
    return TensorMeta(tuple(shape), tuple(contig(shape)), dtype, "cpu")


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
    prog: list[S.Instr] = field(default_factory=list)
    ins: list[int] = field(default_factory=list)
    loads: dict[int, int] = field(default_factory=dict)  # value id -> register
    nregs: int = 0
    members: dict[int, Lazy] = field(default_factory=dict)  # slot -> lazy

    def reg(self) -> int:
        self.nregs += 1
        return self.nregs - 1

    def emit(self, op: str, a: list[int], f: list[float] | None = None) -> int:
        r = self.reg()
        self.prog.append(S.instr(op, r, a, f or ()))
        return r

    def const(self, value: float) -> int:
        return self.emit("const", [], [value])

    def load(self, v: int) -> int:
        """A register loading input value ``v`` (added to the group's inputs)."""
        self.ins.append(v)
        r = self.reg()
        self.prog.append(S.load(r, len(self.ins) - 1))
        return r


class Lowerer:
    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.buffers: list[dict[str, Any]] = []
        self.values: list[dict[str, Any]] = []
        self.steps: list[S.Step] = []
        self.slot: dict[int, Any] = {}
        self.group: Group | None = None
        # value id of a GEMM result -> its step, while an epilogue may still be fused into it
        self.gemm_open: dict[int, Any] = {}
        self.uses: dict[int, int] = {}
        self.used: dict[int, int] = {}
        # slot -> an int64 copy of a narrow-integer value, for the comparisons that read it
        self.widened: dict[int, int] = {}
        self.node_slot = 0  # the plan slot of the node being lowered
        for node in plan.nodes:
            for r in _refs((node.args, node.kwargs)):
                self.uses[r] = self.uses.get(r, 0) + 1
        for r in _refs(plan.outputs):
            self.uses[r] = self.uses.get(r, 0) + 1
        # patterns lowered as one step at their last node (rotary embeddings, written-out RMS
        # norms): node index -> its lowering; the nodes inside a pattern are skipped
        from tb_cpu_rust.lowering.patterns import find_patterns  # it imports this module

        self.patterns, self.pattern_inner = find_patterns(plan, self.uses)

    # -- values ---------------------------------------------------------------------------
    def new_buffer(self, kind: str, meta: TensorMeta) -> int:
        self.buffers.append(
            {
                "kind": kind,
                "dtype": DT_NAME[meta.dtype],
                "numel": extent(meta.shape, meta.stride),
                "sizes": list(meta.shape) if kind == "input" else [],
                "strides": list(meta.stride) if kind == "input" else [],
            }
        )
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
        return self.new_value(self.values[v]["buf"], int(t.storage_offset()), list(t.shape), list(t.stride()))

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
        outs: list[int] = []
        for slot, lz in g.members.items():
            if self.used.get(slot, 0) < self.uses.get(slot, 0):
                v = self.fresh(lz.meta)
                g.prog.append(S.store(len(outs), lz.reg))
                outs.append(v)
                self.slot[slot] = v
            else:
                self.slot[slot] = None  # fully consumed inside the program
        if outs:
            self.steps.append(S.Ew(g.compute, g.ins, outs, g.prog))

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
                g.loads[bv] = g.load(bv)
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
            if k in self.pattern_inner:
                self.slot[slot] = None  # read only by its pattern's last node, lowered there
                continue
            if k in self.patterns:
                self.node_slot = slot
                self.slot[slot] = self.patterns[k](self, node.out)
                continue
            self.slot[slot] = self.lower_node(node, slot)
        self.flush()
        outputs = []
        for o in plan.outputs:
            if isinstance(o, Ref):
                outputs.append(("v", self.value(o)))
            else:
                outputs.append(("lit", o))
        from tb_cpu_rust.lowering.bf16_products import mark_bfloat16_products
        from tb_cpu_rust.lowering.gemm import fold_low_precision_casts  # gemm.py imports this module

        mark_bfloat16_products(self)
        fold_low_precision_casts(self, outputs)
        from tb_cpu_rust.lowering.low_precision_ew import fold_casts_into_ew, merge_rounded_ew_chains

        fold_casts_into_ew(self, outputs)
        merge_rounded_ew_chains(self, outputs)
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
        direct = _direct_outputs(outputs, values, buffers)
        for b in range(len(inputs), len(inputs) + len(out_bufs)):
            # the layout the executor checks each output tensor against: that of the one whole
            # output it backs, else its elements flat
            buffers[b]["sizes"], buffers[b]["strides"] = direct.get(b, ([buffers[b]["numel"]], [1]))
        direct_list = [[b, *layout] for b, layout in sorted(direct.items())]
        spec = {
            "schema": S.SCHEMA_VERSION,
            "buffers": buffers,
            "values": values,
            "steps": [S.wire(st) for st in self.steps],
        }
        return {
            "spec": spec, "outputs": outputs, "values": values, "buffers": buffers, "n_inputs": len(inputs),
            "direct": direct_list,
        }  # fmt: skip

    def share_temps(self) -> None:
        """Memory plan: temporaries whose lifetimes (first write .. last read, in step order)
        do not overlap share one workspace slot, so a plan needs as much scratch memory as its
        widest point and not the sum of all intermediates. A slot is never shared by a step's
        input and output (the executor refuses that), so reuse starts one step after a last read."""
        first: dict[int, int] = {}
        last: dict[int, int] = {}
        for i, st in enumerate(self.steps):
            for v in [*(x for x in st.reads() if x is not None), *st.writes()]:
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
                if sl["dtype"] != buf["dtype"] or sl["free_after"] >= first[b]:
                    continue
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
        for val in self.values:
            val["buf"] = remap.get(val["buf"], val["buf"])

    # -- nodes --------------------------------------------------------------------------------

    def lower_node(self, node: Any, slot: int) -> Any:
        self.node_slot = slot
        return lowering_for(self, node)(self, node)

    def replace_step(self, old: S.Step, new: S.Step) -> None:
        for i, st in enumerate(self.steps):
            if st is old:
                self.steps[i] = new
                return
        raise LoweringError("step not in the plan")

    def dtype_of_arg(self, a: Ref) -> torch.dtype:
        v = self.slot.get(a.slot)
        if isinstance(v, Lazy):
            return v.meta.dtype
        if isinstance(v, int):
            return self.dtype_of(v)
        raise LoweringError("argument has no value")

    def convert(self, v: int, dtype: torch.dtype, nonzero: bool = False) -> int:
        """A copy of value ``v`` in a fresh contiguous buffer of ``dtype`` (``nonzero``: x != 0)."""
        sizes = list(self.values[v]["sizes"])
        out = self.fresh(meta(sizes, dtype))
        src = self.dtype_of(v)
        compute = "f32" if F32 in (src, dtype) and not (nonzero and src != F32) else "i64"
        prog = [S.load(0, 0)]
        if nonzero:
            prog += [S.const(1, 0.0), S.instr("ne", 2, [0, 1])]
        prog.append(S.store(0, len(prog) - 1 if nonzero else 0))
        self.steps.append(S.Ew(compute, [v], [out], prog))
        return out

    def fill(self, v: int, value: float) -> None:
        """Writes ``value`` into every element of value ``v``."""
        compute = "f32" if self.dtype_of(v) == F32 else "i64"
        self.steps.append(S.Ew(compute, [], [v], [S.const(0, float(value)), S.store(0, 0)]))

    def copy_into(self, src: int, dst: int) -> None:
        if not {self.dtype_of(src), self.dtype_of(dst)} <= DTYPES:
            self.steps.append(S.Cast(x=src, y=dst))
            return
        compute = "f32" if F32 in (self.dtype_of(src), self.dtype_of(dst)) else "i64"
        self.steps.append(S.Ew(compute, [src], [dst], S.copy_program()))

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

    def fill_any(self, v: int, value: Any) -> None:
        """A ``fill`` step: integers exactly, floats in f64 (NaN and infinities by mode)."""
        if isinstance(value, (bool, int)):
            step = S.Fill(y=v, mode=1, integer=int(value))
        elif math.isnan(value):
            step = S.Fill(y=v, mode=2)
        elif math.isinf(value):
            step = S.Fill(y=v, mode=3 if value > 0 else 4)
        else:
            step = S.Fill(y=v, mode=0, value=float(value))
        self.steps.append(step)

    # views and temporaries ------------------------------------------------------------------
    def mT(self, v: int) -> int:
        val = self.values[v]
        sz, st = list(val["sizes"]), list(val["strides"])
        sz[-2], sz[-1], st[-2], st[-1] = sz[-1], sz[-2], st[-1], st[-2]
        return self.new_value(val["buf"], val["offset"], sz, st)

    def unsq(self, v: int, dim: int) -> int:
        return self.view_of(v, self.meta_tensor(v).unsqueeze(dim))

    def temp(self, shape: list[int], dtype: torch.dtype = F32) -> int:
        return self.fresh(meta(shape, dtype))

    def reduced_view(self, v: int, mask: list[int], keep: bool) -> int:
        """Result ``v`` of a reduction seen with the input's rank: size 1 and stride 0 on the
        reduced dims (``mask``), which ``v`` has as size-1 dims when ``keep``."""
        val = self.values[v]
        sizes, strides, j = [], [], 0
        for reduced in mask:
            if reduced:
                sizes.append(1)
                strides.append(0)
                j += 1 if keep else 0
            else:
                sizes.append(val["sizes"][j])
                strides.append(val["strides"][j])
                j += 1
        return self.new_value(val["buf"], val["offset"], sizes, strides)

    def flat(self, v: int) -> int:
        """Value ``v`` as a 1-d row-major view (copied into a contiguous temporary when it is not one)."""
        val = self.values[v]
        sizes = list(val["sizes"])
        n = math.prod(sizes)
        if list(val["strides"]) != contig(sizes):
            t = self.temp(sizes, self.dtype_of(v))
            self.copy_into(v, t)
            val = self.values[t]
        return self.new_value(val["buf"], val["offset"], [n], [1])


def _refs(template: Any) -> list[int]:
    if isinstance(template, Ref):
        return [template.slot]
    if isinstance(template, (tuple, list)):
        return [r for t in template for r in _refs(t)]
    if isinstance(template, dict):
        return [r for t in template.values() for r in _refs(t)]
    return []


def finite(value: Any) -> Any:
    """JSON has no inf: ±3.4e39 is finite in f64 and becomes ±inf when Rust narrows to f32."""
    if isinstance(value, float):
        if math.isnan(value):
            raise LoweringError("NaN literal")
        if math.isinf(value):
            return math.copysign(3.4e39, value)
        return value
    if isinstance(value, list):
        return [finite(v) for v in value]
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    return value


def _direct_outputs(
    outputs: list[Any], values: list[dict[str, Any]], buffers: list[dict[str, Any]]
) -> dict[int, tuple[list[int], list[int]]]:
    """Output buffer -> the sizes and strides of the one plan output that is the whole buffer
    (offset 0, spanning its elements): such a buffer is allocated as that output itself."""
    backs: dict[int, list[int]] = {}
    for kind, v in outputs:
        if kind == "v" and buffers[values[v]["buf"]]["kind"] == "output":
            backs.setdefault(values[v]["buf"], []).append(v)
    direct = {}
    for b, vs in backs.items():
        val = values[vs[0]]
        if len(vs) == 1 and val["offset"] == 0 and extent(val["sizes"], val["strides"]) == buffers[b]["numel"]:
            direct[b] = (list(val["sizes"]), list(val["strides"]))
    return direct
