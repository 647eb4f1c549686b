//! Streaming appends: a record whose payload arrives in pieces (an S3 PUT body, the parts
//! of a multipart upload), written straight into its place in the segment with bounded
//! memory instead of being gathered first.
//!
//! 1. [`SegmentStore::reserve`] takes the record's place at the tail of the active segment
//!    (a short hold of the append lock: other appends go on behind it meanwhile).
//! 2. [`Reservation::write`] writes payload bytes in order at their final offsets, computing
//!    the chunk checksums as they pass.
//! 3. [`SegmentStore::commit`] writes the header (now that the checksums are known), syncs
//!    the data as configured, and appends the index entry.
//!
//! **Order.** Recovery lets the newest record of a key win, newest meaning later segment,
//! then later index entry. So that a committed record is always the newest of its key, the
//! index entry is appended while the reservation's segment is still the active one; if the
//! active segment rolled over during the upload, the payload is first copied (in bounded
//! pieces) to a new reservation at the current tail. Commit order is then index order.
//!
//! **Abandoned** reservations (a client that went away) leave their space unindexed; their
//! bytes are released with a hole punch, so a scan of the segment finds zeros, never a
//! half-written payload it could mistake for a record.

use std::os::unix::fs::FileExt;
use std::sync::Arc;

use kvtier_core::{Error, ErrorKind, Result};

use super::{Durability, Loc, Segment, SegmentStore, io_error, seg_path};
use crate::format::{IndexEntry, RECORD_HEADER_LEN, RecordHeader, SEGMENT_HEADER_LEN};

/// Bytes copied per step when a reservation must move (segment rolled over).
const COPY_STEP: u64 = 4 << 20;

/// A record's place in a segment, being filled. Dropping it without a commit abandons it.
#[derive(Debug)]
pub struct Reservation {
    segment: Arc<Segment>,
    offset: u64,
    payload_offset: u64,
    payload_len: u64,
    record_len: u64,
    chunk_log2: u8,
    written: u64,
    /// Payload bytes whose writeback has been started.
    kicker: super::writeback::Kicker,
    crcs: Vec<u32>,
    chunk: crc_fast::Digest,
    committed: bool,
}

impl Reservation {
    /// Payload bytes written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// The payload length this reservation holds.
    pub fn payload_len(&self) -> u64 {
        self.payload_len
    }

    /// Writes the next payload bytes. Refuses more than the reserved length.
    pub fn write(&mut self, bytes: &[u8]) -> Result<()> {
        if self.written + bytes.len() as u64 > self.payload_len {
            return Err(Error::invalid(format!(
                "payload longer than reserved: {} + {} > {}",
                self.written,
                bytes.len(),
                self.payload_len
            )));
        }
        let at = self.offset + self.payload_offset + self.written;
        self.segment.seg.write_all_at(bytes, at).map_err(|e| {
            Error::new(ErrorKind::Unavailable, format!("write payload at {at}")).with_source(e)
        })?;
        let chunk = 1u64 << self.chunk_log2;
        let mut rest = bytes;
        while !rest.is_empty() {
            let room = (chunk - self.written % chunk) as usize;
            let (now, later) = rest.split_at(room.min(rest.len()));
            self.chunk.update(now);
            self.written += now.len() as u64;
            if self.written.is_multiple_of(chunk) {
                self.crcs.push(self.chunk.finalize() as u32);
                self.chunk = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
            }
            rest = later;
        }
        if let Some((from, len)) = self.kicker.due(self.written) {
            let at = self.offset + self.payload_offset + from;
            super::writeback::start(&self.segment.seg, at, len);
        }
        Ok(())
    }

    /// Syncs the payload written so far (`fdatasync` of its segment), so that the sync
    /// inside [`SegmentStore::commit`] has only the header left to write out.
    pub fn sync_data(&self) -> Result<()> {
        self.segment.seg.sync_data().map_err(|e| {
            Error::new(ErrorKind::Unavailable, "sync a reserved payload").with_source(e)
        })
    }

    fn finish_crcs(&mut self) {
        if !self.written.is_multiple_of(1u64 << self.chunk_log2) {
            self.crcs.push(self.chunk.finalize() as u32);
            self.chunk = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.committed {
            return;
        }
        // Zero the abandoned place (a hole punch: no write of the bytes themselves).
        let flags = rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE;
        if let Err(e) =
            rustix::fs::fallocate(&self.segment.seg, flags, self.offset, self.record_len)
        {
            tracing::debug!(segment = self.segment.id, offset = self.offset, error = %e,
                "could not punch out an abandoned reservation");
        }
    }
}

impl SegmentStore {
    /// Reserves the place of a record with `payload_len` bytes of payload and `tokens`
    /// tokens at the tail of the active segment (starting a new segment when it would not
    /// fit). Errors when the record cannot fit in any segment.
    pub fn reserve(&self, payload_len: u64, tokens: usize) -> Result<Reservation> {
        let chunk_log2 = self.config.chunk_log2;
        let chunks = RecordHeader::chunks_for(payload_len, chunk_log2);
        let meta_len = RECORD_HEADER_LEN + 4 * tokens as u64 + 4 * chunks;
        let payload_offset = crate::format::align_up(meta_len);
        let record_len = crate::format::align_up(payload_offset + payload_len);
        if SEGMENT_HEADER_LEN + record_len > self.config.segment_bytes {
            return Err(Error::invalid(format!(
                "a record of {payload_len} bytes does not fit in a {}-byte segment",
                self.config.segment_bytes
            )));
        }
        self.writable()?;
        let mut guard = self.active.lock();
        let slot = &mut *guard;
        let active = self.active_with_room(&mut slot.current, &mut slot.next_id, record_len)?;
        let offset = active.tail;
        active.tail += record_len;
        Ok(Reservation {
            segment: active.segment.clone(),
            offset,
            payload_offset,
            payload_len,
            record_len,
            chunk_log2,
            written: 0,
            kicker: super::writeback::Kicker::default(),
            crcs: Vec::with_capacity(chunks as usize),
            chunk: crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi),
            committed: false,
        })
    }

    /// Completes a reservation whose whole payload was written: `header` gives the record's
    /// fields (its `payload_len`, `chunk_log2` and `chunk_crcs` are set here). Returns where
    /// the record lives, with the header as written, once it and its index entry are durable as configured; it is then
    /// the newest record of its key in index order (see the module docs).
    pub fn commit(
        &self,
        mut res: Reservation,
        mut header: RecordHeader,
    ) -> Result<(Loc, RecordHeader)> {
        if res.written != res.payload_len {
            return Err(Error::invalid(format!(
                "payload incomplete: {} of {} bytes",
                res.written, res.payload_len
            )));
        }
        res.finish_crcs();
        header.payload_len = res.payload_len;
        header.chunk_log2 = res.chunk_log2;
        header.chunk_crcs = std::mem::take(&mut res.crcs);
        // A streamed payload is written as it arrives: raw.
        header.encoding = None;
        if header.payload_offset() != res.payload_offset {
            return Err(Error::invalid(
                "the header's tokens differ from the reservation's",
            ));
        }
        // Each move needs a whole segment's worth of appends meanwhile: a few suffice.
        for _ in 0..4 {
            self.write_meta(&res, &header)?;
            let slot = self.active.lock();
            if slot.current.as_ref().map(|a| a.segment.id) == Some(res.segment.id) {
                let loc = Loc::new(res.segment.id, res.offset, &header);
                self.append_index(
                    &res.segment,
                    &IndexEntry::Record {
                        offset: res.offset,
                        header: header.clone(),
                    },
                )?;
                res.committed = true;
                drop(slot);
                // The log entry too: a synced commit must be found by the log's walk even
                // when an unfinished reservation before it holds no header.
                self.mark_unsynced(res.segment.id, true, true);
                if self.config.durability == Durability::Synced {
                    self.sync_pending()?;
                }
                return Ok((loc, header));
            }
            drop(slot);
            res = self.moved(&res)?;
        }
        Err(Error::new(
            ErrorKind::Unavailable,
            "segments roll over faster than a streamed record can be committed",
        ))
    }

    fn write_meta(&self, res: &Reservation, header: &RecordHeader) -> Result<()> {
        let path = seg_path(&self.dir, res.segment.id);
        res.segment
            .seg
            .write_all_at(&header.encode(), res.offset)
            .map_err(|e| io_error(&path, "write record to", e))
    }

    /// Copies a written reservation's payload to a new one at the current tail.
    fn moved(&self, from: &Reservation) -> Result<Reservation> {
        let mut to = self.reserve(from.payload_len, 0)?;
        to.chunk_log2 = from.chunk_log2;
        let mut buf = vec![0u8; COPY_STEP.min(from.payload_len) as usize];
        let mut at = 0;
        while at < from.payload_len {
            let n = COPY_STEP.min(from.payload_len - at) as usize;
            let piece = &mut buf[..n];
            from.segment
                .seg
                .read_exact_at(piece, from.offset + from.payload_offset + at)
                .map_err(|e| {
                    Error::new(ErrorKind::Unavailable, "re-read a reserved payload").with_source(e)
                })?;
            to.write(piece)?;
            at += n as u64;
        }
        Ok(to)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use crate::StoreConfig;
    use crate::format::{Kind, chunk_crcs};
    use kvtier_core::hash::BlockHash;
    use kvtier_core::layout::LayoutDigest;

    fn header(key: u8) -> RecordHeader {
        RecordHeader {
            kind: Kind::Object,
            layout: LayoutDigest([0; 16]),
            key: [key; 32],
            parent: BlockHash([0; 16]),
            position: 0,
            tokens: Vec::new(),
            extra_tag: None,
            payload_len: 0,
            created_ms: 1,
            chunk_log2: 0,
            chunk_crcs: Vec::new(),
            encoding: None,
        }
    }

    #[test]
    fn a_streamed_record_reads_back_and_survives_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let config = StoreConfig {
            segment_bytes: 1 << 20,
            chunk_log2: 12,
            ..StoreConfig::default()
        };
        let payload: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let loc = {
            let (store, _, _) = SegmentStore::open(dir.path(), config).unwrap();
            // Fill most of the first segment so the streamed record rolls over mid-way.
            let mut res = store.reserve(payload.len() as u64, 0).unwrap();
            for piece in payload.chunks(10_007) {
                res.write(piece).unwrap();
            }
            let filler = vec![1u8; 800_000];
            let mut h = header(9);
            h.payload_len = filler.len() as u64;
            h.chunk_log2 = 12;
            h.chunk_crcs = chunk_crcs(&filler, 12);
            store.append(&h, &filler).unwrap();
            let mut h2 = header(9);
            h2.payload_len = filler.len() as u64;
            h2.chunk_log2 = 12;
            h2.chunk_crcs = chunk_crcs(&filler, 12);
            store.append(&h2, &filler).unwrap();
            let (loc, written) = store.commit(res, header(3)).unwrap();
            assert_eq!(written, committed_header(&payload));
            let got = store
                .read_known(&loc, &committed_header(&payload), 0..payload.len() as u64)
                .unwrap();
            assert_eq!(&got[..], &payload[..]);
            // Too long a payload is refused, not written past the reservation.
            let mut small = store.reserve(4, 0).unwrap();
            assert!(small.write(b"12345").is_err());
            loc
        };
        let (store, recovered, _) = SegmentStore::open(dir.path(), config).unwrap();
        let r = recovered.iter().find(|r| r.header.key == [3; 32]).unwrap();
        assert_eq!(r.loc, loc);
        let got = store
            .read_known(&r.loc, &r.header, 0..payload.len() as u64)
            .unwrap();
        assert_eq!(&got[..], &payload[..]);
    }

    fn committed_header(payload: &[u8]) -> RecordHeader {
        let mut h = header(3);
        h.payload_len = payload.len() as u64;
        h.chunk_log2 = 12;
        h.chunk_crcs = chunk_crcs(payload, 12);
        h
    }
}
