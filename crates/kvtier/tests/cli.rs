//! The `kvtier` binary: `version`, `--help`, and a quick bench that writes every row.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed expectation is a failed test"
)]

use std::process::Command;

fn kvtier() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kvtier"))
}

#[test]
fn version_names_the_formats() -> Result<(), Box<dyn std::error::Error>> {
    let out = kvtier().arg("version").output()?;
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout)?;
    assert!(text.contains(env!("CARGO_PKG_VERSION")), "{text}");
    assert!(text.contains("layout key schema v1"), "{text}");
    Ok(())
}

#[test]
fn help_explains_every_bench_option_with_its_default() -> Result<(), Box<dyn std::error::Error>> {
    let out = kvtier().args(["bench", "--help"]).output()?;
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout)?;
    for opt in [
        "--quick",
        "--json",
        "--filter",
        "--ssd-dir",
        "--ssd-mib",
        "--models",
        "--recover-blocks",
    ] {
        assert!(text.contains(opt), "{opt} missing from:\n{text}");
    }
    assert_eq!(
        text.matches("Default:").count(),
        7,
        "every option names its default:\n{text}"
    );
    Ok(())
}

#[test]
fn unknown_arguments_fail_cleanly() -> Result<(), Box<dyn std::error::Error>> {
    let out = kvtier().args(["bench", "--no-such-flag"]).output()?;
    assert!(!out.status.success());
    assert!(String::from_utf8(out.stderr)?.contains("--no-such-flag"));
    Ok(())
}

/// A dead etcd is a clear error, soon: nothing listening (refused), and a listener that
/// accepts connections but never answers (the client's keep-alive gives up on it).
#[test]
fn cluster_status_fails_fast_and_clearly_without_etcd() -> Result<(), Box<dyn std::error::Error>> {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let silent = std::net::TcpListener::bind("127.0.0.1:0")?;
    for addr in [closed, silent.local_addr()?] {
        let started = std::time::Instant::now();
        let out = kvtier()
            .args(["cluster", "status", "--cluster", &format!("etcd://{addr}")])
            .output()?;
        let took = started.elapsed();
        let err = String::from_utf8(out.stderr)?;
        assert!(!out.status.success(), "{addr}: {err}");
        assert!(
            err.contains("cannot read cluster") && err.contains(&addr.to_string()),
            "{addr}: {err}"
        );
        assert!(
            took < std::time::Duration::from_secs(30),
            "{addr}: took {took:?}"
        );
    }
    drop(silent);
    Ok(())
}

#[test]
fn quick_bench_writes_every_row_with_a_baseline() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("kvtier-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let json = dir.join("rows.json");
    let out = kvtier()
        .args(["bench", "--quick", "--json"])
        .arg(&json)
        .output()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<serde_json::Value> = serde_json::from_str(&std::fs::read_to_string(&json)?)?;
    std::fs::remove_dir_all(&dir)?;
    let names: Vec<&str> = rows.iter().filter_map(|r| r["name"].as_str()).collect();
    let expected = [
        "hash.ns_per_token",
        "lookup.hit_128k.ms",
        "lookup.miss.us",
        "lookup.miss_from_tokens_128k.us",
        "ram.store.256KiB.GBps",
        "ram.store.2MiB.GBps",
        "ram.load.256KiB.GBps",
        "ram.load.2MiB.GBps",
        "ram.store.256KiB.GBps.t2",
        "ram.store.2MiB.GBps.t2",
        "ram.load.256KiB.GBps.t2",
        "ram.load.2MiB.GBps.t2",
        "snapshot.put.us",
        "snapshot.get.us",
        "ssd.store.256KiB.GBps",
        "ssd.store.2MiB.GBps",
        "ssd.load.256KiB.GBps",
        "ssd.load.2MiB.GBps",
        "ssd.store.durable.256KiB.c1.GBps",
        "ssd.store.durable.256KiB.c16.GBps",
        "ssd.store.durable.256KiB.c16.p99.ms",
        "ssd.enqueue.p99.us",
        "ssd.recover.1M.s",
        "ssd.restart.hit_ratio",
        "server.load.64x2MiB.GBps",
        "server.store.2MiB.GBps",
        "server.lookup.p99.ms",
        "server.mixed.lookup.p99.ms",
        "server.mixed.lookup.p50.ms",
        "server.mixed.store.2MiB.GBps",
        "server.mixed_tcp.lookup.p99.ms",
        "s3.gateway.range128KiB.c1.p50.ms",
        "s3.gateway.range128KiB.c8.p99.ms",
        "s3.gateway.range128KiB.c8.ops",
        "s3.moto.range128KiB.c8.ops",
        "s3.gateway_vs_moto.c8.ops",
        "cluster.advertise.p50.ms",
        "cluster.advertise.p99.ms",
        "cluster.remote_hit.load.2MiB.ms",
        "cluster.remote_hit.signed.load.2MiB.ms",
        "cluster.replay.100k.s",
        "cluster.publish.ops",
    ];
    for name in expected {
        assert!(names.contains(&name), "row {name} missing; got {names:?}");
    }
    for r in &rows {
        let (v, b, ratio) = (
            r["value"].as_f64(),
            r["baseline"].as_f64(),
            r["ratio"].as_f64(),
        );
        let (Some(v), Some(b), Some(ratio)) = (v, b, ratio) else {
            panic!("row without numbers: {r}");
        };
        assert!(v > 0.0 && b > 0.0, "row {r}");
        if r["paired"].as_bool() == Some(true) {
            // The median of per-sample ratios: not value / baseline, but of its order.
            assert!(ratio.is_finite() && ratio > 0.0, "row {r}");
        } else {
            assert!(
                (ratio - v / b).abs() <= 1e-9 * ratio.abs().max(1.0),
                "row {r}"
            );
        }
        assert!(r["unit"].as_str().is_some_and(|u| !u.is_empty()));
    }
    Ok(())
}

#[test]
fn serve_help_lists_every_setting_with_its_default() -> Result<(), Box<dyn std::error::Error>> {
    let out = kvtier().args(["serve", "--help"]).output()?;
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout)?;
    // Every key of the printed configuration is listed by its path with its value, which
    // is the default here.
    let dir = tempfile::tempdir()?;
    let out = kvtier()
        .args([
            "serve",
            "--print-config",
            "--admin-token",
            "0123456789abcdef0123",
        ])
        .arg("--data-dir")
        .arg(dir.path())
        .env_remove("KVTIER_CONFIG")
        .output()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let config = String::from_utf8(out.stdout)?;
    assert!(config.contains("admin_token = \"<redacted>\""), "{config}");
    let mut section = String::new();
    let mut keys = 0;
    for line in config.lines() {
        if let Some(s) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = s.to_string();
            continue;
        }
        let Some((key, value)) = line.split_once(" = ") else {
            continue;
        };
        if key == "data_dir" || key.ends_with("token") {
            continue; // set above, not the default
        }
        let path = if section.is_empty() {
            key.to_owned()
        } else {
            format!("{section}.{key}")
        };
        let value = match value.trim_matches('"') {
            "" => "\"\"",
            v => v,
        };
        assert!(
            help.contains(&format!("\n  {path} = {value}\n")),
            "`{path} = {value}` missing from:\n{help}"
        );
        keys += 1;
    }
    assert!(keys >= 40, "only {keys} settings printed:\n{config}");
    Ok(())
}

#[test]
fn serve_settings_come_from_file_then_environment_then_flags()
-> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("kvtier.toml");
    std::fs::write(
        &file,
        "ram = \"2GiB\"\nmax_tokens = 4096\n[ssd]\nttl = \"1h\"\ncapacity = \"1GB\"\n",
    )?;
    let out = kvtier()
        .args(["serve", "--print-config", "--ssd-capacity", "3GB"])
        .arg("--config")
        .arg(&file)
        .env("KVTIER_RAM", "3GiB")
        .env("KVTIER_SSD_CAPACITY", "2GB")
        .output()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let config = String::from_utf8(out.stdout)?;
    assert!(
        config.contains("ram = \"3GiB\""),
        "environment over file:\n{config}"
    );
    assert!(
        config.contains("capacity = \"3GB\""),
        "flag over environment:\n{config}"
    );
    assert!(
        config.contains("ttl = \"1h\"") && config.contains("max_tokens = 4096"),
        "file over default:\n{config}"
    );
    // A bad value names itself.
    let out = kvtier()
        .args(["serve", "--print-config", "--ram", "12XB"])
        .output()?;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("12XB"));
    Ok(())
}

/// Built without the `models` feature (as the workspace tests build it), `kvtier demo`
/// and `bench --models` fail at once and say how to get them; they never half-run.
#[test]
#[cfg(not(feature = "models"))]
fn demo_without_the_models_feature_says_how_to_build_it() -> Result<(), Box<dyn std::error::Error>>
{
    for args in [
        &["demo"][..],
        &["bench", "--models", "--filter", "model."][..],
    ] {
        let out = kvtier().args(args).output()?;
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8(out.stderr)?;
        assert!(err.contains("--features models"), "{args:?}: {err}");
    }
    Ok(())
}
