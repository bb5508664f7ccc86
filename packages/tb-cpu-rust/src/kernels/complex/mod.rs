//! Complex dtypes (interleaved (re, im) pairs of float32 / float64 / float16; element access is
//! `core::element`'s): the casts into and out of them, and the elementwise
//! kernels PyTorch's complex constructors need: `complex`, `polar`, `conj` and `angle`.
//!
//! Values are carried as (f64, f64) and rounded once when stored, as ATen does for float32
//! inputs; complex -> real keeps the real part (ATen's `_to_copy` does, with a warning), and
//! complex -> bool is "either part is non-zero".

pub mod fft;

use crate::core::element::{load_c, load_f64, store_c, store_f64};
use crate::core::mem::Mem;
use crate::core::strided::for_each;
use crate::core::tensor::{need, DType, Result, View};

/// `cast` where either side is complex.
/// # Safety
/// The views must have been validated by the executor.
pub unsafe fn cast(mem: &Mem, x: &View, y: &View) {
    let (px, py) = (mem.byte_ptr(x), mem.byte_ptr(y));
    for_each(&y.sizes, [&x.strides, &y.strides], |[a, b]| store_c(py, y.dtype, b, load_c(px, x.dtype, a)));
}

/// `fill` of a complex view: (value, 0).
/// # Safety
/// As `cast`.
pub unsafe fn fill(mem: &Mem, y: &View, value: f64) {
    let py = mem.byte_ptr(y);
    for_each(&y.sizes, [&y.strides], |[b]| store_c(py, y.dtype, b, (value, 0.0)));
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// out = a + i b (a, b real)
    Complex,
    /// out = a (cos b + i sin b)
    Polar,
    /// out = conj(a)
    Conj,
    /// out = arg(a): atan2(im, re) of a complex value; of a real one pi below zero, 0 else, NaN kept
    Angle,
    /// out = im(a) (a real result; `view_as_real` is a cast for the real parts and this)
    Imag,
}

pub struct Cplx {
    mode: Mode,
    a: View,
    b: Option<View>,
    y: View,
}

fn real_float(v: &View) -> bool {
    matches!(v.dtype, DType::F32 | DType::F64)
}

impl Cplx {
    /// `op` is one of "complex", "polar", "conj", "angle"; operands already broadcast to `y`.
    pub fn new(op: &str, ins: &[Option<View>], outs: &[View]) -> Result<Cplx> {
        let a = ins.first().cloned().flatten().ok_or("missing operand 0")?;
        let y = outs.first().cloned().ok_or("missing output 0")?;
        need(a.sizes == y.sizes, "complex kernel operand and result differ in shape")?;
        let mode = match op {
            "complex" => Mode::Complex,
            "polar" => Mode::Polar,
            "conj" => Mode::Conj,
            "angle" => Mode::Angle,
            "imag" => Mode::Imag,
            other => return Err(format!("unknown complex kernel {other:?}")),
        };
        let b = match mode {
            Mode::Complex | Mode::Polar => {
                let b = ins.get(1).cloned().flatten().ok_or("missing operand 1")?;
                need(b.sizes == y.sizes, "complex kernel operands differ in shape")?;
                need(real_float(&a) && b.dtype == a.dtype, "complex/polar take two float32 or two float64 tensors")?;
                need(y.dtype.is_complex(), "complex/polar give a complex tensor")?;
                Some(b)
            }
            Mode::Conj => {
                need(a.dtype.is_complex() && y.dtype == a.dtype, "conj takes and gives one complex dtype")?;
                None
            }
            Mode::Imag => {
                need(a.dtype.is_complex() && real_float(&y), "imag takes a complex tensor and gives float32 or float64")?;
                None
            }
            Mode::Angle => {
                need(real_float(&a) || a.dtype.is_complex(), "angle takes a float or complex tensor")?;
                need(real_float(&y), "angle gives float32 or float64")?;
                None
            }
        };
        Ok(Cplx { mode, a, b, y })
    }

    /// # Safety
    /// The views must have been validated by the executor.
    pub unsafe fn run(&self, mem: &Mem) {
        let (pa, py) = (mem.byte_ptr(&self.a), mem.byte_ptr(&self.y));
        let (da, dy) = (self.a.dtype, self.y.dtype);
        match (self.mode, &self.b) {
            (Mode::Complex | Mode::Polar, Some(b)) => {
                let pb = mem.byte_ptr(b);
                let polar = self.mode == Mode::Polar;
                for_each(&self.y.sizes, [&self.a.strides, &b.strides, &self.y.strides], |[i, j, k]| {
                    let (u, v) = (load_f64(pa, da, i), load_f64(pb, da, j));
                    let z = if polar { polar_of(u, v, da == DType::F32) } else { (u, v) };
                    store_c(py, dy, k, z);
                });
            }
            (Mode::Conj, _) => {
                for_each(&self.y.sizes, [&self.a.strides, &self.y.strides], |[i, k]| {
                    let (re, im) = load_c(pa, da, i);
                    store_c(py, dy, k, (re, -im));
                });
            }
            (Mode::Imag, _) => {
                for_each(&self.y.sizes, [&self.a.strides, &self.y.strides], |[i, k]| store_f64(py, dy, k, load_c(pa, da, i).1));
            }
            (Mode::Angle, _) => {
                let cplx = da.is_complex();
                for_each(&self.y.sizes, [&self.a.strides, &self.y.strides], |[i, k]| {
                    let (re, im) = load_c(pa, da, i);
                    let v = if cplx { angle_complex(re, im, dy == DType::F32) } else { angle_real(re) };
                    store_f64(py, dy, k, v);
                });
            }
            _ => {}
        }
    }
}

/// abs (cos angle + i sin angle), in the precision of the inputs (float32 as ATen computes it).
fn polar_of(abs: f64, angle: f64, single: bool) -> (f64, f64) {
    if single {
        let (r, t) = (abs as f32, angle as f32);
        ((r * t.cos()) as f64, (r * t.sin()) as f64)
    } else {
        (abs * angle.cos(), abs * angle.sin())
    }
}

fn angle_real(x: f64) -> f64 {
    if x.is_nan() {
        x
    } else if x < 0.0 {
        std::f64::consts::PI
    } else {
        0.0
    }
}

fn angle_complex(re: f64, im: f64, single: bool) -> f64 {
    if single {
        (im as f32).atan2(re as f32) as f64
    } else {
        im.atan2(re)
    }
}

// -- steps: complex, polar, conj, angle, imag ----------------------------------------------------------

pub const STEPS: &[crate::kernels::registry::StepDef] = &[crate::kernels::registry::StepDef::any("complex", build),
    crate::kernels::registry::StepDef::any("polar", build), crate::kernels::registry::StepDef::any("conj", build),
    crate::kernels::registry::StepDef::any("angle", build), crate::kernels::registry::StepDef::any("imag", build)];

fn build(a: &crate::kernels::registry::Args) -> crate::kernels::registry::Built {
    a.no_params()?;
    let k = Cplx::new(a.op, &a.ins, &a.outs)?;
    crate::kernels::registry::infallible(move |mem| unsafe { k.run(mem) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn element_access_round_trips() {
        let mut b64 = [0f32; 4];
        let mut b128 = [0f64; 4];
        let mut b32 = [0u16; 4];
        unsafe {
            store_c(b64.as_mut_ptr() as *mut u8, DType::C64, 1, (1.5, -2.0));
            store_c(b128.as_mut_ptr() as *mut u8, DType::C128, 1, (0.1, 3.0));
            store_c(b32.as_mut_ptr() as *mut u8, DType::C32, 1, (0.5, -0.25));
            assert_eq!(load_c(b64.as_ptr() as *const u8, DType::C64, 1), (1.5, -2.0));
            assert_eq!(load_c(b128.as_ptr() as *const u8, DType::C128, 1), (0.1, 3.0));
            assert_eq!(load_c(b32.as_ptr() as *const u8, DType::C32, 1), (0.5, -0.25));
            let mut flag = [7u8; 2];
            store_c(flag.as_mut_ptr(), DType::Bool, 0, (0.0, 1.0));
            store_c(flag.as_mut_ptr(), DType::Bool, 1, (0.0, 0.0));
            assert_eq!(flag, [1, 0]);
        }
        assert_eq!(b64, [0.0, 0.0, 1.5, -2.0]);
    }

    #[test]
    fn kernels() {
        let mut re = [1f32, -2.0, 0.0];
        let mut im = [0.5f32, 4.0, f32::NAN];
        let mut out = [0f32; 6];
        let mut ang = [0f32; 3];
        let mem = Mem { ptrs: vec![re.as_mut_ptr() as *mut u8, im.as_mut_ptr() as *mut u8, out.as_mut_ptr() as *mut u8, ang.as_mut_ptr() as *mut u8] };
        let (a, b) = (View::contiguous(0, &[3], DType::F32), View::contiguous(1, &[3], DType::F32));
        let y = View::contiguous(2, &[3], DType::C64);
        unsafe {
            Cplx::new("complex", &[Some(a.clone()), Some(b.clone())], std::slice::from_ref(&y)).unwrap().run(&mem);
            assert_eq!(&out[..4], &[1.0, 0.5, -2.0, 4.0]);
            assert!(out[5].is_nan());
            Cplx::new("angle", &[Some(a.clone())], &[View::contiguous(3, &[3], DType::F32)]).unwrap().run(&mem);
            assert_eq!(ang, [0.0, std::f32::consts::PI, 0.0]);
            Cplx::new("polar", &[Some(a.clone()), Some(b)], std::slice::from_ref(&y)).unwrap().run(&mem);
            assert!((out[0] - 0.5f32.cos()).abs() < 1e-7 && (out[1] - 0.5f32.sin()).abs() < 1e-7);
        }
        unsafe {
            Cplx::new("imag", std::slice::from_ref(&Some(y.clone())), &[View::contiguous(3, &[3], DType::F32)]).unwrap().run(&mem);
        }
        assert_eq!(ang.map(f32::to_bits), [out[1], out[3], out[5]].map(f32::to_bits));
        assert!(Cplx::new("imag", &[Some(a.clone())], &[View::contiguous(3, &[3], DType::F32)]).is_err());
        assert!(Cplx::new("conj", &[Some(a.clone())], &[View::contiguous(3, &[3], DType::F32)]).is_err());
        assert!(Cplx::new("complex", &[Some(a.clone())], std::slice::from_ref(&y)).is_err());
        assert!(Cplx::new("angle", &[Some(a)], &[View::contiguous(3, &[2], DType::F32)]).is_err());
    }
}
