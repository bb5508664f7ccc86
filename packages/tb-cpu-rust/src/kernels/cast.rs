//! The two kernels that only move values between dtypes: `cast` (a copy that converts) and
//! `fill`. The per-element conversions are `core::element`'s; the float32 <-> bfloat16 /
//! float16 casts of dense rows run vectorised (`widen`, `narrow`: AVX-512 BW, AVX2 + F16C, or a
//! portable loop), bit-for-bit the same as the per-element conversions, split across threads
//! when large.

use crate::core::element::{load_f64, load_i64, store_f64, store_i64};
use crate::core::mem::Mem;
use crate::core::tensor::{DType, Result, View};

/// Copies `x` into `y` (same sizes, any strides), converting the dtype.
/// # Safety
/// The views must have been validated by the executor.
pub unsafe fn cast(mem: &Mem, x: &View, y: &View) {
    if x.dtype.is_complex() || y.dtype.is_complex() {
        return crate::kernels::complex::cast(mem, x, y);
    }
    let (px, py) = (mem.byte_ptr(x), mem.byte_ptr(y));
    if let Some(f) = vector_cast(x.dtype, y.dtype) {
        if let Some(n) = dense_alike(x, y) {
            return par_cast(f, px, x.dtype.size(), py, y.dtype.size(), n);
        }
        let r = y.rank();
        if r >= 1 && x.strides[r - 1] == 1 && y.strides[r - 1] == 1 && y.sizes[r - 1] >= 16 {
            // rows contiguous in both: one vector cast per row
            let row = y.sizes[r - 1];
            let (sx, sy) = (x.dtype.size(), y.dtype.size());
            crate::core::strided::for_each(&y.sizes[..r - 1], [&x.strides[..r - 1], &y.strides[..r - 1]], |[a, b]| {
                f(px.add(a * sx), py.add(b * sy), row)
            });
            return;
        }
    }
    let float = x.dtype.is_float();
    crate::core::strided::for_each(&y.sizes, [&x.strides, &y.strides], |[a, b]| {
        if float {
            store_f64(py, y.dtype, b, load_f64(px, x.dtype, a));
        } else {
            store_i64(py, y.dtype, b, load_i64(px, x.dtype, a));
        }
    });
}

/// A contiguous cast of `n` elements from the first pointer to the second.
pub type CastFn = unsafe fn(*const u8, *mut u8, usize);

/// The vectorised cast between two dtypes, where there is one.
pub fn vector_cast(from: DType, to: DType) -> Option<CastFn> {
    let level = Level::best();
    match (from, to) {
        (DType::BF16, DType::F32) => Some(match level {
            Level::Avx512 => |s, d, n| unsafe { bf16_to_f32_avx512(s as _, d as _, n) },
            Level::Avx2 => |s, d, n| unsafe { bf16_to_f32_avx2(s as _, d as _, n) },
            Level::Portable => |s, d, n| unsafe { bf16_to_f32_portable(s as _, d as _, n) },
        }),
        (DType::F32, DType::BF16) => Some(match level {
            Level::Avx512 => |s, d, n| unsafe { f32_to_bf16_avx512(s as _, d as _, n) },
            Level::Avx2 => |s, d, n| unsafe { f32_to_bf16_avx2(s as _, d as _, n) },
            Level::Portable => |s, d, n| unsafe { f32_to_bf16_portable(s as _, d as _, n) },
        }),
        (DType::F16, DType::F32) => Some(match level {
            Level::Avx512 | Level::Avx2 if crate::core::isa::has_f16c() => |s, d, n| unsafe { f16_to_f32_f16c(s as _, d as _, n) },
            _ => |s, d, n| unsafe { f16_to_f32_portable(s as _, d as _, n) },
        }),
        (DType::F32, DType::F16) => Some(match level {
            Level::Avx512 | Level::Avx2 if crate::core::isa::has_f16c() => |s, d, n| unsafe { f32_to_f16_f16c(s as _, d as _, n) },
            _ => |s, d, n| unsafe { f32_to_f16_portable(s as _, d as _, n) },
        }),
        (DType::BF16, DType::BF16) | (DType::F16, DType::F16) => Some(|s, d, n| unsafe { std::ptr::copy_nonoverlapping(s, d, 2 * n) }),
        (DType::F32, DType::F32) => Some(|s, d, n| unsafe { std::ptr::copy_nonoverlapping(s, d, 4 * n) }),
        _ => None,
    }
}

/// The ISA the vector casts run with.
#[derive(Clone, Copy, PartialEq, Debug)]
pub(crate) enum Level {
    Portable,
    Avx2,
    Avx512,
}

impl Level {
    fn best() -> Level {
        if crate::core::isa::has_avx512bw() {
            Level::Avx512
        } else if crate::core::isa::has_avx2() {
            Level::Avx2
        } else {
            Level::Portable
        }
    }
}

/// When `x` and `y` lay out their elements alike and densely (same strides, a permutation of a
/// contiguous layout: no gaps, no overlaps), their element count: they convert as flat arrays.
fn dense_alike(x: &View, y: &View) -> Option<usize> {
    let mut dims: Vec<(usize, usize)> = Vec::with_capacity(y.rank());
    for d in 0..y.rank() {
        if y.sizes[d] == 0 {
            return Some(0);
        }
        if y.sizes[d] != 1 {
            if x.strides[d] != y.strides[d] {
                return None;
            }
            dims.push((y.strides[d], y.sizes[d]));
        }
    }
    dims.sort_unstable();
    let mut expect = 1;
    for (st, sz) in dims {
        if st != expect {
            return None;
        }
        expect *= sz;
    }
    Some(expect)
}

/// Below this many elements a cast runs on the calling thread.
const PAR_MIN: usize = 1 << 16;

/// `f` over `n` contiguous elements (`sx`, `sy` bytes each), in chunks across threads when large.
/// # Safety
/// Both pointers valid for `n` elements of their dtypes.
pub unsafe fn par_cast(f: CastFn, src: *const u8, sx: usize, dst: *mut u8, sy: usize, n: usize) {
    let threads = crate::core::par::threads();
    if n < PAR_MIN || threads <= 1 {
        return f(src, dst, n);
    }
    let tasks = (threads * 2).min(n / (PAR_MIN / 4));
    let (s, d) = (src as usize, dst as usize);
    crate::core::par::for_each(tasks, |t| {
        // chunks of whole cache lines of the wider side
        let (lo, hi) = ((n * t / tasks) & !15, if t + 1 == tasks { n } else { (n * (t + 1) / tasks) & !15 });
        if lo < hi {
            // SAFETY: disjoint chunks of the caller's ranges
            unsafe { f((s + lo * sx) as *const u8, (d + lo * sy) as *mut u8, hi - lo) }
        }
    });
}

/// Writes one value into every element of `y`: `int` when the value is an integer (exact for
/// any int64), else `value`.
/// # Safety
/// As `cast`.
pub unsafe fn fill(mem: &Mem, y: &View, value: f64, int: Option<i64>) {
    if y.dtype.is_complex() {
        return crate::kernels::complex::fill(mem, y, int.map_or(value, |v| v as f64));
    }
    let py = mem.byte_ptr(y);
    crate::core::strided::for_each(&y.sizes, [&y.strides], |[b]| match int {
        Some(v) => store_i64(py, y.dtype, b, v),
        None => store_f64(py, y.dtype, b, value),
    });
}

pub fn check_cast(x: &View, y: &View) -> Result<()> {
    if x.sizes != y.sizes {
        return Err(format!("cast shapes differ: {:?} and {:?}", x.sizes, y.sizes));
    }
    Ok(())
}

// -- steps: cast, fill, arange --------------------------------------------------------------------

use crate::core::tensor::need;
use crate::kernels::registry::{infallible, kernel, Args, Built, StepDef};

pub const STEPS: &[StepDef] = &[StepDef::any("cast", cast_step), StepDef::any("fill", fill_step), StepDef::any("arange", arange_step)];

fn cast_step(a: &Args) -> Built {
    a.no_params()?;
    let (x, y) = (a.take(0)?, a.out(0)?);
    check_cast(&x, &y)?;
    infallible(move |mem| unsafe { cast(mem, &x, &y) })
}

crate::step_params!(
    /// mode 0: `value`, 1: `integer` (exact for any int64), 2..4: NaN, +inf, -inf
    struct Fill { mode: i64, integer: i64, value: f64 }
);

fn fill_step(a: &Args) -> Built {
    let p: Fill = a.params()?;
    let y = a.out(0)?;
    let (value, int) = match p.mode {
        0 => (p.value, None),
        1 => (0.0, Some(p.integer)),
        2 => (f64::NAN, None),
        3 => (f64::INFINITY, None),
        4 => (f64::NEG_INFINITY, None),
        m => return Err(format!("unknown fill mode {m}")),
    };
    infallible(move |mem| unsafe { fill(mem, &y, value, int) })
}

crate::step_params!(struct Arange { start: f64, step: f64 });

fn arange_step(a: &Args) -> Built {
    let Arange { start, step } = a.params()?;
    let y = a.out(0)?;
    need(y.rank() == 1 && y.dtype != DType::Bool, "arange output")?;
    kernel(move |mem| {
        let p = unsafe { mem.byte_ptr(&y) };
        for i in 0..y.sizes[0] {
            let v = start + step * i as f64;
            unsafe {
                if y.dtype.is_float() {
                    crate::core::element::store_f64(p, y.dtype, i * y.strides[0], v);
                } else {
                    crate::core::element::store_i64(p, y.dtype, i * y.strides[0], v as i64);
                }
            }
        }
        Ok(())
    })
}

// -- the contiguous conversions ------------------------------------------------------------------
//
// bfloat16 is the top half of a float32: widening is a 16-bit shift, narrowing rounds to nearest
// even by adding 0x7fff plus the kept part's lowest bit (NaN becomes the quiet NaN 0x7fc0, as
// c10::BFloat16 and `core::element::f32_to_bf16`). The loops are written so that the compiler
// vectorises them for the target features of the wrapper they are inlined into. float16 uses
// F16C's conversions (round to nearest even, subnormals kept), or `core::element`'s per element.

#[inline(always)]
unsafe fn bf16_to_f32_body(s: *const u16, d: *mut f32, n: usize) {
    let (s, d) = (std::slice::from_raw_parts(s, n), std::slice::from_raw_parts_mut(d as *mut u32, n));
    for (o, &h) in d.iter_mut().zip(s) {
        *o = (h as u32) << 16;
    }
}

#[inline(always)]
unsafe fn f32_to_bf16_body(s: *const f32, d: *mut u16, n: usize) {
    let (s, d) = (std::slice::from_raw_parts(s as *const u32, n), std::slice::from_raw_parts_mut(d, n));
    for (o, &b) in d.iter_mut().zip(s) {
        let rounded = (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16;
        *o = if b & 0x7fff_ffff > 0x7f80_0000 { 0x7fc0 } else { rounded };
    }
}

/// # Safety
/// `s` valid for `n` reads, `d` for `n` writes.
pub(crate) unsafe fn bf16_to_f32_portable(s: *const u16, d: *mut f32, n: usize) {
    bf16_to_f32_body(s, d, n)
}

/// # Safety
/// As `bf16_to_f32_portable`.
pub(crate) unsafe fn f32_to_bf16_portable(s: *const f32, d: *mut u16, n: usize) {
    f32_to_bf16_body(s, d, n)
}

/// # Safety
/// As `bf16_to_f32_portable`.
pub(crate) unsafe fn f16_to_f32_portable(s: *const u16, d: *mut f32, n: usize) {
    for i in 0..n {
        *d.add(i) = crate::core::element::f16_to_f32(*s.add(i));
    }
}

/// # Safety
/// As `bf16_to_f32_portable`.
pub(crate) unsafe fn f32_to_f16_portable(s: *const f32, d: *mut u16, n: usize) {
    for i in 0..n {
        *d.add(i) = crate::core::element::f32_to_f16(*s.add(i));
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) use x86::*;

#[cfg(not(target_arch = "x86_64"))]
pub(crate) use portable_only::*;

#[cfg(not(target_arch = "x86_64"))]
mod portable_only {
    pub(crate) unsafe fn bf16_to_f32_avx512(s: *const u16, d: *mut f32, n: usize) {
        super::bf16_to_f32_portable(s, d, n)
    }
    pub(crate) unsafe fn bf16_to_f32_avx2(s: *const u16, d: *mut f32, n: usize) {
        super::bf16_to_f32_portable(s, d, n)
    }
    pub(crate) unsafe fn f32_to_bf16_avx512(s: *const f32, d: *mut u16, n: usize) {
        super::f32_to_bf16_portable(s, d, n)
    }
    pub(crate) unsafe fn f32_to_bf16_avx2(s: *const f32, d: *mut u16, n: usize) {
        super::f32_to_bf16_portable(s, d, n)
    }
    pub(crate) unsafe fn f16_to_f32_f16c(s: *const u16, d: *mut f32, n: usize) {
        super::f16_to_f32_portable(s, d, n)
    }
    pub(crate) unsafe fn f32_to_f16_f16c(s: *const f32, d: *mut u16, n: usize) {
        super::f32_to_f16_portable(s, d, n)
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// # Safety
    /// As `bf16_to_f32_portable`; the CPU has AVX-512 F/BW/VL.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
    pub(crate) unsafe fn bf16_to_f32_avx512(s: *const u16, d: *mut f32, n: usize) {
        super::bf16_to_f32_body(s, d, n)
    }

    /// # Safety
    /// As `bf16_to_f32_portable`; the CPU has AVX2.
    #[target_feature(enable = "avx2")]
    pub(crate) unsafe fn bf16_to_f32_avx2(s: *const u16, d: *mut f32, n: usize) {
        super::bf16_to_f32_body(s, d, n)
    }

    /// # Safety
    /// As `bf16_to_f32_avx512`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
    pub(crate) unsafe fn f32_to_bf16_avx512(s: *const f32, d: *mut u16, n: usize) {
        super::f32_to_bf16_body(s, d, n)
    }

    /// # Safety
    /// As `bf16_to_f32_avx2`.
    #[target_feature(enable = "avx2")]
    pub(crate) unsafe fn f32_to_bf16_avx2(s: *const f32, d: *mut u16, n: usize) {
        super::f32_to_bf16_body(s, d, n)
    }

    /// # Safety
    /// As `bf16_to_f32_portable`; the CPU has AVX and F16C.
    #[target_feature(enable = "avx,f16c")]
    pub(crate) unsafe fn f16_to_f32_f16c(s: *const u16, d: *mut f32, n: usize) {
        let mut i = 0;
        while i + 8 <= n {
            _mm256_storeu_ps(d.add(i), _mm256_cvtph_ps(_mm_loadu_si128(s.add(i) as *const __m128i)));
            i += 8;
        }
        super::f16_to_f32_portable(s.add(i), d.add(i), n - i)
    }

    /// # Safety
    /// As `f16_to_f32_f16c`.
    #[target_feature(enable = "avx,f16c")]
    pub(crate) unsafe fn f32_to_f16_f16c(s: *const f32, d: *mut u16, n: usize) {
        let mut i = 0;
        while i + 8 <= n {
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(s.add(i)));
            _mm_storeu_si128(d.add(i) as *mut __m128i, h);
            i += 8;
        }
        super::f32_to_f16_portable(s.add(i), d.add(i), n - i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::element::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};

    type Widen = unsafe fn(*const u16, *mut f32, usize);
    type Narrow = unsafe fn(*const f32, *mut u16, usize);

    /// Every implementation this CPU runs (the portable one always).
    fn bf16_impls() -> Vec<(&'static str, Widen, Narrow)> {
        let mut v: Vec<(&'static str, Widen, Narrow)> = vec![("portable", bf16_to_f32_portable, f32_to_bf16_portable)];
        if crate::core::isa::has_avx2() {
            v.push(("avx2", bf16_to_f32_avx2, f32_to_bf16_avx2));
        }
        if crate::core::isa::has_avx512bw() {
            v.push(("avx512", bf16_to_f32_avx512, f32_to_bf16_avx512));
        }
        v
    }

    fn f16_impls() -> Vec<(&'static str, Widen, Narrow)> {
        let mut v: Vec<(&'static str, Widen, Narrow)> = vec![("portable", f16_to_f32_portable, f32_to_f16_portable)];
        if crate::core::isa::has_f16c() && crate::core::isa::has_avx() {
            v.push(("f16c", f16_to_f32_f16c, f32_to_f16_f16c));
        }
        v
    }

    /// float32 inputs around every rounding case: each 16-bit pattern with low halves of zero,
    /// just below, at and just above the tie, and all-ones (NaN payloads, infinities and
    /// subnormals included), plus odd lengths for the vector tails.
    fn probes() -> Vec<f32> {
        let mut v = Vec::new();
        for h in 0..=u16::MAX as u32 {
            for low in [0u32, 0x7fff, 0x8000, 0x8001, 0xffff, 0x1234] {
                v.push(f32::from_bits(h << 16 | low));
            }
        }
        v.extend([f32::NAN, -f32::NAN, f32::INFINITY, f32::NEG_INFINITY, f32::MAX, f32::MIN_POSITIVE, 1e-45, 65504.0, 65520.0, 6e-8]);
        v
    }

    #[test]
    fn bf16_every_pattern_round_trips_and_rounding_matches_the_scalar_reference() {
        let all: Vec<u16> = (0..=u16::MAX).collect();
        let xs = probes();
        for (name, widen, narrow) in bf16_impls() {
            let mut wide = vec![0f32; all.len()];
            unsafe { widen(all.as_ptr(), wide.as_mut_ptr(), all.len()) };
            for (&h, &w) in all.iter().zip(&wide) {
                assert_eq!(w.to_bits(), bf16_to_f32(h).to_bits(), "{name} widen {h:#06x}");
            }
            let mut back = vec![0u16; all.len()];
            unsafe { narrow(wide.as_ptr(), back.as_mut_ptr(), all.len()) };
            for (&h, &b) in all.iter().zip(&back) {
                if bf16_to_f32(h).is_nan() {
                    assert_eq!(b, 0x7fc0, "{name} NaN {h:#06x} -> {b:#06x}");
                } else {
                    assert_eq!(b, h, "{name} round trip {h:#06x}");
                }
            }
            for len in [xs.len(), 1, 15, 17, 33] {
                let mut out = vec![0u16; len];
                unsafe { narrow(xs.as_ptr(), out.as_mut_ptr(), len) };
                for (&x, &o) in xs.iter().zip(&out) {
                    assert_eq!(o, f32_to_bf16(x), "{name} narrow {:#010x}", x.to_bits());
                }
            }
        }
        // the reference itself: ties to even, overflow to infinity, subnormals kept
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8001)), 0x3f81);
        assert_eq!(f32_to_bf16(f32::from_bits(0x7f7f_ffff)), 0x7f80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x0000_8001)), 0x0001);
        assert_eq!(f32_to_bf16(f32::from_bits(0x8000_8000)), 0x8000);
    }

    #[test]
    fn f16_conversions_match_the_scalar_reference() {
        let all: Vec<u16> = (0..=u16::MAX).collect();
        let xs = probes();
        for (name, widen, narrow) in f16_impls() {
            let mut wide = vec![0f32; all.len()];
            unsafe { widen(all.as_ptr(), wide.as_mut_ptr(), all.len()) };
            for (&h, &w) in all.iter().zip(&wide) {
                let want = f16_to_f32(h);
                assert!(w.to_bits() == want.to_bits() || (w.is_nan() && want.is_nan()), "{name} widen {h:#06x}");
            }
            let mut out = vec![0u16; xs.len()];
            unsafe { narrow(xs.as_ptr(), out.as_mut_ptr(), xs.len()) };
            for (&x, &o) in xs.iter().zip(&out) {
                if x.is_nan() {
                    assert!(f16_to_f32(o).is_nan(), "{name} NaN");
                } else {
                    assert_eq!(o, f32_to_f16(x), "{name} narrow {:#010x}", x.to_bits());
                }
            }
        }
    }

    #[test]
    fn dense_layouts_and_rows() {
        let v = |sizes: &[usize], strides: &[usize], dtype| View { buf: 0, offset: 0, sizes: sizes.to_vec(), strides: strides.to_vec(), dtype };
        // a transposed dense pair converts flat; a column slice does not
        assert_eq!(dense_alike(&v(&[3, 4], &[1, 3], DType::BF16), &v(&[3, 4], &[1, 3], DType::F32)), Some(12));
        assert_eq!(dense_alike(&v(&[3, 4], &[8, 1], DType::BF16), &v(&[3, 4], &[8, 1], DType::F32)), None);
        assert_eq!(dense_alike(&v(&[3, 4], &[4, 1], DType::BF16), &v(&[3, 4], &[1, 3], DType::F32)), None);
        assert_eq!(dense_alike(&v(&[3, 1, 4], &[4, 99, 1], DType::BF16), &v(&[3, 1, 4], &[4, 7, 1], DType::F32)), Some(12));
        assert_eq!(dense_alike(&v(&[0, 4], &[4, 1], DType::BF16), &v(&[0, 4], &[1, 0], DType::F32)), Some(0));
        // a large parallel cast equals the single-threaded one
        let xs = probes();
        let mut a = vec![0u16; xs.len()];
        let mut b = vec![0u16; xs.len()];
        let f = vector_cast(DType::F32, DType::BF16).unwrap();
        unsafe {
            par_cast(f, xs.as_ptr() as *const u8, 4, a.as_mut_ptr() as *mut u8, 2, xs.len());
            f32_to_bf16_portable(xs.as_ptr(), b.as_mut_ptr(), xs.len());
        }
        assert_eq!(a, b);
    }
}
