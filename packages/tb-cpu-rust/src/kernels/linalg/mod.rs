//! Dense linear algebra over batches of small matrices: LU with partial pivoting (LAPACK's
//! pivot choice: the first entry of largest magnitude in the column), LU solves, determinants,
//! Cholesky and triangular solves. Each matrix is read into an f64 scratch copy, factored or
//! solved there and rounded to float32 once on the way out.
//!
//! Batch dims are the leading dims; the lowering broadcasts every operand to the batch shape of
//! the result, so all views of one step share it. Pivots and `info` are int32, as in PyTorch.
//!
//! Submodules: decompositions (QR, eigen, SVD) and pairwise distances.

pub mod decomp;
pub mod dist;

use crate::core::mem::Mem;
use crate::core::tensor::{need, DType, Result, View};
use crate::kernels::registry::{kernel, Args, Built, StepDef};
use serde::Deserialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// A -> LU, pivots, info
    LuFactor,
    /// LU, pivots -> P, L, U (flags: unpack data, unpack pivots)
    LuUnpack,
    /// A -> P, L, U
    Lu,
    /// LU, pivots, B (or identity) -> X (flags: adjoint)
    LuSolve,
    /// A -> det, LU, pivots
    Det,
    /// A -> sign, logabsdet, LU, pivots
    SlogDet,
    /// A -> L, info (lower factor; the lowering passes U.mT for upper)
    Cholesky,
    /// T, B (or identity) -> X with T X = B (flags: upper, unitriangular)
    TriSolve,
}

/// The parameters of each step kind of this family, by name (the variant is the tag).
#[derive(Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
enum Params {
    LuFactor { check: bool },
    LuUnpack { unpack_data: bool, unpack_pivots: bool },
    Lu {},
    LuSolve { adjoint: bool },
    Det {},
    Slogdet {},
    Cholesky { check: bool },
    TriSolve { upper: bool, unitriangular: bool },
}

/// What the kinds' parameters say, by name (a kind leaves the others false). `check`: a failed
/// factorization is an error of the call.
#[derive(Default, Clone, Copy)]
pub struct Flags {
    pub check: bool,
    pub unpack_data: bool,
    pub unpack_pivots: bool,
    pub adjoint: bool,
    pub upper: bool,
    pub unitriangular: bool,
}

fn split(p: Params) -> (Op, Flags) {
    let f = Flags::default();
    match p {
        Params::LuFactor { check } => (Op::LuFactor, Flags { check, ..f }),
        Params::LuUnpack { unpack_data, unpack_pivots } => (Op::LuUnpack, Flags { unpack_data, unpack_pivots, ..f }),
        Params::Lu {} => (Op::Lu, f),
        Params::LuSolve { adjoint } => (Op::LuSolve, Flags { adjoint, ..f }),
        Params::Det {} => (Op::Det, f),
        Params::Slogdet {} => (Op::SlogDet, f),
        Params::Cholesky { check } => (Op::Cholesky, Flags { check, ..f }),
        Params::TriSolve { upper, unitriangular } => (Op::TriSolve, Flags { upper, unitriangular, ..f }),
    }
}

pub const STEPS: &[StepDef] = &[StepDef::any("lu_factor", build), StepDef::any("lu_unpack", build), StepDef::any("lu", build),
    StepDef::any("lu_solve", build), StepDef::any("det", build), StepDef::any("slogdet", build), StepDef::any("cholesky", build),
    StepDef::any("tri_solve", build), StepDef::any("check_info", check_info)];

fn build(a: &Args) -> Built {
    let (op, flags) = split(a.tagged()?);
    let k = Linalg::new(a.op, op, flags, a.ins.clone(), a.outs.clone())?;
    kernel(move |mem| unsafe { k.run(mem) })
}

/// Fails the call when any int32 `info` is non-zero (ATen's _linalg_check_errors).
fn check_info(a: &Args) -> Built {
    a.no_params()?;
    let info = a.take(0)?;
    need(info.dtype == DType::I32, "linalg info is int32")?;
    kernel(move |mem| unsafe {
        let p = mem.ptr::<i32>(&info);
        let mut bad = 0;
        crate::core::strided::for_each(&info.sizes, [&info.strides[..]], |[a]| {
            if bad == 0 {
                bad = *p.add(a);
            }
        });
        if bad != 0 {
            return Err(format!("linalg: the factorization failed (info = {bad}): the input is singular or not positive-definite"));
        }
        Ok(())
    })
}

pub struct Linalg {
    op: Op,
    ins: Vec<Option<View>>,
    outs: Vec<View>,
    flags: Flags,
    batch: Vec<usize>,
}

/// Leading `rank - tail` sizes of a view.
fn batch_of(v: &View, tail: usize) -> Result<&[usize]> {
    need(v.rank() >= tail, "linalg operand has too few dims")?;
    Ok(&v.sizes[..v.rank() - tail])
}

/// The last two sizes of a matrix view.
fn mat(v: &View) -> Result<(usize, usize)> {
    need(v.rank() >= 2, "linalg operand must be at least 2-d")?;
    Ok((v.sizes[v.rank() - 2], v.sizes[v.rank() - 1]))
}

impl Linalg {
    pub fn new(name: &str, op: Op, flags: Flags, ins: Vec<Option<View>>, outs: Vec<View>) -> Result<Linalg> {
        let get = |i: usize| ins.get(i).cloned().flatten().ok_or_else(|| format!("linalg: missing operand {i}"));
        let o = |i: usize| outs.get(i).cloned().ok_or_else(|| format!("linalg: missing output {i}"));
        let f32m = |v: &View| need(v.dtype == DType::F32, "linalg matrices are float32");
        let i32v = |v: &View| need(v.dtype == DType::I32, "pivots and info are int32");
        let a = get(0)?;
        f32m(&a)?;
        let (m, n) = mat(&a)?;
        let k = m.min(n);
        let batch = batch_of(&a, 2)?.to_vec();
        let same = |v: &View, tail: &[usize]| -> Result<()> {
            let mut want = batch.clone();
            want.extend_from_slice(tail);
            need(v.sizes == want, &format!("linalg {name}: operand of shape {:?} where {want:?} was expected", v.sizes))
        };
        match op {
            Op::LuFactor | Op::Det | Op::SlogDet => {
                let first = if op == Op::SlogDet { 2 } else if op == Op::Det { 1 } else { 0 };
                let (lu, piv) = (o(first)?, o(first + 1)?);
                f32m(&lu)?;
                i32v(&piv)?;
                same(&lu, &[m, n])?;
                same(&piv, &[k])?;
                match op {
                    Op::LuFactor => {
                        let info = o(2)?;
                        i32v(&info)?;
                        same(&info, &[])?;
                    }
                    Op::Det => {
                        need(m == n, "det of a non-square matrix")?;
                        f32m(&o(0)?)?;
                        same(&o(0)?, &[])?;
                    }
                    _ => {
                        need(m == n, "slogdet of a non-square matrix")?;
                        for i in 0..2 {
                            f32m(&o(i)?)?;
                            same(&o(i)?, &[])?;
                        }
                    }
                }
            }
            Op::LuUnpack => {
                let piv = get(1)?;
                i32v(&piv)?;
                same(&piv, &[k])?;
                let (p, l, u) = (o(0)?, o(1)?, o(2)?);
                for v in [&p, &l, &u] {
                    f32m(v)?;
                }
                if flags.unpack_pivots {
                    same(&p, &[m, m])?;
                }
                if flags.unpack_data {
                    same(&l, &[m, k])?;
                    same(&u, &[k, n])?;
                }
            }
            Op::Lu => {
                let (p, l, u) = (o(0)?, o(1)?, o(2)?);
                for v in [&p, &l, &u] {
                    f32m(v)?;
                }
                same(&p, &[m, m])?;
                same(&l, &[m, k])?;
                same(&u, &[k, n])?;
            }
            Op::LuSolve | Op::TriSolve => {
                need(m == n, "solve with a non-square matrix")?;
                let x = o(0)?;
                f32m(&x)?;
                let (xr, xc) = mat(&x)?;
                need(xr == n, "solve: right-hand side rows differ from the matrix size")?;
                same(&x, &[xr, xc])?;
                let bi = if op == Op::LuSolve { 2 } else { 1 };
                if op == Op::LuSolve {
                    let piv = get(1)?;
                    i32v(&piv)?;
                    same(&piv, &[n])?;
                }
                match ins.get(bi).cloned().flatten() {
                    Some(b) => {
                        f32m(&b)?;
                        same(&b, &[xr, xc])?;
                    }
                    None => need(xc == n, "solve against the identity needs a square result")?,
                }
            }
            Op::Cholesky => {
                need(m == n, "cholesky of a non-square matrix")?;
                let (l, info) = (o(0)?, o(1)?);
                f32m(&l)?;
                i32v(&info)?;
                same(&l, &[n, n])?;
                same(&info, &[])?;
            }
        }
        for v in &outs {
            for i in ins.iter().flatten() {
                need(v.buf != i.buf, "linalg output shares a buffer with an input")?;
            }
        }
        Ok(Linalg { op, ins, outs, flags, batch })
    }

    /// # Safety
    /// The views must have been validated by the executor (they lie inside their buffers).
    pub unsafe fn run(&self, mem: &Mem) -> Result<()> {
        let nb: usize = self.batch.iter().product();
        let a = self.ins[0].as_ref().ok_or("linalg: missing operand")?;
        let (m, n) = mat(a)?;
        for bi in 0..nb {
            let off = |v: &View, tail: usize| -> usize {
                let nd = v.rank() - tail;
                let mut r = bi;
                let mut o = v.offset;
                for d in (0..nd).rev() {
                    o += (r % v.sizes[d]) * v.strides[d];
                    r /= v.sizes[d];
                }
                o
            };
            match self.op {
                Op::LuFactor | Op::Det | Op::SlogDet | Op::Lu => {
                    let mut lu = load(mem, a, off(a, 2), m, n);
                    let (piv, info) = lu_factor(&mut lu, m, n);
                    match self.op {
                        Op::LuFactor => {
                            if info != 0 && self.flags.check {
                                return Err(format!("linalg.lu_factor: U[{info},{info}] is zero: the matrix is singular"));
                            }
                            store(mem, &self.outs[0], off(&self.outs[0], 2), &lu, m, n);
                            store_i32(mem, &self.outs[1], off(&self.outs[1], 1), &piv);
                            store_i32(mem, &self.outs[2], off(&self.outs[2], 0), &[info]);
                        }
                        Op::Det | Op::SlogDet => {
                            let first = if self.op == Op::Det { 1 } else { 2 };
                            store(mem, &self.outs[first], off(&self.outs[first], 2), &lu, m, n);
                            store_i32(mem, &self.outs[first + 1], off(&self.outs[first + 1], 1), &piv);
                            let mut det = 1f64;
                            let (mut sign, mut logabs) = (1f64, 0f64);
                            for (i, &p) in piv.iter().enumerate() {
                                let d = lu[i * n + i];
                                let s = if p as usize != i + 1 { -1.0 } else { 1.0 };
                                det *= d * s;
                                sign *= d.signum() * s;
                                logabs += d.abs().ln();
                            }
                            if self.op == Op::Det {
                                store(mem, &self.outs[0], off(&self.outs[0], 0), &[det], 1, 1);
                            } else {
                                if piv.iter().enumerate().any(|(i, _)| lu[i * n + i] == 0.0) {
                                    sign = 0.0;
                                    logabs = f64::NEG_INFINITY;
                                }
                                store(mem, &self.outs[0], off(&self.outs[0], 0), &[sign], 1, 1);
                                store(mem, &self.outs[1], off(&self.outs[1], 0), &[logabs], 1, 1);
                            }
                        }
                        _ => self.unpack(mem, &lu, &piv, m, n, [true, true], &off)?,
                    }
                }
                Op::LuUnpack => {
                    let lu = load(mem, a, off(a, 2), m, n);
                    let pv = self.ins[1].as_ref().ok_or("lu_unpack: missing pivots")?;
                    let piv = load_i32(mem, pv, off(pv, 1), m.min(n));
                    self.unpack(mem, &lu, &piv, m, n, [self.flags.unpack_data, self.flags.unpack_pivots], &off)?;
                }
                Op::LuSolve => {
                    let lu = load(mem, a, off(a, 2), n, n);
                    let pv = self.ins[1].as_ref().ok_or("lu_solve: missing pivots")?;
                    let piv = load_i32(mem, pv, off(pv, 1), n);
                    let x = &self.outs[0];
                    let (_, c) = mat(x)?;
                    let mut b = match self.ins.get(2).cloned().flatten() {
                        Some(bv) => load(mem, &bv, off(&bv, 2), n, c),
                        None => identity(n),
                    };
                    lu_solve(&lu, &piv, &mut b, n, c, self.flags.adjoint)?;
                    store(mem, x, off(x, 2), &b, n, c);
                }
                Op::TriSolve => {
                    let t = load(mem, a, off(a, 2), n, n);
                    let x = &self.outs[0];
                    let (_, c) = mat(x)?;
                    let mut b = match self.ins.get(1).cloned().flatten() {
                        Some(bv) => load(mem, &bv, off(&bv, 2), n, c),
                        None => identity(n),
                    };
                    tri_solve(&t, &mut b, n, c, self.flags.upper, self.flags.unitriangular);
                    store(mem, x, off(x, 2), &b, n, c);
                }
                Op::Cholesky => {
                    let mut l = load(mem, a, off(a, 2), n, n);
                    let info = cholesky(&mut l, n);
                    if info != 0 && self.flags.check {
                        return Err(format!("linalg.cholesky: the leading minor of order {info} is not positive-definite"));
                    }
                    store(mem, &self.outs[0], off(&self.outs[0], 2), &l, n, n);
                    store_i32(mem, &self.outs[1], off(&self.outs[1], 0), &[info]);
                }
            }
        }
        Ok(())
    }

    unsafe fn unpack(&self, mem: &Mem, lu: &[f64], piv: &[i32], m: usize, n: usize, what: [bool; 2], off: &dyn Fn(&View, usize) -> usize) -> Result<()> {
        let k = m.min(n);
        if what[1] {
            let mut perm: Vec<usize> = (0..m).collect();
            for (i, &p) in piv.iter().enumerate() {
                let p = p as i64 - 1;
                if p < 0 || p as usize >= m {
                    return Err(format!("lu_unpack: pivot {} out of range 1..={m}", p + 1));
                }
                perm.swap(i, p as usize);
            }
            let mut pm = vec![0f64; m * m];
            for (i, &r) in perm.iter().enumerate() {
                pm[r * m + i] = 1.0;
            }
            store(mem, &self.outs[0], off(&self.outs[0], 2), &pm, m, m);
        }
        if what[0] {
            let mut l = vec![0f64; m * k];
            let mut u = vec![0f64; k * n];
            for i in 0..m {
                for j in 0..k {
                    l[i * k + j] = if i == j {
                        1.0
                    } else if i > j {
                        lu[i * n + j]
                    } else {
                        0.0
                    };
                }
            }
            for i in 0..k {
                for j in i..n {
                    u[i * n + j] = lu[i * n + j];
                }
            }
            store(mem, &self.outs[1], off(&self.outs[1], 2), &l, m, k);
            store(mem, &self.outs[2], off(&self.outs[2], 2), &u, k, n);
        }
        Ok(())
    }
}

unsafe fn load(mem: &Mem, v: &View, off: usize, r: usize, c: usize) -> Vec<f64> {
    let p = mem.ptrs[v.buf] as *const f32;
    let (rs, cs) = (v.strides[v.rank() - 2], v.strides[v.rank() - 1]);
    let mut out = Vec::with_capacity(r * c);
    for i in 0..r {
        for j in 0..c {
            out.push(*p.add(off + i * rs + j * cs) as f64);
        }
    }
    out
}

/// Stores an r x c row-major matrix (or, for r = c = 1 into a 0-d view, a scalar).
unsafe fn store(mem: &Mem, v: &View, off: usize, data: &[f64], r: usize, c: usize) {
    let p = mem.ptrs[v.buf] as *mut f32;
    if v.rank() < 2 {
        *p.add(off) = data[0] as f32;
        return;
    }
    let (rs, cs) = (v.strides[v.rank() - 2], v.strides[v.rank() - 1]);
    for i in 0..r {
        for j in 0..c {
            *p.add(off + i * rs + j * cs) = data[i * c + j] as f32;
        }
    }
}

unsafe fn load_i32(mem: &Mem, v: &View, off: usize, n: usize) -> Vec<i32> {
    let p = mem.ptrs[v.buf] as *const i32;
    let s = v.strides.last().copied().unwrap_or(0);
    (0..n).map(|i| *p.add(off + i * s)).collect()
}

unsafe fn store_i32(mem: &Mem, v: &View, off: usize, data: &[i32]) {
    let p = mem.ptrs[v.buf] as *mut i32;
    let s = v.strides.last().copied().unwrap_or(0);
    for (i, &x) in data.iter().enumerate() {
        *p.add(off + i * s) = x;
    }
}

fn identity(n: usize) -> Vec<f64> {
    let mut e = vec![0f64; n * n];
    for i in 0..n {
        e[i * n + i] = 1.0;
    }
    e
}

/// In-place LU of an m x n row-major matrix with partial pivoting (LAPACK getrf): returns the
/// 1-based pivots and `info` (the 1-based index of the first zero pivot, else 0).
pub fn lu_factor(a: &mut [f64], m: usize, n: usize) -> (Vec<i32>, i32) {
    let k = m.min(n);
    let mut piv = Vec::with_capacity(k);
    let mut info = 0;
    for j in 0..k {
        let mut p = j;
        let mut best = a[j * n + j].abs();
        for i in j + 1..m {
            let v = a[i * n + j].abs();
            if v > best {
                best = v;
                p = i;
            }
        }
        piv.push(p as i32 + 1);
        if a[p * n + j] != 0.0 {
            if p != j {
                for c in 0..n {
                    a.swap(j * n + c, p * n + c);
                }
            }
            let d = a[j * n + j];
            for i in j + 1..m {
                a[i * n + j] /= d;
            }
        } else if info == 0 {
            info = j as i32 + 1;
        }
        for i in j + 1..m {
            let f = a[i * n + j];
            if f != 0.0 {
                for c in j + 1..n {
                    a[i * n + c] -= f * a[j * n + c];
                }
            }
        }
    }
    (piv, info)
}

/// Solves A X = B (or A^T X = B when `adjoint`) from the LU of A; `b` is n x c, overwritten.
pub fn lu_solve(lu: &[f64], piv: &[i32], b: &mut [f64], n: usize, c: usize, adjoint: bool) -> Result<()> {
    for &p in piv {
        if p < 1 || p as usize > n {
            return Err(format!("lu_solve: pivot {p} out of range 1..={n}"));
        }
    }
    let swap_rows = |b: &mut [f64], i: usize, p: usize| {
        if i != p {
            for col in 0..c {
                b.swap(i * c + col, p * c + col);
            }
        }
    };
    // b[i, :] -= f * b[j, :]
    let sub_row = |b: &mut [f64], i: usize, j: usize, f: f64| {
        for col in 0..c {
            b[i * c + col] -= f * b[j * c + col];
        }
    };
    let div_row = |b: &mut [f64], i: usize, d: f64| b[i * c..(i + 1) * c].iter_mut().for_each(|x| *x /= d);
    if !adjoint {
        for (i, &p) in piv.iter().enumerate() {
            swap_rows(b, i, p as usize - 1);
        }
        // L y = Pb (unit lower), then U x = y
        for i in 0..n {
            (0..i).for_each(|j| sub_row(b, i, j, lu[i * n + j]));
        }
        for i in (0..n).rev() {
            (i + 1..n).for_each(|j| sub_row(b, i, j, lu[i * n + j]));
            div_row(b, i, lu[i * n + i]);
        }
    } else {
        // A^T = U^T L^T P^T: U^T z = b (lower), L^T w = z (unit upper), x = P w
        for i in 0..n {
            (0..i).for_each(|j| sub_row(b, i, j, lu[j * n + i]));
            div_row(b, i, lu[i * n + i]);
        }
        for i in (0..n).rev() {
            (i + 1..n).for_each(|j| sub_row(b, i, j, lu[j * n + i]));
        }
        for (i, &p) in piv.iter().enumerate().rev() {
            swap_rows(b, i, p as usize - 1);
        }
    }
    Ok(())
}

/// Solves T X = B for triangular T (only its `upper` or lower triangle is read).
pub fn tri_solve(t: &[f64], b: &mut [f64], n: usize, c: usize, upper: bool, unit: bool) {
    let order: Vec<usize> = if upper { (0..n).rev().collect() } else { (0..n).collect() };
    for &i in &order {
        let range = if upper { i + 1..n } else { 0..i };
        for j in range {
            let f = t[i * n + j];
            for col in 0..c {
                b[i * c + col] -= f * b[j * c + col];
            }
        }
        if !unit {
            let d = t[i * n + i];
            for col in 0..c {
                b[i * c + col] /= d;
            }
        }
    }
}

/// In-place lower Cholesky factor (the strict upper triangle is zeroed); returns `info`, the
/// 1-based order of the first leading minor that is not positive definite, else 0.
pub fn cholesky(a: &mut [f64], n: usize) -> i32 {
    for j in 0..n {
        let mut d = a[j * n + j];
        for k in 0..j {
            d -= a[j * n + k] * a[j * n + k];
        }
        if d.is_nan() || d <= 0.0 {
            for i in 0..n {
                for c in i + 1..n {
                    a[i * n + c] = 0.0;
                }
            }
            return j as i32 + 1;
        }
        let d = d.sqrt();
        a[j * n + j] = d;
        for i in j + 1..n {
            let mut s = a[i * n + j];
            for k in 0..j {
                s -= a[i * n + k] * a[j * n + k];
            }
            a[i * n + j] = s / d;
        }
    }
    for i in 0..n {
        for c in i + 1..n {
            a[i * n + c] = 0.0;
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matmul(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|t| a[i * k + t] * b[t * n + j]).sum();
            }
        }
        c
    }

    #[test]
    fn lu_pivots_and_solve() {
        let a = vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 10.0];
        let mut lu = a.clone();
        let (piv, info) = lu_factor(&mut lu, 3, 3);
        assert_eq!(info, 0);
        assert_eq!(piv[0], 3); // 7 is the largest in column 0
        let x_true = vec![1.0, -2.0, 0.5];
        let b = matmul(&a, &x_true, 3, 3, 1);
        let mut x = b.clone();
        lu_solve(&lu, &piv, &mut x, 3, 1, false).unwrap();
        for (p, q) in x.iter().zip(&x_true) {
            assert!((p - q).abs() < 1e-12);
        }
        // A^T x = b
        let at = vec![1.0, 4.0, 7.0, 2.0, 5.0, 8.0, 3.0, 6.0, 10.0];
        let bt = matmul(&at, &x_true, 3, 3, 1);
        let mut y = bt.clone();
        lu_solve(&lu, &piv, &mut y, 3, 1, true).unwrap();
        for (p, q) in y.iter().zip(&x_true) {
            assert!((p - q).abs() < 1e-12);
        }
        assert!(lu_solve(&lu, &[0, 1, 1], &mut y, 3, 1, false).is_err());
    }

    #[test]
    fn singular_info_and_cholesky() {
        let mut a = vec![1.0, 2.0, 2.0, 4.0];
        let (_, info) = lu_factor(&mut a, 2, 2);
        assert_eq!(info, 2);
        let mut s = vec![4.0, 2.0, 2.0, 3.0];
        assert_eq!(cholesky(&mut s, 2), 0);
        assert_eq!(s, vec![2.0, 0.0, 1.0, 2f64.sqrt()]);
        let mut bad = vec![1.0, 2.0, 2.0, 1.0];
        assert_eq!(cholesky(&mut bad, 2), 2);
    }
}
