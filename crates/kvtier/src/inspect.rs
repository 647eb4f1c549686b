//! `kvtier inspect DIR [--verify]`: what an SSD store holds, per namespace (LayoutKey
//! digest), and with `--verify` whether every record's checksums still match.
//!
//! It opens the store read-only: no lock, no repair, nothing created or removed, so it works
//! on a store a running server holds (a record being written just then shows as a torn
//! tail) and leaves the shutdown record where the next start will read it. Given the data
//! directory of `kvtier serve` (which holds the store in `ssd/`), it inspects that store.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kvtier_core::LayoutDigest;
use kvtier_ssd::SegmentStore;
use kvtier_ssd::format::Kind;
use kvtier_ssd::store::ReadFault;

/// Options of `kvtier inspect`.
#[derive(Debug, clap::Args)]
pub struct InspectArgs {
    /// The store directory, or the data directory of `kvtier serve` (its `ssd/` is used).
    pub dir: PathBuf,
    /// Read every record and verify its checksums (reads the whole store).
    /// Default: off (only the index logs are read).
    #[arg(long)]
    pub verify: bool,
}

#[derive(Default)]
struct Namespace {
    blocks: u64,
    snapshots: u64,
    /// Records of `kvtier gateway` (objects, buckets, parts): counted, not listed.
    gateway_records: u64,
    bytes: u64,
    oldest_ms: Option<u64>,
    newest_ms: Option<u64>,
    corrupt: u64,
}

fn when(ms: Option<u64>) -> String {
    let Some(ms) = ms else {
        return "-".into();
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let age = now.saturating_sub(ms) / 1000;
    match age {
        0..120 => format!("{age}s ago"),
        120..7200 => format!("{}m ago", age / 60),
        7200..172_800 => format!("{}h ago", age / 3600),
        _ => format!("{}d ago", age / 86_400),
    }
}

/// The store directory `dir` names: itself when it holds segments, else the `ssd/` of a
/// `kvtier serve` data directory when that does.
fn store_dir(dir: &Path) -> PathBuf {
    let has_segments = |d: &Path| {
        std::fs::read_dir(d).is_ok_and(|entries| {
            entries
                .flatten()
                .any(|e| e.file_name().to_string_lossy().ends_with(".seg"))
        })
    };
    let nested = dir.join("ssd");
    if !has_segments(dir) && has_segments(&nested) {
        nested
    } else {
        dir.to_path_buf()
    }
}

/// Runs the inspection; an error when `--verify` finds damaged records.
pub fn run(args: &InspectArgs) -> anyhow::Result<()> {
    if !args.dir.is_dir() {
        anyhow::bail!("`{}` is not a directory", args.dir.display());
    }
    let dir = store_dir(&args.dir);
    let (store, records, report) = SegmentStore::open_read_only(&dir)?;
    let mut spaces: BTreeMap<LayoutDigest, Namespace> = BTreeMap::new();
    let mut io_errors = 0u64;
    for r in &records {
        let ns = spaces.entry(r.header.layout).or_default();
        match r.header.kind {
            Kind::Block => ns.blocks += 1,
            Kind::Snapshot => ns.snapshots += 1,
            Kind::Object => ns.gateway_records += 1,
        }
        ns.bytes += r.header.payload_len;
        ns.oldest_ms = Some(
            ns.oldest_ms
                .map_or(r.header.created_ms, |o| o.min(r.header.created_ms)),
        );
        ns.newest_ms = Some(
            ns.newest_ms
                .map_or(r.header.created_ms, |o| o.max(r.header.created_ms)),
        );
        if args.verify && r.header.payload_len > 0 {
            match store.read(&r.loc, &r.header.key, None) {
                Ok(_) => {}
                Err(ReadFault::Corrupt(why)) => {
                    ns.corrupt += 1;
                    println!("corrupt: {why}");
                }
                Err(ReadFault::Io(e)) => {
                    io_errors += 1;
                    println!("read error: {e}");
                }
            }
        }
    }
    println!(
        "store {} (opened read-only: nothing is changed)",
        dir.display()
    );
    let shutdown = match report.previous_shutdown_clean {
        Some(true) => "clean",
        Some(false) => "partial (some queued writes were not done)",
        None => "no record (running now, or killed / crashed)",
    };
    println!("last shutdown: {shutdown}");
    println!(
        "found: {} segments, {} live records, {} tombstoned, {} superseded, {} found by reading the segment (not in the log), {:.1} ms",
        report.segments,
        report.records,
        report.tombstoned,
        report.superseded,
        report.salvaged_records,
        report.elapsed.as_secs_f64() * 1e3
    );
    println!(
        "damage: {} records failing their own checks ({} bytes), {} log entries pointing past the data, {} bad log bytes, {} unfinished bytes at segment tails, {} damaged segment headers, {} stray entries",
        report.damaged_records,
        report.damaged_bytes,
        report.dropped_missing,
        report.torn_index_bytes,
        report.torn_segment_bytes,
        report.damaged_segment_headers,
        report.stray_files
    );
    println!(
        "{:<34} {:>8} {:>9} {:>14} {:>12} {:>12} {:>8}",
        "namespace (layout digest)",
        "blocks",
        "snapshots",
        "bytes",
        "oldest",
        "newest",
        if args.verify { "corrupt" } else { "" }
    );
    let mut corrupt = 0;
    for (layout, ns) in &spaces {
        corrupt += ns.corrupt;
        println!(
            "{:<34} {:>8} {:>9} {:>14} {:>12} {:>12} {:>8}",
            layout.to_hex(),
            ns.blocks,
            ns.snapshots,
            ns.bytes,
            when(ns.oldest_ms),
            when(ns.newest_ms),
            if args.verify {
                ns.corrupt.to_string()
            } else {
                String::new()
            }
        );
    }
    let gateway: u64 = spaces.values().map(|ns| ns.gateway_records).sum();
    if gateway > 0 {
        println!("{gateway} records of kvtier gateway (objects, buckets, upload parts)");
    }
    if args.verify {
        println!(
            "verified {} records: {corrupt} corrupt, {io_errors} unreadable",
            records.len()
        );
        if corrupt + io_errors > 0 {
            anyhow::bail!(
                "{corrupt} corrupt and {io_errors} unreadable records in `{}`",
                args.dir.display()
            );
        }
    }
    Ok(())
}
