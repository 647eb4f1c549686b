//! `GET /metrics`: Prometheus text exposition of every engine counter (read from the
//! engine at scrape time, so they can never drift from `GET /v1/stats`) and request
//! latency histograms per endpoint. docs/metrics.md lists every family.

use std::sync::{Arc, Weak};
use std::time::Duration;

use kvtier_core::Engine;
use kvtier_core::stats::{EngineStats, TierStats};
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
    pub fn attach(&self, engine: &Arc<Engine>, recovery: Arc<Mutex<Option<RecoveryReport>>>) {
        let mut registry = Registry::with_prefix("kvtier");
        registry.register(
            "request_duration_seconds",
            "Time from request to response headers, by endpoint and status class",
            self.latency.clone(),
        );
        registry.register_collector(Box::new(EngineCollector {
            engine: Arc::downgrade(engine),
            recovery,
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
}

/// One metric family being written.
struct FamilyWriter<'a, 'b> {
    enc: &'a mut DescriptorEncoder<'b>,
}

impl FamilyWriter<'_, '_> {
    fn write(
        &mut self,
        name: &str,
        help: &str,
        kind: MetricType,
        series: &[(Labels, u64)],
    ) -> Result<(), std::fmt::Error> {
        let mut m = self.enc.encode_descriptor(name, help, None, kind)?;
        for (labels, v) in series {
            let fam = m.encode_family(labels)?;
            match kind {
                MetricType::Counter => ConstCounter::new(*v).encode(fam)?,
                _ => ConstGauge::new(i64::try_from(*v).unwrap_or(i64::MAX)).encode(fam)?,
            }
        }
        Ok(())
    }

    fn counter(
        &mut self,
        name: &str,
        help: &str,
        series: &[(Labels, u64)],
    ) -> Result<(), std::fmt::Error> {
        self.write(name, help, MetricType::Counter, series)
    }

    fn gauge(
        &mut self,
        name: &str,
        help: &str,
        series: &[(Labels, u64)],
    ) -> Result<(), std::fmt::Error> {
        self.write(name, help, MetricType::Gauge, series)
    }
}

fn l(pairs: &[(&'static str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| (*k, (*v).to_string())).collect()
}

/// The per-tier series of one field.
fn per_tier(s: &EngineStats, f: impl Fn(&TierStats) -> u64) -> Vec<(Labels, u64)> {
    let mut out = vec![(l(&[("tier", "ram")]), f(&s.ram))];
    if let Some(ssd) = &s.ssd {
        out.push((l(&[("tier", "ssd")]), f(ssd)));
    }
    out
}

impl Collector for EngineCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(engine) = self.engine.upgrade() else {
            return Ok(());
        };
        let s = engine.stats();
        let mut w = FamilyWriter { enc: &mut enc };
        // Tiers.
        w.counter(
            "tier_hits",
            "Loads a tier answered",
            &per_tier(&s, |t| t.hits),
        )?;
        w.counter(
            "tier_misses",
            "Loads a tier could not answer",
            &per_tier(&s, |t| t.misses),
        )?;
        w.counter(
            "tier_stores",
            "Blocks a tier admitted",
            &per_tier(&s, |t| t.stores),
        )?;
        w.counter(
            "tier_dedup_skips",
            "Puts of a block already held",
            &per_tier(&s, |t| t.dedup_skips),
        )?;
        w.counter(
            "tier_io_errors",
            "Failed reads and writes (disk full included)",
            &per_tier(&s, |t| t.io_errors),
        )?;
        let mut rejected = Vec::new();
        let mut evictions = Vec::new();
        for (tier, t) in std::iter::once(("ram", &s.ram)).chain(s.ssd.as_ref().map(|t| ("ssd", t)))
        {
            for (reason, v) in [
                ("no_space", t.rejected_no_space),
                ("parent_missing", t.rejected_parent_missing),
                ("collision", t.rejected_collision),
                ("quarantined", t.rejected_quarantined),
            ] {
                rejected.push((l(&[("tier", tier), ("reason", reason)]), v));
            }
            for (cause, v) in [
                ("budget", t.evictions.budget),
                ("ttl", t.evictions.ttl),
                ("explicit", t.evictions.explicit),
                ("corrupt", t.evictions.corrupt),
            ] {
                evictions.push((l(&[("tier", tier), ("cause", cause)]), v));
            }
        }
        w.counter("tier_rejected", "Puts a tier refused, by reason", &rejected)?;
        w.counter(
            "tier_evictions",
            "Blocks a tier removed, by cause",
            &evictions,
        )?;
        w.gauge(
            "tier_resident_blocks",
            "Blocks held now",
            &per_tier(&s, |t| t.resident_blocks),
        )?;
        w.gauge(
            "tier_resident_bytes",
            "Payload bytes held now",
            &per_tier(&s, |t| t.resident_bytes),
        )?;
        w.gauge(
            "tier_capacity_bytes",
            "Byte capacity",
            &per_tier(&s, |t| t.capacity_bytes),
        )?;
        // Movement between tiers.
        w.counter(
            "promotions",
            "Blocks read from a lower tier and promoted, by source and destination",
            &[(l(&[("from", "ssd"), ("to", "ram")]), s.promotions)],
        )?;
        w.counter(
            "demotions",
            "Blocks RAM evicted towards a lower tier, by outcome",
            &[
                (
                    l(&[("from", "ram"), ("to", "ssd"), ("outcome", "queued")]),
                    s.demotions_queued,
                ),
                (
                    l(&[("from", "ram"), ("to", "ssd"), ("outcome", "dropped")]),
                    s.demotions_dropped,
                ),
            ],
        )?;
        w.counter(
            "prefetch_blocks",
            "Blocks read ahead after a lookup, and those a load then used",
            &[
                (l(&[("outcome", "prefetched")]), s.prefetched),
                (l(&[("outcome", "used")]), s.prefetch_used),
            ],
        )?;
        w.counter(
            "prefetch_skipped",
            "Lookups whose prefetch was skipped (queue full)",
            &[(vec![], s.prefetch_skipped)],
        )?;
        // Index.
        let i = &s.index;
        w.counter("index_lookups", "Lookups served", &[(vec![], i.lookups)])?;
        w.counter(
            "index_lookup_results",
            "Lookups by result",
            &[
                (l(&[("result", "hit")]), i.lookup_hits),
                (l(&[("result", "miss")]), i.lookup_misses),
            ],
        )?;
        w.counter(
            "index_matched_blocks",
            "Blocks matched over all lookups",
            &[(vec![], i.matched_blocks)],
        )?;
        w.counter(
            "index_verify_mismatches",
            "Hash matches whose tokens, parent or layout differed (never served)",
            &[(vec![], i.verify_mismatches)],
        )?;
        w.gauge(
            "index_entries",
            "Blocks the prefix index knows",
            &[(vec![], i.entries)],
        )?;
        // Writer.
        if let Some(wr) = &s.writer {
            let outcomes: Vec<(Labels, u64)> = wr
                .counters()
                .into_iter()
                .filter(|(n, _)| n != "writer_queue_depth")
                .map(|(n, v)| {
                    let outcome = n.trim_start_matches("writer_").to_string();
                    (vec![("outcome", outcome)], v)
                })
                .collect();
            w.counter("writer_outcomes", "SSD write queue outcomes", &outcomes)?;
            w.gauge(
                "writer_queue_depth",
                "Blocks waiting in the SSD write queue",
                &[(vec![], wr.queue_depth)],
            )?;
        }
        // Snapshots.
        let sn = &s.snapshot;
        w.counter(
            "snapshot_gets",
            "Snapshot gets by result",
            &[
                (l(&[("result", "hit")]), sn.hits),
                (l(&[("result", "miss")]), sn.misses),
            ],
        )?;
        w.counter(
            "snapshot_stores",
            "Snapshots stored",
            &[(vec![], sn.stores)],
        )?;
        w.counter(
            "snapshot_rejected",
            "Snapshot puts refused",
            &[(vec![], sn.rejected)],
        )?;
        w.counter(
            "snapshot_evictions",
            "Snapshots dropped, by cause",
            &[
                (l(&[("cause", "entries")]), sn.evictions_entries),
                (l(&[("cause", "bytes")]), sn.evictions_bytes),
                (l(&[("cause", "ttl")]), sn.evictions_ttl),
            ],
        )?;
        w.gauge(
            "snapshot_resident_entries",
            "Snapshots held",
            &[(vec![], sn.resident_entries)],
        )?;
        w.gauge(
            "snapshot_resident_bytes",
            "Snapshot bytes held",
            &[(vec![], sn.resident_bytes)],
        )?;
        w.gauge(
            "memory_used_bytes",
            "Shared RAM budget in use",
            &[(vec![], s.memory_used_bytes)],
        )?;
        w.gauge(
            "memory_capacity_bytes",
            "Shared RAM budget",
            &[(vec![], s.memory_capacity_bytes)],
        )?;
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
            w.gauge(
                "ssd_recovery",
                "What the SSD tier's recovery found at open",
                &series,
            )?;
            w.gauge(
                "ssd_recovery_milliseconds",
                "How long the SSD tier's recovery took",
                &[(vec![], r.elapsed.as_millis() as u64)],
            )?;
            w.gauge(
                "ssd_previous_shutdown",
                "How the previous run ended (1 for the state it ended in)",
                &[
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
            )?;
        }
        // Refusals: 4xx answers by code, connections closed by a limit by kind.
        let refused: Vec<(Labels, u64)> = crate::listen::refusals::REFUSALS
            .totals()
            .into_iter()
            .map(|(kind, n)| (l(&[("kind", kind)]), n))
            .collect();
        w.counter(
            "refused",
            "Requests refused (by error code) and connections closed by a limit (by kind)",
            &refused,
        )?;
        Ok(())
    }
}
