//! `ssd.store.durable.256KiB.*`: stores acknowledged only once their bytes are on stable
//! storage (`Ack::Synced`), through the engine with an SSD tier — the path of
//! `POST /v1/store?durability=synced`.
//!
//! - `.c1.GBps`: one client storing one-block prompts one after another — against the
//!   better of `pwrite` + `fdatasync` per block and `O_DIRECT` write + `fdatasync` per
//!   block, into a fresh file.
//! - `.c16.GBps`: sixteen clients at once (group commit shares their syncs) — against the
//!   better of batches of 16 blocks written with `pwrite` then one `fdatasync`, and batches
//!   of 16 `O_DIRECT` writes all in flight (queue depth 16) then one `fdatasync`.
//! - `.c16.p99.ms`: the 99th percentile of one durable store's latency with sixteen
//!   clients — against the p99 of one batch of the better pattern above (a store in a
//!   group of sixteen cannot be acknowledged before such a batch is on disk).

use std::hint::black_box;
use std::path::Path;
use std::time::Instant;

use kvtier_core::tier::TierKind;
use kvtier_core::{Ack, Engine, ExtraKeys, KvDtype, LayoutKey, Prompt, StoreOptions};

use super::measure::{pattern, seconds};
use super::raw_write::{AlignedCopy, write_batches};
use super::{Effort, Row};

/// Concurrent clients of the `c16` rows.
const CLIENTS: usize = 16;

/// `n` one-block prompts with distinct tokens.
fn prompts(engine: &Engine, key: &LayoutKey, n: usize, salt: u32) -> anyhow::Result<Vec<Prompt>> {
    let layout = engine.register_layout(key.clone())?;
    (0..n)
        .map(|i| {
            let tokens: Vec<u32> = (0..16)
                .map(|t| salt * 10_000_000 + i as u32 * 16 + t)
                .collect();
            Ok(engine.prompt(layout.digest(), &tokens, &ExtraKeys::none())?)
        })
        .collect()
}

fn durable() -> StoreOptions {
    StoreOptions {
        ack: Some(Ack::Synced),
        ..StoreOptions::default()
    }
}

fn p99(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() * 99 / 100).copied().unwrap_or(0.0)
}

pub fn rows(
    effort: Effort,
    wanted: &dyn Fn(&str) -> bool,
    root: &Path,
) -> anyhow::Result<Vec<Row>> {
    let c1_name = "ssd.store.durable.256KiB.c1.GBps";
    let c16_name = "ssd.store.durable.256KiB.c16.GBps";
    let p99_name = "ssd.store.durable.256KiB.c16.p99.ms";
    let want_c1 = wanted(c1_name);
    let want_c16 = wanted(c16_name) | wanted(p99_name);
    if !want_c1 && !want_c16 {
        return Ok(Vec::new());
    }
    let key = LayoutKey::new("bench-durable", KvDtype::Bf16, 16, 4, 8, 128);
    let size = kvtier_core::Layout::new(key.clone())?.block_bytes() as usize;
    let payload = pattern(size, 11);
    let aligned = AlignedCopy::new(&payload);
    let stride = kvtier_ssd::format::align_up(size as u64 + 4096);
    let n1 = 128 * effort.scale;
    let batches = 32 * effort.scale;
    let n16 = batches * CLIENTS;
    // Per sample: ours and the better baseline pattern (index 0 buffered, 1 direct).
    let mut c1 = Paired::default();
    let mut c16 = Paired::default();
    let mut p99s = Paired::default();
    for sample in 0..effort.samples.min(7) {
        // This sample's throughputs of [ours, buffered, direct] and latencies (ms).
        let mut g1 = [0.0f64; 3];
        let mut g16 = [0.0f64; 3];
        let mut lat_ours = Vec::new();
        let mut lat_batch: [Vec<f64>; 2] = Default::default();
        let dir = root.join(format!("durable-{sample}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let e = super::rows_ssd::engine_with_ssd(&dir.join("store"), 1 << 30)?;
        let raw = dir.join("raw");
        if want_c1 {
            let ps = prompts(&e, &key, n1, sample as u32 * 2)?;
            for turn in 0..3 {
                match (turn + sample) % 3 {
                    0 => {
                        let secs = seconds(|| {
                            for p in &ps {
                                black_box(e.store_with(p, &[&payload], durable()).ok());
                            }
                        });
                        g1[0] = (n1 * size) as f64 / secs / 1e9;
                    }
                    k => {
                        let direct = k == 2;
                        if let Some(s) =
                            write_batches(&raw, &payload, &aligned, n1, 1, stride, direct)?
                        {
                            g1[k] = (n1 * size) as f64 / s.iter().sum::<f64>() / 1e9;
                        }
                    }
                }
            }
        }
        if want_c16 {
            let ps = prompts(&e, &key, n16, sample as u32 * 2 + 1)?;
            for turn in 0..3 {
                match (turn + sample) % 3 {
                    0 => {
                        let t = Instant::now();
                        let lat: Vec<Vec<f64>> = std::thread::scope(|s| {
                            let workers: Vec<_> = ps
                                .chunks(n16 / CLIENTS)
                                .map(|mine| {
                                    let (e, payload) = (&e, &payload);
                                    s.spawn(move || {
                                        mine.iter()
                                            .map(|p| {
                                                let t = Instant::now();
                                                black_box(
                                                    e.store_with(p, &[payload], durable()).ok(),
                                                );
                                                t.elapsed().as_secs_f64() * 1e3
                                            })
                                            .collect::<Vec<f64>>()
                                    })
                                })
                                .collect();
                            workers.into_iter().filter_map(|w| w.join().ok()).collect()
                        });
                        g16[0] = (n16 * size) as f64 / t.elapsed().as_secs_f64() / 1e9;
                        lat_ours.extend(lat.into_iter().flatten());
                    }
                    k => {
                        let direct = k == 2;
                        if let Some(s) = write_batches(
                            &raw, &payload, &aligned, batches, CLIENTS, stride, direct,
                        )? {
                            g16[k] = (n16 * size) as f64 / s.iter().sum::<f64>() / 1e9;
                            lat_batch[k - 1].extend(s.iter().map(|x| x * 1e3));
                        }
                    }
                }
            }
        }
        if want_c1 {
            c1.push(g1);
        }
        if want_c16 {
            let which = c16.push(g16);
            p99s.ours.push(p99(&mut lat_ours));
            p99s.base.push(p99(&mut lat_batch[which]));
        }
        // Every store must really be on the SSD tier: otherwise the figure measured
        // something else.
        let held = e.stats().tier(TierKind::Ssd).map_or(0, |t| t.stores);
        drop(e);
        let _ = std::fs::remove_dir_all(&dir);
        let expected = if want_c1 { n1 } else { 0 } + if want_c16 { n16 } else { 0 };
        anyhow::ensure!(
            held as usize >= expected,
            "only {held} of {expected} durable stores reached the SSD tier"
        );
    }
    let mut rows = Vec::new();
    if want_c1 {
        rows.push(Row::paired(
            c1_name,
            &c1.ours,
            &c1.base,
            "GB/s",
            c1.note(
                "pwrite + fdatasync per block",
                "O_DIRECT write + fdatasync per block",
            ),
        ));
    }
    if want_c16 {
        rows.push(Row::paired(
            c16_name,
            &c16.ours,
            &c16.base,
            "GB/s",
            c16.note(
                "batches of 16 pwrites + one fdatasync",
                "batches of 16 O_DIRECT writes at QD 16 + one fdatasync",
            ),
        ));
        rows.push(Row::paired(
            p99_name,
            &p99s.ours,
            &p99s.base,
            "ms",
            "p99 of one batch of the c16 baseline, same sample (16 blocks + fdatasync)",
        ));
    }
    Ok(rows)
}

/// Ours and the better of two baselines, sample by sample.
#[derive(Default)]
struct Paired {
    ours: Vec<f64>,
    base: Vec<f64>,
    /// Samples the direct pattern won.
    direct_wins: usize,
}

impl Paired {
    /// Records one sample's [ours, buffered, direct]; returns which baseline won (0, 1).
    fn push(&mut self, g: [f64; 3]) -> usize {
        self.ours.push(g[0]);
        let which = usize::from(g[2] > g[1]);
        self.base.push(g[1 + which]);
        self.direct_wins += which;
        which
    }

    fn note(&self, buffered: &str, direct: &str) -> String {
        format!(
            "better per sample of: {buffered} / {direct} (the latter won {} of {})",
            self.direct_wins,
            self.ours.len()
        )
    }
}
