//! `C (m × n) += A (m × k) · Bᵀ` where B is n × k and the rows of A and B are both contiguous
//! along k: every output is the dot product of a row of A and a row of B.
//!
//! The convolution's weight gradient has this form (`gW += gY · im2colᵀ`: both operands run
//! along the output positions) with a short side (a few input channels times the taps, or a few
//! output channels) and a long k. There the packing GEMM spends as long packing both operands
//! (each used by a single tile row or column) as multiplying; this kernel reads them in place.
//! AVX-512 / AVX2: blocks of 4 rows of A × 3 rows of B, twelve 16- / 8-lane accumulators, seven
//! loads per twelve FMAs (FMA-bound while the rows are in L1 / L2); the edges in smaller blocks of
//! the same kernel; elsewhere a plain dot product per output.
//!
//! A linear layer with few outputs (a classifier head: `x · Wᵀ` with W 10 × k, row-major) has
//! the same form, and `sgemm_epi` sends it here (`few_columns`): the packing GEMM's column panels
//! are 16-32 wide, so 10 columns left most of every tile empty (64 × 512 × 10 ran at 8 % of the
//! FMA peak).

/// # Safety
/// `a` must be valid for `m` rows of `k` elements `lda` apart, `b` for `n` rows of `k` elements
/// `ldb` apart, `c` for `m` rows of `n` elements `ldc` apart, not overlapping `a` or `b`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm_abt_add(m: usize, n: usize, k: usize, a: *const f32, lda: usize, b: *const f32, ldb: usize, c: *mut f32, ldc: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::core::isa::has_avx512() {
            return avx512::run(m, n, k, a, lda, b, ldb, c, ldc);
        }
        if crate::core::isa::has_avx2() {
            return avx2::run(m, n, k, a, lda, b, ldb, c, ldc);
        }
    }
    portable(m, n, k, a, lda, b, ldb, c, ldc)
}

/// The dot product of two equally long slices in 8 independent lanes (vectorisable).
#[inline(always)]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (mut ca, mut cb) = (a.chunks_exact(8), b.chunks_exact(8));
    for (x, y) in (&mut ca).zip(&mut cb) {
        for q in 0..8 {
            acc[q] += x[q] * y[q];
        }
    }
    acc.iter().sum::<f32>() + ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum::<f32>()
}

/// Every output, one dot product each (CPUs without AVX2).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn portable(m: usize, n: usize, k: usize, a: *const f32, lda: usize, b: *const f32, ldb: usize, c: *mut f32, ldc: usize) {
    for i in 0..m {
        let ra = std::slice::from_raw_parts(a.add(i * lda), k);
        for j in 0..n {
            *c.add(i * ldc + j) += dot(ra, std::slice::from_raw_parts(b.add(j * ldb), k));
        }
    }
}

/// The AVX-512 / AVX2 kernels: `MB` rows of A × `NB` rows of B per tile, each output's lanes
/// summed once at the end; the rows past the last whole `MB` block and the columns past the last
/// whole `NB` block take the same tile with fewer rows / columns (never a scalar loop).
#[cfg(target_arch = "x86_64")]
macro_rules! dot_tiles {
    ($name:ident, $feat:literal, $lanes:expr, $zero:path, $load:path, $tail_load:path, $fma:path, $sum:path, $mask:ty, $make_mask:path) => {
        mod $name {
            use std::arch::x86_64::*;

            const MB: usize = 4;
            const NB: usize = 3;

            /// # Safety
            /// As `gemm_abt_add`, on a CPU with the module's instruction set.
            #[allow(clippy::too_many_arguments)]
            #[target_feature(enable = $feat)]
            pub unsafe fn run(m: usize, n: usize, k: usize, a: *const f32, lda: usize, b: *const f32, ldb: usize, c: *mut f32, ldc: usize) {
                let tail = $make_mask(k % $lanes);
                let mut i = 0;
                while i < m {
                    let rows = MB.min(m - i);
                    let mut j = 0;
                    while j < n {
                        let cols = NB.min(n - j);
                        match (rows, cols) {
                            (4, 3) => tile::<4, 3>(k, a, lda, b, ldb, c, ldc, i, j, tail),
                            (4, 2) => tile::<4, 2>(k, a, lda, b, ldb, c, ldc, i, j, tail),
                            (4, _) => tile::<4, 1>(k, a, lda, b, ldb, c, ldc, i, j, tail),
                            (_, 3) => tile::<1, 3>(k, a, lda, b, ldb, c, ldc, i, j, tail),
                            (_, 2) => tile::<1, 2>(k, a, lda, b, ldb, c, ldc, i, j, tail),
                            _ => tile::<1, 1>(k, a, lda, b, ldb, c, ldc, i, j, tail),
                        }
                        j += cols;
                    }
                    // rows of a partial block one at a time (R = 1 tiles)
                    i += if rows == MB { MB } else { 1 };
                }
            }

            #[allow(clippy::too_many_arguments)]
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn tile<const R: usize, const Q: usize>(k: usize, a: *const f32, lda: usize, b: *const f32, ldb: usize, c: *mut f32, ldc: usize, i: usize, j: usize, tail: $mask) {
                let full = k / $lanes * $lanes;
                let mut acc = [[$zero(); Q]; R];
                let mut p = 0;
                while p < full {
                    let mut bv = [$zero(); Q];
                    for (q, v) in bv.iter_mut().enumerate() {
                        *v = $load(b.add((j + q) * ldb + p));
                    }
                    for (r, row) in acc.iter_mut().enumerate() {
                        let av = $load(a.add((i + r) * lda + p));
                        for (q, v) in row.iter_mut().enumerate() {
                            *v = $fma(av, bv[q], *v);
                        }
                    }
                    p += $lanes;
                }
                if full < k {
                    // the k tail as a lane mask: loads past the row's end are masked off, never touched
                    let mut bv = [$zero(); Q];
                    for (q, v) in bv.iter_mut().enumerate() {
                        *v = $tail_load(tail, b.add((j + q) * ldb + p));
                    }
                    for (r, row) in acc.iter_mut().enumerate() {
                        let av = $tail_load(tail, a.add((i + r) * lda + p));
                        for (q, v) in row.iter_mut().enumerate() {
                            *v = $fma(av, bv[q], *v);
                        }
                    }
                }
                for (r, row) in acc.iter().enumerate() {
                    for (q, v) in row.iter().enumerate() {
                        *c.add((i + r) * ldc + j + q) += $sum(*v);
                    }
                }
            }
        }
    };
}

#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn mask16(live: usize) -> std::arch::x86_64::__mmask16 {
    ((1u32 << live) - 1) as std::arch::x86_64::__mmask16
}

#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn mask8(live: usize) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    // lane q live when q < live: the sign bit of each 32-bit lane set
    _mm256_cmpgt_epi32(_mm256_set1_epi32(live as i32), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))
}

/// `_mm256_maskload_ps` with the mask first, as `_mm512_maskz_loadu_ps` takes it.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx")]
unsafe fn masked256(m: std::arch::x86_64::__m256i, p: *const f32) -> std::arch::x86_64::__m256 {
    std::arch::x86_64::_mm256_maskload_ps(p, m)
}

#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx")]
unsafe fn sum256(v: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::*;
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps::<1>(s, s)))
}

#[cfg(target_arch = "x86_64")]
dot_tiles!(avx512, "avx512f", 16, _mm512_setzero_ps, _mm512_loadu_ps, _mm512_maskz_loadu_ps, _mm512_fmadd_ps, _mm512_reduce_add_ps, __mmask16, super::mask16);
#[cfg(target_arch = "x86_64")]
dot_tiles!(avx2, "avx2,fma", 8, _mm256_setzero_ps, _mm256_loadu_ps, super::masked256, _mm256_fmadd_ps, super::sum256, __m256i, super::mask8);

#[cfg(test)]
mod tests {
    use super::*;

    fn data(len: usize, seed: u32) -> Vec<f32> {
        let mut s = seed;
        (0..len)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (s >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0
            })
            .collect()
    }

    type Kernel = unsafe fn(usize, usize, usize, *const f32, usize, *const f32, usize, *mut f32, usize);

    /// Every kernel this CPU can run: the dispatching entry and each ISA's tiles.
    fn kernels() -> Vec<(&'static str, Kernel)> {
        let mut v: Vec<(&'static str, Kernel)> = vec![("dispatch", gemm_abt_add), ("portable", portable)];
        #[cfg(target_arch = "x86_64")]
        {
            if crate::core::isa::has_avx512() {
                v.push(("avx512", avx512::run));
            }
            if crate::core::isa::has_avx2() {
                v.push(("avx2", avx2::run));
            }
        }
        v
    }

    #[test]
    fn products_match_a_float64_reference() {
        for (isa, kernel) in kernels() {
            for &(m, n, k) in &[(1, 1, 1), (4, 3, 16), (5, 7, 33), (32, 27, 1024), (9, 10, 15), (8, 6, 0), (3, 2, 200), (7, 11, 8), (6, 5, 23)] {
                check(isa, kernel, m, n, k);
            }
        }
    }

    fn check(isa: &str, kernel: Kernel, m: usize, n: usize, k: usize) {
        {
            let (lda, ldb, ldc) = (k + 3, k + 1, n + 2);
            let (a, b) = (data(m * lda, 1 + k as u32), data(n * ldb, 7 + m as u32));
            let c0 = data(m * ldc, 3);
            let mut c = c0.clone();
            unsafe { kernel(m, n, k, a.as_ptr(), lda, b.as_ptr(), ldb, c.as_mut_ptr(), ldc) };
            for i in 0..m {
                for j in 0..n {
                    let want = c0[i * ldc + j] as f64 + (0..k).map(|p| a[i * lda + p] as f64 * b[j * ldb + p] as f64).sum::<f64>();
                    let got = c[i * ldc + j] as f64;
                    assert!((got - want).abs() <= 1e-5 * (1.0 + k as f64), "{isa} {m}x{n}x{k} at ({i}, {j}): {got} vs {want}");
                }
                // the padding between rows of C is not written
                for j in n..ldc {
                    assert_eq!(c[i * ldc + j], c0[i * ldc + j]);
                }
            }
        }
    }

    #[test]
    fn nan_and_infinity_reach_only_their_outputs() {
        for (_, kernel) in kernels() {
            nan_and_infinity(kernel);
        }
    }

    fn nan_and_infinity(kernel: Kernel) {
        let (m, n, k) = (5, 4, 40);
        let mut a = data(m * k, 11);
        let b = data(n * k, 12);
        a[2 * k + 17] = f32::NAN;
        a[4 * k + 39] = f32::INFINITY;
        let mut c = vec![0f32; m * n];
        unsafe { kernel(m, n, k, a.as_ptr(), k, b.as_ptr(), k, c.as_mut_ptr(), n) };
        for i in 0..m {
            for j in 0..n {
                let v = c[i * n + j];
                match i {
                    2 => assert!(v.is_nan()),
                    4 => assert!(v.is_infinite() || v.is_nan()),
                    _ => assert!(v.is_finite()),
                }
            }
        }
    }
}
