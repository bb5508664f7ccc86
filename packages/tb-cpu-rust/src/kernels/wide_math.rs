//! Kernels that compute in the wide dtypes, not through float32: softmax / log-softmax in
//! float64 (`_softmax` with `dtype=torch.float64`), and exact integer reductions (sum, amax,
//! amin of int64 / int32 / ... / bool values into an integer result), which ATen also does
//! exactly (a float32 sum would round above 2**24), and single float64 elementwise operations
//! (arithmetic, pow, ceil/floor, comparisons, where) for the small float64 graphs ATen's
//! decompositions make (logspace, quantile's index arithmetic).

use crate::core::element::{load_f64, load_i64, store_f64, store_i64};
use crate::core::mem::Mem;
use crate::core::strided::{drop_dim, for_each};
use crate::core::tensor::{need, DType, Result, View};
use crate::kernels::registry::{infallible, Args, Built, StepDef};
use serde::Deserialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IRed {
    Sum,
    Amax,
    Amin,
}

/// One elementwise float64 operation (no fusion: the graphs that compute in float64 are small).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op64 {
    Add,
    Sub,
    Mul,
    Div,
    Pow,
    Neg,
    Ceil,
    Floor,
    /// half to even, as torch.round
    Round,
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
    Ne,
    Where,
}

/// An operand: a view (any dtype, read as float64; broadcast to the result) or a scalar.
pub enum Arg64 {
    V(View),
    S(f64),
}

pub enum Wide {
    Softmax64 { x: View, y: View, dim: usize, log: bool },
    /// y = op(args) in float64; y is float64, or bool for comparisons
    Ew64 { op: Op64, args: Vec<Arg64>, y: View },
    /// `out` is a view with the reduced dims kept (size 1, stride 0): every x element folds into it
    IReduce { kind: IRed, x: View, out: View },
}

fn is_int(dt: DType) -> bool {
    matches!(dt, DType::I64 | DType::I32 | DType::I16 | DType::I8 | DType::U8 | DType::Bool)
}

/// The parameters of each step kind of this family, by name: ireduce's kind 0 sum, 1 amax,
/// 2 amin; ew64's code (see `Wide::new`), per operand 0 (the next input) or 1 (the next scalar).
#[derive(Deserialize)]
#[serde(tag = "op", deny_unknown_fields)]
pub enum Params {
    #[serde(rename = "softmax64", alias = "log_softmax64")]
    Softmax { dim: i64 },
    #[serde(rename = "ireduce")]
    IReduce { kind: i64 },
    #[serde(rename = "ew64")]
    Ew { code: i64, kinds: Vec<i64>, scalars: Vec<f64> },
}

pub const STEPS: &[StepDef] = &[StepDef::any("softmax64", build), StepDef::any("log_softmax64", build), StepDef::any("ireduce", build),
    StepDef::any("ew64", build)];

fn build(a: &Args) -> Built {
    let k = Wide::new(a.op, &a.ins, &a.outs, a.tagged()?)?;
    infallible(move |mem| unsafe { k.run(mem) })
}

impl Wide {
    pub fn new(op: &str, ins: &[Option<View>], outs: &[View], p: Params) -> Result<Wide> {
        let x = ins.first().cloned().flatten().ok_or("missing operand 0")?;
        let y = outs.first().cloned().ok_or("missing output 0")?;
        match p {
            Params::Softmax { dim: d } => {
                need(x.dtype == DType::F64 && y.dtype == DType::F64, "float64 softmax takes and gives float64")?;
                need(x.sizes == y.sizes, "softmax input and output differ in shape")?;
                let r = x.rank() as i64;
                let d = if d < 0 { d + r } else { d };
                need(d >= 0 && d < r.max(1), "softmax dim out of range")?;
                Ok(Wide::Softmax64 { x, y, dim: d as usize, log: op == "log_softmax64" })
            }
            Params::IReduce { kind } => {
                let kind = match kind {
                    0 => IRed::Sum,
                    1 => IRed::Amax,
                    2 => IRed::Amin,
                    k => return Err(format!("unknown integer reduction {k}")),
                };
                need(is_int(x.dtype) && is_int(y.dtype) && y.dtype != DType::Bool, "integer reductions read integers and give an integer")?;
                need(x.rank() == y.rank(), "integer reduction: output must keep the reduced dims")?;
                for (&a, &b) in x.sizes.iter().zip(&y.sizes) {
                    need(b == a || b == 1, "integer reduction: output shape")?;
                }
                Ok(Wide::IReduce { kind, x, out: y })
            }
            Params::Ew { code, kinds, scalars } => {
                let op = match code {
                    0 => Op64::Add,
                    1 => Op64::Sub,
                    2 => Op64::Mul,
                    3 => Op64::Div,
                    4 => Op64::Pow,
                    5 => Op64::Neg,
                    6 => Op64::Ceil,
                    7 => Op64::Floor,
                    8 => Op64::Lt,
                    9 => Op64::Le,
                    10 => Op64::Gt,
                    11 => Op64::Ge,
                    12 => Op64::Eq,
                    13 => Op64::Ne,
                    14 => Op64::Where,
                    15 => Op64::Round,
                    c => return Err(format!("unknown float64 op {c}")),
                };
                let arity = match op {
                    Op64::Neg | Op64::Ceil | Op64::Floor | Op64::Round => 1,
                    Op64::Where => 3,
                    _ => 2,
                };
                need(kinds.len() == arity, "ew64: one kind per operand")?;
                let (mut vi, mut fi) = (0usize, 0usize);
                let mut args = Vec::with_capacity(arity);
                for &kind in &kinds {
                    if kind == 0 {
                        let v = ins.get(vi).cloned().flatten().ok_or("ew64: missing operand")?;
                        need(v.sizes == y.sizes, "ew64: operand shape differs from the result's")?;
                        need(!v.dtype.is_complex(), "ew64: complex operand")?;
                        args.push(Arg64::V(v));
                        vi += 1;
                    } else {
                        args.push(Arg64::S(*scalars.get(fi).ok_or("ew64: missing scalar")?));
                        fi += 1;
                    }
                }
                let cmp = matches!(op, Op64::Lt | Op64::Le | Op64::Gt | Op64::Ge | Op64::Eq | Op64::Ne);
                need(y.dtype == if cmp { DType::Bool } else { DType::F64 }, "ew64: float64 result (bool for comparisons)")?;
                Ok(Wide::Ew64 { op, args, y })
            }
        }
    }

    /// # Safety
    /// The views must have been validated by the executor.
    pub unsafe fn run(&self, mem: &Mem) {
        match self {
            Wide::Softmax64 { x, y, dim, log } => {
                let (px, py) = (mem.byte_ptr(x) as *const f64, mem.byte_ptr(y) as *mut f64);
                // a 0-d tensor is one line of one element
                let (n, sx, sy) = if x.rank() == 0 { (1, 0, 0) } else { (x.sizes[*dim], x.strides[*dim], y.strides[*dim]) };
                let (outer, xs, ys) = if x.rank() == 0 {
                    (vec![], vec![], vec![])
                } else {
                    (drop_dim(&x.sizes, *dim), drop_dim(&x.strides, *dim), drop_dim(&y.strides, *dim))
                };
                if n == 0 {
                    return;
                }
                for_each(&outer, [&xs, &ys], |[a, b]| {
                    let at = |k: usize| *px.add(a + k * sx);
                    let mut m = f64::NEG_INFINITY;
                    for k in 0..n {
                        let v = at(k);
                        // NaN wins, as ATen's vectorised max does
                        if v.is_nan() || v > m {
                            m = v;
                        }
                    }
                    let mut s = 0.0;
                    for k in 0..n {
                        let e = (at(k) - m).exp();
                        if !*log {
                            *py.add(b + k * sy) = e;
                        }
                        s += e;
                    }
                    if *log {
                        let ls = s.ln();
                        for k in 0..n {
                            *py.add(b + k * sy) = at(k) - m - ls;
                        }
                    } else {
                        for k in 0..n {
                            *py.add(b + k * sy) /= s;
                        }
                    }
                });
            }
            Wide::Ew64 { op, args, y } => {
                let py = mem.byte_ptr(y);
                let dy = y.dtype;
                let zero = vec![0usize; y.rank()];
                let mut ptrs = [std::ptr::null::<u8>(); 3];
                let mut dts = [DType::F64; 3];
                let mut consts = [0f64; 3];
                let mut strides: [&[usize]; 3] = [&zero, &zero, &zero];
                for (i, a) in args.iter().enumerate() {
                    match a {
                        Arg64::V(v) => {
                            ptrs[i] = mem.byte_ptr(v);
                            dts[i] = v.dtype;
                            strides[i] = &v.strides;
                        }
                        Arg64::S(c) => consts[i] = *c,
                    }
                }
                let n = args.len();
                for_each(&y.sizes, [strides[0], strides[1], strides[2], &y.strides], |[o0, o1, o2, k]| {
                    let offs = [o0, o1, o2];
                    let mut v = [0f64; 3];
                    for i in 0..n {
                        v[i] = if ptrs[i].is_null() { consts[i] } else { load_f64(ptrs[i], dts[i], offs[i]) };
                    }
                    let (a, b) = (v[0], v[1]);
                    let r = match op {
                        Op64::Add => a + b,
                        Op64::Sub => a - b,
                        Op64::Mul => a * b,
                        Op64::Div => a / b,
                        Op64::Pow => a.powf(b),
                        Op64::Neg => -a,
                        Op64::Ceil => a.ceil(),
                        Op64::Floor => a.floor(),
                        Op64::Round => a.round_ties_even(),
                        Op64::Lt => (a < b) as u8 as f64,
                        Op64::Le => (a <= b) as u8 as f64,
                        Op64::Gt => (a > b) as u8 as f64,
                        Op64::Ge => (a >= b) as u8 as f64,
                        Op64::Eq => (a == b) as u8 as f64,
                        Op64::Ne => (a != b) as u8 as f64,
                        Op64::Where => {
                            if a != 0.0 {
                                b
                            } else {
                                v[2]
                            }
                        }
                    };
                    store_f64(py, dy, k, r);
                });
            }
            Wide::IReduce { kind, x, out } => {
                let (px, po) = (mem.byte_ptr(x), mem.byte_ptr(out));
                let (dx, dout) = (x.dtype, out.dtype);
                let init = match kind {
                    IRed::Sum => 0,
                    IRed::Amax => i64::MIN,
                    IRed::Amin => i64::MAX,
                };
                // every output element once (reduced dims have size 1)
                for_each(&out.sizes, [&out.strides], |[b]| store_i64(po, dout, b, init));
                // int64 sums wrap around, as ATen's do
                for_each(&x.sizes, [&x.strides, &out.strides], |[a, b]| {
                    let v = load_i64(px, dx, a);
                    let cur = load_i64(po, dout, b);
                    let r = match kind {
                        IRed::Sum => cur.wrapping_add(v),
                        IRed::Amax => cur.max(v),
                        IRed::Amin => cur.min(v),
                    };
                    store_i64(po, dout, b, r);
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `Wide::new` with the parameters in the order [dim] / [kind] / [code, kinds...] + scalars
    fn wide(op: &str, ins: &[Option<View>], outs: &[View], ints: &[i64], floats: &[f64]) -> Result<Wide> {
        let p = match op {
            "ew64" => Params::Ew { code: ints[0], kinds: ints[1..].to_vec(), scalars: floats.to_vec() },
            "ireduce" => Params::IReduce { kind: ints[0] },
            _ => Params::Softmax { dim: ints[0] },
        };
        Wide::new(op, ins, outs, p)
    }

    #[test]
    fn softmax_in_float64() {
        let mut x = [1.0f64, 2.0, 3.0, -1.0, f64::NEG_INFINITY, 0.5];
        let mut y = [0f64; 6];
        let mem = Mem { ptrs: vec![x.as_mut_ptr() as *mut u8, y.as_mut_ptr() as *mut u8] };
        let (vx, vy) = (View::new(0, &[2, 3], &[3, 1], DType::F64), View::new(1, &[2, 3], &[3, 1], DType::F64));
        let k = wide("softmax64", &[Some(vx.clone())], std::slice::from_ref(&vy), &[-1], &[]).unwrap();
        unsafe { k.run(&mem) };
        let s: f64 = [1.0f64, 2.0, 3.0].iter().map(|v| (v - 3.0).exp()).sum();
        assert!((y[0] - (-2.0f64).exp() / s).abs() < 1e-15);
        assert_eq!(y[4], 0.0);
        let k = wide("log_softmax64", &[Some(vx)], &[vy], &[1], &[]).unwrap();
        unsafe { k.run(&mem) };
        assert!((y[2] + s.ln()).abs() < 1e-15);
        let (vx, vy) = (View::new(0, &[], &[], DType::F64), View::new(1, &[], &[], DType::F64));
        let k = wide("log_softmax64", &[Some(vx)], &[vy], &[0], &[]).unwrap();
        unsafe { k.run(&mem) };
        assert_eq!(y[0], 0.0);
        assert!(wide("softmax64", &[Some(View::new(0, &[2], &[1], DType::F32))], &[View::new(1, &[2], &[1], DType::F64)], &[0], &[]).is_err());
    }

    #[test]
    fn float64_elementwise() {
        let mut x = [1.5f64, -2.25, 3.0];
        let mut c = [1u8, 0, 1];
        let mut y = [0f64; 3];
        let mut b = [0u8; 3];
        let mem = Mem { ptrs: vec![x.as_mut_ptr() as *mut u8, c.as_mut_ptr(), y.as_mut_ptr() as *mut u8, b.as_mut_ptr()] };
        let vx = View::new(0, &[3], &[1], DType::F64);
        let vc = View::new(1, &[3], &[1], DType::Bool);
        let vy = View::new(2, &[3], &[1], DType::F64);
        let vb = View::new(3, &[3], &[1], DType::Bool);
        let run = |ins: &[Option<View>], out: &View, ints: &[i64], floats: &[f64]| unsafe {
            wide("ew64", ins, std::slice::from_ref(out), ints, floats).unwrap().run(&mem);
        };
        run(&[Some(vx.clone())], &vy, &[4, 1, 0], &[10.0]); // 10 ** x
        assert_eq!(y, [10f64.powf(1.5), 10f64.powf(-2.25), 1000.0]);
        run(&[Some(vx.clone())], &vy, &[6, 0], &[]);
        assert_eq!(y, [2.0, -2.0, 3.0]);
        run(&[Some(vx.clone())], &vy, &[15, 0], &[]);
        assert_eq!(y, [2.0, -2.0, 3.0]);
        run(&[Some(vx.clone())], &vb, &[8, 0, 1], &[0.0]);
        assert_eq!(b, [0, 1, 0]);
        run(&[Some(vc.clone()), Some(vx.clone())], &vy, &[14, 0, 1, 0], &[-1.0]);
        assert_eq!(y, [-1.0, -2.25, -1.0]);
        assert!(wide("ew64", &[Some(vx.clone())], std::slice::from_ref(&vy), &[8, 0, 1], &[0.0]).is_err());
        assert!(wide("ew64", &[Some(vx.clone())], std::slice::from_ref(&vy), &[0, 0], &[]).is_err());
        assert!(wide("ew64", &[Some(vx)], &[vy], &[0, 0, 1], &[]).is_err());
    }

    #[test]
    fn integer_reductions_are_exact() {
        let big = 1i64 << 40;
        let mut x = [big + 1, 3, -7, big, 5, 2];
        let mut y = [0i64; 2];
        let mem = Mem { ptrs: vec![x.as_mut_ptr() as *mut u8, y.as_mut_ptr() as *mut u8] };
        let vx = View::new(0, &[2, 3], &[3, 1], DType::I64);
        let vy = View::new(1, &[2, 1], &[1, 0], DType::I64);
        for (kind, want) in [(0, [big - 3, big + 7]), (1, [big + 1, big]), (2, [-7, 2])] {
            let k = wide("ireduce", &[Some(vx.clone())], std::slice::from_ref(&vy), &[kind], &[]).unwrap();
            unsafe { k.run(&mem) };
            assert_eq!(y, want);
        }
        assert!(wide("ireduce", &[Some(vx.clone())], &[View::new(1, &[3, 1], &[1, 0], DType::I64)], &[0], &[]).is_err());
        assert!(wide("ireduce", &[Some(vx)], std::slice::from_ref(&vy), &[7], &[]).is_err());
    }
}
