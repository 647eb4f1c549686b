//! `kvtier serve`'s arena settings do what they say, in a real server process:
//! `ram_prefault` makes the whole arena resident at start, `ram_lock` locks it in RAM, and
//! without them neither happens (ADR 0018).

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed expectation is a failed test"
)]

mod server;

use server::{Server, layout_spec, payloads, prompt, runtime};

/// A `/proc/PID/status` field in bytes (`VmRSS`, `VmLck`: reported in kB).
fn status_bytes(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with(field))
        .unwrap_or_else(|| panic!("no {field} in {status}"));
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib << 10
}

/// The arena of a 64 MiB RAM tier: the budget plus two 32 MiB segments.
const ARENA: u64 = 128 << 20;

#[test]
fn a_prefaulted_locked_arena_is_resident_and_locked_and_serves() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(
        dir.path(),
        &[
            "--ram",
            "64MiB",
            "--set",
            "ram_prefault=true",
            "--set",
            "ram_lock=true",
        ],
    );
    let pid = server.pid();
    assert!(
        status_bytes(pid, "VmLck:") >= ARENA,
        "the arena is not locked"
    );
    assert!(
        status_bytes(pid, "VmRSS:") >= ARENA,
        "the arena is not resident"
    );

    // It serves, byte-exact, from the locked arena.
    let c = server.client();
    runtime().block_on(async {
        let layout = c.register_layout(&layout_spec("arena", 4)).await.unwrap();
        let p = prompt(&layout, 7, 4);
        let sent = payloads(&layout, 7, 4);
        assert_eq!(c.store(&p, sent.clone()).await.unwrap().stored, 4);
        let hit = c.lookup(&p).await.unwrap();
        let got = c
            .load(&kvtier_client::wire::LoadRequest {
                layout: layout.layout.clone(),
                handles: hit.handles.clone(),
                layers: None,
                chains: None,
            })
            .await
            .unwrap();
        assert_eq!(got.blocks, sent);
    });
    assert!(server.stop().success());

    // Without the settings (the defaults) nothing is locked, and the arena's pages are
    // not all resident at start.
    let dir = tempfile::tempdir().unwrap();
    let plain = Server::start(dir.path(), &["--ram", "64MiB"]);
    assert_eq!(status_bytes(plain.pid(), "VmLck:"), 0);
    assert!(status_bytes(plain.pid(), "VmRSS:") < ARENA);
    assert!(plain.stop().success());
}
