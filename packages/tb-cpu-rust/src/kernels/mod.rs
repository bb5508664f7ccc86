//! Kernel families. Each family imports `core` (and, without cycles, the families it builds on:
//! convolution and attention run GEMMs); none imports the executor, which imports them.
//!
//! Each family declares the step kinds it builds and runs in one place, its `STEPS` list
//! (`registry::StepDef`: tag, dtypes, builder); `FAMILIES` lists the families. Adding an op to a
//! family touches only that family's file; adding a family, that file and this list.

pub mod attention;
#[cfg(target_arch = "x86_64")]
mod attention_pairs;
#[cfg(target_arch = "x86_64")]
mod attention_small;
pub mod cast;
pub mod complex;
pub mod conv;
pub mod elementwise;
pub mod gemm;
pub mod indexing;
pub mod linalg;
pub mod loss;
pub mod optim;
pub mod reduce;
pub mod registry;
pub mod wide_math;

/// Every family's step kinds (the executor's tag -> builder map is built from this once).
pub const FAMILIES: &[&[registry::StepDef]] = &[
    elementwise::STEPS,
    cast::STEPS,
    gemm::STEPS,
    reduce::STEPS,
    reduce::softmax::STEPS,
    reduce::norm::STEPS,
    reduce::batch_norm::STEPS,
    loss::STEPS,
    attention::STEPS,
    indexing::STEPS,
    indexing::gather::STEPS,
    indexing::nonzero_static::STEPS,
    indexing::search::STEPS,
    indexing::select::STEPS,
    indexing::segment::STEPS,
    conv::STEPS,
    conv::upsample::STEPS,
    linalg::STEPS,
    linalg::decomp::STEPS,
    linalg::dist::STEPS,
    complex::STEPS,
    complex::fft::STEPS,
    wide_math::STEPS,
];
