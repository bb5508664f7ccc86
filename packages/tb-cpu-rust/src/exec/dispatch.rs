//! Running a prepared kernel: one match from `Kernel` variant to the kernel family that runs it.

use super::kernel::Kernel;
use crate::core::math::scalar;
use crate::core::mem::{Mem, SPtr};
use crate::core::par::par_rows;
use crate::core::strided::{drop_dim, for_each, offset_of};
use crate::core::tensor::{DType, Result, View};
use crate::kernels::gemm::{sgemm_epi, Epi, EpiOp, EpiSpec, Mat};
use crate::kernels::reduce::softmax::softmax_row;
use crate::kernels::reduce::reduce;

impl Kernel {
    pub fn run(&self, mem: &Mem) -> Result<()> {
        unsafe { self.run_unchecked(mem) }
    }

    unsafe fn run_unchecked(&self, mem: &Mem) -> Result<()> {
        let threads = crate::core::par::threads();
        match self {
            Kernel::Gemm { a, b, c, bias, res, alpha, beta, epi } => {
                let r = c.rank();
                let (m, k, n) = (a.sizes[r - 2], a.sizes[r - 1], b.sizes[r - 1]);
                let batch = if r == 3 { c.sizes[0] } else { 1 };
                let (pa, pb, pc) = (mem.ptr::<f32>(a), mem.ptr::<f32>(b), mem.ptr::<f32>(c));
                let mat = |p: SPtr<f32>, v: &View, i: usize| {
                    let off = if r == 3 { i * v.strides[0] } else { 0 };
                    Mat { p: SPtr(p.add(off)), rs: v.strides[r - 2] as isize, cs: v.strides[r - 1] as isize }
                };
                let pbias = bias.as_ref().map(|v| (mem.ptr::<f32>(v), v));
                let pres = res.as_ref().map(|v| (mem.ptr::<f32>(v), v));
                let one = |i: usize, t: usize| {
                    // bias and residual are added per output tile, inside the GEMM's store
                    let e = Epi::new(
                        pbias.map(|(p, v)| (mat(p, v, i), *beta)),
                        epi.iter().map(|s| match *s {
                            EpiSpec::Un(u) => EpiOp::Un(u),
                            EpiSpec::Residual => {
                                let (p, v) = pres.expect("checked in Kernel::new");
                                EpiOp::Add(mat(p, v, i), 1.0)
                            }
                        }),
                    );
                    sgemm_epi(m, n, k, mat(pa, a, i), mat(pb, b, i), mat(pc, c, i), *alpha, false, t, &e);
                };
                if batch > 1 && m * n * k < 256 * 256 * 256 {
                    crate::core::par::for_each(batch, |i| one(i, 1));
                } else {
                    for i in 0..batch {
                        one(i, threads);
                    }
                }
            }
            Kernel::Reduce { kind, x, out } => reduce(mem, *kind, x, out),
            Kernel::Softmax { x, y, dim, log } => {
                let (px, py) = (mem.ptr::<f32>(x), mem.ptr::<f32>(y));
                let n = x.sizes[*dim];
                let (sx, sy) = (x.strides[*dim], y.strides[*dim]);
                let osz = drop_dim(&x.sizes, *dim);
                let (osx, osy) = (drop_dim(&x.strides, *dim), drop_dim(&y.strides, *dim));
                let rows: usize = osz.iter().product();
                let row = |r: usize| {
                    let (bx, by) = (px.add(offset_of(r, &osz, &osx)), py.add(offset_of(r, &osz, &osy)));
                    softmax_row(bx, sx, by, sy, n, *log);
                };
                par_rows(rows, rows * n, row);
            }
            Kernel::SoftmaxBwd { g, y, gi, dim, log } => {
                let (pg, py, po) = (mem.ptr::<f32>(g), mem.ptr::<f32>(y), mem.ptr::<f32>(gi));
                let n = g.sizes[*dim];
                let st = [g.strides[*dim], y.strides[*dim], gi.strides[*dim]];
                let osz = drop_dim(&g.sizes, *dim);
                let os = [drop_dim(&g.strides, *dim), drop_dim(&y.strides, *dim), drop_dim(&gi.strides, *dim)];
                let rows: usize = osz.iter().product();
                par_rows(rows, rows * n, |r| {
                    let bg = pg.add(offset_of(r, &osz, &os[0]));
                    let by = py.add(offset_of(r, &osz, &os[1]));
                    let bo = po.add(offset_of(r, &osz, &os[2]));
                    let mut acc = 0f64;
                    for i in 0..n {
                        let gv = *bg.add(i * st[0]);
                        acc += if *log { gv as f64 } else { (gv * *by.add(i * st[1])) as f64 };
                    }
                    let acc = acc as f32;
                    for i in 0..n {
                        let (gv, yv) = (*bg.add(i * st[0]), *by.add(i * st[1]));
                        *bo.add(i * st[2]) = if *log { gv - scalar::exp(yv) * acc } else { yv * (gv - acc) };
                    }
                });
            }
            Kernel::LayerNorm { x, w, b, y, mean, rstd, n, eps } => {
                let (px, py, pm, pr) = (mem.ptr::<f32>(x), mem.ptr::<f32>(y), mem.ptr::<f32>(mean), mem.ptr::<f32>(rstd));
                let pw = w.as_ref().map(|v| mem.ptr::<f32>(v));
                let pb = b.as_ref().map(|v| mem.ptr::<f32>(v));
                let n = *n;
                let rows = x.numel() / n;
                par_rows(rows, x.numel(), |r| {
                    let xs = std::slice::from_raw_parts(px.add(r * n), n);
                    let ys = std::slice::from_raw_parts_mut(py.add(r * n), n);
                    let mu = xs.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
                    let var = xs.iter().map(|&v| (v as f64 - mu) * (v as f64 - mu)).sum::<f64>() / n as f64;
                    let rs = 1.0 / (var + *eps as f64).sqrt();
                    let (mu32, rs32) = (mu as f32, rs as f32);
                    for i in 0..n {
                        let mut v = (xs[i] - mu32) * rs32;
                        if let Some(pw) = pw {
                            v *= *pw.add(i);
                        }
                        if let Some(pb) = pb {
                            v += *pb.add(i);
                        }
                        ys[i] = v;
                    }
                    *pm.add(r) = mu32;
                    *pr.add(r) = rs32;
                });
            }
            Kernel::RmsNorm { x, w, y, rstd, n, eps } => {
                let (px, py, pr) = (mem.ptr::<f32>(x), mem.ptr::<f32>(y), mem.ptr::<f32>(rstd));
                let pw = w.as_ref().map(|v| mem.ptr::<f32>(v));
                let n = *n;
                let rows = x.numel() / n;
                par_rows(rows, x.numel(), |r| {
                    let xs = std::slice::from_raw_parts(px.add(r * n), n);
                    let ys = std::slice::from_raw_parts_mut(py.add(r * n), n);
                    let ms = xs.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>() / n as f64;
                    let rs = (1.0 / (ms + *eps as f64).sqrt()) as f32;
                    for i in 0..n {
                        ys[i] = xs[i] * rs * pw.map(|p| *p.add(i)).unwrap_or(1.0);
                    }
                    *pr.add(r) = rs;
                });
            }
            Kernel::Sdpa { q, k, v, mask, o, lse, causal, scale } => crate::kernels::attention::sdpa(mem, q, k, v, mask.as_ref(), o, lse, *causal, *scale),
            Kernel::Embedding { w, idx, out } => {
                let (pw, pi, po) = (mem.ptr::<f32>(w), mem.ptr::<i64>(idx), mem.ptr::<f32>(out));
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
                if let Some(i) = bad {
                    return Err(format!("embedding index {i} out of range for {rows} rows"));
                }
            }
            Kernel::Index { x, idx, out } => {
                let es = x.dtype.size();
                let (px, po) = (mem.byte_ptr(x), mem.byte_ptr(out));
                let k = idx.len();
                let ptrs: Vec<SPtr<i64>> = idx.iter().map(|v| mem.ptr::<i64>(v)).collect();
                let bshape = &idx[0].sizes;
                let nb: usize = bshape.iter().product();
                let rest = &x.sizes[k..];
                let (xrest, orest) = (&x.strides[k..], &out.strides[bshape.len()..]);
                for lin in 0..nb {
                    let mut base = 0usize;
                    for j in 0..k {
                        let raw = *ptrs[j].add(offset_of(lin, bshape, &idx[j].strides));
                        let dsz = x.sizes[j] as i64;
                        let i = if raw < 0 { raw + dsz } else { raw };
                        if i < 0 || i >= dsz {
                            return Err(format!("index {raw} is out of bounds for dimension {j} with size {dsz}"));
                        }
                        base += i as usize * x.strides[j];
                    }
                    let obase = offset_of(lin, bshape, &out.strides[..bshape.len()]);
                    for_each(rest, [xrest, orest], |[a, b]| {
                        std::ptr::copy_nonoverlapping(px.add((base + a) * es), po.add((obase + b) * es), es);
                    });
                }
            }
            Kernel::Gather { x, idx, out, dim } | Kernel::IndexSelect { x, idx, out, dim } => {
                let gather = matches!(self, Kernel::Gather { .. });
                let es = x.dtype.size();
                let (px, pi, po) = (mem.byte_ptr(x), mem.byte_ptr(idx), mem.byte_ptr(out));
                let idt = idx.dtype;
                let dsz = *x.sizes.get(*dim).unwrap_or(&1) as i64;
                let mut xs = x.strides.clone();
                let xd = xs.get(*dim).copied().unwrap_or(0);
                if !xs.is_empty() {
                    xs[*dim] = 0;
                }
                let istr: Vec<usize> = if gather {
                    idx.strides.clone()
                } else {
                    (0..out.rank()).map(|d| if d == *dim { *idx.strides.first().unwrap_or(&0) } else { 0 }).collect()
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
                if let Some(i) = bad {
                    return Err(format!("index {i} is out of bounds for dimension {dim} with size {dsz}"));
                }
            }
            Kernel::Cumsum { x, y, dim } => {
                let n = x.sizes[*dim];
                let (sx, sy) = (x.strides[*dim], y.strides[*dim]);
                let osz = drop_dim(&x.sizes, *dim);
                let (px, py) = (mem.byte_ptr(x), mem.byte_ptr(y));
                for_each(&osz, [&drop_dim(&x.strides, *dim), &drop_dim(&y.strides, *dim)], |[a, b]| {
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
            }
            Kernel::CumExtreme { x, vals, idx, dim, max } => {
                let n = x.sizes[*dim];
                let (sx, sv, si) = (x.strides[*dim], vals.strides[*dim], idx.strides[*dim]);
                let osz = drop_dim(&x.sizes, *dim);
                let (px, pv, pi) = (mem.ptr::<f32>(x), mem.ptr::<f32>(vals), mem.ptr::<i64>(idx));
                let (rx, rv, ri) = (drop_dim(&x.strides, *dim), drop_dim(&vals.strides, *dim), drop_dim(&idx.strides, *dim));
                for_each(&osz, [&rx[..], &rv[..], &ri[..]], |[a, b, c]| {
                    let (mut best, mut at) = (f32::NAN, 0i64);
                    for i in 0..n {
                        let v = *px.add(a + i * sx);
                        let better = if *max { v >= best } else { v <= best };
                        if i == 0 || v.is_nan() || !best.is_nan() && better {
                            best = v;
                            at = i as i64;
                        }
                        *pv.add(b + i * sv) = best;
                        *pi.add(c + i * si) = at;
                    }
                });
            }
            Kernel::Scan { x, y, dim, mode } => {
                let n = x.sizes[*dim];
                let (sx, sy) = (x.strides[*dim], y.strides[*dim]);
                let osz = drop_dim(&x.sizes, *dim);
                let (px, py) = (mem.ptr::<f32>(x), mem.ptr::<f32>(y));
                for_each(&osz, [&drop_dim(&x.strides, *dim), &drop_dim(&y.strides, *dim)], |[a, b]| {
                    let mut acc = if *mode == 0 { 1f64 } else { f64::NEG_INFINITY };
                    for i in 0..n {
                        let v = *px.add(a + i * sx) as f64;
                        acc = if *mode == 0 {
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
            }
            Kernel::Scatter { base, idx, src, out, dim, how, include_self } => {
                crate::kernels::indexing::scatter(mem, base, idx, src, out, *dim, *how, *include_self)?;
            }
            Kernel::IndexPut { base, values, idx, out, accumulate } => {
                crate::kernels::indexing::index_put(mem, base, values, idx, out, *accumulate)?;
            }
            Kernel::Linalg(l) => l.run(mem)?,
            Kernel::Decomp(k) => k.run(mem)?,
            Kernel::NonzeroStatic(k) => k.run(mem),
            Kernel::Search(k) => k.run(mem)?,
            Kernel::Dist(k) => k.run(mem),
            Kernel::Select(k) => k.run(mem)?,
            Kernel::Resample(k) => k.run(mem),
            Kernel::PoolBwd(k) => k.run(mem)?,
            Kernel::EmbeddingBag { w, idx, offsets, psw, out, mode, include_last, padding } => {
                crate::kernels::indexing::embedding_bag(mem, w, idx, offsets, psw.as_ref(), out, *mode, *include_last, *padding)?
            }
            Kernel::Segment(k) => k.run(mem)?,
            Kernel::CheckInfo { info, api } => {
                let p = mem.ptr::<i32>(info);
                let mut bad = 0;
                for_each(&info.sizes, [&info.strides[..]], |[a]| {
                    if bad == 0 {
                        bad = *p.add(a);
                    }
                });
                if bad != 0 {
                    return Err(format!("{api}: the factorization failed (info = {bad}): the input is singular or not positive-definite"));
                }
            }
            Kernel::MaskedScatter { base, mask, src, out } => {
                let es = out.dtype.size();
                let (pb, pm, ps, po) = (mem.byte_ptr(base), mem.byte_ptr(mask), mem.byte_ptr(src), mem.byte_ptr(out));
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
            }
            Kernel::Cast { x, y } => crate::kernels::cast::cast(mem, x, y),
            Kernel::Cplx(k) => k.run(mem),
            Kernel::Fft(k) => k.run(mem),
            Kernel::Wide(k) => k.run(mem),
            Kernel::Fill { y, value, int } => crate::kernels::cast::fill(mem, y, *value, *int),
            Kernel::Sort { x, vals, pos, dim, descending } => {
                crate::kernels::indexing::sort(mem, x, vals, pos, *dim, *descending);
            }
            Kernel::Arange { y, start, step } => {
                let p = mem.byte_ptr(y);
                for i in 0..y.sizes[0] {
                    let v = start + step * i as f64;
                    if y.dtype.is_float() {
                        crate::core::element::store_f64(p, y.dtype, i * y.strides[0], v);
                    } else {
                        crate::core::element::store_i64(p, y.dtype, i * y.strides[0], v as i64);
                    }
                }
            }
            Kernel::Conv2d { x, w, bias, y, p, epi } => crate::kernels::conv::conv2d(mem, x, w, bias.as_ref(), y, p, epi, threads),
            Kernel::ConvTranspose2d { x, w, bias, y, p } => crate::kernels::conv::conv_transpose::conv_transpose2d(mem, x, w, bias.as_ref(), y, p, threads),
            Kernel::Conv3d { x, w, bias, y, p } => crate::kernels::conv::conv3d::conv3d(mem, x, w, bias.as_ref(), y, p, threads),
            Kernel::MaxPool { x, y, idx, p } => crate::kernels::conv::max_pool(mem, x, y, idx, p),
            Kernel::AvgPool { x, y, p, include_pad, divisor } => crate::kernels::conv::avg_pool(mem, x, y, p, *include_pad, *divisor),
            Kernel::AdaptivePool { x, y, idx } => crate::kernels::conv::adaptive_pool::adaptive_pool(mem, x, y, idx.as_ref()),
            Kernel::MaxPool3d { x, y, idx, p } => crate::kernels::conv::pool3d::max_pool3d(mem, x, y, idx, p),
            Kernel::AvgPool3d { x, y, p, include_pad, divisor } => crate::kernels::conv::pool3d::avg_pool3d(mem, x, y, p, *include_pad, *divisor),
            Kernel::Nll { x, t, w, out, total, reduction, ignore } => {
                let (px, pt, po, ptot) = (mem.ptr::<f32>(x), mem.ptr::<i64>(t), mem.ptr::<f32>(out), mem.ptr::<f32>(total));
                let pw = w.as_ref().map(|v| (mem.ptr::<f32>(v), v.strides[0]));
                let (rows, c) = if x.rank() == 2 { (x.sizes[0], x.sizes[1]) } else { (1, x.sizes[0]) };
                let (rs, cs) = if x.rank() == 2 { (x.strides[0], x.strides[1]) } else { (0, x.strides[0]) };
                let ts = t.strides.first().copied().unwrap_or(0);
                let os = out.strides.first().copied().unwrap_or(0);
                let (mut sum, mut wsum) = (0f64, 0f64);
                for r in 0..rows {
                    let tv = *pt.add(r * ts);
                    let mut loss = 0f32;
                    if tv != *ignore {
                        if tv < 0 || tv as usize >= c {
                            return Err(format!("target {tv} is out of bounds for {c} classes"));
                        }
                        let wv = pw.map(|(p, s)| *p.add(tv as usize * s)).unwrap_or(1.0);
                        loss = -wv * *px.add(r * rs + tv as usize * cs);
                        wsum += wv as f64;
                    }
                    sum += loss as f64;
                    if *reduction == 0 {
                        *po.add(r * os) = loss;
                    }
                }
                match reduction {
                    1 => *po.get() = (sum / wsum) as f32,
                    2 => *po.get() = sum as f32,
                    _ => {}
                }
                *ptot.get() = if *reduction == 0 { 0.0 } else { wsum as f32 };
            }
            Kernel::NllBwd { g, x, t, w, total, gi, reduction, ignore } => {
                let (pg, pt, ptot, po) = (mem.ptr::<f32>(g), mem.ptr::<i64>(t), mem.ptr::<f32>(total), mem.ptr::<f32>(gi));
                let pw = w.as_ref().map(|v| (mem.ptr::<f32>(v), v.strides[0]));
                for_each(&gi.sizes, [&gi.strides], |[o]| *po.add(o) = 0.0);
                let (rows, c) = if x.rank() == 2 { (x.sizes[0], x.sizes[1]) } else { (1, x.sizes[0]) };
                let (rs, cs) = if gi.rank() == 2 { (gi.strides[0], gi.strides[1]) } else { (0, gi.strides[0]) };
                let ts = t.strides.first().copied().unwrap_or(0);
                let gs = g.strides.first().copied().unwrap_or(0);
                let tot = *ptot.get();
                for r in 0..rows {
                    let tv = *pt.add(r * ts);
                    if tv == *ignore {
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
            }
        }
        Ok(())
    }
}
