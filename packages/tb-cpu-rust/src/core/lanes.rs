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
    /// max / min with the NaN of `x` (the second operand) kept
    unsafe fn max(self, x: Self) -> Self;
    unsafe fn min(self, x: Self) -> Self;
    unsafe fn load(p: *const f32, live: usize) -> Self;
    unsafe fn store(self, p: *mut f32, live: usize);
    /// the sum of the lanes
    unsafe fn sum(self) -> f32;
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
    unsafe fn max(self, x: Self) -> Self {
        Z16(_mm512_max_ps(self.0, x.0))
    }
    #[inline(always)]
    unsafe fn min(self, x: Self) -> Self {
        Z16(_mm512_min_ps(self.0, x.0))
    }
    #[inline(always)]
    unsafe fn load(p: *const f32, live: usize) -> Self {
        Z16(if live >= 16 { _mm512_loadu_ps(p) } else { _mm512_maskz_loadu_ps(mask16(live), p) })
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
    unsafe fn max(self, x: Self) -> Self {
        Y8(_mm256_max_ps(self.0, x.0))
    }
    #[inline(always)]
    unsafe fn min(self, x: Self) -> Self {
        Y8(_mm256_min_ps(self.0, x.0))
    }
    #[inline(always)]
    unsafe fn load(p: *const f32, live: usize) -> Self {
        Y8(if live >= 8 { _mm256_loadu_ps(p) } else { _mm256_maskload_ps(p, mask8(live)) })
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
}
