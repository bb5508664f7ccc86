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
    for b in 0..nb {
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

#[cfg(test)]
mod tests {
    use super::*;

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
