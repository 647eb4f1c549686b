//! What the metadata plane counts (docs/metrics.md, `kvtier_cluster_*`).

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of one replica's metadata plane.
#[derive(Debug, Default)]
pub struct ClusterStats {
    /// Records read by full reads (start and resyncs).
    pub replay_records: AtomicU64,
    /// Milliseconds the first full read and its adoption took.
    pub replay_ms: AtomicU64,
    /// Resyncs after a watch was cancelled because its revision was compacted.
    pub resyncs_compacted: AtomicU64,
    /// Watches resumed after a broken stream.
    pub watch_resumes: AtomicU64,
    /// Advertisements adopted from the watch.
    pub adverts_applied: AtomicU64,
    /// Withdrawals applied from the watch.
    pub withdrawals_applied: AtomicU64,
    /// Records that could not be used (malformed, unknown endpoint, refused by the tier).
    pub records_refused: AtomicU64,
    /// Advertisements published by this replica.
    pub published: AtomicU64,
    /// Publishes that found another replica's advertisement (or a tombstone) for the run,
    /// or a tombstone for the state: this replica's object was deleted (a state's goes
    /// with the tombstone's).
    pub publish_lost: AtomicU64,
    /// Publishes and deletes refused because this replica's lease or generation was no
    /// longer current.
    pub fenced: AtomicU64,
    /// Advertisements dropped because the queue was full.
    pub publish_dropped: AtomicU64,
    /// Transactions that advertised runs (`published` / this is the records per
    /// transaction the batching reached).
    pub publish_transactions: AtomicU64,
    /// Publish attempts that failed (etcd unreachable) and were retried.
    pub publish_retries: AtomicU64,
    /// Last advertise lag seen on this replica (record written → applied), milliseconds.
    pub advertise_lag_ms: AtomicU64,
    /// Registrations (each a new generation).
    pub registrations: AtomicU64,
    /// Advertisements this replica withdrew (tombstones written), any reason.
    pub gc_tombstones: AtomicU64,
    /// Withdrawn objects this replica deleted after their grace window.
    pub gc_deleted: AtomicU64,
    /// Their bytes.
    pub gc_bytes: AtomicU64,
    /// Deletes refused because another replica owns the object.
    pub deletes_refused: AtomicU64,
    /// Times this replica became GC leader.
    pub leader_changes: AtomicU64,
    /// Objects the leader withdrew because their owner was gone too long.
    pub orphans_reclaimed: AtomicU64,
    /// Objects the leader withdrew because their namespace was over budget.
    pub budget_evictions: AtomicU64,
    /// 1 while this replica is GC leader.
    pub is_leader: AtomicU64,
    /// State objects (snapshots, checkpoints) this replica advertised.
    pub states_published: AtomicU64,
    /// State advertisements this replica serves from (read at start or from the watch).
    pub states_adopted: AtomicU64,
}

impl ClusterStats {
    /// Every counter as registry samples (`kvtier_core::registry`): flat names
    /// `cluster_{name}`, family `cluster` with a `what` label.
    pub fn samples(&self) -> kvtier_core::registry::Samples {
        let mut out = kvtier_core::registry::Samples::default();
        out.by_what(
            "cluster_",
            "cluster",
            "The cluster metadata plane: replay, watch, publishing, fencing (docs/cluster.md)",
            kvtier_core::stats::CounterKind::Gauge,
            self.snapshot(),
        );
        out
    }

    /// `(name, value)` of every counter, in declaration order.
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        vec![
            ("replay_records", g(&self.replay_records)),
            ("replay_ms", g(&self.replay_ms)),
            ("resyncs_compacted", g(&self.resyncs_compacted)),
            ("watch_resumes", g(&self.watch_resumes)),
            ("adverts_applied", g(&self.adverts_applied)),
            ("withdrawals_applied", g(&self.withdrawals_applied)),
            ("records_refused", g(&self.records_refused)),
            ("published", g(&self.published)),
            ("publish_lost", g(&self.publish_lost)),
            ("fenced", g(&self.fenced)),
            ("publish_dropped", g(&self.publish_dropped)),
            ("publish_retries", g(&self.publish_retries)),
            ("publish_transactions", g(&self.publish_transactions)),
            ("advertise_lag_ms", g(&self.advertise_lag_ms)),
            ("registrations", g(&self.registrations)),
            ("gc_tombstones", g(&self.gc_tombstones)),
            ("gc_deleted", g(&self.gc_deleted)),
            ("gc_bytes", g(&self.gc_bytes)),
            ("deletes_refused", g(&self.deletes_refused)),
            ("leader_changes", g(&self.leader_changes)),
            ("orphans_reclaimed", g(&self.orphans_reclaimed)),
            ("budget_evictions", g(&self.budget_evictions)),
            ("is_leader", g(&self.is_leader)),
            ("states_published", g(&self.states_published)),
            ("states_adopted", g(&self.states_adopted)),
        ]
    }
}

/// Adds one.
pub(crate) fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// Adds `n`.
pub(crate) fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}
