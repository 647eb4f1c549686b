//! Recovery at open: rebuild the list of live records from the segments' index logs
//! without reading payloads; cut torn tails; drop what is missing; remove orphans.

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::hash::BuildHasherDefault;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvtier_core::{PassThroughHasher, Result};
use parking_lot::Mutex;

use super::{Loc, Segment, idx_path, io_error, seg_path};
use crate::format::{
    IndexEntry, RECORD_HEADER_LEN, RecordHeader, SEGMENT_HEADER_LEN, SegmentHeader, align_up,
    decode_index_entries, encode_index_entry,
};

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
    /// Records marked dead by a tombstone.
    pub tombstoned: u64,
    /// Older copies of a key stored again later (the newest wins).
    pub superseded: u64,
    /// Bytes of torn or corrupt index-log tails cut off.
    pub torn_index_bytes: u64,
    /// Bytes of unindexed data cut off segment tails (writes a crash interrupted).
    pub torn_segment_bytes: u64,
    /// Segments whose index log was missing or empty and was rebuilt by scanning.
    pub rescanned_segments: u64,
    /// Files removed: orphan index logs, segments with a bad header, empty segments,
    /// leftover temporary files.
    pub removed_files: u64,
    /// Wall time recovery took.
    pub elapsed: Duration,
    /// How the previous run ended: `Some(true)` clean shutdown, `Some(false)` partial
    /// flush, `None` no record (crash, kill, or first start).
    pub previous_shutdown_clean: Option<bool>,
}

/// Kept segments, live records, the report, and the highest segment id ever seen (new
/// segments take higher ids, so a removed segment's name is never reused).
type Recovery = (
    BTreeMap<u64, Arc<Segment>>,
    Vec<Recovered>,
    RecoveryReport,
    u64,
);

pub(super) fn recover(dir: &Path) -> Result<Recovery> {
    let started = Instant::now();
    let mut report = RecoveryReport::default();
    let mut seg_ids = Vec::new();
    let mut idx_ids = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(|e| io_error(dir, "list", &e))?;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let parse = |stem: &str| u64::from_str_radix(stem, 16).ok();
        if let Some(id) = name.strip_suffix(".seg").and_then(parse) {
            seg_ids.push(id);
        } else if let Some(id) = name.strip_suffix(".idx").and_then(parse) {
            idx_ids.push(id);
        } else if name.ends_with(".tmp") {
            remove(&entry.path(), &mut report);
        }
    }
    seg_ids.sort_unstable();
    let max_seen = seg_ids.iter().chain(&idx_ids).copied().max().unwrap_or(0);
    for id in idx_ids.iter().filter(|id| !seg_ids.contains(id)) {
        remove(&idx_path(dir, *id), &mut report);
    }

    let mut segments = BTreeMap::new();
    // key -> (segment, position in `live`), so a later copy supersedes an earlier one.
    let mut by_key: HashMap<[u8; 32], usize, BuildHasherDefault<PassThroughHasher>> =
        HashMap::default();
    let mut live: Vec<Option<Recovered>> = Vec::new();
    // A bar on a terminal for stores of many segments; hidden otherwise (logs, tests).
    let bar = if seg_ids.len() >= 32 {
        indicatif::ProgressBar::new(seg_ids.len() as u64)
    } else {
        indicatif::ProgressBar::hidden()
    };
    bar.set_message(format!("recovering {}", dir.display()));
    for id in seg_ids {
        bar.inc(1);
        let Some((segment, records)) = recover_segment(dir, id, &mut report)? else {
            continue;
        };
        if records.is_empty() {
            // Nothing live: reclaim the space now.
            drop(segment);
            remove(&seg_path(dir, id), &mut report);
            remove(&idx_path(dir, id), &mut report);
            continue;
        }
        for r in records {
            if let Some(old) = by_key.insert(r.header.key, live.len()) {
                live[old] = None;
                report.superseded += 1;
            }
            live.push(Some(r));
        }
        segments.insert(id, Arc::new(segment));
    }
    bar.finish_and_clear();
    let live: Vec<Recovered> = live.into_iter().flatten().collect();
    report.segments = segments.len() as u64;
    report.records = live.len() as u64;
    report.elapsed = started.elapsed();
    Ok((segments, live, report, max_seen))
}

fn remove(path: &Path, report: &mut RecoveryReport) {
    match std::fs::remove_file(path) {
        Ok(()) => report.removed_files += 1,
        Err(e) => {
            tracing::warn!(file = %path.display(), error = %e, "could not remove a leftover file")
        }
    }
}

/// Recovers one segment: `None` if its header is bad (both files are removed).
fn recover_segment(
    dir: &Path,
    id: u64,
    report: &mut RecoveryReport,
) -> Result<Option<(Segment, Vec<Recovered>)>> {
    let spath = seg_path(dir, id);
    let seg = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&spath)
        .map_err(|e| io_error(&spath, "open segment", &e))?;
    let seg_len = seg
        .metadata()
        .map_err(|e| io_error(&spath, "stat", &e))?
        .len();
    let mut head = vec![0u8; SEGMENT_HEADER_LEN as usize];
    let header_ok = seg.read_exact_at(&mut head, 0).is_ok()
        && SegmentHeader::decode(&head).is_some_and(|h| h.id == id);
    if !header_ok {
        tracing::warn!(segment = %spath.display(), "segment header is missing or corrupt; removing the segment");
        drop(seg);
        remove(&spath, report);
        remove(&idx_path(dir, id), report);
        return Ok(None);
    }

    let ipath = idx_path(dir, id);
    let idx = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&ipath)
        .map_err(|e| io_error(&ipath, "open index log", &e))?;
    let bytes = std::fs::read(&ipath).map_err(|e| io_error(&ipath, "read", &e))?;
    let (mut entries, valid) = decode_index_entries(&bytes);
    if valid < bytes.len() {
        report.torn_index_bytes += (bytes.len() - valid) as u64;
        idx.set_len(valid as u64)
            .map_err(|e| io_error(&ipath, "truncate", &e))?;
    }
    if entries.is_empty() && seg_len > SEGMENT_HEADER_LEN {
        entries = rescan(&seg, seg_len);
        report.rescanned_segments += 1;
        let mut log = Vec::new();
        for e in &entries {
            log.extend_from_slice(&encode_index_entry(e));
        }
        idx.set_len(0)
            .and_then(|()| idx.write_all_at(&log, 0))
            .map_err(|e| io_error(&ipath, "rebuild", &e))?;
    }

    // Records are logged in offset order; tombstones (rare) name a record by offset.
    let mut records: Vec<Recovered> = Vec::with_capacity(entries.len());
    let mut dead: HashMap<u64, [u8; 32]> = HashMap::new();
    for entry in entries {
        match entry {
            IndexEntry::Record { offset, header } => {
                let loc = Loc::new(id, offset, &header);
                if offset < SEGMENT_HEADER_LEN || loc.data_end() > seg_len {
                    report.dropped_missing += 1;
                    continue;
                }
                records.push(Recovered { loc, header });
            }
            IndexEntry::Tombstone { offset, key } => {
                dead.insert(offset, key);
            }
        }
    }
    if !dead.is_empty() {
        records.retain(|r| {
            let is_dead = dead.get(&r.loc.offset).is_some_and(|k| *k == r.header.key);
            if is_dead {
                report.tombstoned += 1;
            }
            !is_dead
        });
    }
    // A record written twice at one offset cannot happen (offsets only grow); sort in
    // case a rebuilt log listed them out of order.
    records.sort_by_key(|r| r.loc.offset);
    // Data past the last indexed record was never acknowledged: cut it off.
    let end = records
        .iter()
        .map(|r| align_up(r.loc.data_end()))
        .max()
        .unwrap_or(SEGMENT_HEADER_LEN);
    if seg_len > end {
        report.torn_segment_bytes += seg_len - end;
        seg.set_len(end)
            .map_err(|e| io_error(&spath, "truncate", &e))?;
    }
    let segment = Segment {
        id,
        seg,
        idx: Mutex::new(idx),
    };
    Ok(Some((segment, records)))
}

/// Rebuilds a segment's index entries by reading every record header in order, stopping
/// at the first that does not decode or whose data is cut short.
fn rescan(seg: &File, seg_len: u64) -> Vec<IndexEntry> {
    let mut out = Vec::new();
    let mut offset = SEGMENT_HEADER_LEN;
    while offset + RECORD_HEADER_LEN <= seg_len {
        let mut fixed = [0u8; RECORD_HEADER_LEN as usize];
        if seg.read_exact_at(&mut fixed, offset).is_err() {
            break;
        }
        let tokens = u64::from(u32::from_le_bytes([
            fixed[76], fixed[77], fixed[78], fixed[79],
        ]));
        let mut pl = [0u8; 8];
        pl.copy_from_slice(&fixed[96..104]);
        let payload_len = u64::from_le_bytes(pl);
        let chunk_log2 = fixed[112];
        if !(9..=30).contains(&chunk_log2) || tokens > 1 << 16 || payload_len > 1 << 31 {
            break;
        }
        let meta_len =
            RECORD_HEADER_LEN + 4 * (tokens + RecordHeader::chunks_for(payload_len, chunk_log2));
        let mut meta = vec![0u8; meta_len as usize];
        if seg.read_exact_at(&mut meta, offset).is_err() {
            break;
        }
        let Ok(header) = RecordHeader::decode(&meta) else {
            break;
        };
        let loc = Loc::new(0, offset, &header);
        if loc.data_end() > seg_len {
            break;
        }
        offset += loc.record_len;
        out.push(IndexEntry::Record {
            offset: loc.offset,
            header,
        });
    }
    out
}
