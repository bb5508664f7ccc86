//! What a kernel family declares for each step kind it handles (`StepDef`: the tag, whether the
//! kernel takes the storage-only dtypes, and the builder), and what a builder gets (`Args`: the
//! step's operands, results and named parameters) and returns (a `StepKernel`).
//!
//! A builder reads its parameters by name into a `#[serde(deny_unknown_fields)]` struct (or a
//! family's `#[serde(tag = "op")]` enum), checks every shape relation its run relies on, and
//! returns the run as a closure over the validated views: the executor calls it once per step
//! and call (one virtual call, no allocation). Nothing here imports the executor.

use crate::core::mem::Mem;
use crate::core::tensor::{need, DType, Result, View};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

/// A built step. `run` may only be called with the memory of a call the executor bound (every
/// view the builder validated lies inside its buffer there).
pub trait StepKernel: Send + Sync {
    fn run(&self, mem: &Mem) -> Result<()>;
}

impl<F: Fn(&Mem) -> Result<()> + Send + Sync> StepKernel for F {
    #[inline]
    fn run(&self, mem: &Mem) -> Result<()> {
        self(mem)
    }
}

/// What a builder returns.
pub type Built = Result<Box<dyn StepKernel>>;

/// A step whose run is `f` (a closure over the views and parameters the builder validated).
pub fn kernel(f: impl Fn(&Mem) -> Result<()> + Send + Sync + 'static) -> Built {
    Ok(Box::new(f))
}

/// A step whose run cannot fail.
pub fn infallible(f: impl Fn(&Mem) + Send + Sync + 'static) -> Built {
    kernel(move |mem| {
        f(mem);
        Ok(())
    })
}

/// A step kind's parameters: a struct of named fields read from the step's JSON, where a
/// missing, mistyped or unknown field is an error (`step_params!(struct P { dim: i64 });`).
#[macro_export]
macro_rules! step_params {
    ($(#[$m:meta])* $vis:vis struct $name:ident { $($fvis:vis $field:ident : $ty:ty),* $(,)? }) => {
        $(#[$m])*
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        $vis struct $name { $($fvis $field: $ty),* }
    };
}

/// One step kind of a family: its tag (the `op` of the step's JSON), whether its kernel reads or
/// writes the storage-only dtypes (float64, int32, complex, ...: the builder checks them; every
/// other kernel gets float32, int64 and bool operands only, checked before it is built) and its
/// builder.
pub struct StepDef {
    pub tag: &'static str,
    pub any_dtype: bool,
    pub build: fn(&Args) -> Built,
}

impl StepDef {
    /// A kernel over float32, int64 and bool operands.
    pub const fn core(tag: &'static str, build: fn(&Args) -> Built) -> StepDef {
        StepDef { tag, any_dtype: false, build }
    }

    /// A kernel whose builder checks the dtypes itself (it takes storage-only ones).
    pub const fn any(tag: &'static str, build: fn(&Args) -> Built) -> StepDef {
        StepDef { tag, any_dtype: true, build }
    }
}

/// The operands, results and parameters of one step, as its builder sees them.
pub struct Args<'a> {
    pub op: &'static str,
    pub ins: Vec<Option<View>>,
    pub outs: Vec<View>,
    /// the step's JSON object less `op`, `ins` and `outs`
    params: &'a Map<String, Value>,
}

step_params!(
    /// The parameters of a step kind that takes none.
    pub struct NoParams {}
);

impl<'a> Args<'a> {
    pub fn new(op: &'static str, ins: Vec<Option<View>>, outs: Vec<View>, params: &'a Map<String, Value>) -> Args<'a> {
        Args { op, ins, outs, params }
    }

    /// The named parameters, as `T` (a struct of the step's fields): a missing, mistyped or
    /// unknown field is an error naming the step and the field.
    pub fn params<T: DeserializeOwned>(&self) -> Result<T> {
        T::deserialize(Value::Object(self.params.clone())).map_err(|e| format!("step {}: {e}", self.op))
    }

    /// The named parameters as a family's `#[serde(tag = "op")]` enum (one variant per kind).
    pub fn tagged<T: DeserializeOwned>(&self) -> Result<T> {
        let mut obj = self.params.clone();
        obj.insert("op".into(), Value::String(self.op.into()));
        T::deserialize(Value::Object(obj)).map_err(|e| format!("step {}: {e}", self.op))
    }

    /// Checks that the step has no parameters.
    pub fn no_params(&self) -> Result<()> {
        self.params::<NoParams>().map(|_| ())
    }

    /// Operand `i` (an error when absent).
    pub fn take(&self, i: usize) -> Result<View> {
        self.ins.get(i).cloned().flatten().ok_or_else(|| format!("{}: missing operand {i}", self.op))
    }

    /// Operand `i`, which the step may leave out.
    pub fn opt(&self, i: usize) -> Option<View> {
        self.ins.get(i).cloned().flatten()
    }

    /// Result `i`.
    pub fn out(&self, i: usize) -> Result<View> {
        self.outs.get(i).cloned().ok_or_else(|| format!("{}: missing output {i}", self.op))
    }
}

pub fn f32s(vs: &[&View]) -> Result<()> {
    need(vs.iter().all(|v| v.dtype == DType::F32), "operand is not float32")
}

pub fn uint(v: i64, what: &str) -> Result<usize> {
    usize::try_from(v).map_err(|_| format!("{what} must be non-negative"))
}

/// `N` non-negative sizes (a window's kernel, stride, padding or dilation per spatial dim).
pub fn uints<const N: usize>(v: &[i64], what: &str) -> Result<[usize; N]> {
    need(v.len() == N, &format!("{what} needs {N} entries"))?;
    let mut out = [0usize; N];
    for (o, &x) in out.iter_mut().zip(v) {
        *o = uint(x, what)?;
    }
    Ok(out)
}

/// A dimension of a tensor of rank `rank` (negative: from the end; a 0-d tensor has dim 0).
pub fn dim(d: i64, rank: usize) -> Result<usize> {
    let r = rank as i64;
    let d = if d < 0 { d + r } else { d };
    need(d >= 0 && d < r.max(1), "dimension out of range")?;
    Ok(d as usize)
}

step_params!(
    /// The `dim` parameter of the many kinds that take only that.
    pub struct DimParam { pub dim: i64 }
);
