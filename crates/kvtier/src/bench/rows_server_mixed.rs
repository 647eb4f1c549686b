//! `server.mixed.*` rows: lookups and stores at the same time, the traffic of an inference
//! engine that asks about every prompt and stores the prefixes it computed. The lookup
//! tail alone (`server.lookup.p99.ms`) and the store rate alone (`server.store.2MiB.GBps`)
//! do not show how one waits behind the other, which is what the default number of
//! request threads is chosen by.
//!
//! - `server.mixed.lookup.p99.ms`: p99 of 16 clients' lookups of a cached 2,048-token
//!   prompt while one client stores 16-block prompts of 2 MiB blocks without pause —
//!   against the p99 round trip of 16 plain TCP connections (the same request and answer
//!   sizes).
//! - `server.mixed.lookup.p50.ms`: the median of the same lookups, against the median of
//!   the same round trips: the tail and the typical lookup move apart (a setting that
//!   changes where the kernel runs the threads moves one and not the other).
//! - `server.mixed.store.2MiB.GBps`: that client's store rate meanwhile — against one
//!   loopback TCP connection carrying the same 32 MiB per store.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use bytes::Bytes;
use kvtier_client::Client;
use kvtier_client::wire::{LayoutInfo, PromptSpec};

use super::rows_server::{CLIENTS, med, p99, prompt, tcp_round_trips_ms, tcp_transfer_secs};
use super::{Effort, Row};

/// Distinct prompts the store client cycles through: after the first round its stores are
/// duplicates (the bytes still cross the network and are read into blocks), so RAM stays
/// bounded however long the lookups take.
const STORE_PROMPTS: u32 = 8;

/// The mixed rows. `big` is a layout of 2 MiB blocks; `small` one whose `lookup` prompt
/// of `ntok` tokens is cached.
pub async fn rows(
    effort: Effort,
    url: &str,
    big: &LayoutInfo,
    payload: &Bytes,
    lookup: PromptSpec,
    req_bytes: usize,
    resp_bytes: usize,
) -> anyhow::Result<Vec<Row>> {
    let rounds = 200 * effort.scale;
    let per = 16;
    let done = Arc::new(AtomicBool::new(false));
    // The store client: stores until the lookups are done (and at least once). It runs on
    // a thread of its own, as another engine's store path would, so that the lookup
    // clients' latency is not its writes' queueing on their threads.
    let storer = {
        let c = Client::new(url)?;
        let done = done.clone();
        let layout = big.layout.clone();
        let payloads = vec![payload.clone(); per];
        let block = payload.len();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        std::thread::Builder::new()
            .name("bench-storer".into())
            .spawn(move || {
                rt.block_on(async move {
                    let mut rates = Vec::new();
                    let mut i = 0u32;
                    while rates.is_empty() || !done.load(Ordering::Relaxed) {
                        let p = prompt(&layout, 500 + i % STORE_PROMPTS, per * 16);
                        let t = Instant::now();
                        let answer = c.store(&p, payloads.clone()).await?;
                        let secs = t.elapsed().as_secs_f64();
                        anyhow::ensure!(
                            answer.stored + answer.duplicates == per,
                            "store kept {answer:?}"
                        );
                        rates.push((per * block) as f64 / secs / 1e9);
                        i += 1;
                    }
                    Ok::<_, anyhow::Error>(rates)
                })
            })?
    };
    let lookup = Arc::new(lookup);
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
    for t in tasks {
        match t.await? {
            Ok(lat) => all.extend(lat),
            Err(e) => failed = Some(e),
        }
    }
    done.store(true, Ordering::Relaxed);
    let mut rates = tokio::task::spawn_blocking(move || storer.join())
        .await?
        .map_err(|_| anyhow::anyhow!("the store client panicked"))??;
    if let Some(e) = failed {
        return Err(e);
    }
    let block = payload.len();
    let mut raw = tcp_round_trips_ms(req_bytes, resp_bytes, rounds)?;
    let raw_p99 = p99(&mut raw);
    let mut raw_rate = Vec::new();
    for _ in 0..effort.samples.min(7) {
        raw_rate.push((per * block) as f64 / tcp_transfer_secs(per * block, block)? / 1e9);
    }
    Ok(vec![
        Row::new(
            "server.mixed.lookup.p99.ms",
            p99(&mut all),
            "ms",
            raw_p99,
            "p99 round trip of the same request/answer sizes over 16 plain TCP connections (no stores)",
        ),
        Row::new(
            "server.mixed.lookup.p50.ms",
            med(&mut all),
            "ms",
            med(&mut raw),
            "median round trip of the same request/answer sizes over 16 plain TCP connections (no stores)",
        ),
        Row::new(
            "server.mixed.store.2MiB.GBps",
            med(&mut rates),
            "GB/s",
            med(&mut raw_rate),
            "one loopback TCP connection carrying the same 32 MiB",
        ),
    ])
}
