//! Early writeback: appended bytes are handed to the disk as soon as about a mebibyte of
//! them has gathered, instead of sitting dirty in the page cache until a sync (or the
//! kernel's dirty limits) writes them all at once.
//!
//! Why: a buffered `pwrite` only copies into the page cache; the disk starts working when
//! someone asks. Left alone, a stream of appends followed by one `fdatasync` keeps the
//! disk idle while the copies run and the CPU idle while the sync runs. Starting the
//! writeback of each finished mebibyte overlaps the two. Measured on this machine's disk
//! (see BENCHMARKS.md, issue 12): 2 MiB appends then one sync went from about 2.3 to about
//! 3.5 GB/s, faster than `O_DIRECT` writes at any queue depth up to 16 (about 3.0 GB/s),
//! which also pay for an aligned copy of every record here.
//!
//! How: `posix_fadvise(POSIX_FADV_DONTNEED)` over the finished range. On Linux it starts
//! writeback of the range's dirty pages without waiting for it, then drops the range's
//! pages that are already clean — blocks the RAM tier holds anyway. It is only a hint:
//! nothing about durability changes (a durable write still waits for `fdatasync`), and a
//! failure is ignored. (`sync_file_range` says the same thing more narrowly, but has no
//! safe binding here, and the workspace denies `unsafe`.)

use std::fs::File;

/// Finished bytes that trigger a writeback.
pub(super) const KICK_BYTES: u64 = 1 << 20;

/// Starts writing `len` bytes at `offset` of `file` to the disk, without waiting.
pub(super) fn start(file: &File, offset: u64, len: u64) {
    if len == 0 {
        return;
    }
    let _ = rustix::fs::fadvise(
        file,
        offset,
        std::num::NonZeroU64::new(len),
        rustix::fs::Advice::DontNeed,
    );
}

/// Tracks how far a file's writeback has been started.
#[derive(Debug, Default)]
pub(super) struct Kicker {
    /// Everything before this offset has been handed to the disk.
    started: u64,
}

impl Kicker {
    /// A kicker for a file whose bytes before `offset` need no writeback.
    pub(super) fn at(offset: u64) -> Self {
        Self { started: offset }
    }

    /// The range to start writing now that the file's bytes end at `end`, when at least
    /// [`KICK_BYTES`] have gathered since the last one.
    pub(super) fn due(&mut self, end: u64) -> Option<(u64, u64)> {
        if end < self.started + KICK_BYTES {
            return None;
        }
        let range = (self.started, end - self.started);
        self.started = end;
        Some(range)
    }
}
