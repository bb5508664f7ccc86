//! The two products of a bfloat16 model's attention on `vdpbf16ps` (AVX-512 BF16), as eager
//! PyTorch's bfloat16 flash attention computes them: Q·Kᵀ of the bfloat16 query and key rows
//! with float32 sums, then the softmax's probabilities rounded to bfloat16 times bfloat16 V,
//! float32 sums. Each operand is rounded (Q, K and V are bfloat16 values already: exact) and
//! laid out as 32-bit pairs along the product's depth for the pair micro-kernel
//! (`gemm::bf16::x86::Pairs`, through the own GEMM's packing): half the float32 kernel's cycles
//! per multiply-add. For the `sdpa` step's `bf16` (the lowering saw bfloat16 q, k and v widened).

use crate::core::mem::SPtr;
use crate::kernels::gemm::bf16::x86::{bf16_lanes, Pairs};
use crate::kernels::gemm::{Epi, Mat};
use std::arch::x86_64::*;

/// Whether the pair kernel runs here (AVX-512 BF16, own GEMM backend).
pub(super) fn available() -> bool {
    crate::kernels::gemm::bf16::pairs_available()
}

/// u16 values a row of `n` bfloat16 takes in pair form (n rounded up to even).
fn even(n: usize) -> usize {
    n + n % 2
}

/// 32-bit values `scores` / `output` need as scratch for one task (`rows` queries, `nk` keys,
/// depth `e`, value width `ev`).
pub(super) fn scratch_len(rows: usize, nk: usize, e: usize, ev: usize) -> usize {
    (rows * even(e) + nk * even(e) + rows * even(nk) + even(nk) * ev) / 2
}

/// sc (rows × nk, rows nk apart) = scale · Q Kᵀ: `q` rows `qs` apart (element stride `qe`),
/// `k` rows `ks` apart (element stride `ke`), depth e.
///
/// # Safety
/// The pointers valid for those sizes; `scratch` holds `scratch_len(..)` values; `available()`.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn scores(q: *const f32, qs: usize, qe: usize, k: *const f32, ks: usize, ke: usize, rows: usize, nk: usize, e: usize, scale: f32, sc: *mut f32, scratch: &mut [u32]) {
    let e2 = even(e) / 2;
    let (qp, rest) = scratch.split_at_mut(rows * e2);
    let kp = &mut rest[..nk * e2];
    for r in 0..rows {
        round_row(q.add(r * qs), qe, e, qp.as_mut_ptr().add(r * e2) as *mut u16);
    }
    for j in 0..nk {
        round_row(k.add(j * ks), ke, e, kp.as_mut_ptr().add(j * e2) as *mut u16);
    }
    let a = Mat { p: SPtr(qp.as_mut_ptr() as *mut f32), rs: e2 as isize, cs: 1 };
    // B (e2 × nk): column j is key j's pairs
    let b = Mat { p: SPtr(kp.as_mut_ptr() as *mut f32), rs: 1, cs: e2 as isize };
    let c = Mat { p: SPtr(sc), rs: nk as isize, cs: 1 };
    crate::kernels::gemm::own::drive::<Pairs>(rows, nk, e2, a, b, c, scale, false, 1, &Epi::default());
}

/// o (rows × ev, rows `os` apart, element stride `oe`) = P V: P the probabilities (rows × nk,
/// rows nk apart, float32: rounded here), `v` rows `vs` apart (element stride `ve`).
///
/// # Safety
/// As `scores`.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn output(p: *const f32, rows: usize, nk: usize, v: *const f32, vs: usize, ve: usize, ev: usize, o: *mut f32, os: usize, oe: usize, scratch: &mut [u32]) {
    let n2 = even(nk) / 2;
    let (pp, rest) = scratch.split_at_mut(rows * n2);
    let vp = &mut rest[..n2 * ev];
    for r in 0..rows {
        round_row(p.add(r * nk), 1, nk, pp.as_mut_ptr().add(r * n2) as *mut u16);
    }
    // V's rows 2t and 2t + 1 as pair row t (a missing last row zero)
    for t in 0..n2 {
        let (lo, hi) = (v.add(2 * t * vs), (2 * t + 1 < nk).then(|| v.add((2 * t + 1) * vs)));
        pair_rows(lo, hi, ve, ev, vp.as_mut_ptr().add(t * ev));
    }
    let a = Mat { p: SPtr(pp.as_mut_ptr() as *mut f32), rs: n2 as isize, cs: 1 };
    let b = Mat { p: SPtr(vp.as_mut_ptr() as *mut f32), rs: ev as isize, cs: 1 };
    let c = Mat { p: SPtr(o), rs: os as isize, cs: oe as isize };
    crate::kernels::gemm::own::drive::<Pairs>(rows, ev, n2, a, b, c, 1.0, false, 1, &Epi::default());
}

/// n floats from `src` (element stride `st`) rounded to bfloat16 into `dst`, then a zero when
/// n is odd (the last pair's high half).
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn round_row(src: *const f32, st: usize, n: usize, dst: *mut u16) {
    let mut i = 0;
    if st == 1 {
        while i < n {
            let live = 16.min(n - i);
            let mask: __mmask16 = if live == 16 { 0xFFFF } else { ((1u32 << live) - 1) as __mmask16 };
            let h = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, src.add(i)));
            _mm256_mask_storeu_epi16(dst.add(i) as *mut i16, mask, std::mem::transmute::<__m256bh, __m256i>(h));
            i += 16;
        }
    } else {
        for j in 0..n {
            *dst.add(j) = crate::core::element::f32_to_bf16(*src.add(j * st));
        }
    }
    if n % 2 == 1 {
        *dst.add(n) = 0;
    }
}

/// dst[j] = (lo[j], hi[j]) as a bfloat16 pair for j < n (hi None: zero high halves); elements
/// `st` apart.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn pair_rows(lo: *const f32, hi: Option<*const f32>, st: usize, n: usize, dst: *mut u32) {
    if st == 1 {
        let mut j = 0;
        while j < n {
            let live = 16.min(n - j);
            let mask: __mmask16 = if live == 16 { 0xFFFF } else { ((1u32 << live) - 1) as __mmask16 };
            let l = bf16_lanes(_mm512_maskz_loadu_ps(mask, lo.add(j)));
            let pair = match hi {
                Some(h) => _mm512_or_si512(l, _mm512_slli_epi32::<16>(bf16_lanes(_mm512_maskz_loadu_ps(mask, h.add(j))))),
                None => l,
            };
            _mm512_mask_storeu_epi32(dst.add(j) as *mut i32, mask, pair);
            j += 16;
        }
        return;
    }
    for j in 0..n {
        let h = hi.map_or(0, |h| u32::from(crate::core::element::f32_to_bf16(*h.add(j * st))));
        *dst.add(j) = u32::from(crate::core::element::f32_to_bf16(*lo.add(j * st))) | (h << 16);
    }
}
