//! A hash map keyed by [`BlockHash`], split into independently locked shards.
//!
//! Block hashes are uniformly distributed already, so the map uses their low bits directly
//! (no second hash) and picks the shard from another byte. Each shard is guarded by a
//! [`ShardedLock`], whose readers lock only a per-thread slot: two threads reading the same
//! shard write no shared cache line, so reads scale with threads. Writers lock every slot,
//! which is fine for the store and evict paths, which are far rarer than reads.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use std::sync::PoisonError;

use crossbeam_utils::sync::{ShardedLock, ShardedLockReadGuard, ShardedLockWriteGuard};

use crate::hash::BlockHash;

const SHARD_BITS: u32 = 6;
const SHARDS: usize = 1 << SHARD_BITS;

/// A hasher for keys that are already uniform hashes: it passes their bits through.
#[derive(Debug, Default, Clone, Copy)]
pub struct PassThroughHasher(u64);

impl Hasher for PassThroughHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Not used by `BlockHash` (which writes one u64); fold anything else in.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, word: u64) {
        self.0 = word;
    }
}

/// The map type of one shard.
pub type ShardMap<V> = HashMap<BlockHash, V, BuildHasherDefault<PassThroughHasher>>;

/// One shard.
#[derive(Debug, Default)]
struct Shard<V>(ShardedLock<ShardMap<V>>);

/// A [`BlockHash`]-keyed map in 64 shards.
#[derive(Debug)]
pub struct ShardedMap<V> {
    shards: Box<[Shard<V>]>,
}

impl<V> Default for ShardedMap<V> {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS)
                .map(|_| Shard(ShardedLock::new(ShardMap::default())))
                .collect(),
        }
    }
}

impl<V> ShardedMap<V> {
    fn shard(&self, key: &BlockHash) -> &ShardedLock<ShardMap<V>> {
        &self.shards[shard_of(key)].0
    }

    /// The number of the shard holding `key`.
    pub fn shard_index(&self, key: &BlockHash) -> usize {
        shard_of(key)
    }

    /// A read guard on the shard holding `key`.
    pub fn read(&self, key: &BlockHash) -> ShardedLockReadGuard<'_, ShardMap<V>> {
        // A panic while holding a guard cannot leave a map half-updated in a way readers
        // could misread (each update is one insert or remove), so poisoning is ignored.
        self.shard(key)
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// A write guard on the shard holding `key`.
    pub fn write(&self, key: &BlockHash) -> ShardedLockWriteGuard<'_, ShardMap<V>> {
        self.shard(key)
            .write()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Read guards on every shard at once, for a long walk that would otherwise lock and
    /// unlock a shard per key. Writers wait until the guards are dropped.
    pub fn read_all(&self) -> AllShards<'_, V> {
        AllShards {
            guards: self
                .shards
                .iter()
                .map(|s| s.0.read().unwrap_or_else(PoisonError::into_inner))
                .collect(),
        }
    }

    /// Runs `f` on every shard under its write lock, one shard at a time.
    pub fn for_each_mut(&self, mut f: impl FnMut(&mut ShardMap<V>)) {
        for shard in self.shards.iter() {
            f(&mut shard.0.write().unwrap_or_else(PoisonError::into_inner));
        }
    }

    /// Entries in all shards (not atomic across shards).
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                s.0.read()
                    .map_or_else(|p| p.into_inner().len(), |g| g.len())
            })
            .sum()
    }

    /// True when every shard is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn shard_of(key: &BlockHash) -> usize {
    (key.0[0] as usize) & (SHARDS - 1)
}

/// Read guards on all shards of a [`ShardedMap`].
pub struct AllShards<'a, V> {
    guards: Vec<ShardedLockReadGuard<'a, ShardMap<V>>>,
}

impl<V> AllShards<'_, V> {
    /// The value under `key`.
    pub fn get(&self, key: &BlockHash) -> Option<&V> {
        self.guards[shard_of(key)].get(key)
    }
}
