//! The prepared-graph executor. Python hands over a whole partition once, as a JSON spec of
//! buffers, strided views into them and steps; `Executor::new` validates every view against
//! its buffer and every step's shapes, so a call only moves pointers and runs kernels.
//!
//! Buffers are of three kinds: inputs (tensors passed per call, never written), outputs
//! (allocated by Python with torch.empty and filled here) and temporaries (owned by the
//! executor, reused across calls; several values may share one by liveness).

pub mod step;

pub use crate::core::mem::{Mem, SPtr};
use crate::core::host_tensor::HostTensor;
use crate::core::tensor::{extent, ranges_overlap, to_usize, DType, Result, View};
use crate::kernels::registry::StepKernel;
use step::StepSpec;
use serde::Deserialize;
use std::sync::Mutex;

#[derive(Deserialize)]
struct BufSpec {
    kind: String,
    dtype: String,
    numel: usize,
    #[serde(default)]
    sizes: Vec<i64>,
    #[serde(default)]
    strides: Vec<i64>,
}

#[derive(Deserialize)]
struct ValSpec {
    buf: usize,
    offset: usize,
    sizes: Vec<usize>,
    strides: Vec<usize>,
}

#[derive(Deserialize)]
struct Spec {
    buffers: Vec<BufSpec>,
    values: Vec<ValSpec>,
    steps: Vec<StepSpec>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum BufKind {
    Input,
    Output,
    Temp,
}

pub struct Buffer {
    pub kind: BufKind,
    pub dtype: DType,
    pub numel: usize,
    /// inputs: the exact sizes and strides the plan was prepared for; outputs: the layout the
    /// output tensor must have (none: `numel` contiguous elements, any shape)
    pub sizes: Vec<usize>,
    pub strides: Vec<usize>,
}

/// `sizes` and `strides` describe the same elements at the same places as the wanted layout (a
/// stride over a dim of size 0 or 1 never moves an index, so it may differ).
fn same_layout(t: &HostTensor, sizes: &[usize], strides: &[usize]) -> bool {
    t.sizes == sizes && t.sizes.iter().zip(&t.strides).zip(strides).all(|((&n, a), b)| n <= 1 || a == b)
}

/// Row-major contiguous (strides of dims of size 1 aside).
fn contiguous(t: &HostTensor) -> bool {
    if t.numel() == 0 {
        return true;
    }
    let mut want = 1;
    for (&n, &s) in t.sizes.iter().zip(&t.strides).rev() {
        if n != 1 && s != want {
            return false;
        }
        want *= n;
    }
    true
}

pub struct Executor {
    pub buffers: Vec<Buffer>,
    /// the built steps, in order (each a kernel family's closure over validated views)
    pub steps: Vec<Box<dyn StepKernel>>,
    /// each step's kind (its `op` tag), in step order: what `run_profiled` reports
    pub tags: Vec<&'static str>,
    pub n_inputs: usize,
    pub n_outputs: usize,
    workspace: Mutex<Option<Vec<Vec<u64>>>>,
}

impl Executor {
    pub fn from_json(text: &str) -> Result<Executor> {
        step::check_version(text)?;
        let spec: Spec = serde_json::from_str(text).map_err(|e| format!("bad plan spec: {e}"))?;
        let mut buffers = Vec::with_capacity(spec.buffers.len());
        let (mut n_inputs, mut n_outputs) = (0, 0);
        for b in &spec.buffers {
            let kind = match b.kind.as_str() {
                "input" => BufKind::Input,
                "output" => BufKind::Output,
                "temp" => BufKind::Temp,
                k => return Err(format!("unknown buffer kind {k:?}")),
            };
            let dtype = DType::parse(&b.dtype)?;
            let (sizes, strides) = (to_usize(&b.sizes, "sizes")?, to_usize(&b.strides, "strides")?);
            let numel = if kind == BufKind::Input { extent(&sizes, &strides)? } else { b.numel };
            if kind == BufKind::Output && !sizes.is_empty() && (sizes.len() != strides.len() || extent(&sizes, &strides)? != numel) {
                return Err(format!("output buffer {}: layout {sizes:?} {strides:?} does not span its {numel} elements", buffers.len()));
            }
            if numel.checked_mul(dtype.size()).is_none_or(|bytes| bytes > isize::MAX as usize) {
                return Err("buffer too large".into());
            }
            match kind {
                BufKind::Input => n_inputs += 1,
                BufKind::Output => n_outputs += 1,
                BufKind::Temp => {}
            }
            buffers.push(Buffer { kind, dtype, numel, sizes, strides });
        }
        // inputs first, then outputs: the call passes them in that order
        let order_ok = buffers.iter().take(n_inputs).all(|b| b.kind == BufKind::Input)
            && buffers.iter().skip(n_inputs).take(n_outputs).all(|b| b.kind == BufKind::Output);
        if !order_ok {
            return Err("buffers must list inputs, then outputs, then temporaries".into());
        }
        let mut values = Vec::with_capacity(spec.values.len());
        for v in &spec.values {
            let b = buffers.get(v.buf).ok_or_else(|| format!("value names buffer {} of {}", v.buf, buffers.len()))?;
            let view = View { buf: v.buf, offset: v.offset, sizes: v.sizes.clone(), strides: v.strides.clone(), dtype: b.dtype };
            view.check_within(b.numel)?;
            values.push(view);
        }
        let get = |i: usize| values.get(i).cloned().ok_or_else(|| format!("step names value {i} of {}", values.len()));
        let mut steps = Vec::with_capacity(spec.steps.len());
        let mut tags = Vec::with_capacity(spec.steps.len());
        for s in &spec.steps {
            let ins: Vec<Option<View>> = s.ins.iter().map(|i| i.map(get).transpose()).collect::<Result<_>>()?;
            let outs: Vec<View> = s.outs.iter().map(|&i| get(i)).collect::<Result<_>>()?;
            let op = s.op.as_str();
            for o in &outs {
                if buffers[o.buf].kind == BufKind::Input {
                    return Err(format!("step {op} would write into an input"));
                }
                if ins.iter().flatten().any(|i| i.buf == o.buf) {
                    return Err(format!("step {op} reads and writes the same buffer"));
                }
            }
            let (tag, step) = step::build(s, ins, outs)?;
            tags.push(tag);
            steps.push(step);
        }
        Ok(Executor { buffers, steps, tags, n_inputs, n_outputs, workspace: Mutex::new(None) })
    }

    fn check_counts(&self, inputs: usize, outputs: usize) -> Result<()> {
        if inputs != self.n_inputs || outputs != self.n_outputs {
            let (ni, no) = (self.n_inputs, self.n_outputs);
            return Err(format!("expected {ni} inputs and {no} outputs, got {inputs} and {outputs}"));
        }
        Ok(())
    }

    /// Outputs (pointer, bytes) must not overlap each other, nor any input, whose extent is the
    /// plan's (an input buffer's numel is its extent; its layout was matched before).
    fn check_no_overlap(&self, outputs: &[(usize, usize)], inputs: impl Iterator<Item = usize> + Clone) -> Result<()> {
        for (k, &(p, n)) in outputs.iter().enumerate() {
            for &(q, m) in &outputs[k + 1..] {
                if ranges_overlap(p, n, q, m) {
                    return Err("output tensors overlap".into());
                }
            }
            for (q, buf) in inputs.clone().zip(&self.buffers) {
                if ranges_overlap(p, n, q, buf.numel * buf.dtype.size()) {
                    return Err("an output tensor overlaps an input".into());
                }
            }
        }
        Ok(())
    }

    /// Checks the tensors of one call against the plan; returns the buffer base pointers. An
    /// input has the plan's dtype, sizes and strides (a stride over a dim of size 0 or 1 never
    /// moves an index, so it may differ); an output the plan's dtype and the layout the plan writes
    /// (its sizes and strides where the plan gives them, else its elements, contiguous): a buffer
    /// is written in the plan's element order, so another layout would read back permuted.
    pub fn bind(&self, inputs: &[HostTensor], outputs: &[HostTensor]) -> Result<Vec<*mut u8>> {
        self.check_counts(inputs.len(), outputs.len())?;
        let mut ptrs = Vec::with_capacity(self.buffers.len());
        let mut ranges: Vec<(usize, usize)> = Vec::with_capacity(outputs.len());
        for (i, (t, buf)) in inputs.iter().chain(outputs).zip(&self.buffers).enumerate() {
            if t.dtype != buf.dtype {
                return Err(format!("tensor {i}: dtype {} where the plan has {}", t.dtype.name(), buf.dtype.name()));
            }
            let (what, declared) = if buf.kind == BufKind::Input { ("input", true) } else { ("output", !buf.sizes.is_empty()) };
            if declared && !same_layout(t, &buf.sizes, &buf.strides) {
                return Err(format!(
                    "{what} {i}: sizes {:?} strides {:?} differ from the plan's {:?} {:?}",
                    t.sizes, t.strides, buf.sizes, buf.strides
                ));
            }
            if !declared && (t.numel() != buf.numel || !contiguous(t)) {
                return Err(format!(
                    "output {i}: sizes {:?} strides {:?} where the plan writes {} contiguous elements",
                    t.sizes, t.strides, buf.numel
                ));
            }
            if buf.kind == BufKind::Output {
                ranges.push((t.ptr, t.extent() * t.dtype.size()));
            }
            ptrs.push(t.ptr as *mut u8);
        }
        self.check_no_overlap(&ranges, inputs.iter().map(|t| t.ptr))?;
        Ok(ptrs)
    }

    /// Runs the plan. `ptrs` comes from `bind` (inputs then outputs).
    ///
    /// # Safety
    /// The pointers must be live tensors with the sizes and strides `bind` checked.
    pub unsafe fn run(&self, ptrs: Vec<*mut u8>) -> Result<()> {
        self.run_steps(ptrs, None)
    }

    /// `run`, also returning each step's wall time in seconds (step order; `tags` names them):
    /// the profiling hook that shows where a plan's time goes. One clock read per step.
    ///
    /// # Safety
    /// As `run`.
    pub unsafe fn run_profiled(&self, ptrs: Vec<*mut u8>) -> Result<Vec<f64>> {
        let mut times = Vec::with_capacity(self.steps.len());
        self.run_steps(ptrs, Some(&mut times))?;
        Ok(times)
    }

    unsafe fn run_steps(&self, mut ptrs: Vec<*mut u8>, mut times: Option<&mut Vec<f64>>) -> Result<()> {
        let mut ws = self.workspace.lock().ok().and_then(|mut g| g.take()).unwrap_or_else(|| {
            self.buffers
                .iter()
                .filter(|b| b.kind == BufKind::Temp)
                .map(|b| vec![0u64; (b.numel * b.dtype.size()).div_ceil(8).max(1)])
                .collect()
        });
        ptrs.extend(ws.iter_mut().map(|w| w.as_mut_ptr() as *mut u8));
        let mem = Mem { ptrs };
        let mut result = Ok(());
        for step in &self.steps {
            let start = times.as_ref().map(|_| std::time::Instant::now());
            let r = step.run(&mem);
            if let (Some(t), Some(s)) = (times.as_deref_mut(), start) {
                t.push(s.elapsed().as_secs_f64());
            }
            if r.is_err() {
                result = r;
                break;
            }
        }
        if let Ok(mut g) = self.workspace.lock() {
            *g = Some(ws);
        }
        result
    }
}
