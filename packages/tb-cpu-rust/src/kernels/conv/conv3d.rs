//! 3-d convolution as im2col + packed GEMM, per image and group: the column buffer holds, for
//! every weight tap `(c, a, b, e)`, the input value each output voxel reads through it (zero in
//! the padding), so `y_g = W_g · col` is one GEMM with the bias preloaded into `y`.

use crate::core::mem::{Mem, SPtr};
use crate::kernels::gemm::{sgemm, Mat};
use crate::core::tensor::View;

/// `[sd, sh, sw, pd, ph, pw, dd, dh, dw, groups]`
pub type Params = [usize; 10];

/// # Safety
/// Every view must have been validated by its step builder against the buffers of `mem`: the
/// weight's dims 1..5 and the output's dims 2..5 laid out contiguously (up to their last stride).
pub unsafe fn conv3d(mem: &Mem, x: &View, w: &View, bias: Option<&View>, y: &View, p: &Params, threads: usize) {
    let (s, pad, dil, groups) = ([p[0], p[1], p[2]], [p[3], p[4], p[5]], [p[6], p[7], p[8]], p[9]);
    let (n, len) = (x.sizes[0], [x.sizes[2], x.sizes[3], x.sizes[4]]);
    let (oc, cg, k) = (w.sizes[0], w.sizes[1], [w.sizes[2], w.sizes[3], w.sizes[4]]);
    let out = [y.sizes[2], y.sizes[3], y.sizes[4]];
    let ocg = oc / groups;
    let vox = out[0] * out[1] * out[2];
    let taps = cg * k[0] * k[1] * k[2];
    let (px, pw, py) = (mem.ptr::<f32>(x), mem.ptr::<f32>(w), mem.ptr::<f32>(y));
    let pb = bias.map(|b| (mem.ptr::<f32>(b), b.strides[0]));
    let (xs, ws, ys) = (&x.strides, &w.strides, &y.strides);
    let one = |ni: usize, t: usize| {
        let mut col = vec![0f32; taps * vox];
        for g in 0..groups {
            let xb = px.add(ni * xs[0] + g * cg * xs[1]);
            for ci in 0..cg {
                for a in 0..k[0] {
                    for b in 0..k[1] {
                        for e in 0..k[2] {
                            let row = &mut col[(((ci * k[0] + a) * k[1] + b) * k[2] + e) * vox..][..vox];
                            let mut at = 0;
                            for od in 0..out[0] {
                                let id = (od * s[0] + a * dil[0]) as isize - pad[0] as isize;
                                for oh in 0..out[1] {
                                    let ih = (oh * s[1] + b * dil[1]) as isize - pad[1] as isize;
                                    for ow in 0..out[2] {
                                        let iw = (ow * s[2] + e * dil[2]) as isize - pad[2] as isize;
                                        let inside = id >= 0
                                            && (id as usize) < len[0]
                                            && ih >= 0
                                            && (ih as usize) < len[1]
                                            && iw >= 0
                                            && (iw as usize) < len[2];
                                        row[at] = if inside {
                                            *xb.add(ci * xs[1] + id as usize * xs[2] + ih as usize * xs[3] + iw as usize * xs[4])
                                        } else {
                                            0.0
                                        };
                                        at += 1;
                                    }
                                }
                            }
                        }
                    }
                }
            }
            let yb = py.add(ni * ys[0] + g * ocg * ys[1]);
            if let Some((bp, bs)) = pb {
                for o in 0..ocg {
                    let bv = *bp.add((g * ocg + o) * bs);
                    for v in 0..vox {
                        *yb.add(o * ys[1] + v * ys[4]) = bv;
                    }
                }
            }
            let wm = Mat { p: SPtr(pw.add(g * ocg * ws[0])), rs: ws[0] as isize, cs: ws[4] as isize };
            let cm = Mat { p: SPtr(col.as_mut_ptr()), rs: vox as isize, cs: 1 };
            let ym = Mat { p: SPtr(yb), rs: ys[1] as isize, cs: ys[4] as isize };
            sgemm(ocg, vox, taps, wm, cm, ym, 1.0, pb.is_some(), t);
        }
    };
    if n >= threads && threads > 1 {
        crate::core::par::for_each(n, |ni| one(ni, 1));
    } else {
        (0..n).for_each(|ni| one(ni, threads));
    }
}
