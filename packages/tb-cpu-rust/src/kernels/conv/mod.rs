//! Convolution as im2col + packed GEMM (bias and activation fused into the GEMM's output),
//! and max / average pooling with PyTorch's window and padding rules.
//!
//! Submodules: 3-d convolution and pooling, transposed convolution, adaptive pooling and
//! upsampling (the resampling kernels over spatial dims).

pub mod adaptive_pool;
pub mod conv3d;
pub mod conv_transpose;
pub mod pool3d;
pub mod upsample;

use crate::core::math::unary::Un;
use crate::core::mem::{Mem, SPtr};
use crate::kernels::gemm::{epilogue, sgemm, Mat};
use crate::core::tensor::View;

/// # Safety
/// Every view must have been validated by `Kernel::new` against the buffers of `mem`.
pub unsafe fn conv2d(mem: &Mem, x: &View, w: &View, bias: Option<&View>, y: &View, p: &[usize; 7], epi: &[Un], threads: usize) {
    let [sh, sw, ph, pw, dh, dw, groups] = *p;
    let (n, c, hh, ww) = (x.sizes[0], x.sizes[1], x.sizes[2], x.sizes[3]);
    let (oc, cg, kh, kw) = (w.sizes[0], w.sizes[1], w.sizes[2], w.sizes[3]);
    let (oh, ow) = (y.sizes[2], y.sizes[3]);
    let ocg = oc / groups;
    let kk = cg * kh * kw;
    let (px, pwt, py) = (mem.ptr::<f32>(x), mem.ptr::<f32>(w), mem.ptr::<f32>(y));
    let pb = bias.map(|b| (mem.ptr::<f32>(b), b.strides[0]));
    let _ = c;
    let direct = kh == 1 && kw == 1 && sh == 1 && sw == 1 && ph == 0 && pw == 0 && (x.strides[2] == ww * x.strides[3] || hh == 1);
    let one = |ni: usize, t: usize| {
        let mut col = if direct { Vec::new() } else { vec![0f32; kk * oh * ow] };
        for g in 0..groups {
            let xb = px.add(ni * x.strides[0] + g * cg * x.strides[1]);
            let colm = if direct {
                Mat { p: SPtr(xb), rs: x.strides[1] as isize, cs: x.strides[3] as isize }
            } else {
                for ci in 0..cg {
                    for a in 0..kh {
                        for bb in 0..kw {
                            let row = &mut col[((ci * kh + a) * kw + bb) * oh * ow..][..oh * ow];
                            for yo in 0..oh {
                                let ih = (yo * sh + a * dh) as isize - ph as isize;
                                for xo in 0..ow {
                                    let iw = (xo * sw + bb * dw) as isize - pw as isize;
                                    row[yo * ow + xo] = if ih >= 0 && (ih as usize) < hh && iw >= 0 && (iw as usize) < ww {
                                        *xb.add(ci * x.strides[1] + ih as usize * x.strides[2] + iw as usize * x.strides[3])
                                    } else {
                                        0.0
                                    };
                                }
                            }
                        }
                    }
                }
                Mat { p: SPtr(col.as_mut_ptr()), rs: (oh * ow) as isize, cs: 1 }
            };
            let yb = py.add(ni * y.strides[0] + g * ocg * y.strides[1]);
            let ym = Mat { p: SPtr(yb), rs: y.strides[1] as isize, cs: y.strides[3] as isize };
            if let Some((bp, bs)) = pb {
                for o in 0..ocg {
                    let bv = *bp.add((g * ocg + o) * bs);
                    for j in 0..oh * ow {
                        *yb.add(o * y.strides[1] + j * y.strides[3]) = bv;
                    }
                }
            }
            let wm = Mat { p: SPtr(pwt.add(g * ocg * w.strides[0])), rs: w.strides[0] as isize, cs: w.strides[3] as isize };
            sgemm(ocg, oh * ow, kk, wm, colm, ym, 1.0, pb.is_some(), t);
            epilogue(ocg, oh * ow, ym, epi);
        }
    };
    if n >= threads && threads > 1 {
        crate::core::par::for_each(n, |ni| one(ni, 1));
    } else {
        (0..n).for_each(|ni| one(ni, threads));
    }
}

/// # Safety
/// Every view must have been validated by `Kernel::new` against the buffers of `mem`.
pub unsafe fn max_pool(mem: &Mem, x: &View, y: &View, idx: &View, p: &[usize; 8]) {
    let [kh, kw, sh, sw, ph, pw, dh, dw] = *p;
    let (n, c, hh, ww) = (x.sizes[0], x.sizes[1], x.sizes[2], x.sizes[3]);
    let (oh, ow) = (y.sizes[2], y.sizes[3]);
    let (px, py, pi) = (mem.ptr::<f32>(x), mem.ptr::<f32>(y), mem.ptr::<i64>(idx));
    crate::core::par::for_each(n * c, |nc| {
        let (ni, ci) = (nc / c, nc % c);
        let xb = px.add(ni * x.strides[0] + ci * x.strides[1]);
        for yo in 0..oh {
            for xo in 0..ow {
                let (mut best, mut at) = (f32::NEG_INFINITY, -1i64);
                for a in 0..kh {
                    let ih = (yo * sh + a * dh) as isize - ph as isize;
                    if ih < 0 || ih as usize >= hh {
                        continue;
                    }
                    for b in 0..kw {
                        let iw = (xo * sw + b * dw) as isize - pw as isize;
                        if iw < 0 || iw as usize >= ww {
                            continue;
                        }
                        let v = *xb.add(ih as usize * x.strides[2] + iw as usize * x.strides[3]);
                        if at < 0 || v > best || v.is_nan() && !best.is_nan() {
                            best = v;
                            at = (ih as usize * ww + iw as usize) as i64;
                        }
                    }
                }
                *py.add(ni * y.strides[0] + ci * y.strides[1] + yo * y.strides[2] + xo * y.strides[3]) = best;
                *pi.add(ni * idx.strides[0] + ci * idx.strides[1] + yo * idx.strides[2] + xo * idx.strides[3]) = at.max(0);
            }
        }
    });
}

/// # Safety
/// Every view must have been validated by `Kernel::new` against the buffers of `mem`.
pub unsafe fn avg_pool(mem: &Mem, x: &View, y: &View, p: &[usize; 6], include_pad: bool, divisor: usize) {
    let [kh, kw, sh, sw, ph, pw] = *p;
    let (n, c, hh, ww) = (x.sizes[0], x.sizes[1], x.sizes[2], x.sizes[3]);
    let (oh, ow) = (y.sizes[2], y.sizes[3]);
    let (px, py) = (mem.ptr::<f32>(x), mem.ptr::<f32>(y));
    crate::core::par::for_each(n * c, |nc| {
        let (ni, ci) = (nc / c, nc % c);
        let xb = px.add(ni * x.strides[0] + ci * x.strides[1]);
        for yo in 0..oh {
            for xo in 0..ow {
                let hs = (yo * sh) as isize - ph as isize;
                let ws = (xo * sw) as isize - pw as isize;
                let he = (hs + kh as isize).min((hh + ph) as isize);
                let we = (ws + kw as isize).min((ww + pw) as isize);
                let pool = ((he - hs) * (we - ws)) as f32;
                let (hs, ws) = (hs.max(0), ws.max(0));
                let (he, we) = (he.min(hh as isize), we.min(ww as isize));
                let mut sum = 0f32;
                for ih in hs..he {
                    for iw in ws..we {
                        sum += *xb.add(ih as usize * x.strides[2] + iw as usize * x.strides[3]);
                    }
                }
                let div = if divisor > 0 {
                    divisor as f32
                } else if include_pad {
                    pool
                } else {
                    ((he - hs) * (we - ws)) as f32
                };
                *py.add(ni * y.strides[0] + ci * y.strides[1] + yo * y.strides[2] + xo * y.strides[3]) = sum / div;
            }
        }
    });
}
