//! `shm.*` rows: a local client of `kvtier serve`'s shared arena (ADR 0019), in this
//! process over the server's Unix socket with its own mappings of the arena and of its
//! staging memory — the same mappings and calls a client process makes — against copies
//! between the client's own buffers in the same run, sample for sample.
//!
//! - `shm.load.1GiB.GBps`: a 1 GiB prompt (512 blocks of 2 MiB) leased and copied out of
//!   the arena into the client's own buffer — against a copy of 1 GiB between two of the
//!   client's own buffers in 2 MiB pieces.
//! - `shm.store.1GiB.GBps`: a new 1 GiB prompt stored through staging memory (the client
//!   copies each block in and checksums it; the server copies it into the arena over its
//!   cores, checksumming what landed) — against the same bytes copied twice on one thread
//!   (into a staging buffer, then into an arena-sized buffer).
//!
//! Both copies use the faster of `memcpy` and streaming stores, as measured by the
//! baseline in the same run.

use std::hint::black_box;
use std::time::Instant;

use kvtier_client::Client;
use kvtier_client::shm::ShmClient;
use kvtier_client::wire::{LayoutSpec, PromptSpec};
use kvtier_core::{KvDtype, LayoutKey};
use kvtier_node::Settings;

use super::measure::pattern;
use super::{Effort, Row};

const BLOCK: usize = 2 << 20;
const BLOCKS: usize = 512;

fn prompt(layout: &str, seed: u32) -> PromptSpec {
    PromptSpec::new(
        layout,
        (0..(BLOCKS * 16) as u32)
            .map(|t| seed * 10_000_000 + t)
            .collect(),
    )
}

/// One copy primitive: `memcpy` or streaming stores.
#[derive(Clone, Copy)]
enum Copy {
    Memcpy,
    Stream,
}

impl Copy {
    fn run(self, dst: &mut [u8], src: &[u8]) {
        match self {
            Copy::Memcpy => dst.copy_from_slice(src),
            Copy::Stream => kvtier_core::copy::copy_to_slice(dst, src),
        }
    }
}

/// Seconds to copy `src` into `dst` in 2 MiB pieces with `how`.
fn copy_secs(how: Copy, dst: &mut [u8], src: &[u8]) -> f64 {
    let t = Instant::now();
    for (d, s) in dst.chunks_mut(BLOCK).zip(src.chunks(BLOCK)) {
        how.run(d, black_box(s));
    }
    black_box(&dst);
    t.elapsed().as_secs_f64()
}

pub fn rows(effort: Effort, wanted: &dyn Fn(&str) -> bool) -> anyhow::Result<Vec<Row>> {
    let names = ["shm.load.1GiB.GBps", "shm.store.1GiB.GBps"];
    if !names.iter().any(|n| wanted(n)) {
        return Ok(Vec::new());
    }
    let dir = std::env::temp_dir().join(format!("kvtier-bench-shm-{}", std::process::id()));
    let mut settings = Settings {
        listen: "127.0.0.1:0".parse()?,
        data_dir: dir.clone(),
        ..Settings::default()
    };
    settings.ram.0 = 3 << 29; // 1.5 GiB: one 1 GiB prompt and room to replace it
    settings.ram_prefault = true;
    settings.ssd.enabled = false;
    settings.shm.enabled = true;
    settings.shm.staging.0 = (BLOCKS * BLOCK) as u64;
    // The whole prompt leased at once (the default, half of `ram`, is less).
    settings.shm.max_leased = settings.ram;
    // KVTIER_BENCH_SHM_HUGE=1: the arena on huge pages (`vm.nr_hugepages` must hold it).
    settings.shm.huge_pages = std::env::var_os("KVTIER_BENCH_SHM_HUGE").is_some();
    let socket = settings.shm_socket();
    let server = kvtier_server::LocalServer::start(settings).map_err(anyhow::Error::msg)?;
    let result = measure(effort, wanted, &server.url(), &socket);
    server.stop();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn measure(
    effort: Effort,
    wanted: &dyn Fn(&str) -> bool,
    url: &str,
    socket: &std::path::Path,
) -> anyhow::Result<Vec<Row>> {
    // The client's HTTP calls (layout, lookup) on a runtime of their own.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let http = Client::new(url)?;
    let mut key = LayoutKey::new("bench-shm", KvDtype::Bf16, 16, 32, 8, 128);
    key.weights_digest = "w".into();
    key.tokenizer_digest = "t".into();
    let layout = rt.block_on(http.register_layout(&LayoutSpec::of_key(&key, None)))?;
    anyhow::ensure!(
        layout.block_bytes as usize == BLOCK,
        "2 MiB blocks expected"
    );
    let shm = ShmClient::connect(socket)?;
    let samples = effort.samples.clamp(3, 5);
    let total = (BLOCKS * BLOCK) as f64;
    // The client's own buffers, touched before any timing.
    let source = pattern(BLOCKS * BLOCK, 7);
    let mut own = vec![1u8; BLOCKS * BLOCK];
    let mut other = vec![2u8; BLOCKS * BLOCK];
    // The baseline's copy primitive: whichever is faster here.
    let how = {
        let m = copy_secs(Copy::Memcpy, &mut own, &source).min(copy_secs(
            Copy::Memcpy,
            &mut own,
            &source,
        ));
        let s = copy_secs(Copy::Stream, &mut own, &source).min(copy_secs(
            Copy::Stream,
            &mut own,
            &source,
        ));
        if s < m { Copy::Stream } else { Copy::Memcpy }
    };
    let blocks: Vec<&[u8]> = source.chunks(BLOCK).collect();
    let mut rows = Vec::new();

    if wanted("shm.store.1GiB.GBps") {
        let (mut got, mut base) = (Vec::new(), Vec::new());
        for sample in 0..samples {
            let p = prompt(&layout.layout, 100 + sample as u32);
            let t = Instant::now();
            let answer = shm.store(&p, &blocks, None)?;
            let secs = t.elapsed().as_secs_f64();
            anyhow::ensure!(
                answer.stored == BLOCKS,
                "stored {} of {BLOCKS}",
                answer.stored
            );
            got.push(total / secs / 1e9);
            let twice = copy_secs(how, &mut own, &source) + copy_secs(how, &mut other, &own);
            base.push(total / twice / 1e9);
        }
        rows.push(Row::paired(
            "shm.store.1GiB.GBps",
            &got,
            &base,
            "GB/s",
            "the same bytes copied twice on one thread (into staging, then into the arena)",
        ));
    }

    if wanted("shm.load.1GiB.GBps") {
        let p = prompt(&layout.layout, 1);
        shm.store(&p, &blocks, None)?;
        let hit = rt.block_on(http.lookup(&p))?;
        anyhow::ensure!(
            hit.matched_tokens == BLOCKS * 16,
            "the prompt is not all cached"
        );
        let (mut got, mut base) = (Vec::new(), Vec::new());
        for _ in 0..samples {
            let t = Instant::now();
            let lease = shm.load_handles(&layout.layout, &hit.handles)?;
            anyhow::ensure!(lease.complete(), "a partial lease");
            for (i, d) in own.chunks_mut(BLOCK).enumerate() {
                how.run(d, lease.block(i));
            }
            drop(lease);
            let secs = t.elapsed().as_secs_f64();
            got.push(total / secs / 1e9);
            base.push(total / copy_secs(how, &mut other, &source) / 1e9);
        }
        anyhow::ensure!(
            own == source,
            "a load through the shared arena changed bytes"
        );
        rows.push(Row::paired(
            "shm.load.1GiB.GBps",
            &got,
            &base,
            "GB/s",
            "a copy of the same bytes between two of the client's own buffers",
        ));
    }
    Ok(rows)
}
