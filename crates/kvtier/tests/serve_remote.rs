//! `kvtier serve` with a remote tier on `kvtier gateway` (both real processes): blocks
//! stored through the API reach the shared bucket; a second server with another data
//! directory and no SSD — a fresh replica — finds them, reports them as remote (`o`),
//! and loads them byte for byte, counting the promotions as remote→ram in `/v1/stats` and
//! `/metrics`. With `remote.require_at_start`, a server whose endpoint answers starts, and
//! one whose endpoint nobody answers exits at once with an `unavailable` error.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests"
)]

mod gateway;
mod server;

use gateway::{ACCESS, Gateway, SECRET};
use kvtier_client::wire::frame::EndStatus;
use server::{Server, layout_spec, load_all, payloads, prompt, runtime};

/// A config file under `dir` giving the remote tier on the gateway at `endpoint` (bucket
/// `shared`) with its credentials; its path.
fn remote_config(dir: &std::path::Path, endpoint: &str) -> String {
    let config = dir.join("kvtier.toml");
    std::fs::write(
        &config,
        format!(
            "[remote]\nendpoints = [\"{endpoint}\"]\nbucket = \"shared\"\naccess_key = \"{ACCESS}\"\nsecret_key = \"{SECRET}\"\n"
        ),
    )
    .unwrap();
    config.to_str().unwrap().to_owned()
}

#[test]
fn a_second_replica_loads_what_the_first_stored_through_the_shared_bucket() {
    let dir = tempfile::tempdir().unwrap();
    let gateway = Gateway::start(&dir.path().join("s3"), &["--create-bucket", "shared"]);
    // The remote tier's settings and credentials come from the config file.
    let config = remote_config(dir.path(), &gateway.endpoint);
    let start = |data: &str, extra: &[&str]| {
        let mut args = vec!["--config", config.as_str()];
        args.extend_from_slice(extra);
        Server::start(&dir.path().join(data), &args)
    };
    let rt = runtime();
    let spec = layout_spec("shared", 4);
    let first = start("a", &[]);
    let layout = rt.block_on(async {
        let c = first.client();
        let layout = c.register_layout(&spec).await.unwrap();
        let stored = c
            .store(&prompt(&layout, 5, 6), payloads(&layout, 5, 6))
            .await
            .unwrap();
        assert_eq!(stored.stored, 6);
        layout
    });
    // SIGTERM drains the remote queue before the process exits.
    assert!(first.stop().success());

    // Strict about the shared tier: the endpoint answers, so the start goes on.
    let second = start(
        "b",
        &[
            "--set",
            "ssd.enabled=false",
            "--set",
            "remote.require_at_start=true",
        ],
    );
    rt.block_on(async {
        let c = second.client();
        assert_eq!(c.register_layout(&spec).await.unwrap(), layout);
        let hit = c.lookup(&prompt(&layout, 5, 6)).await.unwrap();
        assert_eq!(hit.matched_tokens, 96);
        assert_eq!(hit.tiers, "oooooo");
        let got = load_all(&c, &layout, &hit).await;
        assert_eq!(got.status, EndStatus::Complete);
        assert_eq!(got.blocks, payloads(&layout, 5, 6));
        let stats = c.stats().await.unwrap();
        assert_eq!(stats["remote_hits"], 6, "{stats:?}");
        // Counted by their true source: the remote tier, not the (absent) SSD.
        assert_eq!(stats["engine_promotions_remote_to_ram"], 6, "{stats:?}");
        assert!(
            !stats.contains_key("engine_promotions_ssd_to_ram"),
            "{stats:?}"
        );
        assert_eq!(stats["remote_writer_enqueued"], 0, "{stats:?}");
        // `/metrics` shows the remote tier like any other.
        let metrics = c.metrics().await.unwrap();
        for series in [
            "kvtier_tier_hits_total{tier=\"remote\"} 6",
            "kvtier_tier_hits_total{tier=\"ram\"}",
            "kvtier_promotions_total{from=\"remote\",to=\"ram\"} 6",
            "kvtier_writer_queue_depth{tier=\"remote\"} 0",
        ] {
            assert!(
                metrics.contains(series),
                "missing `{series}` in:\n{metrics}"
            );
        }
        assert!(!metrics.contains("tier=\"ssd\""), "{metrics}");
    });
    assert!(second.stop().success());
    drop(gateway);
}

#[test]
fn with_a_signing_key_a_replica_serves_only_what_a_holder_of_the_same_key_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let gateway = Gateway::start(&dir.path().join("s3"), &["--create-bucket", "shared"]);
    let config = remote_config(dir.path(), &gateway.endpoint);
    let key = |byte: &str| format!("remote.signing_key={}", byte.repeat(32));
    let start = |data: &str, key: &str| {
        let args = [
            "--config",
            config.as_str(),
            "--set",
            "ssd.enabled=false",
            "--set",
            key,
        ];
        Server::start(&dir.path().join(data), &args)
    };
    let rt = runtime();
    let spec = layout_spec("signed", 4);
    let writer = start("a", &key("5a"));
    let layout = rt.block_on(async {
        let c = writer.client();
        let layout = c.register_layout(&spec).await.unwrap();
        let stored = c
            .store(&prompt(&layout, 7, 4), payloads(&layout, 7, 4))
            .await
            .unwrap();
        assert_eq!(stored.stored, 4);
        layout
    });
    assert!(writer.stop().success());

    // Another key: the bucket's objects are not signed with it, so none is served.
    let stranger = start("b", &key("a5"));
    rt.block_on(async {
        let c = stranger.client();
        c.register_layout(&spec).await.unwrap();
        let hit = c.lookup(&prompt(&layout, 7, 4)).await.unwrap();
        assert_eq!(hit.matched_tokens, 0);
        let stats = c.stats().await.unwrap();
        assert!(stats["remote_refused_unsigned"] >= 1, "{stats:?}");
    });
    assert!(stranger.stop().success());

    // The same key: all of it, byte for byte.
    let peer = start("c", &key("5a"));
    rt.block_on(async {
        let c = peer.client();
        c.register_layout(&spec).await.unwrap();
        let hit = c.lookup(&prompt(&layout, 7, 4)).await.unwrap();
        assert_eq!(hit.tiers, "oooo");
        let got = load_all(&c, &layout, &hit).await;
        assert_eq!(got.status, EndStatus::Complete);
        assert_eq!(got.blocks, payloads(&layout, 7, 4));
        assert_eq!(c.stats().await.unwrap()["remote_refused_unsigned"], 0);
    });
    assert!(peer.stop().success());
    drop(gateway);
}

/// Runs `kvtier serve` over `data` with the remote tier at `endpoint` required at start
/// (credentials given, so a failure is the endpoint's, not a credential lookup's) and
/// `extra` arguments; it must exit without listening or opening the SSD tier. Its stderr.
fn strict_start_fails(data: &std::path::Path, endpoint: &str, extra: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvtier"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data)
        .args(["--remote-endpoints", endpoint])
        .args(["--set", "remote.require_at_start=true"])
        .args(["--set", &format!("remote.access_key={ACCESS}")])
        .args(["--set", &format!("remote.secret_key={SECRET}")])
        .args(extra)
        .env_remove("KVTIER_CONFIG")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "started: {err}");
    assert!(err.contains("unavailable"), "{err}");
    assert!(err.contains("remote.require_at_start"), "{err}");
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("listening on"),
        "it listened"
    );
    assert!(!data.join("ssd").exists(), "the SSD tier was opened");
    err
}

#[test]
fn a_required_remote_tier_nobody_answers_fails_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let port = kvtier_testkit::free_port().unwrap();
    let endpoint = format!("http://127.0.0.1:{port}");
    let err = strict_start_fails(
        &dir.path().join("data"),
        &endpoint,
        &["--set", "remote.deadline=500ms"],
    );
    assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
    assert!(err.to_lowercase().contains("connect"), "{err}");
}

#[test]
fn a_required_remote_tier_whose_bucket_is_missing_fails_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let gateway = Gateway::start(&dir.path().join("s3"), &["--create-bucket", "shared"]);
    let err = strict_start_fails(
        &dir.path().join("data"),
        &gateway.endpoint,
        &["--remote-bucket", "absent"],
    );
    assert!(err.contains("did not list its bucket"), "{err}");
    drop(gateway);
}

/// Issue 39, item 5: `DELETE /v1/layouts/{layout}` deletes the layout's blocks, snapshots
/// and checkpoints in every tier — RAM, the SSD (tombstones made durable: a kill -9 right
/// after does not bring them back) and the shared bucket (its objects deleted, so a
/// listing finds nothing: not after a restart, not on a fresh replica) — and leaves other
/// layouts alone.
#[test]
fn a_layout_delete_reaches_every_tier_and_nothing_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    let gateway = Gateway::start(&dir.path().join("s3"), &["--create-bucket", "shared"]);
    let config = remote_config(dir.path(), &gateway.endpoint);
    let start = |data: &str| Server::start(&dir.path().join(data), &["--config", config.as_str()]);
    let rt = runtime();
    let (gone, kept) = (layout_spec("deleted", 2), layout_spec("kept", 2));
    let snap = |layout: &kvtier_client::wire::LayoutInfo| kvtier_client::wire::SnapshotSpec {
        layout: layout.layout.clone(),
        tokens: prompt(layout, 3, 2).tokens,
        session: None,
    };
    let state = bytes::Bytes::from(vec![7u8; 4096]);

    let a = start("a");
    let (gone_layout, kept_layout) = rt.block_on(async {
        let c = a.client();
        let (g, k) = (
            c.register_layout(&gone).await.unwrap(),
            c.register_layout(&kept).await.unwrap(),
        );
        for l in [&g, &k] {
            assert_eq!(
                c.store(&prompt(l, 3, 4), payloads(l, 3, 4))
                    .await
                    .unwrap()
                    .stored,
                4
            );
            c.snapshot_put(&snap(l), state.clone()).await.unwrap();
        }
        // Everything queued reaches the SSD and the bucket before the delete.
        assert!(a.admin().admin_flush().await.unwrap());
        assert_eq!(c.delete_layout(&g.layout).await.unwrap(), 4);
        assert_eq!(c.lookup(&prompt(&g, 3, 4)).await.unwrap().matched_tokens, 0);
        assert!(c.snapshot_get(&snap(&g)).await.unwrap().is_none());
        assert_eq!(
            c.lookup(&prompt(&k, 3, 4)).await.unwrap().matched_tokens,
            64
        );
        (g, k)
    });
    // No clean shutdown: what the delete wrote must already be durable.
    a.kill9();

    for (name, server) in [
        ("a, restarted", start("a")),
        ("a fresh replica", start("c")),
    ] {
        rt.block_on(async {
            let c = server.client();
            assert_eq!(c.register_layout(&gone).await.unwrap(), gone_layout);
            assert_eq!(c.register_layout(&kept).await.unwrap(), kept_layout);
            let hit = c.lookup(&prompt(&gone_layout, 3, 4)).await.unwrap();
            assert_eq!(hit.matched_tokens, 0, "{name}: {hit:?}");
            assert_eq!(
                c.snapshot_get(&snap(&gone_layout)).await.unwrap(),
                None,
                "{name}"
            );
            let hit = c.lookup(&prompt(&kept_layout, 3, 4)).await.unwrap();
            assert_eq!(hit.matched_tokens, 64, "{name}: {hit:?}");
            let kept_state = c.snapshot_get(&snap(&kept_layout)).await.unwrap();
            assert!(
                kept_state == Some(state.clone()),
                "{name}: the kept snapshot is gone"
            );
        });
        assert!(server.stop().success());
    }
}
