//! Recurrent state on the remote tier (issue 16), against `kvtier gateway`: checkpoints
//! and exact-prefix snapshots written by one engine are restored by another that shares
//! only the bucket (a second replica, or the same one after a restart), each with one GET;
//! a damaged, substituted or deleted state object is a miss, never served; a hybrid hit
//! is still all-or-nothing when only the state reached the bucket.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests"
)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::Gateway;
use kvtier_core::engine::RemoteAttach;
use kvtier_core::snapshot::{CheckpointConfig, SnapshotConfig};
use kvtier_core::tier::RamConfig;
use kvtier_core::{Engine, ExtraKeys, KvDtype, LayoutKey, StateGroup, TierKind};
use kvtier_remote::{Endpoint, RemoteTier};
use object_store::ObjectStoreExt;
use object_store::path::Path;

const TPB: usize = 16;
const STATE_BYTES: u64 = 40_000;

/// Two attention layers and one Mamba-like state group: a hybrid layout.
fn hybrid_key() -> LayoutKey {
    let mut k = LayoutKey::new("remote-hybrid", KvDtype::F16, TPB as u32, 2, 1, 32);
    k.state_groups = vec![StateGroup {
        kind: "mamba1/f32".into(),
        num_layers: 2,
        state_bytes: STATE_BYTES,
    }];
    k
}

/// A replica: RAM, the remote tier on `endpoint` under `prefix`, checkpoints every
/// 2 blocks. Its remote tier is returned too, to look at its requests.
fn replica(endpoint: &Endpoint, prefix: &str) -> (Engine, Arc<RemoteTier>) {
    let config = common::config(endpoint.clone(), prefix);
    let held: Arc<parking_lot::Mutex<Option<Arc<RemoteTier>>>> = Arc::default();
    let slot = held.clone();
    let engine = Engine::builder()
        .ram(RamConfig {
            capacity_bytes: 64 << 20,
        })
        .checkpoint(CheckpointConfig {
            every_tokens: (2 * TPB) as u32,
            bucket: SnapshotConfig {
                max_bytes: 16 << 20,
                ..CheckpointConfig::default().bucket
            },
        })
        .remote_tier(RemoteAttach::default(), move |sink| {
            let tier = Arc::new(RemoteTier::open(config, sink)?);
            *slot.lock() = Some(tier.clone());
            Ok(tier)
        })
        .build()
        .expect("engine");
    engine.register_layout(hybrid_key()).expect("layout");
    let tier = held.lock().clone().expect("remote tier built");
    (engine, tier)
}

fn tokens(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|t| t.wrapping_mul(2_654_435_761) ^ seed)
        .collect()
}

fn bytes_for(seed: u64, len: u64) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(0x9E37_79B9) ^ seed) as u8)
        .collect()
}

/// Stores every block of `t` and a checkpoint at every boundary; returns the blocks'
/// and the checkpoints' bytes.
fn store_with_checkpoints(engine: &Engine, t: &[u32]) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let digest = hybrid_key().digest();
    let prompt = engine.prompt(digest, t, &ExtraKeys::none()).unwrap();
    let block = engine.layout(digest).unwrap().block_bytes();
    let blocks: Vec<Vec<u8>> = (0..prompt.num_blocks())
        .map(|b| bytes_for(b as u64 + 1, block))
        .collect();
    let refs: Vec<&[u8]> = blocks.iter().map(Vec::as_slice).collect();
    engine.store(&prompt, &refs).unwrap();
    let mut states = Vec::new();
    for b in engine.checkpoint_boundaries(&prompt).unwrap() {
        let state = bytes_for(1000 + b as u64, STATE_BYTES);
        engine.checkpoint_put(&prompt, b, &state).unwrap();
        states.push(state);
    }
    assert!(engine.flush(Duration::from_secs(10)), "writers drained");
    (blocks, states)
}

/// The names of the state objects under `prefix`.
fn state_objects(endpoint: &Endpoint, prefix: &str) -> Vec<Path> {
    use futures_util::StreamExt;
    use object_store::ObjectStore;
    let (store, rt) = common::raw_s3(endpoint);
    rt.block_on(async {
        store
            .list(Some(&Path::from(format!("{prefix}/state"))))
            .filter_map(|m| async move { m.ok() })
            .map(|m| m.location)
            .collect()
            .await
    })
}

#[test]
fn a_second_replica_restores_checkpoints_and_snapshots_from_the_bucket() {
    let gateway = Gateway::start();
    let endpoint = gateway.endpoint();
    let t = tokens(6 * TPB, 1);
    let digest = hybrid_key().digest();
    let (blocks, states) = {
        let (a, _) = replica(&endpoint, "share");
        let stored = store_with_checkpoints(&a, &t);
        a.snapshot_put(digest, &t[..90], None, &bytes_for(77, STATE_BYTES))
            .unwrap();
        assert!(a.flush(Duration::from_secs(10)));
        stored
    };
    assert_eq!(states.len(), 3, "checkpoints after 2, 4 and 6 blocks");
    assert_eq!(state_objects(&endpoint, "share").len(), 4);

    let (b, tier) = replica(&endpoint, "share");
    assert_eq!(tier.state_count(), 4, "listed at open, not read");
    // A prompt that diverges inside block 5: the checkpoint after 4 blocks is the
    // deepest with its KV under it.
    let mut diverged = t.clone();
    diverged[5 * TPB + 3] ^= 1;
    let prompt = b.prompt(digest, &diverged, &ExtraKeys::none()).unwrap();
    let found = b.lookup(&prompt);
    let state = found.state.expect("a composed hit");
    assert_eq!((state.blocks, state.tier), (4, TierKind::Remote));
    assert_eq!(found.blocks.len(), 4);
    let (gets, _) = tier.requests();
    let direct = tier.direct_reads();
    let restored = b.restore(&found).unwrap();
    assert_eq!(restored.tokens, 4 * TPB);
    assert_eq!(restored.state.as_deref(), Some(&states[1][..]));
    for (got, want) in restored.blocks.iter().zip(&blocks) {
        assert_eq!(&got[..], &want[..]);
    }
    assert_eq!(
        tier.requests().0 - gets,
        2,
        "one ranged GET of the KV run and one GET of the state"
    );
    assert_eq!(
        tier.direct_reads() - direct,
        2,
        "both answered by the direct reader, signed, from the gateway"
    );
    // Promoted: restoring again asks the bucket nothing.
    let again = b.restore(&b.lookup(&prompt)).unwrap();
    assert_eq!(again.state.as_deref(), Some(&states[1][..]));
    assert_eq!(tier.requests().0 - gets, 2);
    // The exact-prefix snapshot crossed too, and only for its exact prefix.
    assert_eq!(
        b.snapshot_get(digest, &t[..90], None).unwrap().as_deref(),
        Some(&bytes_for(77, STATE_BYTES)[..])
    );
    assert_eq!(b.snapshot_get(digest, &t[..89], None).unwrap(), None);
}

#[test]
fn damaged_substituted_or_deleted_state_objects_are_misses() {
    let gateway = Gateway::start();
    let endpoint = gateway.endpoint();
    let t = tokens(4 * TPB, 2);
    let digest = hybrid_key().digest();
    {
        let (a, _) = replica(&endpoint, "damage");
        store_with_checkpoints(&a, &t);
    }
    let mut names = state_objects(&endpoint, "damage");
    names.sort_by_key(|p| p.to_string());
    assert_eq!(names.len(), 2);
    let (raw, rt) = common::raw_s3(&endpoint);
    let read = |p: &Path| rt.block_on(async { raw.get(p).await.unwrap().bytes().await.unwrap() });
    let (first, second) = (read(&names[0]), read(&names[1]));
    let check = |label: &str, fault: &dyn Fn()| {
        let (b, tier) = replica(&endpoint, "damage");
        fault();
        let prompt = b.prompt(digest, &t, &ExtraKeys::none()).unwrap();
        let found = b.lookup(&prompt);
        assert!(found.state.is_some(), "{label}: the name still points");
        let restored = b.restore(&found).unwrap();
        assert_eq!(restored.tokens, 0, "{label}: nothing served");
        assert!(
            restored.state.is_none() && restored.blocks.is_empty(),
            "{label}"
        );
        assert!(
            tier.state_count() < 2,
            "{label}: the object that failed is forgotten"
        );
        rt.block_on(async {
            raw.put(&names[0], first.clone().into()).await.unwrap();
            raw.put(&names[1], second.clone().into()).await.unwrap();
        });
    };
    // Every boundary's state damaged: a flipped bit in the state, in the header, a
    // truncated object, and another key's (intact) object under this key's name.
    let flip = |at: usize| {
        let mut a = first.to_vec();
        let mut b = second.to_vec();
        a[at] ^= 4;
        b[at] ^= 4;
        rt.block_on(async {
            raw.put(&names[0], Bytes::from(a).into()).await.unwrap();
            raw.put(&names[1], Bytes::from(b).into()).await.unwrap();
        });
    };
    check("a flipped state bit", &|| flip(5_000));
    check("a flipped header bit", &|| flip(20));
    check("a truncated object", &|| {
        rt.block_on(async {
            raw.put(&names[0], first.slice(..first.len() - 8).into())
                .await
                .unwrap();
            raw.put(&names[1], second.slice(..second.len() - 8).into())
                .await
                .unwrap();
        });
    });
    check("another key's object", &|| {
        rt.block_on(async {
            raw.put(&names[0], second.clone().into()).await.unwrap();
            raw.put(&names[1], first.clone().into()).await.unwrap();
        });
    });
    check("deleted objects", &|| {
        rt.block_on(async {
            raw.delete(&names[0]).await.unwrap();
            raw.delete(&names[1]).await.unwrap();
        });
    });
    // Restored to what was written: served again.
    let (b, _) = replica(&endpoint, "damage");
    let prompt = b.prompt(digest, &t, &ExtraKeys::none()).unwrap();
    let restored = b.restore(&b.lookup(&prompt)).unwrap();
    assert_eq!(restored.tokens, 4 * TPB);
}

#[test]
fn state_in_the_bucket_without_its_kv_is_not_a_hit() {
    let gateway = Gateway::start();
    let endpoint = gateway.endpoint();
    let t = tokens(4 * TPB, 3);
    let digest = hybrid_key().digest();
    {
        let (a, _) = replica(&endpoint, "state-only");
        let prompt = a.prompt(digest, &t, &ExtraKeys::none()).unwrap();
        a.checkpoint_put(&prompt, 2, &bytes_for(5, STATE_BYTES))
            .unwrap();
        a.checkpoint_put(&prompt, 4, &bytes_for(6, STATE_BYTES))
            .unwrap();
        assert!(a.flush(Duration::from_secs(10)));
    }
    let (b, tier) = replica(&endpoint, "state-only");
    assert_eq!(tier.state_count(), 2);
    let prompt = b.prompt(digest, &t, &ExtraKeys::none()).unwrap();
    let found = b.lookup(&prompt);
    assert!(found.state.is_none() && found.blocks.is_empty());
    assert_eq!(found.matched_tokens, 0);
    let (gets, _) = tier.requests();
    assert_eq!(b.restore(&found).unwrap().tokens, 0);
    assert_eq!(tier.requests().0, gets, "a refused hit reads nothing");
}
