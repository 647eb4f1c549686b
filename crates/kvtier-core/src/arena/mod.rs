//! The RAM tier's memory: one region mapped at start, carved into slots.
//!
//! A block stored into the cache is copied into a slot of the arena, not into memory
//! freshly allocated from the system: the kernel zeroes every fresh page on first touch,
//! which cost more than the copy itself (issue 37: a 2 MiB store through `kvtier serve`
//! took 5.3 ms, about 5 of them the kernel filling fresh memory). The arena's pages are
//! touched once — at start with `prefault`, or by the first block that uses them — and
//! reused from then on: an evicted block's slot takes the next block of its size.
//!
//! - The region is as large as the RAM budget plus two segments of slack (slot sizes are
//!   whole pages and segments hold one size each); the budget, not the arena, decides what
//!   the RAM tier keeps.
//! - A payload larger than a segment, or one that finds no free slot of its size (every
//!   segment taken by other sizes), gets a buffer of its own on the heap, as before the
//!   arena; `fallbacks` counts them.
//! - A frozen block keeps its slot until its last reader drops it (see [`BlockBuf`]), so a
//!   slot is never reused under a reader, however the block left the tier.
//!
//! Why slots and not a general allocator: see `docs/adr/0018-arena.md`.

mod buf;
mod check;
mod region;
mod slab;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

pub use crate::copy::copy_checked;
pub use buf::BlockBuf;
pub use check::crc32c;
pub use region::{memory_file, seal};

use crate::error::Result;
use region::Region;
use slab::Slab;

/// Segment size: the largest payload a slot holds. Blocks of real layouts are 64 KiB to a
/// few MiB; 32 MiB leaves room for very wide ones.
pub const SEGMENT_BYTES: usize = 32 << 20;

/// Settings of the arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArenaConfig {
    /// Keep blocks in the arena at all (default true). Off, every block gets a heap buffer
    /// of its own, as before the arena.
    pub enabled: bool,
    /// Touch every page at start (`MAP_POPULATE`), so no store ever waits for the kernel to
    /// fill fresh memory (default false for an embedded engine, whose RAM budget may be
    /// far larger than what it uses; `kvtier serve`: `ram_prefault`).
    pub prefault: bool,
    /// Lock the arena in RAM (`mlock`): never swapped out, as DMA to a GPU wants (default
    /// false; needs `ulimit -l` as large as the arena).
    pub lock: bool,
    /// Back the arena with a sealed memory file that local processes can map read-only
    /// ([`Arena::file`]; `kvtier serve`'s shared arena, docs/adr/0019-shared-arena.md).
    /// Default false: private anonymous memory.
    pub shared: bool,
    /// With `shared`: take the arena's pages from the kernel's huge-page pool (2 MiB
    /// pages; `vm.nr_hugepages` must hold the whole arena, or the start fails saying so).
    /// Shared memory is otherwise mapped in 4 KiB pages wherever the kernel's
    /// `transparent_hugepage/shmem_enabled` is `never` (the common default), and a client
    /// copying blocks out of it walks 512 times as many page-table entries. Default false.
    pub huge_pages: bool,
}

impl Default for ArenaConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            prefault: false,
            lock: false,
            shared: false,
            huge_pages: false,
        }
    }
}

/// What the arena holds now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ArenaStats {
    /// Bytes mapped (0 without an arena).
    pub mapped_bytes: u64,
    /// Bytes of slots handed out (blocks held, and buffers being filled).
    pub used_bytes: u64,
    /// Buffers given from the heap instead (a payload larger than a segment, or no free
    /// slot of its size).
    pub fallbacks: u64,
}

#[derive(Debug)]
pub(crate) struct Shared {
    region: Region,
    slab: Mutex<Slab>,
    fallbacks: AtomicU64,
    /// Checksums of the blocks in slots, for a shared arena's clients (see `check`).
    checks: check::Checks,
}

impl Shared {
    fn free(&self, offset: usize) {
        self.slab.lock().free(offset);
    }
}

/// The RAM tier's memory (see the module docs). Cheap to clone: clones share the region.
#[derive(Debug, Clone)]
pub struct Arena {
    shared: Option<Arc<Shared>>,
}

impl Arena {
    /// An arena for a RAM budget of `capacity_bytes`, as `config` says.
    pub fn new(capacity_bytes: u64, config: ArenaConfig) -> Result<Self> {
        if !config.enabled || capacity_bytes == 0 {
            return Ok(Self::none());
        }
        let segments = usize::try_from(capacity_bytes)
            .unwrap_or(usize::MAX)
            .div_ceil(SEGMENT_BYTES)
            .saturating_add(2);
        let bytes = segments.saturating_mul(SEGMENT_BYTES);
        let region = Region::map(
            bytes,
            config.prefault,
            config.lock,
            config.shared,
            config.huge_pages,
        )?;
        Ok(Self {
            shared: Some(Arc::new(Shared {
                region,
                slab: Mutex::new(Slab::new(SEGMENT_BYTES, segments)),
                fallbacks: AtomicU64::new(0),
                checks: check::Checks::new(if config.shared { bytes } else { 0 }),
            })),
        })
    }

    /// No arena: every buffer on the heap.
    pub fn none() -> Self {
        Self { shared: None }
    }

    /// A buffer for a payload of `len` bytes: a slot when one is free, the heap otherwise.
    pub fn buffer(&self, len: usize) -> BlockBuf {
        let Some(shared) = &self.shared else {
            return BlockBuf::heap(len);
        };
        let offset = {
            let mut slab = shared.slab.lock();
            slab.stride_of(len).and_then(|stride| slab.alloc(stride))
        };
        match offset {
            Some(offset) => {
                shared.checks.forget(offset);
                BlockBuf::slot(shared.clone(), offset, len)
            }
            None => {
                shared.fallbacks.fetch_add(1, Ordering::Relaxed);
                BlockBuf::heap(len)
            }
        }
    }

    /// `src` copied into a buffer of its own (see [`Arena::buffer`]), frozen.
    pub fn copy(&self, src: &[u8]) -> bytes::Bytes {
        let mut buf = self.buffer(src.len());
        buf.append(src);
        buf.freeze()
    }

    /// Where the arena lies in this process's memory: `(address, bytes)`, or `None`
    /// without one. Every block copied into a slot lies inside it, so a GPU can register
    /// it once (`cudaHostRegister`) and read blocks by DMA; a block that fell back to the
    /// heap (see [`ArenaStats::fallbacks`]) does not.
    pub fn region(&self) -> Option<(usize, usize)> {
        self.shared
            .as_ref()
            .map(|s| (s.region.address(), s.region.len()))
    }

    /// The memory file of a shared arena (see [`ArenaConfig::shared`]), to hand to a local
    /// client, which maps it read-only: offset `o` of the file is [`Arena::region`]'s
    /// address plus `o`.
    pub fn file(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        self.shared.as_ref()?.region.file().map(|f| f.as_fd())
    }

    /// Where `bytes` lie in the arena: the offset of their first byte, or `None` when they
    /// are not (wholly) inside it.
    pub fn offset_of(&self, bytes: &[u8]) -> Option<usize> {
        let s = self.shared.as_ref()?;
        let start = (bytes.as_ptr() as usize).checked_sub(s.region.address())?;
        (start.checked_add(bytes.len())? <= s.region.len()).then_some(start)
    }

    /// The CRC32C of `block`, a whole block the caller holds (a frozen buffer of this
    /// arena or any other bytes): remembered per slot in a shared arena, so that a block
    /// is checksummed once however often it is loaded (see `check`).
    pub fn checksum(&self, block: &[u8]) -> u32 {
        let slot = self.offset_of(block).and_then(|offset| {
            let s = self.shared.as_ref()?;
            (s.slab.lock().slot_start(offset) == Some(offset)).then_some((s, offset))
        });
        if let Some((s, offset)) = slot
            && let Some(crc) = s.checks.get(offset, block.len())
        {
            return crc;
        }
        let crc = check::crc32c(block);
        if let Some((s, offset)) = slot {
            s.checks.set(offset, block.len(), crc);
        }
        crc
    }

    /// Whether the pages are locked in RAM.
    pub fn locked(&self) -> bool {
        self.shared.as_ref().is_some_and(|s| s.region.locked())
    }

    /// What the arena holds now.
    pub fn stats(&self) -> ArenaStats {
        let Some(s) = &self.shared else {
            return ArenaStats::default();
        };
        ArenaStats {
            mapped_bytes: s.region.len() as u64,
            used_bytes: s.slab.lock().used_bytes() as u64,
            fallbacks: s.fallbacks.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frozen_block_keeps_its_slot_until_its_last_reader_drops_it() {
        let arena = Arena::new(1 << 20, ArenaConfig::default()).unwrap();
        let payload: Vec<u8> = (0..300_000u32).map(|i| (i * 31 + 7) as u8).collect();
        let a = arena.copy(&payload);
        assert_eq!(&a[..], &payload[..]);
        let used = arena.stats().used_bytes;
        assert_eq!(used, 300_000u64.next_multiple_of(4096));
        let reader = a.slice(1000..2000);
        drop(a);
        assert_eq!(
            arena.stats().used_bytes,
            used,
            "a reader still holds the slot"
        );
        // Another block of the same size gets another slot: the reader's bytes stay.
        let b = arena.copy(&vec![0xee; 300_000]);
        assert_eq!(&reader[..], &payload[1000..2000]);
        drop(reader);
        drop(b);
        assert_eq!(arena.stats().used_bytes, 0);
        assert_eq!(arena.stats().fallbacks, 0);
    }

    #[test]
    fn an_unfrozen_buffer_gives_its_slot_back_and_large_payloads_use_the_heap() {
        let arena = Arena::new(1 << 20, ArenaConfig::default()).unwrap();
        let mut buf = arena.buffer(10_000);
        assert!(buf.in_arena());
        assert_eq!(buf.append(&[1; 6000]), 6000);
        assert_eq!(buf.append(&[2; 6000]), 4000, "only what fits");
        assert_eq!(buf.remaining(), 0);
        drop(buf);
        assert_eq!(arena.stats().used_bytes, 0);
        let big = arena.buffer(SEGMENT_BYTES + 1);
        assert!(!big.in_arena());
        assert_eq!(arena.stats().fallbacks, 1);
        let off = Arena::new(
            1 << 20,
            ArenaConfig {
                enabled: false,
                ..ArenaConfig::default()
            },
        )
        .unwrap();
        assert!(!off.buffer(10).in_arena());
        assert_eq!(off.stats(), ArenaStats::default());
    }
}
