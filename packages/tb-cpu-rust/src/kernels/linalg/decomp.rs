//! Matrix decompositions over batches of small matrices: Householder QR with LAPACK's reflector
//! convention (geqrf, orgqr, ormqr, linalg.qr), singular values by one-sided Jacobi, symmetric
//! eigenvalues by cyclic Jacobi, and what is built on them (pinv, polar, matrix_sqrth), plus the
//! matrix exponential by scaling and squaring of a degree-13 Padé approximant.
//!
//! Every matrix is read into an f64 scratch copy and rounded to float32 once on the way out, so
//! the results agree with LAPACK's float32 ones within float32 rounding of a well-conditioned
//! problem. Jacobi is chosen over faster QR-iteration schemes because it is accurate to the last
//! bits for the small matrices this engine sees and needs no shifts; each sweep loop is capped.
//!
//! QR results are unique given LAPACK's choice of reflector (beta = -sign(alpha) * norm), so they
//! match ATen entry by entry. Singular and eigen *vectors* are unique only up to sign (and to a
//! rotation inside repeated values); the lowering gives these kernels only graphs that do not
//! return them, or return them empty.

use super::{load, store};
use crate::core::mem::Mem;
use crate::core::tensor::{need, DType, Result, View};
use crate::kernels::registry::{kernel, Args, Built, StepDef};
use serde::Deserialize;

/// Jacobi sweeps before giving up (convergence is quadratic: small matrices need well under 20)
const MAX_SWEEPS: usize = 60;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// A -> QR (R above the diagonal, reflectors below), tau
    Geqrf,
    /// A, tau -> Q (first n columns of H1 ... Hk)
    Orgqr,
    /// A, tau, C -> op(Q) C or C op(Q) (flags: left, transpose)
    Ormqr,
    /// A -> Q, R (flags: mode 0 reduced, 1 complete, 2 r only)
    Qr,
    /// A -> U, S, Vh (flags: full_matrices, compute_uv)
    Svd,
    /// A -> eigenvalues, eigenvectors (flags: upper, compute_v)
    Eigh,
    /// A, atol?, rtol? -> pseudo-inverse (flags: hermitian)
    Pinv,
    /// A -> U, H with A = U H
    Polar,
    /// A -> the symmetric square root of a symmetric A
    Sqrth,
    /// A -> exp(A)
    MatrixExp,
}

/// The parameters of each step kind of this family, by name (the variant is the tag).
#[derive(Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
enum Params {
    Geqrf {},
    Orgqr {},
    Ormqr { left: bool, transpose: bool },
    /// mode 0 reduced, 1 complete, 2 r
    Qr { mode: i64 },
    Svd { full_matrices: bool, compute_uv: bool },
    Eigh { upper: bool, compute_v: bool },
    Pinv { hermitian: bool },
    LinalgPolar {},
    Sqrth {},
    MatrixExp {},
}

/// What the kinds' parameters say, by name (a kind leaves the others at their default).
#[derive(Default, Clone, Copy)]
pub struct Flags {
    pub left: bool,
    pub transpose: bool,
    pub mode: i64,
    pub full_matrices: bool,
    pub compute_uv: bool,
    pub upper: bool,
    pub compute_v: bool,
    pub hermitian: bool,
}

fn split(p: Params) -> (Op, Flags) {
    let f = Flags::default();
    match p {
        Params::Geqrf {} => (Op::Geqrf, f),
        Params::Orgqr {} => (Op::Orgqr, f),
        Params::Ormqr { left, transpose } => (Op::Ormqr, Flags { left, transpose, ..f }),
        Params::Qr { mode } => (Op::Qr, Flags { mode, ..f }),
        Params::Svd { full_matrices, compute_uv } => (Op::Svd, Flags { full_matrices, compute_uv, ..f }),
        Params::Eigh { upper, compute_v } => (Op::Eigh, Flags { upper, compute_v, ..f }),
        Params::Pinv { hermitian } => (Op::Pinv, Flags { hermitian, ..f }),
        Params::LinalgPolar {} => (Op::Polar, f),
        Params::Sqrth {} => (Op::Sqrth, f),
        Params::MatrixExp {} => (Op::MatrixExp, f),
    }
}

pub const STEPS: &[StepDef] = &[StepDef::core("geqrf", build), StepDef::core("orgqr", build), StepDef::core("ormqr", build),
    StepDef::core("qr", build), StepDef::core("svd", build), StepDef::core("eigh", build), StepDef::core("pinv", build),
    StepDef::core("linalg_polar", build), StepDef::core("sqrth", build), StepDef::core("matrix_exp", build)];

fn build(a: &Args) -> Built {
    let (op, flags) = split(a.tagged()?);
    let k = Decomp::new(a.op, op, flags, a.ins.clone(), a.outs.clone())?;
    kernel(move |mem| unsafe { k.run(mem) })
}

pub struct Decomp {
    op: Op,
    ins: Vec<Option<View>>,
    outs: Vec<View>,
    flags: Flags,
    batch: Vec<usize>,
}

fn mat(v: &View) -> Result<(usize, usize)> {
    need(v.rank() >= 2, "linalg operand must be at least 2-d")?;
    Ok((v.sizes[v.rank() - 2], v.sizes[v.rank() - 1]))
}

impl Decomp {
    pub fn new(name: &str, op: Op, flags: Flags, ins: Vec<Option<View>>, outs: Vec<View>) -> Result<Decomp> {
        let a = ins.first().cloned().flatten().ok_or_else(|| format!("{name}: missing matrix"))?;
        let (m, n) = mat(&a)?;
        let k = m.min(n);
        let batch = a.sizes[..a.rank() - 2].to_vec();
        let nouts = match op {
            Op::Geqrf | Op::Qr | Op::Eigh | Op::Polar => 2,
            Op::Svd => 3,
            _ => 1,
        };
        need(outs.len() == nouts, &format!("{name}: expected {nouts} outputs"))?;
        // outputs that were not asked for (U, Vh without compute_uv; Q in mode "r") come empty
        for v in ins.iter().flatten().chain(outs.iter().filter(|v| v.numel() > 0 || v.rank() > 1)) {
            let float = v.dtype == DType::F32;
            need(float, &format!("{name}: float32 operands only"))?;
            need(v.rank() >= batch.len() && v.sizes[..batch.len()] == batch[..], &format!("{name}: operands differ in batch shape"))?;
        }
        for v in &outs {
            for i in ins.iter().flatten() {
                need(v.buf != i.buf, "linalg output shares a buffer with an input")?;
            }
        }
        let shape = |v: &View, tail: &[usize], what: &str| -> Result<()> {
            let ok = v.rank() == batch.len() + tail.len() && v.sizes[batch.len()..] == tail[..];
            need(ok, &format!("{name}: {what} has shape {:?}, expected trailing {tail:?}", v.sizes))
        };
        let square = |what: &str| need(m == n, &format!("{name} of a non-square matrix ({what})"));
        match op {
            Op::Geqrf => {
                shape(&outs[0], &[m, n], "QR")?;
                shape(&outs[1], &[k], "tau")?;
            }
            Op::Orgqr => {
                let tau = ins.get(1).cloned().flatten().ok_or("householder_product: missing tau")?;
                need(m >= n, "householder_product: input.shape[-2] must be >= input.shape[-1]")?;
                need(tau.rank() == batch.len() + 1 && tau.sizes[batch.len()] <= n, "householder_product: tau.shape[-1] must be <= input.shape[-1]")?;
                shape(&outs[0], &[m, n], "Q")?;
            }
            Op::Ormqr => {
                let tau = ins.get(1).cloned().flatten().ok_or("ormqr: missing tau")?;
                let c = ins.get(2).cloned().flatten().ok_or("ormqr: missing C")?;
                let (cr, cc) = mat(&c)?;
                let q = if flags.left { cr } else { cc };
                need(m == q, "ormqr: input.shape[-2] must equal the size of Q")?;
                need(tau.rank() == batch.len() + 1 && tau.sizes[batch.len()] <= n.min(m), "ormqr: tau too long")?;
                shape(&outs[0], &[cr, cc], "result")?;
            }
            Op::Qr => {
                need((0..=2).contains(&flags.mode), "qr mode")?;
                let qc = if flags.mode == 1 { m } else { k };
                if flags.mode != 2 {
                    shape(&outs[0], &[m, qc], "Q")?;
                }
                shape(&outs[1], &[if flags.mode == 1 { m } else { k }, n], "R")?;
            }
            Op::Svd => {
                shape(&outs[1], &[k], "S")?;
                if flags.compute_uv {
                    let (uc, vr) = if flags.full_matrices { (m, n) } else { (k, k) };
                    shape(&outs[0], &[m, uc], "U")?;
                    shape(&outs[2], &[vr, n], "Vh")?;
                }
            }
            Op::Eigh => {
                square("eigh")?;
                shape(&outs[0], &[n], "eigenvalues")?;
                if flags.compute_v {
                    shape(&outs[1], &[n, n], "eigenvectors")?;
                }
            }
            Op::Pinv => {
                if flags.hermitian {
                    square("pinv hermitian")?;
                }
                shape(&outs[0], &[n, m], "pinv")?;
                for v in ins.iter().skip(1).flatten() {
                    shape(v, &[], "a tolerance")?;
                }
            }
            Op::Polar => {
                shape(&outs[0], &[m, n], "U")?;
                shape(&outs[1], &[n, n], "H")?;
            }
            Op::Sqrth | Op::MatrixExp => {
                square("square root / exponential")?;
                shape(&outs[0], &[n, n], "result")?;
            }
        }
        Ok(Decomp { op, ins, outs, flags, batch })
    }

    /// # Safety
    /// The views must have been validated by the executor (they lie inside their buffers).
    pub unsafe fn run(&self, mem: &Mem) -> Result<()> {
        let nb: usize = self.batch.iter().product();
        let nd = self.batch.len();
        let a = self.ins[0].as_ref().ok_or("linalg: missing operand")?;
        let (m, n) = mat(a)?;
        let k = m.min(n);
        let f = self.flags;
        for bi in 0..nb {
            let off = |v: &View| -> usize {
                let mut r = bi;
                let mut o = v.offset;
                for d in (0..nd).rev() {
                    o += (r % v.sizes[d]) * v.strides[d];
                    r /= v.sizes[d];
                }
                o
            };
            let get = |v: &View| {
                let (r, c) = mat(v).unwrap_or((1, 1));
                load(mem, v, off(v), r, c)
            };
            let put = |i: usize, data: &[f64]| {
                let v = &self.outs[i];
                if v.rank() == nd + 1 {
                    store_vec(mem, v, off(v), data);
                } else {
                    let (r, c) = mat(v).unwrap_or((1, 1));
                    store(mem, v, off(v), data, r, c);
                }
            };
            let vec_in = |i: usize| -> Vec<f64> {
                let v = self.ins[i].as_ref().expect("validated operand");
                load_vec(mem, v, off(v))
            };
            let mut x = get(a);
            // LAPACK's SVD and symmetric eigen drivers fail on NaN / inf; ATen raises then, so do we
            let spectral = matches!(self.op, Op::Svd | Op::Eigh | Op::Pinv | Op::Polar | Op::Sqrth);
            if spectral && x.iter().any(|v| !v.is_finite()) {
                let eig = matches!(self.op, Op::Eigh | Op::Sqrth) || (self.op == Op::Pinv && f.hermitian);
                let api = if eig { "linalg.eigh" } else { "linalg.svd" };
                return Err(format!("{api}: The algorithm failed to converge because the input matrix contained non-finite values."));
            }
            match self.op {
                Op::Geqrf => {
                    let tau = geqrf(&mut x, m, n);
                    put(0, &x);
                    put(1, &tau);
                }
                Op::Orgqr => {
                    let tau = vec_in(1);
                    put(0, &orgqr(&x, &tau, m, n, n));
                }
                Op::Ormqr => {
                    let tau = vec_in(1);
                    let cv = self.ins[2].as_ref().expect("validated operand");
                    let (cr, cc) = mat(cv)?;
                    let mut c = get(cv);
                    ormqr(&x, n, &tau, &mut c, cr, cc, f.left, f.transpose);
                    put(0, &c);
                }
                Op::Qr => {
                    let tau = geqrf(&mut x, m, n);
                    let rr = if f.mode == 1 { m } else { k };
                    let mut r = vec![0f64; rr * n];
                    for i in 0..rr.min(m) {
                        for j in i..n {
                            r[i * n + j] = x[i * n + j];
                        }
                    }
                    if f.mode != 2 {
                        let qc = if f.mode == 1 { m } else { k };
                        put(0, &orgqr(&x, &tau, m, n, qc));
                    }
                    put(1, &r);
                }
                Op::Svd => {
                    let (u, s, vt) = svd(&x, m, n, f.full_matrices);
                    put(1, &s);
                    if f.compute_uv {
                        put(0, &u);
                        put(2, &vt);
                    }
                }
                Op::Eigh => {
                    let (w, v) = eigh(&mut x, n, f.upper);
                    put(0, &w);
                    if f.compute_v {
                        put(1, &v);
                    }
                }
                Op::Pinv => {
                    let tol = |i: usize| -> Option<f64> {
                        let v = self.ins.get(i)?.as_ref()?;
                        Some(load_scalar(mem, v, off(v)))
                    };
                    put(0, &pinv(&x, m, n, tol(1), tol(2), f.hermitian));
                }
                Op::Polar => {
                    let (u, h) = polar(&x, m, n);
                    put(0, &u);
                    put(1, &h);
                }
                Op::Sqrth => {
                    let (w, v) = eigh(&mut x, n, false);
                    // ATen clamps negative eigenvalues (rounding of a semi-definite A) to zero
                    let s: Vec<f64> = w.iter().map(|&l| if l.is_nan() { l } else { l.max(0.0).sqrt() }).collect();
                    put(0, &vdvt(&v, &s, n, n, n));
                }
                Op::MatrixExp => put(0, &matrix_exp(&x, n)),
            }
        }
        Ok(())
    }
}

// --- Householder QR (LAPACK conventions) -------------------------------------------------------

/// LAPACK dlarfg on (alpha, x): returns (beta, tau) and scales x into the reflector's tail, so
/// that H = I - tau [1; x] [1; x]^T maps (alpha, x) to (beta, 0).
fn reflector(alpha: f64, x: &mut [f64]) -> (f64, f64) {
    let xnorm = x.iter().map(|v| v * v).sum::<f64>().sqrt();
    if xnorm == 0.0 {
        return (alpha, 0.0);
    }
    let norm = alpha.hypot(xnorm);
    let beta = if alpha >= 0.0 { -norm } else { norm };
    let tau = (beta - alpha) / beta;
    let scale = 1.0 / (alpha - beta);
    for v in x.iter_mut() {
        *v *= scale;
    }
    (beta, tau)
}

/// In-place unblocked QR of an m x n row-major matrix (LAPACK dgeqr2): R on and above the
/// diagonal, reflector tails below it; returns tau (min(m, n) values).
pub fn geqrf(a: &mut [f64], m: usize, n: usize) -> Vec<f64> {
    let k = m.min(n);
    let mut tau = vec![0f64; k];
    let mut v = vec![0f64; m];
    for j in 0..k {
        let mut tail: Vec<f64> = (j + 1..m).map(|i| a[i * n + j]).collect();
        let (beta, t) = reflector(a[j * n + j], &mut tail);
        tau[j] = t;
        a[j * n + j] = beta;
        for (i, &x) in (j + 1..m).zip(tail.iter()) {
            a[i * n + j] = x;
        }
        if t == 0.0 {
            continue;
        }
        v[j] = 1.0;
        v[j + 1..m].copy_from_slice(&tail);
        for c in j + 1..n {
            let dot: f64 = (j..m).map(|i| v[i] * a[i * n + c]).sum();
            for i in j..m {
                a[i * n + c] -= t * dot * v[i];
            }
        }
    }
    tau
}

/// The reflector vector of column j of a geqrf result (`lda` columns), 1 at row j.
fn reflector_vec(qr: &[f64], lda: usize, rows: usize, j: usize) -> Vec<f64> {
    let mut v = vec![0f64; rows];
    v[j] = 1.0;
    for i in j + 1..rows {
        v[i] = qr[i * lda + j];
    }
    v
}

/// Applies H = I - tau v v^T (v zero above row j) to the rows of the r x c matrix `c` (left) or
/// to its columns (right).
fn apply_reflector(v: &[f64], tau: f64, j: usize, c: &mut [f64], r: usize, cols: usize, left: bool) {
    if tau == 0.0 {
        return;
    }
    if left {
        for col in 0..cols {
            let dot: f64 = (j..r).map(|i| v[i] * c[i * cols + col]).sum();
            for i in j..r {
                c[i * cols + col] -= tau * dot * v[i];
            }
        }
    } else {
        for row in 0..r {
            let dot: f64 = (j..cols).map(|i| v[i] * c[row * cols + i]).sum();
            for i in j..cols {
                c[row * cols + i] -= tau * dot * v[i];
            }
        }
    }
}

/// The first `qc` columns of Q = H1 ... Hk (k = tau.len()) from reflectors stored in the m x n
/// matrix `qr` (LAPACK orgqr / householder_product).
pub fn orgqr(qr: &[f64], tau: &[f64], m: usize, n: usize, qc: usize) -> Vec<f64> {
    let mut q = vec![0f64; m * qc];
    for i in 0..m.min(qc) {
        q[i * qc + i] = 1.0;
    }
    for j in (0..tau.len().min(m)).rev() {
        let v = reflector_vec(qr, n, m, j);
        apply_reflector(&v, tau[j], j, &mut q, m, qc, true);
    }
    q
}

/// C <- op(Q) C (left) or C op(Q), Q = H1 ... Hk from reflectors in `qr` (`lda` columns).
pub fn ormqr(qr: &[f64], lda: usize, tau: &[f64], c: &mut [f64], r: usize, cols: usize, left: bool, transpose: bool) {
    let q = if left { r } else { cols };
    let k = tau.len().min(q);
    // Q C and C Q^T apply Hk first; Q^T C and C Q apply H1 first
    let order: Vec<usize> = if left != transpose { (0..k).rev().collect() } else { (0..k).collect() };
    for j in order {
        let v = reflector_vec(qr, lda, q, j);
        apply_reflector(&v, tau[j], j, c, r, cols, left);
    }
}

// --- SVD by one-sided Jacobi ------------------------------------------------------------------

/// Thin or full SVD of an m x n row-major matrix: U (m x k or m x m), S (k, descending),
/// Vh (k x n or n x n). Singular vectors are unique only up to sign.
pub fn svd(a: &[f64], m: usize, n: usize, full: bool) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    if m < n {
        // A^T = V S U^T
        let at = transpose(a, m, n);
        let (v, s, ut) = svd(&at, n, m, full);
        let (ur, vr) = if full { (m, n) } else { (m.min(n), m.min(n)) };
        return (transpose(&ut, ur, m), s, transpose(&v, n, vr));
    }
    // m >= n: orthogonalise the columns of W = A V
    let mut w = a.to_vec();
    let mut v = identity(n);
    for _ in 0..MAX_SWEEPS {
        let mut rotated = false;
        for p in 0..n {
            for q in p + 1..n {
                let (mut alpha, mut beta, mut gamma) = (0f64, 0f64, 0f64);
                for i in 0..m {
                    let (x, y) = (w[i * n + p], w[i * n + q]);
                    alpha += x * x;
                    beta += y * y;
                    gamma += x * y;
                }
                if gamma == 0.0 || gamma.abs() <= f64::EPSILON * (alpha * beta).sqrt() {
                    continue;
                }
                rotated = true;
                let zeta = (beta - alpha) / (2.0 * gamma);
                let t = zeta.signum() / (zeta.abs() + (1.0 + zeta * zeta).sqrt());
                let c = 1.0 / (1.0 + t * t).sqrt();
                let s = c * t;
                for mat in [(&mut w, m), (&mut v, n)] {
                    let (x, rows) = mat;
                    for i in 0..rows {
                        let (xp, xq) = (x[i * n + p], x[i * n + q]);
                        x[i * n + p] = c * xp - s * xq;
                        x[i * n + q] = s * xp + c * xq;
                    }
                }
            }
        }
        if !rotated {
            break;
        }
    }
    let norms: Vec<f64> = (0..n).map(|j| (0..m).map(|i| w[i * n + j] * w[i * n + j]).sum::<f64>().sqrt()).collect();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&x, &y| norms[y].partial_cmp(&norms[x]).unwrap_or(std::cmp::Ordering::Equal));
    let s: Vec<f64> = order.iter().map(|&j| norms[j]).collect();
    let uc = if full { m } else { n };
    let mut u = vec![0f64; m * uc];
    let mut vt = vec![0f64; n * n];
    for (r, &j) in order.iter().enumerate() {
        for i in 0..n {
            vt[r * n + i] = v[i * n + j];
        }
        if norms[j] > 0.0 && norms[j].is_finite() {
            for i in 0..m {
                u[i * uc + r] = w[i * n + j] / norms[j];
            }
        }
    }
    // columns for zero singular values and the full basis: Gram-Schmidt against e_1 .. e_m
    let nonzero = s.iter().take_while(|&&x| x > 0.0 && x.is_finite()).count();
    complete_columns(&mut u, m, uc, nonzero);
    (u, s, vt)
}

/// Fills columns `from..cols` of the m x cols matrix `u` (first columns orthonormal) with an
/// orthonormal completion, taken from the unit vectors least in the span so far.
fn complete_columns(u: &mut [f64], m: usize, cols: usize, from: usize) {
    let mut col = from;
    let mut e = 0;
    while col < cols && e < m {
        let mut x = vec![0f64; m];
        x[e] = 1.0;
        e += 1;
        for _ in 0..2 {
            for c in 0..col {
                let dot: f64 = (0..m).map(|i| u[i * cols + c] * x[i]).sum();
                for i in 0..m {
                    x[i] -= dot * u[i * cols + c];
                }
            }
        }
        let norm = x.iter().map(|v| v * v).sum::<f64>().sqrt();
        if norm < 1e-8 {
            continue;
        }
        for i in 0..m {
            u[i * cols + col] = x[i] / norm;
        }
        col += 1;
    }
}

// --- symmetric eigenproblem by cyclic Jacobi ---------------------------------------------------

/// Eigenvalues (ascending) and eigenvectors (columns of the n x n result) of the symmetric matrix
/// whose `upper` (else lower) triangle `a` holds; `a` is overwritten.
pub fn eigh(a: &mut [f64], n: usize, upper: bool) -> (Vec<f64>, Vec<f64>) {
    for i in 0..n {
        for j in 0..i {
            if upper {
                a[i * n + j] = a[j * n + i];
            } else {
                a[j * n + i] = a[i * n + j];
            }
        }
    }
    let mut v = identity(n);
    for _ in 0..MAX_SWEEPS {
        let off: f64 = (0..n).flat_map(|i| (0..n).filter(move |&j| j != i).map(move |j| (i, j))).map(|(i, j)| a[i * n + j] * a[i * n + j]).sum();
        let diag: f64 = (0..n).map(|i| a[i * n + i] * a[i * n + i]).sum();
        if off == 0.0 || off <= f64::EPSILON * f64::EPSILON * diag || !off.is_finite() {
            break;
        }
        for p in 0..n {
            for q in p + 1..n {
                let apq = a[p * n + q];
                if apq == 0.0 {
                    continue;
                }
                let theta = (a[q * n + q] - a[p * n + p]) / (2.0 * apq);
                let t = if theta.is_finite() { theta.signum() / (theta.abs() + (1.0 + theta * theta).sqrt()) } else { 0.0 };
                let t = if theta == 0.0 { 1.0 } else { t };
                let c = 1.0 / (1.0 + t * t).sqrt();
                let s = t * c;
                // A <- J^T A J with J the rotation in the (p, q) plane
                for k in 0..n {
                    let (akp, akq) = (a[k * n + p], a[k * n + q]);
                    a[k * n + p] = c * akp - s * akq;
                    a[k * n + q] = s * akp + c * akq;
                }
                for k in 0..n {
                    let (apk, aqk) = (a[p * n + k], a[q * n + k]);
                    a[p * n + k] = c * apk - s * aqk;
                    a[q * n + k] = s * apk + c * aqk;
                }
                for k in 0..n {
                    let (vkp, vkq) = (v[k * n + p], v[k * n + q]);
                    v[k * n + p] = c * vkp - s * vkq;
                    v[k * n + q] = s * vkp + c * vkq;
                }
            }
        }
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&x, &y| a[x * n + x].partial_cmp(&a[y * n + y]).unwrap_or(std::cmp::Ordering::Equal));
    let w: Vec<f64> = order.iter().map(|&i| a[i * n + i]).collect();
    let mut vs = vec![0f64; n * n];
    for (c, &j) in order.iter().enumerate() {
        for i in 0..n {
            vs[i * n + c] = v[i * n + j];
        }
    }
    (w, vs)
}

// --- built on the above -------------------------------------------------------------------------

/// V diag(d) W^T for V (r x k) and W (c x k) given row-major.
fn vdvt(v: &[f64], d: &[f64], r: usize, k: usize, c: usize) -> Vec<f64> {
    vdw(v, d, v, r, k, c)
}

fn vdw(v: &[f64], d: &[f64], w: &[f64], r: usize, k: usize, c: usize) -> Vec<f64> {
    let mut out = vec![0f64; r * c];
    for i in 0..r {
        for j in 0..c {
            let mut acc = 0f64;
            for l in 0..k {
                if d[l] != 0.0 {
                    acc += v[i * k + l] * d[l] * w[j * k + l];
                }
            }
            out[i * c + j] = acc;
        }
    }
    out
}

/// Moore-Penrose pseudo-inverse (n x m): singular values above max(atol, rtol * s_max) are
/// inverted, the rest dropped. Defaults as ATen: atol 0; rtol eps(float32) * max(m, n) when
/// neither is given or atol is not positive, else 0.
pub fn pinv(a: &[f64], m: usize, n: usize, atol: Option<f64>, rtol: Option<f64>, hermitian: bool) -> Vec<f64> {
    let k = m.min(n);
    let rtol = rtol.unwrap_or(if atol.is_some_and(|t| t > 0.0) { 0.0 } else { f32::EPSILON as f64 * m.max(n) as f64 });
    let atol = atol.unwrap_or(0.0);
    if hermitian {
        let mut x = a.to_vec();
        let (w, v) = eigh(&mut x, n, false);
        let smax = w.iter().fold(0f64, |acc, l| acc.max(l.abs()));
        let cut = atol.max(rtol * smax);
        let d: Vec<f64> = w.iter().map(|&l| if l.abs() > cut { 1.0 / l } else { 0.0 }).collect();
        return vdvt(&v, &d, n, n, n);
    }
    let (u, s, vt) = svd(a, m, n, false);
    let smax = s.first().copied().unwrap_or(0.0);
    let cut = atol.max(rtol * smax);
    let d: Vec<f64> = s.iter().map(|&x| if x > cut { 1.0 / x } else { 0.0 }).collect();
    // V diag(d) U^T with V = Vh^T (n x k) and U (m x k)
    let v = transpose(&vt, k, n);
    vdw(&v, &d, &u, n, k, m)
}

/// Polar decomposition A = U H from the thin SVD: U = W Vh (m x n), H = Vh^T S Vh (n x n).
pub fn polar(a: &[f64], m: usize, n: usize) -> (Vec<f64>, Vec<f64>) {
    let k = m.min(n);
    let (w, s, vt) = svd(a, m, n, false);
    let v = transpose(&vt, k, n);
    let ones = vec![1f64; k];
    (vdw(&w, &ones, &v, m, k, n), vdvt(&v, &s, n, k, n))
}

fn matmul(a: &[f64], b: &[f64], n: usize) -> Vec<f64> {
    let mut c = vec![0f64; n * n];
    for i in 0..n {
        for l in 0..n {
            let x = a[i * n + l];
            if x == 0.0 {
                continue;
            }
            for j in 0..n {
                c[i * n + j] += x * b[l * n + j];
            }
        }
    }
    c
}

/// exp(A) by scaling and squaring with the [13/13] Padé approximant (Higham 2005).
pub fn matrix_exp(a: &[f64], n: usize) -> Vec<f64> {
    const B: [f64; 14] = [
        64764752532480000.0, 32382376266240000.0, 7771770303897600.0, 1187353796428800.0, 129060195264000.0,
        10559470521600.0, 670442572800.0, 33522128640.0, 1323241920.0, 40840800.0, 960960.0, 16380.0, 182.0, 1.0,
    ];
    const THETA13: f64 = 5.371920351148152;
    if n == 0 {
        return Vec::new();
    }
    let norm1 = (0..n).map(|j| (0..n).map(|i| a[i * n + j].abs()).sum::<f64>()).fold(0f64, f64::max);
    if !norm1.is_finite() {
        return vec![f64::NAN; n * n];
    }
    let s = if norm1 > THETA13 { (norm1 / THETA13).log2().ceil() as i32 } else { 0 };
    let scale = 0.5f64.powi(s);
    let a1: Vec<f64> = a.iter().map(|x| x * scale).collect();
    let eye = identity(n);
    let a2 = matmul(&a1, &a1, n);
    let a4 = matmul(&a2, &a2, n);
    let a6 = matmul(&a4, &a2, n);
    let lin = |c: [f64; 4]| -> Vec<f64> { (0..n * n).map(|i| c[0] * a6[i] + c[1] * a4[i] + c[2] * a2[i] + c[3] * eye[i]).collect() };
    let inner_u = lin([B[13], B[11], B[9], 0.0]);
    let mut u_arg = matmul(&a6, &inner_u, n);
    let tail_u = lin([B[7], B[5], B[3], B[1]]);
    for i in 0..n * n {
        u_arg[i] += tail_u[i];
    }
    let u = matmul(&a1, &u_arg, n);
    let inner_v = lin([B[12], B[10], B[8], 0.0]);
    let mut v = matmul(&a6, &inner_v, n);
    let tail_v = lin([B[6], B[4], B[2], B[0]]);
    for i in 0..n * n {
        v[i] += tail_v[i];
    }
    // (V - U) X = (V + U)
    let mut p: Vec<f64> = (0..n * n).map(|i| v[i] - u[i]).collect();
    let mut x: Vec<f64> = (0..n * n).map(|i| v[i] + u[i]).collect();
    let (piv, _) = crate::kernels::linalg::lu_factor(&mut p, n, n);
    if crate::kernels::linalg::lu_solve(&p, &piv, &mut x, n, n, false).is_err() {
        return vec![f64::NAN; n * n];
    }
    for _ in 0..s {
        x = matmul(&x, &x, n);
    }
    x
}

// --- helpers ------------------------------------------------------------------------------------

fn identity(n: usize) -> Vec<f64> {
    let mut e = vec![0f64; n * n];
    for i in 0..n {
        e[i * n + i] = 1.0;
    }
    e
}

fn transpose(a: &[f64], r: usize, c: usize) -> Vec<f64> {
    let mut t = vec![0f64; r * c];
    for i in 0..r {
        for j in 0..c {
            t[j * r + i] = a[i * c + j];
        }
    }
    t
}

unsafe fn load_vec(mem: &Mem, v: &View, off: usize) -> Vec<f64> {
    let p = mem.ptrs[v.buf] as *const f32;
    let (len, s) = (v.sizes[v.rank() - 1], v.strides[v.rank() - 1]);
    (0..len).map(|i| *p.add(off + i * s) as f64).collect()
}

unsafe fn load_scalar(mem: &Mem, v: &View, off: usize) -> f64 {
    *(mem.ptrs[v.buf] as *const f32).add(off) as f64
}

unsafe fn store_vec(mem: &Mem, v: &View, off: usize, data: &[f64]) {
    let p = mem.ptrs[v.buf] as *mut f32;
    let s = v.strides[v.rank() - 1];
    for (i, &x) in data.iter().enumerate() {
        *p.add(off + i * s) = x as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: &[f64], b: &[f64], tol: f64) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= tol)
    }

    fn mm(a: &[f64], b: &[f64], r: usize, k: usize, c: usize) -> Vec<f64> {
        let mut o = vec![0f64; r * c];
        for i in 0..r {
            for l in 0..k {
                for j in 0..c {
                    o[i * c + j] += a[i * k + l] * b[l * c + j];
                }
            }
        }
        o
    }

    const A: [f64; 12] = [4.0, 1.0, -2.0, 2.0, 1.0, 2.0, 0.0, 1.0, -2.0, 0.0, 3.0, -2.0];

    #[test]
    fn qr_reconstructs_with_lapack_signs() {
        let (m, n) = (4, 3);
        let mut qr = A.to_vec();
        let tau = geqrf(&mut qr, m, n);
        // LAPACK's reflector makes R[0,0] = -sign(a00) * ||a[:,0]||
        assert!((qr[0] + 20f64.sqrt()).abs() < 1e-12);
        let q = orgqr(&qr, &tau, m, n, n);
        let mut r = vec![0f64; n * n];
        for i in 0..n {
            for j in i..n {
                r[i * n + j] = qr[i * n + j];
            }
        }
        assert!(close(&mm(&q, &r, m, n, n), &A, 1e-12));
        let qtq = mm(&transpose(&q, m, n), &q, n, m, n);
        assert!(close(&qtq, &identity(n), 1e-12));
        // ormqr with Q^T from the left undoes Q
        let mut c = q.clone();
        let mut full = vec![0f64; m * m];
        for i in 0..m {
            full[i * m + i] = 1.0;
        }
        ormqr(&qr, n, &tau, &mut full, m, m, true, false);
        let qfull = orgqr(&qr, &tau, m, n, m);
        assert!(close(&full, &qfull, 1e-12));
        ormqr(&qr, n, &tau, &mut c, m, n, true, true);
        let mut e = vec![0f64; m * n];
        for i in 0..n {
            e[i * n + i] = 1.0;
        }
        assert!(close(&c, &e, 1e-12));
    }

    #[test]
    fn svd_thin_full_and_wide() {
        for (m, n) in [(4, 3), (3, 4), (2, 6)] {
            let a: Vec<f64> = A.iter().cycle().take(m * n).copied().collect();
            for full in [false, true] {
                let (u, s, vt) = svd(&a, m, n, full);
                let k = m.min(n);
                let (uc, vr) = if full { (m, n) } else { (k, k) };
                assert!(s.windows(2).all(|w| w[0] >= w[1]));
                let mut sd = vec![0f64; uc * vr];
                for i in 0..k {
                    sd[i * vr + i] = s[i];
                }
                let rec = mm(&mm(&u, &sd, m, uc, vr), &vt, m, vr, n);
                assert!(close(&rec, &a, 1e-10), "{m}x{n} full={full}");
                assert!(close(&mm(&transpose(&u, m, uc), &u, uc, m, uc), &identity(uc), 1e-10));
            }
        }
    }

    #[test]
    fn svd_of_zero_and_rank_one() {
        let (u, s, _) = svd(&[0.0; 6], 3, 2, false);
        assert_eq!(s, vec![0.0, 0.0]);
        assert!(close(&mm(&transpose(&u, 3, 2), &u, 2, 3, 2), &identity(2), 1e-12));
        let (_, s, _) = svd(&[1.0, 2.0, 2.0, 4.0], 2, 2, false);
        assert!((s[0] - 5.0).abs() < 1e-12 && s[1].abs() < 1e-12);
    }

    #[test]
    fn eigh_diagonalises() {
        let n = 3;
        let mut a = vec![2.0, 0.0, 0.0, -1.0, 2.0, 0.0, 0.0, -1.0, 2.0];
        let (w, v) = eigh(&mut a, n, false);
        let want = [2.0 - 2f64.sqrt(), 2.0, 2.0 + 2f64.sqrt()];
        assert!(close(&w, &want, 1e-12));
        let full = [2.0, -1.0, 0.0, -1.0, 2.0, -1.0, 0.0, -1.0, 2.0];
        assert!(close(&vdvt(&v, &w, n, n, n), &full, 1e-12));
    }

    #[test]
    fn pinv_and_polar() {
        let (m, n) = (4, 3);
        let p = pinv(&A, m, n, None, None, false);
        // A^+ A = I for full column rank
        assert!(close(&mm(&p, &A, n, m, n), &identity(n), 1e-10));
        let (u, h) = polar(&A, m, n);
        assert!(close(&mm(&u, &h, m, n, n), &A, 1e-10));
        assert!(close(&h, &transpose(&h, n, n), 1e-12));
    }

    #[test]
    fn matrix_exp_of_rotation_generator() {
        let t = 7.5f64;
        let e = matrix_exp(&[0.0, -t, t, 0.0], 2);
        assert!(close(&e, &[t.cos(), -t.sin(), t.sin(), t.cos()], 1e-12));
        let d = matrix_exp(&[1.0, 0.0, 0.0, -2.0], 2);
        assert!(close(&d, &[1f64.exp(), 0.0, 0.0, (-2f64).exp()], 1e-12));
    }
}
