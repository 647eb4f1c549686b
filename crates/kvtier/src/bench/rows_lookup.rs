//! `lookup.hit_128k.ms` and `lookup.miss.us`: the index walk, given the block hashes.
//! `lookup.miss_from_tokens_128k.us`: a miss from the tokens up (the prompt made, hashed
//! as far as the walk goes, walked), against hashing the one block a miss must hash and
//! one plain probe.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::hint::black_box;

use kvtier_core::tier::RamConfig;
use kvtier_core::{Engine, ExtraKeys, KvDtype, LayoutKey};

use super::measure::{median_of, seconds};
use super::{Effort, Row};

const TOKENS: usize = 131_072;
const TPB: usize = 16;

/// The baseline map: no locks, no verification, the hash's low word as its own hash.
type PlainMap = HashMap<u64, u32, BuildHasherDefault<LowBits>>;

#[derive(Default)]
struct LowBits(u64);

impl std::hash::Hasher for LowBits {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, _: &[u8]) {}
    fn write_u64(&mut self, w: u64) {
        self.0 = w;
    }
}

pub fn rows(effort: Effort, wanted: &dyn Fn(&str) -> bool) -> anyhow::Result<Vec<Row>> {
    let (hit_name, miss_name) = ("lookup.hit_128k.ms", "lookup.miss.us");
    let cold_name = "lookup.miss_from_tokens_128k.us";
    if !wanted(hit_name) && !wanted(miss_name) && !wanted(cold_name) {
        return Ok(vec![]);
    }
    // Tiny blocks: this measures the index, not memory.
    let engine = Engine::builder()
        .ram(RamConfig {
            capacity_bytes: 256 << 20,
        })
        .build()?;
    let layout =
        engine.register_layout(LayoutKey::new("bench", KvDtype::F16, TPB as u32, 1, 1, 1))?;
    let tokens: Vec<u32> = (0..TOKENS as u32)
        .map(|t| t.wrapping_mul(2_654_435_761) % 262_144)
        .collect();
    let prompt = engine.prompt(layout.digest(), &tokens, &ExtraKeys::none())?;
    let payload = vec![1u8; layout.block_bytes() as usize];
    let payloads: Vec<&[u8]> = (0..prompt.num_blocks())
        .map(|_| payload.as_slice())
        .collect();
    let report = engine.store(&prompt, &payloads)?;
    anyhow::ensure!(
        report.stored == TOKENS / TPB,
        "setup stored only {} blocks",
        report.stored
    );

    let mut miss_tokens = tokens.clone();
    miss_tokens[0] ^= 1;
    let miss_prompt = engine.prompt(layout.digest(), &miss_tokens, &ExtraKeys::none())?;
    // The walk rows time the index given the hashes: a prompt computes its chain lazily
    // and a miss's walk keeps none, so the miss prompt is hashed here, outside the timed
    // loop (the stored prompt was hashed by its store).
    let _ = miss_prompt.hashes();

    let plain: PlainMap = prompt
        .hashes()
        .iter()
        .enumerate()
        .map(|(i, h)| (h.low64(), i as u32))
        .collect();
    let plain_walk = |hashes: &[kvtier_core::BlockHash]| {
        let mut n = 0;
        for h in hashes {
            // Read the value, as the index reads its entry.
            let Some(v) = plain.get(&h.low64()) else {
                break;
            };
            black_box(v);
            n += 1;
        }
        n
    };

    let reps = 10 * effort.scale;
    let mut rows = Vec::new();
    if wanted(hit_name) {
        let ours = median_of(effort.samples, || {
            seconds(|| {
                for _ in 0..reps {
                    let l = engine.lookup(black_box(&prompt));
                    assert_eq!(l.blocks.len(), TOKENS / TPB);
                }
            }) * 1e3
                / reps as f64
        });
        let base = median_of(effort.samples, || {
            seconds(|| {
                for _ in 0..reps {
                    assert_eq!(plain_walk(black_box(prompt.hashes())), TOKENS / TPB);
                }
            }) * 1e3
                / reps as f64
        });
        rows.push(Row::new(
            hit_name,
            ours,
            "ms",
            base,
            "plain HashMap probes, no locks",
        ));
    }
    if wanted(miss_name) {
        let reps = 10_000 * effort.scale;
        let ours = median_of(effort.samples, || {
            seconds(|| {
                for _ in 0..reps {
                    assert!(engine.lookup(black_box(&miss_prompt)).is_miss());
                }
            }) * 1e6
                / reps as f64
        });
        let base = median_of(effort.samples, || {
            seconds(|| {
                for _ in 0..reps {
                    assert_eq!(plain_walk(black_box(miss_prompt.hashes())), 0);
                }
            }) * 1e6
                / reps as f64
        });
        rows.push(Row::new(
            miss_name,
            ours,
            "us",
            base,
            "plain HashMap probe, no locks",
        ));
    }
    if wanted(cold_name) {
        let reps = 100 * effort.scale;
        let digest = layout.digest();
        let ours = median_of(effort.samples, || {
            seconds(|| {
                for _ in 0..reps {
                    let missed = engine
                        .prompt(digest, black_box(&miss_tokens), &ExtraKeys::none())
                        .map(|p| engine.lookup(&p).is_miss());
                    assert!(matches!(missed, Ok(true)));
                }
            }) * 1e6
                / reps as f64
        });
        let first = &miss_tokens[..TPB];
        let base = median_of(effort.samples, || {
            seconds(|| {
                for _ in 0..reps {
                    let h = kvtier_core::hash::chain(&layout, black_box(first), &ExtraKeys::none());
                    assert_eq!(plain_walk(black_box(&h)), 0);
                }
            }) * 1e6
                / reps as f64
        });
        rows.push(Row::new(
            cold_name,
            ours,
            "us",
            base,
            "the first block's hash and one plain probe",
        ));
    }
    Ok(rows)
}
