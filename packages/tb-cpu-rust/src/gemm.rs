//! Matrix products (mm, addmm, bmm, baddbmm) over strided operands, with fused epilogues.
//!
//! Two maintained kernels are wired in and chosen at run time (`set_backend`): faer's `gemm`
//! crate and `matrixmultiply`. Both pack operands into cache blocks and dispatch on the CPU's
//! ISA; transposed operands are passed as strides, never copied. The benchmark picks the
//! default (see README).

use crate::exec::SPtr;
use crate::ew::{Scalar, Un};
use std::sync::atomic::{AtomicU8, Ordering};

static BACKEND: AtomicU8 = AtomicU8::new(0);

pub fn set_backend(name: &str) -> Result<(), String> {
    let v = match name {
        "gemm" => 0,
        "matrixmultiply" => 1,
        other => return Err(format!("unknown GEMM backend {other:?} (gemm, matrixmultiply)")),
    };
    BACKEND.store(v, Ordering::Relaxed);
    Ok(())
}

pub fn backend() -> &'static str {
    if BACKEND.load(Ordering::Relaxed) == 0 {
        "gemm"
    } else {
        "matrixmultiply"
    }
}

/// One strided matrix: pointer, row stride, column stride (elements).
#[derive(Clone, Copy)]
pub struct Mat {
    pub p: SPtr<f32>,
    pub rs: isize,
    pub cs: isize,
}

/// c = beta_c * c + alpha * a @ b, where a is m×k, b is k×n, c is m×n.
/// `accumulate` false means c is write-only (its old contents are ignored).
///
/// # Safety
/// The three matrices must be valid for the given dimensions and strides and `c` must not
/// overlap `a` or `b`; the executor checks both when it prepares a plan.
pub unsafe fn sgemm(m: usize, n: usize, k: usize, a: Mat, b: Mat, c: Mat, alpha: f32, accumulate: bool, threads: usize) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                for j in 0..n {
                    *c.p.0.offset(i as isize * c.rs + j as isize * c.cs) = 0.0;
                }
            }
        }
        return;
    }
    let flops = m * n * k;
    let threads = if flops < 48 * 48 * 48 { 1 } else { threads };
    if BACKEND.load(Ordering::Relaxed) == 1 {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            alpha,
            a.p.0,
            a.rs,
            a.cs,
            b.p.0,
            b.rs,
            b.cs,
            if accumulate { 1.0 } else { 0.0 },
            c.p.0,
            c.rs,
            c.cs,
        );
    } else {
        let par = if threads > 1 { gemm::Parallelism::Rayon(threads) } else { gemm::Parallelism::None };
        gemm::gemm(
            m, n, k, c.p.0, c.cs, c.rs, accumulate, a.p.0, a.cs, a.rs, b.p.0, b.cs, b.rs, 1.0, alpha, false, false, false,
            par,
        );
    }
}

/// Applies unary epilogue ops in place to an m×n strided matrix.
///
/// # Safety
/// `c` must be valid for m×n with its strides.
pub unsafe fn epilogue(m: usize, n: usize, c: Mat, ops: &[Un]) {
    if ops.is_empty() {
        return;
    }
    let mut tmp = vec![0f32; n];
    let mut tmp2 = vec![0f32; n];
    for i in 0..m {
        let row = c.p.0.offset(i as isize * c.rs);
        for j in 0..n {
            tmp[j] = *row.offset(j as isize * c.cs);
        }
        for &op in ops {
            f32::un(op, &mut tmp2, &tmp);
            std::mem::swap(&mut tmp, &mut tmp2);
        }
        for j in 0..n {
            *row.offset(j as isize * c.cs) = tmp[j];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(m: usize, n: usize, k: usize, a: &[f32], b: &[f32]) -> Vec<f32> {
        let mut c = vec![0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
            }
        }
        c
    }

    #[test]
    fn both_backends_match_naive_with_transposed_b() {
        let (m, n, k) = (37, 29, 53);
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 13) as f32 - 6.0) / 7.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 5 % 11) as f32 - 5.0) / 5.0).collect();
        // b^T stored n×k, read through strides as k×n
        let mut bt = vec![0f32; n * k];
        for p in 0..k {
            for j in 0..n {
                bt[j * k + p] = b[p * n + j];
            }
        }
        let expect = naive(m, n, k, &a, &b);
        for be in ["gemm", "matrixmultiply"] {
            set_backend(be).unwrap();
            let mut c = vec![0f32; m * n];
            unsafe {
                sgemm(
                    m,
                    n,
                    k,
                    Mat { p: SPtr(a.as_ptr() as *mut f32), rs: k as isize, cs: 1 },
                    Mat { p: SPtr(bt.as_ptr() as *mut f32), rs: 1, cs: k as isize },
                    Mat { p: SPtr(c.as_mut_ptr()), rs: n as isize, cs: 1 },
                    1.0,
                    false,
                    2,
                );
            }
            for (x, y) in c.iter().zip(&expect) {
                assert!((x - y).abs() < 1e-4, "{be}: {x} vs {y}");
            }
        }
        set_backend("gemm").unwrap();
        assert!(set_backend("blas").is_err());
    }
}
