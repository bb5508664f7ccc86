//! Non-elementwise kernels: GEMM family, reductions, softmax, norms, attention, indexing,
//! convolution, pooling, losses. `Kernel::new` checks every shape relation a kernel relies on,
//! so `run` only indexes inside validated views.

use crate::ew::Un;
use crate::exec::{Mem, SPtr};
use crate::gemm::{sgemm_epi, Epi, EpiOp, EpiSpec, Mat};
use crate::mathfn;
use crate::tensor::{need, DType, Result, View};

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Red {
    Sum,
    Mean,
    Amax,
    Amin,
    Argmax,
    Argmin,
    Var(f64),
    Prod,
    LogSumExp,
    Any,
    All,
}

pub enum Kernel {
    Gemm { a: View, b: View, c: View, bias: Option<View>, res: Option<View>, alpha: f32, beta: f32, epi: Vec<EpiSpec> },
    Reduce { kind: Red, x: View, out: View },
    Softmax { x: View, y: View, dim: usize, log: bool },
    SoftmaxBwd { g: View, y: View, gi: View, dim: usize, log: bool },
    LayerNorm { x: View, w: Option<View>, b: Option<View>, y: View, mean: View, rstd: View, n: usize, eps: f32 },
    RmsNorm { x: View, w: Option<View>, y: View, rstd: View, n: usize, eps: f32 },
    Sdpa { q: View, k: View, v: View, mask: Option<View>, o: View, lse: View, causal: bool, scale: f32 },
    Embedding { w: View, idx: View, out: View },
    Index { x: View, idx: Vec<View>, out: View },
    Gather { x: View, idx: View, out: View, dim: usize },
    IndexSelect { x: View, idx: View, out: View, dim: usize },
    Cumsum { x: View, y: View, dim: usize },
    /// 0: cumprod, 1: logcumsumexp
    Scan { x: View, y: View, dim: usize, mode: i64 },
    /// running max (`max`) or min with the index where it was last taken (ties and NaN: the later one)
    CumExtreme { x: View, vals: View, idx: View, dim: usize, max: bool },
    Scatter { base: View, idx: View, src: View, out: View, dim: usize, how: crate::indexing::Combine, include_self: bool },
    IndexPut { base: View, values: View, idx: Vec<View>, out: View, accumulate: bool },
    Sort { x: View, vals: View, pos: View, dim: usize, descending: bool },
    Arange { y: View, start: f64, step: f64 },
    Conv2d { x: View, w: View, bias: Option<View>, y: View, p: [usize; 7], epi: Vec<Un> },
    ConvTranspose2d { x: View, w: View, bias: Option<View>, y: View, p: [usize; 7] },
    Conv3d { x: View, w: View, bias: Option<View>, y: View, p: crate::conv3d::Params },
    MaxPool { x: View, y: View, idx: View, p: [usize; 8] },
    AvgPool { x: View, y: View, p: [usize; 6], include_pad: bool, divisor: usize },
    AdaptivePool { x: View, y: View, idx: Option<View> },
    MaxPool3d { x: View, y: View, idx: View, p: crate::pool3d::MaxParams },
    AvgPool3d { x: View, y: View, p: crate::pool3d::AvgParams, include_pad: bool, divisor: usize },
    Nll { x: View, t: View, w: Option<View>, out: View, total: View, reduction: i64, ignore: i64 },
    NllBwd { g: View, x: View, t: View, w: Option<View>, total: View, gi: View, reduction: i64, ignore: i64 },
    Linalg(Box<crate::linalg::Linalg>),
    /// QR, SVD, symmetric eigen and what is built on them (linalg_decomp.rs)
    Decomp(Box<crate::linalg_decomp::Decomp>),
    NonzeroStatic(Box<crate::nonzero_static::NonzeroStatic>),
    /// a copy that converts between any two dtypes the executor carries
    Cast { x: View, y: View },
    /// complex constructors and elementwise ops (complex, polar, conj, angle)
    Cplx(Box<crate::complex::Cplx>),
    /// discrete Fourier transforms (r2c, c2c, c2r)
    Fft(Box<crate::fft::Fft>),
    /// float64 softmax and exact integer reductions
    Wide(Box<crate::wide_math::Wide>),
    Fill { y: View, value: f64, int: Option<i64> },
    Search(Box<crate::search::Search>),
    Dist(Box<crate::dist::Dist>),
    Select(Box<crate::select::Select>),
    Resample(Box<crate::upsample::Resample>),
    PoolBwd(Box<crate::segment::PoolBwd>),
    EmbeddingBag { w: View, idx: View, offsets: View, psw: Option<View>, out: View, mode: i64, include_last: bool, padding: i64 },
    Segment(Box<crate::segment::Segment>),
    /// fails the call when any int32 `info` is non-zero (ATen's _linalg_check_errors)
    CheckInfo { info: View, api: String },
    /// out = base, then the positions where `mask` is set take the next values of `src` (flat)
    MaskedScatter { base: View, mask: View, src: View, out: View },
}

fn f32s(vs: &[&View]) -> Result<()> {
    need(vs.iter().all(|v| v.dtype == DType::F32), "operand is not float32")
}

fn take(ins: &[Option<View>], i: usize) -> Result<View> {
    ins.get(i).cloned().flatten().ok_or_else(|| format!("missing operand {i}"))
}

fn opt(ins: &[Option<View>], i: usize) -> Option<View> {
    ins.get(i).cloned().flatten()
}

fn out(outs: &[View], i: usize) -> Result<View> {
    outs.get(i).cloned().ok_or_else(|| format!("missing output {i}"))
}

fn int(ints: &[i64], i: usize) -> Result<i64> {
    ints.get(i).copied().ok_or_else(|| format!("missing integer parameter {i}"))
}

fn uint(ints: &[i64], i: usize) -> Result<usize> {
    usize::try_from(int(ints, i)?).map_err(|_| format!("parameter {i} must be non-negative"))
}

fn dim(ints: &[i64], i: usize, rank: usize) -> Result<usize> {
    let d = int(ints, i)?;
    let r = rank as i64;
    let d = if d < 0 { d + r } else { d };
    need(d >= 0 && d < r.max(1), "dimension out of range")?;
    Ok(d as usize)
}

/// Iterates every multi-index of `sizes`, passing the offsets of each operand.
pub(crate) fn for_each<const K: usize>(sizes: &[usize], strides: [&[usize]; K], mut f: impl FnMut([usize; K])) {
    if sizes.contains(&0) {
        return;
    }
    let nd = sizes.len();
    let mut idx = vec![0usize; nd];
    let mut offs = [0usize; K];
    loop {
        f(offs);
        let mut d = nd;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            for k in 0..K {
                offs[k] += strides[k][d];
            }
            if idx[d] < sizes[d] {
                break;
            }
            for k in 0..K {
                offs[k] -= strides[k][d] * sizes[d];
            }
            idx[d] = 0;
        }
    }
}

/// Offsets of operand `strides` at multi-index number `linear` of `sizes` (row-major).
fn offset_of(linear: usize, sizes: &[usize], strides: &[usize]) -> usize {
    let mut r = linear;
    let mut o = 0;
    for d in (0..sizes.len()).rev() {
        o += (r % sizes[d]) * strides[d];
        r /= sizes[d];
    }
    o
}

pub(crate) fn drop_dim(v: &[usize], d: usize) -> Vec<usize> {
    v.iter().enumerate().filter(|&(i, _)| i != d).map(|(_, &x)| x).collect()
}

impl Kernel {
    pub fn new(op: &str, ins: Vec<Option<View>>, outs: Vec<View>, ints: &[i64], floats: &[f64], epi: Vec<EpiSpec>) -> Result<Kernel> {
        let fl = |i: usize, d: f64| floats.get(i).copied().unwrap_or(d);
        // complex kernels take their own dtypes (checked in complex.rs / fft.rs)
        match op {
            "complex" | "polar" | "conj" | "angle" | "imag" => return Ok(Kernel::Cplx(Box::new(crate::complex::Cplx::new(op, &ins, &outs)?))),
            "fft_r2c" | "fft_c2c" | "fft_c2r" => return Ok(Kernel::Fft(Box::new(crate::fft::Fft::new(op, &ins, &outs, ints)?))),
            "softmax64" | "log_softmax64" | "ireduce" | "ew64" => return Ok(Kernel::Wide(Box::new(crate::wide_math::Wide::new(op, &ins, &outs, ints, floats)?))),
            _ => {}
        }
        // only these kernels read or write the storage-only dtypes (float64, int32, ...)
        let wide = matches!(op, "cast" | "fill" | "arange" | "gather" | "lu_factor" | "lu_unpack" | "lu" | "lu_solve" | "det" | "slogdet" | "cholesky" | "tri_solve" | "searchsorted" | "frexp" | "check_info" | "scatter" | "index_put" | "segment_reduce");
        if !wide && ins.iter().flatten().chain(&outs).any(|v| !v.dtype.is_core()) {
            return Err(format!("kernel {op} takes float32, int64 and bool only"));
        }
        let k = match op {
            "cast" => {
                let (x, y) = (take(&ins, 0)?, out(&outs, 0)?);
                crate::cast::check_cast(&x, &y)?;
                Kernel::Cast { x, y }
            }
            "fill" => {
                let y = out(&outs, 0)?;
                // mode 0: the float, 1: the integer (exact for any int64), 2..4: NaN, +inf, -inf
                let (value, int) = match int(ints, 0)? {
                    0 => (fl(0, 0.0), None),
                    1 => (0.0, Some(int(ints, 1)?)),
                    2 => (f64::NAN, None),
                    3 => (f64::INFINITY, None),
                    4 => (f64::NEG_INFINITY, None),
                    m => return Err(format!("unknown fill mode {m}")),
                };
                Kernel::Fill { y, value, int }
            }
            "searchsorted" | "histc" | "frexp" => Kernel::Search(Box::new(crate::search::Search::new(op, &ins, &outs, ints, floats)?)),
            "cdist" | "pdist" | "dist" => Kernel::Dist(Box::new(crate::dist::Dist::new(op, &ins, &outs, floats)?)),
            "median_dim" | "nanmedian_dim" | "mode" => {
                let (x, v, i) = (take(&ins, 0)?, out(&outs, 0)?, out(&outs, 1)?);
                let d = dim(ints, 0, x.rank())?;
                Kernel::Select(Box::new(crate::select::Select::new(op, x, v, i, d)?))
            }
            "upsample_linear" | "upsample_cubic" | "grid_sampler_2d" | "grid_sampler_3d" => {
                Kernel::Resample(Box::new(crate::upsample::Resample::new(op, &ins, &outs, ints, floats)?))
            }
            "embedding_bag" => {
                let (w, idx, offsets, o) = (take(&ins, 0)?, take(&ins, 1)?, take(&ins, 2)?, out(&outs, 0)?);
                let psw = opt(&ins, 3);
                f32s(&[&w, &o])?;
                need(w.rank() == 2 && o.rank() == 2 && o.sizes[1] == w.sizes[1], "embedding_bag: 2-d weight and output")?;
                need(idx.dtype == DType::I64 && offsets.dtype == DType::I64 && idx.rank() == 1 && offsets.rank() == 1, "embedding_bag: 1-d int64 indices and offsets")?;
                let (mode, include_last, padding) = (int(ints, 0)?, int(ints, 1)? != 0, int(ints, 2)?);
                need((0..=2).contains(&mode), "embedding_bag mode")?;
                need(o.sizes[0] == offsets.sizes[0] - (include_last && offsets.sizes[0] > 0) as usize, "embedding_bag: number of bags")?;
                if let Some(p) = &psw {
                    need(p.dtype == DType::F32 && p.sizes == idx.sizes && mode == 0, "embedding_bag per-sample weights (sum mode only)")?;
                }
                Kernel::EmbeddingBag { w, idx, offsets, psw, out: o, mode, include_last, padding }
            }
            "max_pool2d_bwd" => Kernel::PoolBwd(Box::new(crate::segment::PoolBwd::new(&ins, &outs)?)),
            "nonzero_static" => {
                let (x, y) = (take(&ins, 0)?, out(&outs, 0)?);
                Kernel::NonzeroStatic(Box::new(crate::nonzero_static::NonzeroStatic::new(x, y, int(ints, 0)?)?))
            }
            "segment_reduce" => Kernel::Segment(Box::new(crate::segment::Segment::new(&ins, &outs, ints, floats)?)),
            "check_info" => {
                let info = take(&ins, 0)?;
                need(info.dtype == DType::I32, "linalg info is int32")?;
                Kernel::CheckInfo { info, api: "linalg".into() }
            }
            "masked_scatter" => {
                let (base, mask, src, o) = (take(&ins, 0)?, take(&ins, 1)?, take(&ins, 2)?, out(&outs, 0)?);
                need(mask.dtype == DType::Bool && base.dtype == o.dtype && src.dtype == o.dtype, "masked_scatter dtypes")?;
                need(mask.sizes == o.sizes && base.sizes == o.sizes && src.rank() == 1, "masked_scatter shapes")?;
                Kernel::MaskedScatter { base, mask, src, out: o }
            }
            "lu_factor" | "lu_unpack" | "lu" | "lu_solve" | "det" | "slogdet" | "cholesky" | "tri_solve" => {
                Kernel::Linalg(Box::new(crate::linalg::Linalg::new(op, ins, outs, ints)?))
            }
            "geqrf" | "orgqr" | "ormqr" | "qr" | "svd" | "eigh" | "pinv" | "linalg_polar" | "sqrth" | "matrix_exp" => {
                Kernel::Decomp(Box::new(crate::linalg_decomp::Decomp::new(op, ins, outs, ints)?))
            }
            "gemm" => {
                let (a, b, c) = (take(&ins, 0)?, take(&ins, 1)?, out(&outs, 0)?);
                let bias = opt(&ins, 2);
                f32s(&[&a, &b, &c])?;
                let r = c.rank();
                need(r == 2 || r == 3, "gemm operands must be 2-d or 3-d")?;
                need(a.rank() == r && b.rank() == r, "gemm operands differ in rank")?;
                let (m, kk, n) = (a.sizes[r - 2], a.sizes[r - 1], b.sizes[r - 1]);
                need(b.sizes[r - 2] == kk && c.sizes[r - 2] == m && c.sizes[r - 1] == n, "gemm shapes do not agree")?;
                if r == 3 {
                    need(a.sizes[0] == c.sizes[0] && b.sizes[0] == c.sizes[0], "bmm batch sizes differ")?;
                }
                if let Some(bv) = &bias {
                    f32s(&[bv])?;
                    need(bv.sizes == c.sizes, "gemm bias must be broadcast to the output shape")?;
                }
                let res = opt(&ins, 3);
                if let Some(rv) = &res {
                    f32s(&[rv])?;
                    need(rv.sizes == c.sizes, "gemm residual must be broadcast to the output shape")?;
                }
                need(res.is_some() == epi.contains(&EpiSpec::Residual), "gemm residual operand and epilogue disagree")?;
                need(epi.iter().filter(|e| **e == EpiSpec::Residual).count() <= 1, "at most one residual add")?;
                need(epi.len() <= crate::gemm::MAX_EPI, "too many GEMM epilogue steps")?;
                Kernel::Gemm { a, b, c, bias, res, alpha: fl(0, 1.0) as f32, beta: fl(1, 1.0) as f32, epi }
            }
            "reduce" => {
                let (x, o) = (take(&ins, 0)?, out(&outs, 0)?);
                need(x.rank() == o.rank(), "reduction output must keep the reduced dims")?;
                for d in 0..x.rank() {
                    need(o.sizes[d] == x.sizes[d] || o.sizes[d] == 1, "reduction shapes do not agree")?;
                }
                let kind = match int(ints, 0)? {
                    0 => Red::Sum,
                    1 => Red::Mean,
                    2 => Red::Amax,
                    3 => Red::Amin,
                    4 => Red::Argmax,
                    5 => Red::Argmin,
                    6 => Red::Var(fl(0, 1.0)),
                    7 => Red::Prod,
                    8 => Red::LogSumExp,
                    9 => Red::Any,
                    10 => Red::All,
                    k => return Err(format!("unknown reduction {k}")),
                };
                let reduced: Vec<bool> = ints.iter().skip(1).map(|&v| v != 0).collect();
                need(reduced.len() == x.rank(), "reduction mask has the wrong rank")?;
                for (d, &r) in reduced.iter().enumerate() {
                    need(!r || o.sizes[d] == 1, "reduced dim must have size 1 in the output")?;
                    need(r || o.sizes[d] == x.sizes[d], "kept dim must keep its size")?;
                }
                f32s(&[&x])?;
                match kind {
                    Red::Argmax | Red::Argmin => need(o.dtype == DType::I64, "argmax output is int64")?,
                    Red::Any | Red::All => need(o.dtype == DType::Bool, "any/all output is bool")?,
                    _ => f32s(&[&o])?,
                }
                // Argmax over several dims needs the row-major position: keep the mask in the view
                let mut x = x;
                for (d, &r) in reduced.iter().enumerate() {
                    if !r && x.sizes[d] == 1 {
                        x.strides[d] = 0;
                    }
                }
                let mut o = o;
                for (d, &r) in reduced.iter().enumerate() {
                    if r {
                        o.strides[d] = 0;
                    }
                }
                Kernel::Reduce { kind, x, out: o }
            }
            "softmax" | "log_softmax" => {
                let (x, y) = (take(&ins, 0)?, out(&outs, 0)?);
                f32s(&[&x, &y])?;
                need(x.sizes == y.sizes, "softmax shapes differ")?;
                need(x.rank() >= 1, "softmax of a 0-d tensor (view it as 1-d)")?;
                let d = dim(ints, 0, x.rank())?;
                Kernel::Softmax { x, y, dim: d, log: op == "log_softmax" }
            }
            "softmax_bwd" | "log_softmax_bwd" => {
                let (g, y, gi) = (take(&ins, 0)?, take(&ins, 1)?, out(&outs, 0)?);
                f32s(&[&g, &y, &gi])?;
                need(g.sizes == y.sizes && y.sizes == gi.sizes, "softmax backward shapes differ")?;
                let d = dim(ints, 0, g.rank())?;
                Kernel::SoftmaxBwd { g, y, gi, dim: d, log: op == "log_softmax_bwd" }
            }
            "layer_norm" | "rms_norm" => {
                let x = take(&ins, 0)?;
                let y = out(&outs, 0)?;
                let n = uint(ints, 0)?;
                f32s(&[&x, &y])?;
                need(x.is_contiguous() && y.is_contiguous() && x.sizes == y.sizes, "norm needs contiguous input/output")?;
                need(n > 0 && x.numel() % n == 0, "normalized size does not divide the input")?;
                let rows = x.numel() / n;
                let w = opt(&ins, 1);
                for p in w.iter().chain(opt(&ins, 2).iter()) {
                    f32s(&[p])?;
                    need(p.is_contiguous() && p.numel() == n, "norm weight/bias must have the normalized shape")?;
                }
                let eps = fl(0, 1e-5) as f32;
                if op == "layer_norm" {
                    let (mean, rstd) = (out(&outs, 1)?, out(&outs, 2)?);
                    f32s(&[&mean, &rstd])?;
                    need(mean.numel() == rows && rstd.numel() == rows && mean.is_contiguous() && rstd.is_contiguous(), "layer norm stats shape")?;
                    Kernel::LayerNorm { x, w, b: opt(&ins, 2), y, mean, rstd, n, eps }
                } else {
                    let rstd = out(&outs, 1)?;
                    f32s(&[&rstd])?;
                    need(rstd.numel() == rows && rstd.is_contiguous(), "rms norm stats shape")?;
                    Kernel::RmsNorm { x, w, y, rstd, n, eps }
                }
            }
            "sdpa" => {
                let (q, k, v, o, lse) = (take(&ins, 0)?, take(&ins, 1)?, take(&ins, 2)?, out(&outs, 0)?, out(&outs, 1)?);
                f32s(&[&q, &k, &v, &o, &lse])?;
                need(q.rank() == 4 && k.rank() == 4 && v.rank() == 4 && o.rank() == 4 && lse.rank() == 3, "sdpa needs 4-d q/k/v")?;
                let (b, h, l, e) = (q.sizes[0], q.sizes[1], q.sizes[2], q.sizes[3]);
                let s = k.sizes[2];
                need(k.sizes == [b, h, s, e] && v.sizes[..3] == [b, h, s] && o.sizes == [b, h, l, v.sizes[3]], "sdpa shapes")?;
                need(lse.sizes == [b, h, l], "sdpa logsumexp shape")?;
                let mask = opt(&ins, 3);
                if let Some(m) = &mask {
                    need(m.sizes == [b, h, l, s], "sdpa mask must be broadcast to (B, H, L, S)")?;
                }
                Kernel::Sdpa { q, k, v, mask, o, lse, causal: int(ints, 0)? != 0, scale: fl(0, 1.0 / (e as f64).sqrt()) as f32 }
            }
            "embedding" => {
                let (w, idx, o) = (take(&ins, 0)?, take(&ins, 1)?, out(&outs, 0)?);
                f32s(&[&w, &o])?;
                need(w.rank() == 2 && idx.dtype == DType::I64, "embedding takes a 2-d weight and int64 indices")?;
                let mut expect = idx.sizes.clone();
                expect.push(w.sizes[1]);
                need(o.sizes == expect, "embedding output shape")?;
                Kernel::Embedding { w, idx, out: o }
            }
            "index" => {
                let x = take(&ins, 0)?;
                let idx: Vec<View> = (1..ins.len()).map(|i| take(&ins, i)).collect::<Result<_>>()?;
                let o = out(&outs, 0)?;
                need(!idx.is_empty() && idx.len() <= x.rank(), "index needs 1..rank index tensors")?;
                need(o.dtype == x.dtype, "index output dtype")?;
                let bshape = idx[0].sizes.clone();
                need(idx.iter().all(|i| i.dtype == DType::I64 && i.sizes == bshape), "index tensors must be int64 and broadcast")?;
                let mut expect = bshape;
                expect.extend_from_slice(&x.sizes[idx.len()..]);
                need(o.sizes == expect, "index output shape")?;
                Kernel::Index { x, idx, out: o }
            }
            "gather" | "index_select" => {
                let (x, idx, o) = (take(&ins, 0)?, take(&ins, 1)?, out(&outs, 0)?);
                let d = dim(ints, 0, x.rank())?;
                need(matches!(idx.dtype, DType::I64 | DType::I32) && o.dtype == x.dtype && o.rank() == x.rank().max(1), "gather dtypes/rank")?;
                need(x.dtype.is_core() && (op == "gather" || idx.dtype == DType::I64), "gather dtypes")?;
                if op == "gather" {
                    need(idx.sizes == o.sizes && idx.rank() == x.rank(), "gather shapes")?;
                    for i in 0..x.rank() {
                        need(i == d || idx.sizes[i] <= x.sizes[i], "gather index larger than input")?;
                    }
                    Kernel::Gather { x, idx, out: o, dim: d }
                } else {
                    need(idx.rank() <= 1 && x.rank() >= 1, "index_select takes a 1-d index")?;
                    let mut expect = x.sizes.clone();
                    expect[d] = idx.numel();
                    need(o.sizes == expect, "index_select output shape")?;
                    Kernel::IndexSelect { x, idx, out: o, dim: d }
                }
            }
            "cumsum" => {
                let (x, y) = (take(&ins, 0)?, out(&outs, 0)?);
                need(x.sizes == y.sizes, "cumsum shapes")?;
                need(y.dtype != DType::Bool && !(y.dtype == DType::I64 && x.dtype == DType::F32), "cumsum dtypes")?;
                need(x.rank() >= 1, "cumsum of a 0-d tensor (view it as 1-d)")?;
                Kernel::Cumsum { dim: dim(ints, 0, x.rank())?, x, y }
            }
            "cummax" | "cummin" => {
                let (x, vals, idx) = (take(&ins, 0)?, out(&outs, 0)?, out(&outs, 1)?);
                f32s(&[&x, &vals])?;
                need(x.sizes == vals.sizes && x.sizes == idx.sizes && x.rank() >= 1, "cummax/cummin shapes")?;
                need(idx.dtype == DType::I64, "cummax/cummin indices are int64")?;
                Kernel::CumExtreme { dim: dim(ints, 0, x.rank())?, x, vals, idx, max: op == "cummax" }
            }
            "scan" => {
                let (x, y) = (take(&ins, 0)?, out(&outs, 0)?);
                f32s(&[&x, &y])?;
                need(x.sizes == y.sizes && x.rank() >= 1, "scan shapes")?;
                let mode = int(ints, 1)?;
                need((0..=1).contains(&mode), "scan mode")?;
                Kernel::Scan { dim: dim(ints, 0, x.rank())?, x, y, mode }
            }
            "scatter" => {
                let (base, idx, src, o) = (take(&ins, 0)?, take(&ins, 1)?, take(&ins, 2)?, out(&outs, 0)?);
                need(o.sizes == base.sizes && o.dtype == base.dtype && src.dtype == o.dtype, "scatter output")?;
                need(matches!(idx.dtype, DType::I64 | DType::I32) && idx.rank() == o.rank() && src.rank() == o.rank(), "scatter index rank")?;
                need(base.dtype.is_core() && src.dtype.is_core() && o.dtype.is_core(), "scatter takes float32, int64 and bool")?;
                let d = dim(ints, 0, o.rank())?;
                for i in 0..o.rank() {
                    need(idx.sizes[i] <= src.sizes[i], "scatter index larger than src")?;
                    need(i == d || idx.sizes[i] <= o.sizes[i], "scatter index larger than self")?;
                }
                let how = crate::indexing::Combine::from_code(int(ints, 1)?)?;
                need(o.dtype == DType::F32 || !matches!(how, crate::indexing::Combine::Mean) || o.dtype == DType::I64, "scatter mean dtype")?;
                Kernel::Scatter { base, idx, src, out: o, dim: d, how, include_self: int(ints, 2)? != 0 }
            }
            "index_put" => {
                let (base, values, o) = (take(&ins, 0)?, take(&ins, 1)?, out(&outs, 0)?);
                let idx: Vec<View> = (2..ins.len()).map(|i| take(&ins, i)).collect::<Result<_>>()?;
                need(!idx.is_empty() && idx.len() <= o.rank(), "index_put needs 1..rank index tensors")?;
                need(o.sizes == base.sizes && o.dtype == base.dtype && values.dtype == o.dtype, "index_put output")?;
                let bshape = idx[0].sizes.clone();
                need(idx.iter().all(|i| matches!(i.dtype, DType::I64 | DType::I32) && i.sizes == bshape), "index_put indices must be int64 or int32 and broadcast")?;
                need(base.dtype.is_core() && values.dtype.is_core() && o.dtype.is_core(), "index_put takes float32, int64 and bool")?;
                let mut expect = bshape;
                expect.extend_from_slice(&o.sizes[idx.len()..]);
                need(values.sizes == expect, "index_put values shape")?;
                Kernel::IndexPut { base, values, idx, out: o, accumulate: int(ints, 0)? != 0 }
            }
            "sort" => {
                let (x, vals, pos) = (take(&ins, 0)?, out(&outs, 0)?, out(&outs, 1)?);
                need(x.rank() >= 1 && vals.sizes == x.sizes && pos.sizes == x.sizes, "sort shapes")?;
                need(vals.dtype == x.dtype && pos.dtype == DType::I64, "sort dtypes")?;
                Kernel::Sort { dim: dim(ints, 0, x.rank())?, x, vals, pos, descending: int(ints, 1)? != 0 }
            }
            "arange" => {
                let y = out(&outs, 0)?;
                need(y.rank() == 1 && y.dtype != DType::Bool, "arange output")?;
                Kernel::Arange { y, start: fl(0, 0.0), step: fl(1, 1.0) }
            }
            "conv2d" => {
                let (x, w, y) = (take(&ins, 0)?, take(&ins, 1)?, out(&outs, 0)?);
                let bias = opt(&ins, 2);
                f32s(&[&x, &w, &y])?;
                need(x.rank() == 4 && w.rank() == 4 && y.rank() == 4, "conv2d takes 4-d tensors")?;
                let p: [usize; 7] = [uint(ints, 0)?, uint(ints, 1)?, uint(ints, 2)?, uint(ints, 3)?, uint(ints, 4)?, uint(ints, 5)?, uint(ints, 6)?];
                let (sh, sw, ph, pw, dh, dw, g) = (p[0], p[1], p[2], p[3], p[4], p[5], p[6]);
                need(sh > 0 && sw > 0 && dh > 0 && dw > 0 && g > 0, "conv2d stride/dilation/groups must be positive")?;
                let (n, c, hh, ww) = (x.sizes[0], x.sizes[1], x.sizes[2], x.sizes[3]);
                let (oc, cg, kh, kw) = (w.sizes[0], w.sizes[1], w.sizes[2], w.sizes[3]);
                need(c == cg * g && oc % g == 0 && kh > 0 && kw > 0, "conv2d channel counts")?;
                let eh = (hh + 2 * ph).checked_sub(dh * (kh - 1) + 1).ok_or("conv2d kernel larger than input")?;
                let ew_ = (ww + 2 * pw).checked_sub(dw * (kw - 1) + 1).ok_or("conv2d kernel larger than input")?;
                need(y.sizes == [n, oc, eh / sh + 1, ew_ / sw + 1], "conv2d output shape")?;
                need(w.strides[1] == kh * w.strides[2] && w.strides[2] == kw * w.strides[3] || cg * kh * kw == 1, "conv2d weight layout")?;
                need(y.strides[2] == y.sizes[3] * y.strides[3] || y.sizes[2] == 1, "conv2d output layout")?;
                if let Some(b) = &bias {
                    need(b.sizes == [oc] && b.dtype == DType::F32, "conv2d bias shape")?;
                }
                let epi = epi
                    .into_iter()
                    .map(|e| match e {
                        EpiSpec::Un(u) => Ok(u),
                        EpiSpec::Residual => Err("conv2d has no residual epilogue".to_string()),
                    })
                    .collect::<Result<Vec<Un>>>()?;
                Kernel::Conv2d { x, w, bias, y, p, epi }
            }
            "conv3d" => {
                let (x, w, y) = (take(&ins, 0)?, take(&ins, 1)?, out(&outs, 0)?);
                let bias = opt(&ins, 2);
                f32s(&[&x, &w, &y])?;
                need(x.rank() == 5 && w.rank() == 5 && y.rank() == 5, "conv3d takes 5-d tensors")?;
                let v: Vec<usize> = (0..10).map(|i| uint(ints, i)).collect::<Result<_>>()?;
                need(v[..3].iter().chain(&v[6..]).all(|&u| u > 0), "conv3d stride/dilation/groups must be positive")?;
                let g = v[9];
                let (c, oc, cg) = (x.sizes[1], w.sizes[0], w.sizes[1]);
                need(c == cg * g && oc % g == 0 && w.sizes[2..].iter().all(|&k| k > 0), "conv3d channel counts")?;
                let mut expect = vec![x.sizes[0], oc];
                for d in 0..3 {
                    expect.push(crate::conv3d::out_len(x.sizes[2 + d], w.sizes[2 + d], v[d], v[3 + d], v[6 + d]).ok_or("conv3d kernel larger than input")?);
                }
                need(y.sizes == expect, "conv3d output shape")?;
                let ws = &w.strides;
                need(ws[3] == w.sizes[4] * ws[4] && ws[2] == w.sizes[3] * ws[3] && ws[1] == w.sizes[2] * ws[2], "conv3d weight layout")?;
                let ys = &y.strides;
                need(ys[3] == y.sizes[4] * ys[4] && ys[2] == y.sizes[3] * ys[3] || y.numel() == 0, "conv3d output layout")?;
                if let Some(b) = &bias {
                    need(b.sizes == [oc] && b.dtype == DType::F32, "conv3d bias shape")?;
                }
                let mut p = [0usize; 10];
                p.copy_from_slice(&v);
                Kernel::Conv3d { x, w, bias, y, p }
            }
            "conv_transpose2d" => {
                let (x, w, y) = (take(&ins, 0)?, take(&ins, 1)?, out(&outs, 0)?);
                let bias = opt(&ins, 2);
                f32s(&[&x, &w, &y])?;
                need(x.rank() == 4 && w.rank() == 4 && y.rank() == 4, "conv_transpose2d takes 4-d tensors")?;
                let v: Vec<usize> = (0..9).map(|i| uint(ints, i)).collect::<Result<_>>()?;
                let (sh, sw, ph, pw, dh, dw, g, oph, opw) = (v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8]);
                need(sh > 0 && sw > 0 && dh > 0 && dw > 0 && g > 0, "conv_transpose2d stride/dilation/groups must be positive")?;
                let (n, c, hh, ww) = (x.sizes[0], x.sizes[1], x.sizes[2], x.sizes[3]);
                let (wc, ocg, kh, kw) = (w.sizes[0], w.sizes[1], w.sizes[2], w.sizes[3]);
                need(wc == c && c % g == 0 && kh > 0 && kw > 0, "conv_transpose2d channel counts")?;
                need(oph < sh.max(dh) && opw < sw.max(dw), "conv_transpose2d output padding must be smaller than stride or dilation")?;
                let oh = crate::conv_transpose::out_len(hh, sh, ph, dh, kh, oph).ok_or("conv_transpose2d output height is not positive")?;
                let ow = crate::conv_transpose::out_len(ww, sw, pw, dw, kw, opw).ok_or("conv_transpose2d output width is not positive")?;
                need(y.sizes == [n, ocg * g, oh, ow], "conv_transpose2d output shape")?;
                need(w.strides[2] == kw * w.strides[3] && w.strides[1] == kh * w.strides[2] || ocg * kh * kw == 1, "conv_transpose2d weight layout")?;
                if let Some(b) = &bias {
                    need(b.sizes == [ocg * g] && b.dtype == DType::F32, "conv_transpose2d bias shape")?;
                }
                let p = [sh, sw, ph, pw, dh, dw, g];
                Kernel::ConvTranspose2d { x, w, bias, y, p }
            }
            "max_pool2d" | "avg_pool2d" => {
                let (x, y) = (take(&ins, 0)?, out(&outs, 0)?);
                f32s(&[&x, &y])?;
                need(x.rank() == 4 && y.rank() == 4 && x.sizes[..2] == y.sizes[..2], "pool takes 4-d tensors")?;
                let vals: Vec<usize> = (0..if op == "max_pool2d" { 8 } else { 6 }).map(|i| uint(ints, i)).collect::<Result<_>>()?;
                need(vals[0] > 0 && vals[1] > 0 && vals[2] > 0 && vals[3] > 0, "pool kernel/stride must be positive")?;
                need(vals[4] <= vals[0] / 2 && vals[5] <= vals[1] / 2, "pool padding larger than half the kernel")?;
                if op == "max_pool2d" {
                    let idx = out(&outs, 1)?;
                    need(idx.sizes == y.sizes && idx.dtype == DType::I64, "max_pool2d indices")?;
                    need(vals[6] > 0 && vals[7] > 0, "pool dilation must be positive")?;
                    let mut p = [0usize; 8];
                    p.copy_from_slice(&vals);
                    Kernel::MaxPool { x, y, idx, p }
                } else {
                    let mut p = [0usize; 6];
                    p.copy_from_slice(&vals);
                    Kernel::AvgPool { x, y, p, include_pad: int(ints, 6)? != 0, divisor: uint(ints, 7)? }
                }
            }
            "max_pool3d" | "avg_pool3d" => {
                let (x, y) = (take(&ins, 0)?, out(&outs, 0)?);
                f32s(&[&x, &y])?;
                need(x.rank() == 5 && y.rank() == 5 && x.sizes[..2] == y.sizes[..2], "3-d pooling takes 5-d tensors")?;
                let max = op == "max_pool3d";
                let vals: Vec<usize> = (0..if max { 12 } else { 9 }).map(|i| uint(ints, i)).collect::<Result<_>>()?;
                need(vals[..6].iter().all(|&v| v > 0), "pool kernel/stride must be positive")?;
                need((0..3).all(|d| vals[6 + d] <= vals[d] / 2), "pool padding larger than half the kernel")?;
                if max {
                    let idx = out(&outs, 1)?;
                    need(idx.sizes == y.sizes && idx.dtype == DType::I64, "max_pool3d indices")?;
                    need(vals[9..].iter().all(|&v| v > 0), "pool dilation must be positive")?;
                    let mut p = [0usize; 12];
                    p.copy_from_slice(&vals);
                    Kernel::MaxPool3d { x, y, idx, p }
                } else {
                    let mut p = [0usize; 9];
                    p.copy_from_slice(&vals);
                    Kernel::AvgPool3d { x, y, p, include_pad: int(ints, 9)? != 0, divisor: uint(ints, 10)? }
                }
            }
            "adaptive_avg_pool2d" | "adaptive_max_pool2d" | "adaptive_avg_pool3d" | "adaptive_max_pool3d" => {
                let (x, y) = (take(&ins, 0)?, out(&outs, 0)?);
                f32s(&[&x, &y])?;
                let r = if op.ends_with("3d") { 5 } else { 4 };
                need(x.rank() == r && y.rank() == r && x.sizes[..2] == y.sizes[..2], "adaptive pool input/output rank")?;
                need(x.sizes[2..].iter().all(|&s| s > 0) || y.numel() == 0, "adaptive pool of an empty plane")?;
                let idx = if op.starts_with("adaptive_max") {
                    let idx = out(&outs, 1)?;
                    need(idx.sizes == y.sizes && idx.dtype == DType::I64, "adaptive max pool indices")?;
                    Some(idx)
                } else {
                    None
                };
                Kernel::AdaptivePool { x, y, idx }
            }
            "nll_loss" | "nll_loss_bwd" => {
                let fwd = op == "nll_loss";
                let off = if fwd { 0 } else { 1 };
                let (x, t) = (take(&ins, off)?, take(&ins, off + 1)?);
                let w = opt(&ins, off + 2);
                f32s(&[&x])?;
                need(x.rank() == 1 || x.rank() == 2, "nll_loss input must be 1-d or 2-d")?;
                need(t.dtype == DType::I64 && t.numel() == if x.rank() == 2 { x.sizes[0] } else { 1 }, "nll_loss target")?;
                let classes = *x.sizes.last().unwrap_or(&0);
                if let Some(wv) = &w {
                    need(wv.sizes == [classes] && wv.dtype == DType::F32, "nll_loss weight")?;
                }
                let reduction = int(ints, 0)?;
                need((0..=2).contains(&reduction), "nll_loss reduction")?;
                let ignore = int(ints, 1)?;
                if fwd {
                    let (o, total) = (out(&outs, 0)?, out(&outs, 1)?);
                    f32s(&[&o, &total])?;
                    need(total.numel() == 1, "nll_loss total weight")?;
                    need(if reduction == 0 { o.numel() == t.numel() } else { o.numel() == 1 }, "nll_loss output")?;
                    Kernel::Nll { x, t, w, out: o, total, reduction, ignore }
                } else {
                    let (g, total, gi) = (take(&ins, 0)?, take(&ins, 4)?, out(&outs, 0)?);
                    f32s(&[&g, &total, &gi])?;
                    need(gi.sizes == x.sizes && total.numel() == 1, "nll_loss_backward shapes")?;
                    need(if reduction == 0 { g.numel() == t.numel() } else { g.numel() == 1 }, "nll_loss_backward grad")?;
                    Kernel::NllBwd { g, x, t, w, total, gi, reduction, ignore }
                }
            }
            other => return Err(format!("unknown kernel {other:?}")),
        };
        Ok(k)
    }

    pub fn run(&self, mem: &Mem) -> Result<()> {
        unsafe { self.run_unchecked(mem) }
    }

    unsafe fn run_unchecked(&self, mem: &Mem) -> Result<()> {
        let threads = crate::par::threads();
        match self {
            Kernel::Gemm { a, b, c, bias, res, alpha, beta, epi } => {
                let r = c.rank();
                let (m, k, n) = (a.sizes[r - 2], a.sizes[r - 1], b.sizes[r - 1]);
                let batch = if r == 3 { c.sizes[0] } else { 1 };
                let (pa, pb, pc) = (mem.ptr::<f32>(a), mem.ptr::<f32>(b), mem.ptr::<f32>(c));
                let mat = |p: SPtr<f32>, v: &View, i: usize| {
                    let off = if r == 3 { i * v.strides[0] } else { 0 };
                    Mat { p: SPtr(p.add(off)), rs: v.strides[r - 2] as isize, cs: v.strides[r - 1] as isize }
                };
                let pbias = bias.as_ref().map(|v| (mem.ptr::<f32>(v), v));
                let pres = res.as_ref().map(|v| (mem.ptr::<f32>(v), v));
                let one = |i: usize, t: usize| {
                    // bias and residual are added per output tile, inside the GEMM's store
                    let e = Epi::new(
                        pbias.map(|(p, v)| (mat(p, v, i), *beta)),
                        epi.iter().map(|s| match *s {
                            EpiSpec::Un(u) => EpiOp::Un(u),
                            EpiSpec::Residual => {
                                let (p, v) = pres.expect("checked in Kernel::new");
                                EpiOp::Add(mat(p, v, i), 1.0)
                            }
                        }),
                    );
                    sgemm_epi(m, n, k, mat(pa, a, i), mat(pb, b, i), mat(pc, c, i), *alpha, false, t, &e);
                };
                if batch > 1 && m * n * k < 256 * 256 * 256 {
                    crate::par::for_each(batch, |i| one(i, 1));
                } else {
                    for i in 0..batch {
                        one(i, threads);
                    }
                }
            }
            Kernel::Reduce { kind, x, out } => reduce(mem, *kind, x, out),
            Kernel::Softmax { x, y, dim, log } => {
                let (px, py) = (mem.ptr::<f32>(x), mem.ptr::<f32>(y));
                let n = x.sizes[*dim];
                let (sx, sy) = (x.strides[*dim], y.strides[*dim]);
                let osz = drop_dim(&x.sizes, *dim);
                let (osx, osy) = (drop_dim(&x.strides, *dim), drop_dim(&y.strides, *dim));
                let rows: usize = osz.iter().product();
                let row = |r: usize| {
                    let (bx, by) = (px.add(offset_of(r, &osz, &osx)), py.add(offset_of(r, &osz, &osy)));
                    softmax_row(bx, sx, by, sy, n, *log);
                };
                par_rows(rows, rows * n, row);
            }
            Kernel::SoftmaxBwd { g, y, gi, dim, log } => {
                let (pg, py, po) = (mem.ptr::<f32>(g), mem.ptr::<f32>(y), mem.ptr::<f32>(gi));
                let n = g.sizes[*dim];
                let st = [g.strides[*dim], y.strides[*dim], gi.strides[*dim]];
                let osz = drop_dim(&g.sizes, *dim);
                let os = [drop_dim(&g.strides, *dim), drop_dim(&y.strides, *dim), drop_dim(&gi.strides, *dim)];
                let rows: usize = osz.iter().product();
                par_rows(rows, rows * n, |r| {
                    let bg = pg.add(offset_of(r, &osz, &os[0]));
                    let by = py.add(offset_of(r, &osz, &os[1]));
                    let bo = po.add(offset_of(r, &osz, &os[2]));
                    let mut acc = 0f64;
                    for i in 0..n {
                        let gv = *bg.add(i * st[0]);
                        acc += if *log { gv as f64 } else { (gv * *by.add(i * st[1])) as f64 };
                    }
                    let acc = acc as f32;
                    for i in 0..n {
                        let (gv, yv) = (*bg.add(i * st[0]), *by.add(i * st[1]));
                        *bo.add(i * st[2]) = if *log { gv - mathfn::exp(yv) * acc } else { yv * (gv - acc) };
                    }
                });
            }
            Kernel::LayerNorm { x, w, b, y, mean, rstd, n, eps } => {
                let (px, py, pm, pr) = (mem.ptr::<f32>(x), mem.ptr::<f32>(y), mem.ptr::<f32>(mean), mem.ptr::<f32>(rstd));
                let pw = w.as_ref().map(|v| mem.ptr::<f32>(v));
                let pb = b.as_ref().map(|v| mem.ptr::<f32>(v));
                let n = *n;
                let rows = x.numel() / n;
                par_rows(rows, x.numel(), |r| {
                    let xs = std::slice::from_raw_parts(px.add(r * n), n);
                    let ys = std::slice::from_raw_parts_mut(py.add(r * n), n);
                    let mu = xs.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
                    let var = xs.iter().map(|&v| (v as f64 - mu) * (v as f64 - mu)).sum::<f64>() / n as f64;
                    let rs = 1.0 / (var + *eps as f64).sqrt();
                    let (mu32, rs32) = (mu as f32, rs as f32);
                    for i in 0..n {
                        let mut v = (xs[i] - mu32) * rs32;
                        if let Some(pw) = pw {
                            v *= *pw.add(i);
                        }
                        if let Some(pb) = pb {
                            v += *pb.add(i);
                        }
                        ys[i] = v;
                    }
                    *pm.add(r) = mu32;
                    *pr.add(r) = rs32;
                });
            }
            Kernel::RmsNorm { x, w, y, rstd, n, eps } => {
                let (px, py, pr) = (mem.ptr::<f32>(x), mem.ptr::<f32>(y), mem.ptr::<f32>(rstd));
                let pw = w.as_ref().map(|v| mem.ptr::<f32>(v));
                let n = *n;
                let rows = x.numel() / n;
                par_rows(rows, x.numel(), |r| {
                    let xs = std::slice::from_raw_parts(px.add(r * n), n);
                    let ys = std::slice::from_raw_parts_mut(py.add(r * n), n);
                    let ms = xs.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>() / n as f64;
                    let rs = (1.0 / (ms + *eps as f64).sqrt()) as f32;
                    for i in 0..n {
                        ys[i] = xs[i] * rs * pw.map(|p| *p.add(i)).unwrap_or(1.0);
                    }
                    *pr.add(r) = rs;
                });
            }
            Kernel::Sdpa { q, k, v, mask, o, lse, causal, scale } => crate::attention::sdpa(mem, q, k, v, mask.as_ref(), o, lse, *causal, *scale),
            Kernel::Embedding { w, idx, out } => {
                let (pw, pi, po) = (mem.ptr::<f32>(w), mem.ptr::<i64>(idx), mem.ptr::<f32>(out));
                let (rows, d) = (w.sizes[0] as i64, w.sizes[1]);
                let od = *out.strides.last().unwrap_or(&1);
                let os = &out.strides[..out.rank() - 1];
                let mut bad = None;
                for_each(&idx.sizes, [&idx.strides, os], |[oi, oo]| {
                    let i = *pi.add(oi);
                    if i < 0 || i >= rows {
                        bad = Some(i);
                        return;
                    }
                    let src = pw.add(i as usize * w.strides[0]);
                    for j in 0..d {
                        *po.add(oo + j * od) = *src.add(j * w.strides[1]);
                    }
                });
                if let Some(i) = bad {
                    return Err(format!("embedding index {i} out of range for {rows} rows"));
                }
            }
            Kernel::Index { x, idx, out } => {
                let es = x.dtype.size();
                let (px, po) = (mem.byte_ptr(x), mem.byte_ptr(out));
                let k = idx.len();
                let ptrs: Vec<SPtr<i64>> = idx.iter().map(|v| mem.ptr::<i64>(v)).collect();
                let bshape = &idx[0].sizes;
                let nb: usize = bshape.iter().product();
                let rest = &x.sizes[k..];
                let (xrest, orest) = (&x.strides[k..], &out.strides[bshape.len()..]);
                for lin in 0..nb {
                    let mut base = 0usize;
                    for j in 0..k {
                        let raw = *ptrs[j].add(offset_of(lin, bshape, &idx[j].strides));
                        let dsz = x.sizes[j] as i64;
                        let i = if raw < 0 { raw + dsz } else { raw };
                        if i < 0 || i >= dsz {
                            return Err(format!("index {raw} is out of bounds for dimension {j} with size {dsz}"));
                        }
                        base += i as usize * x.strides[j];
                    }
                    let obase = offset_of(lin, bshape, &out.strides[..bshape.len()]);
                    for_each(rest, [xrest, orest], |[a, b]| {
                        std::ptr::copy_nonoverlapping(px.add((base + a) * es), po.add((obase + b) * es), es);
                    });
                }
            }
            Kernel::Gather { x, idx, out, dim } | Kernel::IndexSelect { x, idx, out, dim } => {
                let gather = matches!(self, Kernel::Gather { .. });
                let es = x.dtype.size();
                let (px, pi, po) = (mem.byte_ptr(x), mem.byte_ptr(idx), mem.byte_ptr(out));
                let idt = idx.dtype;
                let dsz = *x.sizes.get(*dim).unwrap_or(&1) as i64;
                let mut xs = x.strides.clone();
                let xd = xs.get(*dim).copied().unwrap_or(0);
                if !xs.is_empty() {
                    xs[*dim] = 0;
                }
                let istr: Vec<usize> = if gather {
                    idx.strides.clone()
                } else {
                    (0..out.rank()).map(|d| if d == *dim { *idx.strides.first().unwrap_or(&0) } else { 0 }).collect()
                };
                let mut bad = None;
                for_each(&out.sizes, [&xs, &istr, &out.strides], |[a, ii, b]| {
                    let raw = crate::cast::load_i64(pi, idt, ii);
                    let i = if raw < 0 { raw + dsz } else { raw };
                    if i < 0 || i >= dsz {
                        bad = Some(raw);
                        return;
                    }
                    std::ptr::copy_nonoverlapping(px.add((a + i as usize * xd) * es), po.add(b * es), es);
                });
                if let Some(i) = bad {
                    return Err(format!("index {i} is out of bounds for dimension {dim} with size {dsz}"));
                }
            }
            Kernel::Cumsum { x, y, dim } => {
                let n = x.sizes[*dim];
                let (sx, sy) = (x.strides[*dim], y.strides[*dim]);
                let osz = drop_dim(&x.sizes, *dim);
                let (px, py) = (mem.byte_ptr(x), mem.byte_ptr(y));
                for_each(&osz, [&drop_dim(&x.strides, *dim), &drop_dim(&y.strides, *dim)], |[a, b]| {
                    let (mut fa, mut ia) = (0f64, 0i64);
                    for i in 0..n {
                        let xi = a + i * sx;
                        match x.dtype {
                            DType::F32 => fa += *(px as *const f32).add(xi) as f64,
                            DType::I64 => ia = ia.wrapping_add(*(px as *const i64).add(xi)),
                            _ => ia += (*px.add(xi) != 0) as i64,
                        }
                        let yi = b + i * sy;
                        match y.dtype {
                            DType::F32 => *(py as *mut f32).add(yi) = if x.dtype == DType::F32 { fa as f32 } else { ia as f32 },
                            _ => *(py as *mut i64).add(yi) = ia,
                        }
                    }
                });
            }
            Kernel::CumExtreme { x, vals, idx, dim, max } => {
                let n = x.sizes[*dim];
                let (sx, sv, si) = (x.strides[*dim], vals.strides[*dim], idx.strides[*dim]);
                let osz = drop_dim(&x.sizes, *dim);
                let (px, pv, pi) = (mem.ptr::<f32>(x), mem.ptr::<f32>(vals), mem.ptr::<i64>(idx));
                let (rx, rv, ri) = (drop_dim(&x.strides, *dim), drop_dim(&vals.strides, *dim), drop_dim(&idx.strides, *dim));
                for_each(&osz, [&rx[..], &rv[..], &ri[..]], |[a, b, c]| {
                    let (mut best, mut at) = (f32::NAN, 0i64);
                    for i in 0..n {
                        let v = *px.add(a + i * sx);
                        let better = if *max { v >= best } else { v <= best };
                        if i == 0 || v.is_nan() || !best.is_nan() && better {
                            best = v;
                            at = i as i64;
                        }
                        *pv.add(b + i * sv) = best;
                        *pi.add(c + i * si) = at;
                    }
                });
            }
            Kernel::Scan { x, y, dim, mode } => {
                let n = x.sizes[*dim];
                let (sx, sy) = (x.strides[*dim], y.strides[*dim]);
                let osz = drop_dim(&x.sizes, *dim);
                let (px, py) = (mem.ptr::<f32>(x), mem.ptr::<f32>(y));
                for_each(&osz, [&drop_dim(&x.strides, *dim), &drop_dim(&y.strides, *dim)], |[a, b]| {
                    let mut acc = if *mode == 0 { 1f64 } else { f64::NEG_INFINITY };
                    for i in 0..n {
                        let v = *px.add(a + i * sx) as f64;
                        acc = if *mode == 0 {
                            acc * v
                        } else {
                            // log(e^acc + e^v), stable
                            let (hi, lo) = if acc > v { (acc, v) } else { (v, acc) };
                            if lo == f64::NEG_INFINITY || hi.is_nan() || lo.is_nan() {
                                if lo.is_nan() { lo } else { hi }
                            } else if hi == f64::INFINITY {
                                hi
                            } else {
                                hi + (lo - hi).exp().ln_1p()
                            }
                        };
                        *py.add(b + i * sy) = acc as f32;
                    }
                });
            }
            Kernel::Scatter { base, idx, src, out, dim, how, include_self } => {
                crate::indexing::scatter(mem, base, idx, src, out, *dim, *how, *include_self)?;
            }
            Kernel::IndexPut { base, values, idx, out, accumulate } => {
                crate::indexing::index_put(mem, base, values, idx, out, *accumulate)?;
            }
            Kernel::Linalg(l) => l.run(mem)?,
            Kernel::Decomp(k) => k.run(mem)?,
            Kernel::NonzeroStatic(k) => k.run(mem),
            Kernel::Search(k) => k.run(mem)?,
            Kernel::Dist(k) => k.run(mem),
            Kernel::Select(k) => k.run(mem)?,
            Kernel::Resample(k) => k.run(mem),
            Kernel::PoolBwd(k) => k.run(mem)?,
            Kernel::EmbeddingBag { w, idx, offsets, psw, out, mode, include_last, padding } => {
                crate::indexing::embedding_bag(mem, w, idx, offsets, psw.as_ref(), out, *mode, *include_last, *padding)?
            }
            Kernel::Segment(k) => k.run(mem)?,
            Kernel::CheckInfo { info, api } => {
                let p = mem.ptr::<i32>(info);
                let mut bad = 0;
                for_each(&info.sizes, [&info.strides[..]], |[a]| {
                    if bad == 0 {
                        bad = *p.add(a);
                    }
                });
                if bad != 0 {
                    return Err(format!("{api}: the factorization failed (info = {bad}): the input is singular or not positive-definite"));
                }
            }
            Kernel::MaskedScatter { base, mask, src, out } => {
                let es = out.dtype.size();
                let (pb, pm, ps, po) = (mem.byte_ptr(base), mem.byte_ptr(mask), mem.byte_ptr(src), mem.byte_ptr(out));
                let (n, ss) = (src.sizes[0], src.strides[0]);
                let mut k = 0usize;
                for_each(&out.sizes, [&base.strides[..], &mask.strides[..], &out.strides[..]], |[a, m, o]| {
                    let from = if *pm.add(m) != 0 && k < n {
                        k += 1;
                        ps.add((k - 1) * ss * es)
                    } else if *pm.add(m) != 0 {
                        k += 1; // counted: reported below
                        pb.add(a * es)
                    } else {
                        pb.add(a * es)
                    };
                    std::ptr::copy_nonoverlapping(from, po.add(o * es), es);
                });
                if k > n {
                    return Err(format!("masked_scatter: the mask selects {k} elements but source has only {n}"));
                }
            }
            Kernel::Cast { x, y } => crate::cast::cast(mem, x, y),
            Kernel::Cplx(k) => k.run(mem),
            Kernel::Fft(k) => k.run(mem),
            Kernel::Wide(k) => k.run(mem),
            Kernel::Fill { y, value, int } => crate::cast::fill(mem, y, *value, *int),
            Kernel::Sort { x, vals, pos, dim, descending } => {
                crate::indexing::sort(mem, x, vals, pos, *dim, *descending);
            }
            Kernel::Arange { y, start, step } => {
                let p = mem.byte_ptr(y);
                for i in 0..y.sizes[0] {
                    let v = start + step * i as f64;
                    if y.dtype.is_float() {
                        crate::cast::store_f64(p, y.dtype, i * y.strides[0], v);
                    } else {
                        crate::cast::store_i64(p, y.dtype, i * y.strides[0], v as i64);
                    }
                }
            }
            Kernel::Conv2d { x, w, bias, y, p, epi } => crate::conv::conv2d(mem, x, w, bias.as_ref(), y, p, epi, threads),
            Kernel::ConvTranspose2d { x, w, bias, y, p } => crate::conv_transpose::conv_transpose2d(mem, x, w, bias.as_ref(), y, p, threads),
            Kernel::Conv3d { x, w, bias, y, p } => crate::conv3d::conv3d(mem, x, w, bias.as_ref(), y, p, threads),
            Kernel::MaxPool { x, y, idx, p } => crate::conv::max_pool(mem, x, y, idx, p),
            Kernel::AvgPool { x, y, p, include_pad, divisor } => crate::conv::avg_pool(mem, x, y, p, *include_pad, *divisor),
            Kernel::AdaptivePool { x, y, idx } => crate::adaptive_pool::adaptive_pool(mem, x, y, idx.as_ref()),
            Kernel::MaxPool3d { x, y, idx, p } => crate::pool3d::max_pool3d(mem, x, y, idx, p),
            Kernel::AvgPool3d { x, y, p, include_pad, divisor } => crate::pool3d::avg_pool3d(mem, x, y, p, *include_pad, *divisor),
            Kernel::Nll { x, t, w, out, total, reduction, ignore } => {
                let (px, pt, po, ptot) = (mem.ptr::<f32>(x), mem.ptr::<i64>(t), mem.ptr::<f32>(out), mem.ptr::<f32>(total));
                let pw = w.as_ref().map(|v| (mem.ptr::<f32>(v), v.strides[0]));
                let (rows, c) = if x.rank() == 2 { (x.sizes[0], x.sizes[1]) } else { (1, x.sizes[0]) };
                let (rs, cs) = if x.rank() == 2 { (x.strides[0], x.strides[1]) } else { (0, x.strides[0]) };
                let ts = t.strides.first().copied().unwrap_or(0);
                let os = out.strides.first().copied().unwrap_or(0);
                let (mut sum, mut wsum) = (0f64, 0f64);
                for r in 0..rows {
                    let tv = *pt.add(r * ts);
                    let mut loss = 0f32;
                    if tv != *ignore {
                        if tv < 0 || tv as usize >= c {
                            return Err(format!("target {tv} is out of bounds for {c} classes"));
                        }
                        let wv = pw.map(|(p, s)| *p.add(tv as usize * s)).unwrap_or(1.0);
                        loss = -wv * *px.add(r * rs + tv as usize * cs);
                        wsum += wv as f64;
                    }
                    sum += loss as f64;
                    if *reduction == 0 {
                        *po.add(r * os) = loss;
                    }
                }
                match reduction {
                    1 => *po.get() = (sum / wsum) as f32,
                    2 => *po.get() = sum as f32,
                    _ => {}
                }
                *ptot.get() = if *reduction == 0 { 0.0 } else { wsum as f32 };
            }
            Kernel::NllBwd { g, x, t, w, total, gi, reduction, ignore } => {
                let (pg, pt, ptot, po) = (mem.ptr::<f32>(g), mem.ptr::<i64>(t), mem.ptr::<f32>(total), mem.ptr::<f32>(gi));
                let pw = w.as_ref().map(|v| (mem.ptr::<f32>(v), v.strides[0]));
                for_each(&gi.sizes, [&gi.strides], |[o]| *po.add(o) = 0.0);
                let (rows, c) = if x.rank() == 2 { (x.sizes[0], x.sizes[1]) } else { (1, x.sizes[0]) };
                let (rs, cs) = if gi.rank() == 2 { (gi.strides[0], gi.strides[1]) } else { (0, gi.strides[0]) };
                let ts = t.strides.first().copied().unwrap_or(0);
                let gs = g.strides.first().copied().unwrap_or(0);
                let tot = *ptot.get();
                for r in 0..rows {
                    let tv = *pt.add(r * ts);
                    if tv == *ignore {
                        continue;
                    }
                    if tv < 0 || tv as usize >= c {
                        return Err(format!("target {tv} is out of bounds for {c} classes"));
                    }
                    let wv = pw.map(|(p, s)| *p.add(tv as usize * s)).unwrap_or(1.0);
                    let gv = match reduction {
                        0 => *pg.add(r * gs),
                        1 => *pg.get() / tot,
                        _ => *pg.get(),
                    };
                    *po.add(r * rs + tv as usize * cs) = -wv * gv;
                }
            }
        }
        Ok(())
    }
}

/// Runs `row(r)` for every row, in parallel when the work is large enough to pay for it.
fn par_rows(rows: usize, work: usize, row: impl Fn(usize) + Sync) {
    if work >= 1 << 15 && rows > 1 {
        let tasks = (crate::par::threads() * 4).min(rows);
        let per = rows.div_ceil(tasks);
        crate::par::for_each(tasks, |t| (t * per..((t + 1) * per).min(rows)).for_each(&row));
    } else {
        (0..rows).for_each(row);
    }
}

unsafe fn softmax_row(x: *const f32, sx: usize, y: *mut f32, sy: usize, n: usize, log: bool) {
    #[cfg(target_arch = "x86_64")]
    {
        if sx == 1 && sy == 1 {
            if crate::isa::has_avx512() {
                return crate::vmath::softmax_row_avx512(x, y, n, log);
            }
            if crate::isa::has_avx2() {
                return crate::vmath::softmax_row_avx2(x, y, n, log);
            }
        }
        if crate::isa::has_avx2() {
            return softmax_row_avx2(x, sx, y, sy, n, log);
        }
    }
    if sx == 1 && sy == 1 {
        return softmax_row_contig(std::slice::from_raw_parts(x, n), std::slice::from_raw_parts_mut(y, n), log);
    }
    softmax_row_generic(x, sx, y, sy, n, log)
}

const SM_LANES: usize = 16;
const SM_BLOCK: usize = 256;

/// One block of the online softmax statistics (block length a multiple of the lane count).
#[inline(always)]
fn sm_update(block: &[f32], m: &mut [f32; SM_LANES], s: &mut [f32; SM_LANES], nan: &mut [bool; SM_LANES]) {
    const L: usize = SM_LANES;
    let mut bm = [f32::NEG_INFINITY; L];
    for ch in block.chunks_exact(L) {
        for l in 0..L {
            let v = ch[l];
            bm[l] = if v > bm[l] { v } else { bm[l] };
            nan[l] |= v.is_nan();
        }
    }
    let mut mu = [0f32; L];
    for l in 0..L {
        let nm = if bm[l] > m[l] { bm[l] } else { m[l] };
        // an all -inf lane keeps sum 0 (exp(-inf - 0) = 0) instead of exp(-inf + inf) = NaN
        mu[l] = if nm == f32::NEG_INFINITY { 0.0 } else { nm };
        s[l] *= mathfn::exp(m[l] - mu[l]);
        m[l] = nm;
    }
    for ch in block.chunks_exact(L) {
        for l in 0..L {
            s[l] += mathfn::exp(ch[l] - mu[l]);
        }
    }
}

/// Softmax / log-softmax of one contiguous row. The statistics come from one online pass over
/// memory: each 256-element block (in L1 once loaded) updates 16 lane-wise running maxima and
/// rescaled sums; a second pass writes the output. Lane arrays let LLVM keep everything in
/// vector registers in the AVX-512 / AVX2 instantiations.
#[inline(always)]
pub fn softmax_row_contig(x: &[f32], y: &mut [f32], log: bool) {
    const L: usize = SM_LANES;
    let n = x.len();
    if n == 0 {
        return;
    }
    let mut m = [f32::NEG_INFINITY; L];
    let mut s = [0f32; L];
    let mut nan = [false; L];
    let full = n / SM_BLOCK * SM_BLOCK;
    for block in x[..full].chunks_exact(SM_BLOCK) {
        sm_update(block, &mut m, &mut s, &mut nan);
    }
    let rest = &x[full..];
    if !rest.is_empty() {
        let mut pad = [f32::NEG_INFINITY; SM_BLOCK];
        pad[..rest.len()].copy_from_slice(rest);
        sm_update(&pad[..rest.len().div_ceil(L) * L], &mut m, &mut s, &mut nan);
    }
    if nan.iter().any(|&b| b) {
        y.fill(f32::NAN);
        return;
    }
    let mut mx = f32::NEG_INFINITY;
    for &v in &m {
        mx = if v > mx { v } else { mx };
    }
    let mc = if mx == f32::NEG_INFINITY { 0.0 } else { mx };
    let mut sum = 0f32;
    for l in 0..L {
        sum += s[l] * mathfn::exp(m[l] - mc);
    }
    if log {
        let sub = mc + sum.ln();
        for (o, &v) in y.iter_mut().zip(x) {
            *o = v - sub;
        }
    } else {
        let inv = 1.0 / sum;
        for (o, &v) in y.iter_mut().zip(x) {
            *o = mathfn::exp(v - mc) * inv;
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn softmax_row_avx2(x: *const f32, sx: usize, y: *mut f32, sy: usize, n: usize, log: bool) {
    softmax_row_generic(x, sx, y, sy, n, log)
}

#[inline(always)]
unsafe fn softmax_row_generic(x: *const f32, sx: usize, y: *mut f32, sy: usize, n: usize, log: bool) {
    if n == 0 {
        return;
    }
    if sx == 1 && sy == 1 {
        let xs = std::slice::from_raw_parts(x, n);
        let ys = std::slice::from_raw_parts_mut(y, n);
        let mut m = f32::NEG_INFINITY;
        let mut nan = false;
        for &v in xs {
            m = if v > m { v } else { m };
            nan |= v.is_nan();
        }
        if nan {
            ys.fill(f32::NAN);
            return;
        }
        let m = if m == f32::NEG_INFINITY { 0.0 } else { m };
        let mut sum = 0f32;
        for (o, &v) in ys.iter_mut().zip(xs) {
            let e = mathfn::exp(v - m);
            *o = e;
            sum += e;
        }
        if log {
            let l = sum.ln() + m;
            for (o, &v) in ys.iter_mut().zip(xs) {
                *o = v - l;
            }
        } else {
            let inv = 1.0 / sum;
            for o in ys.iter_mut() {
                *o *= inv;
            }
        }
        return;
    }
    let mut m = f32::NEG_INFINITY;
    let mut nan = false;
    for i in 0..n {
        let v = *x.add(i * sx);
        m = if v > m { v } else { m };
        nan |= v.is_nan();
    }
    if nan {
        for i in 0..n {
            *y.add(i * sy) = f32::NAN;
        }
        return;
    }
    let m = if m == f32::NEG_INFINITY { 0.0 } else { m };
    let mut sum = 0f32;
    for i in 0..n {
        let e = mathfn::exp(*x.add(i * sx) - m);
        *y.add(i * sy) = e;
        sum += e;
    }
    let l = sum.ln() + m;
    for i in 0..n {
        *y.add(i * sy) = if log { *x.add(i * sx) - l } else { *y.add(i * sy) / sum };
    }
}

/// # Safety
/// `x` and `out` must be views validated against the buffers of `mem`.
pub unsafe fn reduce(mem: &Mem, kind: Red, x: &View, out: &View) {
    let nd = x.rank();
    let red: Vec<usize> = (0..nd).filter(|&d| out.sizes[d] == 1 && x.sizes[d] != 1).collect();
    let rsz: Vec<usize> = red.iter().map(|&d| x.sizes[d]).collect();
    let rst: Vec<usize> = red.iter().map(|&d| x.strides[d]).collect();
    let n: usize = rsz.iter().product();
    let outer: usize = out.numel();
    let xk: Vec<usize> = (0..nd).map(|d| if red.contains(&d) { 0 } else { x.strides[d] }).collect();
    if matches!(kind, Red::Sum | Red::Mean) && x.dtype == DType::F32 && out.dtype == DType::F32 && n > 0 {
        // the kept dims form one contiguous run in x and in out (a bias gradient: the sum over
        // the rows of a matrix): add whole rows into float64 accumulators, vectorised, instead
        // of walking each output's strided column
        let kept: Vec<usize> = (0..nd).filter(|&d| !red.contains(&d) && x.sizes[d] != 1).collect();
        let run = |strides: &[usize]| {
            let mut acc = 1;
            for &d in kept.iter().rev() {
                if strides[d] != acc {
                    return false;
                }
                acc *= x.sizes[d];
            }
            true
        };
        if !kept.is_empty() && run(&x.strides) && run(&out.strides) {
            let (xf, of) = (SPtr(mem.byte_ptr(x) as *mut f32), SPtr(mem.byte_ptr(out) as *mut f32));
            const CH: usize = 512;
            let scale = if kind == Red::Mean { 1.0 / n as f64 } else { 1.0 };
            let chunk = |c: usize| {
                let (lo, hi) = (c * CH, ((c + 1) * CH).min(outer));
                let mut acc = [0f64; CH];
                let acc = &mut acc[..hi - lo];
                for_each(&rsz, [&rst], |[off]| {
                    let row = std::slice::from_raw_parts(xf.get().add(off + lo), hi - lo);
                    for (a, &v) in acc.iter_mut().zip(row) {
                        *a += v as f64;
                    }
                });
                for (j, &a) in acc.iter().enumerate() {
                    *of.get().add(lo + j) = (a * scale) as f32;
                }
            };
            par_rows(outer.div_ceil(CH), outer * n, chunk);
            return;
        }
    }
    let px = mem.byte_ptr(x);
    let po = SPtr(mem.byte_ptr(out));
    let px = SPtr(px);
    let one = |o: usize| {
        let xb = offset_of(o, &out.sizes, &xk);
        let ob = offset_of(o, &out.sizes, &out.strides);
        let xf = px.get() as *const f32;
        let mut vals = Vec::new();
        let get = |f: &mut dyn FnMut(usize, f32)| {
            let mut i = 0;
            for_each(&rsz, [&rst], |[off]| {
                f(i, *xf.add(xb + off));
                i += 1;
            });
        };
        let r: f64 = match kind {
            Red::Sum | Red::Mean => {
                let mut s = 0f64;
                get(&mut |_, v| s += v as f64);
                if kind == Red::Mean {
                    s / n as f64
                } else {
                    s
                }
            }
            Red::Prod => {
                let mut s = 1f64;
                get(&mut |_, v| s *= v as f64);
                s
            }
            Red::Amax | Red::Amin | Red::Argmax | Red::Argmin => {
                let maxish = matches!(kind, Red::Amax | Red::Argmax);
                let (mut best, mut at) = (if maxish { f32::NEG_INFINITY } else { f32::INFINITY }, 0usize);
                let mut first = true;
                get(&mut |i, v| {
                    let better = if best.is_nan() {
                        false
                    } else if v.is_nan() {
                        true
                    } else if maxish {
                        v > best
                    } else {
                        v < best
                    };
                    if first || better {
                        best = v;
                        at = i;
                        first = false;
                    }
                });
                if matches!(kind, Red::Argmax | Red::Argmin) {
                    *(po.get() as *mut i64).add(ob) = at as i64;
                    return;
                }
                best as f64
            }
            Red::Var(corr) => {
                get(&mut |_, v| vals.push(v as f64));
                let mu = vals.iter().sum::<f64>() / n as f64;
                let ss: f64 = vals.iter().map(|v| (v - mu) * (v - mu)).sum();
                let d = n as f64 - corr;
                if d <= 0.0 {
                    f64::NAN
                } else {
                    ss / d
                }
            }
            Red::LogSumExp => {
                get(&mut |_, v| vals.push(v as f64));
                let m = vals.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                if vals.iter().any(|v| v.is_nan()) {
                    f64::NAN
                } else if m.is_infinite() {
                    m
                } else {
                    m + vals.iter().map(|v| (v - m).exp()).sum::<f64>().ln()
                }
            }
            Red::Any | Red::All => {
                let (mut any, mut all) = (false, true);
                get(&mut |_, v| {
                    any |= v != 0.0;
                    all &= v != 0.0;
                });
                *po.add(ob) = if kind == Red::Any { any } else { all } as u8;
                return;
            }
        };
        *(po.get() as *mut f32).add(ob) = r as f32;
    };
    par_rows(outer, outer * n.max(1), one);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(x: &[f32], log: bool) -> Vec<f32> {
        let m = x.iter().cloned().fold(f64::NEG_INFINITY, |a, b| a.max(b as f64));
        let s: f64 = x.iter().map(|&v| (v as f64 - m).exp()).sum();
        x.iter().map(|&v| if log { (v as f64 - m - s.ln()) as f32 } else { ((v as f64 - m).exp() / s) as f32 }).collect()
    }

    #[test]
    fn online_softmax_matches_two_pass_reference() {
        for &n in &[1usize, 5, 16, 17, 255, 256, 257, 1000, 2048, 4099] {
            let x: Vec<f32> = (0..n).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.3 + (i as f32 * 0.01)).collect();
            for log in [false, true] {
                let want = reference(&x, log);
                let mut y = vec![0f32; n];
                unsafe { softmax_row(x.as_ptr(), 1, y.as_mut_ptr(), 1, n, log) };
                for (i, (a, b)) in y.iter().zip(&want).enumerate() {
                    assert!((a - b).abs() <= 1e-5 + 1e-5 * b.abs(), "n={n} log={log} [{i}] {a} vs {b}");
                }
                // the portable lane-array version (AVX2 / other CPUs)
                softmax_row_contig(&x, &mut y, log);
                for (i, (a, b)) in y.iter().zip(&want).enumerate() {
                    assert!((a - b).abs() <= 1e-5 + 1e-5 * b.abs(), "lanes n={n} log={log} [{i}] {a} vs {b}");
                }
                // strided row, generic path
                let xs: Vec<f32> = x.iter().flat_map(|&v| [v, 0.0]).collect();
                let mut ys = vec![0f32; 2 * n];
                unsafe { softmax_row(xs.as_ptr(), 2, ys.as_mut_ptr(), 2, n, log) };
                for i in 0..n {
                    assert!((ys[2 * i] - want[i]).abs() <= 1e-5 + 1e-5 * want[i].abs());
                }
            }
        }
    }

    #[test]
    fn softmax_special_values() {
        let mut y = vec![0f32; 300];
        let mut x = vec![f32::NEG_INFINITY; 300];
        x[299] = 1.0;
        unsafe { softmax_row(x.as_ptr(), 1, y.as_mut_ptr(), 1, 300, false) };
        assert_eq!(y[299], 1.0);
        assert!(y[..299].iter().all(|&v| v == 0.0));
        x[299] = f32::NEG_INFINITY;
        unsafe { softmax_row(x.as_ptr(), 1, y.as_mut_ptr(), 1, 300, false) };
        assert!(y.iter().all(|v| v.is_nan()), "all -inf row is NaN like torch");
        let mut x = [0.5f32; 40];
        x[33] = f32::NAN;
        unsafe { softmax_row(x.as_ptr(), 1, y.as_mut_ptr(), 1, 40, true) };
        assert!(y[..40].iter().all(|v| v.is_nan()));
    }
}
