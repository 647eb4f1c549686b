//! The SSD tier passes the tier conformance suite.

#![allow(clippy::expect_used, reason = "test code")]

use std::sync::Arc;

use kvtier_core::clock::SystemClock;
use kvtier_core::tier::conformance;
use kvtier_core::tier::{ResidencySink, Tier};
use kvtier_ssd::{SsdConfig, SsdTier};

#[test]
fn ssd_tier_conforms() -> Result<(), conformance::Failure> {
    let dirs = parking_lot::Mutex::new(Vec::new());
    let factory = |sink: Arc<dyn ResidencySink>| -> Arc<dyn Tier> {
        let dir = tempfile::tempdir().expect("temp dir");
        let tier = SsdTier::open(
            SsdConfig::new(dir.path()),
            Arc::new(SystemClock::new()),
            sink,
        )
        .expect("open SSD tier");
        dirs.lock().push(dir);
        Arc::new(tier)
    };
    conformance::run_all(&factory)
}
