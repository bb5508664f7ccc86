//! `nonzero_static`: the indices of the first `size` nonzero elements (row-major order) as an int64
//! `(size, ndim)` matrix, the rows past the last nonzero element set to `fill_value`. Its output
//! shape does not depend on the data, unlike `nonzero`, so it can run inside a compiled graph.

use crate::core::element::load_f64;
use crate::core::mem::Mem;
use crate::core::tensor::{DType, Result, View};

pub struct NonzeroStatic {
    x: View,
    y: View,
    fill: i64,
}

impl NonzeroStatic {
    pub fn new(x: View, y: View, fill: i64) -> Result<NonzeroStatic> {
        let ok = y.dtype == DType::I64 && y.rank() == 2 && y.sizes[1] == x.rank();
        if !ok {
            return Err(format!("nonzero_static: result must be int64 of shape (size, {})", x.rank()));
        }
        if x.buf == y.buf {
            return Err("nonzero_static: result shares a buffer with the input".into());
        }
        Ok(NonzeroStatic { x, y, fill })
    }

    /// # Safety
    /// The views must have been validated by the executor (they lie inside their buffers).
    pub unsafe fn run(&self, mem: &Mem) {
        let (x, y) = (&self.x, &self.y);
        let (px, py) = (mem.ptrs[x.buf] as *const u8, mem.ptrs[y.buf] as *mut i64);
        let (rows, nd) = (y.sizes[0], x.rank());
        let mut row = 0;
        let mut idx = vec![0usize; nd];
        let total = x.numel();
        for _ in 0..total {
            if row == rows {
                break;
            }
            let at = x.offset + idx.iter().zip(&x.strides).map(|(i, s)| i * s).sum::<usize>();
            // NaN counts as nonzero, as in PyTorch
            if load_f64(px, x.dtype, at) != 0.0 {
                for (d, &i) in idx.iter().enumerate() {
                    *py.add(y.offset + row * y.strides[0] + d * y.strides[1]) = i as i64;
                }
                row += 1;
            }
            for d in (0..nd).rev() {
                idx[d] += 1;
                if idx[d] < x.sizes[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
        for r in row..rows {
            for d in 0..nd {
                *py.add(y.offset + r * y.strides[0] + d * y.strides[1]) = self.fill;
            }
        }
    }
}

// -- steps: nonzero_static ----------------------------------------------------------------------------

pub const STEPS: &[crate::kernels::registry::StepDef] = &[crate::kernels::registry::StepDef::core("nonzero_static", nonzero_static)];

crate::step_params!(struct Params { fill_value: i64 });

fn nonzero_static(a: &crate::kernels::registry::Args) -> crate::kernels::registry::Built {
    let Params { fill_value } = a.params()?;
    let k = NonzeroStatic::new(a.take(0)?, a.out(0)?, fill_value)?;
    crate::kernels::registry::infallible(move |mem| unsafe { k.run(mem) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_indices_then_fill_on_a_transposed_input() {
        // x = [[0, 1], [2, 0], [3, 4]] stored column-major: read through strides (1, 3)
        let mut data = [0f32, 2.0, 3.0, 1.0, 0.0, 4.0];
        for (rows, want) in [(5usize, vec![0i64, 1, 1, 0, 2, 0, 2, 1, -1, -1]), (2, vec![0, 1, 1, 0])] {
            let mut out = vec![0i64; rows * 2];
            let mem = Mem { ptrs: vec![data.as_mut_ptr() as *mut u8, out.as_mut_ptr() as *mut u8] };
            let x = View::new(0, &[3, 2], &[1, 3], DType::F32);
            let y = View::new(1, &[rows, 2], &[2, 1], DType::I64);
            let k = NonzeroStatic::new(x, y, -1).unwrap();
            unsafe { k.run(&mem) };
            assert_eq!(out, want);
        }
    }

    #[test]
    fn result_shape_is_checked() {
        let x = View::new(0, &[4], &[1], DType::F32);
        assert!(NonzeroStatic::new(x.clone(), View::new(1, &[3, 2], &[2, 1], DType::I64), 0).is_err());
        assert!(NonzeroStatic::new(x, View::new(1, &[3, 1], &[1, 1], DType::F32), 0).is_err());
    }
}
