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

/// The huge-page size the mapping is aligned to (x86-64 and arm64 with 4 KiB pages).
pub(super) const HUGE_PAGE: usize = 2 << 20;

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
    /// Maps `len` bytes (a multiple of [`HUGE_PAGE`]) at a huge-page boundary. `prefault`
    /// touches every page now, so no later write faults; `lock` keeps the pages in RAM
    /// (`mlock`), never swapped out.
    pub fn map(len: usize, prefault: bool, lock: bool) -> Result<Self> {
        if len == 0 || !len.is_multiple_of(HUGE_PAGE) {
            return Err(Error::invalid(format!(
                "an arena of {len} bytes (a positive multiple of 2 MiB is needed)"
            )));
        }
        let mut region = Self::map_aligned(len)?;
        // Huge pages where the kernel offers them (`transparent_hugepage` = madvise or
        // always): a first touch fills 2 MiB at once instead of 512 faults of 4 KiB, and a
        // GPU's DMA walks fewer page-table entries. Best effort: without them the arena
        // works the same, with more faults on first use.
        // SAFETY: advice on exactly our mapping; it changes no byte.
        unsafe {
            libc::madvise(region.ptr.as_ptr().cast(), len, libc::MADV_HUGEPAGE);
        }
        if prefault {
            region.populate();
        }
        if lock {
            // SAFETY: the range is exactly our mapping.
            if unsafe { libc::mlock(region.ptr.as_ptr().cast(), len) } != 0 {
                let e = std::io::Error::last_os_error();
                return Err(Error::new(
                    ErrorKind::NoSpace,
                    format!(
                        "cannot lock the {len}-byte arena in RAM (raise `ulimit -l` or turn \
                         `ram_lock` off)"
                    ),
                )
                .with_source(e));
            }
            region.locked = true;
        }
        Ok(region)
    }

    /// An anonymous mapping of `len` bytes starting at a multiple of [`HUGE_PAGE`]: one
    /// huge page more is mapped, and the unaligned head and tail given back.
    fn map_aligned(len: usize) -> Result<Self> {
        let over = len
            .checked_add(HUGE_PAGE)
            .ok_or_else(|| Error::invalid(format!("an arena of {len} bytes")))?;
        // SAFETY: an anonymous mapping at an address of the kernel's choosing touches no
        // existing memory; the result is checked before use.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                over,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            let e = std::io::Error::last_os_error();
            return Err(Error::new(
                ErrorKind::NoSpace,
                format!("cannot map a {len}-byte arena for the RAM tier"),
            )
            .with_source(e));
        }
        let base = raw as usize;
        let head = base.next_multiple_of(HUGE_PAGE) - base;
        let tail = over - head - len;
        // SAFETY: both ranges lie inside the mapping just made and hold nothing yet.
        unsafe {
            if head > 0 {
                libc::munmap(raw, head);
            }
            if tail > 0 {
                libc::munmap((base + head + len) as *mut libc::c_void, tail);
            }
        }
        let ptr = NonNull::new((base + head) as *mut u8)
            .ok_or_else(|| Error::new(ErrorKind::Internal, "mmap returned a null pointer"))?;
        Ok(Region {
            ptr,
            len,
            locked: false,
        })
    }

    /// Touches every page, so that no later write faults: one call where the kernel can
    /// (`MADV_POPULATE_WRITE`, Linux 5.14), a write per page otherwise.
    fn populate(&mut self) {
        // SAFETY: advice on exactly our mapping; populating changes no byte (the pages
        // are zero either way).
        let done = unsafe {
            libc::madvise(
                self.ptr.as_ptr().cast(),
                self.len,
                libc::MADV_POPULATE_WRITE,
            )
        } == 0;
        if done {
            return;
        }
        for page in (0..self.len).step_by(4096) {
            // SAFETY: inside our mapping, and no slot has been handed out yet (`&mut
            // self`); writing the zero a fresh page already holds changes nothing.
            unsafe { self.ptr.as_ptr().add(page).write_volatile(0) };
        }
    }

    /// The address of the mapping's first byte (for a caller that registers the region
    /// with a device, once: every block in the arena lies inside it).
    pub fn address(&self) -> usize {
        self.ptr.as_ptr() as usize
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
