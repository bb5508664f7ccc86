//! The two kernels that only move values between dtypes: `cast` (a copy that converts) and
//! `fill`. The per-element conversions are `core::element`'s.

use crate::core::mem::Mem;
use crate::core::element::{load_f64, load_i64, store_f64, store_i64};
use crate::core::tensor::{Result, View};

/// Copies `x` into `y` (same sizes, any strides), converting the dtype.
/// # Safety
/// The views must have been validated by the executor.
pub unsafe fn cast(mem: &Mem, x: &View, y: &View) {
    if x.dtype.is_complex() || y.dtype.is_complex() {
        return crate::kernels::complex::cast(mem, x, y);
    }
    let (px, py) = (mem.byte_ptr(x), mem.byte_ptr(y));
    let float = x.dtype.is_float();
    crate::core::strided::for_each(&y.sizes, [&x.strides, &y.strides], |[a, b]| {
        if float {
            store_f64(py, y.dtype, b, load_f64(px, x.dtype, a));
        } else {
            store_i64(py, y.dtype, b, load_i64(px, x.dtype, a));
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
