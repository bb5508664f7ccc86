//! 2-d convolution forward, four ways, all with the same fused epilogue (per output channel
//! shift — the bias, or a folded inference batch norm's `b - mean * scale` — then activations
//! and a residual add, applied per GEMM tile while it is in L1):
//!
//! - 3×3 stride 1, one group, ≥ 16 channels each side: Winograd F(2×2, 3×3) (`winograd`), 2.25×
//!   fewer multiply-adds than any direct method; a dense channels-last input through planes
//!   transposed once each way.
//! - depthwise (`groups == in_channels`, any channel multiplier): a direct kernel per output
//!   plane over a zero-padded copy of its input plane, vectorised along the output width.
//! - channels-last input (NHWC, one group): im2col rows gathered as contiguous runs of
//!   channels, `col (positions × K) @ Wᵀ (K × out channels)`, so the output rows are NHWC
//!   positions (a 1×1 stride-1 convolution reads the input in place, no copy).
//! - everything else (NCHW, groups): im2col by contiguous interior runs (padding only at the
//!   borders, no per-element branch), in chunks of output rows that stay in L2, then
//!   `W (out channels × K) @ col (K × positions)`; a 1×1 stride-1 convolution reads the input
//!   in place.
//!
//! A folded batch norm multiplies the weights by `w / sqrt(var + eps)` per output channel (a
//! copy of the weights per call, `oc × K` floats) and adds the shift in the epilogue. Work is
//! split over (image, chunk of output rows) or output planes, each a single-threaded GEMM,
//! when there are enough of them for the threads; else the GEMM itself is threaded.

use crate::core::math::unary::Un;
use crate::core::mem::{with_scratch, Mem, SPtr};
use crate::core::tensor::View;
use crate::kernels::gemm::{sgemm_epi, Epi, EpiOp, EpiSpec, Mat};
use std::cell::RefCell;

/// The epilogue ops a convolution step carries: unary ops and at most one residual add.
pub type ConvOps = Vec<EpiSpec>;

/// An inference batch norm folded into the convolution: its per-channel weight and bias
/// (either may be absent), running mean and variance, and eps.
pub struct FoldedBn {
    pub weight: Option<View>,
    pub bias: Option<View>,
    pub mean: View,
    pub var: View,
    pub eps: f32,
}

/// Floats of im2col buffer one task fills before its GEMM (1 MiB: a chunk that stays in L2).
const COL_BUDGET: usize = 1 << 18;
/// Output positions one channels-last GEMM takes (its m).
pub(super) const NHWC_ROWS: usize = 256;

/// Which code path the direct (depthwise) kernel takes; the GEMM dispatches on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    Portable,
    Avx2,
    Avx512,
}

/// The best path for this CPU; `TB_CONV_PORTABLE=1` forces the portable one (tests, CI).
pub fn path() -> Path {
    static P: std::sync::OnceLock<Path> = std::sync::OnceLock::new();
    *P.get_or_init(|| {
        if std::env::var("TB_CONV_PORTABLE").is_ok_and(|v| v == "1") {
            return Path::Portable;
        }
        if crate::core::isa::has_avx512() {
            Path::Avx512
        } else if crate::core::isa::has_avx2() {
            Path::Avx2
        } else {
            Path::Portable
        }
    })
}

thread_local! {
    static COL: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// a pooled convolution's full result, on the paths that write it
    static FULL: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// B's bfloat16 pair panels (`gemm_pairs`)
    #[cfg(target_arch = "x86_64")]
    static PAIR_PANELS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// The geometry: stride, padding, dilation (h, w), groups.
#[derive(Clone, Copy)]
pub struct Geom {
    pub sh: usize,
    pub sw: usize,
    pub ph: usize,
    pub pw: usize,
    pub dh: usize,
    pub dw: usize,
    pub groups: usize,
}

/// Output columns `lo..hi` whose input column `xo * sw + off` lies inside `0..ww`.
#[inline(always)]
pub(super) fn valid_cols(off: isize, sw: usize, ww: usize, ow: usize) -> (usize, usize) {
    let lo = if off >= 0 { 0 } else { ((-off) as usize).div_ceil(sw) }.min(ow);
    let last = ww as isize - 1 - off;
    let hi = if last < 0 { 0 } else { (last as usize / sw + 1).min(ow) };
    (lo, hi.max(lo))
}

/// `pool`: y holds the 2×2 stride-2 max pool (floor) of the convolution's result after the
/// epilogue (no residual; relu / clamp only, which commute with the max): the Winograd path
/// pools its tiles before the epilogue and never writes the full result, the others write it
/// to a scratch buffer and pool that.
///
/// # Safety
/// Every view must have been validated by its step builder against the buffers of `mem`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn conv2d(
    mem: &Mem, x: &View, w: &View, bias: Option<&View>, bn: Option<&FoldedBn>, res: Option<&View>, y: &View, g: Geom, ops: &[EpiSpec],
    threads: usize, path: Path, pool: bool, bf16: bool,
) {
    let (n, c, hh, ww) = (x.sizes[0], x.sizes[1], x.sizes[2], x.sizes[3]);
    let (oc, cg, kh, kw) = (w.sizes[0], w.sizes[1], w.sizes[2], w.sizes[3]);
    // (pooled: the convolution's own size; the builder checked the kernel fits)
    let (oh, ow) = if pool {
        (super::out_len(hh, kh, g.sh, g.ph, g.dh).unwrap_or(0), super::out_len(ww, kw, g.sw, g.pw, g.dw).unwrap_or(0))
    } else {
        (y.sizes[2], y.sizes[3])
    };
    if n == 0 || oc == 0 || oh == 0 || ow == 0 {
        return;
    }
    let kk = cg * kh * kw;
    // per output channel: scale (folded batch norm) and shift (bias and / or the norm's shift)
    let rd = |v: &View, i: usize| *mem.ptr::<f32>(v).add(i * v.strides[0]);
    let scale: Option<Vec<f32>> = bn.map(|b| {
        (0..oc).map(|o| b.weight.as_ref().map_or(1.0, |wv| rd(wv, o)) * (1.0 / (rd(&b.var, o) + b.eps).sqrt())).collect()
    });
    let shift: Option<Vec<f32>> = match (bn, &scale) {
        (Some(b), Some(s)) => Some(
            (0..oc)
                .map(|o| {
                    let t = bias.map_or(0.0, |bv| rd(bv, o)) - rd(&b.mean, o);
                    t * s[o] + b.bias.as_ref().map_or(0.0, |bv| rd(bv, o))
                })
                .collect(),
        ),
        _ => bias.map(|bv| (0..oc).map(|o| rd(bv, o)).collect()),
    };
    let depthwise = cg == 1 && g.groups == c && c > 0;
    let nhwc = !depthwise && g.groups == 1 && x.strides[1] == 1 && c > 1 && x.strides[3] >= c && (x.strides[2] == ww * x.strides[3] || hh == 1);
    // the weights, scaled, in the order the path reads K: (ci, a, b), or (a, b, ci) for NHWC
    let pw_ = mem.ptr::<f32>(w);
    let ws = &w.strides;
    let mut wk = vec![0f32; oc * kk];
    for o in 0..oc {
        let s = scale.as_ref().map_or(1.0, |v| v[o]);
        for ci in 0..cg {
            for a in 0..kh {
                for b in 0..kw {
                    // NHWC: K × OC row-major (the GEMM's B, packed by plain row copies)
                    let at = if nhwc { ((a * kw + b) * cg + ci) * oc + o } else { o * kk + (ci * kh + a) * kw + b };
                    let v = *pw_.add(o * ws[0] + ci * ws[1] + a * ws[2] + b * ws[3]);
                    wk[at] = if scale.is_some() { v * s } else { v };
                }
            }
        }
    }
    let (px, py) = (mem.ptr::<f32>(x), mem.ptr::<f32>(y));
    let pres = res.map(|r| (mem.ptr::<f32>(r), r.strides.clone()));
    let shift_p = shift.as_ref().map(|v| SPtr(v.as_ptr() as *mut f32));
    let wkp = SPtr(wk.as_mut_ptr());
    // the epilogue of an output block: shift by `bias_mat`, then `ops` (the residual at `res_mat`)
    let epi = |bias_mat: Option<Mat>, res_mat: Option<Mat>| {
        Epi::new(
            bias_mat.map(|m| (m, 1.0)),
            ops.iter().map(|s| match *s {
                EpiSpec::Un(u) => EpiOp::Un(u),
                EpiSpec::Residual => EpiOp::Add(res_mat.expect("a residual operand (checked when built)"), 1.0),
            }),
        )
    };
    let (xs, ys) = (&x.strides, &y.strides);
    if depthwise {
        let mult = oc / c;
        let (hp, wp) = (hh + 2 * g.ph, ww + 2 * g.pw);
        let plane = |item: usize| {
            let (ni, o) = (item / oc, item % oc);
            let xb = px.add(ni * xs[0] + (o / mult) * xs[1]);
            let yb = py.add(ni * ys[0] + o * ys[1]);
            let e = epi(
                shift_p.map(|s| Mat { p: SPtr(s.add(o)), rs: 0, cs: 0 }),
                pres.as_ref().map(|(p, rs)| Mat { p: SPtr(p.add(ni * rs[0] + o * rs[1])), rs: rs[2] as isize, cs: rs[3] as isize }),
            );
            with_scratch(&COL, hp * wp + ow, |buf| {
                let (pad, acc) = buf.split_at_mut(hp * wp);
                let args = DwArgs { xb, xs: [xs[2], xs[3]], hh, ww, wp, kh, kw, g, w: wkp.add(o * kk), yb, ys: [ys[2], ys[3]], oh, ow };
                match path {
                    #[cfg(target_arch = "x86_64")]
                    Path::Avx512 => dw_plane_avx512(&args, pad, acc, &e),
                    #[cfg(target_arch = "x86_64")]
                    Path::Avx2 => dw_plane_avx2(&args, pad, acc, &e),
                    _ => dw_plane::<false>(&args, pad, acc, &e),
                }
            });
        };
        if threads > 1 {
            crate::core::par::for_each(n * oc, plane);
        } else {
            (0..n * oc).for_each(plane);
        }
        return;
    }
    // 3×3 stride 1: Winograd F(2×2, 3×3), 2.25× fewer multiply-adds (`winograd`)
    #[cfg(target_arch = "x86_64")]
    // (channels-last: a dense NHWC input, through planes transposed once each way)
    #[cfg(target_arch = "x86_64")]
    let x_nhwc = nhwc && xs[3] == c && xs[2] == ww * c;
    #[cfg(target_arch = "x86_64")]
    if path != Path::Portable
        && (!nhwc || (x_nhwc && !pool))
        && super::winograd::applies(c, oc, kh, kw, [g.sh, g.sw], [g.dh, g.dw], g.groups, ow, if x_nhwc { 1 } else { ys[3] })
        && (!x_nhwc || ys[3] == 1 || (ys[1] == 1 && ys[3] == oc && ys[2] == ow * oc))
    {
        // the channels-last path laid the weights out (a, b, ci) × oc: back to oc × (ci, a, b)
        let w_planes: Vec<f32> = if nhwc {
            let mut v = vec![0f32; oc * kk];
            for o in 0..oc {
                for ci in 0..c {
                    for t in 0..9 {
                        v[(o * c + ci) * 9 + t] = wk[(t * c + ci) * oc + o];
                    }
                }
            }
            v
        } else {
            Vec::new()
        };
        let wa = super::winograd::Args {
            x: px.get(),
            xs: [xs[0], xs[1], xs[2], xs[3]],
            n,
            c,
            hh,
            ww,
            w: if nhwc { &w_planes } else { &wk },
            oc,
            y: py.get(),
            ys: [ys[0], ys[1], ys[2], ys[3]],
            oh,
            ow,
            ph: g.ph,
            pw: g.pw,
            pool,
            bf16,
        };
        let epi_at = |ni: usize, yo: usize| {
            epi(
                shift_p.map(|s| Mat { p: s, rs: 1, cs: 0 }),
                pres.as_ref().map(|(p, rs)| Mat { p: SPtr(p.add(ni * rs[0] + yo * rs[2])), rs: rs[1] as isize, cs: rs[3] as isize }),
            )
        };
        let done = if x_nhwc { super::winograd::conv3x3_channels_last(&wa, &epi_at, threads) } else { super::winograd::conv3x3(&wa, &epi_at, threads) };
        if done {
            return;
        }
    }
    if pool {
        // the full result into a scratch buffer (kept per thread: a fresh one each call would
        // fault its pages in again), then pooled
        with_scratch(&FULL, n * oc * oh * ow, |full| {
            let mut ptrs = mem.ptrs.clone();
            ptrs.push(full.as_mut_ptr() as *mut u8);
            let local = Mem { ptrs };
            let fv = View::new(local.ptrs.len() - 1, &[n, oc, oh, ow], &[oc * oh * ow, oh * ow, ow, 1], y.dtype);
            conv2d(&local, x, w, bias, bn, res, &fv, g, ops, threads, path, false, bf16);
            // the indices view is never written (write_idx false)
            super::max_pool(&local, &fv, y, y, &[2, 2, 2, 2, 0, 0, 1, 1], false);
        });
        return;
    }
    let direct = kh == 1 && kw == 1 && g.sh == 1 && g.sw == 1 && g.ph == 0 && g.pw == 0 && (xs[2] == ww * xs[3] || hh == 1);
    // a residual whose rows are not evenly spaced is read one output row at a time
    let res_rows = res.is_none_or(|r| r.strides[2] == ow * r.strides[3] || oh == 1);
    let rows = if !res_rows {
        1
    } else if direct && !nhwc {
        oh
    } else if nhwc {
        // GEMM rows are output positions: at most the own kernel's few-rows block (A packed
        // once, B panels packed next to their use)
        (NHWC_ROWS / ow).min(COL_BUDGET / (kk * ow).max(1)).clamp(1, oh)
    } else {
        (COL_BUDGET / (kk * ow).max(1)).clamp(1, oh)
    };
    let chunks = oh.div_ceil(rows);
    let items = n * chunks;
    let ocg = oc / g.groups;
    // a bfloat16 model's NCHW convolution, single-threaded GEMMs: bfloat16 products on the pair
    // kernel (`gemm_pairs`), the weights rounded and packed in pairs once
    #[cfg(target_arch = "x86_64")]
    let pairs_w: Option<Vec<f32>> = (bf16 && !nhwc && (threads == 1 || items >= threads) && (!direct || xs[3] == 1) && super::gemm_pairs::available())
        .then(|| super::gemm_pairs::pack_weights(&wk, g.groups, ocg, kk));
    #[cfg(not(target_arch = "x86_64"))]
    let pairs_w: Option<Vec<f32>> = None;
    // NCHW, single-threaded GEMMs on the own kernel: im2col writes its packed panels directly
    let packed = if pairs_w.is_none() && !nhwc && (threads == 1 || items >= threads) { crate::kernels::gemm::own::packed_b_layout(kk) } else { None };
    // ... and the weights packed once for all of them (each GEMM used to pack its group's A
    // again: for 128 channels of 8 × 8, 1152 deep, that was as much work as the product)
    let pa_len = crate::kernels::gemm::own::packed_a_len(ocg, kk);
    let packed_w: Vec<f32> = match packed {
        Some(_) if !direct => {
            let mut v = vec![0f32; g.groups * pa_len];
            for gi in 0..g.groups {
                let a = Mat { p: SPtr(wkp.add(gi * ocg * kk)), rs: kk as isize, cs: 1 };
                crate::kernels::gemm::own::pack_a_slices(a, ocg, kk, v.as_mut_ptr().add(gi * pa_len));
            }
            v
        }
        _ => Vec::new(),
    };
    let pwp = SPtr(packed_w.as_ptr() as *mut f32);
    let one = |item: usize, t: usize| {
        let (ni, r0) = (item / chunks, (item % chunks) * rows);
        let r1 = (r0 + rows).min(oh);
        let cols = (r1 - r0) * ow;
        let col_len = match packed {
            _ if direct => 0,
            Some((nr, _)) => kk * cols.div_ceil(nr) * nr,
            None => kk * cols,
        };
        with_scratch(&COL, col_len, |col| {
            let colp = SPtr(col.as_mut_ptr());
            if nhwc {
                // rows of C are output positions, columns output channels
                let xb = px.add(ni * xs[0]);
                let a = if direct {
                    Mat { p: SPtr(xb.add(r0 * ow * xs[3])), rs: xs[3] as isize, cs: 1 }
                } else {
                    im2col_nhwc(xb, xs, c, hh, ww, kh, kw, g, r0, r1, ow, col);
                    Mat { p: colp, rs: kk as isize, cs: 1 }
                };
                let b = Mat { p: wkp, rs: oc as isize, cs: 1 };
                let cm = Mat { p: SPtr(py.add(ni * ys[0] + r0 * ys[2])), rs: ys[3] as isize, cs: ys[1] as isize };
                let e = epi(
                    shift_p.map(|s| Mat { p: s, rs: 0, cs: 1 }),
                    pres.as_ref().map(|(p, rs)| Mat { p: SPtr(p.add(ni * rs[0] + r0 * rs[2])), rs: rs[3] as isize, cs: rs[1] as isize }),
                );
                sgemm_epi(cols, oc, kk, a, b, cm, 1.0, false, t, &e);
                return;
            }
            for gi in 0..g.groups {
                let xb = px.add(ni * xs[0] + gi * cg * xs[1]);
                let a = Mat { p: SPtr(wkp.add(gi * ocg * kk)), rs: kk as isize, cs: 1 };
                let cm = Mat { p: SPtr(py.add(ni * ys[0] + gi * ocg * ys[1] + r0 * ys[2])), rs: ys[1] as isize, cs: ys[3] as isize };
                let e = epi(
                    shift_p.map(|s| Mat { p: SPtr(s.add(gi * ocg)), rs: 1, cs: 0 }),
                    pres.as_ref().map(|(p, rs)| Mat { p: SPtr(p.add(ni * rs[0] + gi * ocg * rs[1] + r0 * rs[2])), rs: rs[1] as isize, cs: rs[3] as isize }),
                );
                #[cfg(target_arch = "x86_64")]
                if let Some(pw2) = pairs_w.as_ref() {
                    let (bp, brs) = if direct {
                        (xb.add(r0 * ow * xs[3]) as *const f32, xs[1])
                    } else {
                        im2col_nchw(xb, xs, cg, hh, ww, kh, kw, g, r0, r1, ow, col);
                        (colp.get() as *const f32, cols)
                    };
                    let pa = pw2.as_ptr().add(gi * super::gemm_pairs::packed_weights_len(ocg, kk));
                    with_scratch(&PAIR_PANELS, super::gemm_pairs::b_panels_len(kk, cols), |panels| {
                        super::gemm_pairs::gemm(ocg, cols, kk, pa, bp, brs, panels, cm, &e);
                    });
                    continue;
                }
                if let (false, Some((nr, kc))) = (direct, packed) {
                    // im2col straight into the GEMM's packed panels: no second copy of B
                    im2col_packed(xb, xs, cg, hh, ww, kh, kw, g, r0, r1, ow, nr, kc, col);
                    crate::kernels::gemm::own::sgemm_packed_ab(ocg, cols, kk, pwp.add(gi * pa_len), colp.get(), cm, &e);
                    continue;
                }
                let b = if direct {
                    Mat { p: SPtr(xb.add(r0 * ow * xs[3])), rs: xs[1] as isize, cs: xs[3] as isize }
                } else {
                    im2col_nchw(xb, xs, cg, hh, ww, kh, kw, g, r0, r1, ow, col);
                    Mat { p: colp, rs: cols as isize, cs: 1 }
                };
                sgemm_epi(ocg, cols, kk, a, b, cm, 1.0, false, t, &e);
            }
        })
    };
    if threads > 1 && items >= threads {
        crate::core::par::for_each(items, |i| one(i, 1));
    } else {
        (0..items).for_each(|i| one(i, threads));
    }
}

/// `dst.copy_from_slice(src)` for the short runs im2col moves (a row of an output plane, ~32
/// floats) without a libc call per run: fixed-size blocks the compiler moves inline (the
/// calls were ~13 % of a 3×3 64 → 64 convolution).
#[inline(always)]
pub(super) fn copy_floats(dst: &mut [f32], src: &[f32]) {
    let n = dst.len();
    assert!(src.len() >= n);
    let (d, s) = (dst.as_mut_ptr(), src.as_ptr());
    let mut q = 0;
    // SAFETY: q + 16 ≤ n / q + 4 ≤ n / q < n elements of both (src holds at least n)
    unsafe {
        while q + 16 <= n {
            std::ptr::copy_nonoverlapping(s.add(q), d.add(q), 16);
            q += 16;
        }
        while q + 4 <= n {
            std::ptr::copy_nonoverlapping(s.add(q), d.add(q), 4);
            q += 4;
        }
        while q < n {
            *d.add(q) = *s.add(q);
            q += 1;
        }
    }
}

/// im2col of output rows r0..r1 for one group of an NCHW-strided input: row k = (ci, a, b) of
/// `col` holds, for every output position, the input it multiplies (0 in the padding).
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn im2col_nchw(xb: *mut f32, xs: &[usize], cg: usize, hh: usize, ww: usize, kh: usize, kw: usize, g: Geom, r0: usize, r1: usize, ow: usize, col: &mut [f32]) {
    let cols = (r1 - r0) * ow;
    for ci in 0..cg {
        for a in 0..kh {
            for b in 0..kw {
                let row = &mut col[((ci * kh + a) * kw + b) * cols..][..cols];
                let off = (b * g.dw) as isize - g.pw as isize;
                let (lo, hi) = valid_cols(off, g.sw, ww, ow);
                for yo in r0..r1 {
                    let dst = &mut row[(yo - r0) * ow..][..ow];
                    let ih = (yo * g.sh + a * g.dh) as isize - g.ph as isize;
                    if ih < 0 || ih as usize >= hh {
                        dst.fill(0.0);
                        continue;
                    }
                    dst[..lo].fill(0.0);
                    dst[hi..].fill(0.0);
                    let src = xb.add(ci * xs[1] + ih as usize * xs[2]);
                    if lo < hi {
                        let first = (lo * g.sw) as isize + off;
                        if g.sw == 1 && xs[3] == 1 {
                            std::ptr::copy_nonoverlapping(src.offset(first), dst[lo..hi].as_mut_ptr(), hi - lo);
                        } else {
                            let step = (g.sw * xs[3]) as isize;
                            let s0 = src.offset(first * xs[3] as isize);
                            for (q, d) in dst[lo..hi].iter_mut().enumerate() {
                                *d = *s0.offset(q as isize * step);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// `im2col_nchw` written as the own GEMM's packed B (`own::packed_b_layout`): row k of col,
/// position j, lands at slice k / kc, panel j / nr, row k % kc, lane j % nr; lanes past the last
/// position are zero. Each channel's input rows the chunk reads are first copied once, zero-padded,
/// so every tap's output row is a plain (for stride 1: contiguous) run of that copy, with no
/// bounds test per row.
#[allow(clippy::too_many_arguments)]
unsafe fn im2col_packed(
    xb: *mut f32, xs: &[usize], cg: usize, hh: usize, ww: usize, kh: usize, kw: usize, g: Geom, r0: usize, r1: usize, ow: usize, nr: usize,
    kc_: usize, col: &mut [f32],
) {
    let cols = (r1 - r0) * ow;
    let npan = cols.div_ceil(nr);
    let kk = cg * kh * kw;
    // padded rows p0..p1 (padded row p is input row p - ph), padded width: every column a tap reads
    let (p0, p1) = (r0 * g.sh, (r1 - 1) * g.sh + (kh - 1) * g.dh + 1);
    let wp = ((ow - 1) * g.sw + (kw - 1) * g.dw + 1).max(ww + g.pw);
    let mut pad = vec![0f32; (p1 - p0) * wp];
    // the panel and lane of each output row's first position (divisions once, not per run:
    // they were a large part of im2col for rows of 16)
    let starts: Vec<(usize, usize)> = (r0..r1).map(|yo| ((yo - r0) * ow / nr, (yo - r0) * ow % nr)).collect();
    for ci in 0..cg {
        for (r, prow) in pad.chunks_exact_mut(wp).enumerate() {
            let ih = (p0 + r) as isize - g.ph as isize;
            prow.fill(0.0);
            if ih < 0 || ih as usize >= hh {
                continue;
            }
            let src = xb.add(ci * xs[1] + ih as usize * xs[2]);
            let dst = &mut prow[g.pw..g.pw + ww];
            if xs[3] == 1 {
                copy_floats(dst, std::slice::from_raw_parts(src, ww));
            } else {
                for (q, d) in dst.iter_mut().enumerate() {
                    *d = *src.add(q * xs[3]);
                }
            }
        }
        for a in 0..kh {
            for b in 0..kw {
                let k = (ci * kh + a) * kw + b;
                let (slice, p) = (k / kc_, k % kc_);
                let kc = kc_.min(kk - slice * kc_);
                let base = slice * kc_ * npan * nr + p * nr;
                for (yo, &(pan0, lane0)) in (r0..r1).zip(&starts) {
                    let prow = &pad[((yo * g.sh + a * g.dh) - p0) * wp + b * g.dw..];
                    let (mut pan, mut lane) = (pan0, lane0);
                    let mut xo = 0;
                    // the row's positions, split where they cross a panel
                    while xo < ow {
                        let len = (nr - lane).min(ow - xo);
                        let dst = &mut col[base + pan * kc * nr + lane..][..len];
                        if g.sw == 1 {
                            copy_floats(dst, &prow[xo..xo + len]);
                        } else {
                            for (q, d) in dst.iter_mut().enumerate() {
                                *d = prow[(xo + q) * g.sw];
                            }
                        }
                        xo += len;
                        (pan, lane) = (pan + 1, 0);
                    }
                }
                // lanes past the last position of the last panel
                let tail = cols % nr;
                if tail != 0 {
                    col[base + (npan - 1) * kc * nr + tail..][..nr - tail].fill(0.0);
                }
            }
        }
    }
}

/// im2col of output rows r0..r1 of a channels-last input: row p (an output position) of `col`
/// holds its window, (a, b, ci) with ci fastest, copied as runs of `c` contiguous channels.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn im2col_nhwc(xb: *mut f32, xs: &[usize], c: usize, hh: usize, ww: usize, kh: usize, kw: usize, g: Geom, r0: usize, r1: usize, ow: usize, col: &mut [f32]) {
    let kk = c * kh * kw;
    for yo in r0..r1 {
        for xo in 0..ow {
            let dst = &mut col[((yo - r0) * ow + xo) * kk..][..kk];
            for a in 0..kh {
                let ih = (yo * g.sh + a * g.dh) as isize - g.ph as isize;
                for b in 0..kw {
                    let seg = &mut dst[(a * kw + b) * c..][..c];
                    let iw = (xo * g.sw + b * g.dw) as isize - g.pw as isize;
                    if ih < 0 || ih as usize >= hh || iw < 0 || iw as usize >= ww {
                        seg.fill(0.0);
                    } else {
                        std::ptr::copy_nonoverlapping(xb.add(ih as usize * xs[2] + iw as usize * xs[3]), seg.as_mut_ptr(), c);
                    }
                }
            }
        }
    }
}

/// One depthwise output plane's operands.
pub(super) struct DwArgs {
    pub(super) xb: *mut f32,
    pub(super) xs: [usize; 2],
    pub(super) hh: usize,
    pub(super) ww: usize,
    pub(super) wp: usize,
    pub(super) kh: usize,
    pub(super) kw: usize,
    pub(super) g: Geom,
    pub(super) w: *mut f32,
    pub(super) yb: *mut f32,
    pub(super) ys: [usize; 2],
    pub(super) oh: usize,
    pub(super) ow: usize,
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
unsafe fn dw_plane_avx512(d: &DwArgs, pad: &mut [f32], acc: &mut [f32], e: &Epi) {
    if super::depthwise_vector::plane_avx512(d, pad, e) {
        return;
    }
    dw_plane::<true>(d, pad, acc, e)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dw_plane_avx2(d: &DwArgs, pad: &mut [f32], acc: &mut [f32], e: &Epi) {
    if super::depthwise_vector::plane_avx2(d, pad, e) {
        return;
    }
    dw_plane::<true>(d, pad, acc, e)
}

/// Copies the input plane into `pad` ((hh + 2 ph) rows of wp floats) with its zero border.
#[inline(always)]
pub(super) unsafe fn pad_plane(d: &DwArgs, pad: &mut [f32]) {
    let g = d.g;
    let hp = d.hh + 2 * g.ph;
    pad[..g.ph * d.wp].fill(0.0);
    pad[(g.ph + d.hh) * d.wp..hp * d.wp].fill(0.0);
    for h in 0..d.hh {
        let row = &mut pad[(g.ph + h) * d.wp..][..d.wp];
        row[..g.pw].fill(0.0);
        row[g.pw + d.ww..].fill(0.0);
        let src = d.xb.add(h * d.xs[0]);
        if d.xs[1] == 1 {
            std::ptr::copy_nonoverlapping(src, row[g.pw..].as_mut_ptr(), d.ww);
        } else {
            for (q, v) in row[g.pw..g.pw + d.ww].iter_mut().enumerate() {
                *v = *src.add(q * d.xs[1]);
            }
        }
    }
}

/// One output plane of a depthwise convolution: the input plane is copied into `pad` with its
/// zero border, then each output row accumulates kh × kw shifted rows of it (no bounds tests;
/// stride 1 reads contiguous runs, so the loop vectorises along the width).
#[inline(always)]
unsafe fn dw_plane<const FMA: bool>(d: &DwArgs, pad: &mut [f32], acc: &mut [f32], e: &Epi) {
    let g = d.g;
    pad_plane(d, pad);
    let acc = &mut acc[..d.ow];

    let (ow, taps) = (d.ow, d.kh * d.kw);
    let mut wv = [0f32; 64];
    let big = taps > wv.len();
    if !big {
        for (t, v) in wv[..taps].iter_mut().enumerate() {
            *v = *d.w.add(t);
        }
    }
    for yo in 0..d.oh {
        let rows: [usize; 8] = std::array::from_fn(|a| if a < d.kh { (yo * g.sh + a * g.dh) * d.wp } else { 0 });
        if big || d.kh > 8 {
            // a kernel of more than 64 taps or 8 rows: row by row through memory
            acc.fill(0.0);
            for a in 0..d.kh {
                let prow = &pad[(yo * g.sh + a * g.dh) * d.wp..];
                for b in 0..d.kw {
                    let w = *d.w.add(a * d.kw + b);
                    for (q, o) in acc.iter_mut().enumerate() {
                        *o = madd::<FMA>(w, prow[b * g.dw + q * g.sw], *o);
                    }
                }
            }
        } else {
            // up to 4 × V output columns at a time, their sums in registers across all taps
            let mut xo = 0;
            while xo < ow {
                let left = ow - xo;
                let v = if g.sw == 1 && left >= 4 * V {
                    dw_block::<FMA, 4>(pad, &rows[..d.kh], d.kw, g.dw, &wv, xo, &mut acc[xo..])
                } else if g.sw == 1 && left >= 2 * V {
                    dw_block::<FMA, 2>(pad, &rows[..d.kh], d.kw, g.dw, &wv, xo, &mut acc[xo..])
                } else if g.sw == 1 && left >= V {
                    dw_block::<FMA, 1>(pad, &rows[..d.kh], d.kw, g.dw, &wv, xo, &mut acc[xo..])
                } else {
                    let v = V.min(left);
                    let mut s = [0f32; V];
                    for (a, &row) in rows[..d.kh].iter().enumerate() {
                        for b in 0..d.kw {
                            let w = wv[a * d.kw + b];
                            let src = &pad[row + xo * g.sw + b * g.dw..];
                            for q in 0..v {
                                s[q] = madd::<FMA>(w, src[q * g.sw], s[q]);
                            }
                        }
                    }
                    acc[xo..xo + v].copy_from_slice(&s[..v]);
                    v
                };
                xo += v;
            }
        }
        if !e.is_empty() {
            e.apply_row(acc, yo, 0);
        }
        let dst = d.yb.add(yo * d.ys[0]);
        if d.ys[1] == 1 {
            std::ptr::copy_nonoverlapping(acc.as_ptr(), dst, ow);
        } else {
            for (q, &v) in acc.iter().enumerate() {
                *dst.add(q * d.ys[1]) = v;
            }
        }
    }
}

/// NV × V output columns (stride 1) from the padded plane: every tap's weight times the run of
/// inputs under it, summed in registers (`rows`: each kernel row's offset in `pad`).
#[inline(always)]
fn dw_block<const FMA: bool, const NV: usize>(pad: &[f32], rows: &[usize], kw: usize, dw: usize, wv: &[f32; 64], xo: usize, out: &mut [f32]) -> usize {
    let mut s = [[0f32; V]; NV];
    for (a, &row) in rows.iter().enumerate() {
        for b in 0..kw {
            let w = wv[a * kw + b];
            let src = &pad[row + xo + b * dw..][..NV * V];
            for (j, sj) in s.iter_mut().enumerate() {
                for q in 0..V {
                    sj[q] = madd::<FMA>(w, src[j * V + q], sj[q]);
                }
            }
        }
    }
    for (j, sj) in s.iter().enumerate() {
        out[j * V..(j + 1) * V].copy_from_slice(sj);
    }
    NV * V
}

/// Output columns one depthwise block keeps in registers.
const V: usize = 16;

/// w * x + acc, fused where the path has FMA.
#[inline(always)]
fn madd<const FMA: bool>(w: f32, x: f32, acc: f32) -> f32 {
    if FMA {
        w.mul_add(x, acc)
    } else {
        acc + w * x
    }
}

/// The epilogue op a step names: the GEMM's (relu, gelu, …, add) or `hardtanh:lo:hi`.
pub fn epilogue_op(name: &str) -> Result<EpiSpec, String> {
    if let Some(rest) = name.strip_prefix("hardtanh:") {
        let mut it = rest.split(':').map(|v| v.parse::<f32>());
        if let (Some(Ok(lo)), Some(Ok(hi)), None) = (it.next(), it.next(), it.next()) {
            return Ok(EpiSpec::Un(Un::Clamp(lo, hi)));
        }
        return Err(format!("bad conv2d epilogue {name:?}"));
    }
    crate::kernels::gemm::epilogue_by_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::tensor::DType;

    fn data(len: usize, mul: usize, md: usize) -> Vec<f32> {
        (0..len).map(|i| ((i * mul % md) as f32 - (md / 2) as f32) / md as f32).collect()
    }

    /// x (N, C, H, W) NCHW, w (OC, C/groups, KH, KW): the direct sum in f64.
    #[allow(clippy::too_many_arguments)]
    fn naive(x: &[f32], w: &[f32], dims: [usize; 8], g: Geom, oh: usize, ow: usize) -> Vec<f32> {
        let [n, c, hh, ww, oc, kh, kw, _] = dims;
        let (cg, ocg) = (c / g.groups, oc / g.groups);
        let mut y = vec![0f32; n * oc * oh * ow];
        for ni in 0..n {
            for o in 0..oc {
                for yo in 0..oh {
                    for xo in 0..ow {
                        let mut s = 0f64;
                        for ci in 0..cg {
                            for a in 0..kh {
                                for b in 0..kw {
                                    let ih = (yo * g.sh + a * g.dh) as isize - g.ph as isize;
                                    let iw = (xo * g.sw + b * g.dw) as isize - g.pw as isize;
                                    if ih >= 0 && (ih as usize) < hh && iw >= 0 && (iw as usize) < ww {
                                        let xc = (o / ocg) * cg + ci;
                                        s += x[((ni * c + xc) * hh + ih as usize) * ww + iw as usize] as f64 * w[((o * cg + ci) * kh + a) * kw + b] as f64;
                                    }
                                }
                            }
                        }
                        y[((ni * oc + o) * oh + yo) * ow + xo] = s as f32;
                    }
                }
            }
        }
        y
    }

    /// Stride-1 3×3 / 5×5 depthwise planes on each vector path this CPU has (AVX2 on an
    /// AVX-512 machine too: `depthwise_vector`) with a bias, a residual and a clamp in the
    /// epilogue: widths around each block of 1-4 vectors, dilation, NaN and inf in the input.
    #[test]
    fn depthwise_vector_planes_with_epilogue_match_the_direct_sum() {
        let mut paths = vec![];
        if crate::core::isa::has_avx2() {
            paths.push(Path::Avx2);
        }
        if crate::core::isa::has_avx512() {
            paths.push(Path::Avx512);
        }
        for &ww in &[5usize, 8, 9, 16, 17, 33, 40, 70] {
            for &(k, d) in &[(3usize, 1usize), (5, 1), (3, 2)] {
                let (n, c, hh, p) = (2usize, 3usize, 6usize, d * (k / 2));
                let g = Geom { sh: 1, sw: 1, ph: p, pw: p, dh: d, dw: d, groups: c };
                let (oh, ow) = (hh, ww);
                let mut x = data(n * c * hh * ww, 7, 23);
                x[1] = f32::NAN;
                x[hh * ww + 2] = f32::INFINITY;
                let w = data(c * k * k, 5, 11);
                let bias: Vec<f32> = (0..c).map(|o| o as f32 * 0.3 - 0.2).collect();
                let res = data(n * c * oh * ow, 3, 17);
                let conv = naive(&x, &w, [n, c, hh, ww, c, k, k, 0], g, oh, ow);
                let want: Vec<f32> = conv
                    .iter()
                    .enumerate()
                    .map(|(i, &v)| {
                        let t = v + bias[(i / (oh * ow)) % c] + res[i];
                        if t.is_nan() {
                            t
                        } else {
                            t.clamp(0.0, 0.5)
                        }
                    })
                    .collect();
                for &path in &paths {
                    let (mut xb, mut wb, mut bb, mut rb) = (x.clone(), w.clone(), bias.clone(), res.clone());
                    let mut y = vec![f32::NAN; n * c * oh * ow];
                    let mem = Mem {
                        ptrs: vec![xb.as_mut_ptr() as *mut u8, wb.as_mut_ptr() as *mut u8, y.as_mut_ptr() as *mut u8, bb.as_mut_ptr() as *mut u8, rb.as_mut_ptr() as *mut u8],
                    };
                    let plane = [c * oh * ow, oh * ow, ow, 1];
                    let xv = View::new(0, &[n, c, hh, ww], &[c * hh * ww, hh * ww, ww, 1], DType::F32);
                    let wv = View::new(1, &[c, 1, k, k], &[k * k, k * k, k, 1], DType::F32);
                    let yv = View::new(2, &[n, c, oh, ow], &plane, DType::F32);
                    let bv = View::new(3, &[c], &[1], DType::F32);
                    let rv = View::new(4, &[n, c, oh, ow], &plane, DType::F32);
                    let ops = [EpiSpec::Residual, EpiSpec::Un(Un::Clamp(0.0, 0.5))];
                    unsafe { conv2d(&mem, &xv, &wv, Some(&bv), None, Some(&rv), &yv, g, &ops, 1, path, false, false) };
                    for (i, (a, b)) in y.iter().zip(&want).enumerate() {
                        let same = (a - b).abs() < 1e-4 * (1.0 + b.abs()) || a.is_nan() && b.is_nan();
                        assert!(same, "{path:?} w{ww} k{k} d{d} [{i}]: {a} vs {b}");
                    }
                }
            }
        }
    }

    /// 3×3 stride-1 convolutions the Winograd path takes (`winograd::applies`): odd and even
    /// output sizes (a tile half outside), padding 0 / 1 / 2, strided input, a bias, a folded
    /// norm, a residual and relu / clamp in the epilogue, and NaN / ±inf inputs (recomputed as
    /// the direct sum: the transforms would turn an inf into inf - inf) against the direct sum;
    /// each case also with bfloat16 products (`winograd_pairs`, where the CPU has them: the
    /// inputs and weights are bfloat16 values; the error then within 2^-7 of the sum of the
    /// products' magnitudes, where pairs in the wrong halves or panels miss by their size).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn winograd_path_matches_the_direct_sum() {
        // the GEMM backend must stay put (another test switches it)
        let _g = crate::kernels::gemm::tests::LOCK.lock().unwrap_or_else(|e| e.into_inner());
        if crate::kernels::gemm::own::packed_b_layout(16).is_none() {
            return;
        }
        // (n, c, h, w, oc, pad, epilogue, non-finite inputs, input layout: 0 NCHW, 1 channel
        // stride wider than a plane, 2 channels-last (output and residual channels-last too))
        let cases = [
            (2, 16, 8, 14, 16, 1, false, false, 0),
            (1, 24, 9, 17, 20, 1, true, false, 0),
            (2, 32, 10, 31, 40, 0, true, false, 1),
            (1, 16, 7, 12, 16, 2, true, false, 0),
            (1, 16, 7, 12, 16, 2, false, true, 0),
            (1, 16, 7, 12, 16, 2, true, true, 0),
            (3, 19, 16, 16, 33, 1, false, true, 0),
            (1, 300, 6, 9, 17, 1, true, false, 0),
            // two slices of k for the pair kernel (260 pairs)
            (1, 520, 6, 9, 17, 1, true, false, 0),
            (1, 32, 16, 16, 16, 0, false, false, 2),
            (2, 17, 9, 11, 24, 1, false, false, 2),
            (2, 17, 9, 11, 24, 1, true, true, 2),
        ];
        for &(n, c, hh, ww, oc, p, with_epi, nonfinite, layout) in &cases {
            let (strided, cl) = (layout == 1, layout == 2);
            let g = Geom { sh: 1, sw: 1, ph: p, pw: p, dh: 1, dw: 1, groups: 1 };
            let (oh, ow) = (hh + 2 * p - 2, ww + 2 * p - 2);
            assert!(super::super::winograd::applies(c, oc, 3, 3, [1, 1], [1, 1], 1, ow, 1), "case c{c} oc{oc} {hh}x{ww}");
            let bf = |v: Vec<f32>| -> Vec<f32> { v.into_iter().map(|x| crate::core::element::bf16_to_f32(crate::core::element::f32_to_bf16(x))).collect() };
            let mut x = bf(data(n * c * hh * ww, 7, 23));
            if nonfinite {
                x[3] = f32::INFINITY;
                x[hh * ww + ww + 5] = f32::NEG_INFINITY;
                x[(n * c - 1) * hh * ww + 2 * ww + 1] = f32::NAN;
            }
            let w = bf(data(oc * c * 9, 5, 11));
            let bias = data(oc, 3, 7);
            let res = data(n * oc * oh * ow, 11, 13);
            let mut want = naive(&x, &w, [n, c, hh, ww, oc, 3, 3, 0], g, oh, ow);
            let abs = |v: &[f32]| v.iter().map(|x| x.abs()).collect::<Vec<_>>();
            let magnitude = naive(&abs(&x), &abs(&w), [n, c, hh, ww, oc, 3, 3, 0], g, oh, ow);
            if with_epi {
                for (i, v) in want.iter_mut().enumerate() {
                    let o = i / (oh * ow) % oc;
                    // relu and clamp as ATen's: NaN passes through
                    let r = *v + bias[o];
                    let r = if r < 0.0 { 0.0 } else { r } + res[i];
                    *v = if r < -1.0 { -1.0 } else if r > 0.75 { 0.75 } else { r };
                }
            }
            // a channel stride wider than the plane: the input is a slice of a bigger tensor
            let cstride = if strided { hh * ww + 5 } else { hh * ww };
            let mut xb = vec![0f32; n * c * cstride];
            for ni in 0..n {
                for ci in 0..c {
                    let src = &x[(ni * c + ci) * hh * ww..(ni * c + ci + 1) * hh * ww];
                    if cl {
                        for (q, &v) in src.iter().enumerate() {
                            xb[(ni * hh * ww + q) * c + ci] = v;
                        }
                    } else {
                        xb[(ni * c + ci) * cstride..(ni * c + ci) * cstride + hh * ww].copy_from_slice(src);
                    }
                }
            }
            // NCHW index i of an output-shaped tensor -> its index in the layout under test
            let at = |i: usize| {
                if !cl {
                    return i;
                }
                let (q, o, ni) = (i % (oh * ow), i / (oh * ow) % oc, i / (oh * ow * oc));
                (ni * oh * ow + q) * oc + o
            };
            let mut rb = vec![0f32; res.len()];
            for (i, &v) in res.iter().enumerate() {
                rb[at(i)] = v;
            }
            let (mut wb, mut bb) = (w.clone(), bias.clone());
            let mut y = vec![f32::NAN; n * oc * oh * ow];
            let mem = Mem {
                ptrs: vec![xb.as_mut_ptr() as *mut u8, wb.as_mut_ptr() as *mut u8, y.as_mut_ptr() as *mut u8, bb.as_mut_ptr() as *mut u8, rb.as_mut_ptr() as *mut u8],
            };
            let xs = if cl { [hh * ww * c, 1, ww * c, c] } else { [c * cstride, cstride, ww, 1] };
            let ys = if cl { [oh * ow * oc, 1, ow * oc, oc] } else { [oc * oh * ow, oh * ow, ow, 1] };
            let xv = View::new(0, &[n, c, hh, ww], &xs, DType::F32);
            let wv = View::new(1, &[oc, c, 3, 3], &[c * 9, 9, 3, 1], DType::F32);
            let yv = View::new(2, &[n, oc, oh, ow], &ys, DType::F32);
            let bv = View::new(3, &[oc], &[1], DType::F32);
            let rv = View::new(4, &[n, oc, oh, ow], &ys, DType::F32);
            let ops = [EpiSpec::Un(Un::Relu), EpiSpec::Residual, EpiSpec::Un(Un::Clamp(-1.0, 0.75))];
            for (threads, bf16) in [(1, false), (2, false), (1, true), (2, true)] {
                y.fill(f32::NAN);
                unsafe {
                    if with_epi {
                        conv2d(&mem, &xv, &wv, Some(&bv), None, Some(&rv), &yv, g, &ops, threads, path(), false, bf16);
                    } else {
                        conv2d(&mem, &xv, &wv, None, None, None, &yv, g, &[], threads, path(), false, bf16);
                    }
                }
                let pairs = bf16 && c % 2 == 0 && crate::kernels::gemm::bf16::pairs_available();
                for (i, b) in want.iter().enumerate() {
                    let a = y[at(i)];
                    let tol = if pairs { 2f32.powi(-7) * magnitude[i] + 1e-4 } else { 1e-4 * (1.0 + b.abs()) };
                    let same = if b.is_finite() { (a - b).abs() < tol } else { a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()) };
                    assert!(same, "case c{c} oc{oc} {hh}x{ww} pad {p} layout {layout} t{threads} bf16 {bf16} [{i}]: {a} vs {b}");
                }
            }
        }
    }

    /// The GEMM paths with bfloat16 products (`gemm_pairs`: 1×1 on the input planes, im2col for
    /// strided, patch and grouped kernels, an odd K) against the direct sum, with the epilogue,
    /// at 1 and 2 threads: within 2^-7 of the products' magnitude where the CPU has the pair
    /// kernel (bit-for-bit the float32 path's tolerance where it has not).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn bf16_products_match_the_direct_sum() {
        let _g = crate::kernels::gemm::tests::LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let bf = |v: Vec<f32>| -> Vec<f32> { v.into_iter().map(|x| crate::core::element::bf16_to_f32(crate::core::element::f32_to_bf16(x))).collect() };
        // (n, c, h, w, oc, k, stride, pad, groups)
        let cases = [(2, 32, 9, 11, 48, 1, 1, 0, 1), (1, 7, 6, 5, 20, 1, 1, 0, 1), (2, 16, 13, 12, 24, 3, 2, 1, 1), (1, 3, 32, 24, 32, 8, 8, 0, 1), (2, 8, 7, 9, 8, 3, 1, 1, 2), (1, 600, 4, 4, 40, 1, 1, 0, 1)];
        for &(n, c, hh, ww, oc, k, st, p, groups) in &cases {
            let g = Geom { sh: st, sw: st, ph: p, pw: p, dh: 1, dw: 1, groups };
            let (oh, ow) = ((hh + 2 * p - k) / st + 1, (ww + 2 * p - k) / st + 1);
            let cg = c / groups;
            let x = bf(data(n * c * hh * ww, 7, 23));
            let w = bf(data(oc * cg * k * k, 5, 11));
            let bias = data(oc, 3, 7);
            let dims = [n, c, hh, ww, oc, k, k, 0];
            let mut want = naive(&x, &w, dims, g, oh, ow);
            let abs = |v: &[f32]| v.iter().map(|x| x.abs()).collect::<Vec<_>>();
            let magnitude = naive(&abs(&x), &abs(&w), dims, g, oh, ow);
            for (i, v) in want.iter_mut().enumerate() {
                let r = *v + bias[i / (oh * ow) % oc];
                *v = if r < 0.0 { 0.0 } else { r };
            }
            let (mut xb, mut wb, mut bb) = (x.clone(), w.clone(), bias.clone());
            let mut y = vec![f32::NAN; n * oc * oh * ow];
            let mem = Mem { ptrs: vec![xb.as_mut_ptr() as *mut u8, wb.as_mut_ptr() as *mut u8, y.as_mut_ptr() as *mut u8, bb.as_mut_ptr() as *mut u8] };
            let xv = View::new(0, &[n, c, hh, ww], &[c * hh * ww, hh * ww, ww, 1], DType::F32);
            let wv = View::new(1, &[oc, cg, k, k], &[cg * k * k, k * k, k, 1], DType::F32);
            let yv = View::new(2, &[n, oc, oh, ow], &[oc * oh * ow, oh * ow, ow, 1], DType::F32);
            let bv = View::new(3, &[oc], &[1], DType::F32);
            let pairs = crate::kernels::gemm::bf16::pairs_available();
            for threads in [1, 2] {
                y.fill(f32::NAN);
                unsafe { conv2d(&mem, &xv, &wv, Some(&bv), None, None, &yv, g, &[EpiSpec::Un(Un::Relu)], threads, path(), false, true) };
                for (i, b) in want.iter().enumerate() {
                    let tol = if pairs { 2f32.powi(-7) * magnitude[i] + 1e-4 } else { 1e-4 * (1.0 + b.abs()) };
                    assert!((y[i] - b).abs() < tol, "case c{c} oc{oc} k{k} s{st} g{groups} t{threads} [{i}]: {} vs {b}", y[i]);
                }
            }
        }
    }

    /// Depthwise (the direct kernel, every path this CPU has, the portable one always), grouped
    /// and channels-last input against the direct sum.
    #[test]
    fn every_path_matches_the_direct_sum() {
        let mut paths = vec![Path::Portable];
        if crate::core::isa::has_avx2() {
            paths.push(Path::Avx2);
        }
        if crate::core::isa::has_avx512() {
            paths.push(Path::Avx512);
        }
        // (n, c, h, w, oc, k, stride, pad, dilation, groups, channels_last)
        let cases = [
            (2, 8, 9, 37, 8, 3, 1, 1, 1, 8, false),
            (1, 4, 11, 70, 8, 5, 2, 2, 1, 4, false),
            (2, 6, 7, 20, 6, 3, 1, 2, 2, 6, false),
            (2, 6, 9, 9, 4, 3, 2, 1, 1, 2, false),
            (2, 5, 6, 7, 3, 3, 1, 1, 1, 1, true),
        ];
        for &(n, c, hh, ww, oc, k, s, p, d, groups, cl) in &cases {
            let g = Geom { sh: s, sw: s, ph: p, pw: p, dh: d, dw: d, groups };
            let oh = (hh + 2 * p - d * (k - 1) - 1) / s + 1;
            let ow = (ww + 2 * p - d * (k - 1) - 1) / s + 1;
            let cg = c / groups;
            let x = data(n * c * hh * ww, 7, 23);
            let w = data(oc * cg * k * k, 5, 11);
            let want = naive(&x, &w, [n, c, hh, ww, oc, k, k, 0], g, oh, ow);
            // channels-last: the same values stored NHWC, read through NCHW-ordered strides
            let (xbuf, xs) = if cl {
                let mut t = vec![0f32; x.len()];
                for ni in 0..n {
                    for ci in 0..c {
                        for h in 0..hh {
                            for wi in 0..ww {
                                t[((ni * hh + h) * ww + wi) * c + ci] = x[((ni * c + ci) * hh + h) * ww + wi];
                            }
                        }
                    }
                }
                (t, vec![hh * ww * c, 1, ww * c, c])
            } else {
                (x.clone(), vec![c * hh * ww, hh * ww, ww, 1])
            };
            for &path in &paths {
                let mut xb = xbuf.clone();
                let mut wb = w.clone();
                let mut y = vec![f32::NAN; n * oc * oh * ow];
                let mem = Mem { ptrs: vec![xb.as_mut_ptr() as *mut u8, wb.as_mut_ptr() as *mut u8, y.as_mut_ptr() as *mut u8] };
                let xv = View::new(0, &[n, c, hh, ww], &xs, DType::F32);
                let wv = View::new(1, &[oc, cg, k, k], &[cg * k * k, k * k, k, 1], DType::F32);
                let yv = View::new(2, &[n, oc, oh, ow], &[oc * oh * ow, oh * ow, ow, 1], DType::F32);
                for threads in [1, 2] {
                    unsafe { conv2d(&mem, &xv, &wv, None, None, None, &yv, g, &[], threads, path, false, false) };
                    for (i, (a, b)) in y.iter().zip(&want).enumerate() {
                        assert!((a - b).abs() < 1e-4 * (1.0 + b.abs()), "{path:?} case c{c} g{groups} cl{cl} t{threads} [{i}]: {a} vs {b}");
                    }
                }
            }
        }
    }
}
