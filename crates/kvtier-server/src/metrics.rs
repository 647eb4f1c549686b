//! `GET /metrics`: Prometheus text exposition of every counter of the node (read at scrape
//! time from the one sample list `GET /v1/stats` renders too — `kvtier_node::registry` —
//! so the two can never drift apart) and request latency histograms per endpoint.
//! docs/metrics.md lists every family; a test holds the two to each other.

use std::sync::Arc;
use std::time::Duration;

use kvtier_core::Engine;
use kvtier_core::registry::Samples;
use kvtier_core::stats::CounterKind;
use kvtier_node::registry::Sources;
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

type Labels = kvtier_core::registry::Labels;

/// One family being written: name, help, type and series.
type Written = (&'static str, &'static str, CounterKind, Vec<(Labels, u64)>);

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
        registry.register_collector(Box::new(NodeCollector {
            sources: Sources {
                engine: engine.clone(),
                recovery,
                cluster,
                kv_events,
            },
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

/// Reads the node's samples at every scrape.
#[derive(Debug)]
struct NodeCollector {
    sources: Sources,
}

/// The edge's own samples: refusals, 4xx answers by code and connections closed by a
/// limit by kind (flat names `refused_{kind}`, `kvtier_listen::refusals`), and the
/// shared arena's (`shm_*`). `/v1/stats` adds them to the node's.
pub fn edge_samples() -> Samples {
    let mut out = crate::listen::refusals::REFUSALS.samples();
    out.extend(crate::shm::SHM.samples());
    out
}

/// Every sample of the node and the edge: what both `/v1/stats` and `/metrics` render.
pub fn all_samples(sources: &Sources) -> Samples {
    let mut out = sources.samples();
    out.extend(edge_samples());
    out
}

/// Writes `samples` as metric families, each once, in first-seen order.
pub fn encode(samples: Samples, enc: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
    let mut families: Vec<Written> = Vec::new();
    for s in samples {
        match families.iter_mut().find(|f| f.0 == s.family) {
            Some(f) => f.3.push((s.labels, s.value)),
            None => families.push((s.family, s.help, s.kind, vec![(s.labels, s.value)])),
        }
    }
    for (name, help, kind, series) in families {
        let kind = match kind {
            CounterKind::Counter => MetricType::Counter,
            CounterKind::Gauge => MetricType::Gauge,
        };
        let mut m = enc.encode_descriptor(name, help, None, kind)?;
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

impl Collector for NodeCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        encode(all_samples(&self.sources), &mut enc)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

    use std::collections::{BTreeMap, BTreeSet};

    use kvtier_core::registry::Sample;
    use kvtier_node::Settings;

    use super::*;
    use crate::state::AppState;

    /// A node with RAM, SSD and the KV-event publisher attached (cluster mode and the
    /// remote tier need a real etcd and a real S3 server: `kvtier/tests/stats_and_metrics.rs`
    /// renders a node with every subsystem attached).
    /// (The directory is removed when the returned guard is dropped.)
    fn node() -> (tempfile::TempDir, Arc<AppState>) {
        let dir = tempfile::tempdir().unwrap();
        let mut settings = Settings {
            data_dir: dir.path().to_path_buf(),
            ..Settings::default()
        };
        settings.ssd.enabled = true;
        settings.kv_events.endpoint = "tcp://127.0.0.1:0".to_string();
        crate::listen::refusals::REFUSALS.note(
            crate::listen::refusals::Level::Info,
            "bad_json",
            &"test",
        );
        let app = AppState::open(settings).unwrap();
        (dir, app)
    }

    /// The series of a Prometheus text: `name{labels}` → value, histograms left out.
    fn series(text: &str) -> BTreeMap<String, String> {
        text.lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .filter(|l| !l.starts_with("kvtier_request_duration_seconds"))
            .map(|l| {
                let (k, v) = l.rsplit_once(' ').unwrap();
                (k.to_string(), v.to_string())
            })
            .collect()
    }

    /// The series name a sample has in `/metrics`.
    fn series_of(s: &Sample) -> String {
        let suffix = if s.kind == CounterKind::Counter {
            "_total"
        } else {
            ""
        };
        let labels: Vec<String> = s
            .labels
            .iter()
            .map(|(k, v)| format!("{k}=\"{v}\""))
            .collect();
        // An unlabelled series is written with empty braces.
        format!("kvtier_{}{suffix}{{{}}}", s.family, labels.join(","))
    }

    #[test]
    fn stats_and_metrics_render_the_same_list() {
        let (_dir, app) = node();
        let samples = all_samples(&app.node.sources());
        let flat = samples.flat();
        let text = app.metrics.render().unwrap();
        let metrics = series(&text);
        assert_eq!(flat.len(), samples.iter().count(), "flat names are unique");
        assert_eq!(metrics.len(), flat.len(), "{text}");
        for s in samples.iter() {
            assert!(flat.contains_key(&s.name), "{} not in /v1/stats", s.name);
            let key = series_of(s);
            assert!(metrics.contains_key(&key), "{key} not in /metrics:\n{text}");
        }
        // Every subsystem attached is there, counters typed as counters.
        for name in [
            "ram_hits",
            "ssd_stores",
            "ssd_writer_enqueued",
            "ssd_recovery_records",
            "kv_events_epoch",
            "refused_bad_json",
            "engine_lookup_tokens_promised",
            "engine_load_tokens_undelivered_evicted",
        ] {
            assert!(flat.contains_key(name), "{name}");
        }
        assert!(text.contains("# TYPE kvtier_load_tokens_undelivered counter"));
        assert!(text.contains("kvtier_load_tokens_undelivered_total{reason=\"evicted\"} 0"));
        assert!(text.contains("kvtier_refused_total{kind=\"bad_json\"}"));
        // Each family is written once, typed as its table says.
        for s in samples.iter() {
            let kind = match s.kind {
                CounterKind::Counter => "counter",
                CounterKind::Gauge => "gauge",
            };
            let line = format!("# TYPE kvtier_{} {kind}\n", s.family);
            assert_eq!(text.matches(&line).count(), 1, "{line}");
        }
        // The recovery report's and the publisher's counts are counters; their levels
        // (what recovery kept, the epoch) gauges.
        for (family, kind) in [
            ("ssd_recovery_damaged_records", "counter"),
            ("ssd_recovery_removed_files", "counter"),
            ("ssd_recovery_records", "gauge"),
            ("ssd_recovery_milliseconds", "gauge"),
            ("kv_events_batches", "counter"),
            ("kv_events_missed", "counter"),
            ("kv_events_epoch", "gauge"),
        ] {
            assert!(
                text.contains(&format!("# TYPE kvtier_{family} {kind}\n")),
                "{family} is not a {kind}:\n{text}"
            );
        }
    }

    /// The families of docs/metrics.md's tables, in order (a family listed twice is
    /// there twice).
    fn documented() -> Vec<String> {
        let doc = include_str!("../../../docs/metrics.md");
        doc.lines()
            .filter(|l| l.starts_with("| `"))
            .flat_map(|l| {
                let first = l.split('|').nth(1).unwrap_or_default();
                first
                    .split('`')
                    .skip(1)
                    .step_by(2)
                    .map(|s| s.trim_end_matches("_total").to_string())
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// The families of subsystems the test node does not run, from their tables: the
    /// cluster plane's and the gateway's (whose refusals share `refused`).
    fn families_elsewhere() -> BTreeSet<String> {
        let cluster = kvtier_meta::ClusterStats::COUNTERS.iter().map(|c| c.family);
        let gateway = kvtier_gateway::Counters::COUNTERS.iter().map(|c| c.family);
        cluster.chain(gateway).map(str::to_string).collect()
    }

    #[test]
    fn every_exported_family_is_documented_once_and_every_documented_one_exported() {
        let (_dir, app) = node();
        let mut exported: BTreeSet<String> = all_samples(&app.node.sources())
            .iter()
            .map(|s| s.family.to_string())
            .collect();
        exported.extend(families_elsewhere());
        exported.insert("request_duration_seconds".to_string());
        let listed = documented();
        let documented: BTreeSet<String> = listed.iter().cloned().collect();
        assert_eq!(documented.len(), listed.len(), "listed twice: {listed:?}");
        let undocumented: Vec<_> = exported.difference(&documented).collect();
        assert!(
            undocumented.is_empty(),
            "not in docs/metrics.md: {undocumented:?}"
        );
        let missing: Vec<_> = documented.difference(&exported).collect();
        assert!(missing.is_empty(), "documented, not exported: {missing:?}");
    }

    /// Every string under an `expr`, `query` or `definition` key of `v`.
    fn queries(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    match v {
                        serde_json::Value::String(q)
                            if ["expr", "query", "definition"].contains(&k.as_str()) =>
                        {
                            out.push(q.clone());
                        }
                        _ => queries(v, out),
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| queries(v, out)),
            _ => {}
        }
    }

    /// The `kvtier_*` metric names a PromQL query mentions.
    fn metric_names(query: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut rest = query;
        while let Some(at) = rest.find("kvtier_") {
            let tail = &rest[at..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            out.push(tail[..end].to_string());
            rest = &tail[end..];
        }
        out
    }

    #[test]
    fn every_dashboard_query_names_an_exported_family() {
        let (_dir, app) = node();
        // Series names as `/metrics` writes them: counters end in `_total`.
        let mut exported: BTreeSet<String> = all_samples(&app.node.sources())
            .iter()
            .map(|s| {
                let suffix = if s.kind == CounterKind::Counter {
                    "_total"
                } else {
                    ""
                };
                format!("kvtier_{}{suffix}", s.family)
            })
            .collect();
        for part in ["bucket", "sum", "count"] {
            exported.insert(format!("kvtier_request_duration_seconds_{part}"));
        }
        let text = include_str!("../../../ops/grafana/kvtier.json");
        let dashboard: serde_json::Value = serde_json::from_str(text).unwrap();
        let mut all = Vec::new();
        queries(&dashboard, &mut all);
        assert!(all.len() >= 10, "{all:?}");
        let mut named = 0;
        for q in &all {
            for name in metric_names(q) {
                named += 1;
                assert!(
                    exported.contains(&name),
                    "{name} (in `{q}`) is not exported"
                );
            }
        }
        assert!(named >= 10);
        // The hit-accounting families are on it.
        for family in [
            "kvtier_lookup_tokens_total",
            "kvtier_load_tokens_delivered_total",
            "kvtier_load_tokens_undelivered_total",
        ] {
            assert!(all.iter().any(|q| q.contains(family)), "{family}");
        }
    }
}
