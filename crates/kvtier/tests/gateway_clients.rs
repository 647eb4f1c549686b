//! `kvtier gateway` as a real process, driven by real S3 clients: boto3 (every supported
//! operation, with checks), the AWS CLI, a restart, a kill -9 in the middle of PUTs, and
//! a gateway without authentication (signed clients, aws-chunked bodies) and the refusal
//! to serve unauthenticated off loopback. Python packages come from
//! scripts/setup.sh (boto3, awscli).

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests"
)]

mod gateway;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use gateway::{ACCESS, Gateway, SECRET, assert_ok};
use kvtier_testkit::{Process, Ready};

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gateway/s3_clients.py")
}

fn python(endpoint: &str, secret: &str, mode: &str, extra: &[&str]) -> Output {
    gateway::python("s3_clients.py", endpoint, secret, mode, extra)
}

#[test]
fn boto3_can_use_every_supported_operation() {
    let dir = tempfile::tempdir().unwrap();
    let g = Gateway::start(dir.path(), &[]);
    assert_ok(
        &python(&g.endpoint, SECRET, "full", &[]),
        "the boto3 checks",
    );
}

#[test]
fn objects_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut g = Gateway::start(dir.path(), &[]);
    assert_ok(&python(&g.endpoint, SECRET, "put", &[]), "put");
    g.signal(rustix::process::Signal::TERM);
    let g = Gateway::start(dir.path(), &[]);
    assert_ok(
        &python(&g.endpoint, SECRET, "check", &[]),
        "check after restart",
    );
}

#[test]
fn a_kill_9_during_puts_loses_no_acknowledged_object_and_leaves_no_partial_one() {
    let dir = tempfile::tempdir().unwrap();
    let acks = dir.path().join("acks.txt");
    let store = dir.path().join("store");
    let mut g = Gateway::start(&store, &[]);
    let mut cmd = Command::new("python3");
    cmd.arg(script())
        .args([g.endpoint.as_str(), ACCESS, SECRET, "crashw"]);
    // It prints one line per acknowledged PUT on stdout (the kit keeps it in a file).
    let mut writer = Process::start("the boto3 writer", cmd, Ready::Spawned, Duration::ZERO)
        .expect("python3 (scripts/setup.sh installs boto3)");
    // Let it write for a while, then kill the gateway mid-stream.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while writer.stdout().lines().count() < 30 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    g.signal(rustix::process::Signal::KILL);
    let _ = writer.kill_hard();
    std::fs::write(&acks, writer.stdout()).unwrap();
    let g = Gateway::start(&store, &[]);
    let out = python(&g.endpoint, SECRET, "crashc", &[acks.to_str().unwrap()]);
    assert_ok(&out, "the check after kill -9");
}

fn aws(endpoint: &str, args: &[&str]) -> Output {
    Command::new("aws")
        .arg("--endpoint-url")
        .arg(endpoint)
        .args(args)
        .env("AWS_ACCESS_KEY_ID", ACCESS)
        .env("AWS_SECRET_ACCESS_KEY", SECRET)
        .env("AWS_DEFAULT_REGION", "us-east-1")
        .env("AWS_CONFIG_FILE", "/dev/null")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
        .output()
        .expect("aws (scripts/setup.sh installs awscli)")
}

fn aws_ok(endpoint: &str, args: &[&str]) -> String {
    let out = aws(endpoint, args);
    assert!(
        out.status.success(),
        "aws {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_aws_cli_can_copy_list_get_ranges_and_delete() {
    let dir = tempfile::tempdir().unwrap();
    let g = Gateway::start(&dir.path().join("store"), &[]);
    let file = dir.path().join("up.bin");
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 13 % 251) as u8).collect();
    std::fs::write(&file, &data).unwrap();
    aws_ok(&g.endpoint, &["s3", "mb", "s3://cli-bucket"]);
    aws_ok(
        &g.endpoint,
        &[
            "s3",
            "cp",
            file.to_str().unwrap(),
            "s3://cli-bucket/a/up.bin",
        ],
    );
    let listed = aws_ok(&g.endpoint, &["s3", "ls", "s3://cli-bucket/a/"]);
    assert!(
        listed.contains("300000") && listed.contains("up.bin"),
        "{listed}"
    );
    let part = dir.path().join("part.bin");
    aws_ok(
        &g.endpoint,
        &[
            "s3api",
            "get-object",
            "--bucket",
            "cli-bucket",
            "--key",
            "a/up.bin",
            "--range",
            "bytes=1000-2999",
            part.to_str().unwrap(),
        ],
    );
    assert_eq!(std::fs::read(&part).unwrap(), &data[1000..3000]);
    let down = dir.path().join("down.bin");
    aws_ok(
        &g.endpoint,
        &[
            "s3",
            "cp",
            "s3://cli-bucket/a/up.bin",
            down.to_str().unwrap(),
        ],
    );
    assert_eq!(std::fs::read(&down).unwrap(), data);
    aws_ok(&g.endpoint, &["s3", "rm", "s3://cli-bucket/a/up.bin"]);
    // `aws s3 ls` exits 1 when nothing matches: look at what it printed.
    let listed = aws(&g.endpoint, &["s3", "ls", "s3://cli-bucket/a/"]);
    assert!(!String::from_utf8_lossy(&listed.stdout).contains("up.bin"));
    aws_ok(&g.endpoint, &["s3", "rb", "s3://cli-bucket"]);
    // A wrong secret is refused.
    let out = Command::new("aws")
        .args(["--endpoint-url", &g.endpoint, "s3", "ls"])
        .env("AWS_ACCESS_KEY_ID", ACCESS)
        .env("AWS_SECRET_ACCESS_KEY", "not-the-secret")
        .env("AWS_DEFAULT_REGION", "us-east-1")
        .env("AWS_CONFIG_FILE", "/dev/null")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("SignatureDoesNotMatch"));
}

#[test]
fn without_authentication_signed_requests_presigned_urls_and_aws_chunked_bodies_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let g = Gateway::start_unauthenticated(dir.path());
    assert_ok(
        &python(&g.endpoint, "any-secret", "unauth", &[]),
        "the checks against --auth none",
    );
}

#[test]
fn no_authentication_is_refused_off_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kvtier"))
        .args(["gateway", "--listen", "0.0.0.0:0", "--auth", "none"])
        .arg("--dir")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("refusing to serve without authentication"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
