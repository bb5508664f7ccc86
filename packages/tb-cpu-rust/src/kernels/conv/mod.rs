//! Convolution and max / average pooling with PyTorch's window and padding rules.
//!
//! Submodules: 2-d convolution (`conv2d`: Winograd F(2×2, 3×3) for 3×3 stride-1 layers
//! (`winograd`), im2col + packed GEMM, a direct depthwise kernel,
//! channels-last without a layout copy; bias, a folded inference batch norm, activations and a
//! residual add fused into its epilogue; its backward in `conv2d_backward`), 3-d convolution and pooling, transposed convolution,
//! adaptive pooling and upsampling (the resampling kernels over spatial dims).

pub mod adaptive_pool;
pub mod conv2d;
pub mod conv2d_backward;
pub mod conv3d;
pub mod conv_transpose;
#[cfg(target_arch = "x86_64")]
mod depthwise_vector;
#[cfg(target_arch = "x86_64")]
mod gemm_pairs;
pub mod pool3d;
pub mod upsample;
#[cfg(target_arch = "x86_64")]
mod winograd;
#[cfg(target_arch = "x86_64")]
mod winograd_pairs;

use crate::core::mem::Mem;
use crate::core::tensor::View;

/// The output length of one dimension of a convolution (2-d or 3-d), or None when the dilated
/// kernel does not fit.
pub fn out_len(len: usize, k: usize, stride: usize, pad: usize, dil: usize) -> Option<usize> {
    (len + 2 * pad).checked_sub(dil * (k - 1) + 1).map(|e| e / stride + 1)
}

/// # Safety
/// Every view must have been validated by its step builder against the buffers of `mem`.
pub unsafe fn max_pool(mem: &Mem, x: &View, y: &View, idx: &View, p: &[usize; 8], write_idx: bool) {
    let [kh, kw, sh, sw, ph, pw, dh, dw] = *p;
    let (n, c, hh, ww) = (x.sizes[0], x.sizes[1], x.sizes[2], x.sizes[3]);
    let (oh, ow) = (y.sizes[2], y.sizes[3]);
    let (px, py, pi) = (mem.ptr::<f32>(x), mem.ptr::<f32>(y), mem.ptr::<i64>(idx));
    // every window inside the input: no bounds tests (the CNNs' 2×2 / 3×3 pools without padding)
    let inside = ph == 0 && pw == 0 && oh > 0 && ow > 0 && (oh - 1) * sh + (kh - 1) * dh < hh && (ow - 1) * sw + (kw - 1) * dw < ww;
    crate::core::par::for_each(n * c, |nc| {
        let (ni, ci) = (nc / c, nc % c);
        let xb = px.add(ni * x.strides[0] + ci * x.strides[1]);
        if inside {
            let yb = py.add(ni * y.strides[0] + ci * y.strides[1]);
            let ib = if write_idx { pi.add(ni * idx.strides[0] + ci * idx.strides[1]) } else { std::ptr::null_mut() };
            let pl = PoolPlane { xb, xs: [x.strides[2], x.strides[3]], ww, yb, ys: [y.strides[2], y.strides[3]], ib, is: [idx.strides[2], idx.strides[3]], oh, ow, sh, dh, dw };
            #[cfg(target_arch = "x86_64")]
            if pool_2x2::takes(&pl, [kh, kw, sh, sw]) {
                pool_2x2::plane(&pl);
                return;
            }
            // constant windows for the common pools, so the compiler unrolls and vectorises them
            match (kh, kw, sw) {
                (2, 2, 2) => max_pool_plane(&pl, 2, 2, 2),
                (3, 3, 2) => max_pool_plane(&pl, 3, 3, 2),
                (3, 3, 1) => max_pool_plane(&pl, 3, 3, 1),
                _ => max_pool_plane(&pl, kh, kw, sw),
            }
            return;
        }
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

/// One plane of a max pooling whose windows all lie inside the input (`ib` null: no indices).
#[derive(Clone, Copy)]
struct PoolPlane {
    xb: *mut f32,
    xs: [usize; 2],
    ww: usize,
    yb: *mut f32,
    ys: [usize; 2],
    ib: *mut i64,
    is: [usize; 2],
    oh: usize,
    ow: usize,
    sh: usize,
    dh: usize,
    dw: usize,
}

/// The 2 × 2, stride-2 max pool (every CNN's downsampling) on AVX-512: 16 outputs of a row a
/// time from two input rows, the even and odd columns separated by one permute each, the four
/// candidates compared in window order under the scalar path's rules (ties keep the first
/// maximum, the first NaN wins); indices from the winning candidate's number.
#[cfg(target_arch = "x86_64")]
mod pool_2x2 {
    use super::PoolPlane;
    use crate::core::math::vector::lanes;
    use std::arch::x86_64::*;

    /// The plane is a 2 × 2 stride-2 pool with unit dilation, its rows contiguous (input,
    /// output and indices), on a CPU with AVX-512, and small enough for 32-bit offsets.
    pub fn takes(p: &PoolPlane, [kh, kw, sh, sw]: [usize; 4]) -> bool {
        [kh, kw, sh, sw, p.dh, p.dw] == [2, 2, 2, 2, 1, 1]
            && p.xs[1] == 1
            && p.ys[1] == 1
            && (p.ib.is_null() || p.is[1] == 1)
            && p.ww < 1 << 29
            && crate::core::isa::has_avx512()
    }

    /// # Safety
    /// `takes(p, ..)` holds and the plane's windows all lie inside its input.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn plane(p: &PoolPlane) {
        let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        let odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
        let ww = _mm512_set1_epi32(p.ww as i32);
        for yo in 0..p.oh {
            let h0 = 2 * yo;
            let (r0, r1) = (p.xb.add(h0 * p.xs[0]) as *const f32, p.xb.add((h0 + 1) * p.xs[0]) as *const f32);
            let y = p.yb.add(yo * p.ys[0]);
            let mut xo = 0;
            while xo < p.ow {
                let r = (p.ow - xo).min(16);
                let (ka, kb) = (lanes(2 * r), lanes((2 * r).saturating_sub(16)));
                let at = 2 * xo;
                let (a0, b0) = (_mm512_maskz_loadu_ps(ka, r0.add(at)), _mm512_maskz_loadu_ps(kb, r0.add(at + 16)));
                let (a1, b1) = (_mm512_maskz_loadu_ps(ka, r1.add(at)), _mm512_maskz_loadu_ps(kb, r1.add(at + 16)));
                let cands = [
                    _mm512_permutex2var_ps(a0, odd, b0),
                    _mm512_permutex2var_ps(a1, even, b1),
                    _mm512_permutex2var_ps(a1, odd, b1),
                ];
                let mut best = _mm512_permutex2var_ps(a0, even, b0);
                let mut code = _mm512_setzero_si512();
                for (k, c) in cands.into_iter().enumerate() {
                    let better = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(c, best)
                        | (_mm512_cmp_ps_mask::<_CMP_UNORD_Q>(c, c) & _mm512_cmp_ps_mask::<_CMP_ORD_Q>(best, best));
                    best = _mm512_mask_mov_ps(best, better, c);
                    code = _mm512_mask_mov_epi32(code, better, _mm512_set1_epi32(k as i32 + 1));
                }
                let kr = lanes(r);
                _mm512_mask_storeu_ps(y.add(xo), kr, best);
                if !p.ib.is_null() {
                    // index = (h0 + code / 2) · ww + 2 (xo + lane) + code % 2
                    let off = _mm512_add_epi32(
                        _mm512_add_epi32(_mm512_mullo_epi32(_mm512_srli_epi32::<1>(code), ww), even),
                        _mm512_and_si512(code, _mm512_set1_epi32(1)),
                    );
                    let base = _mm512_set1_epi64((h0 * p.ww + at) as i64);
                    let lo = _mm512_add_epi64(base, _mm512_cvtepi32_epi64(_mm512_castsi512_si256(off)));
                    let hi = _mm512_add_epi64(base, _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64::<1>(off)));
                    let ib = p.ib.add(yo * p.is[0] + xo);
                    _mm512_mask_storeu_epi64(ib, kr as __mmask8, lo);
                    _mm512_mask_storeu_epi64(ib.add(8), (kr >> 8) as __mmask8, hi);
                }
                xo += r;
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::super::{max_pool_plane, PoolPlane};
        use super::*;

        /// Against the scalar plane: widths around the 16-output blocks (odd ones drop the last
        /// column), padded row strides, NaN / inf / ties, with and without indices.
        #[test]
        fn matches_the_scalar_plane() {
            if !crate::core::isa::has_avx512() {
                return;
            }
            let mut seed = 7u64;
            let mut rnd = move || {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (seed >> 40) as u32
            };
            for ww in [2usize, 3, 16, 17, 30, 31, 32, 33, 34, 63, 64, 65, 100] {
                for hh in [2usize, 3, 5] {
                    let xs = ww + 3;
                    let mut x: Vec<f32> = (0..hh * xs)
                        .map(|_| match rnd() % 16 {
                            0 => f32::NAN,
                            1 => f32::INFINITY,
                            2 => f32::NEG_INFINITY,
                            3 | 4 => 1.0, // ties
                            v => v as f32 - 8.5,
                        })
                        .collect();
                    let (oh, ow) = (hh / 2, ww / 2);
                    let mut want = (vec![0f32; oh * ow], vec![0i64; oh * ow]);
                    let mut got = (vec![0f32; oh * ow], vec![0i64; oh * ow]);
                    for with_idx in [true, false] {
                        let make = |y: &mut Vec<f32>, i: &mut Vec<i64>, x: &mut Vec<f32>| PoolPlane {
                            xb: x.as_mut_ptr(),
                            xs: [xs, 1],
                            ww,
                            yb: y.as_mut_ptr(),
                            ys: [ow, 1],
                            ib: if with_idx { i.as_mut_ptr() } else { std::ptr::null_mut() },
                            is: [ow, 1],
                            oh,
                            ow,
                            sh: 2,
                            dh: 1,
                            dw: 1,
                        };
                        let pw = make(&mut want.0, &mut want.1, &mut x);
                        let pg = make(&mut got.0, &mut got.1, &mut x);
                        assert!(takes(&pg, [2, 2, 2, 2]));
                        unsafe {
                            max_pool_plane(&pw, 2, 2, 2);
                            plane(&pg);
                        }
                        for k in 0..oh * ow {
                            let (a, b) = (want.0[k], got.0[k]);
                            assert!(a == b || a.is_nan() && b.is_nan(), "ww={ww} hh={hh} [{k}]: {b} vs {a}");
                            if with_idx {
                                assert_eq!(want.1[k], got.1[k], "ww={ww} hh={hh} index [{k}]");
                            }
                        }
                    }
                    x.clear();
                }
            }
        }
    }
}

/// Q outputs of a row at a time: their compare-and-select chains are independent, and without
/// a branch (on random data one mispredicts half the time). Ties keep the first maximum, the
/// first NaN wins (the slow path's rules).
#[inline(always)]
unsafe fn max_pool_plane(p: &PoolPlane, kh: usize, kw: usize, sw: usize) {
    const Q: usize = 8;
    let PoolPlane { xb, xs: [xs2, xs3], ww, yb, ys, ib, is, oh, ow, sh, dh, dw } = *p;
    for yo in 0..oh {
        let h0 = yo * sh;
        let mut xo = 0;
        while xo < ow {
            let q_n = Q.min(ow - xo);
            let (mut best, mut at) = ([0f32; Q], [0usize; Q]);
            for q in 0..Q {
                let w0 = (xo + q.min(q_n - 1)) * sw;
                best[q] = *xb.add(h0 * xs2 + w0 * xs3);
                at[q] = h0 * ww + w0;
            }
            for a in 0..kh {
                let h = h0 + a * dh;
                let row = xb.add(h * xs2);
                for b in 0..kw {
                    for q in 0..Q {
                        // past the row's end (a last partial block) the last output is recomputed
                        let w = (xo + q.min(q_n - 1)) * sw + b * dw;
                        let v = *row.add(w * xs3);
                        let better = (v > best[q]) | (v.is_nan() & !best[q].is_nan());
                        best[q] = if better { v } else { best[q] };
                        at[q] = if better { h * ww + w } else { at[q] };
                    }
                }
            }
            for q in 0..q_n {
                *yb.add(yo * ys[0] + (xo + q) * ys[1]) = best[q];
                if !ib.is_null() {
                    *ib.add(yo * is[0] + (xo + q) * is[1]) = at[q] as i64;
                }
            }
            xo += q_n;
        }
    }
}

/// # Safety
/// Every view must have been validated by its step builder against the buffers of `mem`.
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

pub use steps::STEPS;

/// The step kinds of this family: 2-d and 3-d convolution, transposed 2-d convolution, max and
/// average pooling (2-d, 3-d) and adaptive pooling.
mod steps {
    use super::*;
    use crate::core::tensor::{need, DType, Result};
    use crate::kernels::registry::{f32s, infallible, uint, uints, Args, Built, StepDef};
    use serde::Deserialize;

    pub const STEPS: &[StepDef] = &[StepDef::core("conv2d", conv2d_step), StepDef::core("conv3d", conv3d_step),
        StepDef::core("conv_transpose2d", conv_transpose2d_step), StepDef::core("max_pool2d", pool2d), StepDef::core("avg_pool2d", pool2d),
        StepDef::core("max_pool3d", pool3d_step), StepDef::core("avg_pool3d", pool3d_step), StepDef::core("adaptive_avg_pool2d", adaptive),
        StepDef::core("adaptive_max_pool2d", adaptive), StepDef::core("adaptive_avg_pool3d", adaptive),
        StepDef::core("adaptive_max_pool3d", adaptive), StepDef::core("adaptive_avg_pool2d_bwd", adaptive_avg_pool2d_bwd),
        StepDef::core("conv2d_backward", conv2d_backward_step)];

    crate::step_params!(struct ConvParams { stride: Vec<i64>, padding: Vec<i64>, dilation: Vec<i64>, groups: i64 });

    crate::step_params!(struct Conv2dParams { stride: Vec<i64>, padding: Vec<i64>, dilation: Vec<i64>, groups: i64, epilogue: Vec<String>, eps: f64, pool: Option<i64>, bf16: Option<bool> });

    /// operands: x, weight, bias?, res? (the residual the epilogue's add reads), and a folded
    /// inference batch norm's weight?, bias?, mean?, var? (mean and var both or neither);
    /// `bf16`: the model computes it in bfloat16 (the lowering saw bfloat16 input and weights
    /// widened), so its Winograd path may multiply bfloat16 values (`winograd_pairs`)
    fn conv2d_step(a: &Args) -> Built {
        let Conv2dParams { stride, padding, dilation, groups, epilogue, eps, pool, bf16 } = a.params()?;
        let pool = pool.unwrap_or(0);
        // the model computes this convolution in bfloat16: products of bfloat16 values allowed
        let bf16 = bf16.unwrap_or(false);
        let (x, w, y) = (a.take(0)?, a.take(1)?, a.out(0)?);
        let (bias, res) = (a.opt(2), a.opt(3));
        f32s(&[&x, &w, &y])?;
        need(x.rank() == 4 && w.rank() == 4 && y.rank() == 4, "conv2d takes 4-d tensors")?;
        let ([sh, sw], [ph, pw], [dh, dw]) = (uints(&stride, "stride")?, uints(&padding, "padding")?, uints(&dilation, "dilation")?);
        let g = uint(groups, "groups")?;
        need(sh > 0 && sw > 0 && dh > 0 && dw > 0 && g > 0, "conv2d stride/dilation/groups must be positive")?;
        let (n, c, hh, ww) = (x.sizes[0], x.sizes[1], x.sizes[2], x.sizes[3]);
        let (oc, cg, kh, kw) = (w.sizes[0], w.sizes[1], w.sizes[2], w.sizes[3]);
        need(c == cg * g && oc % g == 0 && kh > 0 && kw > 0, "conv2d channel counts")?;
        let oh = out_len(hh, kh, sh, ph, dh).ok_or("conv2d kernel larger than input")?;
        let ow = out_len(ww, kw, sw, pw, dw).ok_or("conv2d kernel larger than input")?;
        need(pool == 0 || pool == 2, "conv2d pool is 0 (none) or 2 (a 2×2 stride-2 max pool of the result)")?;
        let (yh, yw) = if pool == 2 { (oh / 2, ow / 2) } else { (oh, ow) };
        need(y.sizes == [n, oc, yh, yw], "conv2d output shape")?;
        need(y.strides[2] == yw * y.strides[3] || yh == 1, "conv2d output layout")?;
        if let Some(b) = &bias {
            need(b.sizes == [oc] && b.dtype == DType::F32, "conv2d bias shape")?;
        }
        let ops = epilogue.iter().map(|e| conv2d::epilogue_op(e)).collect::<Result<Vec<_>>>()?;
        // the max commutes with a per-channel shift and with relu / clamp, not with the rest
        let monotone = |e: &crate::kernels::gemm::EpiSpec| {
            matches!(e, crate::kernels::gemm::EpiSpec::Un(crate::core::math::unary::Un::Relu | crate::core::math::unary::Un::Clamp(..)))
        };
        need(pool == 0 || (res.is_none() && ops.iter().all(monotone)), "conv2d pool with a residual or a non-monotone epilogue")?;
        need(ops.len() <= crate::kernels::gemm::MAX_EPI, "too many conv2d epilogue steps")?;
        let adds = ops.iter().filter(|e| **e == crate::kernels::gemm::EpiSpec::Residual).count();
        need(adds == usize::from(res.is_some()), "conv2d residual operand and epilogue disagree")?;
        if let Some(r) = &res {
            f32s(&[r])?;
            need(r.sizes == y.sizes, "conv2d residual shape")?;
        }
        let chan = |i: usize| -> Result<Option<View>> {
            let v = a.opt(i);
            if let Some(v) = &v {
                f32s(&[v])?;
                need(v.sizes == [oc], "conv2d batch norm operands are (out_channels,)")?;
            }
            Ok(v)
        };
        let (bn_w, bn_b, mean, var) = (chan(4)?, chan(5)?, chan(6)?, chan(7)?);
        let bn = match (mean, var) {
            (Some(mean), Some(var)) => Some(conv2d::FoldedBn { weight: bn_w, bias: bn_b, mean, var, eps: eps as f32 }),
            (None, None) => {
                need(bn_w.is_none() && bn_b.is_none(), "conv2d batch norm weight without its statistics")?;
                None
            }
            _ => return Err("conv2d batch norm needs both mean and var".into()),
        };
        let geom = conv2d::Geom { sh, sw, ph, pw, dh, dw, groups: g };
        infallible(move |mem| unsafe {
            conv2d::conv2d(mem, &x, &w, bias.as_ref(), bn.as_ref(), res.as_ref(), &y, geom, &ops, crate::core::par::threads(), conv2d::path(), pool == 2, bf16)
        })
    }

    crate::step_params!(struct Conv2dBackwardParams { stride: Vec<i64>, padding: Vec<i64>, dilation: Vec<i64>, groups: i64, mask: Vec<i64> });

    /// operands: grad_out, x, weight; results: the gradients `mask` (input, weight, bias: 1 or 0)
    /// asks for, in that order, shaped as x, weight and (out_channels,)
    fn conv2d_backward_step(a: &Args) -> Built {
        let Conv2dBackwardParams { stride, padding, dilation, groups, mask } = a.params()?;
        let (gy, x, w) = (a.take(0)?, a.take(1)?, a.take(2)?);
        f32s(&[&gy, &x, &w])?;
        need(gy.rank() == 4 && x.rank() == 4 && w.rank() == 4, "conv2d_backward takes 4-d tensors")?;
        let ([sh, sw], [ph, pw], [dh, dw]) = (uints(&stride, "stride")?, uints(&padding, "padding")?, uints(&dilation, "dilation")?);
        let g = uint(groups, "groups")?;
        need(sh > 0 && sw > 0 && dh > 0 && dw > 0 && g > 0, "conv2d_backward stride/dilation/groups must be positive")?;
        let (n, c, hh, ww) = (x.sizes[0], x.sizes[1], x.sizes[2], x.sizes[3]);
        let (oc, cg, kh, kw) = (w.sizes[0], w.sizes[1], w.sizes[2], w.sizes[3]);
        need(c == cg * g && oc % g == 0 && kh > 0 && kw > 0 && cg > 0, "conv2d_backward channel counts")?;
        let oh = out_len(hh, kh, sh, ph, dh).ok_or("conv2d_backward kernel larger than input")?;
        let ow = out_len(ww, kw, sw, pw, dw).ok_or("conv2d_backward kernel larger than input")?;
        need(gy.sizes == [n, oc, oh, ow], "conv2d_backward grad_output shape")?;
        need(mask.len() == 3 && mask.iter().all(|&m| m == 0 || m == 1), "conv2d_backward mask is three 0 / 1 flags")?;
        let mut next = 0;
        let mut grad = |want: i64, sizes: &[usize], what: &str| -> Result<Option<View>> {
            if want == 0 {
                return Ok(None);
            }
            let v = a.out(next)?;
            next += 1;
            f32s(&[&v])?;
            need(v.sizes == sizes, what)?;
            Ok(Some(v))
        };
        let grads = conv2d_backward::Grads {
            input: grad(mask[0], &x.sizes, "conv2d_backward grad_input shape")?,
            weight: grad(mask[1], &w.sizes, "conv2d_backward grad_weight shape")?,
            bias: grad(mask[2], &[oc], "conv2d_backward grad_bias shape")?,
        };
        need(a.out(next).is_err(), "conv2d_backward has more results than its mask asks for")?;
        let geom = conv2d::Geom { sh, sw, ph, pw, dh, dw, groups: g };
        infallible(move |mem| unsafe { conv2d_backward::conv2d_backward(mem, &gy, &x, &w, &grads, geom, crate::core::par::threads()) })
    }

    fn conv3d_step(a: &Args) -> Built {
        let ConvParams { stride, padding, dilation, groups } = a.params()?;
        let (x, w, y) = (a.take(0)?, a.take(1)?, a.out(0)?);
        let bias = a.opt(2);
        f32s(&[&x, &w, &y])?;
        need(x.rank() == 5 && w.rank() == 5 && y.rank() == 5, "conv3d takes 5-d tensors")?;
        let v: Vec<usize> = [uints::<3>(&stride, "stride")?, uints(&padding, "padding")?, uints(&dilation, "dilation")?].concat().into_iter().chain([uint(groups, "groups")?]).collect();
        need(v[..3].iter().chain(&v[6..]).all(|&u| u > 0), "conv3d stride/dilation/groups must be positive")?;
        let g = v[9];
        let (c, oc, cg) = (x.sizes[1], w.sizes[0], w.sizes[1]);
        need(c == cg * g && oc % g == 0 && w.sizes[2..].iter().all(|&k| k > 0), "conv3d channel counts")?;
        let mut expect = vec![x.sizes[0], oc];
        for d in 0..3 {
            expect.push(out_len(x.sizes[2 + d], w.sizes[2 + d], v[d], v[3 + d], v[6 + d]).ok_or("conv3d kernel larger than input")?);
        }
        need(y.sizes == expect, "conv3d output shape")?;
        let ws = &w.strides;
        need(ws[3] == w.sizes[4] * ws[4] && ws[2] == w.sizes[3] * ws[3] && ws[1] == w.sizes[2] * ws[2], "conv3d weight layout")?;
        let ys = &y.strides;
        need(ys[3] == y.sizes[4] * ys[4] && ys[2] == y.sizes[3] * ys[3] || y.numel() == 0, "conv3d output layout")?;
        if let Some(b) = &bias {
            need(b.sizes == [oc] && b.dtype == DType::F32, "conv3d bias shape")?;
        }
        let mut p = [0usize; 10];
        p.copy_from_slice(&v);
        infallible(move |mem| unsafe { conv3d::conv3d(mem, &x, &w, bias.as_ref(), &y, &p, crate::core::par::threads()) })
    }

    crate::step_params!(struct ConvTransposeParams { stride: Vec<i64>, padding: Vec<i64>, dilation: Vec<i64>, groups: i64, output_padding: Vec<i64> });

    fn conv_transpose2d_step(a: &Args) -> Built {
        let ConvTransposeParams { stride, padding, dilation, groups, output_padding } = a.params()?;
        let (x, w, y) = (a.take(0)?, a.take(1)?, a.out(0)?);
        let bias = a.opt(2);
        f32s(&[&x, &w, &y])?;
        need(x.rank() == 4 && w.rank() == 4 && y.rank() == 4, "conv_transpose2d takes 4-d tensors")?;
        let ([sh, sw], [ph, pw], [dh, dw]) = (uints(&stride, "stride")?, uints(&padding, "padding")?, uints(&dilation, "dilation")?);
        let ([oph, opw], g) = (uints(&output_padding, "output_padding")?, uint(groups, "groups")?);
        need(sh > 0 && sw > 0 && dh > 0 && dw > 0 && g > 0, "conv_transpose2d stride/dilation/groups must be positive")?;
        let (n, c, hh, ww) = (x.sizes[0], x.sizes[1], x.sizes[2], x.sizes[3]);
        let (wc, ocg, kh, kw) = (w.sizes[0], w.sizes[1], w.sizes[2], w.sizes[3]);
        need(wc == c && c % g == 0 && kh > 0 && kw > 0, "conv_transpose2d channel counts")?;
        need(oph < sh.max(dh) && opw < sw.max(dw), "conv_transpose2d output padding must be smaller than stride or dilation")?;
        let oh = conv_transpose::out_len(hh, sh, ph, dh, kh, oph).ok_or("conv_transpose2d output height is not positive")?;
        let ow = conv_transpose::out_len(ww, sw, pw, dw, kw, opw).ok_or("conv_transpose2d output width is not positive")?;
        need(y.sizes == [n, ocg * g, oh, ow], "conv_transpose2d output shape")?;
        need(w.strides[2] == kw * w.strides[3] && w.strides[1] == kh * w.strides[2] || ocg * kh * kw == 1, "conv_transpose2d weight layout")?;
        if let Some(b) = &bias {
            need(b.sizes == [ocg * g] && b.dtype == DType::F32, "conv_transpose2d bias shape")?;
        }
        let p = [sh, sw, ph, pw, dh, dw, g];
        infallible(move |mem| unsafe { conv_transpose::conv_transpose2d(mem, &x, &w, bias.as_ref(), &y, &p, crate::core::par::threads()) })
    }

    /// max pooling takes a dilation, average pooling count_include_pad and a divisor (0: none)
    #[derive(Deserialize)]
    #[serde(tag = "op", deny_unknown_fields)]
    enum PoolParams {
        #[serde(rename = "max_pool2d", alias = "max_pool3d")]
        Max {
            kernel: Vec<i64>,
            stride: Vec<i64>,
            padding: Vec<i64>,
            dilation: Vec<i64>,
            /// false: nothing reads the indices (inference), which are then not written
            #[serde(default = "yes")]
            with_indices: bool,
        },
        #[serde(rename = "avg_pool2d", alias = "avg_pool3d")]
        Avg { kernel: Vec<i64>, stride: Vec<i64>, padding: Vec<i64>, count_include_pad: bool, divisor: i64 },
    }

    fn yes() -> bool {
        true
    }

    /// A pooling step's window as the kernels read it: kernel, stride, padding (and for max
    /// pooling dilation) per spatial dim, then count_include_pad (average pooling) or whether
    /// the indices are written (max pooling), and the divisor of average pooling.
    fn pool_window<const N: usize>(a: &Args) -> Result<(Vec<usize>, bool, usize)> {
        Ok(match a.tagged::<PoolParams>()? {
            PoolParams::Max { kernel, stride, padding, dilation, with_indices } => {
                let w = [uints::<N>(&kernel, "pool kernel")?, uints(&stride, "pool stride")?, uints(&padding, "pool padding")?, uints(&dilation, "pool dilation")?];
                (w.concat(), with_indices, 0)
            }
            PoolParams::Avg { kernel, stride, padding, count_include_pad, divisor } => {
                let w = [uints::<N>(&kernel, "pool kernel")?, uints(&stride, "pool stride")?, uints(&padding, "pool padding")?];
                (w.concat(), count_include_pad, uint(divisor, "divisor_override")?)
            }
        })
    }

    fn pool2d(a: &Args) -> Built {
        let (vals, include_pad, divisor) = pool_window::<2>(a)?;
        let (x, y) = (a.take(0)?, a.out(0)?);
        f32s(&[&x, &y])?;
        need(x.rank() == 4 && y.rank() == 4 && x.sizes[..2] == y.sizes[..2], "pool takes 4-d tensors")?;
        need(vals[0] > 0 && vals[1] > 0 && vals[2] > 0 && vals[3] > 0, "pool kernel/stride must be positive")?;
        need(vals[4] <= vals[0] / 2 && vals[5] <= vals[1] / 2, "pool padding larger than half the kernel")?;
        if a.op == "max_pool2d" {
            let idx = a.out(1)?;
            need(idx.sizes == y.sizes && idx.dtype == DType::I64, "max_pool2d indices")?;
            need(vals[6] > 0 && vals[7] > 0, "pool dilation must be positive")?;
            let mut p = [0usize; 8];
            p.copy_from_slice(&vals);
            return infallible(move |mem| unsafe { max_pool(mem, &x, &y, &idx, &p, include_pad) });
        }
        let mut p = [0usize; 6];
        p.copy_from_slice(&vals);
        infallible(move |mem| unsafe { avg_pool(mem, &x, &y, &p, include_pad, divisor) })
    }

    fn pool3d_step(a: &Args) -> Built {
        let (vals, include_pad, divisor) = pool_window::<3>(a)?;
        let (x, y) = (a.take(0)?, a.out(0)?);
        f32s(&[&x, &y])?;
        need(x.rank() == 5 && y.rank() == 5 && x.sizes[..2] == y.sizes[..2], "3-d pooling takes 5-d tensors")?;
        need(vals[..6].iter().all(|&v| v > 0), "pool kernel/stride must be positive")?;
        need((0..3).all(|d| vals[6 + d] <= vals[d] / 2), "pool padding larger than half the kernel")?;
        if a.op == "max_pool3d" {
            let idx = a.out(1)?;
            need(idx.sizes == y.sizes && idx.dtype == DType::I64, "max_pool3d indices")?;
            need(vals[9..].iter().all(|&v| v > 0), "pool dilation must be positive")?;
            let mut p = [0usize; 12];
            p.copy_from_slice(&vals);
            return infallible(move |mem| unsafe { pool3d::max_pool3d(mem, &x, &y, &idx, &p) });
        }
        let mut p = [0usize; 9];
        p.copy_from_slice(&vals);
        infallible(move |mem| unsafe { pool3d::avg_pool3d(mem, &x, &y, &p, include_pad, divisor) })
    }

    fn adaptive(a: &Args) -> Built {
        a.no_params()?;
        let (x, y) = (a.take(0)?, a.out(0)?);
        f32s(&[&x, &y])?;
        let r = if a.op.ends_with("3d") { 5 } else { 4 };
        need(x.rank() == r && y.rank() == r && x.sizes[..2] == y.sizes[..2], "adaptive pool input/output rank")?;
        need(x.sizes[2..].iter().all(|&s| s > 0) || y.numel() == 0, "adaptive pool of an empty plane")?;
        let idx = if a.op.starts_with("adaptive_max") {
            let idx = a.out(1)?;
            need(idx.sizes == y.sizes && idx.dtype == DType::I64, "adaptive max pool indices")?;
            Some(idx)
        } else {
            None
        };
        infallible(move |mem| unsafe { adaptive_pool::adaptive_pool(mem, &x, &y, idx.as_ref()) })
    }

    /// grad (N, C, OH, OW) -> grad_in (N, C, H, W), the backward of 2-d adaptive average pooling:
    /// each output cell's gradient, divided by its window's height and then its width, is added to
    /// every input of its window, cells in row-major order (PyTorch's CPU kernel's arithmetic).
    fn adaptive_avg_pool2d_bwd(a: &Args) -> Built {
        a.no_params()?;
        let (g, gi) = (a.take(0)?, a.out(0)?);
        f32s(&[&g, &gi])?;
        need(g.rank() == 4 && gi.rank() == 4 && g.sizes[..2] == gi.sizes[..2], "adaptive_avg_pool2d backward: (N, C, ...) grad and result")?;
        need(gi.sizes[2..].iter().all(|&s| s > 0) || g.numel() == 0, "adaptive_avg_pool2d backward of an empty plane")?;
        infallible(move |mem| unsafe {
            let (pg, po) = (mem.ptr::<f32>(&g), mem.ptr::<f32>(&gi));
            let ((c, hh, ww), (oh, ow)) = ((gi.sizes[1], gi.sizes[2], gi.sizes[3]), (g.sizes[2], g.sizes[3]));
            let (gs, os) = (&g.strides, &gi.strides);
            crate::core::par::for_each(gi.sizes[0] * c, |nc| {
                let (gb, ob) = (pg.add(nc / c * gs[0] + nc % c * gs[1]), po.add(nc / c * os[0] + nc % c * os[1]));
                for h in 0..hh {
                    for w in 0..ww {
                        *ob.add(h * os[2] + w * os[3]) = 0.0;
                    }
                }
                for i in 0..oh {
                    let (h0, h1) = adaptive_pool::window(i, oh, hh);
                    for j in 0..ow {
                        let (w0, w1) = adaptive_pool::window(j, ow, ww);
                        let delta = *gb.add(i * gs[2] + j * gs[3]) / (h1 - h0) as f32 / (w1 - w0) as f32;
                        for h in h0..h1 {
                            for w in w0..w1 {
                                *ob.add(h * os[2] + w * os[3]) += delta;
                            }
                        }
                    }
                }
            });
        })
    }

}
