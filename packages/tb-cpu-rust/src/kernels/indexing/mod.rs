//! Writes through an index (scatter, scatter-reduce, index_put) and sorting along a dim.
//! Shapes are validated by the step builders; these functions only index inside the views.
//!
//! Submodules: selection along a dim, searchsorted / histc, segment reductions and
//! max-pool backward (scatter by index), nonzero with a static size.

pub mod gather;
pub mod nonzero_static;
pub mod search;
pub mod segment;
pub mod select;

use crate::core::mem::Mem;
use crate::core::strided::{for_each, for_each_dyn};
use crate::core::tensor::{DType, Result, View};

/// How a scatter combines a source value with what is already at its destination.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Combine {
    Assign,
    Sum,
    Prod,
    Amax,
    Amin,
    Mean,
}

impl Combine {
    pub fn from_code(code: i64) -> Result<Combine> {
        Ok(match code {
            0 => Combine::Assign,
            1 => Combine::Sum,
            2 => Combine::Prod,
            3 => Combine::Amax,
            4 => Combine::Amin,
            5 => Combine::Mean,
            c => return Err(format!("unknown scatter reduction {c}")),
        })
    }
}

trait Elem: Copy + PartialOrd {
    unsafe fn get(p: *const u8, i: usize) -> Self;
    unsafe fn put(self, p: *mut u8, i: usize);
    fn add(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn zero() -> Self;
    fn one() -> Self;
    fn lowest() -> Self;
    fn highest() -> Self;
    fn is_nan(self) -> bool;
    fn div_count(self, n: usize) -> Self;
}

impl Elem for f32 {
    unsafe fn get(p: *const u8, i: usize) -> f32 {
        *(p as *const f32).add(i)
    }
    unsafe fn put(self, p: *mut u8, i: usize) {
        *(p as *mut f32).add(i) = self
    }
    fn add(self, o: f32) -> f32 {
        self + o
    }
    fn mul(self, o: f32) -> f32 {
        self * o
    }
    fn zero() -> f32 {
        0.0
    }
    fn one() -> f32 {
        1.0
    }
    fn lowest() -> f32 {
        f32::NEG_INFINITY
    }
    fn highest() -> f32 {
        f32::INFINITY
    }
    fn is_nan(self) -> bool {
        f32::is_nan(self)
    }
    fn div_count(self, n: usize) -> f32 {
        self / n as f32
    }
}

impl Elem for i64 {
    unsafe fn get(p: *const u8, i: usize) -> i64 {
        *(p as *const i64).add(i)
    }
    unsafe fn put(self, p: *mut u8, i: usize) {
        *(p as *mut i64).add(i) = self
    }
    fn add(self, o: i64) -> i64 {
        self.wrapping_add(o)
    }
    fn mul(self, o: i64) -> i64 {
        self.wrapping_mul(o)
    }
    fn zero() -> i64 {
        0
    }
    fn one() -> i64 {
        1
    }
    fn lowest() -> i64 {
        i64::MIN
    }
    fn highest() -> i64 {
        i64::MAX
    }
    fn is_nan(self) -> bool {
        false
    }
    fn div_count(self, n: usize) -> i64 {
        // torch floors the integer mean of scatter_reduce
        self.div_euclid(n as i64)
    }
}

impl Elem for u8 {
    unsafe fn get(p: *const u8, i: usize) -> u8 {
        (*p.add(i) != 0) as u8
    }
    unsafe fn put(self, p: *mut u8, i: usize) {
        *p.add(i) = self
    }
    fn add(self, o: u8) -> u8 {
        self | o
    }
    fn mul(self, o: u8) -> u8 {
        self & o
    }
    fn zero() -> u8 {
        0
    }
    fn one() -> u8 {
        1
    }
    fn lowest() -> u8 {
        0
    }
    fn highest() -> u8 {
        1
    }
    fn is_nan(self) -> bool {
        false
    }
    fn div_count(self, _n: usize) -> u8 {
        self
    }
}

/// `out = base`, then `out[.., idx[i], ..] (op)= src[i]` along `dim` (scatter / scatter_reduce).
/// # Safety
/// The views must have been validated by its step builder.
pub unsafe fn scatter(mem: &Mem, base: &View, idx: &View, src: &View, out: &View, dim: usize, how: Combine, include_self: bool) -> Result<()> {
    match out.dtype {
        DType::F32 => scatter_t::<f32>(mem, base, idx, src, out, dim, how, include_self),
        DType::I64 => scatter_t::<i64>(mem, base, idx, src, out, dim, how, include_self),
        _ => scatter_t::<u8>(mem, base, idx, src, out, dim, how, include_self),
    }
}

unsafe fn copy_view<T: Elem>(mem: &Mem, from: &View, to: &View) {
    let (pf, pt) = (mem.byte_ptr(from), mem.byte_ptr(to));
    for_each(&to.sizes, [&from.strides, &to.strides], |[a, b]| T::get(pf, a).put(pt, b));
}

unsafe fn scatter_t<T: Elem>(mem: &Mem, base: &View, idx: &View, src: &View, out: &View, dim: usize, how: Combine, include_self: bool) -> Result<()> {
    copy_view::<T>(mem, base, out);
    let (pi, ps, po) = (mem.byte_ptr(idx), mem.byte_ptr(src), mem.byte_ptr(out));
    let idt = idx.dtype; // int64, or int32
    let size = *out.sizes.get(dim).unwrap_or(&1) as i64;
    let dstride = *out.strides.get(dim).unwrap_or(&0);
    let mut ostr = out.strides.clone();
    if !ostr.is_empty() {
        ostr[dim] = 0;
    }
    // destination offset of every source element, checked before anything is combined
    let mut dests: Vec<usize> = Vec::with_capacity(idx.numel());
    let mut srcs: Vec<usize> = Vec::with_capacity(idx.numel());
    let mut bad = None;
    for_each(&idx.sizes, [&idx.strides, &src.strides, &ostr], |o| {
        let raw = crate::core::element::load_i64(pi, idt, o[0]);
        let i = if raw < 0 { raw + size } else { raw };
        if i < 0 || i >= size {
            bad = Some(raw);
            return;
        }
        dests.push(o[2] + i as usize * dstride);
        srcs.push(o[1]);
    });
    if let Some(raw) = bad {
        return Err(format!("scatter index {raw} is out of bounds for dimension {dim} with size {size}"));
    }
    let mut counts: std::collections::HashMap<usize, usize> = std::collections::HashMap::new();
    if how != Combine::Assign && !include_self {
        let start = match how {
            Combine::Prod => T::one(),
            Combine::Amax => T::lowest(),
            Combine::Amin => T::highest(),
            _ => T::zero(),
        };
        for &d in &dests {
            start.put(po, d);
        }
    }
    for (&d, &s) in dests.iter().zip(&srcs) {
        let v = T::get(ps, s);
        let cur = T::get(po, d);
        let r = match how {
            Combine::Assign => v,
            Combine::Sum | Combine::Mean => cur.add(v),
            Combine::Prod => cur.mul(v),
            Combine::Amax => {
                if cur.is_nan() || v.is_nan() {
                    if cur.is_nan() { cur } else { v }
                } else if v > cur {
                    v
                } else {
                    cur
                }
            }
            Combine::Amin => {
                if cur.is_nan() || v.is_nan() {
                    if cur.is_nan() { cur } else { v }
                } else if v < cur {
                    v
                } else {
                    cur
                }
            }
        };
        r.put(po, d);
        if how == Combine::Mean {
            *counts.entry(d).or_insert(include_self as usize) += 1;
        }
    }
    for (d, n) in counts {
        T::get(po, d).div_count(n.max(1)).put(po, d);
    }
    Ok(())
}

/// `out = base`, then `out[idx0[j], .., idxk[j], rest] (=|+=) values[j, rest]` for every j of the
/// (already broadcast) index shape.
/// # Safety
/// The views must have been validated by its step builder.
pub unsafe fn index_put(mem: &Mem, base: &View, values: &View, idx: &[View], out: &View, accumulate: bool) -> Result<()> {
    match out.dtype {
        DType::F32 => index_put_t::<f32>(mem, base, values, idx, out, accumulate),
        DType::I64 => index_put_t::<i64>(mem, base, values, idx, out, accumulate),
        _ => index_put_t::<u8>(mem, base, values, idx, out, accumulate),
    }
}

unsafe fn index_put_t<T: Elem>(mem: &Mem, base: &View, values: &View, idx: &[View], out: &View, accumulate: bool) -> Result<()> {
    copy_view::<T>(mem, base, out);
    let k = idx.len();
    let bshape = &idx[0].sizes;
    let nb = bshape.len();
    let ptrs: Vec<(*const u8, crate::core::tensor::DType)> = idx.iter().map(|v| (mem.byte_ptr(v) as *const u8, v.dtype)).collect();
    let (pv, po) = (mem.byte_ptr(values), mem.byte_ptr(out));
    let rest = &out.sizes[k..];
    let (ro, rv) = (&out.strides[k..], &values.strides[nb..]);
    let mut bad = None;
    let idx_strides: Vec<&[usize]> = idx.iter().map(|v| v.strides.as_slice()).collect();
    let mut all: Vec<&[usize]> = idx_strides.clone();
    let vb = &values.strides[..nb];
    all.push(vb);
    for_each_dyn(bshape, &all, |offs| {
        if bad.is_some() {
            return;
        }
        let mut ob = 0usize;
        for j in 0..k {
            let raw = crate::core::element::load_i64(ptrs[j].0, ptrs[j].1, offs[j]);
            let size = out.sizes[j] as i64;
            let i = if raw < 0 { raw + size } else { raw };
            if i < 0 || i >= size {
                bad = Some((raw, j));
                return;
            }
            ob += i as usize * out.strides[j];
        }
        let vbase = offs[k];
        for_each(rest, [ro, rv], |o| {
            let v = T::get(pv, vbase + o[1]);
            let d = ob + o[0];
            let r = if accumulate { T::get(po, d).add(v) } else { v };
            r.put(po, d);
        });
    });
    if let Some((raw, j)) = bad {
        return Err(format!("index {raw} is out of bounds for dimension {j} with size {}", out.sizes[j]));
    }
    Ok(())
}

/// Sorts every row along `dim` (stable; NaN sorts above every number, as in PyTorch) and writes
/// the values and their original positions.
/// # Safety
/// The views must have been validated by its step builder.
pub unsafe fn sort(mem: &Mem, x: &View, vals: &View, pos: &View, dim: usize, descending: bool) {
    let n = x.sizes[dim];
    let (sx, sv, sp) = (x.strides[dim], vals.strides[dim], pos.strides[dim]);
    let drop = |v: &[usize]| -> Vec<usize> { v.iter().enumerate().filter(|&(i, _)| i != dim).map(|(_, &s)| s).collect() };
    let osz = drop(&x.sizes);
    let (ox, ov, op) = (drop(&x.strides), drop(&vals.strides), drop(&pos.strides));
    let (px, pv, pp) = (mem.byte_ptr(x), mem.byte_ptr(vals), mem.byte_ptr(pos) as *mut i64);
    let key = |a: f64, b: f64| -> std::cmp::Ordering {
        match (a.is_nan(), b.is_nan()) {
            (true, true) => std::cmp::Ordering::Equal,
            (true, false) => std::cmp::Ordering::Greater,
            (false, true) => std::cmp::Ordering::Less,
            _ => a.partial_cmp(&b).unwrap_or(std::cmp::Ordering::Equal),
        }
    };
    let mut row: Vec<(f64, usize)> = Vec::with_capacity(n);
    for_each(&osz, [&ox, &ov, &op], |o| {
        row.clear();
        for i in 0..n {
            let v = match x.dtype {
                DType::F32 => f32::get(px, o[0] + i * sx) as f64,
                DType::I64 => i64::get(px, o[0] + i * sx) as f64,
                _ => u8::get(px, o[0] + i * sx) as f64,
            };
            row.push((v, i));
        }
        if descending {
            row.sort_by(|a, b| key(b.0, a.0));
        } else {
            row.sort_by(|a, b| key(a.0, b.0));
        }
        for (j, &(v, i)) in row.iter().enumerate() {
            match x.dtype {
                // re-read the element: an int64 above 2^53 does not survive the f64 key
                DType::F32 => f32::get(px, o[0] + i * sx).put(pv, o[1] + j * sv),
                DType::I64 => i64::get(px, o[0] + i * sx).put(pv, o[1] + j * sv),
                _ => ((v != 0.0) as u8).put(pv, o[1] + j * sv),
            }
            *pp.add(o[2] + j * sp) = i as i64;
        }
    });
}

/// `embedding_bag` forward: bag b of `out` reduces the weight rows `idx[offsets[b]..offsets[b+1]]`
/// (the last bag runs to the end of `idx`, unless `include_last` says `offsets` has its end too);
/// mode 0 sum (times `psw`, if given), 1 mean, 2 max; rows equal to `padding` are skipped; an
/// empty bag gives zeros.
/// # Safety
/// The views must have been validated by its step builder.
#[allow(clippy::too_many_arguments)]
pub unsafe fn embedding_bag(mem: &Mem, w: &View, idx: &View, offsets: &View, psw: Option<&View>, out: &View, mode: i64, include_last: bool, padding: i64) -> Result<()> {
    let (pw, pi, po, py) = (mem.ptr::<f32>(w), mem.ptr::<i64>(idx), mem.ptr::<i64>(offsets), mem.ptr::<f32>(out));
    let (rows, d, n) = (w.sizes[0] as i64, w.sizes[1], idx.sizes[0]);
    let nb = out.sizes[0];
    let off = |b: usize| -> i64 { *po.add(b * offsets.strides[0]) };
    let mut acc = vec![0f32; d];
    for b in 0..nb {
        let start = off(b);
        let end = if b + 1 < offsets.sizes[0] { off(b + 1) } else if include_last { off(b) } else { n as i64 };
        if start < 0 || end < start || end as usize > n {
            return Err(format!("embedding_bag: offsets {start}..{end} outside 0..{n}"));
        }
        acc.iter_mut().for_each(|a| *a = if mode == 2 { f32::NEG_INFINITY } else { 0.0 });
        let mut count = 0usize;
        for k in start as usize..end as usize {
            let r = *pi.add(k * idx.strides[0]);
            if r < 0 || r >= rows {
                return Err(format!("embedding_bag: index {r} out of range for {rows} rows"));
            }
            if r == padding {
                continue;
            }
            count += 1;
            let scale = psw.map(|p| *mem.ptr::<f32>(p).add(k * p.strides[0])).unwrap_or(1.0);
            for (j, a) in acc.iter_mut().enumerate() {
                let v = *pw.add(r as usize * w.strides[0] + j * w.strides[1]);
                if mode == 2 {
                    // as ATen: the bag's first row, then any larger value
                    if count == 1 || v > *a {
                        *a = v;
                    }
                } else {
                    *a += v * scale;
                }
            }
        }
        for (j, a) in acc.iter().enumerate() {
            let v = if count == 0 {
                0.0
            } else if mode == 1 {
                *a / count as f32
            } else {
                *a
            };
            *py.add(b * out.strides[0] + j * out.strides[1]) = v;
        }
    }
    Ok(())
}

pub use steps::STEPS;

/// The step kinds of this file: scatter, index_put, sort, embedding_bag.
mod steps {
    use super::*;
    use crate::core::tensor::need;
    use crate::kernels::registry::{dim, f32s, infallible, kernel, Args, Built, StepDef};

    pub const STEPS: &[StepDef] = &[StepDef::any("scatter", scatter_step), StepDef::any("index_put", index_put_step), StepDef::core("sort", sort_step),
        StepDef::core("embedding_bag", embedding_bag_step)];

    crate::step_params!(
        /// how 0 write, 1 sum, 2 prod, 3 amax, 4 amin, 5 mean
        struct ScatterParams { dim: i64, how: i64, include_self: bool }
    );

    fn scatter_step(a: &Args) -> Built {
        let p: ScatterParams = a.params()?;
        let (base, idx, src, o) = (a.take(0)?, a.take(1)?, a.take(2)?, a.out(0)?);
        need(o.sizes == base.sizes && o.dtype == base.dtype && src.dtype == o.dtype, "scatter output")?;
        need(matches!(idx.dtype, DType::I64 | DType::I32) && idx.rank() == o.rank() && src.rank() == o.rank(), "scatter index rank")?;
        need(base.dtype.is_core() && src.dtype.is_core() && o.dtype.is_core(), "scatter takes float32, int64 and bool")?;
        let d = dim(p.dim, o.rank())?;
        for i in 0..o.rank() {
            need(idx.sizes[i] <= src.sizes[i], "scatter index larger than src")?;
            need(i == d || idx.sizes[i] <= o.sizes[i], "scatter index larger than self")?;
        }
        let how = Combine::from_code(p.how)?;
        need(o.dtype == DType::F32 || !matches!(how, Combine::Mean) || o.dtype == DType::I64, "scatter mean dtype")?;
        let include_self = p.include_self;
        kernel(move |mem| unsafe { scatter(mem, &base, &idx, &src, &o, d, how, include_self) })
    }

    crate::step_params!(struct IndexPutParams { accumulate: bool });

    fn index_put_step(a: &Args) -> Built {
        let IndexPutParams { accumulate } = a.params()?;
        let (base, values, o) = (a.take(0)?, a.take(1)?, a.out(0)?);
        let idx: Vec<View> = (2..a.ins.len()).map(|i| a.take(i)).collect::<Result<_>>()?;
        need(!idx.is_empty() && idx.len() <= o.rank(), "index_put needs 1..rank index tensors")?;
        need(o.sizes == base.sizes && o.dtype == base.dtype && values.dtype == o.dtype, "index_put output")?;
        let bshape = idx[0].sizes.clone();
        need(idx.iter().all(|i| matches!(i.dtype, DType::I64 | DType::I32) && i.sizes == bshape), "index_put indices must be int64 or int32 and broadcast")?;
        need(base.dtype.is_core() && values.dtype.is_core() && o.dtype.is_core(), "index_put takes float32, int64 and bool")?;
        let mut expect = bshape;
        expect.extend_from_slice(&o.sizes[idx.len()..]);
        need(values.sizes == expect, "index_put values shape")?;
        kernel(move |mem| unsafe { index_put(mem, &base, &values, &idx, &o, accumulate) })
    }

    crate::step_params!(struct SortParams { dim: i64, descending: bool });

    fn sort_step(a: &Args) -> Built {
        let SortParams { dim: d, descending } = a.params()?;
        let (x, vals, pos) = (a.take(0)?, a.out(0)?, a.out(1)?);
        need(x.rank() >= 1 && vals.sizes == x.sizes && pos.sizes == x.sizes, "sort shapes")?;
        need(vals.dtype == x.dtype && pos.dtype == DType::I64, "sort dtypes")?;
        let d = dim(d, x.rank())?;
        infallible(move |mem| unsafe { sort(mem, &x, &vals, &pos, d, descending) })
    }

    crate::step_params!(
        /// mode 0 sum, 1 mean, 2 max
        struct BagParams { mode: i64, include_last_offset: bool, padding_idx: i64 }
    );

    fn embedding_bag_step(a: &Args) -> Built {
        let BagParams { mode, include_last_offset: include_last, padding_idx: padding } = a.params()?;
        let (w, idx, offsets, o) = (a.take(0)?, a.take(1)?, a.take(2)?, a.out(0)?);
        let psw = a.opt(3);
        f32s(&[&w, &o])?;
        need(w.rank() == 2 && o.rank() == 2 && o.sizes[1] == w.sizes[1], "embedding_bag: 2-d weight and output")?;
        need(idx.dtype == DType::I64 && offsets.dtype == DType::I64 && idx.rank() == 1 && offsets.rank() == 1, "embedding_bag: 1-d int64 indices and offsets")?;
        need((0..=2).contains(&mode), "embedding_bag mode")?;
        need(o.sizes[0] == offsets.sizes[0] - (include_last && offsets.sizes[0] > 0) as usize, "embedding_bag: number of bags")?;
        if let Some(p) = &psw {
            need(p.dtype == DType::F32 && p.sizes == idx.sizes && mode == 0, "embedding_bag per-sample weights (sum mode only)")?;
        }
        kernel(move |mem| unsafe { embedding_bag(mem, &w, &idx, &offsets, psw.as_ref(), &o, mode, include_last, padding) })
    }
}
