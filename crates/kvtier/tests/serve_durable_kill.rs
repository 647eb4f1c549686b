//! Durable acknowledgements mean it: `kvtier serve` is killed with SIGKILL at a random
//! moment while clients store, round after round, into the same data directory; after
//! every restart each store that was answered 200 as `written` or `synced` loads back
//! byte for byte. Half the rounds ask per request (`?durability=written`), half run with
//! the server default `ssd.durability = synced`.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code"
)]

mod server;

use std::sync::Arc;
use std::time::Duration;

use kvtier_client::Client;
use kvtier_client::wire::LayoutInfo;
use parking_lot::Mutex;
use server::{Server, layout_spec, load_all, payload, payloads, prompt, runtime};

const ROUNDS: u32 = 100;
const BLOCKS: usize = 2;
const WRITERS: u32 = 4;

/// Every block of prompt `seed` is found and loads back exactly.
async fn check(c: &Client, layout: &LayoutInfo, seed: u32, round: u32) {
    let p = prompt(layout, seed, BLOCKS);
    let hit = c.lookup(&p).await.unwrap();
    assert_eq!(
        hit.blocks(),
        BLOCKS,
        "round {round}: acknowledged store {seed} lost after kill -9"
    );
    let got = load_all(c, layout, &hit).await;
    assert_eq!(got.blocks.len(), BLOCKS, "round {round}: store {seed}");
    for (i, block) in got.blocks.iter().enumerate() {
        assert_eq!(
            block,
            &payload(layout, seed, i),
            "round {round}: store {seed} block {i} differs"
        );
    }
}

#[test]
fn every_durably_acknowledged_store_survives_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    let spec = layout_spec("durable-kill", 2);
    let mut all_acked: Vec<u32> = Vec::new();
    let mut x: u64 = 0x2545_f491_4f6c_dd1d ^ u64::from(std::process::id());
    for round in 0..ROUNDS {
        let per_request = round % 2 == 1;
        let flags: &[&str] = if per_request {
            &[]
        } else {
            &["--set", "ssd.durability=synced"]
        };
        let server = Server::start(dir.path(), flags);
        let c = server.client();
        let layout = rt.block_on(c.register_layout(&spec)).unwrap();
        // What the previous rounds acknowledged is still there.
        if let Some(&last) = all_acked.last() {
            rt.block_on(check(&c, &layout, last, round));
        }
        let acked = Arc::new(Mutex::new(Vec::new()));
        let writers: Vec<_> = (0..WRITERS)
            .map(|w| {
                let c = c.clone();
                let layout = layout.clone();
                let acked = acked.clone();
                rt.spawn(async move {
                    for k in 0..10_000u32 {
                        let seed = round * 1_000_000 + w * 100_000 + k;
                        let p = prompt(&layout, seed, BLOCKS);
                        let ask = if per_request { Some("written") } else { None };
                        match c
                            .store_durable(&p, payloads(&layout, seed, BLOCKS), ask)
                            .await
                        {
                            Ok(answer) => {
                                assert_eq!(answer.stored + answer.duplicates, BLOCKS);
                                let expected = if per_request { "written" } else { "synced" };
                                assert_eq!(answer.durability, expected);
                                acked.lock().push(seed);
                            }
                            Err(_) => return, // the server is gone
                        }
                    }
                })
            })
            .collect();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        std::thread::sleep(Duration::from_millis(30 + x % 150));
        server.kill9();
        for w in writers {
            rt.block_on(w).unwrap();
        }
        let acked = std::mem::take(&mut *acked.lock());
        let server = Server::start(dir.path(), &[]);
        let c = server.client();
        let layout = rt.block_on(c.register_layout(&spec)).unwrap();
        for &seed in &acked {
            rt.block_on(check(&c, &layout, seed, round));
        }
        all_acked.extend(acked);
        server.kill9();
    }
    assert!(
        all_acked.len() as u32 > ROUNDS,
        "too few stores were acknowledged to mean anything: {}",
        all_acked.len()
    );
    // Every acknowledged store of every round, once more at the end.
    let server = Server::start(dir.path(), &[]);
    let c = server.client();
    let layout = rt.block_on(c.register_layout(&spec)).unwrap();
    for (n, &seed) in all_acked.iter().enumerate() {
        rt.block_on(check(&c, &layout, seed, n as u32));
    }
    println!(
        "{} acknowledged stores survived {ROUNDS} kills",
        all_acked.len()
    );
    assert!(server.stop().success());
}
