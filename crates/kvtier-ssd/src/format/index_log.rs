//! The `.idx` log of a segment: what recovery reads instead of the payloads.
//!
//! ```text
//! entry = u32 length of the rest | u8 type | body | u32 CRC-32C of type and body
//! type 1 (record):    u64 record offset in the .seg, then the record's header, tokens
//!                     and chunk table exactly as in the .seg
//! type 2 (tombstone): u64 record offset, 32-byte key: the record is dead
//! ```
//!
//! Entries are appended after the record they describe is written. The log is an
//! accelerator, not the truth: every record describes itself in the `.seg`, so recovery
//! reads the log with [`salvage_index_entries`], which skips damaged bytes and keeps every
//! intact entry after them, and fills what the log lacks by reading record headers.

use super::crc;
use super::record::{DecodeError, RecordHeader};

/// One decoded `.idx` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IndexEntry {
    /// A record at `offset` in the segment.
    Record {
        /// Offset of the record in the `.seg` file.
        offset: u64,
        /// Its header.
        header: RecordHeader,
    },
    /// The record at `offset` with `key` is dead.
    Tombstone {
        /// Offset of the dead record.
        offset: u64,
        /// Its key.
        key: [u8; 32],
    },
}

/// Encodes one entry.
pub fn encode_index_entry(entry: &IndexEntry) -> Vec<u8> {
    let mut body = Vec::new();
    match entry {
        IndexEntry::Record { offset, header } => {
            body.push(1);
            body.extend_from_slice(&offset.to_le_bytes());
            body.extend_from_slice(&header.encode());
        }
        IndexEntry::Tombstone { offset, key } => {
            body.push(2);
            body.extend_from_slice(&offset.to_le_bytes());
            body.extend_from_slice(key);
        }
    }
    let mut out = Vec::with_capacity(body.len() + 8);
    out.extend_from_slice(&(body.len() as u32 + 4).to_le_bytes());
    let c = crc(&body);
    out.extend_from_slice(&body);
    out.extend_from_slice(&c.to_le_bytes());
    out
}

/// Decodes entries from the start of `bytes`. Returns the entries and the length of the
/// valid prefix: everything after it is a torn or corrupt tail to be cut off.
pub fn decode_index_entries(bytes: &[u8]) -> (Vec<IndexEntry>, usize) {
    let mut entries = Vec::new();
    let mut at = 0usize;
    while let Some(len_bytes) = bytes.get(at..at + 4) {
        let len =
            u32::from_le_bytes([len_bytes[0], len_bytes[1], len_bytes[2], len_bytes[3]]) as usize;
        let Some(rest) = bytes.get(at + 4..at + 4 + len) else {
            break;
        };
        if len < 5 {
            break;
        }
        let (body, crc_bytes) = rest.split_at(len - 4);
        let stored = u32::from_le_bytes([crc_bytes[0], crc_bytes[1], crc_bytes[2], crc_bytes[3]]);
        if crc(body) != stored {
            break;
        }
        let Some(entry) = decode_body(body) else {
            break;
        };
        entries.push(entry);
        at += 4 + len;
    }
    (entries, at)
}

/// The largest entry a resynchronising reader accepts: a record entry with 65,536 tokens
/// and the chunk table of a 2 GiB payload in 512-byte chunks stays far below it.
const MAX_SALVAGED_ENTRY: usize = 64 << 20;

/// What [`salvage_index_entries`] found besides the entries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogDamage {
    /// Length of the leading run of intact entries (everything up to the first bad byte).
    pub clean_prefix: usize,
    /// Bytes that belong to no intact entry (damage, or a torn tail).
    pub bad_bytes: usize,
    /// Intact entries found after damaged bytes.
    pub resynced_entries: usize,
}

/// Decodes every intact entry of `bytes`: where an entry is damaged, it looks for the next
/// position at which an entry decodes with a good checksum and goes on from there, so one
/// flipped byte costs one entry, not the rest of the log.
pub fn salvage_index_entries(bytes: &[u8]) -> (Vec<IndexEntry>, LogDamage) {
    let (mut entries, clean) = decode_index_entries(bytes);
    let mut damage = LogDamage {
        clean_prefix: clean,
        ..LogDamage::default()
    };
    let mut at = clean;
    while at < bytes.len() {
        match entry_at(bytes, at) {
            Some((entry, len)) => {
                entries.push(entry);
                damage.resynced_entries += 1;
                at += len;
            }
            None => {
                damage.bad_bytes += 1;
                at += 1;
            }
        }
    }
    (entries, damage)
}

/// The entry starting at `at`, and its length, if one decodes there. Cheap tests come
/// first (length in range, a known type, a record's magic) so that scanning garbage
/// computes few checksums.
fn entry_at(bytes: &[u8], at: usize) -> Option<(IndexEntry, usize)> {
    let len_bytes = bytes.get(at..at + 4)?;
    let len = u32::from_le_bytes([len_bytes[0], len_bytes[1], len_bytes[2], len_bytes[3]]) as usize;
    if !(5..=MAX_SALVAGED_ENTRY).contains(&len) {
        return None;
    }
    let rest = bytes.get(at + 4..at + 4 + len)?;
    match rest[0] {
        1 if rest.get(9..13) == Some(b"KVTR".as_slice()) => {}
        2 if len == 1 + 8 + 32 + 4 => {}
        _ => return None,
    }
    let (body, crc_bytes) = rest.split_at(len - 4);
    let stored = u32::from_le_bytes([crc_bytes[0], crc_bytes[1], crc_bytes[2], crc_bytes[3]]);
    if crc(body) != stored {
        return None;
    }
    decode_body(body).map(|e| (e, 4 + len))
}

fn decode_body(body: &[u8]) -> Option<IndexEntry> {
    let (&kind, rest) = body.split_first()?;
    let mut off = [0u8; 8];
    off.copy_from_slice(rest.get(..8)?);
    let offset = u64::from_le_bytes(off);
    let rest = &rest[8..];
    match kind {
        1 => {
            let header = RecordHeader::decode(rest)
                .map_err(|_: DecodeError| ())
                .ok()?;
            Some(IndexEntry::Record { offset, header })
        }
        2 => {
            let mut key = [0u8; 32];
            key.copy_from_slice(rest.get(..32)?);
            Some(IndexEntry::Tombstone { offset, key })
        }
        _ => None,
    }
}
