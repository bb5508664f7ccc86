//! Discrete Fourier transforms over any set of dims: ATen's `_fft_r2c`, `_fft_c2c` and
//! `_fft_c2r`, on the `rustfft` crate (mixed radix, Bluestein for large primes).
//!
//! Every transform copies its operand into one contiguous complex<f64> work array, runs 1-d
//! transforms along each dim in turn, scales once and stores (rounding to float32 for
//! complex64), so any input or output strides work and float32 results are at least as accurate
//! as PocketFFT's. `norm` is ATen's `fft_norm_mode`: 0 none, 1 1/sqrt(n), 2 1/n, where n is the
//! product of the signal sizes (the real sizes for c2r). As in PocketFFT, r2c and c2r treat the
//! last dim of the list as the halved (one-sided) one, and c2r runs its c2c dims first.

use crate::core::element::{load_c, store_c};
use crate::core::mem::Mem;
use crate::core::strided::for_each;
use crate::core::tensor::{contiguous_strides, need, numel, DType, Result, View};
use rustfft::num_complex::Complex64;
use crate::kernels::registry::{infallible, Args, Built, StepDef};
use rustfft::FftPlanner;
use std::sync::Arc;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    R2c { onesided: bool },
    C2c { forward: bool },
    C2r,
}

pub struct Fft {
    kind: Kind,
    x: View,
    y: View,
    dims: Vec<usize>,
    /// sizes of the work array: the input's, except c2r, whose work array has the output's sizes
    work: Vec<usize>,
    scale: f64,
    /// one plan per dim of `dims`, in order
    plans: Vec<Arc<dyn rustfft::Fft<f64>>>,
}

crate::step_params!(
    /// norm: ATen's normalisation mode (0 none, 1 1/sqrt(n), 2 1/n); flag: r2c's onesided, c2c's
    /// forward, c2r's last signal size; dims: the transformed dims
    pub struct FftParams { pub norm: i64, pub flag: i64, pub dims: Vec<i64> }
);

pub const STEPS: &[StepDef] = &[StepDef::any("fft_r2c", build), StepDef::any("fft_c2c", build), StepDef::any("fft_c2r", build)];

fn build(a: &Args) -> Built {
    let k = Fft::new(a.op, &a.ins, &a.outs, &a.params()?)?;
    infallible(move |mem| unsafe { k.run(mem) })
}

impl Fft {
    pub fn new(op: &str, ins: &[Option<View>], outs: &[View], p: &FftParams) -> Result<Fft> {
        let x = ins.first().cloned().flatten().ok_or("fft: missing input")?;
        let y = outs.first().cloned().ok_or("fft: missing output")?;
        need(!p.dims.is_empty(), "fft: norm, flag and at least one dim needed")?;
        let (norm, flag) = (p.norm, p.flag);
        let rank = x.rank();
        need(y.rank() == rank, "fft: input and output differ in rank")?;
        let mut dims = Vec::with_capacity(p.dims.len());
        for &d in &p.dims {
            let d = if d < 0 { d + rank as i64 } else { d };
            need(d >= 0 && (d as usize) < rank, "fft: dim out of range")?;
            need(!dims.contains(&(d as usize)), "fft: repeated dim")?;
            dims.push(d as usize);
        }
        let last = *dims.last().ok_or("fft: no dim")?;
        let is_real = |v: &View| matches!(v.dtype, DType::F32 | DType::F64);
        let is_cplx = |v: &View| matches!(v.dtype, DType::C64 | DType::C128);
        let kind = match op {
            "fft_r2c" => {
                need(is_real(&x) && is_cplx(&y), "fft_r2c: real input, complex output")?;
                let onesided = flag != 0;
                let mut want = x.sizes.clone();
                if onesided {
                    want[last] = x.sizes[last] / 2 + 1;
                }
                need(y.sizes == want, "fft_r2c: output shape")?;
                Kind::R2c { onesided }
            }
            "fft_c2c" => {
                need(is_cplx(&x) && is_cplx(&y), "fft_c2c: complex input and output")?;
                need(y.sizes == x.sizes, "fft_c2c: output shape")?;
                Kind::C2c { forward: flag != 0 }
            }
            "fft_c2r" => {
                need(is_cplx(&x) && is_real(&y), "fft_c2r: complex input, real output")?;
                let n = usize::try_from(flag).map_err(|_| "fft_c2r: negative last dim size".to_string())?;
                let mut want = x.sizes.clone();
                want[last] = n;
                need(y.sizes == want, "fft_c2r: output shape")?;
                need(x.sizes[last] > n / 2 || numel(&y.sizes)? == 0, "fft_c2r: input too short for the output size")?;
                Kind::C2r
            }
            other => return Err(format!("unknown transform {other:?}")),
        };
        need(matches!(norm, 0..=2), "fft: norm mode must be 0, 1 or 2")?;
        let work = if kind == Kind::C2r { y.sizes.clone() } else { x.sizes.clone() };
        let n: f64 = dims.iter().map(|&d| work[d] as f64).product();
        let scale = match norm {
            1 => 1.0 / n.sqrt(),
            2 => 1.0 / n,
            _ => 1.0,
        };
        let forward = match kind {
            Kind::R2c { .. } => true,
            Kind::C2c { forward } => forward,
            Kind::C2r => false,
        };
        let mut planner = FftPlanner::<f64>::new();
        let plans = dims
            .iter()
            .map(|&d| if forward { planner.plan_fft_forward(work[d]) } else { planner.plan_fft_inverse(work[d]) })
            .collect();
        Ok(Fft { kind, x, y, dims, work, scale, plans })
    }

    /// # Safety
    /// The views must have been validated by the executor.
    pub unsafe fn run(&self, mem: &Mem) {
        let total: usize = self.work.iter().product();
        if total == 0 || self.y.numel() == 0 {
            return;
        }
        let ws = contiguous_strides(&self.work);
        let mut w = vec![Complex64::new(0.0, 0.0); total];
        let (px, py) = (mem.byte_ptr(&self.x), mem.byte_ptr(&self.y));
        let (dx, dy) = (self.x.dtype, self.y.dtype);
        let last = *self.dims.last().unwrap_or(&0);
        // load: c2r reads only the n/2 + 1 non-redundant entries of its last dim
        let mut load_sizes = self.x.sizes.clone();
        if self.kind == Kind::C2r {
            load_sizes[last] = self.work[last] / 2 + 1;
        }
        for_each(&load_sizes, [&self.x.strides, &ws], |[a, b]| {
            let (re, im) = load_c(px, dx, a);
            w[b] = Complex64::new(re, im);
        });
        let k = self.dims.len();
        if self.kind == Kind::C2r {
            for i in 0..k - 1 {
                along(&mut w, &self.work, self.dims[i], &*self.plans[i]);
            }
            hermitian(&mut w, &self.work, last);
            along(&mut w, &self.work, last, &*self.plans[k - 1]);
        } else if let Kind::R2c { .. } = self.kind {
            // PocketFFT's order: the real transform along the last dim (whose bins 0 and n/2 have
            // an exactly zero imaginary part), then the complex ones
            along(&mut w, &self.work, last, &*self.plans[k - 1]);
            real_bins(&mut w, &self.work, last);
            for i in 0..k - 1 {
                along(&mut w, &self.work, self.dims[i], &*self.plans[i]);
            }
        } else {
            for (&d, plan) in self.dims.iter().zip(&self.plans) {
                along(&mut w, &self.work, d, &**plan);
            }
        }
        let s = self.scale;
        // the output indexes the work array with its own sizes (r2c one-sided: the first half)
        for_each(&self.y.sizes, [&ws, &self.y.strides], |[a, b]| {
            let z = w[a];
            store_c(py, dy, b, (z.re * s, z.im * s));
        });
    }
}

/// In-place 1-d transforms of every line of contiguous `w` (sizes `sizes`) along `dim`.
fn along(w: &mut [Complex64], sizes: &[usize], dim: usize, plan: &dyn rustfft::Fft<f64>) {
    let n = sizes[dim];
    if n <= 1 {
        return; // a length-1 DFT is the identity
    }
    let mut line = vec![Complex64::new(0.0, 0.0); n];
    let mut scratch = vec![Complex64::new(0.0, 0.0); plan.get_inplace_scratch_len()];
    let (starts, inner) = line_starts(sizes, dim);
    for base in starts {
        for (k, z) in line.iter_mut().enumerate() {
            *z = w[base + k * inner];
        }
        plan.process_with_scratch(&mut line, &mut scratch);
        for (k, z) in line.iter().enumerate() {
            w[base + k * inner] = *z;
        }
    }
}

/// The offset of the first element of every line along `dim` of a contiguous array of `sizes`,
/// and the step between the elements of one line.
fn line_starts(sizes: &[usize], dim: usize) -> (impl Iterator<Item = usize>, usize) {
    let (n, inner) = (sizes[dim], sizes[dim + 1..].iter().product::<usize>());
    let outer: usize = sizes[..dim].iter().product();
    ((0..outer).flat_map(move |o| (0..inner).map(move |i| o * n * inner + i)), inner)
}

/// Sets the imaginary part of bins 0 and n/2 (n even) along `dim` to zero: the spectrum of a
/// real line has it exactly, and a real inverse ignores it (as PocketFFT's does).
fn real_bins(w: &mut [Complex64], sizes: &[usize], dim: usize) {
    let n = sizes[dim];
    let (starts, inner) = line_starts(sizes, dim);
    for base in starts {
        w[base].im = 0.0;
        if n.is_multiple_of(2) {
            w[base + n / 2 * inner].im = 0.0;
        }
    }
}

/// Completes each line along `dim` from its first n/2 + 1 entries: X[n - k] = conj(X[k]).
fn hermitian(w: &mut [Complex64], sizes: &[usize], dim: usize) {
    real_bins(w, sizes, dim);
    let n = sizes[dim];
    let (starts, inner) = line_starts(sizes, dim);
    for base in starts {
        for k in n / 2 + 1..n {
            w[base + k * inner] = w[base + (n - k) * inner].conj();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// the parameters [norm, flag, dims...]
    fn fp(ints: &[i64]) -> FftParams {
        FftParams { norm: ints[0], flag: ints[1], dims: ints[2..].to_vec() }
    }

    /// Naive DFT of one line.
    fn dft(x: &[Complex64], forward: bool) -> Vec<Complex64> {
        let n = x.len();
        let sign = if forward { -1.0 } else { 1.0 };
        (0..n)
            .map(|k| {
                x.iter().enumerate().fold(Complex64::new(0.0, 0.0), |acc, (t, &v)| {
                    let a = sign * 2.0 * std::f64::consts::PI * (k * t) as f64 / n as f64;
                    acc + v * Complex64::new(a.cos(), a.sin())
                })
            })
            .collect()
    }

    #[test]
    fn r2c_onesided_matches_a_naive_dft() {
        let mut x: Vec<f64> = (0..7).map(|i| (i as f64 * 0.7).sin() + 0.1 * i as f64).collect();
        let mut y = vec![0f64; 2 * 4];
        let mem = Mem { ptrs: vec![x.as_mut_ptr() as *mut u8, y.as_mut_ptr() as *mut u8] };
        let f = Fft::new("fft_r2c", &[Some(View::contiguous(0, &[7], DType::F64))], &[View::contiguous(1, &[4], DType::C128)], &fp(&[1, 1, 0])).unwrap();
        unsafe { f.run(&mem) };
        let want = dft(&x.iter().map(|&v| Complex64::new(v, 0.0)).collect::<Vec<_>>(), true);
        for k in 0..4 {
            let s = 1.0 / 7f64.sqrt();
            assert!((y[2 * k] - want[k].re * s).abs() < 1e-12 && (y[2 * k + 1] - want[k].im * s).abs() < 1e-12);
        }
    }

    #[test]
    fn c2r_inverts_r2c_over_two_dims() {
        let mut x: Vec<f64> = (0..12).map(|i| ((i * 7) % 5) as f64 - 1.5).collect();
        let mut spec = vec![0f64; 2 * 3 * 3];
        let mut back = vec![0f64; 12];
        let mem = Mem { ptrs: vec![x.as_mut_ptr() as *mut u8, spec.as_mut_ptr() as *mut u8, back.as_mut_ptr() as *mut u8] };
        let fwd = Fft::new("fft_r2c", &[Some(View::contiguous(0, &[3, 4], DType::F64))], &[View::contiguous(1, &[3, 3], DType::C128)], &fp(&[0, 1, 0, 1])).unwrap();
        let inv = Fft::new("fft_c2r", &[Some(View::contiguous(1, &[3, 3], DType::C128))], &[View::contiguous(2, &[3, 4], DType::F64)], &fp(&[2, 4, 0, 1])).unwrap();
        unsafe {
            fwd.run(&mem);
            inv.run(&mem);
        }
        for (a, b) in x.iter().zip(&back) {
            assert!((a - b).abs() < 1e-12, "{a} vs {b}");
        }
    }

    #[test]
    fn bad_specs_are_errors() {
        let (r, c) = (View::contiguous(0, &[4], DType::F32), View::contiguous(1, &[3], DType::C64));
        assert!(Fft::new("fft_r2c", &[Some(r.clone())], &[View::contiguous(1, &[4], DType::C64)], &fp(&[0, 1, 0])).is_err());
        assert!(Fft::new("fft_r2c", &[Some(r.clone())], std::slice::from_ref(&c), &fp(&[0, 1, 1])).is_err());
        assert!(Fft::new("fft_r2c", &[Some(r.clone())], std::slice::from_ref(&c), &fp(&[3, 1, 0])).is_err());
        assert!(Fft::new("fft_c2c", &[Some(r.clone())], std::slice::from_ref(&c), &fp(&[0, 1, 0])).is_err());
        assert!(Fft::new("fft_c2r", &[Some(View::contiguous(1, &[2], DType::C64))], &[View::contiguous(0, &[8], DType::F32)], &fp(&[0, 8, 0])).is_err());
        assert!(Fft::new("fft_r2c", &[Some(r)], &[c], &fp(&[0, 1, 0, 0])).is_err());
    }
}
