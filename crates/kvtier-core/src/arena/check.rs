//! Checksums of the blocks in a shared arena's slots.
//!
//! A local client of a shared arena reads a block in place, and the server tells it the
//! block's CRC32C with its offset, so that it can check what it read. Computing it costs a
//! pass over the block (about 55 GB/s on one core here, a fifth of a load's time if done
//! on every load), so each slot remembers the checksum of the block it holds: written when
//! the server copied the block in (it checksums what landed in the slot) or on the first
//! load that asked, forgotten when the slot is handed out again.
//!
//! One cell per page of the arena (slots start on pages); a cell is only read or written by
//! someone who holds the slot's block, so it cannot be reused in between (see `buf.rs`).

use std::sync::atomic::{AtomicU64, Ordering};

use super::slab::PAGE;

/// A cell's "known" bit; below it the length (bits 32..63) and the CRC (bits 0..32).
const KNOWN: u64 = 1 << 63;

#[derive(Debug)]
pub(super) struct Checks {
    cells: Box<[AtomicU64]>,
}

impl Checks {
    /// Cells for an arena of `bytes` bytes (0: none kept, every checksum computed).
    pub fn new(bytes: usize) -> Self {
        Self {
            cells: (0..bytes / PAGE).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// The slot at `offset` was handed out: whatever it held is gone.
    pub fn forget(&self, offset: usize) {
        if let Some(c) = self.cells.get(offset / PAGE) {
            c.store(0, Ordering::Relaxed);
        }
    }

    /// The checksum remembered for the `len`-byte block of the slot at `offset`.
    pub fn get(&self, offset: usize, len: usize) -> Option<u32> {
        let v = self.cells.get(offset / PAGE)?.load(Ordering::Acquire);
        (v & KNOWN != 0 && (v >> 32) & 0x7fff_ffff == len as u64).then_some(v as u32)
    }

    /// Remembers `crc` for the `len`-byte block of the slot at `offset`.
    pub fn set(&self, offset: usize, len: usize, crc: u32) {
        if let (Some(c), Ok(len)) = (self.cells.get(offset / PAGE), u32::try_from(len))
            && len < 1 << 31
        {
            c.store(
                KNOWN | (u64::from(len) << 32) | u64::from(crc),
                Ordering::Release,
            );
        }
    }
}

/// CRC32C (Castagnoli) of `bytes`: the checksum the SSD format and the remote tier use too.
pub fn crc32c(bytes: &[u8]) -> u32 {
    crc_fast::crc32_iscsi(bytes) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cell_answers_only_for_the_length_it_was_set_for_and_forgets() {
        let checks = Checks::new(4 * PAGE);
        assert_eq!(checks.get(PAGE, 100), None);
        checks.set(PAGE, 100, 0xdead_beef);
        assert_eq!(checks.get(PAGE, 100), Some(0xdead_beef));
        assert_eq!(checks.get(PAGE, 101), None);
        checks.forget(PAGE);
        assert_eq!(checks.get(PAGE, 100), None);
        let none = Checks::new(0);
        none.set(0, 1, 1);
        assert_eq!(none.get(0, 1), None);
    }
}
