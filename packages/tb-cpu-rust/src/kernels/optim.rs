//! Fused optimizer steps (Adam / AdamW, SGD with momentum) over many parameter tensors at once.
//!
//! One call updates every parameter of a group: each element of param, grad and the state
//! buffers is read once and written once, in one sweep, where `torch.optim`'s default CPU path
//! runs eight to ten whole-tensor ops per parameter (each a pass over memory, `sqrt` and `div`
//! among them). The arithmetic follows `torch.optim`'s single-tensor implementation operation
//! by operation in float32 (the same operands, the same order, no fused multiply-add), so the
//! results agree with it to rounding of the scalar constants.
//!
//! Work is split into chunks of at most `CHUNK` elements across all tensors, run on the kernel
//! thread team (`par::for_each`).

use crate::core::mem::SPtr;
use crate::core::par;

/// Elements per parallel task (four float32 buffers of 64 KiB each).
const CHUNK: usize = 16 * 1024;

/// Hyper-parameters of one Adam / AdamW group, as `torch.optim.Adam` takes them.
#[derive(Clone, Copy, Debug)]
pub struct AdamHyper {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    /// AdamW: decay the parameter (`p *= 1 - lr * wd`) instead of adding `wd * p` to the grad.
    pub decoupled: bool,
    pub maximize: bool,
    pub amsgrad: bool,
}

/// One parameter's buffers (all the same length).
pub struct AdamSlot {
    pub param: *mut f32,
    pub grad: *const f32,
    pub exp_avg: *mut f32,
    pub exp_avg_sq: *mut f32,
    /// `max_exp_avg_sq` with amsgrad, else null.
    pub max_exp_avg_sq: *mut f32,
    pub len: usize,
    /// The step count after this step's increment (torch's `state["step"]`).
    pub step: f64,
}

/// The float32 constants of one parameter's update, computed as torch computes them (Python
/// floats, i.e. f64, rounded to float32 where they meet a float32 tensor).
#[derive(Clone, Copy)]
struct AdamConsts {
    sign: f32,
    wd: f32,
    decay: f32,
    w1: f32,
    b2: f32,
    one_minus_b2: f32,
    bc2_sqrt: f32,
    eps: f32,
    neg_step_size: f32,
}

impl AdamConsts {
    fn new(h: &AdamHyper, step: f64) -> Self {
        let bc1 = 1.0 - h.beta1.powf(step);
        let bc2 = 1.0 - h.beta2.powf(step);
        AdamConsts {
            sign: if h.maximize { -1.0 } else { 1.0 },
            wd: h.weight_decay as f32,
            decay: (1.0 - h.lr * h.weight_decay) as f32,
            w1: (1.0 - h.beta1) as f32,
            b2: h.beta2 as f32,
            one_minus_b2: (1.0 - h.beta2) as f32,
            bc2_sqrt: bc2.sqrt() as f32,
            eps: h.eps as f32,
            neg_step_size: (-(h.lr / bc1)) as f32,
        }
    }
}

/// torch's `lerp` for a scalar weight: `a + w * (b - a)` when |w| < 0.5, else
/// `b - (b - a) * (1 - w)` (the form it picks for accuracy).
#[inline(always)]
fn lerp<const LOW: bool>(a: f32, b: f32, w: f32) -> f32 {
    if LOW {
        a + w * (b - a)
    } else {
        b - (b - a) * (1.0 - w)
    }
}

/// The update of `n` elements from offset 0 of the given pointers.
///
/// # Safety
/// Every pointer is valid for `n` elements (max_exp_avg_sq only with AMS) and nothing else
/// touches them during the call.
#[inline(always)]
unsafe fn adam_run<const WD: bool, const DECOUPLED: bool, const AMS: bool, const LOW: bool>(c: AdamConsts, t: Chunk<5>) {
    let ([p, g, m, v, vmax], n) = (t.ptrs, t.n);
    let p = std::slice::from_raw_parts_mut(p, n);
    let g = std::slice::from_raw_parts(g, n);
    let m = std::slice::from_raw_parts_mut(m, n);
    let v = std::slice::from_raw_parts_mut(v, n);
    for i in 0..n {
        let mut pi = p[i];
        let mut gi = g[i] * c.sign;
        if DECOUPLED {
            pi *= c.decay;
        } else if WD {
            gi += c.wd * pi;
        }
        let mi = lerp::<LOW>(m[i], gi, c.w1);
        let vi = v[i] * c.b2 + c.one_minus_b2 * gi * gi;
        m[i] = mi;
        v[i] = vi;
        let second = if AMS {
            let slot = &mut *vmax.add(i);
            let mx = if vi > *slot || vi.is_nan() { vi } else { *slot };
            *slot = mx;
            mx
        } else {
            vi
        };
        let denom = second.sqrt() / c.bc2_sqrt + c.eps;
        p[i] = pi + c.neg_step_size * mi / denom;
    }
}

/// `adam_run` compiled for AVX2 (the loop vectorises 8 wide; no FMA, as the baseline).
///
/// # Safety
/// As `adam_run`; the CPU supports AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn adam_run_avx2<const WD: bool, const DECOUPLED: bool, const AMS: bool, const LOW: bool>(c: AdamConsts, t: Chunk<5>) {
    adam_run::<WD, DECOUPLED, AMS, LOW>(c, t)
}

type AdamFn = unsafe fn(AdamConsts, Chunk<5>);

fn adam_fn<const WD: bool, const DECOUPLED: bool, const AMS: bool, const LOW: bool>() -> AdamFn {
    #[cfg(target_arch = "x86_64")]
    if crate::core::isa::has_avx2() {
        return adam_run_avx2::<WD, DECOUPLED, AMS, LOW>;
    }
    adam_run::<WD, DECOUPLED, AMS, LOW>
}

fn pick_adam(h: &AdamHyper) -> AdamFn {
    let wd = h.weight_decay != 0.0;
    let low = ((1.0 - h.beta1) as f32).abs() < 0.5;
    // decoupled decay with wd == 0 multiplies by exactly 1.0, so DECOUPLED needs no WD flag
    match (wd && !h.decoupled, wd && h.decoupled, h.amsgrad, low) {
        (false, false, false, true) => adam_fn::<false, false, false, true>(),
        (false, false, false, false) => adam_fn::<false, false, false, false>(),
        (false, false, true, true) => adam_fn::<false, false, true, true>(),
        (false, false, true, false) => adam_fn::<false, false, true, false>(),
        (true, _, false, true) => adam_fn::<true, false, false, true>(),
        (true, _, false, false) => adam_fn::<true, false, false, false>(),
        (true, _, true, true) => adam_fn::<true, false, true, true>(),
        (true, _, true, false) => adam_fn::<true, false, true, false>(),
        (false, true, false, true) => adam_fn::<false, true, false, true>(),
        (false, true, false, false) => adam_fn::<false, true, false, false>(),
        (false, true, true, true) => adam_fn::<false, true, true, true>(),
        (false, true, true, false) => adam_fn::<false, true, true, false>(),
    }
}

/// The buffers of one chunk of a slot (each pointer at the chunk's first element; a null one,
/// an absent optional buffer, stays null) and its length.
#[derive(Clone, Copy)]
struct Chunk<const B: usize> {
    ptrs: [*mut f32; B],
    n: usize,
}

/// Cuts every slot (its buffers `ptrs[s]`, `lens[s]` elements) into chunks of at most `CHUNK`
/// elements and runs `f(slot, chunk)` on each, over the thread team when there are several.
///
/// # Safety
/// Every non-null pointer is valid for its slot's length; `f` may write the chunk it is given.
unsafe fn for_each_chunk<const B: usize>(ptrs: &[[SPtr<f32>; B]], lens: &[usize], f: impl Fn(usize, Chunk<B>) + Sync) {
    let mut tasks = Vec::new();
    for (s, &len) in lens.iter().enumerate() {
        let mut at = 0;
        while at < len {
            let n = CHUNK.min(len - at);
            tasks.push((s, at, n));
            at += n;
        }
    }
    let run = |t: usize| {
        let (s, at, n) = tasks[t];
        // SAFETY: chunks are disjoint ranges inside each slot's buffers (caller's contract).
        let ptrs = ptrs[s].map(|p| if p.get().is_null() { p.get() } else { unsafe { p.add(at) } });
        f(s, Chunk { ptrs, n });
    };
    if tasks.len() == 1 {
        run(0);
    } else {
        par::for_each(tasks.len(), run);
    }
}

/// One Adam / AdamW step of every slot.
///
/// # Safety
/// Every slot's pointers are valid for `len` elements, no two buffers of any slots overlap
/// (the grad may only be read), and nothing else touches them during the call.
pub unsafe fn adam_step(h: &AdamHyper, slots: &[AdamSlot]) {
    let f = pick_adam(h);
    let consts: Vec<AdamConsts> = slots.iter().map(|s| AdamConsts::new(h, s.step)).collect();
    let ptrs: Vec<[SPtr<f32>; 5]> = slots
        .iter()
        .map(|s| [SPtr(s.param), SPtr(s.grad as *mut f32), SPtr(s.exp_avg), SPtr(s.exp_avg_sq), SPtr(s.max_exp_avg_sq)])
        .collect();
    let lens: Vec<usize> = slots.iter().map(|s| s.len).collect();
    // SAFETY: the caller's contract; the grad is only read.
    for_each_chunk(&ptrs, &lens, |s, t| unsafe { f(consts[s], t) });
}

/// Hyper-parameters of one SGD group, as `torch.optim.SGD` takes them.
#[derive(Clone, Copy, Debug)]
pub struct SgdHyper {
    pub lr: f64,
    pub momentum: f64,
    pub dampening: f64,
    pub weight_decay: f64,
    pub nesterov: bool,
    pub maximize: bool,
}

/// One parameter of an SGD step.
pub struct SgdSlot {
    pub param: *mut f32,
    pub grad: *const f32,
    /// The momentum buffer (null when momentum is 0).
    pub buf: *mut f32,
    /// The buffer is new this step: it takes the (decayed) gradient as it is.
    pub first: bool,
    pub len: usize,
}

#[derive(Clone, Copy)]
struct SgdConsts {
    sign: f32,
    wd: f32,
    mom: f32,
    one_minus_damp: f32,
    neg_lr: f32,
}

/// # Safety
/// As `adam_run`, for the SGD buffers (buf only with MOM).
#[inline(always)]
unsafe fn sgd_run<const WD: bool, const MOM: bool, const NESTEROV: bool>(c: SgdConsts, first: bool, t: Chunk<3>) {
    let ([p, g, buf], n) = (t.ptrs, t.n);
    let p = std::slice::from_raw_parts_mut(p, n);
    let g = std::slice::from_raw_parts(g, n);
    for i in 0..n {
        let pi = p[i];
        let mut gi = g[i] * c.sign;
        if WD {
            gi += c.wd * pi;
        }
        if MOM {
            let b = &mut *buf.add(i);
            let nb = if first { gi } else { *b * c.mom + c.one_minus_damp * gi };
            *b = nb;
            gi = if NESTEROV { gi + c.mom * nb } else { nb };
        }
        p[i] = pi + c.neg_lr * gi;
    }
}

/// # Safety
/// As `sgd_run`; the CPU supports AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sgd_run_avx2<const WD: bool, const MOM: bool, const NESTEROV: bool>(c: SgdConsts, first: bool, t: Chunk<3>) {
    sgd_run::<WD, MOM, NESTEROV>(c, first, t)
}

type SgdFn = unsafe fn(SgdConsts, bool, Chunk<3>);

fn sgd_fn<const WD: bool, const MOM: bool, const NESTEROV: bool>() -> SgdFn {
    #[cfg(target_arch = "x86_64")]
    if crate::core::isa::has_avx2() {
        return sgd_run_avx2::<WD, MOM, NESTEROV>;
    }
    sgd_run::<WD, MOM, NESTEROV>
}

/// One SGD step of every slot.
///
/// # Safety
/// As `adam_step`, for the SGD buffers.
pub unsafe fn sgd_step(h: &SgdHyper, slots: &[SgdSlot]) {
    let c = SgdConsts {
        sign: if h.maximize { -1.0 } else { 1.0 },
        wd: h.weight_decay as f32,
        mom: h.momentum as f32,
        one_minus_damp: (1.0 - h.dampening) as f32,
        neg_lr: (-h.lr) as f32,
    };
    let f = match (h.weight_decay != 0.0, h.momentum != 0.0, h.nesterov) {
        (false, false, _) => sgd_fn::<false, false, false>(),
        (true, false, _) => sgd_fn::<true, false, false>(),
        (false, true, false) => sgd_fn::<false, true, false>(),
        (false, true, true) => sgd_fn::<false, true, true>(),
        (true, true, false) => sgd_fn::<true, true, false>(),
        (true, true, true) => sgd_fn::<true, true, true>(),
    };
    let firsts: Vec<bool> = slots.iter().map(|s| s.first).collect();
    let ptrs: Vec<[SPtr<f32>; 3]> =
        slots.iter().map(|s| [SPtr(s.param), SPtr(s.grad as *mut f32), SPtr(s.buf)]).collect();
    let lens: Vec<usize> = slots.iter().map(|s| s.len).collect();
    // SAFETY: as in `adam_step`.
    for_each_chunk(&ptrs, &lens, |s, t| unsafe { f(c, firsts[s], t) });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// torch.optim.Adam's single-tensor update, written out op by op in f32.
    fn adam_ref(h: &AdamHyper, step: f64, p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], vmax: &mut [f32]) {
        for i in 0..p.len() {
            let mut gi = if h.maximize { -g[i] } else { g[i] };
            if h.weight_decay != 0.0 {
                if h.decoupled {
                    p[i] *= (1.0 - h.lr * h.weight_decay) as f32;
                } else {
                    gi += h.weight_decay as f32 * p[i];
                }
            }
            let w = (1.0 - h.beta1) as f32;
            m[i] = if w.abs() < 0.5 { m[i] + w * (gi - m[i]) } else { gi - (gi - m[i]) * (1.0 - w) };
            v[i] = v[i] * h.beta2 as f32 + (1.0 - h.beta2) as f32 * gi * gi;
            let s = if h.amsgrad {
                vmax[i] = vmax[i].max(v[i]);
                vmax[i]
            } else {
                v[i]
            };
            let denom = s.sqrt() / (1.0 - h.beta2.powf(step)).sqrt() as f32 + h.eps as f32;
            p[i] += (-(h.lr / (1.0 - h.beta1.powf(step)))) as f32 * m[i] / denom;
        }
    }

    fn data(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2654435761).wrapping_add(1);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s as f32 / u32::MAX as f32) * 2.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn adam_matches_the_op_by_op_reference_for_every_variant() {
        // lengths straddle the chunk size so tasks split parameters
        for &(decoupled, wd, ams, maximize, beta1) in &[
            (false, 0.0, false, false, 0.9),
            (false, 0.01, true, true, 0.9),
            (true, 0.1, false, false, 0.3),
            (true, 0.0, true, false, 0.9),
            (false, 0.05, false, true, 0.2),
        ] {
            let h = AdamHyper { lr: 1e-2, beta1, beta2: 0.999, eps: 1e-8, weight_decay: wd, decoupled, maximize, amsgrad: ams };
            let lens = [0usize, 7, CHUNK + 3, 2 * CHUNK];
            let mut p: Vec<Vec<f32>> = lens.iter().enumerate().map(|(i, &n)| data(n, i as u32)).collect();
            let g: Vec<Vec<f32>> = lens.iter().enumerate().map(|(i, &n)| data(n, 10 + i as u32)).collect();
            let mut m: Vec<Vec<f32>> = lens.iter().map(|&n| vec![0.0; n]).collect();
            let mut v = m.clone();
            let mut mx = m.clone();
            let (mut rp, mut rm, mut rv, mut rmx) = (p.clone(), m.clone(), v.clone(), mx.clone());
            for step in 1..=3 {
                let slots: Vec<AdamSlot> = (0..lens.len())
                    .map(|i| AdamSlot {
                        param: p[i].as_mut_ptr(),
                        grad: g[i].as_ptr(),
                        exp_avg: m[i].as_mut_ptr(),
                        exp_avg_sq: v[i].as_mut_ptr(),
                        max_exp_avg_sq: if ams { mx[i].as_mut_ptr() } else { std::ptr::null_mut() },
                        len: lens[i],
                        step: step as f64,
                    })
                    .collect();
                unsafe { adam_step(&h, &slots) };
                for i in 0..lens.len() {
                    adam_ref(&h, step as f64, &mut rp[i], &g[i], &mut rm[i], &mut rv[i], &mut rmx[i]);
                }
            }
            assert_eq!(p, rp, "{h:?}");
            assert_eq!(m, rm);
            assert_eq!(v, rv);
        }
    }

    #[test]
    fn adam_propagates_nan_and_inf() {
        let h = AdamHyper { lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0, decoupled: false, maximize: false, amsgrad: true };
        let mut p = vec![1.0f32, 1.0, f32::INFINITY];
        let g = [f32::NAN, f32::INFINITY, 1.0];
        let (mut m, mut v, mut mx) = (vec![0.0f32; 3], vec![0.0f32; 3], vec![0.0f32; 3]);
        let slot = AdamSlot { param: p.as_mut_ptr(), grad: g.as_ptr(), exp_avg: m.as_mut_ptr(), exp_avg_sq: v.as_mut_ptr(), max_exp_avg_sq: mx.as_mut_ptr(), len: 3, step: 1.0 };
        unsafe { adam_step(&h, &[slot]) };
        assert!(p[0].is_nan() && mx[0].is_nan());
        assert!(p[1].is_nan()); // inf / inf
        assert_eq!(p[2], f32::INFINITY);
    }

    #[test]
    fn sgd_momentum_nesterov_and_first_step() {
        let h = SgdHyper { lr: 0.1, momentum: 0.9, dampening: 0.1, weight_decay: 0.01, nesterov: true, maximize: false };
        let n = CHUNK + 5;
        let mut p = data(n, 1);
        let g = data(n, 2);
        let mut b = vec![f32::NAN; n]; // the first step must not read it
        let (mut rp, mut rb) = (p.clone(), vec![0.0f32; n]);
        for first in [true, false] {
            let slot = SgdSlot { param: p.as_mut_ptr(), grad: g.as_ptr(), buf: b.as_mut_ptr(), first, len: n };
            unsafe { sgd_step(&h, &[slot]) };
            for i in 0..n {
                let gi = g[i] + 0.01f32 * rp[i];
                rb[i] = if first { gi } else { rb[i] * 0.9f32 + 0.9f32 * gi };
                rp[i] += -0.1f32 * (gi + 0.9f32 * rb[i]);
            }
        }
        assert_eq!(p, rp);
        assert_eq!(b, rb);
    }
}
