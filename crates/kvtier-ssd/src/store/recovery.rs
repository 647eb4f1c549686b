//! Recovery at open: find every record in every segment (see `scan.rs`), decide which copy
//! of each key is current, then — unless opened read-only — repair what the scan found.
//!
//! Rules, in the order they matter:
//! - **Nothing valid is destroyed.** Bytes are cut off only where no record decodes (a torn
//!   tail); a segment is removed only when it holds no live record; a damaged log entry or
//!   segment header never takes intact records with it.
//! - **The newest copy of a key decides** (newest = highest segment id, then offset). If it
//!   is tombstoned the key is deleted, whatever older copies exist; otherwise it is the live
//!   one. A delete writes its tombstone for the copy it removes, which is always the newest,
//!   so a deleted or overwritten key never comes back from an older copy.
//! - **Older copies get their own tombstones** before any segment is removed (they are
//!   appended to their own segment's log). A segment's tombstones are removed with it, so
//!   this is what keeps an older copy dead after the newer one's segment is gone. If those
//!   appends fail (a full disk), no segment is removed this time.
//! - **Repairs never stop the open.** A log that cannot be rewritten or a tail that cannot
//!   be cut is logged and left; the next open finds the same and tries again.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::hash::BuildHasherDefault;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvtier_core::stats::Counter;
use kvtier_core::stats::CounterKind::{Counter as C, Gauge as G};
use kvtier_core::{PassThroughHasher, Result};
use parking_lot::Mutex;

use super::scan::{SegmentScan, scan_segment};
use super::{Loc, Segment, idx_path, io_error, seg_path, sync_dir};
use crate::format::{IndexEntry, RecordHeader, encode_index_entry};

/// A live record found at open.
#[derive(Debug, Clone)]
pub struct Recovered {
    /// Where it lives.
    pub loc: Loc,
    /// Its header (tokens included).
    pub header: RecordHeader,
}

/// What recovery found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Segments kept.
    pub segments: u64,
    /// Live records recovered.
    pub records: u64,
    /// Index entries whose record data is missing or cut short (dropped).
    pub dropped_missing: u64,
    /// Records marked dead by a tombstone (their own, or the newest copy's).
    pub tombstoned: u64,
    /// Older copies of a key stored again later (the newest wins).
    pub superseded: u64,
    /// Bytes of index logs that belonged to no intact entry (damage or torn tails).
    pub torn_index_bytes: u64,
    /// Bytes of unfinished writes cut off segment tails (writes a crash interrupted).
    pub torn_segment_bytes: u64,
    /// Segments whose index log was rewritten from what the scan found.
    pub rescanned_segments: u64,
    /// Records the log lacked, found by reading their own headers in the segment.
    pub salvaged_records: u64,
    /// Records that failed their own checks (header damaged in segment and log): skipped.
    pub damaged_records: u64,
    /// Bytes skipped over with those records.
    pub damaged_bytes: u64,
    /// Segments whose 4 KiB file header is damaged (their records are still read).
    pub damaged_segment_headers: u64,
    /// Tombstones written at open for older copies of keys that had none.
    pub tombstones_written: u64,
    /// Files removed: orphan index logs, segments without a live record, leftover
    /// temporary files.
    pub removed_files: u64,
    /// Entries named like store files that are not regular files (directories, symlinks),
    /// or segments that could not be opened: left alone.
    pub stray_files: u64,
    /// Repairs that failed (a full or read-only disk): retried at the next open.
    pub repairs_failed: u64,
    /// Wall time recovery took.
    pub elapsed: Duration,
    /// How the previous run ended: `Some(true)` clean shutdown, `Some(false)` partial
    /// flush, `None` no record (crash, kill, or first start).
    pub previous_shutdown_clean: Option<bool>,
}

const SHUTDOWN: &str = "How the previous run ended (1 for the state it ended in)";

impl RecoveryReport {
    /// What recovery found, declared once: flat name `ssd_recovery_{name}` in `/v1/stats`,
    /// family `ssd_recovery_{name}` in `/metrics`. What the store held after recovery
    /// (segments, live records) and how long it took are levels; what it came across and
    /// did (damage, repairs, removed files) are counts. A reattach replaces the report,
    /// which a scraper takes for a counter reset, so `increase()` over a window adds up
    /// what every recovery in it found.
    #[rustfmt::skip]
    pub const COUNTERS: &'static [Counter<RecoveryReport>] = &[
        Counter { name: "segments", family: "ssd_recovery_segments", label: None, help: "Segments the last SSD recovery kept", kind: G, read: |r| r.segments },
        Counter { name: "records", family: "ssd_recovery_records", label: None, help: "Live records the last SSD recovery found", kind: G, read: |r| r.records },
        Counter { name: "dropped_missing", family: "ssd_recovery_dropped_missing", label: None, help: "Index entries dropped at open because their record data was missing or cut short", kind: C, read: |r| r.dropped_missing },
        Counter { name: "tombstoned", family: "ssd_recovery_tombstoned", label: None, help: "Records found dead by a tombstone at open", kind: C, read: |r| r.tombstoned },
        Counter { name: "superseded", family: "ssd_recovery_superseded", label: None, help: "Older copies of a key found stored again later at open", kind: C, read: |r| r.superseded },
        Counter { name: "torn_index_bytes", family: "ssd_recovery_torn_index_bytes", label: None, help: "Index log bytes found belonging to no intact entry at open", kind: C, read: |r| r.torn_index_bytes },
        Counter { name: "torn_segment_bytes", family: "ssd_recovery_torn_segment_bytes", label: None, help: "Bytes of unfinished writes cut off segment tails at open", kind: C, read: |r| r.torn_segment_bytes },
        Counter { name: "rescanned_segments", family: "ssd_recovery_rescanned_segments", label: None, help: "Segments whose index log was rewritten from a scan at open", kind: C, read: |r| r.rescanned_segments },
        Counter { name: "salvaged_records", family: "ssd_recovery_salvaged_records", label: None, help: "Records the index log lacked, found by their own headers at open", kind: C, read: |r| r.salvaged_records },
        Counter { name: "damaged_records", family: "ssd_recovery_damaged_records", label: None, help: "Records skipped at open because they failed their own checks", kind: C, read: |r| r.damaged_records },
        Counter { name: "damaged_segment_headers", family: "ssd_recovery_damaged_segment_headers", label: None, help: "Segments found with a damaged file header at open", kind: C, read: |r| r.damaged_segment_headers },
        Counter { name: "tombstones_written", family: "ssd_recovery_tombstones_written", label: None, help: "Tombstones written at open for older copies of keys", kind: C, read: |r| r.tombstones_written },
        Counter { name: "stray_files", family: "ssd_recovery_stray_files", label: None, help: "Entries named like store files left alone at open (not regular files, or unreadable)", kind: C, read: |r| r.stray_files },
        Counter { name: "repairs_failed", family: "ssd_recovery_repairs_failed", label: None, help: "Repairs that failed at open (retried at the next open)", kind: C, read: |r| r.repairs_failed },
        Counter { name: "removed_files", family: "ssd_recovery_removed_files", label: None, help: "Files removed at open (orphan logs, segments without a live record, temporary files)", kind: C, read: |r| r.removed_files },
        Counter { name: "milliseconds", family: "ssd_recovery_milliseconds", label: None, help: "How long the last SSD recovery took", kind: G, read: |r| u64::try_from(r.elapsed.as_millis()).unwrap_or(u64::MAX) },
    ];

    /// How the previous run ended, as flat names `ssd_previous_shutdown_{state}` (1 for
    /// the state it ended in), family `ssd_previous_shutdown` labelled by `state`.
    #[rustfmt::skip]
    pub const PREVIOUS_SHUTDOWN: &'static [Counter<RecoveryReport>] = &[
        Counter { name: "clean", family: "ssd_previous_shutdown", label: Some(("state", "clean")), help: SHUTDOWN, kind: G, read: |r| u64::from(r.previous_shutdown_clean == Some(true)) },
        Counter { name: "partial", family: "ssd_previous_shutdown", label: Some(("state", "partial")), help: SHUTDOWN, kind: G, read: |r| u64::from(r.previous_shutdown_clean == Some(false)) },
        Counter { name: "unknown", family: "ssd_previous_shutdown", label: Some(("state", "unknown")), help: SHUTDOWN, kind: G, read: |r| u64::from(r.previous_shutdown_clean.is_none()) },
    ];

    /// What recovery found, as registry samples (`kvtier_core::registry`): both tables.
    pub fn samples(&self) -> kvtier_core::registry::Samples {
        let mut out = kvtier_core::registry::Samples::default();
        out.table(Self::COUNTERS, "ssd_recovery", self, &[]);
        out.table(Self::PREVIOUS_SHUTDOWN, "ssd_previous_shutdown", self, &[]);
        out
    }
}

/// Kept segments, live records, the report, and the highest segment id ever seen (new
/// segments take higher ids, so a removed segment's name is never reused).
pub(super) type Recovery = (
    BTreeMap<u64, Arc<Segment>>,
    Vec<Recovered>,
    RecoveryReport,
    u64,
);

/// Whether recovery may change the directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// Cut torn tails, rewrite logs, write tombstones, remove dead segments.
    Repair,
    /// Open every file read-only and change nothing (`kvtier inspect`).
    ReadOnly,
}

struct Found {
    id: u64,
    seg: File,
    scan: SegmentScan,
}

pub(super) fn recover(dir: &Path, mode: Mode) -> Result<Recovery> {
    let started = Instant::now();
    let mut report = RecoveryReport::default();
    let (seg_ids, idx_ids, max_seen) = list(dir, mode, &mut report)?;
    let repair = mode == Mode::Repair;
    if repair {
        for id in idx_ids.iter().filter(|id| !seg_ids.contains(id)) {
            remove(&idx_path(dir, *id), &mut report);
        }
    }

    // A bar on a terminal for stores of many segments; hidden otherwise (logs, tests).
    let bar = if seg_ids.len() >= 32 {
        indicatif::ProgressBar::new(seg_ids.len() as u64)
    } else {
        indicatif::ProgressBar::hidden()
    };
    bar.set_message(format!("recovering {}", dir.display()));
    let mut found: Vec<Found> = Vec::with_capacity(seg_ids.len());
    // A segment we could not read may hold what makes an older copy dead: remove nothing.
    let mut unreadable = false;
    for id in seg_ids {
        bar.inc(1);
        let path = seg_path(dir, id);
        let seg = match OpenOptions::new().read(true).write(repair).open(&path) {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(segment = %path.display(), error = %e, "cannot open a segment; leaving it alone");
                report.stray_files += 1;
                unreadable = true;
                continue;
            }
        };
        let log = if idx_ids.contains(&id) {
            std::fs::read(idx_path(dir, id)).unwrap_or_default()
        } else {
            Vec::new()
        };
        let scan = scan_segment(id, &seg, &log).map_err(|e| io_error(&path, "scan", e))?;
        found.push(Found { id, seg, scan });
    }
    bar.finish_and_clear();

    let mut resolved = resolve(&found, &mut report);
    let mut segments = BTreeMap::new();
    let mut removable = Vec::new();
    let mut live = Vec::with_capacity(resolved.live_per_segment.iter().sum::<u64>() as usize);
    for (i, mut f) in found.into_iter().enumerate() {
        let s = &f.scan;
        report.salvaged_records += s.salvaged;
        report.damaged_records += s.damaged;
        report.damaged_bytes += s.skipped_bytes;
        report.dropped_missing += s.dropped_missing;
        report.torn_index_bytes += s.log_bad_bytes;
        report.damaged_segment_headers += u64::from(!s.header_ok);
        if let Some(t) = s.tail_from.filter(|t| *t < s.seg_len) {
            report.torn_segment_bytes += s.seg_len - t;
        }
        if resolved.live_per_segment[i] == 0 {
            removable.push(f);
            continue;
        }
        let idx = if repair {
            repair_segment(dir, &f, &resolved.own_tombstones_to_write[i], &mut report)
        } else {
            None
        };
        let flags = std::mem::take(&mut resolved.live[i]);
        let records = std::mem::take(&mut f.scan.records);
        live.extend(
            records
                .into_iter()
                .zip(flags)
                .filter_map(|(r, keep)| keep.then_some(r)),
        );
        segments.insert(
            f.id,
            Arc::new(Segment {
                id: f.id,
                seg: f.seg,
                // Recovered segments are never appended to.
                direct: None,
                idx: Mutex::new(idx),
            }),
        );
    }
    if repair {
        if unreadable || report.repairs_failed > 0 {
            if !removable.is_empty() {
                tracing::warn!(
                    segments = removable.len(),
                    "keeping segments without live records until their older copies are marked dead"
                );
            }
        } else {
            for f in removable {
                drop(f.seg);
                remove(&seg_path(dir, f.id), &mut report);
                remove(&idx_path(dir, f.id), &mut report);
            }
        }
        if report.removed_files > 0 || report.rescanned_segments > 0 {
            let _ = sync_dir(dir);
        }
    }
    report.segments = segments.len() as u64;
    report.records = live.len() as u64;
    report.elapsed = started.elapsed();
    Ok((segments, live, report, max_seen))
}

/// Segment and log ids in the directory (sorted), and the highest id named by any file.
fn list(dir: &Path, mode: Mode, report: &mut RecoveryReport) -> Result<(Vec<u64>, Vec<u64>, u64)> {
    let mut seg_ids = Vec::new();
    let mut idx_ids = Vec::new();
    let mut max_seen = 0;
    let entries = std::fs::read_dir(dir).map_err(|e| io_error(dir, "list", e))?;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let parse = |stem: &str| u64::from_str_radix(stem, 16).ok();
        let seg = name.strip_suffix(".seg").and_then(parse);
        let idx = name.strip_suffix(".idx").and_then(parse);
        let regular = entry.file_type().is_ok_and(|t| t.is_file());
        if let Some(id) = seg.or(idx) {
            // Never reuse a name, even one a stray entry holds.
            max_seen = max_seen.max(id);
            if !regular {
                tracing::warn!(entry = %entry.path().display(), "not a regular file; ignoring it");
                report.stray_files += 1;
                continue;
            }
        }
        match (seg, idx) {
            (Some(id), _) => seg_ids.push(id),
            (_, Some(id)) => idx_ids.push(id),
            _ if regular && name.ends_with(".tmp") && mode == Mode::Repair => {
                remove(&entry.path(), report)
            }
            _ => {}
        }
    }
    seg_ids.sort_unstable();
    Ok((seg_ids, idx_ids, max_seen))
}

struct Resolved {
    /// Per segment, per record: whether it is its key's live copy.
    live: Vec<Vec<bool>>,
    live_per_segment: Vec<u64>,
    /// Per segment: dead records with no tombstone of their own (offset, key).
    own_tombstones_to_write: Vec<Vec<(u64, [u8; 32])>>,
}

/// Applies the newest-copy-decides rule across segments (`found` is in id order).
fn resolve(found: &[Found], report: &mut RecoveryReport) -> Resolved {
    type Map<V> = HashMap<[u8; 32], V, BuildHasherDefault<PassThroughHasher>>;
    let dead: Vec<HashSet<(u64, [u8; 32])>> = found
        .iter()
        .map(|f| f.scan.tombstones.iter().copied().collect())
        .collect();
    let is_dead = |s: usize, r: &Recovered| dead[s].contains(&(r.loc.offset, r.header.key));
    // key -> (segment index, record index) of its newest copy.
    let mut newest: Map<(usize, usize)> = Map::default();
    for (s, f) in found.iter().enumerate() {
        for (r, rec) in f.scan.records.iter().enumerate() {
            let slot = newest.entry(rec.header.key).or_insert((s, r));
            let (ps, pr) = *slot;
            if ps < s || f.scan.order[r] > found[ps].scan.order[pr] {
                *slot = (s, r);
            }
        }
    }
    let mut live: Vec<Vec<bool>> = found
        .iter()
        .map(|f| vec![false; f.scan.records.len()])
        .collect();
    let mut live_per_segment = vec![0u64; found.len()];
    let mut to_write = vec![Vec::new(); found.len()];
    for (s, f) in found.iter().enumerate() {
        for (r, rec) in f.scan.records.iter().enumerate() {
            let (ns, nr) = newest[&rec.header.key];
            let newest_rec = &found[ns].scan.records[nr];
            let key_deleted = is_dead(ns, newest_rec);
            if (ns, nr) == (s, r) && !key_deleted {
                live[s][r] = true;
                live_per_segment[s] += 1;
                continue;
            }
            if key_deleted {
                report.tombstoned += 1;
            } else {
                report.superseded += 1;
            }
            if !is_dead(s, rec) {
                to_write[s].push((rec.loc.offset, rec.header.key));
            }
        }
    }
    Resolved {
        live,
        live_per_segment,
        own_tombstones_to_write: to_write,
    }
}

/// Repairs one kept segment: its log (rewritten, or its torn tail cut), its torn data
/// tail, the tombstones its dead copies lack. Returns its log opened for appends, or
/// `None` if the log cannot be opened (the segment is then read-only for this run).
fn repair_segment(
    dir: &Path,
    f: &Found,
    tombstones: &[(u64, [u8; 32])],
    report: &mut RecoveryReport,
) -> Option<File> {
    let s = &f.scan;
    let ipath = idx_path(dir, f.id);
    let mut failed = |what: &str, e: std::io::Error| {
        tracing::warn!(segment = f.id, error = %e, "recovery could not {what}; retrying at the next open");
        report.repairs_failed += 1;
    };
    if s.log_needs_rewrite {
        let mut log = Vec::new();
        for r in &s.records {
            log.extend_from_slice(&encode_index_entry(&IndexEntry::Record {
                offset: r.loc.offset,
                header: r.header.clone(),
            }));
        }
        log.extend(encode_tombstones(s.tombstones.iter().chain(tombstones)));
        match replace_file(&ipath, &log) {
            Ok(()) => {
                report.rescanned_segments += 1;
                report.tombstones_written += tombstones.len() as u64;
            }
            Err(e) => failed("rewrite an index log", e),
        }
    } else if s.log_clean_prefix < s.log_len
        && let Err(e) = OpenOptions::new()
            .write(true)
            .open(&ipath)
            .and_then(|f| f.set_len(s.log_clean_prefix))
    {
        failed("cut a torn index-log tail", e);
    }
    if let Some(t) = s.tail_from.filter(|t| *t < s.seg_len)
        && let Err(e) = f.seg.set_len(t)
    {
        failed("cut a torn segment tail", e);
    }
    let idx = match OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&ipath)
    {
        Ok(idx) => idx,
        Err(e) => {
            failed("open an index log", e);
            return None;
        }
    };
    if !s.log_needs_rewrite && !tombstones.is_empty() {
        let bytes = encode_tombstones(tombstones.iter());
        let appended = idx
            .metadata()
            .and_then(|m| idx.write_all_at(&bytes, m.len()))
            .and_then(|()| idx.sync_data());
        match appended {
            Ok(()) => report.tombstones_written += tombstones.len() as u64,
            Err(e) => failed("write tombstones for older copies", e),
        }
    }
    Some(idx)
}

/// Log entries marking the records at these (offset, key) pairs dead.
fn encode_tombstones<'a>(dead: impl Iterator<Item = &'a (u64, [u8; 32])>) -> Vec<u8> {
    dead.flat_map(|&(offset, key)| encode_index_entry(&IndexEntry::Tombstone { offset, key }))
        .collect()
}

/// Writes `bytes` to a temporary file, syncs it and renames it over `path`.
fn replace_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("idx.tmp");
    let written = File::create(&tmp).and_then(|f| {
        f.write_all_at(bytes, 0)?;
        f.sync_data()
    });
    match written.and_then(|()| std::fs::rename(&tmp, path)) {
        Ok(()) => Ok(()),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

fn remove(path: &Path, report: &mut RecoveryReport) {
    match std::fs::remove_file(path) {
        Ok(()) => report.removed_files += 1,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            tracing::warn!(file = %path.display(), error = %e, "could not remove a leftover file")
        }
    }
}
