//! pyo3 layer of the fused optimizer steps (`optim.rs`): validates every tensor descriptor
//! (dtype, contiguity, matching sizes, no two buffers overlapping) before any memory is touched,
//! so a bad call is a `ValueError` and leaves parameters and state as they were. The step runs
//! with the GIL released.

use crate::kernels::optim::{self, AdamHyper, AdamSlot, SgdHyper, SgdSlot};
use crate::core::tensor;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

type TensorArg = (usize, Vec<i64>, Vec<i64>, String);

fn err(e: String) -> PyErr {
    PyValueError::new_err(e)
}

/// A validated contiguous buffer: pointer, sizes, byte span.
struct Buf {
    ptr: usize,
    sizes: Vec<usize>,
    bytes: usize,
    f64: bool,
}

impl Buf {
    fn numel(&self) -> usize {
        self.sizes.iter().product()
    }
}

/// Checks one descriptor: a dtype among `dtypes`, contiguous, a non-null aligned pointer.
fn buf(a: TensorArg, what: &str, dtypes: &[&str]) -> PyResult<Buf> {
    let (ptr, sizes, strides, dt) = a;
    let dt = dt.trim_start_matches("torch.").to_string();
    if !dtypes.contains(&dt.as_str()) {
        return Err(err(format!("{what}: expected dtype {}, got {dt}", dtypes.join(" or "))));
    }
    let elem = if dt == "float64" { 8 } else { 4 };
    let sizes = tensor::to_usize(&sizes, "sizes").map_err(|e| err(format!("{what}: {e}")))?;
    let strides = tensor::to_usize(&strides, "strides").map_err(|e| err(format!("{what}: {e}")))?;
    if strides.len() != sizes.len() {
        return Err(err(format!("{what}: {} sizes but {} strides", sizes.len(), strides.len())));
    }
    let numel = tensor::numel(&sizes).map_err(|e| err(format!("{what}: {e}")))?;
    if numel > 1 && strides != tensor::contiguous_strides(&sizes) {
        // size-1 dims may carry any stride
        let ok = sizes.iter().zip(&strides).zip(tensor::contiguous_strides(&sizes)).all(|((&s, &st), c)| s == 1 || st == c);
        if !ok {
            return Err(err(format!("{what}: must be contiguous, got sizes {sizes:?} strides {strides:?}")));
        }
    }
    if numel > 0 && (ptr == 0 || ptr % elem != 0) {
        return Err(err(format!("{what}: null or misaligned data pointer")));
    }
    let bytes = numel.checked_mul(elem).ok_or_else(|| err(format!("{what}: size overflows")))?;
    Ok(Buf { ptr, sizes, bytes, f64: dt == "float64" })
}

/// Fails when any two non-empty buffers share a byte.
fn disjoint(bufs: &[(Buf, String)]) -> PyResult<()> {
    let mut spans: Vec<(usize, usize, &str)> =
        bufs.iter().filter(|(b, _)| b.bytes > 0).map(|(b, n)| (b.ptr, b.ptr + b.bytes, n.as_str())).collect();
    spans.sort_unstable();
    for w in spans.windows(2) {
        if w[1].0 < w[0].1 {
            return Err(err(format!("{} overlaps {}", w[1].2, w[0].2)));
        }
    }
    Ok(())
}

fn finite(values: &[(f64, &str)]) -> PyResult<()> {
    for &(v, name) in values {
        if !v.is_finite() {
            return Err(err(format!("{name} must be finite, got {v}")));
        }
    }
    Ok(())
}

fn same_len(n: usize, what: &str, len: usize) -> PyResult<()> {
    if len != n {
        return Err(err(format!("{what}: {len} tensors for {n} parameters")));
    }
    Ok(())
}

fn like(p: &Buf, b: &Buf, what: &str) -> PyResult<()> {
    if p.sizes != b.sizes {
        return Err(err(format!("{what}: shape {:?} differs from the parameter's {:?}", b.sizes, p.sizes)));
    }
    Ok(())
}

/// Adds 1 to a validated one-element step tensor and returns the new count.
///
/// # Safety
/// `ptr` addresses a live one-element tensor, float64 when `is_f64` else float32.
unsafe fn bump(ptr: usize, is_f64: bool) -> f64 {
    if is_f64 {
        let p = ptr as *mut f64;
        *p += 1.0;
        *p
    } else {
        let p = ptr as *mut f32;
        *p += 1.0;
        *p as f64
    }
}

/// One Adam (AdamW with `decoupled`) step over every parameter of a group, as
/// `torch.optim.Adam`'s single-tensor path computes it. `steps` are the 0-d step-count tensors
/// (incremented here); `max_exp_avg_sqs` is empty unless `amsgrad`.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn optim_adam(
    py: Python<'_>,
    params: Vec<TensorArg>,
    grads: Vec<TensorArg>,
    exp_avgs: Vec<TensorArg>,
    exp_avg_sqs: Vec<TensorArg>,
    max_exp_avg_sqs: Vec<TensorArg>,
    steps: Vec<TensorArg>,
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
    same_len(n, "grads", grads.len())?;
    same_len(n, "exp_avgs", exp_avgs.len())?;
    same_len(n, "exp_avg_sqs", exp_avg_sqs.len())?;
    same_len(n, "steps", steps.len())?;
    same_len(if amsgrad { n } else { 0 }, "max_exp_avg_sqs", max_exp_avg_sqs.len())?;
    finite(&[(lr, "lr"), (beta1, "beta1"), (beta2, "beta2"), (eps, "eps"), (weight_decay, "weight_decay")])?;
    let f32_ = ["float32"];
    let mut named: Vec<(Buf, String)> = Vec::with_capacity(6 * n);
    let mut rows = Vec::with_capacity(n);
    let mut maxes = max_exp_avg_sqs.into_iter();
    for (i, ((((p, g), m), v), s)) in params.into_iter().zip(grads).zip(exp_avgs).zip(exp_avg_sqs).zip(steps).enumerate() {
        let p = buf(p, &format!("params[{i}]"), &f32_)?;
        let g = buf(g, &format!("grads[{i}]"), &f32_)?;
        let m = buf(m, &format!("exp_avgs[{i}]"), &f32_)?;
        let v = buf(v, &format!("exp_avg_sqs[{i}]"), &f32_)?;
        let s = buf(s, &format!("steps[{i}]"), &["float32", "float64"])?;
        like(&p, &g, &format!("grads[{i}]"))?;
        like(&p, &m, &format!("exp_avgs[{i}]"))?;
        like(&p, &v, &format!("exp_avg_sqs[{i}]"))?;
        if s.numel() != 1 {
            return Err(err(format!("steps[{i}]: expected one element, got shape {:?}", s.sizes)));
        }
        let mx = match maxes.next() {
            Some(a) => {
                let b = buf(a, &format!("max_exp_avg_sqs[{i}]"), &f32_)?;
                like(&p, &b, &format!("max_exp_avg_sqs[{i}]"))?;
                Some(b)
            }
            None => None,
        };
        rows.push((p.ptr, g.ptr, m.ptr, v.ptr, mx.as_ref().map_or(0, |b| b.ptr), p.numel(), s.ptr, s.f64));
        named.push((p, format!("params[{i}]")));
        named.push((g, format!("grads[{i}]")));
        named.push((m, format!("exp_avgs[{i}]")));
        named.push((v, format!("exp_avg_sqs[{i}]")));
        named.push((s, format!("steps[{i}]")));
        if let Some(b) = mx {
            named.push((b, format!("max_exp_avg_sqs[{i}]")));
        }
    }
    disjoint(&named)?;
    let h = AdamHyper { lr, beta1, beta2, eps, weight_decay, decoupled, maximize, amsgrad };
    let slots: Vec<AdamSlot> = rows
        .into_iter()
        .map(|(p, g, m, v, mx, len, s, s64)| AdamSlot {
            param: p as *mut f32,
            grad: g as *const f32,
            exp_avg: m as *mut f32,
            exp_avg_sq: v as *mut f32,
            max_exp_avg_sq: mx as *mut f32,
            len,
            // SAFETY: validated above as a live one-element tensor of that dtype.
            step: unsafe { bump(s, s64) },
        })
        .collect();
    let slots = Slots(slots);
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
#[allow(clippy::too_many_arguments)]
fn optim_sgd(
    py: Python<'_>,
    params: Vec<TensorArg>,
    grads: Vec<TensorArg>,
    momentum_buffers: Vec<TensorArg>,
    first: Vec<bool>,
    lr: f64,
    momentum: f64,
    dampening: f64,
    weight_decay: f64,
    nesterov: bool,
    maximize: bool,
) -> PyResult<()> {
    let n = params.len();
    same_len(n, "grads", grads.len())?;
    let mom = momentum != 0.0;
    same_len(if mom { n } else { 0 }, "momentum_buffers", momentum_buffers.len())?;
    same_len(if mom { n } else { 0 }, "first", first.len())?;
    finite(&[(lr, "lr"), (momentum, "momentum"), (dampening, "dampening"), (weight_decay, "weight_decay")])?;
    let f32_ = ["float32"];
    let mut named: Vec<(Buf, String)> = Vec::with_capacity(3 * n);
    let mut slots = Vec::with_capacity(n);
    let mut bufs = momentum_buffers.into_iter();
    for (i, (p, g)) in params.into_iter().zip(grads).enumerate() {
        let p = buf(p, &format!("params[{i}]"), &f32_)?;
        let g = buf(g, &format!("grads[{i}]"), &f32_)?;
        like(&p, &g, &format!("grads[{i}]"))?;
        let b = match bufs.next() {
            Some(a) => {
                let b = buf(a, &format!("momentum_buffers[{i}]"), &f32_)?;
                like(&p, &b, &format!("momentum_buffers[{i}]"))?;
                Some(b)
            }
            None => None,
        };
        slots.push(SgdSlot {
            param: p.ptr as *mut f32,
            grad: g.ptr as *const f32,
            buf: b.as_ref().map_or(0, |b| b.ptr) as *mut f32,
            first: mom && first[i],
            len: p.numel(),
        });
        named.push((p, format!("params[{i}]")));
        named.push((g, format!("grads[{i}]")));
        if let Some(b) = b {
            named.push((b, format!("momentum_buffers[{i}]")));
        }
    }
    disjoint(&named)?;
    let h = SgdHyper { lr, momentum, dampening, weight_decay, nesterov, maximize };
    let slots = SgdSlots(slots);
    // SAFETY: as in `optim_adam`.
    py.detach(move || {
        let slots = slots;
        unsafe { optim::sgd_step(&h, &slots.0) }
    });
    Ok(())
}

struct Slots(Vec<AdamSlot>);
// SAFETY: the pointers are only used by `adam_step` while Python keeps the tensors alive.
unsafe impl Send for Slots {}
struct SgdSlots(Vec<SgdSlot>);
// SAFETY: as `Slots`.
unsafe impl Send for SgdSlots {}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(optim_adam, m)?)?;
    m.add_function(wrap_pyfunction!(optim_sgd, m)?)?;
    Ok(())
}
