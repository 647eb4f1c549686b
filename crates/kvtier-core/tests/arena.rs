//! The RAM tier's arena (issue 37, item 1): a store into a warm arena takes no page
//! faults; a slot is never reused under a reader, whatever evicts its block; `prefault`
//! and `lock` do what they say.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code"
)]

use kvtier_core::arena::{Arena, ArenaConfig, SEGMENT_BYTES};
use kvtier_core::tier::{RamConfig, Tier};
use kvtier_core::{Engine, ErrorKind, ExtraKeys, KvDtype, LayoutKey, Prompt};

/// Minor page faults taken by this thread so far (the kernel fills a fresh page on its
/// first touch: a minor fault).
fn minor_faults() -> i64 {
    // The kernel fills a zeroed `rusage` for this thread.
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    #[allow(unsafe_code, reason = "getrusage fills the struct it is given")]
    // SAFETY: `usage` is a valid, writable rusage; RUSAGE_THREAD is a valid `who`.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, usage.as_mut_ptr()) };
    assert_eq!(rc, 0);
    #[allow(unsafe_code, reason = "initialised by getrusage above")]
    // SAFETY: getrusage returned 0, so it wrote the whole struct.
    let usage = unsafe { usage.assume_init() };
    usage.ru_minflt
}

/// A layout of 2 MiB blocks (16 tokens × 32 layers × 2 × 8 heads × 128 dims × bf16).
fn two_mib_layout(e: &Engine) -> std::sync::Arc<kvtier_core::Layout> {
    let layout = e
        .register_layout(LayoutKey::new("arena-test", KvDtype::Bf16, 16, 32, 8, 128))
        .unwrap();
    assert_eq!(layout.block_bytes(), 2 << 20);
    layout
}

/// `n` one-block prompts, distinct from any other `seed`'s.
fn prompts(e: &Engine, layout: &kvtier_core::Layout, n: u32, seed: u32) -> Vec<Prompt> {
    (0..n)
        .map(|i| {
            let tokens: Vec<u32> = (0..16).map(|t| seed * 1_000_000 + i * 16 + t).collect();
            e.prompt(layout.digest(), &tokens, &ExtraKeys::none())
                .unwrap()
        })
        .collect()
}

#[test]
fn a_store_into_a_warm_arena_takes_no_page_faults() {
    let e = Engine::builder()
        .ram(RamConfig {
            capacity_bytes: 512 << 20,
        })
        .build()
        .unwrap();
    let layout = two_mib_layout(&e);
    let payload: Vec<u8> = (0..2 << 20).map(|i: u32| (i * 7 + 1) as u8).collect();
    // 256 MiB into the arena: its pages are touched by this first round.
    let first = prompts(&e, &layout, 128, 1);
    for p in &first {
        e.store(p, &[&payload]).unwrap();
    }
    assert_eq!(e.arena().stats().used_bytes, 256 << 20);
    assert_eq!(e.arena().stats().fallbacks, 0);
    let flat: std::collections::HashMap<String, u64> = e.stats().counters().into_iter().collect();
    assert_eq!(flat["engine_arena_used_bytes"], 256 << 20);
    assert!(flat["engine_arena_mapped_bytes"] >= 512 << 20);
    assert_eq!(flat["engine_arena_fallbacks"], 0);
    for p in &first {
        assert!(e.ram().remove(&p.hashes()[0]).unwrap());
    }
    assert_eq!(
        e.arena().stats().used_bytes,
        0,
        "removed blocks give their slots back"
    );

    // Another 256 MiB: every block lands in a slot the first round warmed.
    let second = prompts(&e, &layout, 128, 2);
    let before = minor_faults();
    for p in &second {
        e.store(p, &[&payload]).unwrap();
    }
    let faults = minor_faults() - before;
    // A 256 MiB copy into fresh memory takes 65,536 faults (4 KiB pages), or 128 with
    // transparent huge pages; bookkeeping may take a few.
    assert!(
        faults < 16,
        "{faults} minor faults storing 256 MiB into a warm arena"
    );
    for p in &second {
        let hit = e.lookup(p);
        let got = e.load(&hit).unwrap();
        assert!(got.complete);
        assert_eq!(&got.blocks[0][..], &payload[..]);
    }
}

#[test]
fn eviction_never_frees_a_slot_a_reader_still_holds() {
    // Room for 16 blocks: storing 64 evicts most of them while the first 8 are held.
    let e = Engine::builder()
        .ram(RamConfig {
            capacity_bytes: 32 << 20,
        })
        .build()
        .unwrap();
    let layout = two_mib_layout(&e);
    let payload = |i: u32| -> Vec<u8> {
        (0..2 << 20)
            .map(|b: u32| (b ^ i.wrapping_mul(2_654_435_761)) as u8)
            .collect()
    };
    let ps = prompts(&e, &layout, 64, 3);
    let mut held = Vec::new();
    for (i, p) in ps.iter().enumerate() {
        e.store(p, &[&payload(i as u32)]).unwrap();
        if i < 8 {
            let got = e.load(&e.lookup(p)).unwrap();
            held.push((i as u32, got.blocks[0].clone()));
        }
    }
    assert!(
        !e.ram().contains(&ps[0].hashes()[0]),
        "the first blocks were evicted"
    );
    // Every held block still reads exactly what was stored, though newer blocks were
    // copied into the arena since.
    for (i, bytes) in &held {
        assert!(
            bytes[..] == payload(*i)[..],
            "block {i} changed under its reader"
        );
    }
    let used = e.arena().stats().used_bytes;
    drop(held);
    assert!(
        e.arena().stats().used_bytes < used,
        "the readers' slots come back"
    );
}

#[test]
fn a_prefaulted_arena_takes_no_page_faults_from_its_first_store() {
    let arena = Arena::new(
        64 << 20,
        ArenaConfig {
            prefault: true,
            ..ArenaConfig::default()
        },
    )
    .unwrap();
    let payload = vec![0x5au8; 2 << 20];
    let before = minor_faults();
    let blocks: Vec<_> = (0..32).map(|_| arena.copy(&payload)).collect();
    let faults = minor_faults() - before;
    assert!(
        faults < 16,
        "{faults} minor faults filling a prefaulted arena"
    );
    assert!(blocks.iter().all(|b| b[..] == payload[..]));
    assert_eq!(arena.stats().fallbacks, 0);
}

/// Bytes this process has locked in RAM (`VmLck` of /proc/self/status).
fn locked_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmLck:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib << 10
}

#[test]
fn a_locked_arena_is_locked_or_its_start_fails_clearly() {
    let before = locked_bytes();
    match Arena::new(
        16 << 20,
        ArenaConfig {
            lock: true,
            ..ArenaConfig::default()
        },
    ) {
        Ok(arena) => {
            assert!(arena.locked());
            let mapped = arena.stats().mapped_bytes;
            assert!(mapped >= (16 << 20) + 2 * SEGMENT_BYTES as u64);
            // Other tests in this binary may lock or unlock meanwhile; ours is at least
            // the arena's size more than before, while it lives.
            assert!(
                locked_bytes() >= before + mapped,
                "VmLck did not grow by {mapped}"
            );
        }
        // Without the right to lock that much (`ulimit -l`), a clear error.
        Err(e) => {
            assert_eq!(e.kind(), ErrorKind::NoSpace, "{e}");
            assert!(e.to_string().contains("ulimit -l"), "{e}");
        }
    }
}

#[test]
fn a_shared_arena_is_a_sealed_file_that_holds_the_blocks_and_remembers_their_checksums() {
    use std::os::unix::fs::FileExt;
    let arena = Arena::new(
        64 << 20,
        ArenaConfig {
            shared: true,
            ..ArenaConfig::default()
        },
    )
    .unwrap();
    let payload: Vec<u8> = (0..(1u32 << 20)).map(|i| (i * 7 + 3) as u8).collect();
    let (block, crc) = arena.buffer(payload.len()).fill_checked(&payload).unwrap();
    assert_eq!(&block[..], &payload[..]);
    assert_eq!(crc, kvtier_core::arena::crc32c(&payload));
    assert_eq!(arena.checksum(&block), crc);
    // The file holds the block at its offset; another process mapping it sees the same.
    let offset = arena.offset_of(&block).unwrap();
    let file = std::fs::File::from(arena.file().unwrap().try_clone_to_owned().unwrap());
    let mut read = vec![0; payload.len()];
    file.read_exact_at(&mut read, offset as u64).unwrap();
    assert_eq!(read, payload);
    // Sealed: no write through the file, no resize.
    assert!(file.write_at(b"x", offset as u64).is_err());
    assert!(file.set_len(0).is_err());
    assert_eq!(&block[..4], &payload[..4]);

    // A block copied in without a checksum gets one on first ask; a slot handed out again
    // forgets its old block's.
    let other: Vec<u8> = payload.iter().map(|b| b ^ 0x5a).collect();
    let second = arena.copy(&other);
    let at = arena.offset_of(&second).unwrap();
    assert_eq!(arena.checksum(&second), kvtier_core::arena::crc32c(&other));
    drop(second);
    let third_bytes = vec![9u8; payload.len()];
    let third = arena.copy(&third_bytes);
    assert_eq!(
        arena.offset_of(&third),
        Some(at),
        "the freed slot is reused"
    );
    assert_eq!(
        arena.checksum(&third),
        kvtier_core::arena::crc32c(&third_bytes)
    );
    // Bytes outside the arena have no offset and are checksummed as they are.
    assert_eq!(arena.offset_of(&payload), None);
    assert_eq!(arena.checksum(&payload), crc);
    // A private arena has no file.
    assert!(
        Arena::new(1 << 20, ArenaConfig::default())
            .unwrap()
            .file()
            .is_none()
    );
}

/// 2 MiB pages of the kernel's huge-page pool neither in use nor reserved by a mapping.
fn free_huge_pages() -> u64 {
    let info = std::fs::read_to_string("/proc/meminfo").unwrap();
    let field = |name: &str| -> u64 {
        info.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    field("HugePages_Free:").saturating_sub(field("HugePages_Rsvd:"))
}

#[test]
fn a_huge_page_arena_holds_its_blocks_or_its_start_names_the_pool() {
    let config = ArenaConfig {
        shared: true,
        huge_pages: true,
        ..ArenaConfig::default()
    };
    // 16 MiB of budget: one segment plus two of slack, 96 MiB, 48 huge pages.
    let needed = 48;
    let free = free_huge_pages();
    match Arena::new(16 << 20, config) {
        Ok(arena) => {
            assert!(
                free >= needed,
                "an arena of {needed} huge pages from a pool of {free}"
            );
            let payload = vec![0x3cu8; 2 << 20];
            let block = arena.copy(&payload);
            assert_eq!(&block[..], &payload[..]);
            // Reserved from the pool when mapped (no later touch can find it empty).
            assert!(
                free_huge_pages() <= free - needed,
                "the pages did not come from the pool"
            );
        }
        Err(e) => {
            assert!(free < needed, "{e} with {free} free huge pages");
            assert_eq!(e.kind(), ErrorKind::NoSpace, "{e}");
            assert!(e.full_message().contains("vm.nr_hugepages"), "{e}");
        }
    }
}
