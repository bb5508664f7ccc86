//! A tensor that a caller outside the crate owns, validated once: base address, dtype, sizes and
//! strides whose element and byte extents fit in memory, a non-null aligned address wherever a
//! byte is addressed. Everything that enters the crate from Python becomes a `HostTensor` in
//! `py::args` before any kernel sees it; the executor binds its buffers to them, the LLM and
//! optimizer kernels take slices of them.

use super::tensor::{DType, Result};

/// More dims than any PyTorch tensor has: anything above is a corrupt descriptor.
pub const MAX_RANK: usize = 64;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostTensor {
    /// Address of element 0 (the producer's data pointer plus its byte offset).
    pub ptr: usize,
    pub dtype: DType,
    pub sizes: Vec<usize>,
    pub strides: Vec<usize>,
    numel: usize,
    /// Elements from element 0 to one past the furthest one: 0 when empty.
    extent: usize,
}

impl HostTensor {
    /// Validates a descriptor as a producer reports it (signed sizes and strides, a base address
    /// and a byte offset from it). `strides: None` means compact row-major, as DLPack allows.
    pub fn new(data: usize, byte_offset: u64, dtype: DType, sizes: &[i64], strides: Option<&[i64]>) -> Result<HostTensor> {
        let rank = sizes.len();
        if rank > MAX_RANK {
            return Err(format!("{rank} dims (at most {MAX_RANK})"));
        }
        let sizes = non_negative(sizes, "sizes")?;
        let strides = match strides {
            Some(st) if st.len() != rank => return Err(format!("{rank} sizes but {} strides", st.len())),
            Some(st) => non_negative(st, "strides")?,
            None => super::tensor::contiguous_strides(&sizes),
        };
        let numel = super::tensor::numel(&sizes)?;
        let extent = super::tensor::extent(&sizes, &strides).map_err(|_| format!("sizes {sizes:?} with strides {strides:?} overflow"))?;
        let bytes = extent
            .checked_mul(dtype.size())
            .filter(|&b| b <= isize::MAX as usize)
            .ok_or_else(|| format!("sizes {sizes:?} with strides {strides:?} span more bytes than memory has"))?;
        let offset = usize::try_from(byte_offset).map_err(|_| format!("byte offset {byte_offset} overflows"))?;
        let ptr = data.checked_add(offset).ok_or_else(|| format!("byte offset {byte_offset} overflows the address"))?;
        if bytes > 0 {
            if ptr == 0 {
                return Err("null data pointer".into());
            }
            if !ptr.is_multiple_of(dtype.size()) {
                return Err(format!("data pointer {ptr:#x} is not aligned to its {}-byte {} elements", dtype.size(), dtype.name()));
            }
            if ptr.checked_add(bytes).is_none() {
                return Err("data pointer plus extent overflows the address space".into());
            }
        }
        Ok(HostTensor { ptr, dtype, sizes, strides, numel, extent })
    }

    pub fn rank(&self) -> usize {
        self.sizes.len()
    }

    pub fn numel(&self) -> usize {
        self.numel
    }

    /// Elements spanned from element 0 to one past the furthest (0 when empty).
    pub fn extent(&self) -> usize {
        self.extent
    }

    /// The bytes the tensor can touch: `[ptr, ptr + extent * itemsize)`.
    pub fn span(&self) -> (usize, usize) {
        (self.ptr, self.ptr + self.extent * self.dtype.size())
    }

    /// Whether any byte of `self` may be a byte of `other` (empty tensors overlap nothing).
    pub fn overlaps(&self, other: &HostTensor) -> bool {
        let ((a0, a1), (b0, b1)) = (self.span(), other.span());
        a0 < a1 && b0 < b1 && a0 < b1 && b0 < a1
    }

    /// Row-major with no gaps (a dim of size 1, or any dim of an empty tensor, may carry any
    /// stride: no index ever moves along it).
    pub fn is_contiguous(&self) -> bool {
        if self.numel == 0 {
            return true;
        }
        let mut expected = 1usize;
        for (&s, &st) in self.sizes.iter().zip(&self.strides).rev() {
            if s != 1 && st != expected {
                return false;
            }
            expected *= s;
        }
        true
    }

    /// The elements of a contiguous tensor.
    ///
    /// # Safety
    /// The descriptor still describes live memory (the owner keeps it for the call), `E` has the
    /// dtype's size, and no one writes the memory while the slice lives.
    pub unsafe fn slice<'a, E>(&self) -> &'a [E] {
        debug_assert!(self.is_contiguous() && std::mem::size_of::<E>() == self.dtype.size());
        if self.numel == 0 {
            return &[];
        }
        std::slice::from_raw_parts(self.ptr as *const E, self.numel)
    }

    /// As `slice`, writable.
    ///
    /// # Safety
    /// As `slice`, and nothing else reads or writes the memory while the slice lives.
    pub unsafe fn slice_mut<'a, E>(&self) -> &'a mut [E] {
        debug_assert!(self.is_contiguous() && std::mem::size_of::<E>() == self.dtype.size());
        if self.numel == 0 {
            return &mut [];
        }
        std::slice::from_raw_parts_mut(self.ptr as *mut E, self.numel)
    }

    /// The bytes of a contiguous tensor, writable.
    ///
    /// # Safety
    /// As `slice_mut`.
    pub unsafe fn bytes_mut<'a>(&self) -> &'a mut [u8] {
        debug_assert!(self.is_contiguous());
        if self.numel == 0 {
            return &mut [];
        }
        std::slice::from_raw_parts_mut(self.ptr as *mut u8, self.numel * self.dtype.size())
    }
}

fn non_negative(values: &[i64], what: &str) -> Result<Vec<usize>> {
    values.iter().map(|&v| usize::try_from(v).map_err(|_| format!("{what} must be non-negative, got {values:?}"))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32(ptr: usize, sizes: &[i64], strides: &[i64]) -> Result<HostTensor> {
        HostTensor::new(ptr, 0, DType::F32, sizes, Some(strides))
    }

    #[test]
    fn accepts_what_torch_makes() {
        let t = f32(64, &[2, 3], &[3, 1]).unwrap();
        assert_eq!((t.numel(), t.extent(), t.span()), (6, 6, (64, 88)));
        assert!(t.is_contiguous());
        let t = f32(64, &[3, 2], &[1, 3]).unwrap();
        assert!(!t.is_contiguous());
        // expanded (stride 0), 0-d, empty with a null pointer, size-1 dims with any stride
        assert_eq!(f32(64, &[4, 3], &[0, 1]).unwrap().extent(), 3);
        assert_eq!(f32(64, &[], &[]).unwrap().extent(), 1);
        assert_eq!(f32(0, &[0, 5], &[5, 1]).unwrap().span(), (0, 0));
        assert!(f32(64, &[1, 4], &[99, 1]).unwrap().is_contiguous());
        assert!(f32(64, &[3, 0, 5], &[5, 5, 1]).unwrap().is_contiguous());
        let t = HostTensor::new(64, 8, DType::I64, &[2, 2], None).unwrap();
        assert_eq!((t.ptr, t.strides.clone()), (72, vec![2, 1]));
    }

    #[test]
    fn rejects_bad_descriptors() {
        let bad: [(&[i64], &[i64], usize); 9] = [
            (&[-1], &[1], 64),                 // negative size
            (&[2], &[-1], 64),                 // negative stride
            (&[2, 2], &[1], 64),               // rank mismatch
            (&[i64::MAX, i64::MAX], &[1, 1], 64), // numel overflow
            (&[2, i64::MAX], &[i64::MAX, 1], 64), // extent overflow
            (&[1 << 62], &[1], 64),            // more bytes than memory
            (&[4], &[1], 0),                   // null
            (&[4], &[1], 66),                  // misaligned
            (&[4], &[1], usize::MAX - 3),      // wraps the address space
        ];
        for (sizes, strides, ptr) in bad {
            assert!(f32(ptr, sizes, strides).is_err(), "{sizes:?} {strides:?} {ptr:#x}");
        }
        assert!(HostTensor::new(64, 0, DType::F32, &[1; MAX_RANK + 1], None).is_err());
        assert!(HostTensor::new(64, u64::MAX, DType::U8, &[1], None).is_err());
    }

    #[test]
    fn overlap_is_by_byte_span() {
        let a = f32(64, &[4], &[1]).unwrap();
        assert!(a.overlaps(&f32(76, &[4], &[1]).unwrap()));
        assert!(!a.overlaps(&f32(80, &[4], &[1]).unwrap()));
        assert!(!a.overlaps(&f32(64, &[0], &[1]).unwrap()));
    }
}
