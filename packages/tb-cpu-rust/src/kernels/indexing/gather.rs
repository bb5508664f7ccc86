//! Reads at computed positions: embedding, advanced indexing (`index`), gather, index_select,
//! and masked_scatter (the positions a mask sets take the next values of a flat source).

use crate::core::mem::SPtr;
use crate::core::strided::{for_each, offset_of};
use crate::core::tensor::{need, DType, Result, View};
use crate::kernels::registry::{dim, f32s, kernel, Args, Built, DimParam, StepDef};

pub const STEPS: &[StepDef] = &[StepDef::core("embedding", embedding), StepDef::core("index", index), StepDef::any("gather", gather),
    StepDef::core("index_select", gather), StepDef::core("masked_scatter", masked_scatter)];

fn embedding(a: &Args) -> Built {
    a.no_params()?;
    let (w, idx, out) = (a.take(0)?, a.take(1)?, a.out(0)?);
    f32s(&[&w, &out])?;
    need(w.rank() == 2 && idx.dtype == DType::I64, "embedding takes a 2-d weight and int64 indices")?;
    let mut expect = idx.sizes.clone();
    expect.push(w.sizes[1]);
    need(out.sizes == expect, "embedding output shape")?;
    kernel(move |mem| unsafe {
        let (pw, pi, po) = (mem.ptr::<f32>(&w), mem.ptr::<i64>(&idx), mem.ptr::<f32>(&out));
        let (rows, d) = (w.sizes[0] as i64, w.sizes[1]);
        let od = *out.strides.last().unwrap_or(&1);
        let os = &out.strides[..out.rank() - 1];
        let mut bad = None;
        for_each(&idx.sizes, [&idx.strides, os], |[oi, oo]| {
            let i = *pi.add(oi);
            if i < 0 || i >= rows {
                bad = Some(i);
                return;
            }
            let src = pw.add(i as usize * w.strides[0]);
            for j in 0..d {
                *po.add(oo + j * od) = *src.add(j * w.strides[1]);
            }
        });
        match bad {
            Some(i) => Err(format!("embedding index {i} out of range for {rows} rows")),
            None => Ok(()),
        }
    })
}

/// out = x[i0, i1, ...]: one int64 index per leading dim, every index broadcast to one shape
fn index(a: &Args) -> Built {
    a.no_params()?;
    let x = a.take(0)?;
    let idx: Vec<View> = (1..a.ins.len()).map(|i| a.take(i)).collect::<Result<_>>()?;
    let out = a.out(0)?;
    need(!idx.is_empty() && idx.len() <= x.rank(), "index needs 1..rank index tensors")?;
    need(out.dtype == x.dtype, "index output dtype")?;
    let bshape = idx[0].sizes.clone();
    need(idx.iter().all(|i| i.dtype == DType::I64 && i.sizes == bshape), "index tensors must be int64 and broadcast")?;
    let mut expect = bshape.clone();
    expect.extend_from_slice(&x.sizes[idx.len()..]);
    need(out.sizes == expect, "index output shape")?;
    kernel(move |mem| unsafe {
        let es = x.dtype.size();
        let (px, po) = (mem.byte_ptr(&x), mem.byte_ptr(&out));
        let k = idx.len();
        let ptrs: Vec<SPtr<i64>> = idx.iter().map(|v| mem.ptr::<i64>(v)).collect();
        let nb: usize = bshape.iter().product();
        let rest = &x.sizes[k..];
        let (xrest, orest) = (&x.strides[k..], &out.strides[bshape.len()..]);
        for lin in 0..nb {
            let mut base = 0usize;
            for j in 0..k {
                let raw = *ptrs[j].add(offset_of(lin, &bshape, &idx[j].strides));
                let dsz = x.sizes[j] as i64;
                let i = if raw < 0 { raw + dsz } else { raw };
                if i < 0 || i >= dsz {
                    return Err(format!("index {raw} is out of bounds for dimension {j} with size {dsz}"));
                }
                base += i as usize * x.strides[j];
            }
            let obase = offset_of(lin, &bshape, &out.strides[..bshape.len()]);
            for_each(rest, [xrest, orest], |[a, b]| {
                std::ptr::copy_nonoverlapping(px.add((base + a) * es), po.add((obase + b) * es), es);
            });
        }
        Ok(())
    })
}

/// gather (an index of out's shape) and index_select (a 1-d index along `dim`)
fn gather(a: &Args) -> Built {
    let DimParam { dim: d } = a.params()?;
    let is_gather = a.op == "gather";
    let (x, idx, out) = (a.take(0)?, a.take(1)?, a.out(0)?);
    let d = dim(d, x.rank())?;
    need(matches!(idx.dtype, DType::I64 | DType::I32) && out.dtype == x.dtype && out.rank() == x.rank().max(1), "gather dtypes/rank")?;
    need(x.dtype.is_core() && (is_gather || idx.dtype == DType::I64), "gather dtypes")?;
    if is_gather {
        need(idx.sizes == out.sizes && idx.rank() == x.rank(), "gather shapes")?;
        for i in 0..x.rank() {
            need(i == d || idx.sizes[i] <= x.sizes[i], "gather index larger than input")?;
        }
    } else {
        need(idx.rank() <= 1 && x.rank() >= 1, "index_select takes a 1-d index")?;
        let mut expect = x.sizes.clone();
        expect[d] = idx.numel();
        need(out.sizes == expect, "index_select output shape")?;
    }
    kernel(move |mem| unsafe {
        let es = x.dtype.size();
        let (px, pi, po) = (mem.byte_ptr(&x), mem.byte_ptr(&idx), mem.byte_ptr(&out));
        let idt = idx.dtype;
        let dsz = *x.sizes.get(d).unwrap_or(&1) as i64;
        let mut xs = x.strides.clone();
        let xd = xs.get(d).copied().unwrap_or(0);
        if !xs.is_empty() {
            xs[d] = 0;
        }
        let istr: Vec<usize> = if is_gather {
            idx.strides.clone()
        } else {
            (0..out.rank()).map(|k| if k == d { *idx.strides.first().unwrap_or(&0) } else { 0 }).collect()
        };
        let mut bad = None;
        for_each(&out.sizes, [&xs, &istr, &out.strides], |[a, ii, b]| {
            let raw = crate::core::element::load_i64(pi, idt, ii);
            let i = if raw < 0 { raw + dsz } else { raw };
            if i < 0 || i >= dsz {
                bad = Some(raw);
                return;
            }
            std::ptr::copy_nonoverlapping(px.add((a + i as usize * xd) * es), po.add(b * es), es);
        });
        match bad {
            Some(i) => Err(format!("index {i} is out of bounds for dimension {d} with size {dsz}")),
            None => Ok(()),
        }
    })
}

/// out = base, then the positions where `mask` is set take the next values of `src` (flat)
fn masked_scatter(a: &Args) -> Built {
    a.no_params()?;
    let (base, mask, src, out) = (a.take(0)?, a.take(1)?, a.take(2)?, a.out(0)?);
    need(mask.dtype == DType::Bool && base.dtype == out.dtype && src.dtype == out.dtype, "masked_scatter dtypes")?;
    need(mask.sizes == out.sizes && base.sizes == out.sizes && src.rank() == 1, "masked_scatter shapes")?;
    kernel(move |mem| unsafe {
        let es = out.dtype.size();
        let (pb, pm, ps, po) = (mem.byte_ptr(&base), mem.byte_ptr(&mask), mem.byte_ptr(&src), mem.byte_ptr(&out));
        let (n, ss) = (src.sizes[0], src.strides[0]);
        let mut k = 0usize;
        for_each(&out.sizes, [&base.strides[..], &mask.strides[..], &out.strides[..]], |[a, m, o]| {
            let from = if *pm.add(m) != 0 && k < n {
                k += 1;
                ps.add((k - 1) * ss * es)
            } else if *pm.add(m) != 0 {
                k += 1; // counted: reported below
                pb.add(a * es)
            } else {
                pb.add(a * es)
            };
            std::ptr::copy_nonoverlapping(from, po.add(o * es), es);
        });
        if k > n {
            return Err(format!("masked_scatter: the mask selects {k} elements but source has only {n}"));
        }
        Ok(())
    })
}
