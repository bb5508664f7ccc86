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

/// An epilogue step a micro-kernel applies to its accumulators before storing them
/// (`Epi::in_registers`).
#[derive(Clone, Copy)]
pub enum RegOp {
    Relu,
    Clamp(f32, f32),
    /// c += alpha * r[row] (rows `rs` apart, contiguous along the tile's columns), `r` at the
    /// tile's first element.
    Add(*const f32, isize, f32),
}

/// The epilogue of one tile in the form a micro-kernel applies in registers: a bias per row
/// (NCHW convolutions) or per column (Linear), scaled by `beta`, then up to `MAX_EPI` steps.
/// Pointers are at the tile's first row / column.
#[derive(Clone, Copy)]
pub struct RegEpi {
    /// bias of row r at `row_bias + r * row_bias_step` (null: none)
    pub row_bias: *const f32,
    pub row_bias_step: isize,
    /// bias of column q at `col_bias + q` (null: none)
    pub col_bias: *const f32,
    pub beta: f32,
    pub ops: [RegOp; MAX_EPI],
    pub n: usize,
}

impl RegEpi {
    pub fn ops(&self) -> &[RegOp] {
        &self.ops[..self.n]
    }

    /// The epilogue on `x`, the sums of row `r` (counted from the row the epilogue was built
    /// at), columns col..col + live, in the order `Epi::apply_row` applies it: bias, then each
    /// step. max / min take their NaN from the second operand, so a NaN stays NaN through relu
    /// and clamp. The same bits as `apply_row` where the scales (beta, a residual's alpha) are
    /// powers of two — a scaled bias or residual is one fused multiply-add here.
    ///
    /// # Safety
    /// The CPU has `V`'s instruction set; the pointers valid for those columns of row r.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    pub(crate) unsafe fn apply<V: crate::core::lanes::Lanes>(&self, r: usize, col: usize, live: usize, mut x: V) -> V {
        if !self.row_bias.is_null() {
            x = x.add(V::splat(self.beta * *self.row_bias.offset(r as isize * self.row_bias_step)));
        }
        if !self.col_bias.is_null() {
            x = V::splat(self.beta).fma(V::load(self.col_bias.add(col), live), x);
        }
        for op in self.ops() {
            x = match *op {
                RegOp::Relu => V::zero().max(x),
                RegOp::Clamp(lo, hi) => V::splat(hi).min(V::splat(lo).max(x)),
                RegOp::Add(p, rs, alpha) => V::splat(alpha).fma(V::load(p.offset(r as isize * rs).add(col), live), x),
            };
        }
        x
    }
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

    /// This epilogue for the block of the output whose first element is (i, j): applied at
    /// (r, q) of the block it reads what this one reads at (i + r, j + q). For a product
    /// computed block by block into the matching block of C.
    ///
    /// # Safety
    /// Only computes pointers; they are valid where the epilogue's matrices are.
    pub unsafe fn at(&self, i: usize, j: usize) -> Epi {
        let at = |m: Mat| Mat { p: crate::core::mem::SPtr(m.p.0.offset(i as isize * m.rs + j as isize * m.cs)), ..m };
        let mut e = *self;
        e.bias = self.bias.map(|(m, beta)| (at(m), beta));
        for op in e.ops[..e.n].iter_mut() {
            if let EpiOp::Add(m, alpha) = *op {
                *op = EpiOp::Add(at(m), alpha);
            }
        }
        e
    }

    pub fn is_empty(&self) -> bool {
        self.bias.is_none() && self.n == 0
    }

    /// This epilogue for the tile whose first element is (i, j), as a micro-kernel applies it in
    /// registers: `None` when a step is not one of its forms (another unary op, a bias or
    /// residual that is not contiguous along the columns or constant along them).
    ///
    /// # Safety
    /// Only computes pointers; they are valid where the epilogue's matrices are.
    #[inline]
    pub unsafe fn in_registers(&self, i: usize, j: usize) -> Option<RegEpi> {
        let at = |m: Mat| m.p.0.offset(i as isize * m.rs + j as isize * m.cs) as *const f32;
        let mut e = RegEpi {
            row_bias: std::ptr::null(),
            row_bias_step: 0,
            col_bias: std::ptr::null(),
            beta: 1.0,
            ops: [RegOp::Relu; MAX_EPI],
            n: 0,
        };
        if let Some((b, beta)) = self.bias {
            e.beta = beta;
            match (b.rs, b.cs) {
                (_, 0) => (e.row_bias, e.row_bias_step) = (at(b), b.rs),
                (0, 1) => e.col_bias = at(b),
                _ => return None,
            }
        }
        for op in self.ops() {
            e.ops[e.n] = match *op {
                EpiOp::Un(Un::Relu) => RegOp::Relu,
                EpiOp::Un(Un::Clamp(lo, hi)) => RegOp::Clamp(lo, hi),
                EpiOp::Un(Un::Copy) => continue,
                EpiOp::Add(m, alpha) if m.cs == 1 => RegOp::Add(at(m), m.rs, alpha),
                _ => return None,
            };
            e.n += 1;
        }
        Some(e)
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
                // the activations convolutions and Linear layers end with, in place: a tile row
                // is a few vectors, so the general path's copy and dispatch cost more than the op
                // (NaN passes through both comparisons, as in ATen's relu / hardtanh)
                EpiOp::Un(Un::Relu) => {
                    for o in row.iter_mut() {
                        *o = if *o < 0.0 { 0.0 } else { *o };
                    }
                }
                EpiOp::Un(Un::Clamp(lo, hi)) => {
                    for o in row.iter_mut() {
                        let v = *o;
                        *o = if v < lo { lo } else if v > hi { hi } else { v };
                    }
                }
                EpiOp::Un(Un::Copy) => {}
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
