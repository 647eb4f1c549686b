//! Every counter of a node as one list of samples (`kvtier_core::registry`): the engine's,
//! the SSD tier's recovery report, the cluster metadata plane's and the KV-event
//! publisher's, each declared next to its owner (`EngineStats::samples`,
//! `RecoveryReport::samples` in kvtier-ssd, `ClusterStats::samples` in kvtier-meta,
//! `PublisherStats::samples` in kvtier-events). `/v1/stats` ([`Node::counters`]) and
//! `/metrics` (kvtier-server) both render this one list.

use std::sync::Arc;

use kvtier_core::Engine;
use kvtier_core::registry::Samples;
use kvtier_ssd::RecoveryReport;
use parking_lot::Mutex;

use crate::Node;

/// What a node's samples are read from; [`Node::sources`] fills it.
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

impl Sources {
    /// Every sample now: the engine's, then the SSD recovery report's (`ssd_recovery_*`,
    /// `ssd_previous_shutdown_*`), the cluster plane's (`cluster_*`) and the KV-event
    /// publisher's (`kv_events_*`) where they exist.
    pub fn samples(&self) -> Samples {
        let mut out = self.engine.stats().samples();
        if let Some(r) = self.recovery.lock().as_ref() {
            out.extend(r.samples());
        }
        if let Some(c) = &self.cluster {
            out.extend(c.samples());
        }
        if let Some(k) = &self.kv_events {
            out.extend(k.read().samples());
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
