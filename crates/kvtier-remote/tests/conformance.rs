//! The tier conformance suite against real S3 servers: kvtier gateway and moto.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests"
)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use kvtier_core::tier::{ResidencySink, Tier, conformance};
use kvtier_remote::{Endpoint, RemoteTier};

fn run(endpoint: Endpoint) {
    let n = AtomicUsize::new(0);
    let factory = |sink: Arc<dyn ResidencySink>| -> Arc<dyn Tier> {
        // Each check gets a tier of its own: a fresh prefix in the same bucket.
        let prefix = format!("conformance-{}", n.fetch_add(1, Ordering::Relaxed));
        Arc::new(
            RemoteTier::open(common::config(endpoint.clone(), &prefix), sink)
                .expect("open remote tier"),
        )
    };
    if let Err(f) = conformance::run_all(&factory) {
        panic!("{f}");
    }
}

#[test]
fn the_remote_tier_on_kvtier_gateway_passes_the_conformance_suite() {
    let g = common::Gateway::start();
    run(g.endpoint());
}

#[test]
fn the_remote_tier_on_moto_passes_the_conformance_suite() {
    let m = common::Moto::start();
    run(m.endpoint());
}
