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
use kvtier_core::tier::{BlockMeta, PutOutcome, RamConfig, RamTier, Tier, TierKind};
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
        Arc::new(Self {
            inner: RamTier::standalone(RamConfig {
                capacity_bytes: 64 << 20,
            }),
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
