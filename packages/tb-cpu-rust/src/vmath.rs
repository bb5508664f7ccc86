//! AVX-512 float32 activations written with intrinsics: exp through `vscalefps` (no integer
//! exponent tricks, no overflow branches) and reciprocals through `vrcp14ps` + one Newton step
//! instead of `vdivps`, which is the throughput limit of the scalar-style code LLVM vectorises.
//! Accuracy matches `mathfn` (a few ulp), well inside float32 `assert_close` tolerances.

#[cfg(target_arch = "x86_64")]
mod imp {
    use crate::ew::Un;
    use std::arch::x86_64::*;

    #[inline(always)]
    unsafe fn exp(x: __m512) -> __m512 {
        let xc = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-104.0)), _mm512_set1_ps(89.0));
        // k = round(x / ln2), r = x - k ln2 (two-part ln2)
        let k = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_mul_ps(xc, _mm512_set1_ps(std::f32::consts::LOG2_E)));
        let r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693_145_75), xc);
        let r = _mm512_fnmadd_ps(k, _mm512_set1_ps(1.428_606_8e-6), r);
        let mut p = _mm512_set1_ps(1.0 / 5040.0);
        for c in [1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
        }
        let y = _mm512_scalef_ps(p, k);
        // NaN in, NaN out (the clamp above would have turned it into a number)
        let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
        _mm512_mask_mov_ps(y, nan, x)
    }

    /// exp for x <= 0 or NaN (NaN propagates through the polynomial; no overflow side).
    #[inline(always)]
    unsafe fn exp_nonpos(x: __m512) -> __m512 {
        let xc = _mm512_max_ps(x, _mm512_set1_ps(-104.0));
        let k = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_mul_ps(xc, _mm512_set1_ps(std::f32::consts::LOG2_E)));
        let r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693_145_75), xc);
        let r = _mm512_fnmadd_ps(k, _mm512_set1_ps(1.428_606_8e-6), r);
        let mut p = _mm512_set1_ps(1.0 / 5040.0);
        for c in [1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
        }
        _mm512_scalef_ps(p, k)
    }

    /// 1/d for d >= 1 (finite): rcp14 and one Newton step, ~1 ulp.
    #[inline(always)]
    unsafe fn recip(d: __m512) -> __m512 {
        let y = _mm512_rcp14_ps(d);
        _mm512_mul_ps(y, _mm512_fnmadd_ps(d, y, _mm512_set1_ps(2.0)))
    }

    #[inline(always)]
    unsafe fn sigmoid(x: __m512) -> __m512 {
        // exp(87) is finite, so the reciprocal never sees inf; below -87 the result is 0
        let xc = _mm512_max_ps(x, _mm512_set1_ps(-87.0));
        let s = recip(_mm512_add_ps(_mm512_set1_ps(1.0), exp(_mm512_sub_ps(_mm512_setzero_ps(), xc))));
        let tiny = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_set1_ps(-87.0));
        let s = _mm512_mask_mov_ps(s, tiny, _mm512_setzero_ps());
        let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
        _mm512_mask_mov_ps(s, nan, x)
    }

    #[inline(always)]
    unsafe fn erf_for_gelu(x: __m512) -> __m512 {
        let a = _mm512_abs_ps(x);
        let t = recip(_mm512_fmadd_ps(_mm512_set1_ps(0.327_591_1), a, _mm512_set1_ps(1.0)));
        let mut p = _mm512_set1_ps(1.061_405_4);
        for c in [-1.453_152_1, 1.421_413_7, -0.284_496_74, 0.254_829_6] {
            p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(c));
        }
        p = _mm512_mul_ps(p, t);
        let e = exp_nonpos(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(a, a)));
        // absolute error ~1.5e-7: GELU multiplies it by x/2, so no small-|x| series is needed
        let r = _mm512_fnmadd_ps(p, e, _mm512_set1_ps(1.0));
        // copy the sign of x
        let sign = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(i32::MIN));
        _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(r), sign))
    }

    #[inline(always)]
    unsafe fn apply(op: Un, x: __m512) -> __m512 {
        match op {
            Un::Exp => exp(x),
            Un::Sigmoid => sigmoid(x),
            Un::Silu => {
                let y = _mm512_mul_ps(x, sigmoid(x));
                // -inf * 0 is NaN in PyTorch as well; keep that
                y
            }
            _ => {
                // GeluErf
                let e = erf_for_gelu(_mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::FRAC_1_SQRT_2)));
                let y = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5), x), _mm512_add_ps(_mm512_set1_ps(1.0), e));
                // as PyTorch's CPU kernel: +inf -> inf, -inf -> NaN (-inf·0)
                let pinf = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(x, _mm512_set1_ps(f32::INFINITY));
                let ninf = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(x, _mm512_set1_ps(f32::NEG_INFINITY));
                let y = _mm512_mask_mov_ps(y, pinf, _mm512_set1_ps(f32::INFINITY));
                _mm512_mask_mov_ps(y, ninf, _mm512_set1_ps(f32::NAN))
            }
        }
    }

    #[inline(always)]
    unsafe fn hmax(v: __m512) -> f32 {
        _mm512_reduce_max_ps(v)
    }

    /// Softmax / log-softmax of one contiguous row, online: one pass over memory keeps 16
    /// lane-wise running maxima and sums rescaled by exp(old max - new max) once per 64
    /// elements (the block is in L1 when it is read a second time for the sums); a second
    /// pass writes the output.
    ///
    /// # Safety
    /// The CPU must have AVX-512F; `x` and `y` hold `n` elements.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn softmax_row_avx512(x: *const f32, y: *mut f32, n: usize, log: bool) {
        const B: usize = 64;
        let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
        let mut m = ninf;
        let mut s = _mm512_setzero_ps();
        let mut nan: __mmask16 = 0;
        let mut i = 0;
        let load = |i: usize| -> (__m512, __mmask16) {
            let rem = n - i;
            if rem >= 16 {
                (_mm512_loadu_ps(x.add(i)), 0xffff)
            } else {
                let k: __mmask16 = ((1u32 << rem) - 1) as __mmask16;
                (_mm512_mask_loadu_ps(ninf, k, x.add(i)), k)
            }
        };
        while i < n {
            let end = (i + B).min(n);
            let mut bm = ninf;
            let mut j = i;
            while j < end {
                let (v, _) = load(j);
                nan |= _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
                bm = _mm512_max_ps(bm, v);
                j += 16;
            }
            let nm = _mm512_max_ps(m, bm);
            // an all -inf lane keeps sum 0: exp(-inf - 0) = 0, not exp(-inf + inf) = NaN
            let mu = _mm512_mask_mov_ps(nm, _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(nm, ninf), _mm512_setzero_ps());
            s = _mm512_mul_ps(s, exp(_mm512_sub_ps(m, mu)));
            m = nm;
            let mut j = i;
            while j < end {
                let (v, _) = load(j);
                s = _mm512_add_ps(s, exp(_mm512_sub_ps(v, mu)));
                j += 16;
            }
            i = end;
        }
        if nan != 0 {
            for k in 0..n {
                *y.add(k) = f32::NAN;
            }
            return;
        }
        let mx = hmax(m);
        let mc = if mx == f32::NEG_INFINITY { 0.0 } else { mx };
        let mcv = _mm512_set1_ps(mc);
        let mlanes = _mm512_mask_mov_ps(m, _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(m, ninf), _mm512_set1_ps(-200.0));
        let sum = _mm512_reduce_add_ps(_mm512_mul_ps(s, exp(_mm512_sub_ps(mlanes, mcv))));
        let mut i = 0;
        if log {
            let sub = _mm512_set1_ps(mc + sum.ln());
            while i < n {
                let (v, k) = load(i);
                _mm512_mask_storeu_ps(y.add(i), k, _mm512_sub_ps(v, sub));
                i += 16;
            }
        } else {
            let inv = _mm512_set1_ps(1.0 / sum);
            while i < n {
                let (v, k) = load(i);
                _mm512_mask_storeu_ps(y.add(i), k, _mm512_mul_ps(exp(_mm512_sub_ps(v, mcv)), inv));
                i += 16;
            }
        }
    }

    /// row[i] = exp(row[i] - shift); returns the sum of the new values.
    ///
    /// # Safety
    /// The CPU must have AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn exp_shift_sum_avx512(row: &mut [f32], shift: f32) -> f32 {
        let n = row.len();
        let p = row.as_mut_ptr();
        let sh = _mm512_set1_ps(shift);
        let mut acc = _mm512_setzero_ps();
        let mut i = 0;
        while i < n {
            let k: __mmask16 = if n - i >= 16 { 0xffff } else { ((1u32 << (n - i)) - 1) as __mmask16 };
            let v = exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, p.add(i)), sh));
            let v = _mm512_maskz_mov_ps(k, v);
            acc = _mm512_add_ps(acc, v);
            _mm512_mask_storeu_ps(p.add(i), k, v);
            i += 16;
        }
        _mm512_reduce_add_ps(acc)
    }

    /// out[i] = op(inp[i]) for the ops this module covers; false for any other op.
    ///
    /// # Safety
    /// The CPU must have AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn un_avx512(op: Un, out: &mut [f32], inp: &[f32]) -> bool {
        if !matches!(op, Un::Exp | Un::Sigmoid | Un::Silu | Un::GeluErf) {
            return false;
        }
        let n = out.len().min(inp.len());
        let mut i = 0;
        while i + 16 <= n {
            let x = _mm512_loadu_ps(inp.as_ptr().add(i));
            _mm512_storeu_ps(out.as_mut_ptr().add(i), apply(op, x));
            i += 16;
        }
        if i < n {
            let m: __mmask16 = (1u32 << (n - i)).wrapping_sub(1) as __mmask16;
            let x = _mm512_maskz_loadu_ps(m, inp.as_ptr().add(i));
            _mm512_mask_storeu_ps(out.as_mut_ptr().add(i), m, apply(op, x));
        }
        true
    }
}

#[cfg(target_arch = "x86_64")]
pub use imp::{exp_shift_sum_avx512, softmax_row_avx512, un_avx512};

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use crate::ew::Un;

    #[test]
    fn avx512_activations_match_reference() {
        if !crate::isa::has_avx512() {
            return;
        }
        let mut xs: Vec<f32> = (0..40000).map(|i| -20.0 + i as f32 * 0.001).collect();
        xs.extend([0.0, -0.0, 1e-30, -1e-30, 88.0, 89.0, -87.5, -100.0, -104.5, 200.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 3.0]);
        let mut out = vec![0f32; xs.len()];
        let phi = |x: f64| 0.5 * (1.0 + libm::erf(x / std::f64::consts::SQRT_2));
        for op in [Un::Exp, Un::Sigmoid, Un::Silu, Un::GeluErf] {
            assert!(unsafe { un_avx512(op, &mut out, &xs) });
            for (&x, &y) in xs.iter().zip(&out) {
                let xd = x as f64;
                let want = match op {
                    Un::Exp => xd.exp(),
                    Un::Sigmoid => 1.0 / (1.0 + (-xd).exp()),
                    Un::Silu => xd / (1.0 + (-xd).exp()),
                    _ => {
                        if x == f32::NEG_INFINITY {
                            f64::NAN
                        } else if x == f32::INFINITY {
                            f64::INFINITY
                        } else {
                            xd * phi(xd)
                        }
                    }
                };
                if want.is_nan() {
                    assert!(y.is_nan(), "{op:?}({x}) = {y}, want NaN");
                    continue;
                }
                let want = if want.abs() > f32::MAX as f64 { want.signum() * f64::INFINITY } else { want };
                let err = (y as f64 - want).abs();
                // float32 assert_close: atol 1e-5, rtol 1.3e-6
                assert!(err <= 1e-6 + 1.3e-6 * want.abs() || (want.is_infinite() && y as f64 == want), "{op:?}({x}) = {y}, want {want}");
            }
        }
        assert!(!unsafe { un_avx512(Un::Relu, &mut out, &xs) });
    }
}
