//! Depthwise convolution planes of stride 1 with a 3×3 or 5×5 kernel (MobileNet's, any
//! dilation) in vector registers, AVX-512 (16 lanes) or AVX2 (8 lanes): the kernel's taps are
//! broadcast once per plane and kept in registers, each output row is taken up to 4 vectors
//! at a time (a masked last vector instead of a scalar tail), and the epilogue (the folded
//! batch norm's shift, relu / clamp, a residual) runs on the sums before the single store of
//! each vector.
//!
//! The sums are the same fused multiply-adds in the same tap order as `conv2d::dw_plane`, so
//! both give the same bits; only the loop structure differs (the portable loop left its sums
//! and the taps in memory: 9 GMAC/s for 128 channels of 32 × 32 on one Zen 4 core; this one
//! 15-17).

use super::conv2d::{pad_plane, DwArgs};
use crate::core::lanes::{Lanes, Y8, Z16};
use crate::kernels::gemm::epilogue::RegEpi;
use crate::kernels::gemm::Epi;

/// One plane on AVX-512 (`plane`).
///
/// # Safety
/// The CPU has AVX-512F; as `plane`.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn plane_avx512(d: &DwArgs, pad: &mut [f32], e: &Epi) -> bool {
    plane::<Z16>(d, pad, e)
}

/// One plane on AVX2 (`plane`).
///
/// # Safety
/// The CPU has AVX2 and FMA; as `plane`.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn plane_avx2(d: &DwArgs, pad: &mut [f32], e: &Epi) -> bool {
    plane::<Y8>(d, pad, e)
}

/// The weight gradient of one plane of a stride-1 3×3 / 5×5 depthwise convolution on AVX-512
/// (`tap_sums`).
///
/// # Safety
/// The CPU has AVX-512F; as `tap_sums`.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn tap_sums_avx512(d: &DwArgs, pad: &mut [f32], gy: *const f32, gys: usize, taps: &mut [f64]) -> bool {
    tap_sums::<Z16>(d, pad, gy, gys, taps)
}

/// `tap_sums_avx512` on AVX2.
///
/// # Safety
/// The CPU has AVX2 and FMA; as `tap_sums`.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn tap_sums_avx2(d: &DwArgs, pad: &mut [f32], gy: *const f32, gys: usize, taps: &mut [f64]) -> bool {
    tap_sums::<Y8>(d, pad, gy, gys, taps)
}

/// Adds to `taps[a · kw + b]` the sum over the plane's output positions of
/// `gy[yo, xo] · x[yo + a·dh − ph, xo + b·dw − pw]` (zero outside the input): one input plane's
/// share of a depthwise weight gradient. `d` is the forward's plane (input `xb`, geometry,
/// output size; its weights and output unused), `gy` grad_out's plane with contiguous rows
/// `gys` apart. Each tap's products are summed in a vector register over the plane, then once
/// into float64. False, touching nothing, unless stride 1 and a 3×3 / 5×5 kernel.
#[inline(always)]
unsafe fn tap_sums<V: Lanes>(d: &DwArgs, pad: &mut [f32], gy: *const f32, gys: usize, taps: &mut [f64]) -> bool {
    if d.g.sh != 1 || d.g.sw != 1 {
        return false;
    }
    match (d.kh, d.kw) {
        (3, 3) => {
            pad_copy::<V>(d, pad);
            plane_tap_sums::<V, 3, 3>(d, pad, gy, gys, taps);
        }
        (5, 5) => {
            pad_copy::<V>(d, pad);
            plane_tap_sums::<V, 5, 5>(d, pad, gy, gys, taps);
        }
        _ => return false,
    }
    true
}

#[inline(always)]
unsafe fn plane_tap_sums<V: Lanes, const KH: usize, const KW: usize>(d: &DwArgs, pad: &[f32], gy: *const f32, gys: usize, taps: &mut [f64]) {
    let mut acc = [[V::zero(); KW]; KH];
    let (pp, n) = (pad.as_ptr(), V::N);
    for yo in 0..d.oh {
        let g = gy.add(yo * gys);
        let mut xo = 0;
        while xo < d.ow {
            let live = (d.ow - xo).min(n);
            let gv = V::load(g.add(xo), live);
            for (a, row) in acc.iter_mut().enumerate() {
                let src = pp.add((yo + a * d.g.dh) * d.wp + xo);
                for (b, s) in row.iter_mut().enumerate() {
                    *s = gv.fma(V::load(src.add(b * d.g.dw), live), *s);
                }
            }
            xo += n;
        }
    }
    for (a, row) in acc.iter().enumerate() {
        for (b, s) in row.iter().enumerate() {
            taps[a * KW + b] += s.sum() as f64;
        }
    }
}

/// Runs one output plane when it has this form — stride 1, a 3×3 or 5×5 kernel, output rows
/// contiguous, an epilogue of the forms registers take (`Epi::in_registers`) — and returns
/// true; false, touching nothing, otherwise.
///
/// # Safety
/// `d` valid as for `conv2d::dw_plane`, `pad` at least (hh + 2 ph) × wp floats; the caller
/// has the instruction set of `V`.
#[inline(always)]
unsafe fn plane<V: Lanes>(d: &DwArgs, pad: &mut [f32], e: &Epi) -> bool {
    if d.g.sh != 1 || d.g.sw != 1 || d.ys[1] != 1 {
        return false;
    }
    let reg = if e.is_empty() {
        None
    } else {
        match e.in_registers(0, 0) {
            Some(r) => Some(r),
            None => return false,
        }
    };
    match (d.kh, d.kw) {
        (3, 3) => {
            pad_copy::<V>(d, pad);
            rows::<V, 3, 3>(d, pad, reg.as_ref());
        }
        (5, 5) => {
            pad_copy::<V>(d, pad);
            rows::<V, 5, 5>(d, pad, reg.as_ref());
        }
        _ => return false,
    }
    true
}

/// `conv2d::pad_plane` in vectors for an input plane whose rows are contiguous (a row of 32
/// floats was a libc memcpy call and two fills, 9 % of the depthwise step); else that.
#[inline(always)]
unsafe fn pad_copy<V: Lanes>(d: &DwArgs, pad: &mut [f32]) {
    if d.xs[1] != 1 {
        pad_plane(d, pad);
        return;
    }
    let (ph, pw, wp) = (d.g.ph, d.g.pw, d.wp);
    let total = (d.hh + 2 * ph) * wp;
    let pp = pad.as_mut_ptr();
    // every padded row zeroed (the border), then each input row copied into its interior
    let mut q = 0;
    while q < total {
        V::zero().store(pp.add(q), total - q);
        q += V::N;
    }
    for h in 0..d.hh {
        let (src, dst) = (d.xb.add(h * d.xs[0]), pp.add((ph + h) * wp + pw));
        let mut q = 0;
        while q < d.ww {
            V::load(src.add(q), d.ww - q).store(dst.add(q), d.ww - q);
            q += V::N;
        }
    }
}

/// Every output row of the plane from the padded input `pad`. (Blocks of 2 or 4 rows, for
/// more independent chains of multiply-adds, measured slower on AVX-512: 0.65 / 0.71-0.80 ms
/// against 0.62 for 128 planes of 32 × 32, batch 8, one thread.)
#[inline(always)]
unsafe fn rows<V: Lanes, const KH: usize, const KW: usize>(d: &DwArgs, pad: &[f32], e: Option<&RegEpi>) {
    let mut taps = [[V::zero(); KW]; KH];
    for (a, row) in taps.iter_mut().enumerate() {
        for (b, t) in row.iter_mut().enumerate() {
            *t = V::splat(*d.w.add(a * KW + b));
        }
    }
    let (pp, ow, n) = (pad.as_ptr(), d.ow, V::N);
    for yo in 0..d.oh {
        let at = Row { src: pp.add(yo * d.wp), dh: d.g.dh * d.wp, dw: d.g.dw, dst: d.yb.add(yo * d.ys[0]), yo };
        let mut xo = 0;
        while xo < ow {
            let left = ow - xo;
            xo += if left > 3 * n {
                block::<V, KH, KW, 4>(&at, xo, &taps, left - 3 * n, e)
            } else if left > 2 * n {
                block::<V, KH, KW, 3>(&at, xo, &taps, left - 2 * n, e)
            } else if left > n {
                block::<V, KH, KW, 2>(&at, xo, &taps, left - n, e)
            } else {
                block::<V, KH, KW, 1>(&at, xo, &taps, left, e)
            };
        }
    }
}

/// One output row's operands: its first padded input row, the distance between the kernel's
/// rows (floats) and columns, its output row and index.
struct Row {
    src: *const f32,
    dh: usize,
    dw: usize,
    dst: *mut f32,
    yo: usize,
}

/// NV vectors of output columns from xo (the last one with `last` live lanes, all when `last`
/// ≥ the lane count): the sums of all taps in registers, the epilogue, one store each.
/// Returns the columns done.
#[inline(always)]
unsafe fn block<V: Lanes, const KH: usize, const KW: usize, const NV: usize>(r: &Row, xo: usize, taps: &[[V; KW]; KH], last: usize, e: Option<&RegEpi>) -> usize {
    let live = |v: usize| if v + 1 == NV { last.min(V::N) } else { V::N };
    let mut acc = [V::zero(); NV];
    for (a, row_taps) in taps.iter().enumerate() {
        let row = r.src.add(a * r.dh + xo);
        for (b, &t) in row_taps.iter().enumerate() {
            let src = row.add(b * r.dw);
            for (v, s) in acc.iter_mut().enumerate() {
                *s = t.fma(V::load(src.add(V::N * v), live(v)), *s);
            }
        }
    }
    for (v, &s) in acc.iter().enumerate() {
        let (n, col) = (live(v), xo + V::N * v);
        let x = match e {
            Some(e) => e.apply(r.yo, col, n, s),
            None => s,
        };
        x.store(r.dst.add(col), n);
    }
    (NV - 1) * V::N + last.min(V::N)
}
