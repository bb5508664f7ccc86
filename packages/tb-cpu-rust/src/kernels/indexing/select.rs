//! Order statistics along one dim, with the index PyTorch reports: `median` / `nanmedian`
//! (the lower middle; ties by position) and `mode` (the most frequent value, the smallest on a
//! tie in frequency, and the last position it takes).

use crate::core::mem::Mem;
use crate::core::strided::{drop_dim, for_each};
use crate::core::tensor::{need, DType, Result, View};

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// NaN anywhere in the row: the result is the first NaN
    Median,
    /// NaNs are left out (a row of NaNs gives NaN at position 0)
    NanMedian,
    Mode,
}

pub struct Select {
    x: View,
    vals: View,
    idx: View,
    dim: usize,
    kind: Kind,
}

impl Select {
    /// `vals` and `idx` keep x's rank with size 1 along `dim` (the lowering unsqueezes them).
    pub fn new(op: &str, x: View, vals: View, idx: View, dim: usize) -> Result<Select> {
        let kind = match op {
            "median_dim" => Kind::Median,
            "nanmedian_dim" => Kind::NanMedian,
            "mode" => Kind::Mode,
            other => return Err(format!("unknown selection kernel {other:?}")),
        };
        need(x.dtype == DType::F32 && vals.dtype == DType::F32 && idx.dtype == DType::I64, "median/mode: float32 values, int64 indices")?;
        need(dim < x.rank(), "median/mode: dimension out of range")?;
        need(x.sizes[dim] > 0, "median/mode of an empty dimension")?;
        let mut want = x.sizes.clone();
        want[dim] = 1;
        need(vals.sizes == want && idx.sizes == want, "median/mode output shape")?;
        Ok(Select { x, vals, idx, dim, kind })
    }

    /// # Safety
    /// The views must have been validated by the executor.
    pub unsafe fn run(&self, mem: &Mem) -> Result<()> {
        let (x, d) = (&self.x, self.dim);
        let n = x.sizes[d];
        let sx = x.strides[d];
        let (px, pv, pi) = (mem.ptr::<f32>(x), mem.ptr::<f32>(&self.vals), mem.ptr::<i64>(&self.idx));
        let osz = drop_dim(&x.sizes, d);
        let (ox, ov, oi) = (drop_dim(&x.strides, d), drop_dim(&self.vals.strides, d), drop_dim(&self.idx.strides, d));
        let mut row: Vec<(f32, usize)> = Vec::with_capacity(n);
        let mut all_nan = false;
        for_each(&osz, [&ox[..], &ov[..], &oi[..]], |[a, b, c]| {
            row.clear();
            row.extend((0..n).map(|i| (*px.add(a + i * sx), i)));
            let (v, at) = match self.kind {
                Kind::Median => match row.iter().find(|e| e.0.is_nan()) {
                    Some(&(v, i)) => (v, i),
                    None => nth(&mut row, (n - 1) / 2),
                },
                Kind::NanMedian => {
                    let nans = row.iter().filter(|e| e.0.is_nan()).count();
                    if nans == n {
                        // ATen's index here is whatever its nth_element leaves: not ours to guess
                        all_nan |= n > 1;
                        (f32::NAN, 0)
                    } else {
                        nth(&mut row, (n - nans - 1) / 2)
                    }
                }
                Kind::Mode => mode(&mut row),
            };
            *pv.add(b) = v;
            *pi.add(c) = at as i64;
        });
        if all_nan {
            return Err("nanmedian: a row of NaN only has no defined index (eager decides)".into());
        }
        Ok(())
    }
}

/// The k-th of the row ordered by (value, position), NaN last.
fn nth(row: &mut [(f32, usize)], k: usize) -> (f32, usize) {
    row.sort_by(|p, q| match (p.0.is_nan(), q.0.is_nan()) {
        (false, false) => p.0.partial_cmp(&q.0).unwrap_or(std::cmp::Ordering::Equal).then(p.1.cmp(&q.1)),
        (a, b) => a.cmp(&b).then(p.1.cmp(&q.1)),
    });
    row[k]
}

fn mode(row: &mut [(f32, usize)]) -> (f32, usize) {
    row.sort_by(|p, q| p.0.partial_cmp(&q.0).unwrap_or(std::cmp::Ordering::Equal).then(p.1.cmp(&q.1)));
    let (mut best, mut best_n, mut run) = (row[0], 0usize, 0usize);
    for i in 0..row.len() {
        run += 1;
        if i + 1 == row.len() || row[i].0 != row[i + 1].0 {
            if run > best_n {
                best = row[i];
                best_n = run;
            }
            run = 0;
        }
    }
    best
}

// -- steps: median_dim, nanmedian_dim, mode -----------------------------------------------------------

pub const STEPS: &[crate::kernels::registry::StepDef] = &[crate::kernels::registry::StepDef::core("median_dim", select),
    crate::kernels::registry::StepDef::core("nanmedian_dim", select), crate::kernels::registry::StepDef::core("mode", select)];

fn select(a: &crate::kernels::registry::Args) -> crate::kernels::registry::Built {
    let crate::kernels::registry::DimParam { dim } = a.params()?;
    let (x, v, i) = (a.take(0)?, a.out(0)?, a.out(1)?);
    let d = crate::kernels::registry::dim(dim, x.rank())?;
    let k = Select::new(a.op, x, v, i, d)?;
    crate::kernels::registry::kernel(move |mem| unsafe { k.run(mem) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_mode_of_rows() {
        let mut r: Vec<(f32, usize)> = [3.0, 1.0, 2.0, 2.0].iter().copied().zip(0..).collect();
        assert_eq!(nth(&mut r, 1), (2.0, 2));
        let mut r: Vec<(f32, usize)> = [5.0, 1.0, 5.0, 1.0, 7.0].iter().copied().zip(0..).collect();
        assert_eq!(mode(&mut r), (1.0, 3));
    }
}
