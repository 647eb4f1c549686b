//! `ssd.*` rows of the lossless codec (ADR 0021), on 2 MiB bf16 blocks shaped like KV
//! (Gaussian values, a different spread per head; real KV is measured by the `codec.*`
//! model rows):
//!
//! - `ssd.store.2MiB.lossless.GBps`: the SSD tier storing blocks through the codec as
//!   the engine's stores reach it — queued on its write-behind worker, which hands the
//!   tier what is queued in batches (pages encoded ahead while records are appended) —
//!   then one `fdatasync`; against the same tier storing the same blocks raw the same
//!   way in the same sample.
//! - `ssd.load.2MiB.effective.GBps`: reading them back decoded (decoded bytes per second,
//!   page cache dropped first, a primer's reads just before) — against the better of
//!   cached and O_DIRECT `pread`s of the same decoded bytes from a raw file, measured the
//!   same way (`cold_loads.rs`, as the raw tier's load rows). `--ssd-mib` sets the bytes.

use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kvtier_codec::Codec;
use kvtier_core::clock::SystemClock;
use kvtier_core::tier::writer::{WriteBehind, WriterConfig};
use kvtier_core::tier::{BlockMeta, NoSink, Tier};
use kvtier_core::{KvDtype, Layout, LayoutKey};
use kvtier_ssd::{SsdConfig, SsdTier};

use super::cold_loads::{Loads, RawBlocks};
use super::{Effort, Row};

const STORE: &str = "ssd.store.2MiB.lossless.GBps";
const LOAD: &str = "ssd.load.2MiB.effective.GBps";

/// bf16 bytes of `size` shaped like a KV page: each head's 128 values Gaussian with its
/// own spread.
pub fn kv_like_bf16(size: usize, seed: u64) -> Vec<u8> {
    const SPREAD: [f32; 8] = [0.5, 1.0, 2.0, 4.0, 0.25, 1.5, 3.0, 0.75];
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut uniform = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    let mut out = Vec::with_capacity(size);
    let mut i = 0usize;
    while out.len() < size {
        // Box–Muller: one normal value per pair of uniforms.
        let (u, v) = (uniform(), uniform());
        let normal = (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos();
        let value = normal as f32 * SPREAD[(i / 128) % SPREAD.len()];
        let bits = value.to_bits();
        let rounded = (bits + 0x7fff + ((bits >> 16) & 1)) >> 16;
        out.extend_from_slice(&(rounded as u16).to_le_bytes());
        i += 1;
    }
    out.truncate(size);
    out
}

/// A Llama-3-8B-shaped bf16 layout named `name`: 16 tokens × 32 layers × 8 KV heads ×
/// head dim 128, 2 MiB blocks, the pages [`kv_like_bf16`] fills.
pub fn kv_like_layout(name: &str) -> anyhow::Result<Layout> {
    Ok(Layout::new(LayoutKey::new(
        name,
        KvDtype::Bf16,
        16,
        32,
        8,
        128,
    ))?)
}

fn open(dir: &Path, codec: Codec, layout: &Layout) -> anyhow::Result<SsdTier> {
    let mut config = SsdConfig::new(dir);
    config.codec.default = codec;
    config.min_free_bytes = 0;
    let tier = SsdTier::open(config, Arc::new(SystemClock::new()), Arc::new(NoSink))?;
    tier.layout_registered(layout);
    Ok(tier)
}

/// Seconds to store `payloads` through a write-behind worker in front of `tier` (its
/// queue holds all of them, as the engine's default of 512 would) and sync them.
fn store_behind(
    tier: &Arc<SsdTier>,
    metas: &[BlockMeta],
    payloads: &[Bytes],
) -> anyhow::Result<f64> {
    let config = WriterConfig {
        queue_len: payloads.len().max(1),
        ..WriterConfig::default()
    };
    let writer = WriteBehind::start(tier.clone(), config)?;
    let started = Instant::now();
    for (m, p) in metas.iter().zip(payloads) {
        black_box(writer.enqueue(m.clone(), p.clone()));
    }
    anyhow::ensure!(
        writer.flush(Duration::from_secs(120)),
        "the writer did not drain"
    );
    tier.sync()?;
    let took = started.elapsed().as_secs_f64();
    writer.stop(Duration::from_secs(10));
    anyhow::ensure!(writer.take_unwritten() == 0, "a block was not written");
    Ok(took)
}

pub fn rows(
    effort: Effort,
    wanted: &dyn Fn(&str) -> bool,
    root: &Path,
) -> anyhow::Result<Vec<Row>> {
    if !wanted(STORE) && !wanted(LOAD) {
        return Ok(Vec::new());
    }
    let layout = kv_like_layout("bench-ssd-codec")?;
    let size = layout.block_bytes() as usize;
    let n = (effort.ssd_bytes / size).max(8);
    let payloads: Vec<Bytes> = (0..n)
        .map(|i| Bytes::from(kv_like_bf16(size, i as u64 + 1)))
        .collect();
    let metas = super::rows_ssd::blocks(&layout, n, 77);
    let bytes = (n * size) as f64;
    let (mut store_enc, mut store_raw) = (Vec::new(), Vec::new());
    let mut loads = Loads::default();
    let mut ratio = 0.0;
    for sample in 0..effort.samples.min(5) {
        let dir = root.join(format!("codec-{sample}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let raw_tier = Arc::new(open(&dir.join("raw"), Codec::Raw, &layout)?);
        let tier = Arc::new(open(&dir.join("lossless"), Codec::Lossless, &layout)?);
        // The two stores alternate which goes first.
        for turn in 0..2 {
            let (t, out) = if (turn + sample) % 2 == 0 {
                (&tier, &mut store_enc)
            } else {
                (&raw_tier, &mut store_raw)
            };
            out.push(bytes / store_behind(t, &metas, &payloads)? / 1e9);
        }
        drop(raw_tier);
        let s = tier.stats().codec;
        ratio = s.lossless_decoded_bytes as f64 / s.lossless_stored_bytes.max(1) as f64;
        // The baseline's file: the same decoded bytes, written untimed.
        let raw = RawBlocks::write(
            &dir.join("raw-file"),
            payloads.iter().map(|p| p.as_ref()),
            size,
        )?;
        loads.sample_tier(sample, tier.as_ref(), &metas, &raw);
        drop(tier);
        let _ = std::fs::remove_dir_all(&dir);
    }
    let (ours, baseline, note) = loads.medians();
    Ok(vec![
        Row::paired(
            STORE,
            &store_enc,
            &store_raw,
            "GB/s",
            format!(
                "the SSD tier storing the same blocks raw, same sample (target ≥ 0.9×); ratio {ratio:.2}×"
            ),
        ),
        Row::new(
            LOAD,
            ours,
            "GB/s",
            baseline,
            format!(
                "{note}; decoded bytes (target ≥ 1.3× where the disk is the limit); ratio {ratio:.2}×"
            ),
        ),
    ])
}
