//! What the shared arena counts (docs/metrics.md, `kvtier_shm_*`): one table, rendered by
//! `/v1/stats` and `/metrics` with the edge's other samples. Process-wide, like the
//! listener's refusals: one server per process.

use std::sync::atomic::{AtomicU64, Ordering};

use kvtier_core::stats::Counter;
use kvtier_core::stats::CounterKind::{Counter as C, Gauge as G};

/// The shared arena's counters.
#[derive(Debug, Default)]
pub struct ShmStats {
    /// Clients connected now (past their hello).
    pub clients: AtomicU64,
    /// Bytes of blocks leased to clients now.
    pub leased_bytes: AtomicU64,
    /// Bytes of blocks reserved and not yet committed now.
    pub reserved_bytes: AtomicU64,
    /// Leases granted.
    pub leases: AtomicU64,
    /// Commits (or parts of one) whose blocks were stored.
    pub commits: AtomicU64,
    /// Their bytes.
    pub committed_bytes: AtomicU64,
    /// Commits refused (a wrong checksum, size or offset, a reservation not held, another
    /// client's, a second commit, an expired one).
    pub refused_commits: AtomicU64,
    /// Reservations freed because their commit did not come in time.
    pub expired: AtomicU64,
}

/// The server's shared-arena counters.
pub static SHM: ShmStats = ShmStats::new();

fn get(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

impl ShmStats {
    const fn new() -> Self {
        Self {
            clients: AtomicU64::new(0),
            leased_bytes: AtomicU64::new(0),
            reserved_bytes: AtomicU64::new(0),
            leases: AtomicU64::new(0),
            commits: AtomicU64::new(0),
            committed_bytes: AtomicU64::new(0),
            refused_commits: AtomicU64::new(0),
            expired: AtomicU64::new(0),
        }
    }

    /// Every counter, declared once: flat name `shm_{name}` in `/v1/stats`, family
    /// `shm_{name}` in `/metrics` (`_total` for a counter).
    #[rustfmt::skip]
    pub const COUNTERS: &'static [Counter<ShmStats>] = &[
        Counter { name: "clients", family: "shm_clients", label: None, help: "Local clients connected to the shared arena", kind: G, read: |s| get(&s.clients) },
        Counter { name: "leased_bytes", family: "shm_leased_bytes", label: None, help: "Bytes of blocks leased to local clients", kind: G, read: |s| get(&s.leased_bytes) },
        Counter { name: "reserved_bytes", family: "shm_reserved_bytes", label: None, help: "Bytes reserved for stores not yet committed", kind: G, read: |s| get(&s.reserved_bytes) },
        Counter { name: "leases", family: "shm_leases", label: None, help: "Leases granted", kind: C, read: |s| get(&s.leases) },
        Counter { name: "commits", family: "shm_commits", label: None, help: "Commits (or parts of one) stored", kind: C, read: |s| get(&s.commits) },
        Counter { name: "committed_bytes", family: "shm_committed_bytes", label: None, help: "Bytes of the commits stored", kind: C, read: |s| get(&s.committed_bytes) },
        Counter { name: "refused_commits", family: "shm_refused_commits", label: None, help: "Commits refused (checksum, size, offset, not held, another client's, doubled, expired)", kind: C, read: |s| get(&s.refused_commits) },
        Counter { name: "expired", family: "shm_expired", label: None, help: "Reservations freed because their commit did not come in time", kind: C, read: |s| get(&s.expired) },
    ];

    /// Every counter as registry samples.
    pub fn samples(&self) -> kvtier_core::registry::Samples {
        let mut out = kvtier_core::registry::Samples::default();
        out.table(Self::COUNTERS, "shm", self, &[]);
        out
    }

    pub(super) fn add(a: &AtomicU64, n: u64) {
        a.fetch_add(n, Ordering::Relaxed);
    }

    pub(super) fn sub(a: &AtomicU64, n: u64) {
        // Never below zero, whatever the order of updates.
        let _ = a.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
            Some(v.saturating_sub(n))
        });
    }
}
