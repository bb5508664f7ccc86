//! The one argument validator of the pyo3 layer. Every tensor argument of every entry of
//! `_native` is a torch tensor object; it becomes a `HostTensor` here (`dlpack::read`), is held
//! to what the entry needs of it (`Want`: dtype, rank, layout), and the entry's tensors are
//! checked against each other (shapes, no output sharing a byte with another tensor) before
//! any kernel runs. A bad argument is a `TypeError` (not a tensor) or a `ValueError` that names
//! the argument, never undefined behaviour.

use std::fmt::Display;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyAny;

use super::dlpack::{self, Refusal};
use crate::core::host_tensor::HostTensor;
use crate::core::tensor::DType;

/// A `ValueError` with the crate's message.
pub fn err(e: impl Into<String>) -> PyErr {
    PyValueError::new_err(e.into())
}

/// The layout an entry needs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    Strided,
    /// Any strides, but the last dim steps by one element (the row kernels' vector loads).
    UnitLast,
    Contiguous,
}

/// What an entry needs of one tensor argument.
#[derive(Clone, Copy)]
pub struct Want {
    dtypes: &'static [DType],
    rank: Option<usize>,
    layout: Layout,
}

impl Want {
    pub const fn of(dtypes: &'static [DType]) -> Want {
        Want { dtypes, rank: None, layout: Layout::Strided }
    }
    pub const fn rank(self, rank: usize) -> Want {
        Want { rank: Some(rank), ..self }
    }
    pub const fn contiguous(self) -> Want {
        Want { layout: Layout::Contiguous, ..self }
    }
    pub const fn unit_last(self) -> Want {
        Want { layout: Layout::UnitLast, ..self }
    }

    fn check(&self, t: &HostTensor) -> Result<(), String> {
        if !self.dtypes.is_empty() && !self.dtypes.contains(&t.dtype) {
            let names: Vec<&str> = self.dtypes.iter().map(|d| d.name()).collect();
            return Err(format!("expected dtype {}, got {}", names.join(" or "), t.dtype.name()));
        }
        if let Some(rank) = self.rank.filter(|&r| r != t.rank()) {
            return Err(format!("expected {rank} dims, got sizes {:?}", t.sizes));
        }
        let ok = match self.layout {
            Layout::Strided => true,
            Layout::Contiguous => t.is_contiguous(),
            Layout::UnitLast => t.sizes.last().zip(t.strides.last()).is_none_or(|(&s, &st)| s <= 1 || st == 1),
        };
        if !ok {
            let how = if self.layout == Layout::Contiguous { "be contiguous" } else { "have a last stride of 1" };
            return Err(format!("must {how}, got sizes {:?} strides {:?}", t.sizes, t.strides));
        }
        Ok(())
    }
}

/// Any tensor the crate can read, of any dtype, rank and layout.
pub const ANY: Want = Want::of(&[]);

/// `obj` validated as a tensor that `want` describes; errors name it `what`.
pub fn tensor(obj: &Bound<'_, PyAny>, what: impl Display, want: Want) -> PyResult<HostTensor> {
    let t = dlpack::read(obj).map_err(|r| match r {
        Refusal::NotTensor(why) => PyTypeError::new_err(format!("{what}: {why}")),
        Refusal::Unreadable(why) => err(format!("{what}: {why}")),
    })?;
    want.check(&t).map_err(|why| err(format!("{what}: {why}")))?;
    Ok(t)
}

/// `tensor` of an optional argument.
pub fn optional(obj: Option<&Bound<'_, PyAny>>, what: impl Display, want: Want) -> PyResult<Option<HostTensor>> {
    obj.map(|o| tensor(o, what, want)).transpose()
}

/// Each tensor of a list or tuple, named `what[i]`.
pub fn tensors(list: &[Bound<'_, PyAny>], what: &str, want: Want) -> PyResult<Vec<HostTensor>> {
    list.iter().enumerate().map(|(i, o)| tensor(o, Indexed(what, i), want)).collect()
}

/// `what[i]` in messages, formatted only when one is raised.
#[derive(Clone, Copy)]
pub struct Indexed<'a>(pub &'a str, pub usize);

impl Display for Indexed<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}[{}]", self.0, self.1)
    }
}

/// Fails unless `got` (the sizes of `what`) is `want`.
pub fn shape(what: impl Display, got: &[usize], want: &[usize]) -> PyResult<()> {
    if got != want {
        return Err(err(format!("{what}: shape {got:?} differs from the {want:?} needed")));
    }
    Ok(())
}

/// Fails when the output `out` shares a byte with any of `others`.
pub fn disjoint(what: impl Display, out: &HostTensor, others: &[&HostTensor]) -> PyResult<()> {
    if others.iter().any(|t| out.overlaps(t)) {
        return Err(err(format!("{what} overlaps an input")));
    }
    Ok(())
}

/// Fails when any two of the named tensors share a byte (all of them are written).
pub fn all_disjoint<N: Display>(named: &[(&HostTensor, N)]) -> PyResult<()> {
    let mut spans: Vec<(usize, usize, usize)> =
        named.iter().enumerate().map(|(i, (t, _))| (t.span().0, t.span().1, i)).filter(|s| s.0 < s.1).collect();
    spans.sort_unstable();
    for w in spans.windows(2) {
        if w[1].0 < w[0].1 {
            return Err(err(format!("{} overlaps {}", named[w[1].2].1, named[w[0].2].1)));
        }
    }
    Ok(())
}

/// Fails unless `n` equals `expected` (tensor lists that go together).
pub fn count(what: &str, n: usize, expected: usize, of: &str) -> PyResult<()> {
    if n != expected {
        return Err(err(format!("{what}: {n} tensors for {expected} {of}")));
    }
    Ok(())
}

/// Fails unless every value is finite (hyper-parameters, scales).
pub fn finite(values: &[(f64, &str)]) -> PyResult<()> {
    match values.iter().find(|(v, _)| !v.is_finite()) {
        Some((v, name)) => Err(err(format!("{name} must be finite, got {v}"))),
        None => Ok(()),
    }
}

/// Raw pointers moved into a GIL-released closure.
pub struct SendPtrs<T>(pub T);
// SAFETY: the pointers come from validated `HostTensor`s whose owners (Python objects the
// entry holds) outlive the call; the kernels that use them split the memory between threads.
unsafe impl<T> Send for SendPtrs<T> {}
