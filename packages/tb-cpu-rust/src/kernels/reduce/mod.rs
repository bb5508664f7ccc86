//! Reductions over one or more dims (sum, mean, extrema and their indices, variance, product,
//! logsumexp, any/all) and the softmax rows.

pub mod batch_norm;
pub mod norm;
pub mod rows;
pub mod softmax;

use crate::core::mem::{Mem, SPtr};
use crate::core::par::par_rows;
use crate::core::strided::{for_each, offset_of};
use crate::core::tensor::{DType, View};

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Red {
    Sum,
    Mean,
    Amax,
    Amin,
    Argmax,
    Argmin,
    Var(f64),
    Prod,
    LogSumExp,
    Any,
    All,
}

/// # Safety
/// `x` and `out` must be views validated against the buffers of `mem`.
pub unsafe fn reduce(mem: &Mem, kind: Red, x: &View, out: &View) {
    let nd = x.rank();
    let red: Vec<usize> = (0..nd).filter(|&d| out.sizes[d] == 1 && x.sizes[d] != 1).collect();
    let rsz: Vec<usize> = red.iter().map(|&d| x.sizes[d]).collect();
    let rst: Vec<usize> = red.iter().map(|&d| x.strides[d]).collect();
    let n: usize = rsz.iter().product();
    let outer: usize = out.numel();
    let xk: Vec<usize> = (0..nd).map(|d| if red.contains(&d) { 0 } else { x.strides[d] }).collect();
    let f32_moments = matches!(kind, Red::Sum | Red::Mean | Red::Var(_)) && x.dtype == DType::F32 && out.dtype == DType::F32;
    if f32_moments && n > 0 && (moments_by_runs(mem, kind, x, out, &red, &xk, n) || moments_by_kept_rows(mem, kind, x, out, &red, &rsz, &rst, n)) {
        return;
    }
    let px = mem.byte_ptr(x);
    let po = SPtr(mem.byte_ptr(out));
    let px = SPtr(px);
    let one = |o: usize| {
        let xb = offset_of(o, &out.sizes, &xk);
        let ob = offset_of(o, &out.sizes, &out.strides);
        let xf = px.get() as *const f32;
        let mut vals = Vec::new();
        let get = |f: &mut dyn FnMut(usize, f32)| {
            let mut i = 0;
            for_each(&rsz, [&rst], |[off]| {
                f(i, *xf.add(xb + off));
                i += 1;
            });
        };
        let r: f64 = match kind {
            Red::Sum | Red::Mean => {
                let mut s = 0f64;
                get(&mut |_, v| s += v as f64);
                if kind == Red::Mean {
                    s / n as f64
                } else {
                    s
                }
            }
            Red::Prod => {
                let mut s = 1f64;
                get(&mut |_, v| s *= v as f64);
                s
            }
            Red::Amax | Red::Amin | Red::Argmax | Red::Argmin => {
                let maxish = matches!(kind, Red::Amax | Red::Argmax);
                let (mut best, mut at) = (if maxish { f32::NEG_INFINITY } else { f32::INFINITY }, 0usize);
                let mut first = true;
                get(&mut |i, v| {
                    let better = if best.is_nan() {
                        false
                    } else if v.is_nan() {
                        true
                    } else if maxish {
                        v > best
                    } else {
                        v < best
                    };
                    if first || better {
                        best = v;
                        at = i;
                        first = false;
                    }
                });
                if matches!(kind, Red::Argmax | Red::Argmin) {
                    *(po.get() as *mut i64).add(ob) = at as i64;
                    return;
                }
                best as f64
            }
            Red::Var(corr) => {
                get(&mut |_, v| vals.push(v as f64));
                let mu = vals.iter().sum::<f64>() / n as f64;
                let ss: f64 = vals.iter().map(|v| (v - mu) * (v - mu)).sum();
                let d = n as f64 - corr;
                if d <= 0.0 {
                    f64::NAN
                } else {
                    ss / d
                }
            }
            Red::LogSumExp => {
                get(&mut |_, v| vals.push(v as f64));
                let m = vals.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                if vals.iter().any(|v| v.is_nan()) {
                    f64::NAN
                } else if m.is_infinite() {
                    m
                } else {
                    m + vals.iter().map(|v| (v - m).exp()).sum::<f64>().ln()
                }
            }
            Red::Any | Red::All => {
                let (mut any, mut all) = (false, true);
                get(&mut |_, v| {
                    any |= v != 0.0;
                    all &= v != 0.0;
                });
                *po.add(ob) = if kind == Red::Any { any } else { all } as u8;
                return;
            }
        };
        *(po.get() as *mut f32).add(ob) = r as f32;
    };
    par_rows(outer, outer * n.max(1), one);
}

/// Sum / mean / variance of float32 when the innermost reduced dims form one contiguous run of
/// `x` (a mean over the last dim, as RMS norm written out in ATen does; a per-channel statistic of
/// an NCHW tensor, as training-mode batch norm takes: one H × W plane per image): vectorised sums
/// over each run, the runs of the other reduced dims walked as an odometer, float64 across runs.
/// The variance takes two passes (the mean, then the squared deviations from it: no
/// cancellation). False, having done nothing, when the runs are shorter than a vector block.
///
/// # Safety
/// As `reduce`.
unsafe fn moments_by_runs(mem: &Mem, kind: Red, x: &View, out: &View, red: &[usize], xk: &[usize], n: usize) -> bool {
    let (mut inner, mut k) = (1usize, red.len());
    while k > 0 && x.strides[red[k - 1]] == inner {
        inner *= x.sizes[red[k - 1]];
        k -= 1;
    }
    // several runs of fewer than 16 elements each (4 × 4 planes) gain nothing from a vector pass
    if k > 0 && inner < 16 {
        return false;
    }
    let osz: Vec<usize> = red[..k].iter().map(|&d| x.sizes[d]).collect();
    let ost: Vec<usize> = red[..k].iter().map(|&d| x.strides[d]).collect();
    let (xf, of) = (SPtr(mem.byte_ptr(x) as *mut f32), SPtr(mem.byte_ptr(out) as *mut f32));
    let outer = out.numel();
    par_rows(outer, outer * n, |o| {
        let xb = xf.get().add(offset_of(o, &out.sizes, xk));
        let ob = offset_of(o, &out.sizes, &out.strides);
        let runs = |f: &mut dyn FnMut(&[f32])| for_each(&osz, [&ost], |[off]| f(std::slice::from_raw_parts(xb.add(off), inner)));
        let mut s = 0f64;
        runs(&mut |run| s += rows::sum(run));
        let r = match kind {
            Red::Sum => s,
            Red::Mean => s / n as f64,
            Red::Var(corr) => {
                let mu = (s / n as f64) as f32;
                let mut ss = 0f64;
                runs(&mut |run| ss += rows::sum_sq_dev(run, mu));
                let d = n as f64 - corr;
                if d <= 0.0 {
                    f64::NAN
                } else {
                    ss / d
                }
            }
            _ => unreachable!("moments_by_runs takes sum, mean and variance"),
        };
        *of.get().add(ob) = r as f32;
    });
    true
}

/// Sum / mean / variance of float32 when the kept dims form one contiguous run in `x` and in
/// `out` (a bias gradient: the sum over the rows of a matrix; a per-channel statistic of a
/// channels-last tensor): whole rows added into float64 accumulators, vectorised, instead of
/// walking each output's strided column; the variance in a second sweep over the deviations.
/// False, having done nothing, for any other layout.
///
/// # Safety
/// As `reduce`.
#[allow(clippy::too_many_arguments)]
unsafe fn moments_by_kept_rows(mem: &Mem, kind: Red, x: &View, out: &View, red: &[usize], rsz: &[usize], rst: &[usize], n: usize) -> bool {
    let nd = x.rank();
    let kept: Vec<usize> = (0..nd).filter(|&d| !red.contains(&d) && x.sizes[d] != 1).collect();
    let run = |strides: &[usize]| {
        let mut acc = 1;
        for &d in kept.iter().rev() {
            if strides[d] != acc {
                return false;
            }
            acc *= x.sizes[d];
        }
        true
    };
    if kept.is_empty() || !run(&x.strides) || !run(&out.strides) {
        return false;
    }
    let outer = out.numel();
    let (xf, of) = (SPtr(mem.byte_ptr(x) as *mut f32), SPtr(mem.byte_ptr(out) as *mut f32));
    const CH: usize = 512;
    let chunk = |c: usize| {
        let (lo, hi) = (c * CH, ((c + 1) * CH).min(outer));
        let mut acc = [0f64; CH];
        let acc = &mut acc[..hi - lo];
        for_each(rsz, [rst], |[off]| {
            let row = std::slice::from_raw_parts(xf.get().add(off + lo), hi - lo);
            for (a, &v) in acc.iter_mut().zip(row) {
                *a += v as f64;
            }
        });
        if let Red::Var(corr) = kind {
            let mut mu = [0f64; CH];
            let mu = &mut mu[..hi - lo];
            for (m, a) in mu.iter_mut().zip(acc.iter_mut()) {
                *m = *a / n as f64;
                *a = 0.0;
            }
            for_each(rsz, [rst], |[off]| {
                let row = std::slice::from_raw_parts(xf.get().add(off + lo), hi - lo);
                for ((a, &m), &v) in acc.iter_mut().zip(mu.iter()).zip(row) {
                    let d = v as f64 - m;
                    *a += d * d;
                }
            });
            let d = n as f64 - corr;
            for (j, &a) in acc.iter().enumerate() {
                *of.get().add(lo + j) = if d <= 0.0 { f32::NAN } else { (a / d) as f32 };
            }
            return;
        }
        let scale = if kind == Red::Mean { 1.0 / n as f64 } else { 1.0 };
        for (j, &a) in acc.iter().enumerate() {
            *of.get().add(lo + j) = (a * scale) as f32;
        }
    };
    par_rows(outer.div_ceil(CH), outer * n, chunk);
    true
}

pub use steps::STEPS;

/// The step kinds of this family: reduce, cumsum, scan (cumprod, logcumsumexp), cummax, cummin.
mod steps {
    use super::*;
    use crate::core::strided::drop_dim;
    use crate::core::tensor::need;
    use crate::kernels::registry::{dim, f32s, infallible, kernel, Args, Built, DimParam, StepDef};

    pub const STEPS: &[StepDef] = &[StepDef::core("reduce", reduce_step), StepDef::core("cumsum", cumsum), StepDef::core("scan", scan),
        StepDef::core("cummax", cum_extreme), StepDef::core("cummin", cum_extreme)];

    crate::step_params!(
        /// kind 0 sum, 1 mean, 2 amax, 3 amin, 4 argmax, 5 argmin, 6 var, 7 prod, 8 logsumexp,
        /// 9 any, 10 all; mask: 1 on the reduced dims
        struct ReduceParams { kind: i64, mask: Vec<i64>, correction: f64 }
    );

    fn reduce_step(a: &Args) -> Built {
        let p: ReduceParams = a.params()?;
        let (x, o) = (a.take(0)?, a.out(0)?);
        need(x.rank() == o.rank(), "reduction output must keep the reduced dims")?;
        for d in 0..x.rank() {
            need(o.sizes[d] == x.sizes[d] || o.sizes[d] == 1, "reduction shapes do not agree")?;
        }
        let kind = match p.kind {
            0 => Red::Sum,
            1 => Red::Mean,
            2 => Red::Amax,
            3 => Red::Amin,
            4 => Red::Argmax,
            5 => Red::Argmin,
            6 => Red::Var(p.correction),
            7 => Red::Prod,
            8 => Red::LogSumExp,
            9 => Red::Any,
            10 => Red::All,
            k => return Err(format!("unknown reduction {k}")),
        };
        let reduced: Vec<bool> = p.mask.iter().map(|&v| v != 0).collect();
        need(reduced.len() == x.rank(), "reduction mask has the wrong rank")?;
        for (d, &r) in reduced.iter().enumerate() {
            need(!r || o.sizes[d] == 1, "reduced dim must have size 1 in the output")?;
            need(r || o.sizes[d] == x.sizes[d], "kept dim must keep its size")?;
        }
        f32s(&[&x])?;
        match kind {
            Red::Argmax | Red::Argmin => need(o.dtype == DType::I64, "argmax output is int64")?,
            Red::Any | Red::All => need(o.dtype == DType::Bool, "any/all output is bool")?,
            _ => f32s(&[&o])?,
        }
        // Argmax over several dims needs the row-major position: keep the mask in the view
        let mut x = x;
        for (d, &r) in reduced.iter().enumerate() {
            if !r && x.sizes[d] == 1 {
                x.strides[d] = 0;
            }
        }
        let mut o = o;
        for (d, &r) in reduced.iter().enumerate() {
            if r {
                o.strides[d] = 0;
            }
        }
        infallible(move |mem| unsafe { reduce(mem, kind, &x, &o) })
    }

    fn cumsum(a: &Args) -> Built {
        let DimParam { dim: d } = a.params()?;
        let (x, y) = (a.take(0)?, a.out(0)?);
        need(x.sizes == y.sizes, "cumsum shapes")?;
        need(y.dtype != DType::Bool && !(y.dtype == DType::I64 && x.dtype == DType::F32), "cumsum dtypes")?;
        need(x.rank() >= 1, "cumsum of a 0-d tensor (view it as 1-d)")?;
        let d = dim(d, x.rank())?;
        kernel(move |mem| unsafe {
            let n = x.sizes[d];
            let (sx, sy) = (x.strides[d], y.strides[d]);
            let osz = drop_dim(&x.sizes, d);
            let (px, py) = (mem.byte_ptr(&x), mem.byte_ptr(&y));
            for_each(&osz, [&drop_dim(&x.strides, d), &drop_dim(&y.strides, d)], |[a, b]| {
                let (mut fa, mut ia) = (0f64, 0i64);
                for i in 0..n {
                    let xi = a + i * sx;
                    match x.dtype {
                        DType::F32 => fa += *(px as *const f32).add(xi) as f64,
                        DType::I64 => ia = ia.wrapping_add(*(px as *const i64).add(xi)),
                        _ => ia += (*px.add(xi) != 0) as i64,
                    }
                    let yi = b + i * sy;
                    match y.dtype {
                        DType::F32 => *(py as *mut f32).add(yi) = if x.dtype == DType::F32 { fa as f32 } else { ia as f32 },
                        _ => *(py as *mut i64).add(yi) = ia,
                    }
                }
            });
            Ok(())
        })
    }

    crate::step_params!(
        /// mode 0: cumprod, 1: logcumsumexp
        struct ScanParams { dim: i64, mode: i64 }
    );

    fn scan(a: &Args) -> Built {
        let ScanParams { dim: d, mode } = a.params()?;
        let (x, y) = (a.take(0)?, a.out(0)?);
        f32s(&[&x, &y])?;
        need(x.sizes == y.sizes && x.rank() >= 1, "scan shapes")?;
        need((0..=1).contains(&mode), "scan mode")?;
        let d = dim(d, x.rank())?;
        kernel(move |mem| unsafe {
            let n = x.sizes[d];
            let (sx, sy) = (x.strides[d], y.strides[d]);
            let osz = drop_dim(&x.sizes, d);
            let (px, py) = (mem.ptr::<f32>(&x), mem.ptr::<f32>(&y));
            for_each(&osz, [&drop_dim(&x.strides, d), &drop_dim(&y.strides, d)], |[a, b]| {
                let mut acc = if mode == 0 { 1f64 } else { f64::NEG_INFINITY };
                for i in 0..n {
                    let v = *px.add(a + i * sx) as f64;
                    acc = if mode == 0 {
                        acc * v
                    } else {
                        // log(e^acc + e^v), stable
                        let (hi, lo) = if acc > v { (acc, v) } else { (v, acc) };
                        if lo == f64::NEG_INFINITY || hi.is_nan() || lo.is_nan() {
                            if lo.is_nan() { lo } else { hi }
                        } else if hi == f64::INFINITY {
                            hi
                        } else {
                            hi + (lo - hi).exp().ln_1p()
                        }
                    };
                    *py.add(b + i * sy) = acc as f32;
                }
            });
            Ok(())
        })
    }

    /// cummax / cummin: the running extreme with the index where it was last taken (ties and
    /// NaN: the later one)
    fn cum_extreme(a: &Args) -> Built {
        let DimParam { dim: d } = a.params()?;
        let max = a.op == "cummax";
        let (x, vals, idx) = (a.take(0)?, a.out(0)?, a.out(1)?);
        f32s(&[&x, &vals])?;
        need(x.sizes == vals.sizes && x.sizes == idx.sizes && x.rank() >= 1, "cummax/cummin shapes")?;
        need(idx.dtype == DType::I64, "cummax/cummin indices are int64")?;
        let d = dim(d, x.rank())?;
        kernel(move |mem| unsafe {
            let n = x.sizes[d];
            let (sx, sv, si) = (x.strides[d], vals.strides[d], idx.strides[d]);
            let osz = drop_dim(&x.sizes, d);
            let (px, pv, pi) = (mem.ptr::<f32>(&x), mem.ptr::<f32>(&vals), mem.ptr::<i64>(&idx));
            let (rx, rv, ri) = (drop_dim(&x.strides, d), drop_dim(&vals.strides, d), drop_dim(&idx.strides, d));
            for_each(&osz, [&rx[..], &rv[..], &ri[..]], |[a, b, c]| {
                let (mut best, mut at) = (f32::NAN, 0i64);
                for i in 0..n {
                    let v = *px.add(a + i * sx);
                    let better = if max { v >= best } else { v <= best };
                    if i == 0 || v.is_nan() || !best.is_nan() && better {
                        best = v;
                        at = i as i64;
                    }
                    *pv.add(b + i * sv) = best;
                    *pi.add(c + i * si) = at;
                }
            });
            Ok(())
        })
    }
}
