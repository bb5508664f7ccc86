//! Reductions over one or more dims (sum, mean, extrema and their indices, variance, product,
//! logsumexp, any/all) and the softmax rows.

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
    if matches!(kind, Red::Sum | Red::Mean) && x.dtype == DType::F32 && out.dtype == DType::F32 && n > 0 {
        // the kept dims form one contiguous run in x and in out (a bias gradient: the sum over
        // the rows of a matrix): add whole rows into float64 accumulators, vectorised, instead
        // of walking each output's strided column
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
        if !kept.is_empty() && run(&x.strides) && run(&out.strides) {
            let (xf, of) = (SPtr(mem.byte_ptr(x) as *mut f32), SPtr(mem.byte_ptr(out) as *mut f32));
            const CH: usize = 512;
            let scale = if kind == Red::Mean { 1.0 / n as f64 } else { 1.0 };
            let chunk = |c: usize| {
                let (lo, hi) = (c * CH, ((c + 1) * CH).min(outer));
                let mut acc = [0f64; CH];
                let acc = &mut acc[..hi - lo];
                for_each(&rsz, [&rst], |[off]| {
                    let row = std::slice::from_raw_parts(xf.get().add(off + lo), hi - lo);
                    for (a, &v) in acc.iter_mut().zip(row) {
                        *a += v as f64;
                    }
                });
                for (j, &a) in acc.iter().enumerate() {
                    *of.get().add(lo + j) = (a * scale) as f32;
                }
            };
            par_rows(outer.div_ceil(CH), outer * n, chunk);
            return;
        }
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
