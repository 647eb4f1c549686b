//! Raw write baselines for the `ssd.store.*` rows: the same bytes written to a fresh file
//! by the best plain patterns this machine offers, each ending in `fdatasync`, so a row can
//! be held against the strongest of them.
//!
//! - buffered `pwrite`s, then one sync;
//! - buffered `pwrite`s with each finished mebibyte handed to the disk at once
//!   (`posix_fadvise(DONTNEED)`, the hint the store itself uses), then one sync;
//! - `O_DIRECT` writes from an aligned buffer at a queue depth of 1, 4 or 16 (threads,
//!   each taking the next block), then one sync;
//! - for durable stores, batches: `k` blocks written (buffered, or `O_DIRECT` with all `k`
//!   in flight at once) then one `fdatasync`, per batch.
//!
//! Blocks go at `4096 + i × stride` like records in a segment.

use std::fs::{File, OpenOptions};
use std::hint::black_box;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Barrier;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// How the raw file is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// Buffered `pwrite`s, one `fdatasync` at the end.
    Pwrite,
    /// Buffered `pwrite`s with early writeback every mebibyte, one `fdatasync` at the end.
    PwriteEarly,
    /// `O_DIRECT` writes with this many in flight, one `fdatasync` at the end.
    Direct(usize),
}

impl Pattern {
    /// Every pattern a store row is held against.
    pub const ALL: [Pattern; 5] = [
        Pattern::Pwrite,
        Pattern::PwriteEarly,
        Pattern::Direct(1),
        Pattern::Direct(4),
        Pattern::Direct(16),
    ];

    /// What the pattern is, for a row's baseline note.
    pub fn describe(self) -> &'static str {
        match self {
            Pattern::Pwrite => "pwrite of the same bytes + fdatasync",
            Pattern::PwriteEarly => {
                "pwrite of the same bytes, writeback started every MiB, + fdatasync"
            }
            Pattern::Direct(1) => "O_DIRECT writes of the same bytes, QD 1, + fdatasync",
            Pattern::Direct(4) => "O_DIRECT writes of the same bytes, QD 4, + fdatasync",
            Pattern::Direct(_) => "O_DIRECT writes of the same bytes, QD 16, + fdatasync",
        }
    }
}

/// An aligned copy of `payload` for `O_DIRECT` (length rounded up to whole pages), held
/// inside a larger vector so no unsafe allocation is needed.
pub struct AlignedCopy {
    buf: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedCopy {
    pub fn new(payload: &[u8]) -> Self {
        let len = payload.len().div_ceil(4096) * 4096;
        let mut buf = vec![0u8; len + 4096];
        let start = buf.as_ptr().align_offset(4096);
        buf[start..start + payload.len()].copy_from_slice(payload);
        Self { buf, start, len }
    }

    pub fn bytes(&self) -> &[u8] {
        &self.buf[self.start..self.start + self.len]
    }
}

fn create(path: &Path, direct: bool) -> std::io::Result<File> {
    let _ = std::fs::remove_file(path);
    let mut o = OpenOptions::new();
    o.read(true).write(true).create_new(true);
    if direct {
        o.custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32);
    }
    o.open(path)
}

fn early_writeback(file: &File, from: u64, len: u64) {
    let _ = rustix::fs::fadvise(
        file,
        from,
        std::num::NonZeroU64::new(len),
        rustix::fs::Advice::DontNeed,
    );
}

/// Writes `n` copies of `payload` to a new file at `path` with `pattern`, then syncs it;
/// returns the seconds taken. `None` when the filesystem refuses `O_DIRECT`.
pub fn write_file(
    path: &Path,
    payload: &[u8],
    aligned: &AlignedCopy,
    n: usize,
    stride: u64,
    pattern: Pattern,
) -> anyhow::Result<Option<f64>> {
    let direct = matches!(pattern, Pattern::Direct(_));
    let file = match create(path, direct) {
        Ok(f) => f,
        Err(_) if direct => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let t = Instant::now();
    match pattern {
        Pattern::Pwrite | Pattern::PwriteEarly => {
            let mut started = 0u64;
            for i in 0..n as u64 {
                let at = 4096 + i * stride;
                file.write_all_at(payload, at)?;
                let end = at + payload.len() as u64;
                if pattern == Pattern::PwriteEarly && end >= started + (1 << 20) {
                    early_writeback(&file, started, end - started);
                    started = end;
                }
            }
        }
        Pattern::Direct(depth) => {
            let next = AtomicUsize::new(0);
            let failed = AtomicUsize::new(0);
            std::thread::scope(|s| {
                for _ in 0..depth {
                    s.spawn(|| {
                        loop {
                            let i = next.fetch_add(1, Ordering::Relaxed);
                            if i >= n {
                                break;
                            }
                            let at = 4096 + i as u64 * stride;
                            if file.write_all_at(aligned.bytes(), at).is_err() {
                                failed.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    });
                }
            });
            anyhow::ensure!(
                failed.load(Ordering::Relaxed) == 0,
                "O_DIRECT writes failed"
            );
        }
    }
    file.sync_data()?;
    let secs = t.elapsed().as_secs_f64();
    black_box(&file);
    drop(file);
    let _ = std::fs::remove_file(path);
    Ok(Some(secs))
}

/// Writes `batches × batch` copies of `payload` to a new file at `path`, `batch` blocks
/// then one `fdatasync` at a time (with `direct`, the batch's blocks all in flight at
/// once); returns each batch's seconds. `None` when the filesystem refuses `O_DIRECT`.
pub fn write_batches(
    path: &Path,
    payload: &[u8],
    aligned: &AlignedCopy,
    batches: usize,
    batch: usize,
    stride: u64,
    direct: bool,
) -> anyhow::Result<Option<Vec<f64>>> {
    let file = match create(path, direct) {
        Ok(f) => f,
        Err(_) if direct => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let mut secs = Vec::with_capacity(batches);
    if !direct || batch == 1 {
        let bytes = if direct { aligned.bytes() } else { payload };
        for b in 0..batches {
            let t = Instant::now();
            for k in 0..batch {
                let at = 4096 + (b * batch + k) as u64 * stride;
                file.write_all_at(bytes, at)?;
            }
            file.sync_data()?;
            secs.push(t.elapsed().as_secs_f64());
        }
    } else {
        // One thread per block of a batch, released together: `batch` writes in flight.
        let start = Barrier::new(batch + 1);
        let done = Barrier::new(batch + 1);
        let failed = AtomicUsize::new(0);
        // A failed sync must not leave the workers waiting at a barrier: every batch runs.
        let mut sync_failed = None;
        std::thread::scope(|s| {
            for k in 0..batch {
                let (start, done, failed, file) = (&start, &done, &failed, &file);
                s.spawn(move || {
                    for b in 0..batches {
                        start.wait();
                        let at = 4096 + (b * batch + k) as u64 * stride;
                        if file.write_all_at(aligned.bytes(), at).is_err() {
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                        done.wait();
                    }
                });
            }
            for _ in 0..batches {
                let t = Instant::now();
                start.wait();
                done.wait();
                if let Err(e) = file.sync_data() {
                    sync_failed.get_or_insert(e);
                }
                secs.push(t.elapsed().as_secs_f64());
            }
        });
        if let Some(e) = sync_failed {
            return Err(e.into());
        }
        anyhow::ensure!(
            failed.load(Ordering::Relaxed) == 0,
            "O_DIRECT writes failed"
        );
    }
    drop(file);
    let _ = std::fs::remove_file(path);
    Ok(Some(secs))
}
