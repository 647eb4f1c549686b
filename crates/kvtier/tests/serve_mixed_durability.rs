//! Durability promises hold when levels are mixed (issue 35, ADR 0016), against the real
//! `kvtier serve` process:
//! - the reproduction: a prompt stored `queued`, then again `written` or `synced` (every
//!   block a duplicate), then kill -9 at once, a flush then kill -9, or SIGTERM — after
//!   the restart every block is served exact;
//! - a model check: random sequences of stores at each level, duplicate stores, layout
//!   deletes, flushes, pauses in which compaction runs, SIGTERM and kill -9; after every
//!   restart each block the model says must survive is served exact and no deleted block
//!   comes back;
//! - a crash test: three writers storing at random levels (and storing again what they
//!   stored, at another level) while flushes run, rounds ended by kill -9 or SIGTERM;
//!   after each restart every durably acknowledged block, and every block acknowledged
//!   before a clean stop or a `drained: true` flush, is served exact.
//!
//! Sizes for CI; `KVTIER_MIXED_TRIALS`, `KVTIER_MIXED_SEQUENCES`, `KVTIER_MIXED_ROUNDS`
//! and `KVTIER_MIXED_ROUND_MS` make them longer (BENCHMARKS.md, issue 35);
//! `KVTIER_MIXED_SEED` replays a printed seed.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code"
)]

mod server;

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kvtier_client::Client;
use kvtier_client::wire::{LayoutInfo, LayoutSpec};
use parking_lot::Mutex;
use server::{Server, layout_spec, load_all, payloads, prompt, runtime};

const LEVELS: [&str; 3] = ["queued", "written", "synced"];

/// Small segments and a fast maintenance pass, so compaction moves records while the
/// tests run: three 16 KiB blocks (20 KiB records) per segment, so with prompts of two
/// blocks a segment holds blocks of two prompts, and a layout delete leaves segments a
/// third full (compaction moves what is left of a segment under half full).
const COMPACTING: &[&str] = &[
    "--set",
    "ssd.segment_size=64KiB",
    "--set",
    "ssd.maintenance_every=100ms",
];

fn env_or(name: &str, default: u32) -> u32 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A xorshift generator: each test prints its seed, so a failure can be replayed.
struct Rng(u64);

impl Rng {
    fn seeded(name: &str) -> Rng {
        let seed = std::env::var("KVTIER_MIXED_SEED")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
                    | 1
            });
        println!("{name}: KVTIER_MIXED_SEED={seed}");
        Rng(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// How many leading blocks of prompt `seed` the server serves, each checked byte for
/// byte: a block served with other bytes fails the test.
async fn served(c: &Client, layout: &LayoutInfo, seed: u32, blocks: usize) -> usize {
    let p = prompt(layout, seed, blocks);
    let hit = c.lookup(&p).await.unwrap();
    if hit.blocks() == 0 {
        return 0;
    }
    let got = load_all(c, layout, &hit).await;
    let want = payloads(layout, seed, blocks);
    for (i, block) in got.blocks.iter().enumerate() {
        assert_eq!(
            block, &want[i],
            "prompt {seed}: block {i} served wrong bytes"
        );
    }
    got.blocks.len()
}

async fn register(c: &Client, specs: &[LayoutSpec]) -> Vec<LayoutInfo> {
    let mut out = Vec::new();
    for s in specs {
        out.push(c.register_layout(s).await.unwrap());
    }
    out
}

// ---------------------------------------------------------------------------------------
// The reproduction of issue 35.

const REPRO_BLOCKS: usize = 6;

#[derive(Debug, Clone, Copy)]
enum End {
    KillAtOnce,
    FlushThenKill,
    Sigterm,
}

/// One trial: returns how many of the prompt's blocks were served after the restart.
fn repro_trial(dir: &Path, level: &str, end: End, seed: u32) -> usize {
    let rt = runtime();
    let spec = layout_spec("mixed-repro", 2);
    let server = Server::start(dir, &[]);
    let c = server.client();
    let layout = rt.block_on(c.register_layout(&spec)).unwrap();
    let p = prompt(&layout, seed, REPRO_BLOCKS);
    let first = rt
        .block_on(c.store(&p, payloads(&layout, seed, REPRO_BLOCKS)))
        .unwrap();
    assert_eq!(first.stored, REPRO_BLOCKS);
    let again = rt
        .block_on(c.store_durable(&p, payloads(&layout, seed, REPRO_BLOCKS), Some(level)))
        .unwrap();
    assert_eq!(again.duplicates, REPRO_BLOCKS);
    assert_eq!(again.durability, level);
    match end {
        End::KillAtOnce => server.kill9(),
        End::FlushThenKill => {
            std::thread::sleep(Duration::from_secs(1));
            let flushed = rt.block_on(server.admin().admin_flush_report()).unwrap();
            assert!(flushed.drained, "{flushed:?}");
            server.kill9();
        }
        End::Sigterm => {
            std::thread::sleep(Duration::from_millis(500));
            assert!(server.stop().success());
        }
    }
    let server = Server::start(dir, &[]);
    let c = server.client();
    let layout = rt.block_on(c.register_layout(&spec)).unwrap();
    let n = rt.block_on(served(&c, &layout, seed, REPRO_BLOCKS));
    assert!(server.stop().success());
    n
}

#[test]
fn a_durable_store_of_queued_blocks_keeps_them_at_every_end() {
    let trials = env_or("KVTIER_MIXED_TRIALS", 3);
    let mut lost = Vec::new();
    for level in ["written", "synced"] {
        for end in [End::KillAtOnce, End::FlushThenKill, End::Sigterm] {
            let mut lost_here = 0;
            for t in 0..trials {
                let dir = tempfile::tempdir().unwrap();
                let n = repro_trial(dir.path(), level, end, 7 + t);
                lost_here += u32::from(n != REPRO_BLOCKS);
            }
            println!("{level:>7} {end:?}: lost in {lost_here} of {trials} trials");
            if lost_here > 0 {
                lost.push(format!("{level} {end:?}: {lost_here} of {trials}"));
            }
        }
    }
    assert!(lost.is_empty(), "acknowledged blocks lost: {lost:?}");
}

// ---------------------------------------------------------------------------------------
// The model check.

const MODEL_BLOCKS: usize = 2;

/// What the model knows of a prompt it stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kept {
    /// Must be served exact after any restart: acknowledged `written` or `synced`, or at
    /// any level before a clean stop or a `drained: true` flush.
    Safe,
    /// Acknowledged `queued` since: a kill -9 may lose it, nothing may change it.
    Queued,
}

struct Model {
    /// Prompt seed → (layout index, what is known).
    kept: HashMap<u32, (usize, Kept)>,
    /// Prompts deleted with their layout and not stored since: never served again.
    deleted: HashSet<u32>,
}

impl Model {
    fn all_safe(&mut self) {
        for (_, k) in self.kept.values_mut() {
            *k = Kept::Safe;
        }
    }
}

/// Checks the running server against the model. `after_kill`: prompts acknowledged only
/// `queued` may be gone (they are dropped from the model, or become safe if they are
/// there: a restart found them on disk).
async fn check_model(c: &Client, layouts: &[LayoutInfo], m: &mut Model, after_kill: bool) {
    let mut seeds: Vec<u32> = m.kept.keys().copied().collect();
    seeds.sort_unstable();
    for seed in seeds {
        let (l, kept) = m.kept[&seed];
        let n = served(c, &layouts[l], seed, MODEL_BLOCKS).await;
        match (kept, n == MODEL_BLOCKS) {
            (_, true) => {
                if after_kill {
                    m.kept.insert(seed, (l, Kept::Safe));
                }
            }
            (Kept::Queued, false) if after_kill => {
                m.kept.remove(&seed);
            }
            (kept, false) => panic!("prompt {seed} ({kept:?}) served {n} of {MODEL_BLOCKS} blocks"),
        }
    }
    for &seed in &m.deleted {
        let l = (seed % layouts.len() as u32) as usize;
        let n = served(c, &layouts[l], seed, MODEL_BLOCKS).await;
        assert_eq!(n, 0, "prompt {seed} was deleted and came back");
    }
}

/// Records the server's compaction moved so far.
async fn relocated(c: &Client) -> u64 {
    c.stats().await.unwrap()["ssd_relocated"]
}

/// Runs `steps` random operations; returns how many records compaction moved meanwhile.
fn model_sequence(rng: &mut Rng, steps: u32) -> u64 {
    let mut moved = 0;
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    let specs = [
        layout_spec("mixed-model-a", 2),
        layout_spec("mixed-model-b", 2),
    ];
    let mut server = Server::start(dir.path(), COMPACTING);
    let mut c = server.client();
    let mut layouts = rt.block_on(register(&c, &specs));
    let mut m = Model {
        kept: HashMap::new(),
        deleted: HashSet::new(),
    };
    let mut next_seed = 1u32;
    let mut ops: Vec<String> = Vec::new();
    for _ in 0..steps {
        let roll = rng.below(100);
        match roll {
            // A new prompt, or one stored before (its blocks all duplicates), at a level.
            0..=59 => {
                let seed = if roll < 30 || m.kept.is_empty() {
                    next_seed += 1;
                    next_seed
                } else if roll < 45 && m.kept.contains_key(&next_seed) {
                    // The prompt just stored, its blocks likely still queued.
                    next_seed
                } else {
                    let known: Vec<u32> = m.kept.keys().copied().collect();
                    known[rng.below(known.len() as u64) as usize]
                };
                let l = (seed % layouts.len() as u32) as usize;
                let level = LEVELS[rng.below(3) as usize];
                ops.push(format!("store {seed} {level}"));
                let answer = rt
                    .block_on(c.store_durable(
                        &prompt(&layouts[l], seed, MODEL_BLOCKS),
                        payloads(&layouts[l], seed, MODEL_BLOCKS),
                        Some(level),
                    ))
                    .unwrap();
                assert_eq!(answer.stored + answer.duplicates, MODEL_BLOCKS);
                m.deleted.remove(&seed);
                let was = m.kept.get(&seed).map(|(_, k)| *k);
                let now = if level == "queued" && was != Some(Kept::Safe) {
                    Kept::Queued
                } else {
                    Kept::Safe
                };
                m.kept.insert(seed, (l, now));
            }
            60..=64 => {
                let l = rng.below(layouts.len() as u64) as usize;
                ops.push(format!("delete layout {l}"));
                rt.block_on(c.delete_layout(&layouts[l].layout)).unwrap();
                let gone: Vec<u32> = m
                    .kept
                    .iter()
                    .filter(|(_, (at, _))| *at == l)
                    .map(|(s, _)| *s)
                    .collect();
                for seed in gone {
                    m.kept.remove(&seed);
                    m.deleted.insert(seed);
                }
            }
            65..=74 => {
                ops.push("flush".into());
                let flushed = rt.block_on(server.admin().admin_flush_report()).unwrap();
                assert!(flushed.drained, "{flushed:?}");
                m.all_safe();
            }
            75..=81 => {
                ops.push("pause".into());
                // Maintenance passes (compaction) run meanwhile.
                std::thread::sleep(Duration::from_millis(250));
            }
            82..=87 => {
                ops.push("check".into());
                rt.block_on(check_model(&c, &layouts, &mut m, false));
            }
            _ => {
                let kill = roll < 95;
                ops.push(if kill { "kill -9" } else { "sigterm" }.into());
                moved += rt.block_on(relocated(&c));
                if kill {
                    server.kill9();
                } else {
                    assert!(server.stop().success());
                    m.all_safe();
                }
                server = Server::start(dir.path(), COMPACTING);
                c = server.client();
                layouts = rt.block_on(register(&c, &specs));
                let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    rt.block_on(check_model(&c, &layouts, &mut m, kill))
                }));
                if let Err(e) = checked {
                    println!("operations so far: {ops:?}");
                    std::panic::resume_unwind(e);
                }
            }
        }
    }
    moved += rt.block_on(relocated(&c));
    assert!(server.stop().success());
    moved
}

#[test]
fn random_sequences_of_mixed_operations_keep_every_promise() {
    let mut rng = Rng::seeded("model");
    let sequences = env_or("KVTIER_MIXED_SEQUENCES", 2);
    let moved: u64 = (0..sequences).map(|_| model_sequence(&mut rng, 120)).sum();
    println!("compaction moved {moved} records during {sequences} sequences");
    assert!(moved > 0, "compaction never ran during the sequences");
}

// ---------------------------------------------------------------------------------------
// The crash test.

const CRASH_BLOCKS: usize = 4;
const WRITERS: u32 = 3;

/// What one round's writers had acknowledged, and what must survive.
#[derive(Default)]
struct Acked {
    /// Prompts acknowledged `written` or `synced`.
    durable: HashSet<u32>,
    /// Prompts acknowledged at any level, in order (a flush makes those before it safe).
    any: Vec<u32>,
    /// How many of `any` a `drained: true` flush covered.
    flushed_upto: usize,
}

#[test]
fn mixed_level_writers_lose_nothing_acknowledged_across_kills_and_stops() {
    let rounds = env_or("KVTIER_MIXED_ROUNDS", 6);
    // How long a round may run past its first 150 ms before the stop.
    let round_ms = u64::from(env_or("KVTIER_MIXED_ROUND_MS", 400));
    let mut rng = Rng::seeded("crash");
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    let spec = layout_spec("mixed-crash", 2);
    // Every prompt that must survive from now on.
    let mut safe: Vec<u32> = Vec::new();
    let mut durable_acks = 0usize;
    for round in 0..rounds {
        let server = Server::start(dir.path(), COMPACTING);
        let c = server.client();
        let admin = server.admin();
        let layout = rt.block_on(c.register_layout(&spec)).unwrap();
        let acked = Arc::new(Mutex::new(Acked::default()));
        let writers: Vec<_> = (0..WRITERS)
            .map(|w| {
                let (c, layout, acked) = (c.clone(), layout.clone(), acked.clone());
                let mut r = Rng(rng.next() | 1);
                rt.spawn(async move {
                    let mut mine: Vec<u32> = Vec::new();
                    for k in 0..100_000u32 {
                        // Half the time a prompt this writer stored before: its blocks
                        // are duplicates, often still queued.
                        let seed = if mine.is_empty() || r.below(2) == 0 {
                            let s = round * 10_000_000 + w * 1_000_000 + k;
                            mine.push(s);
                            s
                        } else {
                            mine[mine.len() - 1 - r.below(mine.len().min(8) as u64) as usize]
                        };
                        let level = LEVELS[r.below(3) as usize];
                        let answer = c
                            .store_durable(
                                &prompt(&layout, seed, CRASH_BLOCKS),
                                payloads(&layout, seed, CRASH_BLOCKS),
                                Some(level),
                            )
                            .await;
                        let Ok(answer) = answer else { return };
                        assert_eq!(answer.stored + answer.duplicates, CRASH_BLOCKS);
                        assert_eq!(answer.durability, level);
                        let mut a = acked.lock();
                        if level != "queued" {
                            a.durable.insert(seed);
                        }
                        a.any.push(seed);
                    }
                })
            })
            .collect();
        // Flush barriers while the writers run.
        let flusher = {
            let acked = acked.clone();
            rt.spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(40)).await;
                    let before = acked.lock().any.len();
                    match admin.admin_flush_report().await {
                        Ok(f) if f.drained => acked.lock().flushed_upto = before,
                        Ok(f) => panic!("a flush did not drain on a healthy disk: {f:?}"),
                        Err(_) => return,
                    }
                }
            })
        };
        std::thread::sleep(Duration::from_millis(150 + rng.below(round_ms.max(1))));
        let clean = rng.below(10) == 0;
        if clean {
            assert!(server.stop().success());
        } else {
            server.kill9();
        }
        for w in writers {
            rt.block_on(w).unwrap();
        }
        rt.block_on(flusher).unwrap();
        let a = std::mem::take(&mut *acked.lock());
        durable_acks += a.durable.len();
        let kept: HashSet<u32> = if clean {
            a.any.iter().copied().collect()
        } else {
            a.any[..a.flushed_upto]
                .iter()
                .copied()
                .chain(a.durable.iter().copied())
                .collect()
        };
        safe.extend(kept);
        safe.sort_unstable();
        safe.dedup();
        let server = Server::start(dir.path(), COMPACTING);
        let c = server.client();
        let layout = rt.block_on(c.register_layout(&spec)).unwrap();
        for &seed in &safe {
            let n = rt.block_on(served(&c, &layout, seed, CRASH_BLOCKS));
            assert_eq!(
                n,
                CRASH_BLOCKS,
                "round {round} ({}): prompt {seed} lost",
                if clean { "SIGTERM" } else { "kill -9" }
            );
        }
        println!(
            "round {round} ({}): {} acknowledged, {} durable, {} flushed; {} safe prompts served exact",
            if clean { "SIGTERM" } else { "kill -9" },
            a.any.len(),
            a.durable.len(),
            a.flushed_upto,
            safe.len()
        );
        assert!(server.stop().success());
    }
    assert!(durable_acks > 0, "no durable store was acknowledged");
}
