//! Fused elementwise kernels: a small register program (loads, arithmetic, stores) run as one
//! sweep over memory. A chain or DAG of elementwise ops becomes one program, so intermediate
//! values live in a block-sized register file and never in a buffer.
//!
//! Operands are strided views with the output's shape (broadcast inputs carry stride 0);
//! dimensions that are contiguous for every operand are merged first, so the innermost loop is
//! as long as possible and contiguous operands take the memcpy-like path.

use crate::core::math::unary::Un;
use crate::core::mem::{Mem, SPtr};
use crate::core::math::scalar;
use crate::core::tensor::{DType, Result, View};
use serde::Deserialize;

const BLK: usize = 256;
const PAR_MIN: usize = 1 << 15;
/// A program runs in parallel from this many element-instructions (numel × program length):
/// a load-op-store program from PAR_MIN elements as before, a long fused chain (sigmoid, tanh,
/// ... on every element) from fewer — its sweep then costs far more than a fork/join.
const PAR_WORK: usize = 3 * PAR_MIN;

#[derive(Deserialize, Debug, Clone)]
pub struct InstrSpec {
    pub op: String,
    #[serde(default)]
    pub dst: usize,
    #[serde(default)]
    pub a: Vec<usize>,
    #[serde(default)]
    pub f: Vec<f64>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Bin {
    Add(f32), Sub(f32), Mul, Div, Max, Min, Pow, Eq, Ne, Lt, Le, Gt, Ge, And, Or, Xor, ThresholdBwd(f32),
    Atan2, Fmod, Remainder, FloorDiv, Copysign, Nextafter, Hypot, Fmax, Fmin, Zeta,
    /// regularized incomplete gamma P(a, x) and Q(a, x) (igamma.rs)
    Igamma, Igammac,
    Poly(scalar::Poly, bool),
}

#[derive(Clone, Debug)]
pub enum Instr {
    Load { dst: usize, src: usize },
    Const { dst: usize, v: f64 },
    Un { op: Un, dst: usize, a: usize },
    Bin { op: Bin, dst: usize, a: usize, b: usize },
    Where { dst: usize, c: usize, a: usize, b: usize },
    Store { dst: usize, src: usize },
    /// Rounds a float32 register to `to` (bfloat16 / float16, nearest even) and back: a
    /// low-precision intermediate kept in a register, rounded as storing it would round it.
    Narrow { dst: usize, a: usize, to: DType },
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Compute {
    F32,
    I64,
}

#[derive(Debug)]
pub struct EwStep {
    pub compute: Compute,
    pub prog: Vec<Instr>,
    /// registers holding one constant for the whole program (`simplify`): filled once per
    /// run, not per block
    pub consts: Vec<(usize, f64)>,
    /// per instruction: a `load` whose register may point at the input itself where a block is
    /// one contiguous run of its elements in the compute dtype (the register is written by that
    /// load alone and no output shares the input's buffer), so the block is not copied
    in_place: Vec<bool>,
    pub nregs: usize,
    pub ins: Vec<View>,
    pub outs: Vec<View>,
    /// coalesced iteration shape and per-operand strides (ins then outs)
    shape: Vec<usize>,
    strides: Vec<Vec<usize>>,
}

fn f32p(f: &[f64], i: usize, default: f32) -> f32 {
    f.get(i).map(|&v| v as f32).unwrap_or(default)
}

fn parse_instr(s: &InstrSpec, compute: Compute) -> Result<Instr> {
    let arg = |i: usize| s.a.get(i).copied().ok_or_else(|| format!("instruction {} misses operand {i}", s.op));
    let un = |op: Un| -> Result<Instr> { Ok(Instr::Un { op, dst: s.dst, a: arg(0)? }) };
    let bin = |op: Bin| -> Result<Instr> { Ok(Instr::Bin { op, dst: s.dst, a: arg(0)?, b: arg(1)? }) };
    let f = &s.f;
    let int_ok = matches!(
        s.op.as_str(),
        "load" | "store" | "const" | "where" | "neg" | "abs" | "copy" | "add" | "sub" | "mul" | "maximum" | "minimum"
            | "eq" | "ne" | "lt" | "le" | "gt" | "ge" | "and" | "or" | "xor" | "logical_not" | "sign" | "square"
            | "floor_divide" | "remainder" | "clamp" | "relu"
    );
    if compute == Compute::I64 && !int_ok {
        return Err(format!("elementwise op {} has no integer form", s.op));
    }
    match s.op.as_str() {
        "load" => Ok(Instr::Load { dst: s.dst, src: arg(0)? }),
        "store" => Ok(Instr::Store { dst: s.dst, src: arg(0)? }),
        "const" => Ok(Instr::Const { dst: s.dst, v: *f.first().ok_or("const without value")? }),
        "where" => Ok(Instr::Where { dst: s.dst, c: arg(0)?, a: arg(1)?, b: arg(2)? }),
        "round_bf16" => Ok(Instr::Narrow { dst: s.dst, a: arg(0)?, to: DType::BF16 }),
        "round_f16" => Ok(Instr::Narrow { dst: s.dst, a: arg(0)?, to: DType::F16 }),
        "neg" => un(Un::Neg),
        "abs" => un(Un::Abs),
        "exp" => un(Un::Exp),
        "exp2" => un(Un::Exp2),
        "log" => un(Un::Log),
        "log2" => un(Un::Log2),
        "log1p" => un(Un::Log1p),
        "expm1" => un(Un::Expm1),
        "sqrt" => un(Un::Sqrt),
        "rsqrt" => un(Un::Rsqrt),
        "sin" => un(Un::Sin),
        "cos" => un(Un::Cos),
        "tan" => un(Un::Tan),
        "atan" => un(Un::Atan),
        "asin" => un(Un::Asin),
        "acos" => un(Un::Acos),
        "sinh" => un(Un::Sinh),
        "cosh" => un(Un::Cosh),
        "tanh" => un(Un::Tanh),
        "sigmoid" => un(Un::Sigmoid),
        "relu" => un(Un::Relu),
        "gelu" => un(Un::GeluErf),
        "gelu_tanh" => un(Un::GeluTanh),
        "silu" => un(Un::Silu),
        "erf" => un(Un::Erf),
        "floor" => un(Un::Floor),
        "ceil" => un(Un::Ceil),
        "round" => un(Un::Round),
        "trunc" => un(Un::Trunc),
        "frac" => un(Un::Frac),
        "sign" => un(Un::Sign),
        "reciprocal" => un(Un::Recip),
        "square" => un(Un::Square),
        "copy" => un(Un::Copy),
        "isnan" => un(Un::IsNan),
        "logical_not" => un(Un::LogicalNot),
        "clamp" => un(Un::Clamp(f32p(f, 0, f32::NEG_INFINITY), f32p(f, 1, f32::INFINITY))),
        "leaky_relu" => un(Un::Leaky(f32p(f, 0, 0.01))),
        "elu" => un(Un::Elu(f32p(f, 0, 1.0), f32p(f, 1, 1.0), f32p(f, 2, 1.0))),
        "softplus" => un(Un::Softplus(f32p(f, 0, 1.0), f32p(f, 1, 20.0))),
        "pow_scalar" => un(Un::PowS(f32p(f, 0, 1.0))),
        "add" => bin(Bin::Add(f32p(f, 0, 1.0))),
        "sub" => bin(Bin::Sub(f32p(f, 0, 1.0))),
        "mul" => bin(Bin::Mul),
        "div" => bin(Bin::Div),
        "maximum" => bin(Bin::Max),
        "minimum" => bin(Bin::Min),
        "pow" => bin(Bin::Pow),
        "atan2" => bin(Bin::Atan2),
        "fmod" => bin(Bin::Fmod),
        "remainder" => bin(Bin::Remainder),
        "floor_divide" => bin(Bin::FloorDiv),
        "eq" => bin(Bin::Eq),
        "ne" => bin(Bin::Ne),
        "lt" => bin(Bin::Lt),
        "le" => bin(Bin::Le),
        "gt" => bin(Bin::Gt),
        "ge" => bin(Bin::Ge),
        "and" => bin(Bin::And),
        "or" => bin(Bin::Or),
        "xor" => bin(Bin::Xor),
        "threshold_backward" => bin(Bin::ThresholdBwd(f32p(f, 0, 0.0))),
        "lgamma" => un(Un::Lgamma),
        "digamma" => un(Un::Digamma),
        "erfc" => un(Un::Erfc),
        "erfinv" => un(Un::Erfinv),
        "log10" => un(Un::Log10),
        "asinh" => un(Un::Asinh),
        "acosh" => un(Un::Acosh),
        "atanh" => un(Un::Atanh),
        "isinf" => un(Un::IsInf),
        "signbit" => un(Un::Signbit),
        "copysign" => bin(Bin::Copysign),
        "nextafter" => bin(Bin::Nextafter),
        "hypot" => bin(Bin::Hypot),
        "fmax" => bin(Bin::Fmax),
        "fmin" => bin(Bin::Fmin),
        "zeta" => bin(Bin::Zeta),
        "igamma" => bin(Bin::Igamma),
        "igammac" => bin(Bin::Igammac),
        "erfcx" => un(Un::Erfcx),
        "spherical_j0" => un(Un::SphJ0),
        "i0" => un(Un::I0),
        "i0e" => un(Un::I0e),
        "i1" => un(Un::I1),
        "i1e" => un(Un::I1e),
        "ndtri" => un(Un::Ndtri),
        "bessel_j0" => un(Un::BesselJ0),
        "bessel_j1" => un(Un::BesselJ1),
        "bessel_y0" => un(Un::BesselY0),
        "bessel_y1" => un(Un::BesselY1),
        poly if poly.starts_with("poly_") => {
            let (name, shifted) = match poly.strip_prefix("poly_shifted_") {
                Some(rest) => (rest, true),
                None => (&poly[5..], false),
            };
            let kind = match name {
                "chebyshev_t" => scalar::Poly::ChebT,
                "chebyshev_u" => scalar::Poly::ChebU,
                "chebyshev_v" => scalar::Poly::ChebV,
                "chebyshev_w" => scalar::Poly::ChebW,
                "hermite_h" => scalar::Poly::HermiteH,
                "hermite_he" => scalar::Poly::HermiteHe,
                "laguerre_l" => scalar::Poly::LaguerreL,
                "legendre_p" => scalar::Poly::LegendreP,
                other => return Err(format!("unknown polynomial {other:?}")),
            };
            bin(Bin::Poly(kind, shifted))
        }
        other => Err(format!("unknown elementwise op {other:?}")),
    }
}

impl EwStep {
    pub fn new(compute: Compute, specs: &[InstrSpec], ins: Vec<View>, outs: Vec<View>) -> Result<EwStep> {
        let prog: Vec<Instr> = specs.iter().map(|s| parse_instr(s, compute)).collect::<Result<_>>()?;
        let shape = outs.first().ok_or("elementwise step without output")?.sizes.clone();
        for v in ins.iter().chain(&outs) {
            if v.sizes != shape {
                return Err(format!("elementwise operand of shape {:?} where {:?} was expected", v.sizes, shape));
            }
            // bfloat16 / float16 operands are storage: a float32 program loads them widened and
            // stores its float32 result rounded (to nearest even), one pass, no cast steps around it
            let low = matches!(v.dtype, DType::BF16 | DType::F16);
            if !(v.dtype.is_core() || (low && compute == Compute::F32)) {
                return Err(format!(
                    "elementwise operand of dtype {}: float32, int64 and bool (bfloat16 and float16 in float32 programs) only",
                    v.dtype.name()
                ));
            }
            if compute == Compute::I64 && v.dtype == DType::F32 && ins.contains(v) {
                return Err("integer elementwise program cannot read float32".into());
            }
        }
        let mut nregs = 0usize;
        let mut written = vec![false; 0];
        let defined = |r: usize, written: &mut Vec<bool>| {
            if r >= written.len() {
                written.resize(r + 1, false);
            }
            written[r] = true;
        };
        for ins_ in &prog {
            let (dst, reads): (Option<usize>, Vec<usize>) = match *ins_ {
                Instr::Load { dst, src } => {
                    if src >= ins.len() {
                        return Err(format!("load of input {src} of {}", ins.len()));
                    }
                    (Some(dst), vec![])
                }
                Instr::Const { dst, .. } => (Some(dst), vec![]),
                Instr::Un { dst, a, .. } | Instr::Narrow { dst, a, .. } => (Some(dst), vec![a]),
                Instr::Bin { dst, a, b, .. } => (Some(dst), vec![a, b]),
                Instr::Where { dst, c, a, b } => (Some(dst), vec![c, a, b]),
                Instr::Store { dst, src } => {
                    if dst >= outs.len() {
                        return Err(format!("store to output {dst} of {}", outs.len()));
                    }
                    (None, vec![src])
                }
            };
            for &r in &reads {
                if !written.get(r).copied().unwrap_or(false) {
                    return Err(format!("register {r} read before it is written"));
                }
                if Some(r) == dst {
                    return Err(format!("instruction writes register {r} that it reads"));
                }
            }
            if let Some(d) = dst {
                if d > 4096 {
                    return Err("too many registers".into());
                }
                defined(d, &mut written);
                nregs = nregs.max(d + 1);
            }
        }
        let (shape, strides) = coalesce(&shape, ins.iter().chain(&outs).map(|v| v.strides.clone()).collect());
        let (prog, consts) = simplify(prog, nregs);
        let writes = write_counts(&prog, nregs);
        let native = |d: DType| match compute {
            Compute::F32 => d == DType::F32,
            Compute::I64 => d == DType::I64,
        };
        let last = shape.len().saturating_sub(1);
        let in_place = prog
            .iter()
            .map(|i| match *i {
                Instr::Load { dst, src } => {
                    writes[dst] == 1
                        && native(ins[src].dtype)
                        && strides[src].get(last) == Some(&1)
                        && outs.iter().all(|o| o.buf != ins[src].buf)
                }
                _ => false,
            })
            .collect();
        Ok(EwStep { compute, prog, consts, in_place, nregs, ins, outs, shape, strides })
    }

    /// `load; op; store` over contiguous float32: the op reads the input and writes the
    /// output directly, with no register block in between.
    fn unary_contiguous(&self) -> Option<Un> {
        if self.compute != Compute::F32 || self.shape.len() != 1 || self.strides.iter().any(|s| s[0] != 1) {
            return None;
        }
        if self.ins.len() != 1 || self.outs.len() != 1 || self.ins[0].dtype != DType::F32 || self.outs[0].dtype != DType::F32 {
            return None;
        }
        match self.prog.as_slice() {
            [Instr::Load { dst: r0, src: 0 }, Instr::Un { op, dst: r1, a }, Instr::Store { dst: 0, src }] if a == r0 && src == r1 => Some(*op),
            _ => None,
        }
    }

    pub fn run(&self, mem: &Mem) {
        let numel: usize = self.shape.iter().product();
        if numel == 0 {
            return;
        }
        if let Some(op) = self.unary_contiguous() {
            let (x, y) = unsafe { (mem.ptr::<f32>(&self.ins[0]), mem.ptr::<f32>(&self.outs[0])) };
            // chunks of 16 Ki elements (64 KiB in + out: L2-sized), threads only when there
            // are several chunks
            const CH: usize = 1 << 14;
            let chunk = |c: usize| {
                let (lo, hi) = (c * CH, ((c + 1) * CH).min(numel));
                // SAFETY: the views were validated for `numel` contiguous elements
                let (xs, ys) = unsafe { (std::slice::from_raw_parts(x.add(lo), hi - lo), std::slice::from_raw_parts_mut(y.add(lo), hi - lo)) };
                un_dispatch(op, ys, xs);
            };
            let chunks = numel.div_ceil(CH);
            if numel >= PAR_MIN && chunks > 1 && crate::core::par::threads() > 1 {
                crate::core::par::for_each(chunks, chunk);
            } else {
                (0..chunks).for_each(chunk);
            }
            return;
        }
        let inner = *self.shape.last().unwrap_or(&1);
        let outer = numel / inner.max(1);
        // rows shorter than half a block share one: `rpi` rows per item (the program is
        // interpreted once per item, so a 32-wide row no longer pays a whole block's dispatch)
        let rpi = if inner > 0 && inner <= BLK / 2 { BLK / inner } else { 1 };
        let chunks_per_row = if rpi > 1 { 1 } else { inner.div_ceil(BLK) };
        let items = if rpi > 1 { outer.div_ceil(rpi) } else { outer * chunks_per_row };
        let tiling = Tiling { cpr: chunks_per_row, rpi, outer, inner };
        let bases: Vec<SPtr<u8>> = self
            .ins
            .iter()
            .chain(&self.outs)
            .map(|v| SPtr(unsafe { mem.byte_ptr(v) }))
            .collect();
        let work = |range: std::ops::Range<usize>| match self.compute {
            Compute::F32 => dispatch_f32(self, &bases, range, tiling),
            Compute::I64 => i64::with_regs(self.nregs.max(1), |regs| run_items::<i64>(self, &bases, range, tiling, regs)),
        };
        if numel.saturating_mul(self.prog.len()) >= PAR_WORK && items > 1 && crate::core::par::threads() > 1 {
            let tasks = (crate::core::par::threads() * 4).min(items);
            let per = items.div_ceil(tasks);
            crate::core::par::for_each(tasks, |t| work(t * per..((t + 1) * per).min(items)));
        } else {
            work(0..items);
        }
    }
}

/// Merges adjacent dimensions that are contiguous for every operand and drops size-1 dims.
pub fn coalesce(shape: &[usize], strides: Vec<Vec<usize>>) -> (Vec<usize>, Vec<Vec<usize>>) {
    let keep: Vec<usize> = (0..shape.len()).filter(|&d| shape[d] != 1).collect();
    let mut out_shape: Vec<usize> = Vec::new();
    let mut out_strides: Vec<Vec<usize>> = vec![Vec::new(); strides.len()];
    for &d in &keep {
        let merge = !out_shape.is_empty()
            && strides.iter().enumerate().all(|(k, st)| out_strides[k].last() == Some(&(st[d] * shape[d])));
        if merge {
            let last = out_shape.len() - 1;
            out_shape[last] *= shape[d];
            for (k, st) in strides.iter().enumerate() {
                let l = out_strides[k].len() - 1;
                out_strides[k][l] = st[d];
            }
        } else {
            out_shape.push(shape[d]);
            for (k, st) in strides.iter().enumerate() {
                out_strides[k].push(st[d]);
            }
        }
    }
    if out_shape.is_empty() {
        out_shape.push(1);
        for s in out_strides.iter_mut() {
            s.push(0);
        }
    }
    (out_shape, out_strides)
}

/// How a sweep is cut into items: `cpr` blocks per row of `inner` elements, or (`rpi` > 1)
/// `rpi` whole rows per item; `outer` rows in all.
#[derive(Clone, Copy)]
struct Tiling {
    cpr: usize,
    rpi: usize,
    outer: usize,
    inner: usize,
}

fn dispatch_f32(step: &EwStep, bases: &[SPtr<u8>], range: std::ops::Range<usize>, t: Tiling) {
    // the register blocks come from a per-thread pool, fetched here, outside the
    // target-feature functions, so the hot loop below is never split off into a closure
    f32::with_regs(step.nregs.max(1), |regs| {
        #[cfg(target_arch = "x86_64")]
        {
            if crate::core::isa::has_avx512() {
                return unsafe { run_f32_avx512(step, bases, range, t, regs) };
            }
            if crate::core::isa::has_avx2() {
                return unsafe { run_f32_avx2(step, bases, range, t, regs) };
            }
        }
        run_items::<f32>(step, bases, range, t, regs)
    })
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
unsafe fn run_f32_avx512(step: &EwStep, bases: &[SPtr<u8>], range: std::ops::Range<usize>, t: Tiling, regs: &mut [[f32; BLK]]) {
    run_items::<f32>(step, bases, range, t, regs)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn run_f32_avx2(step: &EwStep, bases: &[SPtr<u8>], range: std::ops::Range<usize>, t: Tiling, regs: &mut [[f32; BLK]]) {
    run_items::<f32>(step, bases, range, t, regs)
}

/// `f32::un` in the best instantiation for this CPU.
fn un_dispatch(op: Un, y: &mut [f32], x: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::core::isa::has_avx512() {
            return unsafe { un_avx512_inst(op, y, x) };
        }
        if crate::core::isa::has_avx2() {
            return unsafe { un_avx2_inst(op, y, x) };
        }
    }
    f32::un(op, y, x)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
unsafe fn un_avx512_inst(op: Un, y: &mut [f32], x: &[f32]) {
    f32::un(op, y, x)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn un_avx2_inst(op: Un, y: &mut [f32], x: &[f32]) {
    f32::un(op, y, x)
}

pub trait Scalar: Copy + Default + Send + Sync + 'static {
    /// # Safety
    /// `p` must point to a buffer of `dt` elements with index `i` in bounds.
    unsafe fn load(p: *const u8, dt: DType, i: usize) -> Self;
    /// # Safety
    /// As `load`, for writing.
    unsafe fn store(self, p: *mut u8, dt: DType, i: usize);
    fn from_f64(v: f64) -> Self;
    /// The value rounded to the float dtype `dt` and read back (a float32 program's registers
    /// holding a bfloat16 / float16 intermediate); unchanged where `dt` holds it exactly.
    fn narrow(self, dt: DType) -> Self;
    fn truthy(self) -> bool;
    fn from_bool(b: bool) -> Self;
    fn un(op: Un, x: &mut [Self], a: &[Self]);
    fn bin(op: Bin, x: &mut [Self], a: &[Self], b: &[Self]);
    /// Runs `f` on `n` register blocks from a per-thread pool (allocated once per thread, not
    /// per call; a fresh one only if the pool is already in use on this thread).
    fn with_regs(n: usize, f: impl FnOnce(&mut [[Self; BLK]]));
}

thread_local! {
    static REGS_F32: std::cell::RefCell<Vec<[f32; BLK]>> = const { std::cell::RefCell::new(Vec::new()) };
    static REGS_I64: std::cell::RefCell<Vec<[i64; BLK]>> = const { std::cell::RefCell::new(Vec::new()) };
}

#[inline(always)]
fn with_pool<T: Copy + Default>(pool: &'static std::thread::LocalKey<std::cell::RefCell<Vec<[T; BLK]>>>, n: usize, f: impl FnOnce(&mut [[T; BLK]])) {
    pool.with(|c| match c.try_borrow_mut() {
        Ok(mut v) => {
            if v.len() < n {
                v.resize(n, [T::default(); BLK]);
            }
            f(&mut v[..n])
        }
        Err(_) => f(&mut vec![[T::default(); BLK]; n]),
    })
}

/// The register each instruction writes (None: a store).
fn written_by(i: &Instr) -> Option<usize> {
    match *i {
        Instr::Load { dst, .. } | Instr::Const { dst, .. } | Instr::Un { dst, .. } | Instr::Bin { dst, .. } | Instr::Where { dst, .. } | Instr::Narrow { dst, .. } => Some(dst),
        Instr::Store { .. } => None,
    }
}

/// How many instructions of `prog` write each register.
fn write_counts(prog: &[Instr], nregs: usize) -> Vec<usize> {
    let mut writes = vec![0usize; nregs];
    for d in prog.iter().filter_map(written_by) {
        writes[d] += 1;
    }
    writes
}

/// A validated program with the work that is the same in every block taken out of it (the
/// interpreter runs each instruction over a block of 256 elements in memory, so each one
/// costs a pass over L1): a constant written to a register nothing else writes is filled once
/// per run (returned apart), and a copy between two registers written once each is dropped,
/// its readers reading the source instead (the low-precision pass leaves one after each
/// rounding). The same values in every register that is read.
fn simplify(prog: Vec<Instr>, nregs: usize) -> (Vec<Instr>, Vec<(usize, f64)>) {
    let writes = write_counts(&prog, nregs);
    let once = |r: usize| writes[r] == 1;
    // the register each read is redirected to (copies of copies resolved in program order)
    let mut alias: Vec<usize> = (0..nregs).collect();
    let mut consts = Vec::new();
    let mut out = Vec::with_capacity(prog.len());
    for i in prog {
        let r = |x: usize| alias[x];
        let i = match i {
            Instr::Const { dst, v } if once(dst) => {
                consts.push((dst, v));
                continue;
            }
            Instr::Un { op: Un::Copy, dst, a } if once(dst) && once(alias[a]) => {
                alias[dst] = alias[a];
                continue;
            }
            Instr::Un { op, dst, a } => Instr::Un { op, dst, a: r(a) },
            Instr::Bin { op, dst, a, b } => Instr::Bin { op, dst, a: r(a), b: r(b) },
            Instr::Where { dst, c, a, b } => Instr::Where { dst, c: r(c), a: r(a), b: r(b) },
            Instr::Narrow { dst, a, to } => Instr::Narrow { dst, a: r(a), to },
            Instr::Store { dst, src } => Instr::Store { dst, src: r(src) },
            other => other,
        };
        out.push(i);
    }
    (out, consts)
}

/// float32 -> bfloat16 bits, round to nearest even, NaN -> the quiet NaN (as c10::BFloat16 and
/// `core::element::f32_to_bf16`), written without a branch so the store loops vectorise.
#[inline(always)]
fn round_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    let rounded = (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16;
    if b & 0x7fff_ffff > 0x7f80_0000 {
        0x7fc0
    } else {
        rounded
    }
}

impl Scalar for f32 {
    #[inline(always)]
    unsafe fn load(p: *const u8, dt: DType, i: usize) -> f32 {
        {
            match dt {
                DType::F32 => *(p as *const f32).add(i),
                DType::I64 => *(p as *const i64).add(i) as f32,
                DType::Bool => (*p.add(i) != 0) as u8 as f32,
                DType::BF16 => f32::from_bits((*(p as *const u16).add(i) as u32) << 16),
                DType::F16 => crate::core::element::f16_to_f32(*(p as *const u16).add(i)),
                _ => unreachable!("EwStep::new admits float32, int64, bool, bfloat16 and float16 only"),
            }
        }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut u8, dt: DType, i: usize) {
        {
            match dt {
                DType::F32 => *(p as *mut f32).add(i) = self,
                DType::I64 => *(p as *mut i64).add(i) = self as i64,
                DType::Bool => *p.add(i) = (self != 0.0) as u8,
                DType::BF16 => *(p as *mut u16).add(i) = round_bf16(self),
                DType::F16 => *(p as *mut u16).add(i) = crate::core::element::f32_to_f16(self),
                _ => unreachable!("EwStep::new admits float32, int64, bool, bfloat16 and float16 only"),
            }
        }
    }
    fn from_f64(v: f64) -> f32 {
        v as f32
    }
    #[inline(always)]
    fn narrow(self, dt: DType) -> f32 {
        match dt {
            DType::BF16 => f32::from_bits((round_bf16(self) as u32) << 16),
            DType::F16 => crate::core::element::f16_to_f32(crate::core::element::f32_to_f16(self)),
            _ => self,
        }
    }
    #[inline(always)]
    fn truthy(self) -> bool {
        self != 0.0
    }
    #[inline(always)]
    fn from_bool(b: bool) -> f32 {
        b as u8 as f32
    }
    fn with_regs(n: usize, f: impl FnOnce(&mut [[f32; BLK]])) {
        with_pool(&REGS_F32, n, f)
    }
    #[inline(always)]
    fn un(op: Un, x: &mut [f32], a: &[f32]) {
        #[cfg(target_arch = "x86_64")]
        {
            if matches!(op, Un::Exp | Un::Sigmoid | Un::Silu | Un::GeluErf | Un::GeluTanh | Un::Tanh) && crate::core::isa::has_avx512() {
                // SAFETY: the CPU has AVX-512F (checked just above)
                if unsafe { crate::core::math::vector::un_avx512(op, x, a) } {
                    return;
                }
            } else if matches!(op, Un::Exp | Un::Sigmoid | Un::Silu | Un::GeluErf | Un::GeluTanh | Un::Tanh) && crate::core::isa::has_avx2() {
                // SAFETY: the CPU has AVX2 and FMA (checked just above)
                if unsafe { crate::core::math::vector::un_avx2(op, x, a) } {
                    return;
                }
            }
            if matches!(op, Un::Sin | Un::Cos) && crate::core::isa::has_avx2() {
                // SAFETY: the CPU has AVX2 and FMA (checked just above)
                unsafe { crate::core::math::vector_trig::sincos_avx2(x, a, op == Un::Cos) };
                return;
            }
        }
        macro_rules! map {
            ($v:ident => $e:expr) => {
                for (o, &$v) in x.iter_mut().zip(a) {
                    *o = $e;
                }
            };
        }
        match op {
            Un::Neg => map!(v => -v),
            Un::Abs => map!(v => v.abs()),
            Un::Copy => map!(v => v),
            Un::Exp => map!(v => scalar::exp(v)),
            Un::Exp2 => map!(v => v.exp2()),
            Un::Log => map!(v => v.ln()),
            Un::Log2 => map!(v => v.log2()),
            Un::Log1p => map!(v => v.ln_1p()),
            Un::Expm1 => map!(v => v.exp_m1()),
            Un::Sqrt => map!(v => v.sqrt()),
            Un::Rsqrt => map!(v => 1.0 / v.sqrt()),
            Un::Sin => map!(v => v.sin()),
            Un::Cos => map!(v => v.cos()),
            Un::Tan => map!(v => v.tan()),
            Un::Atan => map!(v => v.atan()),
            Un::Asin => map!(v => v.asin()),
            Un::Acos => map!(v => v.acos()),
            Un::Sinh => map!(v => v.sinh()),
            Un::Cosh => map!(v => v.cosh()),
            Un::Tanh => map!(v => scalar::tanh(v)),
            Un::Sigmoid => map!(v => scalar::sigmoid(v)),
            Un::Relu => map!(v => if v < 0.0 { 0.0 } else { v }),
            Un::GeluErf => map!(v => scalar::gelu_erf(v)),
            Un::GeluTanh => map!(v => scalar::gelu_tanh(v)),
            Un::Silu => map!(v => v * scalar::sigmoid(v)),
            Un::Erf => map!(v => scalar::erf(v)),
            Un::Floor => map!(v => v.floor()),
            Un::Ceil => map!(v => v.ceil()),
            Un::Round => map!(v => v.round_ties_even()),
            Un::Trunc => map!(v => v.trunc()),
            Un::Frac => map!(v => v - v.trunc()),
            Un::Sign => map!(v => if v > 0.0 { 1.0 } else if v < 0.0 { -1.0 } else { 0.0 }),
            Un::Recip => map!(v => 1.0 / v),
            Un::Square => map!(v => v * v),
            Un::IsNan => map!(v => v.is_nan() as u8 as f32),
            Un::IsInf => map!(v => v.is_infinite() as u8 as f32),
            Un::Signbit => map!(v => v.is_sign_negative() as u8 as f32),
            Un::Lgamma => map!(v => scalar::lgamma(v as f64) as f32),
            Un::Digamma => map!(v => scalar::digamma(v as f64) as f32),
            Un::Erfc => map!(v => scalar::erfc(v as f64) as f32),
            Un::Erfinv => map!(v => scalar::erfinv(v as f64) as f32),
            Un::Log10 => map!(v => v.log10()),
            Un::Asinh => map!(v => (v as f64).asinh() as f32),
            Un::Acosh => map!(v => (v as f64).acosh() as f32),
            Un::Atanh => map!(v => (v as f64).atanh() as f32),
            Un::Erfcx => map!(v => scalar::erfcx(v as f64) as f32),
            Un::SphJ0 => map!(v => scalar::spherical_j0(v as f64) as f32),
            Un::I0 => map!(v => scalar::bessel_i(0, v as f64, false) as f32),
            Un::I0e => map!(v => scalar::bessel_i(0, v as f64, true) as f32),
            Un::I1 => map!(v => scalar::bessel_i(1, v as f64, false) as f32),
            Un::I1e => map!(v => scalar::bessel_i(1, v as f64, true) as f32),
            Un::BesselJ0 => map!(v => libm::j0(v as f64) as f32),
            Un::BesselJ1 => map!(v => libm::j1(v as f64) as f32),
            Un::BesselY0 => map!(v => libm::y0(v as f64) as f32),
            Un::BesselY1 => map!(v => libm::y1(v as f64) as f32),
            Un::Ndtri => map!(v => (std::f64::consts::SQRT_2 * scalar::erfinv(2.0 * v as f64 - 1.0)) as f32),
            Un::LogicalNot => map!(v => (v == 0.0) as u8 as f32),
            Un::Clamp(lo, hi) => map!(v => if v < lo { lo } else if v > hi { hi } else { v }),
            Un::Leaky(s) => map!(v => if v > 0.0 { v } else { v * s }),
            Un::Elu(alpha, scale, input_scale) => {
                map!(v => if v > 0.0 { v * scale } else { alpha * scale * (scalar::exp(v * input_scale) - 1.0) })
            }
            Un::Softplus(beta, threshold) => {
                map!(v => if v * beta > threshold { v } else { (1.0 + scalar::exp(v * beta)).ln() / beta })
            }
            Un::PowS(e) => {
                if e == 2.0 {
                    map!(v => v * v)
                } else if e == 1.0 {
                    map!(v => v)
                } else if e == 0.5 {
                    map!(v => v.sqrt())
                } else if e == 3.0 {
                    map!(v => v * v * v)
                } else if e == -1.0 {
                    map!(v => 1.0 / v)
                } else if e == -0.5 {
                    map!(v => 1.0 / v.sqrt())
                } else {
                    map!(v => v.powf(e))
                }
            }
        }
    }
    #[inline(always)]
    fn bin(op: Bin, x: &mut [f32], a: &[f32], b: &[f32]) {
        macro_rules! zip {
            ($p:ident, $q:ident => $e:expr) => {
                for ((o, &$p), &$q) in x.iter_mut().zip(a).zip(b) {
                    *o = $e;
                }
            };
        }
        match op {
            Bin::Add(alpha) => {
                if alpha == 1.0 {
                    zip!(p, q => p + q)
                } else {
                    zip!(p, q => p + alpha * q)
                }
            }
            Bin::Sub(alpha) => {
                if alpha == 1.0 {
                    zip!(p, q => p - q)
                } else {
                    zip!(p, q => p - alpha * q)
                }
            }
            Bin::Mul => zip!(p, q => p * q),
            Bin::Div => zip!(p, q => p / q),
            Bin::Max => zip!(p, q => if p.is_nan() || q.is_nan() { f32::NAN } else if p > q { p } else { q }),
            Bin::Min => zip!(p, q => if p.is_nan() || q.is_nan() { f32::NAN } else if p < q { p } else { q }),
            Bin::Pow => zip!(p, q => if q == 2.0 { p * p } else { p.powf(q) }),
            Bin::Atan2 => zip!(p, q => p.atan2(q)),
            Bin::Fmod => zip!(p, q => p % q),
            Bin::Remainder => zip!(p, q => { let r = p % q; if r != 0.0 && ((r < 0.0) != (q < 0.0)) { r + q } else { r } }),
            Bin::FloorDiv => zip!(p, q => (p / q).floor()),
            Bin::Eq => zip!(p, q => (p == q) as u8 as f32),
            Bin::Ne => zip!(p, q => (p != q) as u8 as f32),
            Bin::Lt => zip!(p, q => (p < q) as u8 as f32),
            Bin::Le => zip!(p, q => (p <= q) as u8 as f32),
            Bin::Gt => zip!(p, q => (p > q) as u8 as f32),
            Bin::Ge => zip!(p, q => (p >= q) as u8 as f32),
            Bin::And => zip!(p, q => (p != 0.0 && q != 0.0) as u8 as f32),
            Bin::Or => zip!(p, q => (p != 0.0 || q != 0.0) as u8 as f32),
            Bin::Xor => zip!(p, q => ((p != 0.0) != (q != 0.0)) as u8 as f32),
            Bin::ThresholdBwd(t) => zip!(g, s => if s <= t { 0.0 } else { g }),
            Bin::Copysign => zip!(p, q => p.copysign(q)),
            Bin::Nextafter => zip!(p, q => scalar::nextafter(p, q)),
            Bin::Hypot => zip!(p, q => p.hypot(q)),
            // fmax/fmin: NaN only when both are NaN
            Bin::Fmax => zip!(p, q => p.max(q)),
            Bin::Fmin => zip!(p, q => p.min(q)),
            Bin::Zeta => zip!(p, q => scalar::zeta(p as f64, q as f64) as f32),
            Bin::Igamma => zip!(p, q => crate::core::math::igamma::igamma(p as f64, q as f64) as f32),
            Bin::Igammac => zip!(p, q => crate::core::math::igamma::igammac(p as f64, q as f64) as f32),
            // shifted polynomials: the same recurrence at 2x - 1
            Bin::Poly(kind, shifted) => zip!(p, q => scalar::poly(kind, if shifted { p + p - 1.0 } else { p }, q)),
        }
    }
}

impl Scalar for i64 {
    #[inline(always)]
    unsafe fn load(p: *const u8, dt: DType, i: usize) -> i64 {
        {
            match dt {
                DType::F32 => *(p as *const f32).add(i) as i64,
                DType::I64 => *(p as *const i64).add(i),
                DType::Bool => (*p.add(i) != 0) as i64,
                _ => unreachable!("EwStep::new admits float32, int64 and bool only"),
            }
        }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut u8, dt: DType, i: usize) {
        {
            match dt {
                DType::F32 => *(p as *mut f32).add(i) = self as f32,
                DType::I64 => *(p as *mut i64).add(i) = self,
                DType::Bool => *p.add(i) = (self != 0) as u8,
                _ => unreachable!("EwStep::new admits float32, int64 and bool only"),
            }
        }
    }
    fn from_f64(v: f64) -> i64 {
        v as i64
    }
    fn narrow(self, _dt: DType) -> i64 {
        self // integer programs never narrow (parse_instr refuses round_* there)
    }
    fn truthy(self) -> bool {
        self != 0
    }
    fn from_bool(b: bool) -> i64 {
        b as i64
    }
    fn with_regs(n: usize, f: impl FnOnce(&mut [[i64; BLK]])) {
        with_pool(&REGS_I64, n, f)
    }
    fn un(op: Un, x: &mut [i64], a: &[i64]) {
        for (o, &v) in x.iter_mut().zip(a) {
            *o = match op {
                Un::Neg => v.wrapping_neg(),
                Un::Abs => v.wrapping_abs(),
                Un::Sign => v.signum(),
                Un::Square => v.wrapping_mul(v),
                Un::LogicalNot => (v == 0) as i64,
                Un::Relu => v.max(0),
                Un::Clamp(lo, hi) => {
                    let mut r = v;
                    if lo.is_finite() {
                        r = r.max(lo as i64)
                    }
                    if hi.is_finite() {
                        r = r.min(hi as i64)
                    }
                    r
                }
                _ => v,
            };
        }
    }
    fn bin(op: Bin, x: &mut [i64], a: &[i64], b: &[i64]) {
        for ((o, &p), &q) in x.iter_mut().zip(a).zip(b) {
            *o = match op {
                Bin::Add(alpha) => p.wrapping_add((alpha as i64).wrapping_mul(q)),
                Bin::Sub(alpha) => p.wrapping_sub((alpha as i64).wrapping_mul(q)),
                Bin::Mul => p.wrapping_mul(q),
                Bin::Max => p.max(q),
                Bin::Min => p.min(q),
                Bin::Eq => (p == q) as i64,
                Bin::Ne => (p != q) as i64,
                Bin::Lt => (p < q) as i64,
                Bin::Le => (p <= q) as i64,
                Bin::Gt => (p > q) as i64,
                Bin::Ge => (p >= q) as i64,
                Bin::And => p & q,
                Bin::Or => p | q,
                Bin::Xor => p ^ q,
                // division by zero is a Python-visible error in torch; here it yields 0 rather than a crash
                Bin::FloorDiv => {
                    if q == 0 {
                        0
                    } else {
                        p.wrapping_div(q) - (((p % q) != 0) && ((p < 0) != (q < 0))) as i64
                    }
                }
                Bin::Remainder => {
                    if q == 0 {
                        0
                    } else {
                        let r = p.wrapping_rem(q);
                        if r != 0 && ((r < 0) != (q < 0)) {
                            r + q
                        } else {
                            r
                        }
                    }
                }
                _ => p,
            };
        }
    }
}

/// Runs `$body` with `$d` bound to the constant dtype of each arm, so that `match`es on the
/// dtype inside inlined loads and stores fold away.
macro_rules! with_dtype {
    ($dt:expr, $d:ident => $body:expr) => {
        match $dt {
            DType::F32 => {
                let $d = DType::F32;
                $body
            }
            DType::I64 => {
                let $d = DType::I64;
                $body
            }
            DType::Bool => {
                let $d = DType::Bool;
                $body
            }
            DType::BF16 => {
                let $d = DType::BF16;
                $body
            }
            DType::F16 => {
                let $d = DType::F16;
                $body
            }
            _ => unreachable!("EwStep::new admits float32, int64, bool, bfloat16 and float16 only"),
        }
    };
}

#[inline(always)]
fn run_items<T: Scalar>(step: &EwStep, bases: &[SPtr<u8>], range: std::ops::Range<usize>, t: Tiling, regs: &mut [[T; BLK]]) {
    let nd = step.shape.len();
    let nin = step.ins.len();
    let nops = bases.len();
    // offs[j * nops + k]: operand k's element offset at the start of the item's j-th row
    let mut offs = vec![0usize; nops * t.rpi];
    if range.is_empty() {
        return;
    }
    // the multi-index of the current row over the outer dims and each operand's offset there:
    // found by division once per range, then stepped like an odometer (no division per row)
    let outer_dims = nd.saturating_sub(1);
    let first_row = if t.rpi > 1 { range.start * t.rpi } else { range.start / t.cpr };
    let mut idx = vec![0usize; outer_dims];
    let mut r = first_row;
    for d in (0..outer_dims).rev() {
        idx[d] = r % step.shape[d];
        r /= step.shape[d];
    }
    let mut row_offs: Vec<usize> = step.strides.iter().map(|st| (0..outer_dims).map(|d| idx[d] * st[d]).sum()).collect();
    let advance = |idx: &mut [usize], row_offs: &mut [usize]| {
        for d in (0..outer_dims).rev() {
            idx[d] += 1;
            if idx[d] < step.shape[d] {
                for (o, st) in row_offs.iter_mut().zip(&step.strides) {
                    *o += st[d];
                }
                return;
            }
            idx[d] = 0;
            for (o, st) in row_offs.iter_mut().zip(&step.strides) {
                *o -= (step.shape[d] - 1) * st[d];
            }
        }
    };
    for &(r, v) in &step.consts {
        regs[r].fill(T::from_f64(v));
    }
    // where each register's block is read from: its own block, or (a load in place) the input
    let own: Vec<*const T> = regs.iter().map(|r| r.as_ptr()).collect();
    let mut at: Vec<*const T> = own.clone();
    let single_row = t.rpi == 1;
    for item in range {
        let (nrows, start) = if t.rpi > 1 { (t.rpi.min(t.outer - item * t.rpi), 0) } else { (1, (item % t.cpr) * BLK) };
        // elements per row in this item, and in all
        let w = if t.rpi > 1 { t.inner } else { BLK.min(t.inner - start) };
        let n = w * nrows;
        for j in 0..nrows {
            for (k, st) in step.strides.iter().enumerate() {
                offs[j * nops + k] = row_offs[k] + start * st[nd - 1];
            }
            if t.rpi > 1 || item % t.cpr == t.cpr - 1 {
                advance(&mut idx, &mut row_offs);
            }
        }
        for (k, ins) in step.prog.iter().enumerate() {
            match *ins {
                Instr::Load { dst, src } if single_row && step.in_place[k] => {
                    // SAFETY: the block's w elements of input src are contiguous from offset o
                    // and of the compute dtype (`in_place`)
                    at[dst] = unsafe { (bases[src].0 as *const T).add(offs[src]) };
                }
                Instr::Load { dst, src } => {
                    at[dst] = own[dst];
                    let v = &step.ins[src];
                    let st = step.strides[src][nd - 1];
                    let base = bases[src].0 as *const u8;
                    let reg = &mut regs[dst];
                    // the dtype is matched once per block so each loop below is a plain
                    // (vectorisable) copy or conversion
                    with_dtype!(v.dtype, dt => {
                        for j in 0..nrows {
                            let o = offs[j * nops + src];
                            let part = &mut reg[j * w..(j + 1) * w];
                            if st == 1 {
                                for (i, r) in part.iter_mut().enumerate() {
                                    *r = unsafe { T::load(base, dt, o + i) };
                                }
                            } else if st == 0 {
                                let x = unsafe { T::load(base, dt, o) };
                                part.fill(x);
                            } else {
                                for (i, r) in part.iter_mut().enumerate() {
                                    *r = unsafe { T::load(base, dt, o + i * st) };
                                }
                            }
                        }
                    })
                }
                Instr::Const { dst, v } => regs[dst][..n].fill(T::from_f64(v)),
                // registers are read through raw pointers so that no 1 KiB block is copied per
                // instruction; `EwStep::new` checked that no instruction writes a register it reads
                Instr::Un { op, dst, a } => {
                    let base = regs.as_mut_ptr();
                    let src = unsafe { std::slice::from_raw_parts(at[a], n) };
                    T::un(op, unsafe { &mut (&mut (*base.add(dst)))[..n] }, src);
                }
                Instr::Bin { op, dst, a, b } => {
                    let base = regs.as_mut_ptr();
                    let (ra, rb) = unsafe { (std::slice::from_raw_parts(at[a], n), std::slice::from_raw_parts(at[b], n)) };
                    T::bin(op, unsafe { &mut (&mut (*base.add(dst)))[..n] }, ra, rb);
                }
                Instr::Narrow { dst, a, to } => {
                    let base = regs.as_mut_ptr();
                    let (src, out) = unsafe { (std::slice::from_raw_parts(at[a], n), &mut (&mut (*base.add(dst)))[..n]) };
                    with_dtype!(to, dt => {
                        for (o, &x) in out.iter_mut().zip(src) {
                            *o = x.narrow(dt);
                        }
                    })
                }
                Instr::Where { dst, c, a, b } => {
                    let base = regs.as_mut_ptr();
                    let (rc, ra, rb) = unsafe { (std::slice::from_raw_parts(at[c], n), std::slice::from_raw_parts(at[a], n), std::slice::from_raw_parts(at[b], n)) };
                    let out = unsafe { &mut (&mut (*base.add(dst)))[..n] };
                    for i in 0..n {
                        out[i] = if rc[i].truthy() { ra[i] } else { rb[i] };
                    }
                }
                Instr::Store { dst, src } => {
                    let k = nin + dst;
                    let v = &step.outs[dst];
                    let st = step.strides[k][nd - 1];
                    let base = bases[k].0;
                    let reg = unsafe { std::slice::from_raw_parts(at[src], n) };
                    with_dtype!(v.dtype, dt => {
                        for j in 0..nrows {
                            let o = offs[j * nops + k];
                            let part = &reg[j * w..(j + 1) * w];
                            if st == 1 {
                                for (i, &x) in part.iter().enumerate() {
                                    unsafe { x.store(base, dt, o + i) };
                                }
                            } else {
                                for (i, &x) in part.iter().enumerate() {
                                    unsafe { x.store(base, dt, o + i * st) };
                                }
                            }
                        }
                    })
                }
            }
        }
    }
}

// -- steps: ew -------------------------------------------------------------------------------------

pub const STEPS: &[crate::kernels::registry::StepDef] = &[crate::kernels::registry::StepDef::any("ew", ew_step)];

crate::step_params!(
    /// An elementwise step's parameters: the compute type ("f32", "i64"; "" is f32) and the program.
    struct EwParams { compute: String, prog: Vec<InstrSpec> }
);

fn ew_step(a: &crate::kernels::registry::Args) -> crate::kernels::registry::Built {
    let p: EwParams = a.params()?;
    let compute = match p.compute.as_str() {
        "f32" | "" => Compute::F32,
        "i64" => Compute::I64,
        c => return Err(format!("unknown compute type {c:?}")),
    };
    let ins: Vec<View> = a.ins.iter().cloned().collect::<Option<_>>().ok_or("elementwise input missing")?;
    let step = EwStep::new(compute, &p.prog, ins, a.outs.clone())?;
    crate::kernels::registry::kernel(move |mem| {
        step.run(mem);
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coalesce_merges_contiguous_dims() {
        let (s, st) = coalesce(&[2, 3, 4], vec![vec![12, 4, 1], vec![0, 4, 1]]);
        assert_eq!(s, vec![2, 12]);
        assert_eq!(st, vec![vec![12, 1], vec![0, 1]]);
        let (s, _) = coalesce(&[1, 1], vec![vec![1, 1]]);
        assert_eq!(s, vec![1]);
    }

    #[test]
    fn low_precision_operands_load_widened_and_store_rounded() {
        use crate::core::element::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
        // values around bfloat16 / float16 ties, specials and a strided second input
        let xs: Vec<f32> = vec![1.0, 1.00390625, 1.01171875, -2.5, 0.0, -0.0, f32::INFINITY, f32::NAN, 3.0e38, 1.0e-40];
        let n = xs.len();
        let a16: Vec<u16> = xs.iter().map(|&x| f32_to_bf16(x)).collect();
        let h16: Vec<u16> = xs.iter().map(|&x| f32_to_f16(x)).collect();
        let b32: Vec<f32> = (0..2 * n).map(|i| 0.001953125 * i as f32).collect();
        let mut y_bf = vec![0u16; n];
        let mut y_h = vec![0u16; n];
        let view = |buf, dtype, stride| View { buf, offset: 0, sizes: vec![n], strides: vec![stride], dtype };
        let prog = vec![
            InstrSpec { op: "load".into(), dst: 0, a: vec![0], f: vec![] },
            InstrSpec { op: "load".into(), dst: 1, a: vec![1], f: vec![] },
            InstrSpec { op: "load".into(), dst: 2, a: vec![2], f: vec![] },
            InstrSpec { op: "add".into(), dst: 3, a: vec![0, 1], f: vec![] },
            InstrSpec { op: "mul".into(), dst: 4, a: vec![2, 1], f: vec![] },
            InstrSpec { op: "store".into(), dst: 0, a: vec![3], f: vec![] },
            InstrSpec { op: "store".into(), dst: 1, a: vec![4], f: vec![] },
        ];
        let ins = vec![view(0, DType::BF16, 1), view(1, DType::F32, 2), view(2, DType::F16, 1)];
        let outs = vec![view(3, DType::BF16, 1), view(4, DType::F16, 1)];
        let step = EwStep::new(Compute::F32, &prog, ins, outs).unwrap();
        let mem = Mem {
            ptrs: vec![
                a16.as_ptr() as *mut u8,
                b32.as_ptr() as *mut u8,
                h16.as_ptr() as *mut u8,
                y_bf.as_mut_ptr() as *mut u8,
                y_h.as_mut_ptr() as *mut u8,
            ],
        };
        step.run(&mem);
        for i in 0..n {
            let want_bf = f32_to_bf16(bf16_to_f32(a16[i]) + b32[2 * i]);
            let want_h = f32_to_f16(f16_to_f32(h16[i]) * b32[2 * i]);
            assert_eq!(y_bf[i], want_bf, "bfloat16 element {i}");
            assert_eq!(y_h[i], want_h, "float16 element {i}");
        }
        // an integer program never reads a low-precision operand
        let prog = vec![
            InstrSpec { op: "load".into(), dst: 0, a: vec![0], f: vec![] },
            InstrSpec { op: "store".into(), dst: 0, a: vec![0], f: vec![] },
        ];
        assert!(EwStep::new(Compute::I64, &prog, vec![view(0, DType::BF16, 1)], vec![view(1, DType::I64, 1)]).is_err());
    }

    #[test]
    fn narrow_rounds_a_register_as_a_store_would() {
        use crate::core::element::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
        let xs: Vec<f32> = vec![1.00390625, 1.01171875, -2.5e-3, 65520.0, f32::NAN, -f32::INFINITY, 1.0e-40, 3.3e38];
        let n = xs.len();
        let (mut yb, mut yh) = (vec![0f32; n], vec![0f32; n]);
        let view = |buf| View { buf, offset: 0, sizes: vec![n], strides: vec![1], dtype: DType::F32 };
        let spec = |op: &str, dst: usize, a: Vec<usize>| InstrSpec { op: op.into(), dst, a, f: vec![] };
        let prog = vec![
            spec("load", 0, vec![0]),
            spec("round_bf16", 1, vec![0]),
            spec("round_f16", 2, vec![0]),
            spec("store", 0, vec![1]),
            spec("store", 1, vec![2]),
        ];
        let step = EwStep::new(Compute::F32, &prog, vec![view(0)], vec![view(1), view(2)]).unwrap();
        let mem = Mem { ptrs: vec![xs.as_ptr() as *mut u8, yb.as_mut_ptr() as *mut u8, yh.as_mut_ptr() as *mut u8] };
        step.run(&mem);
        for i in 0..n {
            assert_eq!(yb[i].to_bits(), bf16_to_f32(f32_to_bf16(xs[i])).to_bits(), "bfloat16 element {i}");
            assert_eq!(yh[i].to_bits(), f16_to_f32(f32_to_f16(xs[i])).to_bits(), "float16 element {i}");
        }
        assert!(EwStep::new(Compute::I64, &prog, vec![view(0)], vec![view(1), view(2)]).is_err());
    }

    #[test]
    fn constants_and_copies_leave_the_block_loop_with_the_same_results() {
        // 3 rows of 700 (several 256-element blocks per row, a partial last one), rows of 40
        // (several rows per block): x -> round(x * 1.5) copied, + 0.25 copied, a register
        // redefined (written twice: neither hoisted nor aliased), a copy of a copy, a where
        for (rows, cols) in [(3usize, 700usize), (50, 40)] {
            let n = rows * cols;
            let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() * 9.0).collect();
            let mut y = vec![0f32; n];
            let mut z = vec![0f32; n];
            let v = |buf| View { buf, offset: 0, sizes: vec![rows, cols], strides: vec![cols, 1], dtype: DType::F32 };
            let i = |op: &str, dst: usize, a: &[usize], f: &[f64]| InstrSpec { op: op.into(), dst, a: a.to_vec(), f: f.to_vec() };
            let prog = vec![
                i("load", 0, &[0], &[]),
                i("const", 1, &[], &[1.5]),
                i("mul", 2, &[0, 1], &[]),
                i("round_bf16", 3, &[2], &[]),
                i("copy", 4, &[3], &[]),
                i("copy", 5, &[4], &[]),
                i("const", 6, &[], &[0.25]),
                i("add", 7, &[5, 6], &[1.0]),
                i("const", 8, &[], &[2.0]),
                i("mul", 9, &[7, 8], &[]),
                i("const", 8, &[], &[-1.0]), // register 8 written twice
                i("copy", 10, &[8], &[]),
                i("gt", 11, &[0, 6], &[]),
                i("where", 12, &[11, 9, 10], &[]),
                i("store", 0, &[12], &[]),
                i("store", 1, &[4], &[]),
            ];
            let step = EwStep::new(Compute::F32, &prog, vec![v(0)], vec![v(1), v(2)]).unwrap();
            // consts 1 and 6 hoisted (8 is written twice), copies 4 and 5 dropped (10 copies 8)
            assert_eq!(step.consts, vec![(1, 1.5), (6, 0.25)]);
            assert_eq!(step.prog.iter().filter(|x| matches!(x, Instr::Un { op: Un::Copy, .. })).count(), 1);
            assert_eq!(step.prog.len(), prog.len() - 4);
            let mem = Mem { ptrs: vec![x.as_ptr() as *mut u8, y.as_mut_ptr() as *mut u8, z.as_mut_ptr() as *mut u8] };
            step.run(&mem);
            for k in 0..n {
                let r = crate::core::element::bf16_to_f32(crate::core::element::f32_to_bf16(x[k] * 1.5));
                let want = if x[k] > 0.25 { (r + 0.25) * 2.0 } else { -1.0 };
                assert_eq!(y[k], want, "{rows}x{cols} element {k}");
                assert_eq!(z[k], r, "{rows}x{cols} element {k}");
            }
        }
    }

    /// Loads read the input in place where a block is one contiguous float32 run (and nothing
    /// else writes the register, and no output shares the buffer); elsewhere they copy. Either
    /// way the same results: contiguous, strided rows (rows per block), a transposed input,
    /// and an output written over its own input.
    #[test]
    fn loads_in_place_only_where_safe() {
        let i = |op: &str, dst: usize, a: &[usize], f: &[f64]| InstrSpec { op: op.into(), dst, a: a.to_vec(), f: f.to_vec() };
        let prog = vec![
            i("load", 0, &[0], &[]),
            i("load", 1, &[1], &[]),
            i("mul", 2, &[0, 1], &[]),
            i("add", 3, &[2, 0], &[0.5]),
            i("store", 0, &[3], &[]),
        ];
        let (r, c) = (9usize, 300usize);
        let x: Vec<f32> = (0..r * c).map(|k| (k as f32 * 0.11).cos()).collect();
        let w: Vec<f32> = (0..r * c).map(|k| (k as f32 * 0.07).sin() + 2.0).collect();
        let want = |xv: f32, wv: f32| xv * wv + 0.5 * xv;
        let dense = |buf| View { buf, offset: 0, sizes: vec![r, c], strides: vec![c, 1], dtype: DType::F32 };
        // (x view, w view, output buffer 2 or x's own 0, expect in place for x, for w)
        let cases = [
            (dense(0), dense(1), 2usize, true, true),
            (View { sizes: vec![r, c / 2], ..dense(0) }, View { sizes: vec![r, c / 2], strides: vec![c, 2], ..dense(1) }, 2, true, false),
            (View { sizes: vec![c, r], strides: vec![1, c], ..dense(0) }, View { sizes: vec![c, r], strides: vec![1, c], ..dense(1) }, 2, false, false),
            (dense(0), dense(1), 0, false, true),
        ];
        for (case, (xv, wv, out_buf, x_in_place, w_in_place)) in cases.into_iter().enumerate() {
            let mut xs = x.clone();
            let mut y = vec![f32::NAN; r * c];
            let out = View { buf: out_buf, offset: 0, sizes: xv.sizes.clone(), strides: if out_buf == 0 { xv.strides.clone() } else { crate::core::tensor::contiguous_strides(&xv.sizes) }, dtype: DType::F32 };
            let step = EwStep::new(Compute::F32, &prog, vec![xv.clone(), wv.clone()], vec![out.clone()]).unwrap();
            assert_eq!(step.in_place, vec![x_in_place, w_in_place, false, false, false], "case {case}");
            let mem = Mem { ptrs: vec![xs.as_mut_ptr() as *mut u8, w.as_ptr() as *mut u8, y.as_mut_ptr() as *mut u8] };
            step.run(&mem);
            let res = if out_buf == 0 { &xs } else { &y };
            crate::core::strided::for_each(&xv.sizes, [&xv.strides, &wv.strides, &out.strides], |[ox, ow, oo]| {
                assert_eq!(res[oo], want(x[ox], w[ow]), "case {case}");
            });
        }
    }

    #[test]
    fn fused_program_runs() {
        let x: Vec<f32> = (0..10).map(|i| i as f32 - 5.0).collect();
        let mut y = vec![0f32; 10];
        let v = |buf| View { buf, offset: 0, sizes: vec![10], strides: vec![1], dtype: DType::F32 };
        let prog = vec![
            InstrSpec { op: "load".into(), dst: 0, a: vec![0], f: vec![] },
            InstrSpec { op: "relu".into(), dst: 1, a: vec![0], f: vec![] },
            InstrSpec { op: "const".into(), dst: 2, a: vec![], f: vec![2.0] },
            InstrSpec { op: "mul".into(), dst: 3, a: vec![1, 2], f: vec![] },
            InstrSpec { op: "store".into(), dst: 0, a: vec![3], f: vec![] },
        ];
        let step = EwStep::new(Compute::F32, &prog, vec![v(0)], vec![v(1)]).unwrap();
        let mem = Mem { ptrs: vec![x.as_ptr() as *mut u8, y.as_mut_ptr() as *mut u8] };
        step.run(&mem);
        assert_eq!(y, vec![0., 0., 0., 0., 0., 0., 2., 4., 6., 8.]);
    }

    #[test]
    fn reading_an_unwritten_register_is_an_error() {
        let v = View { buf: 0, offset: 0, sizes: vec![1], strides: vec![1], dtype: DType::F32 };
        let prog = vec![InstrSpec { op: "store".into(), dst: 0, a: vec![5], f: vec![] }];
        assert!(EwStep::new(Compute::F32, &prog, vec![], vec![v]).is_err());
    }
}
