//! Batch norm backward (`aten.native_batch_norm_backward`), in two passes over the data: per
//! channel `Σ dy` and `Σ dy·(x − mean)` (f64 totals), then grad_input
//! `w·istd·(dy − Σdy/M − (x − mean)·istd²·Σdy(x−mean)/M)` (training) or `w·istd·dy` (eval, the
//! running statistics), grad_weight `istd·Σdy(x−mean)`, grad_bias `Σ dy`: PyTorch's CPU formulas.
//!
//! Tensors come as (N, C, S) views (the spatial dims merged by the lowering). Contiguous planes
//! (NCHW) run per channel, vectorised along S; channels-last (channel stride 1) runs per
//! position, vectorised across channels, each thread summing its own share of positions;
//! anything else element by element per channel.

use crate::core::mem::{Mem, SPtr};
use crate::core::tensor::{need, View};
use crate::kernels::registry::{f32s, infallible, Args, Built, StepDef};

pub const STEPS: &[StepDef] = &[StepDef::core("batch_norm_backward", batch_norm_backward_step)];

crate::step_params!(struct BatchNormBackwardParams { training: bool, eps: f64, mask: Vec<i64> });

/// operands: grad (N, C, S), x (N, C, S), weight? (C,), mean (C,), invstd (C,) in training or
/// the running variance (C,) in eval; results: the gradients `mask` (input, weight, bias: 1 / 0)
/// asks for, shaped (N, C, S), (C,), (C,)
fn batch_norm_backward_step(a: &Args) -> Built {
    let BatchNormBackwardParams { training, eps, mask } = a.params()?;
    let (dy, x, w, mean, stat) = (a.take(0)?, a.take(1)?, a.opt(2), a.take(3)?, a.take(4)?);
    f32s(&[&dy, &x, &mean, &stat])?;
    need(x.rank() == 3 && dy.sizes == x.sizes, "batch_norm_backward takes (N, C, S) grad and input of one shape")?;
    let c = x.sizes[1];
    need(mean.sizes == [c] && stat.sizes == [c], "batch_norm_backward statistics are (C,)")?;
    if let Some(w) = &w {
        f32s(&[w])?;
        need(w.sizes == [c], "batch_norm_backward weight is (C,)")?;
    }
    need(mask.len() == 3 && mask.iter().all(|&m| m == 0 || m == 1), "batch_norm_backward mask is three 0 / 1 flags")?;
    let mut next = 0;
    let mut grad = |want: i64, sizes: &[usize], what: &str| -> crate::core::tensor::Result<Option<View>> {
        if want == 0 {
            return Ok(None);
        }
        let v = a.out(next)?;
        next += 1;
        f32s(&[&v])?;
        need(v.sizes == sizes, what)?;
        Ok(Some(v))
    };
    let outs = Outs {
        input: grad(mask[0], &x.sizes, "batch_norm_backward grad_input shape")?,
        weight: grad(mask[1], &[c], "batch_norm_backward grad_weight shape")?,
        bias: grad(mask[2], &[c], "batch_norm_backward grad_bias shape")?,
    };
    need(a.out(next).is_err(), "batch_norm_backward has more results than its mask asks for")?;
    let eps = eps as f32;
    infallible(move |mem| unsafe {
        batch_norm_backward(mem, &dy, &x, w.as_ref(), &mean, &stat, &outs, training, eps, crate::core::par::threads())
    })
}

/// The gradients a step writes (absent: not asked for).
pub struct Outs {
    pub input: Option<View>,
    pub weight: Option<View>,
    pub bias: Option<View>,
}

/// How the (N, C, S) tensors lie: S contiguous, C contiguous, or neither.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Layout {
    Planes,
    ChannelsLast,
    Strided,
}

fn layout(vs: &[&View]) -> Layout {
    if vs.iter().all(|v| v.strides[2] == 1 || v.sizes[2] == 1) {
        Layout::Planes
    } else if vs.iter().all(|v| v.strides[1] == 1 || v.sizes[1] == 1) {
        Layout::ChannelsLast
    } else {
        Layout::Strided
    }
}

/// # Safety
/// Every view must have been validated by the step builder against the buffers of `mem`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn batch_norm_backward(
    mem: &Mem, dy: &View, x: &View, w: Option<&View>, mean: &View, stat: &View, outs: &Outs, training: bool, eps: f32, threads: usize,
) {
    let (n, c, sp) = (x.sizes[0], x.sizes[1], x.sizes[2]);
    let rd = |v: &View, i: usize| *mem.ptr::<f32>(v).add(i * v.strides[0]);
    let mu: Vec<f32> = (0..c).map(|i| rd(mean, i)).collect();
    let istd: Vec<f32> = (0..c).map(|i| if training { rd(stat, i) } else { 1.0 / (rd(stat, i) + eps).sqrt() }).collect();
    let wv: Vec<f32> = (0..c).map(|i| w.map_or(1.0, |w| rd(w, i))).collect();
    let need_sums = training && outs.input.is_some() || outs.weight.is_some() || outs.bias.is_some();
    let (sum_dy, sum_dxmu) = if need_sums { sums(mem, dy, x, &mu, threads) } else { (vec![0.0; c], vec![0.0; c]) };
    if let Some(gw) = &outs.weight {
        let p = mem.ptr::<f32>(gw);
        for i in 0..c {
            *p.add(i * gw.strides[0]) = (sum_dxmu[i] * istd[i] as f64) as f32;
        }
    }
    if let Some(gb) = &outs.bias {
        let p = mem.ptr::<f32>(gb);
        for i in 0..c {
            *p.add(i * gb.strides[0]) = sum_dy[i] as f32;
        }
    }
    let Some(gx) = &outs.input else { return };
    // dx = a·(dy − mdy − (x − mean)·k) per channel, in PyTorch's order of operations (a
    // rearranged form would turn its ±inf into NaN); eval: mdy = k = 0
    let m = (n * sp).max(1) as f64;
    let mut scale = vec![0f32; c];
    let mut kx = vec![0f32; c];
    let mut mdy = vec![0f32; c];
    for i in 0..c {
        scale[i] = istd[i] * wv[i];
        if training {
            kx[i] = (sum_dxmu[i] * (istd[i] as f64) * (istd[i] as f64) / m) as f32;
            mdy[i] = (sum_dy[i] / m) as f32;
        }
    }
    let (scale, kx, mdy, mu) = (&scale, &kx, &mdy, &mu);
    let f = move |q: usize, y: f32, xv: f32| if training { (y - mdy[q] - (xv - mu[q]) * kx[q]) * scale[q] } else { y * scale[q] };
    let (py, px, pg) = (mem.ptr::<f32>(dy), mem.ptr::<f32>(x), mem.ptr::<f32>(gx));
    let (ys, xs, gs) = (&dy.strides, &x.strides, &gx.strides);
    match layout(&[dy, x, gx]) {
        Layout::ChannelsLast => {
            let rows = n * sp;
            let row = |r: usize| {
                let (ni, si) = (r / sp, r % sp);
                let yr = std::slice::from_raw_parts(py.add(ni * ys[0] + si * ys[2]), c);
                let xr = std::slice::from_raw_parts(px.add(ni * xs[0] + si * xs[2]), c);
                let gr = std::slice::from_raw_parts_mut(pg.add(ni * gs[0] + si * gs[2]), c);
                // per-channel rows zipped: no bounds checks, vectorised across channels
                let coef = scale.iter().zip(kx).zip(mdy).zip(mu);
                if training {
                    for (((g, &y), &xv), (((&a, &k), &md), &m)) in gr.iter_mut().zip(yr).zip(xr).zip(coef) {
                        *g = (y - md - (xv - m) * k) * a;
                    }
                } else {
                    for ((g, &y), &a) in gr.iter_mut().zip(yr).zip(scale) {
                        *g = y * a;
                    }
                }
            };
            par_rows(rows, rows * c, threads, row);
        }
        lay => {
            let plane = |item: usize| {
                let (ni, ci) = (item / c, item % c);
                let (yb, xb, gb) = (py.add(ni * ys[0] + ci * ys[1]), px.add(ni * xs[0] + ci * xs[1]), pg.add(ni * gs[0] + ci * gs[1]));
                if lay == Layout::Planes {
                    let (yr, xr) = (std::slice::from_raw_parts(yb, sp), std::slice::from_raw_parts(xb, sp));
                    let gr = std::slice::from_raw_parts_mut(gb, sp);
                    let (a, k, md, m) = (scale[ci], kx[ci], mdy[ci], mu[ci]);
                    // the channel's constants hoisted: a vectorised loop
                    if training {
                        for ((g, &y), &xv) in gr.iter_mut().zip(yr).zip(xr) {
                            *g = (y - md - (xv - m) * k) * a;
                        }
                    } else {
                        for (g, &y) in gr.iter_mut().zip(yr) {
                            *g = y * a;
                        }
                    }
                } else {
                    for q in 0..sp {
                        *gb.add(q * gs[2]) = f(ci, *yb.add(q * ys[2]), *xb.add(q * xs[2]));
                    }
                }
            };
            par_rows(n * c, n * c * sp, threads, plane);
        }
    }
}

/// Runs `f` for every row, over the threads when there is enough work.
fn par_rows(rows: usize, work: usize, threads: usize, f: impl Fn(usize) + Sync + Send) {
    if threads > 1 && work >= 1 << 14 {
        crate::core::par::for_each(rows, f);
    } else {
        (0..rows).for_each(f);
    }
}

/// Per channel `Σ dy` and `Σ dy·(x − mean)`, f64 totals of f32 runs.
unsafe fn sums(mem: &Mem, dy: &View, x: &View, mu: &[f32], threads: usize) -> (Vec<f64>, Vec<f64>) {
    let (n, c, sp) = (x.sizes[0], x.sizes[1], x.sizes[2]);
    let (py, px, ys, xs) = (mem.ptr::<f32>(dy), mem.ptr::<f32>(x), &dy.strides, &x.strides);
    let mut sum_dy = vec![0f64; c];
    let mut sum_dxmu = vec![0f64; c];
    match layout(&[dy, x]) {
        Layout::ChannelsLast => {
            // each part sums its positions into its own per-channel rows
            let rows = n * sp;
            let parts = if threads > 1 && rows * c >= 1 << 14 { threads.min(rows) } else { 1 };
            let mut acc = vec![0f64; parts * 2 * c];
            let accp = SPtr(acc.as_mut_ptr());
            let part = |p: usize| {
                let (ady, adx) = (std::slice::from_raw_parts_mut(accp.add(p * 2 * c), c), std::slice::from_raw_parts_mut(accp.add(p * 2 * c + c), c));
                let (mut fdy, mut fdx) = (vec![0f32; c], vec![0f32; c]);
                let (r0, r1) = (p * rows / parts, (p + 1) * rows / parts);
                for (t, r) in (r0..r1).enumerate() {
                    let (ni, si) = (r / sp, r % sp);
                    let yr = std::slice::from_raw_parts(py.add(ni * ys[0] + si * ys[2]), c);
                    let xr = std::slice::from_raw_parts(px.add(ni * xs[0] + si * xs[2]), c);
                    for q in 0..c {
                        fdy[q] += yr[q];
                        fdx[q] += yr[q] * (xr[q] - mu[q]);
                    }
                    // f32 runs of at most 64 positions, then into the f64 totals
                    if t % 64 == 63 || r + 1 == r1 {
                        for q in 0..c {
                            ady[q] += fdy[q] as f64;
                            adx[q] += fdx[q] as f64;
                        }
                        fdy.fill(0.0);
                        fdx.fill(0.0);
                    }
                }
            };
            if parts > 1 {
                crate::core::par::for_each(parts, part);
            } else {
                part(0);
            }
            for p in 0..parts {
                for q in 0..c {
                    sum_dy[q] += acc[p * 2 * c + q];
                    sum_dxmu[q] += acc[p * 2 * c + c + q];
                }
            }
        }
        lay => {
            let (sdp, sxp) = (SPtr(sum_dy.as_mut_ptr()), SPtr(sum_dxmu.as_mut_ptr()));
            let channel = |ci: usize| {
                let m = mu[ci];
                let (mut tdy, mut tdx) = (0f64, 0f64);
                for ni in 0..n {
                    let (yb, xb) = (py.add(ni * ys[0] + ci * ys[1]), px.add(ni * xs[0] + ci * xs[1]));
                    if lay == Layout::Planes {
                        let (a, b) = lanes(std::slice::from_raw_parts(yb, sp), std::slice::from_raw_parts(xb, sp), m);
                        tdy += a as f64;
                        tdx += b as f64;
                    } else {
                        for q in 0..sp {
                            let v = *yb.add(q * ys[2]);
                            tdy += v as f64;
                            tdx += (v * (*xb.add(q * xs[2]) - m)) as f64;
                        }
                    }
                }
                *sdp.add(ci) = tdy;
                *sxp.add(ci) = tdx;
            };
            par_rows(c, n * c * sp, threads, channel);
        }
    }
    (sum_dy, sum_dxmu)
}

/// `Σ dy` and `Σ dy·(x − m)` of one plane in 8 independent lanes (vectorised).
#[inline(always)]
fn lanes(dy: &[f32], x: &[f32], m: f32) -> (f32, f32) {
    let (mut a, mut b) = ([0f32; 8], [0f32; 8]);
    let (mut cy, mut cx) = (dy.chunks_exact(8), x.chunks_exact(8));
    for (y8, x8) in (&mut cy).zip(&mut cx) {
        for q in 0..8 {
            a[q] += y8[q];
            b[q] += y8[q] * (x8[q] - m);
        }
    }
    let (mut ta, mut tb) = (a.iter().sum::<f32>(), b.iter().sum::<f32>());
    for (y, xv) in cy.remainder().iter().zip(cx.remainder()) {
        ta += y;
        tb += y * (xv - m);
    }
    (ta, tb)
}
