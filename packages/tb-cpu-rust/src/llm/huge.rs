//! Weight buffers on transparent huge pages.
//!
//! A decode step streams every weight once per token, hundreds of MB, so the page size of the
//! weight memory shows in the bandwidth: with 4 KiB pages the TLB misses and the prefetchers'
//! stops at page boundaries cost several percent of a step. Linux backs a region with 2 MiB
//! pages when it is marked `MADV_HUGEPAGE` *before* its first touch. Allocating through malloc
//! does not guarantee that: once a process has freed large blocks (loading a checkpoint does),
//! glibc raises its mmap threshold and serves the next blocks of up to 32 MiB from heap memory
//! that was touched before, already on 4 KiB pages, and marking it then changes nothing until
//! khugepaged gets to it. Measured on the fp32 benchmark model: about half the weights ended on
//! 4 KiB pages, and forcing fresh mappings (`MALLOC_MMAP_THRESHOLD_`) made decode 3-8 % faster.
//!
//! `HugeBuf` therefore maps big buffers itself: anonymous, 2 MiB-aligned, marked before the first
//! touch. Small buffers, other systems, or a failed mapping fall back to a `Vec`.

use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// 2 MiB: the huge page size of x86-64 and of 4 KiB-granule aarch64 Linux.
const HUGE: usize = 2 << 20;
/// Buffers from this size on get their own mapping (smaller ones fit in few pages either way).
const MIN_MAPPED: usize = HUGE;

/// A fixed-length buffer of `T`, on huge pages where it is big enough (see the module comment).
pub struct HugeBuf<T: Copy> {
    inner: Inner<T>,
}

enum Inner<T> {
    Heap(Vec<T>),
    /// `base .. base + map_len`: the whole mapping; the elements start at the first 2 MiB
    /// boundary inside it.
    Mapped { data: NonNull<T>, len: usize, base: usize, map_len: usize },
}

// SAFETY: a HugeBuf owns its memory exclusively, like a Vec<T>.
unsafe impl<T: Copy + Send> Send for HugeBuf<T> {}
// SAFETY: shared access only reads, like &[T].
unsafe impl<T: Copy + Sync> Sync for HugeBuf<T> {}

#[cfg(target_os = "linux")]
mod sys {
    use std::ffi::c_void;
    extern "C" {
        pub fn mmap(addr: *mut c_void, len: usize, prot: i32, flags: i32, fd: i32, off: i64) -> *mut c_void;
        pub fn munmap(addr: *mut c_void, len: usize) -> i32;
        pub fn madvise(addr: *mut c_void, len: usize, advice: i32) -> i32;
    }
    pub const PROT_READ_WRITE: i32 = 0x1 | 0x2;
    /// MAP_PRIVATE | MAP_ANONYMOUS (the same values on x86-64 and aarch64)
    pub const MAP_PRIVATE_ANON: i32 = 0x02 | 0x20;
    pub const MADV_HUGEPAGE: i32 = 14;
}

impl<T: Copy> HugeBuf<T> {
    /// `n` copies of `fill`.
    pub fn filled(n: usize, fill: T) -> HugeBuf<T> {
        let bytes = n.checked_mul(std::mem::size_of::<T>()).expect("buffer size overflows usize");
        if bytes >= MIN_MAPPED {
            if let Some(b) = Self::mapped(n, bytes, fill) {
                return b;
            }
        }
        HugeBuf { inner: Inner::Heap(vec![fill; n]) }
    }

    /// Whether the buffer has its own (huge-page) mapping.
    pub fn is_mapped(&self) -> bool {
        matches!(self.inner, Inner::Mapped { .. })
    }

    #[cfg(target_os = "linux")]
    fn mapped(n: usize, bytes: usize, fill: T) -> Option<HugeBuf<T>> {
        let map_len = bytes.div_ceil(HUGE).checked_add(1)?.checked_mul(HUGE)?;
        // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
        let base = unsafe { sys::mmap(std::ptr::null_mut(), map_len, sys::PROT_READ_WRITE, sys::MAP_PRIVATE_ANON, -1, 0) };
        if base as isize == -1 || base.is_null() {
            return None;
        }
        let base = base as usize;
        let start = base.div_ceil(HUGE) * HUGE;
        // Only the whole huge pages of the data are marked: a marked partial last page would be
        // resident in full once touched (up to 2 MiB more per buffer; ~100 MB over a model's
        // weights), while its 4 KiB pages cost little.
        // SAFETY: start .. start + bytes lies inside the mapping (one spare huge page covers the
        // alignment); the advice only changes how the kernel backs it. A failure (THP disabled)
        // leaves 4 KiB pages, which is still correct.
        unsafe { sys::madvise(start as *mut std::ffi::c_void, bytes / HUGE * HUGE, sys::MADV_HUGEPAGE) };
        let data = NonNull::new(start as *mut T)?;
        // anonymous memory reads as zero bytes: only a non-zero fill needs writing (the first
        // write of each page then faults it in, on a huge page)
        // SAFETY: `fill` is a plain Copy value; its bytes are readable.
        let zero = unsafe { std::slice::from_raw_parts(&fill as *const T as *const u8, std::mem::size_of::<T>()) }.iter().all(|&b| b == 0);
        if !zero {
            // SAFETY: `data` is aligned to 2 MiB (so to T) and valid for `n` elements.
            let s = unsafe { std::slice::from_raw_parts_mut(data.as_ptr(), n) };
            s.fill(fill);
        }
        Some(HugeBuf { inner: Inner::Mapped { data, len: n, base, map_len } })
    }

    #[cfg(not(target_os = "linux"))]
    fn mapped(_n: usize, _bytes: usize, _fill: T) -> Option<HugeBuf<T>> {
        None
    }
}

impl<T: Copy> Deref for HugeBuf<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match &self.inner {
            Inner::Heap(v) => v,
            // SAFETY: `data` holds `len` initialised elements for the life of the mapping.
            Inner::Mapped { data, len, .. } => unsafe { std::slice::from_raw_parts(data.as_ptr(), *len) },
        }
    }
}

impl<T: Copy> DerefMut for HugeBuf<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match &mut self.inner {
            Inner::Heap(v) => v,
            // SAFETY: as in `deref`, and `&mut self` makes the access exclusive.
            Inner::Mapped { data, len, .. } => unsafe { std::slice::from_raw_parts_mut(data.as_ptr(), *len) },
        }
    }
}

impl<T: Copy> Drop for HugeBuf<T> {
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        if let Inner::Mapped { base, map_len, .. } = self.inner {
            // SAFETY: the mapping was made by `mapped` with this base and length and is unmapped
            // once; nothing borrows it past `self`.
            unsafe { sys::munmap(base as *mut std::ffi::c_void, map_len) };
        }
    }
}

/// Hands the free memory inside malloc's heap back to the system (glibc's `malloc_trim`);
/// returns whether any was released. Call once the weights are packed: loading frees many
/// temporaries of up to 32 MiB (a weight widened to f32, a quantizer's buffers), which glibc
/// keeps resident in its heap, and the packed weights no longer reuse that memory (they have
/// their own huge-page mappings), so without this an fp32 model stayed ~1.5x its weights in RSS.
pub fn release_free_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        extern "C" {
            fn malloc_trim(pad: usize) -> i32;
        }
        // SAFETY: malloc_trim only returns free pages of the heap to the kernel.
        unsafe { malloc_trim(0) != 0 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

impl<T: Copy + PartialEq> PartialEq for HugeBuf<T> {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_buffers_stay_on_the_heap_and_big_ones_are_mapped_aligned() {
        let s = HugeBuf::filled(1000, 7u16);
        assert!(!s.is_mapped());
        assert!(s.iter().all(|&v| v == 7));
        for (n, fill) in [(MIN_MAPPED / 4, 0f32), (MIN_MAPPED / 4 + 3, 1.5f32), (3 * MIN_MAPPED + 5, -2.0f32)] {
            let mut b = HugeBuf::filled(n, fill);
            assert_eq!(b.len(), n);
            assert!(b.iter().all(|&v| v == fill), "fill {fill}");
            if cfg!(target_os = "linux") {
                assert!(b.is_mapped());
                assert_eq!(b.as_ptr() as usize % HUGE, 0);
            }
            b[n - 1] = 3.0;
            b[0] = 4.0;
            assert_eq!((b[0], b[n - 1]), (4.0, 3.0));
        }
        let bytes = HugeBuf::filled(MIN_MAPPED + 1, 128u8);
        assert!(bytes.iter().all(|&v| v == 128));
    }
}
