//! Kernel families. Each family imports `core` (and, without cycles, the families it builds on:
//! convolution and attention run GEMMs); none imports the executor, which imports them.

pub mod attention;
pub mod cast;
pub mod complex;
pub mod conv;
pub mod elementwise;
pub mod gemm;
pub mod indexing;
pub mod linalg;
pub mod optim;
pub mod reduce;
pub mod wide_math;
