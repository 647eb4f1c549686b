//! `ram.store.*` and `ram.load.*`: moving block payloads into and out of the RAM tier,
//! against memcpy of the same sizes in the same run.

use std::hint::black_box;
use std::sync::Arc;

use kvtier_core::tier::RamConfig;
use kvtier_core::{Engine, ExtraKeys, KvDtype, Layout, LayoutKey, Lookup, Prompt};

use super::measure::{cold_copy_gbps, median_of, memcpy_gbps, pattern, seconds};
use super::{Effort, Row};

/// (label, layers): 16 tokens × 8 KV heads × 128 dims × 2 bytes × K and V = 64 KiB per layer.
const SIZES: [(&str, u32); 2] = [("256KiB", 4), ("2MiB", 32)];

fn layout_key(layers: u32) -> LayoutKey {
    LayoutKey::new("bench-ram", KvDtype::Bf16, 16, layers, 8, 128)
}

/// `n` one-block prompts with distinct tokens, so every store is a new block.
fn prompts(engine: &Engine, layout: &Layout, n: usize, salt: u32) -> anyhow::Result<Vec<Prompt>> {
    (0..n)
        .map(|i| {
            let tokens: Vec<u32> = (0..16)
                .map(|t| (i as u32) * 16 + t + (salt << 24))
                .collect();
            Ok(engine.prompt(layout.digest(), &tokens, &ExtraKeys::none())?)
        })
        .collect()
}

pub fn rows(effort: Effort, wanted: &dyn Fn(&str) -> bool) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    for (label, layers) in SIZES {
        for threads in [1usize, 2] {
            let suffix = if threads == 1 { "" } else { ".t2" };
            let store = format!("ram.store.{label}.GBps{suffix}");
            if wanted(&store) {
                rows.push(store_row(store, layers, threads, effort)?);
            }
            let load = format!("ram.load.{label}.GBps{suffix}");
            let load_ns = format!("ram.load.{label}.ns{suffix}");
            if wanted(&load) || wanted(&load_ns) {
                let (gbps, ns) = load_rows(load, load_ns, layers, threads, effort)?;
                rows.extend([gbps, ns]);
            }
        }
    }
    Ok(rows)
}

fn store_row(name: String, layers: u32, threads: usize, effort: Effort) -> anyhow::Result<Row> {
    // A budget well below the bytes written, so stores run in steady state with evictions.
    let capacity: u64 = 64 << 20;
    let engine = Engine::builder()
        .ram(RamConfig {
            capacity_bytes: capacity,
        })
        .build()?;
    let layout = engine.register_layout(layout_key(layers))?;
    let size = layout.block_bytes() as usize;
    let per_sample = ((256usize << 20) * effort.scale / size / threads).max(8);
    let per_thread: Vec<Vec<Prompt>> = (0..threads)
        .map(|t| {
            prompts(
                &engine,
                &layout,
                per_sample * (effort.samples + 1),
                t as u32,
            )
        })
        .collect::<anyhow::Result<_>>()?;
    let sources: Vec<Vec<u8>> = (0..threads).map(|t| pattern(size, t as u8)).collect();
    // Warm up the allocator and the budget with one sample's worth.
    let mut round = 0;
    let mut sample = || -> anyhow::Result<f64> {
        let r = round;
        round += 1;
        let secs = seconds(|| {
            std::thread::scope(|s| {
                for (t, src) in sources.iter().enumerate() {
                    let (engine, mine) = (
                        &engine,
                        &per_thread[t][r * per_sample..(r + 1) * per_sample],
                    );
                    s.spawn(move || {
                        for p in mine {
                            let rep = engine.store(p, &[src.as_slice()]);
                            black_box(rep.ok());
                        }
                    });
                }
            });
        });
        Ok((size * per_sample * threads) as f64 / secs / 1e9)
    };
    sample()?;
    let mut results = Vec::new();
    for _ in 0..effort.samples {
        results.push(sample()?);
    }
    results.sort_by(f64::total_cmp);
    let ours = results[results.len() / 2];
    let stats = engine.stats();
    anyhow::ensure!(
        stats.ram.evictions.budget > 0,
        "store bench ran without evictions"
    );
    anyhow::ensure!(stats.ram.resident_bytes <= capacity, "budget exceeded");
    // The same kind of destination as the RAM tier's: a ring as large as its budget, far
    // beyond the CPU cache, every page already faulted (the arena is warm).
    let base = cold_copy_gbps(size, capacity as usize, per_sample, effort.samples, threads);
    Ok(Row::new(
        name,
        ours,
        "GB/s",
        base,
        "best of memcpy and streaming stores into a ring of warm destinations as large as the budget",
    ))
}

fn load_rows(
    name: String,
    name_ns: String,
    layers: u32,
    threads: usize,
    effort: Effort,
) -> anyhow::Result<(Row, Row)> {
    let blocks_per_thread = 64;
    let engine = Engine::builder()
        .ram(RamConfig {
            capacity_bytes: 256 << 20,
        })
        .build()?;
    let layout = engine.register_layout(layout_key(layers))?;
    let size = layout.block_bytes() as usize;
    let src = pattern(size, 9);
    let mut refs: Vec<Vec<Lookup>> = Vec::new();
    for t in 0..threads {
        let ps = prompts(&engine, &layout, blocks_per_thread, 100 + t as u32)?;
        let mut mine = Vec::new();
        for p in &ps {
            engine.store(p, &[src.as_slice()])?;
            let hit = engine.lookup(p);
            anyhow::ensure!(hit.blocks.len() == 1, "setup block not resident");
            mine.push(hit);
        }
        refs.push(mine);
    }
    let refs = Arc::new(refs);
    let loads = 20_000 * effort.scale;
    let ns_per_load = median_of(effort.samples, || {
        let secs = seconds(|| {
            std::thread::scope(|s| {
                for mine in refs.iter() {
                    let engine = &engine;
                    s.spawn(move || {
                        for i in 0..loads {
                            let got = engine.load(&mine[i % mine.len()]);
                            black_box(got.ok());
                        }
                    });
                }
            });
        });
        secs * 1e9 / loads as f64
    });
    let gbps = (size * threads) as f64 / ns_per_load;
    let base_gbps = memcpy_gbps(size, (256 << 20) / size, effort.samples, threads);
    let base_ns = size as f64 / base_gbps;
    Ok((
        Row::new(name, gbps, "GB/s", base_gbps, "memcpy, same size"),
        Row::new(name_ns, ns_per_load, "ns", base_ns, "memcpy of one block"),
    ))
}
