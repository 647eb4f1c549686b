//! `remote.*` rows of the lossless codec (ADR 0021), on a run of four 2 MiB bf16 blocks
//! shaped like KV (`rows_ssd_codec::kv_like_bf16`; real KV's ratio is the `codec.*` model
//! rows'), stored by the remote tier in `kvtier gateway` on loopback:
//!
//! - `remote.bytes.per.block`: what a block costs the shared bucket with the codec (the
//!   run object's bytes over its blocks) — against the same blocks stored raw.
//! - `remote.hit.4x2MiB.raw.ms` and `.lossless.ms`: a four-block hit through the remote
//!   tier (one ranged GET, every block checked; the lossless one decoded) — each against
//!   one signed ranged GET of the same 8 MiB of decoded bytes from the raw object with
//!   kvtier bench's lean HTTP/1.1 client on a kept-alive connection, in the same sample.
//!   Loopback moves bytes at memory speed, so this is the codec's cost where the network
//!   is not the limit; where it is, a hit moves `1 / ratio` of the bytes.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use kvtier_codec::Codec;
use kvtier_core::Layout;
use kvtier_core::tier::{BlockMeta, NoSink, Tier};
use kvtier_remote::{Endpoint, RemoteConfig, RemoteTier};

use super::rows_ssd_codec::{kv_like_bf16, kv_like_layout};
use super::s3::http::Conn;
use super::s3::load::{Target, timed_ranged_get};
use super::{Effort, Row};

const BYTES: &str = "remote.bytes.per.block";
const HIT_RAW: &str = "remote.hit.4x2MiB.raw.ms";
const HIT_LOSSLESS: &str = "remote.hit.4x2MiB.lossless.ms";
const ACCESS: &str = "kvtier-bench";
const SECRET: &str = "kvtier-bench-secret";
const BUCKET: &str = "bench";
const BLOCKS: usize = 4;

pub fn rows(effort: Effort, wanted: &dyn Fn(&str) -> bool) -> anyhow::Result<Vec<Row>> {
    if ![BYTES, HIT_RAW, HIT_LOSSLESS].iter().any(|n| wanted(n)) {
        return Ok(Vec::new());
    }
    let dir = std::env::temp_dir().join(format!("kvtier-bench-remote-{}", std::process::id()));
    let rows = measure(&dir, effort, wanted);
    let _ = std::fs::remove_dir_all(&dir);
    rows
}

/// A remote tier on `url` writing with `codec`, under a prefix of its own.
fn tier(url: &str, codec: Codec, layout: &Layout) -> anyhow::Result<RemoteTier> {
    let mut config = RemoteConfig::new(vec![
        Endpoint::new(url.to_owned(), BUCKET).with_credentials(ACCESS, SECRET),
    ]);
    config.prefix = codec.name().into();
    config.codec.default = codec;
    let tier = RemoteTier::open(config, Arc::new(NoSink))?;
    tier.layout_registered(layout);
    Ok(tier)
}

fn measure(
    dir: &std::path::Path,
    effort: Effort,
    wanted: &dyn Fn(&str) -> bool,
) -> anyhow::Result<Vec<Row>> {
    let gateway = super::s3::procs::in_process_gateway(dir, ACCESS, SECRET, BUCKET)?;
    let url = format!("http://{}", gateway.addr);
    let layout = kv_like_layout("bench-remote-codec")?;
    let size = layout.block_bytes() as usize;
    let tokens: Vec<u32> = (0..(BLOCKS * 16) as u32).collect();
    let chain: Vec<(BlockMeta, Bytes)> = BlockMeta::chain(&layout, &tokens)
        .into_iter()
        .enumerate()
        .map(|(i, m)| (m, Bytes::from(kv_like_bf16(size, i as u64 + 1))))
        .collect();
    let hashes: Vec<_> = chain.iter().map(|(m, _)| m.hash).collect();

    let raw = tier(&url, Codec::Raw, &layout)?;
    let lossless = tier(&url, Codec::Lossless, &layout)?;
    for t in [&raw, &lossless] {
        for outcome in t.put_many(&chain) {
            outcome?;
        }
    }
    let stored = |t: &RemoteTier| t.stats().resident_bytes as f64 / BLOCKS as f64;
    let mut rows = Vec::new();
    if wanted(BYTES) {
        rows.push(Row::paired(
            BYTES,
            &[stored(&lossless)],
            &[stored(&raw)],
            "bytes",
            "the same blocks stored raw",
        ));
    }

    // The baseline: the raw object's first four blocks, one signed ranged GET.
    let data = raw
        .list_objects()
        .into_iter()
        .find(|o| o.name.ends_with(".kvo"))
        .ok_or_else(|| anyhow::anyhow!("the raw run object is not listed"))?;
    let target = Target::signed(&url, BUCKET, ACCESS, SECRET);
    let mut conn = Conn::open(&target.host)?;
    let path = format!("/{BUCKET}/{}", data.name);
    let range = format!("bytes=0-{}", BLOCKS * size - 1);
    let mut body = Vec::with_capacity(BLOCKS * size);
    for (name, t) in [(HIT_RAW, &raw), (HIT_LOSSLESS, &lossless)] {
        if !wanted(name) {
            continue;
        }
        let (mut value, mut baseline) = (Vec::new(), Vec::new());
        for _ in 0..5 * effort.samples {
            let started = Instant::now();
            let got = t.get_run(&hashes)?;
            value.push(started.elapsed().as_secs_f64() * 1e3);
            anyhow::ensure!(
                got.len() == BLOCKS && got.iter().zip(&chain).all(|(g, (_, p))| g == p),
                "{name}: the remote tier returned other bytes"
            );
            baseline.push(timed_ranged_get(
                &target,
                &mut conn,
                &path,
                &range,
                &mut body,
                BLOCKS * size,
            )?);
        }
        rows.push(Row::paired(
            name,
            &value,
            &baseline,
            "ms",
            "one signed ranged GET of the same decoded bytes from the gateway (lean HTTP/1.1 client, kept-alive connection)",
        ));
    }
    drop((raw, lossless));
    drop(gateway);
    Ok(rows)
}
