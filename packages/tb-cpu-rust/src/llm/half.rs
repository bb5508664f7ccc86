//! IEEE 754 binary16 conversions for the int4 scales and zeros (stored as f16 bits: 4 bytes per
//! group instead of 8, so int4 streams 0.625 bytes per weight at group 32, not 0.75).
//!
//! `f16_bits` rounds to nearest, ties to even, as PyTorch's `.to(torch.float16)` does (tb-llm's
//! quantizer rounds with it, and the tests check bit equality); the SIMD kernels widen with F16C
//! `vcvtph2ps`, which is exact like `f16_to_f32`.

/// `x` rounded to the nearest binary16 (ties to even); beyond 65504 (after rounding) gives
/// infinity, NaN stays NaN.
pub fn f16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32;
    let man = b & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if man != 0 { 0x200 } else { 0 };
    }
    // the binary16 exponent field this value would have
    let e = exp - 127 + 15;
    if e >= 31 {
        return sign | 0x7c00;
    }
    if e <= 0 {
        // a subnormal (units of 2^-24) or zero; below 2^-25 everything rounds to zero
        if e < -10 {
            return sign;
        }
        let m = man | 0x80_0000;
        let shift = (14 - e) as u32;
        let (mut r, rem, half) = (m >> shift, m & ((1 << shift) - 1), 1u32 << (shift - 1));
        if rem > half || (rem == half && r & 1 == 1) {
            r += 1; // may carry into the smallest normal, which is the right encoding
        }
        return sign | r as u16;
    }
    let mut r = ((e as u32) << 10) | (man >> 13);
    let rem = man & 0x1fff;
    if rem > 0x1000 || (rem == 0x1000 && r & 1 == 1) {
        r += 1; // a carry out of the mantissa bumps the exponent (up to infinity): still right
    }
    sign | r as u16
}

/// The binary16 `h` as f32 (exact).
pub fn f16_to_f32(h: u16) -> f32 {
    let neg = h & 0x8000 != 0;
    let e = ((h >> 10) & 0x1f) as u32;
    let m = (h & 0x3ff) as u32;
    let v = match e {
        0 => m as f32 * (1.0 / 16_777_216.0),
        31 => f32::from_bits(0x7f80_0000 | (m << 13)),
        _ => f32::from_bits(((e + 112) << 23) | (m << 13)),
    };
    if neg {
        -v
    } else {
        v
    }
}

/// `x` as binary16 bits when it is exactly a binary16 value (what tb-llm's quantizer produces).
pub fn exact_f16(x: f32) -> Option<u16> {
    let h = f16_bits(x);
    (f16_to_f32(h).to_bits() == x.to_bits()).then_some(h)
}

/// `x` rounded to binary16 and back: the value an int4 scale or zero keeps.
pub fn round_f16(x: f32) -> f32 {
    f16_to_f32(f16_bits(x))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_f16_round_trips() {
        for h in 0..=u16::MAX {
            let v = f16_to_f32(h);
            if v.is_nan() {
                assert!(f16_bits(v) & 0x7c00 == 0x7c00 && f16_bits(v) & 0x3ff != 0);
                continue;
            }
            assert_eq!(f16_bits(v), h, "{h:#06x} = {v}");
            assert_eq!(exact_f16(v), Some(h));
        }
    }

    #[test]
    fn midpoints_round_to_even_and_ranges_saturate() {
        // the f32 halfway between two neighbouring f16 values (exact in f32) goes to the even one
        for h in 0..0x7bffu16 {
            let (a, b) = (f16_to_f32(h) as f64, f16_to_f32(h + 1) as f64);
            let mid = ((a + b) / 2.0) as f32;
            assert_eq!(mid as f64, (a + b) / 2.0);
            let want = if h & 1 == 0 { h } else { h + 1 };
            assert_eq!(f16_bits(mid), want, "between {h:#06x} and {:#06x}", h + 1);
            assert_eq!(f16_bits(-mid), want | 0x8000);
            // just off the midpoint: the nearer one
            assert_eq!(f16_bits(f32::from_bits(mid.to_bits() - 1)), h);
            assert_eq!(f16_bits(f32::from_bits(mid.to_bits() + 1)), h + 1);
        }
        assert_eq!(f16_bits(65504.0), 0x7bff);
        assert_eq!(f16_bits(65519.0), 0x7bff);
        assert_eq!(f16_bits(65520.0), 0x7c00);
        assert_eq!(f16_bits(1e30), 0x7c00);
        assert_eq!(f16_bits(-f32::INFINITY), 0xfc00);
        assert_eq!(f16_bits(2f32.powi(-25)), 0);
        assert_eq!(f16_bits(2f32.powi(-25) * 1.0000001), 1);
        assert_eq!(f16_bits(1e-30), 0);
        assert_eq!(exact_f16(0.01), None);
        assert_eq!(round_f16(0.01), 0.010_002_136);
    }
}
