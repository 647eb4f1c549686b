//! A background thread that panics closes the engine: every later call fails with
//! `Closed` and the reason, within a second, instead of hanging (issue 36, item 3).

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
use kvtier_core::tier::conformance::test_layout;
use kvtier_core::tier::{BlockMeta, PutOutcome, RamConfig, RamTier, ResidencySink, Tier, TierKind};
use kvtier_core::{
    Ack, Engine, ErrorKind, ExtraKeys, Layout, PersistConfig, PersistMode, StoreOptions,
};

/// A RAM tier standing in for the SSD below the engine.
#[derive(Debug)]
struct Lower(RamTier);

impl Tier for Lower {
    fn kind(&self) -> TierKind {
        TierKind::Ssd
    }
    fn put(&self, meta: &BlockMeta, payload: Bytes) -> kvtier_core::Result<PutOutcome> {
        self.0.put(meta, payload)
    }
    fn get(&self, hash: &BlockHash) -> kvtier_core::Result<Option<Bytes>> {
        self.0.get(hash)
    }
    fn get_range(&self, hash: &BlockHash, range: Range<u64>) -> kvtier_core::Result<Option<Bytes>> {
        self.0.get_range(hash, range)
    }
    fn contains(&self, hash: &BlockHash) -> bool {
        self.0.contains(hash)
    }
    fn remove(&self, hash: &BlockHash) -> kvtier_core::Result<bool> {
        self.0.remove(hash)
    }
    fn stats(&self) -> TierStats {
        self.0.stats()
    }
}

fn engine() -> (Engine, Arc<Layout>) {
    let layout = test_layout().unwrap();
    let lower = Arc::new(Lower(RamTier::standalone(RamConfig {
        capacity_bytes: 64 << 20,
    })));
    let e = Engine::builder()
        .ram(RamConfig {
            capacity_bytes: 64 * layout.block_bytes(),
        })
        .persistent_tier(
            PersistConfig {
                mode: PersistMode::WriteThrough,
                ..PersistConfig::default()
            },
            move |_sink: Arc<dyn ResidencySink>| Ok(lower as Arc<dyn Tier>),
        )
        .build()
        .unwrap();
    let layout = e.register_layout(layout.key().clone()).unwrap();
    (e, layout)
}

fn store(e: &Engine, layout: &Layout, first: u32, ack: Option<Ack>) -> kvtier_core::Result<()> {
    let tokens: Vec<u32> = (0..layout.tokens_per_block() as u32)
        .map(|t| first + t)
        .collect();
    let prompt = e.prompt(layout.digest(), &tokens, &ExtraKeys::none())?;
    let payload = vec![7u8; layout.block_bytes() as usize];
    e.store_with(&prompt, &[&payload], StoreOptions { ack })?;
    Ok(())
}

#[test]
fn a_writer_that_panics_closes_the_engine_within_a_second() -> kvtier_core::Result<()> {
    let (e, layout) = engine();
    store(&e, &layout, 100, None)?;
    assert!(e.flush(Duration::from_secs(5)));
    assert!(e.poison().reason().is_none());

    e.inject_background_panic();
    let started = Instant::now();
    let err = loop {
        match store(&e, &layout, 200, None) {
            Err(err) => break err,
            Ok(()) => {
                assert!(
                    started.elapsed() < Duration::from_secs(1),
                    "still open after 1 s"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    };
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(err.kind(), ErrorKind::Closed, "{err}");
    assert!(
        err.message()
            .contains("background thread `kvtier-writer-ssd` panicked: injected fault"),
        "{err}"
    );

    // Every later call says the same, a durable store included, and none waits.
    let started = Instant::now();
    let durable = store(&e, &layout, 300, Some(Ack::Written)).unwrap_err();
    assert_eq!(durable.kind(), ErrorKind::Closed);
    let lookup = e.lookup(&e.prompt(layout.digest(), &[1, 2, 3], &ExtraKeys::none())?);
    assert_eq!(
        e.load(&lookup.blocks).unwrap_err().kind(),
        ErrorKind::Closed
    );
    assert_eq!(
        e.snapshot_put(layout.digest(), &[1], None, b"x")
            .unwrap_err()
            .kind(),
        ErrorKind::Closed
    );
    assert_eq!(
        e.register_layout(layout.key().clone()).unwrap_err().kind(),
        ErrorKind::Closed
    );
    // A flush does not wait for the dead worker.
    e.flush(Duration::from_secs(30));
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    Ok(())
}
