//! Bad input gets a clear error and stores nothing.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed expectation is a failed test"
)]

mod common;

use kvtier_core::tier::RamConfig;
use kvtier_core::{Engine, ErrorKind, ExtraKeys, KvDtype, LayoutKey};

use common::{payload_for, small_key};

fn engine() -> Result<Engine, kvtier_core::Error> {
    Engine::builder()
        .ram(RamConfig {
            capacity_bytes: 1 << 20,
        })
        .max_tokens(1024)
        .build()
}

fn assert_invalid<T: std::fmt::Debug>(r: kvtier_core::Result<T>, needle: &str) {
    match r {
        Err(e) => {
            assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
            assert!(
                e.to_string().contains(needle),
                "`{e}` should mention `{needle}`"
            );
        }
        Ok(v) => panic!("expected an error mentioning `{needle}`, got {v:?}"),
    }
}

#[test]
fn wrong_payload_size_stores_nothing() -> Result<(), kvtier_core::Error> {
    let e = engine()?;
    let layout = e.register_layout(small_key())?;
    let tokens: Vec<u32> = (0..48).collect();
    let prompt = e.prompt(layout.digest(), &tokens, &ExtraKeys::none())?;
    let good = payload_for(&layout, &prompt.hashes()[0]);
    let short = vec![0u8; good.len() - 1];
    // The bad payload is the third: the first two must not be kept either.
    assert_invalid(
        e.store(&prompt, &[&good, &good, &short]),
        "payload of block 2 is 1023 bytes",
    );
    assert_invalid(
        e.store(&prompt, &[&good, &[][..]]),
        "payload of block 1 is 0 bytes",
    );
    let s = e.stats();
    assert_eq!(
        (s.ram.stores, s.ram.resident_bytes, s.index.entries),
        (0, 0, 0)
    );
    assert!(e.lookup(&prompt).is_miss());
    Ok(())
}

#[test]
fn more_payloads_than_whole_blocks_is_refused() -> Result<(), kvtier_core::Error> {
    let e = engine()?;
    let layout = e.register_layout(small_key())?;
    let tokens: Vec<u32> = (0..20).collect(); // one whole block and a partial one
    let prompt = e.prompt(layout.digest(), &tokens, &ExtraKeys::none())?;
    let p = vec![0u8; layout.block_bytes() as usize];
    assert_invalid(
        e.store(&prompt, &[&p, &p]),
        "2 payloads for a prompt of 1 whole blocks",
    );
    assert_eq!(e.stats().ram.stores, 0);
    Ok(())
}

#[test]
fn zero_tokens_and_too_many_tokens_are_refused() -> Result<(), kvtier_core::Error> {
    let e = engine()?;
    let layout = e.register_layout(small_key())?;
    assert_invalid(
        e.prompt(layout.digest(), &[], &ExtraKeys::none()),
        "zero tokens",
    );
    let long: Vec<u32> = (0..1025).collect();
    assert_invalid(
        e.prompt(layout.digest(), &long, &ExtraKeys::none()),
        "1025 tokens; at most 1024",
    );
    assert_invalid(
        e.snapshot_put(layout.digest(), &long, None, b"x"),
        "at most 1024",
    );
    assert_invalid(e.snapshot_get(layout.digest(), &[], None), "zero tokens");
    assert_eq!(e.stats().snapshot.stores, 0);
    Ok(())
}

#[test]
fn unknown_layout_is_refused() -> Result<(), kvtier_core::Error> {
    let e = engine()?;
    let unregistered = small_key().digest();
    assert_invalid(
        e.prompt(unregistered, &[1, 2, 3], &ExtraKeys::none()),
        "unknown layout",
    );
    assert_invalid(
        e.snapshot_put(unregistered, &[1], None, b"state"),
        "unknown layout",
    );
    assert_invalid(e.snapshot_get(unregistered, &[1], None), "unknown layout");
    // A prompt hashed by another engine's layout is refused at store time too.
    let other = engine()?;
    let layout = other.register_layout(small_key())?;
    let prompt = other.prompt(
        layout.digest(),
        &(0..16).collect::<Vec<_>>(),
        &ExtraKeys::none(),
    )?;
    let p = vec![0u8; layout.block_bytes() as usize];
    assert_invalid(e.store(&prompt, &[&p]), "unknown layout");
    assert_eq!(e.stats().ram.stores, 0);
    Ok(())
}

#[test]
fn invalid_layout_values_are_refused() -> Result<(), kvtier_core::Error> {
    let e = engine()?;
    let mut k = small_key();
    k.tokens_per_block = 0;
    assert_invalid(e.register_layout(k), "tokens_per_block is 0");
    let mut k = small_key();
    k.num_layers = 0;
    assert_invalid(e.register_layout(k), "num_layers is 0");
    let err = "fp3".parse::<KvDtype>().map(|_| ());
    assert_invalid(err, "unknown KV dtype `fp3`");
    Ok(())
}

#[test]
fn capacity_smaller_than_one_block_is_refused() -> Result<(), kvtier_core::Error> {
    let e = Engine::builder()
        .ram(RamConfig {
            capacity_bytes: 1000,
        })
        .build()?;
    let err = e.register_layout(small_key()).map(|_| ());
    match err {
        Err(err) => {
            assert_eq!(err.kind(), ErrorKind::NoSpace);
            assert!(
                err.to_string()
                    .contains("more than the whole RAM capacity of 1000 bytes"),
                "{err}"
            );
        }
        Ok(()) => panic!("a 1 KiB block was accepted into a 1000-byte budget"),
    }
    let zero = Engine::builder()
        .ram(RamConfig { capacity_bytes: 0 })
        .build();
    assert_invalid(zero, "ram capacity");
    Ok(())
}

#[test]
fn extra_keys_past_the_prompt_are_refused() -> Result<(), kvtier_core::Error> {
    let e = engine()?;
    let layout = e.register_layout(small_key())?;
    let mut extras = ExtraKeys::none();
    extras.push(5, b"img".to_vec());
    assert_invalid(
        e.prompt(layout.digest(), &(0..40).collect::<Vec<_>>(), &extras),
        "block 5",
    );
    Ok(())
}

#[test]
fn bad_layer_ranges_are_refused() -> Result<(), kvtier_core::Error> {
    let e = engine()?;
    let layout = e.register_layout(LayoutKey::new("m", KvDtype::F16, 16, 2, 2, 4))?;
    let tokens: Vec<u32> = (0..16).collect();
    common::store_all(&e, &layout, &tokens)?;
    let prompt = e.prompt(layout.digest(), &tokens, &ExtraKeys::none())?;
    let hit = e.lookup(&prompt);
    assert_invalid(e.load_layers(&hit, 1..3), "layer range 1..3");
    assert_invalid(e.load_layers(&hit, 1..1), "layer range 1..1");
    Ok(())
}
