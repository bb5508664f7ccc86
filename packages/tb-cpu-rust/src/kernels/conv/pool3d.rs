//! Max and average pooling over the last three dimensions of an `[N, C, D, H, W]` view, with
//! PyTorch's windows: window `o` of a dimension starts at `o·stride − pad`; max pooling steps
//! by `dilation` inside it and skips positions in the padding; average pooling clips the
//! window to `len + pad` for its divisor (`count_include_pad`) and to the input for its sum.

use crate::core::mem::Mem;
use crate::core::tensor::View;

/// `[kd, kh, kw, sd, sh, sw, pd, ph, pw, dd, dh, dw]`
pub type MaxParams = [usize; 12];
/// `[kd, kh, kw, sd, sh, sw, pd, ph, pw]`
pub type AvgParams = [usize; 9];

/// What both poolings read of their parameters and views: kernel, stride and padding per
/// spatial dim (the first nine parameters), the channel count, input and output lengths.
struct Window {
    k: [usize; 3],
    s: [usize; 3],
    pad: [usize; 3],
    c: usize,
    len: [usize; 3],
    out: [usize; 3],
}

impl Window {
    fn new(x: &View, y: &View, p: &[usize]) -> Window {
        Window {
            k: [p[0], p[1], p[2]],
            s: [p[3], p[4], p[5]],
            pad: [p[6], p[7], p[8]],
            c: x.sizes[1],
            len: [x.sizes[2], x.sizes[3], x.sizes[4]],
            out: [y.sizes[2], y.sizes[3], y.sizes[4]],
        }
    }
}

/// # Safety
/// Every view must have been validated by its step builder against the buffers of `mem` (`x`,
/// `y` f32 5-d with equal N and C; `idx` i64 shaped as `y`).
pub unsafe fn max_pool3d(mem: &Mem, x: &View, y: &View, idx: &View, p: &MaxParams) {
    let Window { k, s, pad, c, len, out } = Window::new(x, y, p);
    let dil = [p[9], p[10], p[11]];
    let (px, py, pi) = (mem.ptr::<f32>(x), mem.ptr::<f32>(y), mem.ptr::<i64>(idx));
    let (xs, ys, is) = (&x.strides, &y.strides, &idx.strides);
    crate::core::par::for_each(x.sizes[0] * c, |nc| {
        let (ni, ci) = (nc / c, nc % c);
        let xb = px.add(ni * xs[0] + ci * xs[1]);
        for od in 0..out[0] {
            for oh in 0..out[1] {
                for ow in 0..out[2] {
                    let (mut best, mut at) = (f32::NEG_INFINITY, -1i64);
                    for a in 0..k[0] {
                        let id = (od * s[0] + a * dil[0]) as isize - pad[0] as isize;
                        if id < 0 || id as usize >= len[0] {
                            continue;
                        }
                        for b in 0..k[1] {
                            let ih = (oh * s[1] + b * dil[1]) as isize - pad[1] as isize;
                            if ih < 0 || ih as usize >= len[1] {
                                continue;
                            }
                            for e in 0..k[2] {
                                let iw = (ow * s[2] + e * dil[2]) as isize - pad[2] as isize;
                                if iw < 0 || iw as usize >= len[2] {
                                    continue;
                                }
                                let (id, ih, iw) = (id as usize, ih as usize, iw as usize);
                                let v = *xb.add(id * xs[2] + ih * xs[3] + iw * xs[4]);
                                if at < 0 || v > best || v.is_nan() {
                                    best = v;
                                    at = ((id * len[1] + ih) * len[2] + iw) as i64;
                                }
                            }
                        }
                    }
                    *py.add(ni * ys[0] + ci * ys[1] + od * ys[2] + oh * ys[3] + ow * ys[4]) = best;
                    *pi.add(ni * is[0] + ci * is[1] + od * is[2] + oh * is[3] + ow * is[4]) = at.max(0);
                }
            }
        }
    });
}

/// # Safety
/// As `max_pool3d`, without indices.
pub unsafe fn avg_pool3d(mem: &Mem, x: &View, y: &View, p: &AvgParams, include_pad: bool, divisor: usize) {
    let Window { k, s, pad, c, len, out } = Window::new(x, y, p);
    let (px, py) = (mem.ptr::<f32>(x), mem.ptr::<f32>(y));
    let (xs, ys) = (&x.strides, &y.strides);
    // (clipped to the input, length within input + padding) of window `o` along dimension `d`
    let span = |d: usize, o: usize| -> ((usize, usize), isize) {
        let st = (o * s[d]) as isize - pad[d] as isize;
        let en = (st + k[d] as isize).min((len[d] + pad[d]) as isize);
        let padded = en - st;
        ((st.max(0) as usize, en.min(len[d] as isize).max(0) as usize), padded)
    };
    crate::core::par::for_each(x.sizes[0] * c, |nc| {
        let (ni, ci) = (nc / c, nc % c);
        let xb = px.add(ni * xs[0] + ci * xs[1]);
        for od in 0..out[0] {
            let ((d0, d1), pd) = span(0, od);
            for oh in 0..out[1] {
                let ((h0, h1), ph) = span(1, oh);
                for ow in 0..out[2] {
                    let ((w0, w1), pw) = span(2, ow);
                    let mut sum = 0f32;
                    for id in d0..d1 {
                        for ih in h0..h1 {
                            for iw in w0..w1 {
                                sum += *xb.add(id * xs[2] + ih * xs[3] + iw * xs[4]);
                            }
                        }
                    }
                    let inside = (d1.saturating_sub(d0) * h1.saturating_sub(h0) * w1.saturating_sub(w0)) as f32;
                    let div = if divisor > 0 {
                        divisor as f32
                    } else if include_pad {
                        (pd * ph * pw) as f32
                    } else {
                        inside
                    };
                    *py.add(ni * ys[0] + ci * ys[1] + od * ys[2] + oh * ys[3] + ow * ys[4]) = sum / div;
                }
            }
        }
    });
}
