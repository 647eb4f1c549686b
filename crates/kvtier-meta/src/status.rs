//! What `kvtier cluster status` reports, read from etcd alone: the live replicas and
//! their generations, the GC leader, and advertised objects (runs and state objects) and
//! bytes per owner and per namespace, with the tombstones waiting for their grace window.

use std::collections::BTreeMap;

use etcd_client::{Client, GetOptions, SortOrder, SortTarget};
use serde::Serialize;

use crate::keys::{Keys, prefix_end};
use crate::record::{Advert, Advertised, Member, Priority, StateAdvert};

/// Records per page when reading a whole prefix (fewer when a page of them is larger
/// than [`MAX_MESSAGE`]).
pub const PAGE: i64 = 2_000;

/// The largest etcd response this crate decodes. gRPC's default is 4 MiB, which a page
/// of 2,000 advertisements of runs of 32 blocks or more passes (each lists its blocks'
/// hashes), and so would a watch catching up after a gap: a replica would then fail its
/// replay, or resume its watch, forever. etcd itself bounds one record (its
/// `--max-request-bytes`, 1.5 MiB by default); pages shrink and watches fragment to stay
/// under this bound.
pub const MAX_MESSAGE: usize = 64 << 20;

/// One key and value with the revision it was last written at.
#[derive(Debug, Clone)]
pub struct Entry {
    /// The key.
    pub key: Vec<u8>,
    /// The value.
    pub value: Vec<u8>,
    /// Its `mod_revision`.
    pub revision: i64,
}

/// Reads every key under `prefix` at one revision, [`PAGE`] keys at a time, handing each
/// page to `page` as it arrives (so a large prefix is never held whole); returns the
/// revision read at. A page whose response would pass [`MAX_MESSAGE`] is asked for again
/// with half as many keys.
pub async fn read_pages(
    client: &mut Client,
    prefix: &str,
    mut page: impl FnMut(&[etcd_client::KeyValue]),
) -> Result<i64, etcd_client::Error> {
    let end = prefix_end(prefix);
    let mut start = prefix.as_bytes().to_vec();
    let mut revision = 0;
    let mut kv = client.kv_client().max_decoding_message_size(MAX_MESSAGE);
    let mut limit = PAGE;
    loop {
        let mut options = GetOptions::new()
            .with_range(end.clone())
            .with_limit(limit)
            .with_sort(SortTarget::Key, SortOrder::Ascend);
        if revision > 0 {
            options = options.with_revision(revision);
        }
        let got = match kv.get(start.clone(), Some(options)).await {
            Err(e) if limit > 1 && too_large(&e) => {
                limit /= 2;
                continue;
            }
            got => got?,
        };
        if revision == 0 {
            revision = got.header().map_or(0, |h| h.revision());
        }
        page(got.kvs());
        match got.kvs().last() {
            Some(last) if got.more() => {
                start = last.key().to_vec();
                start.push(0);
            }
            _ => return Ok(revision),
        }
    }
}

/// Whether etcd's answer was refused for passing the decode bound (gRPC's
/// `OUT_OF_RANGE` from the client's own decoder, or etcd's own limit on a response).
pub(crate) fn too_large(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(status) => {
            matches!(
                status.code(),
                tonic::Code::OutOfRange | tonic::Code::ResourceExhausted
            )
        }
        _ => false,
    }
}

/// Every key under `prefix`, read at one revision; with the revision.
pub async fn read_prefix(
    client: &mut Client,
    prefix: &str,
) -> Result<(i64, Vec<Entry>), etcd_client::Error> {
    let mut out = Vec::new();
    let revision = read_pages(client, prefix, |kvs| {
        out.extend(kvs.iter().map(|kv| Entry {
            key: kv.key().to_vec(),
            value: kv.value().to_vec(),
            revision: kv.mod_revision(),
        }));
    })
    .await?;
    Ok((revision, out))
}

/// A live replica.
#[derive(Debug, Clone, Serialize)]
pub struct LiveReplica {
    /// Its id.
    pub replica: String,
    /// Its current generation.
    pub generation: u64,
    /// When it registered, Unix milliseconds.
    pub since_ms: u64,
}

/// Objects and bytes of one owner or namespace.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Usage {
    /// Advertised run objects.
    pub objects: u64,
    /// Advertised state objects (snapshots and checkpoints of recurrent state).
    pub states: u64,
    /// The bytes of both (what a namespace's budget counts).
    pub bytes: u64,
    /// Pinned objects among both.
    pub pinned: u64,
}

impl Status {
    /// Counts one advertisement into its owner's and its namespace's usage.
    fn count(&mut self, advert: &Advertised) {
        for usage in [
            self.owners.entry(advert.owner().to_owned()).or_default(),
            self.namespaces
                .entry(advert.namespace().to_owned())
                .or_default(),
        ] {
            match advert {
                Advertised::Run(_) => usage.objects += 1,
                Advertised::State(_) => usage.states += 1,
            }
            usage.bytes += advert.bytes();
            usage.pinned += u64::from(advert.priority() == Priority::Pinned);
        }
    }
}

/// The cluster as etcd has it.
#[derive(Debug, Clone, Serialize)]
pub struct Status {
    /// The cluster's name.
    pub cluster: String,
    /// The etcd revision read at.
    pub revision: i64,
    /// Replicas with a live member key.
    pub replicas: Vec<LiveReplica>,
    /// Every replica's generation, live or not.
    pub generations: BTreeMap<String, u64>,
    /// The GC leader, if one is elected.
    pub leader: Option<String>,
    /// Advertised objects and bytes per owner.
    pub owners: BTreeMap<String, Usage>,
    /// Advertised objects and bytes per namespace.
    pub namespaces: BTreeMap<String, Usage>,
    /// Objects withdrawn and waiting for their grace window.
    pub tombstones: u64,
    /// Records that could not be read (another version, or damaged).
    pub unreadable: u64,
}

/// Reads the status of `cluster`.
pub async fn status(client: &mut Client, cluster: &str) -> Result<Status, etcd_client::Error> {
    let keys = Keys::new(cluster);
    let (_, members) = read_prefix(client, &keys.members()).await?;
    let (_, generations) = read_prefix(client, &keys.generations()).await?;
    let leader = client
        .leader(keys.election())
        .await
        .ok()
        .and_then(|r| r.kv().and_then(|kv| kv.value_str().ok().map(str::to_owned)));
    let mut status = Status {
        cluster: cluster.to_owned(),
        revision: 0,
        replicas: Vec::new(),
        generations: BTreeMap::new(),
        leader,
        owners: BTreeMap::new(),
        namespaces: BTreeMap::new(),
        tombstones: 0,
        unreadable: 0,
    };
    for e in &members {
        match serde_json::from_slice::<Member>(&e.value) {
            Ok(m) => status.replicas.push(LiveReplica {
                replica: m.replica,
                generation: m.generation,
                since_ms: m.since_ms,
            }),
            Err(_) => status.unreadable += 1,
        }
    }
    let generations_prefix = keys.generations();
    for e in &generations {
        let replica = String::from_utf8_lossy(&e.key)
            .strip_prefix(generations_prefix.as_str())
            .map(str::to_owned);
        let generation = std::str::from_utf8(&e.value)
            .ok()
            .and_then(|v| v.parse().ok());
        match (replica, generation) {
            (Some(r), Some(g)) => {
                status.generations.insert(r, g);
            }
            _ => status.unreadable += 1,
        }
    }
    // Advertisements and tombstones may number in the hundreds of thousands: counted
    // page by page, never held whole.
    status.revision = read_pages(client, &keys.objects(), |kvs| {
        for kv in kvs {
            match keys.open::<Advert>(kv.key(), kv.value()) {
                Ok(a) => status.count(&Advertised::Run(a)),
                Err(_) => status.unreadable += 1,
            }
        }
    })
    .await?;
    read_pages(client, &keys.states(), |kvs| {
        for kv in kvs {
            match keys.open::<StateAdvert>(kv.key(), kv.value()) {
                Ok(a) => status.count(&Advertised::State(a)),
                Err(_) => status.unreadable += 1,
            }
        }
    })
    .await?;
    read_pages(client, &keys.tombstones(), |kvs| {
        status.tombstones += kvs.len() as u64;
    })
    .await?;
    Ok(status)
}
