//! Every counter of a node as one list of samples (`kvtier_core::registry`): the engine's,
//! the SSD tier's recovery report, the cluster metadata plane's and the KV-event
//! publisher's. `/v1/stats` ([`Node::counters`]) and `/metrics` (kvtier-server) both
//! render this one list.

use std::sync::Arc;

use kvtier_core::Engine;
use kvtier_core::registry::{Sample, Samples};
use kvtier_core::stats::CounterKind;
use kvtier_ssd::RecoveryReport;
use parking_lot::Mutex;

use crate::Node;

/// What a node's samples are read from; [`Node::sources`] fills it, and an exporter that
/// outlives no node keeps one.
#[derive(Debug, Clone)]
pub struct Sources {
    /// The engine.
    pub engine: Arc<Engine>,
    /// The SSD tier's last recovery report, if one ran.
    pub recovery: Arc<Mutex<Option<RecoveryReport>>>,
    /// The cluster metadata plane's counters, in cluster mode.
    pub cluster: Option<Arc<kvtier_meta::ClusterStats>>,
    /// The KV-event publisher's counters, where it runs.
    pub kv_events: Option<kvtier_events::StatsReader>,
}

const CLUSTER: &str =
    "The cluster metadata plane: replay, watch, publishing, fencing (docs/cluster.md)";
const KV_EVENTS: &str =
    "The KV-event publisher: epoch, batches, replays, misses, re-listings (docs/kv-events.md)";
const RECOVERY: &str = "What the SSD tier's recovery found at open";

/// Samples of one family with a `what` label per counter, flat names `{prefix}{what}`.
fn by_what(
    out: &mut Samples,
    prefix: &str,
    family: &'static str,
    help: &'static str,
    counters: impl IntoIterator<Item = (&'static str, u64)>,
) {
    for (what, value) in counters {
        out.push(Sample {
            name: format!("{prefix}{what}"),
            family,
            help,
            kind: CounterKind::Gauge,
            labels: vec![("what", what.to_string())],
            value,
        });
    }
}

/// The recovery report's counters, in the order docs/metrics.md lists them.
pub fn recovery_counters(r: &RecoveryReport) -> [(&'static str, u64); 15] {
    [
        ("segments", r.segments),
        ("records", r.records),
        ("dropped_missing", r.dropped_missing),
        ("tombstoned", r.tombstoned),
        ("superseded", r.superseded),
        ("torn_index_bytes", r.torn_index_bytes),
        ("torn_segment_bytes", r.torn_segment_bytes),
        ("rescanned_segments", r.rescanned_segments),
        ("salvaged_records", r.salvaged_records),
        ("damaged_records", r.damaged_records),
        ("damaged_segment_headers", r.damaged_segment_headers),
        ("tombstones_written", r.tombstones_written),
        ("stray_files", r.stray_files),
        ("repairs_failed", r.repairs_failed),
        ("removed_files", r.removed_files),
    ]
}

impl Sources {
    /// Every sample now: the engine's, then the SSD recovery report's (`ssd_recovery_*`),
    /// the cluster plane's (`cluster_*`) and the KV-event publisher's (`kv_events_*`)
    /// where they exist.
    pub fn samples(&self) -> Samples {
        let mut out = self.engine.stats().samples();
        if let Some(r) = self.recovery.lock().clone() {
            by_what(
                &mut out,
                "ssd_recovery_",
                "ssd_recovery",
                RECOVERY,
                recovery_counters(&r),
            );
            out.push(Sample {
                name: "ssd_recovery_milliseconds".to_string(),
                family: "ssd_recovery_milliseconds",
                help: "How long the SSD tier's recovery took",
                kind: CounterKind::Gauge,
                labels: vec![],
                value: r.elapsed.as_millis() as u64,
            });
            for (state, on) in [
                ("clean", r.previous_shutdown_clean == Some(true)),
                ("partial", r.previous_shutdown_clean == Some(false)),
                ("unknown", r.previous_shutdown_clean.is_none()),
            ] {
                out.push(Sample {
                    name: format!("ssd_previous_shutdown_{state}"),
                    family: "ssd_previous_shutdown",
                    help: "How the previous run ended (1 for the state it ended in)",
                    kind: CounterKind::Gauge,
                    labels: vec![("state", state.to_string())],
                    value: u64::from(on),
                });
            }
        }
        if let Some(c) = &self.cluster {
            by_what(&mut out, "cluster_", "cluster", CLUSTER, c.snapshot());
        }
        if let Some(k) = &self.kv_events {
            by_what(
                &mut out,
                "kv_events_",
                "kv_events",
                KV_EVENTS,
                k.read().counters(),
            );
        }
        out
    }
}

impl Node {
    /// What this node's samples are read from.
    pub fn sources(&self) -> Sources {
        Sources {
            engine: self.engine.clone(),
            recovery: self.recovery.clone(),
            cluster: self.cluster.as_ref().map(|c| c.stats().clone()),
            kv_events: self.kv_events.as_ref().map(|k| k.stats_reader()),
        }
    }

    /// Every counter of the node (see [`Sources::samples`]).
    pub fn samples(&self) -> Samples {
        self.sources().samples()
    }
}
