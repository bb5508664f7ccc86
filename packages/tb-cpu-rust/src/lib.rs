//! tb_cpu_rust._native: the `native_cpu` engine's kernels and prepared-graph executor.
//!
//! `core` holds the primitives everything shares and imports nothing else of the crate;
//! `kernels` are the op families (importing `core` only, never the executor); `exec` parses a
//! plan and dispatches its steps to the kernels; `llm` holds tb-llm's decode kernels; `py` is the
//! thin pyo3 layer over all of them. See README.md, "Architecture".

// Kernels index several arrays with one loop counter and take many shape parameters; the
// index-based form reads closer to the math than iterator chains would.
#![allow(clippy::needless_range_loop, clippy::too_many_arguments)]

pub mod core;
pub mod exec;
pub mod kernels;
pub mod llm;
mod py;

use pyo3::prelude::*;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    py::register(m)
}
