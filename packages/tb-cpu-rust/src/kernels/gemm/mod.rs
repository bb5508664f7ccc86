//! Matrix products (mm, addmm, bmm, baddbmm) over strided operands, with fused epilogues.
//!
//! Two maintained kernels are wired in and chosen at run time (`set_backend`): faer's `gemm`
//! crate and `matrixmultiply`. Both pack operands into cache blocks and dispatch on the CPU's
//! ISA; transposed operands are passed as strides, never copied. The benchmark picks the
//! default (see README).

pub mod bf16;
pub mod dot_rows;
pub mod epilogue;
pub mod gemv;
pub mod gemv_pairs;
pub mod own;

use crate::core::math::unary::Un;
pub use epilogue::{Epi, EpiOp, EpiSpec, Mat, MAX_EPI};
use std::sync::atomic::{AtomicU8, Ordering};

static BACKEND: AtomicU8 = AtomicU8::new(DEFAULT);
/// "auto": our kernel where the CPU has AVX-512 or AVX2+FMA, else faer's `gemm` crate.
const DEFAULT: u8 = 3;

pub fn set_backend(name: &str) -> Result<(), String> {
    let v = match name {
        "gemm" => 0,
        "matrixmultiply" => 1,
        "own" if crate::kernels::gemm::own::available() => 2,
        "own" => return Err("the own GEMM kernel needs x86-64 with AVX-512 or AVX2+FMA".into()),
        "auto" => DEFAULT,
        other => return Err(format!("unknown GEMM backend {other:?} (auto, own, gemm, matrixmultiply)")),
    };
    BACKEND.store(v, Ordering::Relaxed);
    Ok(())
}

pub(crate) fn resolved() -> u8 {
    match BACKEND.load(Ordering::Relaxed) {
        3 if crate::kernels::gemm::own::available() => 2,
        3 => 0,
        b => b,
    }
}

pub fn backend() -> &'static str {
    match resolved() {
        0 => "gemm",
        1 => "matrixmultiply",
        _ => "own",
    }
}

/// c = beta_c * c + alpha * a @ b, where a is m×k, b is k×n, c is m×n.
/// `accumulate` false means c is write-only (its old contents are ignored).
///
/// # Safety
/// The three matrices must be valid for the given dimensions and strides and `c` must not
/// overlap `a` or `b`; the executor checks both when it prepares a plan.
pub unsafe fn sgemm(m: usize, n: usize, k: usize, a: Mat, b: Mat, c: Mat, alpha: f32, accumulate: bool, threads: usize) {
    sgemm_epi(m, n, k, a, b, c, alpha, accumulate, threads, &Epi::default())
}

/// `sgemm`, then the epilogue `epi` on every output element (inside the kernel's tile loop
/// for the own kernel; one pass over the output for the crates).
///
/// # Safety
/// As `sgemm`; the epilogue's matrices must be valid for m×n.
pub unsafe fn sgemm_epi(m: usize, n: usize, k: usize, a: Mat, b: Mat, c: Mat, alpha: f32, accumulate: bool, threads: usize, epi: &Epi) {
    if m == 0 || n == 0 {
        return;
    }
    let be = resolved();
    if be == 2 && m <= crate::kernels::gemm::gemv::MAX_ROWS && crate::kernels::gemm::gemv::sgemv(m, n, k, a, b, c, alpha, accumulate, threads, epi) {
        return;
    }
    if be == 2 && few_columns(m, n, k, a, b, c, alpha, accumulate, threads, epi) {
        return;
    }
    if k == 0 || be != 2 {
        if k == 0 {
            if !accumulate {
                for i in 0..m {
                    for j in 0..n {
                        *c.p.0.offset(i as isize * c.rs + j as isize * c.cs) = 0.0;
                    }
                }
            }
        } else {
            crate_sgemm(be, m, n, k, a, b, c, alpha, accumulate, threads);
        }
        if !epi.is_empty() {
            epilogue_pass(m, n, c, epi);
        }
        return;
    }
    crate::kernels::gemm::own::sgemm(m, n, k, a, b, c, alpha, accumulate, threads, epi)
}

/// At most this many columns of C, from rows of B contiguous along k (`b` the transposed view
/// of a row-major n × k weight), go to `dot_rows` instead of the packing GEMM.
const FEW_COLUMNS: usize = 12;

/// `c = [c +] a @ b` then `epi`, one dot product per output (`dot_rows::gemm_abt_add`) when C has
/// at most FEW_COLUMNS columns, B's columns and A's rows are contiguous along k and k fills a
/// vector: a linear layer with few outputs. Rows split between `threads` above ~1M multiply-adds.
/// False (nothing written) for any other product.
#[allow(clippy::too_many_arguments)]
unsafe fn few_columns(m: usize, n: usize, k: usize, a: Mat, b: Mat, c: Mat, alpha: f32, accumulate: bool, threads: usize, epi: &Epi) -> bool {
    if n > FEW_COLUMNS || k < 16 || alpha != 1.0 || a.cs != 1 || a.rs <= 0 || b.rs != 1 || b.cs <= 0 || c.cs != 1 || c.rs <= 0 {
        return false;
    }
    let (lda, ldb, ldc) = (a.rs as usize, b.cs as usize, c.rs as usize);
    let rows = |i0: usize, i1: usize| {
        let cp = c.p.get().add(i0 * ldc);
        if !accumulate {
            for i in 0..i1 - i0 {
                std::slice::from_raw_parts_mut(cp.add(i * ldc), n).fill(0.0);
            }
        }
        dot_rows::gemm_abt_add(i1 - i0, n, k, a.p.get().add(i0 * lda), lda, b.p.get(), ldb, cp, ldc);
        if !epi.is_empty() {
            epilogue_pass(i1 - i0, n, Mat { p: crate::core::mem::SPtr(cp), rs: c.rs, cs: 1 }, &epi.at(i0, 0));
        }
    };
    let parts = if threads > 1 && m * n * k >= 1 << 20 { threads.min(m.div_ceil(4)) } else { 1 };
    if parts > 1 {
        crate::core::par::for_each(parts, |t| {
            let (i0, i1) = (m * t / parts / 4 * 4, if t + 1 == parts { m } else { m * (t + 1) / parts / 4 * 4 });
            if i0 < i1 {
                rows(i0, i1);
            }
        });
    } else {
        rows(0, m);
    }
    true
}

unsafe fn crate_sgemm(be: u8, m: usize, n: usize, k: usize, a: Mat, b: Mat, c: Mat, alpha: f32, accumulate: bool, threads: usize) {
    let flops = m * n * k;
    let threads = if flops < 48 * 48 * 48 { 1 } else { threads };
    if be == 1 {
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

/// One pass over an m×n output applying `epi` row by row.
unsafe fn epilogue_pass(m: usize, n: usize, c: Mat, epi: &Epi) {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::core::isa::has_avx512() {
            return epilogue_pass_avx512(m, n, c, epi);
        }
        if crate::core::isa::has_avx2() {
            return epilogue_pass_avx2(m, n, c, epi);
        }
    }
    epilogue_pass_generic(m, n, c, epi)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
unsafe fn epilogue_pass_avx512(m: usize, n: usize, c: Mat, epi: &Epi) {
    epilogue_pass_generic(m, n, c, epi)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn epilogue_pass_avx2(m: usize, n: usize, c: Mat, epi: &Epi) {
    epilogue_pass_generic(m, n, c, epi)
}

#[inline(always)]
unsafe fn epilogue_pass_generic(m: usize, n: usize, c: Mat, epi: &Epi) {
    let mut tmp = [0f32; 256];
    for i in 0..m {
        let mut j = 0;
        while j < n {
            let w = 256.min(n - j);
            let row = c.p.0.offset(i as isize * c.rs + j as isize * c.cs);
            if c.cs == 1 {
                epi.apply_row(std::slice::from_raw_parts_mut(row, w), i, j);
            } else {
                for q in 0..w {
                    tmp[q] = *row.offset(q as isize * c.cs);
                }
                epi.apply_row(&mut tmp[..w], i, j);
                for q in 0..w {
                    *row.offset(q as isize * c.cs) = tmp[q];
                }
            }
            j += w;
        }
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
    for chunk in ops.chunks(MAX_EPI) {
        epilogue_pass(m, n, c, &Epi::new(None, chunk.iter().map(|&u| EpiOp::Un(u))));
    }
}

// -- steps: gemm -------------------------------------------------------------------------------------

use crate::core::mem::SPtr;
use crate::core::tensor::{need, View};
use crate::kernels::registry::{f32s, kernel, Args, Built, StepDef};

// `any`: the builder checks the dtypes (float32; bfloat16 / float16 storage in bf16.rs)
pub const STEPS: &[StepDef] = &[StepDef::any("gemm", gemm_step)];

crate::step_params!(
    /// c = alpha * a @ b + beta * bias, then the epilogue (by name) per output tile
    struct GemmParams { alpha: f64, beta: f64, epilogue: Vec<String> }
);

/// An epilogue step by the name Python's lowering writes.
pub fn epilogue_by_name(name: &str) -> Result<EpiSpec, String> {
    match name {
        "relu" => Ok(EpiSpec::Un(Un::Relu)),
        "gelu" => Ok(EpiSpec::Un(Un::GeluErf)),
        "gelu_tanh" => Ok(EpiSpec::Un(Un::GeluTanh)),
        "silu" => Ok(EpiSpec::Un(Un::Silu)),
        "sigmoid" => Ok(EpiSpec::Un(Un::Sigmoid)),
        "tanh" => Ok(EpiSpec::Un(Un::Tanh)),
        "add" => Ok(EpiSpec::Residual),
        other => Err(format!("unknown epilogue {other:?}")),
    }
}

fn gemm_step(args: &Args) -> Built {
    let p: GemmParams = args.params()?;
    let epi = p.epilogue.iter().map(|e| epilogue_by_name(e)).collect::<Result<Vec<_>, _>>()?;
    let (alpha, beta) = (p.alpha as f32, p.beta as f32);
    let (a, b, c) = (args.take(0)?, args.take(1)?, args.out(0)?);
    let bias = args.opt(2);
    let low = [Some(&a), Some(&b), Some(&c), bias.as_ref(), args.opt(3).as_ref()].iter().flatten().any(|v| bf16::is_low(v.dtype));
    if low {
        // bfloat16 / float16 storage, float32 compute (bf16.rs)
        let ok = |v: &View| v.dtype == crate::core::tensor::DType::F32 || bf16::is_low(v.dtype);
        need([Some(&a), Some(&b), Some(&c), bias.as_ref(), args.opt(3).as_ref()].iter().flatten().all(|v| ok(v)), "gemm operands must be float32, bfloat16 or float16")?;
    } else {
        f32s(&[&a, &b, &c])?;
    }
    let r = c.rank();
    need(r == 2 || r == 3, "gemm operands must be 2-d or 3-d")?;
    need(a.rank() == r && b.rank() == r, "gemm operands differ in rank")?;
    let (m, k, n) = (a.sizes[r - 2], a.sizes[r - 1], b.sizes[r - 1]);
    need(b.sizes[r - 2] == k && c.sizes[r - 2] == m && c.sizes[r - 1] == n, "gemm shapes do not agree")?;
    if r == 3 {
        need(a.sizes[0] == c.sizes[0] && b.sizes[0] == c.sizes[0], "bmm batch sizes differ")?;
    }
    if let Some(bv) = &bias {
        if !low {
            f32s(&[bv])?;
        }
        need(bv.sizes == c.sizes, "gemm bias must be broadcast to the output shape")?;
    }
    let res = args.opt(3);
    if let Some(rv) = &res {
        if !low {
            f32s(&[rv])?;
        }
        need(rv.sizes == c.sizes, "gemm residual must be broadcast to the output shape")?;
    }
    need(res.is_some() == epi.contains(&EpiSpec::Residual), "gemm residual operand and epilogue disagree")?;
    need(epi.iter().filter(|e| **e == EpiSpec::Residual).count() <= 1, "at most one residual add")?;
    need(epi.len() <= MAX_EPI, "too many GEMM epilogue steps")?;
    if low {
        return kernel(move |mem| unsafe {
            bf16::gemm(mem, &a, &b, &c, bias.as_ref(), res.as_ref(), alpha, beta, &epi);
            Ok(())
        });
    }
    kernel(move |mem| unsafe {
        let threads = crate::core::par::threads();
        let batch = if r == 3 { c.sizes[0] } else { 1 };
        let (pa, pb, pc) = (mem.ptr::<f32>(&a), mem.ptr::<f32>(&b), mem.ptr::<f32>(&c));
        let mat = |p: SPtr<f32>, v: &View, i: usize| {
            let off = if r == 3 { i * v.strides[0] } else { 0 };
            Mat { p: SPtr(p.add(off)), rs: v.strides[r - 2] as isize, cs: v.strides[r - 1] as isize }
        };
        let pbias = bias.as_ref().map(|v| (mem.ptr::<f32>(v), v));
        let pres = res.as_ref().map(|v| (mem.ptr::<f32>(v), v));
        let one = |i: usize, t: usize| {
            // bias and residual are added per output tile, inside the GEMM's store
            let e = Epi::new(
                pbias.map(|(p, v)| (mat(p, v, i), beta)),
                epi.iter().map(|s| match *s {
                    EpiSpec::Un(u) => EpiOp::Un(u),
                    EpiSpec::Residual => {
                        let (p, v) = pres.expect("checked when built");
                        EpiOp::Add(mat(p, v, i), 1.0)
                    }
                }),
            );
            sgemm_epi(m, n, k, mat(pa, &a, i), mat(pb, &b, i), mat(pc, &c, i), alpha, false, t, &e);
        };
        if batch > 1 && m * n * k < 256 * 256 * 256 {
            crate::core::par::for_each(batch, |i| one(i, 1));
        } else {
            for i in 0..batch {
                one(i, threads);
            }
        }
        Ok(())
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::core::mem::SPtr;
    use std::sync::Mutex;

    // the backend is a process-wide setting: tests that switch it take turns
    pub(crate) static LOCK: Mutex<()> = Mutex::new(());

    fn naive(m: usize, n: usize, k: usize, a: &[f32], b: &[f32]) -> Vec<f32> {
        let mut c = vec![0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
            }
        }
        c
    }

    fn backends() -> Vec<&'static str> {
        let mut v = vec!["gemm", "matrixmultiply"];
        if crate::kernels::gemm::own::available() {
            v.push("own");
        }
        v
    }

    fn data(len: usize, mul: usize, md: usize) -> Vec<f32> {
        (0..len).map(|i| ((i * mul % md) as f32 - (md / 2) as f32) / md as f32).collect()
    }

    #[test]
    fn every_backend_matches_naive_with_transposed_b_and_odd_sizes() {
        let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
        for &(m, n, k) in &[(37usize, 29usize, 53usize), (1, 1, 1), (8, 32, 256), (9, 33, 257), (130, 70, 600), (3, 100, 2)] {
            let a = data(m * k, 7, 13);
            let b = data(k * n, 5, 11);
            // b^T stored n×k, read through strides as k×n
            let mut bt = vec![0f32; n * k];
            for p in 0..k {
                for j in 0..n {
                    bt[j * k + p] = b[p * n + j];
                }
            }
            let expect = naive(m, n, k, &a, &b);
            for be in backends() {
                set_backend(be).unwrap();
                for (bmat, threads) in [(Mat { p: SPtr(bt.as_ptr() as *mut f32), rs: 1, cs: k as isize }, 2), (Mat { p: SPtr(b.as_ptr() as *mut f32), rs: n as isize, cs: 1 }, 1)] {
                    let mut c = vec![7f32; m * n];
                    unsafe {
                        sgemm(m, n, k, Mat { p: SPtr(a.as_ptr() as *mut f32), rs: k as isize, cs: 1 }, bmat, Mat { p: SPtr(c.as_mut_ptr()), rs: n as isize, cs: 1 }, 1.0, false, threads);
                    }
                    for (x, y) in c.iter().zip(&expect) {
                        assert!((x - y).abs() < 1e-3, "{be} {m}x{n}x{k}: {x} vs {y}");
                    }
                }
            }
        }
        set_backend("auto").unwrap();
        assert!(set_backend("blas").is_err());
    }

    #[test]
    fn epilogue_bias_activation_residual_and_accumulate() {
        let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let (m, n, k) = (19, 45, 300);
        let a = data(m * k, 7, 13);
        let b = data(k * n, 5, 11);
        let bias = data(n, 3, 7);
        let res = data(m * n, 11, 17);
        let base = naive(m, n, k, &a, &b);
        for be in backends() {
            set_backend(be).unwrap();
            // c (column-major, to exercise strided output) = 0.5 * (2*ab + 3*bias) -> relu -> + 2*res
            let mut c = vec![1f32; m * n];
            let epi = Epi::new(
                Some((Mat { p: SPtr(bias.as_ptr() as *mut f32), rs: 0, cs: 1 }, 3.0)),
                [EpiOp::Un(Un::Relu), EpiOp::Add(Mat { p: SPtr(res.as_ptr() as *mut f32), rs: n as isize, cs: 1 }, 2.0)],
            );
            unsafe {
                sgemm_epi(
                    m, n, k,
                    Mat { p: SPtr(a.as_ptr() as *mut f32), rs: k as isize, cs: 1 },
                    Mat { p: SPtr(b.as_ptr() as *mut f32), rs: n as isize, cs: 1 },
                    Mat { p: SPtr(c.as_mut_ptr()), rs: 1, cs: m as isize },
                    2.0, true, 2, &epi,
                );
            }
            for i in 0..m {
                for j in 0..n {
                    let want = (1.0 + 2.0 * base[i * n + j] + 3.0 * bias[j]).max(0.0) + 2.0 * res[i * n + j];
                    let got = c[j * m + i];
                    assert!((got - want).abs() < 1e-3, "{be} ({i},{j}): {got} vs {want}");
                }
            }
        }
        set_backend("auto").unwrap();
    }

    /// A linear layer with few outputs (`x · Wᵀ`, W row-major, n ≤ FEW_COLUMNS) takes the
    /// dot-product path: every n up to 12 (tiles of 3 columns and their edges), rows past whole
    /// blocks of 4, k tails of each vector width, padded row strides, two threads over many rows,
    /// accumulate, and the epilogue (bias, relu, residual) on the right rows; NaN stays in its row.
    #[test]
    fn few_columns_match_naive_with_epilogue() {
        let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
        for &(m, k) in &[(1usize, 16usize), (5, 17), (64, 512), (9, 40), (300, 129), (2048, 100)] {
            for n in 1..=FEW_COLUMNS {
                let (lda, ldw, ldc) = (k + 3, k + 1, n + 2);
                let mut a = data(m * lda, 7, 13);
                if m > 2 {
                    a[2 * lda + k / 2] = f32::NAN;
                }
                let w = data(n * ldw, 5, 11);
                let bias = data(n, 3, 7);
                let res = data(m * n, 11, 17);
                for (accumulate, threads) in [(false, 1), (true, 2)] {
                    let mut c = vec![0.5f32; m * ldc];
                    let epi = Epi::new(
                        Some((Mat { p: SPtr(bias.as_ptr() as *mut f32), rs: 0, cs: 1 }, 1.0)),
                        [EpiOp::Un(Un::Relu), EpiOp::Add(Mat { p: SPtr(res.as_ptr() as *mut f32), rs: n as isize, cs: 1 }, 1.0)],
                    );
                    let (am, bm, cm) = (
                        Mat { p: SPtr(a.as_ptr() as *mut f32), rs: lda as isize, cs: 1 },
                        Mat { p: SPtr(w.as_ptr() as *mut f32), rs: 1, cs: ldw as isize },
                        Mat { p: SPtr(c.as_mut_ptr()), rs: ldc as isize, cs: 1 },
                    );
                    assert!(unsafe { few_columns(m, n, k, am, bm, cm, 1.0, accumulate, threads, &epi) });
                    for i in 0..m {
                        for j in 0..n {
                            let dot: f64 = (0..k).map(|p| a[i * lda + p] as f64 * w[j * ldw + p] as f64).sum();
                            let start = if accumulate { 0.5 } else { 0.0 };
                            let want = (start + dot + bias[j] as f64).max(0.0) + res[i * n + j] as f64;
                            let got = c[i * ldc + j] as f64;
                            if i == 2 && m > 2 {
                                assert!(got.is_nan(), "{m}x{n}x{k} ({i},{j}): {got}");
                            } else {
                                assert!((got - want).abs() <= 1e-4 * (1.0 + dot.abs() + k as f64 * 0.01), "{m}x{n}x{k} acc {accumulate} ({i},{j}): {got} vs {want}");
                            }
                        }
                        for j in n..ldc {
                            assert_eq!(c[i * ldc + j], 0.5, "the padding of row {i} is not written");
                        }
                    }
                }
            }
        }
        // not its form: B not transposed, too many columns, alpha, a short k
        let z = [0f32; 64];
        let mat = |rs: isize, cs: isize| Mat { p: SPtr(z.as_ptr() as *mut f32), rs, cs };
        unsafe {
            assert!(!few_columns(2, 4, 16, mat(16, 1), mat(4, 1), mat(4, 1), 1.0, false, 1, &Epi::default()));
            assert!(!few_columns(2, 13, 16, mat(16, 1), mat(1, 16), mat(13, 1), 1.0, false, 1, &Epi::default()));
            assert!(!few_columns(2, 4, 16, mat(16, 1), mat(1, 16), mat(4, 1), 2.0, false, 1, &Epi::default()));
            assert!(!few_columns(2, 4, 8, mat(8, 1), mat(1, 8), mat(4, 1), 1.0, false, 1, &Epi::default()));
        }
    }
}
