//! Non-elementwise kernels: GEMM family, reductions, softmax, norms, attention, indexing,
//! convolution, pooling, losses. `Kernel::new` checks every shape relation a kernel relies on,
//! so `run` only indexes inside validated views.

use crate::core::math::unary::Un;
use crate::core::tensor::{need, DType, Result, View};
use crate::kernels::gemm::EpiSpec;
use crate::kernels::reduce::Red;
use super::step::StepKind;

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
    Scatter { base: View, idx: View, src: View, out: View, dim: usize, how: crate::kernels::indexing::Combine, include_self: bool },
    IndexPut { base: View, values: View, idx: Vec<View>, out: View, accumulate: bool },
    Sort { x: View, vals: View, pos: View, dim: usize, descending: bool },
    Arange { y: View, start: f64, step: f64 },
    Conv2d { x: View, w: View, bias: Option<View>, y: View, p: [usize; 7], epi: Vec<Un> },
    ConvTranspose2d { x: View, w: View, bias: Option<View>, y: View, p: [usize; 7] },
    Conv3d { x: View, w: View, bias: Option<View>, y: View, p: crate::kernels::conv::conv3d::Params },
    MaxPool { x: View, y: View, idx: View, p: [usize; 8] },
    AvgPool { x: View, y: View, p: [usize; 6], include_pad: bool, divisor: usize },
    AdaptivePool { x: View, y: View, idx: Option<View> },
    MaxPool3d { x: View, y: View, idx: View, p: crate::kernels::conv::pool3d::MaxParams },
    AvgPool3d { x: View, y: View, p: crate::kernels::conv::pool3d::AvgParams, include_pad: bool, divisor: usize },
    Nll { x: View, t: View, w: Option<View>, out: View, total: View, reduction: i64, ignore: i64 },
    NllBwd { g: View, x: View, t: View, w: Option<View>, total: View, gi: View, reduction: i64, ignore: i64 },
    Linalg(Box<crate::kernels::linalg::Linalg>),
    /// QR, SVD, symmetric eigen and what is built on them (linalg_decomp.rs)
    Decomp(Box<crate::kernels::linalg::decomp::Decomp>),
    NonzeroStatic(Box<crate::kernels::indexing::nonzero_static::NonzeroStatic>),
    /// a copy that converts between any two dtypes the executor carries
    Cast { x: View, y: View },
    /// complex constructors and elementwise ops (complex, polar, conj, angle)
    Cplx(Box<crate::kernels::complex::Cplx>),
    /// discrete Fourier transforms (r2c, c2c, c2r)
    Fft(Box<crate::kernels::complex::fft::Fft>),
    /// float64 softmax and exact integer reductions
    Wide(Box<crate::kernels::wide_math::Wide>),
    Fill { y: View, value: f64, int: Option<i64> },
    Search(Box<crate::kernels::indexing::search::Search>),
    Dist(Box<crate::kernels::linalg::dist::Dist>),
    Select(Box<crate::kernels::indexing::select::Select>),
    Resample(Box<crate::kernels::conv::upsample::Resample>),
    PoolBwd(Box<crate::kernels::indexing::segment::PoolBwd>),
    EmbeddingBag { w: View, idx: View, offsets: View, psw: Option<View>, out: View, mode: i64, include_last: bool, padding: i64 },
    Segment(Box<crate::kernels::indexing::segment::Segment>),
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

fn uint(v: i64, what: &str) -> Result<usize> {
    usize::try_from(v).map_err(|_| format!("{what} must be non-negative"))
}

/// `n` non-negative sizes (a window's kernel, stride, padding or dilation per spatial dim).
fn uints<const N: usize>(v: &[i64], what: &str) -> Result<[usize; N]> {
    need(v.len() == N, &format!("{what} needs {N} entries"))?;
    let mut out = [0usize; N];
    for (o, &x) in out.iter_mut().zip(v) {
        *o = uint(x, what)?;
    }
    Ok(out)
}

fn dim(d: i64, rank: usize) -> Result<usize> {
    let r = rank as i64;
    let d = if d < 0 { d + r } else { d };
    need(d >= 0 && d < r.max(1), "dimension out of range")?;
    Ok(d as usize)
}

/// A pooling step's window as the kernels read it: kernel, stride, padding (and for max pooling
/// dilation) per spatial dim, then count_include_pad and the divisor of average pooling.
fn pool_window<const N: usize>(kind: &StepKind) -> Result<(Vec<usize>, bool, usize)> {
    let (kernel, stride, padding, rest) = match kind {
        StepKind::MaxPool2d { kernel, stride, padding, dilation } | StepKind::MaxPool3d { kernel, stride, padding, dilation } => {
            (kernel, stride, padding, Some(dilation))
        }
        StepKind::AvgPool2d { kernel, stride, padding, .. } | StepKind::AvgPool3d { kernel, stride, padding, .. } => (kernel, stride, padding, None),
        _ => return Err("not a pooling step".into()),
    };
    let mut window = [uints::<N>(kernel, "pool kernel")?, uints(stride, "pool stride")?, uints(padding, "pool padding")?].concat();
    if let Some(d) = rest {
        window.extend(uints::<N>(d, "pool dilation")?);
    }
    let (include_pad, divisor) = match kind {
        StepKind::AvgPool2d { count_include_pad, divisor, .. } | StepKind::AvgPool3d { count_include_pad, divisor, .. } => {
            (*count_include_pad, uint(*divisor, "divisor_override")?)
        }
        _ => (false, 0),
    };
    Ok((window, include_pad, divisor))
}

impl Kernel {
    /// Builds the kernel of one parsed step, checking every shape relation its run relies on.
    /// Kernel families with their own constructors (complex, FFT, wide dtypes, search,
    /// distances, resampling, segments, linear algebra) read the step's parameters in declaration
    /// order (`StepKind::params`); the others read them by name here.
    pub fn new(kind: &StepKind, ins: Vec<Option<View>>, outs: Vec<View>, epi: Vec<EpiSpec>) -> Result<Kernel> {
        let op = kind.tag();
        let (ints, floats) = kind.params();
        let (ints, floats) = (ints.as_slice(), floats.as_slice());
        // complex kernels take their own dtypes (checked in complex.rs / fft.rs)
        match op {
            "complex" | "polar" | "conj" | "angle" | "imag" => return Ok(Kernel::Cplx(Box::new(crate::kernels::complex::Cplx::new(op, &ins, &outs)?))),
            "fft_r2c" | "fft_c2c" | "fft_c2r" => return Ok(Kernel::Fft(Box::new(crate::kernels::complex::fft::Fft::new(op, &ins, &outs, ints)?))),
            "softmax64" | "log_softmax64" | "ireduce" | "ew64" => return Ok(Kernel::Wide(Box::new(crate::kernels::wide_math::Wide::new(op, &ins, &outs, ints, floats)?))),
            _ => {}
        }
        // only these kernels read or write the storage-only dtypes (float64, int32, ...)
        let wide = matches!(op, "cast" | "fill" | "arange" | "gather" | "lu_factor" | "lu_unpack" | "lu" | "lu_solve" | "det" | "slogdet" | "cholesky" | "tri_solve" | "searchsorted" | "frexp" | "check_info" | "scatter" | "index_put" | "segment_reduce");
        if !wide && ins.iter().flatten().chain(&outs).any(|v| !v.dtype.is_core()) {
            return Err(format!("kernel {op} takes float32, int64 and bool only"));
        }
        let k = match kind {
            StepKind::Cast {} => {
                let (x, y) = (take(&ins, 0)?, out(&outs, 0)?);
                crate::kernels::cast::check_cast(&x, &y)?;
                Kernel::Cast { x, y }
            }
            StepKind::Fill { mode, integer, value } => {
                let y = out(&outs, 0)?;
                // mode 0: the float, 1: the integer (exact for any int64), 2..4: NaN, +inf, -inf
                let (value, int) = match *mode {
                    0 => (*value, None),
                    1 => (0.0, Some(*integer)),
                    2 => (f64::NAN, None),
                    3 => (f64::INFINITY, None),
                    4 => (f64::NEG_INFINITY, None),
                    m => return Err(format!("unknown fill mode {m}")),
                };
                Kernel::Fill { y, value, int }
            }
            StepKind::Searchsorted { .. } | StepKind::Histc { .. } | StepKind::Frexp {} => Kernel::Search(Box::new(crate::kernels::indexing::search::Search::new(op, &ins, &outs, ints, floats)?)),
            StepKind::Cdist { .. } | StepKind::Pdist { .. } | StepKind::Dist { .. } => Kernel::Dist(Box::new(crate::kernels::linalg::dist::Dist::new(op, &ins, &outs, floats)?)),
            StepKind::MedianDim { dim: d } | StepKind::NanmedianDim { dim: d } | StepKind::Mode { dim: d } => {
                let (x, v, i) = (take(&ins, 0)?, out(&outs, 0)?, out(&outs, 1)?);
                let d = dim(*d, x.rank())?;
                Kernel::Select(Box::new(crate::kernels::indexing::select::Select::new(op, x, v, i, d)?))
            }
            StepKind::UpsampleLinear { .. } | StepKind::UpsampleCubic { .. } | StepKind::GridSampler2d { .. } | StepKind::GridSampler3d { .. } => {
                Kernel::Resample(Box::new(crate::kernels::conv::upsample::Resample::new(op, &ins, &outs, ints, floats)?))
            }
            StepKind::EmbeddingBag { mode, include_last_offset, padding_idx } => {
                let (w, idx, offsets, o) = (take(&ins, 0)?, take(&ins, 1)?, take(&ins, 2)?, out(&outs, 0)?);
                let psw = opt(&ins, 3);
                f32s(&[&w, &o])?;
                need(w.rank() == 2 && o.rank() == 2 && o.sizes[1] == w.sizes[1], "embedding_bag: 2-d weight and output")?;
                need(idx.dtype == DType::I64 && offsets.dtype == DType::I64 && idx.rank() == 1 && offsets.rank() == 1, "embedding_bag: 1-d int64 indices and offsets")?;
                let (mode, include_last, padding) = (*mode, *include_last_offset, *padding_idx);
                need((0..=2).contains(&mode), "embedding_bag mode")?;
                need(o.sizes[0] == offsets.sizes[0] - (include_last && offsets.sizes[0] > 0) as usize, "embedding_bag: number of bags")?;
                if let Some(p) = &psw {
                    need(p.dtype == DType::F32 && p.sizes == idx.sizes && mode == 0, "embedding_bag per-sample weights (sum mode only)")?;
                }
                Kernel::EmbeddingBag { w, idx, offsets, psw, out: o, mode, include_last, padding }
            }
            StepKind::MaxPool2dBwd {} => Kernel::PoolBwd(Box::new(crate::kernels::indexing::segment::PoolBwd::new(&ins, &outs)?)),
            StepKind::NonzeroStatic { fill_value } => {
                let (x, y) = (take(&ins, 0)?, out(&outs, 0)?);
                Kernel::NonzeroStatic(Box::new(crate::kernels::indexing::nonzero_static::NonzeroStatic::new(x, y, *fill_value)?))
            }
            StepKind::SegmentReduce { .. } => Kernel::Segment(Box::new(crate::kernels::indexing::segment::Segment::new(&ins, &outs, ints, floats)?)),
            StepKind::CheckInfo {} => {
                let info = take(&ins, 0)?;
                need(info.dtype == DType::I32, "linalg info is int32")?;
                Kernel::CheckInfo { info, api: "linalg".into() }
            }
            StepKind::MaskedScatter {} => {
                let (base, mask, src, o) = (take(&ins, 0)?, take(&ins, 1)?, take(&ins, 2)?, out(&outs, 0)?);
                need(mask.dtype == DType::Bool && base.dtype == o.dtype && src.dtype == o.dtype, "masked_scatter dtypes")?;
                need(mask.sizes == o.sizes && base.sizes == o.sizes && src.rank() == 1, "masked_scatter shapes")?;
                Kernel::MaskedScatter { base, mask, src, out: o }
            }
            StepKind::LuFactor { .. } | StepKind::LuUnpack { .. } | StepKind::Lu {} | StepKind::LuSolve { .. } | StepKind::Det {} | StepKind::Slogdet {} | StepKind::Cholesky { .. } | StepKind::TriSolve { .. } => {
                Kernel::Linalg(Box::new(crate::kernels::linalg::Linalg::new(op, ins, outs, ints)?))
            }
            StepKind::Geqrf {} | StepKind::Orgqr {} | StepKind::Ormqr { .. } | StepKind::Qr { .. } | StepKind::Svd { .. } | StepKind::Eigh { .. } | StepKind::Pinv { .. } | StepKind::LinalgPolar {} | StepKind::Sqrth {} | StepKind::MatrixExp {} => {
                Kernel::Decomp(Box::new(crate::kernels::linalg::decomp::Decomp::new(op, ins, outs, ints)?))
            }
            StepKind::Gemm { alpha, beta, .. } => {
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
                need(epi.len() <= crate::kernels::gemm::MAX_EPI, "too many GEMM epilogue steps")?;
                Kernel::Gemm { a, b, c, bias, res, alpha: *alpha as f32, beta: *beta as f32, epi }
            }
            StepKind::Reduce { kind, mask, correction } => {
                let (x, o) = (take(&ins, 0)?, out(&outs, 0)?);
                need(x.rank() == o.rank(), "reduction output must keep the reduced dims")?;
                for d in 0..x.rank() {
                    need(o.sizes[d] == x.sizes[d] || o.sizes[d] == 1, "reduction shapes do not agree")?;
                }
                let kind = match *kind {
                    0 => Red::Sum,
                    1 => Red::Mean,
                    2 => Red::Amax,
                    3 => Red::Amin,
                    4 => Red::Argmax,
                    5 => Red::Argmin,
                    6 => Red::Var(*correction),
                    7 => Red::Prod,
                    8 => Red::LogSumExp,
                    9 => Red::Any,
                    10 => Red::All,
                    k => return Err(format!("unknown reduction {k}")),
                };
                let reduced: Vec<bool> = mask.iter().map(|&v| v != 0).collect();
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
            StepKind::Softmax { dim: d } | StepKind::LogSoftmax { dim: d } => {
                let (x, y) = (take(&ins, 0)?, out(&outs, 0)?);
                f32s(&[&x, &y])?;
                need(x.sizes == y.sizes, "softmax shapes differ")?;
                need(x.rank() >= 1, "softmax of a 0-d tensor (view it as 1-d)")?;
                let d = dim(*d, x.rank())?;
                Kernel::Softmax { x, y, dim: d, log: matches!(kind, StepKind::LogSoftmax { .. }) }
            }
            StepKind::SoftmaxBwd { dim: d } | StepKind::LogSoftmaxBwd { dim: d } => {
                let (g, y, gi) = (take(&ins, 0)?, take(&ins, 1)?, out(&outs, 0)?);
                f32s(&[&g, &y, &gi])?;
                need(g.sizes == y.sizes && y.sizes == gi.sizes, "softmax backward shapes differ")?;
                let d = dim(*d, g.rank())?;
                Kernel::SoftmaxBwd { g, y, gi, dim: d, log: matches!(kind, StepKind::LogSoftmaxBwd { .. }) }
            }
            StepKind::LayerNorm { n, eps } | StepKind::RmsNorm { n, eps } => {
                let x = take(&ins, 0)?;
                let y = out(&outs, 0)?;
                let n = uint(*n, "normalized size")?;
                f32s(&[&x, &y])?;
                need(x.is_contiguous() && y.is_contiguous() && x.sizes == y.sizes, "norm needs contiguous input/output")?;
                need(n > 0 && x.numel() % n == 0, "normalized size does not divide the input")?;
                let rows = x.numel() / n;
                let w = opt(&ins, 1);
                for p in w.iter().chain(opt(&ins, 2).iter()) {
                    f32s(&[p])?;
                    need(p.is_contiguous() && p.numel() == n, "norm weight/bias must have the normalized shape")?;
                }
                let eps = *eps as f32;
                if matches!(kind, StepKind::LayerNorm { .. }) {
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
            StepKind::Sdpa { causal, scale } => {
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
                Kernel::Sdpa { q, k, v, mask, o, lse, causal: *causal, scale: *scale as f32 }
            }
            StepKind::Embedding {} => {
                let (w, idx, o) = (take(&ins, 0)?, take(&ins, 1)?, out(&outs, 0)?);
                f32s(&[&w, &o])?;
                need(w.rank() == 2 && idx.dtype == DType::I64, "embedding takes a 2-d weight and int64 indices")?;
                let mut expect = idx.sizes.clone();
                expect.push(w.sizes[1]);
                need(o.sizes == expect, "embedding output shape")?;
                Kernel::Embedding { w, idx, out: o }
            }
            StepKind::Index {} => {
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
            StepKind::Gather { dim: d } | StepKind::IndexSelect { dim: d } => {
                let gather = matches!(kind, StepKind::Gather { .. });
                let (x, idx, o) = (take(&ins, 0)?, take(&ins, 1)?, out(&outs, 0)?);
                let d = dim(*d, x.rank())?;
                need(matches!(idx.dtype, DType::I64 | DType::I32) && o.dtype == x.dtype && o.rank() == x.rank().max(1), "gather dtypes/rank")?;
                need(x.dtype.is_core() && (gather || idx.dtype == DType::I64), "gather dtypes")?;
                if gather {
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
            StepKind::Cumsum { dim: d } => {
                let (x, y) = (take(&ins, 0)?, out(&outs, 0)?);
                need(x.sizes == y.sizes, "cumsum shapes")?;
                need(y.dtype != DType::Bool && !(y.dtype == DType::I64 && x.dtype == DType::F32), "cumsum dtypes")?;
                need(x.rank() >= 1, "cumsum of a 0-d tensor (view it as 1-d)")?;
                Kernel::Cumsum { dim: dim(*d, x.rank())?, x, y }
            }
            StepKind::Cummax { dim: d } | StepKind::Cummin { dim: d } => {
                let (x, vals, idx) = (take(&ins, 0)?, out(&outs, 0)?, out(&outs, 1)?);
                f32s(&[&x, &vals])?;
                need(x.sizes == vals.sizes && x.sizes == idx.sizes && x.rank() >= 1, "cummax/cummin shapes")?;
                need(idx.dtype == DType::I64, "cummax/cummin indices are int64")?;
                Kernel::CumExtreme { dim: dim(*d, x.rank())?, x, vals, idx, max: matches!(kind, StepKind::Cummax { .. }) }
            }
            StepKind::Scan { dim: d, mode } => {
                let (x, y) = (take(&ins, 0)?, out(&outs, 0)?);
                f32s(&[&x, &y])?;
                need(x.sizes == y.sizes && x.rank() >= 1, "scan shapes")?;
                need((0..=1).contains(mode), "scan mode")?;
                Kernel::Scan { dim: dim(*d, x.rank())?, x, y, mode: *mode }
            }
            StepKind::Scatter { dim: d, how, include_self } => {
                let (base, idx, src, o) = (take(&ins, 0)?, take(&ins, 1)?, take(&ins, 2)?, out(&outs, 0)?);
                need(o.sizes == base.sizes && o.dtype == base.dtype && src.dtype == o.dtype, "scatter output")?;
                need(matches!(idx.dtype, DType::I64 | DType::I32) && idx.rank() == o.rank() && src.rank() == o.rank(), "scatter index rank")?;
                need(base.dtype.is_core() && src.dtype.is_core() && o.dtype.is_core(), "scatter takes float32, int64 and bool")?;
                let d = dim(*d, o.rank())?;
                for i in 0..o.rank() {
                    need(idx.sizes[i] <= src.sizes[i], "scatter index larger than src")?;
                    need(i == d || idx.sizes[i] <= o.sizes[i], "scatter index larger than self")?;
                }
                let how = crate::kernels::indexing::Combine::from_code(*how)?;
                need(o.dtype == DType::F32 || !matches!(how, crate::kernels::indexing::Combine::Mean) || o.dtype == DType::I64, "scatter mean dtype")?;
                Kernel::Scatter { base, idx, src, out: o, dim: d, how, include_self: *include_self }
            }
            StepKind::IndexPut { accumulate } => {
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
                Kernel::IndexPut { base, values, idx, out: o, accumulate: *accumulate }
            }
            StepKind::Sort { dim: d, descending } => {
                let (x, vals, pos) = (take(&ins, 0)?, out(&outs, 0)?, out(&outs, 1)?);
                need(x.rank() >= 1 && vals.sizes == x.sizes && pos.sizes == x.sizes, "sort shapes")?;
                need(vals.dtype == x.dtype && pos.dtype == DType::I64, "sort dtypes")?;
                Kernel::Sort { dim: dim(*d, x.rank())?, x, vals, pos, descending: *descending }
            }
            StepKind::Arange { start, step } => {
                let y = out(&outs, 0)?;
                need(y.rank() == 1 && y.dtype != DType::Bool, "arange output")?;
                Kernel::Arange { y, start: *start, step: *step }
            }
            StepKind::Conv2d { stride, padding, dilation, groups } => {
                let (x, w, y) = (take(&ins, 0)?, take(&ins, 1)?, out(&outs, 0)?);
                let bias = opt(&ins, 2);
                f32s(&[&x, &w, &y])?;
                need(x.rank() == 4 && w.rank() == 4 && y.rank() == 4, "conv2d takes 4-d tensors")?;
                let ([sh, sw], [ph, pw], [dh, dw]) = (uints(stride, "stride")?, uints(padding, "padding")?, uints(dilation, "dilation")?);
                let g = uint(*groups, "groups")?;
                let p: [usize; 7] = [sh, sw, ph, pw, dh, dw, g];
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
            StepKind::Conv3d { stride, padding, dilation, groups } => {
                let (x, w, y) = (take(&ins, 0)?, take(&ins, 1)?, out(&outs, 0)?);
                let bias = opt(&ins, 2);
                f32s(&[&x, &w, &y])?;
                need(x.rank() == 5 && w.rank() == 5 && y.rank() == 5, "conv3d takes 5-d tensors")?;
                let v: Vec<usize> = [uints::<3>(stride, "stride")?, uints(padding, "padding")?, uints(dilation, "dilation")?].concat().into_iter().chain([uint(*groups, "groups")?]).collect();
                need(v[..3].iter().chain(&v[6..]).all(|&u| u > 0), "conv3d stride/dilation/groups must be positive")?;
                let g = v[9];
                let (c, oc, cg) = (x.sizes[1], w.sizes[0], w.sizes[1]);
                need(c == cg * g && oc % g == 0 && w.sizes[2..].iter().all(|&k| k > 0), "conv3d channel counts")?;
                let mut expect = vec![x.sizes[0], oc];
                for d in 0..3 {
                    expect.push(crate::kernels::conv::conv3d::out_len(x.sizes[2 + d], w.sizes[2 + d], v[d], v[3 + d], v[6 + d]).ok_or("conv3d kernel larger than input")?);
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
            StepKind::ConvTranspose2d { stride, padding, dilation, groups, output_padding } => {
                let (x, w, y) = (take(&ins, 0)?, take(&ins, 1)?, out(&outs, 0)?);
                let bias = opt(&ins, 2);
                f32s(&[&x, &w, &y])?;
                need(x.rank() == 4 && w.rank() == 4 && y.rank() == 4, "conv_transpose2d takes 4-d tensors")?;
                let ([sh, sw], [ph, pw], [dh, dw]) = (uints(stride, "stride")?, uints(padding, "padding")?, uints(dilation, "dilation")?);
                let ([oph, opw], g) = (uints(output_padding, "output_padding")?, uint(*groups, "groups")?);
                need(sh > 0 && sw > 0 && dh > 0 && dw > 0 && g > 0, "conv_transpose2d stride/dilation/groups must be positive")?;
                let (n, c, hh, ww) = (x.sizes[0], x.sizes[1], x.sizes[2], x.sizes[3]);
                let (wc, ocg, kh, kw) = (w.sizes[0], w.sizes[1], w.sizes[2], w.sizes[3]);
                need(wc == c && c % g == 0 && kh > 0 && kw > 0, "conv_transpose2d channel counts")?;
                need(oph < sh.max(dh) && opw < sw.max(dw), "conv_transpose2d output padding must be smaller than stride or dilation")?;
                let oh = crate::kernels::conv::conv_transpose::out_len(hh, sh, ph, dh, kh, oph).ok_or("conv_transpose2d output height is not positive")?;
                let ow = crate::kernels::conv::conv_transpose::out_len(ww, sw, pw, dw, kw, opw).ok_or("conv_transpose2d output width is not positive")?;
                need(y.sizes == [n, ocg * g, oh, ow], "conv_transpose2d output shape")?;
                need(w.strides[2] == kw * w.strides[3] && w.strides[1] == kh * w.strides[2] || ocg * kh * kw == 1, "conv_transpose2d weight layout")?;
                if let Some(b) = &bias {
                    need(b.sizes == [ocg * g] && b.dtype == DType::F32, "conv_transpose2d bias shape")?;
                }
                let p = [sh, sw, ph, pw, dh, dw, g];
                Kernel::ConvTranspose2d { x, w, bias, y, p }
            }
            StepKind::MaxPool2d { .. } | StepKind::AvgPool2d { .. } => {
                let (x, y) = (take(&ins, 0)?, out(&outs, 0)?);
                f32s(&[&x, &y])?;
                need(x.rank() == 4 && y.rank() == 4 && x.sizes[..2] == y.sizes[..2], "pool takes 4-d tensors")?;
                let (window, include_pad, divisor) = pool_window::<2>(kind)?;
                let vals: Vec<usize> = window;
                need(vals[0] > 0 && vals[1] > 0 && vals[2] > 0 && vals[3] > 0, "pool kernel/stride must be positive")?;
                need(vals[4] <= vals[0] / 2 && vals[5] <= vals[1] / 2, "pool padding larger than half the kernel")?;
                if matches!(kind, StepKind::MaxPool2d { .. }) {
                    let idx = out(&outs, 1)?;
                    need(idx.sizes == y.sizes && idx.dtype == DType::I64, "max_pool2d indices")?;
                    need(vals[6] > 0 && vals[7] > 0, "pool dilation must be positive")?;
                    let mut p = [0usize; 8];
                    p.copy_from_slice(&vals);
                    Kernel::MaxPool { x, y, idx, p }
                } else {
                    let mut p = [0usize; 6];
                    p.copy_from_slice(&vals);
                    Kernel::AvgPool { x, y, p, include_pad, divisor }
                }
            }
            StepKind::MaxPool3d { .. } | StepKind::AvgPool3d { .. } => {
                let (x, y) = (take(&ins, 0)?, out(&outs, 0)?);
                f32s(&[&x, &y])?;
                need(x.rank() == 5 && y.rank() == 5 && x.sizes[..2] == y.sizes[..2], "3-d pooling takes 5-d tensors")?;
                let max = matches!(kind, StepKind::MaxPool3d { .. });
                let (vals, include_pad, divisor) = pool_window::<3>(kind)?;
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
                    Kernel::AvgPool3d { x, y, p, include_pad, divisor }
                }
            }
            StepKind::AdaptiveAvgPool2d {} | StepKind::AdaptiveMaxPool2d {} | StepKind::AdaptiveAvgPool3d {} | StepKind::AdaptiveMaxPool3d {} => {
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
            StepKind::NllLoss { reduction, ignore_index } | StepKind::NllLossBwd { reduction, ignore_index } => {
                let fwd = matches!(kind, StepKind::NllLoss { .. });
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
                let (reduction, ignore) = (*reduction, *ignore_index);
                need((0..=2).contains(&reduction), "nll_loss reduction")?;
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
            StepKind::Ew { .. } => return Err("an elementwise step is not a kernel".into()),
            _ => return Err(format!("no kernel for step {op:?}")),
        };
        Ok(k)
    }
}
