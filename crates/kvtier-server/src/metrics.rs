//! `GET /metrics`: Prometheus text exposition of every engine counter (read from the
//! engine at scrape time, so they can never drift from `GET /v1/stats`) and request
//! latency histograms per endpoint. docs/metrics.md lists every family.

use std::sync::{Arc, Weak};
use std::time::Duration;

use kvtier_core::Engine;
use kvtier_core::events::ObserverStats;
use kvtier_core::stats::{
    Counter, CounterKind, EngineCounters, EngineStats, IndexStats, SnapshotStats, StateStats,
    TierStats,
};
use kvtier_core::tier::writer::WriterStats;
use kvtier_ssd::RecoveryReport;
use parking_lot::Mutex;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

type Labels = Vec<(&'static str, String)>;

/// Request latency histograms, and the registry that also reads the engine's counters.
pub struct Metrics {
    latency: Family<Labels, Histogram>,
    registry: Mutex<Option<Registry>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Empty histograms; [`Metrics::attach`] connects the engine.
    pub fn new() -> Self {
        Self {
            latency: Family::new_with_constructor(|| {
                // 25 µs to about 13 s.
                Histogram::new(exponential_buckets(25e-6, 2.0, 20))
            }),
            registry: Mutex::new(None),
        }
    }

    /// Builds the registry over `engine` and the SSD recovery report slot.
    pub fn attach(
        &self,
        engine: &Arc<Engine>,
        recovery: Arc<Mutex<Option<RecoveryReport>>>,
        cluster: Option<Arc<kvtier_meta::ClusterStats>>,
        kv_events: Option<kvtier_events::StatsReader>,
    ) {
        let mut registry = Registry::with_prefix("kvtier");
        registry.register(
            "request_duration_seconds",
            "Time from request to response headers, by endpoint and status class",
            self.latency.clone(),
        );
        registry.register_collector(Box::new(EngineCollector {
            engine: Arc::downgrade(engine),
            recovery,
            cluster,
            kv_events,
        }));
        *self.registry.lock() = Some(registry);
    }

    /// Records one request.
    pub fn observe(&self, endpoint: String, status: u16, took: Duration) {
        let class = format!("{}xx", status / 100);
        self.latency
            .get_or_create(&vec![("endpoint", endpoint), ("status", class)])
            .observe(took.as_secs_f64());
    }

    /// The exposition text.
    pub fn render(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        if let Some(registry) = self.registry.lock().as_ref() {
            prometheus_client::encoding::text::encode(&mut out, registry)?;
        }
        Ok(out)
    }
}

/// Reads the engine's counters at every scrape.
#[derive(Debug)]
struct EngineCollector {
    engine: Weak<Engine>,
    recovery: Arc<Mutex<Option<RecoveryReport>>>,
    cluster: Option<Arc<kvtier_meta::ClusterStats>>,
    kv_events: Option<kvtier_events::StatsReader>,
}

/// Metric families collected from the counter tables, in first-seen order, then written
/// out once each.
#[derive(Default)]
struct Families {
    list: Vec<MetricFamily>,
}

/// One family: its name, help, type and series.
struct MetricFamily {
    name: String,
    help: &'static str,
    kind: CounterKind,
    series: Vec<(Labels, u64)>,
}

impl Families {
    /// One series of family `family`.
    fn push(
        &mut self,
        family: &str,
        help: &'static str,
        kind: CounterKind,
        labels: Labels,
        value: u64,
    ) {
        match self.list.iter_mut().find(|f| f.name == family) {
            Some(f) => f.series.push((labels, value)),
            None => self.list.push(MetricFamily {
                name: family.to_string(),
                help,
                kind,
                series: vec![(labels, value)],
            }),
        }
    }

    /// Every counter of `table`, read from `stats`, with the labels `base` plus its own.
    fn add<S>(&mut self, table: &[Counter<S>], stats: &S, base: &Labels) {
        for c in table {
            let mut labels = base.clone();
            if let Some((k, v)) = c.label {
                labels.push((k, v.to_string()));
            }
            self.push(c.family, c.help, c.kind, labels, (c.read)(stats));
        }
    }

    /// Every series of one gauge family.
    fn gauges(&mut self, family: &str, help: &'static str, series: Vec<(Labels, u64)>) {
        for (labels, v) in series {
            self.push(family, help, CounterKind::Gauge, labels, v);
        }
    }

    fn write(self, enc: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for MetricFamily {
            name,
            help,
            kind,
            series,
        } in self.list
        {
            let kind = match kind {
                CounterKind::Counter => MetricType::Counter,
                CounterKind::Gauge => MetricType::Gauge,
            };
            let mut m = enc.encode_descriptor(&name, help, None, kind)?;
            for (labels, v) in series {
                let fam = m.encode_family(&labels)?;
                match kind {
                    MetricType::Counter => ConstCounter::new(v).encode(fam)?,
                    _ => ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX)).encode(fam)?,
                }
            }
        }
        Ok(())
    }
}

fn l(pairs: &[(&'static str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| (*k, (*v).to_string())).collect()
}

/// Every engine counter, from the tables the engine declares them in: per attached tier
/// (label `tier`, the tier's true name), movement by true source and destination, then the
/// index, the engine and the snapshot bucket.
fn engine_families(s: &EngineStats, out: &mut Families) {
    for (kind, t) in s.tiers() {
        out.add(TierStats::COUNTERS, t, &l(&[("tier", kind.name())]));
    }
    for lower in &s.lower {
        out.add(
            WriterStats::COUNTERS,
            &lower.writer,
            &l(&[("tier", lower.kind.name())]),
        );
    }
    for m in &s.moves {
        let (from, to) = (m.from.name(), m.to.name());
        if m.from > m.to {
            out.push(
                "promotions",
                "Blocks read from a slower tier and promoted into a faster one, by source and destination",
                CounterKind::Counter,
                l(&[("from", from), ("to", to)]),
                m.promoted,
            );
        } else {
            for (outcome, v) in [
                ("queued", m.demotions_queued),
                ("dropped", m.demotions_dropped),
            ] {
                out.push(
                    "demotions",
                    "Blocks a faster tier evicted towards a slower one, by outcome",
                    CounterKind::Counter,
                    l(&[("from", from), ("to", to), ("outcome", outcome)]),
                    v,
                );
            }
        }
    }
    out.add(IndexStats::COUNTERS, &s.index, &vec![]);
    out.add(EngineCounters::COUNTERS, &s.engine, &vec![]);
    // Exact-prefix snapshots and checkpoints share the families, told apart by `bucket`.
    out.add(
        SnapshotStats::COUNTERS,
        &s.snapshot,
        &l(&[("bucket", "exact")]),
    );
    out.add(
        SnapshotStats::COUNTERS,
        &s.checkpoint,
        &l(&[("bucket", "checkpoint")]),
    );
    out.add(StateStats::COUNTERS, &s.state, &vec![]);
    for o in &s.observers {
        out.add(ObserverStats::COUNTERS, o, &l(&[("observer", &o.name)]));
    }
}

impl Collector for EngineCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(engine) = self.engine.upgrade() else {
            return Ok(());
        };
        let mut w = Families::default();
        engine_families(&engine.stats(), &mut w);
        if let Some(c) = &self.cluster {
            // One family, the counter's name as a label (docs/metrics.md).
            let series = c
                .snapshot()
                .into_iter()
                .map(|(what, v)| (l(&[("what", what)]), v))
                .collect();
            w.gauges(
                "cluster",
                "The cluster metadata plane: replay, watch, publishing, fencing (docs/cluster.md)",
                series,
            );
        }
        if let Some(k) = &self.kv_events {
            let series = k
                .read()
                .counters()
                .into_iter()
                .map(|(what, v)| (l(&[("what", what)]), v))
                .collect();
            w.gauges(
                "kv_events",
                "The KV-event publisher: epoch, batches, replays, misses, re-listings (docs/kv-events.md)",
                series,
            );
        }
        // Recovery of the SSD tier last opened.
        if let Some(r) = self.recovery.lock().clone() {
            let series: Vec<(Labels, u64)> = [
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
            .into_iter()
            .map(|(what, v)| (l(&[("what", what)]), v))
            .collect();
            w.gauges(
                "ssd_recovery",
                "What the SSD tier's recovery found at open",
                series,
            );
            w.gauges(
                "ssd_recovery_milliseconds",
                "How long the SSD tier's recovery took",
                vec![(vec![], r.elapsed.as_millis() as u64)],
            );
            w.gauges(
                "ssd_previous_shutdown",
                "How the previous run ended (1 for the state it ended in)",
                vec![
                    (
                        l(&[("state", "clean")]),
                        u64::from(r.previous_shutdown_clean == Some(true)),
                    ),
                    (
                        l(&[("state", "partial")]),
                        u64::from(r.previous_shutdown_clean == Some(false)),
                    ),
                    (
                        l(&[("state", "unknown")]),
                        u64::from(r.previous_shutdown_clean.is_none()),
                    ),
                ],
            );
        }
        // Refusals: 4xx answers by code, connections closed by a limit by kind.
        let refused: Vec<(Labels, u64)> = crate::listen::refusals::REFUSALS
            .totals()
            .into_iter()
            .map(|(kind, n)| (l(&[("kind", kind)]), n))
            .collect();
        for (labels, n) in refused {
            w.push(
                "refused",
                "Requests refused (by error code) and connections closed by a limit (by kind)",
                CounterKind::Counter,
                labels,
                n,
            );
        }
        w.write(&mut enc)
    }
}
