//! Cluster mode against etcd and S3 alone, every replica in this process on one etcd
//! member and `kvtier gateway` (both on loopback, started and stopped here):
//!
//! - `cluster.advertise.p50.ms` / `.p99.ms`: a store returns on A → B's index hits;
//!   baseline: a raw etcd put → watch event of a value the size of the advertisement.
//! - `cluster.remote_hit.load.2MiB.ms`: B loads A's 8×256 KiB run; baseline: one ranged
//!   GET of the same bytes from the gateway with the same S3 client library.
//! - `cluster.remote_hit.signed.load.2MiB.ms`: the same with a signing key on both
//!   replicas (every block's keyed tag checked on the load; docs/remote-tier.md, "Signed
//!   objects"), against the same baseline: the cost of signing on a hit.
//! - `cluster.replay.100k.s`: a replica cold-starts until 100,000 advertised objects hit;
//!   baseline: the paginated etcd read of the same records.
//! - `cluster.publish.ops`: objects advertised per second while 4 threads report writes;
//!   baseline: the same records (the publishing replica's own keys and values, byte for
//!   byte, under its own fence) written raw, batched as the publisher batches them, with
//!   the same concurrency (one record per transaction is printed beside it).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kvtier_core::clock::{ClockExt, SystemClock};
use kvtier_core::hash::BlockHash;
use kvtier_core::layout::{Layout, LayoutDigest};
use kvtier_core::tier::{BlockMeta, NoSink, Tier};
use kvtier_core::{KvDtype, LayoutKey};
use kvtier_meta::etcd_client::{Client, Compare, CompareOp, Txn, TxnOp, WatchOptions};
use kvtier_meta::{Advert, ClusterCatalog, ClusterConfig};
use kvtier_remote::{Endpoint, ObjectInfo, ObjectName, RemoteConfig, RemoteTier};

use super::measure::pattern;
use super::{Effort, Row};

const NAMES: [&str; 6] = [
    "cluster.advertise.p50.ms",
    "cluster.advertise.p99.ms",
    "cluster.remote_hit.load.2MiB.ms",
    "cluster.replay.100k.s",
    "cluster.publish.ops",
    "cluster.remote_hit.signed.load.2MiB.ms",
];
const ACCESS: &str = "kvtier-bench";
const SECRET: &str = "kvtier-bench-secret";
const BUCKET: &str = "bench";
const REPLAY_OBJECTS: usize = 100_000;
const PUBLISH_THREADS: usize = 4;

pub fn rows(effort: Effort, wanted: &dyn Fn(&str) -> bool) -> anyhow::Result<Vec<Row>> {
    if !NAMES.iter().any(|n| wanted(n)) {
        return Ok(Vec::new());
    }
    let dir = std::env::temp_dir().join(format!("kvtier-bench-cluster-{}", std::process::id()));
    let rows = measure(&dir, effort, wanted);
    let _ = std::fs::remove_dir_all(&dir);
    rows
}

fn measure(
    dir: &std::path::Path,
    effort: Effort,
    wanted: &dyn Fn(&str) -> bool,
) -> anyhow::Result<Vec<Row>> {
    let etcd = match kvtier_testkit::EtcdCluster::start(&dir.join("etcd"), 1) {
        Ok(e) => e,
        Err(e) => {
            println!(
                "  (cluster rows skipped: no etcd to start: {e}; scripts/setup.sh installs it)"
            );
            return Ok(Vec::new());
        }
    };
    let gateway = super::s3::procs::in_process_gateway(&dir.join("s3"), ACCESS, SECRET, BUCKET)?;
    let bench = Bench {
        url: format!("http://{}", gateway.addr),
        etcd: etcd.endpoints(),
        rt: tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?,
        effort,
    };
    let mut rows = Vec::new();
    if wanted(NAMES[0]) || wanted(NAMES[1]) {
        rows.extend(bench.advertise()?);
    }
    if wanted(NAMES[2]) {
        rows.push(bench.remote_hit(None)?);
    }
    if wanted(NAMES[5]) {
        let key = kvtier_remote::SigningKey::from_bytes(&[0x5a; 32]);
        rows.push(bench.remote_hit(Some(key))?);
    }
    if wanted(NAMES[3]) {
        rows.push(bench.replay()?);
    }
    if wanted(NAMES[4]) {
        rows.push(bench.publish()?);
    }
    drop(gateway);
    drop(etcd);
    Ok(rows.into_iter().filter(|r| wanted(&r.name)).collect())
}

struct Bench {
    url: String,
    etcd: Vec<String>,
    rt: tokio::runtime::Runtime,
    effort: Effort,
}

/// One replica in this process.
struct Replica {
    tier: Arc<RemoteTier>,
    catalog: Arc<ClusterCatalog>,
}

impl Bench {
    fn remote(&self) -> RemoteConfig {
        let mut c = RemoteConfig::new(vec![
            Endpoint::new(self.url.clone(), BUCKET).with_credentials(ACCESS, SECRET),
        ]);
        c.prefix = "kv".into();
        c
    }

    /// Replica `name` of `cluster`, registered and replayed.
    fn replica(&self, cluster: &str, name: &str) -> anyhow::Result<Replica> {
        self.replica_signing(cluster, name, None)
    }

    /// [`Bench::replica`] signing its objects and records with `key`.
    fn replica_signing(
        &self,
        cluster: &str,
        name: &str,
        key: Option<kvtier_remote::SigningKey>,
    ) -> anyhow::Result<Replica> {
        let mut config = ClusterConfig::new(self.etcd.clone(), cluster, name);
        config.gc_leader = false;
        config.signing_key = key.clone();
        let mut remote = self.remote();
        remote.signing_key = key;
        let catalog = ClusterCatalog::new(
            config,
            self.rt.handle().clone(),
            Arc::new(SystemClock::new()),
        )
        .map_err(anyhow::Error::msg)?;
        let tier = Arc::new(RemoteTier::open_with_catalog(
            remote,
            Arc::new(NoSink),
            catalog.clone(),
        )?);
        catalog.start(&tier);
        anyhow::ensure!(
            self.rt.block_on(catalog.replayed(Duration::from_secs(600))),
            "replica {name} did not replay"
        );
        let t = Instant::now();
        while catalog.generation() == 0 {
            anyhow::ensure!(
                t.elapsed() < Duration::from_secs(20),
                "{name} did not register"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(Replica { tier, catalog })
    }

    fn client(&self) -> anyhow::Result<Client> {
        Ok(self.rt.block_on(kvtier_meta::connect_once(&self.etcd))?)
    }

    fn advertise(&self) -> anyhow::Result<Vec<Row>> {
        let layout = Layout::new(LayoutKey::new("bench-advert", KvDtype::F16, 16, 2, 2, 32))?;
        let (a, b) = (self.replica("adv", "a")?, self.replica("adv", "b")?);
        let samples = 50 * self.effort.scale;
        let mut took = Vec::with_capacity(samples);
        let mut record_bytes = 0;
        for i in 0..samples {
            let chain = chain(&layout, 8, i as u32);
            let last = chain[7].0.hash;
            a.tier.put_many(&chain);
            let t = Instant::now();
            while !b.tier.contains(&last) {
                anyhow::ensure!(t.elapsed() < Duration::from_secs(10), "B never hit");
                std::hint::spin_loop();
            }
            took.push(t.elapsed().as_secs_f64() * 1e3);
            if record_bytes == 0 {
                record_bytes = b
                    .catalog
                    .view()
                    .all()
                    .first()
                    .and_then(|(_, s)| serde_json::to_vec(s.advert.run()?).ok())
                    .map_or(0, |v| v.len());
            }
        }
        let raw = self.raw_put_to_watch(samples, record_bytes.max(1))?;
        let baseline_is = format!("raw etcd put → watch event of a {record_bytes} B value");
        Ok(vec![
            Row::new(
                NAMES[0],
                pct(&mut took, 50),
                "ms",
                pct(&mut raw.clone(), 50),
                baseline_is.clone(),
            ),
            Row::new(
                NAMES[1],
                pct(&mut took, 99),
                "ms",
                pct(&mut raw.clone(), 99),
                baseline_is,
            ),
        ])
    }

    /// Milliseconds from a put's start to its watch event, `samples` times.
    fn raw_put_to_watch(&self, samples: usize, bytes: usize) -> anyhow::Result<Vec<f64>> {
        let (mut writer, mut watcher) = (self.client()?, self.client()?);
        let seen = Arc::new(AtomicU64::new(0));
        let seen2 = seen.clone();
        let mut stream = self
            .rt
            .block_on(watcher.watch("bench/raw/", Some(WatchOptions::new().with_prefix())))?;
        let reader = self.rt.spawn(async move {
            while let Ok(Some(m)) = stream.message().await {
                seen2.fetch_add(m.events().len() as u64, Ordering::SeqCst);
            }
        });
        let value = vec![b'x'; bytes];
        let mut took = Vec::with_capacity(samples);
        for i in 0..samples {
            let before = seen.load(Ordering::SeqCst);
            let t = Instant::now();
            self.rt
                .block_on(writer.put(format!("bench/raw/{i}"), value.clone(), None))?;
            while seen.load(Ordering::SeqCst) == before {
                anyhow::ensure!(t.elapsed() < Duration::from_secs(10), "no watch event");
                std::hint::spin_loop();
            }
            took.push(t.elapsed().as_secs_f64() * 1e3);
        }
        reader.abort();
        Ok(took)
    }

    /// B loads A's run; both sign with `key` if there is one.
    fn remote_hit(&self, key: Option<kvtier_remote::SigningKey>) -> anyhow::Result<Row> {
        let layout = Layout::new(LayoutKey::new("bench-hit", KvDtype::F16, 16, 8, 8, 64))?;
        anyhow::ensure!(layout.block_bytes() == 256 << 10, "a block is not 256 KiB");
        let (cluster, name) = match key {
            Some(_) => ("hit-signed", NAMES[5]),
            None => ("hit", NAMES[2]),
        };
        let (a, b) = (
            self.replica_signing(cluster, "a", key.clone())?,
            self.replica_signing(cluster, "b", key)?,
        );
        let chain = chain(&layout, 8, 1);
        let hashes: Vec<BlockHash> = chain.iter().map(|(m, _)| m.hash).collect();
        a.tier.put_many(&chain);
        let t = Instant::now();
        while !b.tier.contains(&hashes[7]) || b.tier.record_checks().1 == 0 {
            anyhow::ensure!(
                t.elapsed() < Duration::from_secs(10),
                "B never learned of the run"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let object = b
            .catalog
            .view()
            .all()
            .first()
            .map(|(_, s)| s.advert.object().to_owned())
            .ok_or_else(|| anyhow::anyhow!("no advertisement"))?;
        // The baseline client: kvtier bench's lean HTTP/1.1 client, one keep-alive
        // connection, SigV4 — the least a ranged GET of these bytes can cost here.
        let target = super::s3::load::Target::signed(&self.url, BUCKET, ACCESS, SECRET);
        let mut conn = super::s3::http::Conn::open(&target.host)?;
        let path = format!("/{BUCKET}/{}", object.replace(".kvm", ".kvo"));
        let bytes = 8 * (256usize << 10);
        let range = format!("bytes=0-{}", bytes - 1);
        let mut body = Vec::with_capacity(bytes);
        let samples = 10 * self.effort.samples;
        let (mut value, mut baseline) = (Vec::new(), Vec::new());
        for _ in 0..samples {
            let t = Instant::now();
            let got = b.tier.get_run(&hashes)?;
            value.push(t.elapsed().as_secs_f64() * 1e3);
            anyhow::ensure!(
                got.len() == 8 && got[7] == chain[7].1,
                "B loaded the wrong bytes"
            );
            baseline.push(super::s3::load::timed_ranged_get(
                &target, &mut conn, &path, &range, &mut body, bytes,
            )?);
        }
        Ok(Row::paired(
            name,
            &value,
            &baseline,
            "ms",
            "one signed ranged GET of the same 2 MiB from the gateway (lean HTTP/1.1 client, kept-alive connection)",
        ))
    }

    fn replay(&self) -> anyhow::Result<Row> {
        let endpoint = format!("{}/{BUCKET}", self.url);
        let layout = LayoutDigest([0x5a; 16]);
        let mut client = self.client()?;
        let keys = kvtier_meta::Keys::new("replay");
        let start = Instant::now();
        for batch in (0..REPLAY_OBJECTS).collect::<Vec<_>>().chunks(128) {
            let ops: Vec<TxnOp> = batch
                .iter()
                .map(|&i| {
                    let hash = BlockHash(seeded(i as u64));
                    let info = ObjectInfo {
                        name: ObjectName {
                            endpoint: 0,
                            manifest: format!(
                                "kv/{}/{}-{}.w.bench.1.{i}.kvm",
                                layout.to_hex(),
                                hash.to_hex(),
                                hash.to_hex()
                            ),
                        },
                        layout,
                        first_position: 1,
                        first_parent: BlockHash(seeded(i as u64 + (1 << 40))),
                        blocks: vec![hash],
                        block_bytes: 4096,
                        manifest_digest: [0; 32],
                    };
                    let advert = Advert::of(&info, endpoint.clone(), "bench", 1, "default", 0);
                    TxnOp::put(
                        keys.object(&layout, &hash, &hash),
                        serde_json::to_vec(&advert).unwrap_or_default(),
                        None,
                    )
                })
                .collect();
            self.rt.block_on(client.txn(Txn::new().and_then(ops)))?;
        }
        println!(
            "  (replay: wrote {REPLAY_OBJECTS} advertisements in {:.1} s)",
            start.elapsed().as_secs_f64()
        );
        // Each sample is a cold start over 100,000 records: five in a full run, one in a
        // quick (smoke) run.
        let samples = if self.effort.scale > 1 { 5 } else { 1 };
        let (mut value, mut baseline) = (Vec::new(), Vec::new());
        for s in 0..samples {
            let t = Instant::now();
            let (_, read) = self.rt.block_on(kvtier_meta::status::read_prefix(
                &mut client,
                &keys.objects(),
            ))?;
            baseline.push(t.elapsed().as_secs_f64());
            anyhow::ensure!(read.len() == REPLAY_OBJECTS, "read {} records", read.len());
            let t = Instant::now();
            let r = self.replica("replay", &format!("cold{s}"))?;
            let took = t.elapsed().as_secs_f64();
            let hit = (0..REPLAY_OBJECTS)
                .filter(|&i| r.tier.contains(&BlockHash(seeded(i as u64))))
                .count();
            anyhow::ensure!(
                hit == REPLAY_OBJECTS,
                "{hit} of {REPLAY_OBJECTS} hit after replay"
            );
            value.push(took);
        }
        Ok(Row::paired(
            NAMES[3],
            &value,
            &baseline,
            "s",
            "paginated etcd read of the same 100,000 records",
        ))
    }

    fn publish(&self) -> anyhow::Result<Row> {
        let n = 1_000 * self.effort.scale;
        let layout = Layout::new(LayoutKey::new("bench-publish", KvDtype::F16, 16, 1, 1, 32))?;
        // Untimed: the objects are written to the bucket under replica `p`'s name (by a
        // writer that tells nobody).
        let recorder = Arc::new(Recorder::default());
        let writer =
            RemoteTier::open_with_catalog(self.remote(), Arc::new(NoSink), recorder.clone())?;
        for i in 0..n {
            writer.put_many(&chain(&layout, 1, 9_000 + i as u32));
        }
        let infos = std::mem::take(&mut *recorder.wrote.lock().unwrap_or_else(|e| e.into_inner()));
        anyhow::ensure!(infos.len() == n, "wrote {} of {n} objects", infos.len());
        let p = self.replica("pub", "p")?;
        let stats = p.catalog.stats().clone();
        let raw = RawRecords::of(self, &p, "raw", &infos)?;
        // Each sample publishes all n objects and is paired with a raw sample of the same
        // records. One sample lasts a fraction of a second and etcd's own rate swings from
        // one to the next (its backend commits every 100 ms), so a full run takes many and
        // quotes the median of the per-sample ratios. Every timed phase starts on a store
        // compacted up to now, and the two alternate which goes first, so neither runs on
        // the other's history. Between samples the records are deleted (p forgets the
        // objects) and p adopts the objects again, untimed.
        let samples = if self.effort.scale > 1 { 15 } else { 1 };
        let (mut value, mut baseline) = (Vec::new(), Vec::new());
        for sample in 0..samples {
            for info in &infos {
                anyhow::ensure!(
                    matches!(p.tier.adopt(&info.name), kvtier_remote::Adopted::Blocks(1)),
                    "p did not adopt {}",
                    info.name.manifest
                );
            }
            let raw_first = sample % 2 == 1;
            if raw_first {
                self.compact()?;
                baseline.push(self.raw_txns(&raw, 16, false)?);
            }
            self.compact()?;
            value.push(self.publish_sample(&p, &infos)?);
            if !raw_first {
                self.compact()?;
                baseline.push(self.raw_txns(&raw, 16, false)?);
            }
            if sample + 1 < samples {
                self.withdraw_all(&p, "pub")?;
            }
        }
        anyhow::ensure!(
            stats.resyncs_compacted.load(Ordering::Relaxed) == 0,
            "a compaction made the publishing replica resync: the samples are not comparable"
        );
        let transactions = stats.publish_transactions.load(Ordering::Relaxed);
        let mut values = value.clone();
        values.sort_by(f64::total_cmp);
        let mut ratios: Vec<f64> = value.iter().zip(&baseline).map(|(v, b)| v / b).collect();
        ratios.sort_by(f64::total_cmp);
        let quartile = |v: &[f64], q: usize| v[(v.len() - 1) * q / 4];
        // Context: one record per transaction (the baseline), and batched while a
        // client watches.
        self.compact()?;
        let single = self.raw_txns(&raw, 1, false)?;
        self.compact()?;
        let watched = self.raw_txns(&raw, 16, true)?;
        println!(
            "  (publish: {samples} samples of {n}, {:.1} records per transaction, per-sample ratios {:.2}–{:.2}–{:.2} (quartiles); raw records/s one per transaction {single:.0}, ratio {:.2}; batched with one watcher on their prefix {watched:.0})",
            (n * samples) as f64 / transactions.max(1) as f64,
            quartile(&ratios, 1),
            quartile(&ratios, 2),
            quartile(&ratios, 3),
            quartile(&values, 2) / single
        );
        Ok(Row::paired(
            NAMES[4],
            &value,
            &baseline,
            "ops/s",
            "the same records raw (keys as long, same values and fence), 16 to a transaction, 128 transactions in flight",
        ))
    }

    /// Objects advertised per second while four storing threads report `infos` to `p`'s
    /// catalog (as the tier does after each PUT), until every one is advertised.
    fn publish_sample(&self, p: &Replica, infos: &[ObjectInfo]) -> anyhow::Result<f64> {
        let stats = p.catalog.stats();
        let before = stats.published.load(Ordering::Relaxed);
        let t = Instant::now();
        std::thread::scope(|s| {
            for k in 0..PUBLISH_THREADS {
                let catalog = p.catalog.clone();
                s.spawn(move || {
                    for info in infos.iter().skip(k).step_by(PUBLISH_THREADS) {
                        kvtier_remote::Catalog::wrote(catalog.as_ref(), info);
                    }
                });
            }
        });
        let n = infos.len() as u64;
        while stats.published.load(Ordering::Relaxed) < before + n {
            anyhow::ensure!(t.elapsed() < Duration::from_secs(120), "publishing stalled");
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(n as f64 / t.elapsed().as_secs_f64())
    }

    /// Compacts etcd's history up to now (as a deployment's auto-compaction does), so
    /// every timed phase starts from the same store, not after the revisions of the ones
    /// before it.
    fn compact(&self) -> anyhow::Result<()> {
        let mut client = self.client()?;
        self.rt.block_on(async {
            let revision = client
                .get("bench/none", None)
                .await?
                .header()
                .map(|h| h.revision())
                .unwrap_or(0);
            client
                .compact(
                    revision,
                    Some(kvtier_meta::etcd_client::CompactionOptions::new().with_physical()),
                )
                .await?;
            Ok::<_, anyhow::Error>(())
        })
    }

    /// Deletes every advertisement of `cluster` and waits until `replica` has applied the
    /// deletions (its view is empty, its tier forgot the objects).
    fn withdraw_all(&self, replica: &Replica, cluster: &str) -> anyhow::Result<()> {
        let mut client = self.client()?;
        let prefix = kvtier_meta::Keys::new(cluster).objects();
        self.rt.block_on(client.delete(
            prefix.as_str(),
            Some(kvtier_meta::etcd_client::DeleteOptions::new().with_prefix()),
        ))?;
        let t = Instant::now();
        while !replica.catalog.view().is_empty() {
            anyhow::ensure!(
                t.elapsed() < Duration::from_secs(60),
                "the deletions never reached the replica"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }

    /// Raw records per second: `records` (key and value) written straight to etcd,
    /// `per_txn` to a transaction — each record compared absent with its tombstone
    /// (`fence` first) — 128 transactions in flight (as many as the publisher keeps); with
    /// `watch`, one more client watches their prefix meanwhile. Every transaction must
    /// commit. The records are deleted afterwards (untimed), so the next sample finds etcd
    /// as this one did.
    fn raw_txns(&self, raw: &RawRecords, per_txn: usize, watch: bool) -> anyhow::Result<f64> {
        let client = self.client()?;
        let watcher = if watch {
            let mut w = self.client()?;
            let mut stream = self
                .rt
                .block_on(w.watch(raw.prefix.clone(), Some(WatchOptions::new().with_prefix())))?;
            Some(self.rt.spawn(async move {
                let _keep = w;
                while let Ok(Some(_)) = stream.message().await {}
            }))
        } else {
            None
        };
        let n = raw.records.len();
        let txns = n.div_ceil(per_txn);
        let t = Instant::now();
        self.rt.block_on(async {
            let mut set = tokio::task::JoinSet::new();
            for k in 0..128 {
                let (mut c, records, fence) =
                    (client.clone(), raw.records.clone(), raw.fence.clone());
                set.spawn(async move {
                    for j in (k..txns).step_by(128) {
                        let mut when = fence.clone();
                        let mut puts = Vec::with_capacity(per_txn);
                        for (key, tomb, value) in &records[j * per_txn..((j + 1) * per_txn).min(n)]
                        {
                            when.push(Compare::version(key.as_str(), CompareOp::Equal, 0));
                            when.push(Compare::version(tomb.as_str(), CompareOp::Equal, 0));
                            puts.push(TxnOp::put(key.as_str(), value.as_str(), None));
                        }
                        let r = c.txn(Txn::new().when(when).and_then(puts)).await?;
                        anyhow::ensure!(r.succeeded(), "a raw transaction did not commit");
                    }
                    Ok::<_, anyhow::Error>(())
                });
            }
            while let Some(r) = set.join_next().await {
                r??;
            }
            Ok::<_, anyhow::Error>(())
        })?;
        let rate = n as f64 / t.elapsed().as_secs_f64();
        if let Some(w) = watcher {
            w.abort();
        }
        let mut c = client;
        self.rt.block_on(c.delete(
            raw.prefix.as_str(),
            Some(kvtier_meta::etcd_client::DeleteOptions::new().with_prefix()),
        ))?;
        Ok(rate)
    }
}

/// What the publish row's baseline writes: replica `p`'s own advertisements of its
/// objects, byte for byte, under keys of the same length in a sibling cluster nobody
/// watches, and `p`'s own fence (its generation's value and its member key's lease).
struct RawRecords {
    prefix: String,
    /// Advertisement key, tombstone key, value.
    records: Arc<Vec<(String, String, String)>>,
    fence: Vec<Compare>,
}

impl RawRecords {
    fn of(
        bench: &Bench,
        replica: &Replica,
        cluster: &str,
        infos: &[ObjectInfo],
    ) -> anyhow::Result<Self> {
        let config = replica.catalog.config();
        let ours = kvtier_meta::Keys::new(&config.name);
        let keys = kvtier_meta::Keys::new(cluster);
        anyhow::ensure!(
            keys.root().len() == ours.root().len(),
            "the baseline's keys must be as long as the replica's"
        );
        let generation = replica.catalog.generation();
        let endpoint = replica.tier.endpoint_id(0).unwrap_or_default();
        let clock = SystemClock::new();
        let mut records = Vec::with_capacity(infos.len());
        for info in infos {
            let (key, tomb) = keys
                .of_object(info)
                .ok_or_else(|| anyhow::anyhow!("an object without blocks"))?;
            let mut advert = Advert::of(
                info,
                endpoint.clone(),
                &config.replica,
                generation,
                &config.namespace,
                clock.wall_unix_ms(),
            );
            advert.priority = config.priority;
            records.push((key, tomb, serde_json::to_string(&advert)?));
        }
        let mut client = bench.client()?;
        let member = ours.member(&config.replica);
        let lease = bench
            .rt
            .block_on(client.get(member.as_str(), None))?
            .kvs()
            .first()
            .map(|kv| kv.lease())
            .ok_or_else(|| anyhow::anyhow!("replica {} is not registered", config.replica))?;
        let fence = vec![
            Compare::value(
                ours.generation(&config.replica),
                CompareOp::Equal,
                generation.to_string(),
            ),
            Compare::lease(member, CompareOp::Equal, lease),
        ];
        Ok(Self {
            prefix: keys.root().to_owned(),
            records: Arc::new(records),
            fence,
        })
    }
}

/// A writer's catalog that names objects like replica `p` and tells nobody of them.
#[derive(Debug, Default)]
struct Recorder {
    sequence: AtomicU64,
    wrote: std::sync::Mutex<Vec<ObjectInfo>>,
}

impl kvtier_remote::Catalog for Recorder {
    fn at_open(&self, _: &RemoteTier) -> Vec<ObjectName> {
        Vec::new()
    }
    fn writer_tag(&self) -> Option<String> {
        Some(format!(
            "p.1.{}",
            self.sequence.fetch_add(1, Ordering::Relaxed)
        ))
    }
    fn wrote(&self, object: &ObjectInfo) {
        self.wrote
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(object.clone());
    }
}

/// `n` blocks of one chain under `layout`, payloads from `seed`.
fn chain(layout: &Layout, n: usize, seed: u32) -> Vec<(BlockMeta, bytes::Bytes)> {
    let tokens: Vec<u32> = (0..(n * layout.tokens_per_block()) as u32)
        .map(|t| t.wrapping_mul(2_654_435_761) ^ seed)
        .collect();
    BlockMeta::chain(layout, &tokens)
        .into_iter()
        .enumerate()
        .map(|(i, meta)| {
            let payload = pattern(layout.block_bytes() as usize, (seed as u8) ^ (i as u8));
            (meta, bytes::Bytes::from(payload))
        })
        .collect()
}

/// 16 bytes derived from `i` (distinct for distinct `i`).
fn seeded(i: u64) -> [u8; 16] {
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&i.to_le_bytes());
    out[8..].copy_from_slice(&i.wrapping_mul(0x9e37_79b9_7f4a_7c15).to_le_bytes());
    out
}

/// The `p`th percentile of `v`.
fn pct(v: &mut [f64], p: usize) -> f64 {
    v.sort_by(f64::total_cmp);
    let i = ((v.len() * p) / 100).min(v.len().saturating_sub(1));
    v.get(i).copied().unwrap_or(f64::NAN)
}
