//! `kvtier cluster reconcile`: makes the bucket and the records agree again after crashes.
//!
//! - A replica that died between its manifest PUT and its advertisement left an object
//!   nobody serves: if its manifest checks out (the same checks as adopting it) and its
//!   run has neither record nor tombstone, it is advertised under its writer's name.
//! - What cannot be advertised — a manifest that does not check out, a run already held
//!   by another object (a lost race whose loser died before deleting), data whose manifest
//!   never landed — is deleted once it is older than the bound, so a write still in flight
//!   is never taken for debris.
//!
//! - A state object (snapshot or checkpoint) nobody advertised — the writer's queue was
//!   full, or it died between its PUT and its record — is advertised as `unowned`: budgets
//!   count it from then on, and the GC leader reclaims it as an orphan after
//!   `orphan_after` (a state object's name carries no writer). It verifies itself on every
//!   read, so it is not read here.
//!
//! Tombstoned objects are left to the GC.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};
use kvtier_remote::object::{data_of, manifest_of};
use kvtier_remote::state::header_bytes;
use kvtier_remote::{ObjectInfo, ObjectName, RemoteTier, StateName};
use serde::Serialize;

use crate::keys::Keys;
use crate::record::{Advert, StateAdvert, Tombstone, UNOWNED};
use crate::signed::RecordSigning;
use crate::status::read_pages;

/// The catalog of a tier opened only to survey its bucket: it adopts nothing at open.
#[derive(Debug, Default, Clone, Copy)]
pub struct Survey;

impl kvtier_remote::Catalog for Survey {
    fn at_open(&self, _tier: &RemoteTier) -> Vec<ObjectName> {
        Vec::new()
    }
}

/// What reconcile did (or, with `dry_run`, would do).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// Objects listed in the bucket (manifests and data).
    pub listed: u64,
    /// Objects already advertised.
    pub advertised: u64,
    /// Objects advertised by this run.
    pub readvertised: u64,
    /// Unadvertisable objects deleted (manifest and data count as one object).
    pub removed: u64,
    /// Unadvertisable objects younger than the bound, left alone.
    pub young: u64,
    /// Objects waiting in a tombstone (the GC's).
    pub tombstoned: u64,
    /// State objects among the advertised ones (`advertised` counts them too).
    pub states_advertised: u64,
    /// State objects advertised by this run (`readvertised` counts them too).
    pub states_readvertised: u64,
}

/// How reconcile runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// The cluster.
    pub cluster: String,
    /// Only debris older than this is deleted.
    pub older_than: Duration,
    /// Namespace written into the advertisements it makes.
    pub namespace: String,
    /// Count, change nothing.
    pub dry_run: bool,
    /// Now, Unix milliseconds.
    pub now_ms: u64,
}

/// Reconciles `tier`'s bucket with the records of `options.cluster`.
pub async fn reconcile(
    client: &mut Client,
    tier: &Arc<RemoteTier>,
    options: &Options,
) -> Result<Report, String> {
    // Records are signed with the tier's key, as the replicas sign theirs.
    let signing = RecordSigning::new(tier.signing_key().cloned(), Default::default());
    let keys = Keys::signed(&options.cluster, signing);
    let t = tier.clone();
    let listed = tokio::task::spawn_blocking(move || t.list_objects())
        .await
        .map_err(|e| e.to_string())?;
    let place = |endpoint: &str, object: &str| {
        tier.endpoint_index(endpoint)
            .map(|i| (i, object.to_owned()))
    };
    // Only the objects the records name are kept, page by page.
    let mut advertised: HashSet<(usize, String)> = HashSet::new();
    read_pages(client, &keys.objects(), |kvs| {
        advertised.extend(
            kvs.iter()
                .filter_map(|kv| keys.open::<Advert>(kv.key(), kv.value()).ok())
                .filter_map(|a| place(&a.endpoint, &a.object)),
        );
    })
    .await
    .map_err(|e| e.to_string())?;
    read_pages(client, &keys.states(), |kvs| {
        advertised.extend(
            kvs.iter()
                .filter_map(|kv| keys.open::<StateAdvert>(kv.key(), kv.value()).ok())
                .filter_map(|a| place(&a.endpoint, &a.object)),
        );
    })
    .await
    .map_err(|e| e.to_string())?;
    let mut tombstoned: HashSet<(usize, String)> = HashSet::new();
    read_pages(client, &keys.tombstones(), |kvs| {
        tombstoned.extend(
            kvs.iter()
                .filter_map(|kv| keys.open::<Tombstone>(kv.key(), kv.value()).ok())
                .filter_map(|t| place(t.of.endpoint(), t.of.object())),
        );
    })
    .await
    .map_err(|e| e.to_string())?;
    let manifests: HashSet<(usize, String)> = listed
        .iter()
        .filter(|o| o.name.ends_with(".kvm"))
        .map(|o| (o.endpoint, o.name.clone()))
        .collect();
    let mut report = Report {
        listed: listed.len() as u64,
        ..Report::default()
    };
    for object in &listed {
        if let Some(state) = tier.state_of(object) {
            let place = (state.endpoint, state.name.clone());
            if advertised.contains(&place) {
                report.advertised += 1;
                report.states_advertised += 1;
            } else if tombstoned.contains(&place) {
                report.tombstoned += 1;
            } else if advertise_state(client, tier, &keys, &state, object.size, options).await? {
                report.readvertised += 1;
                report.states_readvertised += 1;
            }
            continue;
        }
        let manifest = if object.name.ends_with(".kvm") {
            object.name.clone()
        } else if let Some(m) = manifest_of(&object.name) {
            if manifests.contains(&(object.endpoint, m.clone())) {
                continue; // judged with its manifest
            }
            m
        } else {
            continue; // not kvtier's
        };
        let place = (object.endpoint, manifest.clone());
        if advertised.contains(&place) {
            report.advertised += 1;
            continue;
        }
        if tombstoned.contains(&place) {
            report.tombstoned += 1;
            continue;
        }
        let name = ObjectName {
            endpoint: object.endpoint,
            manifest,
        };
        let described = if object.name.ends_with(".kvm") {
            let (t, n) = (tier.clone(), name.clone());
            tokio::task::spawn_blocking(move || t.read_described(&n))
                .await
                .map_err(|e| e.to_string())?
        } else {
            Err("data without a manifest".into())
        };
        if let Ok(info) = &described
            && advertise(client, tier, &keys, info, options).await?
        {
            report.readvertised += 1;
            continue;
        }
        let age_ms = options.now_ms.saturating_sub(object.modified_ms);
        if age_ms < options.older_than.as_millis() as u64 {
            report.young += 1;
            continue;
        }
        if !options.dry_run {
            let t = tier.clone();
            let n = name.clone();
            tokio::task::spawn_blocking(move || t.delete(&n))
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())?;
        }
        tracing::info!(object = %name.manifest, data = ?data_of(&name.manifest), "reconcile: removed an object that cannot be advertised");
        report.removed += 1;
    }
    Ok(report)
}

/// Advertises the state object `state` (`size` bytes in the bucket) as `unowned` if its
/// key has neither record nor tombstone; true if it is advertised now (or would be, with
/// `dry_run`).
async fn advertise_state(
    client: &mut Client,
    tier: &RemoteTier,
    keys: &Keys,
    state: &StateName,
    size: u64,
    options: &Options,
) -> Result<bool, String> {
    let key = keys.state(&state.layout, &state.key);
    let (Some(endpoint), Some(tombstone)) =
        (tier.endpoint_id(state.endpoint), keys.tombstone_of(&key))
    else {
        return Ok(false);
    };
    let advert = StateAdvert::of(
        state,
        endpoint,
        size.saturating_sub(header_bytes(tier.signing_key()) as u64),
        UNOWNED,
        0,
        &options.namespace,
        options.now_ms,
    );
    put_if_free(client, keys, &key, &tombstone, &advert, options.dry_run).await
}

/// Writes `record` under `key` if neither it nor `tombstone` exists (with `dry_run`, only
/// says whether `key` is free).
async fn put_if_free(
    client: &mut Client,
    keys: &Keys,
    key: &str,
    tombstone: &str,
    record: &impl Serialize,
    dry_run: bool,
) -> Result<bool, String> {
    if dry_run {
        let free = client
            .get(key, None)
            .await
            .map_err(|e| e.to_string())?
            .kvs()
            .is_empty();
        return Ok(free);
    }
    let txn = Txn::new()
        .when(vec![
            Compare::version(key, CompareOp::Equal, 0),
            Compare::version(tombstone, CompareOp::Equal, 0),
        ])
        .and_then(vec![TxnOp::put(key, keys.seal(key, record), None)]);
    let done = client.txn(txn).await.map_err(|e| e.to_string())?;
    if done.succeeded() {
        tracing::info!(
            key,
            "reconcile: advertised an object its writer never advertised"
        );
    }
    Ok(done.succeeded())
}

/// Advertises `info` under its writer's name if its run has neither record nor tombstone;
/// true if it is advertised now (or would be, with `dry_run`).
async fn advertise(
    client: &mut Client,
    tier: &RemoteTier,
    keys: &Keys,
    info: &ObjectInfo,
    options: &Options,
) -> Result<bool, String> {
    let (Some(endpoint), Some((key, tombstone))) =
        (tier.endpoint_id(info.name.endpoint), keys.of_object(info))
    else {
        return Ok(false);
    };
    // The writer's tag is `REPLICA.GENERATION.SEQUENCE`; an object named by content only
    // (written outside cluster mode) has no owner, and the GC leader treats it as an
    // orphan once `orphan_after` has passed.
    let tag = info
        .name
        .manifest
        .rsplit_once(".w.")
        .and_then(|(_, t)| t.strip_suffix(".kvm"));
    let mut parts = tag.unwrap_or("").split('.');
    let owner = parts.next().filter(|o| !o.is_empty()).unwrap_or(UNOWNED);
    let generation = parts.next().and_then(|g| g.parse().ok()).unwrap_or(0);
    let advert = Advert::of(
        info,
        endpoint,
        owner,
        generation,
        &options.namespace,
        options.now_ms,
    );
    put_if_free(client, keys, &key, &tombstone, &advert, options.dry_run).await
}
