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
/// (m ≤ MAX_ROWS, rows of A contiguous, rows of C contiguous, and B either with contiguous
/// columns (`W.T`, dot products) or contiguous rows (`x @ W`, row-major: rows of B scaled by
/// A's entries and summed, `axpy_columns`)); returns false, touching nothing, otherwise.
///
/// # Safety
/// As `gemm::sgemm_epi`: the matrices valid for m×k, k×n, m×n, C not overlapping A or B.
pub unsafe fn sgemv(m: usize, n: usize, k: usize, a: Mat, b: Mat, c: Mat, alpha: f32, accumulate: bool, threads: usize, epi: &Epi) -> bool {
    if m == 0 || m > MAX_ROWS || k == 0 || n == 0 || a.cs != 1 || c.cs != 1 || a.rs < 0 || c.rs < 0 {
        return false;
    }
    let dot = b.rs == 1 && b.cs > 0;
    let row_major = !dot && b.cs == 1 && b.rs > 0;
    if !dot && !row_major {
        return false;
    }
    let task = |j0: usize| {
        let j1 = (j0 + COLS_PER_TASK).min(n);
        // SAFETY: the caller's contract; tasks write disjoint column ranges of C
        unsafe {
            if row_major {
                axpy_columns(m, j0, j1, k, a, b, c, alpha, accumulate, epi)
            } else {
                columns(m, j0, j1, k, a, b, c, alpha, accumulate, epi)
            }
        };
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
        if crate::core::isa::has_avx512() {
            if rows == 2 {
                dots_avx512::<2>(cols, k, a, a_rs, b, b_cs, acc);
            } else {
                dots_avx512::<1>(cols, k, a, a_rs, b, b_cs, acc);
            }
            return;
        }
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

/// `dots_avx2` in 16-wide vectors, the tail of k in one masked step.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn dots_avx512<const R: usize>(cols: usize, k: usize, a: *const f32, a_rs: isize, b: *const f32, b_cs: isize, acc: &mut [[f32; 4]; 2]) {
    use std::arch::x86_64::*;
    let bq: [*const f32; 4] = std::array::from_fn(|q| b.offset(if q < cols { q as isize * b_cs } else { 0 }));
    let ar: [*const f32; R] = std::array::from_fn(|r| a.offset(r as isize * a_rs));
    let mut s = [[_mm512_setzero_ps(); 4]; R];
    let k16 = k / 16 * 16;
    let mut t = 0;
    while t < k16 {
        let x: [__m512; R] = std::array::from_fn(|r| _mm512_loadu_ps(ar[r].add(t)));
        for q in 0..4 {
            let w = _mm512_loadu_ps(bq[q].add(t));
            for r in 0..R {
                s[r][q] = _mm512_fmadd_ps(x[r], w, s[r][q]);
            }
        }
        t += 16;
    }
    if k16 < k {
        // lanes past k are neither read nor counted (masked loads give zeros)
        let mask: __mmask16 = ((1u32 << (k - k16)) - 1) as __mmask16;
        let x: [__m512; R] = std::array::from_fn(|r| _mm512_maskz_loadu_ps(mask, ar[r].add(k16)));
        for q in 0..4 {
            let w = _mm512_maskz_loadu_ps(mask, bq[q].add(k16));
            for r in 0..R {
                s[r][q] = _mm512_fmadd_ps(x[r], w, s[r][q]);
            }
        }
    }
    for r in 0..R {
        for q in 0..4 {
            acc[r][q] = _mm512_reduce_add_ps(s[r][q]);
        }
    }
}

/// Columns j0..j1 (at most COLS_PER_TASK) of every row of C for a row-major B: row p of B
/// (those columns), scaled by A[i, p], is added into row i's sums for each step p of k, so B is
/// read once, in runs of j1 - j0 contiguous floats, and nothing is packed.
unsafe fn axpy_columns(m: usize, j0: usize, j1: usize, k: usize, a: Mat, b: Mat, c: Mat, alpha: f32, accumulate: bool, epi: &Epi) {
    let cols = j1 - j0;
    let mut acc = [[0f32; COLS_PER_TASK]; MAX_ROWS];
    axpy(m, cols, k, a.p.0, a.rs, b.p.0.add(j0), b.rs, &mut acc);
    for (i, sums) in acc.iter().enumerate().take(m) {
        let out = std::slice::from_raw_parts_mut(c.p.0.offset(i as isize * c.rs + j0 as isize), cols);
        for (o, &v) in out.iter_mut().zip(&sums[..cols]) {
            *o = if accumulate { *o + alpha * v } else { alpha * v };
        }
        if !epi.is_empty() {
            epi.apply_row(out, i, j0);
        }
    }
}

/// acc[r][q] = sum_p A[r, p] * B[p, q] for r < m ≤ MAX_ROWS, q < cols ≤ COLS_PER_TASK, with
/// B's rows `b_rs` apart and contiguous.
#[inline(always)]
unsafe fn axpy(m: usize, cols: usize, k: usize, a: *const f32, a_rs: isize, b: *const f32, b_rs: isize, acc: &mut [[f32; COLS_PER_TASK]; MAX_ROWS]) {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::core::isa::has_avx512() {
            match m {
                1 => axpy_avx512::<1, 4>(cols, k, a, a_rs, b, b_rs, acc),
                2 => axpy_avx512::<2, 2>(cols, k, a, a_rs, b, b_rs, acc),
                3 => axpy_avx512::<3, 1>(cols, k, a, a_rs, b, b_rs, acc),
                _ => axpy_avx512::<4, 1>(cols, k, a, a_rs, b, b_rs, acc),
            }
            return;
        }
        if crate::core::isa::has_avx2() {
            match m {
                1 => axpy_avx2::<1>(cols, k, a, a_rs, b, b_rs, acc),
                2 => axpy_avx2::<2>(cols, k, a, a_rs, b, b_rs, acc),
                3 => axpy_avx2::<3>(cols, k, a, a_rs, b, b_rs, acc),
                _ => axpy_avx2::<4>(cols, k, a, a_rs, b, b_rs, acc),
            }
            return;
        }
    }
    axpy_scalar(m, 0, cols, k, a, a_rs, b, b_rs, acc)
}

/// Columns q0..q1 of `axpy` one float at a time (the portable path and the SIMD tails).
#[inline(always)]
unsafe fn axpy_scalar(m: usize, q0: usize, q1: usize, k: usize, a: *const f32, a_rs: isize, b: *const f32, b_rs: isize, acc: &mut [[f32; COLS_PER_TASK]; MAX_ROWS]) {
    for (r, sums) in acc.iter_mut().enumerate().take(m) {
        let ar = a.offset(r as isize * a_rs);
        for q in q0..q1 {
            let mut v = 0f32;
            for p in 0..k {
                v += *ar.add(p) * *b.offset(p as isize * b_rs + q as isize);
            }
            sums[q] = v;
        }
    }
}

/// `axpy` for R rows in four 16-wide vectors a row (64 columns; a partial last vector masked),
/// U steps of k at a time into U sets of sums (for one or two rows a single set would wait on
/// the FMA latency every step), the next rows of B requested ahead.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn axpy_avx512<const R: usize, const U: usize>(cols: usize, k: usize, a: *const f32, a_rs: isize, b: *const f32, b_rs: isize, acc: &mut [[f32; COLS_PER_TASK]; MAX_ROWS]) {
    use std::arch::x86_64::*;
    const V: usize = COLS_PER_TASK / 16;
    const AHEAD: isize = 8;
    let masks: [__mmask16; V] = std::array::from_fn(|v| {
        let have = cols.saturating_sub(16 * v).min(16);
        ((1u32 << have) - 1) as __mmask16
    });
    let ar: [*const f32; R] = std::array::from_fn(|r| a.offset(r as isize * a_rs));
    let mut s = [[[_mm512_setzero_ps(); V]; R]; U];
    let mut p = 0;
    while p + U <= k {
        for (u, su) in s.iter_mut().enumerate() {
            let row = b.offset((p + u) as isize * b_rs);
            let ahead = row.wrapping_offset(AHEAD * b_rs) as *const i8;
            _mm_prefetch::<_MM_HINT_T0>(ahead);
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(4 * COLS_PER_TASK - 1));
            let w: [__m512; V] = std::array::from_fn(|v| _mm512_maskz_loadu_ps(masks[v], row.add(16 * v)));
            for r in 0..R {
                let x = _mm512_set1_ps(*ar[r].add(p + u));
                for v in 0..V {
                    su[r][v] = _mm512_fmadd_ps(x, w[v], su[r][v]);
                }
            }
        }
        p += U;
    }
    while p < k {
        let row = b.offset(p as isize * b_rs);
        let w: [__m512; V] = std::array::from_fn(|v| _mm512_maskz_loadu_ps(masks[v], row.add(16 * v)));
        for r in 0..R {
            let x = _mm512_set1_ps(*ar[r].add(p));
            for v in 0..V {
                s[0][r][v] = _mm512_fmadd_ps(x, w[v], s[0][r][v]);
            }
        }
        p += 1;
    }
    for r in 0..R {
        for v in 0..V {
            let mut t = s[0][r][v];
            for su in &s[1..] {
                t = _mm512_add_ps(t, su[r][v]);
            }
            _mm512_mask_storeu_ps(acc[r].as_mut_ptr().add(16 * v), masks[v], t);
        }
    }
}

/// `axpy` for R rows: 32 columns at a time in four 8-wide vectors, then single vectors, then
/// the last columns (< 8) without SIMD.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn axpy_avx2<const R: usize>(cols: usize, k: usize, a: *const f32, a_rs: isize, b: *const f32, b_rs: isize, acc: &mut [[f32; COLS_PER_TASK]; MAX_ROWS]) {
    let mut q = 0;
    while q + 32 <= cols {
        axpy_avx2_block::<R, 4>(q, k, a, a_rs, b, b_rs, acc);
        q += 32;
    }
    while q + 8 <= cols {
        axpy_avx2_block::<R, 1>(q, k, a, a_rs, b, b_rs, acc);
        q += 8;
    }
    axpy_scalar(R, q, cols, k, a, a_rs, b, b_rs, acc)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn axpy_avx2_block<const R: usize, const V: usize>(q: usize, k: usize, a: *const f32, a_rs: isize, b: *const f32, b_rs: isize, acc: &mut [[f32; COLS_PER_TASK]; MAX_ROWS]) {
    use std::arch::x86_64::*;
    let ar: [*const f32; R] = std::array::from_fn(|r| a.offset(r as isize * a_rs));
    let mut s = [[_mm256_setzero_ps(); V]; R];
    for p in 0..k {
        let row = b.offset(p as isize * b_rs + q as isize);
        let w: [__m256; V] = std::array::from_fn(|v| _mm256_loadu_ps(row.add(8 * v)));
        for r in 0..R {
            let x = _mm256_set1_ps(*ar[r].add(p));
            for v in 0..V {
                s[r][v] = _mm256_fmadd_ps(x, w[v], s[r][v]);
            }
        }
    }
    for r in 0..R {
        for v in 0..V {
            _mm256_storeu_ps(acc[r].as_mut_ptr().add(q + 8 * v), s[r][v]);
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
        for &(m, n, k) in &[(1, 1, 1), (1, 5, 7), (2, 9, 8), (3, 130, 33), (4, 64, 784), (1, 256, 784), (4, 3, 17), (2, 79, 40), (3, 200, 5)] {
            let a: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.25).collect();
            let w: Vec<f32> = (0..n * k).map(|i| ((i * 5 % 11) as f32 - 5.0) * 0.5).collect(); // W[n, k]
            // the same B = W.T stored row-major (k × n) with a padded row stride
            let ldb = n + 3;
            let mut bt = vec![f32::NAN; k * ldb];
            for p in 0..k {
                for j in 0..n {
                    bt[p * ldb + j] = w[j * k + p];
                }
            }
            let bias: Vec<f32> = (0..n).map(|j| j as f32 * 0.1 - 1.0).collect();
            for b in [mat(&w, 1, k as isize), mat(&bt, ldb as isize, 1)] {
                for accumulate in [false, true] {
                    for threads in [1, 2] {
                        let c = vec![0.5f32; m * n];
                        let epi = Epi::new(Some((mat(&bias, 0, 1), 1.0)), [EpiOp::Un(Un::Relu)]);
                        // SAFETY: buffers sized for the shapes above
                        let took = unsafe { sgemv(m, n, k, mat(&a, k as isize, 1), b, mat(&c, n as isize, 1), 2.0, accumulate, threads, &epi) };
                        assert!(took);
                        for i in 0..m {
                            for j in 0..n {
                                let dot: f64 = (0..k).map(|t| a[i * k + t] as f64 * w[j * k + t] as f64).sum();
                                let base = if accumulate { 0.5 } else { 0.0 };
                                let want = (base + 2.0 * dot + bias[j] as f64).max(0.0);
                                let got = c[i * n + j] as f64;
                                assert!((got - want).abs() <= 1e-4 * (1.0 + want.abs()), "({m},{n},{k}) b.rs={} [{i},{j}] {got} vs {want}", b.rs);
                            }
                        }
                    }
                }
            }
        }
    }

    /// Each SIMD form of `axpy` this CPU has (AVX2 too on an AVX-512 machine) against the scalar
    /// one, for every row count and column counts around the vector widths.
    #[test]
    fn axpy_isa_forms_match_scalar() {
        for m in 1..=MAX_ROWS {
            for cols in [1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 40, 63, 64] {
                let k = 13;
                let a: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.25).collect();
                let b: Vec<f32> = (0..k * 70).map(|i| ((i * 5 % 11) as f32 - 5.0) * 0.5).collect();
                let mut want = [[0f32; COLS_PER_TASK]; MAX_ROWS];
                // SAFETY: a is m × k, b is k rows of 70 floats, cols ≤ 64
                unsafe { axpy_scalar(m, 0, cols, k, a.as_ptr(), k as isize, b.as_ptr(), 70, &mut want) };
                #[cfg(target_arch = "x86_64")]
                {
                    let mut forms: Vec<(&str, [[f32; COLS_PER_TASK]; MAX_ROWS])> = Vec::new();
                    type Axpy = unsafe fn(usize, usize, *const f32, isize, *const f32, isize, &mut [[f32; COLS_PER_TASK]; MAX_ROWS]);
                    let run = |f: Axpy| {
                        let mut got = [[0f32; COLS_PER_TASK]; MAX_ROWS];
                        // SAFETY: as above; the caller checked the ISA
                        unsafe { f(cols, k, a.as_ptr(), k as isize, b.as_ptr(), 70, &mut got) };
                        got
                    };
                    if crate::core::isa::has_avx2() {
                        let f = [axpy_avx2::<1>, axpy_avx2::<2>, axpy_avx2::<3>, axpy_avx2::<4>];
                        forms.push(("avx2", run(f[m - 1])));
                    }
                    if crate::core::isa::has_avx512() {
                        let f = [axpy_avx512::<1, 4>, axpy_avx512::<2, 2>, axpy_avx512::<3, 1>, axpy_avx512::<4, 1>];
                        forms.push(("avx512", run(f[m - 1])));
                    }
                    for (name, got) in forms {
                        for r in 0..m {
                            for q in 0..cols {
                                assert!((got[r][q] - want[r][q]).abs() <= 1e-4 * (1.0 + want[r][q].abs()), "{name} m={m} cols={cols} [{r},{q}]");
                            }
                        }
                    }
                }
            }
        }
    }

    /// Each SIMD form of `dots` this CPU has (AVX2 too on an AVX-512 machine) against a float64
    /// sum, for 1 and 2 rows, 1-4 columns and k around the vector widths.
    #[test]
    fn dots_isa_forms_match_reference() {
        for k in [1, 7, 8, 9, 15, 16, 17, 33, 100] {
            let a: Vec<f32> = (0..2 * k).map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.25).collect();
            let w: Vec<f32> = (0..4 * k).map(|i| ((i * 5 % 11) as f32 - 5.0) * 0.5).collect();
            for rows in [1, 2] {
                for cols in 1..=4 {
                    #[cfg(target_arch = "x86_64")]
                    {
                        type Dots = unsafe fn(usize, usize, *const f32, isize, *const f32, isize, &mut [[f32; 4]; 2]);
                        let mut forms: Vec<(&str, Dots)> = Vec::new();
                        if crate::core::isa::has_avx2() {
                            forms.push(("avx2", if rows == 2 { dots_avx2::<2> } else { dots_avx2::<1> }));
                        }
                        if crate::core::isa::has_avx512() {
                            forms.push(("avx512", if rows == 2 { dots_avx512::<2> } else { dots_avx512::<1> }));
                        }
                        for (name, f) in forms {
                            let mut got = [[f32::NAN; 4]; 2];
                            // SAFETY: a holds 2 rows of k, w 4 rows of k; the ISA was checked
                            unsafe { f(cols, k, a.as_ptr(), k as isize, w.as_ptr(), k as isize, &mut got) };
                            for r in 0..rows {
                                for q in 0..cols {
                                    let want: f64 = (0..k).map(|t| a[r * k + t] as f64 * w[q * k + t] as f64).sum();
                                    assert!((got[r][q] as f64 - want).abs() <= 1e-4 * (1.0 + want.abs()), "{name} k={k} rows={rows} cols={cols} [{r},{q}]");
                                }
                            }
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
            assert!(!sgemv(1, 2, 2, mat(&a, 2, 1), mat(&a, 2, 2), mat(&c, 2, 1), 1.0, false, 1, &Epi::default()));
            assert!(!sgemv(1, 2, 2, mat(&a, 1, 2), mat(&a, 1, 2), mat(&c, 2, 1), 1.0, false, 1, &Epi::default()));
        }
    }
}
