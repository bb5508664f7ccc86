//! Math helpers shared by kernels: scalar special functions, the unary op vocabulary, and the
//! SIMD versions of the transcendental functions.

pub mod igamma;
pub mod scalar;
pub mod unary;
pub mod vector;
pub mod vector_trig;
