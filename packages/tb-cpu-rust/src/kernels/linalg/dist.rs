//! p-norm distances: `cdist` (every row of x1 against every row of x2, batched), `pdist` (the
//! upper triangle of the pairwise distances of one set of rows) and `dist` (the p-norm of one
//! broadcast difference). Sums run in f64.

use crate::core::mem::Mem;
use crate::core::strided::for_each;
use crate::core::tensor::{DType, Result, View};
use crate::kernels::registry::{infallible, Args, Built, StepDef};

pub enum Dist {
    /// x1 (B, P, M), x2 (B, R, M) -> out (B, P, R)
    Cdist { x1: View, x2: View, out: View, p: f64 },
    /// x (N, M) -> out (N (N - 1) / 2)
    Pdist { x: View, out: View, p: f64 },
    /// a, b broadcast to one shape -> out (0-d)
    Norm { a: View, b: View, out: View, p: f64 },
}

fn need(cond: bool, what: &str) -> Result<()> {
    if cond {
        Ok(())
    } else {
        Err(what.to_string())
    }
}

/// Accumulates |d| for one p: the value to add to (or combine into) the running total.
#[derive(Clone, Copy)]
struct Acc {
    p: f64,
    total: f64,
}

impl Acc {
    fn new(p: f64) -> Acc {
        let total = if p == f64::NEG_INFINITY { f64::INFINITY } else { 0.0 };
        Acc { p, total }
    }
    #[inline]
    fn add(&mut self, d: f64) {
        let a = d.abs();
        let p = self.p;
        if p == 0.0 {
            self.total += (a != 0.0) as u8 as f64;
        } else if p == f64::INFINITY {
            if a > self.total || a.is_nan() {
                self.total = a;
            }
        } else if p == f64::NEG_INFINITY {
            if a < self.total || a.is_nan() {
                self.total = a;
            }
        } else if p == 1.0 {
            self.total += a;
        } else if p == 2.0 {
            self.total += a * a;
        } else {
            self.total += a.powf(p);
        }
    }
    fn finish(self) -> f64 {
        let p = self.p;
        if p == 0.0 || p.is_infinite() || p == 1.0 {
            self.total
        } else if p == 2.0 {
            self.total.sqrt()
        } else {
            self.total.powf(1.0 / p)
        }
    }
}

crate::step_params!(
    /// The norm's order.
    struct DistParams { p: f64 }
);

pub const STEPS: &[StepDef] = &[StepDef::core("cdist", build), StepDef::core("pdist", build), StepDef::core("dist", build)];

fn build(a: &Args) -> Built {
    let DistParams { p } = a.params()?;
    let k = Dist::new(a.op, &a.ins, &a.outs, p)?;
    infallible(move |mem| unsafe { k.run(mem) })
}

impl Dist {
    pub fn new(op: &str, ins: &[Option<View>], outs: &[View], p: f64) -> Result<Dist> {
        let get = |i: usize| ins.get(i).cloned().flatten().ok_or_else(|| format!("{op}: missing operand {i}"));
        let out = outs.first().cloned().ok_or_else(|| format!("{op}: missing output"))?;
        // the lowering's JSON has no infinity: ±3.4e39 (finite in f64) stands for it
        let p = match p {
            p if p >= 3.0e39 => f64::INFINITY,
            p if p <= -3.0e39 => f64::NEG_INFINITY,
            p => p,
        };
        need(p >= 0.0 || p == f64::NEG_INFINITY && op == "dist", "p must be non-negative")?;
        need(out.dtype == DType::F32, "distances are float32")?;
        let k = match op {
            "cdist" => {
                let (x1, x2) = (get(0)?, get(1)?);
                need(x1.rank() == 3 && x2.rank() == 3 && out.rank() == 3, "cdist takes (B, P, M) and (B, R, M)")?;
                need(x1.sizes[0] == x2.sizes[0] && x1.sizes[2] == x2.sizes[2], "cdist: batch or feature sizes differ")?;
                need(out.sizes == [x1.sizes[0], x1.sizes[1], x2.sizes[1]], "cdist output shape")?;
                Dist::Cdist { x1, x2, out, p }
            }
            "pdist" => {
                let x = get(0)?;
                need(x.rank() == 2 && out.rank() == 1, "pdist takes an (N, M) input")?;
                let n = x.sizes[0];
                need(out.sizes[0] == n * n.saturating_sub(1) / 2, "pdist output shape")?;
                Dist::Pdist { x, out, p }
            }
            "dist" => {
                let (a, b) = (get(0)?, get(1)?);
                need(a.sizes == b.sizes && out.numel() == 1, "dist operands must be broadcast to one shape")?;
                Dist::Norm { a, b, out, p }
            }
            other => return Err(format!("unknown distance kernel {other:?}")),
        };
        for v in ins.iter().flatten() {
            need(v.dtype == DType::F32, "distance operands are float32")?;
        }
        Ok(k)
    }

    /// # Safety
    /// The views must have been validated by the executor.
    pub unsafe fn run(&self, mem: &Mem) {
        match self {
            Dist::Cdist { x1, x2, out, p } => {
                let (p1, p2, po) = (mem.ptr::<f32>(x1), mem.ptr::<f32>(x2), mem.ptr::<f32>(out));
                let (b, pn, rn, m) = (x1.sizes[0], x1.sizes[1], x2.sizes[1], x1.sizes[2]);
                for bi in 0..b {
                    for i in 0..pn {
                        for j in 0..rn {
                            let mut acc = Acc::new(*p);
                            for t in 0..m {
                                let u = *p1.add(bi * x1.strides[0] + i * x1.strides[1] + t * x1.strides[2]) as f64;
                                let v = *p2.add(bi * x2.strides[0] + j * x2.strides[1] + t * x2.strides[2]) as f64;
                                acc.add(u - v);
                            }
                            *po.add(bi * out.strides[0] + i * out.strides[1] + j * out.strides[2]) = acc.finish() as f32;
                        }
                    }
                }
            }
            Dist::Pdist { x, out, p } => {
                let (px, po) = (mem.ptr::<f32>(x), mem.ptr::<f32>(out));
                let (n, m) = (x.sizes[0], x.sizes[1]);
                let mut k = 0;
                for i in 0..n {
                    for j in i + 1..n {
                        let mut acc = Acc::new(*p);
                        for t in 0..m {
                            let u = *px.add(i * x.strides[0] + t * x.strides[1]) as f64;
                            let v = *px.add(j * x.strides[0] + t * x.strides[1]) as f64;
                            acc.add(u - v);
                        }
                        *po.add(k * out.strides[0]) = acc.finish() as f32;
                        k += 1;
                    }
                }
            }
            Dist::Norm { a, b, out, p } => {
                let (pa, pb) = (mem.ptr::<f32>(a), mem.ptr::<f32>(b));
                let mut acc = Acc::new(*p);
                // as ATen, the difference is rounded to float32 before the norm
                for_each(&a.sizes, [&a.strides[..], &b.strides[..]], |[i, j]| acc.add((*pa.add(i) - *pb.add(j)) as f64));
                let v = if a.numel() == 0 && p.is_infinite() { 0.0 } else { acc.finish() };
                *mem.ptr::<f32>(out).get() = v as f32;
            }
        }
    }
}
