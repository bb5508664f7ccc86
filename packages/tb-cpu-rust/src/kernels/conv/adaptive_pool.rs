//! Adaptive average / max pooling over the last two (or three) dimensions of an `[N, C, H, W]`
//! (or `[N, C, D, H, W]`) view:
//! output cell `(i, j)` of an `OH × OW` grid covers input rows `floor(i·H/OH) .. ceil((i+1)·H/OH)`
//! and the matching columns (PyTorch's windows, which overlap when `H` is not a multiple of
//! `OH`). Averages sum in row-major window order and divide once; max takes the first largest
//! value, or the last NaN (PyTorch's CPU kernel's rule), and reports its `h·W + w` index.

use crate::core::mem::Mem;
use crate::core::tensor::View;

/// `[start, end)` of output cell `o` of `out` cells over `len` inputs.
pub fn window(o: usize, out: usize, len: usize) -> (usize, usize) {
    (o * len / out, ((o + 1) * len).div_ceil(out))
}

/// # Safety
/// Every view must have been validated by its step builder against the buffers of `mem`
/// (`x` and `y` f32 4-d `[N, C, H, W]` or 5-d `[N, C, D, H, W]` with equal N and C, `idx` i64
/// shaped as `y` when given).
pub unsafe fn adaptive_pool(mem: &Mem, x: &View, y: &View, idx: Option<&View>) {
    // a 4-d view is a 5-d one with a depth of 1
    let deep = |v: &View| -> ([usize; 5], [usize; 5]) {
        let (s, t) = (&v.sizes, &v.strides);
        if s.len() == 5 {
            ([s[0], s[1], s[2], s[3], s[4]], [t[0], t[1], t[2], t[3], t[4]])
        } else {
            ([s[0], s[1], 1, s[2], s[3]], [t[0], t[1], 0, t[2], t[3]])
        }
    };
    let ((xsz, xs), (ysz, ys)) = (deep(x), deep(y));
    let is = idx.map(|v| deep(v).1);
    let (c, dd, hh, ww) = (xsz[1], xsz[2], xsz[3], xsz[4]);
    let (od, oh, ow) = (ysz[2], ysz[3], ysz[4]);
    let (px, py) = (mem.ptr::<f32>(x), mem.ptr::<f32>(y));
    let pi = idx.map(|v| mem.ptr::<i64>(v));
    crate::core::par::for_each(xsz[0] * c, |nc| {
        let (ni, ci) = (nc / c, nc % c);
        let xb = px.add(ni * xs[0] + ci * xs[1]);
        for k in 0..od {
            let (d0, d1) = window(k, od, dd);
            for i in 0..oh {
                let (h0, h1) = window(i, oh, hh);
                for j in 0..ow {
                    let (w0, w1) = window(j, ow, ww);
                    let at = ni * ys[0] + ci * ys[1] + k * ys[2] + i * ys[3] + j * ys[4];
                    match (pi, is) {
                        (Some(pi), Some(is)) => {
                            let (mut best, mut arg) = (f32::NEG_INFINITY, ((d0 * hh + h0) * ww + w0) as i64);
                            for d in d0..d1 {
                                for h in h0..h1 {
                                    for w in w0..w1 {
                                        let v = *xb.add(d * xs[2] + h * xs[3] + w * xs[4]);
                                        if v > best || v.is_nan() {
                                            best = v;
                                            arg = ((d * hh + h) * ww + w) as i64;
                                        }
                                    }
                                }
                            }
                            *py.add(at) = best;
                            *pi.add(ni * is[0] + ci * is[1] + k * is[2] + i * is[3] + j * is[4]) = arg;
                        }
                        _ => {
                            let mut sum = 0f32;
                            for d in d0..d1 {
                                for h in h0..h1 {
                                    for w in w0..w1 {
                                        sum += *xb.add(d * xs[2] + h * xs[3] + w * xs[4]);
                                    }
                                }
                            }
                            *py.add(at) = sum / ((d1 - d0) * (h1 - h0) * (w1 - w0)) as f32;
                        }
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
