//! Reading one segment at open, without changing it: which records it holds, which
//! tombstones its log carries, and what (if anything) must be repaired.
//!
//! The `.seg` is the truth and the `.idx` log an accelerator. The scan walks the segment
//! from its first record to its end; at each record boundary it takes the log's copy of
//! the header when the log has one (no read of the segment: a million blocks recover from
//! the logs alone), and reads the record's own header from the segment when it does not —
//! a record written but never logged (a crash, or a log whose sync a power loss undid), or
//! one whose log entry is damaged. A record whose header fails its checks in both places is
//! skipped: the walk goes on at the next logged record. So one damaged byte costs at most
//! the one record it sits in, never the logged records after it.
//!
//! The walk never searches for a record by its magic bytes: it lands only where a genuine
//! header or log entry says a record starts. A payload (client data) may contain bytes that
//! decode as a record header; a search could adopt such a forgery from an unfinished
//! write, so past the last logged record an undecodable place ends the segment.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;

use super::{Loc, Recovered};
use crate::format::{
    ALIGN, IndexEntry, RECORD_HEADER_LEN, RecordHeader, SEGMENT_HEADER_LEN, SegmentHeader,
    align_up, salvage_index_entries,
};

/// What the scan of one segment found.
#[derive(Debug, Default)]
pub(super) struct SegmentScan {
    /// Its live-or-dead records, in offset order (tombstones not applied yet).
    pub records: Vec<Recovered>,
    /// For each record, its place in commit order within the segment: its position in the
    /// log, or, for a record the log lacks, after every logged one (in offset order).
    pub order: Vec<u64>,
    /// Tombstones its log carries: (record offset, key).
    pub tombstones: Vec<(u64, [u8; 32])>,
    /// The segment's own 4 KiB header was intact.
    pub header_ok: bool,
    /// The log is not an exact description of the records (damaged entries, records it
    /// lacks, entries past the data): it is rewritten from what the scan found.
    pub log_needs_rewrite: bool,
    /// Length of the log's leading intact run (a log with only a torn tail is cut here
    /// instead of rewritten).
    pub log_clean_prefix: u64,
    /// The log's length.
    pub log_len: u64,
    /// Bytes of the log that belonged to no intact entry.
    pub log_bad_bytes: u64,
    /// The segment's length.
    pub seg_len: u64,
    /// From here on the segment holds no record (a write a crash interrupted): cut.
    pub tail_from: Option<u64>,
    /// Records found by reading the segment because the log lacked them.
    pub salvaged: u64,
    /// Places where a record failed its own checks and was skipped.
    pub damaged: u64,
    /// Bytes skipped over that way.
    pub skipped_bytes: u64,
    /// Log entries whose record data lies past the end of the segment.
    pub dropped_missing: u64,
}

/// Commit-order base of records the log lacks: after every logged record.
const UNLOGGED: u64 = 1 << 62;

/// Scans segment `id` (`seg`, with the bytes of its log, empty if it has none).
pub(super) fn scan_segment(id: u64, seg: &File, log: &[u8]) -> std::io::Result<SegmentScan> {
    let seg_len = seg.metadata()?.len();
    let mut scan = SegmentScan {
        seg_len,
        log_len: log.len() as u64,
        ..SegmentScan::default()
    };
    let mut head = vec![0u8; SEGMENT_HEADER_LEN as usize];
    scan.header_ok = seg.read_exact_at(&mut head, 0).is_ok()
        && SegmentHeader::decode(&head).is_some_and(|h| h.id == id);

    let (entries, damage) = salvage_index_entries(log);
    scan.log_clean_prefix = damage.clean_prefix as u64;
    scan.log_bad_bytes = damage.bad_bytes as u64;
    // Damage followed by intact entries cannot be cut off without losing them.
    scan.log_needs_rewrite = damage.resynced_entries > 0;
    let mut logged: BTreeMap<u64, (RecordHeader, u64)> = BTreeMap::new();
    for (n, entry) in entries.into_iter().enumerate() {
        match entry {
            IndexEntry::Record { offset, header } => {
                if offset >= SEGMENT_HEADER_LEN && offset % ALIGN == 0 {
                    logged.insert(offset, (header, n as u64));
                }
            }
            IndexEntry::Tombstone { offset, key } => scan.tombstones.push((offset, key)),
        }
    }

    let mut offset = SEGMENT_HEADER_LEN;
    while offset + RECORD_HEADER_LEN <= seg_len {
        if let Some((header, n)) = logged.remove(&offset) {
            let loc = Loc::new(id, offset, &header);
            if loc.data_end() > seg_len {
                // The segment was cut short behind the log's back.
                scan.dropped_missing += 1;
                scan.tail_from = Some(offset);
                break;
            }
            offset += loc.record_len;
            scan.records.push(Recovered { loc, header });
            scan.order.push(n);
            continue;
        }
        scan.log_needs_rewrite = true;
        match read_header(seg, offset) {
            Some(header) => {
                let loc = Loc::new(id, offset, &header);
                if loc.data_end() > seg_len {
                    // Written in part when the process stopped: never acknowledged.
                    scan.tail_from = Some(offset);
                    break;
                }
                scan.salvaged += 1;
                scan.order.push(UNLOGGED + offset);
                offset += loc.record_len;
                scan.records.push(Recovered { loc, header });
            }
            None => {
                let next = logged.range(offset + 1..).next().map(|(o, _)| *o);
                let Some(next) = next else {
                    scan.tail_from = Some(offset);
                    break;
                };
                scan.damaged += 1;
                scan.skipped_bytes += next - offset;
                offset = next;
            }
        }
    }
    if scan.tail_from.is_none() && offset < seg_len {
        // Fewer bytes than a record header: a torn write.
        scan.tail_from = Some(offset);
    }
    // Log entries the walk never reached describe data that is not there.
    scan.dropped_missing += logged.len() as u64;
    if scan.dropped_missing > 0 {
        scan.log_needs_rewrite = true;
    }
    if let Some(t) = scan.tail_from {
        scan.tail_from = Some(align_up(t).max(SEGMENT_HEADER_LEN));
    }
    Ok(scan)
}

/// The record header at `offset` of `seg`, if one decodes there with a good checksum.
pub(super) fn read_header(seg: &File, offset: u64) -> Option<RecordHeader> {
    let mut fixed = [0u8; RECORD_HEADER_LEN as usize];
    seg.read_exact_at(&mut fixed, offset).ok()?;
    if &fixed[..4] != b"KVTR" {
        return None;
    }
    let tokens = u64::from(u32::from_le_bytes([
        fixed[76], fixed[77], fixed[78], fixed[79],
    ]));
    let mut pl = [0u8; 8];
    pl.copy_from_slice(&fixed[96..104]);
    let payload_len = u64::from_le_bytes(pl);
    let chunk_log2 = fixed[112];
    if !(9..=30).contains(&chunk_log2) || tokens > 1 << 16 || payload_len > 1 << 31 {
        return None;
    }
    let meta_len =
        RECORD_HEADER_LEN + 4 * (tokens + RecordHeader::chunks_for(payload_len, chunk_log2));
    let mut meta = vec![0u8; meta_len as usize];
    seg.read_exact_at(&mut meta, offset).ok()?;
    RecordHeader::decode(&meta).ok()
}
