//! A background thread that panics closes the engine: every later call fails with
//! `Closed` and the reason, within a second, instead of hanging (issue 36, item 3).

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code"
)]

mod stand_in;

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvtier_core::{Ack, Engine, ErrorKind, ExtraKeys, Layout, StoreOptions};

fn engine() -> (Engine, Arc<Layout>) {
    let (e, layout, _lower) = stand_in::engine();
    (e, layout)
}

fn store(e: &Engine, layout: &Layout, first: u32, ack: Option<Ack>) -> kvtier_core::Result<()> {
    let tokens: Vec<u32> = (0..layout.tokens_per_block() as u32)
        .map(|t| first + t)
        .collect();
    let prompt = e.prompt(layout.digest(), &tokens, &ExtraKeys::none())?;
    let payload = vec![7u8; layout.block_bytes() as usize];
    e.store_with(
        &prompt,
        &[&payload],
        StoreOptions {
            ack,
            ..Default::default()
        },
    )?;
    Ok(())
}

#[test]
fn a_writer_that_panics_closes_the_engine_within_a_second() -> kvtier_core::Result<()> {
    let (e, layout) = engine();
    store(&e, &layout, 100, None)?;
    assert!(e.flush(Duration::from_secs(5)));
    assert!(e.poison().reason().is_none());

    // The second is counted from when the panic hook finished printing, which under
    // RUST_BACKTRACE on a loaded machine can itself take longer.
    kvtier_testkit::time_panic_reports();
    e.inject_background_panic();
    let err = kvtier_testkit::first_error_after_panic(Duration::from_secs(1), || {
        store(&e, &layout, 200, None)
    });
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
    assert_eq!(e.load(&lookup).unwrap_err().kind(), ErrorKind::Closed);
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
