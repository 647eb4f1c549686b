//! `server.*` rows: `kvtier serve` (in this process, on a loopback ephemeral port, RAM
//! tier only so the rows measure the network path, not the disk) through `kvtier-client`,
//! against plain TCP over loopback moving the same bytes in the same run.
//!
//! - `server.load.64x2MiB.GBps`: one load of a 64-block prefix of 2 MiB blocks (one
//!   response, 128 MiB) into the caller's memory — against one TCP connection carrying the
//!   same bytes: a writer thread sends 64 distinct 2 MiB buffers (the server's blocks are 64
//!   buffers too) and a reader thread reads them into one 128 MiB destination (where the
//!   load puts them). Sending one 2 MiB buffer 64 times into a reused 2 MiB buffer, as the
//!   row measured before issue 13's end, moves bytes that stay in the CPU's cache and is
//!   not the same transfer (BENCHMARKS.md, issue 13).
//! - `server.store.2MiB.GBps`: stores of 16-block prompts of 2 MiB blocks — against the
//!   same TCP transfer.
//! - `server.lookup.p99.ms`: lookups of a cached 2,048-token prompt (128 blocks; the env
//!   variable `KVTIER_BENCH_LOOKUP_TOKENS` changes the length) from 16 concurrent
//!   clients, p99 — against the p99 round trip of 16 plain TCP connections each sending a
//!   request of the same size and reading an answer of the same size.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use kvtier_client::Client;
use kvtier_client::wire::frame::EndStatus;
use kvtier_client::wire::{LayoutSpec, LoadRequest, PromptSpec};
use kvtier_core::{KvDtype, LayoutKey};
use kvtier_listen::http::LanePriority;
use kvtier_node::Settings;

use super::measure::pattern;
use super::rows_server_mixed::ROWS as MIXED_ROWS;
use super::{Effort, Row};

/// Clients in the lookup row.
pub(super) const CLIENTS: usize = 16;

fn spec(layers: u32) -> LayoutSpec {
    let mut key = LayoutKey::new("bench-server", KvDtype::Bf16, 16, layers, 8, 128);
    key.weights_digest = "w".into();
    key.tokenizer_digest = "t".into();
    LayoutSpec::of_key(&key, None)
}

pub(super) fn prompt(layout: &str, seed: u32, tokens: usize) -> PromptSpec {
    PromptSpec::new(
        layout,
        (0..tokens as u32).map(|t| seed * 1_000_000 + t).collect(),
    )
}

/// Seconds to move `total` bytes over one loopback TCP connection in `chunk`-byte writes.
pub(super) fn tcp_transfer_secs(total: usize, chunk: usize) -> anyhow::Result<f64> {
    let src = pattern(chunk, 3);
    let write = move |s: &mut TcpStream| -> std::io::Result<()> {
        let mut left = total;
        while left > 0 {
            let n = left.min(src.len());
            s.write_all(&src[..n])?;
            left -= n;
        }
        Ok(())
    };
    timed_transfer(total, write, &mut vec![0u8; chunk])
}

/// Seconds to move `sources`, in order, over one loopback TCP connection into `dst` (the
/// sum of their lengths): the physical limit of a load that sends buffers held in memory
/// into the caller's memory.
pub(super) fn tcp_copy_secs(sources: Arc<Vec<Vec<u8>>>, dst: &mut [u8]) -> anyhow::Result<f64> {
    let total: usize = sources.iter().map(Vec::len).sum();
    anyhow::ensure!(dst.len() == total, "destination of the wrong size");
    let write = move |s: &mut TcpStream| -> std::io::Result<()> {
        sources.iter().try_for_each(|src| s.write_all(src))
    };
    timed_transfer(total, write, dst)
}

/// Seconds for a writer thread running `write` to move `total` bytes to a reader over one
/// loopback connection. The reader fills `dst` from its start when it holds all `total`
/// bytes, else reads each time into the whole of it (a reused buffer).
fn timed_transfer(
    total: usize,
    write: impl FnOnce(&mut TcpStream) -> std::io::Result<()> + Send + 'static,
    dst: &mut [u8],
) -> anyhow::Result<f64> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let writer = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut s, _) = listener.accept()?;
        write(&mut s)
    });
    let start = Instant::now();
    let mut s = TcpStream::connect(addr)?;
    let whole = dst.len() >= total;
    let mut got = 0;
    while got < total {
        let into = if whole { &mut dst[got..] } else { &mut dst[..] };
        let n = s.read(into)?;
        if n == 0 {
            anyhow::bail!("raw TCP transfer ended early");
        }
        got += n;
    }
    let secs = start.elapsed().as_secs_f64();
    writer
        .join()
        .map_err(|_| anyhow::anyhow!("writer thread failed"))??;
    Ok(secs)
}

/// p99 in ms of round trips of `req` bytes out and `resp` bytes back, 16 connections at once.
pub(super) fn tcp_round_trip_p99_ms(req: usize, resp: usize, rounds: usize) -> anyhow::Result<f64> {
    Ok(p99(&mut tcp_round_trips_ms(req, resp, rounds)?))
}

/// Every round trip's time in ms, of `req` bytes out and `resp` bytes back, 16 connections
/// at once.
pub(super) fn tcp_round_trips_ms(
    req: usize,
    resp: usize,
    rounds: usize,
) -> anyhow::Result<Vec<f64>> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let server = std::thread::spawn(move || {
        let mut handles = Vec::new();
        for _ in 0..CLIENTS {
            let Ok((mut s, _)) = listener.accept() else {
                break;
            };
            handles.push(std::thread::spawn(move || {
                let _ = s.set_nodelay(true);
                let mut inb = vec![0u8; req];
                let out = vec![7u8; resp];
                while s.read_exact(&mut inb).is_ok() {
                    if s.write_all(&out).is_err() {
                        break;
                    }
                }
            }));
        }
        for h in handles {
            let _ = h.join();
        }
    });
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            std::thread::spawn(move || -> std::io::Result<Vec<f64>> {
                let mut s = TcpStream::connect(addr)?;
                s.set_nodelay(true)?;
                let out = vec![1u8; req];
                let mut inb = vec![0u8; resp];
                let mut lat = Vec::with_capacity(rounds);
                for _ in 0..rounds {
                    let t = Instant::now();
                    s.write_all(&out)?;
                    s.read_exact(&mut inb)?;
                    lat.push(t.elapsed().as_secs_f64() * 1e3);
                }
                Ok(lat)
            })
        })
        .collect();
    let mut all = Vec::new();
    for c in clients {
        all.extend(
            c.join()
                .map_err(|_| anyhow::anyhow!("client thread failed"))??,
        );
    }
    let _ = server.join();
    Ok(all)
}

/// Every lookup's time in ms: `CLIENTS` clients, each looking `lookup` up `rounds` times
/// in turn; a lookup that does not match the whole prompt is an error.
pub(super) async fn lookup_latencies(
    url: &str,
    lookup: &Arc<PromptSpec>,
    rounds: usize,
) -> anyhow::Result<Vec<f64>> {
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let client = Client::new(url)?;
        let p = lookup.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(rounds);
            for _ in 0..rounds {
                let t = Instant::now();
                let hit = client.lookup(&p).await?;
                lat.push(t.elapsed().as_secs_f64() * 1e3);
                anyhow::ensure!(
                    hit.matched_tokens == p.tokens.len(),
                    "lookup matched {}",
                    hit.matched_tokens
                );
            }
            Ok::<_, anyhow::Error>(lat)
        }));
    }
    let mut all = Vec::new();
    let mut failed = None;
    // Every task is awaited, failed or not, so that none outlives the row.
    for t in tasks {
        match t.await? {
            Ok(lat) => all.extend(lat),
            Err(e) => failed = Some(e),
        }
    }
    match failed {
        Some(e) => Err(e),
        None => Ok(all),
    }
}

pub(super) fn p99(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get((v.len() * 99 / 100).min(v.len().saturating_sub(1)))
        .copied()
        .unwrap_or(0.0)
}

pub fn rows(effort: Effort, wanted: &dyn Fn(&str) -> bool) -> anyhow::Result<Vec<Row>> {
    let names = [
        "server.load.64x2MiB.GBps",
        "server.store.2MiB.GBps",
        "server.lookup.p99.ms",
    ];
    if !names.iter().chain(&MIXED_ROWS).any(|n| wanted(n)) {
        return Ok(Vec::new());
    }
    let dir = std::env::temp_dir().join(format!("kvtier-bench-server-{}", std::process::id()));
    let mut settings = Settings {
        listen: "127.0.0.1:0".parse()?,
        data_dir: dir.clone(),
        ..Settings::default()
    };
    settings.ram.0 = 1 << 30;
    // A server that has run a while: every store lands in arena memory already touched
    // (the rows measure stores, not the kernel filling fresh pages once).
    settings.ram_prefault = true;
    settings.ssd.enabled = false;
    // Settings from the environment the way `kvtier serve` reads them, to compare a
    // setting's values in one binary: `KVTIER__WORKERS=2` (the default thread count is
    // chosen by these rows), `KVTIER__STORE_IDLE=false`.
    let settings = kvtier_node::overrides::apply(
        &settings,
        &kvtier_node::overrides::from_env(std::env::vars()),
    )?;
    // The server runs on its own runtime, with as many request threads as `kvtier serve`
    // would start by default; the clients on another runtime.
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(settings.worker_threads())
        .thread_name("bench-server")
        .enable_all()
        .build()?;
    // The priority the server gives its store threads, for the plain stream beside which
    // the mixed rows' lookups are measured again.
    let store_priority = kvtier_server::serve::store_priority(&settings);
    let running = server_rt
        .block_on(kvtier_server::Running::start(settings))
        .map_err(anyhow::Error::msg)?;
    let url = format!("http://{}", running.addr);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let served = server_rt.spawn(running.serve(async {
        let _ = stop_rx.await;
    }));
    let client_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("bench-client")
        .enable_all()
        .build()?;
    let result = client_rt.block_on(measure(effort, wanted, &url, store_priority));
    let _ = stop_tx.send(());
    let _ = server_rt.block_on(served);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

async fn measure(
    effort: Effort,
    wanted: &dyn Fn(&str) -> bool,
    url: &str,
    store_priority: LanePriority,
) -> anyhow::Result<Vec<Row>> {
    let c = Client::new(url)?;
    let layout = c.register_layout(&spec(32)).await?; // 2 MiB blocks
    let block = layout.block_bytes as usize;
    let mut rows = Vec::new();
    let samples = effort.samples.min(7);

    // One 64-block prefix, stored once; every sample loads all of it in one response.
    let blocks = 64;
    let payload = Bytes::from(pattern(block, 9));
    let long = prompt(&layout.layout, 1, blocks * 16);
    c.store(&long, vec![payload.clone(); blocks]).await?;
    let hit = c.lookup(&long).await?;
    anyhow::ensure!(hit.blocks() == blocks, "the 64-block prefix is not cached");
    let request = LoadRequest {
        layout: layout.layout.clone(),
        handles: hit.handles.clone(),
        layers: None,
        chains: None,
    };
    let total = blocks * block;
    if wanted("server.load.64x2MiB.GBps") {
        let mut ours = Vec::new();
        let mut raw = Vec::new();
        // Into one reused staging buffer, as an engine loads into its own memory; the raw
        // pair reads into a reused buffer of the same size, from 64 buffers of its own.
        let mut staging = vec![0u8; total];
        let mut raw_dst = vec![0u8; total];
        let sources: Arc<Vec<Vec<u8>>> =
            Arc::new((0..blocks).map(|i| pattern(block, 20 + i as u8)).collect());
        for _ in 0..samples {
            let t = Instant::now();
            let (n, status) = c.load_into(&request, &mut staging).await?;
            let secs = t.elapsed().as_secs_f64();
            anyhow::ensure!(
                n == blocks
                    && status == EndStatus::Complete
                    && staging.chunks(block).all(|b| b == &payload[..]),
                "load returned other bytes"
            );
            staging.fill(0);
            ours.push(total as f64 / secs / 1e9);
            raw.push(total as f64 / tcp_copy_secs(sources.clone(), &mut raw_dst)? / 1e9);
        }
        rows.push(Row::new(
            "server.load.64x2MiB.GBps",
            med(&mut ours),
            "GB/s",
            med(&mut raw),
            "one loopback TCP connection carrying the same 128 MiB from 64 buffers into one",
        ));
    }
    if wanted("server.store.2MiB.GBps") {
        let per = 16;
        let mut ours = Vec::new();
        let mut raw = Vec::new();
        for s in 0..samples {
            let p = prompt(&layout.layout, 100 + s as u32, per * 16);
            let t = Instant::now();
            let answer = c.store(&p, vec![payload.clone(); per]).await?;
            let secs = t.elapsed().as_secs_f64();
            anyhow::ensure!(answer.stored == per, "store kept {answer:?}");
            ours.push((per * block) as f64 / secs / 1e9);
            raw.push((per * block) as f64 / tcp_transfer_secs(per * block, block)? / 1e9);
        }
        rows.push(Row::new(
            "server.store.2MiB.GBps",
            med(&mut ours),
            "GB/s",
            med(&mut raw),
            "one loopback TCP connection carrying the same 32 MiB (RAM tier only)",
        ));
    }
    let mixed = MIXED_ROWS.iter().any(|n| wanted(n));
    if wanted("server.lookup.p99.ms") || mixed {
        // A small layout: lookups read memory only, block size does not matter.
        let small = c.register_layout(&spec(2)).await?;
        // Prompt length: 2,048 tokens unless KVTIER_BENCH_LOOKUP_TOKENS says otherwise (a
        // multiple of 16), to see how the figure scales.
        let ntok: usize = std::env::var("KVTIER_BENCH_LOOKUP_TOKENS")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|n: &usize| *n >= 16 && n.is_multiple_of(16))
            .unwrap_or(2048);
        let p = prompt(&small.layout, 7, ntok);
        let payloads = vec![Bytes::from(vec![1u8; small.block_bytes as usize]); ntok / 16];
        c.store(&p, payloads).await?;
        // What the client sends: the binary lookup (upload head, JSON head, raw tokens).
        let head = PromptSpec::new(p.layout.clone(), Vec::new());
        let req_bytes = 12 + serde_json::to_vec(&head)?.len() + 4 * ntok;
        let resp_bytes = serde_json::to_vec(&c.lookup(&p).await?)?.len();
        let rounds = 200 * effort.scale;
        let p = Arc::new(p);
        let mut all = lookup_latencies(url, &p, rounds).await?;
        let ours = p99(&mut all);
        let raw = tcp_round_trip_p99_ms(req_bytes, resp_bytes, rounds)?;
        if wanted("server.lookup.p99.ms") {
            rows.push(Row::new(
                "server.lookup.p99.ms",
                ours,
                "ms",
                raw,
                "p99 round trip of the same request/answer sizes over 16 plain TCP connections",
            ));
        }
        if mixed {
            rows.extend(
                super::rows_server_mixed::rows(
                    effort,
                    url,
                    &layout,
                    &payload,
                    &p,
                    req_bytes,
                    resp_bytes,
                    store_priority,
                )
                .await?,
            );
        }
    }
    Ok(rows)
}

pub(super) fn med(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}
