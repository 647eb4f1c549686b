//! Crash safety of the SSD tier with real processes: a child stores blocks as fast as it
//! can and is killed with SIGKILL at a pseudo-random moment, round after round, into the
//! same store. After each kill the store is reopened: every block it serves must be
//! byte-identical to what was written (the payload is a function of the hash), nothing
//! may panic, and in `fsync` mode every acknowledged block must be there.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code"
)]

use std::collections::HashSet;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use kvtier_core::clock::SystemClock;
use kvtier_core::hash::BlockHash;
use kvtier_core::tier::conformance::{Event, RecordingSink};
use kvtier_core::tier::{ResidencySink, Tier, TierKind};
use kvtier_ssd::{SsdConfig, SsdTier};
use kvtier_testkit::{Process, Ready};

/// Must match `crash_writer::crash_payload`: the contract between writer and checker.
fn payload(hash: &BlockHash, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| hash.0[i % 16] ^ (i as u8) ^ ((i >> 8) as u8))
        .collect()
}

const BLOCK_BYTES: usize = 16 * 2 * 64 * 2 * 2 * 2; // tokens × heads × dim × f16 × K,V × layers

fn run_rounds(rounds: u32, fsync: bool) {
    let dir = kvtier_testkit::test_dir("crash-recovery").unwrap();
    let store = dir.path().join("store");
    let ack_log = dir.path().join("acks");
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15 ^ u64::from(std::process::id());
    let mut total_recovered = 0;
    for round in 0..rounds {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_kvtier"));
        cmd.args(["__crash-writer", "--round", &round.to_string()])
            .arg("--dir")
            .arg(&store)
            .arg("--ack-log")
            .arg(&ack_log);
        if fsync {
            cmd.arg("--fsync");
        }
        let mut child =
            Process::start("kvtier __crash-writer", cmd, Ready::Spawned, Duration::ZERO).unwrap();
        std::thread::sleep(Duration::from_millis(40 + seed % 200));
        child.kill_hard().unwrap(); // SIGKILL
        total_recovered = check(&store, &ack_log, fsync);
    }
    assert!(total_recovered > 0, "the child never stored anything");
}

/// Reopens the store and checks it; returns how many blocks it holds.
fn check(store: &Path, ack_log: &Path, fsync: bool) -> usize {
    let sink = Arc::new(RecordingSink::default());
    let tier = SsdTier::open(
        SsdConfig::new(store),
        Arc::new(SystemClock::new()),
        sink.clone() as Arc<dyn ResidencySink>,
    )
    .expect("reopen after SIGKILL");
    assert_eq!(
        tier.recovery_report().previous_shutdown_clean,
        None,
        "a killed run was reported clean"
    );
    let recovered: Vec<BlockHash> = sink
        .events()
        .into_iter()
        .filter_map(|e| match e {
            Event::Inserted(TierKind::Ssd, h) => Some(h),
            _ => None,
        })
        .collect();
    for h in &recovered {
        let got = tier.get(h).expect("a read after a crash must not fail");
        let got = got.unwrap_or_else(|| panic!("block {h} was indexed but is unreadable"));
        assert_eq!(
            &got[..],
            &payload(h, BLOCK_BYTES)[..],
            "block {h} has other bytes"
        );
    }
    if fsync {
        let held: HashSet<String> = recovered.iter().map(|h| h.to_hex()).collect();
        let acks = std::fs::read_to_string(ack_log).unwrap_or_default();
        // Only whole lines count: a line cut by the kill was never a full acknowledgement.
        // A whole line is one hash (32 hex digits); anything else is a harness error.
        let lines: Vec<&str> = acks
            .split_inclusive('\n')
            .filter(|l| l.ends_with('\n'))
            .map(str::trim)
            .collect();
        for l in &lines {
            assert_eq!(l.len(), 32, "ack log line `{l}` is not one block hash");
        }
        for h in &lines {
            assert!(
                held.contains(*h),
                "acknowledged block {h} was lost ({} acks, {} held)",
                lines.len(),
                held.len()
            );
        }
    }
    assert_eq!(
        tier.stats().evictions.corrupt,
        0,
        "a record torn by the kill was served or indexed"
    );
    recovered.len()
}

#[test]
fn sigkill_never_leaves_a_readable_partial_write() {
    run_rounds(8, false);
}

#[test]
fn sigkill_in_fsync_mode_loses_no_acknowledged_block() {
    run_rounds(6, true);
}
