//! `kvtier inspect`: per-namespace counts of a real store, `--verify` finds a flipped byte,
//! and a store held by another process is refused with a clear message.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code"
)]

use std::os::unix::fs::FileExt;
use std::process::Command;
use std::sync::Arc;

use kvtier_core::clock::SystemClock;
use kvtier_core::tier::conformance::test_chain;
use kvtier_core::tier::{NoSink, Tier};
use kvtier_core::{KvDtype, Layout, LayoutKey};
use kvtier_ssd::{SsdConfig, SsdTier};

fn kvtier(args: &[&str], dir: &std::path::Path) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kvtier"))
        .args(args)
        .arg(dir)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Every file of `dir` (recursively) with its bytes.
fn listing(dir: &std::path::Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(listing(&p));
        } else {
            out.push((p.clone(), std::fs::read(&p).unwrap()));
        }
    }
    out.sort();
    out
}

#[test]
fn inspect_counts_namespaces_and_verify_finds_damage() {
    let dir = tempfile::tempdir().unwrap();
    let a = Layout::new(LayoutKey::new("model-a", KvDtype::F16, 16, 2, 2, 64)).unwrap();
    let b = Layout::new(LayoutKey::new("model-b", KvDtype::Bf16, 16, 2, 2, 64)).unwrap();
    {
        let tier = SsdTier::open(
            SsdConfig::new(dir.path()),
            Arc::new(SystemClock::new()),
            Arc::new(NoSink),
        )
        .unwrap();
        for (m, p) in test_chain(&a, 5, 1).into_iter().chain(test_chain(&b, 3, 2)) {
            tier.put(&m, p).unwrap();
        }
        // While the store is open, inspect works beside it and changes nothing.
        let before = listing(dir.path());
        let (ok, text) = kvtier(&["inspect"], dir.path());
        assert!(ok && text.contains("live records"), "{text}");
        assert_eq!(
            listing(dir.path()),
            before,
            "inspect changed a store in use"
        );
    }
    let (ok, text) = kvtier(&["inspect", "--verify"], dir.path());
    assert!(ok, "{text}");
    let line_of = |l: &Layout| {
        text.lines()
            .find(|line| line.starts_with(&l.digest().to_hex()))
            .unwrap_or_default()
            .to_string()
    };
    let la = line_of(&a);
    let lb = line_of(&b);
    assert!(la.split_whitespace().nth(1) == Some("5"), "{text}");
    assert!(lb.split_whitespace().nth(1) == Some("3"), "{text}");
    assert!(text.contains("verified 8 records: 0 corrupt"), "{text}");

    // Flip one payload byte of the first record.
    let seg = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .min()
        .unwrap();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&seg)
        .unwrap();
    let mut byte = [0u8; 1];
    f.read_exact_at(&mut byte, 4096 + 4096 + 100).unwrap();
    f.write_all_at(&[byte[0] ^ 1], 4096 + 4096 + 100).unwrap();
    drop(f);
    let (ok, text) = kvtier(&["inspect", "--verify"], dir.path());
    assert!(!ok, "damage must fail --verify:\n{text}");
    assert!(
        text.contains("checksum mismatch") && text.contains("1 corrupt"),
        "{text}"
    );
}

#[test]
fn inspect_of_a_data_directory_reads_its_store_and_changes_nothing() {
    let data = tempfile::tempdir().unwrap();
    let store = data.path().join("ssd");
    let layout = Layout::new(LayoutKey::new("model-a", KvDtype::F16, 16, 2, 2, 64)).unwrap();
    {
        let tier = SsdTier::open(
            SsdConfig::new(&store),
            Arc::new(SystemClock::new()),
            Arc::new(NoSink),
        )
        .unwrap();
        for (m, p) in test_chain(&layout, 4, 1) {
            tier.put(&m, p).unwrap();
        }
        tier.record_shutdown(true).unwrap();
    }
    let before = listing(data.path());
    let (ok, text) = kvtier(&["inspect"], data.path());
    assert!(ok, "{text}");
    assert!(text.contains("4 live records"), "{text}");
    assert!(text.contains("last shutdown: clean"), "{text}");
    assert_eq!(
        listing(data.path()),
        before,
        "inspect wrote to what it inspected"
    );
    // The shutdown record is still there for the next start.
    let tier = SsdTier::open(
        SsdConfig::new(&store),
        Arc::new(SystemClock::new()),
        Arc::new(NoSink),
    )
    .unwrap();
    assert_eq!(tier.previous_shutdown_clean(), Some(true));
}
