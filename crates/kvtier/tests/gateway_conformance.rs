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

use std::process::Output;

use gateway::{Gateway, SECRET, assert_ok};

fn python(endpoint: &str, mode: &str) -> Output {
    gateway::python("s3_conformance.py", endpoint, SECRET, mode, &[])
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
