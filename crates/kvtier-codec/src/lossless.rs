//! The lossless codec: byte planes, each coded with a Huffman code of its own statistics
//! or stored as it is.
//!
//! ```text
//! u8   w: bytes per word (1..=8), the page's element width
//! w ×  plane: u8 mode (0 stored, 1 Huffman), u32 LE length L, then L bytes
//!      the page's last (len % w) bytes, as they are
//! ```
//!
//! Plane `p` holds byte `p` of every whole word of the page (little-endian words: for bf16
//! and f16, plane 1 is sign and exponent). Every 8th byte of a plane decides: a plane whose
//! code would save under 1/32 of it is stored, so decoding it is a copy, and a page of
//! noise costs its encoder a counting pass over an eighth of it and its decoder nothing;
//! a coded plane's code is built from the same sample. The coder and why it is not zstd:
//! `huffman.rs` and ADR 0021.

use std::sync::{Mutex, PoisonError};

use crate::huffman;
use crate::planes::{merge, split};
use crate::{Cursor, DecodeError};

/// A plane's code is built from every this many-th of its bytes.
const SAMPLE_STEP: usize = 8;

const STORED: u8 = 0;
const HUFFMAN: u8 = 1;

/// Space an encode or a decode works in: the planes of its page and the bit streams of
/// the plane being coded.
#[derive(Default)]
struct Scratch {
    planes: Vec<Vec<u8>>,
    streams: huffman::Streams,
}

/// Scratch spaces not in use. A pool, not thread-locals: pages are coded on short-lived
/// scoped threads (`frame`), whose thread-locals would start empty, and have their pages
/// faulted in afresh, for every page.
static SCRATCH: Mutex<Vec<Scratch>> = Mutex::new(Vec::new());
/// Scratch spaces kept at most (one per thread coding at once is all that is reused).
const POOLED: usize = 16;

/// Runs `f` with a scratch space from the pool, returned to it after.
fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    let pool = || SCRATCH.lock().unwrap_or_else(PoisonError::into_inner);
    let mut scratch = pool().pop().unwrap_or_default();
    let result = f(&mut scratch);
    let mut pool = pool();
    if pool.len() < POOLED {
        pool.push(scratch);
    }
    result
}

/// Encodes `page` as `width`-byte words; `None` if the width is out of range.
pub fn encode(width: usize, page: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    encode_into(width, page, &mut out).then_some(out)
}

/// [`encode`], appending the stream to `out`; `false` (and `out` as it was) if the width
/// is out of range.
pub fn encode_into(width: usize, page: &[u8], out: &mut Vec<u8>) -> bool {
    if !(1..=8).contains(&width) {
        return false;
    }
    let n = page.len() / width;
    let words = &page[..n * width];
    // Each plane is judged on every 8th of its bytes, read from the page: a plane of noise
    // (a bf16 low byte) by the sample's entropy (no code does better) and stored; another
    // plane's code is built from its sample, every byte value the plane may hold given a
    // code (`huffman::estimated_counts`).
    let samples: Vec<[u64; 256]> = (0..width)
        .map(|p| huffman::sampled_histogram(words.get(p..).unwrap_or(&[]), SAMPLE_STEP * width))
        .collect();
    let worth_coding: Vec<bool> = samples.iter().map(huffman::could_pay).collect();
    // The planes stored ahead of the first one coded are split straight into `out`; the
    // rest into scratch, from where they are coded (or copied, if stored after all).
    let direct = worth_coding.iter().take_while(|c| !**c).count();
    out.reserve(page.len() + 1 + 5 * width);
    out.push(width as u8);
    let first = out.len();
    for _ in 0..direct {
        out.push(STORED);
        out.extend_from_slice(&(n as u32).to_le_bytes());
        out.resize(out.len() + n, 0);
    }
    with_scratch(|s| {
        let Scratch { planes, streams } = s;
        planes.resize_with(width, Vec::new);
        for plane in &mut planes[direct..width] {
            plane.resize(n, 0);
        }
        {
            let mut dests: Vec<&mut [u8]> = Vec::with_capacity(width);
            let mut rest = &mut out[first..];
            for _ in 0..direct {
                let (plane, after) = std::mem::take(&mut rest)[5..].split_at_mut(n);
                dests.push(plane);
                rest = after;
            }
            dests.extend(planes[direct..width].iter_mut().map(Vec::as_mut_slice));
            split(words, &mut dests);
        }
        for (p, plane) in planes.iter().enumerate().take(width).skip(direct) {
            let code = worth_coding[p]
                .then(|| {
                    let counts = huffman::estimated_counts(plane, &samples[p], SAMPLE_STEP);
                    let lens = huffman::lengths(&counts);
                    (huffman::coded_len(&counts, &lens) * 32 < plane.len() * 31).then_some(lens)
                })
                .flatten();
            if let Some(lens) = code {
                out.push(HUFFMAN);
                let at = out.len();
                out.extend_from_slice(&[0; 4]);
                huffman::encode(plane, &lens, out, streams);
                let len = (out.len() - at - 4) as u32;
                out[at..at + 4].copy_from_slice(&len.to_le_bytes());
            } else {
                out.push(STORED);
                out.extend_from_slice(&(plane.len() as u32).to_le_bytes());
                out.extend_from_slice(plane);
            }
        }
    });
    out.extend_from_slice(&page[n * width..]);
    true
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
    with_scratch(|s| {
        let planes = &mut s.planes;
        planes.resize_with(width, Vec::new);
        let mut layout = Vec::with_capacity(width);
        for (p, plane) in planes[..width].iter_mut().enumerate() {
            let mode = cur.u8()?;
            let len = cur.u32()? as usize;
            let bytes = cur.take(len)?;
            match mode {
                STORED if len == n => layout.push(Plane::Stored(bytes)),
                STORED => return Err(DecodeError::Invalid("stored plane length")),
                HUFFMAN => {
                    plane.clear();
                    plane.resize(n, 0);
                    huffman::decode(bytes, plane.as_mut_slice())?;
                    layout.push(Plane::Decoded(p));
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
        let enc = encode(2, &page).unwrap();
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
        let enc = encode(2, &page).unwrap();
        let mut out = vec![0u8; page.len()];
        for cut in [0, 1, 5, enc.len() / 2, enc.len() - 1] {
            assert!(decode(&enc[..cut], &mut out).is_err(), "cut at {cut}");
        }
        let mut longer = enc.clone();
        longer.push(0);
        assert!(decode(&longer, &mut out).is_err());
        let mut wrong_len = vec![0u8; page.len() + 2];
        assert!(decode(&enc, &mut wrong_len).is_err());
        // Flip each byte of the stream's framing and of the Huffman plane: never a panic.
        for i in 0..enc.len().min(64) {
            let mut bad = enc.clone();
            bad[i] ^= 0x5a;
            let _ = decode(&bad, &mut out);
        }
    }
}
