//! The front door answers with the core's error and its kind (issue 36, item 3): bad
//! settings are `Invalid`, an S3 endpoint nothing listens on starts the node degraded (no
//! error) unless `remote.require_at_start` asks for `Unavailable`, and a background thread that panics closes the node's engine (`Closed`, with
//! the reason).

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

use std::time::{Duration, Instant};

use kvtier_core::{ErrorKind, ExtraKeys, KvDtype, LayoutKey};
use kvtier_node::units::ByteSize;
use kvtier_node::{Node, Settings, cluster_endpoints};

fn settings(dir: &std::path::Path) -> Settings {
    Settings {
        data_dir: dir.to_path_buf(),
        ..Settings::default()
    }
}

#[test]
fn bad_settings_are_invalid() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = settings(dir.path());
    s.ram = ByteSize(0);
    assert_eq!(s.validate().unwrap_err().kind(), ErrorKind::Invalid);

    // Cluster mode without the remote tier it shares.
    let mut s = settings(dir.path());
    s.cluster.etcd = "etcd://127.0.0.1:2379".into();
    let e = Node::open(s.clone()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
    assert!(e.message().contains("remote endpoints"), "{e}");

    // Endpoints that do not parse.
    s.cluster.etcd = "etcd://nohostport".into();
    let e = cluster_endpoints(&s).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
}

#[test]
fn a_settings_file_that_does_not_parse_or_exist_is_invalid() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("kvtier.toml");
    let e = Settings::from_file(&file).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
    assert!(
        std::error::Error::source(&e).is_some(),
        "the io::Error is kept"
    );
    std::fs::write(&file, "ram = [\n").unwrap();
    let e = Settings::from_file(&file).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
}

/// An S3 endpoint nothing listens on does not fail the open: the node starts degraded
/// (the remote tier is attached, its listing failed and is counted as I/O errors, and its
/// calls fail or miss within the deadline), as issue 12 decided. So no `Unavailable` comes
/// out of `Node::open` here; this test holds that behaviour until it is changed on purpose.
#[test]
fn an_s3_endpoint_nothing_listens_on_starts_degraded() {
    let dir = tempfile::tempdir().unwrap();
    let port = kvtier_testkit::free_port().unwrap();
    let mut s = settings(dir.path());
    s.remote.endpoints = vec![format!("http://127.0.0.1:{port}")];
    s.remote.bucket = "kvtier".into();
    s.remote.deadline = kvtier_node::units::HumanDuration(Duration::from_millis(500));
    let node = Node::open(s).unwrap();
    let remote = node
        .engine
        .stats()
        .lower
        .into_iter()
        .find(|t| t.kind == kvtier_core::TierKind::Remote)
        .expect("the remote tier is attached");
    assert!(remote.tier.io_errors > 0, "{remote:?}");
}

/// With `remote.require_at_start`, the same endpoint fails the open with `Unavailable`,
/// naming the endpoint and the setting, before any tier is opened (no SSD store is made).
#[test]
fn an_s3_endpoint_nothing_listens_on_fails_the_open_when_required() {
    let dir = tempfile::tempdir().unwrap();
    let port = kvtier_testkit::free_port().unwrap();
    let mut s = settings(&dir.path().join("data"));
    s.remote.endpoints = vec![format!("http://127.0.0.1:{port}")];
    s.remote.deadline = kvtier_node::units::HumanDuration(Duration::from_millis(500));
    s.remote.require_at_start = true;
    // Credentials given, so the failure is the endpoint's, not a credential lookup's.
    s.remote.access_key = Some("kvtier-test".into());
    s.remote.secret_key = Some("kvtier-test-secret".into());
    let started = Instant::now();
    let e = Node::open(s.clone()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    let text = e.to_string();
    assert!(text.contains("remote.require_at_start"), "{text}");
    assert!(text.contains(&format!("127.0.0.1:{port}/kvtier")), "{text}");
    assert!(text.to_lowercase().contains("connect"), "{text}");
    // Within the deadline, plus the bridge's margin and some slack for a loaded machine.
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(!s.ssd_dir().exists(), "the SSD tier was opened");
}

#[test]
fn a_writer_that_panics_closes_the_node_within_a_second() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = settings(dir.path());
    s.ssd.enabled = true;
    s.ssd.min_free = ByteSize(0);
    let node = Node::open(s).unwrap();
    let engine = &node.engine;
    let layout = engine
        .register_layout(LayoutKey::new("poison", KvDtype::F16, 16, 2, 2, 8))
        .unwrap();
    let payload = vec![1u8; layout.block_bytes() as usize];
    let store = |first: u32| {
        let tokens: Vec<u32> = (first..first + 16).collect();
        let prompt = engine
            .prompt(layout.digest(), &tokens, &ExtraKeys::none())
            .unwrap();
        engine.store(&prompt, &[&payload])
    };
    store(0).unwrap();

    // The second is counted from when the panic hook finished printing: symbolizing a
    // backtrace of this binary under RUST_BACKTRACE can take longer on a loaded machine.
    kvtier_testkit::time_panic_reports();
    engine.inject_background_panic();
    let e = kvtier_testkit::first_error_after_panic(Duration::from_secs(1), || store(100));
    assert_eq!(e.kind(), ErrorKind::Closed, "{e}");
    assert!(
        e.message()
            .contains("background thread `kvtier-writer-ssd` panicked"),
        "{e}"
    );
    let ssd = node.settings.read().ssd.clone();
    assert_eq!(
        node.reattach_ssd(ssd).unwrap_err().kind(),
        ErrorKind::Closed
    );
}
