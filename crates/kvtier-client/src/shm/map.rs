//! A shared mapping of a memory file: the arena (read-only) or staging memory.
#![expect(
    unsafe_code,
    reason = "mmap/munmap and slices of the mapping need raw pointers"
)]

use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::NonNull;

/// `len` bytes of a memory file mapped shared, unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    writable: bool,
}

// SAFETY: plain memory owned by this value; who reads or writes which bytes is the
// protocol's rule (a leased block is not written by anyone while leased; a reserved
// staging range is written by its client only until it commits).
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps all `len` bytes of `file`, read-only or read-write.
    pub fn map(file: BorrowedFd<'_>, len: usize, writable: bool) -> std::io::Result<Self> {
        if len == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "an empty memory file",
            ));
        }
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: a new shared mapping at an address of the kernel's choosing; checked.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let ptr = NonNull::new(raw.cast::<u8>())
            .ok_or_else(|| std::io::Error::other("mmap returned null"))?;
        Ok(Self { ptr, len, writable })
    }

    /// The address of the first byte (to register the memory with a device once).
    pub fn address(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is mapped (never: a mapping has at least one byte).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `offset..offset + len` lies inside the mapping.
    pub fn holds(&self, offset: u64, len: u64) -> bool {
        offset
            .checked_add(len)
            .is_some_and(|end| end <= self.len as u64)
    }

    /// The bytes `offset..offset + len`.
    ///
    /// # Safety
    /// The range must lie inside the mapping ([`Mapping::holds`]) and nobody may write it
    /// while the slice lives (a leased block; a staging range its client no longer writes).
    pub unsafe fn bytes(&self, offset: usize, len: usize) -> &[u8] {
        debug_assert!(self.holds(offset as u64, len as u64));
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(offset), len) }
    }

    /// The bytes `offset..offset + len`, writable.
    ///
    /// # Safety
    /// The mapping must be writable, the range inside it, and nobody else may read or
    /// write it while the slice lives (a reserved staging range, before its commit).
    #[expect(
        clippy::mut_from_ref,
        reason = "exclusive access to a range is the protocol's rule"
    )]
    pub unsafe fn bytes_mut(&self, offset: usize, len: usize) -> &mut [u8] {
        debug_assert!(self.writable && self.holds(offset as u64, len as u64));
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(offset), len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping is ours; every slice borrowed from it borrowed `self`.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}
