//! The write-behind queue: bounded enqueue time, pending-hash dedup, the three levels of
//! backpressure, and deterministic shutdown, against a tier whose worker-side writes can
//! be held back on demand.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code"
)]

use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kvtier_core::hash::BlockHash;
use kvtier_core::stats::TierStats;
use kvtier_core::tier::conformance::{test_chain, test_layout};
use kvtier_core::tier::writer::{Enqueued, Overflow, WriteBehind, WriterConfig};
use kvtier_core::tier::{BlockMeta, PutOutcome, RamConfig, RamTier, ResidencySink, Tier, TierKind};
use kvtier_core::{Engine, ExtraKeys, Layout, PersistConfig, PersistMode};
use parking_lot::{Condvar, Mutex};

/// A RAM tier whose writes from the writer's worker thread wait until the gate opens.
#[derive(Debug)]
struct Gated {
    inner: RamTier,
    open: Mutex<bool>,
    opened: Condvar,
}

impl Gated {
    fn new(open: bool) -> Arc<Self> {
        Self::with_capacity(open, 64 << 20)
    }
    /// A gated tier of `capacity_bytes` (smaller than a block: it refuses every block).
    fn with_capacity(open: bool, capacity_bytes: u64) -> Arc<Self> {
        Arc::new(Self {
            inner: RamTier::standalone(RamConfig { capacity_bytes }),
            open: Mutex::new(open),
            opened: Condvar::new(),
        })
    }
    fn open(&self) {
        *self.open.lock() = true;
        self.opened.notify_all();
    }
}

impl Tier for Gated {
    fn kind(&self) -> TierKind {
        TierKind::Ssd
    }
    fn put(&self, meta: &BlockMeta, payload: Bytes) -> kvtier_core::Result<PutOutcome> {
        if std::thread::current()
            .name()
            .is_some_and(|n| n.starts_with("kvtier-writer"))
        {
            let mut open = self.open.lock();
            while !*open {
                self.opened.wait(&mut open);
            }
        }
        self.inner.put(meta, payload)
    }
    fn get(&self, hash: &BlockHash) -> kvtier_core::Result<Option<Bytes>> {
        self.inner.get(hash)
    }
    fn get_range(&self, hash: &BlockHash, range: Range<u64>) -> kvtier_core::Result<Option<Bytes>> {
        self.inner.get_range(hash, range)
    }
    fn contains(&self, hash: &BlockHash) -> bool {
        self.inner.contains(hash)
    }
    fn remove(&self, hash: &BlockHash) -> kvtier_core::Result<bool> {
        self.inner.remove(hash)
    }
    fn stats(&self) -> TierStats {
        self.inner.stats()
    }
}

/// `n` independent first blocks (the RAM tier under the gate wants parents held).
fn blocks(n: usize) -> Vec<(BlockMeta, Bytes)> {
    let layout = test_layout().unwrap();
    (0..n)
        .map(|i| test_chain(&layout, 1, 1000 + i as u32).remove(0))
        .collect()
}

#[test]
fn everything_queued_is_written_and_the_counters_add_up() {
    let target = Gated::new(true);
    let w = WriteBehind::start(target.clone(), WriterConfig::default()).unwrap();
    let chain = blocks(50);
    for (m, p) in &chain {
        assert_eq!(w.enqueue(m.clone(), p.clone()), Enqueued::Queued);
    }
    let report = w.stop(Duration::from_secs(10));
    assert!(report.clean && !report.partial, "{report:?}");
    for (m, p) in &chain {
        assert_eq!(target.get(&m.hash).unwrap().as_ref(), Some(p));
    }
    let s = w.stats();
    assert_eq!(
        (s.enqueued, s.saved, s.failed, s.queue_depth),
        (50, 50, 0, 0)
    );
    assert_eq!(
        w.enqueue(chain[0].0.clone(), chain[0].1.clone()),
        Enqueued::Closed
    );
    assert_eq!(w.stats().dropped_closed, 1);
    assert_eq!(w.stop(Duration::from_secs(1)), report, "stop is idempotent");
}

#[test]
fn a_hash_already_queued_is_not_queued_twice() {
    let target = Gated::new(false);
    let w = WriteBehind::start(target.clone(), WriterConfig::default()).unwrap();
    let chain = blocks(2);
    assert_eq!(
        w.enqueue(chain[0].0.clone(), chain[0].1.clone()),
        Enqueued::Queued
    );
    assert_eq!(
        w.enqueue(chain[1].0.clone(), chain[1].1.clone()),
        Enqueued::Queued
    );
    assert!(w.is_pending(&chain[1].0.hash));
    assert_eq!(
        w.enqueue(chain[1].0.clone(), chain[1].1.clone()),
        Enqueued::AlreadyPending
    );
    target.open();
    assert!(w.stop(Duration::from_secs(10)).clean);
    assert_eq!((w.stats().pending_dedup, w.stats().saved), (1, 2));
    assert!(!w.is_pending(&chain[1].0.hash));
}

#[test]
fn a_full_queue_writes_inline_after_the_short_wait() {
    let target = Gated::new(false);
    let config = WriterConfig {
        queue_len: 2,
        wait: Duration::from_millis(20),
        overflow: Overflow::SyncWrite,
    };
    let w = WriteBehind::start(target.clone(), config).unwrap();
    let chain = blocks(6);
    // The worker takes one and blocks; two fill the queue.
    for (m, p) in &chain[..3] {
        assert_eq!(w.enqueue(m.clone(), p.clone()), Enqueued::Queued);
    }
    std::thread::sleep(Duration::from_millis(20));
    let started = Instant::now();
    let out = w.enqueue(chain[3].0.clone(), chain[3].1.clone());
    let took = started.elapsed();
    // The worker holds one block and the queue holds two: the fourth waits its 20 ms,
    // then is written on this thread.
    assert!(
        took >= Duration::from_millis(15) && took < Duration::from_secs(2),
        "enqueue took {took:?}"
    );
    assert_eq!(out, Enqueued::WrittenInline(Ok(PutOutcome::Stored)));
    assert!(
        target.contains(&chain[3].0.hash),
        "the inline write did not land"
    );
    assert_eq!(w.stats().sync_fallback, 1);
    target.open();
    assert!(w.stop(Duration::from_secs(10)).clean);
}

#[test]
fn a_full_queue_drops_when_configured_to() {
    let target = Gated::new(false);
    let config = WriterConfig {
        queue_len: 1,
        wait: Duration::from_millis(5),
        overflow: Overflow::Drop,
    };
    let w = WriteBehind::start(target.clone(), config).unwrap();
    let chain = blocks(8);
    let mut dropped = 0;
    for (m, p) in &chain {
        if w.enqueue(m.clone(), p.clone()) == Enqueued::Dropped {
            dropped += 1;
        }
    }
    assert!(
        dropped >= 5,
        "only {dropped} dropped with a 1-slot queue and a blocked worker"
    );
    assert_eq!(w.stats().dropped_full, dropped);
    // try_enqueue never waits.
    let started = Instant::now();
    let again = w.try_enqueue(chain[7].0.clone(), chain[7].1.clone());
    assert!(started.elapsed() < Duration::from_millis(5));
    assert_eq!(again, Enqueued::Dropped);
    target.open();
    assert!(w.stop(Duration::from_secs(10)).clean);
}

#[test]
fn a_hung_tier_makes_shutdown_report_a_partial_flush() {
    let target = Gated::new(false);
    let w = WriteBehind::start(target.clone(), WriterConfig::default()).unwrap();
    for (m, p) in &blocks(5) {
        w.enqueue(m.clone(), p.clone());
    }
    let started = Instant::now();
    let report = w.stop(Duration::from_millis(100));
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(!report.clean && report.partial, "{report:?}");
    assert!(report.left_in_queue >= 3, "{report:?}");
    // Let the worker finish so the test leaves no thread behind.
    target.open();
}

#[test]
fn queued_bytes_stay_readable_until_written() {
    let target = Gated::new(false);
    let w = WriteBehind::start(target.clone(), WriterConfig::default()).unwrap();
    let chain = blocks(3);
    for (m, p) in &chain {
        w.enqueue(m.clone(), p.clone());
    }
    for (m, p) in &chain {
        assert!(target.get(&m.hash).unwrap().is_none(), "not written yet");
        assert_eq!(w.pending_payload(&m.hash).as_ref(), Some(p));
    }
    target.open();
    assert!(w.flush(Duration::from_secs(10)));
    for (m, p) in &chain {
        assert_eq!(
            w.pending_payload(&m.hash),
            None,
            "written: no longer pending"
        );
        assert_eq!(target.get(&m.hash).unwrap().as_ref(), Some(p));
    }
}

#[test]
fn a_refused_write_is_reported_to_the_lost_hook_and_a_stored_one_is_not() {
    // 100 bytes hold no block: every write is refused (no space).
    let refusing = Gated::with_capacity(true, 100);
    let w = WriteBehind::start(refusing, WriterConfig::default()).unwrap();
    let lost = Arc::new(Mutex::new(Vec::new()));
    let seen = lost.clone();
    w.on_lost(Box::new(move |m| seen.lock().push(m.hash)));
    let chain = blocks(2);
    for (m, p) in &chain {
        w.enqueue(m.clone(), p.clone());
    }
    assert!(w.flush(Duration::from_secs(10)));
    let want: Vec<BlockHash> = chain.iter().map(|(m, _)| m.hash).collect();
    assert_eq!(*lost.lock(), want);
    assert_eq!(w.stats().rejected, 2);

    let accepting = Gated::new(true);
    let w = WriteBehind::start(accepting, WriterConfig::default()).unwrap();
    let lost = Arc::new(Mutex::new(Vec::new()));
    let seen = lost.clone();
    w.on_lost(Box::new(move |m| seen.lock().push(m.hash)));
    for (m, p) in &chain {
        w.enqueue(m.clone(), p.clone());
    }
    assert!(w.flush(Duration::from_secs(10)));
    assert!(lost.lock().is_empty());
}

/// A gated tier that takes batches, keeping the blocks of each call it gets, in order.
#[derive(Debug)]
struct Batching {
    gated: Arc<Gated>,
    calls: Mutex<Vec<Vec<BlockHash>>>,
}

impl Tier for Batching {
    fn kind(&self) -> TierKind {
        TierKind::Ssd
    }
    fn put(&self, meta: &BlockMeta, payload: Bytes) -> kvtier_core::Result<PutOutcome> {
        self.calls.lock().push(vec![meta.hash]);
        self.gated.put(meta, payload)
    }
    fn put_many(&self, items: &[(BlockMeta, Bytes)]) -> Vec<kvtier_core::Result<PutOutcome>> {
        self.calls
            .lock()
            .push(items.iter().map(|(m, _)| m.hash).collect());
        items
            .iter()
            .map(|(m, p)| self.gated.put(m, p.clone()))
            .collect()
    }
    fn takes_batches(&self) -> bool {
        true
    }
    fn get(&self, hash: &BlockHash) -> kvtier_core::Result<Option<Bytes>> {
        self.gated.get(hash)
    }
    fn get_range(&self, hash: &BlockHash, range: Range<u64>) -> kvtier_core::Result<Option<Bytes>> {
        self.gated.get_range(hash, range)
    }
    fn contains(&self, hash: &BlockHash) -> bool {
        self.gated.contains(hash)
    }
    fn remove(&self, hash: &BlockHash) -> kvtier_core::Result<bool> {
        self.gated.remove(hash)
    }
    fn stats(&self) -> TierStats {
        self.gated.stats()
    }
}

#[test]
fn a_tier_that_takes_batches_gets_what_is_queued_together_in_order() {
    let gated = Gated::new(false);
    let target = Arc::new(Batching {
        gated: gated.clone(),
        calls: Mutex::new(Vec::new()),
    });
    let w = WriteBehind::start(target.clone(), WriterConfig::default()).unwrap();
    let chain = blocks(40);
    // The worker takes the first block alone and waits at the gate; the other 39 queue up
    // behind it.
    assert_eq!(
        w.enqueue(chain[0].0.clone(), chain[0].1.clone()),
        Enqueued::Queued
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while target.calls.lock().is_empty() {
        assert!(Instant::now() < deadline, "the worker never took a block");
        std::thread::sleep(Duration::from_millis(1));
    }
    for (m, p) in &chain[1..] {
        assert_eq!(w.enqueue(m.clone(), p.clone()), Enqueued::Queued);
    }
    gated.open();
    assert!(w.stop(Duration::from_secs(10)).clean);
    let calls = target.calls.lock().clone();
    let sizes: Vec<usize> = calls.iter().map(Vec::len).collect();
    // The first alone, then what queued behind it, at most 16 a call.
    assert_eq!(sizes, vec![1, 16, 16, 7], "{sizes:?}");
    let order: Vec<BlockHash> = calls.into_iter().flatten().collect();
    let want: Vec<BlockHash> = chain.iter().map(|(m, _)| m.hash).collect();
    assert_eq!(order, want, "every block once, in the order queued");
    for (m, p) in &chain {
        assert_eq!(target.get(&m.hash).unwrap().as_ref(), Some(p));
    }
    assert_eq!(w.stats().saved, 40);
}

/// An evict-only engine over a gated tier: what RAM evicts waits in the writer's queue.
fn evict_only_engine(lower: Arc<Gated>, ram_blocks: u64) -> (Engine, Arc<Layout>) {
    let layout = test_layout().unwrap();
    let e = Engine::builder()
        .ram(RamConfig {
            capacity_bytes: ram_blocks * layout.block_bytes(),
        })
        .persistent_tier(
            PersistConfig {
                mode: PersistMode::EvictOnly,
                prefetch: false,
                ..PersistConfig::default()
            },
            move |_sink: Arc<dyn ResidencySink>| Ok(lower as Arc<dyn Tier>),
        )
        .build()
        .unwrap();
    let layout = e.register_layout(layout.key().clone()).unwrap();
    (e, layout)
}

fn store_conversations(e: &Engine, layout: &Layout, n: u32) -> Vec<(Vec<u32>, Vec<u8>)> {
    let per = layout.tokens_per_block() as u32;
    (0..n)
        .map(|c| {
            let tokens: Vec<u32> = (0..per).map(|t| 7000 + c * 100 + t).collect();
            let bytes: Vec<u8> = (0..layout.block_bytes())
                .map(|i| (i as u32 * 13 + c) as u8)
                .collect();
            let prompt = e
                .prompt(layout.digest(), &tokens, &ExtraKeys::none())
                .unwrap();
            e.store(&prompt, &[&bytes]).unwrap();
            (tokens, bytes)
        })
        .collect()
}

#[test]
fn a_block_on_its_way_down_is_found_and_loads_byte_for_byte() {
    let lower = Gated::new(false);
    let (e, layout) = evict_only_engine(lower.clone(), 2);
    // Four one-block conversations in a RAM of two: two are evicted into the held queue.
    let convs = store_conversations(&e, &layout, 4);
    assert_eq!(
        e.stats()
            .moved(TierKind::Ram, TierKind::Ssd)
            .demotions_queued,
        2
    );
    for (tokens, bytes) in &convs {
        let prompt = e
            .prompt(layout.digest(), tokens, &ExtraKeys::none())
            .unwrap();
        let hit = e.lookup(&prompt);
        assert_eq!(
            hit.blocks.len(),
            1,
            "every block is findable while the writer is held"
        );
        let loaded = e.load(&hit).unwrap();
        assert!(loaded.complete);
        assert_eq!(&loaded.blocks[0][..], &bytes[..]);
        // A layer of it, too.
        let page = layout.geometry().layer_range(1..2).unwrap();
        let layer = e.load_layers(&hit, 1..2).unwrap();
        assert!(layer.complete);
        assert_eq!(
            &layer.blocks[0][..],
            &bytes[page.start as usize..page.end as usize]
        );
    }
    lower.open();
    assert!(e.flush(Duration::from_secs(10)));
}

#[test]
fn a_demotion_the_tier_refuses_leaves_the_index() {
    let lower = Gated::with_capacity(false, 100);
    let (e, layout) = evict_only_engine(lower.clone(), 1);
    let convs = store_conversations(&e, &layout, 2);
    let first = e
        .prompt(layout.digest(), &convs[0].0, &ExtraKeys::none())
        .unwrap();
    assert_eq!(e.lookup(&first).blocks.len(), 1, "queued: still findable");
    lower.open();
    // The queue empties, but a block in it was not written: the flush says so.
    let flushed = e.flush_report(Duration::from_secs(10));
    assert!(flushed.tiers.iter().all(|t| t.drained && t.synced));
    assert_eq!(flushed.unwritten(), 1, "{flushed:?}");
    assert!(!flushed.clean());
    // Counted once: the next flush has nothing new to report.
    assert!(e.flush(Duration::from_secs(10)));
    assert!(
        e.lookup(&first).is_miss(),
        "refused by the tier: no longer claimed"
    );
}
