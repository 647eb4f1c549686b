//! Private KV events (issue 39, item 2): plaintext sockets only on this host; beyond it,
//! CURVE, and then only the listed clients' keys receive anything — a subscriber without
//! CURVE, or with a key not on the list, gets nothing at all.

#![allow(clippy::unwrap_used, clippy::panic, reason = "test code")]

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvtier_core::clock::SystemClock;
use kvtier_core::tier::RamConfig;
use kvtier_core::{Engine, ExtraKeys, KvDtype, LayoutKey};
use kvtier_events::zmq::{self, Context, CurveKeyPair, Socket};
use kvtier_events::{CurveConfig, KvEventPublisher, KvEventsConfig};

fn engine() -> Arc<Engine> {
    Arc::new(
        Engine::builder()
            .ram(RamConfig {
                capacity_bytes: 16 << 20,
            })
            .build()
            .unwrap(),
    )
}

/// Stores one block of a fresh prompt (`seed`): one `BlockStored` to publish.
fn store_one(engine: &Engine, seed: u32) {
    let layout = engine
        .register_layout(LayoutKey::new("curve-test", KvDtype::F16, 16, 2, 2, 4))
        .unwrap();
    let tokens: Vec<u32> = (0..16).map(|t| seed * 1000 + t).collect();
    let prompt = engine
        .prompt(layout.digest(), &tokens, &ExtraKeys::none())
        .unwrap();
    let block = vec![seed as u8; layout.block_bytes() as usize];
    engine.store(&prompt, &[&block]).unwrap();
}

/// The events in a batch's payload (`[ts, [event, …], rank]`).
fn events_in(payload: &[u8]) -> usize {
    let value = rmpv::decode::read_value(&mut &payload[..]).unwrap();
    value.as_array().unwrap()[1].as_array().unwrap().len()
}

/// Every message `sub` receives within `wait`, as events per batch.
fn batches(sub: &Socket, wait: Duration) -> Vec<usize> {
    let until = Instant::now() + wait;
    let mut got = Vec::new();
    while let Some(left) = until.checked_duration_since(Instant::now()) {
        if sub.readable(left.as_millis() as i64).unwrap() {
            let frames = sub.recv_multipart(true).unwrap();
            assert_eq!(frames.len(), 3, "[topic, sequence, payload]");
            got.push(events_in(&frames[2]));
        }
    }
    got
}

fn subscriber(ctx: &Context, at: &str, curve: Option<(&[u8; 32], &CurveKeyPair)>) -> Socket {
    let sub = ctx.socket(zmq::SUB).unwrap();
    if let Some((server, keys)) = curve {
        sub.set_curve_client(server, keys).unwrap();
    }
    sub.connect(at).unwrap();
    sub.subscribe(b"").unwrap();
    sub
}

#[test]
fn only_listed_clients_receive_events_over_curve() {
    let server = CurveKeyPair::generate().unwrap();
    let (listed, unlisted) = (
        CurveKeyPair::generate().unwrap(),
        CurveKeyPair::generate().unwrap(),
    );
    let config = KvEventsConfig {
        endpoint: "tcp://127.0.0.1:0".into(),
        curve: Some(CurveConfig {
            secret_key: server.secret,
            clients: vec![listed.public],
        }),
        ..KvEventsConfig::default()
    };
    let engine = engine();
    let sockets = KvEventPublisher::bind(&config).unwrap();
    let publisher =
        KvEventPublisher::start(&engine, sockets, Arc::new(SystemClock::new())).unwrap();
    let at = publisher.endpoint().to_string();

    let ctx = Context::new().unwrap();
    let allowed = subscriber(&ctx, &at, Some((&server.public, &listed)));
    let stranger = subscriber(&ctx, &at, Some((&server.public, &unlisted)));
    let plain = subscriber(&ctx, &at, None);
    // The allowed subscriber is welcomed (an empty batch teaches it the sequence).
    let first = batches(&allowed, Duration::from_secs(3));
    assert!(!first.is_empty(), "the listed client received nothing");
    store_one(&engine, 1);
    let after = batches(&allowed, Duration::from_secs(2));
    assert!(
        after.iter().any(|&n| n > 0),
        "the listed client did not see the store: {after:?}"
    );
    // The others received nothing at all, welcome included.
    assert_eq!(
        batches(&stranger, Duration::from_millis(500)),
        Vec::<usize>::new()
    );
    assert_eq!(
        batches(&plain, Duration::from_millis(500)),
        Vec::<usize>::new()
    );
    assert!(
        publisher.stats().refused_clients >= 1,
        "{:?}",
        publisher.stats()
    );
}

#[test]
fn plaintext_events_beyond_this_host_are_refused() {
    for endpoint in ["tcp://*:0", "tcp://0.0.0.0:0"] {
        let config = KvEventsConfig {
            endpoint: endpoint.into(),
            ..KvEventsConfig::default()
        };
        let e = KvEventPublisher::bind(&config).unwrap_err();
        assert!(e.to_string().contains("CURVE"), "{endpoint}: {e}");
    }
    // A replay socket beyond the host, too.
    let config = KvEventsConfig {
        endpoint: "tcp://127.0.0.1:0".into(),
        replay_endpoint: Some("tcp://*:0".into()),
        ..KvEventsConfig::default()
    };
    assert!(KvEventPublisher::bind(&config).is_err());
    // With CURVE, the same endpoint binds.
    let server = CurveKeyPair::generate().unwrap();
    let config = KvEventsConfig {
        endpoint: "tcp://0.0.0.0:0".into(),
        curve: Some(CurveConfig {
            secret_key: server.secret,
            clients: Vec::new(),
        }),
        ..KvEventsConfig::default()
    };
    KvEventPublisher::bind(&config).unwrap();
}
