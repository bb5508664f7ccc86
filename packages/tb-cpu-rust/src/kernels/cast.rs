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

// -- steps: cast, fill, arange --------------------------------------------------------------------

use crate::core::tensor::{need, DType};
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
