//! The S3 load generator (seed 001 §15): preload objects with PUT, then C client threads
//! issue ranged GETs of each object's leading bytes — a cached prefix — for a bounded
//! count (and at most a bounded time), checking every answer's bytes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::http::Conn;
use super::sigv4::{EMPTY_SHA256, Signer, request_head, sha256_hex};
use crate::bench::measure::pattern;

/// Where to send requests.
#[derive(Debug, Clone)]
pub struct Target {
    /// `IP:PORT`.
    pub host: String,
    /// The bucket (created if missing).
    pub bucket: String,
    /// Sign requests with SigV4; `None` sends them unsigned.
    pub signer: Option<Signer>,
}

/// The workload.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    /// Objects preloaded.
    pub objects: usize,
    /// Bytes per object.
    pub object_bytes: usize,
    /// Bytes per ranged GET, from offset 0.
    pub range_bytes: usize,
    /// Concurrent clients, one connection each.
    pub clients: usize,
    /// GETs per client.
    pub requests_per_client: usize,
    /// Clients stop early after this long.
    pub max_time: Duration,
}

/// What a run measured.
#[derive(Debug, Clone, Copy)]
pub struct Outcome {
    /// Median latency.
    pub p50_ms: f64,
    /// 99th percentile latency.
    pub p99_ms: f64,
    /// Completed GETs per second.
    pub ops: f64,
    /// CPU the client threads used, in cores (CPU seconds per wall second).
    pub client_cores: f64,
    /// GETs completed.
    pub requests: usize,
}

impl Target {
    /// The bucket `bucket` of the S3 endpoint at `url` (`http://HOST:PORT`), requests
    /// signed with SigV4 under `access_key`.
    pub fn signed(url: &str, bucket: &str, access_key: &str, secret_key: &str) -> Self {
        Self {
            host: url.trim_start_matches("http://").to_owned(),
            bucket: bucket.into(),
            signer: Some(super::sigv4::Signer {
                access_key: access_key.into(),
                secret_key: secret_key.into(),
                region: "us-east-1".into(),
                session_token: None,
            }),
        }
    }
}

/// One signed ranged GET of `range` (`bytes=A-B`) of `path` (`/BUCKET/KEY`) over `conn`,
/// the body read into `body`: the milliseconds it took, checked to be a 206 of
/// `expected` bytes. The baseline of the rows that read one object of `kvtier gateway`.
pub(crate) fn timed_ranged_get(
    t: &Target,
    conn: &mut Conn,
    path: &str,
    range: &str,
    body: &mut Vec<u8>,
    expected: usize,
) -> anyhow::Result<f64> {
    let start = Instant::now();
    let head = head(
        t,
        conn,
        "GET",
        path,
        &[("range", range)],
        super::sigv4::EMPTY_SHA256,
    );
    let answer = conn.request(&head, &[], body)?;
    let ms = start.elapsed().as_secs_f64() * 1e3;
    anyhow::ensure!(
        answer.status == 206 && body.len() == expected,
        "ranged GET answered {} with {} bytes",
        answer.status,
        body.len()
    );
    Ok(ms)
}

fn object_key(i: usize) -> String {
    format!("bench/object-{i:05}")
}

pub(crate) fn head(
    t: &Target,
    conn: &Conn,
    method: &str,
    path: &str,
    extra: &[(&str, &str)],
    payload_sha: &str,
) -> String {
    request_head(
        t.signer.as_ref(),
        method,
        conn.host(),
        path,
        extra,
        payload_sha,
    )
}

/// Creates the bucket (if missing) and PUTs every object.
pub fn preload(t: &Target, spec: &Spec) -> anyhow::Result<()> {
    let mut conn = Conn::open(&t.host)?;
    let mut out = Vec::new();
    let path = format!("/{}", t.bucket);
    let h = head(t, &conn, "PUT", &path, &[], EMPTY_SHA256);
    let r = conn.request(&h, &[], &mut out)?;
    if r.status != 200 && r.status != 409 {
        bail!(
            "creating bucket {}: HTTP {} {}",
            t.bucket,
            r.status,
            String::from_utf8_lossy(&out)
        );
    }
    for i in 0..spec.objects {
        let body = pattern(spec.object_bytes, i as u8);
        let path = format!("/{}/{}", t.bucket, object_key(i));
        let sha = sha256_hex(&body);
        let h = head(t, &conn, "PUT", &path, &[], &sha);
        let r = conn.request(&h, &body, &mut out)?;
        if r.status != 200 {
            bail!(
                "PUT {path}: HTTP {} {}",
                r.status,
                String::from_utf8_lossy(&out)
            );
        }
    }
    Ok(())
}

/// CPU time this thread has used, from the scheduler's own count (nanoseconds).
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Runs the GET load and returns the figures. Every answer is checked: status 206 and
/// exactly the object's leading bytes.
pub fn run(t: &Target, spec: &Spec) -> anyhow::Result<Outcome> {
    let expected: Arc<Vec<Vec<u8>>> = Arc::new(
        (0..spec.objects)
            .map(|i| pattern(spec.object_bytes, i as u8)[..spec.range_bytes].to_vec())
            .collect(),
    );
    let range = format!("bytes=0-{}", spec.range_bytes - 1);
    let start = Instant::now();
    let deadline = start + spec.max_time;
    let results: Vec<anyhow::Result<(Vec<f64>, u64)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..spec.clients)
            .map(|c| {
                let expected = expected.clone();
                let range = range.as_str();
                s.spawn(move || -> anyhow::Result<(Vec<f64>, u64)> {
                    let cpu0 = thread_cpu_ns();
                    let mut conn = Conn::open(&t.host)?;
                    let mut out = Vec::with_capacity(spec.range_bytes);
                    let mut lat = Vec::with_capacity(spec.requests_per_client);
                    let mut x = (c as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                    for _ in 0..spec.requests_per_client {
                        if Instant::now() > deadline {
                            break;
                        }
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let i = (x % spec.objects as u64) as usize;
                        let path = format!("/{}/{}", t.bucket, object_key(i));
                        let t0 = Instant::now();
                        let h = head(t, &conn, "GET", &path, &[("range", range)], EMPTY_SHA256);
                        let r = conn.request(&h, &[], &mut out)?;
                        lat.push(t0.elapsed().as_secs_f64() * 1e3);
                        if r.status != 206 || out != expected[i] {
                            bail!(
                                "GET {path} {range}: HTTP {} with {} bytes, not the object's first {} bytes",
                                r.status,
                                out.len(),
                                spec.range_bytes
                            );
                        }
                    }
                    Ok((lat, thread_cpu_ns().saturating_sub(cpu0)))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a client thread panicked")))
            })
            .collect()
    });
    let wall = start.elapsed().as_secs_f64();
    let mut all = Vec::new();
    let mut cpu_ns = 0;
    for r in results {
        let (lat, cpu) = r.context("load client")?;
        all.extend(lat);
        cpu_ns += cpu;
    }
    if all.is_empty() {
        bail!("no request completed");
    }
    all.sort_by(f64::total_cmp);
    let at = |q: usize| all[(all.len() * q / 100).min(all.len() - 1)];
    Ok(Outcome {
        p50_ms: at(50),
        p99_ms: at(99),
        ops: all.len() as f64 / wall,
        client_cores: cpu_ns as f64 / 1e9 / wall,
        requests: all.len(),
    })
}
