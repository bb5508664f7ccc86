//! Raw memory of one call: the base pointers of a plan's buffers (`Mem`) and a pointer that
//! crosses thread boundaries (`SPtr`). Kernels only see these and validated `View`s.

use crate::core::tensor::View;
use std::cell::RefCell;

/// A per-thread scratch buffer of floats that kernels keep between calls (a fresh allocation each
/// call would fault its pages in again).
pub type Scratch = std::thread::LocalKey<RefCell<Vec<f32>>>;

/// Runs `f` with `cell`'s vector grown to at least `n` floats (its first `n`), or with a fresh one
/// when the thread-local is already borrowed (a nested call on the same worker thread).
pub fn with_scratch<R>(cell: &'static Scratch, n: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    cell.with(|c| match c.try_borrow_mut() {
        Ok(mut v) => {
            if v.len() < n {
                v.resize(n, 0.0);
            }
            f(&mut v[..n])
        }
        Err(_) => f(&mut vec![0.0; n]),
    })
}

#[derive(Clone, Copy)]
pub struct SPtr<T>(pub *mut T);
// SAFETY: kernels partition the memory they write between threads; the executor validated
// that every view lies inside its buffer.
unsafe impl<T> Send for SPtr<T> {}
unsafe impl<T> Sync for SPtr<T> {}

impl<T> SPtr<T> {
    /// The raw pointer (a method, so closures capture the Send wrapper and not the field).
    #[inline(always)]
    pub fn get(self) -> *mut T {
        self.0
    }
    /// # Safety
    /// As `pointer::add`.
    #[inline(always)]
    pub unsafe fn add(self, i: usize) -> *mut T {
        self.0.add(i)
    }
}

/// Base pointers of the buffers of one call.
pub struct Mem {
    pub ptrs: Vec<*mut u8>,
}

impl Mem {
    /// # Safety
    /// `v` must have been validated against the buffer it names.
    pub unsafe fn byte_ptr(&self, v: &View) -> *mut u8 {
        self.ptrs[v.buf].add(v.offset * v.dtype.size())
    }
    /// # Safety
    /// As `byte_ptr`, and `T` must be the view's element type.
    pub unsafe fn ptr<T>(&self, v: &View) -> SPtr<T> {
        SPtr(self.byte_ptr(v) as *mut T)
    }
}
