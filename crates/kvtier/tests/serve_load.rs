//! `kvtier serve` under concurrent traffic: `POST /admin/ssd` while clients load and
//! store, and a bounded mixed run of 16 clients. Every load is checked byte for byte.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed expectation is a failed test"
)]

mod server;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kvtier_client::wire::frame::EndStatus;
use kvtier_client::wire::{LayoutInfo, LoadRequest, SsdAdmin};
use kvtier_client::{Client, ClientError};
use server::{Server, layout_spec, payload, payloads, prompt, runtime};

/// Looks `seed`'s prompt up and loads it; checks every byte that came back. Returns the
/// blocks loaded. An error is returned only if it is a documented retryable one.
async fn lookup_and_check(
    c: &Client,
    layout: &LayoutInfo,
    seed: u32,
    blocks: usize,
) -> Result<usize, ClientError> {
    let p = prompt(layout, seed, blocks);
    let hit = c.lookup(&p).await?;
    let got = c
        .load(&LoadRequest {
            layout: layout.layout.clone(),
            handles: hit.handles.clone(),
            layers: None,
            chains: None,
        })
        .await?;
    if got.status == EndStatus::Complete {
        assert_eq!(got.blocks.len(), hit.blocks());
    } else {
        assert_eq!(
            got.status,
            EndStatus::Lost,
            "a load ends complete or lost, never failed"
        );
    }
    for (i, b) in got.blocks.iter().enumerate() {
        assert_eq!(
            b,
            &payload(layout, seed, i),
            "prompt {seed} block {i}: wrong bytes served"
        );
    }
    Ok(got.blocks.len())
}

#[test]
fn reattaching_the_ssd_under_load_loses_no_acknowledged_write() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    let spec = layout_spec("reattach", 4);
    let server = Server::start(dir.path(), &["--ram", "64MiB"]);
    let c = server.client();
    let admin = server.admin();
    let layout = rt.block_on(c.register_layout(&spec)).unwrap();
    let acked: Arc<parking_lot::Mutex<Vec<u32>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let loads = Arc::new(AtomicU64::new(0));
    let retried = Arc::new(AtomicU64::new(0));
    rt.block_on(async {
        // Seed some prompts, then keep loading them while others are stored.
        for seed in 0..8 {
            c.store(&prompt(&layout, seed, 4), payloads(&layout, seed, 4))
                .await
                .unwrap();
        }
        acked.lock().extend(0..8);
        let mut tasks = Vec::new();
        for t in 0..2u32 {
            let (c, layout, stop, loads, retried) = (
                c.clone(),
                layout.clone(),
                stop.clone(),
                loads.clone(),
                retried.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let mut k = t;
                while !stop.load(Ordering::Relaxed) {
                    match lookup_and_check(&c, &layout, k % 8, 4).await {
                        Ok(_) => {
                            loads.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) if e.is_retryable() => {
                            retried.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => panic!("load during reattach: {e}"),
                    }
                    k += 1;
                }
            }));
        }
        {
            let (c, layout, stop, acked) = (c.clone(), layout.clone(), stop.clone(), acked.clone());
            tasks.push(tokio::spawn(async move {
                let mut seed = 100;
                while !stop.load(Ordering::Relaxed) {
                    match c
                        .store(&prompt(&layout, seed, 4), payloads(&layout, seed, 4))
                        .await
                    {
                        Ok(answer) if answer.stored + answer.duplicates == 4 => {
                            acked.lock().push(seed)
                        }
                        Ok(answer) => panic!("store refused during reattach: {answer:?}"),
                        Err(e) if e.is_retryable() => {}
                        Err(e) => panic!("store during reattach: {e}"),
                    }
                    seed += 1;
                }
            }));
        }
        // Reattach twice while that runs: new capacity and durability, then back.
        tokio::time::sleep(Duration::from_millis(300)).await;
        for (capacity, durability) in [("8GiB", "synced"), ("16GiB", "queued")] {
            let answer = admin
                .admin_ssd(&SsdAdmin {
                    action: "reconfigure".into(),
                    capacity: Some(capacity.into()),
                    durability: Some(durability.into()),
                    ..SsdAdmin::default()
                })
                .await
                .unwrap();
            assert!(answer.attached && answer.drained_clean, "{answer:?}");
            let shown = answer.ssd.unwrap();
            assert_eq!(shown["capacity"], capacity);
            assert_eq!(shown["durability"], durability);
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            t.await.unwrap();
        }
        assert!(admin.admin_flush().await.unwrap());
    });
    assert!(loads.load(Ordering::Relaxed) > 0, "the loads ran");
    assert!(server.stop().success());

    // Every acknowledged store is on the SSD after a restart.
    let server = Server::start(dir.path(), &[]);
    let c = server.client();
    let acked = acked.lock().clone();
    assert!(acked.len() > 8, "stores ran during the reattach");
    rt.block_on(async {
        c.register_layout(&spec).await.unwrap();
        for seed in acked {
            assert_eq!(
                lookup_and_check(&c, &layout, seed, 4).await.unwrap(),
                4,
                "prompt {seed} lost"
            );
        }
    });
    assert!(server.stop().success());
}

#[test]
fn disable_and_enable_keep_answering_and_never_serve_wrong_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    // RAM holds 4 of the 8 prompts: the rest live only on the SSD.
    let spec = layout_spec("toggle", 32); // 512 KiB blocks
    let server = Server::start(
        dir.path(),
        &["--ram", "8MiB", "--set", "ssd.mode=write_through"],
    );
    let c = server.client();
    let admin = server.admin();
    rt.block_on(async {
        let layout = c.register_layout(&spec).await.unwrap();
        for seed in 0..8 {
            c.store(&prompt(&layout, seed, 4), payloads(&layout, seed, 4))
                .await
                .unwrap();
        }
        assert!(admin.admin_flush().await.unwrap());
        let off = admin
            .admin_ssd(&SsdAdmin {
                action: "disable".into(),
                ..SsdAdmin::default()
            })
            .await
            .unwrap();
        assert!(!off.attached && off.ssd.is_none());
        assert_eq!(c.health().await.unwrap().tiers, vec!["ram"]);
        // Detached: what only the SSD held is a miss (or a shorter prefix), never an error.
        for seed in 0..8 {
            lookup_and_check(&c, &layout, seed, 4).await.unwrap();
        }
        let on = admin
            .admin_ssd(&SsdAdmin {
                action: "enable".into(),
                ..SsdAdmin::default()
            })
            .await
            .unwrap();
        assert!(on.attached && on.attached_blocks >= 32, "{on:?}");
        for seed in 0..8 {
            assert_eq!(lookup_and_check(&c, &layout, seed, 4).await.unwrap(), 4);
        }
        // A bad request changes nothing.
        let bad = admin
            .admin_ssd(&SsdAdmin {
                action: "explode".into(),
                ..SsdAdmin::default()
            })
            .await
            .unwrap_err();
        assert!(
            matches!(bad, ClientError::Api { status: 400, .. }),
            "{bad:?}"
        );
        assert_eq!(c.health().await.unwrap().tiers, vec!["ram", "ssd"]);
    });
    assert!(server.stop().success());
}

#[test]
fn sixteen_clients_of_mixed_traffic_see_no_error_and_only_exact_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    let spec = layout_spec("mixed", 8); // 128 KiB blocks
    // A RAM of 24 MiB under about 100 MiB of prompts: evictions, SSD hits and promotions.
    let server = Server::start(dir.path(), &["--ram", "24MiB"]);
    let c = server.client();
    let layout = rt.block_on(c.register_layout(&spec)).unwrap();
    let seconds: u64 = std::env::var("KVTIER_MIXED_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let ops = Arc::new(AtomicU64::new(0));
    let loaded_blocks = Arc::new(AtomicU64::new(0));
    rt.block_on(async {
        let mut tasks = Vec::new();
        for client in 0..16u32 {
            let (c, layout, ops, loaded_blocks) = (
                c.clone(),
                layout.clone(),
                ops.clone(),
                loaded_blocks.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let mut x = 0x9E37_79B9u32 ^ client;
                // Bounded in count and in time.
                for _ in 0..100_000 {
                    if Instant::now() > deadline {
                        break;
                    }
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    let seed = x % 48;
                    let blocks = 1 + (x >> 8) as usize % 16;
                    if (x >> 16).is_multiple_of(3) {
                        let answer = c
                            .store(
                                &prompt(&layout, seed, blocks),
                                payloads(&layout, seed, blocks),
                            )
                            .await
                            .unwrap_or_else(|e| panic!("client {client}: store failed: {e}"));
                        assert_eq!(answer.stopped, None, "client {client}: {answer:?}");
                    } else {
                        let n = lookup_and_check(&c, &layout, seed, blocks)
                            .await
                            .unwrap_or_else(|e| panic!("client {client}: load failed: {e}"));
                        loaded_blocks.fetch_add(n as u64, Ordering::Relaxed);
                    }
                    ops.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let stats = c.stats().await.unwrap();
        assert!(
            stats["ram_evictions_budget"] > 0,
            "the run must overflow RAM: {stats:?}"
        );
        assert!(
            stats["index_lookup_hits"] > 0 && stats["ssd_hits"] > 0,
            "hits from RAM and SSD: {stats:?}"
        );
        let errors = stats["ssd_io_errors"] + stats["ssd_writer_failed"];
        assert_eq!(errors, 0, "{stats:?}");
        let metrics = c.metrics().await.unwrap();
        assert!(
            !metrics.contains("status=\"5xx\""),
            "a request failed:\n{metrics}"
        );
    });
    assert!(ops.load(Ordering::Relaxed) > 100, "the run did work");
    assert!(loaded_blocks.load(Ordering::Relaxed) > 0);
    assert!(server.stop().success());
}
