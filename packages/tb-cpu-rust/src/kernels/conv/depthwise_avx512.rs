//! Depthwise convolution planes of stride 1 with a 3×3 or 5×5 kernel (MobileNet's, any
//! dilation) in AVX-512 registers: the kernel's taps are broadcast once per plane and kept in
//! registers, each output row is taken up to 4 vectors of 16 columns at a time (a masked last
//! vector instead of a scalar tail), and the epilogue (the folded batch norm's
//! shift, relu / clamp, a residual) runs on the sums before the single store of each vector.
//!
//! The sums are the same fused multiply-adds in the same tap order as `conv2d::dw_plane`, so
//! both give the same bits; only the loop structure differs (the portable loop left its sums
//! and the taps in memory: 9 GMAC/s for 128 channels of 32 × 32 on one Zen 4 core).

use super::conv2d::{pad_plane, DwArgs};
use crate::kernels::gemm::epilogue::{RegEpi, RegOp};
use crate::kernels::gemm::Epi;
use std::arch::x86_64::*;

/// Runs one output plane when it has this form — stride 1, a 3×3 or 5×5 kernel, output rows
/// contiguous, an epilogue of the forms registers take (`Epi::in_registers`) — and returns
/// true; false, touching nothing, otherwise.
///
/// # Safety
/// The CPU has AVX-512F; `d` valid as for `conv2d::dw_plane`, `pad` at least (hh + 2 ph) × wp.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn plane(d: &DwArgs, pad: &mut [f32], e: &Epi) -> bool {
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
            pad_copy(d, pad);
            rows::<3, 3>(d, pad, reg.as_ref());
        }
        (5, 5) => {
            pad_copy(d, pad);
            rows::<5, 5>(d, pad, reg.as_ref());
        }
        _ => return false,
    }
    true
}

/// `conv2d::pad_plane` in vectors for an input plane whose rows are contiguous (a row of 32
/// floats was a libc memcpy call and two fills, 9 % of the depthwise step); else that.
#[inline(always)]
unsafe fn pad_copy(d: &DwArgs, pad: &mut [f32]) {
    if d.xs[1] != 1 {
        pad_plane(d, pad);
        return;
    }
    let (ph, pw, wp) = (d.g.ph, d.g.pw, d.wp);
    let hp = d.hh + 2 * ph;
    let zero = _mm512_setzero_ps();
    let pp = pad.as_mut_ptr();
    // every padded row zeroed (the border), then each input row copied into its interior
    let mut q = 0;
    while q < hp * wp {
        _mm512_mask_storeu_ps(pp.add(q), mask(hp * wp - q), zero);
        q += 16;
    }
    for h in 0..d.hh {
        let (src, dst) = (d.xb.add(h * d.xs[0]), pp.add((ph + h) * wp + pw));
        let mut q = 0;
        while q < d.ww {
            let m = mask(d.ww - q);
            _mm512_mask_storeu_ps(dst.add(q), m, _mm512_maskz_loadu_ps(m, src.add(q)));
            q += 16;
        }
    }
}

/// Every output row of the plane from the padded input `pad`. (Blocks of 2 or 4 rows, for
/// more independent chains of multiply-adds, measured slower: 0.65 / 0.71-0.80 ms against
/// 0.62 for 128 planes of 32 × 32, batch 8, one thread.)
#[inline(always)]
unsafe fn rows<const KH: usize, const KW: usize>(d: &DwArgs, pad: &[f32], e: Option<&RegEpi>) {
    let mut taps = [[_mm512_setzero_ps(); KW]; KH];
    for (a, row) in taps.iter_mut().enumerate() {
        for (b, t) in row.iter_mut().enumerate() {
            *t = _mm512_set1_ps(*d.w.add(a * KW + b));
        }
    }
    let (pp, ow) = (pad.as_ptr(), d.ow);
    for yo in 0..d.oh {
        let at = Row { src: pp.add(yo * d.wp), dh: d.g.dh * d.wp, dw: d.g.dw, dst: d.yb.add(yo * d.ys[0]), yo };
        let mut xo = 0;
        while xo < ow {
            let left = ow - xo;
            xo += match left {
                49.. => block::<KH, KW, 4>(&at, xo, &taps, mask(left - 48), e),
                33.. => block::<KH, KW, 3>(&at, xo, &taps, mask(left - 32), e),
                17.. => block::<KH, KW, 2>(&at, xo, &taps, mask(left - 16), e),
                _ => block::<KH, KW, 1>(&at, xo, &taps, mask(left), e),
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

/// Lanes of the last vector of a block: `left` columns (16 or more: all).
#[inline(always)]
fn mask(left: usize) -> __mmask16 {
    if left >= 16 {
        0xFFFF
    } else {
        ((1u32 << left) - 1) as __mmask16
    }
}

/// NV vectors of output columns from xo (the last one masked by `last`): the sums of all taps
/// in registers, the epilogue, one store each. Returns the columns done.
#[inline(always)]
unsafe fn block<const KH: usize, const KW: usize, const NV: usize>(r: &Row, xo: usize, taps: &[[__m512; KW]; KH], last: __mmask16, e: Option<&RegEpi>) -> usize {
    let lane_mask = |v: usize| if v + 1 == NV { last } else { 0xFFFF };
    let mut acc = [_mm512_setzero_ps(); NV];
    for (a, row_taps) in taps.iter().enumerate() {
        let row = r.src.add(a * r.dh + xo);
        for (b, &t) in row_taps.iter().enumerate() {
            let src = row.add(b * r.dw);
            for (v, s) in acc.iter_mut().enumerate() {
                *s = _mm512_fmadd_ps(t, _mm512_maskz_loadu_ps(lane_mask(v), src.add(16 * v)), *s);
            }
        }
    }
    for (v, &s) in acc.iter().enumerate() {
        let (m, col) = (lane_mask(v), xo + 16 * v);
        let x = match e {
            Some(e) => epilogue(e, r.yo, col, m, s),
            None => s,
        };
        _mm512_mask_storeu_ps(r.dst.add(col), m, x);
    }
    (NV - 1) * 16 + last.count_ones() as usize
}

/// The epilogue on the sums of output row `yo`, columns col.. (lanes `m`), in the order
/// `Epi::apply_row` applies it: bias, then each step (max / min take their NaN from the second
/// operand: a NaN stays NaN through relu and clamp). The same bits as `apply_row` where the
/// scales (beta, a residual's alpha) are powers of two — a scaled residual is one fused
/// multiply-add here, a product and a sum there.
#[inline(always)]
unsafe fn epilogue(e: &RegEpi, yo: usize, col: usize, m: __mmask16, mut x: __m512) -> __m512 {
    if !e.row_bias.is_null() {
        x = _mm512_add_ps(x, _mm512_set1_ps(e.beta * *e.row_bias.offset(yo as isize * e.row_bias_step)));
    }
    if !e.col_bias.is_null() {
        x = _mm512_fmadd_ps(_mm512_set1_ps(e.beta), _mm512_maskz_loadu_ps(m, e.col_bias.add(col)), x);
    }
    for op in e.ops() {
        x = match *op {
            RegOp::Relu => _mm512_max_ps(_mm512_setzero_ps(), x),
            RegOp::Clamp(lo, hi) => _mm512_min_ps(_mm512_set1_ps(hi), _mm512_max_ps(_mm512_set1_ps(lo), x)),
            RegOp::Add(p, rs, alpha) => _mm512_fmadd_ps(_mm512_set1_ps(alpha), _mm512_maskz_loadu_ps(m, p.offset(yo as isize * rs).add(col)), x),
        };
    }
    x
}
