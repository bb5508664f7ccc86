//! Reductions into a computed set of destinations: `segment_reduce` (consecutive segments of
//! given lengths or offsets along one axis) and the backward of 2-d max pooling (each gradient
//! added at the input position its index names).

use crate::core::element::load_i64;
use crate::core::mem::Mem;
use crate::core::par::par_rows;
use crate::core::tensor::{need, DType, Result, View};
use crate::kernels::registry::{kernel, Args, Built, StepDef};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

/// data (O, N, I), lengths (O, S) or offsets (O, S + 1), out (O, S, I)
pub struct Segment {
    data: View,
    bounds: View,
    out: View,
    offsets: bool,
    reduce: i64,
    initial: Option<f64>,
}

crate::step_params!(
    /// reduction 0 sum, 1 mean, 2 max, 3 min, 4 prod; offsets: the bounds are offsets, else lengths;
    /// `initial` counts only with `has_initial`
    pub struct SegmentParams { pub reduction: i64, pub offsets: bool, pub has_initial: bool, pub initial: f64 }
);

pub const STEPS: &[StepDef] = &[StepDef::any("segment_reduce", segment_reduce), StepDef::core("max_pool2d_bwd", max_pool2d_bwd)];

fn segment_reduce(a: &Args) -> Built {
    let k = Segment::new(&a.ins, &a.outs, &a.params()?)?;
    kernel(move |mem| unsafe { k.run(mem) })
}

fn max_pool2d_bwd(a: &Args) -> Built {
    a.no_params()?;
    let k = PoolBwd::new(&a.ins, &a.outs)?;
    kernel(move |mem| unsafe { k.run(mem) })
}

impl Segment {
    pub fn new(ins: &[Option<View>], outs: &[View], p: &SegmentParams) -> Result<Segment> {
        let data = ins.first().cloned().flatten().ok_or("segment_reduce: missing data")?;
        let bounds = ins.get(1).cloned().flatten().ok_or("segment_reduce: missing lengths")?;
        let out = outs.first().cloned().ok_or("segment_reduce: missing output")?;
        need((0..=4).contains(&p.reduction), "segment_reduce reduction")?;
        need(data.dtype == DType::F32 && out.dtype == DType::F32, "segment_reduce takes float32 data")?;
        need(matches!(bounds.dtype, DType::I64 | DType::I32), "segment lengths are int64 or int32")?;
        need(data.rank() == 3 && bounds.rank() == 2 && out.rank() == 3, "segment_reduce views")?;
        let offsets = p.offsets;
        let s = bounds.sizes[1].saturating_sub(offsets as usize);
        need(offsets <= (bounds.sizes[1] > 0), "segment offsets need at least one entry")?;
        need(bounds.sizes[0] == data.sizes[0] && out.sizes == [data.sizes[0], s, data.sizes[2]], "segment_reduce shapes")?;
        let initial = if p.has_initial { Some(p.initial) } else { None };
        Ok(Segment { data, bounds, out, offsets, reduce: p.reduction, initial })
    }

    /// # Safety
    /// The views must have been validated by the executor.
    pub unsafe fn run(&self, mem: &Mem) -> Result<()> {
        let (d, b, o) = (&self.data, &self.bounds, &self.out);
        let (pd, pb, po) = (mem.ptr::<f32>(d), mem.byte_ptr(b), mem.ptr::<f32>(o));
        let (n, inner, segs) = (d.sizes[1], d.sizes[2], o.sizes[1]);
        for oi in 0..d.sizes[0] {
            let bound = |k: usize| load_i64(pb, b.dtype, oi * b.strides[0] + k * b.strides[1]);
            let mut start = if self.offsets { bound(0) } else { 0 };
            for s in 0..segs {
                let len = if self.offsets { bound(s + 1) - bound(s) } else { bound(s) };
                if self.offsets {
                    start = bound(s);
                }
                if len < 0 || start < 0 || (start + len) as usize > n {
                    return Err(format!("segment_reduce: segment {s} ({start}..{}) is outside 0..{n}", start + len));
                }
                for j in 0..inner {
                    let init = self.initial.map(|v| v as f32);
                    let mut acc = match self.reduce {
                        2 => init.unwrap_or(f32::NEG_INFINITY),
                        3 => init.unwrap_or(f32::INFINITY),
                        4 => init.unwrap_or(1.0),
                        _ => init.unwrap_or(0.0),
                    };
                    for t in start..start + len {
                        let v = *pd.add(oi * d.strides[0] + t as usize * d.strides[1] + j * d.strides[2]);
                        acc = match self.reduce {
                            // std::max / std::min as ATen uses them: a NaN seen stays
                            2 if v.is_nan() || acc < v => v,
                            3 if v.is_nan() || v < acc => v,
                            2 | 3 => acc,
                            4 => acc * v,
                            _ => acc + v,
                        };
                    }
                    if self.reduce == 1 {
                        if len == 0 && self.initial.is_none() {
                            acc = f32::NAN;
                        } else if len > 0 && !acc.is_nan() {
                            acc /= len as f32;
                        }
                    }
                    *po.add(oi * o.strides[0] + s * o.strides[1] + j * o.strides[2]) = acc;
                }
                if !self.offsets {
                    start += len;
                }
            }
            if !self.offsets && start as usize != n {
                return Err(format!("segment_reduce: the lengths add up to {start}, not to the axis size {n}"));
            }
        }
        Ok(())
    }
}

/// grad (N, C, OH, OW), indices (N, C, OH, OW) into each H x W plane, gi (N, C, H, W)
pub struct PoolBwd {
    g: View,
    idx: View,
    gi: View,
}

impl PoolBwd {
    pub fn new(ins: &[Option<View>], outs: &[View]) -> Result<PoolBwd> {
        let g = ins.first().cloned().flatten().ok_or("max_pool2d backward: missing grad")?;
        let idx = ins.get(1).cloned().flatten().ok_or("max_pool2d backward: missing indices")?;
        let gi = outs.first().cloned().ok_or("max_pool2d backward: missing output")?;
        need(g.dtype == DType::F32 && gi.dtype == DType::F32 && idx.dtype == DType::I64, "max_pool2d backward dtypes")?;
        need(g.rank() == 4 && gi.rank() == 4 && idx.sizes == g.sizes && g.sizes[..2] == gi.sizes[..2], "max_pool2d backward shapes")?;
        Ok(PoolBwd { g, idx, gi })
    }

    /// # Safety
    /// The views must have been validated by the executor.
    pub unsafe fn run(&self, mem: &Mem) -> Result<()> {
        let (g, idx, gi) = (&self.g, &self.idx, &self.gi);
        let (pg, pi, po) = (mem.ptr::<f32>(g), mem.ptr::<i64>(idx), mem.ptr::<f32>(gi));
        let (h, w) = (gi.sizes[2], gi.sizes[3]);
        let plane = (h * w) as i64;
        // a plane of the input gradient stored row after row: the index is the offset in it
        let dense = gi.strides[3] == 1 && gi.strides[2] == w;
        let (ch, oh, ow) = (gi.sizes[1], g.sizes[2], g.sizes[3]);
        // planes are independent (every index points into its own plane): one task per plane
        let (bad, bad_k) = (AtomicBool::new(false), AtomicI64::new(0));
        par_rows(gi.sizes[0] * ch, gi.numel() + 2 * g.numel(), |p| {
            let (n, c) = (p / ch, p % ch);
            let ob = po.get().add(n * gi.strides[0] + c * gi.strides[1]);
            if dense {
                std::slice::from_raw_parts_mut(ob, h * w).fill(0.0);
            } else {
                for y in 0..h {
                    for x in 0..w {
                        *ob.add(y * gi.strides[2] + x * gi.strides[3]) = 0.0;
                    }
                }
            }
            let (gb, ib) = (pg.get().add(n * g.strides[0] + c * g.strides[1]), pi.get().add(n * idx.strides[0] + c * idx.strides[1]));
            for oy in 0..oh {
                for ox in 0..ow {
                    let k = *ib.add(oy * idx.strides[2] + ox * idx.strides[3]);
                    if k < 0 || k >= plane {
                        bad_k.store(k, Ordering::Relaxed);
                        bad.store(true, Ordering::Relaxed);
                        return;
                    }
                    let k = k as usize;
                    let at = if dense { k } else { k / w * gi.strides[2] + k % w * gi.strides[3] };
                    *ob.add(at) += *gb.add(oy * g.strides[2] + ox * g.strides[3]);
                }
            }
        });
        if bad.load(Ordering::Relaxed) {
            let k = bad_k.load(Ordering::Relaxed);
            return Err(format!("max_pool2d backward: index {k} is outside a {h}x{w} plane"));
        }
        Ok(())
    }
}
