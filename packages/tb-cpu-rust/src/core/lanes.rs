//! Vector registers behind one trait, so a kernel written once over `V: Lanes` runs on
//! AVX-512 (`Z16`, 16 lanes) and AVX2 (`Y8`, 8 lanes): the caller's `#[target_feature]` entry
//! point picks the type, and everything below it inlines into that function.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

/// The vector operations the kernels use, per instruction set (`live`: the number of leading
/// lanes that are live; masked loads give 0 in the others, masked stores leave them untouched).
///
/// # Safety
/// Every method runs its instruction set's intrinsics: call them only where the CPU has it.
pub(crate) trait Lanes: Copy {
    const N: usize;
    unsafe fn zero() -> Self;
    unsafe fn splat(v: f32) -> Self;
    /// self * x + acc
    unsafe fn fma(self, x: Self, acc: Self) -> Self;
    unsafe fn add(self, x: Self) -> Self;
    /// self - x
    unsafe fn sub(self, x: Self) -> Self;
    /// max / min with the NaN of `x` (the second operand) kept
    unsafe fn max(self, x: Self) -> Self;
    unsafe fn min(self, x: Self) -> Self;
    /// max that is NaN where either lane is (max_pool's rule)
    unsafe fn max_nan(self, x: Self) -> Self;
    unsafe fn load(p: *const f32, live: usize) -> Self;
    /// Lanes from..to loaded (from < to ≤ N), the others 0 and not read: `p` may point before
    /// or past the buffer where those lanes would.
    unsafe fn load_range(p: *const f32, from: usize, to: usize) -> Self;
    unsafe fn store(self, p: *mut f32, live: usize);
    /// the sum of the lanes
    unsafe fn sum(self) -> f32;
    /// Interleaves the lanes of `self` (a) and `x` (b): (a0 b0 a1 b1 … of the first halves,
    /// the same of the second halves).
    unsafe fn zip(self, x: Self) -> (Self, Self);
    /// The inverse of `zip` over the 2N floats `self` then `x`: (even lanes, odd lanes).
    unsafe fn unzip(self, x: Self) -> (Self, Self);
    /// Whether a lane holds NaN or ±inf.
    unsafe fn any_nonfinite(self) -> bool;
}

/// 16 float32 lanes in a zmm register (AVX-512F).
#[derive(Clone, Copy)]
pub(crate) struct Z16(pub(crate) __m512);

/// 8 float32 lanes in a ymm register (AVX2 + FMA).
#[derive(Clone, Copy)]
pub(crate) struct Y8(pub(crate) __m256);

#[inline(always)]
fn mask16(live: usize) -> __mmask16 {
    if live >= 16 {
        0xFFFF
    } else {
        ((1u32 << live) - 1) as __mmask16
    }
}

impl Lanes for Z16 {
    const N: usize = 16;
    #[inline(always)]
    unsafe fn zero() -> Self {
        Z16(_mm512_setzero_ps())
    }
    #[inline(always)]
    unsafe fn splat(v: f32) -> Self {
        Z16(_mm512_set1_ps(v))
    }
    #[inline(always)]
    unsafe fn fma(self, x: Self, acc: Self) -> Self {
        Z16(_mm512_fmadd_ps(self.0, x.0, acc.0))
    }
    #[inline(always)]
    unsafe fn add(self, x: Self) -> Self {
        Z16(_mm512_add_ps(self.0, x.0))
    }
    #[inline(always)]
    unsafe fn sub(self, x: Self) -> Self {
        Z16(_mm512_sub_ps(self.0, x.0))
    }
    #[inline(always)]
    unsafe fn max(self, x: Self) -> Self {
        Z16(_mm512_max_ps(self.0, x.0))
    }
    #[inline(always)]
    unsafe fn min(self, x: Self) -> Self {
        Z16(_mm512_min_ps(self.0, x.0))
    }
    #[inline(always)]
    unsafe fn max_nan(self, x: Self) -> Self {
        // max_ps gives x where either is NaN: self's NaN lanes put back
        let m = _mm512_max_ps(self.0, x.0);
        Z16(_mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_UNORD_Q>(self.0, self.0), m, self.0))
    }
    #[inline(always)]
    unsafe fn load(p: *const f32, live: usize) -> Self {
        Z16(if live >= 16 { _mm512_loadu_ps(p) } else { _mm512_maskz_loadu_ps(mask16(live), p) })
    }
    #[inline(always)]
    unsafe fn load_range(p: *const f32, from: usize, to: usize) -> Self {
        Z16(_mm512_maskz_loadu_ps(mask16(to) & !mask16(from), p))
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32, live: usize) {
        if live >= 16 {
            _mm512_storeu_ps(p, self.0)
        } else {
            _mm512_mask_storeu_ps(p, mask16(live), self.0)
        }
    }
    #[inline(always)]
    unsafe fn sum(self) -> f32 {
        _mm512_reduce_add_ps(self.0)
    }
    #[inline(always)]
    unsafe fn zip(self, x: Self) -> (Self, Self) {
        // index bit 4 picks x
        let lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
        let hi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
        (Z16(_mm512_permutex2var_ps(self.0, lo, x.0)), Z16(_mm512_permutex2var_ps(self.0, hi, x.0)))
    }
    #[inline(always)]
    unsafe fn unzip(self, x: Self) -> (Self, Self) {
        let ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        let od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
        (Z16(_mm512_permutex2var_ps(self.0, ev, x.0)), Z16(_mm512_permutex2var_ps(self.0, od, x.0)))
    }
    #[inline(always)]
    unsafe fn any_nonfinite(self) -> bool {
        // x - x is 0 for a finite x, NaN for NaN / ±inf
        let d = _mm512_sub_ps(self.0, self.0);
        _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(d, _mm512_setzero_ps()) != 0xFFFF
    }
}

/// Lanes 0..live set (all ones), for AVX2's masked loads and stores.
#[inline(always)]
unsafe fn mask8(live: usize) -> __m256i {
    let idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    _mm256_cmpgt_epi32(_mm256_set1_epi32(live.min(8) as i32), idx)
}

impl Lanes for Y8 {
    const N: usize = 8;
    #[inline(always)]
    unsafe fn zero() -> Self {
        Y8(_mm256_setzero_ps())
    }
    #[inline(always)]
    unsafe fn splat(v: f32) -> Self {
        Y8(_mm256_set1_ps(v))
    }
    #[inline(always)]
    unsafe fn fma(self, x: Self, acc: Self) -> Self {
        Y8(_mm256_fmadd_ps(self.0, x.0, acc.0))
    }
    #[inline(always)]
    unsafe fn add(self, x: Self) -> Self {
        Y8(_mm256_add_ps(self.0, x.0))
    }
    #[inline(always)]
    unsafe fn sub(self, x: Self) -> Self {
        Y8(_mm256_sub_ps(self.0, x.0))
    }
    #[inline(always)]
    unsafe fn max(self, x: Self) -> Self {
        Y8(_mm256_max_ps(self.0, x.0))
    }
    #[inline(always)]
    unsafe fn min(self, x: Self) -> Self {
        Y8(_mm256_min_ps(self.0, x.0))
    }
    #[inline(always)]
    unsafe fn max_nan(self, x: Self) -> Self {
        let m = _mm256_max_ps(self.0, x.0);
        Y8(_mm256_blendv_ps(m, self.0, _mm256_cmp_ps::<_CMP_UNORD_Q>(self.0, self.0)))
    }
    #[inline(always)]
    unsafe fn load(p: *const f32, live: usize) -> Self {
        Y8(if live >= 8 { _mm256_loadu_ps(p) } else { _mm256_maskload_ps(p, mask8(live)) })
    }
    #[inline(always)]
    unsafe fn load_range(p: *const f32, from: usize, to: usize) -> Self {
        let idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        let below_to = _mm256_cmpgt_epi32(_mm256_set1_epi32(to.min(8) as i32), idx);
        let below_from = _mm256_cmpgt_epi32(_mm256_set1_epi32(from.min(8) as i32), idx);
        Y8(_mm256_maskload_ps(p, _mm256_andnot_si256(below_from, below_to)))
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32, live: usize) {
        if live >= 8 {
            _mm256_storeu_ps(p, self.0)
        } else {
            _mm256_maskstore_ps(p, mask8(live), self.0)
        }
    }
    #[inline(always)]
    unsafe fn sum(self) -> f32 {
        let h = _mm_add_ps(_mm256_castps256_ps128(self.0), _mm256_extractf128_ps::<1>(self.0));
        let h = _mm_add_ps(h, _mm_movehl_ps(h, h));
        _mm_cvtss_f32(_mm_add_ss(h, _mm_shuffle_ps::<1>(h, h)))
    }
    #[inline(always)]
    unsafe fn zip(self, x: Self) -> (Self, Self) {
        // a0 b0 a1 b1 | a4 b4 a5 b5 and a2 b2 a3 b3 | a6 b6 a7 b7, then the halves regrouped
        let (l, h) = (_mm256_unpacklo_ps(self.0, x.0), _mm256_unpackhi_ps(self.0, x.0));
        (Y8(_mm256_permute2f128_ps::<0x20>(l, h)), Y8(_mm256_permute2f128_ps::<0x31>(l, h)))
    }
    #[inline(always)]
    unsafe fn unzip(self, x: Self) -> (Self, Self) {
        // a0 a2 b0 b2 | a4 a6 b4 b6, then 64-bit pairs reordered to a0 a2 a4 a6 b0 b2 b4 b6
        let ev = _mm256_shuffle_ps::<0b10_00_10_00>(self.0, x.0);
        let od = _mm256_shuffle_ps::<0b11_01_11_01>(self.0, x.0);
        let fix = |v: __m256| _mm256_castpd_ps(_mm256_permute4x64_pd::<0b11_01_10_00>(_mm256_castps_pd(v)));
        (Y8(fix(ev)), Y8(fix(od)))
    }
    #[inline(always)]
    unsafe fn any_nonfinite(self) -> bool {
        let d = _mm256_sub_ps(self.0, self.0);
        _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(d, _mm256_setzero_ps())) != 0xFF
    }
}
