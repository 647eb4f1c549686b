//! What the metadata plane counts (docs/metrics.md, `kvtier_cluster_*`): the counters and
//! their table ([`ClusterStats::COUNTERS`]), which `/v1/stats` and `/metrics` both render.

use std::sync::atomic::{AtomicU64, Ordering};

use kvtier_core::stats::Counter;
use kvtier_core::stats::CounterKind::{Counter as C, Gauge as G};

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
    /// Records refused because they were not signed with the cluster's signing key
    /// (shared with the keys' [`crate::signed::RecordSigning`], which counts them).
    pub records_forged: std::sync::Arc<AtomicU64>,
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
    /// Objects the leader withdrew because their layout was deleted.
    pub deleted_withdrawn: AtomicU64,
    /// Layout deletes this replica asked the cluster for (delete markers written).
    pub layout_deletes: AtomicU64,
    /// Layout deletes (markers) this replica applied to its own tiers.
    pub layout_deletes_applied: AtomicU64,
    /// 1 while this replica is GC leader.
    pub is_leader: AtomicU64,
    /// State objects (snapshots, checkpoints) this replica advertised.
    pub states_published: AtomicU64,
    /// State advertisements this replica serves from (read at start or from the watch).
    pub states_adopted: AtomicU64,
}

impl ClusterStats {
    /// Every counter of the metadata plane, declared once: flat name `cluster_{name}` in
    /// `/v1/stats`, family `cluster_{name}` in `/metrics` (`_total` for a counter). Only
    /// three are levels rather than counts: the first replay's duration, the last
    /// advertise lag and the leader flag.
    #[rustfmt::skip]
    pub const COUNTERS: &'static [Counter<ClusterStats>] = &[
        Counter { name: "replay_records", family: "cluster_replay_records", label: None, help: "Records read by full reads (start and resyncs)", kind: C, read: |s| get(&s.replay_records) },
        Counter { name: "replay_ms", family: "cluster_replay_milliseconds", label: None, help: "How long the first full read and its adoption took", kind: G, read: |s| get(&s.replay_ms) },
        Counter { name: "resyncs_compacted", family: "cluster_resyncs_compacted", label: None, help: "Full resyncs after a watch's revision was compacted", kind: C, read: |s| get(&s.resyncs_compacted) },
        Counter { name: "watch_resumes", family: "cluster_watch_resumes", label: None, help: "Watches resumed after a broken stream", kind: C, read: |s| get(&s.watch_resumes) },
        Counter { name: "adverts_applied", family: "cluster_adverts_applied", label: None, help: "Advertisements adopted from the watch", kind: C, read: |s| get(&s.adverts_applied) },
        Counter { name: "withdrawals_applied", family: "cluster_withdrawals_applied", label: None, help: "Withdrawals applied from the watch", kind: C, read: |s| get(&s.withdrawals_applied) },
        Counter { name: "records_refused", family: "cluster_records_refused", label: None, help: "Records not adopted (malformed, unknown endpoint, refused by the tier)", kind: C, read: |s| get(&s.records_refused) },
        Counter { name: "records_forged", family: "cluster_records_forged", label: None, help: "Records refused for lacking the cluster's signature", kind: C, read: |s| get(&s.records_forged) },
        Counter { name: "published", family: "cluster_published", label: None, help: "Advertisements this replica published", kind: C, read: |s| get(&s.published) },
        Counter { name: "publish_lost", family: "cluster_publish_lost", label: None, help: "Publishes that found the run or state already taken or withdrawn", kind: C, read: |s| get(&s.publish_lost) },
        Counter { name: "fenced", family: "cluster_fenced", label: None, help: "Publishes and deletes refused because this replica's lease or generation was stale", kind: C, read: |s| get(&s.fenced) },
        Counter { name: "publish_dropped", family: "cluster_publish_dropped", label: None, help: "Advertisements dropped from a full queue", kind: C, read: |s| get(&s.publish_dropped) },
        Counter { name: "publish_retries", family: "cluster_publish_retries", label: None, help: "Publish attempts that failed and were retried", kind: C, read: |s| get(&s.publish_retries) },
        Counter { name: "publish_transactions", family: "cluster_publish_transactions", label: None, help: "Transactions that advertised runs", kind: C, read: |s| get(&s.publish_transactions) },
        Counter { name: "advertise_lag_ms", family: "cluster_advertise_lag_milliseconds", label: None, help: "The last record's lag from written to applied here", kind: G, read: |s| get(&s.advertise_lag_ms) },
        Counter { name: "registrations", family: "cluster_registrations", label: None, help: "Registrations of this replica (each a new generation)", kind: C, read: |s| get(&s.registrations) },
        Counter { name: "gc_tombstones", family: "cluster_gc_tombstones", label: None, help: "Advertisements this replica withdrew", kind: C, read: |s| get(&s.gc_tombstones) },
        Counter { name: "gc_deleted", family: "cluster_gc_deleted", label: None, help: "Withdrawn objects deleted after their grace window", kind: C, read: |s| get(&s.gc_deleted) },
        Counter { name: "gc_bytes", family: "cluster_gc_bytes", label: None, help: "Bytes of the withdrawn objects deleted", kind: C, read: |s| get(&s.gc_bytes) },
        Counter { name: "deletes_refused", family: "cluster_deletes_refused", label: None, help: "Deletes refused because another replica owns the object", kind: C, read: |s| get(&s.deletes_refused) },
        Counter { name: "leader_changes", family: "cluster_leader_changes", label: None, help: "Times this replica became GC leader", kind: C, read: |s| get(&s.leader_changes) },
        Counter { name: "orphans_reclaimed", family: "cluster_orphans_reclaimed", label: None, help: "Objects the leader withdrew because their owner was gone too long", kind: C, read: |s| get(&s.orphans_reclaimed) },
        Counter { name: "budget_evictions", family: "cluster_budget_evictions", label: None, help: "Objects the leader withdrew because their namespace was over budget", kind: C, read: |s| get(&s.budget_evictions) },
        Counter { name: "deleted_withdrawn", family: "cluster_deleted_withdrawn", label: None, help: "Objects the leader withdrew because their layout was deleted", kind: C, read: |s| get(&s.deleted_withdrawn) },
        Counter { name: "layout_deletes", family: "cluster_layout_deletes", label: None, help: "Layout deletes this replica asked the cluster for (delete markers written)", kind: C, read: |s| get(&s.layout_deletes) },
        Counter { name: "layout_deletes_applied", family: "cluster_layout_deletes_applied", label: None, help: "Layout deletes this replica applied to its own tiers", kind: C, read: |s| get(&s.layout_deletes_applied) },
        Counter { name: "is_leader", family: "cluster_is_leader", label: None, help: "1 while this replica is GC leader", kind: G, read: |s| get(&s.is_leader) },
        Counter { name: "states_published", family: "cluster_states_published", label: None, help: "State objects (snapshots, checkpoints) this replica advertised", kind: C, read: |s| get(&s.states_published) },
        Counter { name: "states_adopted", family: "cluster_states_adopted", label: None, help: "State advertisements this replica adopted to serve from", kind: C, read: |s| get(&s.states_adopted) },
    ];

    /// Every counter as registry samples (`kvtier_core::registry`), from [`Self::COUNTERS`].
    pub fn samples(&self) -> kvtier_core::registry::Samples {
        let mut out = kvtier_core::registry::Samples::default();
        out.table(Self::COUNTERS, "cluster", self, &[]);
        out
    }

    /// `(name, value)` of every counter, in declaration order (names without the
    /// `cluster_` prefix).
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        Self::COUNTERS
            .iter()
            .map(|c| (c.name, (c.read)(self)))
            .collect()
    }
}

fn get(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

/// Adds one.
pub(crate) fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// Adds `n`.
pub(crate) fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}
