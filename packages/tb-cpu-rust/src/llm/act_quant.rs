//! Dynamic int8 quantization of one activation row, in blocks of 32 values (as llama.cpp's
//! Q8_0): each block has its own scale, so an outlier only costs precision in its own block.
//!
//! The row is zero-padded to `kp` (a multiple of 128) so the kernels never need a tail loop:
//! padded values quantize to 0 and contribute nothing to any dot product.

pub const QBLOCK: usize = 32;
const ROUND: f32 = 12_582_912.0;

pub struct QuantRow {
    /// quantized values, `kp` of them (zero past `k`)
    pub q: Vec<i8>,
    /// one scale per block of 32
    pub scale: Vec<f32>,
    /// sum of the quantized values of each block
    pub qsum: Vec<i32>,
    /// per 64-value chunk, 16 lanes: lanes 0..8 hold the scale of the chunk's first block,
    /// lanes 8..16 that of its second (the layout of a 512-bit VNNI accumulator)
    pub lane_scale: Vec<f32>,
}

pub fn round_up(k: usize, to: usize) -> usize {
    k.div_ceil(to) * to
}

pub fn quantize_row(x: &[f32], kp: usize) -> QuantRow {
    debug_assert!(kp >= x.len() && kp.is_multiple_of(128));
    let nb = kp / QBLOCK;
    let mut q = vec![0i8; kp];
    let mut scale = vec![0f32; nb];
    let mut qsum = vec![0i32; nb];
    // whole blocks of 32 with AVX2 (same values: see `x86::block`), the rest as below
    #[cfg(target_arch = "x86_64")]
    let first = if crate::core::isa::has_avx2() {
        let whole = x.len() / QBLOCK;
        for b in 0..whole {
            // SAFETY: AVX2 and FMA present; block b lies within x and q (kp >= x.len())
            let (s, sum) = unsafe { x86::block(x.as_ptr().add(b * QBLOCK), q.as_mut_ptr().add(b * QBLOCK)) };
            scale[b] = s;
            qsum[b] = sum;
        }
        whole
    } else {
        0
    };
    #[cfg(not(target_arch = "x86_64"))]
    let first = 0;
    for b in first..nb {
        let lo = (b * QBLOCK).min(x.len());
        let hi = ((b + 1) * QBLOCK).min(x.len());
        let xs = &x[lo..hi];
        let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        if amax == 0.0 || !amax.is_finite() {
            continue;
        }
        let s = amax / 127.0;
        let inv = 1.0 / s;
        let mut sum = 0i32;
        for (d, v) in q[lo..hi].iter_mut().zip(xs) {
            // round to nearest (ties to even) by adding and removing 1.5 * 2^23: |v * inv| <= 127,
            // and unlike `f32::round` (a libm call on the baseline target) it vectorizes
            let r = ((v * inv + ROUND) - ROUND) as i32;
            *d = r as i8;
            sum += r;
        }
        scale[b] = s;
        qsum[b] = sum;
    }
    let mut lane_scale = vec![0f32; kp / 64 * 16];
    for c in 0..kp / 64 {
        for l in 0..16 {
            lane_scale[c * 16 + l] = scale[2 * c + l / 8];
        }
    }
    QuantRow { q, scale, qsum, lane_scale }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::ROUND;
    use std::arch::x86_64::*;

    /// One block of 32 values at `x` quantized into `q`: (scale, sum of the codes), exactly as
    /// `quantize_row`'s loop does it: the largest magnitude ignores NaN (`f32::max`: the running
    /// maximum is the second operand of `max_ps`, which it returns when the other is NaN); a
    /// block whose largest magnitude is 0 or not finite keeps codes 0 and scale 0; codes round
    /// `v * (1 / s)` to nearest even by the same `ROUND` trick, and a NaN value gets code 0 (the
    /// scalar loop's saturating `as i32`).
    ///
    /// # Safety
    /// AVX2 and FMA; `x` valid for 32 reads, `q` for 32 writes.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn block(x: *const f32, q: *mut i8) -> (f32, i32) {
        let sign = _mm256_set1_ps(-0.0);
        let v = [_mm256_loadu_ps(x), _mm256_loadu_ps(x.add(8)), _mm256_loadu_ps(x.add(16)), _mm256_loadu_ps(x.add(24))];
        let mut m = _mm256_setzero_ps();
        for vi in v {
            m = _mm256_max_ps(_mm256_andnot_ps(sign, vi), m);
        }
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), m);
        let amax = lanes.iter().fold(0f32, |a, &b| a.max(b));
        if amax == 0.0 || !amax.is_finite() {
            return (0.0, 0);
        }
        let s = amax / 127.0;
        let inv = _mm256_set1_ps(1.0 / s);
        let round = _mm256_set1_ps(ROUND);
        let mut r = [_mm256_setzero_si256(); 4];
        for (ri, vi) in r.iter_mut().zip(v) {
            let t = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(vi, inv), round), round);
            // NaN -> 0 (ordered compare is false for NaN)
            let t = _mm256_and_ps(t, _mm256_cmp_ps::<_CMP_ORD_Q>(t, t));
            *ri = _mm256_cvttps_epi32(t);
        }
        // i32 -> i8 keeping order: packs interleave 128-bit lanes, the permute puts them back
        let w01 = _mm256_packs_epi32(r[0], r[1]);
        let w23 = _mm256_packs_epi32(r[2], r[3]);
        let b = _mm256_packs_epi16(w01, w23);
        let b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(q as *mut __m256i, b);
        let sum = _mm256_add_epi32(_mm256_add_epi32(r[0], r[1]), _mm256_add_epi32(r[2], r[3]));
        let mut s32 = [0i32; 8];
        _mm256_storeu_si256(s32.as_mut_ptr() as *mut __m256i, sum);
        (s, s32.iter().sum())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The loop of `quantize_row` alone (the reference the AVX2 blocks must equal).
    fn scalar(x: &[f32], kp: usize) -> (Vec<i8>, Vec<f32>, Vec<i32>) {
        let nb = kp / QBLOCK;
        let (mut q, mut scale, mut qsum) = (vec![0i8; kp], vec![0f32; nb], vec![0i32; nb]);
        for b in 0..nb {
            let (lo, hi) = ((b * QBLOCK).min(x.len()), ((b + 1) * QBLOCK).min(x.len()));
            let amax = x[lo..hi].iter().fold(0f32, |m, v| m.max(v.abs()));
            if amax == 0.0 || !amax.is_finite() {
                continue;
            }
            let s = amax / 127.0;
            let inv = 1.0 / s;
            for (d, v) in q[lo..hi].iter_mut().zip(&x[lo..hi]) {
                let r = ((v * inv + ROUND) - ROUND) as i32;
                *d = r as i8;
                qsum[b] += r;
            }
            scale[b] = s;
        }
        (q, scale, qsum)
    }

    #[test]
    fn vector_blocks_equal_the_scalar_loop() {
        let mut s = 5u64;
        let mut next = || {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 8.0
        };
        for &k in &[1usize, 31, 32, 33, 64, 100, 128, 896, 1000] {
            for case in 0..8 {
                let mut x: Vec<f32> = (0..k).map(|_| next()).collect();
                match case {
                    1 => x.iter_mut().step_by(7).for_each(|v| *v = f32::NAN),
                    2 => x[k / 2] = f32::INFINITY,
                    3 => x.iter_mut().for_each(|v| *v = 0.0),
                    4 => x.iter_mut().enumerate().for_each(|(i, v)| *v = if i % 2 == 0 { 0.5 } else { -1.5 }), // exact ties
                    5 => x.iter_mut().for_each(|v| *v *= 1e-30),
                    6 => x[0] = f32::NEG_INFINITY,
                    7 => x.iter_mut().for_each(|v| *v = -0.0),
                    _ => {}
                }
                let kp = round_up(k, 128);
                let r = quantize_row(&x, kp);
                let (q, scale, qsum) = scalar(&x, kp);
                assert_eq!(r.q, q, "k {k} case {case}");
                assert_eq!(r.scale.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), scale.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "k {k} case {case}");
                assert_eq!(r.qsum, qsum, "k {k} case {case}");
            }
        }
    }

    #[test]
    fn quantize_roundtrip_within_half_step() {
        let x: Vec<f32> = (0..100).map(|i| ((i * 37 % 17) as f32 - 8.0) * 0.3).collect();
        let r = quantize_row(&x, 128);
        for (i, v) in x.iter().enumerate() {
            let s = r.scale[i / QBLOCK];
            assert!((r.q[i] as f32 * s - v).abs() <= 0.5 * s + 1e-6);
        }
        assert!(r.q[100..].iter().all(|&v| v == 0));
        assert_eq!(r.qsum[0], r.q[..32].iter().map(|&v| v as i32).sum::<i32>());
    }
}
