//! 2-d convolution backward (`aten.convolution_backward` of a non-transposed 2-d convolution):
//! the gradients of the input, the weight and the bias, each only when asked for.
//!
//! - grad_bias: per output channel, the sum of grad_out over images and positions (in f64).
//! - grad_weight, one group: `gW (OC/g × K) += gY (OC/g × P) @ im2col(x)ᵀ (P × K)` per image and
//!   chunk of output rows, with the forward's im2col (a 1×1 stride-1 convolution reads the input
//!   in place); the images are split over the threads, each summing into its own copy of the
//!   weight gradient, added up at the end.
//!   A channels-last input (one group) is gathered as the forward's NHWC im2col (positions ×
//!   (a, b, ci)), so both GEMM operands are read along their rows.
//! - grad_input, stride 1, no more output than input channels (or any counts where that forward
//!   is a Winograd 3×3): the forward convolution (`conv2d::conv2d`, all its paths) of grad_out
//!   with the weights flipped in space and transposed per group, padded `d·(k−1) − p`.
//! - grad_input otherwise: `col (K × P) = Wᵀ (K × OC/g) @ gY (OC/g × P)`, then col2im adds each
//!   column back onto the input positions its window read (a 1×1 stride-1 convolution writes
//!   `Wᵀ @ gY` straight into grad_input); images are split over the threads.
//! - depthwise (`groups == in_channels`, any channel multiplier): direct loops per plane, no
//!   GEMM, vectorised along the width where both rows are contiguous; a stride-1 3×3 / 5×5
//!   grad_input (multiplier 1) by the forward's vector planes over grad_out, kernel flipped, and
//!   its weight gradient by per-tap vector sums over each padded input plane.
//!
//! Every operand is read through its strides, so channels-last tensors need no layout copy (the
//! GEMMs take grad_out as a strided matrix; a grad_out whose rows are not evenly spaced is read
//! one output row at a time).

use super::conv2d::{im2col_nchw, im2col_nhwc, valid_cols, DwArgs, Geom, Path};
use crate::core::mem::{Mem, SPtr};
use crate::core::tensor::View;
use crate::kernels::gemm::{dot_rows, sgemm, Epi, Mat};

/// Floats of im2col buffer one task fills before its GEMM (as the forward: a chunk in L2).
const COL_BUDGET: usize = 1 << 18;

/// The gradients a step writes (absent: not asked for).
pub struct Grads {
    pub input: Option<View>,
    pub weight: Option<View>,
    pub bias: Option<View>,
}

/// # Safety
/// Every view must have been validated by its step builder against the buffers of `mem`: `gy`
/// (N, OC, OH, OW), `x` (N, C, H, W), `w` (OC, C / groups, KH, KW), the gradients shaped as
/// x, w and (OC,), the output size the forward's for `g`.
pub unsafe fn conv2d_backward(mem: &Mem, gy: &View, x: &View, w: &View, grads: &Grads, g: Geom, threads: usize) {
    let s = Shape::of(gy, x, w);
    if let Some(gb) = &grads.bias {
        grad_bias(mem, gy, gb, threads);
    }
    let depthwise = s.cg == 1 && g.groups == s.c && g.groups > 1;
    // the weights as (OC, K) rows, K = (ci, a, b)
    let wk = if grads.input.is_some() { dense_weight(mem, w, &s) } else { Vec::new() };
    if depthwise {
        if let Some(gx) = &grads.input {
            if !dw_grad_input_by_forward(mem, gy, gx, &wk, &s, g, threads) {
                dw_grad_input(mem, gy, gx, &wk, &s, g, threads);
            }
        }
        if let Some(gw) = &grads.weight {
            if !dw_grad_weight_by_taps(mem, gy, x, gw, &s, g, threads) {
                dw_grad_weight(mem, gy, x, gw, &s, g, threads);
            }
        }
        return;
    }
    if let Some(gx) = &grads.input {
        if !grad_input_by_forward(mem, gy, gx, &wk, &s, g, threads) {
            gemm_grad_input(mem, gy, gx, &wk, &s, g, threads);
        }
    }
    if let Some(gw) = &grads.weight {
        if is_nhwc(x, &s, g) && is_nhwc(gy, &s, g) {
            nhwc_grad_weight(mem, gy, x, gw, &s, g, threads);
        } else {
            gemm_grad_weight(mem, gy, x, gw, &s, g, threads);
        }
    }
}

/// A channels-last operand of a one-group convolution (channels contiguous, rows evenly spaced).
fn is_nhwc(v: &View, s: &Shape, g: Geom) -> bool {
    let (c, h) = (v.sizes[1], v.sizes[2]);
    g.groups == 1 && s.cg > 0 && c > 1 && v.strides[1] == 1 && v.strides[3] >= c && (v.strides[2] == v.sizes[3] * v.strides[3] || h == 1)
}

/// grad_input of a stride-1 convolution as a forward convolution of grad_out: weight
/// `W'[g·cg + ci, o, a, b] = W[g·ocg + o, ci, kh−1−a, kw−1−b]`, padding `d·(k−1) − p`, same
/// dilation and groups. False (nothing written) where that does not apply: a stride, a padding
/// past `d·(k−1)`, a grad_input whose rows are not evenly spaced, more output than input
/// channels per group, a non-finite weight.
#[allow(clippy::too_many_arguments)]
unsafe fn grad_input_by_forward(mem: &Mem, gy: &View, gx: &View, wk: &[f32], s: &Shape, g: Geom, threads: usize) -> bool {
    let (reach_h, reach_w) = (g.dh * (s.kh - 1), g.dw * (s.kw - 1));
    let rows_even = gx.strides[2] == s.ww * gx.strides[3] || s.hh == 1;
    // the forward's im2col copies OC/g·KH·KW rows per position, col2im's GEMM writes C/g·KH·KW:
    // the forward only where its side is not the larger (a 3-channel first layer's grad_input
    // would im2col 32 channels to make 3)
    let ocg = s.oc / g.groups;
    // a non-finite weight times the zero padding the forward reads would be NaN where
    // PyTorch's gradient has none
    // ... except where the forward is a Winograd 3×3 (2.25× fewer products than either GEMM)
    #[cfg(target_arch = "x86_64")]
    let winograd = gy.strides[3] == 1
        && super::conv2d::path() != Path::Portable
        && super::winograd::applies(ocg, s.c, s.kh, s.kw, [1, 1], [g.dh, g.dw], g.groups, s.ww, gx.strides[3]);
    #[cfg(not(target_arch = "x86_64"))]
    let winograd = false;
    if g.sh != 1 || g.sw != 1 || g.ph > reach_h || g.pw > reach_w || !rows_even || (ocg > s.cg && !winograd) || !wk.iter().all(|v| v.is_finite()) {
        return false;
    }
    let taps = s.kh * s.kw;
    let mut wt = vec![0f32; s.c * ocg * taps];
    for gi in 0..g.groups {
        for ol in 0..ocg {
            let src = &wk[(gi * ocg + ol) * s.kk..][..s.kk];
            for ci in 0..s.cg {
                let dst = &mut wt[((gi * s.cg + ci) * ocg + ol) * taps..][..taps];
                for (t, d) in dst.iter_mut().enumerate() {
                    *d = src[ci * taps + taps - 1 - t];
                }
            }
        }
    }
    let local = Mem { ptrs: vec![mem.ptr::<f32>(gy).get() as *mut u8, wt.as_mut_ptr() as *mut u8, mem.ptr::<f32>(gx).get() as *mut u8] };
    let dt = gy.dtype;
    let gyv = View::new(0, &gy.sizes, &gy.strides, dt);
    let wv = View::new(1, &[s.c, ocg, s.kh, s.kw], &[ocg * taps, taps, s.kw, 1], dt);
    let gxv = View::new(2, &gx.sizes, &gx.strides, dt);
    let fg = Geom { sh: 1, sw: 1, ph: reach_h - g.ph, pw: reach_w - g.pw, dh: g.dh, dw: g.dw, groups: g.groups };
    super::conv2d::conv2d(&local, &gyv, &wv, None, None, None, &gxv, fg, &[], threads, super::conv2d::path(), false, false);
    true
}

/// The weight gradient of a one-group convolution over channels-last operands:
/// `gW (OC × K) += gYᵀ (OC × P) @ col (P × K)` with the forward's NHWC im2col (K ordered
/// (a, b, ci)); 1×1 stride-1 reads the input in place.
#[allow(clippy::too_many_arguments)]
unsafe fn nhwc_grad_weight(mem: &Mem, gy: &View, x: &View, gw: &View, s: &Shape, g: Geom, threads: usize) {
    let kk = s.kk;
    let direct = is_direct(s, g, x);
    let rows = if direct { s.oh.max(1) } else { (super::conv2d::NHWC_ROWS / s.ow.max(1)).clamp(1, s.oh.max(1)) };
    let parts = if threads > 1 && s.n >= threads { threads } else { 1 };
    let mut acc = vec![0f32; parts * s.oc * kk];
    let accp = SPtr(acc.as_mut_ptr());
    let (px, py, xs, ys) = (mem.ptr::<f32>(x), mem.ptr::<f32>(gy), &x.strides, &gy.strides);
    let part = |p: usize, gemm_threads: usize| {
        let sums = accp.add(p * s.oc * kk);
        let mut col = if direct { Vec::new() } else { vec![0f32; kk * rows * s.ow] };
        for ni in p * s.n / parts..(p + 1) * s.n / parts {
            let mut r0 = 0;
            while r0 < s.oh {
                let r1 = (r0 + rows).min(s.oh);
                let cols = (r1 - r0) * s.ow;
                let xb = px.add(ni * xs[0]);
                let a = Mat { p: SPtr(py.add(ni * ys[0] + r0 * ys[2])), rs: ys[1] as isize, cs: ys[3] as isize };
                let b = if direct {
                    Mat { p: SPtr(xb.add(r0 * xs[2])), rs: xs[3] as isize, cs: xs[1] as isize }
                } else {
                    im2col_nhwc(xb, xs, s.c, s.hh, s.ww, s.kh, s.kw, g, r0, r1, s.ow, &mut col[..kk * cols]);
                    Mat { p: SPtr(col.as_mut_ptr()), rs: kk as isize, cs: 1 }
                };
                sgemm(s.oc, kk, cols, a, b, Mat { p: SPtr(sums), rs: kk as isize, cs: 1 }, 1.0, true, gemm_threads);
                r0 = r1;
            }
        }
    };
    over_items(parts, threads, part);
    let (pw, ws) = (mem.ptr::<f32>(gw), &gw.strides);
    for o in 0..s.oc {
        for ci in 0..s.cg {
            for a in 0..s.kh {
                for b in 0..s.kw {
                    let k = o * kk + (a * s.kw + b) * s.cg + ci;
                    *pw.add(o * ws[0] + ci * ws[1] + a * ws[2] + b * ws[3]) = (0..parts).map(|p| acc[p * s.oc * kk + k]).sum();
                }
            }
        }
    }
}

/// The sizes every part reads.
#[derive(Clone, Copy)]
struct Shape {
    n: usize,
    c: usize,
    hh: usize,
    ww: usize,
    oc: usize,
    cg: usize,
    kh: usize,
    kw: usize,
    oh: usize,
    ow: usize,
    kk: usize,
}

impl Shape {
    fn of(gy: &View, x: &View, w: &View) -> Shape {
        let (cg, kh, kw) = (w.sizes[1], w.sizes[2], w.sizes[3]);
        Shape {
            n: x.sizes[0],
            c: x.sizes[1],
            hh: x.sizes[2],
            ww: x.sizes[3],
            oc: w.sizes[0],
            cg,
            kh,
            kw,
            oh: gy.sizes[2],
            ow: gy.sizes[3],
            kk: cg * kh * kw,
        }
    }

    /// Output rows per GEMM chunk: as many as fit the im2col budget (all when there is no
    /// im2col), one when grad_out's rows are not evenly spaced (its chunk is then not a matrix).
    fn rows(&self, gy: &View, im2col: bool) -> usize {
        if !(gy.strides[2] == self.ow * gy.strides[3] || self.oh == 1) {
            1
        } else if im2col {
            (COL_BUDGET / (self.kk * self.ow).max(1)).clamp(1, self.oh.max(1))
        } else {
            self.oh.max(1)
        }
    }
}

/// A 1×1, stride-1, unpadded convolution over an input whose rows are evenly spaced: the
/// input itself is the im2col matrix.
fn is_direct(s: &Shape, g: Geom, v: &View) -> bool {
    s.kh == 1 && s.kw == 1 && g.sh == 1 && g.sw == 1 && g.ph == 0 && g.pw == 0 && (v.strides[2] == s.ww * v.strides[3] || s.hh == 1)
}

unsafe fn dense_weight(mem: &Mem, w: &View, s: &Shape) -> Vec<f32> {
    let (p, ws) = (mem.ptr::<f32>(w), &w.strides);
    let mut wk = vec![0f32; s.oc * s.kk];
    for o in 0..s.oc {
        for ci in 0..s.cg {
            for a in 0..s.kh {
                for b in 0..s.kw {
                    wk[o * s.kk + (ci * s.kh + a) * s.kw + b] = *p.add(o * ws[0] + ci * ws[1] + a * ws[2] + b * ws[3]);
                }
            }
        }
    }
    wk
}

/// Runs `task(item, gemm_threads)` for every item: items over the threads when there are enough
/// of them, else one after another with threaded GEMMs.
fn over_items(items: usize, threads: usize, task: impl Fn(usize, usize) + Sync + Send) {
    if threads > 1 && items >= threads {
        crate::core::par::for_each(items, |i| task(i, 1));
    } else {
        (0..items).for_each(|i| task(i, threads));
    }
}

unsafe fn grad_bias(mem: &Mem, gy: &View, gb: &View, threads: usize) {
    let (n, oc, oh, ow) = (gy.sizes[0], gy.sizes[1], gy.sizes[2], gy.sizes[3]);
    let (py, pb, ys) = (mem.ptr::<f32>(gy), mem.ptr::<f32>(gb), &gy.strides);
    let gbs = gb.strides[0];
    let one = |o: usize, _: usize| {
        let mut total = 0f64;
        for ni in 0..n {
            for yo in 0..oh {
                let row = py.add(ni * ys[0] + o * ys[1] + yo * ys[2]);
                total += if ys[3] == 1 { sum(std::slice::from_raw_parts(row, ow)) } else { (0..ow).map(|xo| *row.add(xo * ys[3])).sum::<f32>() } as f64;
            }
        }
        *pb.add(o * gbs) = total as f32;
    };
    if n * oh * ow >= 1 << 12 {
        over_items(oc, threads, one);
    } else {
        (0..oc).for_each(|o| one(o, 1));
    }
}

/// A sum in 8 independent lanes (vectorised), then added up.
#[inline(always)]
fn sum(v: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let mut chunks = v.chunks_exact(8);
    for ch in &mut chunks {
        for (a, &x) in acc.iter_mut().zip(ch) {
            *a += x;
        }
    }
    acc.iter().sum::<f32>() + chunks.remainder().iter().sum::<f32>()
}

/// Whether the weight gradient's per-image product `gW (ocg × kk) += gY · colᵀ` runs as dot
/// products of rows (`dot_rows`) rather than through the packing GEMM: where the gradient is
/// small (up to 20 K outputs per group, 80 KiB), so packing each operand for its single use costs
/// as much as the product. Measured per image, 1 thread (`benchmarks/bench_cnn_training.py`
/// shapes): 3 → 32 channels (864 outputs) 2.7× faster, 16 → 16 (2304) 1.2×, 32 → 64 (18432)
/// 1.2×; 64 → 64 (36864) 0.94×, 128 → 128 0.8×, so those keep the GEMM.
fn use_dots(ocg: usize, kk: usize) -> bool {
    ocg * kk <= DOTS_MAX_OUTPUTS
}

/// The largest weight gradient (per group) `use_dots` sends to the dot-product kernel.
const DOTS_MAX_OUTPUTS: usize = 20_000;

#[allow(clippy::too_many_arguments)]
unsafe fn gemm_grad_weight(mem: &Mem, gy: &View, x: &View, gw: &View, s: &Shape, g: Geom, threads: usize) {
    let (ocg, kk) = (s.oc / g.groups, s.kk);
    let direct = is_direct(s, g, x);
    let rows = s.rows(gy, !direct);
    let parts = if threads > 1 && s.n >= threads { threads } else { 1 };
    let mut acc = vec![0f32; parts * s.oc * kk];
    let accp = SPtr(acc.as_mut_ptr());
    let (px, py, xs, ys) = (mem.ptr::<f32>(x), mem.ptr::<f32>(gy), &x.strides, &gy.strides);
    let part = |p: usize, gemm_threads: usize| {
        let sums = accp.add(p * s.oc * kk);
        let mut col = if direct { Vec::new() } else { vec![0f32; kk * rows * s.ow] };
        for ni in p * s.n / parts..(p + 1) * s.n / parts {
            let mut r0 = 0;
            while r0 < s.oh {
                let r1 = (r0 + rows).min(s.oh);
                let cols = (r1 - r0) * s.ow;
                for gi in 0..g.groups {
                    let xb = px.add(ni * xs[0] + gi * s.cg * xs[1]);
                    let a = Mat { p: SPtr(py.add(ni * ys[0] + gi * ocg * ys[1] + r0 * ys[2])), rs: ys[1] as isize, cs: ys[3] as isize };
                    let b = if direct {
                        Mat { p: SPtr(xb.add(r0 * xs[2])), rs: xs[3] as isize, cs: xs[1] as isize }
                    } else {
                        im2col_nchw(xb, xs, s.cg, s.hh, s.ww, s.kh, s.kw, g, r0, r1, s.ow, &mut col[..kk * cols]);
                        Mat { p: SPtr(col.as_mut_ptr()), rs: 1, cs: cols as isize }
                    };
                    if !direct && ys[3] == 1 && use_dots(ocg, kk) {
                        dot_rows::gemm_abt_add(ocg, kk, cols, a.p.get(), ys[1], col.as_ptr(), cols, sums.add(gi * ocg * kk), kk);
                        continue;
                    }
                    let c = Mat { p: SPtr(sums.add(gi * ocg * kk)), rs: kk as isize, cs: 1 };
                    sgemm(ocg, kk, cols, a, b, c, 1.0, true, gemm_threads);
                }
                r0 = r1;
            }
        }
    };
    over_items(parts, threads, part);
    let (pw, ws) = (mem.ptr::<f32>(gw), &gw.strides);
    for o in 0..s.oc {
        for ci in 0..s.cg {
            for a in 0..s.kh {
                for b in 0..s.kw {
                    let k = o * kk + (ci * s.kh + a) * s.kw + b;
                    *pw.add(o * ws[0] + ci * ws[1] + a * ws[2] + b * ws[3]) = (0..parts).map(|p| acc[p * s.oc * kk + k]).sum();
                }
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
unsafe fn gemm_grad_input(mem: &Mem, gy: &View, gx: &View, wk: &[f32], s: &Shape, g: Geom, threads: usize) {
    let (ocg, kk) = (s.oc / g.groups, s.kk);
    let direct = is_direct(s, g, gx);
    let rows = s.rows(gy, !direct);
    let (pgx, py, gs, ys) = (mem.ptr::<f32>(gx), mem.ptr::<f32>(gy), &gx.strides, &gy.strides);
    let wkp = SPtr(wk.as_ptr() as *mut f32);
    let image = |ni: usize, gemm_threads: usize| {
        let gxn = pgx.add(ni * gs[0]);
        if !direct {
            for ci in 0..s.c {
                for h in 0..s.hh {
                    let row = gxn.add(ci * gs[1] + h * gs[2]);
                    for w in 0..s.ww {
                        *row.add(w * gs[3]) = 0.0;
                    }
                }
            }
        }
        let mut col = if direct { Vec::new() } else { vec![0f32; kk * rows * s.ow] };
        let mut r0 = 0;
        while r0 < s.oh {
            let r1 = (r0 + rows).min(s.oh);
            let cols = (r1 - r0) * s.ow;
            for gi in 0..g.groups {
                // Wᵀ of the group: (K × OC/g)
                let a = Mat { p: SPtr(wkp.add(gi * ocg * kk)), rs: 1, cs: kk as isize };
                let b = Mat { p: SPtr(py.add(ni * ys[0] + gi * ocg * ys[1] + r0 * ys[2])), rs: ys[1] as isize, cs: ys[3] as isize };
                let gxb = gxn.add(gi * s.cg * gs[1]);
                if direct {
                    let c = Mat { p: SPtr(gxb.add(r0 * gs[2])), rs: gs[1] as isize, cs: gs[3] as isize };
                    sgemm(s.cg, cols, ocg, a, b, c, 1.0, false, gemm_threads);
                    continue;
                }
                let c = Mat { p: SPtr(col.as_mut_ptr()), rs: cols as isize, cs: 1 };
                sgemm(kk, cols, ocg, a, b, c, 1.0, false, gemm_threads);
                col2im(&col[..kk * cols], gxb, gs, s, g, r0, r1);
            }
            r0 = r1;
        }
    };
    over_items(s.n, threads, image);
}

/// Adds row k = (ci, a, b) of `col` (output rows r0..r1) onto the inputs that tap read: the
/// inverse of `im2col_nchw`.
unsafe fn col2im(col: &[f32], gxb: *mut f32, gs: &[usize], s: &Shape, g: Geom, r0: usize, r1: usize) {
    let cols = (r1 - r0) * s.ow;
    for ci in 0..s.cg {
        for a in 0..s.kh {
            for b in 0..s.kw {
                let row = &col[((ci * s.kh + a) * s.kw + b) * cols..][..cols];
                let off = (b * g.dw) as isize - g.pw as isize;
                let (lo, hi) = valid_cols(off, g.sw, s.ww, s.ow);
                for yo in r0..r1 {
                    let ih = (yo * g.sh + a * g.dh) as isize - g.ph as isize;
                    if ih < 0 || ih as usize >= s.hh || lo >= hi {
                        continue;
                    }
                    let src = &row[(yo - r0) * s.ow..][lo..hi];
                    let dst = gxb.add(ci * gs[1] + ih as usize * gs[2]);
                    add_row(dst, gs[3], (lo * g.sw) as isize + off, g.sw, src, 1.0);
                }
            }
        }
    }
}

/// `dst[(first + q * sw) * ds] += scale * src[q]` for every q (contiguous: vectorised).
#[inline(always)]
unsafe fn add_row(dst: *mut f32, ds: usize, first: isize, sw: usize, src: &[f32], scale: f32) {
    if sw == 1 && ds == 1 {
        let d = std::slice::from_raw_parts_mut(dst.offset(first), src.len());
        for (d, &v) in d.iter_mut().zip(src) {
            *d += scale * v;
        }
    } else {
        let (step, d0) = ((sw * ds) as isize, dst.offset(first * ds as isize));
        for (q, &v) in src.iter().enumerate() {
            *d0.offset(q as isize * step) += scale * v;
        }
    }
}

/// One row of grad_out as a slice (copied into `tmp` when its elements are not contiguous).
#[inline(always)]
unsafe fn row_of(p: *mut f32, stride: usize, len: usize, tmp: &mut Vec<f32>) -> &[f32] {
    if stride == 1 {
        return std::slice::from_raw_parts(p, len);
    }
    tmp.clear();
    tmp.extend((0..len).map(|q| *p.add(q * stride)));
    tmp
}

/// grad_input of a stride-1 depthwise convolution with a 3×3 / 5×5 kernel and channel
/// multiplier 1 (MobileNet's) as the forward's vector plane kernel (`depthwise_vector`) over
/// grad_out, the kernel flipped in space and the padding `d·(k−1) − p`: each plane's taps in
/// registers instead of a scattered add per (row, tap). False, touching nothing, where that
/// does not apply (other shapes, the portable path, a grad_input whose rows are not contiguous).
unsafe fn dw_grad_input_by_forward(mem: &Mem, gy: &View, gx: &View, wk: &[f32], s: &Shape, g: Geom, threads: usize) -> bool {
    let path = super::conv2d::path();
    let (qh, qw) = ((s.kh - 1) * g.dh, (s.kw - 1) * g.dw);
    // a non-finite weight times the zero padding around grad_out would be NaN where autograd
    // adds nothing (as `grad_input_by_forward`)
    if path == Path::Portable
        || s.oc != s.c
        || g.sh != 1
        || g.sw != 1
        || !matches!((s.kh, s.kw), (3, 3) | (5, 5))
        || gx.strides[3] != 1
        || g.ph > qh
        || g.pw > qw
        || !wk.iter().all(|v| v.is_finite())
    {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        let gp = Geom { sh: 1, sw: 1, ph: qh - g.ph, pw: qw - g.pw, dh: g.dh, dw: g.dw, groups: s.c };
        // tap (a, b) of the flipped kernel is (kh − 1 − a, kw − 1 − b): index kk − 1 − t
        let flipped: Vec<f32> = (0..s.c).flat_map(|o| (0..s.kk).map(move |t| wk[o * s.kk + s.kk - 1 - t])).collect();
        let fp = SPtr(flipped.as_ptr() as *mut f32);
        let (pgx, py, gs, ys) = (mem.ptr::<f32>(gx), mem.ptr::<f32>(gy), &gx.strides, &gy.strides);
        let wp = s.ow + 2 * gp.pw;
        let plane = |item: usize, _: usize| {
            let (ni, ci) = (item / s.c, item % s.c);
            let d = DwArgs {
                xb: py.add(ni * ys[0] + ci * ys[1]),
                xs: [ys[2], ys[3]],
                hh: s.oh,
                ww: s.ow,
                wp,
                kh: s.kh,
                kw: s.kw,
                g: gp,
                w: fp.add(ci * s.kk),
                yb: pgx.add(ni * gs[0] + ci * gs[1]),
                ys: [gs[2], gs[3]],
                oh: s.hh,
                ow: s.ww,
            };
            let mut pad = vec![0f32; (s.oh + 2 * gp.ph) * wp];
            let done = match path {
                Path::Avx512 => super::depthwise_vector::plane_avx512(&d, &mut pad, &Epi::default()),
                _ => super::depthwise_vector::plane_avx2(&d, &mut pad, &Epi::default()),
            };
            assert!(done, "the depthwise vector plane takes every stride-1 3x3 / 5x5 plane");
        };
        over_items(s.n * s.c, threads, plane);
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (mem, gy, wk, threads);
        false
    }
}

#[allow(clippy::too_many_arguments)]
unsafe fn dw_grad_input(mem: &Mem, gy: &View, gx: &View, wk: &[f32], s: &Shape, g: Geom, threads: usize) {
    let mult = s.oc / s.c;
    let (pgx, py, gs, ys) = (mem.ptr::<f32>(gx), mem.ptr::<f32>(gy), &gx.strides, &gy.strides);
    let plane = |item: usize, _: usize| {
        let (ni, ci) = (item / s.c, item % s.c);
        let gxb = pgx.add(ni * gs[0] + ci * gs[1]);
        for h in 0..s.hh {
            for w in 0..s.ww {
                *gxb.add(h * gs[2] + w * gs[3]) = 0.0;
            }
        }
        let mut tmp = Vec::new();
        for o in ci * mult..(ci + 1) * mult {
            let yb = py.add(ni * ys[0] + o * ys[1]);
            for yo in 0..s.oh {
                let gyr = row_of(yb.add(yo * ys[2]), ys[3], s.ow, &mut tmp);
                for a in 0..s.kh {
                    let ih = (yo * g.sh + a * g.dh) as isize - g.ph as isize;
                    if ih < 0 || ih as usize >= s.hh {
                        continue;
                    }
                    let dst = gxb.add(ih as usize * gs[2]);
                    for b in 0..s.kw {
                        let off = (b * g.dw) as isize - g.pw as isize;
                        let (lo, hi) = valid_cols(off, g.sw, s.ww, s.ow);
                        if lo < hi {
                            add_row(dst, gs[3], (lo * g.sw) as isize + off, g.sw, &gyr[lo..hi], wk[o * s.kk + a * s.kw + b]);
                        }
                    }
                }
            }
        }
    };
    over_items(s.n * s.c, threads, plane);
}

/// The weight gradient of a stride-1 depthwise convolution with a 3×3 / 5×5 kernel and
/// channel multiplier 1 by the vector tap sums (`depthwise_vector::tap_sums`): per image, the
/// input plane padded once and every tap's products summed in a register over the plane,
/// instead of a dot product per (row, tap). A channel whose grad_out holds a NaN or an infinity
/// takes the loops (`dw_grad_weight_channel`): its product with the zero padding would be NaN
/// where autograd adds nothing. False, touching nothing, where that does not apply.
unsafe fn dw_grad_weight_by_taps(mem: &Mem, gy: &View, x: &View, gw: &View, s: &Shape, g: Geom, threads: usize) -> bool {
    let path = super::conv2d::path();
    if path == Path::Portable || s.oc != s.c || g.sh != 1 || g.sw != 1 || !matches!((s.kh, s.kw), (3, 3) | (5, 5)) || gy.strides[3] != 1 {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        let (px, py, pw) = (mem.ptr::<f32>(x), mem.ptr::<f32>(gy), mem.ptr::<f32>(gw));
        let (xs, ys, ws) = (&x.strides, &gy.strides, &gw.strides);
        let wp = s.ww + 2 * g.pw;
        let channel = |o: usize, _: usize| {
            let finite = (0..s.n).all(|ni| {
                (0..s.oh).all(|yo| std::slice::from_raw_parts(py.add(ni * ys[0] + o * ys[1] + yo * ys[2]), s.ow).iter().all(|v| v.is_finite()))
            });
            if !finite {
                dw_grad_weight_channel([px, py, pw], gy, x, gw, s, g, o);
                return;
            }
            let mut taps = vec![0f64; s.kk];
            let mut pad = vec![0f32; (s.hh + 2 * g.ph) * wp];
            for ni in 0..s.n {
                let d = DwArgs {
                    xb: px.add(ni * xs[0] + o * xs[1]),
                    xs: [xs[2], xs[3]],
                    hh: s.hh,
                    ww: s.ww,
                    wp,
                    kh: s.kh,
                    kw: s.kw,
                    g,
                    w: std::ptr::null_mut(),
                    yb: std::ptr::null_mut(),
                    ys: [0, 1],
                    oh: s.oh,
                    ow: s.ow,
                };
                let gyb = py.add(ni * ys[0] + o * ys[1]) as *const f32;
                let done = match path {
                    Path::Avx512 => super::depthwise_vector::tap_sums_avx512(&d, &mut pad, gyb, ys[2], &mut taps),
                    _ => super::depthwise_vector::tap_sums_avx2(&d, &mut pad, gyb, ys[2], &mut taps),
                };
                assert!(done, "the depthwise tap sums take every stride-1 3x3 / 5x5 plane");
            }
            for a in 0..s.kh {
                for b in 0..s.kw {
                    *pw.add(o * ws[0] + a * ws[2] + b * ws[3]) = taps[a * s.kw + b] as f32;
                }
            }
        };
        over_items(s.oc, threads, channel);
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (mem, x, gw, threads);
        false
    }
}

unsafe fn dw_grad_weight(mem: &Mem, gy: &View, x: &View, gw: &View, s: &Shape, g: Geom, threads: usize) {
    let ptrs = [mem.ptr::<f32>(x), mem.ptr::<f32>(gy), mem.ptr::<f32>(gw)];
    over_items(s.oc, threads, |o, _| dw_grad_weight_channel(ptrs, gy, x, gw, s, g, o));
}

/// Output channel `o`'s depthwise weight gradient by dot products of rows (any stride,
/// multiplier, kernel; NaN and infinities exactly as autograd: padding is never multiplied).
/// `ptrs`: x, grad_out and grad_weight's buffers.
unsafe fn dw_grad_weight_channel(ptrs: [SPtr<f32>; 3], gy: &View, x: &View, gw: &View, s: &Shape, g: Geom, o: usize) {
    let mult = s.oc / s.c;
    let [px, py, pw] = ptrs;
    let (xs, ys, ws) = (&x.strides, &gy.strides, &gw.strides);
    {
        let ci = o / mult;
        let mut taps = vec![0f64; s.kh * s.kw];
        let (mut tmp, mut xrow) = (Vec::new(), vec![0f32; s.ow]);
        for ni in 0..s.n {
            let (xb, yb) = (px.add(ni * xs[0] + ci * xs[1]), py.add(ni * ys[0] + o * ys[1]));
            for yo in 0..s.oh {
                let gyr = row_of(yb.add(yo * ys[2]), ys[3], s.ow, &mut tmp);
                for a in 0..s.kh {
                    let ih = (yo * g.sh + a * g.dh) as isize - g.ph as isize;
                    if ih < 0 || ih as usize >= s.hh {
                        continue;
                    }
                    let src = xb.add(ih as usize * xs[2]);
                    for b in 0..s.kw {
                        let off = (b * g.dw) as isize - g.pw as isize;
                        let (lo, hi) = valid_cols(off, g.sw, s.ww, s.ow);
                        if lo >= hi {
                            continue;
                        }
                        let first = (lo * g.sw) as isize + off;
                        let xr: &[f32] = if g.sw == 1 && xs[3] == 1 {
                            std::slice::from_raw_parts(src.offset(first), hi - lo)
                        } else {
                            let step = (g.sw * xs[3]) as isize;
                            let s0 = src.offset(first * xs[3] as isize);
                            for (q, d) in xrow[..hi - lo].iter_mut().enumerate() {
                                *d = *s0.offset(q as isize * step);
                            }
                            &xrow[..hi - lo]
                        };
                        taps[a * s.kw + b] += dot_rows::dot(&gyr[lo..hi], xr) as f64;
                    }
                }
            }
        }
        for a in 0..s.kh {
            for b in 0..s.kw {
                *pw.add(o * ws[0] + a * ws[2] + b * ws[3]) = taps[a * s.kw + b] as f32;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::tensor::DType;

    fn data(len: usize, mul: usize, md: usize) -> Vec<f32> {
        (0..len).map(|i| ((i * mul % md) as f32 - (md / 2) as f32) / md as f32).collect()
    }

    /// The three gradients by the direct sums (f64), NCHW.
    fn naive(x: &[f32], w: &[f32], gy: &[f32], d: [usize; 7], g: Geom, oh: usize, ow: usize) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
        let [n, c, hh, ww, oc, kh, kw] = d;
        let (cg, ocg) = (c / g.groups, oc / g.groups);
        let (mut gx, mut gw, mut gb) = (vec![0f64; x.len()], vec![0f64; w.len()], vec![0f64; oc]);
        for ni in 0..n {
            for o in 0..oc {
                for yo in 0..oh {
                    for xo in 0..ow {
                        let gv = gy[((ni * oc + o) * oh + yo) * ow + xo] as f64;
                        gb[o] += gv;
                        for ci in 0..cg {
                            for a in 0..kh {
                                for b in 0..kw {
                                    let ih = (yo * g.sh + a * g.dh) as isize - g.ph as isize;
                                    let iw = (xo * g.sw + b * g.dw) as isize - g.pw as isize;
                                    if ih >= 0 && (ih as usize) < hh && iw >= 0 && (iw as usize) < ww {
                                        let xi = ((ni * c + (o / ocg) * cg + ci) * hh + ih as usize) * ww + iw as usize;
                                        let wi = ((o * cg + ci) * kh + a) * kw + b;
                                        gx[xi] += gv * w[wi] as f64;
                                        gw[wi] += gv * x[xi] as f64;
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        (gx, gw, gb)
    }

    fn close(got: &[f32], want: &[f64], what: &str) {
        for (i, (a, b)) in got.iter().zip(want).enumerate() {
            assert!((*a as f64 - b).abs() < 1e-4 * (1.0 + b.abs()), "{what} [{i}]: {a} vs {b}");
        }
    }

    /// Grouped, depthwise (with a channel multiplier), strided, dilated, padded, 1×1 and a
    /// channels-last input and grad_input, one and two threads, against the direct sums.
    #[test]
    fn gradients_match_the_direct_sums() {
        // (n, c, h, w, oc, k, stride, pad, dilation, groups, channels_last)
        let cases = [
            (2, 4, 7, 9, 6, 3, 1, 1, 1, 1, false),
            (3, 6, 9, 8, 4, 3, 2, 1, 1, 2, false),
            (2, 4, 8, 10, 8, 3, 1, 2, 2, 4, false),
            (2, 3, 6, 7, 3, 3, 2, 0, 1, 3, true),
            (2, 5, 6, 7, 3, 1, 1, 0, 1, 1, false),
            (2, 5, 6, 7, 4, 3, 1, 1, 1, 1, true),
            (0, 4, 5, 5, 4, 3, 1, 1, 1, 1, false),
            // depthwise stride 1, multiplier 1 (grad_input by the forward's vector planes):
            // 3×3 / 5×5, padding 0 / k / 2, dilation 2, widths past one and two vectors
            (2, 4, 7, 9, 4, 3, 1, 1, 1, 4, false),
            (2, 3, 8, 20, 3, 5, 1, 2, 1, 3, false),
            (2, 4, 8, 37, 4, 3, 1, 2, 2, 4, false),
            (1, 3, 6, 7, 3, 3, 1, 0, 1, 3, false),
            (2, 4, 7, 9, 4, 3, 1, 1, 1, 4, true),
        ];
        for &(n, c, hh, ww, oc, k, st, p, dl, groups, cl) in &cases {
            let g = Geom { sh: st, sw: st, ph: p, pw: p, dh: dl, dw: dl, groups };
            let oh = (hh + 2 * p - dl * (k - 1) - 1) / st + 1;
            let ow = (ww + 2 * p - dl * (k - 1) - 1) / st + 1;
            let cg = c / groups;
            let (x, w, gy) = (data(n * c * hh * ww, 7, 23), data(oc * cg * k * k, 5, 11), data(n * oc * oh * ow, 3, 13));
            let (wx, ww_, wb) = naive(&x, &w, &gy, [n, c, hh, ww, oc, k, k], g, oh, ow);
            let nchw = |cc: usize, h: usize, wd: usize| vec![cc * h * wd, h * wd, wd, 1];
            let nhwc = |cc: usize, h: usize, wd: usize| vec![h * wd * cc, 1, wd * cc, cc];
            let to_nhwc = |v: &[f32], cc: usize, h: usize, wd: usize| {
                let mut t = vec![0f32; v.len()];
                for i in 0..v.len() {
                    let (ni, ci, hi, wi) = (i / (cc * h * wd), i / (h * wd) % cc, i / wd % h, i % wd);
                    t[((ni * h + hi) * wd + wi) * cc + ci] = v[i];
                }
                t
            };
            let (mut xb, xs) = if cl { (to_nhwc(&x, c, hh, ww), nhwc(c, hh, ww)) } else { (x.clone(), nchw(c, hh, ww)) };
            let (mut gyb, ys) = if cl { (to_nhwc(&gy, oc, oh, ow), nhwc(oc, oh, ow)) } else { (gy.clone(), nchw(oc, oh, ow)) };
            let mut wb_ = w.clone();
            for threads in [1, 2] {
                let (mut gx, mut gw, mut gb) = (vec![f32::NAN; x.len()], vec![f32::NAN; w.len()], vec![f32::NAN; oc]);
                let mem = Mem {
                    ptrs: [xb.as_mut_ptr(), wb_.as_mut_ptr(), gyb.as_mut_ptr(), gx.as_mut_ptr(), gw.as_mut_ptr(), gb.as_mut_ptr()].iter().map(|p| *p as *mut u8).collect(),
                };
                let xv = View::new(0, &[n, c, hh, ww], &xs, DType::F32);
                let wv = View::new(1, &[oc, cg, k, k], &nchw(cg, k, k), DType::F32);
                let yv = View::new(2, &[n, oc, oh, ow], &ys, DType::F32);
                let grads = Grads {
                    input: Some(View::new(3, &[n, c, hh, ww], &xs, DType::F32)),
                    weight: Some(View::new(4, &[oc, cg, k, k], &nchw(cg, k, k), DType::F32)),
                    bias: Some(View::new(5, &[oc], &[1], DType::F32)),
                };
                unsafe { conv2d_backward(&mem, &yv, &xv, &wv, &grads, g, threads) };
                let gx_nchw = if cl {
                    (0..gx.len()).map(|i| { let (ni, ci, hi, wi) = (i / (c * hh * ww), i / (hh * ww) % c, i / ww % hh, i % ww); gx[((ni * hh + hi) * ww + wi) * c + ci] }).collect()
                } else {
                    gx.clone()
                };
                let what = format!("n{n} c{c} oc{oc} k{k} s{st} p{p} d{dl} g{groups} cl{cl} t{threads}");
                close(&gx_nchw, &wx, &format!("grad_input {what}"));
                close(&gw, &ww_, &format!("grad_weight {what}"));
                close(&gb, &wb, &format!("grad_bias {what}"));
            }
        }
    }
}
