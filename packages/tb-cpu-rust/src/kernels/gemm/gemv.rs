//! Matrix–vector products for GEMMs with a few rows: `x @ W.T` at batch 1–4 (a `Linear` layer
//! called on one sample, a decode step).
//!
//! Packing B costs as much as the whole product when A has a single row, so the blocked GEMM is
//! the wrong tool there. This kernel reads B in place: when B's columns are contiguous (B is
//! `W.T` of a row-major weight `W[n, k]`, the `Linear` layout) every output is a dot product of
//! two contiguous rows, computed for four columns and up to two rows of A at a time (eight AVX2
//! accumulators, one load of B feeding every row). The columns are split across threads in
//! blocks, so each thread streams its part of W once (at 2 threads a 784×256 weight is two
//! 400 KB halves, each inside its core's 512 KB L2 on this machine). The GEMM's epilogue (bias,
//! activation, residual) runs on each output row right after it is computed.

use crate::kernels::gemm::{Epi, Mat};

/// A's rows this kernel takes; from 5 on the blocked GEMM's packing pays for itself.
pub const MAX_ROWS: usize = 4;
/// Columns per parallel task (a multiple of the 4-column block; tasks are claimed
/// from a counter, so several per thread balance a thread that loses its core).
const COLS_PER_TASK: usize = 64;
/// Below this many multiply-adds the product runs on the calling thread. On PyTorch's OpenMP team
/// (`crate::core::par`) a fork costs about a microsecond, and splitting a 784×256 weight (200K) lets each
/// core keep its half in its own L2: the batch-1 native MLP 784→256→10 went 25 → 20 µs per call
/// (executor alone 15.5 → 10.3 µs) against 1 << 18, 2 threads, idle machine.
const PAR_MIN_MACS: usize = 1 << 16;

/// `c = alpha * a @ b (+ c when accumulate)`, then `epi`, when the layout suits this kernel
/// (m ≤ MAX_ROWS, rows of A contiguous, columns of B contiguous, rows of C contiguous); returns
/// false, touching nothing, otherwise.
///
/// # Safety
/// As `gemm::sgemm_epi`: the matrices valid for m×k, k×n, m×n, C not overlapping A or B.
pub unsafe fn sgemv(m: usize, n: usize, k: usize, a: Mat, b: Mat, c: Mat, alpha: f32, accumulate: bool, threads: usize, epi: &Epi) -> bool {
    if m == 0 || m > MAX_ROWS || k == 0 || n == 0 || a.cs != 1 || b.rs != 1 || c.cs != 1 || b.cs <= 0 || a.rs < 0 || c.rs < 0 {
        return false;
    }
    let task = |j0: usize| {
        let j1 = (j0 + COLS_PER_TASK).min(n);
        // SAFETY: the caller's contract; tasks write disjoint column ranges of C
        unsafe { columns(m, j0, j1, k, a, b, c, alpha, accumulate, epi) };
    };
    let tasks = n.div_ceil(COLS_PER_TASK);
    if threads > 1 && tasks > 1 && m * n * k >= PAR_MIN_MACS {
        crate::core::par::for_each(tasks, |t| task(t * COLS_PER_TASK));
    } else {
        for t in 0..tasks {
            task(t * COLS_PER_TASK);
        }
    }
    true
}

/// Columns j0..j1 of every row of C.
unsafe fn columns(m: usize, j0: usize, j1: usize, k: usize, a: Mat, b: Mat, c: Mat, alpha: f32, accumulate: bool, epi: &Epi) {
    let mut i = 0;
    while i < m {
        let rows = if i + 1 < m { 2 } else { 1 };
        let mut j = j0;
        while j < j1 {
            let cols = (j1 - j).min(4);
            let mut acc = [[0f32; 4]; 2];
            dots(rows, cols, k, a.p.0.offset(i as isize * a.rs), a.rs, b.p.0.offset(j as isize * b.cs), b.cs, &mut acc);
            for r in 0..rows {
                let out = c.p.0.offset((i + r) as isize * c.rs + j as isize);
                for q in 0..cols {
                    let v = alpha * acc[r][q];
                    *out.add(q) = if accumulate { *out.add(q) + v } else { v };
                }
            }
            j += cols;
        }
        if !epi.is_empty() {
            for r in 0..rows {
                let row = std::slice::from_raw_parts_mut(c.p.0.offset((i + r) as isize * c.rs + j0 as isize), j1 - j0);
                epi.apply_row(row, i + r, j0);
            }
        }
        i += rows;
    }
}

/// acc[r][q] = dot(A row r, B column q) for `rows` ≤ 2 rows and `cols` ≤ 4 columns.
#[inline(always)]
unsafe fn dots(rows: usize, cols: usize, k: usize, a: *const f32, a_rs: isize, b: *const f32, b_cs: isize, acc: &mut [[f32; 4]; 2]) {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::core::isa::has_avx2() {
            if rows == 2 {
                dots_avx2::<2>(cols, k, a, a_rs, b, b_cs, acc);
            } else {
                dots_avx2::<1>(cols, k, a, a_rs, b, b_cs, acc);
            }
            return;
        }
    }
    for r in 0..rows {
        for q in 0..cols {
            let (ar, bq) = (a.offset(r as isize * a_rs), b.offset(q as isize * b_cs));
            let mut s = 0f32;
            for t in 0..k {
                s += *ar.add(t) * *bq.add(t);
            }
            acc[r][q] = s;
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dots_avx2<const R: usize>(cols: usize, k: usize, a: *const f32, a_rs: isize, b: *const f32, b_cs: isize, acc: &mut [[f32; 4]; 2]) {
    use std::arch::x86_64::*;
    // a missing column reads column 0 again (always valid) and is not stored
    let bq: [*const f32; 4] = std::array::from_fn(|q| b.offset(if q < cols { q as isize * b_cs } else { 0 }));
    let ar: [*const f32; R] = std::array::from_fn(|r| a.offset(r as isize * a_rs));
    let mut s = [[_mm256_setzero_ps(); 4]; R];
    let k8 = k / 8 * 8;
    let mut t = 0;
    while t < k8 {
        let x: [__m256; R] = std::array::from_fn(|r| _mm256_loadu_ps(ar[r].add(t)));
        for q in 0..4 {
            let w = _mm256_loadu_ps(bq[q].add(t));
            for r in 0..R {
                s[r][q] = _mm256_fmadd_ps(x[r], w, s[r][q]);
            }
        }
        t += 8;
    }
    for r in 0..R {
        for q in 0..4 {
            let mut v = crate::core::math::vector::hsum256(s[r][q]);
            for u in k8..k {
                v += *ar[r].add(u) * *bq[q].add(u);
            }
            acc[r][q] = v;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::math::unary::Un;
    use crate::core::mem::SPtr;
    use crate::kernels::gemm::EpiOp;

    fn mat(p: &[f32], rs: isize, cs: isize) -> Mat {
        Mat { p: SPtr(p.as_ptr() as *mut f32), rs, cs }
    }

    #[test]
    fn matches_naive_for_every_row_count_and_odd_sizes_with_epilogue() {
        for &(m, n, k) in &[(1, 1, 1), (1, 5, 7), (2, 9, 8), (3, 130, 33), (4, 64, 784), (1, 256, 784), (4, 3, 17)] {
            let a: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.25).collect();
            let w: Vec<f32> = (0..n * k).map(|i| ((i * 5 % 11) as f32 - 5.0) * 0.5).collect(); // W[n, k]
            let bias: Vec<f32> = (0..n).map(|j| j as f32 * 0.1 - 1.0).collect();
            for accumulate in [false, true] {
                for threads in [1, 2] {
                    let c = vec![0.5f32; m * n];
                    let epi = Epi::new(Some((mat(&bias, 0, 1), 1.0)), [EpiOp::Un(Un::Relu)]);
                    // SAFETY: buffers sized for the shapes above
                    let took = unsafe {
                        sgemv(m, n, k, mat(&a, k as isize, 1), mat(&w, 1, k as isize), mat(&c, n as isize, 1), 2.0, accumulate, threads, &epi)
                    };
                    assert!(took);
                    for i in 0..m {
                        for j in 0..n {
                            let dot: f64 = (0..k).map(|t| a[i * k + t] as f64 * w[j * k + t] as f64).sum();
                            let base = if accumulate { 0.5 } else { 0.0 };
                            let want = (base + 2.0 * dot + bias[j] as f64).max(0.0);
                            let got = c[i * n + j] as f64;
                            assert!((got - want).abs() <= 1e-4 * (1.0 + want.abs()), "({m},{n},{k}) [{i},{j}] {got} vs {want}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn declines_layouts_it_does_not_take() {
        let a = vec![1f32; 64];
        let c = vec![0f32; 64];
        // SAFETY: declined before any access
        unsafe {
            assert!(!sgemv(5, 2, 2, mat(&a, 2, 1), mat(&a, 1, 2), mat(&c, 2, 1), 1.0, false, 1, &Epi::default()));
            assert!(!sgemv(1, 2, 2, mat(&a, 2, 1), mat(&a, 2, 1), mat(&c, 2, 1), 1.0, false, 1, &Epi::default()));
            assert!(!sgemv(1, 2, 2, mat(&a, 1, 2), mat(&a, 1, 2), mat(&c, 2, 1), 1.0, false, 1, &Epi::default()));
        }
    }
}
