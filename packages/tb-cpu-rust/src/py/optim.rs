//! pyo3 layer of the fused optimizer steps (`kernels::optim`): every tensor is validated by
//! `args` (float32, contiguous, the parameter's shape, no two sharing a byte) before any memory
//! is touched, so a bad call is an exception and leaves parameters and state as they were. The
//! step runs with the GIL released.

use pyo3::prelude::*;

use super::args::{self, count, err, finite, Indexed, SendPtrs, Want};
use crate::core::host_tensor::HostTensor;
use crate::core::tensor::DType;
use crate::kernels::optim::{self, AdamHyper, AdamSlot, SgdHyper, SgdSlot};

const F32: Want = Want::of(&[DType::F32]).contiguous();
/// torch keeps the step count as a float32 tensor, or float64 with `capturable` / `fused`.
const STEP: Want = Want::of(&[DType::F32, DType::F64]).contiguous();

/// The tensors of one parameter, each validated and of the parameter's shape, with their names
/// for the overlap check.
struct Group<'a> {
    tensors: Vec<(HostTensor, Indexed<'a>)>,
}

impl<'a> Group<'a> {
    fn new() -> Group<'a> {
        Group { tensors: Vec::new() }
    }

    /// `obj` as `what[i]`, of the shape of `like` (the parameter) when given.
    fn add(&mut self, obj: &Bound<'_, PyAny>, what: &'a str, i: usize, want: Want, like: Option<&HostTensor>) -> PyResult<HostTensor> {
        let name = Indexed(what, i);
        let t = args::tensor(obj, name, want)?;
        if let Some(p) = like {
            args::shape(name, &t.sizes, &p.sizes)?;
        }
        self.tensors.push((t.clone(), name));
        Ok(t)
    }

    fn disjoint(&self) -> PyResult<()> {
        let named: Vec<(&HostTensor, Indexed<'a>)> = self.tensors.iter().map(|(t, n)| (t, *n)).collect();
        args::all_disjoint(&named)
    }
}

/// Adds 1 to a validated one-element step tensor and returns the new count.
///
/// # Safety
/// `t` is a live one-element float32 or float64 tensor.
unsafe fn bump(t: &HostTensor) -> f64 {
    if t.dtype == DType::F64 {
        let p = t.ptr as *mut f64;
        *p += 1.0;
        *p
    } else {
        let p = t.ptr as *mut f32;
        *p += 1.0;
        *p as f64
    }
}

/// One Adam (AdamW with `decoupled`) step over every parameter of a group, as
/// `torch.optim.Adam`'s single-tensor path computes it. `steps` are the 0-d step-count tensors
/// (incremented here); `max_exp_avg_sqs` is empty unless `amsgrad`.
#[pyfunction]
fn optim_adam(
    py: Python<'_>,
    params: Vec<Bound<'_, PyAny>>,
    grads: Vec<Bound<'_, PyAny>>,
    exp_avgs: Vec<Bound<'_, PyAny>>,
    exp_avg_sqs: Vec<Bound<'_, PyAny>>,
    max_exp_avg_sqs: Vec<Bound<'_, PyAny>>,
    steps: Vec<Bound<'_, PyAny>>,
    lr: f64,
    beta1: f64,
    beta2: f64,
    eps: f64,
    weight_decay: f64,
    decoupled: bool,
    maximize: bool,
    amsgrad: bool,
) -> PyResult<()> {
    let n = params.len();
    count("grads", grads.len(), n, "parameters")?;
    count("exp_avgs", exp_avgs.len(), n, "parameters")?;
    count("exp_avg_sqs", exp_avg_sqs.len(), n, "parameters")?;
    count("steps", steps.len(), n, "parameters")?;
    count("max_exp_avg_sqs", max_exp_avg_sqs.len(), if amsgrad { n } else { 0 }, "parameters with amsgrad")?;
    finite(&[(lr, "lr"), (beta1, "beta1"), (beta2, "beta2"), (eps, "eps"), (weight_decay, "weight_decay")])?;
    let mut group = Group::new();
    let mut rows = Vec::with_capacity(n);
    for i in 0..n {
        let p = group.add(&params[i], "params", i, F32, None)?;
        let g = group.add(&grads[i], "grads", i, F32, Some(&p))?;
        let m = group.add(&exp_avgs[i], "exp_avgs", i, F32, Some(&p))?;
        let v = group.add(&exp_avg_sqs[i], "exp_avg_sqs", i, F32, Some(&p))?;
        let s = group.add(&steps[i], "steps", i, STEP, None)?;
        if s.numel() != 1 {
            return Err(err(format!("steps[{i}]: expected one element, got shape {:?}", s.sizes)));
        }
        let mx = max_exp_avg_sqs.get(i).map(|o| group.add(o, "max_exp_avg_sqs", i, F32, Some(&p))).transpose()?;
        rows.push((p, g, m, v, mx, s));
    }
    group.disjoint()?;
    let h = AdamHyper { lr, beta1, beta2, eps, weight_decay, decoupled, maximize, amsgrad };
    let slots: Vec<AdamSlot> = rows
        .into_iter()
        .map(|(p, g, m, v, mx, s)| AdamSlot {
            param: p.ptr as *mut f32,
            grad: g.ptr as *const f32,
            exp_avg: m.ptr as *mut f32,
            exp_avg_sq: v.ptr as *mut f32,
            max_exp_avg_sq: mx.map_or(0, |b| b.ptr) as *mut f32,
            len: p.numel(),
            // SAFETY: validated above as a live one-element tensor of that dtype.
            step: unsafe { bump(&s) },
        })
        .collect();
    let slots = SendPtrs(slots);
    // SAFETY: every buffer was validated (dtype, contiguous, sizes) and no two overlap; Python
    // holds the tensors for the duration of the call.
    py.detach(move || {
        let slots = slots; // the whole Send wrapper, not its field
        unsafe { optim::adam_step(&h, &slots.0) }
    });
    Ok(())
}

/// One SGD step over every parameter of a group, as `torch.optim.SGD`'s single-tensor path
/// computes it. `momentum_buffers` is empty when momentum is 0; `first[i]` says buffer i is new
/// (it takes the gradient as it is).
#[pyfunction]
fn optim_sgd(
    py: Python<'_>,
    params: Vec<Bound<'_, PyAny>>,
    grads: Vec<Bound<'_, PyAny>>,
    momentum_buffers: Vec<Bound<'_, PyAny>>,
    first: Vec<bool>,
    lr: f64,
    momentum: f64,
    dampening: f64,
    weight_decay: f64,
    nesterov: bool,
    maximize: bool,
) -> PyResult<()> {
    let n = params.len();
    count("grads", grads.len(), n, "parameters")?;
    let mom = momentum != 0.0;
    count("momentum_buffers", momentum_buffers.len(), if mom { n } else { 0 }, "parameters with momentum")?;
    count("first", first.len(), if mom { n } else { 0 }, "parameters with momentum")?;
    finite(&[(lr, "lr"), (momentum, "momentum"), (dampening, "dampening"), (weight_decay, "weight_decay")])?;
    let mut group = Group::new();
    let mut slots = Vec::with_capacity(n);
    for i in 0..n {
        let p = group.add(&params[i], "params", i, F32, None)?;
        let g = group.add(&grads[i], "grads", i, F32, Some(&p))?;
        let b = momentum_buffers.get(i).map(|o| group.add(o, "momentum_buffers", i, F32, Some(&p))).transpose()?;
        slots.push(SgdSlot {
            param: p.ptr as *mut f32,
            grad: g.ptr as *const f32,
            buf: b.map_or(0, |b| b.ptr) as *mut f32,
            first: mom && first[i],
            len: p.numel(),
        });
    }
    group.disjoint()?;
    let h = SgdHyper { lr, momentum, dampening, weight_decay, nesterov, maximize };
    let slots = SendPtrs(slots);
    // SAFETY: as in `optim_adam`.
    py.detach(move || {
        let slots = slots;
        unsafe { optim::sgd_step(&h, &slots.0) }
    });
    Ok(())
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(optim_adam, m)?)?;
    m.add_function(wrap_pyfunction!(optim_sgd, m)?)?;
    Ok(())
}
