//! Injected time.
//!
//! Every component reads time through one [`Clock`] handed to it by the assembly
//! (`kvtier-node`), so tests move a [`MockClock`] forward instead of sleeping. A clock
//! gives two readings, for two different questions:
//!
//! - [`Clock::now_nanos`], **monotonic**: how long since something happened within this
//!   run (TTLs, LRU order, quarantine). It never goes back, and its origin is arbitrary,
//!   so its readings mean nothing after a restart or on another machine.
//! - [`Clock::wall_unix_nanos`], **wall**: when something happened, as a date that still
//!   means the same after a restart (the creation stamp of an SSD record, an object's
//!   `Last-Modified`). It may jump either way (NTP, an operator), so it is never used to
//!   measure an interval within a run; intervals across a restart are the one place the
//!   two meet (the SSD tier maps a record's age onto the monotonic line at open).

use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A source of time: a monotonic reading and a wall-clock reading.
pub trait Clock: Send + Sync + Debug + 'static {
    /// Nanoseconds since this clock's origin. Never decreases.
    fn now_nanos(&self) -> u64;

    /// Nanoseconds since the Unix epoch, as far as this clock knows (0 for a time before
    /// the epoch). May jump in either direction between two readings.
    fn wall_unix_nanos(&self) -> u64;
}

/// Conveniences over any [`Clock`].
pub trait ClockExt: Clock {
    /// Milliseconds since the Unix epoch (the unit of the stamps kvtier writes to disk).
    fn wall_unix_ms(&self) -> u64 {
        self.wall_unix_nanos() / 1_000_000
    }
}

impl<C: Clock + ?Sized> ClockExt for C {}

/// The real clocks: `Instant` for monotonic time, `SystemTime` for wall time.
#[derive(Debug, Clone)]
pub struct SystemClock {
    origin: Instant,
}

impl SystemClock {
    /// A clock whose monotonic origin is now.
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

    fn wall_unix_nanos(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    }
}

/// Where a [`MockClock`]'s wall time starts: 2023-11-14 22:13:20 UTC, a plausible date,
/// so stamps written under test look like real ones.
pub const MOCK_WALL_START: Duration = Duration::from_secs(1_700_000_000);

/// A clock that moves only when told to. Each monotonic reading also advances it by one
/// nanosecond, so two successive events are always ordered (LRU tests rely on that).
///
/// Wall time moves with monotonic time ([`MockClock::advance`] moves both) from
/// [`MOCK_WALL_START`], and can be set on its own ([`MockClock::set_wall`]) to model a
/// restart days later or a clock that jumps.
#[derive(Debug)]
pub struct MockClock {
    nanos: AtomicU64,
    /// Wall time minus monotonic time, modulo 2^64 (so a wall time set below the
    /// monotonic reading needs no sign).
    wall_offset: AtomicU64,
}

impl Default for MockClock {
    fn default() -> Self {
        Self {
            nanos: AtomicU64::new(0),
            wall_offset: AtomicU64::new(nanos_of(MOCK_WALL_START)),
        }
    }
}

fn nanos_of(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl MockClock {
    /// A mock clock at monotonic time zero and wall time [`MOCK_WALL_START`].
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// A mock clock at monotonic time zero and wall time `since_epoch`: a process that
    /// starts at that date.
    pub fn at_wall(since_epoch: Duration) -> Arc<Self> {
        let clock = Self::default();
        clock.set_wall(since_epoch);
        Arc::new(clock)
    }

    /// Moves the clock forward by `by`: monotonic and wall time alike.
    pub fn advance(&self, by: Duration) {
        self.nanos.fetch_add(nanos_of(by), Ordering::SeqCst);
    }

    /// Sets wall time to `since_epoch` without moving monotonic time (a wall clock that
    /// jumps, either way).
    pub fn set_wall(&self, since_epoch: Duration) {
        let mono = self.nanos.load(Ordering::SeqCst);
        self.wall_offset
            .store(nanos_of(since_epoch).wrapping_sub(mono), Ordering::SeqCst);
    }
}

impl Clock for MockClock {
    fn now_nanos(&self) -> u64 {
        self.nanos.fetch_add(1, Ordering::SeqCst) + 1
    }

    fn wall_unix_nanos(&self) -> u64 {
        let mono = self.nanos.load(Ordering::SeqCst);
        self.wall_offset.load(Ordering::SeqCst).wrapping_add(mono)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mock_wall_time_moves_with_advance_and_jumps_when_set() {
        let c = MockClock::new();
        let w0 = c.wall_unix_nanos();
        assert_eq!(w0, nanos_of(MOCK_WALL_START));
        c.advance(Duration::from_secs(3));
        assert_eq!(c.wall_unix_nanos(), w0 + 3_000_000_000);
        let m = c.now_nanos();
        c.set_wall(Duration::from_secs(10));
        assert_eq!(c.wall_unix_ms(), 10_000);
        assert!(
            c.now_nanos() > m,
            "setting the wall clock moved monotonic time back"
        );
        // A wall clock set behind the monotonic reading still reads as set.
        c.advance(Duration::from_secs(100));
        c.set_wall(Duration::from_secs(1));
        assert_eq!(c.wall_unix_ms(), 1_000);
    }

    #[test]
    fn the_system_wall_clock_is_after_2020() {
        let c = SystemClock::new();
        assert!(c.wall_unix_ms() > 1_577_836_800_000);
    }
}
