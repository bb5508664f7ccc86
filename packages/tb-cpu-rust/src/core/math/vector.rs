//! AVX-512 float32 activations written with intrinsics: exp through `vscalefps` (no integer
//! exponent tricks, no overflow branches) and reciprocals through `vrcp14ps` + one Newton step
//! instead of `vdivps`, which is the throughput limit of the scalar-style code LLVM vectorises.
//! Accuracy matches `mathfn` (a few ulp), well inside float32 `assert_close` tolerances.

#[cfg(target_arch = "x86_64")]
mod imp {
    use crate::core::math::unary::Un;
    use std::arch::x86_64::*;

    #[inline(always)]
    unsafe fn exp(x: __m512) -> __m512 {
        let xc = _mm512_min_ps(
            _mm512_max_ps(x, _mm512_set1_ps(-104.0)),
            _mm512_set1_ps(89.0),
        );
        // k = round(x / ln2), r = x - k ln2 (two-part ln2)
        let k = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm512_mul_ps(xc, _mm512_set1_ps(std::f32::consts::LOG2_E)),
        );
        let r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693_145_75), xc);
        let r = _mm512_fnmadd_ps(k, _mm512_set1_ps(1.428_606_8e-6), r);
        // e^r on |r| ≤ ln2/2: the AVX2 path's degree-5 fit (`imp2::EXP_FIT`)
        let mut p = _mm512_set1_ps(super::imp2::EXP_FIT[0]);
        for &c in &super::imp2::EXP_FIT[1..] {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
        }
        let y = _mm512_scalef_ps(p, k);
        // NaN in, NaN out (the clamp above would have turned it into a number)
        let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
        _mm512_mask_mov_ps(y, nan, x)
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
        let s = recip(_mm512_add_ps(
            _mm512_set1_ps(1.0),
            exp(_mm512_sub_ps(_mm512_setzero_ps(), xc)),
        ));
        let tiny = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_set1_ps(-87.0));
        let s = _mm512_mask_mov_ps(s, tiny, _mm512_setzero_ps());
        let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
        _mm512_mask_mov_ps(s, nan, x)
    }

    /// x clamped to [−c, c], then x·P(x²)/Q(x²) (coefficients lowest degree first; Q ≥ 1 there,
    /// so the division is `rcp14` and a Newton step). min/max pass a NaN in their second operand
    /// through: NaN in, NaN out.
    #[inline(always)]
    unsafe fn odd_rational<const N: usize>(x: __m512, c: f32, p: &[f32; N], q: &[f32; N]) -> __m512 {
        let xc = _mm512_max_ps(_mm512_set1_ps(-c), _mm512_min_ps(_mm512_set1_ps(c), x));
        let t = _mm512_mul_ps(xc, xc);
        let mut pv = _mm512_set1_ps(p[N - 1]);
        let mut qv = _mm512_set1_ps(q[N - 1]);
        for k in (0..N - 1).rev() {
            pv = _mm512_fmadd_ps(pv, t, _mm512_set1_ps(p[k]));
            qv = _mm512_fmadd_ps(qv, t, _mm512_set1_ps(q[k]));
        }
        _mm512_mul_ps(_mm512_mul_ps(xc, pv), recip(qv))
    }

    /// ERF_P / ERF_Q for erf(x/√2) written in x: u² = x²/2 scales the k-th coefficients by
    /// 2^-k (exact), and P's also by 1/√2 (the u in front: one rounding each).
    const fn gelu_coefficients(c: [f32; 6], root_half: bool) -> [f32; 6] {
        let mut out = [0.0f32; 6];
        let mut k = 0;
        let mut scale = if root_half { std::f32::consts::FRAC_1_SQRT_2 } else { 1.0 };
        while k < 6 {
            out[k] = c[k] * scale;
            scale *= 0.5;
            k += 1;
        }
        out
    }
    const GELU_P: [f32; 6] = gelu_coefficients(super::imp2::ERF_P, true);
    const GELU_Q: [f32; 6] = gelu_coefficients(super::imp2::ERF_Q, false);

    /// GELU (erf form), x/2 · (1 + erf(x/√2)), with the 1/√2 folded into the fit's coefficients
    /// (no multiply of the argument) and erf clamped below at −1 only: 1 + erf is exactly 0 where
    /// erf saturates low (−inf → NaN as PyTorch's −inf·0), while above, an erf a few ulp over 1
    /// changes x·(1 + erf)/2 by as little. Two operations fewer a vector than through `erf`.
    #[inline(always)]
    unsafe fn gelu_erf(x: __m512) -> __m512 {
        let e = odd_rational(x, super::imp2::ERF_CLAMP * std::f32::consts::SQRT_2, &GELU_P, &GELU_Q);
        half_x_one_plus(x, _mm512_max_ps(_mm512_set1_ps(-1.0), e))
    }

    /// tanh as x·P(x²)/Q(x²) on |x| < 9, ±1 beyond: the AVX2 path's fit (`imp2::tanh`).
    #[inline(always)]
    unsafe fn tanh(x: __m512) -> __m512 {
        use super::imp2::{TANH_CLAMP, TANH_P, TANH_Q};
        let y = odd_rational(x, TANH_CLAMP, &TANH_P, &TANH_Q);
        let sat = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(_mm512_abs_ps(x), _mm512_set1_ps(TANH_CLAMP));
        let one = _mm512_castsi512_ps(_mm512_or_si512(
            _mm512_castps_si512(_mm512_set1_ps(1.0)),
            _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(i32::MIN)),
        ));
        _mm512_mask_mov_ps(y, sat, one)
    }

    /// x/2 · (1 + f) as one FMA: +inf·(1 + 1) = inf, −inf·(1 − 1) = NaN as PyTorch's CPU kernel
    /// (−inf·0), NaN stays NaN.
    #[inline(always)]
    unsafe fn half_x_one_plus(x: __m512, f: __m512) -> __m512 {
        let h = _mm512_mul_ps(_mm512_set1_ps(0.5), x);
        _mm512_fmadd_ps(h, f, h)
    }

    #[inline(always)]
    unsafe fn apply(op: Un, x: __m512) -> __m512 {
        match op {
            Un::Exp => exp(x),
            Un::Sigmoid => sigmoid(x),
            // -inf * 0 is NaN in PyTorch as well; keep that
            Un::Silu => _mm512_mul_ps(x, sigmoid(x)),
            Un::Tanh => tanh(x),
            Un::GeluTanh => {
                // tanh(√(2/π)·(x + 0.044715·x³)) = tanh(√(2/π)·x·(1 + 0.044715·x²))
                let s = _mm512_fmadd_ps(
                    _mm512_mul_ps(x, x),
                    _mm512_set1_ps(0.044_715),
                    _mm512_set1_ps(1.0),
                );
                let z = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.797_884_6), x), s);
                half_x_one_plus(x, tanh(z))
            }
            _ => gelu_erf(x), // GeluErf
        }
    }

    #[inline(always)]
    unsafe fn hmax(v: __m512) -> f32 {
        _mm512_reduce_max_ps(v)
    }

    /// Rows up to this many elements (1 MiB) take the three-pass form (`softmax_short_row`):
    /// x and y together stay within L2 while the row is worked on, so reading x twice costs
    /// little and each exponential is computed once. Longer rows take the online form, which
    /// reads x from memory once for the statistics but computes each exponential twice.
    /// Measured (`softmax_forms_timing`, 1 thread, Zen 4 class EPYC, 16 MiB of rows): the
    /// three-pass form 1.55x the online one at 2048-element rows, 1.28x at 2^20.
    pub const SHORT_ROW: usize = 1 << 18;

    /// Softmax / log-softmax of one contiguous row: `softmax_short_row` up to `SHORT_ROW`
    /// elements, `softmax_online_row` beyond.
    ///
    /// # Safety
    /// The CPU must have AVX-512F; `x` and `y` hold `n` elements.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn softmax_row_avx512(x: *const f32, y: *mut f32, n: usize, log: bool) {
        if n <= SHORT_ROW {
            softmax_short_row(x, y, n, log)
        } else {
            softmax_online_row(x, y, n, log)
        }
    }

    /// The mask of the first `min(rem, 16)` lanes of a 512-bit float32 vector.
    #[inline(always)]
    pub fn lanes(rem: usize) -> __mmask16 {
        if rem >= 16 {
            0xffff
        } else {
            ((1u32 << rem) - 1) as __mmask16
        }
    }

    /// Three passes over one row: its max (a NaN or +inf anywhere gives a NaN row, as
    /// PyTorch's exp(x - max) does), y = exp(x - max) with the sum in the same pass, then
    /// y *= 1 / sum while y is still in cache (log-softmax: the sum alone, then y = x - max -
    /// ln sum). An all -inf row shifts by 0 and divides 0 by 0: NaN, as PyTorch.
    ///
    /// # Safety
    /// The CPU must have AVX-512F; `x` and `y` hold `n` elements.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn softmax_short_row(x: *const f32, y: *mut f32, n: usize, log: bool) {
        if n == 0 {
            return;
        }
        let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
        let (mut m0, mut m1) = (ninf, ninf);
        let mut nan: __mmask16 = 0;
        let mut i = 0;
        while i + 32 <= n {
            let a = _mm512_loadu_ps(x.add(i));
            let b = _mm512_loadu_ps(x.add(i + 16));
            nan |= _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(a, b);
            m0 = _mm512_max_ps(m0, a);
            m1 = _mm512_max_ps(m1, b);
            i += 32;
        }
        while i < n {
            let a = _mm512_mask_loadu_ps(ninf, lanes(n - i), x.add(i));
            nan |= _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(a, a);
            m0 = _mm512_max_ps(m0, a);
            i += 16;
        }
        let mx = hmax(_mm512_max_ps(m0, m1));
        if nan != 0 || mx == f32::INFINITY {
            std::slice::from_raw_parts_mut(y, n).fill(f32::NAN);
            return;
        }
        let shift = if mx == f32::NEG_INFINITY { 0.0 } else { mx };
        let sh = _mm512_set1_ps(shift);
        let (mut s0, mut s1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        let mut i = 0;
        while i + 32 <= n {
            let a = exp(_mm512_sub_ps(_mm512_loadu_ps(x.add(i)), sh));
            let b = exp(_mm512_sub_ps(_mm512_loadu_ps(x.add(i + 16)), sh));
            if !log {
                _mm512_storeu_ps(y.add(i), a);
                _mm512_storeu_ps(y.add(i + 16), b);
            }
            s0 = _mm512_add_ps(s0, a);
            s1 = _mm512_add_ps(s1, b);
            i += 32;
        }
        while i < n {
            let k = lanes(n - i);
            let a = _mm512_maskz_mov_ps(k, exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x.add(i)), sh)));
            if !log {
                _mm512_mask_storeu_ps(y.add(i), k, a);
            }
            s0 = _mm512_add_ps(s0, a);
            i += 16;
        }
        let sum = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
        let (src, f, add) = if log {
            (x, _mm512_set1_ps(1.0), _mm512_set1_ps(-(shift + sum.ln())))
        } else {
            (y as *const f32, _mm512_set1_ps(1.0 / sum), _mm512_setzero_ps())
        };
        let mut i = 0;
        while i < n {
            let k = lanes(n - i);
            let v = _mm512_maskz_loadu_ps(k, src.add(i));
            _mm512_mask_storeu_ps(y.add(i), k, _mm512_fmadd_ps(v, f, add));
            i += 16;
        }
    }

    /// Softmax / log-softmax of one contiguous row, online: one pass over memory keeps 16
    /// lane-wise running maxima and sums rescaled by exp(old max - new max) once per 64
    /// elements (the block is in L1 when it is read a second time for the sums); a second
    /// pass writes the output.
    ///
    /// # Safety
    /// The CPU must have AVX-512F; `x` and `y` hold `n` elements.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn softmax_online_row(x: *const f32, y: *mut f32, n: usize, log: bool) {
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
            let mu = _mm512_mask_mov_ps(
                nm,
                _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(nm, ninf),
                _mm512_setzero_ps(),
            );
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
        let mlanes = _mm512_mask_mov_ps(
            m,
            _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(m, ninf),
            _mm512_set1_ps(-200.0),
        );
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

    /// row[i] = exp(row[i] - shift); returns the sum of the new values. Results below float32's
    /// smallest normal number (row[i] - shift < -87.3) are flushed to 0, as the AVX2 path does:
    /// these rows are attention probabilities that a GEMM reads next, and a denormal operand
    /// costs a microcode assist per multiply (a causal mask's -inf scores made `sdpa` 2× slower).
    ///
    /// # Safety
    /// The CPU must have AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn exp_shift_sum_avx512(row: &mut [f32], shift: f32) -> f32 {
        let n = row.len();
        let p = row.as_mut_ptr();
        let sh = _mm512_set1_ps(shift);
        let floor = _mm512_set1_ps(-87.3);
        let mut acc = _mm512_setzero_ps();
        let mut i = 0;
        while i < n {
            let k: __mmask16 = if n - i >= 16 {
                0xffff
            } else {
                ((1u32 << (n - i)) - 1) as __mmask16
            };
            let x = _mm512_sub_ps(_mm512_maskz_loadu_ps(k, p.add(i)), sh);
            // keep lanes at or above the floor, and NaN lanes (NaN in, NaN out)
            let keep = k & !_mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, floor);
            let v = _mm512_maskz_mov_ps(keep, exp(x));
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
        match op {
            Un::Exp => map512(out, inp, |x| apply(Un::Exp, x)),
            Un::Sigmoid => map512(out, inp, |x| apply(Un::Sigmoid, x)),
            Un::Silu => map512(out, inp, |x| apply(Un::Silu, x)),
            Un::Tanh => map512(out, inp, |x| apply(Un::Tanh, x)),
            Un::GeluTanh => map512(out, inp, |x| apply(Un::GeluTanh, x)),
            Un::GeluErf => map512(out, inp, |x| apply(Un::GeluErf, x)),
            _ => return false,
        }
        true
    }

    /// out[i] = f(inp[i]); one loop per op (the match outside it), the tail through a mask.
    #[inline(always)]
    unsafe fn map512(out: &mut [f32], inp: &[f32], f: impl Fn(__m512) -> __m512) {
        let n = out.len().min(inp.len());
        let mut i = 0;
        while i + 16 <= n {
            let x = _mm512_loadu_ps(inp.as_ptr().add(i));
            _mm512_storeu_ps(out.as_mut_ptr().add(i), f(x));
            i += 16;
        }
        if i < n {
            let m: __mmask16 = (1u32 << (n - i)).wrapping_sub(1) as __mmask16;
            let x = _mm512_maskz_loadu_ps(m, inp.as_ptr().add(i));
            _mm512_mask_storeu_ps(out.as_mut_ptr().add(i), m, f(x));
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub use imp::{exp_shift_sum_avx512, lanes, softmax_online_row, softmax_row_avx512, softmax_short_row, un_avx512, SHORT_ROW};

/// The same activations for AVX2+FMA CPUs (no AVX-512): exp scales by 2^k through the
/// exponent bits (AVX2 has no `vscalefps`), reciprocals through `vrcpps` + one Newton step.
#[cfg(target_arch = "x86_64")]
mod imp2 {
    use crate::core::math::unary::Un;
    use std::arch::x86_64::*;

    #[inline(always)]
    unsafe fn set(v: f32) -> __m256 {
        _mm256_set1_ps(v)
    }

    /// e^r on |r| ≤ ln2/2 as 1 + r + c2 r² + … + c5 r⁵ (highest degree first, for Horner):
    /// this crate's own relative-error fit, ≤ 1.1e-7 exact, ≤ 1.6e-7 in float32; two
    /// multiply-adds fewer than the Taylor series of the same accuracy.
    pub(super) const EXP_FIT: [f32; 6] = [8.31247e-03, 4.1890286e-02, 1.6667116e-01, 4.999923e-01, 1.0, 1.0];

    /// 2^k·p for integral k in [-126, 128]: 2^(k-1) from the exponent bits, times 2p.
    #[inline(always)]
    unsafe fn exp_core(xc: __m256) -> __m256 {
        let k = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(xc, set(std::f32::consts::LOG2_E)),
        );
        let r = _mm256_fnmadd_ps(k, set(0.693_145_75), xc);
        let r = _mm256_fnmadd_ps(k, set(1.428_606_8e-6), r);
        let mut p = set(EXP_FIT[0]);
        for &c in &EXP_FIT[1..] {
            p = _mm256_fmadd_ps(p, r, set(c));
        }
        let bits = _mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_cvtps_epi32(k),
            _mm256_set1_epi32(126),
        ));
        _mm256_mul_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(bits)), set(2.0))
    }

    /// exp with IEEE edges: inf above 88.72, 0 below -87.3, NaN kept.
    #[inline(always)]
    pub(super) unsafe fn exp(x: __m256) -> __m256 {
        let xc = _mm256_min_ps(_mm256_max_ps(x, set(-87.3)), set(88.72));
        let y = exp_core(xc);
        let y = _mm256_blendv_ps(
            y,
            set(f32::INFINITY),
            _mm256_cmp_ps::<_CMP_GT_OQ>(x, set(88.72)),
        );
        let y = _mm256_blendv_ps(
            y,
            _mm256_setzero_ps(),
            _mm256_cmp_ps::<_CMP_LT_OQ>(x, set(-87.3)),
        );
        _mm256_blendv_ps(y, x, _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x))
    }

    /// exp for x <= 0 (or -inf): no overflow side, flushes below -87.3 to 0. NaN in, NaN out
    /// is not kept (callers that can see NaN use `exp`).
    #[inline(always)]
    pub(super) unsafe fn exp_nonpos(x: __m256) -> __m256 {
        let xc = _mm256_max_ps(x, set(-87.3));
        let y = exp_core(xc);
        _mm256_blendv_ps(
            y,
            _mm256_setzero_ps(),
            _mm256_cmp_ps::<_CMP_LT_OQ>(x, set(-87.3)),
        )
    }

    /// 1/d for finite d >= 1: rcpps and one Newton step (~1 ulp more than a division).
    #[inline(always)]
    unsafe fn recip(d: __m256) -> __m256 {
        let y = _mm256_rcp_ps(d);
        _mm256_mul_ps(y, _mm256_fnmadd_ps(d, y, set(2.0)))
    }

    /// erf(u) = u·P(u²)/Q(u²) for |u| < ERF_CLAMP (see `erf`).
    pub(super) const ERF_CLAMP: f32 = 4.0;
    pub(super) const ERF_P: [f32; 6] = [
        std::f32::consts::FRAC_2_SQRT_PI,
        1.9455428e-01,
        5.3238638e-02,
        3.927603e-03,
        2.8570523e-04,
        1.9808706e-06,
    ];
    pub(super) const ERF_Q: [f32; 6] = [
        1.0,
        5.0575167e-01,
        1.1577019e-01,
        1.5295738e-02,
        1.1965742e-03,
        3.741861e-05,
    ];
    /// tanh(x) = x·P(x²)/Q(x²) for |x| < TANH_CLAMP (see `tanh`).
    pub(super) const TANH_CLAMP: f32 = 9.0;
    pub(super) const TANH_P: [f32; 5] = [
        1.0,
        1.3380408e-01,
        3.4948646e-03,
        2.0597783e-05,
        1.334031e-08,
    ];
    pub(super) const TANH_Q: [f32; 5] =
        [1.0, 4.6713725e-01, 2.58742e-02, 3.284476e-04, 7.7704016e-07];

    #[inline(always)]
    unsafe fn sigmoid(x: __m256) -> __m256 {
        // exp(87) is finite, so the reciprocal never sees inf; below -87 the result is 0 and
        // above 87 it is 1 (exp_core needs its argument inside [-87.3, 88.7])
        let xc = _mm256_min_ps(_mm256_max_ps(x, set(-87.0)), set(87.0));
        let s = recip(_mm256_add_ps(
            set(1.0),
            exp_core(_mm256_sub_ps(_mm256_setzero_ps(), xc)),
        ));
        let s = _mm256_blendv_ps(
            s,
            _mm256_setzero_ps(),
            _mm256_cmp_ps::<_CMP_LT_OQ>(x, set(-87.0)),
        );
        _mm256_blendv_ps(s, x, _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x))
    }

    #[inline(always)]
    unsafe fn abs(x: __m256) -> __m256 {
        _mm256_andnot_ps(set(-0.0), x)
    }

    /// |x| with the sign of `s`.
    #[inline(always)]
    unsafe fn with_sign(mag: __m256, s: __m256) -> __m256 {
        _mm256_or_ps(mag, _mm256_and_ps(s, set(-0.0)))
    }

    /// erf as u·P(u²)/Q(u²) on |u| ≤ 4, ±1 beyond (float32 erf rounds to ±1 there). The
    /// coefficients are this crate's own weighted least-squares fit (degree 5/5 in u², P(0) = 2/√π):
    /// |error| ≤ 2.4e-8 in exact arithmetic, ≤ 4.5e-7 evaluated in float32; GELU multiplies it
    /// by x/2. The result is clamped to [−1, 1], so 1 + erf is exactly 0 where erf saturates low.
    #[inline(always)]
    unsafe fn erf(u: __m256) -> __m256 {
        // min/max take their first operand's NaN through: NaN in, NaN out
        let uc = _mm256_max_ps(set(-ERF_CLAMP), _mm256_min_ps(set(ERF_CLAMP), u));
        let t = _mm256_mul_ps(uc, uc);
        let mut p = set(ERF_P[5]);
        for c in [ERF_P[4], ERF_P[3], ERF_P[2], ERF_P[1], ERF_P[0]] {
            p = _mm256_fmadd_ps(p, t, set(c));
        }
        let mut q = set(ERF_Q[5]);
        for c in [ERF_Q[4], ERF_Q[3], ERF_Q[2], ERF_Q[1], ERF_Q[0]] {
            q = _mm256_fmadd_ps(q, t, set(c));
        }
        let e = _mm256_div_ps(_mm256_mul_ps(uc, p), q);
        _mm256_max_ps(set(-1.0), _mm256_min_ps(set(1.0), e))
    }

    /// tanh as x·P(x²)/Q(x²) on |x| ≤ 9 (±1 beyond, where float32 tanh rounds to ±1). The
    /// coefficients are this crate's own weighted least-squares fit of tanh (degree 4/4 in x²,
    /// P(0) = Q(0) = 1 so that tanh(x) = x for tiny x): |error| ≤ 2.1e-8 in exact arithmetic,
    /// ≤ 3.5e-7 (≈ 3 ulp near ±1) evaluated in float32. One division, no exp, no branch blend
    /// between a series and the exp form.
    #[inline(always)]
    unsafe fn tanh(x: __m256) -> __m256 {
        // min/max take their first operand's NaN through: NaN in, NaN out
        let xc = _mm256_max_ps(set(-TANH_CLAMP), _mm256_min_ps(set(TANH_CLAMP), x));
        let t = _mm256_mul_ps(xc, xc);
        let mut p = set(TANH_P[4]);
        for c in [TANH_P[3], TANH_P[2], TANH_P[1], TANH_P[0]] {
            p = _mm256_fmadd_ps(p, t, set(c));
        }
        let mut q = set(TANH_Q[4]);
        for c in [TANH_Q[3], TANH_Q[2], TANH_Q[1], TANH_Q[0]] {
            q = _mm256_fmadd_ps(q, t, set(c));
        }
        let y = _mm256_div_ps(_mm256_mul_ps(xc, p), q);
        let sat = _mm256_cmp_ps::<_CMP_GE_OQ>(abs(x), set(TANH_CLAMP));
        _mm256_blendv_ps(y, with_sign(set(1.0), x), sat)
    }

    /// GELU (erf form): x/2 · (1 + erf(x/√2)). erf is ±1 where it saturates, so +inf gives inf
    /// and −inf gives NaN (−inf · 0), as PyTorch's CPU kernel does; NaN stays NaN.
    #[inline(always)]
    unsafe fn gelu(x: __m256) -> __m256 {
        let e = erf(_mm256_mul_ps(x, set(std::f32::consts::FRAC_1_SQRT_2)));
        _mm256_mul_ps(_mm256_mul_ps(set(0.5), x), _mm256_add_ps(set(1.0), e))
    }

    /// GELU (tanh form): x/2 · (1 + tanh(√(2/π)·x·(1 + 0.044715·x²))), the same inf / NaN
    /// behaviour as the erf form.
    #[inline(always)]
    unsafe fn gelu_tanh(x: __m256) -> __m256 {
        let s = _mm256_fmadd_ps(_mm256_mul_ps(x, x), set(0.044_715), set(1.0));
        let th = tanh(_mm256_mul_ps(_mm256_mul_ps(set(0.797_884_6), x), s));
        let h = _mm256_mul_ps(set(0.5), x);
        _mm256_fmadd_ps(h, th, h)
    }

    /// out[i] = op(inp[i]) for the ops this module covers; false for any other op.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn un_avx2(op: Un, out: &mut [f32], inp: &[f32]) -> bool {
        // one loop per op (the match outside it), so each loop body is the op's straight-line code
        match op {
            Un::Exp => map(out, inp, |x| exp(x)),
            Un::Sigmoid => map(out, inp, |x| sigmoid(x)),
            // -inf * 0 is NaN in PyTorch as well; keep that
            Un::Silu => map(out, inp, |x| _mm256_mul_ps(x, sigmoid(x))),
            Un::Tanh => map(out, inp, |x| tanh(x)),
            Un::Relu => map(out, inp, |x| {
                _mm256_and_ps(x, _mm256_cmp_ps::<_CMP_NLT_UQ>(x, _mm256_setzero_ps()))
            }),
            Un::GeluErf => map(out, inp, |x| gelu(x)),
            Un::GeluTanh => map(out, inp, |x| gelu_tanh(x)),
            _ => return false,
        }
        true
    }

    /// out[i] = f(inp[i]), two vectors per step, the tail through a padded vector.
    #[inline(always)]
    unsafe fn map(out: &mut [f32], inp: &[f32], f: impl Fn(__m256) -> __m256) {
        let n = out.len().min(inp.len());
        let (ip, op_) = (inp.as_ptr(), out.as_mut_ptr());
        let mut i = 0;
        while i + 16 <= n {
            let (x0, x1) = (_mm256_loadu_ps(ip.add(i)), _mm256_loadu_ps(ip.add(i + 8)));
            _mm256_storeu_ps(op_.add(i), f(x0));
            _mm256_storeu_ps(op_.add(i + 8), f(x1));
            i += 16;
        }
        while i + 8 <= n {
            _mm256_storeu_ps(op_.add(i), f(_mm256_loadu_ps(ip.add(i))));
            i += 8;
        }
        if i < n {
            let mut buf = [0f32; 8];
            buf[..n - i].copy_from_slice(&inp[i..n]);
            _mm256_storeu_ps(buf.as_mut_ptr(), f(_mm256_loadu_ps(buf.as_ptr())));
            out[i..n].copy_from_slice(&buf[..n - i]);
        }
    }

    #[inline(always)]
    unsafe fn hmax(v: __m256) -> f32 {
        let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let m = _mm_max_ss(m, _mm_shuffle_ps::<1>(m, m));
        _mm_cvtss_f32(m)
    }

    /// Sum of the eight lanes (the one horizontal sum the crate's AVX2 kernels share).
    ///
    /// # Safety
    /// The CPU must have AVX; call it from AVX2 code (it is inlined into its caller).
    #[inline(always)]
    pub unsafe fn hsum(v: __m256) -> f32 {
        let m = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let m = _mm_add_ps(m, _mm_movehl_ps(m, m));
        let m = _mm_add_ss(m, _mm_shuffle_ps::<1>(m, m));
        _mm_cvtss_f32(m)
    }

    /// Mask of the first `rem` (< 8) lanes.
    #[inline(always)]
    unsafe fn tail_mask(rem: usize) -> __m256i {
        let idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        _mm256_cmpgt_epi32(_mm256_set1_epi32(rem as i32), idx)
    }

    /// Largest element of a row, NaN if any element is NaN.
    #[inline(always)]
    unsafe fn row_max_nan(x: *const f32, n: usize) -> f32 {
        let ninf = set(f32::NEG_INFINITY);
        let (mut m0, mut m1) = (ninf, ninf);
        let mut nan = _mm256_setzero_ps();
        let mut i = 0;
        while i + 16 <= n {
            let (a, b) = (_mm256_loadu_ps(x.add(i)), _mm256_loadu_ps(x.add(i + 8)));
            nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(a, b));
            m0 = _mm256_max_ps(m0, a);
            m1 = _mm256_max_ps(m1, b);
            i += 16;
        }
        while i < n {
            let v = if n - i >= 8 {
                _mm256_loadu_ps(x.add(i))
            } else {
                _mm256_blendv_ps(
                    ninf,
                    _mm256_maskload_ps(x.add(i), tail_mask(n - i)),
                    _mm256_castsi256_ps(tail_mask(n - i)),
                )
            };
            nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
            m0 = _mm256_max_ps(m0, v);
            i += 8;
        }
        if _mm256_movemask_ps(nan) != 0 {
            return f32::NAN;
        }
        hmax(_mm256_max_ps(m0, m1))
    }

    /// `exp_nonpos` that keeps NaN (NaN in, NaN out, as the AVX-512 `exp_shift_sum` does): a
    /// NaN score must make its softmax row NaN, not drop out of it.
    #[inline(always)]
    unsafe fn exp_nonpos_nan(d: __m256) -> __m256 {
        _mm256_blendv_ps(exp_nonpos(d), d, _mm256_cmp_ps::<_CMP_UNORD_Q>(d, d))
    }

    /// y[i] = exp(x[i] - shift) (x may be y); returns the sum of the new values (NaN where an
    /// x[i] or the shift is NaN).
    #[inline(always)]
    unsafe fn exp_shift_store_sum(x: *const f32, y: *mut f32, n: usize, shift: f32) -> f32 {
        let sh = set(shift);
        let (mut s0, mut s1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut i = 0;
        while i + 16 <= n {
            let a = exp_nonpos_nan(_mm256_sub_ps(_mm256_loadu_ps(x.add(i)), sh));
            let b = exp_nonpos_nan(_mm256_sub_ps(_mm256_loadu_ps(x.add(i + 8)), sh));
            _mm256_storeu_ps(y.add(i), a);
            _mm256_storeu_ps(y.add(i + 8), b);
            s0 = _mm256_add_ps(s0, a);
            s1 = _mm256_add_ps(s1, b);
            i += 16;
        }
        while i < n {
            let k = tail_mask((n - i).min(8));
            let v = exp_nonpos_nan(_mm256_sub_ps(_mm256_maskload_ps(x.add(i), k), sh));
            let v = _mm256_and_ps(v, _mm256_castsi256_ps(k));
            _mm256_maskstore_ps(y.add(i), k, v);
            s0 = _mm256_add_ps(s0, v);
            i += 8;
        }
        hsum(_mm256_add_ps(s0, s1))
    }

    /// row[i] = exp(row[i] - shift) for shift >= max(row); returns the sum of the new values.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn exp_shift_sum_avx2(row: &mut [f32], shift: f32) -> f32 {
        exp_shift_store_sum(row.as_ptr(), row.as_mut_ptr(), row.len(), shift)
    }

    /// y[i] = x[i] * s (x may be y).
    #[inline(always)]
    unsafe fn scale(x: *const f32, y: *mut f32, n: usize, s: f32) {
        let sv = set(s);
        let mut i = 0;
        while i + 8 <= n {
            _mm256_storeu_ps(y.add(i), _mm256_mul_ps(_mm256_loadu_ps(x.add(i)), sv));
            i += 8;
        }
        for j in i..n {
            *y.add(j) = *x.add(j) * s;
        }
    }

    /// Softmax / log-softmax of one contiguous row whose max is already known to be finite
    /// or -inf (no NaN): y = exp(x - max) with its sum in the same pass, then one scaling pass
    /// over y while it is still in cache. Each element's exponential is computed once.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA; `x` and `y` hold `n` elements.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn softmax_row_avx2(x: *const f32, y: *mut f32, n: usize, log: bool) {
        if n == 0 {
            return;
        }
        let mx = row_max_nan(x, n);
        // a NaN anywhere, or an inf (exp(x - inf) is NaN for the inf entries): PyTorch gives NaN rows
        if mx.is_nan() || mx == f32::INFINITY {
            std::slice::from_raw_parts_mut(y, n).fill(f32::NAN);
            return;
        }
        // an all -inf row gives NaN in PyTorch (exp(-inf + inf)): shift by 0 and divide 0 by 0
        let shift = if mx == f32::NEG_INFINITY { 0.0 } else { mx };
        if log {
            // log-softmax never stores the exponentials: sum them, then one subtracting pass
            let mut i = 0;
            let sh = set(shift);
            let (mut s0, mut s1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            while i + 16 <= n {
                s0 = _mm256_add_ps(s0, exp_nonpos(_mm256_sub_ps(_mm256_loadu_ps(x.add(i)), sh)));
                s1 = _mm256_add_ps(
                    s1,
                    exp_nonpos(_mm256_sub_ps(_mm256_loadu_ps(x.add(i + 8)), sh)),
                );
                i += 16;
            }
            while i < n {
                let k = tail_mask((n - i).min(8));
                let v = exp_nonpos(_mm256_sub_ps(_mm256_maskload_ps(x.add(i), k), sh));
                s0 = _mm256_add_ps(s0, _mm256_and_ps(v, _mm256_castsi256_ps(k)));
                i += 8;
            }
            let sub = shift + hsum(_mm256_add_ps(s0, s1)).ln();
            let sv = set(sub);
            let mut i = 0;
            while i + 8 <= n {
                _mm256_storeu_ps(y.add(i), _mm256_sub_ps(_mm256_loadu_ps(x.add(i)), sv));
                i += 8;
            }
            for j in i..n {
                *y.add(j) = *x.add(j) - sub;
            }
            return;
        }
        let sum = exp_shift_store_sum(x, y, n, shift);
        scale(y, y, n, 1.0 / sum);
    }
}

#[cfg(target_arch = "x86_64")]
pub use imp2::{exp_shift_sum_avx2, hsum as hsum256, softmax_row_avx2, un_avx2};

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use crate::core::math::unary::Un;

    fn reference(op: Un, x: f32) -> f64 {
        let xd = x as f64;
        let phi = |x: f64| 0.5 * (1.0 + libm::erf(x / std::f64::consts::SQRT_2));
        match op {
            Un::Exp => xd.exp(),
            Un::Sigmoid => 1.0 / (1.0 + (-xd).exp()),
            Un::Silu => xd / (1.0 + (-xd).exp()),
            Un::Tanh => xd.tanh(),
            Un::Relu => xd.max(0.0),
            Un::GeluTanh => {
                if x == f32::NEG_INFINITY {
                    f64::NAN
                } else if x == f32::INFINITY {
                    f64::INFINITY
                } else {
                    let k = (2.0 / std::f64::consts::PI).sqrt();
                    0.5 * xd * (1.0 + (k * (xd + 0.044_715 * xd * xd * xd)).tanh())
                }
            }
            _ => {
                if x == f32::NEG_INFINITY {
                    f64::NAN
                } else if x == f32::INFINITY {
                    f64::INFINITY
                } else {
                    xd * phi(xd)
                }
            }
        }
    }

    fn check_close(op: Un, xs: &[f32], out: &[f32]) {
        for (&x, &y) in xs.iter().zip(out) {
            let want = reference(op, x);
            if want.is_nan() || x.is_nan() {
                assert!(y.is_nan(), "{op:?}({x}) = {y}, want NaN");
                continue;
            }
            let want = if want.abs() > f32::MAX as f64 {
                want.signum() * f64::INFINITY
            } else {
                want
            };
            let err = (y as f64 - want).abs();
            // float32 assert_close: atol 1e-5, rtol 1.3e-6
            assert!(
                err <= 1e-6 + 1.3e-6 * want.abs() || (want.is_infinite() && y as f64 == want),
                "{op:?}({x}) = {y}, want {want}"
            );
        }
    }

    fn inputs() -> Vec<f32> {
        let mut xs: Vec<f32> = (0..40000).map(|i| -20.0 + i as f32 * 0.001).collect();
        xs.extend([
            0.0, -0.0, 1e-30, -1e-30, 0.06, -0.0624, 88.0, 88.5, 88.8, 89.0, -87.2, -87.5, -100.0,
            -104.5, 200.0,
        ]);
        xs.extend([f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 3.0, 1e-3, -1e-3]);
        xs
    }

    #[test]
    fn avx2_activations_match_reference_at_every_length() {
        if !crate::core::isa::has_avx2() {
            return;
        }
        let xs = inputs();
        let ops = [Un::Exp, Un::Sigmoid, Un::Silu, Un::GeluErf, Un::GeluTanh, Un::Tanh, Un::Relu];
        match_reference_at_every_length(un_avx2, &ops, &xs, 16);
        let mut out = vec![0f32; xs.len()];
        assert!(!unsafe { un_avx2(Un::Log, &mut out, &xs) });
    }

    #[test]
    fn avx2_tanh_is_exact_at_the_edges() {
        if crate::core::isa::has_avx2() {
            tanh_is_exact_at_the_edges(un_avx2);
        }
    }

    #[test]
    fn avx512_gelu_saturates_exactly() {
        if !crate::core::isa::has_avx512() {
            return;
        }
        // around the clamp (4·√2 = 5.65685) and far beyond it, both signs
        let xs = [-5.656_854f32, -5.66, -10.0, -1e6, -3e38, 5.656_854, 5.66, 10.0, 1e6, 3e30];
        let mut out = [0f32; 10];
        assert!(unsafe { un_avx512(Un::GeluErf, &mut out, &xs) });
        for (&x, &y) in xs.iter().zip(&out) {
            if x < 0.0 {
                // erf saturated low: 1 + erf is exactly 0, never a sliver of a huge negative x
                assert!(y == 0.0, "gelu({x}) = {y}");
            } else {
                assert!(((y as f64 - x as f64) / x as f64).abs() < 2.5e-7, "gelu({x}) = {y}");
            }
        }
        let special = [f32::INFINITY, f32::NEG_INFINITY, f32::NAN];
        let mut out = [0f32; 3];
        assert!(unsafe { un_avx512(Un::GeluErf, &mut out, &special) });
        assert!(out[0] == f32::INFINITY && out[1].is_nan() && out[2].is_nan());
    }

    #[test]
    fn avx512_tanh_is_exact_at_the_edges() {
        if crate::core::isa::has_avx512() {
            tanh_is_exact_at_the_edges(un_avx512);
        }
    }

    fn tanh_is_exact_at_the_edges(run: unsafe fn(Un, &mut [f32], &[f32]) -> bool) {
        let xs = [
            9.0f32,
            -9.0,
            9.5,
            -30.0,
            1e30,
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.0,
            -0.0,
            1e-30,
            -1e-38,
            8.999_999,
        ];
        let mut out = [0f32; 12];
        assert!(unsafe { run(Un::Tanh, &mut out, &xs) });
        assert_eq!(&out[..7], &[1.0, -1.0, 1.0, -1.0, 1.0, 1.0, -1.0]);
        assert_eq!(out[7].to_bits(), 0.0f32.to_bits());
        assert_eq!(out[8].to_bits(), (-0.0f32).to_bits());
        assert_eq!(out[9], 1e-30);
        assert_eq!(out[10], -1e-38);
        assert!((out[11] as f64 - 8.999_999f64.tanh()).abs() < 4e-7);
        // fine sweep of the range the rational form covers: within 4e-7 of the f64 tanh
        for i in 0..=180_000 {
            let x = -9.0 + i as f32 * 1e-4;
            let mut y = [0f32; 1];
            assert!(unsafe { run(Un::Tanh, &mut y, &[x]) });
            assert!(
                (y[0] as f64 - (x as f64).tanh()).abs() <= 4e-7,
                "tanh({x}) = {}",
                y[0]
            );
        }
    }

    #[test]
    fn avx2_softmax_rows_match_reference() {
        if crate::core::isa::has_avx2() {
            softmax_rows_match_reference(softmax_row_avx2);
        }
    }

    #[test]
    fn avx512_softmax_rows_match_reference_in_both_forms() {
        if crate::core::isa::has_avx512() {
            softmax_rows_match_reference(softmax_short_row);
            softmax_rows_match_reference(softmax_online_row);
            softmax_rows_match_reference(softmax_row_avx512);
        }
    }

    /// Same-run timing of the two AVX-512 forms over 2048 rows (A B B A …, medians); not a
    /// pass/fail check: `cargo test --release --lib softmax_forms_timing -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn softmax_forms_timing() {
        if !crate::core::isa::has_avx512() {
            return;
        }
        for n in [256usize, 2048, 8192, 32768, 1 << 18, 1 << 20] {
            let rows = (1 << 22) / n;
            let x: Vec<f32> = (0..rows * n).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.1).collect();
            let mut y = vec![0f32; rows * n];
            let mut t = [Vec::new(), Vec::new()];
            for rep in 0..12 {
                for k in [rep % 2, 1 - rep % 2] {
                    let f: unsafe fn(*const f32, *mut f32, usize, bool) = if k == 0 { softmax_online_row } else { softmax_short_row };
                    let s = std::time::Instant::now();
                    for r in 0..rows {
                        unsafe { f(x.as_ptr().add(r * n), y.as_mut_ptr().add(r * n), n, false) };
                    }
                    t[k].push(s.elapsed().as_secs_f64());
                }
            }
            for v in &mut t {
                v.sort_by(|a, b| a.partial_cmp(b).unwrap());
            }
            println!("n={n} rows={rows}: online {:.3} ms, short {:.3} ms (1 thread)", t[0][6] * 1e3, t[1][6] * 1e3);
        }
    }

    fn softmax_rows_match_reference(run: unsafe fn(*const f32, *mut f32, usize, bool)) {
        for n in [1usize, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 100, 2048, 5000, SHORT_ROW, SHORT_ROW + 17] {
            let x: Vec<f32> = (0..n)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.3)
                .collect();
            let mx = x.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
            let sum: f64 = x.iter().map(|&v| (v as f64 - mx).exp()).sum();
            for log in [false, true] {
                let mut y = vec![0f32; n];
                unsafe { run(x.as_ptr(), y.as_mut_ptr(), n, log) };
                for (i, (&v, &got)) in x.iter().zip(&y).enumerate() {
                    let want = if log {
                        v as f64 - mx - sum.ln()
                    } else {
                        (v as f64 - mx).exp() / sum
                    };
                    assert!(
                        (got as f64 - want).abs() <= 1e-6 + 1e-5 * want.abs(),
                        "n={n} log={log} [{i}]: {got} vs {want}"
                    );
                }
            }
        }
        for n in [11usize, 40] {
            for log in [false, true] {
                // NaN or +inf anywhere -> NaN row; an all -inf row -> NaN (as PyTorch)
                let mut y = vec![0f32; n];
                for bad in [f32::NAN, f32::INFINITY] {
                    for at in [0, n / 2, n - 1] {
                        let mut x = vec![1f32; n];
                        x[at] = bad;
                        unsafe { run(x.as_ptr(), y.as_mut_ptr(), n, log) };
                        assert!(y.iter().all(|v| v.is_nan()), "n={n} log={log} {bad} at {at}: {y:?}");
                    }
                }
                let x = vec![f32::NEG_INFINITY; n];
                unsafe { run(x.as_ptr(), y.as_mut_ptr(), n, log) };
                assert!(y.iter().all(|v| v.is_nan()), "n={n} log={log} all -inf: {y:?}");
                // -inf entries -> 0 (log: -inf) beside one finite entry
                let mut x = vec![f32::NEG_INFINITY; n];
                x[n - 2] = 2.0;
                unsafe { run(x.as_ptr(), y.as_mut_ptr(), n, log) };
                for (i, &v) in y.iter().enumerate() {
                    let want = match (i == n - 2, log) {
                        (true, false) => 1.0,
                        (true, true) => 0.0,
                        (false, false) => 0.0,
                        (false, true) => f32::NEG_INFINITY,
                    };
                    assert_eq!(v, want, "n={n} log={log} [{i}]");
                }
            }
        }
    }

    #[test]
    fn avx512_activations_match_reference() {
        if !crate::core::isa::has_avx512() {
            return;
        }
        let mut xs = inputs();
        xs.extend([
            89.0,
            -104.5,
            9.0,
            -9.0,
            8.999_999,
            4.0 * std::f32::consts::SQRT_2,
            -4.0 * std::f32::consts::SQRT_2,
            1e30,
            -1e30,
        ]);
        let ops = [Un::Exp, Un::Sigmoid, Un::Silu, Un::GeluErf, Un::GeluTanh, Un::Tanh];
        match_reference_at_every_length(un_avx512, &ops, &xs, 32);
        let mut out = vec![0f32; xs.len()];
        assert!(!unsafe { un_avx512(Un::Relu, &mut out, &xs) });
    }

    /// Every op over `xs`, then every tail length up to `tails` at an odd offset.
    fn match_reference_at_every_length(run: unsafe fn(Un, &mut [f32], &[f32]) -> bool, ops: &[Un], xs: &[f32], tails: usize) {
        let mut out = vec![0f32; xs.len()];
        for &op in ops {
            assert!(unsafe { run(op, &mut out, xs) });
            check_close(op, xs, &out);
            for len in 0..=tails {
                let mut o = vec![7f32; len];
                assert!(unsafe { run(op, &mut o, &xs[3..3 + len]) });
                check_close(op, &xs[3..3 + len], &o);
            }
        }
    }
}

#[cfg(test)]
mod exp_shift_tests {
    /// exp(x - shift) per element and its sum on AVX2 (and AVX-512 where the CPU has it), against
    /// the scalar exp: NaN in, NaN out (element and sum), -inf to 0, every tail length.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn exp_shift_sum_keeps_nan_and_matches_scalar() {
        for n in [1usize, 7, 8, 9, 16, 17, 33] {
            for nan_at in [None, Some(0), Some(n - 1), Some(n / 2)] {
                let mut row: Vec<f32> = (0..n).map(|i| -(i as f32) * 0.37).collect();
                if n > 2 {
                    row[1] = f32::NEG_INFINITY;
                }
                if let Some(j) = nan_at {
                    row[j] = f32::NAN;
                }
                let want: Vec<f32> = row.iter().map(|&x| super::super::scalar::exp(x - 0.25)).collect();
                let mut runs: Vec<(&str, Vec<f32>, f32)> = Vec::new();
                if crate::core::isa::has_avx2() {
                    let mut r = row.clone();
                    // SAFETY: the CPU has AVX2 and FMA
                    let s = unsafe { super::exp_shift_sum_avx2(&mut r, 0.25) };
                    runs.push(("avx2", r, s));
                }
                if crate::core::isa::has_avx512() {
                    let mut r = row.clone();
                    // SAFETY: the CPU has AVX-512F
                    let s = unsafe { super::exp_shift_sum_avx512(&mut r, 0.25) };
                    runs.push(("avx512", r, s));
                }
                for (isa, got, sum) in runs {
                    for (g, w) in got.iter().zip(&want) {
                        assert!((g.is_nan() && w.is_nan()) || (g - w).abs() <= 1e-6 * w.abs().max(1e-30), "{isa} n {n}: {g} vs {w}");
                    }
                    assert_eq!(sum.is_nan(), nan_at.is_some(), "{isa} n {n}: sum {sum}");
                }
            }
        }
    }
}
