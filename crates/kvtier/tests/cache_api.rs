//! The caller API (`kvtier_node::Cache`) answers the same over an engine in this process
//! and over a real `kvtier serve`: every call, the same bytes, the same refusals. This is
//! the seam Python, the model runners and the benches go through, so a call that drifts
//! between the two fails here.

#![allow(clippy::unwrap_used, reason = "tests")]

mod server;

use std::path::Path;

use kvtier_core::snapshot::SnapshotPut;
use kvtier_core::{ErrorKind, KvDtype, LayoutKey, StateGroup};
use kvtier_node::{Cache, Settings};
use server::Server;

const TPB: u32 = 16;
const STATE_BYTES: u64 = 3_000;

fn key(model: &str) -> LayoutKey {
    let mut key = LayoutKey::new(model, KvDtype::F16, TPB, 2, 2, 64);
    key.weights_digest = "w".into();
    key.tokenizer_digest = "t".into();
    key
}

fn hybrid_key() -> LayoutKey {
    let mut key = key("cache-api-hybrid");
    key.state_groups = vec![StateGroup {
        kind: "mamba1/f32".into(),
        num_layers: 2,
        state_bytes: STATE_BYTES,
    }];
    key
}

fn tokens(blocks: u32, seed: u32) -> Vec<u32> {
    (0..blocks * TPB).map(|t| seed * 100_000 + t).collect()
}

/// `n` blocks of `bytes` each, every byte depending on the block and `seed`.
fn blocks(n: usize, bytes: usize, seed: u8) -> Vec<Vec<u8>> {
    (0..n)
        .map(|b| {
            (0..bytes)
                .map(|i| (i as u8).wrapping_mul(7) ^ (b as u8) ^ seed)
                .collect()
        })
        .collect()
}

fn embedded(dir: &Path) -> Cache {
    let mut settings = Settings {
        data_dir: dir.to_path_buf(),
        ..Settings::default()
    };
    settings.ssd.enabled = false;
    Cache::open(settings).unwrap()
}

/// Everything the API does with attention-only blocks; returns what the loads read, for
/// the two caches to be compared.
fn attention_calls(cache: &Cache) -> Vec<Vec<u8>> {
    let layout = cache.register_layout(key("cache-api"), None).unwrap();
    assert_eq!(layout.block_bytes(), 2 * 2 * 2 * 64 * 2 * u64::from(TPB));
    let payloads = blocks(4, layout.block_bytes() as usize, 1);
    let refs: Vec<&[u8]> = payloads.iter().map(|p| &p[..]).collect();
    let prompt = tokens(4, 1);

    let stored = cache.store(&layout, &prompt, &refs).unwrap();
    assert_eq!(
        (stored.stored, stored.duplicates, stored.stopped),
        (4, 0, None)
    );
    let again = cache.store(&layout, &prompt, &refs).unwrap();
    assert_eq!((again.stored, again.duplicates), (0, 4));

    // A longer prompt over the same blocks: four match, memory only.
    let mut longer = prompt.clone();
    longer.extend(tokens(2, 9));
    let hit = cache.lookup(&layout, &longer).unwrap();
    assert_eq!((hit.matched_tokens, hit.blocks()), (64, 4));
    assert_eq!(hit.tier_names(), ["ram"; 4]);
    assert_eq!(hit.nbytes(None).unwrap(), 4 * layout.block_bytes() as usize);

    let loaded = cache.load(&hit, None).unwrap();
    assert_eq!(loaded.len(), 4);
    for (got, want) in loaded.iter().zip(&payloads) {
        assert_eq!(&got[..], &want[..]);
    }
    let mut out = vec![0u8; hit.nbytes(None).unwrap()];
    assert_eq!(cache.load_into(&hit, None, &mut out).unwrap(), 4);
    assert_eq!(out, payloads.concat());

    // One layer of each block, into memory and as blocks alike.
    let layer = cache.load(&hit, Some((1, 2))).unwrap();
    let per_block = hit.bytes_per_block(Some((1, 2))).unwrap();
    assert_eq!(per_block, layout.block_bytes() as usize / 2);
    let mut pages = vec![0u8; hit.nbytes(Some((1, 2))).unwrap()];
    assert_eq!(cache.load_into(&hit, Some((1, 2)), &mut pages).unwrap(), 4);
    assert_eq!(pages, layer.concat());

    // A prefix of the hit loads only its blocks; more than the hit is refused.
    let two = hit.prefix(2).unwrap();
    assert_eq!((two.blocks(), two.matched_tokens), (2, 32));
    assert_eq!(
        cache.load(&two, None).unwrap().concat(),
        payloads[..2].concat()
    );
    assert_eq!(hit.prefix(5).unwrap_err().kind(), ErrorKind::Invalid);

    // Refusals before anything is read: a short buffer, layers past the layout's.
    let mut short = vec![0u8; out.len() - 1];
    let e = cache.load_into(&hit, None, &mut short).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
    assert_eq!(
        cache.load(&hit, Some((1, 3))).unwrap_err().kind(),
        ErrorKind::Invalid
    );
    let e = cache.store(&layout, &prompt, &[&refs[0][1..]]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");

    // Snapshots: exact tokens and session, nothing else.
    assert_eq!(
        cache
            .snapshot_put(&layout, &prompt[..5], None, b"state")
            .unwrap(),
        SnapshotPut::Stored
    );
    let got = cache.snapshot_get(&layout, &prompt[..5], None).unwrap();
    assert_eq!(got.as_deref(), Some(&b"state"[..]));
    assert!(
        cache
            .snapshot_get(&layout, &prompt[..4], None)
            .unwrap()
            .is_none()
    );
    assert!(
        cache
            .snapshot_get(&layout, &prompt[..5], Some(b"s"))
            .unwrap()
            .is_none()
    );

    let stats = cache.stats().unwrap();
    assert!(stats["index_lookup_hits"] >= 1, "{stats:?}");
    layer.iter().map(|b| b.to_vec()).collect()
}

/// Checkpoints and restores of a hybrid layout; returns what the restore read.
fn hybrid_calls(cache: &Cache) -> (usize, Vec<u8>, Vec<u8>) {
    let layout = cache.register_layout(hybrid_key(), Some(32)).unwrap();
    assert_eq!(layout.checkpoint_every(), Some(32));
    assert_eq!(layout.state_bytes(), STATE_BYTES);
    let payloads = blocks(4, layout.block_bytes() as usize, 2);
    let refs: Vec<&[u8]> = payloads.iter().map(|p| &p[..]).collect();
    let prompt = tokens(4, 2);
    assert_eq!(cache.store(&layout, &prompt, &refs).unwrap().stored, 4);

    // Without a state there is no hybrid hit, and a restore brings nothing.
    assert_eq!(cache.lookup(&layout, &prompt).unwrap().matched_tokens, 0);
    assert_eq!(cache.restore(&layout, &prompt).unwrap().tokens, 0);

    let state: Vec<u8> = (0..STATE_BYTES).map(|i| (i % 251) as u8).collect();
    let e = cache
        .checkpoint_put(&layout, &prompt, 2, &state[1..])
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
    let put = cache.checkpoint_put(&layout, &prompt, 2, &state).unwrap();
    assert_eq!(put, SnapshotPut::Stored);

    let hit = cache.lookup(&layout, &prompt).unwrap();
    assert_eq!((hit.matched_tokens, hit.blocks()), (32, 2));
    assert_eq!(hit.state_tier, Some(kvtier_core::TierKind::Ram));
    let restored = cache.restore(&layout, &prompt).unwrap();
    assert_eq!(restored.tokens, 32);
    assert_eq!(restored.blocks.concat(), payloads[..2].concat());
    assert_eq!(restored.state.as_deref(), Some(&state[..]));
    (
        restored.tokens,
        restored.blocks.concat(),
        restored.state.unwrap().to_vec(),
    )
}

#[test]
fn an_embedded_engine_and_a_server_answer_every_call_alike() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("served"), &["--set", "ssd.enabled=false"]);
    let served = Cache::served(&server.url, None).unwrap();
    let local = embedded(&dir.path().join("local"));
    assert!(local.is_embedded() && !served.is_embedded());

    assert_eq!(attention_calls(&local), attention_calls(&served));
    assert_eq!(hybrid_calls(&local), hybrid_calls(&served));

    // The same key names the same layout in both; a hit or layout of one is refused by
    // the other, not misread.
    let l = local.register_layout(key("cache-api"), None).unwrap();
    let s = served.register_layout(key("cache-api"), None).unwrap();
    assert_eq!(l.digest_hex(), s.digest_hex());
    let prompt = tokens(4, 1);
    let e = local.lookup(&s, &prompt).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
    let local_hit = local.lookup(&l, &prompt).unwrap();
    let served_hit = served.lookup(&s, &prompt).unwrap();
    assert_eq!(
        served.load(&local_hit, None).unwrap_err().kind(),
        ErrorKind::Invalid
    );
    assert_eq!(
        local.load(&served_hit, None).unwrap_err().kind(),
        ErrorKind::Invalid
    );

    // A server's own refusals keep their kind, and their code under the source.
    let local_only = local
        .register_layout(key("cache-api-local-only"), None)
        .unwrap();
    let e = served.lookup(&local_only, &prompt).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
    let client = std::error::Error::source(&e)
        .and_then(|s| s.downcast_ref::<kvtier_client::ClientError>())
        .unwrap();
    assert_eq!(client.code(), Some("unknown_layout"), "{e}");

    // The server is gone: every call is unavailable, none hangs.
    server.stop();
    let e = served.lookup(&s, &prompt).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
}

#[test]
fn a_served_cache_at_a_port_nobody_listens_on_is_unavailable() {
    let port = kvtier_testkit::free_port().unwrap();
    let cache = Cache::served(&format!("http://127.0.0.1:{port}"), None).unwrap();
    let e = cache.register_layout(key("nobody"), None).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(cache.flush(std::time::Duration::from_secs(1)).is_err());
}
