//! The engine with a remote tier, against real S3 servers: store, restart the engine, hit
//! with exactly one GET (counted at the gateway); growth keeps one GET per hit; an object
//! deleted behind the tier's back is a miss; the endpoint dying, answering 500 or hanging
//! gives misses within the deadline while RAM keeps serving; a corrupt object is never
//! served.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests"
)]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{Gateway, Mode, Moto, Proxy};
use kvtier_core::engine::RemoteAttach;
use kvtier_core::hash::ExtraKeys;
use kvtier_core::layout::{KvDtype, LayoutKey};
use kvtier_core::tier::{RamConfig, Tier, TierKind};
use kvtier_core::{Engine, layout::LayoutDigest};
use kvtier_remote::{Endpoint, RemoteTier};

const TPB: usize = 16;

fn engine(endpoint: &Endpoint, prefix: &str) -> (Engine, LayoutDigest) {
    let builder = Engine::builder().ram(RamConfig {
        capacity_bytes: 64 << 20,
    });
    engine_with(builder, common::config(endpoint.clone(), prefix))
}

/// `builder` with a remote tier of `config` attached, and the test layout registered.
fn engine_with(
    builder: kvtier_core::engine::EngineBuilder,
    config: kvtier_remote::RemoteConfig,
) -> (Engine, LayoutDigest) {
    let engine = builder
        .remote_tier(RemoteAttach::default(), move |sink| {
            Ok(Arc::new(RemoteTier::open(config, sink)?))
        })
        .build()
        .expect("engine");
    let layout = engine
        .register_layout(LayoutKey::new(
            "remote-test",
            KvDtype::F16,
            TPB as u32,
            4,
            2,
            64,
        ))
        .expect("layout");
    (engine, layout.digest())
}

fn tokens(n_blocks: usize, seed: u32) -> Vec<u32> {
    (0..(n_blocks * TPB) as u32).map(|t| t * 7 + seed).collect()
}

fn payloads(engine: &Engine, layout: LayoutDigest, tokens: &[u32]) -> Vec<Vec<u8>> {
    let size = engine.layout(layout).unwrap().block_bytes() as usize;
    (0..tokens.len() / TPB)
        .map(|b| {
            (0..size)
                .map(|i| {
                    (i as u32)
                        .wrapping_mul(2654435761)
                        .wrapping_add(tokens[b * TPB]) as u8
                })
                .collect()
        })
        .collect()
}

fn store(engine: &Engine, layout: LayoutDigest, tokens: &[u32]) -> Vec<Vec<u8>> {
    let prompt = engine.prompt(layout, tokens, &ExtraKeys::none()).unwrap();
    let p = payloads(engine, layout, tokens);
    let refs: Vec<&[u8]> = p.iter().map(Vec::as_slice).collect();
    engine.store(&prompt, &refs).unwrap();
    assert!(
        engine.flush(Duration::from_secs(10)),
        "remote writer drained"
    );
    p
}

/// Looks `tokens` up and loads what is found; returns (blocks found, loaded bytes).
fn hit(engine: &Engine, layout: LayoutDigest, tokens: &[u32]) -> (usize, Vec<Bytes>, bool) {
    let prompt = engine.prompt(layout, tokens, &ExtraKeys::none()).unwrap();
    let found = engine.lookup(&prompt);
    let loaded = engine.load(&found).unwrap();
    (found.blocks.len(), loaded.blocks, loaded.complete)
}

#[test]
fn a_restarted_engine_hits_the_remote_tier_with_one_get() {
    let gateway = Gateway::start();
    let t = tokens(8, 1);
    let expected = {
        let (engine, layout) = engine(&gateway.endpoint(), "restart");
        store(&engine, layout, &t)
    };
    let (engine, layout) = engine(&gateway.endpoint(), "restart");
    let prompt = engine.prompt(layout, &t, &ExtraKeys::none()).unwrap();
    let found = engine.lookup(&prompt);
    assert_eq!(found.blocks.len(), 8);
    assert!(found.blocks.iter().all(|b| b.tier == TierKind::Remote));
    let before = (gateway.gets(), gateway.ranged_gets());
    let loaded = engine.load(&found).unwrap();
    assert!(loaded.complete);
    for (got, want) in loaded.blocks.iter().zip(&expected) {
        assert_eq!(&got[..], &want[..]);
    }
    assert_eq!(
        (gateway.gets() - before.0, gateway.ranged_gets() - before.1),
        (1, 1),
        "an 8-block hit is exactly one ranged GET"
    );
    // Promoted into RAM: the next hit costs no request.
    let (_, again, complete) = hit(&engine, layout, &t);
    assert!(complete && again.len() == 8);
    assert_eq!(gateway.gets() - before.0, 1);
}

#[test]
fn a_grown_prefix_is_still_one_get_and_so_is_its_shorter_prefix() {
    let gateway = Gateway::start();
    let long = tokens(8, 2);
    let expected = {
        let (engine, layout) = engine(&gateway.endpoint(), "growth");
        store(&engine, layout, &long[..4 * TPB]);
        store(&engine, layout, &long)
    };
    for n in [8, 4, 6] {
        let (engine, layout) = engine(&gateway.endpoint(), "growth");
        let before = gateway.gets();
        let (found, blocks, complete) = hit(&engine, layout, &long[..n * TPB]);
        assert_eq!(found, n);
        assert!(complete);
        for (got, want) in blocks.iter().zip(&expected) {
            assert_eq!(&got[..], &want[..]);
        }
        assert_eq!(gateway.gets() - before, 1, "a {n}-block prefix is one GET");
    }
}

#[test]
fn the_remote_tier_works_against_moto() {
    let moto = Moto::start();
    let t = tokens(5, 3);
    let expected = {
        let (engine, layout) = engine(&moto.endpoint(), "moto");
        store(&engine, layout, &t)
    };
    let (engine, layout) = engine(&moto.endpoint(), "moto");
    let (found, blocks, complete) = hit(&engine, layout, &t);
    assert_eq!(found, 5);
    assert!(complete);
    for (got, want) in blocks.iter().zip(&expected) {
        assert_eq!(&got[..], &want[..]);
    }
}

/// Runs `f` with an S3 client of `endpoint` that bypasses the tier, and the names of
/// the data objects (`.kvo`) under `prefix`.
fn with_data_objects<T>(
    endpoint: &Endpoint,
    prefix: &str,
    f: impl AsyncFnOnce(&object_store::aws::AmazonS3, Vec<object_store::path::Path>) -> T,
) -> T {
    use futures_util::StreamExt;
    use object_store::ObjectStore;
    let (store, rt) = common::raw_s3(endpoint);
    rt.block_on(async {
        let p = object_store::path::Path::from(prefix);
        let names: Vec<_> = store
            .list(Some(&p))
            .filter_map(|m| async move { m.ok() })
            .map(|m| m.location)
            .filter(|n| std::future::ready(n.as_ref().ends_with(".kvo")))
            .collect()
            .await;
        f(&store, names).await
    })
}

/// Deletes every data object under `prefix`, straight through the S3 API.
fn delete_objects(endpoint: &Endpoint, prefix: &str) -> usize {
    use object_store::ObjectStoreExt;
    with_data_objects(endpoint, prefix, async |store, names| {
        for name in &names {
            store.delete(name).await.unwrap();
        }
        names.len()
    })
}

fn deleted_behind_the_back(endpoint: &Endpoint, prefix: &str) {
    let t = tokens(4, 4);
    {
        let (engine, layout) = engine(endpoint, prefix);
        store(&engine, layout, &t);
    }
    let (engine, layout) = engine(endpoint, prefix);
    assert_eq!(delete_objects(endpoint, prefix), 1);
    let (found, blocks, complete) = hit(&engine, layout, &t);
    assert_eq!(found, 4, "the index still listed the blocks");
    assert!(
        !complete && blocks.is_empty(),
        "a 404 is a miss, not an error"
    );
    // The blocks are forgotten: the next lookup finds nothing.
    let (found, _, _) = hit(&engine, layout, &t);
    assert_eq!(found, 0);
}

#[test]
fn an_object_deleted_behind_the_tiers_back_is_a_miss() {
    let gateway = Gateway::start();
    deleted_behind_the_back(&gateway.endpoint(), "deleted");
}

#[test]
fn an_object_deleted_behind_the_tiers_back_is_a_miss_on_moto() {
    let moto = Moto::start();
    deleted_behind_the_back(&moto.endpoint(), "deleted");
}

#[test]
fn remote_hits_are_promoted_into_ram_and_the_ssd() {
    let gateway = Gateway::start();
    let t = tokens(3, 40);
    let expected = {
        let (engine, layout) = engine(&gateway.endpoint(), "promote");
        store(&engine, layout, &t)
    };
    // A replica with an empty SSD of its own.
    let ssd_dir = tempfile::tempdir().unwrap();
    let config = common::config(gateway.endpoint(), "promote");
    let dir = ssd_dir.path().to_path_buf();
    let builder = Engine::builder().persistent_tier(
        kvtier_core::engine::PersistConfig::default(),
        move |sink| {
            let mut c = kvtier_ssd::SsdConfig::new(dir);
            c.min_free_bytes = 0;
            let clock: Arc<dyn kvtier_core::clock::Clock> =
                Arc::new(kvtier_core::clock::SystemClock::new());
            Ok(Arc::new(kvtier_ssd::SsdTier::open(c, clock, sink)?))
        },
    );
    let (engine, layout) = engine_with(builder, config);
    let (found, blocks, complete) = hit(&engine, layout, &t);
    assert!(found == 3 && complete);
    assert!(engine.flush(Duration::from_secs(10)));
    let ssd = engine.persistent().unwrap();
    let prompt = engine.prompt(layout, &t, &ExtraKeys::none()).unwrap();
    for (i, h) in prompt.hashes().iter().enumerate() {
        assert!(engine.ram().contains(h), "block {i} promoted into RAM");
        assert!(
            ssd.contains(h),
            "block {i} queued for and written to the SSD"
        );
        assert_eq!(&ssd.get(h).unwrap().unwrap()[..], &expected[i][..]);
        assert_eq!(&blocks[i][..], &expected[i][..]);
    }
    // Each move is counted by its true source and destination.
    use kvtier_core::tier::TierKind::{Ram, Remote, Ssd};
    let s = engine.stats();
    assert_eq!(s.moved(Remote, Ram).promoted, 3, "{s:?}");
    assert_eq!(s.moved(Remote, Ssd).promoted, 3, "{s:?}");
    assert_eq!(s.moved(Ssd, Ram).promoted, 0, "{s:?}");
    let counters: std::collections::HashMap<String, u64> = s.counters().into_iter().collect();
    assert_eq!(counters["engine_promotions_remote_to_ram"], 3);
    assert_eq!(counters["engine_promotions_remote_to_ssd"], 3);
    assert_eq!(counters["engine_promotions_ssd_to_ram"], 0);
    assert_eq!(
        s.tiers().map(|(k, _)| k).collect::<Vec<_>>(),
        [Ram, Ssd, Remote],
        "fastest first"
    );
}

#[test]
fn a_corrupt_object_is_never_served() {
    let gateway = Gateway::start();
    let t = tokens(3, 5);
    {
        let (engine, layout) = engine(&gateway.endpoint(), "corrupt");
        store(&engine, layout, &t);
    }
    // Same name, same length, other bytes: written straight through the S3 API.
    let (engine, layout) = engine(&gateway.endpoint(), "corrupt");
    let size = engine.layout(layout).unwrap().block_bytes() as usize * 3;
    overwrite_data(&gateway.endpoint(), "corrupt", vec![0x5a; size]);
    let (found, blocks, complete) = hit(&engine, layout, &t);
    assert_eq!(found, 3);
    assert!(
        !complete && blocks.is_empty(),
        "bytes failing the checksum are a miss"
    );
    // The hit accounting says why the three promised blocks did not come: their bytes
    // failed verification (not `evicted`, which the miss alone would suggest).
    let h = engine.stats().engine.hits;
    assert_eq!(h.load_tokens_undelivered_corrupt, 3 * TPB as u64, "{h:?}");
    assert_eq!(h.load_tokens_undelivered_evicted, 0, "{h:?}");
    assert_eq!(
        hit(&engine, layout, &t).0,
        0,
        "the corrupt object's blocks are forgotten"
    );
}

/// Replaces the one data object under `prefix` with `bytes`, straight through the S3 API.
fn overwrite_data(endpoint: &Endpoint, prefix: &str, bytes: Vec<u8>) {
    use object_store::ObjectStoreExt;
    with_data_objects(endpoint, prefix, async |store, names| {
        assert_eq!(names.len(), 1);
        store.put(&names[0], bytes.into()).await.unwrap();
    });
}

/// Stores `remote_tokens` through the proxy, restarts the engine, and returns it with
/// the blocks indexed as remote-only; `local_tokens` are then stored into RAM only.
fn engine_behind_proxy(
    proxy: &Proxy,
    remote_tokens: &[u32],
    local_tokens: &[u32],
    prefix: &str,
) -> (Engine, LayoutDigest) {
    {
        let (engine, layout) = engine(&proxy.endpoint(), prefix);
        store(&engine, layout, remote_tokens);
    }
    let (engine, layout) = engine(&proxy.endpoint(), prefix);
    let prompt = engine
        .prompt(layout, local_tokens, &ExtraKeys::none())
        .unwrap();
    let p = payloads(&engine, layout, local_tokens);
    let refs: Vec<&[u8]> = p.iter().map(Vec::as_slice).collect();
    engine.store(&prompt, &refs).unwrap();
    (engine, layout)
}

fn check_fault(mode: Mode) {
    let gateway = Gateway::start();
    let proxy = Proxy::start(gateway.addr());
    let remote_t = tokens(4, 10 + mode as u32);
    let local_t = tokens(4, 20 + mode as u32);
    let (engine, layout) = engine_behind_proxy(
        &proxy,
        &remote_t,
        &local_t,
        &format!("fault-{}", mode as u8),
    );
    let engine = Arc::new(engine);
    proxy.set(mode);
    // A load that needs the endpoint, on its own thread.
    let e2 = engine.clone();
    let rt = remote_t.clone();
    let started = Instant::now();
    let remote_load = std::thread::spawn(move || {
        let r = hit(&e2, layout, &rt);
        (r, started.elapsed())
    });
    // Meanwhile RAM keeps serving, quickly.
    std::thread::sleep(Duration::from_millis(50));
    let t0 = Instant::now();
    let (found, blocks, complete) = hit(&engine, layout, &local_t);
    assert!(found == 4 && complete && blocks.len() == 4);
    assert!(
        t0.elapsed() < Duration::from_millis(200),
        "a RAM hit waited {:?} on a sick endpoint",
        t0.elapsed()
    );
    let ((found, blocks, complete), took) = remote_load.join().unwrap();
    assert_eq!(found, 4);
    assert!(
        !complete && blocks.is_empty(),
        "{mode:?}: a miss, nothing served"
    );
    // Deadline 1.5 s, plus the runtime's margin and scheduling on a busy machine.
    assert!(
        took < Duration::from_secs(4),
        "{mode:?}: the load took {took:?}"
    );
    assert!(proxy.intercepted.load(std::sync::atomic::Ordering::Relaxed) > 0);
    // The hit accounting says why the four promised blocks did not come: a hanging
    // endpoint ran the read out of its deadline; any other fault failed it (or ran out of
    // time between retries). Never `evicted`: the blocks are still there.
    let h = engine.stats().engine.hits;
    let promised = 4 * TPB as u64;
    match mode {
        Mode::Hang => assert_eq!(h.load_tokens_undelivered_deadline, promised, "{h:?}"),
        _ => assert_eq!(
            h.load_tokens_undelivered_failed + h.load_tokens_undelivered_deadline,
            promised,
            "{mode:?}: {h:?}"
        ),
    }
    assert_eq!(h.load_tokens_undelivered_evicted, 0, "{mode:?}: {h:?}");
    // A transient failure forgets nothing: once the endpoint is back, the blocks hit.
    proxy.set(Mode::Pass);
    let (found, blocks, complete) = hit(&engine, layout, &remote_t);
    assert_eq!(found, 4);
    assert!(
        complete && blocks.len() == 4,
        "{mode:?}: hit after recovery"
    );
}

#[test]
fn a_hanging_endpoint_is_a_miss_within_the_deadline() {
    check_fault(Mode::Hang);
}

#[test]
fn an_endpoint_answering_500_is_a_miss_within_the_deadline() {
    check_fault(Mode::Error500);
}

#[test]
fn a_dead_endpoint_is_a_miss_within_the_deadline() {
    check_fault(Mode::Dead);
}

#[test]
fn a_gateway_killed_mid_load_gives_a_miss_and_nothing_corrupt() {
    let gateway = Gateway::start();
    let t = tokens(64, 30);
    let expected = {
        let (engine, layout) = engine(&gateway.endpoint(), "killed");
        store(&engine, layout, &t)
    };
    let block = expected[0].len() as u64;
    // Through a proxy that "kills the gateway" partway through the load's answer: after
    // 20 blocks' worth of answer bytes (headers included) the connection is cut and no
    // later request is answered — so the stop lands mid-load, every time.
    let proxy = Proxy::start(gateway.addr());
    let (engine, layout) = engine(&proxy.endpoint(), "killed");
    proxy.die_after_answer_bytes(20 * block);
    let (found, blocks, complete) = hit(&engine, layout, &t);
    assert!(proxy.died(), "the gateway was not stopped mid-load");
    assert_eq!(found, 64, "the lookup promised every block");
    // Whatever arrived before the stop is exactly the stored bytes; the rest is a miss.
    assert!(
        !complete && blocks.len() < 20,
        "{} blocks served",
        blocks.len()
    );
    for (got, want) in blocks.iter().zip(&expected) {
        assert_eq!(&got[..], &want[..]);
    }
    // With the gateway gone, lookups still answer from memory at once.
    let t0 = Instant::now();
    let prompt = engine.prompt(layout, &t, &ExtraKeys::none()).unwrap();
    let _ = engine.lookup(&prompt);
    assert!(t0.elapsed() < Duration::from_millis(100));
}

#[test]
fn objects_spread_over_two_endpoints_and_all_hit_after_a_restart() {
    let (a, b) = (Gateway::start(), Gateway::start());
    let endpoints = vec![a.endpoint(), b.endpoint()];
    let open = || {
        let mut config = common::config(endpoints[0].clone(), "spread");
        config.endpoints = endpoints.clone();
        engine_with(Engine::builder(), config)
    };
    let prompts: Vec<Vec<u32>> = (0..12).map(|s| tokens(2, 100 + s)).collect();
    {
        let (engine, layout) = open();
        for t in &prompts {
            store(&engine, layout, t);
        }
    }
    let (engine, layout) = open();
    let before = (a.gets(), b.gets());
    for t in &prompts {
        let (found, blocks, complete) = hit(&engine, layout, t);
        assert_eq!((found, blocks.len(), complete), (2, 2, true));
    }
    let (on_a, on_b) = (a.gets() - before.0, b.gets() - before.1);
    assert_eq!(on_a + on_b, 12, "one GET per prompt");
    assert!(
        on_a > 0 && on_b > 0,
        "placement used both endpoints ({on_a}, {on_b})"
    );
}
