//! Helpers shared by the integration tests.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed expectation is a failed test"
)]

use std::sync::Arc;

use kvtier_core::{BlockHash, Engine, KvDtype, Layout, LayoutKey};

/// A small layout: 16 tokens per block, 2 layers, 2 KV heads, head_dim 4, f16:
/// 16 × 2 × 4 × 2 bytes × (K, V) = 512 bytes per page, 1 KiB per block.
pub fn small_key() -> LayoutKey {
    let mut k = LayoutKey::new("test-model", KvDtype::F16, 16, 2, 2, 4);
    k.weights_digest = "w1".into();
    k.tokenizer_digest = "t1".into();
    k
}

/// The payload kvtier must return for block `hash` of `layout`: derived from the key, so
/// any block read back can be checked against the key it was read under.
pub fn payload_for(layout: &Layout, hash: &BlockHash) -> Vec<u8> {
    let seed = hash.low64();
    (0..layout.block_bytes() as usize)
        .map(|i| (seed.rotate_left((i % 61) as u32) as u8) ^ (i as u8))
        .collect()
}

/// Stores every whole block of `tokens` with payloads from [`payload_for`].
pub fn store_all(
    engine: &Engine,
    layout: &Arc<Layout>,
    tokens: &[u32],
) -> kvtier_core::Result<kvtier_core::StoreReport> {
    let prompt = engine.prompt(layout.digest(), tokens, &kvtier_core::ExtraKeys::none())?;
    let payloads: Vec<Vec<u8>> = prompt
        .hashes()
        .iter()
        .map(|h| payload_for(layout, h))
        .collect();
    let refs: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
    engine.store(&prompt, &refs)
}
