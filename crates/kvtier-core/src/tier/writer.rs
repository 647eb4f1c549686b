//! Write-behind: a bounded queue and one worker thread in front of a slow tier (the SSD
//! tier, later the remote tier), so a caller's store returns in bounded time (seed 002).
//!
//! `enqueue` never waits longer than the configured short wait. Three levels:
//! 1. a non-blocking push;
//! 2. a push that waits up to [`WriterConfig::wait`];
//! 3. [`Overflow::SyncWrite`]: write on the caller's thread (the caller pays the I/O but
//!    nothing is lost), or [`Overflow::Drop`]: count the block as dropped.
//!
//! A hash already queued is not queued twice (pending-hash dedup), and its bytes stay
//! readable ([`WriteBehind::pending_payload`]) until the write is done, so a block on its
//! way down is never invisible; a block whose write fails or is refused is reported to the
//! hook set with [`WriteBehind::on_lost`]. Shutdown is
//! deterministic: stop admitting, wait for enqueues in flight, put a sentinel at the end
//! of the queue, and wait (up to a deadline) for the worker to write everything before
//! it; the report says whether that finished (`clean`) and what was left. Every outcome
//! has a counter (prefix `writer_`).

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use crossbeam_channel::{Receiver, Sender, TrySendError, bounded};
use parking_lot::{Condvar, Mutex, RwLock};

use super::{BlockMeta, PutOutcome, Tier};
use crate::hash::BlockHash;
use crate::layout::LayoutDigest;
use crate::snapshot::SnapshotKey;
use crate::stats::Counter;
use crate::stats::CounterKind::{Counter as C, Gauge as G};

/// What to do when the queue stays full for the whole short wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "snake_case")
)]
pub enum Overflow {
    /// Write on the caller's thread (default).
    SyncWrite,
    /// Drop the block and count it.
    Drop,
}

impl Overflow {
    /// The policy's name in settings: `sync_write` or `drop`.
    pub fn name(self) -> &'static str {
        match self {
            Overflow::SyncWrite => "sync_write",
            Overflow::Drop => "drop",
        }
    }
}

impl std::fmt::Display for Overflow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Overflow {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "sync_write" => Ok(Overflow::SyncWrite),
            "drop" => Ok(Overflow::Drop),
            _ => Err(format!(
                "`{s}` is not an overflow policy: sync_write or drop"
            )),
        }
    }
}

/// Settings of a write-behind queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriterConfig {
    /// Blocks the queue holds (default 512).
    pub queue_len: usize,
    /// How long an enqueue may wait for room (default 50 ms).
    pub wait: Duration,
    /// What happens after that (default [`Overflow::SyncWrite`]).
    pub overflow: Overflow,
}

impl Default for WriterConfig {
    fn default() -> Self {
        Self {
            queue_len: 512,
            wait: Duration::from_millis(50),
            overflow: Overflow::SyncWrite,
        }
    }
}

/// How one enqueue ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enqueued {
    /// Queued for the worker.
    Queued,
    /// The same hash is already queued.
    AlreadyPending,
    /// The queue was full; written on the caller's thread with this outcome.
    WrittenInline(Result<PutOutcome, ()>),
    /// The queue was full and the block was dropped.
    Dropped,
    /// The writer is shutting down or stopped.
    Closed,
}

/// Counters of a writer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriterStats {
    /// Blocks queued.
    pub enqueued: u64,
    /// Enqueues skipped because the hash was already queued.
    pub pending_dedup: u64,
    /// Blocks the worker (or an inline write) stored.
    pub saved: u64,
    /// Writes the tier answered with "already held".
    pub duplicate: u64,
    /// Writes the tier refused (no space, collision, quarantine).
    pub rejected: u64,
    /// Writes that failed with an error.
    pub failed: u64,
    /// Enqueues written inline because the queue stayed full.
    pub sync_fallback: u64,
    /// Enqueues dropped because the queue stayed full.
    pub dropped_full: u64,
    /// Enqueues refused because the writer was closing.
    pub dropped_closed: u64,
    /// Blocks in the queue now.
    pub queue_depth: u64,
}

const OUTCOMES: &str = "A tier's write queue, by outcome";

impl WriterStats {
    /// Every writer counter; names are prefixed `{tier}_writer_`, and the metrics carry a
    /// `tier` label.
    #[rustfmt::skip]
    pub const COUNTERS: &'static [Counter<WriterStats>] = &[
        Counter { name: "enqueued", family: "writer_outcomes", label: Some(("outcome", "enqueued")), help: OUTCOMES, kind: C, read: |s| s.enqueued },
        Counter { name: "pending_dedup", family: "writer_outcomes", label: Some(("outcome", "pending_dedup")), help: OUTCOMES, kind: C, read: |s| s.pending_dedup },
        Counter { name: "saved", family: "writer_outcomes", label: Some(("outcome", "saved")), help: OUTCOMES, kind: C, read: |s| s.saved },
        Counter { name: "duplicate", family: "writer_outcomes", label: Some(("outcome", "duplicate")), help: OUTCOMES, kind: C, read: |s| s.duplicate },
        Counter { name: "rejected", family: "writer_outcomes", label: Some(("outcome", "rejected")), help: OUTCOMES, kind: C, read: |s| s.rejected },
        Counter { name: "failed", family: "writer_outcomes", label: Some(("outcome", "failed")), help: OUTCOMES, kind: C, read: |s| s.failed },
        Counter { name: "sync_fallback", family: "writer_outcomes", label: Some(("outcome", "sync_fallback")), help: OUTCOMES, kind: C, read: |s| s.sync_fallback },
        Counter { name: "dropped_full", family: "writer_outcomes", label: Some(("outcome", "dropped_full")), help: OUTCOMES, kind: C, read: |s| s.dropped_full },
        Counter { name: "dropped_closed", family: "writer_outcomes", label: Some(("outcome", "dropped_closed")), help: OUTCOMES, kind: C, read: |s| s.dropped_closed },
        Counter { name: "queue_depth", family: "writer_queue_depth", label: None, help: "Blocks waiting in a tier's write queue", kind: G, read: |s| s.queue_depth },
    ];
}

/// How a shutdown ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shutdown {
    /// Everything queued before the stop was written (or refused) in time.
    pub clean: bool,
    /// The deadline passed with blocks still queued or being written: they may be lost.
    pub partial: bool,
    /// Blocks still queued when the deadline passed.
    pub left_in_queue: u64,
}

enum Job {
    Put(BlockMeta, Bytes),
    /// Blocks of one store, written together (one object for the remote tier).
    Run(Vec<(BlockMeta, Bytes)>),
    Snapshot(SnapshotKey, LayoutDigest, Bytes),
    /// Fault injection: the worker panics on it (see [`WriteBehind::inject_panic`]).
    Panic,
    Stop,
}

#[derive(Debug, Default)]
struct Life {
    closing: bool,
    inflight: u64,
    worker_done: bool,
    stopped: Option<Shutdown>,
}

#[derive(Debug, Default)]
struct Counters {
    enqueued: AtomicU64,
    pending_dedup: AtomicU64,
    saved: AtomicU64,
    duplicate: AtomicU64,
    rejected: AtomicU64,
    failed: AtomicU64,
    sync_fallback: AtomicU64,
    dropped_full: AtomicU64,
    dropped_closed: AtomicU64,
    /// Blocks and snapshots admitted for writing that did not reach the tier (failed,
    /// refused, dropped on a full queue) since the last [`WriteBehind::take_unwritten`].
    unwritten: AtomicU64,
}

/// Told about a queued block that did not reach the tier (write failed or refused).
pub type LostHook = Box<dyn Fn(&BlockMeta) + Send + Sync>;

/// Told, on the worker thread, that the worker panicked and ended (with the reason from
/// [`crate::poison::panic_reason`]); the engine closes itself with it.
pub type PanicHook = Box<dyn FnOnce(String) + Send>;

struct Shared {
    target: Arc<dyn Tier>,
    /// Queued blocks not yet written, with their bytes.
    pending: Mutex<HashMap<BlockHash, Bytes>>,
    lost: RwLock<Option<LostHook>>,
    life: Mutex<Life>,
    changed: Condvar,
    counters: Counters,
}

impl Shared {
    /// Marks `meta` as queued; false if it already is.
    fn add_pending(&self, meta: &BlockMeta, payload: &Bytes) -> bool {
        match self.pending.lock().entry(meta.hash) {
            std::collections::hash_map::Entry::Occupied(_) => false,
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(payload.clone());
                true
            }
        }
    }

    fn report_lost(&self, meta: &BlockMeta) {
        if let Some(hook) = self.lost.read().as_ref() {
            hook(meta);
        }
    }

    fn write_snapshot(&self, key: &SnapshotKey, layout: LayoutDigest, blob: &Bytes) {
        let Some(store) = self.target.snapshots() else {
            return;
        };
        match store.put_snapshot(key, layout, blob) {
            Ok(()) => {
                self.counters.saved.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                self.counters.failed.fetch_add(1, Ordering::Relaxed);
                self.counters.unwritten.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %e, "write-behind snapshot store failed");
            }
        }
    }

    fn write_many(&self, batch: &[(BlockMeta, Bytes)]) -> Vec<Result<PutOutcome, ()>> {
        let outcomes = self.target.put_many(batch);
        batch
            .iter()
            .zip(outcomes)
            .map(|((meta, _), o)| self.count(meta, o))
            .collect()
    }

    fn write(&self, meta: &BlockMeta, payload: Bytes) -> Result<PutOutcome, ()> {
        let outcome = self.target.put(meta, payload);
        self.count(meta, outcome)
    }

    fn count(
        &self,
        meta: &BlockMeta,
        outcome: crate::Result<PutOutcome>,
    ) -> Result<PutOutcome, ()> {
        let c = &self.counters;
        match outcome {
            Ok(PutOutcome::Stored) => {
                c.saved.fetch_add(1, Ordering::Relaxed);
                Ok(PutOutcome::Stored)
            }
            Ok(PutOutcome::Duplicate) => {
                c.duplicate.fetch_add(1, Ordering::Relaxed);
                Ok(PutOutcome::Duplicate)
            }
            Ok(other) => {
                c.rejected.fetch_add(1, Ordering::Relaxed);
                c.unwritten.fetch_add(1, Ordering::Relaxed);
                Ok(other)
            }
            Err(e) => {
                c.failed.fetch_add(1, Ordering::Relaxed);
                c.unwritten.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(block = %meta.hash, tier = self.target.kind().name(), error = %e, "write-behind store failed");
                Err(())
            }
        }
    }
}

/// See the module docs.
pub struct WriteBehind {
    shared: Arc<Shared>,
    tx: Sender<Job>,
    config: WriterConfig,
    worker: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl fmt::Debug for WriteBehind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriteBehind")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl WriteBehind {
    /// Starts the worker thread writing into `target`; a panic of the worker is logged.
    pub fn start(target: Arc<dyn Tier>, config: WriterConfig) -> std::io::Result<Self> {
        Self::start_with(target, config, Box::new(|_| {}))
    }

    /// [`WriteBehind::start`], telling `on_panic` if the worker thread dies by a panic
    /// (a tier's panic inside a write is caught per batch and does not end it). After
    /// such a death the worker counts as done: flushes and `stop` return at once instead
    /// of waiting for it.
    pub fn start_with(
        target: Arc<dyn Tier>,
        config: WriterConfig,
        on_panic: PanicHook,
    ) -> std::io::Result<Self> {
        let (tx, rx) = bounded(config.queue_len.max(1));
        let shared = Arc::new(Shared {
            target,
            pending: Mutex::new(HashMap::new()),
            lost: RwLock::new(None),
            life: Mutex::new(Life::default()),
            changed: Condvar::new(),
            counters: Counters::default(),
        });
        let worker = shared.clone();
        let died = shared.clone();
        let handle = crate::poison::spawn(
            format!("kvtier-writer-{}", worker.target.kind().name()),
            move || run(&worker, &rx),
            move |reason| {
                // The receiver is gone with the closure: enqueues now fall back to their
                // overflow policy and the sentinel of `stop` is refused at once.
                let mut life = died.life.lock();
                life.worker_done = true;
                died.changed.notify_all();
                drop(life);
                on_panic(reason);
            },
        )?;
        Ok(Self {
            shared,
            tx,
            config,
            worker: Mutex::new(Some(handle)),
        })
    }

    /// Queues a block for the target tier; returns within the configured wait (plus the
    /// inline write, with [`Overflow::SyncWrite`]).
    pub fn enqueue(&self, meta: BlockMeta, payload: Bytes) -> Enqueued {
        self.admitted(|| self.enqueue_admitted(meta, payload))
    }

    /// Runs `f` as one enqueue in flight (so `stop` waits for it), or refuses with
    /// [`Enqueued::Closed`] once the writer is closing.
    fn admitted(&self, f: impl FnOnce() -> Enqueued) -> Enqueued {
        let s = &self.shared;
        {
            let mut life = s.life.lock();
            if life.closing {
                s.counters.dropped_closed.fetch_add(1, Ordering::Relaxed);
                return Enqueued::Closed;
            }
            life.inflight += 1;
        }
        let outcome = f();
        let mut life = s.life.lock();
        life.inflight -= 1;
        if life.inflight == 0 {
            s.changed.notify_all();
        }
        outcome
    }

    /// Like [`WriteBehind::enqueue`] but never waits and never writes inline: a full queue
    /// drops the block (counted). For callers holding locks, such as eviction.
    pub fn try_enqueue(&self, meta: BlockMeta, payload: Bytes) -> Enqueued {
        let s = &self.shared;
        if s.life.lock().closing {
            s.counters.dropped_closed.fetch_add(1, Ordering::Relaxed);
            return Enqueued::Closed;
        }
        if !s.add_pending(&meta, &payload) {
            s.counters.pending_dedup.fetch_add(1, Ordering::Relaxed);
            return Enqueued::AlreadyPending;
        }
        let hash = meta.hash;
        match self.tx.try_send(Job::Put(meta, payload)) {
            Ok(()) => {
                s.counters.enqueued.fetch_add(1, Ordering::Relaxed);
                Enqueued::Queued
            }
            Err(_) => {
                s.pending.lock().remove(&hash);
                s.counters.dropped_full.fetch_add(1, Ordering::Relaxed);
                Enqueued::Dropped
            }
        }
    }

    fn enqueue_admitted(&self, meta: BlockMeta, payload: Bytes) -> Enqueued {
        let s = &self.shared;
        if !s.add_pending(&meta, &payload) {
            s.counters.pending_dedup.fetch_add(1, Ordering::Relaxed);
            return Enqueued::AlreadyPending;
        }
        let hash = meta.hash;
        let job = match self.tx.try_send(Job::Put(meta, payload)) {
            Ok(()) => {
                s.counters.enqueued.fetch_add(1, Ordering::Relaxed);
                return Enqueued::Queued;
            }
            Err(TrySendError::Full(job) | TrySendError::Disconnected(job)) => job,
        };
        let job = match self.tx.send_timeout(job, self.config.wait) {
            Ok(()) => {
                s.counters.enqueued.fetch_add(1, Ordering::Relaxed);
                return Enqueued::Queued;
            }
            Err(e) => e.into_inner(),
        };
        s.pending.lock().remove(&hash);
        let Job::Put(meta, payload) = job else {
            return Enqueued::Closed;
        };
        match self.config.overflow {
            Overflow::SyncWrite => {
                s.counters.sync_fallback.fetch_add(1, Ordering::Relaxed);
                let outcome = s.target.put_for_caller(&meta, payload);
                Enqueued::WrittenInline(s.count(&meta, outcome))
            }
            Overflow::Drop => {
                s.counters.dropped_full.fetch_add(1, Ordering::Relaxed);
                s.counters.unwritten.fetch_add(1, Ordering::Relaxed);
                Enqueued::Dropped
            }
        }
    }

    /// Queues the blocks of one store as one job, so the tier gets them in one call (the
    /// remote tier writes them as one object). Blocks already queued are left out. Never
    /// waits longer than the configured wait; then the overflow policy applies to the
    /// whole run.
    pub fn enqueue_run(&self, items: Vec<(BlockMeta, Bytes)>) -> Enqueued {
        self.admitted(|| {
            let s = &self.shared;
            let items: Vec<(BlockMeta, Bytes)> = items
                .into_iter()
                .filter(|(m, p)| {
                    let fresh = s.add_pending(m, p);
                    if !fresh {
                        s.counters.pending_dedup.fetch_add(1, Ordering::Relaxed);
                    }
                    fresh
                })
                .collect();
            if items.is_empty() {
                return Enqueued::AlreadyPending;
            }
            let n = items.len() as u64;
            let job = match self.tx.send_timeout(Job::Run(items), self.config.wait) {
                Ok(()) => {
                    s.counters.enqueued.fetch_add(n, Ordering::Relaxed);
                    return Enqueued::Queued;
                }
                Err(e) => e.into_inner(),
            };
            let Job::Run(items) = job else {
                return Enqueued::Closed;
            };
            match self.config.overflow {
                Overflow::SyncWrite => {
                    s.counters.sync_fallback.fetch_add(n, Ordering::Relaxed);
                    write_batch(s, items);
                    Enqueued::WrittenInline(Ok(PutOutcome::Stored))
                }
                Overflow::Drop => {
                    let mut pending = s.pending.lock();
                    for (m, _) in &items {
                        pending.remove(&m.hash);
                    }
                    s.counters.dropped_full.fetch_add(n, Ordering::Relaxed);
                    s.counters.unwritten.fetch_add(n, Ordering::Relaxed);
                    Enqueued::Dropped
                }
            }
        })
    }

    /// Queues a snapshot for the target tier's snapshot store (a no-op for a tier without
    /// one). Never waits: a full queue writes it on the caller's thread.
    pub fn enqueue_snapshot(
        &self,
        key: SnapshotKey,
        layout: LayoutDigest,
        blob: Bytes,
    ) -> Enqueued {
        let s = &self.shared;
        if s.target.snapshots().is_none() {
            return Enqueued::Dropped;
        }
        self.admitted(
            || match self.tx.try_send(Job::Snapshot(key, layout, blob)) {
                Ok(()) => {
                    s.counters.enqueued.fetch_add(1, Ordering::Relaxed);
                    Enqueued::Queued
                }
                Err(
                    TrySendError::Full(Job::Snapshot(key, layout, blob))
                    | TrySendError::Disconnected(Job::Snapshot(key, layout, blob)),
                ) => {
                    s.counters.sync_fallback.fetch_add(1, Ordering::Relaxed);
                    s.write_snapshot(&key, layout, &blob);
                    Enqueued::WrittenInline(Ok(PutOutcome::Stored))
                }
                Err(_) => Enqueued::Dropped,
            },
        )
    }

    /// Waits until everything queued so far is written (or `timeout` passes); the writer
    /// keeps running. Returns whether the queue drained in time.
    pub fn flush(&self, timeout: Duration) -> bool {
        let s = &self.shared;
        let deadline = Instant::now() + timeout;
        let mut life = s.life.lock();
        loop {
            if s.pending.lock().is_empty() && life.inflight == 0 {
                return true;
            }
            if life.worker_done || s.changed.wait_until(&mut life, deadline).timed_out() {
                return s.pending.lock().is_empty();
            }
        }
    }

    /// How many blocks and snapshots admitted for writing did not reach the tier — the
    /// write failed or the tier refused it, or a full queue dropped it — since the previous
    /// call (or the start); resets the count. A flush reports it: a queue that emptied is
    /// not a queue whose every block was written.
    pub fn take_unwritten(&self) -> u64 {
        self.shared.counters.unwritten.swap(0, Ordering::SeqCst)
    }

    /// Whether `hash` is queued and not yet written.
    pub fn is_pending(&self, hash: &BlockHash) -> bool {
        self.shared.pending.lock().contains_key(hash)
    }

    /// The kind of tier this writer writes to.
    pub fn target_kind(&self) -> super::TierKind {
        self.shared.target.kind()
    }

    /// The bytes of `hash` if it is queued and not yet written.
    pub fn pending_payload(&self, hash: &BlockHash) -> Option<Bytes> {
        self.shared.pending.lock().get(hash).cloned()
    }

    /// Sets the hook told about every queued block whose write fails or is refused (not
    /// about blocks dropped before they were queued: the caller sees those). Cleared by
    /// [`WriteBehind::stop`]: after it, nothing is reported.
    pub fn on_lost(&self, hook: LostHook) {
        *self.shared.lost.write() = Some(hook);
    }

    /// Stops admitting, lets enqueues in flight finish, drains the queue and stops the
    /// worker, waiting at most `timeout` in all. Calling it again returns the first report.
    pub fn stop(&self, timeout: Duration) -> Shutdown {
        let s = &self.shared;
        let deadline = Instant::now() + timeout;
        let mut life = s.life.lock();
        if let Some(done) = life.stopped {
            return done;
        }
        life.closing = true;
        // Whoever owns the hook may reuse what it points at once the writer is stopped.
        *s.lost.write() = None;
        while life.inflight > 0 {
            if s.changed.wait_until(&mut life, deadline).timed_out() {
                break;
            }
        }
        drop(life);
        let remaining = deadline.saturating_duration_since(Instant::now());
        let sentinel_sent = self.tx.send_timeout(Job::Stop, remaining).is_ok();
        let mut life = s.life.lock();
        while sentinel_sent && !life.worker_done {
            if s.changed.wait_until(&mut life, deadline).timed_out() {
                break;
            }
        }
        let clean = sentinel_sent && life.worker_done && life.inflight == 0;
        let left = self.tx.len() as u64;
        let report = Shutdown {
            clean,
            partial: !clean,
            left_in_queue: if clean { 0 } else { left },
        };
        if !clean {
            tracing::error!(
                left_in_queue = left,
                "writer did not drain before its deadline; queued blocks may be lost"
            );
        }
        life.stopped = Some(report);
        drop(life);
        if clean {
            // The worker has finished its loop; joining waits only for it to release its
            // handle on the tier, so the tier is closed when `stop` returns.
            if let Some(handle) = self.worker.lock().take() {
                let _ = handle.join();
            }
        }
        report
    }

    /// Fault injection for tests: makes the worker thread panic when it reaches this job
    /// (after what is queued before it). Not for production use.
    #[doc(hidden)]
    pub fn inject_panic(&self) {
        let _ = self.tx.send_timeout(Job::Panic, Duration::from_secs(1));
    }

    /// The counters now.
    pub fn stats(&self) -> WriterStats {
        let c = &self.shared.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        WriterStats {
            enqueued: get(&c.enqueued),
            pending_dedup: get(&c.pending_dedup),
            saved: get(&c.saved),
            duplicate: get(&c.duplicate),
            rejected: get(&c.rejected),
            failed: get(&c.failed),
            sync_fallback: get(&c.sync_fallback),
            dropped_full: get(&c.dropped_full),
            dropped_closed: get(&c.dropped_closed),
            queue_depth: self.tx.len() as u64,
        }
    }
}

impl Drop for WriteBehind {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(5));
    }
}

/// Blocks queued one by one that the worker hands a tier in one call at most, when the
/// tier takes batches ([`Tier::takes_batches`]).
const BATCH: usize = 16;

fn run(s: &Shared, rx: &Receiver<Job>) {
    let batches = s.target.takes_batches();
    let mut next = None;
    while let Some(job) = next.take().or_else(|| rx.recv().ok()) {
        match job {
            Job::Put(meta, payload) if batches => {
                // What else is queued already, in order, up to a batch: the tier works on
                // them together (the SSD tier encodes the next pages while it writes).
                // Any other job waits its turn after them.
                let mut batch = vec![(meta, payload)];
                while batch.len() < BATCH {
                    match rx.try_recv() {
                        Ok(Job::Put(meta, payload)) => batch.push((meta, payload)),
                        Ok(other) => {
                            next = Some(other);
                            break;
                        }
                        Err(_) => break,
                    }
                }
                write_batch(s, batch);
            }
            Job::Put(meta, payload) => write_batch(s, vec![(meta, payload)]),
            // The blocks of one store, in one call: a tier that writes in batches (the
            // remote tier: one object) sees them together.
            Job::Run(items) => write_batch(s, items),
            Job::Snapshot(key, layout, blob) => {
                s.write_snapshot(&key, layout, &blob);
                let _life = s.life.lock();
                s.changed.notify_all();
            }
            #[expect(clippy::panic, reason = "fault injection, asked for by a test")]
            Job::Panic => panic!("injected fault"),
            Job::Stop => break,
        }
    }
    let mut life = s.life.lock();
    life.worker_done = true;
    s.changed.notify_all();
}

fn write_batch(s: &Shared, batch: Vec<(BlockMeta, Bytes)>) {
    // A panic inside a tier must not leave `stop` waiting forever.
    let written = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        if batch.len() == 1 {
            vec![s.write(&batch[0].0, batch[0].1.clone())]
        } else {
            s.write_many(&batch)
        }
    }));
    let outcomes: Vec<Result<PutOutcome, ()>> = match written {
        Ok(o) => o,
        Err(_) => {
            s.counters
                .failed
                .fetch_add(batch.len() as u64, Ordering::Relaxed);
            s.counters
                .unwritten
                .fetch_add(batch.len() as u64, Ordering::Relaxed);
            tracing::error!(
                blocks = batch.len(),
                "a tier panicked while writing; the blocks are lost"
            );
            vec![Err(()); batch.len()]
        }
    };
    for (i, (meta, _)) in batch.iter().enumerate() {
        let kept = matches!(
            outcomes.get(i),
            Some(Ok(PutOutcome::Stored | PutOutcome::Duplicate))
        );
        if !kept {
            s.report_lost(meta);
        }
        s.pending.lock().remove(&meta.hash);
    }
    let _life = s.life.lock();
    s.changed.notify_all();
}
