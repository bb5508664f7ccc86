"""Non-elementwise ops: views (free), matmul family, row kernels, attention, gathers, conv, pooling.

Every entry is ``lower(L, ctx, *args, **kwargs) -> value`` where values are ``TV`` (a strided
view of a device storage), ``Lazy`` (an elementwise expression) or tuples of them.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import torch

from tb_wgpu import shaders
from tb_wgpu.elementwise import TABLE as ELEMENTWISE
from tb_wgpu.lower import (
    DEV_TYPE,
    I64,
    TV,
    Gather,
    Lazy,
    Leaf,
    Lowerer,
    LoweringError,
    Op,
    broadcast_shapes,
    cast,
    const,
    contiguous_strides,
    err_decl,
    f32_literal,
)

Lower = Callable[..., Any]
TABLE: dict[str, Lower] = dict(ELEMENTWISE)


def _norm_dim(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


# -- views: metadata only ------------------------------------------------------------------------
def _view(L: Lowerer, ctx: Any, x: Any, size: Any) -> TV:
    shape = tuple(ctx.out.shape)
    tv = L.as_tv(x)
    if not (tv.stride == contiguous_strides(tv.shape) or tv.is_contiguous):
        tv = L.contiguous(tv)
    return tv.with_view(shape, contiguous_strides(shape))


TABLE["aten.view.default"] = _view
TABLE["aten._unsafe_view.default"] = _view
TABLE["aten.reshape.default"] = _view


def _permute(L: Lowerer, ctx: Any, x: Any, dims: Any) -> TV:
    tv = L.as_tv(x)
    dims = [_norm_dim(d, len(tv.shape)) for d in dims]
    return tv.with_view(tuple(tv.shape[d] for d in dims), tuple(tv.stride[d] for d in dims))


TABLE["aten.permute.default"] = _permute


def _transpose(L: Lowerer, ctx: Any, x: Any, d0: int, d1: int) -> TV:
    tv = L.as_tv(x)
    order = list(range(len(tv.shape)))
    a, b = _norm_dim(d0, len(order)), _norm_dim(d1, len(order))
    order[a], order[b] = order[b], order[a]
    return _permute(L, ctx, tv, order)


TABLE["aten.transpose.int"] = _transpose
TABLE["aten.t.default"] = lambda L, ctx, x: _transpose(L, ctx, x, 0, 1) if len(L.as_tv(x).shape) == 2 else L.as_tv(x)


def _expand(L: Lowerer, ctx: Any, x: Any, size: Any, implicit: bool = False) -> TV:
    tv = L.as_tv(x)
    shape = tuple(ctx.out.shape)
    lead = len(shape) - len(tv.shape)
    stride = []
    for d, s in enumerate(shape):
        if d < lead:
            stride.append(0)
        else:
            src = tv.shape[d - lead]
            stride.append(tv.stride[d - lead] if src == s else 0)
    return tv.with_view(shape, tuple(stride))


TABLE["aten.expand.default"] = _expand


def _unsqueeze(L: Lowerer, ctx: Any, x: Any, dim: int) -> TV:
    tv = L.as_tv(x)
    dim = _norm_dim(dim, len(tv.shape) + 1)
    inner = tv.stride[dim] * tv.shape[dim] if dim < len(tv.shape) else 1
    shape = (*tv.shape[:dim], 1, *tv.shape[dim:])
    return tv.with_view(shape, (*tv.stride[:dim], inner, *tv.stride[dim:]))


TABLE["aten.unsqueeze.default"] = _unsqueeze


def _squeeze(L: Lowerer, ctx: Any, x: Any, dims: Any = None) -> TV:
    tv = L.as_tv(x)
    rank = len(tv.shape)
    if dims is None:
        drop = {d for d in range(rank) if tv.shape[d] == 1}
    else:
        dims = [dims] if isinstance(dims, int) else dims
        drop = {_norm_dim(d, rank) for d in dims if tv.shape[_norm_dim(d, rank)] == 1}
    keep = [d for d in range(rank) if d not in drop]
    return tv.with_view(tuple(tv.shape[d] for d in keep), tuple(tv.stride[d] for d in keep))


TABLE["aten.squeeze.dim"] = _squeeze
TABLE["aten.squeeze.dims"] = _squeeze
TABLE["aten.squeeze.default"] = _squeeze


def _slice(L: Lowerer, ctx: Any, x: Any, dim: int = 0, start: Any = None, end: Any = None, step: int = 1) -> TV:
    tv = L.as_tv(x)
    dim = _norm_dim(dim, len(tv.shape))
    size = tv.shape[dim]
    lo = slice(start, end, step).indices(size)[0]
    n = tuple(ctx.out.shape)[dim]
    shape = (*tv.shape[:dim], n, *tv.shape[dim + 1 :])
    stride = (*tv.stride[:dim], tv.stride[dim] * step, *tv.stride[dim + 1 :])
    return tv.with_view(shape, stride, tv.offset + (lo * tv.stride[dim] if n else 0))


TABLE["aten.slice.Tensor"] = _slice


def _select(L: Lowerer, ctx: Any, x: Any, dim: int, index: int) -> TV:
    tv = L.as_tv(x)
    dim = _norm_dim(dim, len(tv.shape))
    index = index + tv.shape[dim] if index < 0 else index
    return tv.with_view(
        tv.shape[:dim] + tv.shape[dim + 1 :], tv.stride[:dim] + tv.stride[dim + 1 :], tv.offset + index * tv.stride[dim]
    )


TABLE["aten.select.int"] = _select


def _split(L: Lowerer, ctx: Any, x: Any, sizes: Any, dim: int = 0) -> tuple[TV, ...]:
    """split / split_with_sizes: views at offsets along ``dim`` (getitem picks one)."""
    tv = L.as_tv(x)
    dim = _norm_dim(dim, len(tv.shape))
    parts = []
    at = 0
    for meta in ctx.out:
        n = meta.shape[dim]
        shape = (*tv.shape[:dim], n, *tv.shape[dim + 1 :])
        parts.append(tv.with_view(shape, tv.stride, tv.offset + at * tv.stride[dim]))
        at += n
    return tuple(parts)


TABLE["aten.split_with_sizes.default"] = _split
TABLE["aten.split.Tensor"] = _split
TABLE["aten.alias.default"] = lambda L, ctx, x: L.as_tv(x)
TABLE["aten.detach.default"] = lambda L, ctx, x: L.as_tv(x)


# -- matmul family --------------------------------------------------------------------------------
def _matmul(L: Lowerer, ctx: Any, a: Any, b: Any, bias: Any = None, alpha: float = 1.0, beta: float = 1.0) -> TV:
    ta, tb = L.as_tv(a), L.as_tv(b)
    batched = len(ta.shape) == 3
    if not batched:
        ta = ta.with_view((1, *ta.shape), (0, *ta.stride))
        tb = tb.with_view((1, *tb.shape), (0, *tb.stride))
    batch, m, k = ta.shape
    n = tb.shape[2]
    out = L.new_tv((batch, m, n) if batched else (m, n), ctx.out.dtype)
    inputs = [ta.storage, tb.storage]
    subs: dict[str, Any] = {
        "M": m,
        "N": n,
        "K": k,
        "A_OFF": ta.offset,
        "A_SB": ta.stride[0],
        "A_SM": ta.stride[1],
        "A_SK": ta.stride[2],
        "B_OFF": tb.offset,
        "B_SB": tb.stride[0],
        "B_SK": tb.stride[1],
        "B_SN": tb.stride[2],
        "ALPHA": f32_literal(alpha),
        "OUT_BINDING": 2,
        "BIAS_BINDING": "",
        "BIAS_EXPR": "return 0.0;",
    }
    if bias is not None and beta != 0:
        tbias = L.as_tv(bias)
        full = (batch, m, n)
        lead = 3 - len(tbias.shape)
        st = [0] * 3
        for d, (size, s) in enumerate(zip(tbias.shape, tbias.stride)):
            st[d + lead] = s if size != 1 else 0
        if not batched and len(tbias.shape) == 3:
            raise LoweringError("a 3-d bias for a 2-d matmul")
        del full
        inputs.append(tbias.storage)
        subs["OUT_BINDING"] = 3
        subs["BIAS_BINDING"] = "@group(0) @binding(2) var<storage, read> bias: array<f32>;"
        subs["BIAS_EXPR"] = (
            f"return {f32_literal(beta)} * bias[{tbias.offset}u + batch * {st[0]}u + m * {st[1]}u + n * {st[2]}u];"
        )

    # Workgroup-memory tiles on GPUs; register blocks without barriers on CPU adapters.
    # TORCHBURN_WGPU_MATMUL=tiled|direct overrides the choice (tests run both on lavapipe).
    choice = os.environ.get("TORCHBURN_WGPU_MATMUL", "").strip().lower()
    kernel = {"tiled": "matmul", "direct": "matmul_direct"}.get(
        choice, "matmul_direct" if L.ctx.is_software else "matmul"
    )

    def rebuild(epilogue: str) -> str:
        return shaders.render(kernel, EPILOGUE=epilogue, **subs)

    if batch > L.ctx.max_workgroups:
        raise LoweringError("batch larger than the adapter's dispatch limit")
    tile = 32 if kernel == "matmul_direct" else 64
    grid = (-(-n // tile), -(-m // tile), batch)
    index = L.launch(rebuild("return v;"), inputs, [out.storage], grid, rebuild=rebuild, name=kernel)
    if ctx.uses == 1 and m * n * batch > 0:
        L.epilogue_open[out.storage] = index
    return out


TABLE["aten.mm.default"] = lambda L, ctx, a, b: _matmul(L, ctx, a, b)
TABLE["aten.bmm.default"] = lambda L, ctx, a, b: _matmul(L, ctx, a, b)
TABLE["aten.addmm.default"] = lambda L, ctx, bias, a, b, beta=1, alpha=1: _matmul(
    L, ctx, a, b, bias, float(alpha), float(beta)
)
TABLE["aten.baddbmm.default"] = lambda L, ctx, bias, a, b, beta=1, alpha=1: _matmul(
    L, ctx, a, b, bias, float(alpha), float(beta)
)


# -- row kernels ----------------------------------------------------------------------------------
def _rows(L: Lowerer, x: Any, dims: list[int]) -> tuple[TV, tuple[int, ...], int, list[int]]:
    """``x`` with ``dims`` moved last and made contiguous: (tv, kept shape, row length, order)."""
    tv = L.as_tv(x)
    rank = len(tv.shape)
    dims = sorted({_norm_dim(d, rank) for d in dims}) if rank else []
    keep = [d for d in range(rank) if d not in dims]
    order = keep + dims
    if order != list(range(rank)):
        tv = tv.with_view(tuple(tv.shape[d] for d in order), tuple(tv.stride[d] for d in order))
    tv = L.contiguous(tv)
    r = 1
    for d in dims:
        r *= tv.shape[order.index(d)]
    kept = tuple(tv.shape[: len(keep)])
    return tv, kept, r, order


def _row_grid(L: Lowerer, rows: int) -> tuple[int, int, int]:
    return L.grid(rows, per_group=1)


def _reduce(kind: str) -> Lower:
    def lower(L: Lowerer, ctx: Any, x: Any, dim: Any = None, keepdim: bool = False, dtype: Any = None) -> Any:
        rank = len(L.as_tv(x).shape)
        dims = (
            list(range(rank))
            if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0)
            else ([dim] if isinstance(dim, int) else list(dim))
        )
        tv, kept, r, _ = _rows(L, x, dims)
        rows = 1
        for s in kept:
            rows *= s
        out = L.new_tv(tuple(ctx.out.shape), ctx.out.dtype)
        if ctx.out.dtype == torch.int64:
            in_ty = DEV_TYPE[tv.dtype]
            init, combine = {
                "sum": ("tb_i64_make(0u, 0u)", "tb_i64_add"),
                "amax": ("tb_i64_make(0u, 0x80000000u)", "tb_i64_max"),
                "amin": ("tb_i64_make(0xffffffffu, 0x7fffffffu)", "tb_i64_min"),
            }[kind]
            convert = "" if in_ty == I64 else f"tb_i64_from_{in_ty}"
            src = shaders.render(
                "reduce_i64", R=r, ROWS=rows, IN_TYPE=in_ty, INIT=init, COMBINE=combine, CONVERT=convert
            )
            if rows:
                L.launch(src, [tv.storage], [out.storage], L.grid(rows, per_group=64), name=f"{kind}_i64")
            return out
        init, combine, finish = {
            "sum": ("0.0", "return a + b;", "r"),
            "mean": ("0.0", "return a + b;", f"r / {f32_literal(float(r))}" if r else "tb_nan()"),
            "amax": ("-tb_inf()", "return tb_max(a, b);", "r"),
            "amin": ("tb_inf()", "return tb_min(a, b);", "r"),
            "prod": ("1.0", "return a * b;", "r"),
        }[kind]
        src = shaders.render(
            "reduce",
            ROWS_PRELUDE=shaders.source("rows_prelude"),
            R=r,
            ROWS=rows,
            INIT=init,
            COMBINE=combine,
            FINISH=finish,
        )
        if rows:
            L.launch(src, [tv.storage], [out.storage], _row_grid(L, rows), name=kind)
        return out

    return lower


TABLE["aten.sum.dim_IntList"] = _reduce("sum")
TABLE["aten.mean.dim"] = _reduce("mean")
TABLE["aten.amax.default"] = _reduce("amax")
TABLE["aten.amin.default"] = _reduce("amin")
TABLE["aten.prod.dim_int"] = _reduce("prod")
TABLE["aten.sum.default"] = lambda L, ctx, x, dtype=None: _reduce("sum")(L, ctx, x)
TABLE["aten.mean.default"] = lambda L, ctx, x, dtype=None: _reduce("mean")(L, ctx, x)


def _arg(cmp: str) -> Lower:
    def lower(L: Lowerer, ctx: Any, x: Any, dim: Any = None, keepdim: bool = False) -> TV:
        rank = len(L.as_tv(x).shape)
        dims = list(range(rank)) if dim is None else [dim]
        tv, kept, r, _ = _rows(L, x, dims)
        rows = max(1, math.prod(kept)) if kept else 1
        out = L.new_tv(tuple(ctx.out.shape), torch.int64)
        src = shaders.render("argreduce", R=r, ROWS=rows, CMP=cmp)
        L.launch(src, [tv.storage], [out.storage], _row_grid(L, rows), name="argreduce")
        return out

    return lower


TABLE["aten.argmax.default"] = _arg(">")
TABLE["aten.argmin.default"] = _arg("<")


def _var(L: Lowerer, ctx: Any, x: Any, dim: Any = None, *, correction: Any = None, keepdim: bool = False) -> TV:
    rank = len(L.as_tv(x).shape)
    dims = list(range(rank)) if dim is None else ([dim] if isinstance(dim, int) else list(dim))
    tv, kept, r, _ = _rows(L, x, dims)
    rows = math.prod(kept) if kept else 1
    c = 1.0 if correction is None else float(correction)
    out = L.new_tv(tuple(ctx.out.shape), ctx.out.dtype)  # float32 or float16 (f32 moments)
    denom = f32_literal(max(r - c, 0.0))
    src = shaders.render("moments", ROWS_PRELUDE=shaders.source("rows_prelude"), R=r, ROWS=rows, DENOM=denom)
    if rows:
        L.launch(src, [tv.storage], [out.storage], _row_grid(L, rows), name="var")
    return out


TABLE["aten.var.correction"] = _var


def _softmax_like(mode: int) -> Lower:
    def lower(L: Lowerer, ctx: Any, x: Any, dim: Any, half_to_float: bool = False) -> TV:
        if mode == 2:
            dims = [dim] if isinstance(dim, int) else list(dim)
            keepdim = half_to_float
        else:
            dims = [dim]
        tv, kept, r, order = _rows(L, x, dims)
        rows = math.prod(kept) if kept else 1
        if mode == 2:
            out = L.new_tv(tuple(ctx.out.shape), ctx.out.dtype)
            del keepdim
        else:
            out = L.new_tv(tv.shape, ctx.out.dtype)
        src = shaders.render("softmax", ROWS_PRELUDE=shaders.source("rows_prelude"), R=r, ROWS=rows, MODE=mode)
        if rows and r:
            L.launch(src, [tv.storage], [out.storage], _row_grid(L, rows), name="softmax")
        if mode == 2:
            return out
        inverse = [order.index(d) for d in range(len(order))]
        return out.with_view(tuple(out.shape[i] for i in inverse), tuple(out.stride[i] for i in inverse))

    return lower


TABLE["aten._softmax.default"] = _softmax_like(0)
TABLE["aten._log_softmax.default"] = _softmax_like(1)
TABLE["aten.logsumexp.default"] = lambda L, ctx, x, dim, keepdim=False: _softmax_like(2)(L, ctx, x, dim, keepdim)


def _cumsum(L: Lowerer, ctx: Any, x: Any, dim: int, dtype: Any = None) -> TV:
    tv, kept, r, order = _rows(L, x, [dim])
    rows = math.prod(kept) if kept else 1
    out = L.new_tv(tv.shape, ctx.out.dtype)
    in_ty = DEV_TYPE[tv.dtype]
    if ctx.out.dtype == torch.int64:
        zero, accum = (
            "tb_i64_make(0u, 0u)",
            "tb_i64_add(s, {})".format("v" if in_ty == I64 else f"tb_i64_from_{in_ty}(v)"),
        )
    else:
        zero, accum = "0.0", "s + v"
    src = shaders.render(
        "cumsum", R=r, ROWS=rows, IN_TYPE=in_ty, OUT_TYPE=DEV_TYPE[ctx.out.dtype], ZERO=zero, ACCUM=accum
    )
    if rows and r:
        L.launch(src, [tv.storage], [out.storage], L.grid(rows, per_group=64), name="cumsum")
    inverse = [order.index(d) for d in range(len(order))]
    return out.with_view(tuple(out.shape[i] for i in inverse), tuple(out.stride[i] for i in inverse))


TABLE["aten.cumsum.default"] = _cumsum


def _layer_norm(
    L: Lowerer, ctx: Any, x: Any, normalized_shape: Any, weight: Any, bias: Any, eps: float
) -> tuple[TV, TV, TV]:
    rank = len(L.as_tv(x).shape)
    dims = list(range(rank - len(normalized_shape), rank))
    tv, kept, r, _ = _rows(L, x, dims)
    rows = math.prod(kept) if kept else 1
    out = L.new_tv(tv.shape, ctx.out[0].dtype)
    mean = L.new_tv(tuple(ctx.out[1].shape), ctx.out[1].dtype)
    rstd = L.new_tv(tuple(ctx.out[2].shape), ctx.out[2].dtype)
    w = L.contiguous(weight) if weight is not None else None
    b = L.contiguous(bias) if bias is not None else None
    src = shaders.render(
        "layer_norm",
        ROWS_PRELUDE=shaders.source("rows_prelude"),
        R=r,
        ROWS=rows,
        EPS=f32_literal(eps),
        W=f"w[{w.offset}u + j]" if w is not None else "1.0",
        B=f"b[{b.offset}u + j]" if b is not None else "0.0",
    )
    ins = [tv.storage, (w or tv).storage, (b or tv).storage]
    if rows:
        L.launch(src, ins, [out.storage, mean.storage, rstd.storage], _row_grid(L, rows), name="layer_norm")
    return out, mean, rstd


TABLE["aten.native_layer_norm.default"] = _layer_norm


def _rms_norm(
    L: Lowerer, ctx: Any, x: Any, normalized_shape: Any, weight: Any = None, eps: Any = None
) -> tuple[TV, TV]:
    rank = len(L.as_tv(x).shape)
    dims = list(range(rank - len(normalized_shape), rank))
    tv, kept, r, _ = _rows(L, x, dims)
    rows = math.prod(kept) if kept else 1
    out = L.new_tv(tv.shape, ctx.out[0].dtype)  # float32 or float16 (f32 statistics)
    rstd = L.new_tv(tuple(ctx.out[1].shape), ctx.out[1].dtype)
    w = L.contiguous(weight) if weight is not None else None
    e = torch.finfo(tv.dtype).eps if eps is None else float(eps)
    src = shaders.render(
        "rms_norm",
        ROWS_PRELUDE=shaders.source("rows_prelude"),
        R=r,
        ROWS=rows,
        EPS=f32_literal(e),
        W=f"w[{w.offset}u + j]" if w is not None else "1.0",
    )
    if rows:
        L.launch(src, [tv.storage, (w or tv).storage], [out.storage, rstd.storage], _row_grid(L, rows), name="rms_norm")
    return out, rstd


TABLE["aten._fused_rms_norm.default"] = _rms_norm


# -- attention --------------------------------------------------------------------------------------
def _sdpa(
    L: Lowerer,
    ctx: Any,
    q: Any,
    k: Any,
    v: Any,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    attn_mask: Any = None,
    scale: Any = None,
) -> tuple[TV, TV]:
    tq, tk, tvv = L.as_tv(q), L.as_tv(k), L.as_tv(v)
    b, h, lq, e = tq.shape
    s = tk.shape[2]
    ev = tvv.shape[3]
    out_meta, lse_meta = ctx.out[0], ctx.out[1]
    out = _alloc_like_meta(L, out_meta)
    lse = _alloc_like_meta(L, lse_meta)
    subs: dict[str, Any] = {"B": b, "H": h, "L": lq, "S": s, "E": e, "EV": ev}
    for name, t in (("Q", tq), ("K", tk), ("V", tvv)):
        subs[f"{name}_OFF"] = t.offset
        for suffix, st in zip(("SB", "SH", "SL", "SE"), t.stride):
            subs[f"{name}_{suffix}"] = st if t.shape[("SB", "SH", "SL", "SE").index(suffix)] != 1 else 0
    for suffix, st in zip(("SB", "SH", "SL", "SE"), out.stride):
        subs[f"O_{suffix}"] = st
    for suffix, st in zip(("SB", "SH", "SL"), lse.stride):
        subs[f"LSE_{suffix}"] = st
    subs["SCALE"] = f32_literal(1.0 / math.sqrt(e) if scale is None else float(scale))
    subs["CAUSAL"] = "true" if is_causal else "false"
    inputs = [tq.storage, tk.storage, tvv.storage]
    if attn_mask is not None:
        tm = L.as_tv(attn_mask)
        lead = 4 - len(tm.shape)
        mst = [0] * 4
        for d, (size, stv) in enumerate(zip(tm.shape, tm.stride)):
            mst[d + lead] = stv if size != 1 else 0
        index = f"{tm.offset}u + b * {mst[0]}u + h * {mst[1]}u + i * {mst[2]}u + j * {mst[3]}u"
        if tm.dtype == torch.bool:
            subs["MASK_TYPE"] = "u32"
            subs["MASK_EXPR"] = f"return select(-tb_inf(), 0.0, mask[{index}] != 0u);"
        else:
            subs["MASK_TYPE"] = "f32"
            subs["MASK_EXPR"] = f"return mask[{index}];"
        inputs.append(tm.storage)
    else:
        subs["MASK_TYPE"] = "f32"
        subs["MASK_EXPR"] = "return 0.0 * mask[0];"
        inputs.append(tq.storage)
    src = shaders.render("sdpa", **subs)
    if b * h * lq:
        L.launch(src, inputs, [out.storage, lse.storage], L.grid(b * h * lq, per_group=64), name="sdpa")
    return out, lse


def _alloc_like_meta(L: Lowerer, meta: Any) -> TV:
    """A fresh storage laid out with ``meta``'s (dense, possibly permuted) strides."""
    shape, stride = tuple(meta.shape), tuple(meta.stride)
    order = sorted(range(len(shape)), key=lambda d: (-stride[d], d))
    dense = tuple(shape[d] for d in order)
    tv = L.new_tv(dense, meta.dtype)
    if contiguous_strides(dense) != tuple(stride[d] for d in order):
        return L.new_tv(shape, meta.dtype)
    inverse = [order.index(d) for d in range(len(shape))]
    return tv.with_view(shape, tuple(tv.stride[i] for i in inverse))


TABLE["aten._scaled_dot_product_flash_attention_for_cpu.default"] = _sdpa


# -- gathers ------------------------------------------------------------------------------------------
def _gather_lazy(L: Lowerer, ctx: Any, src: Any, coords: list[Any], op: str, wrap: bool = False) -> Lazy:
    """out[c] = src[coords(c)], each coordinate an int (output dim) or an i32 index expression.

    ``wrap``: negative indices count from the end (``x[idx]`` semantics; embedding and gather
    reject them in torch). Indices fit in i32: a dimension is below the binding size limit.
    Every index is checked against its dimension: a bad one is recorded in the partition's
    error words (``Lowerer.check``) and the call raises after readback, as torch does.
    """
    tv = L.as_tv(src)
    parts: list[str] = []
    args: list[Any] = []
    checks: list[tuple[int, int, bool, int]] = []
    for d, c in enumerate(coords):
        st = tv.stride[d]
        if isinstance(c, int):
            parts.append(f"c{c} * {st}u")
        else:
            e = L.as_expr(c)
            # int64 indices saturate to i32, so one beyond 2^31 is still caught by the check
            args.append(Op("i32", "tb_i64_to_index({0})", (e,)) if e.ty == I64 else cast(e, "i32"))
            k = f"{{{len(args) - 1}}}"
            index = f"select({k}, {k} + {tv.shape[d]}, {k} < 0)" if wrap else k
            parts.append(f"u32({index}) * {st}u")
            size = tv.shape[d]
            message = f"{op}: index {{index}} is out of bounds for dimension {d} with size {size}"
            checks.append((len(args) - 1, size, wrap, L.check(message)))
    index = " + ".join([f"{tv.offset}u", *parts])
    ty = DEV_TYPE[tv.dtype]
    gather = Gather(ty, "@SRC@[" + index + "]", tuple(args), tv, tuple(checks))
    return Lazy(gather, tuple(ctx.out.shape), ctx.out.dtype, ctx.uses)


def _embedding(
    L: Lowerer,
    ctx: Any,
    weight: Any,
    indices: Any,
    padding_idx: int = -1,
    scale_grad_by_freq: bool = False,
    sparse: bool = False,
) -> Lazy:
    ti = L.as_tv(indices)
    rank = len(ti.shape)
    idx = ti.with_view((*ti.shape, 1), (*ti.stride, 0))
    return _gather_lazy(L, ctx, weight, [idx, rank], "aten.embedding")


def _index_select(L: Lowerer, ctx: Any, x: Any, dim: int, index: Any) -> Lazy:
    tx = L.as_tv(x)
    rank = len(tx.shape)
    dim = _norm_dim(dim, rank)
    ti = L.as_tv(index)
    shape = tuple(ctx.out.shape)
    view = ti.with_view(
        tuple(shape[d] if d == dim else 1 for d in range(rank)),
        tuple(ti.stride[0] if d == dim else 0 for d in range(rank)),
    )
    coords: list[Any] = [view if d == dim else d for d in range(rank)]
    return _gather_lazy(L, ctx, tx, coords, "aten.index_select")


def _gather(L: Lowerer, ctx: Any, x: Any, dim: int, index: Any, sparse_grad: bool = False) -> Lazy:
    tx = L.as_tv(x)
    rank = len(tx.shape)
    dim = _norm_dim(dim, rank)
    coords: list[Any] = [L.as_tv(index) if d == dim else d for d in range(rank)]
    return _gather_lazy(L, ctx, tx, coords, "aten.gather")


def _index(L: Lowerer, ctx: Any, x: Any, indices: Any) -> Lazy:
    """``x[i0, i1, ...]`` (aten.index.Tensor): integer index tensors broadcast together; their
    dims replace the indexed dims in place when those are adjacent, else lead the result."""
    tx = L.as_tv(x)
    rank = len(tx.shape)
    idx = list(indices) + [None] * (rank - len(indices))
    where = [d for d, t in enumerate(idx) if t is not None]
    tvs = {d: L.as_tv(idx[d]) for d in where}
    bshape = broadcast_shapes(*[tvs[d].shape for d in where])
    adjacent = where == list(range(where[0], where[-1] + 1))
    first = where[0] if adjacent else 0
    out_shape = tuple(ctx.out.shape)
    rank_out = len(out_shape)
    coords: list[Any] = []
    rest = first + len(bshape) if adjacent else len(bshape)
    for d in range(rank):
        if d in tvs:
            t = tvs[d]
            lead = first + len(bshape) - len(t.shape)
            shape = [1] * rank_out
            stride = [0] * rank_out
            for k, (size, st) in enumerate(zip(t.shape, t.stride)):
                if size != 1:
                    shape[lead + k], stride[lead + k] = size, st
            coords.append(t.with_view(tuple(shape), tuple(stride)))
        elif adjacent and d < first:
            coords.append(d)
        else:
            coords.append(rest)
            rest += 1
    return _gather_lazy(L, ctx, tx, coords, "aten.index.Tensor", wrap=True)


TABLE["aten.index.Tensor"] = _index
TABLE["aten.embedding.default"] = _embedding
TABLE["aten.index_select.default"] = _index_select
TABLE["aten.gather.default"] = _gather


# -- data movement -----------------------------------------------------------------------------------
def _cat(L: Lowerer, ctx: Any, tensors: Any, dim: int = 0) -> TV:
    shape = tuple(ctx.out.shape)
    rank = len(shape)
    dim = _norm_dim(dim, rank)
    out = L.new_tv(shape, ctx.out.dtype)
    at = 0
    for t in tensors:
        part_shape = tuple(t.shape) if isinstance(t, (TV, Lazy)) else None
        if part_shape is None:
            raise LoweringError("cat of a non-tensor")
        if len(part_shape) == 1 and part_shape[0] == 0 and rank > 1:
            continue  # torch.cat skips legacy empty 1-d tensors
        n = part_shape[dim]
        dest = out.with_view(part_shape, out.stride, out.offset + at * out.stride[dim])
        if n:
            L.materialize(L.as_expr(t), part_shape, ctx.out.dtype, dest=dest)
        at += n
    return out


TABLE["aten.cat.default"] = _cat


def _arange(L: Lowerer, ctx: Any, start: Any, end: Any = None, step: Any = 1, **kwargs: Any) -> TV:
    """arange with integer bounds and step: start + i * step in int64 registers, converted to the
    output dtype (int64, int32, or float32 rounded once, as torch's double arange is)."""
    if end is None:  # aten.arange.default(end)
        start, end = 0, start
    start, step = int(start), int(step)
    n = int(ctx.out.shape[0])
    expr = Op(I64, "tb_i64_add({0}, tb_i64_mul(tb_i64_from_u32(i), {1}))", (const(start, I64), const(step, I64)))
    return L.materialize(expr, (n,), ctx.out.dtype)


for _op in ("aten.arange.default", "aten.arange.start", "aten.arange.start_step"):
    TABLE[_op] = _arange


# -- convolution and pooling --------------------------------------------------------------------------
def _conv(
    L: Lowerer,
    ctx: Any,
    x: Any,
    w: Any,
    bias: Any,
    stride: Any,
    padding: Any,
    dilation: Any,
    transposed: bool,
    output_padding: Any,
    groups: int,
) -> TV:
    tx, tw = L.as_tv(x), L.as_tv(w)
    _, _, ih, iw = tx.shape
    cout, cin_g, kh, kw = tw.shape
    out_shape = tuple(ctx.out.shape)
    _, _, oh, ow = out_shape
    out = L.new_tv(out_shape, ctx.out.dtype)
    inputs = [tx.storage, tw.storage]
    if bias is not None:
        tb = L.as_tv(bias)
        inputs.append(tb.storage)
        bias_expr = f"bias[{tb.offset}u + co * {tb.stride[0]}u]"
    else:
        inputs.append(tw.storage)
        bias_expr = "0.0"
    subs = {
        "COUT": cout,
        "OH": oh,
        "OW": ow,
        "CIN_G": cin_g,
        "COUT_G": cout // groups,
        "KH": kh,
        "KW": kw,
        "IH": ih,
        "IW": iw,
        "TOTAL": math.prod(out_shape),
        "SH": stride[0],
        "SW": stride[1],
        "PH": padding[0],
        "PW": padding[1],
        "DH": dilation[0],
        "DW": dilation[1],
        "X_OFF": tx.offset,
        "X_SN": tx.stride[0],
        "X_SC": tx.stride[1],
        "X_SH": tx.stride[2],
        "X_SW": tx.stride[3],
        "W_OFF": tw.offset,
        "W_SO": tw.stride[0],
        "W_SI": tw.stride[1],
        "W_SH": tw.stride[2],
        "W_SW": tw.stride[3],
        "BIAS_EXPR": bias_expr,
    }

    def rebuild(epilogue: str) -> str:
        return shaders.render("conv2d", EPILOGUE=epilogue, **subs)

    total = math.prod(out_shape)
    if total:
        index = L.launch(
            rebuild("return v;"), inputs, [out.storage], L.grid(total, per_group=64), rebuild=rebuild, name="conv2d"
        )
        if ctx.uses == 1:
            L.epilogue_open[out.storage] = index
    return out


TABLE["aten.convolution.default"] = _conv


def _pool(
    L: Lowerer,
    ctx: Any,
    x: Any,
    kernel: Any,
    stride: Any,
    padding: Any,
    dilation: Any,
    is_max: bool,
    ceil_mode: bool,
    count_include_pad: bool = True,
    divisor_override: Any = None,
) -> Any:
    tx = L.as_tv(x)
    squeeze = len(tx.shape) == 3
    if squeeze:
        tx = tx.with_view((1, *tx.shape), (0, *tx.stride))
    n, c, ih, iw = tx.shape
    kernel = list(kernel) * (2 if len(kernel) == 1 else 1)
    stride = list(stride or kernel) * (2 if len(stride or kernel) == 1 else 1)
    padding = list(padding) * (2 if len(padding) == 1 else 1)
    dilation = list(dilation) * (2 if len(dilation) == 1 else 1)
    out_meta = ctx.out[0] if isinstance(ctx.out, tuple) else ctx.out
    oh, ow = out_meta.shape[-2], out_meta.shape[-1]
    out = L.new_tv(tuple(out_meta.shape), out_meta.dtype)
    idx = L.new_tv(tuple(out_meta.shape), torch.int64)
    if divisor_override:
        divisor = str(int(divisor_override))
    elif count_include_pad:
        divisor = "pool_size"
    else:
        divisor = "count"
    subs = {
        "C": c,
        "OH": oh,
        "OW": ow,
        "IH": ih,
        "IW": iw,
        "TOTAL": n * c * oh * ow,
        "IS_MAX": "true" if is_max else "false",
        "KH": kernel[0],
        "KW": kernel[1],
        "SH": stride[0],
        "SW": stride[1],
        "PH": padding[0],
        "PW": padding[1],
        "DH": dilation[0],
        "DW": dilation[1],
        "DIVISOR": divisor,
        "X_OFF": tx.offset,
        "X_SN": tx.stride[0],
        "X_SC": tx.stride[1],
        "X_SH": tx.stride[2],
        "X_SW": tx.stride[3],
    }
    total = n * c * oh * ow
    if total:
        L.launch(
            shaders.render("pool2d", **subs),
            [tx.storage],
            [out.storage, idx.storage],
            L.grid(total, per_group=64),
            name="pool2d",
        )
    return (out, idx) if is_max else out


TABLE["aten.max_pool2d_with_indices.default"] = (
    lambda L, ctx, x, kernel_size, stride=(), padding=(0,), dilation=(1,), ceil_mode=False: _pool(
        L, ctx, x, kernel_size, stride, padding, dilation, True, ceil_mode
    )
)
TABLE["aten.avg_pool2d.default"] = (
    lambda L, ctx, x, kernel_size, stride=(), padding=(0,), ceil_mode=False, count_include_pad=True, divisor_override=None: (
        _pool(L, ctx, x, kernel_size, stride, padding, (1,), False, ceil_mode, count_include_pad, divisor_override)
    )
)

__all__ = ["TABLE", "Leaf"]


# -- loss --------------------------------------------------------------------------------------------
def _nll_loss(
    L: Lowerer, ctx: Any, x: Any, target: Any, weight: Any, reduction: int, ignore_index: int
) -> tuple[TV, TV]:
    tx, tt = L.as_tv(x), L.as_tv(target)
    n, c = tx.shape
    out = L.new_tv(tuple(ctx.out[0].shape), ctx.out[0].dtype)  # float32 or float16 (f32 sums)
    total = L.new_tv(tuple(ctx.out[1].shape), ctx.out[1].dtype)
    inputs = [tx.storage, tt.storage]
    if weight is not None:
        tw = L.as_tv(weight)
        inputs.append(tw.storage)
        weight_expr = f"return weight[{tw.offset}u + u32(t) * {tw.stride[0]}u];"
    else:
        inputs.append(tx.storage)
        weight_expr = "return 1.0;"
    src = shaders.render(
        "nll_loss",
        ROWS_PRELUDE=shaders.source("rows_prelude"),
        N=n,
        C=c,
        REDUCTION=int(reduction),
        IGNORE=int(ignore_index),
        WEIGHT_EXPR=weight_expr,
        T_TYPE=DEV_TYPE[tt.dtype],
        T_CONV="tb_i64_to_index" if DEV_TYPE[tt.dtype] == I64 else "i32",
        T_OFF=tt.offset,
        T_S=tt.stride[0],
        X_OFF=tx.offset,
        X_SN=tx.stride[0],
        X_SC=tx.stride[1],
        ERR_DECL=err_decl(5),
        CHECK=L.check(f"aten.nll_loss_forward: Target {{index}} is out of bounds (classes: {c})"),
    )
    assert L.err_storage is not None
    L.launch(src, inputs, [out.storage, total.storage, L.err_storage], (1, 1, 1), name="nll_loss")
    return out, total


TABLE["aten.nll_loss_forward.default"] = _nll_loss
