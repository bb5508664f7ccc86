"""The executor's step schema, Python side: one frozen dataclass per step kind, with named fields.

A step's fields say what each number means (``Gather(x=…, index=…, out=…, dim=…)``); in the Rust
executor the kernel family that declares the kind (its ``STEPS`` list, ``src/kernels/``) reads the
same field names into a typed struct, once, when a plan is prepared. Each kind is declared on one
line below by ``kind(tag, operands, results, params)`` (a kind that only one family module writes
may be declared there instead, the same way): operands and results are value ids (``name?``: may
be None, ``*name``: a list), params ``name:type=default`` with type one of int, bool, float, ints,
floats, strs. ``wire`` is the one place that turns a step into the JSON object the executor
reads. ``SCHEMA_VERSION`` goes into every spec and into the engine's cache tag, so a spec written
for another schema is refused, never misread.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from tb_cpu_rust import _native

#: the step schema the executor reads (``src/exec/step.rs``, bumped there whenever a step kind gains,
#: loses or renames a field); every spec carries it and the engine's version includes it
SCHEMA_VERSION: int = _native.STEP_SCHEMA_VERSION

_PARAM_TYPES: dict[str, Any] = {
    "int": int, "bool": bool, "float": float, "ints": tuple, "floats": tuple, "strs": tuple, "str": str,
}  # fmt: skip


_PARAM = re.compile(r"(\w+):(\w+)=(\([^)]*\)|\S+)")


@dataclass(frozen=True, eq=False)
class Step:
    """One executor step. ``OP`` is the tag the executor dispatches on."""

    OP: ClassVar[str] = ""

    def reads(self) -> list[int | None]:
        return _gather(self, "ins")

    def writes(self) -> list[int]:
        return [v for v in _gather(self, "outs") if v is not None]


def _gather(step: Step, kind: str) -> list[Any]:
    out: list[Any] = []
    for f in fields(step):
        if f.metadata.get("wire") == kind:
            value = getattr(step, f.name)
            out.extend(value) if f.metadata.get("many") else out.append(value)
    return out


def kind(tag: str, operands: str, results: str, params: str) -> Any:
    """A frozen dataclass for the step kind ``tag`` (see the module docstring for the notation)."""
    specs: list[tuple[str, Any, Any]] = []
    for wire, names in (("ins", operands), ("outs", results)):
        for name in names.split():
            many = name.startswith("*")
            meta = {"wire": wire, "many": many, "optional": name.endswith("?")}
            specs.append((name.strip("*?"), list if many else int, field(metadata=meta)))
    for name, ty, default in _PARAM.findall(params):
        specs.append((name, _PARAM_TYPES[ty], field(default=ast.literal_eval(default), metadata={"param": ty})))
    name = "".join(part.title() for part in tag.split("_"))
    return dataclasses.make_dataclass(name, specs, bases=(Step,), namespace={"OP": tag}, frozen=True, eq=False)


def wire(step: Step) -> dict[str, Any]:
    """The JSON object of ``step``: ``{"op", "ins", "outs", <named params>}``."""
    obj: dict[str, Any] = {"op": step.OP, "ins": step.reads(), "outs": _gather(step, "outs")}
    for f in fields(step):
        if "wire" not in f.metadata:
            value = getattr(step, f.name)
            obj[f.name] = [_plain(v) for v in value] if isinstance(value, (list, tuple)) else _plain(value)
    return obj


def _plain(v: Any) -> Any:
    return v.wire() if isinstance(v, Instr) else v


# -- fused elementwise programs -------------------------------------------------------------------
@dataclass(frozen=True)
class Instr:
    """One register instruction of an elementwise program (``a``: source registers or input slots)."""

    op: str
    dst: int
    a: tuple[int, ...] = ()
    f: tuple[float, ...] = ()

    def wire(self) -> dict[str, Any]:
        return {"op": self.op, "dst": self.dst, "a": list(self.a), "f": list(self.f)}


def load(dst: int, slot: int) -> Instr:
    return Instr("load", dst, (slot,))


def store(slot: int, reg: int) -> Instr:
    return Instr("store", slot, (reg,))


def const(dst: int, value: float) -> Instr:
    return Instr("const", dst, (), (value,))


def instr(op: str, dst: int, a: list[int] | tuple[int, ...], f: list[float] | tuple[float, ...] = ()) -> Instr:
    return Instr(op, dst, tuple(a), tuple(f))


def copy_program() -> list[Instr]:
    return [load(0, 0), store(0, 0)]


@dataclass(frozen=True, eq=False)
class Ew(Step):
    """A fused elementwise program: one sweep over ``outs``' shape (``compute``: "f32" or "i64")."""

    OP: ClassVar[str] = "ew"
    compute: str = field(metadata={"param": "str"})
    ins: list[int] = field(default_factory=list, metadata={"wire": "ins", "many": True})
    outs: list[int] = field(default_factory=list, metadata={"wire": "outs", "many": True})
    prog: list[Instr] = field(default_factory=list, metadata={"param": "instrs"})


# -- every other step kind: one kernel (family) of the executor ------------------------------------------
# fmt: off
Cast = kind("cast", "x", "y", "")
# mode 0: value, 1: integer (exact for any int64), 2..4: NaN, +inf, -inf
Fill = kind("fill", "", "y", "mode:int=0 integer:int=0 value:float=0.0")
Arange = kind("arange", "", "y", "start:float=0.0 step:float=1.0")
# c = alpha * a @ b + beta * bias, then the epilogue per output tile (res: the residual its add reads)
Gemm = kind("gemm", "a b bias? res?", "c", "alpha:float=1.0 beta:float=1.0 epilogue:strs=()")
# kind 0 sum, 1 mean, 2 amax, 3 amin, 4 argmax, 5 argmin, 6 var, 7 prod, 8 logsumexp, 9 any;
# mask: 1 on the reduced dims
Reduce = kind("reduce", "x", "y", "kind:int=0 mask:ints=() correction:float=0.0")
Cumsum = kind("cumsum", "x", "y", "dim:int=0")
# mode 0: cumprod, 1: logcumsumexp
Scan = kind("scan", "x", "y", "dim:int=0 mode:int=0")
Cummax = kind("cummax", "x", "values indices", "dim:int=0")
Cummin = kind("cummin", "x", "values indices", "dim:int=0")
Sort = kind("sort", "x", "values indices", "dim:int=0 descending:bool=False")
MedianDim = kind("median_dim", "x", "values indices", "dim:int=0")
NanmedianDim = kind("nanmedian_dim", "x", "values indices", "dim:int=0")
Mode = kind("mode", "x", "values indices", "dim:int=0")
Softmax = kind("softmax", "x", "y", "dim:int=0")
LogSoftmax = kind("log_softmax", "x", "y", "dim:int=0")
SoftmaxBwd = kind("softmax_bwd", "grad y", "grad_in", "dim:int=0")
LogSoftmaxBwd = kind("log_softmax_bwd", "grad y", "grad_in", "dim:int=0")
# normalises over the trailing n elements of each row
LayerNorm = kind("layer_norm", "x weight? bias?", "y mean rstd", "n:int=0 eps:float=0.0")
RmsNorm = kind("rms_norm", "x weight?", "y rstd", "n:int=0 eps:float=0.0")
# bf16: q, k and v are bfloat16 values, products of bfloat16 values allowed (bf16_products)
Sdpa = kind("sdpa", "q k v mask?", "out lse", "causal:bool=False scale:float=1.0 bf16:bool=False nan_row_masked:bool=False")
NllLoss = kind("nll_loss", "x target weight?", "out total_weight", "reduction:int=0 ignore_index:int=-100")
NllLossBwd = kind("nll_loss_bwd", "grad x target weight? total_weight", "grad_in", "reduction:int=0 ignore_index:int=-100")
Embedding = kind("embedding", "weight index", "out", "")
# out = x[i0, i1, ...]: one index per leading dim, every index broadcast to out's shape
Index = kind("index", "x *indices", "out", "")
Gather = kind("gather", "x index", "out", "dim:int=0")
IndexSelect = kind("index_select", "x index", "out", "dim:int=0")
# how 0 write, 1 sum, 2 prod, 3 amax, 4 amin, 5 mean
Scatter = kind("scatter", "base index src", "out", "dim:int=0 how:int=0 include_self:bool=True")
IndexPut = kind("index_put", "base values *indices", "out", "accumulate:bool=False")
MaskedScatter = kind("masked_scatter", "base mask src", "out", "")
NonzeroStatic = kind("nonzero_static", "x", "out", "fill_value:int=-1")
# mode 0 sum, 1 mean, 2 max
EmbeddingBag = kind("embedding_bag", "weight indices offsets per_sample_weights?", "out", "mode:int=0 include_last_offset:bool=False padding_idx:int=-1")
# reduction 0 sum, 1 mean, 2 max, 3 min, 4 prod; offsets: the bounds are offsets, else lengths
SegmentReduce = kind("segment_reduce", "data bounds", "out", "reduction:int=0 offsets:bool=False has_initial:bool=False initial:float=0.0")
Searchsorted = kind("searchsorted", "sorted_seq values", "out", "right:bool=False")
Histc = kind("histc", "x", "out", "min:float=0.0 max:float=0.0")
Frexp = kind("frexp", "x", "mantissa exponent", "")
Cdist = kind("cdist", "x1 x2", "out", "p:float=2.0")
Pdist = kind("pdist", "x", "out", "p:float=2.0")
Dist = kind("dist", "x y", "out", "p:float=2.0")
# the epilogue (GEMM epilogue names and ``hardtanh:lo:hi``) runs after the per-channel shift: the bias,
# or with bn_mean / bn_var a folded inference batch norm; res: the residual its add reads; pool 2: y is
# the 2×2 stride-2 max pool of that result (conv_fusion: no residual, relu / hardtanh only); bf16: the
# model computes it in bfloat16, products of bfloat16 values allowed (bf16_products)
Conv2d = kind(
    "conv2d", "x weight bias? res? bn_weight? bn_bias? bn_mean? bn_var?", "y",
    "stride:ints=(1, 1) padding:ints=(0, 0) dilation:ints=(1, 1) groups:int=1 epilogue:strs=() eps:float=0.0 pool:int=0 bf16:bool=False",
)  # fmt: skip
ConvTranspose2d = kind("conv_transpose2d", "x weight bias?", "y", "stride:ints=(1, 1) padding:ints=(0, 0) dilation:ints=(1, 1) groups:int=1 output_padding:ints=(0, 0)")
Conv3d = kind("conv3d", "x weight bias?", "y", "stride:ints=(1, 1, 1) padding:ints=(0, 0, 0) dilation:ints=(1, 1, 1) groups:int=1")
# with_indices False: nothing reads the indices (inference), the kernel may leave them unwritten
MaxPool = kind("max_pool2d", "x", "y indices", "kernel:ints=() stride:ints=() padding:ints=() dilation:ints=() with_indices:bool=True")
MaxPool3d = kind("max_pool3d", "x", "y indices", "kernel:ints=() stride:ints=() padding:ints=() dilation:ints=()")
# divisor: divisor_override, 0 for none
AvgPool = kind("avg_pool2d", "x", "y", "kernel:ints=() stride:ints=() padding:ints=() count_include_pad:bool=True divisor:int=0")
AvgPool3d = kind("avg_pool3d", "x", "y", "kernel:ints=() stride:ints=() padding:ints=() count_include_pad:bool=True divisor:int=0")
# adaptive average pooling gives one result, adaptive max pooling values and indices
AdaptivePool = kind("adaptive_avg_pool2d", "x", "*outs", "")
AdaptiveMaxPool2d = kind("adaptive_max_pool2d", "x", "*outs", "")
AdaptiveAvgPool3d = kind("adaptive_avg_pool3d", "x", "*outs", "")
AdaptiveMaxPool3d = kind("adaptive_max_pool3d", "x", "*outs", "")
MaxPool2dBwd = kind("max_pool2d_bwd", "grad indices", "grad_in", "")
# a scale of 0: from the sizes
Upsample = kind("upsample_linear", "x", "y", "align_corners:bool=False scales:floats=()")
UpsampleCubic = kind("upsample_cubic", "x", "y", "align_corners:bool=False scales:floats=()")
# interpolation 0 bilinear, 1 nearest, 2 bicubic; padding 0 zeros, 1 border, 2 reflection
GridSampler = kind("grid_sampler_2d", "x grid", "y", "align_corners:bool=False interpolation:int=0 padding:int=0")
GridSampler3d = kind("grid_sampler_3d", "x grid", "y", "align_corners:bool=False interpolation:int=0 padding:int=0")
LuFactor = kind("lu_factor", "a", "lu pivots info", "check:bool=False")
Lu = kind("lu", "a", "*outs", "")
LuUnpack = kind("lu_unpack", "lu pivots", "*outs", "unpack_data:bool=True unpack_pivots:bool=True")
# b None: against the identity (the inverse)
LuSolve = kind("lu_solve", "lu pivots b?", "x", "adjoint:bool=False")
Det = kind("det", "a", "*outs", "")
Slogdet = kind("slogdet", "a", "*outs", "")
Cholesky = kind("cholesky", "a", "lower info", "check:bool=False")
# t x = b for a triangular t
TriSolve = kind("tri_solve", "t b?", "x", "upper:bool=False unitriangular:bool=False")
CheckInfo = kind("check_info", "info", "", "")
Geqrf = kind("geqrf", "a", "*outs", "")
Orgqr = kind("orgqr", "a tau", "q", "")
Ormqr = kind("ormqr", "a tau c", "out", "left:bool=True transpose:bool=False")
# mode 0 reduced, 1 complete, 2 r
Qr = kind("qr", "a", "*outs", "mode:int=0")
Svd = kind("svd", "a", "*outs", "full_matrices:bool=False compute_uv:bool=True")
Eigh = kind("eigh", "a", "*outs", "upper:bool=False compute_v:bool=True")
Pinv = kind("pinv", "a atol? rtol?", "out", "hermitian:bool=False")
LinalgPolar = kind("linalg_polar", "a", "*outs", "")
Sqrth = kind("sqrth", "a", "out", "")
# complex (re, im) or polar (abs, angle) into one complex result
Complex = kind("complex", "a b", "out", "")
Polar = kind("polar", "a b", "out", "")
Conj = kind("conj", "x", "out", "")
Angle = kind("angle", "x", "out", "")
Imag = kind("imag", "x", "out", "")
# norm: ATen's normalisation mode; flag: r2c's onesided, c2c's forward, c2r's last signal size
Fft = kind("fft_c2c", "x", "out", "norm:int=0 flag:int=0 dims:ints=()")
FftR2c = kind("fft_r2c", "x", "out", "norm:int=0 flag:int=0 dims:ints=()")
FftC2r = kind("fft_c2r", "x", "out", "norm:int=0 flag:int=0 dims:ints=()")
Softmax64 = kind("softmax64", "x", "y", "dim:int=0")
LogSoftmax64 = kind("log_softmax64", "x", "y", "dim:int=0")
# one float64 elementwise op; kinds: per argument, 0 the next of ins, 1 the next of scalars
Ew64 = kind("ew64", "*ins", "out", "code:int=0 kinds:ints=() scalars:floats=()")
# exact int64 reduction of integer values: kind 0 sum, 1 amax, 2 amin
IntReduce = kind("ireduce", "x", "y", "kind:int=0")

# fmt: on


def step_kinds() -> dict[str, type[Step]]:
    """Every step kind by its tag."""
    return {cls.OP: cls for cls in Step.__subclasses__()}
