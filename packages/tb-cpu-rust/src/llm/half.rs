//! IEEE 754 binary16 conversions for the int4 scales and zeros (stored as f16 bits: 4 bytes per
//! group instead of 8, so int4 streams 0.625 bytes per weight at group 32, not 0.75).
//!
//! The conversions are the executor's (`crate::core::element`): `f32_to_f16` rounds to nearest, ties to
//! even, as PyTorch's `.to(torch.float16)` does (tb-llm's quantizer rounds with it, and the
//! tests check bit equality); the SIMD kernels widen with F16C `vcvtph2ps`, which is exact like
//! `f16_to_f32`. This module adds what the int4 layout needs on top, and exhaustive tests.

pub use crate::core::element::{f16_to_f32, f32_to_f16};

/// `x` as binary16 bits when it is exactly a binary16 value (what tb-llm's quantizer produces).
pub fn exact_f16(x: f32) -> Option<u16> {
    let h = f32_to_f16(x);
    (f16_to_f32(h).to_bits() == x.to_bits()).then_some(h)
}

/// `x` rounded to binary16 and back: the value an int4 scale or zero keeps.
pub fn round_f16(x: f32) -> f32 {
    f16_to_f32(f32_to_f16(x))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_f16_round_trips() {
        for h in 0..=u16::MAX {
            let v = f16_to_f32(h);
            if v.is_nan() {
                assert!(f32_to_f16(v) & 0x7c00 == 0x7c00 && f32_to_f16(v) & 0x3ff != 0);
                continue;
            }
            assert_eq!(f32_to_f16(v), h, "{h:#06x} = {v}");
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
            assert_eq!(f32_to_f16(mid), want, "between {h:#06x} and {:#06x}", h + 1);
            assert_eq!(f32_to_f16(-mid), want | 0x8000);
            // just off the midpoint: the nearer one
            assert_eq!(f32_to_f16(f32::from_bits(mid.to_bits() - 1)), h);
            assert_eq!(f32_to_f16(f32::from_bits(mid.to_bits() + 1)), h + 1);
        }
        assert_eq!(f32_to_f16(65504.0), 0x7bff);
        assert_eq!(f32_to_f16(65519.0), 0x7bff);
        assert_eq!(f32_to_f16(65520.0), 0x7c00);
        assert_eq!(f32_to_f16(1e30), 0x7c00);
        assert_eq!(f32_to_f16(-f32::INFINITY), 0xfc00);
        assert_eq!(f32_to_f16(2f32.powi(-25)), 0);
        assert_eq!(f32_to_f16(2f32.powi(-25) * 1.0000001), 1);
        assert_eq!(f32_to_f16(1e-30), 0);
        assert_eq!(exact_f16(0.01), None);
        assert_eq!(round_f16(0.01), 0.010_002_136);
    }
}
