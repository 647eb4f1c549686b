//! `kvtier gateway` as a real process, on what ceph/s3-tests measures beyond the basics:
//! request ids on every answer and in error bodies, re-creating an owned bucket (200,
//! contents kept), GET/HEAD by `partNumber`, GetObjectAttributes, ListMultipartUploads,
//! canned ACLs (anonymous clients read `public-read` objects and nothing else), CORS
//! preflights, GetBucketLocation and ListBuckets pages; part boundaries, ACLs and
//! locations kept across a restart. Checked with boto3 (`tests/gateway/s3_conformance.py`).

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests"
)]

mod gateway;

use std::path::Path;
use std::process::{Command, Output};

use gateway::{ACCESS, Gateway, SECRET};

fn python(endpoint: &str, mode: &str) -> Output {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gateway/s3_conformance.py");
    Command::new("python3")
        .arg(script)
        .args([endpoint, ACCESS, SECRET, mode])
        .output()
        .expect("python3 (scripts/setup.sh installs boto3)")
}

fn assert_ok(out: &Output, what: &str) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.trim_end().ends_with("OK"),
        "{what} failed: {}\nstdout: {stdout}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn request_ids_recreation_parts_attributes_upload_listings_acls_and_bucket_listings() {
    let dir = tempfile::tempdir().unwrap();
    let g = Gateway::start(dir.path(), &[]);
    assert_ok(&python(&g.endpoint, "api"), "the conformance checks");
}

#[test]
fn part_boundaries_acls_and_locations_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut g = Gateway::start(dir.path(), &[]);
    assert_ok(&python(&g.endpoint, "parts"), "writing the parts");
    g.signal(rustix::process::Signal::TERM);
    let g = Gateway::start(dir.path(), &[]);
    assert_ok(&python(&g.endpoint, "partsc"), "parts after a restart");
}
