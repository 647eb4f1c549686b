//! The hybrid model (attention and Mamba layers) through `kvtier serve` with a remote
//! tier on `kvtier gateway`: the first replica stores a prompt's KV blocks and
//! checkpoints and serves a diverged prompt from them over HTTP; a second replica with
//! its own data directory and no SSD — sharing only the bucket — restores the same
//! boundary from S3 and decodes exactly like cold.

use kvtier_candle::conversation::ssd_settings;
use kvtier_candle::reuse::Cache;
use kvtier_node::Settings;
use kvtier_server::LocalServer;

use crate::fixtures::hybrid::{DECODE, assert_same_decode, cold, runner};
use crate::fixtures::{cached, diverging};
use crate::gateway::{ACCESS, Gateway, SECRET};

const EVERY: usize = 64;

fn replica(dir: &std::path::Path, endpoint: &str, ssd: bool) -> Settings {
    let mut s = ssd_settings(dir, 64 << 20);
    s.ssd.enabled = ssd;
    s.remote.endpoints = vec![endpoint.to_owned()];
    s.remote.bucket = "shared".into();
    s.remote.access_key = Some(ACCESS.into());
    s.remote.secret_key = Some(SECRET.into());
    s
}

#[test]
fn a_second_replica_restores_kv_and_state_from_the_shared_bucket() {
    let dir = tempfile::tempdir().unwrap();
    let gateway = Gateway::start(&dir.path().join("s3"), &["--create-bucket", "shared"]);

    let first =
        LocalServer::start(replica(&dir.path().join("a"), &gateway.endpoint, true)).unwrap();
    let writer = runner(Cache::served(&first.url(), None).unwrap(), EVERY);
    let one = writer.run_turn(&cached(), DECODE).unwrap();
    assert_eq!((one.blocks_stored, one.checkpoints_stored), (12, 3));
    let two = writer.run_turn(&diverging(), DECODE).unwrap();
    assert_eq!(two.reused_tokens, 128, "{:?}", two.refused);
    assert_same_decode(&two, &cold(&diverging()));
    // A clean stop drains the remote tier's queue.
    assert!(first.stop().unwrap().writer_clean);

    let second =
        LocalServer::start(replica(&dir.path().join("b"), &gateway.endpoint, false)).unwrap();
    let mut reader = runner(Cache::served(&second.url(), None).unwrap(), EVERY);
    reader.store_kv = false;
    reader.store_state = false;
    let turn = reader.run_turn(&diverging(), DECODE).unwrap();
    assert_eq!(turn.reused_tokens, 128, "{:?}", turn.refused);
    assert_same_decode(&turn, &cold(&diverging()));
    let counters = reader.backend().stats().unwrap();
    assert_eq!(
        counters["engine_promotions_remote_to_ram"], 8,
        "8 blocks came from the bucket: {counters:?}"
    );
    // The checkpoint was not in RAM: it came from the bucket, and is now kept in RAM.
    assert_eq!(counters["state_restores"], 1, "{counters:?}");
    assert_eq!(counters["state_restore_misses"], 0, "{counters:?}");
    assert_eq!(counters["checkpoint_misses"], 1, "{counters:?}");
    assert_eq!(counters["checkpoint_resident_entries"], 1, "{counters:?}");
    assert!(second.stop().is_some());
    drop(gateway);
}
