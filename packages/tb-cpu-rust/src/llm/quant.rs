//! Load-time weight quantization straight from the checkpoint's f32 / bf16 data, with the
//! same numbers as tb-llm's `torchburn.llm` (the Python quantizer is the specification; the
//! tests check bit equality against it), and over rayon's pool, so `from_pretrained` does not
//! spend seconds in PyTorch's elementwise ops on a 0.5B model.
//!
//! * int8: `s = max(amax|w|, 1e-12) / 127`, `q = clamp(round_half_even(w / s), -127, 127)`.
//! * int4: per group `lo, hi = min, max`, `s = f16(max((hi - lo) / 15, 2^-24))`,
//!   `z = f16(lo + 8 s)`, `q = clamp(round_half_even((w - z) / s) + 8, 0, 15)`, where `f16`
//!   rounds to the nearest float16 value (the kernels keep scales and zeros as binary16); a
//!   scale or zero beyond float16's range is an error.
//!
//! Every step is one f32 operation, in PyTorch's order, and never fused into an FMA.

use super::half::round_f16;
use super::huge::HugeBuf;
use super::packed::{int4_tiles, Packed, Result};
use rayon::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering};

/// PyTorch's `clamp(min=1e-12)` on f32: the Python float rounded to f32.
const TINY: f32 = 1e-12f64 as f32;
/// The smallest positive float16 (2^-24): the int4 scale's floor, so it never rounds to 0.
const TINY_F16: f32 = 1.0 / 16_777_216.0;

/// A row-major `[N, K]` weight as stored in the checkpoint.
#[derive(Clone, Copy)]
pub enum Src<'a> {
    F32(&'a [f32]),
    Bf16(&'a [u16]),
}

impl Src<'_> {
    fn len(&self) -> usize {
        match self {
            Src::F32(w) => w.len(),
            Src::Bf16(w) => w.len(),
        }
    }

    /// Row `r` (of `k` values) as f32, in `buf`.
    fn row<'b>(&'b self, r: usize, k: usize, buf: &'b mut Vec<f32>) -> &'b [f32] {
        match self {
            Src::F32(w) => &w[r * k..(r + 1) * k],
            Src::Bf16(w) => {
                buf.clear();
                buf.extend(w[r * k..(r + 1) * k].iter().map(|&b| f32::from_bits((b as u32) << 16)));
                buf
            }
        }
    }
}

/// Round to nearest, ties to even, for |x| <= 2^22 (every quotient here is within [-127, 127]):
/// adding and removing 1.5 * 2^23 does it in two vectorizable adds, where `round_ties_even` is a
/// libm call per value on the baseline x86-64 target (no SSE4.1 `roundps`).
#[inline(always)]
fn rne(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (x + MAGIC) - MAGIC
}

/// One row to int8; returns its scale. (Comparisons written as `if a > m` so they vectorize
/// to `maxps`; a NaN weight is skipped, where PyTorch's amax would propagate it.)
pub fn int8_row(w: &[f32], q: &mut [i8]) -> f32 {
    let amax = w.iter().fold(0f32, |m, v| if v.abs() > m { v.abs() } else { m });
    let s = amax.max(TINY) / 127.0;
    for (d, &v) in q.iter_mut().zip(w) {
        *d = rne(v / s).clamp(-127.0, 127.0) as i8;
    }
    s
}

/// One group to unsigned nibbles (one per byte of `q`); returns its scale and zero (float16
/// values), or None when one of them is beyond float16's range.
pub fn int4_group(w: &[f32], q: &mut [u8]) -> Option<(f32, f32)> {
    let (mut lo, mut hi) = (w[0], w[0]);
    for &v in w {
        lo = if v < lo { v } else { lo };
        hi = if v > hi { v } else { hi };
    }
    let s = round_f16(((hi - lo) / 15.0).max(TINY_F16));
    let z = round_f16(lo + 8.0 * s);
    if !(s.is_finite() && z.is_finite()) {
        return None;
    }
    for (d, &v) in q.iter_mut().zip(w) {
        // (v - z) / s is within [-8, 7] up to the rounding of s and z; far outside only when
        // s is tiny, where `rne`'s 2^22 limit no longer matters: the clamp decides
        *d = (rne((v - z) / s) + 8.0).clamp(0.0, 15.0) as u8;
    }
    Some((s, z))
}

fn check(src: &Src, n: usize, k: usize) -> Result<()> {
    if src.len() != n * k || k == 0 {
        return Err(format!("weight has {} elements, expected {n} x {k}", src.len()));
    }
    Ok(())
}

/// the int8 layout of `torchburn.llm`: `q` `[N, K]`, `scale` `[N]`.
pub fn int8(src: Src, n: usize, k: usize) -> Result<(Vec<i8>, Vec<f32>)> {
    check(&src, n, k)?;
    let mut q = vec![0i8; n * k];
    let mut scale = vec![0f32; n];
    q.par_chunks_mut(k).zip(scale.par_iter_mut()).enumerate().for_each_init(Vec::new, |buf, (r, (qr, s))| {
        *s = int8_row(src.row(r, k, buf), qr);
    });
    Ok((q, scale))
}

/// the int4 layout of `torchburn.llm`: `packed` `[N, K / 2]` (column `2j` in the low nibble), `scale` and
/// `zero` `[N, K / G]`.
pub fn int4(src: Src, n: usize, k: usize, group: usize) -> Result<(Vec<u8>, Vec<f32>, Vec<f32>)> {
    check(&src, n, k)?;
    check_group(k, group)?;
    let ng = k / group;
    let mut packed = vec![0u8; n * k / 2];
    let mut scale = vec![0f32; n * ng];
    let mut zero = vec![0f32; n * ng];
    let bad = AtomicUsize::new(0);
    packed
        .par_chunks_mut(k / 2)
        .zip(scale.par_chunks_mut(ng))
        .zip(zero.par_chunks_mut(ng))
        .enumerate()
        .for_each_init(
            || (Vec::new(), vec![0u8; k]),
            |(buf, nib), (r, ((pr, sr), zr))| {
                if !int4_row(src.row(r, k, buf), group, nib, sr, zr) {
                    bad.fetch_add(1, Ordering::Relaxed);
                }
                for (j, b) in pr.iter_mut().enumerate() {
                    *b = nib[2 * j] | (nib[2 * j + 1] << 4);
                }
            },
        );
    match bad.into_inner() {
        0 => Ok((packed, scale, zero)),
        rows => Err(out_of_f16_range(rows)),
    }
}

fn check_group(k: usize, group: usize) -> Result<()> {
    if !matches!(group, 32 | 64 | 128) || !k.is_multiple_of(group) {
        return Err(format!("int4 group size must be 32, 64 or 128 and divide K={k}, got {group}"));
    }
    Ok(())
}

/// One row's groups; false when a group's scale or zero is beyond float16's range.
fn int4_row(w: &[f32], group: usize, nib: &mut [u8], sr: &mut [f32], zr: &mut [f32]) -> bool {
    for (g, (s, z)) in sr.iter_mut().zip(zr.iter_mut()).enumerate() {
        match int4_group(&w[g * group..(g + 1) * group], &mut nib[g * group..(g + 1) * group]) {
            Some(sz) => (*s, *z) = sz,
            None => return false,
        }
    }
    true
}

fn out_of_f16_range(n: usize) -> String {
    format!("int4: {n} row(s) have a group whose range is beyond float16 (|value| > 65504), which int4's float16 scales and zeros cannot hold; quantize this weight to int8 or keep it in bf16 / fp32")
}

/// Quantized and packed for the kernels in one pass (no tb-llm layout in between): the same
/// `Packed` as `Packed::int8(int8(src))`.
pub fn packed_int8(src: Src, n: usize, k: usize) -> Result<Packed> {
    check(&src, n, k)?;
    let kp = super::act_quant::round_up(k, 128);
    let mut w = HugeBuf::filled(n * kp, 128u8);
    let mut scale = vec![0f32; n];
    w.par_chunks_mut(kp).zip(scale.par_iter_mut()).enumerate().for_each_init(
        || (Vec::new(), vec![0i8; k]),
        |(buf, q), (r, (dst, s))| {
            *s = int8_row(src.row(r, k, buf), q);
            for (d, &v) in dst.iter_mut().zip(q.iter()) {
                *d = (v as i16 + 128) as u8;
            }
        },
    );
    Ok(Packed::Int8 { n, k, kp, w, scale })
}

/// As `packed_int8`, for int4: the same `Packed` as `Packed::int4(int4(src))`.
pub fn packed_int4(src: Src, n: usize, k: usize, group: usize) -> Result<Packed> {
    check(&src, n, k)?;
    check_group(k, group)?;
    let bad = AtomicUsize::new(0);
    let p = int4_tiles(n, k, group, |r, nib, sr, zr, buf| {
        if !int4_row(src.row(r, k, buf), group, nib, sr, zr) {
            bad.fetch_add(1, Ordering::Relaxed);
        }
    });
    match bad.into_inner() {
        0 => Ok(p),
        rows => Err(out_of_f16_range(rows)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn direct_packing_matches_two_step() {
        let (n, k) = (7, 256);
        let w: Vec<f32> = (0..n * k).map(|i| ((i * 7919 % 1013) as f32 - 506.0) * 1e-3).collect();
        let b: Vec<u16> = w.iter().map(|v| (v.to_bits() >> 16) as u16).collect();
        for src in [Src::F32(&w), Src::Bf16(&b)] {
            let (q, s) = int8(src, n, k).unwrap();
            let two = Packed::int8(n, k, &q, &s).unwrap();
            let one = packed_int8(src, n, k).unwrap();
            assert!(matches!((&one, &two), (Packed::Int8 { w: a, scale: x, .. }, Packed::Int8 { w: b, scale: y, .. }) if a == b && x == y));
            for g in [32, 64, 128] {
                let (p, s, z) = int4(src, n, k, g).unwrap();
                let two = Packed::int4(n, k, g, &p, &s, &z).unwrap();
                let one = packed_int4(src, n, k, g).unwrap();
                assert!(matches!((&one, &two), (Packed::Int4 { w: a, scale: x, zero: u, .. }, Packed::Int4 { w: b, scale: y, zero: v, .. }) if a == b && x == y && u == v));
            }
        }
    }

    #[test]
    fn constant_group_and_rounding() {
        // a constant group: the scale clamps to 2^-24 (float16's smallest), the zero rounds to
        // the value itself, every value maps to q = 8 and dequantizes exactly
        let mut q = [9u8; 32];
        let (s, z) = int4_group(&[0.5; 32], &mut q).unwrap();
        assert_eq!(s, TINY_F16);
        assert_eq!(z, 0.5);
        assert!(q.iter().all(|&v| v == 8));
        // scales and zeros are float16 values; the codes are taken against the rounded ones
        let w: Vec<f32> = (0..32).map(|i| 0.013 * i as f32 - 0.1).collect();
        let (s, z) = int4_group(&w, &mut q).unwrap();
        assert_eq!((super::super::half::round_f16(s), super::super::half::round_f16(z)), (s, z));
        assert_ne!(s, ((0.013f32 * 31.0 - 0.1) - (-0.1)) / 15.0);
        for (&v, &c) in w.iter().zip(&q) {
            assert!(((c as f32 - 8.0) * s + z - v).abs() <= s / 2.0 + 1e-6, "{v} -> {c}");
        }
        // beyond float16: an error naming the problem, not infinities in the weights
        assert_eq!(int4_group(&[0.0, 1e6], &mut q[..2]), None);
        assert_eq!(int4_group(&[7e4; 2], &mut q[..2]), None);
        let e = int4(Src::F32(&[1e6; 64]), 2, 32, 32).unwrap_err();
        assert!(e.contains("float16") && e.contains("2 row(s)"), "{e}");
        assert!(packed_int4(Src::F32(&[1e6; 64]), 2, 32, 32).is_err());
        // ties go to even, like torch.round
        let mut q8 = [0i8; 5];
        let s = int8_row(&[127.0, 0.5, 1.5, -2.5, -126.5], &mut q8);
        assert_eq!(s, 1.0);
        assert_eq!(q8, [127, 0, 2, -2, -126]);
        for x in [-127.0f32, -3.5, -0.5, 0.49999997, 2.5, 14.5, 126.5] {
            assert_eq!(rne(x), x.round_ties_even(), "{x}");
        }
        assert!(int4(Src::F32(&[0.0; 48]), 1, 48, 32).is_err());
        assert!(int8(Src::F32(&[0.0; 5]), 2, 3).is_err());
    }
}
