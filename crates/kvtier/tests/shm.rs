//! The shared arena (ADR 0019) with a real `kvtier serve` and real client processes: loads
//! and stores through the mapping are byte-exact, a client can neither write the arena nor
//! change a block it committed, a killed client gives back everything it held, a killed
//! server leaves its clients with errors (never wrong bytes) and a restart serves from the
//! SSD, and every kind of bad commit is refused with its room freed.
//!
//! Client processes are this test binary run again with `KVTIER_SHM_ROLE` set: the test
//! `client_role` then plays that role instead of testing.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed expectation is a failed test"
)]

mod server;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use kvtier_client::shm::ShmClient;
use kvtier_client::shm::proto::{CommitHead, Slot};
use kvtier_client::wire::{LayoutInfo, LoadRequest, PromptSpec};
use kvtier_testkit::{Process, Ready};
use server::{Server, layout_spec, payload, payloads, prompt, runtime};

const ROLE: &str = "KVTIER_SHM_ROLE";

fn socket(dir: &Path) -> PathBuf {
    dir.join("kvtier.sock")
}

fn start(dir: &Path, extra: &[&str]) -> Server {
    let mut args = vec!["--set", "shm.enabled=true"];
    args.extend_from_slice(extra);
    Server::start(dir, &args)
}

fn register(server: &Server, layers: u32) -> LayoutInfo {
    runtime()
        .block_on(server.client().register_layout(&layout_spec("shm", layers)))
        .unwrap()
}

fn lookup(server: &Server, p: &PromptSpec) -> kvtier_client::wire::LookupAnswer {
    runtime().block_on(server.client().lookup(p)).unwrap()
}

fn http_load(server: &Server, layout: &LayoutInfo, p: &PromptSpec) -> Vec<bytes::Bytes> {
    let hit = lookup(server, p);
    let req = LoadRequest {
        layout: layout.layout.clone(),
        handles: hit.handles,
        layers: None,
        chains: None,
    };
    runtime()
        .block_on(server.client().load(&req))
        .unwrap()
        .blocks
}

fn arena_used(server: &Server) -> u64 {
    stat(server, "engine_arena_used_bytes")
}

fn stat(server: &Server, name: &str) -> u64 {
    runtime().block_on(server.client().stats()).unwrap()[name]
}

/// Waits until `cond` holds, at most `within`.
fn eventually(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + within;
    while Instant::now() < end {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    cond()
}

/// This binary as a client process playing `role`.
fn client_process(role: &str, env: &[(&str, String)], ready: &'static str) -> Process {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "client_role", "--nocapture", "--test-threads=1"])
        .env(ROLE, role);
    for (k, v) in env {
        cmd.env(k, v);
    }
    Process::start(
        format!("client {role}"),
        cmd,
        Ready::StdoutLine(ready.into()),
        Duration::from_secs(30),
    )
    .unwrap()
}

fn wait_exit(p: &mut Process, within: Duration) -> std::process::ExitStatus {
    let end = Instant::now() + within;
    loop {
        if let Some(status) = p.try_wait().unwrap() {
            return status;
        }
        assert!(
            Instant::now() < end,
            "the client did not exit: {}",
            p.stdout()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn loads_and_stores_through_the_mapping_are_byte_exact() {
    let dir = tempfile::tempdir().unwrap();
    // Staging for 64 blocks of 32 KiB: the 100-block store goes in two pieces.
    let server = start(dir.path(), &["--set", "shm.staging=2MiB"]);
    let layout = register(&server, 4);
    let shm = ShmClient::connect(&socket(dir.path())).unwrap();

    // Stored through the arena, loaded over HTTP and in place.
    let p = prompt(&layout, 1, 100);
    let sent = payloads(&layout, 1, 100);
    let refs: Vec<&[u8]> = sent.iter().map(|b| &b[..]).collect();
    let answer = shm.store(&p, &refs, None).unwrap();
    assert_eq!((answer.stored, answer.stopped), (100, None));
    assert_eq!(http_load(&server, &layout, &p), sent);
    let hit = lookup(&server, &p);
    let lease = shm.load_handles(&layout.layout, &hit.handles).unwrap();
    assert!(lease.complete());
    assert_eq!(lease.slots().len(), 100);
    for (i, want) in sent.iter().enumerate() {
        assert_eq!(lease.block(i), &want[..], "block {i}");
        assert!(lease.verify(i));
    }
    // Stored again: duplicates, nothing copied twice.
    let again = shm.store(&p, &refs, None).unwrap();
    assert_eq!((again.stored, again.duplicates), (0, 100));

    // Stored over HTTP, loaded in place.
    let q = prompt(&layout, 2, 5);
    runtime()
        .block_on(server.client().store(&q, payloads(&layout, 2, 5)))
        .unwrap();
    let lease_q = shm
        .load_handles(&layout.layout, &lookup(&server, &q).handles)
        .unwrap();
    assert_eq!(
        (0..5)
            .map(|i| lease_q.block(i).to_vec())
            .collect::<Vec<_>>(),
        payloads(&layout, 2, 5)
    );
    assert!((0..5).all(|i| lease_q.verify(i)));

    // A handle list that stops being a prefix is leased up to there.
    let mut handles = lookup(&server, &p).handles;
    handles.replace_range(32 * 3..32 * 4, &"0".repeat(32));
    let part = shm.load_handles(&layout.layout, &handles).unwrap();
    assert_eq!((part.slots().len(), part.complete()), (3, false));
    drop((lease, lease_q, part));
    assert!(server.stop().success());
}

#[test]
fn a_large_store_goes_in_pieces_and_parts_and_lands_whole() {
    let dir = tempfile::tempdir().unwrap();
    // 32 KiB blocks: 12 MiB of staging holds 384 of them (a piece), committed in parts of
    // 8 MiB (256 blocks): 600 blocks are a piece of two parts and a piece of one.
    let server = start(dir.path(), &["--set", "shm.staging=12MiB"]);
    let layout = register(&server, 4);
    let shm = ShmClient::connect(&socket(dir.path())).unwrap();
    let p = prompt(&layout, 40, 600);
    let sent = payloads(&layout, 40, 600);
    let refs: Vec<&[u8]> = sent.iter().map(|b| &b[..]).collect();
    let answer = shm.store(&p, &refs, Some("written")).unwrap();
    assert_eq!((answer.stored, answer.stopped.as_deref()), (600, None));
    assert_eq!(answer.durability, "written");
    assert_eq!(http_load(&server, &layout, &p), sent);

    // Parts by hand: in order they land, out of order the reservation is refused whole.
    let q = prompt(&layout, 41, 3);
    let mut r = shm.reserve(&q, 0, 3).unwrap();
    let mut slots = Vec::new();
    for i in 0..3 {
        let crc =
            kvtier_core::arena::copy_checked(shm.staging_mut(&mut r, i), &payload(&layout, 41, i));
        slots.push(Slot {
            offset: r.offsets[i],
            len: layout.block_bytes,
            crc,
        });
    }
    let part = |first: u32, s: &[Slot]| {
        let mut tail = Vec::new();
        s.iter().for_each(|s| s.put(&mut tail));
        shm.commit_raw(
            &CommitHead {
                reservation: r.id,
                first,
                durability: None,
            },
            &tail,
        )
    };
    assert_eq!(part(0, &slots[..1]).unwrap().stored, 1);
    assert_eq!(
        lookup(&server, &q).matched_tokens,
        16,
        "the first part is stored at once"
    );
    assert_eq!(
        part(2, &slots[2..]).unwrap_err().code(),
        Some("not_reserved")
    );
    assert_eq!(
        part(1, &slots[1..]).unwrap_err().code(),
        Some("not_reserved"),
        "refused whole"
    );
    assert_eq!(lookup(&server, &q).matched_tokens, 16);
    assert!(server.stop().success());
}

#[test]
fn a_client_cannot_write_the_arena_or_change_what_it_committed() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[]);
    let layout = register(&server, 4);
    let p = prompt(&layout, 3, 4);
    let sent = payloads(&layout, 3, 4);
    let shm = ShmClient::connect(&socket(dir.path())).unwrap();

    // Commit, then scribble over the staging memory the blocks came from.
    let mut r = shm.reserve(&p, 0, 4).unwrap();
    for (i, want) in sent.iter().enumerate() {
        shm.staging_mut(&mut r, i).copy_from_slice(want);
    }
    let offsets = r.offsets.clone();
    assert_eq!(shm.commit(r, None, None).unwrap().stored, 4);
    let (staging, _) = shm.staging_region();
    for &o in &offsets {
        // SAFETY: inside this client's own staging mapping (the server handed out these
        // offsets); the server no longer reads them.
        #[allow(unsafe_code, reason = "a client misusing its own staging memory")]
        unsafe {
            std::ptr::write_bytes(
                (staging + o as usize) as *mut u8,
                0xee,
                layout.block_bytes as usize,
            );
        }
    }
    assert_eq!(
        http_load(&server, &layout, &p),
        sent,
        "committed bytes changed"
    );

    // Another process tries to write the arena: the seals refuse a writable mapping and a
    // write through its read-only one kills it, and no block changes.
    let hit = lookup(&server, &p);
    let mut writer = client_process(
        "write",
        &[
            ("SOCKET", socket(dir.path()).display().to_string()),
            ("LAYOUT", layout.layout.clone()),
            ("HANDLES", hit.handles.clone()),
        ],
        "writing",
    );
    let status = wait_exit(&mut writer, Duration::from_secs(20));
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        status.signal(),
        Some(libc::SIGSEGV),
        "{status:?}: {}",
        writer.stdout()
    );
    assert!(
        writer
            .stdout()
            .contains("sealed: no writable mapping, no mprotect"),
        "{}",
        writer.stdout()
    );
    assert_eq!(http_load(&server, &layout, &p), sent, "the arena changed");
    let lease = shm.load_handles(&layout.layout, &hit.handles).unwrap();
    assert!((0..4).all(|i| lease.verify(i) && lease.block(i) == &sent[i][..]));
    drop(lease);
    assert!(server.stop().success());
}

/// A client that keeps changing its staging bytes while the server copies them gets, for
/// each block, either a refusal (`bad_checksum`) or exactly the bytes its checksum
/// describes: the server checksums the words it stores, read once, not the staging memory
/// read again.
#[test]
fn staging_changed_during_a_commit_never_indexes_bytes_its_checksum_does_not_describe() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[]);
    let layout = register(&server, 4);
    let shm = ShmClient::connect(&socket(dir.path())).unwrap();
    let block = layout.block_bytes as usize;
    let (staging, _) = shm.staging_region();
    let (mut stored, mut refused) = (0, 0);
    for round in 0..12u32 {
        let p = prompt(&layout, 100 + round, 16);
        let sent = payloads(&layout, 100 + round, 16);
        let mut r = shm.reserve(&p, 0, 16).unwrap();
        let crcs: Vec<u32> = (0..16)
            .map(|i| kvtier_core::arena::copy_checked(shm.staging_mut(&mut r, i), &sent[i]))
            .collect();
        let ranges: Vec<usize> = r.offsets.iter().map(|&o| staging + o as usize).collect();
        let stop = Arc::new(AtomicBool::new(false));
        // Each byte it touches is flipped and put back at once: most copies see the
        // payload whole, some catch a flipped byte.
        let originals = sent.clone();
        let scribbler = std::thread::spawn({
            let stop = Arc::clone(&stop);
            move || {
                while !stop.load(Ordering::Relaxed) {
                    for (&start, original) in ranges.iter().zip(&originals) {
                        for at in (0..block).step_by(61) {
                            let p = (start + at) as *mut u8;
                            // SAFETY: inside this client's own staging mapping, in a
                            // range the server handed to this reservation.
                            #[allow(unsafe_code, reason = "a client racing the server's copy")]
                            unsafe {
                                p.write_volatile(!original[at]);
                                p.write_volatile(original[at]);
                            }
                        }
                    }
                }
            }
        });
        let answer = shm.commit(r, Some(&crcs), None);
        stop.store(true, Ordering::Relaxed);
        scribbler.join().unwrap();
        match answer {
            Ok(a) => {
                stored += a.stored;
                let hit = lookup(&server, &p);
                let lease = shm.load_handles(&layout.layout, &hit.handles).unwrap();
                assert_eq!(lease.slots().len(), a.stored, "round {round}");
                for (i, want) in sent.iter().enumerate().take(a.stored) {
                    assert!(
                        lease.verify(i),
                        "round {round}: block {i} fails its checksum"
                    );
                    assert_eq!(lease.block(i), &want[..], "round {round}: block {i}");
                }
            }
            Err(e) => {
                assert_eq!(e.code(), Some("bad_checksum"), "round {round}: {e}");
                refused += 1;
            }
        }
    }
    eprintln!("{stored} blocks stored whole, {refused} commits refused");
    assert!(stored + refused > 0);
    assert!(server.stop().success());
}

#[test]
fn two_clients_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[]);
    let layout = register(&server, 4);
    let env = |seed: u32| {
        vec![
            ("SOCKET", socket(dir.path()).display().to_string()),
            ("URL", server.url().to_string()),
            ("LAYOUT", serde_json::to_string(&layout).unwrap()),
            ("SEED", seed.to_string()),
        ]
    };
    let mut a = client_process("busy", &env(10), "started");
    let mut b = client_process("busy", &env(20), "started");
    for c in [&mut a, &mut b] {
        let status = wait_exit(c, Duration::from_secs(60));
        assert!(status.success(), "{status:?}: {}", c.stdout());
        assert!(c.stdout().contains("rounds ok"), "{}", c.stdout());
    }
    // Each client's blocks are there, byte-exact, for anyone.
    for seed in [10, 20] {
        for round in 0..10 {
            let p = prompt(&layout, seed + round, 3);
            assert_eq!(
                http_load(&server, &layout, &p),
                payloads(&layout, seed + round, 3)
            );
        }
    }
    assert!(server.stop().success());
}

#[test]
fn a_killed_client_gives_back_its_slots_and_indexes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    // A small RAM tier, so that the leased prompt is evicted while leased.
    let server = start(dir.path(), &["--ram", "8MiB", "--set", "ssd.enabled=false"]);
    let layout = register(&server, 4);
    let block = layout.block_bytes;
    let held = prompt(&layout, 5, 16);
    runtime()
        .block_on(server.client().store(&held, payloads(&layout, 5, 16)))
        .unwrap();
    let half_written = prompt(&layout, 6, 4);
    let mut client = client_process(
        "hold",
        &[
            ("SOCKET", socket(dir.path()).display().to_string()),
            ("LAYOUT", layout.layout.clone()),
            ("HANDLES", lookup(&server, &held).handles),
            ("PROMPT", serde_json::to_string(&half_written).unwrap()),
        ],
        "holding",
    );
    // Evict the leased blocks: their slots stay taken under the lease.
    for seed in 100..120 {
        runtime()
            .block_on(
                server
                    .client()
                    .store(&prompt(&layout, seed, 16), payloads(&layout, seed, 16)),
            )
            .unwrap();
    }
    assert_eq!(
        lookup(&server, &held).matched_tokens,
        0,
        "the leased prompt was not evicted"
    );
    let before = arena_used(&server);
    client.kill_hard().unwrap();
    // 16 leased blocks and 4 reserved ones come back, and nothing of the reservation is
    // indexed.
    let freed = 20 * block;
    assert!(
        eventually(Duration::from_secs(10), || arena_used(&server)
            == before - freed),
        "arena used {} bytes before the kill, {} after (expected {} fewer)",
        before,
        arena_used(&server),
        freed
    );
    assert_eq!(lookup(&server, &half_written).matched_tokens, 0);
    // The gauges say so too.
    assert_eq!(
        (
            stat(&server, "shm_clients"),
            stat(&server, "shm_leased_bytes"),
            stat(&server, "shm_reserved_bytes")
        ),
        (0, 0, 0)
    );
    assert_eq!(stat(&server, "shm_leases"), 1);
    assert!(server.stop().success());
}

#[test]
fn a_killed_server_gives_its_clients_errors_and_a_restart_serves_from_the_ssd() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[]);
    let layout = register(&server, 4);
    let p = prompt(&layout, 7, 6);
    let sent = payloads(&layout, 7, 6);
    let refs: Vec<&[u8]> = sent.iter().map(|b| &b[..]).collect();
    let shm = ShmClient::connect(&socket(dir.path())).unwrap();
    assert_eq!(
        shm.store(&p, &refs, Some("synced")).unwrap().durability,
        "synced"
    );
    let handles = lookup(&server, &p).handles;
    let lease = shm.load_handles(&layout.layout, &handles).unwrap();
    server.kill9();
    // The mapping outlives the server: leased bytes read as they were.
    assert!((0..6).all(|i| lease.block(i) == &sent[i][..] && lease.verify(i)));
    // Calls fail, they do not hang or crash.
    let e = shm.load_handles(&layout.layout, &handles).unwrap_err();
    assert_eq!(e.kind(), kvtier_core::ErrorKind::Unavailable, "{e}");
    assert!(shm.store(&p, &refs, None).is_err());
    drop(lease);
    assert!(ShmClient::connect(&socket(dir.path())).is_err());

    // A restart replaces the stale socket and serves the synced blocks from the SSD, copied
    // into the arena for the client.
    let server = start(dir.path(), &[]);
    let layout = register(&server, 4);
    let shm = ShmClient::connect(&socket(dir.path())).unwrap();
    let lease = shm
        .load_handles(&layout.layout, &lookup(&server, &p).handles)
        .unwrap();
    assert!(lease.complete());
    assert!((0..6).all(|i| lease.block(i) == &sent[i][..] && lease.verify(i)));
    drop(lease);
    assert!(server.stop().success());
    assert!(
        !socket(dir.path()).exists(),
        "a clean stop removes the socket"
    );
}

#[test]
fn bad_commits_are_refused_and_their_room_freed() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &["--set", "shm.reserve_ttl=300ms"]);
    let layout = register(&server, 4);
    let block = layout.block_bytes;
    let a = ShmClient::connect(&socket(dir.path())).unwrap();
    let b = ShmClient::connect(&socket(dir.path())).unwrap();
    let baseline = arena_used(&server);
    let code = |r: Result<kvtier_client::wire::StoreAnswer, kvtier_client::shm::ShmError>| {
        r.expect_err("a bad commit was accepted")
            .code()
            .unwrap_or("none")
            .to_string()
    };
    // A reservation with its payload written; the slots a right commit would send.
    let ready = |c: &ShmClient, seed: u32| {
        let p = prompt(&layout, seed, 2);
        let mut r = c.reserve(&p, 0, 2).unwrap();
        let mut slots = Vec::new();
        for i in 0..2 {
            let want = payload(&layout, seed, i);
            let crc = kvtier_core::arena::copy_checked(c.staging_mut(&mut r, i), &want);
            slots.push(Slot {
                offset: r.offsets[i],
                len: block,
                crc,
            });
        }
        (p, r.id, slots)
    };
    let tail = |slots: &[Slot]| {
        let mut out = Vec::new();
        slots.iter().for_each(|s| s.put(&mut out));
        out
    };
    let head = |id| CommitHead {
        reservation: id,
        first: 0,
        durability: None,
    };

    let (p, id, mut slots) = ready(&a, 30);
    slots[1].crc ^= 1;
    assert_eq!(code(a.commit_raw(&head(id), &tail(&slots))), "bad_checksum");
    slots[1].crc ^= 1;
    assert_eq!(
        code(a.commit_raw(&head(id), &tail(&slots))),
        "not_reserved",
        "the room was freed"
    );
    assert_eq!(lookup(&server, &p).matched_tokens, 0);

    let (_, id, mut slots) = ready(&a, 31);
    slots[0].len -= 1;
    assert_eq!(code(a.commit_raw(&head(id), &tail(&slots))), "bad_size");

    let (_, id, mut slots) = ready(&a, 32);
    slots[1].offset += 4096;
    assert_eq!(code(a.commit_raw(&head(id), &tail(&slots))), "not_reserved");

    // Another client's reservation: refused, and left to its owner.
    let (p, id, slots) = ready(&a, 33);
    assert_eq!(code(b.commit_raw(&head(id), &tail(&slots))), "not_yours");
    assert_eq!(a.commit_raw(&head(id), &tail(&slots)).unwrap().stored, 2);
    assert_eq!(http_load(&server, &layout, &p), payloads(&layout, 33, 2));
    assert_eq!(
        code(a.commit_raw(&head(id), &tail(&slots))),
        "already_committed"
    );

    let (p, id, slots) = ready(&a, 34);
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(code(a.commit_raw(&head(id), &tail(&slots))), "expired");
    assert_eq!(lookup(&server, &p).matched_tokens, 0);

    // An uncommitted reservation expires on its own too.
    let (p, _, _) = ready(&b, 35);
    std::thread::sleep(Duration::from_millis(900));
    assert_eq!(lookup(&server, &p).matched_tokens, 0);

    // Every refused or expired reservation gave its arena room back: only seed 33's two
    // committed blocks are held.
    assert_eq!(arena_used(&server), baseline + 2 * block);
    // Counted: six refused commits (checksum, size, offset, another's, doubled, expired;
    // the retry after the bad checksum is one more), two expiries, one stored commit.
    assert_eq!(stat(&server, "shm_refused_commits"), 7);
    assert_eq!(stat(&server, "shm_expired"), 2);
    assert_eq!(
        (
            stat(&server, "shm_commits"),
            stat(&server, "shm_committed_bytes")
        ),
        (1, 2 * block)
    );
    assert_eq!(
        (
            stat(&server, "shm_clients"),
            stat(&server, "shm_reserved_bytes")
        ),
        (2, 0)
    );
    assert!(server.stop().success());
}

/// A client process's part (see the module docs); does nothing in a normal test run.
#[test]
fn client_role() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let var = |k: &str| std::env::var(k).unwrap();
    let shm = ShmClient::connect(Path::new(&var("SOCKET"))).unwrap();
    match role.as_str() {
        "write" => write_role(
            &shm,
            &var("LAYOUT"),
            &var("HANDLES"),
            Path::new(&var("SOCKET")),
        ),
        "hold" => {
            let _lease = shm.load_handles(&var("LAYOUT"), &var("HANDLES")).unwrap();
            let p: PromptSpec = serde_json::from_str(&var("PROMPT")).unwrap();
            let mut r = shm.reserve(&p, 0, 4).unwrap();
            for i in 0..2 {
                shm.staging_mut(&mut r, i).fill(0x77);
            }
            println!("holding");
            std::thread::sleep(Duration::from_secs(120));
        }
        "busy" => {
            let layout: LayoutInfo = serde_json::from_str(&var("LAYOUT")).unwrap();
            let seed: u32 = var("SEED").parse().unwrap();
            let http = kvtier_client::Client::new(&var("URL")).unwrap();
            println!("started");
            let rt = runtime();
            for round in 0..10 {
                let p = prompt(&layout, seed + round, 3);
                let sent = payloads(&layout, seed + round, 3);
                let refs: Vec<&[u8]> = sent.iter().map(|b| &b[..]).collect();
                assert_eq!(shm.store(&p, &refs, None).unwrap().stored, 3);
                let hit = rt.block_on(http.lookup(&p)).unwrap();
                let lease = shm.load_handles(&layout.layout, &hit.handles).unwrap();
                for (i, want) in sent.iter().enumerate() {
                    assert_eq!(lease.block(i), &want[..]);
                }
            }
            println!("rounds ok");
        }
        other => panic!("unknown role {other}"),
    }
}

/// Tries every way a client could write the arena; the last one must kill it.
#[allow(unsafe_code, reason = "a client misbehaving on purpose")]
fn write_role(shm: &ShmClient, layout: &str, handles: &str, socket: &Path) {
    use std::os::fd::AsRawFd;
    // The arena's file, as the server hands it over.
    let mut raw = std::os::unix::net::UnixStream::connect(socket).unwrap();
    let hello = kvtier_client::shm::proto::Hello {
        version: kvtier_client::shm::proto::VERSION,
    };
    kvtier_client::shm::proto::write(&mut raw, 1, &hello, b"").unwrap();
    let (_, files) = kvtier_client::shm::fds::recv(&mut raw).unwrap().unwrap();
    let (_, len) = shm.arena_region();
    // SAFETY: a new mapping the kernel must refuse; nothing is touched.
    let writable = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            files[0].as_raw_fd(),
            0,
        )
    };
    assert_eq!(
        writable,
        libc::MAP_FAILED,
        "a writable mapping of the arena was allowed"
    );
    let (addr, _) = shm.arena_region();
    // SAFETY: asks the kernel to make our read-only mapping writable; it must refuse.
    let upgraded = unsafe {
        libc::mprotect(
            addr as *mut libc::c_void,
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
        )
    };
    assert_ne!(upgraded, 0, "the read-only mapping became writable");
    println!("sealed: no writable mapping, no mprotect");
    let lease = shm.load_handles(layout, handles).unwrap();
    let target = lease.block(0).as_ptr() as *mut u8;
    println!("writing");
    // SAFETY: none — this write must fault (the page is mapped read-only).
    unsafe { target.write_volatile(0x42) };
    println!("the write went through");
}

/// Requests the server answered on `route` so far (from `/metrics`).
fn answered(server: &Server, route: &str) -> u64 {
    let text = runtime().block_on(server.client().metrics()).unwrap();
    text.lines()
        .filter(|l| {
            l.starts_with("kvtier_request_duration_seconds_count")
                && l.contains(&format!("endpoint=\"{route}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

#[test]
fn the_cache_api_goes_through_the_shared_arena_when_connected() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[]);
    let url = server.url().to_string();
    let cache = kvtier_node::Cache::served_shared(&url, None, &socket(dir.path())).unwrap();
    let http_only = kvtier_node::Cache::served(&url, None).unwrap();
    assert!(http_only.arena().is_none());
    let (address, len) = cache.arena().unwrap();
    assert!(address > 0 && len >= 256 << 20);
    let key = kvtier_core::LayoutKey::new("shm-cache", kvtier_core::KvDtype::F16, 16, 4, 2, 64);
    let layout = cache.register_layout(key, None).unwrap();
    let block = layout.block_bytes() as usize;
    let tokens: Vec<u32> = (0..64).collect();
    let data: Vec<Vec<u8>> = (0..4).map(|i| vec![i as u8 * 17 + 1; block]).collect();
    let refs: Vec<&[u8]> = data.iter().map(|d| &d[..]).collect();
    let (loads, stores) = (
        answered(&server, "/v1/load"),
        answered(&server, "/v1/store"),
    );
    assert_eq!(cache.store(&layout, &tokens, &refs).unwrap().stored, 4);
    let hit = cache.lookup(&layout, &tokens).unwrap();
    let mut out = vec![0u8; hit.nbytes(None).unwrap()];
    assert_eq!(cache.load_into(&hit, None, &mut out).unwrap(), 4);
    assert_eq!(out, data.concat());
    assert_eq!(
        (
            answered(&server, "/v1/load"),
            answered(&server, "/v1/store")
        ),
        (loads, stores),
        "a load or store went over HTTP"
    );
    // A layer range goes over HTTP, and agrees.
    let mut half = vec![0u8; hit.nbytes(Some((0, 2))).unwrap()];
    assert_eq!(cache.load_into(&hit, Some((0, 2)), &mut half).unwrap(), 4);
    assert_eq!(answered(&server, "/v1/load"), loads + 1);
    assert_eq!(&half[..block / 2], &data[0][..block / 2]);
    drop((cache, http_only));
    assert!(server.stop().success());
}

#[test]
fn malformed_requests_get_a_clear_refusal_or_a_closed_connection_and_nothing_else_breaks() {
    use kvtier_client::shm::proto::{self, Hello, LoadHead, Op};
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;

    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[]);
    let layout = register(&server, 4);
    let code_of = |s: &mut UnixStream| -> String {
        let frame = proto::read(s).unwrap().expect("an answer");
        assert_eq!(frame.kind, proto::ERROR);
        frame
            .head::<kvtier_client::wire::ErrorDetail>()
            .unwrap()
            .code
    };
    // Before hello, and an op nobody knows.
    let mut s = UnixStream::connect(socket(dir.path())).unwrap();
    proto::write(
        &mut s,
        Op::Load as u8,
        &LoadHead {
            layout: layout.layout.clone(),
        },
        b"",
    )
    .unwrap();
    assert_eq!(code_of(&mut s), "bad_op");
    proto::write(&mut s, 99, &Hello { version: 1 }, b"").unwrap();
    assert_eq!(code_of(&mut s), "bad_op");
    proto::write(&mut s, Op::Hello as u8, &Hello { version: 99 }, b"").unwrap();
    assert_eq!(code_of(&mut s), "bad_version");
    // A head that is not the op's.
    proto::write(
        &mut s,
        Op::Hello as u8,
        &LoadHead { layout: "x".into() },
        b"",
    )
    .unwrap();
    assert_eq!(code_of(&mut s), "bad_head");

    // After a proper hello: handles cut short, an unknown layout, a garbage commit tail.
    let shm = ShmClient::connect(&socket(dir.path())).unwrap();
    let cut = shm
        .load(&layout.layout, &[[0; 16]])
        .map(|l| l.slots().len());
    assert_eq!(cut.unwrap(), 0, "a handle nobody holds leases nothing");
    let e = shm.load(&"ab".repeat(16), &[[0; 16]]).unwrap_err();
    assert_eq!(e.code(), Some("unknown_layout"), "{e}");
    let r = shm.reserve(&prompt(&layout, 70, 1), 0, 1).unwrap();
    let head = CommitHead {
        reservation: r.id,
        first: 0,
        durability: None,
    };
    assert_eq!(
        shm.commit_raw(&head, &[1, 2, 3]).unwrap_err().code(),
        Some("not_reserved")
    );
    let too_many = shm.reserve(&prompt(&layout, 71, 1), 0, 2).unwrap_err();
    assert_eq!(too_many.code(), Some("invalid"), "{too_many}");

    // A frame longer than any allowed: the connection is closed, nothing is answered.
    let mut s = UnixStream::connect(socket(dir.path())).unwrap();
    s.write_all(&u32::MAX.to_le_bytes()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut rest = Vec::new();
    assert_eq!(s.read_to_end(&mut rest).unwrap(), 0);
    // A frame that stops half-way, then a hang-up: the same.
    let mut s = UnixStream::connect(socket(dir.path())).unwrap();
    s.write_all(&100u32.to_le_bytes()).unwrap();
    s.write_all(&[1, 0]).unwrap();
    drop(s);

    // The server still serves, byte-exact.
    let p = prompt(&layout, 72, 2);
    let sent = payloads(&layout, 72, 2);
    let refs: Vec<&[u8]> = sent.iter().map(|b| &b[..]).collect();
    assert_eq!(shm.store(&p, &refs, None).unwrap().stored, 2);
    assert_eq!(http_load(&server, &layout, &p), sent);
    assert!(server.stop().success());
}

#[test]
fn a_stalled_server_is_an_error_not_a_hang() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("stalled.sock");
    // Accepts, reads, never answers.
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let held = std::thread::spawn(move || {
        let (conn, _) = listener.accept().unwrap();
        std::thread::sleep(Duration::from_secs(2));
        drop(conn);
    });
    let started = Instant::now();
    let e = ShmClient::connect_with(&path, Duration::from_millis(500)).unwrap_err();
    assert_eq!(e.kind(), kvtier_core::ErrorKind::Unavailable, "{e}");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "waited {:?}",
        started.elapsed()
    );
    held.join().unwrap();
}
