//! One counter registry: every counter of a node as a list of [`Sample`]s, each carrying
//! both its flat `/v1/stats` name and its metric family, labels and type for `/metrics`.
//!
//! Every subsystem declares its counters in a [`Counter`] table next to its owner — the
//! engine's components (`TierStats::COUNTERS`, `WriterStats::COUNTERS`, …), the SSD
//! recovery report, the cluster plane, the KV-event publisher, the gateway — and reads
//! them into samples with [`Samples::table`]. [`EngineStats::samples`] gathers the
//! engine's, the node adds its other subsystems' (`kvtier_node::registry`) and the edge
//! its refusals (`kvtier_listen::refusals`), and every exporter renders that one list, so
//! a name can never be in one and missing from another.

use std::collections::BTreeMap;

use crate::events::ObserverStats;
use crate::stats::{
    Counter, CounterKind, EngineCounters, HitStats, IndexStats, SnapshotStats, StateStats,
    TierStats,
};
use crate::tier::TierKind;
use crate::tier::writer::WriterStats;

/// Metric labels: name and value.
pub type Labels = Vec<(&'static str, String)>;

/// One value of one counter, under both of its names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    /// The flat name in `/v1/stats` (`ram_hits`).
    pub name: String,
    /// The metric family, without the `kvtier_` prefix (`tier_hits`).
    pub family: &'static str,
    /// The family's help text.
    pub help: &'static str,
    /// Counter or gauge.
    pub kind: CounterKind,
    /// The series' labels (`tier="ram"`).
    pub labels: Labels,
    /// The value now.
    pub value: u64,
}

/// Every sample of a node, in a stable order (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Samples {
    list: Vec<Sample>,
}

impl Samples {
    /// Adds every counter of `table` read from `stats`, named `{prefix}_{name}`, with the
    /// labels `base` plus the counter's own.
    pub fn table<S>(
        &mut self,
        table: &[Counter<S>],
        prefix: &str,
        stats: &S,
        base: &[(&'static str, &str)],
    ) {
        for c in table {
            let mut labels: Labels = base.iter().map(|(k, v)| (*k, (*v).to_string())).collect();
            if let Some((k, v)) = c.label {
                labels.push((k, v.to_string()));
            }
            self.list.push(Sample {
                name: format!("{prefix}_{}", c.name),
                family: c.family,
                help: c.help,
                kind: c.kind,
                labels,
                value: (c.read)(stats),
            });
        }
    }

    /// Adds one sample.
    pub fn push(&mut self, sample: Sample) {
        self.list.push(sample);
    }

    /// Adds every sample of `other`.
    pub fn extend(&mut self, other: Samples) {
        self.list.extend(other.list);
    }

    /// The samples, in order.
    pub fn iter(&self) -> impl Iterator<Item = &Sample> {
        self.list.iter()
    }

    /// `(flat name, value)` of every sample, in order.
    pub fn pairs(&self) -> Vec<(String, u64)> {
        self.list
            .iter()
            .map(|s| (s.name.clone(), s.value))
            .collect()
    }

    /// Flat name → value: what `/v1/stats` answers.
    pub fn flat(&self) -> BTreeMap<String, u64> {
        self.list
            .iter()
            .map(|s| (s.name.clone(), s.value))
            .collect()
    }
}

impl IntoIterator for Samples {
    type Item = Sample;
    type IntoIter = std::vec::IntoIter<Sample>;
    fn into_iter(self) -> Self::IntoIter {
        self.list.into_iter()
    }
}

/// One tier below RAM: its counters and its write queue's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LowerTierStats {
    /// Which tier.
    pub kind: TierKind,
    /// The tier's counters.
    pub tier: TierStats,
    /// Its write-behind queue's counters.
    pub writer: WriterStats,
}

/// Blocks moved from one tier to another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoveStats {
    /// The tier the blocks came from.
    pub from: TierKind,
    /// The tier they went to.
    pub to: TierKind,
    /// Read from `from` (slower) and put into `to` (faster, or queued for it).
    pub promoted: u64,
    /// Evicted from `from` (faster) and queued for `to` (slower).
    pub demotions_queued: u64,
    /// Evicted from `from` and not queued for `to` (queue full or closing).
    pub demotions_dropped: u64,
}

/// Everything the engine counts, taken in one call.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// The prefix index.
    pub index: IndexStats,
    /// The RAM tier.
    pub ram: TierStats,
    /// The tiers below RAM, fastest first.
    pub lower: Vec<LowerTierStats>,
    /// Movement between every pair of attached tiers (fastest source first).
    pub moves: Vec<MoveStats>,
    /// The engine's own counters.
    pub engine: EngineCounters,
    /// The snapshot bucket.
    pub snapshot: SnapshotStats,
    /// The checkpoint bucket (counted apart from the snapshots, prefix `checkpoint_`).
    pub checkpoint: SnapshotStats,
    /// The composition rule of layouts with state groups.
    pub state: StateStats,
    /// Each residency observer's delivery counters.
    pub observers: Vec<ObserverStats>,
}

impl EngineStats {
    /// The counters of tier `kind`, if it is attached (RAM always is).
    pub fn tier(&self, kind: TierKind) -> Option<TierStats> {
        if kind == TierKind::Ram {
            return Some(self.ram);
        }
        self.lower.iter().find(|l| l.kind == kind).map(|l| l.tier)
    }

    /// The counters of tier `kind`'s write queue, if it is attached below RAM.
    pub fn writer(&self, kind: TierKind) -> Option<WriterStats> {
        self.lower.iter().find(|l| l.kind == kind).map(|l| l.writer)
    }

    /// Every attached tier with its counters, fastest first (RAM first).
    pub fn tiers(&self) -> impl Iterator<Item = (TierKind, &TierStats)> {
        std::iter::once((TierKind::Ram, &self.ram))
            .chain(self.lower.iter().map(|l| (l.kind, &l.tier)))
    }

    /// Blocks moved from `from` to `to` (zeros when the pair is not attached).
    pub fn moved(&self, from: TierKind, to: TierKind) -> MoveStats {
        self.moves
            .iter()
            .find(|m| m.from == from && m.to == to)
            .copied()
            .unwrap_or(MoveStats {
                from,
                to,
                promoted: 0,
                demotions_queued: 0,
                demotions_dropped: 0,
            })
    }

    /// Every counter as `(name, value)`, names unique thanks to their prefixes:
    /// `index_*`, `{tier}_*` and `{tier}_writer_*` per attached tier, the movement
    /// counters (`engine_promotions_{from}_to_{to}` for a slower source,
    /// `engine_demotions_{from}_to_{to}_{queued,dropped}` for a faster one), `engine_*`
    /// `snapshot_*`, `checkpoint_*` and `state_*`.
    pub fn counters(&self) -> Vec<(String, u64)> {
        self.samples().pairs()
    }
}

impl HitStats {
    /// Tokens loads delivered from tier `kind`.
    pub fn delivered(&self, kind: TierKind) -> u64 {
        match kind {
            TierKind::Ram => self.load_tokens_delivered_ram,
            TierKind::Ssd => self.load_tokens_delivered_ssd,
            TierKind::Remote => self.load_tokens_delivered_remote,
        }
    }
}

const PROMOTIONS: &str =
    "Blocks read from a slower tier and promoted into a faster one, by source and destination";
const DEMOTIONS: &str = "Blocks a faster tier evicted towards a slower one, by outcome";

impl EngineStats {
    /// Every engine counter as samples, from the tables the engine's components declare
    /// them in: per attached tier (label `tier`, the tier's true name) and its write
    /// queue, movement by true source and destination, the index, the engine, the
    /// snapshot and checkpoint buckets (label `bucket`), the state rule and each observer.
    pub fn samples(&self) -> Samples {
        let mut out = Samples::default();
        out.table(IndexStats::COUNTERS, "index", &self.index, &[]);
        for (kind, t) in self.tiers() {
            out.table(
                TierStats::COUNTERS,
                kind.name(),
                t,
                &[("tier", kind.name())],
            );
            out.push(Sample {
                name: format!("engine_load_tokens_delivered_{}", kind.name()),
                family: "load_tokens_delivered",
                help: "Tokens loads delivered, by the tier that served them",
                kind: CounterKind::Counter,
                labels: vec![("tier", kind.name().to_string())],
                value: self.engine.hits.delivered(kind),
            });
            if let Some(l) = self.lower.iter().find(|l| l.kind == kind) {
                out.table(
                    WriterStats::COUNTERS,
                    &format!("{}_writer", kind.name()),
                    &l.writer,
                    &[("tier", kind.name())],
                );
            }
        }
        for m in &self.moves {
            let (from, to) = (m.from.name(), m.to.name());
            let labels = |extra: &[(&'static str, &str)]| -> Labels {
                [("from", from), ("to", to)]
                    .iter()
                    .chain(extra)
                    .map(|(k, v)| (*k, (*v).to_string()))
                    .collect()
            };
            if m.from > m.to {
                out.push(Sample {
                    name: format!("engine_promotions_{from}_to_{to}"),
                    family: "promotions",
                    help: PROMOTIONS,
                    kind: CounterKind::Counter,
                    labels: labels(&[]),
                    value: m.promoted,
                });
            } else {
                for (outcome, value) in [
                    ("queued", m.demotions_queued),
                    ("dropped", m.demotions_dropped),
                ] {
                    out.push(Sample {
                        name: format!("engine_demotions_{from}_to_{to}_{outcome}"),
                        family: "demotions",
                        help: DEMOTIONS,
                        kind: CounterKind::Counter,
                        labels: labels(&[("outcome", outcome)]),
                        value,
                    });
                }
            }
        }
        out.table(EngineCounters::COUNTERS, "engine", &self.engine, &[]);
        // Exact-prefix snapshots and checkpoints share the families, told apart by `bucket`.
        out.table(
            SnapshotStats::COUNTERS,
            "snapshot",
            &self.snapshot,
            &[("bucket", "exact")],
        );
        out.table(
            SnapshotStats::COUNTERS,
            "checkpoint",
            &self.checkpoint,
            &[("bucket", "checkpoint")],
        );
        out.table(StateStats::COUNTERS, "state", &self.state, &[]);
        for o in &self.observers {
            out.table(
                ObserverStats::COUNTERS,
                &format!("observer_{}", o.name),
                o,
                &[("observer", &o.name)],
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_names_are_unique() {
        let all = EngineStats {
            lower: vec![
                LowerTierStats {
                    kind: TierKind::Ssd,
                    tier: TierStats::default(),
                    writer: WriterStats::default(),
                },
                LowerTierStats {
                    kind: TierKind::Remote,
                    tier: TierStats::default(),
                    writer: WriterStats::default(),
                },
            ],
            moves: TierKind::ALL
                .iter()
                .flat_map(|&from| TierKind::ALL.iter().map(move |&to| (from, to)))
                .filter(|(from, to)| from != to)
                .map(|(from, to)| MoveStats {
                    from,
                    to,
                    promoted: 0,
                    demotions_queued: 0,
                    demotions_dropped: 0,
                })
                .collect(),
            ..EngineStats::default()
        };
        let names: Vec<String> = all.counters().into_iter().map(|(n, _)| n).collect();
        let unique: std::collections::HashSet<&String> = names.iter().collect();
        assert_eq!(unique.len(), names.len());
    }
}
