//! Per-block extra keys, such as digests of the images a block's tokens stand for.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

/// Extra keys attached to blocks by index. A block with extra keys hashes differently from
/// the same tokens without them, or with other keys, or with the same keys in another order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExtraKeys {
    by_block: BTreeMap<usize, Vec<Vec<u8>>>,
}

impl ExtraKeys {
    /// No extra keys.
    pub fn none() -> Self {
        Self::default()
    }

    /// Appends `key` to block `block`'s keys.
    pub fn push(&mut self, block: usize, key: Vec<u8>) {
        self.by_block.entry(block).or_default().push(key);
    }

    /// True when no block has extra keys.
    pub fn is_empty(&self) -> bool {
        self.by_block.is_empty()
    }

    /// The highest block index that has keys.
    pub fn last_block(&self) -> Option<usize> {
        self.by_block.keys().next_back().copied()
    }

    /// The tags of blocks `0..blocks` ([`ExtraKeys::tag`] of each); empty when there are
    /// no extra keys, as `hash::chain_extend` takes them.
    pub fn tags(&self, blocks: usize) -> Vec<Option<[u8; 16]>> {
        if self.is_empty() {
            return Vec::new();
        }
        (0..blocks).map(|i| self.tag(i)).collect()
    }

    /// The 128-bit tag mixed into block `block`'s hash, or `None` if it has no keys.
    pub fn tag(&self, block: usize) -> Option<[u8; 16]> {
        if self.by_block.is_empty() {
            return None;
        }
        let keys = self.by_block.get(&block)?;
        let mut h = Sha256::new();
        h.update(b"kvtier/extra-keys/v1");
        h.update((keys.len() as u64).to_le_bytes());
        for k in keys {
            h.update((k.len() as u64).to_le_bytes());
            h.update(k);
        }
        let full = h.finalize();
        let mut tag = [0u8; 16];
        tag.copy_from_slice(&full[..16]);
        Some(tag)
    }
}
