//! `snapshot.remote.get.ms`: a 1 MiB recurrent state read back through the remote tier
//! from `kvtier gateway` on loopback (one GET of the state object, its header and state
//! checksums verified), against one signed ranged GET of the same 1 MiB of that object
//! with kvtier bench's lean HTTP/1.1 client on a kept-alive connection.

use std::sync::Arc;
use std::time::Instant;

use kvtier_core::layout::LayoutDigest;
use kvtier_core::snapshot::SnapshotKey;
use kvtier_core::tier::{NoSink, SnapshotStore};
use kvtier_remote::state::{HEADER_BYTES, state_object_name};
use kvtier_remote::{Endpoint, RemoteConfig, RemoteTier};

use super::measure::pattern;
use super::{Effort, Row};

const NAME: &str = "snapshot.remote.get.ms";
const STATE_BYTES: usize = 1 << 20;
const ACCESS: &str = "kvtier-bench";
const SECRET: &str = "kvtier-bench-secret";
const BUCKET: &str = "bench";
const PREFIX: &str = "kv";

pub fn rows(effort: Effort, wanted: &dyn Fn(&str) -> bool) -> anyhow::Result<Vec<Row>> {
    if !wanted(NAME) {
        return Ok(Vec::new());
    }
    let dir = std::env::temp_dir().join(format!("kvtier-bench-state-{}", std::process::id()));
    let row = measure(&dir, effort);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(vec![row?])
}

fn measure(dir: &std::path::Path, effort: Effort) -> anyhow::Result<Row> {
    let gateway = super::s3::procs::in_process_gateway(dir, ACCESS, SECRET, BUCKET)?;
    let url = format!("http://{}", gateway.addr);
    let mut remote = RemoteConfig::new(vec![
        Endpoint::new(url.clone(), BUCKET).with_credentials(ACCESS, SECRET),
    ]);
    remote.prefix = PREFIX.into();
    let tier = Arc::new(RemoteTier::open(remote, Arc::new(NoSink))?);
    let (layout, key) = (LayoutDigest([5; 16]), SnapshotKey([6; 32]));
    let state = bytes::Bytes::from(pattern(STATE_BYTES, 11));
    tier.put_snapshot(&key, layout, &state)?;

    let target = super::s3::load::Target::signed(&url, BUCKET, ACCESS, SECRET);
    let mut conn = super::s3::http::Conn::open(&target.host)?;
    let path = format!("/{BUCKET}/{}", state_object_name(PREFIX, &layout, &key));
    let range = format!("bytes={HEADER_BYTES}-{}", HEADER_BYTES + STATE_BYTES - 1);
    let mut body = Vec::with_capacity(STATE_BYTES);
    let samples = 10 * effort.samples;
    let (mut value, mut baseline) = (Vec::new(), Vec::new());
    for _ in 0..samples {
        let t = Instant::now();
        let got = tier.get_snapshot(&key)?;
        value.push(t.elapsed().as_secs_f64() * 1e3);
        anyhow::ensure!(
            got.as_ref() == Some(&state),
            "the remote tier returned another state"
        );
        baseline.push(super::s3::load::timed_ranged_get(
            &target,
            &mut conn,
            &path,
            &range,
            &mut body,
            STATE_BYTES,
        )?);
        anyhow::ensure!(body[..] == state[..], "the ranged GET returned other bytes");
    }
    drop(tier);
    drop(gateway);
    Ok(Row::paired(
        NAME,
        &value,
        &baseline,
        "ms",
        "one signed ranged GET of the same 1 MiB from the gateway (lean HTTP/1.1 client, kept-alive connection)",
    ))
}
