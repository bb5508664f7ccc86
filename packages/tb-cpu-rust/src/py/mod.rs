//! The pyo3 layer of `tb_cpu_rust._native`: every function converts Python values, calls into
//! plain Rust that returns `Result`, and turns errors into Python `ValueError`s. Kernels run
//! with the GIL released.

pub mod eager;
mod llm;
mod optim;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

type TensorArg = (usize, Vec<i64>, Vec<i64>, String);

fn err(e: String) -> PyErr {
    PyValueError::new_err(e)
}

struct Ptrs(Vec<*mut u8>);
// SAFETY: the pointers are only dereferenced by the executor while Python keeps the tensors
// alive (the caller holds references for the duration of `run`).
unsafe impl Send for Ptrs {}

fn args(list: Vec<TensorArg>) -> Vec<crate::exec::Arg> {
    list.into_iter()
        .map(|(ptr, sizes, strides, dtype)| crate::exec::Arg { ptr, sizes, strides, dtype })
        .collect()
}

/// A prepared partition: built once from the plan spec, called many times.
#[pyclass(module = "tb_cpu_rust._native", frozen)]
struct Executor {
    inner: crate::exec::Executor,
}

#[pymethods]
impl Executor {
    #[new]
    fn new(spec: &str) -> PyResult<Self> {
        crate::exec::Executor::from_json(spec).map(|inner| Executor { inner }).map_err(err)
    }

    /// Runs the plan on `inputs`, writing `outputs`; each tensor is (data_ptr, sizes, strides, dtype).
    fn run(&self, py: Python<'_>, inputs: Vec<TensorArg>, outputs: Vec<TensorArg>) -> PyResult<()> {
        let ptrs = Ptrs(self.inner.bind(&args(inputs), &args(outputs)).map_err(err)?);
        let inner = &self.inner;
        py.detach(move || {
            let ptrs = ptrs;
            // SAFETY: `bind` validated dtypes, sizes, strides and overlap of every tensor.
            unsafe { inner.run(ptrs.0) }
        })
        .map_err(err)
    }

    /// Runs the plan on bare data pointers (inputs, then outputs): the fast entry for a caller that
    /// has matched every tensor's dtype, sizes and strides against the plan itself (tb-cython-dispatch
    /// compares them with the layouts it prepared the plan for). Pointers are still checked for
    /// count, null, alignment and overlapping outputs; sizes and strides are not crossed at all.
    fn run_ptrs(&self, py: Python<'_>, inputs: Vec<usize>, outputs: Vec<usize>) -> PyResult<()> {
        let ptrs = Ptrs(self.inner.bind_ptrs(&inputs, &outputs).map_err(err)?);
        let inner = &self.inner;
        py.detach(move || {
            let ptrs = ptrs;
            // SAFETY: the caller vouches for the layouts; `bind_ptrs` checked the pointers.
            unsafe { inner.run(ptrs.0) }
        })
        .map_err(err)
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

/// Validates one tensor descriptor and returns the number of elements it spans.
#[pyfunction]
fn validate_tensor(ptr: usize, sizes: Vec<i64>, strides: Vec<i64>, dtype: &str) -> PyResult<usize> {
    let dt = crate::core::tensor::DType::parse(dtype).map_err(err)?;
    let sizes = crate::core::tensor::to_usize(&sizes, "sizes").map_err(err)?;
    let strides = crate::core::tensor::to_usize(&strides, "strides").map_err(err)?;
    crate::core::tensor::numel(&sizes).map_err(err)?;
    let ext = crate::core::tensor::extent(&sizes, &strides).map_err(err)?;
    if ptr == 0 && ext > 0 {
        return Err(err("null data pointer".into()));
    }
    if !ptr.is_multiple_of(dt.size()) {
        return Err(err("misaligned data pointer".into()));
    }
    Ok(ext)
}

/// out = op(inp) over `n` contiguous float32 elements (`eager.rs`): the caller vouches that both
/// pointers address `n` elements of live tensors that are the same buffer or do not overlap.
#[pyfunction]
fn unary_f32(py: Python<'_>, op: usize, src: usize, dst: usize, n: usize) -> PyResult<()> {
    let un = eager::check(op, src, dst, n).map_err(err)?;
    if eager::parallel(n) {
        // SAFETY: the caller's contract above; the tensors outlive the call (Python holds them)
        py.detach(move || unsafe { eager::run(un, src, dst, n) });
    } else {
        // SAFETY: as above
        unsafe { eager::run(un, src, dst, n) };
    }
    Ok(())
}

/// The op names `unary_f32` takes, by code.
#[pyfunction]
fn unary_ops() -> Vec<&'static str> {
    eager::op_names()
}

#[pyfunction(name = "isa")]
fn isa_name() -> &'static str {
    crate::core::isa::describe()
}

#[pyfunction]
fn gemm_backend() -> &'static str {
    crate::kernels::gemm::backend()
}

#[pyfunction]
fn set_gemm_backend(name: &str) -> PyResult<()> {
    crate::kernels::gemm::set_backend(name).map_err(err)
}

/// Threads a kernel may use: `torch.get_num_threads()` on the OpenMP pool, else rayon's.
#[pyfunction]
fn num_threads() -> usize {
    crate::core::par::threads()
}

/// Hands over the addresses of libgomp's `GOMP_parallel`, `omp_get_max_threads` and
/// `omp_in_parallel` (from the libgomp PyTorch loaded) and makes OpenMP the kernels' pool.
///
/// # Safety (for the caller)
/// The addresses must be those functions of a library that stays loaded.
#[pyfunction]
fn set_openmp(parallel: usize, max_threads: usize, in_parallel: usize) -> PyResult<()> {
    // SAFETY: the Python caller (tb_cpu_rust.program) takes the addresses from ctypes' view of
    // the libgomp PyTorch already mapped, which is never unloaded.
    unsafe { crate::core::par::set_openmp(parallel, max_threads, in_parallel) }.map_err(err)
}

/// "openmp" or "rayon": where the kernels' parallel loops run.
#[pyfunction]
fn thread_pool() -> &'static str {
    crate::core::par::pool()
}

#[pyfunction]
fn set_thread_pool(name: &str) -> PyResult<()> {
    crate::core::par::set_pool(name).map_err(err)
}

/// Adds every class and function of `_native` to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Executor>()?;
    m.add_function(wrap_pyfunction!(validate_tensor, m)?)?;
    m.add_function(wrap_pyfunction!(isa_name, m)?)?;
    m.add_function(wrap_pyfunction!(gemm_backend, m)?)?;
    m.add_function(wrap_pyfunction!(set_gemm_backend, m)?)?;
    m.add_function(wrap_pyfunction!(num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(unary_f32, m)?)?;
    m.add_function(wrap_pyfunction!(unary_ops, m)?)?;
    m.add_function(wrap_pyfunction!(set_openmp, m)?)?;
    m.add_function(wrap_pyfunction!(thread_pool, m)?)?;
    m.add_function(wrap_pyfunction!(set_thread_pool, m)?)?;
    llm::register(m)?;
    optim::register(m)?;
    // the step schema and the limits Python's lowering must agree on, from their one definition
    m.add("STEP_SCHEMA_VERSION", crate::exec::step::SCHEMA_VERSION)?;
    m.add("STEP_KINDS", crate::exec::step::STEP_KINDS.to_vec())?;
    m.add("MAX_EPILOGUE", crate::kernels::gemm::MAX_EPI)?;
    Ok(())
}
