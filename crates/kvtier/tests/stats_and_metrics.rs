//! One counter registry, seen from outside (issue 36's acceptance): a node with every
//! subsystem attached — RAM, SSD, a remote tier on a real S3 server (`kvtier gateway`),
//! cluster mode on a real etcd, a KV-event publisher — served over HTTP by the server's
//! own code. Its `/v1/stats` and `/metrics` answers name the same samples (one flat name
//! for each series, and no other), each subsystem's table is among them, and each family
//! is typed as its table declares it.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests"
)]

mod gateway;
mod server;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use gateway::{ACCESS, Gateway, SECRET};
use kvtier_client::Client;
use kvtier_client::wire::frame::EndStatus;
use kvtier_core::registry::Sample;
use kvtier_core::stats::{Counter, CounterKind};
use kvtier_core::units::ByteSize;
use kvtier_server::{Running, Settings};
use kvtier_testkit::EtcdCluster;
use server::{layout_spec, load_all, payloads, prompt, runtime};

/// The series a sample is written as in `/metrics` (an unlabelled one with empty braces).
fn series_of(s: &Sample) -> String {
    let suffix = match s.kind {
        CounterKind::Counter => "_total",
        CounterKind::Gauge => "",
    };
    let labels: Vec<String> = s
        .labels
        .iter()
        .map(|(k, v)| format!("{k}=\"{v}\""))
        .collect();
    format!("kvtier_{}{suffix}{{{}}}", s.family, labels.join(","))
}

/// The series of a `/metrics` answer, the latency histograms left out.
fn series(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter(|l| !l.starts_with("kvtier_request_duration_seconds"))
        .map(|l| l.rsplit_once(' ').unwrap().0.to_string())
        .collect()
}

/// The `# TYPE` line `/metrics` writes for a family of `kind`.
fn type_line(family: &str, kind: CounterKind) -> String {
    let kind = match kind {
        CounterKind::Counter => "counter",
        CounterKind::Gauge => "gauge",
    };
    format!("# TYPE kvtier_{family} {kind}\n")
}

/// Every counter of `table` under `prefix`: its flat name in `/v1/stats` and its type line
/// in `/metrics`, both required.
fn table_is_wired<S>(
    table: &[Counter<S>],
    prefix: &str,
    stats: &BTreeMap<String, u64>,
    text: &str,
) {
    assert!(!table.is_empty());
    for c in table {
        let name = format!("{prefix}_{}", c.name);
        assert!(stats.contains_key(&name), "{name} not in /v1/stats");
        let line = type_line(c.family, c.kind);
        assert!(text.contains(&line), "{line} not in /metrics:\n{text}");
    }
}

/// A request whose body is not JSON: answered 400 and counted as a `bad_json` refusal.
fn refused_request(addr: std::net::SocketAddr) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(
        b"POST /v1/lookup HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1\r\nConnection: close\r\n\r\n{",
    )
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    answer
}

#[test]
fn a_node_with_every_subsystem_names_the_same_samples_in_stats_and_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let gateway = Gateway::start(&dir.path().join("s3"), &["--create-bucket", "shared"]);
    let etcd = EtcdCluster::start(&dir.path().join("etcd"), 1).unwrap();
    let mut settings = Settings {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: dir.path().join("node"),
        ram: ByteSize(256 << 20),
        ..Settings::default()
    };
    assert!(settings.ssd.enabled, "the SSD tier is on by default");
    // The test machine's disk may be nearly full.
    settings.ssd.min_free = ByteSize(0);
    settings.remote.endpoints = vec![gateway.endpoint.clone()];
    settings.remote.bucket = "shared".into();
    settings.remote.access_key = Some(ACCESS.into());
    settings.remote.secret_key = Some(SECRET.into());
    settings.cluster.etcd = etcd.url();
    settings.cluster.name = "test".into();
    settings.cluster.replica = Some("all".into());
    settings.kv_events.endpoint = "tcp://127.0.0.1:0".into();

    let rt = runtime();
    let running = rt.block_on(Running::start(settings)).unwrap();
    let app = running.state();
    let addr = running.addr;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = rt.spawn(running.serve(async move {
        let _ = stopped.await;
    }));
    let c = Client::new(&format!("http://{addr}")).unwrap();

    let (stats, text) = rt.block_on(async {
        // Ready: every tier attached, recovery done, the cluster followed.
        let since = Instant::now();
        while !c.ready().await.is_ok_and(|r| r.ready) {
            assert!(
                since.elapsed() < Duration::from_secs(30),
                "{:?}",
                c.ready().await
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Traffic through every subsystem: a store (RAM, SSD, the remote tier's queue,
        // an advertisement, residency events), a lookup and a load, a refusal.
        let layout = c
            .register_layout(&layout_spec("registry", 2))
            .await
            .unwrap();
        let p = prompt(&layout, 3, 4);
        let stored = c.store(&p, payloads(&layout, 3, 4)).await.unwrap();
        assert_eq!(stored.stored, 4);
        let hit = c.lookup(&p).await.unwrap();
        assert_eq!(hit.matched_tokens, 64);
        let got = load_all(&c, &layout, &hit).await;
        assert_eq!(got.status, EndStatus::Complete);
        let answer = refused_request(addr);
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
        // The remote write, its advertisement and the events are behind queues: wait
        // for them, so the answers below carry values, not only names.
        let since = Instant::now();
        loop {
            let s = c.stats().await.unwrap();
            let n = |name: &str| {
                *s.get(name)
                    .unwrap_or_else(|| panic!("{name} not in /v1/stats: {s:?}"))
            };
            if n("remote_stores") >= 4 && n("cluster_published") >= 1 && n("kv_events_batches") >= 1
            {
                break;
            }
            assert!(since.elapsed() < Duration::from_secs(30), "{s:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        (c.stats().await.unwrap(), c.metrics().await.unwrap())
    });

    // The same samples, named once each in both answers.
    let samples = kvtier_server::metrics::all_samples(&app.node.sources());
    let names: BTreeSet<String> = samples.iter().map(|s| s.name.clone()).collect();
    let stats_names: BTreeSet<String> = stats.keys().cloned().collect();
    assert_eq!(stats_names, names, "/v1/stats names other samples");
    let written: BTreeSet<String> = samples.iter().map(series_of).collect();
    let metrics = series(&text);
    assert_eq!(metrics, written, "/metrics names other samples:\n{text}");
    assert_eq!(stats.len(), metrics.len(), "one series per flat name");
    for s in samples.iter() {
        let line = type_line(s.family, s.kind);
        assert_eq!(text.matches(&line).count(), 1, "{line}");
    }

    // Every subsystem is there, under both names.
    for (flat, series) in [
        ("ram_hits", "kvtier_tier_hits_total{tier=\"ram\"}"),
        ("ssd_stores", "kvtier_tier_stores_total{tier=\"ssd\"}"),
        (
            "ssd_writer_saved",
            "kvtier_writer_outcomes_total{tier=\"ssd\",outcome=\"saved\"}",
        ),
        ("remote_stores", "kvtier_tier_stores_total{tier=\"remote\"}"),
        (
            "remote_writer_saved",
            "kvtier_writer_outcomes_total{tier=\"remote\",outcome=\"saved\"}",
        ),
        (
            "engine_load_tokens_delivered_ram",
            "kvtier_load_tokens_delivered_total{tier=\"ram\"}",
        ),
        ("ssd_recovery_records", "kvtier_ssd_recovery_records{}"),
        (
            "ssd_recovery_damaged_records",
            "kvtier_ssd_recovery_damaged_records_total{}",
        ),
        ("cluster_published", "kvtier_cluster_published_total{}"),
        ("cluster_is_leader", "kvtier_cluster_is_leader{}"),
        ("kv_events_batches", "kvtier_kv_events_batches_total{}"),
        ("kv_events_epoch", "kvtier_kv_events_epoch{}"),
        (
            "refused_bad_json",
            "kvtier_refused_total{kind=\"bad_json\"}",
        ),
    ] {
        assert!(stats.contains_key(flat), "{flat} not in /v1/stats");
        assert!(
            metrics.contains(series),
            "{series} not in /metrics:\n{text}"
        );
    }
    assert!(stats["cluster_published"] >= 1, "{stats:?}");
    assert!(stats["remote_stores"] >= 4, "{stats:?}");
    assert!(stats["refused_bad_json"] >= 1, "{stats:?}");
    // The served load is counted in the lookup's tokens: all 64 promised, all delivered.
    assert_eq!(stats["engine_lookup_tokens_promised"], 64, "{stats:?}");
    assert_eq!(stats["engine_load_tokens_asked"], 64, "{stats:?}");
    assert_eq!(stats["engine_load_tokens_delivered_ram"], 64, "{stats:?}");
    // Each subsystem's whole table, typed as declared: the counts are counters, the
    // levels (what recovery kept, the epoch, the leader flag) gauges.
    table_is_wired(
        kvtier_ssd::RecoveryReport::COUNTERS,
        "ssd_recovery",
        &stats,
        &text,
    );
    table_is_wired(
        kvtier_ssd::RecoveryReport::PREVIOUS_SHUTDOWN,
        "ssd_previous_shutdown",
        &stats,
        &text,
    );
    table_is_wired(
        kvtier_meta::ClusterStats::COUNTERS,
        "cluster",
        &stats,
        &text,
    );
    table_is_wired(
        kvtier_events::PublisherStats::COUNTERS,
        "kv_events",
        &stats,
        &text,
    );
    for line in [
        "# TYPE kvtier_cluster_published counter\n",
        "# TYPE kvtier_cluster_is_leader gauge\n",
        "# TYPE kvtier_kv_events_batches counter\n",
        "# TYPE kvtier_kv_events_epoch gauge\n",
        "# TYPE kvtier_ssd_recovery_damaged_records counter\n",
        "# TYPE kvtier_ssd_recovery_records gauge\n",
    ] {
        assert!(text.contains(line), "{line}");
    }

    let _ = stop.send(());
    let stopped = rt.block_on(serving).unwrap();
    assert!(stopped.requests_finished);
    drop(etcd);
}
