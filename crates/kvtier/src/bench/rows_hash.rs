//! `hash.ns_per_token`: hashing a 131,072-token prompt into its block-hash chain.

use std::hint::black_box;

use kvtier_core::hash::{self, ExtraKeys};
use kvtier_core::{KvDtype, Layout, LayoutKey};
use sha2::{Digest, Sha256};

use super::measure::{median_of, seconds};
use super::{Effort, Row};

const TOKENS: usize = 131_072;

pub fn rows(effort: Effort, wanted: &dyn Fn(&str) -> bool) -> anyhow::Result<Vec<Row>> {
    let name = "hash.ns_per_token";
    if !wanted(name) {
        return Ok(vec![]);
    }
    let layout = Layout::new(LayoutKey::new("bench", KvDtype::Bf16, 16, 32, 8, 128))?;
    let tokens: Vec<u32> = (0..TOKENS as u32)
        .map(|t| t.wrapping_mul(2_654_435_761) % 262_144)
        .collect();
    let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    let reps = 2 * effort.scale;
    let chain = median_of(effort.samples, || {
        seconds(|| {
            for _ in 0..reps {
                black_box(hash::chain(&layout, black_box(&tokens), &ExtraKeys::none()));
            }
        }) * 1e9
            / (TOKENS * reps) as f64
    });
    // Baseline: SHA-256 of the same bytes in one streaming call, which does the same
    // number of compressions with no chain bookkeeping at all.
    let plain = median_of(effort.samples, || {
        seconds(|| {
            for _ in 0..reps {
                black_box(Sha256::digest(black_box(&bytes)));
            }
        }) * 1e9
            / (TOKENS * reps) as f64
    });
    Ok(vec![Row::new(
        name,
        chain,
        "ns",
        plain,
        "one SHA-256 over the same bytes",
    )])
}
