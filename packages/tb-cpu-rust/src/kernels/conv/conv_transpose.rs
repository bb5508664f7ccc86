//! Transposed 2-d convolution (`ConvTranspose2d`, the gradient of a convolution with respect to
//! its input) as one packed GEMM per image and group into a column buffer, then col2im: every
//! column entry is added to the output pixel it lands on.
//!
//! For input `x [N, C, H, W]`, weight `w [C, OC/g, kh, kw]`, `y [N, OC, OH, OW]`:
//! `y[n, o, iy·sh − ph + a·dh, ix·sw − pw + b·dw] += Σ_c x[n, c, iy, ix] · w[c, o, a, b]`,
//! `OH = (H − 1)·sh − 2·ph + dh·(kh − 1) + out_pad_h + 1`.

use crate::core::mem::{Mem, SPtr};
use crate::kernels::gemm::{sgemm, Mat};
use crate::core::tensor::View;

/// `[sh, sw, ph, pw, dh, dw, groups]`
pub type Params = [usize; 7];

/// The output height (or width) PyTorch gives a transposed convolution; None when not positive.
pub fn out_len(len: usize, stride: usize, pad: usize, dil: usize, k: usize, out_pad: usize) -> Option<usize> {
    let v = (len as isize - 1) * stride as isize - 2 * pad as isize + (dil * (k - 1) + out_pad + 1) as isize;
    (v > 0).then_some(v as usize)
}

/// # Safety
/// Every view must have been validated by its step builder against the buffers of `mem`; the
/// weight's dims 1..4 must be laid out contiguously (`w.strides[1] = kh·kw·w.strides[3]`).
pub unsafe fn conv_transpose2d(mem: &Mem, x: &View, w: &View, bias: Option<&View>, y: &View, p: &Params, threads: usize) {
    let [sh, sw, ph, pw, dh, dw, groups] = *p;
    let (n, hh, ww) = (x.sizes[0], x.sizes[2], x.sizes[3]);
    let (cg, ocg, kh, kw) = (w.sizes[0] / groups, w.sizes[1], w.sizes[2], w.sizes[3]);
    let (oh, ow) = (y.sizes[2], y.sizes[3]);
    let rows = ocg * kh * kw;
    let pix = hh * ww;
    let (px, pwt, py) = (mem.ptr::<f32>(x), mem.ptr::<f32>(w), mem.ptr::<f32>(y));
    let pb = bias.map(|b| (mem.ptr::<f32>(b), b.strides[0]));
    let (xs, ys) = (&x.strides, &y.strides);
    let x_rows_plain = xs[2] == ww * xs[3] || hh == 1;
    let one = |ni: usize, t: usize| {
        let mut cols = vec![0f32; rows * pix];
        let mut xcopy = if x_rows_plain { Vec::new() } else { vec![0f32; cg * pix] };
        for g in 0..groups {
            let xb = px.add(ni * xs[0] + g * cg * xs[1]);
            let xm = if x_rows_plain {
                Mat { p: SPtr(xb), rs: xs[1] as isize, cs: xs[3] as isize }
            } else {
                for ci in 0..cg {
                    for iy in 0..hh {
                        for ix in 0..ww {
                            xcopy[ci * pix + iy * ww + ix] = *xb.add(ci * xs[1] + iy * xs[2] + ix * xs[3]);
                        }
                    }
                }
                Mat { p: SPtr(xcopy.as_mut_ptr()), rs: pix as isize, cs: 1 }
            };
            // cols[(o, a, b), pixel] = Σ_c w[c, o, a, b] · x[c, pixel]: A = w_gᵀ, rows (o, a, b)
            let wm = Mat { p: SPtr(pwt.add(g * cg * w.strides[0])), rs: w.strides[3] as isize, cs: w.strides[0] as isize };
            let cm = Mat { p: SPtr(cols.as_mut_ptr()), rs: pix as isize, cs: 1 };
            sgemm(rows, pix, cg, wm, xm, cm, 1.0, false, t);
            let yb = py.add(ni * ys[0] + g * ocg * ys[1]);
            for o in 0..ocg {
                let yo = yb.add(o * ys[1]);
                let init = pb.map_or(0.0, |(bp, bs)| *bp.add((g * ocg + o) * bs));
                for r in 0..oh {
                    for c in 0..ow {
                        *yo.add(r * ys[2] + c * ys[3]) = init;
                    }
                }
                for a in 0..kh {
                    for b in 0..kw {
                        let col = &cols[((o * kh + a) * kw + b) * pix..][..pix];
                        for iy in 0..hh {
                            let oy = (iy * sh + a * dh) as isize - ph as isize;
                            if oy < 0 || oy as usize >= oh {
                                continue;
                            }
                            let yrow = yo.add(oy as usize * ys[2]);
                            for ix in 0..ww {
                                let ox = (ix * sw + b * dw) as isize - pw as isize;
                                if ox >= 0 && (ox as usize) < ow {
                                    *yrow.add(ox as usize * ys[3]) += col[iy * ww + ix];
                                }
                            }
                        }
                    }
                }
            }
        }
    };
    if n >= threads && threads > 1 {
        crate::core::par::for_each(n, |ni| one(ni, 1));
    } else {
        (0..n).for_each(|ni| one(ni, threads));
    }
}

#[cfg(test)]
mod tests {
    use super::out_len;

    #[test]
    fn output_length_follows_pytorch() {
        assert_eq!(out_len(5, 2, 1, 1, 3, 1), Some(10)); // (5-1)*2 - 2 + 2 + 1 + 1
        assert_eq!(out_len(1, 1, 0, 1, 1, 0), Some(1));
        assert_eq!(out_len(1, 1, 1, 1, 1, 0), None);
    }
}
