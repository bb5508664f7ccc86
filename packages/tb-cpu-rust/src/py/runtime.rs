//! The entries that report or choose how the kernels run: ISA, GEMM backend, thread pool and
//! the OpenMP runtime the loops share with PyTorch, and the DLPack reader in force.

use pyo3::prelude::*;

use super::args::err;
use crate::core::{isa, par};
use crate::kernels::gemm;

#[pyfunction(name = "isa")]
pub fn isa_name() -> &'static str {
    isa::describe()
}

/// The float32 FMA peak of `threads` threads running at once (GFLOP/s), measured for about
/// `seconds` (`core::fma_peak`): what the benchmarks' GEMM rows give their fraction of peak of.
#[pyfunction]
#[pyo3(signature = (threads, seconds = 0.2))]
pub fn fma_peak_gflops(py: Python<'_>, threads: usize, seconds: f64) -> PyResult<f64> {
    py.detach(|| crate::core::fma_peak::fma_peak_gflops(threads, seconds))
        .map_err(pyo3::exceptions::PyValueError::new_err)
}

#[pyfunction]
pub fn gemm_backend() -> &'static str {
    gemm::backend()
}

#[pyfunction]
pub fn set_gemm_backend(name: &str) -> PyResult<()> {
    gemm::set_backend(name).map_err(err)
}

/// Threads a kernel may use: `torch.get_num_threads()` on the OpenMP pool, else rayon's.
#[pyfunction]
pub fn num_threads() -> usize {
    par::threads()
}

/// Makes OpenMP the kernels' pool, on the runtime of `library`: the path of a libgomp this
/// process has already loaded (PyTorch's). Its `GOMP_parallel`, `omp_get_max_threads`,
/// `omp_in_parallel` and `omp_get_thread_num` are looked up here, so only a loaded library's own functions are ever called.
#[pyfunction]
pub fn set_openmp(library: &str) -> PyResult<()> {
    let [parallel, max_threads, in_parallel, thread_num] = loaded_openmp(library).map_err(err)?;
    // SAFETY: the four addresses are those functions of a library that is loaded and, with the
    // reference `loaded_openmp` took and never returns, stays loaded.
    unsafe { par::set_openmp(parallel, max_threads, in_parallel, thread_num) }.map_err(err)
}

/// The OpenMP entry points of an already loaded `library` (which it keeps loaded).
#[cfg(unix)]
fn loaded_openmp(library: &str) -> Result<[usize; 4], String> {
    let path = std::ffi::CString::new(library).map_err(|_| format!("library path {library:?} has a NUL byte"))?;
    // SAFETY: RTLD_NOLOAD loads nothing: it returns a new reference to an already loaded library,
    // or NULL; no initialiser runs.
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    if handle.is_null() {
        return Err(format!("{library} is not a library this process has loaded"));
    }
    let mut found = [0usize; 4];
    let names = [c"GOMP_parallel", c"omp_get_max_threads", c"omp_in_parallel", c"omp_get_thread_num"];
    for (slot, name) in found.iter_mut().zip(names) {
        // SAFETY: a live handle and a NUL-terminated name.
        *slot = unsafe { libc::dlsym(handle, name.as_ptr()) } as usize;
        if *slot == 0 {
            return Err(format!("{library} has no {}: not an OpenMP runtime", name.to_string_lossy()));
        }
    }
    Ok(found)
}

#[cfg(not(unix))]
fn loaded_openmp(library: &str) -> Result<[usize; 4], String> {
    Err(format!("sharing the OpenMP runtime of {library} is only supported on Unix"))
}

/// "openmp" or "rayon": where the kernels' parallel loops run.
#[pyfunction]
pub fn thread_pool() -> &'static str {
    par::pool()
}

#[pyfunction]
pub fn set_thread_pool(name: &str) -> PyResult<()> {
    par::set_pool(name).map_err(err)
}

/// How tensor arguments are read: "exchange" (DLPack's exchange API) or "capsule"
/// (`torch._C._to_dlpack`, the reader of older torch); `name` switches it, for the tests.
#[pyfunction(name = "_dlpack_reader")]
#[pyo3(signature = (name=None))]
pub fn dlpack_reader(py: Python<'_>, name: Option<&str>) -> PyResult<&'static str> {
    super::dlpack::reader(py, name)
}
