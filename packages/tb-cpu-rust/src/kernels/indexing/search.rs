//! Searching sorted data and counting into bins: `searchsorted` / `bucketize` (binary search
//! per row of boundaries) and `histc` (equal-width bins over [min, max]).

use crate::core::element::{load_f64, store_i64};
use crate::core::mem::Mem;
use crate::core::strided::{drop_dim, for_each};
use crate::core::tensor::{need, DType, Result, View};
use crate::kernels::registry::{kernel, Args, Built, StepDef};
use serde::Deserialize;
use std::cmp::Ordering;

pub enum Search {
    /// seq (..., m) or (m,), values (..., k), out (..., k) int64 or int32
    Sorted { seq: View, vals: View, out: View, right: bool },
    /// x (any shape), out (bins,) float32; lo == hi: the data's own range
    Histc { x: View, out: View, lo: f64, hi: f64 },
    /// x -> mantissa (float32) and exponent (int32), as C's frexp
    Frexp { x: View, man: View, exp: View },
}

/// The parameters of each step kind of this family, by name.
#[derive(Deserialize)]
#[serde(tag = "op", deny_unknown_fields)]
enum Params {
    #[serde(rename = "searchsorted")]
    Searchsorted { right: bool },
    #[serde(rename = "histc")]
    Histc { min: f64, max: f64 },
    #[serde(rename = "frexp")]
    Frexp {},
}

pub const STEPS: &[StepDef] = &[StepDef::any("searchsorted", build), StepDef::any("histc", build), StepDef::any("frexp", build)];

fn build(a: &Args) -> Built {
    let k = Search::new(a)?;
    kernel(move |mem| unsafe { k.run(mem) })
}

impl Search {
    pub fn new(a: &Args) -> Result<Search> {
        let (get, o) = (|i| a.take(i), |i| a.out(i));
        match a.tagged::<Params>()? {
            Params::Searchsorted { right } => {
                let (seq, vals, out) = (get(0)?, get(1)?, o(0)?);
                need(seq.dtype == DType::F32 && vals.dtype == DType::F32, "searchsorted takes float32")?;
                need(matches!(out.dtype, DType::I64 | DType::I32), "searchsorted gives int64 or int32")?;
                need(out.sizes == vals.sizes && seq.rank() >= 1, "searchsorted shapes")?;
                if seq.rank() > 1 {
                    need(seq.rank() == vals.rank() && seq.sizes[..seq.rank() - 1] == vals.sizes[..vals.rank() - 1], "searchsorted: boundaries and values differ in their leading dims")?;
                }
                Ok(Search::Sorted { seq, vals, out, right })
            }
            Params::Histc { min: lo, max: hi } => {
                let (x, out) = (get(0)?, o(0)?);
                need(x.dtype == DType::F32 && out.dtype == DType::F32 && out.rank() == 1, "histc takes and gives float32")?;
                need(lo <= hi, "histc: max must be larger than min")?;
                need(lo.is_finite() && hi.is_finite(), "histc: range of [inf, inf] is not finite")?;
                Ok(Search::Histc { x, out, lo, hi })
            }
            Params::Frexp {} => {
                let (x, man, exp) = (get(0)?, o(0)?, o(1)?);
                need(x.dtype == DType::F32 && man.dtype == DType::F32 && exp.dtype == DType::I32, "frexp: float32 in, float32 and int32 out")?;
                need(x.sizes == man.sizes && x.sizes == exp.sizes, "frexp shapes")?;
                Ok(Search::Frexp { x, man, exp })
            }
        }
    }

    /// # Safety
    /// The views must have been validated by the executor.
    pub unsafe fn run(&self, mem: &Mem) -> Result<()> {
        match self {
            Search::Sorted { seq, vals, out, right } => {
                let (ps, pv, po) = (mem.byte_ptr(seq), mem.byte_ptr(vals), mem.byte_ptr(out));
                let r = vals.rank();
                let m = *seq.sizes.last().unwrap_or(&0);
                let ss = *seq.strides.last().unwrap_or(&0);
                // the boundary row of each value: its leading index when seq is batched, else row 0
                let seq_strides: Vec<usize> = if seq.rank() > 1 {
                    let mut s = seq.strides.clone();
                    if let Some(last) = s.last_mut() {
                        *last = 0;
                    }
                    s
                } else {
                    vec![0; r]
                };
                for_each(&vals.sizes, [&seq_strides[..], &vals.strides[..], &out.strides[..]], |[a, b, c]| {
                    let v = load_f64(pv, vals.dtype, b);
                    // as ATen: step right while !(s >= v) (left) or !(s > v) (right); NaN sorts last
                    let (mut lo, mut hi) = (0usize, m);
                    while lo < hi {
                        let mid = (lo + hi) / 2;
                        let s = load_f64(ps, seq.dtype, a + mid * ss);
                        let ord = s.partial_cmp(&v);
                        let go_right = if *right { ord != Some(Ordering::Greater) } else { matches!(ord, Some(Ordering::Less) | None) };
                        if go_right {
                            lo = mid + 1;
                        } else {
                            hi = mid;
                        }
                    }
                    store_i64(po, out.dtype, c, lo as i64);
                });
            }
            Search::Histc { x, out, lo, hi } => {
                let px = mem.ptr::<f32>(x);
                let bins = out.sizes[0];
                let (mut lo, mut hi) = (*lo as f32, *hi as f32);
                if lo == hi && x.numel() > 0 {
                    let (mut mn, mut mx) = (f32::INFINITY, f32::NEG_INFINITY);
                    for_each(&x.sizes, [&x.strides[..]], |[a]| {
                        let v = *px.add(a);
                        mn = mn.min(v);
                        mx = mx.max(v);
                    });
                    lo = mn;
                    hi = mx;
                }
                if lo == hi {
                    lo -= 1.0;
                    hi += 1.0;
                }
                let mut counts = vec![0f64; bins];
                if bins > 0 {
                    for_each(&x.sizes, [&x.strides[..]], |[a]| {
                        let v = *px.add(a);
                        if v >= lo && v <= hi {
                            let mut pos = ((v - lo) * bins as f32 / (hi - lo)) as usize;
                            if pos >= bins {
                                pos = bins - 1;
                            }
                            counts[pos] += 1.0;
                        }
                    });
                }
                let po = mem.ptr::<f32>(out);
                for (i, c) in counts.iter().enumerate() {
                    *po.add(i * out.strides[0]) = *c as f32;
                }
            }
            Search::Frexp { x, man, exp } => {
                let (px, pm, pe) = (mem.ptr::<f32>(x), mem.ptr::<f32>(man), mem.ptr::<i32>(exp));
                for_each(&x.sizes, [&x.strides[..], &man.strides[..], &exp.strides[..]], |[a, b, c]| {
                    let (m, e) = frexp(*px.add(a));
                    *pm.add(b) = m;
                    *pe.add(c) = e;
                });
            }
        }
        Ok(())
    }
}

/// x = m * 2^e with 0.5 <= |m| < 1 (zero, infinities and NaN: m = x, e = 0).
pub fn frexp(x: f32) -> (f32, i32) {
    if x == 0.0 || !x.is_finite() {
        return (x, 0);
    }
    let bits = x.to_bits();
    let exp = ((bits >> 23) & 0xff) as i32;
    if exp == 0 {
        // subnormal: scale into the normal range first
        let (m, e) = frexp(x * 2f32.powi(25));
        return (m, e - 25);
    }
    let e = exp - 126;
    let m = f32::from_bits((bits & 0x807f_ffff) | (126 << 23));
    (m, e)
}

/// Rows along `dim` of a view: (outer sizes, outer strides, stride along dim).
pub fn rows(v: &View, dim: usize) -> (Vec<usize>, Vec<usize>, usize) {
    (drop_dim(&v.sizes, dim), drop_dim(&v.strides, dim), v.strides[dim])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frexp_matches_c() {
        assert_eq!(frexp(8.0), (0.5, 4));
        assert_eq!(frexp(-3.0), (-0.75, 2));
        assert_eq!(frexp(0.0), (0.0, 0));
        let tiny = f32::from_bits(1);
        let (m, e) = frexp(tiny);
        assert_eq!((m, e), (0.5, -148));
    }
}
