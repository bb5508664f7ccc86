//! Row normalisations over the trailing `n` elements of contiguous rows: layer norm (with the
//! mean and reciprocal standard deviation it saves for backward) and RMS norm; each row by the
//! vectorised passes of `rows`.

use super::rows;
use crate::core::par::par_rows;
use crate::core::tensor::need;
use crate::kernels::registry::{f32s, kernel, uint, Args, Built, StepDef};

pub const STEPS: &[StepDef] = &[StepDef::core("layer_norm", norm), StepDef::core("rms_norm", norm)];

crate::step_params!(struct NormParams { n: i64, eps: f64 });

fn norm(a: &Args) -> Built {
    let p: NormParams = a.params()?;
    let (x, y) = (a.take(0)?, a.out(0)?);
    let n = uint(p.n, "normalized size")?;
    f32s(&[&x, &y])?;
    need(x.is_contiguous() && y.is_contiguous() && x.sizes == y.sizes, "norm needs contiguous input/output")?;
    need(n > 0 && x.numel() % n == 0, "normalized size does not divide the input")?;
    let rows = x.numel() / n;
    let (w, b) = (a.opt(1), a.opt(2));
    for v in w.iter().chain(b.iter()) {
        f32s(&[v])?;
        need(v.is_contiguous() && v.numel() == n, "norm weight/bias must have the normalized shape")?;
    }
    let eps = p.eps as f32;
    if a.op == "layer_norm" {
        let (mean, rstd) = (a.out(1)?, a.out(2)?);
        f32s(&[&mean, &rstd])?;
        need(mean.numel() == rows && rstd.numel() == rows && mean.is_contiguous() && rstd.is_contiguous(), "layer norm stats shape")?;
        return kernel(move |mem| unsafe {
            let (px, py, pm, pr) = (mem.ptr::<f32>(&x), mem.ptr::<f32>(&y), mem.ptr::<f32>(&mean), mem.ptr::<f32>(&rstd));
            let pw = w.as_ref().map(|v| mem.ptr::<f32>(v));
            let pb = b.as_ref().map(|v| mem.ptr::<f32>(v));
            par_rows(rows, x.numel(), |r| {
                let xs = std::slice::from_raw_parts(px.add(r * n), n);
                let ys = std::slice::from_raw_parts_mut(py.add(r * n), n);
                let ws = pw.map(|p| std::slice::from_raw_parts(p.get() as *const f32, n));
                let bs = pb.map(|p| std::slice::from_raw_parts(p.get() as *const f32, n));
                let (mu, rs) = rows::layer_norm(xs, ys, ws, bs, eps);
                *pm.add(r) = mu;
                *pr.add(r) = rs;
            });
            Ok(())
        });
    }
    let rstd = a.out(1)?;
    f32s(&[&rstd])?;
    need(rstd.numel() == rows && rstd.is_contiguous(), "rms norm stats shape")?;
    kernel(move |mem| unsafe {
        let (px, py, pr) = (mem.ptr::<f32>(&x), mem.ptr::<f32>(&y), mem.ptr::<f32>(&rstd));
        let pw = w.as_ref().map(|v| mem.ptr::<f32>(v));
        par_rows(rows, x.numel(), |r| {
            let xs = std::slice::from_raw_parts(px.add(r * n), n);
            let ys = std::slice::from_raw_parts_mut(py.add(r * n), n);
            let ws = pw.map(|p| std::slice::from_raw_parts(p.get() as *const f32, n));
            *pr.add(r) = rows::rms_norm(xs, ys, ws, eps);
        });
        Ok(())
    })
}
