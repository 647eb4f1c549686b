//! `s3.*` rows and `kvtier bench s3`: ranged GETs of cached prefixes (128 KiB out of
//! 256 KiB objects) through the S3 API, against `kvtier gateway` and moto (a third-party
//! S3 server) started here, each beside plain TCP over loopback answering the same
//! requests with the same bytes, with the same client, in the same run.

pub(crate) mod load;
pub(crate) mod procs;

/// The client of every S3 request the bench sends: the remote tier's own lean HTTP/1.1
/// connection and signatures, so a baseline GET costs what the tier's direct read of the
/// same bytes would without the tier.
pub(crate) use kvtier_remote::{http1 as http, sigv4};

use std::time::Duration;

use super::{Effort, Row};

pub use load::{Outcome, Spec, Target};

/// Options of `kvtier bench s3`.
#[derive(Debug, clap::Args)]
pub struct S3BenchArgs {
    /// The endpoint, `http://HOST:PORT` (plain HTTP).
    #[arg(long)]
    pub endpoint: String,
    /// The bucket to use (created if missing).
    #[arg(long)]
    pub bucket: String,
    /// Concurrent clients, one keep-alive connection each.
    #[arg(long, default_value_t = 8)]
    pub clients: usize,
    /// GETs per client.
    #[arg(long, default_value_t = 1000)]
    pub requests: usize,
    /// Objects preloaded with PUT.
    #[arg(long, default_value_t = 64)]
    pub objects: usize,
    /// Bytes per object.
    #[arg(long, default_value_t = 256 << 10)]
    pub object_bytes: usize,
    /// Bytes per ranged GET (from offset 0: a cached prefix).
    #[arg(long, default_value_t = 128 << 10)]
    pub range_bytes: usize,
    /// Access key for SigV4; unsigned requests without it.
    #[arg(long, env = "AWS_ACCESS_KEY_ID")]
    pub access_key: Option<String>,
    /// Secret key for SigV4.
    #[arg(long, env = "AWS_SECRET_ACCESS_KEY", hide_env_values = true)]
    pub secret_key: Option<String>,
    /// Region in the signature.
    #[arg(long, default_value = "us-east-1")]
    pub region: String,
    /// Skip the PUTs (the objects are there from an earlier run).
    #[arg(long)]
    pub no_preload: bool,
    /// Stop the clients after this many seconds even if requests remain.
    #[arg(long, default_value_t = 60)]
    pub max_secs: u64,
}

/// `kvtier bench s3`: preload, load, print p50/p99/ops/client CPU.
pub fn run_cli(args: &S3BenchArgs) -> anyhow::Result<()> {
    let host = args
        .endpoint
        .strip_prefix("http://")
        .ok_or_else(|| anyhow::anyhow!("the endpoint must be http://HOST:PORT"))?
        .trim_end_matches('/')
        .to_owned();
    if args.range_bytes == 0
        || args.range_bytes > args.object_bytes
        || args.objects == 0
        || args.clients == 0
    {
        anyhow::bail!("need 0 < range-bytes <= object-bytes, and at least one object and client");
    }
    let target = Target {
        host,
        bucket: args.bucket.clone(),
        signer: match (&args.access_key, &args.secret_key) {
            (Some(a), Some(s)) => Some(sigv4::Signer {
                access_key: a.clone(),
                secret_key: s.clone(),
                region: args.region.clone(),
                session_token: None,
            }),
            _ => None,
        },
    };
    let spec = Spec {
        objects: args.objects,
        object_bytes: args.object_bytes,
        range_bytes: args.range_bytes,
        clients: args.clients,
        requests_per_client: args.requests,
        max_time: Duration::from_secs(args.max_secs),
    };
    if !args.no_preload {
        load::preload(&target, &spec)?;
    }
    let o = load::run(&target, &spec)?;
    println!(
        "{} GETs of {} bytes, {} clients: p50 {:.3} ms, p99 {:.3} ms, {:.0} ops/s, client CPU {:.2} cores",
        o.requests, args.range_bytes, args.clients, o.p50_ms, o.p99_ms, o.ops, o.client_cores
    );
    Ok(())
}

const NAMES: [&str; 7] = [
    "s3.gateway.range128KiB.c1.p50.ms",
    "s3.gateway.range128KiB.c8.p99.ms",
    "s3.gateway.range128KiB.c8.ops",
    "s3.moto.range128KiB.c1.p50.ms",
    "s3.moto.range128KiB.c8.p99.ms",
    "s3.moto.range128KiB.c8.ops",
    "s3.gateway_vs_moto.c8.ops",
];

fn specs(effort: Effort, moto: bool) -> (Spec, Spec) {
    // moto answers in milliseconds: fewer requests keep its rows to seconds.
    let per = if moto { 150 } else { 500 } * effort.scale;
    let base = Spec {
        objects: 64,
        object_bytes: 256 << 10,
        range_bytes: 128 << 10,
        clients: 1,
        requests_per_client: per * 2,
        max_time: Duration::from_secs(30),
    };
    (
        base,
        Spec {
            clients: 8,
            requests_per_client: per,
            ..base
        },
    )
}

/// c1 and c8 runs against one target: `(c1, c8)`, each the run with the median c8 ops of
/// `samples` rounds (c1 likewise by p50).
fn measure(target: &Target, effort: Effort, moto: bool) -> anyhow::Result<(Outcome, Outcome)> {
    let (c1, c8) = specs(effort, moto);
    load::preload(target, &c8)?;
    // Warm the connection paths and the page cache once.
    load::run(
        target,
        &Spec {
            requests_per_client: 20,
            ..c8
        },
    )?;
    // Each round is thousands of requests already: three rounds in a full run, one quick.
    let rounds = if effort.scale > 1 { 3 } else { 1 };
    let mut ones = Vec::new();
    let mut eights = Vec::new();
    for _ in 0..rounds {
        ones.push(load::run(target, &c1)?);
        eights.push(load::run(target, &c8)?);
    }
    ones.sort_by(|a, b| a.p50_ms.total_cmp(&b.p50_ms));
    eights.sort_by(|a, b| a.ops.total_cmp(&b.ops));
    Ok((ones[ones.len() / 2], eights[eights.len() / 2]))
}

pub fn rows(effort: Effort, wanted: &dyn Fn(&str) -> bool) -> anyhow::Result<Vec<Row>> {
    if !NAMES.iter().any(|n| wanted(n)) {
        return Ok(Vec::new());
    }
    let signer = sigv4::Signer {
        access_key: "kvtier-bench".into(),
        secret_key: format!("secret-{}", std::process::id()),
        region: "us-east-1".into(),
        session_token: None,
    };
    // The baseline: plain TCP answering the same requests with the same bytes.
    let raw = procs::RawServer::start(64, 256 << 10, 128 << 10)?;
    let raw_target = Target {
        host: raw.addr.to_string(),
        bucket: "bench".into(),
        signer: Some(signer.clone()),
    };
    let (raw1, raw8) = measure(&raw_target, effort, false)?;
    let mut rows = Vec::new();
    let dir = std::env::temp_dir().join(format!("kvtier-bench-gateway-{}", std::process::id()));
    let gateway = procs::Child::gateway(&dir, &signer)?;
    let gw_target = Target {
        host: gateway.host.clone(),
        bucket: "bench".into(),
        signer: Some(signer.clone()),
    };
    let gw = measure(&gw_target, effort, false);
    drop(gateway);
    let _ = std::fs::remove_dir_all(&dir);
    let (gw1, gw8) = gw?;
    let tcp = "plain TCP over loopback, same requests and bytes, same client";
    rows.push(Row::new(NAMES[0], gw1.p50_ms, "ms", raw1.p50_ms, tcp));
    rows.push(Row::new(NAMES[1], gw8.p99_ms, "ms", raw8.p99_ms, tcp));
    rows.push(Row::new(NAMES[2], gw8.ops, "ops/s", raw8.ops, tcp));
    println!(
        "  (client CPU at c8: gateway run {:.2} cores, plain TCP run {:.2} cores)",
        gw8.client_cores, raw8.client_cores
    );
    match procs::Child::moto() {
        Ok(moto) => {
            let target = Target {
                host: moto.host.clone(),
                bucket: "bench".into(),
                signer: Some(signer),
            };
            let (m1, m8) = measure(&target, effort, true)?;
            drop(moto);
            rows.push(Row::new(NAMES[3], m1.p50_ms, "ms", raw1.p50_ms, tcp));
            rows.push(Row::new(NAMES[4], m8.p99_ms, "ms", raw8.p99_ms, tcp));
            rows.push(Row::new(NAMES[5], m8.ops, "ops/s", raw8.ops, tcp));
            rows.push(Row::new(
                NAMES[6],
                gw8.ops,
                "ops/s",
                m8.ops,
                "moto's c8 ops/s in the same run (ratio: gateway / moto)",
            ));
        }
        Err(e) => println!("  (moto rows skipped: {e:#})"),
    }
    Ok(rows.into_iter().filter(|r| wanted(&r.name)).collect())
}
