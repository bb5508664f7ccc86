//! The step schema: the steps Python's lowering writes (`tb_cpu_rust/lowering/steps.py`). A step
//! is an envelope (`op`, `ins`, `outs`) around named parameters; the kernel family that handles
//! `op` declares the kind (`kernels::registry::StepDef`, listed in `kernels::FAMILIES`) and reads
//! its parameters by name when it builds the step, once, when a plan is prepared: an unknown
//! kind, a missing field, a field of the wrong type or an unknown one is an error naming it, and
//! a plan written for another `SCHEMA_VERSION` is refused before any step is read.

use crate::core::tensor::{Result, View};
use crate::kernels::registry::{Args, StepDef, StepKernel};
use serde::Deserialize;
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::sync::OnceLock;

/// Bumped whenever a step kind gains, loses or renames a field, or the plan's envelope changes
/// meaning (Python's `steps.SCHEMA_VERSION` is this value, read from the native module). 3: an
/// output buffer's `sizes` / `strides` are the layout its tensor must have. 4: `conv2d` takes a
/// residual and a folded batch norm's operands, and `epilogue` / `eps` parameters. 5: `conv2d`
/// takes `pool` (2: its result max-pooled 2×2 stride 2). 6: `conv2d` and `sdpa` take `bf16`
/// (bfloat16 products allowed).
pub const SCHEMA_VERSION: u32 = 6;

/// One step of a plan: its operands and results (value ids), what it computes (`op`) and the
/// named parameters of that kind.
#[derive(Deserialize)]
pub struct StepSpec {
    #[serde(default)]
    pub ins: Vec<Option<usize>>,
    #[serde(default)]
    pub outs: Vec<usize>,
    pub op: String,
    #[serde(flatten)]
    pub params: Map<String, Value>,
}

/// Every step kind by tag, from the families' declarations (built once).
fn registry() -> &'static HashMap<&'static str, &'static StepDef> {
    static REGISTRY: OnceLock<HashMap<&'static str, &'static StepDef>> = OnceLock::new();
    REGISTRY.get_or_init(|| crate::kernels::FAMILIES.iter().flat_map(|f| f.iter()).map(|d| (d.tag, d)).collect())
}

/// Every step kind's tag, sorted.
pub fn step_kinds() -> Vec<&'static str> {
    let mut tags: Vec<&'static str> = registry().keys().copied().collect();
    tags.sort_unstable();
    tags
}

/// Builds the kernel of one step over its (already resolved) operand and result views; returns
/// it with its kind's tag.
pub fn build(spec: &StepSpec, ins: Vec<Option<View>>, outs: Vec<View>) -> Result<(&'static str, Box<dyn StepKernel>)> {
    let def = registry().get(spec.op.as_str()).ok_or_else(|| format!("bad plan spec: unknown step kind {:?}", spec.op))?;
    let op = def.tag;
    // only the kernels declared `any` read or write the storage-only dtypes (float64, int32, ...)
    if !def.any_dtype && ins.iter().flatten().chain(&outs).any(|v| !v.dtype.is_core()) {
        return Err(format!("kernel {op} takes float32, int64 and bool only"));
    }
    (def.build)(&Args::new(op, ins, outs, &spec.params)).map(|k| (op, k))
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

    /// Builds a parsed step over float32 vectors of 4 (enough to reach the parameter checks).
    fn build_text(text: &str) -> std::result::Result<(), String> {
        let s = parse(text)?;
        let v = |i: usize| View::contiguous(i, &[4], crate::core::tensor::DType::F32);
        let ins = s.ins.iter().map(|i| i.map(v)).collect();
        let outs = s.outs.iter().map(|&i| v(i)).collect();
        build(&s, ins, outs).map(|_| ())
    }

    #[test]
    fn the_envelope_keeps_the_named_parameters_for_the_family() {
        let s = parse(r#"{"op": "conv2d", "ins": [0, 1, null], "outs": [2], "stride": [1, 2], "padding": [0, 1], "dilation": [1, 1], "groups": 3}"#).unwrap();
        assert_eq!(s.op, "conv2d");
        assert_eq!(s.ins, vec![Some(0), Some(1), None]);
        assert_eq!(s.params.len(), 4);
        assert_eq!(s.params["groups"], 3);
    }

    #[test]
    fn a_missing_mistyped_or_unknown_field_or_an_unknown_kind_is_an_error() {
        let missing = build_text(r#"{"op": "gather", "ins": [0, 1], "outs": [2]}"#).err().unwrap();
        assert!(missing.contains("gather") && missing.contains("missing field `dim`"), "{missing}");
        let mistyped = build_text(r#"{"op": "gather", "ins": [0, 1], "outs": [2], "dim": "one"}"#).err().unwrap();
        assert!(mistyped.contains("invalid type"), "{mistyped}");
        let unknown = build_text(r#"{"op": "softmax", "ins": [0], "outs": [1], "dim": 0, "dims": 1}"#).err().unwrap();
        assert!(unknown.contains("unknown field `dims`"), "{unknown}");
        let unknown = build_text(r#"{"op": "qr", "ins": [0], "outs": [1, 2], "mode": 0, "pivot": true}"#).err().unwrap();
        assert!(unknown.contains("unknown field `pivot`"), "{unknown}");
        let missing = build_text(r#"{"op": "svd", "ins": [0], "outs": [1, 2, 3], "compute_uv": true}"#).err().unwrap();
        assert!(missing.contains("missing field `full_matrices`"), "{missing}");
        let none = build_text(r#"{"op": "cast", "ins": [0], "outs": [1], "dim": 0}"#).err().unwrap();
        assert!(none.contains("unknown field `dim`"), "{none}");
        let kind = build_text(r#"{"op": "launch_rockets", "ins": [], "outs": []}"#).err().unwrap();
        assert!(kind.contains("launch_rockets"), "{kind}");
    }

    #[test]
    fn another_schema_version_is_refused() {
        assert!(check_version(r#"{"buffers": [], "values": [], "steps": []}"#).is_ok());
        let e = check_version(r#"{"schema": 1, "buffers": [], "values": [], "steps": []}"#).err().unwrap();
        assert!(e.contains("schema 1") && e.contains(&SCHEMA_VERSION.to_string()), "{e}");
    }

    #[test]
    fn every_kind_is_declared_by_one_family() {
        let declared: usize = crate::kernels::FAMILIES.iter().map(|f| f.len()).sum();
        assert_eq!(step_kinds().len(), declared, "a tag is declared twice");
        assert!(step_kinds().contains(&"ew") && step_kinds().contains(&"gemm"));
    }
}
