//! sin and cos for AVX2+FMA CPUs, eight lanes at a time.
//!
//! Range reduction by π: sin(x) = (−1)^k · sin(x − kπ) with k = round(x/π), and
//! cos(x) = sin(x + π/2) = (−1)^m · sin(x − (m − ½)π) with m = round(x/π + ½), so one odd
//! polynomial on |r| ≤ π/2 serves both (no second polynomial, no quadrant blend). π is split into
//! three float32 parts (Cody–Waite); the first has 8 significant bits, so h·P1 is exact for the
//! |h| < 2^15 that |x| ≤ `REDUCE_MAX` gives (h = k, or m − ½ with one fraction bit), and the two
//! later subtractions are fused multiply-adds (one rounding each): |error of r| stays near 1e-7.
//! Lanes beyond `REDUCE_MAX` (±inf included) take the scalar libm function, so large arguments keep
//! full accuracy, and NaN stays NaN. On |r| ≤ π/2 the Taylor series to r^11 is within 6e-8 of
//! sin r.

#[cfg(target_arch = "x86_64")]
mod imp {
    use std::arch::x86_64::*;

    /// Beyond this |x| a vector takes the scalar path (h·P1 must stay exact: |h| < 2^15).
    pub const REDUCE_MAX: f32 = 65536.0;

    const P1: f32 = 3.140_625; // 201/64: 8 significant bits
    const P2: f32 = (std::f64::consts::PI - 3.140_625) as f32;
    const P3: f32 = (std::f64::consts::PI - 3.140_625 - P2 as f64) as f32;

    #[inline(always)]
    unsafe fn set(v: f32) -> __m256 {
        _mm256_set1_ps(v)
    }

    /// sin(r) for |r| ≤ π/2: r + r³(−1/3! + r²(1/5! + r²(−1/7! + r²(1/9! − r²/11!)))).
    #[inline(always)]
    unsafe fn sin_poly(r: __m256) -> __m256 {
        let r2 = _mm256_mul_ps(r, r);
        let mut p = set(-1.0 / 39_916_800.0);
        for c in [1.0 / 362_880.0, -1.0 / 5040.0, 1.0 / 120.0, -1.0 / 6.0] {
            p = _mm256_fmadd_ps(p, r2, set(c));
        }
        _mm256_fmadd_ps(_mm256_mul_ps(p, r2), r, r)
    }

    /// sin (cos when `cosine`) of eight lanes whose |x| ≤ REDUCE_MAX or NaN.
    #[inline(always)]
    unsafe fn sincos(x: __m256, cosine: bool) -> __m256 {
        let t = _mm256_mul_ps(x, set(std::f32::consts::FRAC_1_PI));
        let (n, h) = if cosine {
            let m = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_add_ps(t, set(0.5)));
            (m, _mm256_sub_ps(m, set(0.5)))
        } else {
            let k = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(t);
            (k, k)
        };
        let r = _mm256_fnmadd_ps(h, set(P1), x);
        let r = _mm256_fnmadd_ps(h, set(P2), r);
        let r = _mm256_fnmadd_ps(h, set(P3), r);
        // (−1)^n: n's lowest bit into the sign bit (a NaN lane converts to 0x80000000: even)
        let odd = _mm256_castsi256_ps(_mm256_slli_epi32::<31>(_mm256_cvtps_epi32(n)));
        _mm256_xor_ps(sin_poly(r), odd)
    }

    /// Eight lanes of |x| ≤ REDUCE_MAX or NaN (other lanes are fixed up after the sweep).
    #[inline(always)]
    unsafe fn lanes<const COS: bool>(x: __m256) -> __m256 {
        let y = sincos(x, COS);
        if COS {
            y
        } else {
            // sin(±0) = ±0 (the reduction's subtractions would turn −0 into +0)
            _mm256_blendv_ps(y, x, _mm256_cmp_ps::<_CMP_EQ_OQ>(x, _mm256_setzero_ps()))
        }
    }

    /// Lanes beyond REDUCE_MAX (|x| > REDUCE_MAX, ±inf included), if any.
    #[inline(always)]
    unsafe fn big(x: __m256) -> __m256 {
        _mm256_cmp_ps::<_CMP_GT_OQ>(_mm256_andnot_ps(set(-0.0), x), set(REDUCE_MAX))
    }

    /// out[i] = sin(inp[i]) (or cos).
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn sincos_avx2(out: &mut [f32], inp: &[f32], cosine: bool) {
        if cosine {
            sweep::<true>(out, inp)
        } else {
            sweep::<false>(out, inp)
        }
    }

    /// The vector sweep, then (only if some |x| was beyond REDUCE_MAX) a scalar pass over those
    /// elements: the loop itself has no call and no branch, so its constants stay in registers.
    #[inline(always)]
    unsafe fn sweep<const COS: bool>(out: &mut [f32], inp: &[f32]) {
        let n = out.len().min(inp.len());
        let (ip, op) = (inp.as_ptr(), out.as_mut_ptr());
        let mut any_big = _mm256_setzero_ps();
        let mut i = 0;
        // two independent vectors per step: their dependency chains overlap
        while i + 16 <= n {
            let (x0, x1) = (_mm256_loadu_ps(ip.add(i)), _mm256_loadu_ps(ip.add(i + 8)));
            _mm256_storeu_ps(op.add(i), lanes::<COS>(x0));
            _mm256_storeu_ps(op.add(i + 8), lanes::<COS>(x1));
            any_big = _mm256_or_ps(any_big, _mm256_or_ps(big(x0), big(x1)));
            i += 16;
        }
        while i + 8 <= n {
            let x = _mm256_loadu_ps(ip.add(i));
            _mm256_storeu_ps(op.add(i), lanes::<COS>(x));
            any_big = _mm256_or_ps(any_big, big(x));
            i += 8;
        }
        if i < n {
            let mut buf = [0f32; 8];
            buf[..n - i].copy_from_slice(&inp[i..n]);
            let x = _mm256_loadu_ps(buf.as_ptr());
            any_big = _mm256_or_ps(any_big, big(x));
            _mm256_storeu_ps(buf.as_mut_ptr(), lanes::<COS>(x));
            out[i..n].copy_from_slice(&buf[..n - i]);
        }
        if _mm256_movemask_ps(any_big) != 0 {
            fix_big(&mut out[..n], &inp[..n], COS);
        }
    }

    /// The scalar libm function for every |x| > REDUCE_MAX (full accuracy for large arguments).
    #[cold]
    #[inline(never)]
    fn fix_big(out: &mut [f32], inp: &[f32], cosine: bool) {
        for (o, &v) in out.iter_mut().zip(inp) {
            if v.abs() > REDUCE_MAX {
                *o = if cosine { v.cos() } else { v.sin() };
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub use imp::{sincos_avx2, REDUCE_MAX};

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    fn check(xs: &[f32], cosine: bool) {
        let mut out = vec![0f32; xs.len()];
        // SAFETY: guarded by the feature check below
        unsafe { sincos_avx2(&mut out, xs, cosine) };
        for (&x, &y) in xs.iter().zip(&out) {
            let want = if cosine { (x as f64).cos() } else { (x as f64).sin() };
            if want.is_nan() {
                assert!(y.is_nan(), "f({x}) = {y}, want NaN");
                continue;
            }
            let tol = 1e-6 + 1.5e-6 * want.abs();
            assert!((y as f64 - want).abs() <= tol, "cos={cosine} f({x}) = {y}, want {want}");
        }
    }

    #[test]
    fn matches_f64_reference_over_the_reduction_range_and_beyond() {
        if !crate::core::isa::has_avx2() {
            return;
        }
        let mut xs: Vec<f32> = (-20_000..20_000).map(|i| i as f32 * 0.01).collect();
        xs.extend((0..4000).map(|i| (i as f32 - 2000.0) * 37.77));
        xs.extend([
            0.0, -0.0, 1e-30, -1e-30, f32::MIN_POSITIVE, 1e-8, REDUCE_MAX, -REDUCE_MAX, REDUCE_MAX * 1.5, 1e10, -3e30,
            f32::MAX, f32::INFINITY, f32::NEG_INFINITY, f32::NAN,
            std::f32::consts::FRAC_PI_2, std::f32::consts::PI, 3.0 * std::f32::consts::FRAC_PI_2,
        ]);
        for len in [xs.len(), 1, 7, 9, 15] {
            check(&xs[xs.len() - len..], false);
            check(&xs[xs.len() - len..], true);
        }
        check(&xs, false);
        check(&xs, true);
    }

    #[test]
    fn sign_of_zero_is_kept_by_sin() {
        if !crate::core::isa::has_avx2() {
            return;
        }
        let mut out = [1f32; 8];
        // SAFETY: AVX2 checked above
        unsafe { sincos_avx2(&mut out, &[-0.0; 8], false) };
        assert!(out.iter().all(|v| *v == 0.0 && v.is_sign_negative()));
    }
}
