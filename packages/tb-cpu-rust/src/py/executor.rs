//! `Executor`: a prepared partition, built once from the plan spec and run many times on torch
//! tensors; `validate_tensor`, the validator itself as an entry.

use pyo3::prelude::*;

use super::args::{self, err, SendPtrs, ANY};
use crate::exec;

/// A prepared partition: built once from the plan spec, called many times.
#[pyclass(module = "tb_cpu_rust._native", frozen)]
pub struct Executor {
    inner: exec::Executor,
}

#[pymethods]
impl Executor {
    #[new]
    fn new(spec: &str) -> PyResult<Self> {
        exec::Executor::from_json(spec).map(|inner| Executor { inner }).map_err(err)
    }

    /// Runs the plan on the tensors `inputs`, writing the tensors `outputs`, with the GIL
    /// released. Each input has the dtype, sizes and strides (where a size is above 1) of the
    /// plan's; each output its dtype and at least its elements; no output shares a byte with
    /// another tensor of the call.
    fn run(&self, py: Python<'_>, inputs: Vec<Bound<'_, PyAny>>, outputs: Vec<Bound<'_, PyAny>>) -> PyResult<()> {
        let ins = args::tensors(&inputs, "inputs", ANY)?;
        let outs = args::tensors(&outputs, "outputs", ANY)?;
        let ptrs = SendPtrs(self.inner.bind(&ins, &outs).map_err(err)?);
        let inner = &self.inner;
        py.detach(move || {
            let ptrs = ptrs;
            // SAFETY: `bind` matched every tensor against the plan and checked the outputs'
            // overlap; `inputs` and `outputs` hold the tensors until this returns.
            unsafe { inner.run(ptrs.0) }
        })
        .map_err(err)
    }

    /// `run`, returning each step's kind and wall time in seconds, in step order: where a
    /// plan's time goes (a profiling hook; one clock read per step).
    fn run_profiled(
        &self,
        py: Python<'_>,
        inputs: Vec<Bound<'_, PyAny>>,
        outputs: Vec<Bound<'_, PyAny>>,
    ) -> PyResult<Vec<(&'static str, f64)>> {
        let ins = args::tensors(&inputs, "inputs", ANY)?;
        let outs = args::tensors(&outputs, "outputs", ANY)?;
        let ptrs = SendPtrs(self.inner.bind(&ins, &outs).map_err(err)?);
        let inner = &self.inner;
        let times = py
            .detach(move || {
                let ptrs = ptrs;
                // SAFETY: as in `run`.
                unsafe { inner.run_profiled(ptrs.0) }
            })
            .map_err(err)?;
        Ok(inner.tags.iter().copied().zip(times).collect())
    }

    /// `run` under the name of the former bare-pointer entry: the same validated call.
    fn run_ptrs(&self, py: Python<'_>, inputs: Vec<Bound<'_, PyAny>>, outputs: Vec<Bound<'_, PyAny>>) -> PyResult<()> {
        self.run(py, inputs, outputs)
    }

    #[getter]
    fn n_inputs(&self) -> usize {
        self.inner.n_inputs
    }

    #[getter]
    fn n_outputs(&self) -> usize {
        self.inner.n_outputs
    }

    #[getter]
    fn n_steps(&self) -> usize {
        self.inner.steps.len()
    }
}

/// Validates one tensor as every entry does and returns the number of elements it spans.
#[pyfunction]
pub fn validate_tensor(tensor: &Bound<'_, PyAny>) -> PyResult<usize> {
    Ok(args::tensor(tensor, "tensor", ANY)?.extent())
}
