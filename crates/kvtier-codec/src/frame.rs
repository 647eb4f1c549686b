//! Frames: a page encoded as independent segments, so a read of one layer decodes only
//! the segments that hold it, a whole page decodes on several threads at once, and every
//! decoded segment is checked against its own checksum of the bytes it must give back.
//!
//! ```text
//! u32  S: decoded bytes per segment (a multiple of the element width; the last segment
//!      may be shorter)
//! u32  N: segments, = ⌈decoded length / S⌉
//! N ×  u32 LE encoded length, u32 LE CRC-32C of the decoded segment, u8 codec code
//!      (the frame's codec, or raw for a segment that did not shrink)
//!      the segments' encoded bytes, in order
//! ```
//!
//! The checksums are of the decoded bytes (for a lossy codec: of what the stream decodes
//! to, not of the page it was made from), so verification does not depend on the codec:
//! a damaged stream, a codec bug or a stream from another page all fail here, and the
//! caller serves nothing.

use std::ops::Range;

use crate::shares::in_shares;
use crate::{Codec, Cursor, DecodeError, Shape};

/// Bytes of the frame's fixed part.
const FIXED: usize = 8;
/// Bytes per segment entry.
const ENTRY: usize = 9;
/// Below this many decoded bytes a whole-frame decode stays on the calling thread.
pub(crate) const PARALLEL_FROM: usize = 512 << 10;

/// CRC-32C, as the SSD format uses.
pub fn crc(bytes: &[u8]) -> u32 {
    crc_fast::crc32_iscsi(bytes)
}

/// One encoded segment's entry in the frame's table: the codec it used, its encoded
/// length, the checksum of what it decodes to.
type Entry = (Codec, usize, u32);

/// Appends the encodings of `segments` to `body`, one after another (see [`encode`]);
/// their entries, or `None` if a lossy stream does not decode. Into one buffer, not one
/// per segment: no allocation and no copy per segment.
fn encode_segments(
    codec: Codec,
    shape: Shape,
    segments: &[&[u8]],
    body: &mut Vec<u8>,
) -> Option<Vec<Entry>> {
    let mut entries = Vec::with_capacity(segments.len());
    for seg in segments {
        let at = body.len();
        let used = if crate::encode_into(codec, shape, seg, body) {
            codec
        } else {
            body.extend_from_slice(seg);
            Codec::Raw
        };
        // The checksum is of what a read will give back: the page's own bytes, or for a
        // lossy codec what its encoding decodes to (decoded here, once, so a codec that
        // cannot give back its own stream is caught at the writer).
        let sum = if used.is_lossless() {
            crc(seg)
        } else {
            let mut decoded = vec![0u8; seg.len()];
            crate::decode(used, &body[at..], &mut decoded).ok()?;
            crc(&decoded)
        };
        entries.push((used, body.len() - at, sum));
    }
    Some(entries)
}

/// Encodes `page` as a frame of `segment`-byte segments (rounded down to a multiple of the
/// element width, at least one element), each with `codec` or raw where
/// that does not shrink it, on up to `threads` threads for a page large enough to gain
/// from it (segments are independent). `None` when the frame would not be smaller than
/// the page, or when no segment shrank.
pub fn encode(
    codec: Codec,
    shape: Shape,
    page: &[u8],
    segment: usize,
    threads: usize,
) -> Option<Vec<u8>> {
    if codec == Codec::Raw || page.is_empty() {
        return None;
    }
    let width = shape.element.width();
    let segment = (segment / width * width).max(width);
    let count = page.len().div_ceil(segment);
    let segment_u32 = u32::try_from(segment).ok()?;
    let count_u32 = u32::try_from(count).ok()?;
    let table_len = FIXED + ENTRY * count;
    let segments: Vec<&[u8]> = page.chunks(segment).collect();
    let threads = threads.clamp(1, count);
    // The first share's buffer becomes the frame: room for the table at its front, then
    // its segments; the other shares' segments are appended to it.
    let (mut out, entries) = if threads == 1 || page.len() < PARALLEL_FROM {
        let mut out = Vec::with_capacity(table_len + page.len());
        out.resize(table_len, 0);
        let entries = encode_segments(codec, shape, &segments, &mut out)?;
        (out, entries)
    } else {
        let shares: Vec<(usize, Vec<&[u8]>)> = {
            let per = count.div_ceil(threads);
            segments
                .chunks(per)
                .enumerate()
                .map(|(i, share)| (i, share.to_vec()))
                .collect()
        };
        let coded = in_shares(shares, threads, |mine| {
            let mut parts = Vec::with_capacity(mine.len());
            for (i, share) in mine {
                let bytes: usize = share.iter().map(|s| s.len()).sum();
                // The first share's buffer has room for the whole frame: the others are
                // appended to it without moving it.
                let (front, room) = if i == 0 {
                    (table_len, table_len + page.len())
                } else {
                    (0, bytes)
                };
                let mut body = Vec::with_capacity(room);
                body.resize(front, 0);
                parts.push((encode_segments(codec, shape, &share, &mut body)?, body));
            }
            Some(parts)
        });
        let mut parts = Vec::with_capacity(count);
        for share in coded {
            parts.extend(share??);
        }
        let mut parts = parts.into_iter();
        let (mut entries, mut out) = parts.next()?;
        for (more, body) in parts {
            entries.extend(more);
            out.extend_from_slice(&body);
        }
        (out, entries)
    };
    if entries.iter().all(|(used, _, _)| *used == Codec::Raw) || out.len() >= page.len() {
        return None;
    }
    let mut table = Vec::with_capacity(table_len);
    table.extend_from_slice(&segment_u32.to_le_bytes());
    table.extend_from_slice(&count_u32.to_le_bytes());
    for (used, len, sum) in &entries {
        table.extend_from_slice(&(*len as u32).to_le_bytes());
        table.extend_from_slice(&sum.to_le_bytes());
        table.push(used.code());
    }
    out[..table_len].copy_from_slice(&table);
    Some(out)
}

/// One segment of a parsed frame.
#[derive(Debug, Clone, Copy)]
struct Segment {
    /// Where its encoded bytes are in the stream.
    at: usize,
    len: usize,
    crc: u32,
    codec: Codec,
}

/// A frame whose table has been read and checked against the decoded length.
#[derive(Debug, Clone)]
pub struct Frame<'a> {
    stream: &'a [u8],
    segment: usize,
    decoded_len: usize,
    segments: Vec<Segment>,
    codec: Codec,
}

/// Bytes of a frame's table (fixed part and entries) for a frame whose fixed part is
/// `head` (at least 8 bytes): what to read before the segments when reading part of it.
pub fn table_len(head: &[u8]) -> Result<usize, DecodeError> {
    let mut cur = Cursor { rest: head };
    let _segment = cur.u32()?;
    let count = cur.u32()? as usize;
    count
        .checked_mul(ENTRY)
        .and_then(|n| n.checked_add(FIXED))
        .ok_or(DecodeError::Invalid("segment count"))
}

impl<'a> Frame<'a> {
    /// Reads the table of `stream`, a frame written by `codec` of a page of `decoded_len`
    /// bytes. With `whole`, the stream must end exactly after the last segment; without,
    /// `stream` may be only the table (see [`Frame::segments_for`]).
    pub fn parse(
        codec: Codec,
        stream: &'a [u8],
        decoded_len: usize,
        whole: bool,
    ) -> Result<Self, DecodeError> {
        let mut cur = Cursor { rest: stream };
        let segment = cur.u32()? as usize;
        let count = cur.u32()? as usize;
        if segment == 0 || count != decoded_len.div_ceil(segment) {
            return Err(DecodeError::Invalid("segment size or count"));
        }
        let mut segments = Vec::with_capacity(count);
        let mut at = FIXED + ENTRY * count;
        for _ in 0..count {
            let len = cur.u32()? as usize;
            let crc = cur.u32()?;
            let code = cur.u8()?;
            let used = Codec::from_code(code).ok_or(DecodeError::UnknownCodec(code))?;
            if used != Codec::Raw && used != codec {
                return Err(DecodeError::Invalid("segment codec"));
            }
            segments.push(Segment {
                at,
                len,
                crc,
                codec: used,
            });
            at = at.checked_add(len).ok_or(DecodeError::Truncated)?;
        }
        if whole && at != stream.len() {
            return Err(DecodeError::Truncated);
        }
        Ok(Self {
            stream,
            segment,
            decoded_len,
            segments,
            codec,
        })
    }

    /// The codec the frame was written with.
    pub fn codec(&self) -> Codec {
        self.codec
    }

    /// Every segment's encoded bytes (where they are in the stream) and decoded bytes (where
    /// they go in the page), in order: for a reader that reads and decodes segment by
    /// segment.
    pub fn spans(&self) -> impl Iterator<Item = (Range<usize>, Range<usize>)> + '_ {
        self.segments.iter().enumerate().map(|(i, s)| {
            let start = i * self.segment;
            let end = (start + self.segment).min(self.decoded_len);
            (s.at..s.at + s.len, start..end)
        })
    }

    /// The segments holding decoded bytes `range`, and where their encoded bytes are in
    /// the stream.
    pub fn segments_for(&self, range: Range<usize>) -> (Range<usize>, Range<usize>) {
        let first = range.start / self.segment;
        let last = range.end.saturating_sub(1) / self.segment;
        let last = last.min(self.segments.len().saturating_sub(1));
        let first = first.min(last);
        let start = self.segments.get(first).map_or(0, |s| s.at);
        let end = self.segments.get(last).map_or(0, |s| s.at + s.len);
        (first..last + 1, start..end)
    }

    /// Decoded bytes `segments.start * S ..` of the segments `segments`.
    pub fn decoded_span(&self, segments: Range<usize>) -> Range<usize> {
        let start = segments.start * self.segment;
        let end = (segments.end * self.segment).min(self.decoded_len);
        start..end
    }

    /// Decodes segments `segments` from `encoded` (their encoded bytes, starting at the
    /// first one's) into `out` (exactly their decoded bytes), checking each one's CRC.
    pub fn decode_segments(
        &self,
        segments: Range<usize>,
        encoded: &[u8],
        out: &mut [u8],
    ) -> Result<(), DecodeError> {
        let Some(base) = self.segments.get(segments.start).map(|s| s.at) else {
            return Err(DecodeError::Invalid("segment range"));
        };
        let span = self.decoded_span(segments.clone());
        if out.len() != span.len() {
            return Err(DecodeError::Invalid("output length"));
        }
        for (i, dst) in segments.zip(out.chunks_mut(self.segment)) {
            let s = self.segments[i];
            let from = s.at - base;
            let bytes = encoded
                .get(from..from + s.len)
                .ok_or(DecodeError::Truncated)?;
            crate::decode(s.codec, bytes, dst)?;
            if crc(dst) != s.crc {
                return Err(DecodeError::Checksum);
            }
        }
        Ok(())
    }

    /// Decodes the whole frame (parsed with `whole`) into `out`, on up to `threads`
    /// threads when the page is large enough to gain from it.
    pub fn decode_all(&self, out: &mut [u8], threads: usize) -> Result<(), DecodeError> {
        if out.len() != self.decoded_len {
            return Err(DecodeError::Invalid("output length"));
        }
        let n = self.segments.len();
        let encoded = &self.stream[self.segments.first().map_or(0, |s| s.at)..];
        let threads = threads.clamp(1, n.max(1));
        if threads == 1 || out.len() < PARALLEL_FROM {
            return self.decode_segments(0..n, encoded, out);
        }
        // One job per segment: its range, its stored bytes, its place in `out`.
        let mut jobs = Vec::with_capacity(n);
        let mut rest = out;
        for (i, s) in self.segments.iter().enumerate() {
            let span = self.decoded_span(i..i + 1);
            let (mine, later) = rest.split_at_mut(span.len());
            rest = later;
            let from = s.at - self.segments[0].at;
            jobs.push((i..i + 1, &encoded[from..], mine));
        }
        in_shares(jobs, threads, |share| {
            share
                .into_iter()
                .try_for_each(|(segs, src, dst)| self.decode_segments(segs, src, dst))
        })
        .into_iter()
        .try_for_each(|r| r.unwrap_or(Err(DecodeError::Invalid("decoder thread"))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Element;

    fn page(len: usize) -> Vec<u8> {
        let mut x = 12345u32;
        (0..len)
            .map(|i| {
                x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
                if i % 2 == 1 {
                    0x3c + (x >> 30) as u8
                } else {
                    (x >> 16) as u8
                }
            })
            .collect()
    }

    const BF16: Shape = Shape {
        element: Element::Bf16,
        group: 64,
    };

    #[test]
    fn a_frame_decodes_whole_in_parallel_and_by_segment_ranges() {
        let p = page(3 << 20 | 6);
        let enc = encode(Codec::Lossless, BF16, &p, 256 << 10, 2).unwrap();
        let frame = Frame::parse(Codec::Lossless, &enc, p.len(), true).unwrap();
        for threads in [1, 2, 4] {
            let mut out = vec![0u8; p.len()];
            frame.decode_all(&mut out, threads).unwrap();
            assert_eq!(out, p);
        }
        let table = table_len(&enc).unwrap();
        for range in [0..1, 5..300_000, (1 << 20)..(3 << 20) + 6] {
            // Only the table and the segments' bytes are needed.
            let (segs, at) = frame.segments_for(range.clone());
            let partial = Frame::parse(Codec::Lossless, &enc[..table], p.len(), false).unwrap();
            let span = partial.decoded_span(segs.clone());
            let mut out = vec![0u8; span.len()];
            partial.decode_segments(segs, &enc[at], &mut out).unwrap();
            assert_eq!(out, p[span.clone()]);
            assert!(span.start <= range.start && span.end >= range.end);
        }
    }

    #[test]
    fn a_segment_that_decodes_to_other_bytes_fails_its_checksum() {
        let p = page(1 << 20);
        let mut enc = encode(Codec::Lossless, BF16, &p, 64 << 10, 1).unwrap();
        // Change one stored byte of the first segment's stored (low) plane: the codec and
        // the framing are happy, the decoded bytes are not the page's.
        let first = table_len(&enc).unwrap();
        enc[first + 8] ^= 1;
        let frame = Frame::parse(Codec::Lossless, &enc, p.len(), true).unwrap();
        let mut out = vec![0u8; p.len()];
        assert_eq!(frame.decode_all(&mut out, 1), Err(DecodeError::Checksum));
        assert!(Frame::parse(Codec::Lossless, &enc[..enc.len() - 1], p.len(), true).is_err());
        assert!(Frame::parse(Codec::Lossless, &enc, p.len() + 1, true).is_err());
        assert!(Frame::parse(Codec::Fp8E4M3, &enc, p.len(), true).is_err());
    }

    #[test]
    fn a_lossy_frame_checks_what_it_decodes_to() {
        let p = page(1 << 20);
        let enc = encode(Codec::Fp8E4M3, BF16, &p, 64 << 10, 2).unwrap();
        assert!(enc.len() < p.len() * 6 / 10);
        let frame = Frame::parse(Codec::Fp8E4M3, &enc, p.len(), true).unwrap();
        let (mut a, mut b) = (vec![0u8; p.len()], vec![0u8; p.len()]);
        frame.decode_all(&mut a, 1).unwrap();
        frame.decode_all(&mut b, 4).unwrap();
        assert_eq!(a, b);
        assert_ne!(a, p, "fp8 is lossy on these values");
    }

    #[test]
    fn noise_is_not_framed() {
        let mut x = 1u64;
        let noise: Vec<u8> = (0..100_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        assert!(encode(Codec::Lossless, BF16, &noise, 16 << 10, 1).is_none());
    }
}
