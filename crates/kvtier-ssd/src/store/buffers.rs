//! Read buffers that go back to a small pool when the last `Bytes` referring to them is
//! dropped, so a stream of same-sized loads reuses memory that is already mapped instead
//! of faulting in fresh pages for every block (about 10% of a 2 MiB read here).

use std::sync::{Arc, Weak};

use bytes::Bytes;
use parking_lot::Mutex;

/// Most buffers kept.
const KEEP: usize = 16;

/// A pool of read buffers.
#[derive(Debug, Default)]
pub struct BufferPool {
    free: Arc<Mutex<Vec<Vec<u8>>>>,
}

struct Pooled {
    buf: Vec<u8>,
    home: Weak<Mutex<Vec<Vec<u8>>>>,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        if let Some(home) = self.home.upgrade() {
            let mut free = home.lock();
            if free.len() < KEEP {
                free.push(std::mem::take(&mut self.buf));
            }
        }
    }
}

impl BufferPool {
    /// Fills a buffer of `len` bytes with `fill` and returns it as `Bytes`; the buffer
    /// returns to the pool when the last clone of the `Bytes` is dropped.
    pub fn filled<E>(
        &self,
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> Result<(), E>,
    ) -> Result<Bytes, E> {
        let reused = {
            let mut free = self.free.lock();
            free.iter()
                .position(|b| b.len() == len)
                .map(|i| free.swap_remove(i))
        };
        let mut buf = reused.unwrap_or_else(|| vec![0u8; len]);
        fill(&mut buf)?;
        Ok(Bytes::from_owner(Pooled {
            buf,
            home: Arc::downgrade(&self.free),
        }))
    }
}
