//! Shared primitives every other module builds on. Nothing here imports the executor, a kernel
//! family, the LLM kernels or pyo3: tensor views and dtypes, the memory of one call, parallel
//! loops, runtime ISA detection, strided iteration, element access and the math helpers.

pub mod element;
pub mod fma_peak;
pub mod host_tensor;
pub mod isa;
#[cfg(target_arch = "x86_64")]
pub mod lanes;
pub mod math;
pub mod mem;
pub mod par;
pub mod strided;
pub mod tensor;
pub mod transpose;
