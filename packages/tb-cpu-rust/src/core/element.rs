//! One element of any dtype the executor carries: loads and stores through f64 / i64 / (re, im)
//! and the scalar conversions between dtypes.
//!
//! Conversions follow PyTorch on x86-64: float -> integer truncates toward zero through the
//! hardware conversion (NaN and out-of-range values give the "integer indefinite" value, and the
//! narrow integer types take the low bits of an int32), float -> float16 / bfloat16 rounds to
//! nearest even from float32, integer -> narrower integer wraps.

use crate::core::tensor::DType;

/// float32 -> IEEE half bits, round to nearest even (NaN stays NaN, keeps its sign).
pub fn f32_to_f16(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32;
    let man = b & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if man != 0 { 0x200 | (man >> 13) as u16 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        // subnormal half (or zero): shift the full mantissa, round to nearest even
        if e < -10 {
            return sign;
        }
        let m = man | 0x80_0000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        let rest = m & ((1u32 << shift) - 1);
        let mut r = m >> shift;
        if rest > half || (rest == half && (r & 1) == 1) {
            r += 1;
        }
        return sign | r as u16;
    }
    let mut r = ((e as u32) << 10) | (man >> 13);
    let rest = man & 0x1fff;
    if rest > 0x1000 || (rest == 0x1000 && (r & 1) == 1) {
        r += 1; // may carry into the exponent, up to infinity: correct
    }
    sign | r as u16
}

pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h & 0x8000) as u32) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    let bits = if exp == 0 {
        if man == 0 {
            sign
        } else {
            // subnormal: value = man * 2^-24
            let v = man as f32 * (2f32).powi(-24);
            return if sign != 0 { -v } else { v };
        }
    } else if exp == 0x1f {
        sign | 0x7f80_0000 | (man << 13)
    } else {
        sign | ((exp + 127 - 15) << 23) | (man << 13)
    };
    f32::from_bits(bits)
}

/// float32 -> bfloat16 bits, round to nearest even (NaN -> the quiet NaN, as c10::BFloat16).
pub fn f32_to_bf16(x: f32) -> u16 {
    if x.is_nan() {
        return 0x7fc0;
    }
    let b = x.to_bits();
    let round = 0x7fff + ((b >> 16) & 1);
    (b.wrapping_add(round) >> 16) as u16
}

pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// x86 `cvtt` semantics: truncate toward zero; NaN or out of range -> the type's minimum.
fn trunc_i64(v: f64) -> i64 {
    const LIM: f64 = 9_223_372_036_854_775_808.0; // 2^63
    if v.is_nan() || !(-LIM..LIM).contains(&v) {
        i64::MIN
    } else {
        v as i64
    }
}

fn trunc_i32(v: f64) -> i32 {
    if v.is_nan() || !(-2_147_483_648.0..2_147_483_648.0).contains(&v) {
        i32::MIN
    } else {
        v as i32
    }
}

/// # Safety
/// `p` must point at a buffer of dtype `dt` with at least `i + 1` elements.
#[inline]
pub unsafe fn load_f64(p: *const u8, dt: DType, i: usize) -> f64 {
    match dt {
        DType::F32 => *(p as *const f32).add(i) as f64,
        DType::F64 => *(p as *const f64).add(i),
        DType::F16 => f16_to_f32(*(p as *const u16).add(i)) as f64,
        DType::BF16 => bf16_to_f32(*(p as *const u16).add(i)) as f64,
        DType::C64 | DType::C128 | DType::C32 => load_c(p, dt, i).0,
        _ => load_i64(p, dt, i) as f64,
    }
}

/// # Safety
/// As `load_f64`.
#[inline]
pub unsafe fn load_i64(p: *const u8, dt: DType, i: usize) -> i64 {
    match dt {
        DType::I64 => *(p as *const i64).add(i),
        DType::I32 => *(p as *const i32).add(i) as i64,
        DType::I16 => *(p as *const i16).add(i) as i64,
        DType::I8 => *(p as *const i8).add(i) as i64,
        DType::U8 => *p.add(i) as i64,
        DType::Bool => (*p.add(i) != 0) as i64,
        _ => trunc_i64(load_f64(p, dt, i)),
    }
}

/// Stores a float value converted to `dt` (see the module note for the rounding).
/// # Safety
/// As `load_f64`, for writing.
#[inline]
pub unsafe fn store_f64(p: *mut u8, dt: DType, i: usize, v: f64) {
    match dt {
        DType::F32 => *(p as *mut f32).add(i) = v as f32,
        DType::F64 => *(p as *mut f64).add(i) = v,
        DType::F16 => *(p as *mut u16).add(i) = f32_to_f16(v as f32),
        DType::BF16 => *(p as *mut u16).add(i) = f32_to_bf16(v as f32),
        DType::Bool => *p.add(i) = (v != 0.0) as u8,
        DType::I64 => *(p as *mut i64).add(i) = trunc_i64(v),
        DType::I32 => *(p as *mut i32).add(i) = trunc_i32(v),
        DType::I16 => *(p as *mut i16).add(i) = trunc_i32(v) as i16,
        DType::I8 => *(p as *mut i8).add(i) = trunc_i32(v) as i8,
        DType::U8 => *p.add(i) = trunc_i32(v) as u8,
        DType::C64 | DType::C128 | DType::C32 => store_c(p, dt, i, (v, 0.0)),
    }
}

/// Stores an integer value converted to `dt` (narrower integers wrap).
/// # Safety
/// As `store_f64`.
#[inline]
pub unsafe fn store_i64(p: *mut u8, dt: DType, i: usize, v: i64) {
    match dt {
        DType::I64 => *(p as *mut i64).add(i) = v,
        DType::I32 => *(p as *mut i32).add(i) = v as i32,
        DType::I16 => *(p as *mut i16).add(i) = v as i16,
        DType::I8 => *(p as *mut i8).add(i) = v as i8,
        DType::U8 => *p.add(i) = v as u8,
        DType::Bool => *p.add(i) = (v != 0) as u8,
        DType::F64 => *(p as *mut f64).add(i) = v as f64,
        _ => store_f64(p, dt, i, v as f32 as f64),
    }
}

/// # Safety
/// `p` must point at a buffer of dtype `dt` with at least `i + 1` elements.
#[inline]
pub unsafe fn load_c(p: *const u8, dt: DType, i: usize) -> (f64, f64) {
    match dt {
        DType::C64 => {
            let q = (p as *const f32).add(2 * i);
            (*q as f64, *q.add(1) as f64)
        }
        DType::C128 => {
            let q = (p as *const f64).add(2 * i);
            (*q, *q.add(1))
        }
        DType::C32 => {
            let q = (p as *const u16).add(2 * i);
            (f16_to_f32(*q) as f64, f16_to_f32(*q.add(1)) as f64)
        }
        _ => (load_f64(p, dt, i), 0.0),
    }
}

/// Stores a complex value into `dt` (a real dtype takes the real part).
/// # Safety
/// As `load_c`, for writing.
#[inline]
pub unsafe fn store_c(p: *mut u8, dt: DType, i: usize, (re, im): (f64, f64)) {
    match dt {
        DType::C64 => {
            let q = (p as *mut f32).add(2 * i);
            *q = re as f32;
            *q.add(1) = im as f32;
        }
        DType::C128 => {
            let q = (p as *mut f64).add(2 * i);
            *q = re;
            *q.add(1) = im;
        }
        DType::C32 => {
            let q = (p as *mut u16).add(2 * i);
            *q = f32_to_f16(re as f32);
            *q.add(1) = f32_to_f16(im as f32);
        }
        DType::Bool => *p.add(i) = (re != 0.0 || im != 0.0) as u8,
        _ => store_f64(p, dt, i, re),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_rounding() {
        assert_eq!(f32_to_f16(1.0), 0x3c00);
        assert_eq!(f32_to_f16(-2.0), 0xc000);
        assert_eq!(f32_to_f16(65504.0), 0x7bff);
        assert_eq!(f32_to_f16(65520.0), 0x7c00); // rounds up to infinity
        assert_eq!(f32_to_f16(1.0 + 1.0 / 2048.0), 0x3c00); // tie -> even
        assert_eq!(f32_to_f16(1.0 + 3.0 / 2048.0), 0x3c02); // tie -> even (up)
        assert_eq!(f32_to_f16(5.960_464_5e-8), 0x0001); // smallest subnormal
        assert_eq!(f32_to_f16(2.0e-8), 0x0000);
        assert!(f16_to_f32(f32_to_f16(f32::NAN)).is_nan());
        for h in [0x0001u16, 0x03ff, 0x0400, 0x3c00, 0x7bff, 0x8001, 0xfbff] {
            assert_eq!(f32_to_f16(f16_to_f32(h)), h);
        }
    }

    #[test]
    fn bfloat16_rounding() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        assert_eq!(bf16_to_f32(f32_to_bf16(3.140625)), 3.140625);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80); // tie -> even
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(f32_to_bf16(f32::NAN), 0x7fc0);
    }

    #[test]
    fn integer_truncation() {
        assert_eq!(trunc_i64(-2.7), -2);
        assert_eq!(trunc_i64(f64::NAN), i64::MIN);
        assert_eq!(trunc_i32(-3.9) as u8, 253);
        assert_eq!(trunc_i32(1e10), i32::MIN);
    }
}
