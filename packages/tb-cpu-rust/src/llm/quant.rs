//! Load-time weight quantization straight from the checkpoint's f32 / bf16 data, with the
//! same numbers as tb-llm's `tb_llm.quant` (the Python quantizer is the specification; the
//! tests check bit equality against it), and over rayon's pool, so `from_pretrained` does not
//! spend seconds in PyTorch's elementwise ops on a 0.5B model.
//!
//! * int8: `s = max(amax|w|, 1e-12) / 127`, `q = clamp(round_half_even(w / s), -127, 127)`.
//! * int4: per group `lo, hi = min, max`, `s = max((hi - lo) / 15, 1e-12)`, `z = lo + 8 s`,
//!   `q = clamp(round_half_even((w - lo) / s), 0, 15)`.
//!
//! Every step is one f32 operation, in PyTorch's order, and never fused into an FMA.

use super::packed::{big_vec, int4_tiles, Packed, Result};
use rayon::prelude::*;

/// PyTorch's `clamp(min=1e-12)` on f32: the Python float rounded to f32.
const TINY: f32 = 1e-12f64 as f32;

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

/// One group to unsigned nibbles (one per byte of `q`); returns its scale and zero.
pub fn int4_group(w: &[f32], q: &mut [u8]) -> (f32, f32) {
    let (mut lo, mut hi) = (w[0], w[0]);
    for &v in w {
        lo = if v < lo { v } else { lo };
        hi = if v > hi { v } else { hi };
    }
    let s = ((hi - lo) / 15.0).max(TINY);
    let z = lo + 8.0 * s;
    for (d, &v) in q.iter_mut().zip(w) {
        // (v - lo) / s is within [0, 15] up to rounding: |hi - lo| <= 15 s
        *d = rne((v - lo) / s).clamp(0.0, 15.0) as u8;
    }
    (s, z)
}

fn check(src: &Src, n: usize, k: usize) -> Result<()> {
    if src.len() != n * k || k == 0 {
        return Err(format!("weight has {} elements, expected {n} x {k}", src.len()));
    }
    Ok(())
}

/// tb-llm's int8 layout: `q` `[N, K]`, `scale` `[N]`.
pub fn int8(src: Src, n: usize, k: usize) -> Result<(Vec<i8>, Vec<f32>)> {
    check(&src, n, k)?;
    let mut q = vec![0i8; n * k];
    let mut scale = vec![0f32; n];
    q.par_chunks_mut(k).zip(scale.par_iter_mut()).enumerate().for_each_init(Vec::new, |buf, (r, (qr, s))| {
        *s = int8_row(src.row(r, k, buf), qr);
    });
    Ok((q, scale))
}

/// tb-llm's int4 layout: `packed` `[N, K / 2]` (column `2j` in the low nibble), `scale` and
/// `zero` `[N, K / G]`.
pub fn int4(src: Src, n: usize, k: usize, group: usize) -> Result<(Vec<u8>, Vec<f32>, Vec<f32>)> {
    check(&src, n, k)?;
    check_group(k, group)?;
    let ng = k / group;
    let mut packed = vec![0u8; n * k / 2];
    let mut scale = vec![0f32; n * ng];
    let mut zero = vec![0f32; n * ng];
    packed
        .par_chunks_mut(k / 2)
        .zip(scale.par_chunks_mut(ng))
        .zip(zero.par_chunks_mut(ng))
        .enumerate()
        .for_each_init(
            || (Vec::new(), vec![0u8; k]),
            |(buf, nib), (r, ((pr, sr), zr))| {
                int4_row(src.row(r, k, buf), group, nib, sr, zr);
                for (j, b) in pr.iter_mut().enumerate() {
                    *b = nib[2 * j] | (nib[2 * j + 1] << 4);
                }
            },
        );
    Ok((packed, scale, zero))
}

fn check_group(k: usize, group: usize) -> Result<()> {
    if !matches!(group, 32 | 64 | 128) || !k.is_multiple_of(group) {
        return Err(format!("int4 group size must be 32, 64 or 128 and divide K={k}, got {group}"));
    }
    Ok(())
}

fn int4_row(w: &[f32], group: usize, nib: &mut [u8], sr: &mut [f32], zr: &mut [f32]) {
    for (g, (s, z)) in sr.iter_mut().zip(zr.iter_mut()).enumerate() {
        (*s, *z) = int4_group(&w[g * group..(g + 1) * group], &mut nib[g * group..(g + 1) * group]);
    }
}

/// Quantized and packed for the kernels in one pass (no tb-llm layout in between): the same
/// `Packed` as `Packed::int8(int8(src))`.
pub fn packed_int8(src: Src, n: usize, k: usize) -> Result<Packed> {
    check(&src, n, k)?;
    let kp = super::act_quant::round_up(k, 128);
    let mut w = big_vec(n * kp, 128u8);
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
    Ok(int4_tiles(n, k, group, |r, nib, sr, zr, buf| int4_row(src.row(r, k, buf), group, nib, sr, zr)))
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
        // a constant group: scale clamps to 1e-12, every value maps to q = 0, zero = lo + 8e-12
        let mut q = [9u8; 32];
        let (s, z) = int4_group(&[0.5; 32], &mut q);
        assert_eq!(s, TINY);
        assert_eq!(z, 0.5 + 8.0 * TINY);
        assert!(q.iter().all(|&v| v == 0));
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
