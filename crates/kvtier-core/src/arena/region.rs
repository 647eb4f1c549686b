//! One anonymous memory mapping: the arena's memory, mapped once at start.
//!
//! The only unsafe code of the arena: mapping and unmapping, locking, and handing out the
//! bytes of one slot. The slab (`slab.rs`) decides which bytes belong to whom; this file
//! trusts it for exactly one thing, stated on [`Region::bytes_mut`] and [`Region::bytes`].
#![expect(
    unsafe_code,
    reason = "mmap/munmap/mlock and slices of the mapping need raw pointers"
)]

use std::ptr::NonNull;

use crate::error::{Error, ErrorKind, Result};

/// A private anonymous mapping, unmapped on drop.
#[derive(Debug)]
pub(super) struct Region {
    ptr: NonNull<u8>,
    len: usize,
    locked: bool,
}

// SAFETY: the mapping is plain memory owned by this value; which thread touches which
// bytes is governed by the slab (one writer per slot, readers only after it is frozen).
unsafe impl Send for Region {}
// SAFETY: as above: shared access hands out disjoint slots only.
unsafe impl Sync for Region {}

impl Region {
    /// Maps `len` bytes. `prefault` touches every page now (`MAP_POPULATE`), so no later
    /// write faults; `lock` keeps the pages in RAM (`mlock`), never swapped out.
    pub fn map(len: usize, prefault: bool, lock: bool) -> Result<Self> {
        if len == 0 {
            return Err(Error::invalid("an arena of 0 bytes"));
        }
        let mut flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
        if prefault {
            flags |= libc::MAP_POPULATE;
        }
        // SAFETY: an anonymous mapping at an address of the kernel's choosing touches no
        // existing memory; the result is checked before use.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            let e = std::io::Error::last_os_error();
            return Err(Error::new(
                ErrorKind::NoSpace,
                format!("cannot map a {len}-byte arena for the RAM tier"),
            )
            .with_source(e));
        }
        let ptr = NonNull::new(ptr.cast::<u8>())
            .ok_or_else(|| Error::new(ErrorKind::Internal, "mmap returned a null pointer"))?;
        let mut region = Region {
            ptr,
            len,
            locked: false,
        };
        if lock {
            // SAFETY: the range is exactly the mapping just made.
            if unsafe { libc::mlock(region.ptr.as_ptr().cast(), len) } != 0 {
                let e = std::io::Error::last_os_error();
                return Err(Error::new(
                    ErrorKind::NoSpace,
                    format!(
                        "cannot lock the {len}-byte arena in RAM (raise `ulimit -l` or turn \
                         `ram.lock` off)"
                    ),
                )
                .with_source(e));
            }
            region.locked = true;
        }
        Ok(region)
    }

    /// The mapping's length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the pages are locked in RAM.
    pub fn locked(&self) -> bool {
        self.locked
    }

    /// The bytes `offset..offset + len`, writable.
    ///
    /// # Safety
    /// The range must lie inside the mapping and nobody else may read or write it while
    /// the returned slice lives: the slab hands each slot to one owner at a time.
    #[expect(
        clippy::mut_from_ref,
        reason = "the mapping is shared; exclusive access to a slot is the slab's rule"
    )]
    pub unsafe fn bytes_mut(&self, offset: usize, len: usize) -> &mut [u8] {
        debug_assert!(offset.checked_add(len).is_some_and(|end| end <= self.len));
        // SAFETY: the caller's contract: inside the mapping and exclusively theirs.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(offset), len) }
    }

    /// The bytes `offset..offset + len`, read-only.
    ///
    /// # Safety
    /// The range must lie inside the mapping and nobody may write it while the returned
    /// slice lives: a frozen block's slot is not handed out again until its last reader
    /// lets go.
    pub unsafe fn bytes(&self, offset: usize, len: usize) -> &[u8] {
        debug_assert!(offset.checked_add(len).is_some_and(|end| end <= self.len));
        // SAFETY: the caller's contract: inside the mapping and written by nobody.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(offset), len) }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: the mapping is ours and every slice of it borrowed from `self` is gone
        // (each slot's owner holds the arena, and so this region, alive).
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}
