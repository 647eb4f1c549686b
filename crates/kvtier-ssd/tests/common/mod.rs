//! Helpers shared by the SSD tier's tests.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    dead_code,
    reason = "test helpers: not every test uses every helper"
)]

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use kvtier_core::clock::SystemClock;
use kvtier_core::tier::conformance::{RecordingSink, test_chain};
use kvtier_core::tier::{BlockMeta, ResidencySink};
use kvtier_core::{KvDtype, Layout, LayoutKey};
use kvtier_ssd::{SsdConfig, SsdTier};

/// 16 tokens × 4 layers × 2 heads × 64 dims × f16 × K,V = 32 KiB blocks.
pub fn layout() -> Layout {
    Layout::new(LayoutKey::new("ssd-test", KvDtype::F16, 16, 4, 2, 64)).expect("valid layout")
}

/// A chain of `n` blocks with distinct payloads.
pub fn chain(n: usize, seed: u32) -> Vec<(BlockMeta, Bytes)> {
    test_chain(&layout(), n, seed)
}

/// Small segments and 4 KiB checksum chunks, so tests cross segment and chunk boundaries.
pub fn config(dir: &Path) -> SsdConfig {
    let mut c = SsdConfig::new(dir);
    c.store.segment_bytes = 256 << 10;
    c.store.chunk_log2 = 12;
    // Tests run on whatever disk the machine has; they test the watermark explicitly.
    c.min_free_bytes = 0;
    c
}

pub fn open(dir: &Path) -> (SsdTier, Arc<RecordingSink>) {
    let sink = Arc::new(RecordingSink::default());
    let tier = SsdTier::open(
        config(dir),
        Arc::new(SystemClock::new()),
        sink.clone() as Arc<dyn ResidencySink>,
    )
    .expect("open SSD tier");
    (tier, sink)
}

/// XORs the byte at `offset` of `path` with `mask` (damage, as a bad sector or a bit flip
/// would do it).
pub fn flip(path: &Path, offset: u64, mask: u8) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, offset).unwrap();
    b[0] ^= mask;
    f.write_all_at(&b, offset).unwrap();
}
