//! Softmax and log-softmax of one row: an online pass for the statistics, one for the output.

use crate::core::math::scalar;

/// Softmax (or log-softmax) of the `n`-element row at `x` (stride `sx`) into `y` (stride `sy`).
///
/// # Safety
/// Both rows must be valid for `n` elements at their strides, and must not overlap.
pub unsafe fn softmax_row(x: *const f32, sx: usize, y: *mut f32, sy: usize, n: usize, log: bool) {
    #[cfg(target_arch = "x86_64")]
    {
        if sx == 1 && sy == 1 {
            if crate::core::isa::has_avx512() {
                return crate::core::math::vector::softmax_row_avx512(x, y, n, log);
            }
            if crate::core::isa::has_avx2() {
                return crate::core::math::vector::softmax_row_avx2(x, y, n, log);
            }
        }
        if crate::core::isa::has_avx2() {
            return softmax_row_avx2(x, sx, y, sy, n, log);
        }
    }
    if sx == 1 && sy == 1 {
        return softmax_row_contig(std::slice::from_raw_parts(x, n), std::slice::from_raw_parts_mut(y, n), log);
    }
    softmax_row_generic(x, sx, y, sy, n, log)
}

const SM_LANES: usize = 16;
const SM_BLOCK: usize = 256;

/// One block of the online softmax statistics (block length a multiple of the lane count).
#[inline(always)]
fn sm_update(block: &[f32], m: &mut [f32; SM_LANES], s: &mut [f32; SM_LANES], nan: &mut [bool; SM_LANES]) {
    const L: usize = SM_LANES;
    let mut bm = [f32::NEG_INFINITY; L];
    for ch in block.chunks_exact(L) {
        for l in 0..L {
            let v = ch[l];
            bm[l] = if v > bm[l] { v } else { bm[l] };
            nan[l] |= v.is_nan();
        }
    }
    let mut mu = [0f32; L];
    for l in 0..L {
        let nm = if bm[l] > m[l] { bm[l] } else { m[l] };
        // an all -inf lane keeps sum 0 (exp(-inf - 0) = 0) instead of exp(-inf + inf) = NaN
        mu[l] = if nm == f32::NEG_INFINITY { 0.0 } else { nm };
        s[l] *= scalar::exp(m[l] - mu[l]);
        m[l] = nm;
    }
    for ch in block.chunks_exact(L) {
        for l in 0..L {
            s[l] += scalar::exp(ch[l] - mu[l]);
        }
    }
}

/// Softmax / log-softmax of one contiguous row. The statistics come from one online pass over
/// memory: each 256-element block (in L1 once loaded) updates 16 lane-wise running maxima and
/// rescaled sums; a second pass writes the output. Lane arrays let LLVM keep everything in
/// vector registers in the AVX-512 / AVX2 instantiations.
#[inline(always)]
pub fn softmax_row_contig(x: &[f32], y: &mut [f32], log: bool) {
    const L: usize = SM_LANES;
    let n = x.len();
    if n == 0 {
        return;
    }
    let mut m = [f32::NEG_INFINITY; L];
    let mut s = [0f32; L];
    let mut nan = [false; L];
    let full = n / SM_BLOCK * SM_BLOCK;
    for block in x[..full].chunks_exact(SM_BLOCK) {
        sm_update(block, &mut m, &mut s, &mut nan);
    }
    let rest = &x[full..];
    if !rest.is_empty() {
        let mut pad = [f32::NEG_INFINITY; SM_BLOCK];
        pad[..rest.len()].copy_from_slice(rest);
        sm_update(&pad[..rest.len().div_ceil(L) * L], &mut m, &mut s, &mut nan);
    }
    if nan.iter().any(|&b| b) {
        y.fill(f32::NAN);
        return;
    }
    let mut mx = f32::NEG_INFINITY;
    for &v in &m {
        mx = if v > mx { v } else { mx };
    }
    let mc = if mx == f32::NEG_INFINITY { 0.0 } else { mx };
    let mut sum = 0f32;
    for l in 0..L {
        sum += s[l] * scalar::exp(m[l] - mc);
    }
    if log {
        let sub = mc + sum.ln();
        for (o, &v) in y.iter_mut().zip(x) {
            *o = v - sub;
        }
    } else {
        let inv = 1.0 / sum;
        for (o, &v) in y.iter_mut().zip(x) {
            *o = scalar::exp(v - mc) * inv;
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn softmax_row_avx2(x: *const f32, sx: usize, y: *mut f32, sy: usize, n: usize, log: bool) {
    softmax_row_generic(x, sx, y, sy, n, log)
}

#[inline(always)]
unsafe fn softmax_row_generic(x: *const f32, sx: usize, y: *mut f32, sy: usize, n: usize, log: bool) {
    if n == 0 {
        return;
    }
    if sx == 1 && sy == 1 {
        let xs = std::slice::from_raw_parts(x, n);
        let ys = std::slice::from_raw_parts_mut(y, n);
        let mut m = f32::NEG_INFINITY;
        let mut nan = false;
        for &v in xs {
            m = if v > m { v } else { m };
            nan |= v.is_nan();
        }
        if nan {
            ys.fill(f32::NAN);
            return;
        }
        let m = if m == f32::NEG_INFINITY { 0.0 } else { m };
        let mut sum = 0f32;
        for (o, &v) in ys.iter_mut().zip(xs) {
            let e = scalar::exp(v - m);
            *o = e;
            sum += e;
        }
        if log {
            let l = sum.ln() + m;
            for (o, &v) in ys.iter_mut().zip(xs) {
                *o = v - l;
            }
        } else {
            let inv = 1.0 / sum;
            for o in ys.iter_mut() {
                *o *= inv;
            }
        }
        return;
    }
    let mut m = f32::NEG_INFINITY;
    let mut nan = false;
    for i in 0..n {
        let v = *x.add(i * sx);
        m = if v > m { v } else { m };
        nan |= v.is_nan();
    }
    if nan {
        for i in 0..n {
            *y.add(i * sy) = f32::NAN;
        }
        return;
    }
    let m = if m == f32::NEG_INFINITY { 0.0 } else { m };
    let mut sum = 0f32;
    for i in 0..n {
        let e = scalar::exp(*x.add(i * sx) - m);
        *y.add(i * sy) = e;
        sum += e;
    }
    let l = sum.ln() + m;
    for i in 0..n {
        *y.add(i * sy) = if log { *x.add(i * sx) - l } else { *y.add(i * sy) / sum };
    }
}

pub use steps::STEPS;

/// The step kinds of this family: softmax, log_softmax and their backward.
mod steps {
    use super::*;
    use crate::core::par::par_rows;
    use crate::core::strided::{drop_dim, offset_of};
    use crate::core::tensor::need;
    use crate::kernels::registry::{dim, f32s, kernel, Args, Built, DimParam, StepDef};

    pub const STEPS: &[StepDef] = &[StepDef::core("softmax", softmax), StepDef::core("log_softmax", softmax), StepDef::core("softmax_bwd", softmax_bwd),
        StepDef::core("log_softmax_bwd", softmax_bwd)];

    fn softmax(a: &Args) -> Built {
        let DimParam { dim: d } = a.params()?;
        let log = a.op == "log_softmax";
        let (x, y) = (a.take(0)?, a.out(0)?);
        f32s(&[&x, &y])?;
        need(x.sizes == y.sizes, "softmax shapes differ")?;
        need(x.rank() >= 1, "softmax of a 0-d tensor (view it as 1-d)")?;
        let d = dim(d, x.rank())?;
        kernel(move |mem| unsafe {
            let (px, py) = (mem.ptr::<f32>(&x), mem.ptr::<f32>(&y));
            let n = x.sizes[d];
            let (sx, sy) = (x.strides[d], y.strides[d]);
            let osz = drop_dim(&x.sizes, d);
            let (osx, osy) = (drop_dim(&x.strides, d), drop_dim(&y.strides, d));
            let rows: usize = osz.iter().product();
            let row = |r: usize| {
                let (bx, by) = (px.add(offset_of(r, &osz, &osx)), py.add(offset_of(r, &osz, &osy)));
                softmax_row(bx, sx, by, sy, n, log);
            };
            par_rows(rows, rows * n, row);
            Ok(())
        })
    }

    fn softmax_bwd(a: &Args) -> Built {
        let DimParam { dim: d } = a.params()?;
        let log = a.op == "log_softmax_bwd";
        let (g, y, gi) = (a.take(0)?, a.take(1)?, a.out(0)?);
        f32s(&[&g, &y, &gi])?;
        need(g.sizes == y.sizes && y.sizes == gi.sizes, "softmax backward shapes differ")?;
        let d = dim(d, g.rank())?;
        kernel(move |mem| unsafe {
            let (pg, py, po) = (mem.ptr::<f32>(&g), mem.ptr::<f32>(&y), mem.ptr::<f32>(&gi));
            let n = g.sizes[d];
            let st = [g.strides[d], y.strides[d], gi.strides[d]];
            let osz = drop_dim(&g.sizes, d);
            let os = [drop_dim(&g.strides, d), drop_dim(&y.strides, d), drop_dim(&gi.strides, d)];
            let rows: usize = osz.iter().product();
            par_rows(rows, rows * n, |r| {
                let bg = pg.add(offset_of(r, &osz, &os[0]));
                let by = py.add(offset_of(r, &osz, &os[1]));
                let bo = po.add(offset_of(r, &osz, &os[2]));
                let mut acc = 0f64;
                for i in 0..n {
                    let gv = *bg.add(i * st[0]);
                    acc += if log { gv as f64 } else { (gv * *by.add(i * st[1])) as f64 };
                }
                let acc = acc as f32;
                for i in 0..n {
                    let (gv, yv) = (*bg.add(i * st[0]), *by.add(i * st[1]));
                    *bo.add(i * st[2]) = if log { gv - scalar::exp(yv) * acc } else { yv * (gv - acc) };
                }
            });
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(x: &[f32], log: bool) -> Vec<f32> {
        let m = x.iter().cloned().fold(f64::NEG_INFINITY, |a, b| a.max(b as f64));
        let s: f64 = x.iter().map(|&v| (v as f64 - m).exp()).sum();
        x.iter().map(|&v| if log { (v as f64 - m - s.ln()) as f32 } else { ((v as f64 - m).exp() / s) as f32 }).collect()
    }

    #[test]
    fn online_softmax_matches_two_pass_reference() {
        for &n in &[1usize, 5, 16, 17, 255, 256, 257, 1000, 2048, 4099] {
            let x: Vec<f32> = (0..n).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.3 + (i as f32 * 0.01)).collect();
            for log in [false, true] {
                let want = reference(&x, log);
                let mut y = vec![0f32; n];
                unsafe { softmax_row(x.as_ptr(), 1, y.as_mut_ptr(), 1, n, log) };
                for (i, (a, b)) in y.iter().zip(&want).enumerate() {
                    assert!((a - b).abs() <= 1e-5 + 1e-5 * b.abs(), "n={n} log={log} [{i}] {a} vs {b}");
                }
                // the portable lane-array version (AVX2 / other CPUs)
                softmax_row_contig(&x, &mut y, log);
                for (i, (a, b)) in y.iter().zip(&want).enumerate() {
                    assert!((a - b).abs() <= 1e-5 + 1e-5 * b.abs(), "lanes n={n} log={log} [{i}] {a} vs {b}");
                }
                // strided row, generic path
                let xs: Vec<f32> = x.iter().flat_map(|&v| [v, 0.0]).collect();
                let mut ys = vec![0f32; 2 * n];
                unsafe { softmax_row(xs.as_ptr(), 2, ys.as_mut_ptr(), 2, n, log) };
                for i in 0..n {
                    assert!((ys[2 * i] - want[i]).abs() <= 1e-5 + 1e-5 * want[i].abs());
                }
            }
        }
    }

    #[test]
    fn softmax_special_values() {
        let mut y = vec![0f32; 300];
        let mut x = vec![f32::NEG_INFINITY; 300];
        x[299] = 1.0;
        unsafe { softmax_row(x.as_ptr(), 1, y.as_mut_ptr(), 1, 300, false) };
        assert_eq!(y[299], 1.0);
        assert!(y[..299].iter().all(|&v| v == 0.0));
        x[299] = f32::NEG_INFINITY;
        unsafe { softmax_row(x.as_ptr(), 1, y.as_mut_ptr(), 1, 300, false) };
        assert!(y.iter().all(|v| v.is_nan()), "all -inf row is NaN like torch");
        let mut x = [0.5f32; 40];
        x[33] = f32::NAN;
        unsafe { softmax_row(x.as_ptr(), 1, y.as_mut_ptr(), 1, 40, true) };
        assert!(y[..40].iter().all(|v| v.is_nan()));
    }
}
