"""Lowering a Plan to a list of compute dispatches over device storages.

Values inside a partition are strided views (``TV``) of device storages, so view ops (view,
permute, expand, slice, select...) cost nothing. Elementwise ops do not run when they are
met: they build a ``Lazy`` expression, and a chain of them becomes ONE generated WGSL kernel
when a non-elementwise op, a second user or a partition output needs the value. A lazy whose
only input is the fresh result of a matmul folds into the matmul's epilogue instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from tb_wgpu import shaders

WG = 256
# Device element type of each accepted torch dtype, as kernels compute with it. bool and int32
# take a 32-bit word (WGSL storage has no 8-bit types). float16 computes in f32 registers but is
# STORED as f16 (``Storage.half``: the program rewrites the kernel's binding to ``array<f16>``
# with converting loads and stores, see ``shaders.to_half``). int64 is ``tb_i64``, 8 bytes like
# torch's: WGSL ``i64`` where the device has ``shader-int64``, else two u32 words with emulated
# arithmetic (``shaders.with_int64`` picks the helpers when the program is built).
I64 = "tb_i64"
DEV_TYPE: dict[torch.dtype, str] = {
    torch.float32: "f32",
    torch.float16: "f32",
    torch.bool: "u32",
    torch.int64: I64,
    torch.int32: "i32",
}


class LoweringError(ValueError):
    """The plan holds something this engine's lowering does not take (a bug if the checker passed it)."""


@dataclass
class Storage:
    id: int
    numel: int
    wgsl: str
    input_slot: int | None = None
    half: bool = False  # stored as f16 (2 bytes an element)

    @property
    def itemsize(self) -> int:
        return 2 if self.half else (8 if self.wgsl == I64 else 4)

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize


@dataclass(frozen=True)
class TV:
    """A strided view of a storage, in elements."""

    storage: int
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def is_contiguous(self) -> bool:
        return (
            self.stride == contiguous_strides(self.shape) or self.numel <= 1 or _dense_contig(self.shape, self.stride)
        )

    def with_view(self, shape: tuple[int, ...], stride: tuple[int, ...], offset: int | None = None) -> TV:
        return TV(self.storage, self.offset if offset is None else offset, tuple(shape), tuple(stride), self.dtype)


def _dense_contig(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    expected = 1
    for size, st in zip(reversed(shape), reversed(stride)):
        if size != 1 and st != expected:
            return False
        expected *= size
    return True


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides = []
    acc = 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


# -- expressions -------------------------------------------------------------------------------
@dataclass(eq=False)
class Expr:
    ty: str  # "f32", "i32", "u32" (bool) or I64


@dataclass(eq=False)
class Leaf(Expr):
    tv: TV = None  # type: ignore[assignment]


@dataclass(eq=False)
class Const(Expr):
    text: str = ""


@dataclass(eq=False)
class Op(Expr):
    fmt: str = ""
    args: tuple[Expr, ...] = ()


@dataclass(eq=False)
class Gather(Op):
    """A read of ``src`` at computed coordinates; ``fmt`` names the storage ``@SRC@``.

    ``checks``: (argument position, dimension size, negative indices allowed, check id) per
    index argument; the kernel records an index outside the dimension (see ``Lowerer.check``).
    """

    src: TV = None  # type: ignore[assignment]
    checks: tuple[tuple[int, int, bool, int], ...] = ()


@dataclass(eq=False)
class Lazy:
    """An elementwise value not computed yet."""

    expr: Expr
    shape: tuple[int, ...]
    dtype: torch.dtype
    uses: int
    tv: TV | None = None


def f32_literal(value: float) -> str:
    import struct

    bits = struct.unpack("<I", struct.pack("<f", float(value)))[0]
    return f"bitcast<f32>({bits}u)"


def const(value: Any, ty: str) -> Const:
    if ty == "f32":
        return Const(ty, f32_literal(float(value)))
    if ty == "i32":
        v = int(value)
        if not -(2**31) <= v < 2**31:
            raise LoweringError(f"integer constant {v} does not fit in i32")
        return Const(ty, f"i32({v})")
    if ty == I64:
        v = int(value)
        if not -(2**63) <= v < 2**63:
            raise LoweringError(f"integer constant {v} does not fit in int64")
        v &= 2**64 - 1
        return Const(ty, f"tb_i64_make({v & 0xFFFFFFFF}u, {v >> 32}u)")
    return Const(ty, "1u" if value else "0u")


_FROM_I64 = {"f32": "tb_i64_to_f32({0})", "i32": "tb_i64_to_i32({0})", "u32": "tb_b(tb_i64_nz({0}))"}
_TO_I64 = {"f32": "tb_i64_from_f32({0})", "i32": "tb_i64_from_i32({0})", "u32": "tb_i64_from_u32({0})"}


def cast(e: Expr, ty: str) -> Expr:
    if e.ty == ty:
        return e
    if e.ty == I64:
        return Op(ty, _FROM_I64[ty], (e,))
    if ty == I64:
        return Op(ty, _TO_I64[e.ty], (e,))
    if isinstance(e, Const) and ty == "f32" and e.ty in ("i32", "u32"):
        return Const(ty, f"f32({e.text})")
    if ty == "u32":
        zero = "0.0" if e.ty == "f32" else ("0" if e.ty == "i32" else "0u")
        return Op("u32", "tb_b({0} != " + zero + ")", (e,))
    return Op(ty, ty + "({0})", (e,))


def err_decl(binding: int) -> str:
    """WGSL binding of a partition's error words and ``tb_oob``, which records a bad index."""
    return (
        f"@group(0) @binding({binding}) var<storage, read_write> tb_err: array<atomic<u32>>;\n"
        "fn tb_oob(check: u32, index: i32) {\n"
        "    if (atomicAdd(&tb_err[2u * check], 1u) == 0u) {\n"
        "        atomicStore(&tb_err[2u * check + 1u], bitcast<u32>(index));\n"
        "    }\n"
        "}"
    )


def broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(torch.broadcast_shapes(*[torch.Size(s) for s in shapes]))


# -- launches ------------------------------------------------------------------------------------
@dataclass
class Launch:
    source: str
    inputs: list[int]
    outputs: list[int]
    grid: tuple[int, int, int]
    # A matmul launch keeps what it needs to regenerate its source with a fused epilogue.
    rebuild: Callable[[str], str] | None = None
    name: str = ""


@dataclass
class Lowered:
    storages: list[Storage]
    launches: list[Launch]
    input_tvs: dict[int, TV]
    outputs: list[Any]  # TV or literal per plan output
    # The error words the indexing kernels write (two u32 per check: a count of bad indices and
    # the first one recorded), read back with the outputs; ``checks`` holds each check's message.
    err_storage: int | None = None
    checks: list[str] = field(default_factory=list)


class Lowerer:
    def __init__(self, ctx: Any, uses: dict[int, int]) -> None:
        self.ctx = ctx
        self.storages: list[Storage] = []
        self.launches: list[Launch] = []
        self.uses = uses
        # storage -> launch index whose epilogue may still absorb elementwise work
        self.epilogue_open: dict[int, int] = {}
        self.err_storage: int | None = None
        self.checks: list[str] = []

    # -- index checks --------------------------------------------------------------------------
    def check(self, message: str) -> int:
        """A new index check; ``message`` formats the bad index as ``{index}``. Returns its id.

        Kernels that index bind the partition's error words (``ERR_DECL``) and call ``tb_oob``
        with the id and the bad index; the program raises ``WgpuIndexError`` after readback.
        """
        if self.err_storage is None:
            self.err_storage = self.new_storage(2, torch.int32)
        self.checks.append(message)
        self.storages[self.err_storage].numel = 2 * len(self.checks)
        return len(self.checks) - 1

    # -- storages and launches -----------------------------------------------------------------
    def new_storage(self, numel: int, dtype: torch.dtype, input_slot: int | None = None) -> int:
        if dtype not in DEV_TYPE:
            raise LoweringError(f"dtype {dtype} has no device representation")
        storage = Storage(len(self.storages), numel, DEV_TYPE[dtype], input_slot, dtype == torch.float16)
        self.ctx.check_size(storage.nbytes)
        self.storages.append(storage)
        return len(self.storages) - 1

    def new_tv(self, shape: tuple[int, ...], dtype: torch.dtype) -> TV:
        shape = tuple(int(s) for s in shape)
        n = 1
        for s in shape:
            n *= s
        return TV(self.new_storage(n, dtype), 0, shape, contiguous_strides(shape), dtype)

    def launch(
        self,
        source: str,
        inputs: list[int],
        outputs: list[int],
        threads: int | tuple[int, int, int],
        *,
        rebuild: Callable[[str], str] | None = None,
        name: str = "",
    ) -> int:
        clash = set(inputs) & set(outputs)
        if clash:  # WebGPU forbids a buffer bound writable and readable in one dispatch
            raise LoweringError(f"a {name or 'kernel'} would read and write storage {sorted(clash)} in one dispatch")
        for s in inputs:
            self.epilogue_open.pop(s, None)
        grid = self.grid(threads) if isinstance(threads, int) else threads
        self.launches.append(Launch(source, list(inputs), list(outputs), grid, rebuild, name))
        return len(self.launches) - 1

    def grid(self, threads: int, per_group: int = WG) -> tuple[int, int, int]:
        groups = -(-threads // per_group)
        if groups == 0:
            return (0, 1, 1)
        limit = self.ctx.max_workgroups
        gx = min(groups, limit)
        gy = -(-groups // gx)
        if gy > limit:
            raise LoweringError(f"{threads} invocations exceed the adapter's dispatch limits")
        return (gx, gy, 1)

    # -- values ---------------------------------------------------------------------------------
    def as_expr(self, value: Any, ty: str | None = None) -> Expr:
        if isinstance(value, Lazy):
            if value.tv is not None:
                e: Expr = Leaf(DEV_TYPE[value.dtype], value.tv)
            elif value.uses > 1:
                e = Leaf(DEV_TYPE[value.dtype], self.as_tv(value))
            else:
                e = value.expr
        elif isinstance(value, TV):
            e = Leaf(DEV_TYPE[value.dtype], value)
        elif isinstance(value, bool):
            e = const(value, "u32")
        elif isinstance(value, int):
            e = const(value, ty if ty in ("f32", "i32", I64) else "i32")
        elif isinstance(value, float):
            e = const(value, "f32")
        else:
            raise LoweringError(f"cannot use {type(value).__name__} in an elementwise expression")
        return cast(e, ty) if ty is not None else e

    def as_tv(self, value: Any) -> TV:
        if isinstance(value, TV):
            self.epilogue_open.pop(value.storage, None)
            return value
        if isinstance(value, Lazy):
            if value.tv is None:
                value.tv = self.materialize(value.expr, value.shape, value.dtype)
            self.epilogue_open.pop(value.tv.storage, None)
            return value.tv
        raise LoweringError(f"expected a tensor, got {type(value).__name__}")

    def contiguous(self, value: Any) -> TV:
        tv = self.as_tv(value)
        if tv.is_contiguous and tv.stride == contiguous_strides(tv.shape):
            return tv
        return self.materialize(Leaf(DEV_TYPE[tv.dtype], tv), tv.shape, tv.dtype)

    # -- elementwise codegen ----------------------------------------------------------------------
    def materialize(self, expr: Expr, shape: tuple[int, ...], dtype: torch.dtype, dest: TV | None = None) -> TV:
        """Generate and launch the kernel computing ``expr`` over ``shape`` (into ``dest`` if given)."""
        shape = tuple(shape)
        fused = self._fold_into_epilogue(expr, shape, dtype) if dest is None else None
        if fused is not None:
            return fused
        out = dest if dest is not None else self.new_tv(shape, dtype)
        bindings: dict[int, str] = {}
        leaves: list[Leaf] = []
        lines: list[str] = []
        names: dict[int, str] = {}
        checked = False

        def visit(e: Expr) -> str:
            nonlocal checked
            key = id(e)
            if key in names:
                return names[key]
            if isinstance(e, Const):
                return e.text
            if isinstance(e, Leaf):
                tv = e.tv
                if tv.storage not in bindings:
                    bindings[tv.storage] = f"in{len(bindings)}"
                name = f"v{len(names)}"
                lines.append(f"    let {name} = {bindings[tv.storage]}[{self._index(tv, shape)}];")
                leaves.append(e)
            else:
                assert isinstance(e, Op)
                parts = [visit(a) for a in e.args]
                fmt = e.fmt
                if isinstance(e, Gather):
                    if e.src.storage not in bindings:
                        bindings[e.src.storage] = f"in{len(bindings)}"
                    fmt = fmt.replace("@SRC@", bindings[e.src.storage])
                    for pos, size, wrap, check in e.checks:
                        k = parts[pos]
                        low = f"-{size}" if wrap else "0"
                        lines.append(f"    if ({k} < {low} || {k} >= {size}) {{ tb_oob({check}u, {k}); }}")
                        checked = True
                name = f"v{len(names)}"
                lines.append(f"    let {name}: {e.ty} = {fmt.format(*parts)};")
            names[key] = name
            return name

        result = visit(cast(expr, DEV_TYPE[dtype]))
        lines.insert(0, self._decompose(shape))
        lines.append(f"    out[{self._index(out, shape, out_of_place=True)}] = {result};")
        decls = []
        for storage, name in bindings.items():
            decls.append(
                f"@group(0) @binding({int(name[2:])}) var<storage, read> {name}: array<{self.storages[storage].wgsl}>;"
            )
        decls.append(f"@group(0) @binding({len(bindings)}) var<storage, read_write> out: array<{DEV_TYPE[dtype]}>;")
        outputs = [out.storage]
        if checked:
            assert self.err_storage is not None
            decls.append(err_decl(len(bindings) + 1))
            outputs.append(self.err_storage)
        total = 1
        for s in shape:
            total *= s
        src = shaders.render("elementwise", BINDINGS="\n".join(decls), BODY="\n".join(lines), TOTAL=total)
        if total > 0:
            self.launch(src, list(bindings), outputs, total, name="elementwise")
        return out

    def _decompose(self, shape: tuple[int, ...]) -> str:
        if not shape:
            return ""
        parts = ["    var r = i;"]
        for d in range(len(shape) - 1, 0, -1):
            parts.append(f"    let c{d} = r % {shape[d]}u; r = r / {shape[d]}u;")
        parts.append("    let c0 = r;")
        return "\n".join(parts)

    def _index(self, tv: TV, shape: tuple[int, ...], out_of_place: bool = False) -> str:
        """Element index of ``tv`` at the coordinates ``c0..`` of ``shape`` (broadcasting ``tv``)."""
        rank = len(shape)
        if len(tv.shape) > rank:
            raise LoweringError("a leaf has more dimensions than the expression")
        terms = [f"{tv.offset}u"] if tv.offset else []
        if not out_of_place and tv.stride == contiguous_strides(tv.shape) and tv.shape == shape:
            return " + ".join([*terms, "i"])
        if out_of_place and tv.stride == contiguous_strides(tv.shape) and tv.shape == shape:
            return " + ".join([*terms, "i"])
        lead = rank - len(tv.shape)
        for d, (size, st) in enumerate(zip(tv.shape, tv.stride)):
            if size == 1 or st == 0:
                continue
            terms.append(f"c{d + lead} * {st}u" if st != 1 else f"c{d + lead}")
        return " + ".join(terms) or "0u"

    def _fold_into_epilogue(self, expr: Expr, shape: tuple[int, ...], dtype: torch.dtype) -> TV | None:
        if dtype not in (torch.float32, torch.float16):
            return None
        leaves: list[Leaf] = []
        stack = [expr]
        while stack:
            e = stack.pop()
            if isinstance(e, Leaf):
                leaves.append(e)
            elif isinstance(e, Gather):
                return None
            elif isinstance(e, Op):
                stack.extend(e.args)
        if not leaves or any(leaf.tv is not leaves[0].tv and leaf.tv != leaves[0].tv for leaf in leaves):
            return None
        tv = leaves[0].tv
        index = self.epilogue_open.get(tv.storage)
        if index is None or tv.offset != 0 or tv.shape != shape or tv.stride != contiguous_strides(shape):
            return None
        if tv.dtype != dtype:  # the matmul's storage holds the result: its dtype must be the result's
            return None
        launch = self.launches[index]
        if launch.rebuild is None or tv.numel != self.storages[tv.storage].numel:
            return None
        code: list[str] = []
        names: dict[int, str] = {}

        def visit(e: Expr) -> str:
            if id(e) in names:
                return names[id(e)]
            if isinstance(e, Const):
                return e.text
            if isinstance(e, Leaf):
                return "v"
            assert isinstance(e, Op)
            parts = [visit(a) for a in e.args]
            name = f"e{len(names)}"
            code.append(f"let {name}: {e.ty} = {e.fmt.format(*parts)};")
            names[id(e)] = name
            return name

        result = visit(cast(expr, "f32"))
        body = " ".join(code) + f" return {result};"
        launch.source = launch.rebuild(body)
        launch.rebuild = None  # one epilogue per matmul
        del self.epilogue_open[tv.storage]
        return tv
