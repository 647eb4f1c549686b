//! A persistent tier for tests that need one below the engine without disk: a RAM tier
//! that says it is the SSD, whose reads of one chosen block can be made to fail, or to
//! answer a miss for a reason (as a real tier does for a block failing its checksum).

#![allow(clippy::unwrap_used, reason = "test code")]

use std::ops::Range;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use kvtier_core::hash::BlockHash;
use kvtier_core::stats::TierStats;
use kvtier_core::tier::conformance::test_layout;
use kvtier_core::tier::{
    BlockMeta, PutOutcome, RamConfig, RamTier, ResidencySink, RunRead, ShortRead, Tier, TierKind,
};
use kvtier_core::{Engine, Error, ErrorKind, Layout, PersistConfig, PersistMode};

/// A RAM tier standing in for the SSD below the engine; a read of the block set with
/// [`StandIn::fail_reads_of`] fails with the error kind given, one set with
/// [`StandIn::miss_reads_of`] answers a miss for the reason given.
#[derive(Debug)]
pub struct StandIn {
    ram: RamTier,
    failing: Mutex<Option<(BlockHash, ErrorKind)>>,
    missing: Mutex<Option<(BlockHash, ShortRead)>>,
}

impl StandIn {
    /// From now on, reads of `hash` fail with `kind`.
    #[allow(dead_code, reason = "not every test binary injects read failures")]
    pub fn fail_reads_of(&self, hash: BlockHash, kind: ErrorKind) {
        *self.failing.lock().unwrap() = Some((hash, kind));
    }

    /// From now on, reads of `hash` answer a miss for `why`.
    #[allow(dead_code, reason = "not every test binary injects misses")]
    pub fn miss_reads_of(&self, hash: BlockHash, why: ShortRead) {
        *self.missing.lock().unwrap() = Some((hash, why));
    }

    fn missed(&self, hash: &BlockHash) -> Option<ShortRead> {
        let missing = *self.missing.lock().unwrap();
        missing.and_then(|(h, why)| (h == *hash).then_some(why))
    }
}

impl Tier for StandIn {
    fn kind(&self) -> TierKind {
        TierKind::Ssd
    }
    fn put(&self, meta: &BlockMeta, payload: Bytes) -> kvtier_core::Result<PutOutcome> {
        self.ram.put(meta, payload)
    }
    fn get(&self, hash: &BlockHash) -> kvtier_core::Result<Option<Bytes>> {
        if let Some((h, kind)) = *self.failing.lock().unwrap()
            && h == *hash
        {
            return Err(Error::new(kind, format!("injected: block=`{hash:?}`")));
        }
        if self.missed(hash).is_some() {
            return Ok(None);
        }
        self.ram.get(hash)
    }
    fn read_run(&self, hashes: &[BlockHash]) -> kvtier_core::Result<RunRead> {
        let mut out = RunRead::default();
        for hash in hashes {
            if let Some(why) = self.missed(hash) {
                out.short = Some(why);
                break;
            }
            match self.get(hash)? {
                Some(b) => out.blocks.push(b),
                None => {
                    out.short = Some(ShortRead::NotHeld);
                    break;
                }
            }
        }
        Ok(out)
    }
    fn get_range(&self, hash: &BlockHash, range: Range<u64>) -> kvtier_core::Result<Option<Bytes>> {
        Ok(self.read_range(hash, range)?.ok())
    }
    fn read_range(
        &self,
        hash: &BlockHash,
        range: Range<u64>,
    ) -> kvtier_core::Result<Result<Bytes, ShortRead>> {
        if let Some(why) = self.missed(hash) {
            return Ok(Err(why));
        }
        Ok(self.ram.get_range(hash, range)?.ok_or(ShortRead::NotHeld))
    }
    fn contains(&self, hash: &BlockHash) -> bool {
        self.ram.contains(hash)
    }
    fn remove(&self, hash: &BlockHash) -> kvtier_core::Result<bool> {
        self.ram.remove(hash)
    }
    fn stats(&self) -> TierStats {
        self.ram.stats()
    }
}

/// An engine with a RAM tier of 64 blocks over a [`StandIn`] written through, the test
/// layout registered.
pub fn engine() -> (Engine, Arc<Layout>, Arc<StandIn>) {
    let layout = test_layout().unwrap();
    let lower = Arc::new(StandIn {
        ram: RamTier::standalone(RamConfig {
            capacity_bytes: 64 << 20,
        }),
        failing: Mutex::new(None),
        missing: Mutex::new(None),
    });
    let tier = lower.clone();
    let e = Engine::builder()
        .ram(RamConfig {
            capacity_bytes: 64 * layout.block_bytes(),
        })
        .persistent_tier(
            PersistConfig {
                mode: PersistMode::WriteThrough,
                ..PersistConfig::default()
            },
            move |_sink: Arc<dyn ResidencySink>| Ok(tier as Arc<dyn Tier>),
        )
        .build()
        .unwrap();
    let layout = e.register_layout(layout.key().clone()).unwrap();
    (e, layout, lower)
}
