//! `C (m × n) += A (m × k) · Bᵀ` where B is n × k and the rows of A and B are both contiguous
//! along k: every output is the dot product of a row of A and a row of B.
//!
//! The convolution's weight gradient has this form (`gW += gY · im2colᵀ`: both operands run
//! along the output positions) with a short side (a few input channels times the taps, or a few
//! output channels) and a long k. There the packing GEMM spends as long packing both operands
//! (each used by a single tile row or column) as multiplying; this kernel reads them in place.
//! AVX-512: blocks of 4 rows of A × 3 rows of B, twelve 16-lane accumulators, seven loads per
//! twelve FMAs (FMA-bound while the rows are in L1 / L2); elsewhere a plain dot product per output.

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
    }
    portable(m, n, k, a, lda, b, ldb, c, ldc, 0, 0)
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

/// The outputs from row `i0` and column `j0` on, one dot product each.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn portable(m: usize, n: usize, k: usize, a: *const f32, lda: usize, b: *const f32, ldb: usize, c: *mut f32, ldc: usize, i0: usize, j0: usize) {
    for i in 0..m {
        let ra = std::slice::from_raw_parts(a.add(i * lda), k);
        let from = if i < i0 { j0 } else { 0 };
        for j in from..n {
            *c.add(i * ldc + j) += dot(ra, std::slice::from_raw_parts(b.add(j * ldb), k));
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    const MB: usize = 4;
    const NB: usize = 3;

    /// # Safety
    /// As `gemm_abt_add`, on a CPU with AVX-512F.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f")]
    pub unsafe fn run(m: usize, n: usize, k: usize, a: *const f32, lda: usize, b: *const f32, ldb: usize, c: *mut f32, ldc: usize) {
        let (mf, nf) = (m / MB * MB, n / NB * NB);
        let full = k / 16 * 16;
        // the k tail as a lane mask (loads past the row's end are masked off, never touched)
        let tail: __mmask16 = ((1u32 << (k - full)) - 1) as __mmask16;
        for i in (0..mf).step_by(MB) {
            for j in (0..nf).step_by(NB) {
                let mut acc = [[_mm512_setzero_ps(); NB]; MB];
                let mut p = 0;
                while p < full {
                    let bv = [_mm512_loadu_ps(b.add(j * ldb + p)), _mm512_loadu_ps(b.add((j + 1) * ldb + p)), _mm512_loadu_ps(b.add((j + 2) * ldb + p))];
                    for (r, row) in acc.iter_mut().enumerate() {
                        let av = _mm512_loadu_ps(a.add((i + r) * lda + p));
                        for (q, v) in row.iter_mut().enumerate() {
                            *v = _mm512_fmadd_ps(av, bv[q], *v);
                        }
                    }
                    p += 16;
                }
                if tail != 0 {
                    let bv = [
                        _mm512_maskz_loadu_ps(tail, b.add(j * ldb + p)),
                        _mm512_maskz_loadu_ps(tail, b.add((j + 1) * ldb + p)),
                        _mm512_maskz_loadu_ps(tail, b.add((j + 2) * ldb + p)),
                    ];
                    for (r, row) in acc.iter_mut().enumerate() {
                        let av = _mm512_maskz_loadu_ps(tail, a.add((i + r) * lda + p));
                        for (q, v) in row.iter_mut().enumerate() {
                            *v = _mm512_fmadd_ps(av, bv[q], *v);
                        }
                    }
                }
                for (r, row) in acc.iter().enumerate() {
                    for (q, v) in row.iter().enumerate() {
                        *c.add((i + r) * ldc + j + q) += _mm512_reduce_add_ps(*v);
                    }
                }
            }
        }
        // the columns past the last whole block of B rows (rows i < mf), then the rows past
        // the last whole block of A rows (all columns)
        super::portable(mf, n, k, a, lda, b, ldb, c, ldc, mf, nf);
        super::portable(m - mf, n, k, a.add(mf * lda), lda, b, ldb, c.add(mf * ldc), ldc, 0, 0);
    }
}

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

    #[test]
    fn products_match_a_float64_reference() {
        for &(m, n, k) in &[(1, 1, 1), (4, 3, 16), (5, 7, 33), (32, 27, 1024), (9, 10, 15), (8, 6, 0), (3, 2, 200)] {
            let (lda, ldb, ldc) = (k + 3, k + 1, n + 2);
            let (a, b) = (data(m * lda, 1 + k as u32), data(n * ldb, 7 + m as u32));
            let c0 = data(m * ldc, 3);
            let mut c = c0.clone();
            unsafe { gemm_abt_add(m, n, k, a.as_ptr(), lda, b.as_ptr(), ldb, c.as_mut_ptr(), ldc) };
            for i in 0..m {
                for j in 0..n {
                    let want = c0[i * ldc + j] as f64 + (0..k).map(|p| a[i * lda + p] as f64 * b[j * ldb + p] as f64).sum::<f64>();
                    let got = c[i * ldc + j] as f64;
                    assert!((got - want).abs() <= 1e-5 * (1.0 + k as f64), "{m}x{n}x{k} at ({i}, {j}): {got} vs {want}");
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
        let (m, n, k) = (5, 4, 40);
        let mut a = data(m * k, 11);
        let b = data(n * k, 12);
        a[2 * k + 17] = f32::NAN;
        a[4 * k + 39] = f32::INFINITY;
        let mut c = vec![0f32; m * n];
        unsafe { gemm_abt_add(m, n, k, a.as_ptr(), k, b.as_ptr(), k, c.as_mut_ptr(), n) };
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
