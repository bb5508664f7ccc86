//! Adaptive average / max pooling over the last two dimensions of an `[N, C, H, W]` view:
//! output cell `(i, j)` of an `OH × OW` grid covers input rows `floor(i·H/OH) .. ceil((i+1)·H/OH)`
//! and the matching columns (PyTorch's windows, which overlap when `H` is not a multiple of
//! `OH`). Averages sum in row-major window order and divide once; max takes the first largest
//! value, or the last NaN (PyTorch's CPU kernel's rule), and reports its `h·W + w` index.

use crate::exec::Mem;
use crate::tensor::View;
use rayon::prelude::*;

/// `[start, end)` of output cell `o` of `out` cells over `len` inputs.
pub fn window(o: usize, out: usize, len: usize) -> (usize, usize) {
    (o * len / out, ((o + 1) * len).div_ceil(out))
}

/// # Safety
/// Every view must have been validated by `Kernel::new` against the buffers of `mem`
/// (`x` and `y` f32 4-d with equal N and C, `idx` i64 shaped as `y` when given).
pub unsafe fn adaptive_pool(mem: &Mem, x: &View, y: &View, idx: Option<&View>) {
    let (n, c, hh, ww) = (x.sizes[0], x.sizes[1], x.sizes[2], x.sizes[3]);
    let (oh, ow) = (y.sizes[2], y.sizes[3]);
    let (px, py) = (mem.ptr::<f32>(x), mem.ptr::<f32>(y));
    let pi = idx.map(|v| mem.ptr::<i64>(v));
    let (xs, ys) = (&x.strides, &y.strides);
    (0..n * c).into_par_iter().for_each(|nc| {
        let (ni, ci) = (nc / c, nc % c);
        let xb = px.add(ni * xs[0] + ci * xs[1]);
        for i in 0..oh {
            let (h0, h1) = window(i, oh, hh);
            for j in 0..ow {
                let (w0, w1) = window(j, ow, ww);
                let at = ni * ys[0] + ci * ys[1] + i * ys[2] + j * ys[3];
                match (pi, idx) {
                    (Some(pi), Some(iv)) => {
                        let (mut best, mut arg) = (f32::NEG_INFINITY, (h0 * ww + w0) as i64);
                        for h in h0..h1 {
                            for w in w0..w1 {
                                let v = *xb.add(h * xs[2] + w * xs[3]);
                                if v > best || v.is_nan() {
                                    best = v;
                                    arg = (h * ww + w) as i64;
                                }
                            }
                        }
                        *py.add(at) = best;
                        let is = &iv.strides;
                        *pi.add(ni * is[0] + ci * is[1] + i * is[2] + j * is[3]) = arg;
                    }
                    _ => {
                        let mut sum = 0f32;
                        for h in h0..h1 {
                            for w in w0..w1 {
                                sum += *xb.add(h * xs[2] + w * xs[3]);
                            }
                        }
                        *py.add(at) = sum / ((h1 - h0) * (w1 - w0)) as f32;
                    }
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::window;

    #[test]
    fn windows_cover_the_input_and_overlap_only_when_uneven() {
        for len in 1..20 {
            for out in 1..=len {
                assert_eq!(window(0, out, len).0, 0);
                assert_eq!(window(out - 1, out, len).1, len);
                for o in 0..out {
                    let (s, e) = window(o, out, len);
                    assert!(s < e && e <= len);
                    if len % out == 0 {
                        assert_eq!(e - s, len / out);
                    }
                }
            }
        }
        assert_eq!(window(1, 3, 7), (2, 5));
    }
}
