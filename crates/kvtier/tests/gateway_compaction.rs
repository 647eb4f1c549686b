//! `kvtier gateway` reclaims the space of deleted and overwritten objects (issue 39, item
//! 6): under a churn loop — puts, overwrites and deletes at a steady rate — with the
//! gateway killed with SIGKILL between rounds, the store's disk use stays under a bound,
//! every live object reads back with exactly its last bytes and no deleted one returns.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests"
)]

mod gateway;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;

use gateway::Gateway;

const BUCKET: &str = "churn";
const SEGMENT: u64 = 16 << 20;
const OBJECT: usize = 256 << 10;
const KEYS: u64 = 40;

/// One request on a fresh connection: its status and body.
fn request(endpoint: &str, method: &str, key: &str, body: &[u8]) -> (u16, Vec<u8>) {
    let addr = endpoint.trim_start_matches("http://");
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "{method} /{BUCKET}/{key} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .unwrap();
    s.write_all(body).unwrap();
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).unwrap();
    let head_end = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("an HTTP answer");
    let status = std::str::from_utf8(&answer[9..12])
        .unwrap()
        .parse()
        .unwrap();
    (status, answer[head_end + 4..].to_vec())
}

/// The bytes of version `v` of an object.
fn content(v: u64) -> Vec<u8> {
    (0..OBJECT as u64)
        .map(|i| (i.wrapping_mul(0x9E37_79B9) ^ v.wrapping_mul(0x85EB_CA6B) >> 3) as u8)
        .collect()
}

/// Bytes of the store's files.
fn disk(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok()?.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum()
}

/// A small deterministic generator (xorshift).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn start(dir: &Path, below: &str) -> Gateway {
    Gateway::start_unauthenticated_with(
        dir,
        &[
            "--create-bucket",
            BUCKET,
            "--segment-bytes",
            &SEGMENT.to_string(),
            "--compact-interval",
            "100ms",
            "--compact-below",
            below,
        ],
    )
}

/// Runs the churn: `rounds` rounds of `ops` operations, a SIGKILL after each; returns the
/// largest disk use seen and the bytes written.
fn churn(dir: &Path, below: &str, rounds: usize, ops: usize) -> (u64, u64) {
    let mut model: BTreeMap<u64, Option<u64>> = BTreeMap::new();
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let (mut version, mut written, mut peak) = (0u64, 0u64, 0u64);
    for round in 0..=rounds {
        let mut g = start(dir, below);
        // Everything the model says is there, and nothing else.
        for (key, v) in &model {
            let (status, body) = request(&g.endpoint, "GET", &format!("k{key}"), &[]);
            match v {
                Some(v) => {
                    assert_eq!(status, 200, "round {round}: k{key} lost");
                    assert!(body == content(*v), "round {round}: k{key} has other bytes");
                }
                None => assert_eq!(status, 404, "round {round}: deleted k{key} came back"),
            }
        }
        if round == rounds {
            break; // the last start only checks what the last kill left
        }
        for op in 0..ops {
            let key = rng.next() % KEYS;
            if rng.next().is_multiple_of(5) {
                let (status, _) = request(&g.endpoint, "DELETE", &format!("k{key}"), &[]);
                assert_eq!(status, 204);
                model.insert(key, None);
            } else {
                version += 1;
                let (status, _) =
                    request(&g.endpoint, "PUT", &format!("k{key}"), &content(version));
                assert_eq!(status, 200);
                model.insert(key, Some(version));
                written += OBJECT as u64;
            }
            if op.is_multiple_of(25) {
                peak = peak.max(disk(dir));
            }
        }
        peak = peak.max(disk(dir));
        g.signal(kvtier_testkit::Signal::KILL);
    }
    (peak, written)
}

#[test]
fn under_churn_and_kill_9_the_gateways_disk_stays_bounded_and_nothing_is_lost_or_resurrected() {
    let dir = tempfile::tempdir().unwrap();
    let (rounds, ops) = (10, 180);
    let (peak, written) = churn(dir.path(), "0.5", rounds, ops);
    // At most 40 objects of 256 KiB are live (10 MiB). Sealed segments compacted below
    // half live hold at most twice that; with the active segment, one sealed since the
    // last pass and one waiting a pass to be removed (16 MiB each), 68 MiB. Without
    // compaction the same churn reached 124 MiB (recovery at each restart removes only
    // segments with nothing live in them).
    let bound = 68u64 << 20;
    println!(
        "gateway churn: {rounds} rounds of {ops} operations, {} MiB written, peak disk {} MiB (bound {} MiB)",
        written >> 20,
        peak >> 20,
        bound >> 20
    );
    assert!(
        written > 3 * bound,
        "the churn must write far more than the bound"
    );
    assert!(peak <= bound, "disk use reached {peak} bytes");
}
