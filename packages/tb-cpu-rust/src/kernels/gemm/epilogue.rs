//! The operands every GEMM kernel shares: a strided matrix (`Mat`) and the epilogue fused
//! after the product (`Epi`: bias, residual, unary ops).

use crate::core::math::unary::Un;
use crate::core::mem::SPtr;
use crate::kernels::elementwise::Scalar;

/// One strided matrix: pointer, row stride, column stride (elements).
#[derive(Clone, Copy)]
pub struct Mat {
    pub p: SPtr<f32>,
    pub rs: isize,
    pub cs: isize,
}

/// One step of a GEMM epilogue, applied to each output element after the product.
#[derive(Clone, Copy)]
pub enum EpiOp {
    Un(Un),
    /// c += alpha * r[i, j] (a residual connection)
    Add(Mat, f32),
}

/// An epilogue step as the plan names it: a unary op, or adding the residual operand.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum EpiSpec {
    Un(Un),
    Residual,
}

/// Most epilogue steps one GEMM carries (a fixed array, so building one per call allocates nothing).
pub const MAX_EPI: usize = 4;

/// What runs on each output tile after the product: `c += beta * bias[i, j]`, then `ops`.
#[derive(Clone, Copy)]
pub struct Epi {
    pub bias: Option<(Mat, f32)>,
    ops: [EpiOp; MAX_EPI],
    n: usize,
}

impl Default for Epi {
    fn default() -> Epi {
        Epi { bias: None, ops: [EpiOp::Un(Un::Copy); MAX_EPI], n: 0 }
    }
}

impl Epi {
    /// Keeps the first `MAX_EPI` ops (plans are validated to carry no more).
    pub fn new(bias: Option<(Mat, f32)>, ops: impl IntoIterator<Item = EpiOp>) -> Epi {
        let mut e = Epi { bias, ..Epi::default() };
        for op in ops.into_iter().take(MAX_EPI) {
            e.ops[e.n] = op;
            e.n += 1;
        }
        e
    }

    pub fn ops(&self) -> &[EpiOp] {
        &self.ops[..self.n]
    }

    pub fn is_empty(&self) -> bool {
        self.bias.is_none() && self.n == 0
    }

    /// Applies the epilogue to `row`, the elements (i, j..j+row.len()) of the output.
    ///
    /// # Safety
    /// The bias and residual matrices must be valid at those positions.
    #[inline(always)]
    pub unsafe fn apply_row(&self, row: &mut [f32], i: usize, j: usize) {
        #[inline(always)]
        unsafe fn add(row: &mut [f32], m: Mat, alpha: f32, i: usize, j: usize) {
            let p = m.p.0.offset(i as isize * m.rs + j as isize * m.cs);
            if m.cs == 1 {
                let src = std::slice::from_raw_parts(p, row.len());
                if alpha == 1.0 {
                    for (o, &x) in row.iter_mut().zip(src) {
                        *o += x;
                    }
                } else {
                    for (o, &x) in row.iter_mut().zip(src) {
                        *o += alpha * x;
                    }
                }
            } else if m.cs == 0 {
                let x = alpha * *p;
                for o in row.iter_mut() {
                    *o += x;
                }
            } else {
                for (q, o) in row.iter_mut().enumerate() {
                    *o += alpha * *p.offset(q as isize * m.cs);
                }
            }
        }
        if let Some((b, beta)) = self.bias {
            add(row, b, beta, i, j);
        }
        for op in self.ops() {
            match *op {
                EpiOp::Un(u) => {
                    for chunk in row.chunks_mut(64) {
                        let mut tmp = [0f32; 64];
                        let t = &mut tmp[..chunk.len()];
                        t.copy_from_slice(chunk);
                        f32::un(u, chunk, t);
                    }
                }
                EpiOp::Add(m, alpha) => add(row, m, alpha, i, j),
            }
        }
    }
}
