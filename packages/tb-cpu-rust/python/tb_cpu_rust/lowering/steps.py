"""The executor's step schema, Python side: one frozen dataclass per step kind, with named fields.

A step's fields say what each number means (``Gather(x=…, index=…, out=…, dim=…)``); the Rust
executor reads the same names (``src/exec``'s tagged ``StepSpec``). ``wire`` is the one place
that turns a step into the JSON object the executor parses: operands become ``ins``, results
``outs``, every other field is written under its own name. ``SCHEMA_VERSION`` goes into every
spec and into the engine's cache tag, so a spec written for another schema is refused, never
misread.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

#: bumped whenever a step kind gains, loses or renames a field
SCHEMA_VERSION = 1

Val = int  # a value id of the spec
OptVal = int | None  # an operand a kernel may go without (a bias, a mask)


#: field metadata: an operand (``ins``) or a result (``outs``) of the step, one value or a list
IN: dict[str, Any] = {"wire": "ins"}
INS: dict[str, Any] = {"wire": "ins", "many": True}
OUT: dict[str, Any] = {"wire": "outs"}
OUTS: dict[str, Any] = {"wire": "outs", "many": True}


@dataclass(frozen=True, eq=False)
class Step:
    """One executor step. ``OP`` is the tag the executor dispatches on."""

    OP: ClassVar[str] = ""

    def reads(self) -> list[OptVal]:
        return _gather(self, "ins")

    def writes(self) -> list[Val]:
        return [v for v in _gather(self, "outs") if v is not None]


def _gather(step: Step, kind: str) -> list[Any]:
    out: list[Any] = []
    for f in fields(step):
        if f.metadata.get("wire") == kind:
            value = getattr(step, f.name)
            out.extend(value) if f.metadata.get("many") else out.append(value)
    return out


def wire(step: Step) -> dict[str, Any]:
    """The JSON object of ``step``: ``{"op", "ins", "outs", <named params>}``."""
    obj: dict[str, Any] = {"op": step.OP, "ins": step.reads(), "outs": _gather(step, "outs")}
    if not NAMED_PARAMS:
        return _positional(step, obj)
    for f in fields(step):
        if "wire" not in f.metadata:
            value = getattr(step, f.name)
            obj[f.name] = [_plain(v) for v in value] if isinstance(value, (list, tuple)) else _plain(value)
    return obj


#: schema 1 (the executor before the tagged StepSpec) reads integer and float parameters as two
#: positional lists, in field order; strings and programs under their own names
NAMED_PARAMS = SCHEMA_VERSION >= 2


def _positional(step: Step, obj: dict[str, Any]) -> dict[str, Any]:
    ints: list[int] = []
    floats: list[float] = []
    for f in fields(step):
        if "wire" in f.metadata:
            continue
        value = getattr(step, f.name)
        kind = str(f.type)
        if "float" in kind:
            floats.extend(float(v) for v in (value if isinstance(value, (list, tuple)) else [value]))
        elif "str" in kind or "Instr" in kind:
            obj[f.name] = [_plain(v) for v in value] if isinstance(value, (list, tuple)) else value
        else:
            ints.extend(int(v) for v in (value if isinstance(value, (list, tuple)) else [value]))
    if ints:
        obj["ints"] = ints
    if floats:
        obj["floats"] = floats
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


@dataclass(frozen=True, eq=False)
class Ew(Step):
    """A fused elementwise program: one sweep over ``outs``' shape (``compute``: "f32" or "i64")."""

    OP: ClassVar[str] = "ew"
    compute: str
    ins: list[Val] = field(metadata=INS)
    outs: list[Val] = field(metadata=OUTS)
    prog: list[Instr] = field(default_factory=list)


def copy_program() -> list[Instr]:
    return [load(0, 0), store(0, 0)]


# -- copies and fills in any dtype -------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Cast(Step):
    OP: ClassVar[str] = "cast"
    x: Val = field(metadata=IN)
    y: Val = field(metadata=OUT)


@dataclass(frozen=True, eq=False)
class Fill(Step):
    """``mode`` 0: ``value``, 1: ``integer`` (exact for any int64), 2..4: NaN, +inf, -inf."""

    OP: ClassVar[str] = "fill"
    y: Val = field(metadata=OUT)
    mode: int = 0
    integer: int = 0
    value: float = 0.0


@dataclass(frozen=True, eq=False)
class Arange(Step):
    OP: ClassVar[str] = "arange"
    y: Val = field(metadata=OUT)
    start: float = 0.0
    step: float = 1.0


# -- GEMM ---------------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Gemm(Step):
    """``c = alpha * a @ b + beta * bias``, then ``epilogue`` per output tile (``res``: the residual
    an ``add`` in the epilogue reads)."""

    OP: ClassVar[str] = "gemm"
    a: Val = field(metadata=IN)
    b: Val = field(metadata=IN)
    bias: OptVal = field(metadata=IN)
    res: OptVal = field(metadata=IN)
    c: Val = field(metadata=OUT)
    alpha: float = 1.0
    beta: float = 1.0
    epilogue: tuple[str, ...] = ()


# -- reductions and scans ---------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Reduce(Step):
    """``kind``: 0 sum, 1 mean, 2 amax, 3 amin, 4 argmax, 5 argmin, 6 var, 7 prod, 8 logsumexp,
    9 any; ``mask``: 1 on the reduced dims; ``correction``: var's."""

    OP: ClassVar[str] = "reduce"
    x: Val = field(metadata=IN)
    y: Val = field(metadata=OUT)
    kind: int = 0
    mask: tuple[int, ...] = ()
    correction: float = 0.0


@dataclass(frozen=True, eq=False)
class Cumsum(Step):
    OP: ClassVar[str] = "cumsum"
    x: Val = field(metadata=IN)
    y: Val = field(metadata=OUT)
    dim: int = 0


@dataclass(frozen=True, eq=False)
class Scan(Step):
    """``mode`` 0: cumprod, 1: logcumsumexp."""

    OP: ClassVar[str] = "scan"
    x: Val = field(metadata=IN)
    y: Val = field(metadata=OUT)
    dim: int = 0
    mode: int = 0


@dataclass(frozen=True, eq=False)
class Cummax(Step):
    OP: ClassVar[str] = "cummax"
    x: Val = field(metadata=IN)
    values: Val = field(metadata=OUT)
    indices: Val = field(metadata=OUT)
    dim: int = 0


class Cummin(Cummax):
    OP: ClassVar[str] = "cummin"


@dataclass(frozen=True, eq=False)
class Sort(Step):
    OP: ClassVar[str] = "sort"
    x: Val = field(metadata=IN)
    values: Val = field(metadata=OUT)
    indices: Val = field(metadata=OUT)
    dim: int = 0
    descending: bool = False


@dataclass(frozen=True, eq=False)
class MedianDim(Step):
    OP: ClassVar[str] = "median_dim"
    x: Val = field(metadata=IN)
    values: Val = field(metadata=OUT)
    indices: Val = field(metadata=OUT)
    dim: int = 0


class NanmedianDim(MedianDim):
    OP: ClassVar[str] = "nanmedian_dim"


class Mode(MedianDim):
    OP: ClassVar[str] = "mode"


# -- softmax, norms, attention, losses --------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Softmax(Step):
    OP: ClassVar[str] = "softmax"
    x: Val = field(metadata=IN)
    y: Val = field(metadata=OUT)
    dim: int = 0


class LogSoftmax(Softmax):
    OP: ClassVar[str] = "log_softmax"


@dataclass(frozen=True, eq=False)
class SoftmaxBwd(Step):
    OP: ClassVar[str] = "softmax_bwd"
    grad: Val = field(metadata=IN)
    y: Val = field(metadata=IN)
    grad_in: Val = field(metadata=OUT)
    dim: int = 0


class LogSoftmaxBwd(SoftmaxBwd):
    OP: ClassVar[str] = "log_softmax_bwd"


@dataclass(frozen=True, eq=False)
class LayerNorm(Step):
    """Normalises over the trailing ``n`` elements of each row."""

    OP: ClassVar[str] = "layer_norm"
    x: Val = field(metadata=IN)
    weight: OptVal = field(metadata=IN)
    bias: OptVal = field(metadata=IN)
    y: Val = field(metadata=OUT)
    mean: Val = field(metadata=OUT)
    rstd: Val = field(metadata=OUT)
    n: int = 0
    eps: float = 0.0


@dataclass(frozen=True, eq=False)
class RmsNorm(Step):
    OP: ClassVar[str] = "rms_norm"
    x: Val = field(metadata=IN)
    weight: OptVal = field(metadata=IN)
    y: Val = field(metadata=OUT)
    rstd: Val = field(metadata=OUT)
    n: int = 0
    eps: float = 0.0


@dataclass(frozen=True, eq=False)
class Sdpa(Step):
    OP: ClassVar[str] = "sdpa"
    q: Val = field(metadata=IN)
    k: Val = field(metadata=IN)
    v: Val = field(metadata=IN)
    mask: OptVal = field(metadata=IN)
    out: Val = field(metadata=OUT)
    lse: Val = field(metadata=OUT)
    causal: bool = False
    scale: float = 1.0


@dataclass(frozen=True, eq=False)
class NllLoss(Step):
    OP: ClassVar[str] = "nll_loss"
    x: Val = field(metadata=IN)
    target: Val = field(metadata=IN)
    weight: OptVal = field(metadata=IN)
    out: Val = field(metadata=OUT)
    total_weight: Val = field(metadata=OUT)
    reduction: int = 0
    ignore_index: int = -100


@dataclass(frozen=True, eq=False)
class NllLossBwd(Step):
    OP: ClassVar[str] = "nll_loss_bwd"
    grad: Val = field(metadata=IN)
    x: Val = field(metadata=IN)
    target: Val = field(metadata=IN)
    weight: OptVal = field(metadata=IN)
    total_weight: Val = field(metadata=IN)
    grad_in: Val = field(metadata=OUT)
    reduction: int = 0
    ignore_index: int = -100


# -- indexing ----------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Embedding(Step):
    OP: ClassVar[str] = "embedding"
    weight: Val = field(metadata=IN)
    index: Val = field(metadata=IN)
    out: Val = field(metadata=OUT)


@dataclass(frozen=True, eq=False)
class Index(Step):
    """``out = x[i0, i1, ...]`` with one index per leading dim, all broadcast to ``out``'s shape."""

    OP: ClassVar[str] = "index"
    x: Val = field(metadata=IN)
    indices: list[Val] = field(metadata=INS)
    out: Val = field(metadata=OUT)


@dataclass(frozen=True, eq=False)
class Gather(Step):
    OP: ClassVar[str] = "gather"
    x: Val = field(metadata=IN)
    index: Val = field(metadata=IN)
    out: Val = field(metadata=OUT)
    dim: int = 0


@dataclass(frozen=True, eq=False)
class IndexSelect(Step):
    OP: ClassVar[str] = "index_select"
    x: Val = field(metadata=IN)
    index: Val = field(metadata=IN)
    out: Val = field(metadata=OUT)
    dim: int = 0


@dataclass(frozen=True, eq=False)
class Scatter(Step):
    """``how`` 0: write, 1 sum, 2 prod, 3 amax, 4 amin, 5 mean; ``include_self``: base joins the reduction."""

    OP: ClassVar[str] = "scatter"
    base: Val = field(metadata=IN)
    index: Val = field(metadata=IN)
    src: Val = field(metadata=IN)
    out: Val = field(metadata=OUT)
    dim: int = 0
    how: int = 0
    include_self: bool = True


@dataclass(frozen=True, eq=False)
class IndexPut(Step):
    OP: ClassVar[str] = "index_put"
    base: Val = field(metadata=IN)
    values: Val = field(metadata=IN)
    indices: list[Val] = field(metadata=INS)
    out: Val = field(metadata=OUT)
    accumulate: bool = False


@dataclass(frozen=True, eq=False)
class MaskedScatter(Step):
    OP: ClassVar[str] = "masked_scatter"
    base: Val = field(metadata=IN)
    mask: Val = field(metadata=IN)
    src: Val = field(metadata=IN)
    out: Val = field(metadata=OUT)


@dataclass(frozen=True, eq=False)
class NonzeroStatic(Step):
    OP: ClassVar[str] = "nonzero_static"
    x: Val = field(metadata=IN)
    out: Val = field(metadata=OUT)
    fill_value: int = -1


@dataclass(frozen=True, eq=False)
class EmbeddingBag(Step):
    """``mode`` 0 sum, 1 mean, 2 max."""

    OP: ClassVar[str] = "embedding_bag"
    weight: Val = field(metadata=IN)
    indices: Val = field(metadata=IN)
    offsets: Val = field(metadata=IN)
    per_sample_weights: OptVal = field(metadata=IN)
    out: Val = field(metadata=OUT)
    mode: int = 0
    include_last_offset: bool = False
    padding_idx: int = -1


@dataclass(frozen=True, eq=False)
class SegmentReduce(Step):
    """``reduction`` 0 sum, 1 mean, 2 max, 3 min, 4 prod; ``offsets``: bounds are offsets, else lengths."""

    OP: ClassVar[str] = "segment_reduce"
    data: Val = field(metadata=IN)
    bounds: Val = field(metadata=IN)
    out: Val = field(metadata=OUT)
    reduction: int = 0
    offsets: bool = False
    has_initial: bool = False
    initial: float = 0.0


@dataclass(frozen=True, eq=False)
class Searchsorted(Step):
    OP: ClassVar[str] = "searchsorted"
    sorted_seq: Val = field(metadata=IN)
    values: Val = field(metadata=IN)
    out: Val = field(metadata=OUT)
    right: bool = False


@dataclass(frozen=True, eq=False)
class Histc(Step):
    OP: ClassVar[str] = "histc"
    x: Val = field(metadata=IN)
    out: Val = field(metadata=OUT)
    min: float = 0.0
    max: float = 0.0


@dataclass(frozen=True, eq=False)
class Frexp(Step):
    OP: ClassVar[str] = "frexp"
    x: Val = field(metadata=IN)
    mantissa: Val = field(metadata=OUT)
    exponent: Val = field(metadata=OUT)


@dataclass(frozen=True, eq=False)
class Cdist(Step):
    OP: ClassVar[str] = "cdist"
    x1: Val = field(metadata=IN)
    x2: Val = field(metadata=IN)
    out: Val = field(metadata=OUT)
    p: float = 2.0


@dataclass(frozen=True, eq=False)
class Pdist(Step):
    OP: ClassVar[str] = "pdist"
    x: Val = field(metadata=IN)
    out: Val = field(metadata=OUT)
    p: float = 2.0


@dataclass(frozen=True, eq=False)
class Dist(Step):
    OP: ClassVar[str] = "dist"
    x: Val = field(metadata=IN)
    y: Val = field(metadata=IN)
    out: Val = field(metadata=OUT)
    p: float = 2.0


# -- convolution, pooling, resampling -----------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Conv2d(Step):
    OP: ClassVar[str] = "conv2d"
    x: Val = field(metadata=IN)
    weight: Val = field(metadata=IN)
    bias: OptVal = field(metadata=IN)
    y: Val = field(metadata=OUT)
    stride: tuple[int, ...] = (1, 1)
    padding: tuple[int, ...] = (0, 0)
    dilation: tuple[int, ...] = (1, 1)
    groups: int = 1


@dataclass(frozen=True, eq=False)
class ConvTranspose2d(Conv2d):
    OP: ClassVar[str] = "conv_transpose2d"
    output_padding: tuple[int, ...] = (0, 0)


@dataclass(frozen=True, eq=False)
class Conv3d(Step):
    OP: ClassVar[str] = "conv3d"
    x: Val = field(metadata=IN)
    weight: Val = field(metadata=IN)
    bias: OptVal = field(metadata=IN)
    y: Val = field(metadata=OUT)
    stride: tuple[int, ...] = (1, 1, 1)
    padding: tuple[int, ...] = (0, 0, 0)
    dilation: tuple[int, ...] = (1, 1, 1)
    groups: int = 1


@dataclass(frozen=True, eq=False)
class MaxPool(Step):
    """2-d (``max_pool2d``) or 3-d (``max_pool3d``): each window field has one entry per spatial dim."""

    OP: ClassVar[str] = "max_pool2d"
    x: Val = field(metadata=IN)
    y: Val = field(metadata=OUT)
    indices: Val = field(metadata=OUT)
    kernel: tuple[int, ...] = ()
    stride: tuple[int, ...] = ()
    padding: tuple[int, ...] = ()
    dilation: tuple[int, ...] = ()


class MaxPool3d(MaxPool):
    OP: ClassVar[str] = "max_pool3d"


@dataclass(frozen=True, eq=False)
class AvgPool(Step):
    """``divisor``: divisor_override, 0 for none."""

    OP: ClassVar[str] = "avg_pool2d"
    x: Val = field(metadata=IN)
    y: Val = field(metadata=OUT)
    kernel: tuple[int, ...] = ()
    stride: tuple[int, ...] = ()
    padding: tuple[int, ...] = ()
    count_include_pad: bool = True
    divisor: int = 0


class AvgPool3d(AvgPool):
    OP: ClassVar[str] = "avg_pool3d"


@dataclass(frozen=True, eq=False)
class AdaptivePool(Step):
    """Adaptive average (one result) or max (values and indices) pooling; ``OP`` names which."""

    OP: ClassVar[str] = "adaptive_avg_pool2d"
    x: Val = field(metadata=IN)
    outs: list[Val] = field(metadata=OUTS)


class AdaptiveMaxPool2d(AdaptivePool):
    OP: ClassVar[str] = "adaptive_max_pool2d"


class AdaptiveAvgPool3d(AdaptivePool):
    OP: ClassVar[str] = "adaptive_avg_pool3d"


class AdaptiveMaxPool3d(AdaptivePool):
    OP: ClassVar[str] = "adaptive_max_pool3d"


@dataclass(frozen=True, eq=False)
class MaxPool2dBwd(Step):
    OP: ClassVar[str] = "max_pool2d_bwd"
    grad: Val = field(metadata=IN)
    indices: Val = field(metadata=IN)
    grad_in: Val = field(metadata=OUT)


@dataclass(frozen=True, eq=False)
class Upsample(Step):
    """Linear (1 to 3 spatial dims) or cubic interpolation; a scale of 0 means "from the sizes"."""

    OP: ClassVar[str] = "upsample_linear"
    x: Val = field(metadata=IN)
    y: Val = field(metadata=OUT)
    align_corners: bool = False
    scales: tuple[float, ...] = ()


class UpsampleCubic(Upsample):
    OP: ClassVar[str] = "upsample_cubic"


@dataclass(frozen=True, eq=False)
class GridSampler(Step):
    """``interpolation`` 0 bilinear, 1 nearest, 2 bicubic; ``padding`` 0 zeros, 1 border, 2 reflection."""

    OP: ClassVar[str] = "grid_sampler_2d"
    x: Val = field(metadata=IN)
    grid: Val = field(metadata=IN)
    y: Val = field(metadata=OUT)
    align_corners: bool = False
    interpolation: int = 0
    padding: int = 0


class GridSampler3d(GridSampler):
    OP: ClassVar[str] = "grid_sampler_3d"


# -- linear algebra -------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class LuFactor(Step):
    OP: ClassVar[str] = "lu_factor"
    a: Val = field(metadata=IN)
    lu: Val = field(metadata=OUT)
    pivots: Val = field(metadata=OUT)
    info: Val = field(metadata=OUT)
    check: bool = False


@dataclass(frozen=True, eq=False)
class Lu(Step):
    OP: ClassVar[str] = "lu"
    a: Val = field(metadata=IN)
    outs: list[Val] = field(metadata=OUTS)


@dataclass(frozen=True, eq=False)
class LuUnpack(Step):
    OP: ClassVar[str] = "lu_unpack"
    lu: Val = field(metadata=IN)
    pivots: Val = field(metadata=IN)
    outs: list[Val] = field(metadata=OUTS)
    unpack_data: bool = True
    unpack_pivots: bool = True


@dataclass(frozen=True, eq=False)
class LuSolve(Step):
    """``b`` None: solve against the identity (the inverse)."""

    OP: ClassVar[str] = "lu_solve"
    lu: Val = field(metadata=IN)
    pivots: Val = field(metadata=IN)
    b: OptVal = field(metadata=IN)
    x: Val = field(metadata=OUT)
    adjoint: bool = False


@dataclass(frozen=True, eq=False)
class Det(Step):
    OP: ClassVar[str] = "det"
    a: Val = field(metadata=IN)
    outs: list[Val] = field(metadata=OUTS)


class Slogdet(Det):
    OP: ClassVar[str] = "slogdet"


@dataclass(frozen=True, eq=False)
class Cholesky(Step):
    OP: ClassVar[str] = "cholesky"
    a: Val = field(metadata=IN)
    lower: Val = field(metadata=OUT)
    info: Val = field(metadata=OUT)
    check: bool = False


@dataclass(frozen=True, eq=False)
class TriSolve(Step):
    """Solves ``t x = b`` for a triangular ``t`` (``b`` None: the inverse)."""

    OP: ClassVar[str] = "tri_solve"
    t: Val = field(metadata=IN)
    b: OptVal = field(metadata=IN)
    x: Val = field(metadata=OUT)
    upper: bool = False
    unitriangular: bool = False


@dataclass(frozen=True, eq=False)
class CheckInfo(Step):
    OP: ClassVar[str] = "check_info"
    info: Val = field(metadata=IN)


@dataclass(frozen=True, eq=False)
class Geqrf(Step):
    OP: ClassVar[str] = "geqrf"
    a: Val = field(metadata=IN)
    outs: list[Val] = field(metadata=OUTS)


@dataclass(frozen=True, eq=False)
class Orgqr(Step):
    OP: ClassVar[str] = "orgqr"
    a: Val = field(metadata=IN)
    tau: Val = field(metadata=IN)
    q: Val = field(metadata=OUT)


@dataclass(frozen=True, eq=False)
class Ormqr(Step):
    OP: ClassVar[str] = "ormqr"
    a: Val = field(metadata=IN)
    tau: Val = field(metadata=IN)
    c: Val = field(metadata=IN)
    out: Val = field(metadata=OUT)
    left: bool = True
    transpose: bool = False


@dataclass(frozen=True, eq=False)
class Qr(Step):
    """``mode`` 0 reduced, 1 complete, 2 r."""

    OP: ClassVar[str] = "qr"
    a: Val = field(metadata=IN)
    outs: list[Val] = field(metadata=OUTS)
    mode: int = 0


@dataclass(frozen=True, eq=False)
class Svd(Step):
    OP: ClassVar[str] = "svd"
    a: Val = field(metadata=IN)
    outs: list[Val] = field(metadata=OUTS)
    full_matrices: bool = False
    compute_uv: bool = True


@dataclass(frozen=True, eq=False)
class Eigh(Step):
    OP: ClassVar[str] = "eigh"
    a: Val = field(metadata=IN)
    outs: list[Val] = field(metadata=OUTS)
    upper: bool = False
    compute_v: bool = True


@dataclass(frozen=True, eq=False)
class Pinv(Step):
    OP: ClassVar[str] = "pinv"
    a: Val = field(metadata=IN)
    atol: OptVal = field(metadata=IN)
    rtol: OptVal = field(metadata=IN)
    out: Val = field(metadata=OUT)
    hermitian: bool = False


@dataclass(frozen=True, eq=False)
class LinalgPolar(Step):
    OP: ClassVar[str] = "linalg_polar"
    a: Val = field(metadata=IN)
    outs: list[Val] = field(metadata=OUTS)


@dataclass(frozen=True, eq=False)
class Sqrth(Step):
    OP: ClassVar[str] = "sqrth"
    a: Val = field(metadata=IN)
    out: Val = field(metadata=OUT)


# -- complex values and FFTs ------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Complex(Step):
    """``complex`` (re, im) or ``polar`` (abs, angle) into one complex result."""

    OP: ClassVar[str] = "complex"
    a: Val = field(metadata=IN)
    b: Val = field(metadata=IN)
    out: Val = field(metadata=OUT)


class Polar(Complex):
    OP: ClassVar[str] = "polar"


@dataclass(frozen=True, eq=False)
class ComplexUnary(Step):
    OP: ClassVar[str] = "conj"
    x: Val = field(metadata=IN)
    out: Val = field(metadata=OUT)


class Angle(ComplexUnary):
    OP: ClassVar[str] = "angle"


class Imag(ComplexUnary):
    OP: ClassVar[str] = "imag"


@dataclass(frozen=True, eq=False)
class Fft(Step):
    """``norm``: ATen's normalisation mode; ``flag``: r2c's onesided, c2c's forward, c2r's last
    signal size, as ATen passes them; ``dims``: the transformed dims."""

    OP: ClassVar[str] = "fft_c2c"
    x: Val = field(metadata=IN)
    out: Val = field(metadata=OUT)
    norm: int = 0
    flag: int = 0
    dims: tuple[int, ...] = ()


class FftR2c(Fft):
    OP: ClassVar[str] = "fft_r2c"


class FftC2r(Fft):
    OP: ClassVar[str] = "fft_c2r"


# -- compute in the wide dtypes -----------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Softmax64(Step):
    OP: ClassVar[str] = "softmax64"
    x: Val = field(metadata=IN)
    y: Val = field(metadata=OUT)
    dim: int = 0


class LogSoftmax64(Softmax64):
    OP: ClassVar[str] = "log_softmax64"


@dataclass(frozen=True, eq=False)
class Ew64(Step):
    """One float64 elementwise op; ``kinds``: per argument, 0 a tensor of ``ins``, 1 the next of ``scalars``."""

    OP: ClassVar[str] = "ew64"
    ins: list[Val] = field(metadata=INS)
    out: Val = field(metadata=OUT)
    code: int = 0
    kinds: tuple[int, ...] = ()
    scalars: tuple[float, ...] = ()


@dataclass(frozen=True, eq=False)
class IntReduce(Step):
    """Exact int64 reduction of integer values: ``kind`` 0 sum, 1 amax, 2 amin."""

    OP: ClassVar[str] = "ireduce"
    x: Val = field(metadata=IN)
    y: Val = field(metadata=OUT)
    kind: int = 0


def step_kinds() -> dict[str, type[Step]]:
    """Every step kind by its tag (for the schema test against the executor)."""
    found: dict[str, type[Step]] = {}
    todo: list[type[Step]] = [Step]
    while todo:
        cls = todo.pop()
        if cls.OP:
            found[cls.OP] = cls
        todo.extend(cls.__subclasses__())
    return found
