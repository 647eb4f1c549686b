//! Replicas of a test cluster as `kvtier serve` processes: their config files, starting
//! them, waiting on them, and `kvtier cluster status`.

#![allow(
    dead_code,
    clippy::unwrap_used,
    reason = "test helpers, each test binary using some"
)]

use std::time::{Duration, Instant};

use crate::gateway::{ACCESS, SECRET};
use crate::server::{Server, layout_spec};

/// A config file for a replica of the cluster at `etcd` using the bucket at `endpoint`.
pub fn config(dir: &std::path::Path, name: &str, endpoint: &str, etcd: &str) -> String {
    config_with(dir, name, endpoint, etcd, "")
}

/// [`config`], with `cluster_toml` added to its `[cluster]` table (and any tables after).
pub fn config_with(
    dir: &std::path::Path,
    name: &str,
    endpoint: &str,
    etcd: &str,
    cluster_toml: &str,
) -> String {
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(
        &path,
        format!(
            "[remote]\nendpoints = [\"{endpoint}\"]\nbucket = \"shared\"\naccess_key = \"{ACCESS}\"\nsecret_key = \"{SECRET}\"\n\n[cluster]\netcd = \"{etcd}\"\nname = \"test\"\nreplica = \"{name}\"\n{cluster_toml}\n"
        ),
    )
    .unwrap();
    path.to_str().unwrap().to_owned()
}

/// Replica `name` of cluster `test`, storing through `endpoint`, reaching etcd at `etcd`,
/// with `extra` flags, its data under `dir/name`.
pub fn replica(
    dir: &std::path::Path,
    name: &str,
    endpoint: &str,
    etcd: &str,
    extra: &[&str],
) -> Server {
    replica_with(dir, name, endpoint, etcd, "", extra)
}

/// [`replica`], with `cluster_toml` in its config file's `[cluster]` table.
pub fn replica_with(
    dir: &std::path::Path,
    name: &str,
    endpoint: &str,
    etcd: &str,
    cluster_toml: &str,
    extra: &[&str],
) -> Server {
    let config = config_with(dir, name, endpoint, etcd, cluster_toml);
    let mut args = vec!["--config", config.as_str()];
    args.extend_from_slice(extra);
    Server::start(&dir.join(name), &args)
}

/// Registers the test layout on both replicas and gives them time to register in the
/// cluster and open their watches.
pub async fn shared_layout(
    ca: &kvtier_client::Client,
    cb: &kvtier_client::Client,
) -> kvtier_client::wire::LayoutInfo {
    let spec = layout_spec("cluster", 2);
    let layout = ca.register_layout(&spec).await.unwrap();
    assert_eq!(cb.register_layout(&spec).await.unwrap(), layout);
    tokio::time::sleep(Duration::from_secs(2)).await;
    layout
}

/// Polls `check` every 20 ms until it holds or `within` passes; whether it held.
pub async fn eventually(within: Duration, mut check: impl AsyncFnMut() -> bool) -> bool {
    let t = Instant::now();
    loop {
        if check().await {
            return true;
        }
        if t.elapsed() > within {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `kvtier cluster status --json` for cluster `test` at `etcd`.
pub fn cluster_status(etcd: &str) -> serde_json::Value {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvtier"))
        .args([
            "cluster",
            "status",
            "--json",
            "--cluster",
            etcd,
            "--set",
            "cluster.name=test",
        ])
        .env_remove("KVTIER_CONFIG")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}
