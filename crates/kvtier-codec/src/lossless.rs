//! The lossless codec: byte planes, each zstd-coded or stored as it is.
//!
//! ```text
//! u8   w: bytes per word (1..=8), the page's element width
//! w ×  plane: u8 mode (0 stored, 1 zstd frame), u32 LE length L, then L bytes
//!      the page's last (len % w) bytes, as they are
//! ```
//!
//! Plane `p` holds byte `p` of every whole word of the page (little-endian words: for bf16
//! and f16, plane 1 is sign and exponent). A plane that zstd does not shrink is stored, so
//! decoding it is a copy, and a page of noise costs its encoder one failed attempt per
//! plane and its decoder nothing.
//!
//! zstd's contexts are kept per thread: a fresh one costs an allocation of about a
//! mebibyte per call.

use std::cell::RefCell;

use crate::planes::{merge, split};
use crate::{Cursor, DecodeError};

const STORED: u8 = 0;
const ZSTD: u8 = 1;

/// The zstd level the SSD and remote tiers use unless told otherwise (ADR 0021: the best
/// ratio × throughput measured on KV from the candle models).
pub const DEFAULT_LEVEL: i32 = 1;

#[derive(Default)]
struct Scratch {
    planes: Vec<Vec<u8>>,
    coded: Vec<u8>,
    compressor: Option<(i32, zstd::bulk::Compressor<'static>)>,
    decompressor: Option<zstd::bulk::Decompressor<'static>>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Encodes `page` as `width`-byte words with zstd at `level`; `None` if zstd is not
/// available (a context could not be made) or the width is out of range.
pub fn encode(width: usize, page: &[u8], level: i32) -> Option<Vec<u8>> {
    if !(1..=8).contains(&width) {
        return None;
    }
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        let Scratch {
            planes,
            coded,
            compressor,
            ..
        } = &mut *s;
        if compressor.as_ref().is_none_or(|(l, _)| *l != level) {
            *compressor = Some((level, zstd::bulk::Compressor::new(level).ok()?));
        }
        let (_, zstd) = compressor.as_mut()?;
        planes.resize_with(width, Vec::new);
        split(page, &mut planes[..width]);
        let mut out = Vec::with_capacity(page.len() / 2 + 64);
        out.push(width as u8);
        for plane in &planes[..width] {
            // Room for one byte less than the plane: a frame that does not fit did not
            // shrink it, and zstd gives up as soon as it knows.
            coded.clear();
            coded.resize(plane.len().saturating_sub(1), 0);
            match zstd.compress_to_buffer(plane.as_slice(), coded.as_mut_slice()) {
                Ok(n) if n < plane.len() => {
                    out.push(ZSTD);
                    out.extend_from_slice(&(n as u32).to_le_bytes());
                    out.extend_from_slice(&coded[..n]);
                }
                _ => {
                    out.push(STORED);
                    out.extend_from_slice(&(plane.len() as u32).to_le_bytes());
                    out.extend_from_slice(plane);
                }
            }
        }
        out.extend_from_slice(&page[page.len() / width * width..]);
        Some(out)
    })
}

/// Where a plane's bytes are while a page is decoded.
enum Plane<'a> {
    Stored(&'a [u8]),
    Decoded(usize),
}

/// Decodes a stream written by [`encode`] into `out` (exactly the page's length).
pub fn decode(stream: &[u8], out: &mut [u8]) -> Result<(), DecodeError> {
    let mut cur = Cursor { rest: stream };
    let width = usize::from(cur.u8()?);
    if !(1..=8).contains(&width) {
        return Err(DecodeError::Invalid("plane width"));
    }
    let n = out.len() / width;
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        let Scratch {
            planes,
            decompressor,
            ..
        } = &mut *s;
        planes.resize_with(width, Vec::new);
        let mut layout = Vec::with_capacity(width);
        for (p, plane) in planes[..width].iter_mut().enumerate() {
            let mode = cur.u8()?;
            let len = cur.u32()? as usize;
            let bytes = cur.take(len)?;
            match mode {
                STORED if len == n => layout.push(Plane::Stored(bytes)),
                STORED => return Err(DecodeError::Invalid("stored plane length")),
                ZSTD => {
                    if decompressor.is_none() {
                        *decompressor = Some(
                            zstd::bulk::Decompressor::new()
                                .map_err(|_| DecodeError::Invalid("no zstd context"))?,
                        );
                    }
                    let Some(zstd) = decompressor.as_mut() else {
                        return Err(DecodeError::Invalid("no zstd context"));
                    };
                    plane.clear();
                    plane.resize(n, 0);
                    match zstd.decompress_to_buffer(bytes, plane.as_mut_slice()) {
                        Ok(got) if got == n => layout.push(Plane::Decoded(p)),
                        _ => return Err(DecodeError::Invalid("zstd plane")),
                    }
                }
                _ => return Err(DecodeError::Invalid("plane mode")),
            }
        }
        let tail = cur.take(out.len() - n * width)?;
        cur.finish()?;
        let refs: Vec<&[u8]> = layout
            .iter()
            .map(|p| match p {
                Plane::Stored(b) => *b,
                Plane::Decoded(i) => planes[*i].as_slice(),
            })
            .collect();
        let (words, rest) = out.split_at_mut(n * width);
        merge(&refs, words);
        rest.copy_from_slice(tail);
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// bf16 words whose high byte repeats a few exponents and whose low byte is noise,
    /// like a KV page.
    fn kv_like(words: usize) -> Vec<u8> {
        let mut x = 0x9e37_79b9_u32;
        let mut page = Vec::with_capacity(words * 2);
        for _ in 0..words {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            page.push(x as u8);
            page.push(0x3c + (x >> 30) as u8);
        }
        page
    }

    #[test]
    fn a_kv_like_page_shrinks_and_comes_back_exactly() {
        let page = kv_like(4096);
        let enc = encode(2, &page, DEFAULT_LEVEL).unwrap();
        assert!(
            enc.len() < page.len() * 3 / 4,
            "{} of {}",
            enc.len(),
            page.len()
        );
        let mut out = vec![0u8; page.len()];
        decode(&enc, &mut out).unwrap();
        assert_eq!(out, page);
    }

    #[test]
    fn a_damaged_or_short_stream_is_an_error_not_a_panic() {
        let page = kv_like(1000);
        let enc = encode(2, &page, DEFAULT_LEVEL).unwrap();
        let mut out = vec![0u8; page.len()];
        for cut in [0, 1, 5, enc.len() / 2, enc.len() - 1] {
            assert!(decode(&enc[..cut], &mut out).is_err(), "cut at {cut}");
        }
        let mut longer = enc.clone();
        longer.push(0);
        assert!(decode(&longer, &mut out).is_err());
        let mut wrong_len = vec![0u8; page.len() + 2];
        assert!(decode(&enc, &mut wrong_len).is_err());
        // Flip each byte of the stream's framing and of the zstd frame: never a panic.
        for i in 0..enc.len().min(64) {
            let mut bad = enc.clone();
            bad[i] ^= 0x5a;
            let _ = decode(&bad, &mut out);
        }
    }
}
