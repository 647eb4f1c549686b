//! The RAM tier passes the tier conformance suite.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed expectation is a failed test"
)]

use std::sync::Arc;

use kvtier_core::budget::MemoryBudget;
use kvtier_core::clock::SystemClock;
use kvtier_core::tier::conformance::{self, MIN_CAPACITY};
use kvtier_core::tier::{RamTier, ResidencySink, Tier};

#[test]
fn ram_tier_conforms() -> Result<(), conformance::Failure> {
    let factory = |sink: Arc<dyn ResidencySink>| -> Arc<dyn Tier> {
        Arc::new(RamTier::new(
            Arc::new(MemoryBudget::new(4 * MIN_CAPACITY)),
            Arc::new(SystemClock::new()),
            sink,
        ))
    };
    conformance::run_all(&factory)
}
