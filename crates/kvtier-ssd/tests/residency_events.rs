//! Residency events: an engine with RAM and a real SSD tier tells its observers every
//! insertion, removal (with its cause), promotion and detachment, and a slow observer
//! never blocks a store (it misses events instead, counted), while the index misses none.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests"
)]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvtier_core::events::{Removal, ResidencyEvent, ResidencyObserver};
use kvtier_core::tier::{RamConfig, ResidencySink, Tier, TierKind};
use kvtier_core::{Engine, ErrorKind, ExtraKeys, KvDtype, LayoutKey, PersistConfig};
use kvtier_ssd::{SsdConfig, SsdTier};
use parking_lot::{Condvar, Mutex};

fn key() -> LayoutKey {
    LayoutKey::new("events-test", KvDtype::F16, 16, 2, 2, 16) // 4 KiB blocks
}

fn engine(dir: Option<&Path>, ram_blocks: u64) -> Engine {
    let mut b = Engine::builder().ram(RamConfig {
        capacity_bytes: ram_blocks * 4096,
    });
    if let Some(dir) = dir {
        let mut config = SsdConfig::new(dir);
        config.min_free_bytes = 0;
        b = b.persistent_tier(
            PersistConfig {
                prefetch: false,
                ..PersistConfig::default()
            },
            move |sink: Arc<dyn ResidencySink>| {
                let clock = Arc::new(kvtier_core::clock::SystemClock::new());
                Ok(Arc::new(SsdTier::open(config, clock, sink)?) as Arc<dyn Tier>)
            },
        );
    }
    b.build().expect("engine")
}

/// Keeps every event it is handed.
#[derive(Default)]
struct Recorder {
    events: Mutex<Vec<ResidencyEvent>>,
}

impl ResidencyObserver for Recorder {
    fn observe(&self, events: &[ResidencyEvent]) {
        self.events.lock().extend_from_slice(events);
    }
}

impl Recorder {
    /// Waits (up to 10 s) until `done` holds for the events so far.
    fn wait_for(&self, what: &str, done: impl Fn(&[ResidencyEvent]) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done(&self.events.lock()) {
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}: {:#?}",
                self.events.lock()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

fn inserted(tier: TierKind) -> impl Fn(&ResidencyEvent) -> bool {
    move |e| matches!(e, ResidencyEvent::Inserted { tier: t, .. } if *t == tier)
}

fn removed(tier: TierKind, cause: Removal) -> impl Fn(&ResidencyEvent) -> bool {
    move |e| matches!(e, ResidencyEvent::Removed { tier: t, cause: c, .. } if *t == tier && *c == cause)
}

#[test]
fn observers_hear_every_insertion_removal_promotion_and_detachment() {
    let dir = tempfile::tempdir().unwrap();
    // RAM holds four blocks; the SSD takes everything (write-through).
    let e = engine(Some(dir.path()), 4);
    let recorder = Arc::new(Recorder::default());
    let _handle = e.observe("recorder", recorder.clone(), 1024).unwrap();
    let layout = e.register_layout(key()).unwrap();
    let payload = vec![7u8; layout.block_bytes() as usize];
    let prompt_of = |seed: u32| {
        let tokens: Vec<u32> = (0..48).map(|t| seed * 1000 + t).collect();
        e.prompt(layout.digest(), &tokens, &ExtraKeys::none())
            .unwrap()
    };
    let (a, b) = (prompt_of(1), prompt_of(2));
    e.store(&a, &[&payload, &payload, &payload]).unwrap();
    assert!(e.flush(Duration::from_secs(10)));
    recorder.wait_for("3 RAM and 3 SSD insertions", |ev| {
        ev.iter().filter(|e| inserted(TierKind::Ram)(e)).count() == 3
            && ev.iter().filter(|e| inserted(TierKind::Ssd)(e)).count() == 3
    });
    // The events name the blocks stored, in chain order for each tier.
    let ram_positions: Vec<u32> = recorder
        .events
        .lock()
        .iter()
        .filter(|e| inserted(TierKind::Ram)(e))
        .map(|e| e.block().position)
        .collect();
    assert_eq!(ram_positions, [0, 1, 2]);
    assert!(
        recorder
            .events
            .lock()
            .iter()
            .all(|e| a.hashes().contains(&e.block().hash))
    );

    // A second chain pushes two of the first out of RAM: evicted, not deleted.
    e.store(&b, &[&payload, &payload, &payload]).unwrap();
    recorder.wait_for("2 RAM evictions", |ev| {
        ev.iter()
            .filter(|e| removed(TierKind::Ram, Removal::Evicted)(e))
            .count()
            == 2
    });

    // Loading the first chain reads the evicted blocks from the SSD: promotions ssd→ram.
    let hit = e.lookup(&a);
    assert_eq!(hit.blocks.len(), 3);
    let loaded = e.load(&hit).unwrap();
    assert!(loaded.complete);
    let promoted_now = e.stats().moved(TierKind::Ssd, TierKind::Ram).promoted;
    assert!(promoted_now >= 1, "{:?}", e.stats());
    recorder.wait_for("the promotions", |ev| {
        ev.iter()
            .filter(|e| {
                matches!(
                    e,
                    ResidencyEvent::Promoted {
                        from: TierKind::Ssd,
                        to: TierKind::Ram,
                        ..
                    }
                )
            })
            .count() as u64
            == promoted_now
    });

    // Detaching the SSD tier removes all it held, with the cause `Detached`.
    assert!(e.flush(Duration::from_secs(10)));
    let held = e.stats().tier(TierKind::Ssd).unwrap().resident_blocks;
    assert_eq!(held, 6);
    let report = e
        .reattach_persistent(None, Duration::from_secs(10))
        .unwrap();
    assert_eq!(report.detached_blocks, 6);
    recorder.wait_for("6 detachments", |ev| {
        ev.iter()
            .filter(|e| removed(TierKind::Ssd, Removal::Detached)(e))
            .count()
            == 6
    });

    // A namespace delete removes what RAM holds, with the cause `Deleted`.
    let in_ram = e.stats().ram.resident_blocks as usize;
    assert!(in_ram > 0);
    e.delete_namespace(layout.digest()).unwrap();
    recorder.wait_for("the deletions", |ev| {
        ev.iter()
            .filter(|e| removed(TierKind::Ram, Removal::Deleted)(e))
            .count()
            == in_ram
    });
    let s = e.stats();
    assert_eq!(s.observers.len(), 1);
    assert_eq!(s.observers[0].dropped, 0, "{s:?}");
    assert_eq!(
        s.observers[0].delivered as usize,
        recorder.events.lock().len()
    );
}

/// An observer stuck until its gate opens.
struct Stuck {
    open: Mutex<bool>,
    opened: Condvar,
    seen: Mutex<usize>,
}

impl ResidencyObserver for Stuck {
    fn observe(&self, events: &[ResidencyEvent]) {
        let mut open = self.open.lock();
        while !*open {
            self.opened.wait(&mut open);
        }
        *self.seen.lock() += events.len();
    }
}

#[test]
fn a_stuck_observer_never_blocks_stores_and_its_misses_are_counted() {
    let e = Arc::new(engine(None, 256));
    let stuck = Arc::new(Stuck {
        open: Mutex::new(false),
        opened: Condvar::new(),
        seen: Mutex::new(0),
    });
    let recorder = Arc::new(Recorder::default());
    let _slow = e.observe("stuck", stuck.clone(), 4).unwrap();
    let _fast = e.observe("fast", recorder.clone(), 1024).unwrap();
    let layout = e.register_layout(key()).unwrap();
    let digest = layout.digest();
    let payload = vec![3u8; layout.block_bytes() as usize];
    // 100 one-block conversations, stored on another thread while the observer is stuck.
    let (done_tx, done_rx) = crossbeam_channel::bounded(1);
    let storing = {
        let e = e.clone();
        std::thread::spawn(move || {
            for c in 0..100u32 {
                let tokens: Vec<u32> = (0..16).map(|t| c * 100 + t).collect();
                let p = e.prompt(digest, &tokens, &ExtraKeys::none()).unwrap();
                e.store(&p, &[&payload]).unwrap();
            }
            done_tx.send(()).unwrap();
        })
    };
    let finished = done_rx.recv_timeout(Duration::from_secs(60));
    assert!(
        finished.is_ok(),
        "stores waited for a stuck observer (it must never block them)"
    );
    storing.join().unwrap();
    // The index missed nothing: every conversation hits.
    assert_eq!(e.stats().index.entries, 100);
    // The stuck observer missed most events, counted; the fast one missed none.
    let s = e.stats();
    let stuck_stats = s.observers.iter().find(|o| o.name == "stuck").unwrap();
    assert!(stuck_stats.dropped >= 90, "{stuck_stats:?}");
    recorder.wait_for("100 insertions", |ev| ev.len() == 100);
    let fast_stats = e
        .stats()
        .observers
        .into_iter()
        .find(|o| o.name == "fast")
        .unwrap();
    assert_eq!((fast_stats.delivered, fast_stats.dropped), (100, 0));
    let counters: std::collections::HashMap<String, u64> =
        e.stats().counters().into_iter().collect();
    assert_eq!(counters["observer_stuck_dropped"], stuck_stats.dropped);
    // Opened, it receives what its queue held: delivered + dropped = every event.
    *stuck.open.lock() = true;
    stuck.opened.notify_all();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let o = e
            .stats()
            .observers
            .into_iter()
            .find(|o| o.name == "stuck")
            .unwrap();
        if o.delivered + o.dropped == 100 && o.queued == 0 {
            assert_eq!(*stuck.seen.lock() as u64, o.delivered);
            break;
        }
        assert!(Instant::now() < deadline, "{o:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn observer_names_are_checked_and_dropping_the_handle_unregisters() {
    let e = engine(None, 16);
    let recorder = Arc::new(Recorder::default());
    for bad in ["", "Has Space", "dash-ed", "UPPER"] {
        let err = e.observe(bad, recorder.clone(), 8).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Invalid, "{bad:?}");
    }
    assert_eq!(
        e.observe("zero", recorder.clone(), 0).unwrap_err().kind(),
        ErrorKind::Invalid
    );
    let handle = e.observe("once", recorder.clone(), 8).unwrap();
    assert_eq!(
        e.observe("once", recorder.clone(), 8).unwrap_err().kind(),
        ErrorKind::Invalid,
        "names are unique"
    );
    assert_eq!(e.stats().observers.len(), 1);
    drop(handle);
    assert!(e.stats().observers.is_empty());
    // Unregistered: it hears nothing more.
    let layout = e.register_layout(key()).unwrap();
    let tokens: Vec<u32> = (0..16).collect();
    let p = e
        .prompt(layout.digest(), &tokens, &ExtraKeys::none())
        .unwrap();
    e.store(&p, &[&vec![1u8; layout.block_bytes() as usize]])
        .unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert!(recorder.events.lock().is_empty());
}
