//! Receive buffers for ranged GETs, reused.
//!
//! A load of a run is one ranged GET whose body lands in one buffer, sliced into the
//! blocks handed out. A fresh buffer per load costs a page fault per 4 KiB page the first
//! time it is written (the kernel zeroes each page): on a 2 MiB load that was about a
//! third of the tier's CPU, more than the checksums. Buffers here go back to a small
//! pool when the last block sliced from them is dropped, so a steady stream of loads
//! writes into memory that is already mapped.

use std::sync::{Arc, Weak};

use bytes::Bytes;
use parking_lot::Mutex;

/// At most this many bytes of idle buffers are kept.
const KEEP_BYTES: usize = 64 << 20;

/// A buffer larger than this is never kept (one load of an unusually long run must not
/// pin its size for good).
const KEEP_ONE: usize = 16 << 20;

/// Idle receive buffers.
#[derive(Debug, Default)]
pub(crate) struct RecvPool {
    idle: Mutex<Idle>,
}

#[derive(Debug, Default)]
struct Idle {
    buffers: Vec<Vec<u8>>,
    bytes: usize,
}

impl RecvPool {
    /// An empty buffer with room for `len` bytes: an idle one if one is large enough.
    pub(crate) fn take(&self, len: usize) -> Vec<u8> {
        let mut buf = self
            .take_idle(len)
            .unwrap_or_else(|| Vec::with_capacity(len));
        buf.clear();
        buf
    }

    /// A buffer of exactly `len` bytes to be overwritten: an idle one keeps its old
    /// contents (only bytes past its last length are zeroed), a new one is zeroed pages
    /// the kernel maps on first write. Either way no pass over the buffer happens before
    /// a read fills it.
    pub(crate) fn take_filled(&self, len: usize) -> Vec<u8> {
        match self.take_idle(len) {
            Some(mut buf) => {
                buf.resize(len, 0);
                buf
            }
            None => vec![0; len],
        }
    }

    fn take_idle(&self, len: usize) -> Option<Vec<u8>> {
        let mut idle = self.idle.lock();
        let i = idle.buffers.iter().position(|b| b.capacity() >= len)?;
        let buf = idle.buffers.swap_remove(i);
        idle.bytes -= buf.capacity();
        Some(buf)
    }

    /// `buf` as [`Bytes`] that return it to the pool when the last slice of them drops.
    pub(crate) fn freeze(self: &Arc<Self>, buf: Vec<u8>) -> Bytes {
        Bytes::from_owner(Pooled {
            buf,
            pool: Arc::downgrade(self),
        })
    }

    fn give_back(&self, buf: Vec<u8>) {
        let size = buf.capacity();
        if size > KEEP_ONE {
            return;
        }
        let mut idle = self.idle.lock();
        if idle.bytes + size > KEEP_BYTES {
            return;
        }
        // Kept at its length: those bytes are initialised, so `take_filled` reuses them
        // without zeroing.
        idle.bytes += size;
        idle.buffers.push(buf);
    }

    /// Idle bytes held (for tests).
    #[cfg(test)]
    fn idle_bytes(&self) -> usize {
        self.idle.lock().bytes
    }
}

/// A received body; goes back to its pool when dropped.
struct Pooled {
    buf: Vec<u8>,
    pool: Weak<RecvPool>,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.upgrade() {
            pool.give_back(std::mem::take(&mut self.buf));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_returns_when_its_last_slice_drops_and_is_reused() {
        let pool = Arc::new(RecvPool::default());
        let mut buf = pool.take(1 << 20);
        buf.extend_from_slice(&[7u8; 1 << 20]);
        let ptr = buf.as_ptr();
        let bytes = pool.freeze(buf);
        let slice = bytes.slice(4096..8192);
        drop(bytes);
        assert_eq!(pool.idle_bytes(), 0, "a slice still holds it");
        assert_eq!(&slice[..], &[7u8; 4096][..]);
        drop(slice);
        assert!(pool.idle_bytes() >= 1 << 20);
        let again = pool.take(512 << 10);
        assert_eq!(again.as_ptr(), ptr, "not reused");
        assert!(again.is_empty());
        assert_eq!(pool.idle_bytes(), 0);
        drop(pool.freeze(again));
        let filled = pool.take_filled(3 << 20);
        assert_eq!(filled.len(), 3 << 20);
        assert!(filled.iter().all(|b| *b == 0), "a new buffer is zeroed");
    }

    #[test]
    fn a_filled_buffer_is_reused_at_any_length() {
        let pool = Arc::new(RecvPool::default());
        let mut buf = pool.take_filled(4096);
        buf.fill(5);
        let ptr = buf.as_ptr();
        drop(pool.freeze(buf));
        let shorter = pool.take_filled(100);
        assert_eq!((shorter.as_ptr(), shorter.len()), (ptr, 100));
        drop(pool.freeze(shorter));
        let longer = pool.take_filled(4096);
        assert_eq!(longer.len(), 4096);
        assert!(
            longer[100..].iter().all(|b| *b == 0),
            "bytes past the last length are zeroed"
        );
    }

    #[test]
    fn idle_buffers_are_bounded() {
        let pool = Arc::new(RecvPool::default());
        let big = pool.freeze(vec![0u8; KEEP_ONE + 1]);
        drop(big);
        assert_eq!(pool.idle_bytes(), 0, "an oversized buffer was kept");
        let many: Vec<Bytes> = (0..(KEEP_BYTES / KEEP_ONE) + 2)
            .map(|_| pool.freeze(vec![0u8; KEEP_ONE]))
            .collect();
        drop(many);
        assert!(pool.idle_bytes() <= KEEP_BYTES);
    }
}
