//! Injected time.
//!
//! TTLs and LRU order read time through [`Clock`], so tests move a [`MockClock`] forward
//! instead of sleeping. Time is a monotonic count of nanoseconds since an arbitrary origin.

use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A monotonic source of time.
pub trait Clock: Send + Sync + Debug + 'static {
    /// Nanoseconds since this clock's origin. Never decreases.
    fn now_nanos(&self) -> u64;
}

/// The real monotonic clock.
#[derive(Debug, Clone)]
pub struct SystemClock {
    origin: Instant,
}

impl SystemClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now_nanos(&self) -> u64 {
        // u64 nanoseconds last 584 years of uptime.
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// A clock that moves only when told to. Each reading also advances it by one nanosecond,
/// so two successive events are always ordered (LRU tests rely on that).
#[derive(Debug, Default)]
pub struct MockClock {
    nanos: AtomicU64,
}

impl MockClock {
    /// A mock clock at time zero.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        self.nanos.fetch_add(by, Ordering::SeqCst);
    }
}

impl Clock for MockClock {
    fn now_nanos(&self) -> u64 {
        self.nanos.fetch_add(1, Ordering::SeqCst) + 1
    }
}
