//! I/O that bypasses the page cache (O_DIRECT), from and into 4 KiB-aligned buffers.
//! Writes: a store asked to sync a record before it returns (a durable acknowledgement)
//! writes it direct, since `O_DIRECT` + `fdatasync` is the cheapest way to stable
//! storage here (about 20% cheaper than a buffered write + `fdatasync` for 256 KiB,
//! BENCHMARKS.md, issue 12). Reads: used today by the benchmark's raw baseline; the
//! store's prefetch path will use them with several reads in flight (one at a time, a
//! direct read loses the kernel's readahead).
//!
//! A cached read copies every byte from the page cache into the caller's buffer and fills
//! the cache with blocks that RAM already holds once promoted; a direct read lands the
//! bytes in our buffer straight from the device. Records and payloads start on 4 KiB
//! boundaries (the format guarantees it), so a read only has to round its length up.
//! Filesystems without O_DIRECT (tmpfs) fall back to cached reads.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use bytemuck::{Pod, Zeroable};
use bytes::Bytes;

use crate::format::ALIGN;

/// One aligned page.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C, align(4096))]
struct Page([u8; ALIGN as usize]);

/// An aligned buffer of whole pages, of which the first `len` bytes are meaningful.
struct AlignedBuf {
    pages: Vec<Page>,
    len: usize,
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        &bytemuck::cast_slice::<Page, u8>(&self.pages)[..self.len]
    }
}

/// A reusable aligned buffer for direct writes: whole pages, grown on demand.
#[derive(Default)]
pub(crate) struct AlignedScratch {
    pages: Vec<Page>,
}

impl std::fmt::Debug for AlignedScratch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedScratch({} pages)", self.pages.len())
    }
}

impl AlignedScratch {
    /// The first `len` bytes (a multiple of the page size), zeroed.
    pub(crate) fn zeroed(&mut self, len: usize) -> &mut [u8] {
        let pages = len.div_ceil(ALIGN as usize);
        if self.pages.len() < pages {
            self.pages.resize(pages, Page::zeroed());
        }
        let bytes = &mut bytemuck::cast_slice_mut::<Page, u8>(&mut self.pages)[..len];
        bytes.fill(0);
        bytes
    }
}

/// Opens `path` for direct writes, or `None` where the filesystem does not support them.
pub(crate) fn open_direct_write(path: &Path) -> Option<File> {
    OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .ok()
}

/// Opens `path` for direct reads, or `None` where the filesystem does not support them.
pub fn open_direct(path: &Path) -> Option<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .ok()
}

/// Reads the `len` bytes at the aligned `offset` of `file` (opened with O_DIRECT),
/// returning them as `Bytes` without a copy. The request is rounded up to whole pages; the
/// file may end inside the last page, but not before `offset + len` (`UnexpectedEof`).
pub fn read_direct(file: &File, offset: u64, len: usize) -> std::io::Result<Bytes> {
    debug_assert_eq!(offset % ALIGN, 0);
    let pages = len.div_ceil(ALIGN as usize);
    let mut buf = AlignedBuf {
        pages: vec![Page::zeroed(); pages],
        len,
    };
    let bytes = bytemuck::cast_slice_mut::<Page, u8>(&mut buf.pages);
    let mut done = 0;
    // Each request starts on a page boundary; a short read means the end of the file.
    while done < len && done % ALIGN as usize == 0 {
        match file.read_at(&mut bytes[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    if done < len {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(Bytes::from_owner(buf))
}
