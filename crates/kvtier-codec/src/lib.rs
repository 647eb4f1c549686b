//! Cold-page codecs: how the persistent tiers (SSD, remote) may hold a page in fewer bytes
//! than the engine hands them, and get the same page back (ADR 0021).
//!
//! - [`Codec::Lossless`]: each `w`-byte element is split into `w` byte planes (all first
//!   bytes, then all second bytes, …), and each plane is coded on its own with a Huffman
//!   code of its statistics, sampled (`huffman.rs`). A bf16 value's high byte (sign and exponent)
//!   carries about 3 bits of entropy and its low byte nearly 8: coded apart, the high
//!   plane shrinks to well under half and the low plane is stored as it is, its
//!   sample having said a code would not pay. Exactly the bytes given come back.
//! - [`Codec::Fp8E4M3`]: lossy and opt-in. Each group of elements (one head of one token)
//!   is scaled so its largest magnitude is fp8's largest, and every element is rounded to
//!   fp8 e4m3; decoding multiplies back and rounds to the page's own dtype. Only ever used
//!   for a layout registered with it, so its pages are never served under a layout that
//!   expects exact bytes.
//!
//! Encoded streams describe themselves (element width, dtype, group size): decoding needs
//! only the codec, the stream and the decoded length, which the record or object that
//! holds the stream keeps beside it. A page that does not shrink is not encoded
//! ([`encode`] returns `None`) and is stored raw.
//!
//! Decoding never trusts the stream: every length is checked against the decoded length
//! before anything is written, so a damaged stream is an error, never a panic, an
//! over-long allocation or bytes outside the output.

pub mod coder;
pub mod fp8;
pub mod frame;
mod huffman;
pub mod lossless;
mod planes;
mod shares;

use std::fmt;
use std::str::FromStr;

pub use coder::{CodecConfig, Encoded, PageCoder, Resident};

/// How a stored page is encoded. The code is written into records and objects: never
/// reuse one for another meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Codec {
    /// The page's own bytes.
    #[cfg_attr(feature = "serde", serde(rename = "raw"))]
    Raw,
    /// Byte planes, each Huffman-coded or stored ([`lossless`]).
    #[cfg_attr(feature = "serde", serde(rename = "lossless"))]
    Lossless,
    /// fp8 e4m3 with one scale per group ([`fp8`]); lossy.
    #[cfg_attr(feature = "serde", serde(rename = "fp8_e4m3"))]
    Fp8E4M3,
}

impl Codec {
    /// Every codec, in code order.
    pub const ALL: [Codec; 3] = [Codec::Raw, Codec::Lossless, Codec::Fp8E4M3];

    /// The code stored on disk and in objects.
    pub fn code(self) -> u8 {
        match self {
            Codec::Raw => 0,
            Codec::Lossless => 1,
            Codec::Fp8E4M3 => 2,
        }
    }

    /// The codec stored as `code`, if this build knows it.
    pub fn from_code(code: u8) -> Option<Codec> {
        Codec::ALL.into_iter().find(|c| c.code() == code)
    }

    /// The name in settings, stats and docs: `raw`, `lossless`, `fp8_e4m3`.
    pub fn name(self) -> &'static str {
        match self {
            Codec::Raw => "raw",
            Codec::Lossless => "lossless",
            Codec::Fp8E4M3 => "fp8_e4m3",
        }
    }

    /// Whether decoding gives back exactly the bytes encoded.
    pub fn is_lossless(self) -> bool {
        !matches!(self, Codec::Fp8E4M3)
    }
}

impl fmt::Display for Codec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Codec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Codec::ALL
            .into_iter()
            .find(|c| c.name() == s)
            .ok_or_else(|| format!("`{s}` is not a codec: raw, lossless or fp8_e4m3"))
    }
}

/// The element type of a page, as far as a codec cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Element {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// bfloat16.
    Bf16,
    /// Anything else, taken as `width`-byte words (1 for opaque bytes: no plane split).
    Bytes {
        /// Bytes per word (1..=8).
        width: u8,
    },
}

impl Element {
    /// Bytes per element.
    pub fn width(self) -> usize {
        match self {
            Element::F32 => 4,
            Element::F16 | Element::Bf16 => 2,
            Element::Bytes { width } => usize::from(width.clamp(1, 8)),
        }
    }

    /// The code stored in fp8 streams.
    fn code(self) -> u8 {
        match self {
            Element::F32 => 1,
            Element::F16 => 2,
            Element::Bf16 => 3,
            Element::Bytes { .. } => 0,
        }
    }

    fn from_code(code: u8) -> Option<Element> {
        match code {
            1 => Some(Element::F32),
            2 => Some(Element::F16),
            3 => Some(Element::Bf16),
            _ => None,
        }
    }
}

/// What a codec knows of a page: its element type and, for scaled codecs, how many
/// consecutive elements share a scale (a KV page's head dimension).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shape {
    /// The page's element type.
    pub element: Element,
    /// Elements per scale group (fp8); at least 1.
    pub group: u32,
}

impl Shape {
    /// Opaque bytes: no plane split, no scale groups.
    pub const BYTES: Shape = Shape {
        element: Element::Bytes { width: 1 },
        group: 1,
    };
}

/// Why an encoded stream could not be decoded. A record or object whose stream fails to
/// decode is damaged: a miss, never served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// The record names a codec this build does not know.
    UnknownCodec(u8),
    /// The stream is shorter than its own lengths say, or longer.
    Truncated,
    /// A field is out of range, or the stream does not decode to exactly the expected
    /// length.
    Invalid(&'static str),
    /// A segment decoded to bytes other than the ones it was encoded from.
    Checksum,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::UnknownCodec(c) => write!(f, "unknown codec {c}"),
            DecodeError::Truncated => f.write_str("encoded stream truncated or over-long"),
            DecodeError::Invalid(what) => write!(f, "encoded stream invalid: {what}"),
            DecodeError::Checksum => f.write_str("a decoded segment fails its checksum"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// Encodes `page` with `codec`, or `None` when it should be stored raw: the codec is
/// [`Codec::Raw`], the encoding would not be smaller than the page, or the codec cannot
/// represent the page (fp8 of a page with a non-finite value, or of a non-float dtype).
pub fn encode(codec: Codec, shape: Shape, page: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    encode_into(codec, shape, page, &mut out).then_some(out)
}

/// [`encode`], appending the stream to `out`; `false`, and `out` as it was, where
/// [`encode`] says `None`.
pub fn encode_into(codec: Codec, shape: Shape, page: &[u8], out: &mut Vec<u8>) -> bool {
    let at = out.len();
    let encoded = match codec {
        Codec::Raw => false,
        Codec::Lossless => lossless::encode_into(shape.element.width(), page, out),
        Codec::Fp8E4M3 => fp8::encode(shape, page).is_some_and(|stream| {
            out.extend_from_slice(&stream);
            true
        }),
    };
    if encoded && out.len() - at < page.len() {
        return true;
    }
    out.truncate(at);
    false
}

/// Decodes `stream`, written by `codec`, into `out`, which must be exactly the decoded
/// length. `out` is fully written on success; on an error its contents are unspecified.
pub fn decode(codec: Codec, stream: &[u8], out: &mut [u8]) -> Result<(), DecodeError> {
    match codec {
        Codec::Raw => {
            if stream.len() != out.len() {
                return Err(DecodeError::Truncated);
            }
            out.copy_from_slice(stream);
            Ok(())
        }
        Codec::Lossless => lossless::decode(stream, out),
        Codec::Fp8E4M3 => fp8::decode(stream, out),
    }
}

/// A little-endian reader over a stream that fails instead of panicking.
struct Cursor<'a> {
    rest: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if n > self.rest.len() {
            return Err(DecodeError::Truncated);
        }
        let (now, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(now)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn finish(&self) -> Result<(), DecodeError> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::Truncated)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_codec_has_its_own_code_and_name_and_reads_back() {
        for c in Codec::ALL {
            assert_eq!(Codec::from_code(c.code()), Some(c));
            assert_eq!(c.name().parse::<Codec>(), Ok(c));
        }
        assert_eq!(Codec::from_code(3), None);
        assert!("zstd".parse::<Codec>().is_err());
    }

    #[test]
    fn a_raw_stream_must_be_exactly_the_decoded_length() {
        let mut out = [0u8; 4];
        assert!(decode(Codec::Raw, &[1, 2, 3, 4], &mut out).is_ok());
        assert_eq!(out, [1, 2, 3, 4]);
        assert_eq!(
            decode(Codec::Raw, &[1, 2, 3], &mut out),
            Err(DecodeError::Truncated)
        );
    }
}
