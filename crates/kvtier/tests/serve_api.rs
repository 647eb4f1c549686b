//! `kvtier serve` as a process: store, lookup, load, restart and hit from SSD; SIGTERM and
//! kill -9 and what the next start reports; auth refusals; every kind of bad input.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed expectation is a failed test"
)]

mod server;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use bytes::Bytes;
use kvtier_client::wire::frame::EndStatus;
use kvtier_client::wire::{LoadRequest, SnapshotSpec};
use server::{Server, api_error, layout_spec, load_all, payloads, prompt, runtime};

#[test]
fn stored_blocks_load_byte_for_byte_and_hit_from_ssd_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    let spec = layout_spec("restart", 4);
    let server = Server::start(dir.path(), &[]);
    let c = server.client();
    let (layout, p) = rt.block_on(async {
        let layout = c.register_layout(&spec).await.unwrap();
        let p = prompt(&layout, 1, 8);
        let miss = c.lookup(&p).await.unwrap();
        assert_eq!(miss.matched_tokens, 0);
        let stored = c.store(&p, payloads(&layout, 1, 8)).await.unwrap();
        assert_eq!(stored.stored, 8);
        let hit = c.lookup(&p).await.unwrap();
        assert_eq!(hit.matched_tokens, 128);
        assert!(hit.tiers.chars().all(|t| t == 'r'), "{}", hit.tiers);
        let got = load_all(&c, &layout, &hit).await;
        assert_eq!(got.status, EndStatus::Complete);
        assert_eq!(got.blocks, payloads(&layout, 1, 8));
        // Layers 1..3 of each block: the matching slice of the layer-major payload.
        let part = c
            .load(&LoadRequest {
                layout: layout.layout.clone(),
                handles: hit.handles.clone(),
                layers: Some([1, 3]),
                chains: None,
            })
            .await
            .unwrap();
        let per_layer = (layout.block_bytes / 4) as usize;
        for (i, b) in part.blocks.iter().enumerate() {
            assert_eq!(
                &b[..],
                &payloads(&layout, 1, 8)[i][per_layer..3 * per_layer]
            );
        }
        (layout, p)
    });
    assert!(server.stop().success());

    let server = Server::start(dir.path(), &[]);
    let c = server.client();
    rt.block_on(async {
        assert_eq!(
            c.health().await.unwrap().previous_shutdown_clean,
            Some(true)
        );
        let again = c.register_layout(&spec).await.unwrap();
        assert_eq!(again, layout, "same key, same digest");
        // The same key allowing fp8 in the cold tiers is another layout (ADR 0021); a
        // cold codec the server does not know is refused.
        let mut lossy = spec.clone();
        lossy.cold_codec = Some("fp8_e4m3".into());
        let other = c.register_layout(&lossy).await.unwrap();
        assert_ne!(other.layout, layout.layout);
        lossy.cold_codec = Some("int4".into());
        let refused = c.register_layout(&lossy).await.unwrap_err().to_string();
        assert!(refused.contains("int4"), "{refused}");
        let hit = c.lookup(&p).await.unwrap();
        assert_eq!(hit.matched_tokens, 128, "recovered from the SSD");
        let got = load_all(&c, &layout, &hit).await;
        assert_eq!(got.status, EndStatus::Complete);
        assert_eq!(got.blocks, payloads(&layout, 1, 8));
        let stats = c.stats().await.unwrap();
        assert!(
            stats["ssd_hits"] >= 1 || stats["engine_prefetched_blocks"] >= 1,
            "{stats:?}"
        );
        let metrics = c.metrics().await.unwrap();
        for family in [
            "kvtier_tier_hits_total{tier=\"ssd\"}",
            "kvtier_tier_resident_blocks{tier=\"ssd\"} 8",
            "kvtier_ssd_recovery_records{} 8",
            "kvtier_ssd_previous_shutdown{state=\"clean\"} 1",
            "kvtier_request_duration_seconds_count{endpoint=\"/v1/load\",status=\"2xx\"}",
            "kvtier_writer_queue_depth{tier=\"ssd\"}",
            "kvtier_snapshot_gets_total",
        ] {
            assert!(
                metrics.contains(family),
                "missing `{family}` in:\n{metrics}"
            );
        }
    });
    assert!(server.stop().success());
}

#[test]
fn after_kill_9_the_next_start_reports_an_unclean_shutdown_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    let spec = layout_spec("kill", 2);
    let server = Server::start(dir.path(), &["--set", "ssd.durability=fsync"]);
    let c = server.client();
    let (layout, p) = rt.block_on(async {
        assert_eq!(
            c.health().await.unwrap().previous_shutdown_clean,
            None,
            "first start"
        );
        let layout = c.register_layout(&spec).await.unwrap();
        let p = prompt(&layout, 2, 6);
        c.store(&p, payloads(&layout, 2, 6)).await.unwrap();
        assert!(server.admin().admin_flush().await.unwrap());
        (layout, p)
    });
    server.kill9();
    let server = Server::start(dir.path(), &[]);
    let c = server.client();
    rt.block_on(async {
        let health = c.health().await.unwrap();
        assert_eq!(health.previous_shutdown_clean, Some(false), "{health:?}");
        c.register_layout(&spec).await.unwrap();
        let hit = c.lookup(&p).await.unwrap();
        assert_eq!(hit.matched_tokens, 96);
        let got = load_all(&c, &layout, &hit).await;
        assert_eq!(got.blocks, payloads(&layout, 2, 6));
    });
    assert!(server.stop().success());
}

#[test]
fn tokens_are_required_where_configured() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    let data = "data-token-for-tests-0002";
    let server = Server::start(dir.path(), &["--data-token", data]);
    rt.block_on(async {
        let anon = server.client();
        let (s, code) = api_error(
            anon.register_layout(&layout_spec("auth", 2))
                .await
                .unwrap_err(),
        );
        assert_eq!((s, code.as_str()), (401, "token_required"));
        let wrong = server.client().with_token("not-the-token-at-all");
        let (s, code) = api_error(wrong.stats().await.unwrap_err());
        assert_eq!((s, code.as_str()), (403, "bad_token"));
        let good = server.client().with_token(data);
        good.register_layout(&layout_spec("auth", 2)).await.unwrap();
        // The data token does not open the admin endpoints.
        let (s, _) = api_error(good.admin_flush().await.unwrap_err());
        assert_eq!(s, 403);
        let (s, _) = api_error(anon.admin_flush().await.unwrap_err());
        assert_eq!(s, 401);
        assert!(server.admin().admin_flush().await.is_ok());
        // Health stays open.
        assert_eq!(anon.health().await.unwrap().status, "ok");
    });
    assert!(server.stop().success());
}

#[test]
fn an_open_address_without_tokens_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvtier"))
        .args([
            "serve",
            "--listen",
            "0.0.0.0:0",
            "--set",
            "ssd.enabled=false",
        ])
        .arg("--data-dir")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "must refuse an open address without tokens"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--allow-insecure-listen"), "{err}");
}

#[test]
fn bad_input_gets_a_named_4xx_stores_nothing_and_the_server_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    let server = Server::start(
        dir.path(),
        &["--set", "max_body=256KiB", "--set", "max_tokens=256"],
    );
    let url = server.url.clone();
    let c = server.client();
    let http = reqwest_like(&url);
    rt.block_on(async {
        let layout = c.register_layout(&layout_spec("bad", 2)).await.unwrap();
        let p = prompt(&layout, 3, 4);
        let good = payloads(&layout, 3, 4);

        // Malformed JSON, wrong types, unknown fields.
        for body in [
            "{",
            "[]",
            "{\"layout\": 5}",
            "{\"layout\":\"00\",\"tokens\":[1],\"extra\":1}",
        ] {
            let (s, code) = http.post("/v1/lookup", body.as_bytes());
            assert_eq!(s, 400, "{body}");
            assert_eq!(code, "bad_json", "{body}");
        }
        // Unknown layout (well-formed digest), bad hex.
        let mut unknown = p.clone();
        unknown.layout = "00".repeat(16);
        let (s, code) = api_error(c.lookup(&unknown).await.unwrap_err());
        assert_eq!((s, code.as_str()), (404, "unknown_layout"));
        unknown.layout = "xyz".into();
        let (s, code) = api_error(c.lookup(&unknown).await.unwrap_err());
        assert_eq!((s, code.as_str()), (400, "bad_hex"));
        // Too many tokens.
        let mut long = p.clone();
        long.tokens = (0..300).collect();
        let (s, code) = api_error(c.lookup(&long).await.unwrap_err());
        assert_eq!((s, code.as_str()), (422, "invalid"));
        // Payloads of the wrong length, or more blocks than tokens: nothing is kept.
        let mut short = good.clone();
        short[2] = short[2].slice(..100);
        let (s, code) = api_error(c.store(&p, short).await.unwrap_err());
        assert_eq!((s, code.as_str()), (400, "bad_payload_length"));
        let mut five = good.clone();
        five.push(good[0].clone());
        let (s, code) = api_error(c.store(&p, five).await.unwrap_err());
        assert_eq!((s, code.as_str()), (400, "bad_payload_length"));
        assert_eq!(
            c.lookup(&p).await.unwrap().matched_tokens,
            0,
            "nothing partially stored"
        );
        // A body over the limit.
        let big = vec![Bytes::from(vec![0u8; 300 << 10])];
        let (s, code) = api_error(c.store(&p, big).await.unwrap_err());
        assert_eq!((s, code.as_str()), (413, "body_too_large"));
        // A truncated upload head.
        let (s, code) = http.post("/v1/store", b"KVTU\x01\x00\x00\x00\xff\x00\x00\x00{}");
        assert_eq!((s, code.as_str()), (400, "bad_upload"));
        // Bad handles and layer ranges.
        let bad_load = LoadRequest {
            layout: layout.layout.clone(),
            handles: "zz".repeat(16),
            layers: None,
            chains: None,
        };
        let (s, code) = api_error(c.load(&bad_load).await.unwrap_err());
        assert_eq!((s, code.as_str()), (400, "bad_hex"));
        let ragged = LoadRequest {
            handles: "abc".into(),
            ..bad_load.clone()
        };
        let (s, code) = api_error(c.load(&ragged).await.unwrap_err());
        assert_eq!((s, code.as_str()), (400, "bad_handles"));
        // Tokens in both forms, or base64 that is not whole u32s.
        let mut both = p.compact();
        both.tokens = vec![1, 2];
        let (s, code) = http.post("/v1/lookup", &serde_json::to_vec(&both).unwrap());
        assert_eq!((s, code.as_str()), (400, "bad_tokens"));
        let mut odd = p.clone();
        odd.tokens = Vec::new();
        odd.tokens_b64 = Some("AAAA".into());
        let (s, code) = http.post("/v1/lookup", &serde_json::to_vec(&odd).unwrap());
        assert_eq!((s, code.as_str()), (400, "bad_tokens"));
        let bad_layers = LoadRequest {
            layout: layout.layout.clone(),
            handles: String::new(),
            layers: Some([1, 9]),
            chains: None,
        };
        let (s, code) = api_error(c.load(&bad_layers).await.unwrap_err());
        assert_eq!((s, code.as_str()), (422, "bad_layers"));
        // Handles that are not a chain of this layout load nothing, marked lost.
        let forged = LoadRequest {
            layout: layout.layout.clone(),
            handles: "ab".repeat(16),
            layers: None,
            chains: None,
        };
        let got = c.load(&forged).await.unwrap();
        assert_eq!((got.blocks.len(), got.status), (0, EndStatus::Lost));
        // A body cut off mid-way by the client.
        let mut raw = TcpStream::connect(url.trim_start_matches("http://")).unwrap();
        raw.write_all(
            b"POST /v1/lookup HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\n{\"layout\":",
        )
        .unwrap();
        raw.shutdown(std::net::Shutdown::Write).unwrap();
        let mut answer = String::new();
        let _ = raw.read_to_string(&mut answer);
        assert!(!answer.starts_with("HTTP/1.1 2"), "{answer}");
        // Unknown endpoint.
        let (s, code) = http.post("/v1/nothing", b"{}");
        assert_eq!((s, code.as_str()), (404, "no_such_endpoint"));
        // Still serving, and the good request works.
        assert_eq!(c.store(&p, good.clone()).await.unwrap().stored, 4);
        let hit = c.lookup(&p).await.unwrap();
        let got = load_all(&c, &layout, &hit).await;
        assert_eq!(got.blocks, good);
    });
    assert!(server.stop().success());
}

#[test]
fn snapshots_round_trip_and_survive_a_restart_and_namespaces_delete() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    let spec = layout_spec("snap", 2);
    let server = Server::start(dir.path(), &[]);
    let c = server.client();
    let state = Bytes::from((0..50_000u32).map(|i| (i * 7) as u8).collect::<Vec<u8>>());
    let (layout, snap) = rt.block_on(async {
        let layout = c.register_layout(&spec).await.unwrap();
        let snap = SnapshotSpec {
            layout: layout.layout.clone(),
            tokens: vec![5, 6, 7],
            session: None,
        };
        assert_eq!(c.snapshot_get(&snap).await.unwrap(), None);
        c.snapshot_put(&snap, state.clone()).await.unwrap();
        assert_eq!(c.snapshot_get(&snap).await.unwrap(), Some(state.clone()));
        let mut other = snap.clone();
        other.tokens.push(8);
        assert_eq!(
            c.snapshot_get(&other).await.unwrap(),
            None,
            "exact prefix only"
        );
        (layout, snap)
    });
    assert!(server.stop().success());
    let server = Server::start(dir.path(), &[]);
    let c = server.client();
    rt.block_on(async {
        c.register_layout(&spec).await.unwrap();
        assert_eq!(c.snapshot_get(&snap).await.unwrap(), Some(state.clone()));
        let p = prompt(&layout, 9, 3);
        c.store(&p, payloads(&layout, 9, 3)).await.unwrap();
        assert_eq!(c.delete_layout(&layout.layout).await.unwrap(), 3);
        assert_eq!(c.lookup(&p).await.unwrap().matched_tokens, 0);
    });
    assert!(server.stop().success());
}

/// A bare HTTP/1.1 client for requests the typed client cannot send.
struct Raw {
    addr: String,
}

fn reqwest_like(url: &str) -> Raw {
    Raw {
        addr: url.trim_start_matches("http://").to_string(),
    }
}

impl Raw {
    /// POSTs `body`; returns the status and the error code of the answer.
    fn post(&self, path: &str, body: &[u8]) -> (u16, String) {
        let mut s = TcpStream::connect(&self.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        s.write_all(head.as_bytes()).unwrap();
        s.write_all(body).unwrap();
        let mut answer = Vec::new();
        s.read_to_end(&mut answer).unwrap();
        let text = String::from_utf8_lossy(&answer);
        let status: u16 = text.split(' ').nth(1).unwrap().parse().unwrap();
        let body = text.split("\r\n\r\n").nth(1).unwrap_or("");
        let code = serde_json::from_str::<serde_json::Value>(body)
            .ok()
            .and_then(|v| v["error"]["code"].as_str().map(str::to_string))
            .unwrap_or_default();
        (status, code)
    }
}

#[test]
fn a_load_longer_than_one_batch_streams_from_the_ssd_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    let spec = layout_spec("long", 128); // 1 MiB blocks: 40 of them span two read batches
    let server = Server::start(dir.path(), &[]);
    let c = server.client();
    let (layout, p) = rt.block_on(async {
        let layout = c.register_layout(&spec).await.unwrap();
        assert_eq!(layout.block_bytes, 1 << 20);
        let p = prompt(&layout, 5, 40);
        assert_eq!(
            c.store(&p, payloads(&layout, 5, 40)).await.unwrap().stored,
            40
        );
        (layout, p)
    });
    assert!(server.stop().success());
    let server = Server::start(dir.path(), &[]);
    let c = server.client();
    rt.block_on(async {
        c.register_layout(&spec).await.unwrap();
        let hit = c.lookup(&p).await.unwrap();
        assert_eq!(hit.blocks(), 40);
        assert!(hit.tiers.chars().all(|t| t == 's'), "{}", hit.tiers);
        let mut staging = vec![0u8; 40 << 20];
        let (n, status) = c
            .load_into(
                &LoadRequest {
                    layout: layout.layout.clone(),
                    handles: hit.handles.clone(),
                    layers: None,
                    chains: None,
                },
                &mut staging,
            )
            .await
            .unwrap();
        assert_eq!((n, status), (40, EndStatus::Complete));
        for (i, want) in payloads(&layout, 5, 40).iter().enumerate() {
            assert_eq!(&staging[i << 20..(i + 1) << 20], &want[..], "block {i}");
        }
        // Asking for more handles than are cached: the stream ends marked lost after
        // the cached ones.
        let mut longer = hit.handles.clone();
        longer.push_str(&"ab".repeat(16));
        let got = c
            .load(&LoadRequest {
                layout: layout.layout.clone(),
                handles: longer,
                layers: None,
                chains: None,
            })
            .await
            .unwrap();
        assert_eq!((got.blocks.len(), got.status), (40, EndStatus::Lost));
    });
    assert!(server.stop().success());
}

#[test]
fn a_second_server_on_the_same_data_directory_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let first = Server::start(dir.path(), &[]);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvtier"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--set",
            "ssd.min_free=0",
        ])
        .arg("--data-dir")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success(), "two servers on one store");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("pid"), "the refusal names the holder: {err}");
    // The first one is unaffected.
    let rt = runtime();
    assert_eq!(rt.block_on(first.client().health()).unwrap().status, "ok");
    assert!(first.stop().success());
}

/// `/readyz` checks what the settings ask for: the SSD tier of a default server (and
/// nothing for a RAM-only one), without a token.
#[test]
fn readiness_checks_the_tiers_the_settings_ask_for() {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let with_ssd = Server::start(dir.path(), &["--data-token", "data-token-for-tests-01"]);
    let r = rt.block_on(with_ssd.client().ready()).unwrap();
    assert!(r.ready, "{r:?}");
    assert_eq!(
        r.checks.into_iter().collect::<Vec<_>>(),
        vec![("ssd".to_owned(), true)]
    );
    assert!(with_ssd.stop().success());
    let ram_only = Server::start(dir.path(), &["--set", "ssd.enabled=false"]);
    let r = rt.block_on(ram_only.client().ready()).unwrap();
    assert!(r.ready && r.checks.is_empty(), "{r:?}");
    assert!(ram_only.stop().success());
}
