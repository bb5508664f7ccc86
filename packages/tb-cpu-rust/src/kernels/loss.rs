//! Losses: negative log-likelihood forward and backward.

use crate::core::strided::for_each;
use crate::core::tensor::{need, DType};
use crate::kernels::registry::{f32s, kernel, Args, Built, StepDef};

pub const STEPS: &[StepDef] = &[StepDef::core("nll_loss", nll_loss), StepDef::core("nll_loss_bwd", nll_loss)];

crate::step_params!(
    /// reduction 0 none, 1 mean, 2 sum
    struct NllParams { reduction: i64, ignore_index: i64 }
);

/// nll_loss: x, target, weight? -> out, total_weight; nll_loss_bwd: grad, x, target, weight?,
/// total_weight -> grad_in
fn nll_loss(a: &Args) -> Built {
    let NllParams { reduction, ignore_index: ignore } = a.params()?;
    let fwd = a.op == "nll_loss";
    let off = if fwd { 0 } else { 1 };
    let (x, t) = (a.take(off)?, a.take(off + 1)?);
    let w = a.opt(off + 2);
    f32s(&[&x])?;
    need(x.rank() == 1 || x.rank() == 2, "nll_loss input must be 1-d or 2-d")?;
    need(t.dtype == DType::I64 && t.numel() == if x.rank() == 2 { x.sizes[0] } else { 1 }, "nll_loss target")?;
    let classes = *x.sizes.last().unwrap_or(&0);
    if let Some(wv) = &w {
        need(wv.sizes == [classes] && wv.dtype == DType::F32, "nll_loss weight")?;
    }
    need((0..=2).contains(&reduction), "nll_loss reduction")?;
    let (rows, c) = if x.rank() == 2 { (x.sizes[0], x.sizes[1]) } else { (1, x.sizes[0]) };
    let ts = t.strides.first().copied().unwrap_or(0);
    if fwd {
        let (o, total) = (a.out(0)?, a.out(1)?);
        f32s(&[&o, &total])?;
        need(total.numel() == 1, "nll_loss total weight")?;
        need(if reduction == 0 { o.numel() == t.numel() } else { o.numel() == 1 }, "nll_loss output")?;
        return kernel(move |mem| unsafe {
            let (px, pt, po, ptot) = (mem.ptr::<f32>(&x), mem.ptr::<i64>(&t), mem.ptr::<f32>(&o), mem.ptr::<f32>(&total));
            let pw = w.as_ref().map(|v| (mem.ptr::<f32>(v), v.strides[0]));
            let (rs, cs) = if x.rank() == 2 { (x.strides[0], x.strides[1]) } else { (0, x.strides[0]) };
            let os = o.strides.first().copied().unwrap_or(0);
            let (mut sum, mut wsum) = (0f64, 0f64);
            for r in 0..rows {
                let tv = *pt.add(r * ts);
                let mut loss = 0f32;
                if tv != ignore {
                    if tv < 0 || tv as usize >= c {
                        return Err(format!("target {tv} is out of bounds for {c} classes"));
                    }
                    let wv = pw.map(|(p, s)| *p.add(tv as usize * s)).unwrap_or(1.0);
                    loss = -wv * *px.add(r * rs + tv as usize * cs);
                    wsum += wv as f64;
                }
                sum += loss as f64;
                if reduction == 0 {
                    *po.add(r * os) = loss;
                }
            }
            match reduction {
                1 => *po.get() = (sum / wsum) as f32,
                2 => *po.get() = sum as f32,
                _ => {}
            }
            *ptot.get() = if reduction == 0 { 0.0 } else { wsum as f32 };
            Ok(())
        });
    }
    let (g, total, gi) = (a.take(0)?, a.take(4)?, a.out(0)?);
    f32s(&[&g, &total, &gi])?;
    need(gi.sizes == x.sizes && total.numel() == 1, "nll_loss_backward shapes")?;
    need(if reduction == 0 { g.numel() == t.numel() } else { g.numel() == 1 }, "nll_loss_backward grad")?;
    kernel(move |mem| unsafe {
        let (pg, pt, ptot, po) = (mem.ptr::<f32>(&g), mem.ptr::<i64>(&t), mem.ptr::<f32>(&total), mem.ptr::<f32>(&gi));
        let pw = w.as_ref().map(|v| (mem.ptr::<f32>(v), v.strides[0]));
        for_each(&gi.sizes, [&gi.strides], |[o]| *po.add(o) = 0.0);
        let (rs, cs) = if gi.rank() == 2 { (gi.strides[0], gi.strides[1]) } else { (0, gi.strides[0]) };
        let gs = g.strides.first().copied().unwrap_or(0);
        let tot = *ptot.get();
        for r in 0..rows {
            let tv = *pt.add(r * ts);
            if tv == ignore {
                continue;
            }
            if tv < 0 || tv as usize >= c {
                return Err(format!("target {tv} is out of bounds for {c} classes"));
            }
            let wv = pw.map(|(p, s)| *p.add(tv as usize * s)).unwrap_or(1.0);
            let gv = match reduction {
                0 => *pg.add(r * gs),
                1 => *pg.get() / tot,
                _ => *pg.get(),
            };
            *po.add(r * rs + tv as usize * cs) = -wv * gv;
        }
        Ok(())
    })
}
