//! One memory mapping: the arena's memory, mapped once at start — anonymous, or (a shared
//! arena) a sealed memory file that local clients map read-only.
//!
//! The only unsafe code of the arena: mapping and unmapping, locking, and handing out the
//! bytes of one slot. The slab (`slab.rs`) decides which bytes belong to whom; this file
//! trusts it for exactly one thing, stated on [`Region::bytes_mut`] and [`Region::bytes`].
#![expect(
    unsafe_code,
    reason = "mmap/munmap/mlock and slices of the mapping need raw pointers"
)]

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;

use crate::error::{Error, ErrorKind, Result};

/// The huge-page size the mapping is aligned to (x86-64 and arm64 with 4 KiB pages).
pub(super) const HUGE_PAGE: usize = 2 << 20;

/// A mapping, unmapped on drop: private and anonymous, or shared over a memory file.
#[derive(Debug)]
pub(super) struct Region {
    ptr: NonNull<u8>,
    len: usize,
    locked: bool,
    /// The memory file of a shared region (see [`Region::map`]).
    file: Option<OwnedFd>,
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
    ///
    /// `shared` backs the region with a memory file ([`Region::file`]) that other processes
    /// can map. The file is sealed once this mapping exists: it can neither shrink nor
    /// grow (a client cannot make the server's reads fault) and no new mapping of it can
    /// be writable (`F_SEAL_FUTURE_WRITE`: only this one writes; a client's `mmap` with
    /// `PROT_WRITE` fails, and so does `mprotect` of a read-only one).
    ///
    /// `huge` (shared only) takes the file's pages from the kernel's huge-page pool
    /// (`MFD_HUGETLB`, 2 MiB pages; `vm.nr_hugepages` must hold the arena): a client
    /// reading blocks walks 512 times fewer page-table entries.
    pub fn map(len: usize, prefault: bool, lock: bool, shared: bool, huge: bool) -> Result<Self> {
        if len == 0 || !len.is_multiple_of(HUGE_PAGE) {
            return Err(Error::invalid(format!(
                "an arena of {len} bytes (a positive multiple of 2 MiB is needed)"
            )));
        }
        let mut region = if shared {
            Self::map_file(len, huge)?
        } else {
            Self::map_aligned(len)?
        };
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
            file: None,
        })
    }

    /// A shared mapping of a new memory file of `len` bytes at a huge-page boundary, the
    /// file sealed once mapped (see [`Region::map`]).
    ///
    /// The file is mapped where nothing is: an aligned free range is found (mapped and
    /// given back at once), then the file mapped there with `MAP_FIXED_NOREPLACE`, which
    /// fails rather than replace a mapping another thread made meanwhile (and is tried
    /// again). `MAP_FIXED` over an anonymous mapping of our own would be simpler, but a
    /// `MAP_FIXED` that fails (a huge-page pool too small) leaves the range unmapped on
    /// recent kernels, and our drop would then unmap whatever another thread mapped into
    /// the hole — seen as a test's arena vanishing under it (SIGSEGV).
    fn map_file(len: usize, huge: bool) -> Result<Self> {
        // A huge-page arena reserves its pages when mapped (no MAP_NORESERVE), so a pool
        // too small fails the start here instead of a later touch with SIGBUS.
        let pool = if huge {
            " from the huge-page pool (raise vm.nr_hugepages to hold it, or turn \
             shm.huge_pages off)"
        } else {
            ""
        };
        let failed = |what: &str, kind: ErrorKind, e: std::io::Error| {
            Error::new(
                kind,
                format!("cannot {what} for a {len}-byte shared arena{pool}"),
            )
            .with_source(e)
        };
        let file = memory_file(c"kvtier-arena", len, huge)
            .map_err(|e| failed("create the memory file", ErrorKind::NoSpace, e))?;
        let reserve = if huge { 0 } else { libc::MAP_NORESERVE };
        for _ in 0..8 {
            let want = Self::map_aligned(len)?.address();
            // SAFETY: NOREPLACE maps only where nothing is mapped (the range just given
            // back, unless another thread took it); the result is checked.
            let raw = unsafe {
                libc::mmap(
                    want as *mut libc::c_void,
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_FIXED_NOREPLACE | reserve,
                    file.as_raw_fd(),
                    0,
                )
            };
            if raw == libc::MAP_FAILED {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EEXIST) {
                    continue; // another thread mapped something there first
                }
                return Err(failed("map the memory file", ErrorKind::NoSpace, e));
            }
            let ptr = NonNull::new(raw.cast::<u8>())
                .ok_or_else(|| Error::new(ErrorKind::Internal, "mmap returned a null pointer"))?;
            // From here the mapping is ours and unmapped on drop, whatever happens next.
            let mut region = Region {
                ptr,
                len,
                locked: false,
                file: None,
            };
            // A kernel older than 4.17 takes the address as a hint only.
            if !region.address().is_multiple_of(HUGE_PAGE) {
                continue;
            }
            seal(&file, libc::F_SEAL_FUTURE_WRITE).map_err(|e| {
                failed(
                    "seal the memory file (Linux 5.1 or later)",
                    ErrorKind::Unavailable,
                    e,
                )
            })?;
            region.file = Some(file);
            return Ok(region);
        }
        Err(Error::new(
            ErrorKind::NoSpace,
            format!("cannot find a free 2 MiB-aligned address range for a {len}-byte shared arena"),
        ))
    }

    /// The memory file of a shared region, to pass to a local client (`None`: private).
    pub fn file(&self) -> Option<&OwnedFd> {
        self.file.as_ref()
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

/// A new memory file (`memfd`) of `len` bytes, which can neither shrink nor grow: a
/// process that maps it can never have its reads fault because another cut it short.
/// `huge`: its pages come from the kernel's pool of 2 MiB pages (`len` a multiple of them).
/// Further seals are added with [`seal`]. Shared by the arena and by `kvtier serve`'s
/// per-client staging memory.
pub fn memory_file(name: &std::ffi::CStr, len: usize, huge: bool) -> std::io::Result<OwnedFd> {
    let pages = if huge {
        libc::MFD_HUGETLB | libc::MFD_HUGE_2MB
    } else {
        0
    };
    // SAFETY: the name is NUL-terminated; the result is checked.
    let raw = unsafe {
        libc::memfd_create(
            name.as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING | pages,
        )
    };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `raw` is a descriptor just opened, and ours alone.
    let file = unsafe { OwnedFd::from_raw_fd(raw) };
    let size = libc::off_t::try_from(len)
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: a plain call on our own descriptor.
    if unsafe { libc::ftruncate(file.as_raw_fd(), size) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    seal(&file, libc::F_SEAL_SHRINK | libc::F_SEAL_GROW)?;
    Ok(file)
}

/// Adds `seals` (`F_SEAL_*`) to a memory file made by [`memory_file`].
pub fn seal(file: &OwnedFd, seals: libc::c_int) -> std::io::Result<()> {
    // SAFETY: a plain call on a descriptor the caller owns.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
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
