//! Whole reads of encoded records, with the disk and the cores working at once: the
//! calling thread reads the frame segment by segment and hands each one, as soon as it
//! has landed, to decoder threads, which decode it into its place in the page while the
//! next one is read. Reading first and decoding after left the disk idle during the
//! decode and the cores idle during the read (BENCHMARKS.md, issue 40).
//!
//! Verification is the same as reading first: the stored bytes are fed through the
//! record's chunk checksums as they land (in order, so each chunk is checked the moment it
//! is complete), and every decoded segment is checked against its own checksum. A
//! mismatch anywhere fails the read; what the decoders wrote meanwhile is thrown away
//! with the buffer and never returned.

use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::Mutex;
use std::sync::mpsc;

use bytes::Bytes;
use kvtier_codec::DecodeError;
use kvtier_codec::frame::{self, Frame};

use super::ReadFault;
use super::read::{Reader, TABLE_READ};
use crate::format::{Encoding, RecordHeader};

/// Checks stored bytes against a record's chunk checksums as they arrive, in order.
struct ChunkCheck<'a> {
    expected: &'a [u32],
    chunk: usize,
    digest: crc_fast::Digest,
    in_chunk: usize,
    next: usize,
}

impl<'a> ChunkCheck<'a> {
    fn new(header: &'a RecordHeader) -> Self {
        Self {
            expected: &header.chunk_crcs,
            chunk: 1usize << header.chunk_log2,
            digest: crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi),
            in_chunk: 0,
            next: 0,
        }
    }

    /// Feeds the next stored bytes; the index of the first chunk that fails, if any.
    fn feed(&mut self, mut bytes: &[u8]) -> Result<(), usize> {
        while !bytes.is_empty() {
            let take = (self.chunk - self.in_chunk).min(bytes.len());
            self.digest.update(&bytes[..take]);
            self.in_chunk += take;
            bytes = &bytes[take..];
            if self.in_chunk == self.chunk {
                self.close()?;
            }
        }
        Ok(())
    }

    fn close(&mut self) -> Result<(), usize> {
        let crc = self.digest.finalize() as u32;
        self.digest = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
        self.in_chunk = 0;
        let at = self.next;
        self.next += 1;
        if self.expected.get(at) == Some(&crc) {
            Ok(())
        } else {
            Err(at)
        }
    }

    /// Checks the last, partial chunk and that every chunk was seen.
    fn finish(mut self) -> Result<(), usize> {
        if self.in_chunk > 0 {
            self.close()?;
        }
        if self.next == self.expected.len() {
            Ok(())
        } else {
            Err(self.next)
        }
    }
}

/// A segment to decode: its stored bytes and where its decoded bytes go.
type Job<'a> = (Range<usize>, &'a [u8], &'a mut [u8]);

impl Reader<'_> {
    /// The whole decoded payload of an encoded record (see the module docs).
    pub(super) fn whole_decoded(&self, enc: Encoding) -> Result<Bytes, ReadFault> {
        let header = self.meta()?;
        let stored = header.payload_len as usize;
        let bad = |e: DecodeError| self.corrupt(&format!("encoded payload ({e})"));
        let base = self.loc.offset + self.loc.payload_offset;
        let read = |buf: &mut [u8], at: usize| {
            self.seg
                .seg
                .read_exact_at(buf, base + at as u64)
                .map_err(|e| self.io(e))
        };
        if stored < 8 {
            return Err(self.corrupt("encoded payload (shorter than a frame)"));
        }
        let mut table = vec![0u8; stored.min(TABLE_READ as usize)];
        read(&mut table, 0)?;
        let table_len = frame::table_len(&table).map_err(bad)?;
        if table_len > stored {
            return Err(self.corrupt("encoded payload (frame table past its end)"));
        }
        let first = table.len();
        table.resize(table_len, 0);
        if table_len > first {
            read(&mut table[first..], first)?;
        }
        let mut check = ChunkCheck::new(&header);
        let chunk_failed = |c: usize| self.corrupt(&format!("checksum mismatch in chunk {c}"));
        check.feed(&table).map_err(chunk_failed)?;
        let frame =
            Frame::parse(enc.codec, &table, enc.decoded_len as usize, false).map_err(bad)?;
        let spans: Vec<_> = frame.spans().collect();
        // The segments follow the table back to back and end the payload.
        let mut at = table_len;
        for (stored_range, _) in &spans {
            if stored_range.start != at {
                return Err(self.corrupt("encoded payload (segments out of place)"));
            }
            at = stored_range.end;
        }
        if at != stored {
            return Err(self.corrupt("encoded payload (segments do not end it)"));
        }
        let coder = &self.store.coder;
        let threads = coder.threads().min(spans.len()).max(1);
        self.store.buffers.filled(enc.decoded_len as usize, |out| {
            let mut encoded = vec![0u8; stored - table_len];
            // Declared before the scope: the decoder threads borrow them.
            let (tx, rx) = mpsc::channel::<Job<'_>>();
            let rx = Mutex::new(rx);
            let failed: Mutex<Option<DecodeError>> = Mutex::new(None);
            let decode = || {
                loop {
                    let job = match rx.lock() {
                        Ok(rx) => rx.recv(),
                        Err(_) => return,
                    };
                    let Ok((segments, src, dst)) = job else {
                        return;
                    };
                    if let Err(e) = coder.decode_segments(&frame, segments, src, dst)
                        && let Ok(mut f) = failed.lock()
                    {
                        f.get_or_insert(e);
                    }
                }
            };
            let read = std::thread::scope(|scope| {
                let decoders: Vec<_> = (0..threads).map(|_| scope.spawn(decode)).collect();
                // Dropping the sender (at the end of `read_all`) ends the decoders' loops.
                let read = self.read_segments(&spans, &mut encoded, out, &mut check, tx);
                let joined = decoders.into_iter().all(|d| d.join().is_ok());
                (read, joined)
            });
            match read {
                (Err(e), _) => return Err(e),
                (Ok(()), false) => return Err(self.corrupt("a decoder thread panicked")),
                (Ok(()), true) => {}
            }
            match failed.into_inner() {
                Ok(None) => {}
                Ok(Some(e)) => return Err(bad(e)),
                Err(_) => return Err(self.corrupt("a decoder thread panicked")),
            }
            check.finish().map_err(chunk_failed)
        })
    }

    /// Reads the segments in order into `encoded` (their stored bytes, after the table),
    /// feeding each through the chunk checksums, and sends each with its place in `out`
    /// to the decoders; dropping `tx` at the end stops them.
    fn read_segments<'a>(
        &self,
        spans: &[(Range<usize>, Range<usize>)],
        encoded: &'a mut [u8],
        out: &'a mut [u8],
        check: &mut ChunkCheck<'_>,
        tx: mpsc::Sender<Job<'a>>,
    ) -> Result<(), ReadFault> {
        let base = self.loc.offset + self.loc.payload_offset;
        let (mut rest_in, mut rest_out) = (encoded, out);
        for (i, (stored_range, decoded_range)) in spans.iter().enumerate() {
            let (src, later_in) = rest_in.split_at_mut(stored_range.len());
            rest_in = later_in;
            let (dst, later_out) = rest_out.split_at_mut(decoded_range.len());
            rest_out = later_out;
            self.seg
                .seg
                .read_exact_at(src, base + stored_range.start as u64)
                .map_err(|e| self.io(e))?;
            check
                .feed(src)
                .map_err(|c| self.corrupt(&format!("checksum mismatch in chunk {c}")))?;
            if tx.send((i..i + 1, &*src, dst)).is_err() {
                return Err(self.corrupt("a decoder thread stopped"));
            }
        }
        Ok(())
    }
}
