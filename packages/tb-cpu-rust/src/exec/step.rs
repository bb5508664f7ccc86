//! The step schema: the steps Python's lowering writes (`tb_cpu_rust/lowering/steps.py`), one
//! tagged variant per step kind with named fields. A plan is parsed into these once, at the
//! boundary: an unknown kind, a missing field or a field of the wrong type is an error naming it,
//! and a plan written for another `SCHEMA_VERSION` is refused before any field is read.
//!
//! `steps!` declares each kind once: its tag, its named fields and their kinds. From that one
//! list come the serde enum, the tag of a parsed step, the list of every tag (`STEP_KINDS`, which
//! Python's schema is tested against) and the parameter lists the kernel constructors read.

use crate::core::tensor::Result;
use crate::kernels::elementwise::InstrSpec;
use serde::Deserialize;

/// Bumped whenever a step kind gains, loses or renames a field (Python's `steps.SCHEMA_VERSION`
/// is this value, read from the native module).
pub const SCHEMA_VERSION: u32 = 2;

/// One step of a plan: its operands and results (value ids) and what it computes.
#[derive(Deserialize)]
pub struct StepSpec {
    #[serde(default)]
    pub ins: Vec<Option<usize>>,
    #[serde(default)]
    pub outs: Vec<usize>,
    #[serde(flatten)]
    pub kind: StepKind,
}

macro_rules! field_type {
    (int) => { i64 };
    (bool) => { bool };
    (float) => { f64 };
    (ints) => { Vec<i64> };
    (floats) => { Vec<f64> };
    (strs) => { Vec<String> };
    (str) => { String };
    (prog) => { Vec<InstrSpec> };
}

macro_rules! push_param {
    (int, $v:ident, $ints:ident, $floats:ident) => { $ints.push(*$v) };
    (bool, $v:ident, $ints:ident, $floats:ident) => { $ints.push(i64::from(*$v)) };
    (float, $v:ident, $ints:ident, $floats:ident) => { $floats.push(*$v) };
    (ints, $v:ident, $ints:ident, $floats:ident) => { $ints.extend_from_slice($v) };
    (floats, $v:ident, $ints:ident, $floats:ident) => { $floats.extend_from_slice($v) };
    ($other:ident, $v:ident, $ints:ident, $floats:ident) => { let _ = $v; };
}

macro_rules! steps {
    ($($variant:ident $tag:literal { $($field:ident : $kind:ident),* $(,)? })*) => {
        /// What a step computes, by kind (the `op` tag), with its parameters by name.
        #[derive(Deserialize)]
        #[serde(tag = "op")]
        pub enum StepKind {
            $(#[serde(rename = $tag)] $variant { $($field: field_type!($kind)),* },)*
        }

        /// Every step kind's tag.
        pub const STEP_KINDS: &[&str] = &[$($tag),*];

        impl StepKind {
            pub fn tag(&self) -> &'static str {
                match self {
                    $(StepKind::$variant { .. } => $tag,)*
                }
            }

            /// The integer and float parameters in declaration order: the layout the kernel
            /// constructors read (booleans as 0 / 1).
            pub fn params(&self) -> (Vec<i64>, Vec<f64>) {
                let (mut ints, mut floats): (Vec<i64>, Vec<f64>) = (Vec::new(), Vec::new());
                match self {
                    $(StepKind::$variant { $($field),* } => { $(push_param!($kind, $field, ints, floats);)* })*
                }
                (ints, floats)
            }
        }
    };
}

steps! {
    Ew "ew" { compute: str, prog: prog }
    Cast "cast" {}
    // mode 0: value, 1: integer (exact for any int64), 2..4: NaN, +inf, -inf
    Fill "fill" { mode: int, integer: int, value: float }
    Arange "arange" { start: float, step: float }
    Gemm "gemm" { alpha: float, beta: float, epilogue: strs }
    Reduce "reduce" { kind: int, mask: ints, correction: float }
    Cumsum "cumsum" { dim: int }
    Scan "scan" { dim: int, mode: int }
    Cummax "cummax" { dim: int }
    Cummin "cummin" { dim: int }
    Sort "sort" { dim: int, descending: bool }
    MedianDim "median_dim" { dim: int }
    NanmedianDim "nanmedian_dim" { dim: int }
    Mode "mode" { dim: int }
    Softmax "softmax" { dim: int }
    LogSoftmax "log_softmax" { dim: int }
    SoftmaxBwd "softmax_bwd" { dim: int }
    LogSoftmaxBwd "log_softmax_bwd" { dim: int }
    LayerNorm "layer_norm" { n: int, eps: float }
    RmsNorm "rms_norm" { n: int, eps: float }
    Sdpa "sdpa" { causal: bool, scale: float }
    NllLoss "nll_loss" { reduction: int, ignore_index: int }
    NllLossBwd "nll_loss_bwd" { reduction: int, ignore_index: int }
    Embedding "embedding" {}
    Index "index" {}
    Gather "gather" { dim: int }
    IndexSelect "index_select" { dim: int }
    Scatter "scatter" { dim: int, how: int, include_self: bool }
    IndexPut "index_put" { accumulate: bool }
    MaskedScatter "masked_scatter" {}
    NonzeroStatic "nonzero_static" { fill_value: int }
    EmbeddingBag "embedding_bag" { mode: int, include_last_offset: bool, padding_idx: int }
    SegmentReduce "segment_reduce" { reduction: int, offsets: bool, has_initial: bool, initial: float }
    Searchsorted "searchsorted" { right: bool }
    Histc "histc" { min: float, max: float }
    Frexp "frexp" {}
    Cdist "cdist" { p: float }
    Pdist "pdist" { p: float }
    Dist "dist" { p: float }
    Conv2d "conv2d" { stride: ints, padding: ints, dilation: ints, groups: int }
    ConvTranspose2d "conv_transpose2d" { stride: ints, padding: ints, dilation: ints, groups: int, output_padding: ints }
    Conv3d "conv3d" { stride: ints, padding: ints, dilation: ints, groups: int }
    MaxPool2d "max_pool2d" { kernel: ints, stride: ints, padding: ints, dilation: ints }
    MaxPool3d "max_pool3d" { kernel: ints, stride: ints, padding: ints, dilation: ints }
    AvgPool2d "avg_pool2d" { kernel: ints, stride: ints, padding: ints, count_include_pad: bool, divisor: int }
    AvgPool3d "avg_pool3d" { kernel: ints, stride: ints, padding: ints, count_include_pad: bool, divisor: int }
    AdaptiveAvgPool2d "adaptive_avg_pool2d" {}
    AdaptiveMaxPool2d "adaptive_max_pool2d" {}
    AdaptiveAvgPool3d "adaptive_avg_pool3d" {}
    AdaptiveMaxPool3d "adaptive_max_pool3d" {}
    MaxPool2dBwd "max_pool2d_bwd" {}
    UpsampleLinear "upsample_linear" { align_corners: bool, scales: floats }
    UpsampleCubic "upsample_cubic" { align_corners: bool, scales: floats }
    GridSampler2d "grid_sampler_2d" { align_corners: bool, interpolation: int, padding: int }
    GridSampler3d "grid_sampler_3d" { align_corners: bool, interpolation: int, padding: int }
    LuFactor "lu_factor" { check: bool }
    Lu "lu" {}
    LuUnpack "lu_unpack" { unpack_data: bool, unpack_pivots: bool }
    LuSolve "lu_solve" { adjoint: bool }
    Det "det" {}
    Slogdet "slogdet" {}
    Cholesky "cholesky" { check: bool }
    TriSolve "tri_solve" { upper: bool, unitriangular: bool }
    CheckInfo "check_info" {}
    Geqrf "geqrf" {}
    Orgqr "orgqr" {}
    Ormqr "ormqr" { left: bool, transpose: bool }
    Qr "qr" { mode: int }
    Svd "svd" { full_matrices: bool, compute_uv: bool }
    Eigh "eigh" { upper: bool, compute_v: bool }
    Pinv "pinv" { hermitian: bool }
    LinalgPolar "linalg_polar" {}
    Sqrth "sqrth" {}
    MatrixExp "matrix_exp" {}
    Complex "complex" {}
    Polar "polar" {}
    Conj "conj" {}
    Angle "angle" {}
    Imag "imag" {}
    FftR2c "fft_r2c" { norm: int, flag: int, dims: ints }
    FftC2c "fft_c2c" { norm: int, flag: int, dims: ints }
    FftC2r "fft_c2r" { norm: int, flag: int, dims: ints }
    Softmax64 "softmax64" { dim: int }
    LogSoftmax64 "log_softmax64" { dim: int }
    Ew64 "ew64" { code: int, kinds: ints, scalars: floats }
    Ireduce "ireduce" { kind: int }
}

fn current() -> u32 {
    SCHEMA_VERSION
}

/// The version field of a plan: absent means this build's schema.
#[derive(Deserialize)]
pub struct Schema {
    #[serde(default = "current")]
    pub schema: u32,
}

/// Refuses a plan written for another step schema.
pub fn check_version(text: &str) -> Result<()> {
    let s: Schema = serde_json::from_str(text).map_err(|e| format!("bad plan spec: {e}"))?;
    if s.schema != SCHEMA_VERSION {
        return Err(format!(
            "plan spec uses step schema {} but this tb_cpu_rust executor reads schema {SCHEMA_VERSION}: \
             install matching tb-cpu-rust Python and native parts",
            s.schema
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> std::result::Result<StepSpec, String> {
        serde_json::from_str(text).map_err(|e| e.to_string())
    }

    #[test]
    fn named_fields_become_the_constructor_parameters() {
        let s = parse(r#"{"op": "conv2d", "ins": [0, 1, null], "outs": [2], "stride": [1, 2], "padding": [0, 1], "dilation": [1, 1], "groups": 3}"#).unwrap();
        assert_eq!(s.kind.tag(), "conv2d");
        assert_eq!(s.ins, vec![Some(0), Some(1), None]);
        assert_eq!(s.kind.params(), (vec![1, 2, 0, 1, 1, 1, 3], vec![]));
        let s = parse(r#"{"op": "sdpa", "ins": [0, 1, 2, null], "outs": [3, 4], "causal": true, "scale": 0.5}"#).unwrap();
        assert_eq!(s.kind.params(), (vec![1], vec![0.5]));
    }

    #[test]
    fn a_missing_or_mistyped_field_or_an_unknown_kind_is_an_error() {
        let missing = parse(r#"{"op": "gather", "ins": [0, 1], "outs": [2]}"#).err().unwrap();
        assert!(missing.contains("dim"), "{missing}");
        let mistyped = parse(r#"{"op": "gather", "ins": [0, 1], "outs": [2], "dim": "one"}"#).err().unwrap();
        assert!(mistyped.contains("invalid type"), "{mistyped}");
        let unknown = parse(r#"{"op": "launch_rockets", "ins": [], "outs": []}"#).err().unwrap();
        assert!(unknown.contains("launch_rockets"), "{unknown}");
    }

    #[test]
    fn another_schema_version_is_refused() {
        assert!(check_version(r#"{"buffers": [], "values": [], "steps": []}"#).is_ok());
        let e = check_version(r#"{"schema": 1, "buffers": [], "values": [], "steps": []}"#).err().unwrap();
        assert!(e.contains("schema 1") && e.contains(&SCHEMA_VERSION.to_string()), "{e}");
    }

    #[test]
    fn every_kind_has_one_tag() {
        let mut tags = STEP_KINDS.to_vec();
        tags.sort_unstable();
        tags.dedup();
        assert_eq!(tags.len(), STEP_KINDS.len());
    }
}
