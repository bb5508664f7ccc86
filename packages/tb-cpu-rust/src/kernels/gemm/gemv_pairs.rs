//! bfloat16 matrix–vector products on pairs (`vdpbf16ps`): `x @ W.T` at batch 1–4 with both
//! factors bfloat16 and the weight in the `Linear` layout (each output a dot product of two
//! contiguous bfloat16 rows).
//!
//! The bfloat16 GEMM's tiles (`bf16::amx`) and its pair kernel are built for many rows: the
//! tiles multiply 16 weight rows by a 32-column panel of activations, so one activation row
//! leaves 31 of 32 columns idle, and the pair kernel packs the weight on every call. Here the
//! weight is read once, in place, two bytes an element: for four weight rows (columns of C) and
//! up to four activation rows at a time, `vdpbf16ps` multiplies 16 pairs of one by 16 pairs of
//! the other into float32 sums (bfloat16 products are exact in float32), the tail of k in one
//! masked step. Columns are split across threads in blocks, as the float32 GEMV does.
//!
//! Numerics: as the pair kernel (products exact, float32 sums, in another order than oneDNN's).

use crate::kernels::gemm::{Epi, Mat};

/// A's rows this kernel takes; from 5 on the tiles (or the pair kernel) take the product.
pub const MAX_ROWS: usize = 4;
/// Columns per parallel task (a multiple of the 4-column block).
const COLS_PER_TASK: usize = 64;
/// Below this many pair multiply-adds the product runs on the calling thread.
const PAR_MIN: usize = 1 << 15;

/// Whether this CPU runs the kernel (AVX-512 BF16).
pub fn available() -> bool {
    crate::core::isa::has_avx512bf16()
}

/// `c = alpha * a @ b`, then `epi`, for pair matrices (`k2` pairs deep): `a` m×k2 with unit
/// column stride, `b` k2×n with unit row stride (column j of B, row j of W, is k2 contiguous
/// pairs), C with unit column stride. Returns false, touching nothing, when the shapes or the CPU
/// do not suit the kernel (m > MAX_ROWS, another layout, no AVX-512 BF16).
///
/// # Safety
/// The matrices valid for m×k2, k2×n and m×n (pairs are 32-bit words), C not overlapping A or B.
pub unsafe fn gemv(m: usize, n: usize, k2: usize, a: Mat, b: Mat, c: Mat, alpha: f32, threads: usize, epi: &Epi) -> bool {
    if m == 0 || m > MAX_ROWS || n == 0 || k2 == 0 || a.cs != 1 || b.rs != 1 || b.cs <= 0 || c.cs != 1 || a.rs < 0 || c.rs < 0 || !available() {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        let task = |j0: usize| {
            let j1 = (j0 + COLS_PER_TASK).min(n);
            // SAFETY: the caller's contract; tasks write disjoint column ranges of C; the ISA was checked
            unsafe { columns(m, j0, j1, k2, a, b, c, alpha, epi) };
        };
        let tasks = n.div_ceil(COLS_PER_TASK);
        if threads > 1 && tasks > 1 && m * n * k2 >= PAR_MIN {
            crate::core::par::for_each(tasks, |t| task(t * COLS_PER_TASK));
        } else {
            (0..tasks).for_each(|t| task(t * COLS_PER_TASK));
        }
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (threads, alpha, epi);
        false
    }
}

/// Columns j0..j1 of every row of C, then the epilogue on each row's range.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
unsafe fn columns(m: usize, j0: usize, j1: usize, k2: usize, a: Mat, b: Mat, c: Mat, alpha: f32, epi: &Epi) {
    let a0 = a.p.0 as *const u32;
    let mut j = j0;
    while j < j1 {
        let cols = (j1 - j).min(4);
        let mut acc = [[0f32; 4]; MAX_ROWS];
        let bj = (b.p.0 as *const u32).offset(j as isize * b.cs);
        match m {
            1 => dots::<1>(cols, k2, a0, a.rs, bj, b.cs, &mut acc),
            2 => dots::<2>(cols, k2, a0, a.rs, bj, b.cs, &mut acc),
            3 => dots::<3>(cols, k2, a0, a.rs, bj, b.cs, &mut acc),
            _ => dots::<4>(cols, k2, a0, a.rs, bj, b.cs, &mut acc),
        }
        for (r, sums) in acc.iter().enumerate().take(m) {
            let out = c.p.0.offset(r as isize * c.rs + j as isize);
            for (q, &s) in sums.iter().enumerate().take(cols) {
                *out.add(q) = alpha * s;
            }
        }
        j += cols;
    }
    if !epi.is_empty() {
        for r in 0..m {
            let row = std::slice::from_raw_parts_mut(c.p.0.offset(r as isize * c.rs + j0 as isize), j1 - j0);
            epi.apply_row(row, r, j0);
        }
    }
}

/// acc[r][q] = sum over the k2 pairs of A row r · B column q, for R rows and `cols` ≤ 4 columns
/// (a missing column reads column 0 again, always valid, and is not stored).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn dots<const R: usize>(cols: usize, k2: usize, a: *const u32, a_rs: isize, b: *const u32, b_cs: isize, acc: &mut [[f32; 4]; MAX_ROWS]) {
    use std::arch::x86_64::*;
    let bq: [*const u32; 4] = std::array::from_fn(|q| b.offset(if q < cols { q as isize * b_cs } else { 0 }));
    let ar: [*const u32; R] = std::array::from_fn(|r| a.offset(r as isize * a_rs));
    let mut s = [[_mm512_setzero_ps(); 4]; R];
    let step = |s: &mut [[__m512; 4]; R], t: usize, mask: __mmask16| {
        let x: [__m512bh; R] = std::array::from_fn(|r| std::mem::transmute(_mm512_maskz_loadu_epi32(mask, ar[r].add(t) as *const i32)));
        for q in 0..4 {
            let w: __m512bh = std::mem::transmute(_mm512_maskz_loadu_epi32(mask, bq[q].add(t) as *const i32));
            for r in 0..R {
                s[r][q] = _mm512_dpbf16_ps(s[r][q], x[r], w);
            }
        }
    };
    let k16 = k2 / 16 * 16;
    let mut t = 0;
    while t < k16 {
        step(&mut s, t, !0);
        t += 16;
    }
    if k16 < k2 {
        // pairs past k2 are neither read nor counted (masked loads give zeros)
        step(&mut s, k16, ((1u32 << (k2 - k16)) - 1) as __mmask16);
    }
    for r in 0..R {
        for q in 0..4 {
            acc[r][q] = _mm512_reduce_add_ps(s[r][q]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::element::{bf16_to_f32, f32_to_bf16};
    use crate::core::math::unary::Un;
    use crate::core::mem::SPtr;
    use crate::kernels::gemm::EpiOp;

    fn mat(p: &[u16], rs: isize, cs: isize) -> Mat {
        Mat { p: SPtr(p.as_ptr() as *mut f32), rs, cs }
    }

    /// Every row count, odd pair counts around the vector width, padded row strides, 1 and 2
    /// threads, bias and ReLU: against a float64 sum of the bfloat16 products.
    #[test]
    fn matches_a_float64_reference() {
        if !available() {
            return;
        }
        for &(m, n, k) in &[(1usize, 1usize, 2usize), (1, 5, 30), (2, 9, 32), (3, 130, 34), (4, 64, 784), (1, 1024, 512), (4, 3, 18), (2, 79, 40), (3, 200, 66)] {
            let (lda, ldw) = (k + 4, k + 2); // bfloat16 elements, even: rows start on pairs
            let a: Vec<u16> = (0..m * lda).map(|i| f32_to_bf16(((i * 7 % 13) as f32 - 6.0) * 0.25)).collect();
            let w: Vec<u16> = (0..n * ldw).map(|i| f32_to_bf16(((i * 5 % 11) as f32 - 5.0) * 0.37)).collect();
            let bias: Vec<f32> = (0..n).map(|j| j as f32 * 0.1 - 1.0).collect();
            for threads in [1, 2] {
                let c = vec![f32::NAN; m * n];
                let epi = Epi::new(Some((Mat { p: SPtr(bias.as_ptr() as *mut f32), rs: 0, cs: 1 }, 1.0)), [EpiOp::Un(Un::Relu)]);
                let cm = Mat { p: SPtr(c.as_ptr() as *mut f32), rs: n as isize, cs: 1 };
                // SAFETY: buffers sized for the shapes above
                let took = unsafe { gemv(m, n, k / 2, mat(&a, (lda / 2) as isize, 1), mat(&w, 1, (ldw / 2) as isize), cm, 0.5, threads, &epi) };
                assert!(took);
                for i in 0..m {
                    for j in 0..n {
                        let dot: f64 = (0..k).map(|t| bf16_to_f32(a[i * lda + t]) as f64 * bf16_to_f32(w[j * ldw + t]) as f64).sum();
                        let want = (0.5 * dot + bias[j] as f64).max(0.0);
                        let got = c[i * n + j] as f64;
                        assert!((got - want).abs() <= 1e-5 * (1.0 + want.abs()), "({m},{n},{k}) t={threads} [{i},{j}] {got} vs {want}");
                    }
                }
            }
        }
    }

    /// NaN and infinity in one activation row reach exactly the outputs they should.
    #[test]
    fn non_finite_values_propagate_per_row() {
        if !available() {
            return;
        }
        let (m, n, k) = (2usize, 6usize, 40usize);
        let mut a: Vec<u16> = vec![f32_to_bf16(0.5); m * k];
        a[3] = f32_to_bf16(f32::NAN);
        a[k + 5] = f32_to_bf16(f32::INFINITY);
        let w: Vec<u16> = vec![f32_to_bf16(1.0); n * k];
        let c = vec![0f32; m * n];
        let cm = Mat { p: SPtr(c.as_ptr() as *mut f32), rs: n as isize, cs: 1 };
        // SAFETY: buffers sized for the shapes above
        assert!(unsafe { gemv(m, n, k / 2, mat(&a, (k / 2) as isize, 1), mat(&w, 1, (k / 2) as isize), cm, 1.0, 1, &Epi::default()) });
        assert!(c[..n].iter().all(|v| v.is_nan()));
        assert!(c[n..].iter().all(|&v| v == f32::INFINITY));
    }

    #[test]
    fn declines_layouts_it_does_not_take() {
        let a = vec![0u16; 64];
        let c = vec![0f32; 64];
        let cm = Mat { p: SPtr(c.as_ptr() as *mut f32), rs: 2, cs: 1 };
        // SAFETY: declined before any access
        unsafe {
            assert!(!gemv(5, 2, 2, mat(&a, 2, 1), mat(&a, 1, 2), cm, 1.0, 1, &Epi::default()));
            assert!(!gemv(1, 2, 2, mat(&a, 2, 1), mat(&a, 2, 2), cm, 1.0, 1, &Epi::default()));
            assert!(!gemv(1, 2, 2, mat(&a, 1, 2), mat(&a, 1, 2), cm, 1.0, 1, &Epi::default()));
        }
    }
}
