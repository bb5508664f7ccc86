//! The pyo3 layer of `tb_cpu_rust._native`. Every entry takes torch tensors, never addresses:
//! `args` (over `dlpack`) validates each tensor argument into a `HostTensor` in one place, the
//! entry checks them against each other, calls plain Rust that returns `Result`, and turns
//! errors into Python exceptions. Kernels run with the GIL released.

mod args;
mod dlpack;
mod eager;
mod executor;
mod llm;
mod optim;
mod runtime;

use pyo3::prelude::*;

/// Adds every class and function of `_native` to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<executor::Executor>()?;
    m.add_function(wrap_pyfunction!(executor::validate_tensor, m)?)?;
    m.add_function(wrap_pyfunction!(eager::unary_f32, m)?)?;
    m.add_function(wrap_pyfunction!(eager::unary_ops, m)?)?;
    m.add_function(wrap_pyfunction!(runtime::isa_name, m)?)?;
    m.add_function(wrap_pyfunction!(runtime::fma_peak_gflops, m)?)?;
    m.add_function(wrap_pyfunction!(runtime::gemm_backend, m)?)?;
    m.add_function(wrap_pyfunction!(runtime::set_gemm_backend, m)?)?;
    m.add_function(wrap_pyfunction!(runtime::num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(runtime::set_openmp, m)?)?;
    m.add_function(wrap_pyfunction!(runtime::thread_pool, m)?)?;
    m.add_function(wrap_pyfunction!(runtime::set_thread_pool, m)?)?;
    m.add_function(wrap_pyfunction!(runtime::dlpack_reader, m)?)?;
    llm::register(m)?;
    optim::register(m)?;
    // the step schema and the limits Python's lowering must agree on, from their one definition
    m.add("STEP_SCHEMA_VERSION", crate::exec::step::SCHEMA_VERSION)?;
    m.add("STEP_KINDS", crate::exec::step::step_kinds())?;
    m.add("MAX_EPILOGUE", crate::kernels::gemm::MAX_EPI)?;
    Ok(())
}
