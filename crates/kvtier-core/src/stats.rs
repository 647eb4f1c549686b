//! Counters and their snapshots: the leaf of the crate's imports.
//!
//! Each component owns its counters under a distinct prefix (`index_`, one per tier such as
//! `ram_`, `{tier}_writer_`, `engine_`, `snapshot_`), so merging them can never overwrite one
//! with another (seed 002, "Stats ownership"). Each component declares its counters once, in
//! a [`Counter`] table from which both the flat stats names and the metric families come.
//! Counters bumped on the lock-free read path are [`StripedCounter`]s, so two threads
//! loading blocks do not fight over one cache line.
//!
//! This module imports nothing from the crate but the reject reasons' name table (a leaf,
//! `tier::reject`): the tables of components that own their
//! stats types (`WriterStats::COUNTERS` in `tier::writer`, `ObserverStats::COUNTERS` in
//! `events`) live next to them, and the aggregate of everything the engine counts
//! (`EngineStats`) lives in `registry`, which reads every table. So tiers, the index and
//! the engine import `stats`, and `stats` imports none of them (it used to import tier,
//! writer and events back, closing an import cycle through the core).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::tier::reject::RejectReason;

/// Number of stripes; a power of two at least the core count of the machines we target.
const STRIPES: usize = 16;

#[derive(Debug, Default)]
#[repr(align(128))]
struct PaddedCounter(AtomicU64);

/// A counter split over cache-line-padded stripes chosen by thread.
#[derive(Debug, Default)]
pub struct StripedCounter {
    stripes: [PaddedCounter; STRIPES],
}

fn stripe_of_this_thread() -> usize {
    use std::cell::Cell;
    use std::sync::atomic::AtomicUsize;
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static STRIPE: Cell<usize> = Cell::new(NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES);
    }
    STRIPE.with(Cell::get)
}

impl StripedCounter {
    /// Adds one.
    pub fn incr(&self) {
        self.add(1);
    }

    /// Adds `n`.
    pub fn add(&self, n: u64) {
        self.stripes[stripe_of_this_thread()]
            .0
            .fetch_add(n, Ordering::Relaxed);
    }

    /// The sum over all stripes.
    pub fn get(&self) -> u64 {
        self.stripes
            .iter()
            .map(|s| s.0.load(Ordering::Relaxed))
            .sum()
    }
}

/// Whether a value only grows or goes up and down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CounterKind {
    /// Grows from zero (Prometheus type `counter`).
    Counter,
    /// A level now (Prometheus type `gauge`).
    Gauge,
}

/// One counter of a stats snapshot `S`, declared once: its flat name (in `/v1/stats`), its
/// metric family and label (in `/metrics`) and how to read it. Every component lists its
/// counters in one such table (`COUNTERS`), and both outputs are derived from it, so the
/// two can never drift apart.
pub struct Counter<S> {
    /// The name under the component's prefix (`hits` → `ram_hits`).
    pub name: &'static str,
    /// The metric family, without the `kvtier_` prefix (`tier_hits`).
    pub family: &'static str,
    /// The label that tells this counter from its siblings in the family, if any.
    pub label: Option<(&'static str, &'static str)>,
    /// The family's help text (the same for every counter of a family).
    pub help: &'static str,
    /// Counter or gauge.
    pub kind: CounterKind,
    /// Reads the value from a snapshot.
    pub read: fn(&S) -> u64,
}

impl<S> std::fmt::Debug for Counter<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Counter")
            .field("name", &self.name)
            .field("family", &self.family)
            .finish_non_exhaustive()
    }
}

impl<S> Counter<S> {
    /// Every counter of `table` read from `stats`, named `{prefix}_{name}`.
    pub fn read_all(table: &[Counter<S>], prefix: &str, stats: &S) -> Vec<(String, u64)> {
        table
            .iter()
            .map(|c| (format!("{prefix}_{}", c.name), (c.read)(stats)))
            .collect()
    }
}

use CounterKind::{Counter as C, Gauge as G};

/// Evictions of one tier, by cause.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Evictions {
    /// Evicted to stay within the byte budget.
    pub budget: u64,
    /// Expired.
    pub ttl: u64,
    /// Removed on request.
    pub explicit: u64,
    /// Dropped because they failed verification.
    pub corrupt: u64,
}

/// A snapshot of one tier's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TierStats {
    /// Loads that found the block.
    pub hits: u64,
    /// Loads that did not.
    pub misses: u64,
    /// Blocks admitted.
    pub stores: u64,
    /// Puts of a block already held (refreshed, not rewritten).
    pub dedup_skips: u64,
    /// Puts refused for lack of room.
    pub rejected_no_space: u64,
    /// Puts refused because the parent block was absent.
    pub rejected_parent_missing: u64,
    /// Puts refused because another block holds the same hash (the hash is quarantined).
    pub rejected_collision: u64,
    /// Puts refused because the hash is quarantined.
    pub rejected_quarantined: u64,
    /// Reads or writes that failed with an I/O error (disk full included).
    pub io_errors: u64,
    /// Blocks removed, by cause.
    pub evictions: Evictions,
    /// Blocks held now.
    pub resident_blocks: u64,
    /// Payload bytes held now.
    pub resident_bytes: u64,
    /// The tier's byte capacity.
    pub capacity_bytes: u64,
    /// Records rewritten to reclaim space (compaction), for tiers that compact.
    pub relocated: u64,
    /// Objects and blocks refused because they were not signed with the cluster's
    /// signing key (the remote tier, with a key): forged, or written without the key.
    pub refused_unsigned: u64,
    /// What the tier's cold-page codec did, for tiers that encode pages.
    pub codec: CodecStats,
}

/// What a tier's cold-page codec did (kvtier-codec, ADR 0021): bytes held encoded against
/// the bytes they decode to, per codec, and the cost of encoding and decoding.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CodecStats {
    /// Stored bytes of pages held losslessly encoded.
    pub lossless_stored_bytes: u64,
    /// What those pages decode to.
    pub lossless_decoded_bytes: u64,
    /// Stored bytes of pages held fp8-encoded.
    pub fp8_stored_bytes: u64,
    /// What those pages decode to.
    pub fp8_decoded_bytes: u64,
    /// Pages written encoded.
    pub encoded_pages: u64,
    /// Pages the codec did not shrink, written raw.
    pub not_shrunk_pages: u64,
    /// Pages (or parts of pages) decoded by reads.
    pub decoded_pages: u64,
    /// Encoded pages that did not decode to the bytes they were encoded from (a miss).
    pub decode_failures: u64,
    /// Time spent encoding, nanoseconds (on the tier's writer threads).
    pub encode_ns: u64,
    /// Time spent decoding, nanoseconds (on the load path).
    pub decode_ns: u64,
}

const CODEC_STORED: &str = "Bytes a tier holds encoded, by codec";
const CODEC_DECODED: &str = "Bytes the pages a tier holds encoded decode to, by codec";

const REJECTED: &str = "Puts a tier refused, by reason";
const EVICTIONS: &str = "Blocks a tier removed, by cause";

impl TierStats {
    /// Every tier counter; names are prefixed with the tier's name, and the metrics carry
    /// a `tier` label.
    #[rustfmt::skip]
    pub const COUNTERS: &'static [Counter<TierStats>] = &[
        Counter { name: "hits", family: "tier_hits", label: None, help: "Loads a tier answered", kind: C, read: |s| s.hits },
        Counter { name: "misses", family: "tier_misses", label: None, help: "Loads a tier could not answer", kind: C, read: |s| s.misses },
        Counter { name: "stores", family: "tier_stores", label: None, help: "Blocks a tier admitted", kind: C, read: |s| s.stores },
        Counter { name: "dedup_skips", family: "tier_dedup_skips", label: None, help: "Puts of a block already held", kind: C, read: |s| s.dedup_skips },
        Counter { name: "rejected_no_space", family: "tier_rejected", label: Some(("reason", RejectReason::NoSpace.name())), help: REJECTED, kind: C, read: |s| s.rejected_no_space },
        Counter { name: "rejected_parent_missing", family: "tier_rejected", label: Some(("reason", RejectReason::ParentMissing.name())), help: REJECTED, kind: C, read: |s| s.rejected_parent_missing },
        Counter { name: "rejected_collision", family: "tier_rejected", label: Some(("reason", RejectReason::Collision.name())), help: REJECTED, kind: C, read: |s| s.rejected_collision },
        Counter { name: "rejected_quarantined", family: "tier_rejected", label: Some(("reason", RejectReason::Quarantined.name())), help: REJECTED, kind: C, read: |s| s.rejected_quarantined },
        Counter { name: "io_errors", family: "tier_io_errors", label: None, help: "Failed reads and writes (disk full included)", kind: C, read: |s| s.io_errors },
        Counter { name: "evictions_budget", family: "tier_evictions", label: Some(("cause", "budget")), help: EVICTIONS, kind: C, read: |s| s.evictions.budget },
        Counter { name: "evictions_ttl", family: "tier_evictions", label: Some(("cause", "ttl")), help: EVICTIONS, kind: C, read: |s| s.evictions.ttl },
        Counter { name: "evictions_explicit", family: "tier_evictions", label: Some(("cause", "explicit")), help: EVICTIONS, kind: C, read: |s| s.evictions.explicit },
        Counter { name: "evictions_corrupt", family: "tier_evictions", label: Some(("cause", "corrupt")), help: EVICTIONS, kind: C, read: |s| s.evictions.corrupt },
        Counter { name: "resident_blocks", family: "tier_resident_blocks", label: None, help: "Blocks held now", kind: G, read: |s| s.resident_blocks },
        Counter { name: "resident_bytes", family: "tier_resident_bytes", label: None, help: "Payload bytes held now", kind: G, read: |s| s.resident_bytes },
        Counter { name: "capacity_bytes", family: "tier_capacity_bytes", label: None, help: "Byte capacity", kind: G, read: |s| s.capacity_bytes },
        Counter { name: "relocated", family: "tier_relocated", label: None, help: "Records rewritten to reclaim space (compaction)", kind: C, read: |s| s.relocated },
        Counter { name: "refused_unsigned", family: "tier_refused_unsigned", label: None, help: "Objects and blocks refused for lacking the cluster's signature", kind: C, read: |s| s.refused_unsigned },
        Counter { name: "codec_stored_bytes_lossless", family: "tier_codec_stored_bytes", label: Some(("codec", "lossless")), help: CODEC_STORED, kind: G, read: |s| s.codec.lossless_stored_bytes },
        Counter { name: "codec_decoded_bytes_lossless", family: "tier_codec_decoded_bytes", label: Some(("codec", "lossless")), help: CODEC_DECODED, kind: G, read: |s| s.codec.lossless_decoded_bytes },
        Counter { name: "codec_stored_bytes_fp8", family: "tier_codec_stored_bytes", label: Some(("codec", "fp8_e4m3")), help: CODEC_STORED, kind: G, read: |s| s.codec.fp8_stored_bytes },
        Counter { name: "codec_decoded_bytes_fp8", family: "tier_codec_decoded_bytes", label: Some(("codec", "fp8_e4m3")), help: CODEC_DECODED, kind: G, read: |s| s.codec.fp8_decoded_bytes },
        Counter { name: "codec_encoded_pages", family: "tier_codec_encoded_pages", label: None, help: "Pages a tier wrote encoded", kind: C, read: |s| s.codec.encoded_pages },
        Counter { name: "codec_not_shrunk_pages", family: "tier_codec_not_shrunk_pages", label: None, help: "Pages a tier's codec did not shrink, written raw", kind: C, read: |s| s.codec.not_shrunk_pages },
        Counter { name: "codec_decoded_pages", family: "tier_codec_decoded_pages", label: None, help: "Encoded pages (or parts) a tier decoded for reads", kind: C, read: |s| s.codec.decoded_pages },
        Counter { name: "codec_decode_failures", family: "tier_codec_decode_failures", label: None, help: "Encoded pages that did not decode to their own bytes (served as misses)", kind: C, read: |s| s.codec.decode_failures },
        Counter { name: "codec_encode_ns", family: "tier_codec_encode_nanoseconds", label: None, help: "Time a tier spent encoding pages, on its writer threads", kind: C, read: |s| s.codec.encode_ns },
        Counter { name: "codec_decode_ns", family: "tier_codec_decode_nanoseconds", label: None, help: "Time a tier spent decoding pages, on the load path", kind: C, read: |s| s.codec.decode_ns },
    ];

    /// The counters as `(name, value)` pairs, each name starting with `prefix_`.
    pub fn counters(&self, prefix: &str) -> Vec<(String, u64)> {
        Counter::read_all(Self::COUNTERS, prefix, self)
    }
}

/// A snapshot of the prefix index's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IndexStats {
    /// Lookups served.
    pub lookups: u64,
    /// Lookups that matched at least one block.
    pub lookup_hits: u64,
    /// Lookups that matched nothing.
    pub lookup_misses: u64,
    /// Blocks matched over all lookups.
    pub matched_blocks: u64,
    /// Entries whose hash matched but whose parent, tokens, extra keys or layout did not:
    /// treated as a miss. Non-zero means a hash collision or a bug, never served.
    pub verify_mismatches: u64,
    /// Blocks the index knows of now.
    pub entries: u64,
}

impl IndexStats {
    /// Every index counter (prefix `index_`).
    #[rustfmt::skip]
    pub const COUNTERS: &'static [Counter<IndexStats>] = &[
        Counter { name: "lookups", family: "index_lookups", label: None, help: "Lookups served", kind: C, read: |s| s.lookups },
        Counter { name: "lookup_hits", family: "index_lookup_results", label: Some(("result", "hit")), help: "Lookups by result", kind: C, read: |s| s.lookup_hits },
        Counter { name: "lookup_misses", family: "index_lookup_results", label: Some(("result", "miss")), help: "Lookups by result", kind: C, read: |s| s.lookup_misses },
        Counter { name: "matched_blocks", family: "index_matched_blocks", label: None, help: "Blocks matched over all lookups", kind: C, read: |s| s.matched_blocks },
        Counter { name: "verify_mismatches", family: "index_verify_mismatches", label: None, help: "Hash matches whose tokens, parent or layout differed (never served)", kind: C, read: |s| s.verify_mismatches },
        Counter { name: "entries", family: "index_entries", label: None, help: "Blocks the prefix index knows", kind: G, read: |s| s.entries },
    ];

    /// The counters as `(name, value)` pairs prefixed `index_`.
    pub fn counters(&self) -> Vec<(String, u64)> {
        Counter::read_all(Self::COUNTERS, "index", self)
    }
}

/// A snapshot of the snapshot bucket's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SnapshotStats {
    /// Gets that found a live snapshot.
    pub hits: u64,
    /// Gets that did not (absent or expired).
    pub misses: u64,
    /// Snapshots stored (new or replacing one under the same key).
    pub stores: u64,
    /// Puts refused (larger than the byte cap, or no memory could be freed).
    pub rejected: u64,
    /// Snapshots dropped to respect the entry cap.
    pub evictions_entries: u64,
    /// Snapshots dropped to respect the byte cap or the shared memory budget.
    pub evictions_bytes: u64,
    /// Snapshots dropped because their TTL passed.
    pub evictions_ttl: u64,
    /// Snapshots held now.
    pub resident_entries: u64,
    /// Snapshot bytes held now.
    pub resident_bytes: u64,
}

impl SnapshotStats {
    /// Every snapshot bucket counter (prefix `snapshot_`).
    #[rustfmt::skip]
    pub const COUNTERS: &'static [Counter<SnapshotStats>] = &[
        Counter { name: "hits", family: "snapshot_gets", label: Some(("result", "hit")), help: "Snapshot gets by result", kind: C, read: |s| s.hits },
        Counter { name: "misses", family: "snapshot_gets", label: Some(("result", "miss")), help: "Snapshot gets by result", kind: C, read: |s| s.misses },
        Counter { name: "stores", family: "snapshot_stores", label: None, help: "Snapshots stored", kind: C, read: |s| s.stores },
        Counter { name: "rejected", family: "snapshot_rejected", label: None, help: "Snapshot puts refused", kind: C, read: |s| s.rejected },
        Counter { name: "evictions_entries", family: "snapshot_evictions", label: Some(("cause", "entries")), help: "Snapshots dropped, by cause", kind: C, read: |s| s.evictions_entries },
        Counter { name: "evictions_bytes", family: "snapshot_evictions", label: Some(("cause", "bytes")), help: "Snapshots dropped, by cause", kind: C, read: |s| s.evictions_bytes },
        Counter { name: "evictions_ttl", family: "snapshot_evictions", label: Some(("cause", "ttl")), help: "Snapshots dropped, by cause", kind: C, read: |s| s.evictions_ttl },
        Counter { name: "resident_entries", family: "snapshot_resident_entries", label: None, help: "Snapshots held", kind: G, read: |s| s.resident_entries },
        Counter { name: "resident_bytes", family: "snapshot_resident_bytes", label: None, help: "Snapshot bytes held", kind: G, read: |s| s.resident_bytes },
    ];

    /// The counters as `(name, value)` pairs prefixed `snapshot_`.
    pub fn counters(&self) -> Vec<(String, u64)> {
        Counter::read_all(Self::COUNTERS, "snapshot", self)
    }
}

/// Lookups and restores of layouts with state groups (hybrid and recurrent models): how
/// often the composition rule served, trimmed or refused a hit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StateStats {
    /// Lookups of a layout with state groups.
    pub lookups: u64,
    /// Those that found a boundary where every group can be restored.
    pub hits: u64,
    /// Those that found KV blocks but no state at or before their end: refused.
    pub refused: u64,
    /// Hits whose KV went past the deepest state boundary and was cut back to it.
    pub trimmed: u64,
    /// Restores of a hit with state.
    pub restores: u64,
    /// Restores that returned nothing: a part was lost or damaged since the lookup.
    pub restore_misses: u64,
}

impl StateStats {
    /// Every counter of the composition rule (prefix `state_`).
    #[rustfmt::skip]
    pub const COUNTERS: &'static [Counter<StateStats>] = &[
        Counter { name: "lookups", family: "state_lookups", label: Some(("result", "any")), help: "Lookups of layouts with state groups, by result", kind: C, read: |s| s.lookups },
        Counter { name: "hits", family: "state_lookups", label: Some(("result", "hit")), help: "Lookups of layouts with state groups, by result", kind: C, read: |s| s.hits },
        Counter { name: "refused", family: "state_lookups", label: Some(("result", "refused")), help: "Lookups of layouts with state groups, by result", kind: C, read: |s| s.refused },
        Counter { name: "trimmed", family: "state_lookups", label: Some(("result", "trimmed")), help: "Lookups of layouts with state groups, by result", kind: C, read: |s| s.trimmed },
        Counter { name: "restores", family: "state_restores", label: Some(("result", "any")), help: "Restores of hits with state, by result", kind: C, read: |s| s.restores },
        Counter { name: "restore_misses", family: "state_restores", label: Some(("result", "miss")), help: "Restores of hits with state, by result", kind: C, read: |s| s.restore_misses },
    ];
}

/// The engine's own counters: prefetch, shutdown saves and the shared memory budget.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineCounters {
    /// Blocks read ahead from a lower tier after a lookup and promoted into RAM.
    pub prefetched: u64,
    /// Prefetched blocks that a load then found in RAM.
    pub prefetch_used: u64,
    /// Lookups whose prefetch was skipped (queue full).
    pub prefetch_skipped: u64,
    /// Evict-only mode: RAM-only blocks written to a lower tier at shutdown.
    pub shutdown_saved: u64,
    /// Evict-only mode: RAM-only blocks a shutdown could not write (deadline, refusal).
    pub shutdown_unsaved: u64,
    /// Bytes of the shared memory budget in use (RAM blocks plus snapshots).
    pub memory_used_bytes: u64,
    /// The shared memory budget.
    pub memory_capacity_bytes: u64,
    /// What the RAM tier's arena holds (see [`crate::arena`]).
    pub arena: crate::arena::ArenaStats,
    /// What lookups promised and loads delivered (see [`HitStats`]).
    pub hits: HitStats,
}

/// Hit accounting: what lookups promised and what loads delivered, and why a promised
/// block was not (`engine::hits`). Promised − delivered is the hollow part of the hits.
/// The delivered counters are listed per attached tier (`registry`), the rest in
/// `EngineCounters::COUNTERS`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HitStats {
    /// Prompt tokens lookups were asked about.
    pub lookup_tokens_asked: u64,
    /// Tokens lookups matched (promised).
    pub lookup_tokens_promised: u64,
    /// Blocks lookups matched (promised).
    pub lookup_blocks_promised: u64,
    /// Tokens loads were asked for (of the blocks asked for).
    pub load_tokens_asked: u64,
    /// Tokens loads delivered from RAM.
    pub load_tokens_delivered_ram: u64,
    /// Tokens loads delivered from the SSD tier.
    pub load_tokens_delivered_ssd: u64,
    /// Tokens loads delivered from the remote tier.
    pub load_tokens_delivered_remote: u64,
    /// Tokens a load did not deliver because no tier held their block any more (evicted,
    /// expired or removed since the lookup), or a block before it.
    pub load_tokens_undelivered_evicted: u64,
    /// Tokens a load did not deliver because a tier's read failed verification.
    pub load_tokens_undelivered_corrupt: u64,
    /// Tokens a load did not deliver because a tier's read ran out of its deadline.
    pub load_tokens_undelivered_deadline: u64,
    /// Tokens a load did not deliver because a tier's read failed otherwise (unreachable,
    /// refused by its store, an I/O error).
    pub load_tokens_undelivered_failed: u64,
    /// Tokens a load did not deliver because the engine refused the load (its layout no
    /// longer registered, the engine closed).
    pub load_tokens_undelivered_refused: u64,
}

impl EngineCounters {
    /// Every engine counter (prefix `engine_`).
    #[rustfmt::skip]
    pub const COUNTERS: &'static [Counter<EngineCounters>] = &[
        Counter { name: "prefetched_blocks", family: "prefetch_blocks", label: Some(("outcome", "prefetched")), help: "Blocks read ahead after a lookup, and those a load then used", kind: C, read: |s| s.prefetched },
        Counter { name: "prefetch_used_blocks", family: "prefetch_blocks", label: Some(("outcome", "used")), help: "Blocks read ahead after a lookup, and those a load then used", kind: C, read: |s| s.prefetch_used },
        Counter { name: "prefetch_skipped", family: "prefetch_skipped", label: None, help: "Lookups whose prefetch was skipped (queue full)", kind: C, read: |s| s.prefetch_skipped },
        Counter { name: "shutdown_saved_blocks", family: "shutdown_blocks", label: Some(("outcome", "saved")), help: "Evict-only mode: RAM-only blocks a clean shutdown wrote to a lower tier, and those it could not", kind: C, read: |s| s.shutdown_saved },
        Counter { name: "shutdown_unsaved_blocks", family: "shutdown_blocks", label: Some(("outcome", "unsaved")), help: "Evict-only mode: RAM-only blocks a clean shutdown wrote to a lower tier, and those it could not", kind: C, read: |s| s.shutdown_unsaved },
        Counter { name: "memory_used_bytes", family: "memory_used_bytes", label: None, help: "Shared RAM budget in use", kind: G, read: |s| s.memory_used_bytes },
        Counter { name: "memory_capacity_bytes", family: "memory_capacity_bytes", label: None, help: "Shared RAM budget", kind: G, read: |s| s.memory_capacity_bytes },
        Counter { name: "arena_mapped_bytes", family: "arena_mapped_bytes", label: None, help: "Bytes of the RAM tier's arena, mapped at start", kind: G, read: |s| s.arena.mapped_bytes },
        Counter { name: "arena_used_bytes", family: "arena_used_bytes", label: None, help: "Bytes of arena slots in use (blocks held by the RAM tier, a queue or a reader, and buffers being filled)", kind: G, read: |s| s.arena.used_bytes },
        Counter { name: "arena_fallbacks", family: "arena_fallbacks", label: None, help: "Block buffers given from the heap instead of the arena (larger than a segment, or no free slot of their size)", kind: C, read: |s| s.arena.fallbacks },
        Counter { name: "lookup_tokens_asked", family: "lookup_tokens", label: Some(("outcome", "asked")), help: "Prompt tokens lookups were asked about, and those they matched (promised)", kind: C, read: |s| s.hits.lookup_tokens_asked },
        Counter { name: "lookup_tokens_promised", family: "lookup_tokens", label: Some(("outcome", "promised")), help: "Prompt tokens lookups were asked about, and those they matched (promised)", kind: C, read: |s| s.hits.lookup_tokens_promised },
        Counter { name: "lookup_blocks_promised", family: "lookup_blocks_promised", label: None, help: "Blocks lookups matched (promised to a later load)", kind: C, read: |s| s.hits.lookup_blocks_promised },
        Counter { name: "load_tokens_asked", family: "load_tokens_asked", label: None, help: "Tokens loads were asked for", kind: C, read: |s| s.hits.load_tokens_asked },
        Counter { name: "load_tokens_undelivered_evicted", family: "load_tokens_undelivered", label: Some(("reason", "evicted")), help: "Tokens loads were asked for and did not deliver, by reason", kind: C, read: |s| s.hits.load_tokens_undelivered_evicted },
        Counter { name: "load_tokens_undelivered_corrupt", family: "load_tokens_undelivered", label: Some(("reason", "corrupt")), help: "Tokens loads were asked for and did not deliver, by reason", kind: C, read: |s| s.hits.load_tokens_undelivered_corrupt },
        Counter { name: "load_tokens_undelivered_deadline", family: "load_tokens_undelivered", label: Some(("reason", "deadline")), help: "Tokens loads were asked for and did not deliver, by reason", kind: C, read: |s| s.hits.load_tokens_undelivered_deadline },
        Counter { name: "load_tokens_undelivered_failed", family: "load_tokens_undelivered", label: Some(("reason", "failed")), help: "Tokens loads were asked for and did not deliver, by reason", kind: C, read: |s| s.hits.load_tokens_undelivered_failed },
        Counter { name: "load_tokens_undelivered_refused", family: "load_tokens_undelivered", label: Some(("reason", "refused")), help: "Tokens loads were asked for and did not deliver, by reason", kind: C, read: |s| s.hits.load_tokens_undelivered_refused },
    ];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn striped_counter_sums_over_threads() {
        let c = std::sync::Arc::new(StripedCounter::default());
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let c = c.clone();
                std::thread::spawn(move || (0..1000).for_each(|_| c.incr()))
            })
            .collect();
        for h in handles {
            assert!(h.join().is_ok());
        }
        assert_eq!(c.get(), 4000);
    }
}
