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
//! - `server.mixed_tcp.lookup.p99.ms`: the same lookups while the store's bytes go over a
//!   plain TCP connection instead of to kvtier (a reader thread at the priority of the
//!   server's store threads, reading them straight into a 2 MiB block: one copy, the least
//!   a receiver does) — against the plain round trips of the first row beside the same
//!   stream. Set beside `server.mixed.lookup.p99.ms`, it tells what kvtier's store path
//!   adds to the lookups' tail from what moving the same bytes on the same cores costs
//!   them anyway (on 2 cores: nothing measurable; BENCHMARKS.md, issue 36).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use bytes::Bytes;
use kvtier_client::Client;
use kvtier_client::wire::{LayoutInfo, PromptSpec};
use kvtier_listen::http::LanePriority;

use super::rows_server::{
    lookup_latencies, med, p99, prompt, tcp_round_trips_ms, tcp_transfer_secs,
};
use super::{Effort, Row};

/// The rows measured here.
pub const ROWS: [&str; 4] = [
    "server.mixed.lookup.p99.ms",
    "server.mixed.lookup.p50.ms",
    "server.mixed.store.2MiB.GBps",
    "server.mixed_tcp.lookup.p99.ms",
];

/// Distinct prompts the store client cycles through: after the first round its stores are
/// duplicates (the bytes still cross the network and are read into blocks), so RAM stays
/// bounded however long the lookups take.
const STORE_PROMPTS: u32 = 8;

/// The mixed rows. `big` is a layout of 2 MiB blocks; `small` one whose `lookup` prompt
/// of `ntok` tokens is cached; `store_priority` that of the server's store threads.
#[expect(
    clippy::too_many_arguments,
    reason = "one call site, every argument named"
)]
pub async fn rows(
    effort: Effort,
    url: &str,
    big: &LayoutInfo,
    payload: &Bytes,
    lookup: &Arc<PromptSpec>,
    req_bytes: usize,
    resp_bytes: usize,
    store_priority: LanePriority,
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
    let lookups = lookup_latencies(url, lookup, rounds).await;
    done.store(true, Ordering::Relaxed);
    let mut rates = tokio::task::spawn_blocking(move || storer.join())
        .await?
        .map_err(|_| anyhow::anyhow!("the store client panicked"))??;
    let mut all = lookups?;
    let block = payload.len();
    // The same lookups, and the plain round trips, beside the same bytes over plain TCP.
    let stream = PlainStream::start(per, block, store_priority)?;
    let beside = lookup_latencies(url, lookup, rounds).await;
    let raw_beside =
        tokio::task::spawn_blocking(move || tcp_round_trips_ms(req_bytes, resp_bytes, rounds))
            .await?;
    stream.stop()?;
    let (mut beside, mut raw_beside) = (beside?, raw_beside?);
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
        Row::new(
            "server.mixed_tcp.lookup.p99.ms",
            p99(&mut beside),
            "ms",
            p99(&mut raw_beside),
            "p99 round trip of the same request/answer sizes over 16 plain TCP connections beside the same stream",
        ),
    ])
}

/// The store's bytes without kvtier: a sender thread writes `per` blocks of `block` bytes
/// over one loopback TCP connection and waits for the reader's one-byte acknowledgement,
/// again and again until stopped, as the store client does with stores. The reader runs
/// at the server's store threads' priority and reads straight into one block-sized buffer.
struct PlainStream {
    done: Arc<AtomicBool>,
    threads: Option<[std::thread::JoinHandle<std::io::Result<()>>; 2]>,
}

impl PlainStream {
    fn start(per: usize, block: usize, priority: LanePriority) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let reader = std::thread::Builder::new()
            .name("bench-tcp-reader".into())
            .spawn(move || -> std::io::Result<()> {
                priority.apply_to_this_thread();
                let (mut s, _) = listener.accept()?;
                let mut buf = vec![0u8; block];
                let per_store = per * block;
                let mut got = 0;
                loop {
                    // The sender waits for the acknowledgement after each store's bytes,
                    // so a read never crosses a store's end.
                    let n = s.read(&mut buf[got % block..])?;
                    if n == 0 {
                        return Ok(());
                    }
                    got += n;
                    if got % per_store == 0 {
                        s.write_all(b"k")?;
                    }
                }
            })?;
        let done = Arc::new(AtomicBool::new(false));
        let stop = done.clone();
        let sender = std::thread::Builder::new()
            .name("bench-tcp-sender".into())
            .spawn(move || -> std::io::Result<()> {
                let mut s = TcpStream::connect(addr)?;
                let src = super::measure::pattern(block, 5);
                let mut ack = [0u8; 1];
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..per {
                        s.write_all(&src)?;
                    }
                    s.read_exact(&mut ack)?;
                }
                Ok(())
            })?;
        Ok(Self {
            done,
            threads: Some([sender, reader]),
        })
    }

    /// Stops the sender after its current round; the reader ends with the connection.
    fn stop(mut self) -> anyhow::Result<()> {
        self.done.store(true, Ordering::Relaxed);
        let mut first_error = None;
        for (h, who) in self
            .threads
            .take()
            .into_iter()
            .flatten()
            .zip(["sender", "reader"])
        {
            let joined = h
                .join()
                .map_err(|_| anyhow::anyhow!("the plain TCP {who} panicked"))
                .and_then(|r| r.map_err(anyhow::Error::from));
            if let Err(e) = joined {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

impl Drop for PlainStream {
    /// A row that fails before [`PlainStream::stop`] still ends the stream's loop.
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
    }
}
