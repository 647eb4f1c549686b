//! The record: one block payload (or one snapshot) with everything needed to check it.
//!
//! ```text
//! offset  size  field (little-endian)
//!      0     4  magic "KVTR"
//!      4     2  record version: 1 raw payload, 2 encoded payload
//!      6     1  kind: 1 block, 2 snapshot, 3 gateway object
//!      7     1  flags: bit 0 = has extra-key tag
//!      8    16  layout digest
//!     24    32  key: block hash (16 bytes, then 16 zero bytes) or snapshot key (32 bytes)
//!     56    16  parent hash (zero for snapshots)
//!     72     4  position in the chain
//!     76     4  token count
//!     80    16  extra-key tag (zero when absent)
//!     96     8  payload length
//!    104     8  created, milliseconds since the Unix epoch
//!    112     1  log2 of the checksum chunk size
//!    113     1  version 2: codec code (kvtier-codec); version 1: zero
//!    114     2  zero
//!    116     8  version 2: decoded payload length; version 1: zero
//!    124     4  CRC-32C of bytes 0..124, then the tokens, then the chunk CRC table
//!    128     …  tokens (token count × u32)
//!      …     …  chunk CRC table: one CRC-32C per chunk of the payload (u32 each)
//!      …     …  zero padding to the next 4 KiB boundary
//!      …     …  payload
//!      …     …  zero padding to the next 4 KiB boundary (the next record)
//! ```
//!
//! The payload is checksummed in chunks so that a read of one layer's page verifies just
//! the chunks it touches; a whole-block read verifies them all.
//!
//! A version-2 record's payload is a kvtier-codec frame (ADR 0021): the chunk checksums
//! cover the encoded bytes as stored, and the frame's own table carries a checksum of
//! each decoded segment, so a page is checked both before and after decoding. Raw
//! payloads are still written as version 1, byte for byte as before codecs existed.

use kvtier_codec::Codec;
use kvtier_core::hash::BlockHash;
use kvtier_core::layout::LayoutDigest;

use super::{FORMAT_VERSION, RAW_RECORD_VERSION, align_up, crc_of};

/// Bytes of the fixed part of a record header.
pub const RECORD_HEADER_LEN: u64 = 128;

const MAGIC: &[u8; 4] = b"KVTR";

/// What a record holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A KV block.
    Block = 1,
    /// A recurrent-state snapshot.
    Snapshot = 2,
    /// An entry of `kvtier gateway` (an S3 object, a bucket, an upload part): its own
    /// description is at the end of the payload (see kvtier-gateway). The SSD tier skips
    /// these records.
    Object = 3,
}

/// A decoded record header (with the tokens and chunk checksums that follow it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordHeader {
    /// What the record holds.
    pub kind: Kind,
    /// The layout the payload was computed under.
    pub layout: LayoutDigest,
    /// Block hash (first 16 bytes, rest zero) or snapshot key.
    pub key: [u8; 32],
    /// Parent block hash (zero for snapshots).
    pub parent: BlockHash,
    /// Position in the chain (0 for snapshots).
    pub position: u32,
    /// The block's tokens (empty for snapshots, whose prompt is hashed into the key).
    pub tokens: Vec<u32>,
    /// Extra-key tag of the block, if any.
    pub extra_tag: Option<[u8; 16]>,
    /// Payload length in bytes.
    pub payload_len: u64,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_ms: u64,
    /// log2 of the checksum chunk size.
    pub chunk_log2: u8,
    /// CRC-32C of each chunk of the payload.
    pub chunk_crcs: Vec<u32>,
    /// How the payload is encoded; `None` for a raw payload (a version-1 record).
    pub encoding: Option<Encoding>,
}

/// An encoded payload: a kvtier-codec frame of a page of `decoded_len` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Encoding {
    /// The frame's codec (never raw).
    pub codec: Codec,
    /// Bytes the payload decodes to.
    pub decoded_len: u64,
}

/// Why a header could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// Fewer bytes than the header says it needs.
    Truncated,
    /// Not a record, or a record of a format this build does not read.
    BadMagicOrVersion,
    /// The header checksum does not match.
    Checksum,
    /// A field is out of range.
    Invalid(&'static str),
}

/// The CRC-32C of each `1 << chunk_log2`-byte chunk of `payload`.
pub fn chunk_crcs(payload: &[u8], chunk_log2: u8) -> Vec<u32> {
    payload
        .chunks(1usize << chunk_log2)
        .map(super::crc)
        .collect()
}

impl RecordHeader {
    /// Bytes of header, tokens and chunk table, before padding.
    pub fn meta_len(&self) -> u64 {
        RECORD_HEADER_LEN + 4 * self.tokens.len() as u64 + 4 * self.chunk_crcs.len() as u64
    }

    /// Offset of the payload from the start of the record.
    pub fn payload_offset(&self) -> u64 {
        align_up(self.meta_len())
    }

    /// Bytes the whole record occupies, padding included.
    pub fn record_len(&self) -> u64 {
        align_up(self.payload_offset() + self.payload_len)
    }

    /// Number of checksum chunks a payload of `len` bytes has.
    pub fn chunks_for(len: u64, chunk_log2: u8) -> u64 {
        len.div_ceil(1u64 << chunk_log2)
    }

    /// Bytes the payload decodes to: the payload length for a raw payload.
    pub fn decoded_len(&self) -> u64 {
        self.encoding.map_or(self.payload_len, |e| e.decoded_len)
    }

    /// The block hash stored in the key.
    pub fn block_hash(&self) -> BlockHash {
        let mut h = [0u8; 16];
        h.copy_from_slice(&self.key[..16]);
        BlockHash(h)
    }

    /// Encodes header, tokens and chunk table (without padding).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.meta_len() as usize);
        out.extend_from_slice(MAGIC);
        let version = match self.encoding {
            None => RAW_RECORD_VERSION,
            Some(_) => FORMAT_VERSION,
        };
        out.extend_from_slice(&version.to_le_bytes());
        out.push(self.kind as u8);
        out.push(u8::from(self.extra_tag.is_some()));
        out.extend_from_slice(&self.layout.0);
        out.extend_from_slice(&self.key);
        out.extend_from_slice(&self.parent.0);
        out.extend_from_slice(&self.position.to_le_bytes());
        out.extend_from_slice(&(self.tokens.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.extra_tag.unwrap_or([0; 16]));
        out.extend_from_slice(&self.payload_len.to_le_bytes());
        out.extend_from_slice(&self.created_ms.to_le_bytes());
        out.push(self.chunk_log2);
        match self.encoding {
            None => out.extend_from_slice(&[0u8; 11]),
            Some(e) => {
                out.push(e.codec.code());
                out.extend_from_slice(&[0u8; 2]);
                out.extend_from_slice(&e.decoded_len.to_le_bytes());
            }
        }
        debug_assert_eq!(out.len(), 124);
        let mut tail = Vec::with_capacity(4 * (self.tokens.len() + self.chunk_crcs.len()));
        for t in &self.tokens {
            tail.extend_from_slice(&t.to_le_bytes());
        }
        for c in &self.chunk_crcs {
            tail.extend_from_slice(&c.to_le_bytes());
        }
        let crc = crc_of(&[&out, &tail]);
        out.extend_from_slice(&crc.to_le_bytes());
        out.extend_from_slice(&tail);
        out
    }

    /// Decodes a header from the start of `bytes`, checking magic, version, ranges and the
    /// header checksum. `bytes` must hold at least [`RecordHeader::meta_len`] bytes.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let fixed = bytes
            .get(..RECORD_HEADER_LEN as usize)
            .ok_or(DecodeError::Truncated)?;
        let u16_at = |o: usize| u16::from_le_bytes([fixed[o], fixed[o + 1]]);
        let u32_at =
            |o: usize| u32::from_le_bytes([fixed[o], fixed[o + 1], fixed[o + 2], fixed[o + 3]]);
        let u64_at = |o: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&fixed[o..o + 8]);
            u64::from_le_bytes(b)
        };
        let arr16 = |o: usize| {
            let mut b = [0u8; 16];
            b.copy_from_slice(&fixed[o..o + 16]);
            b
        };
        let version = u16_at(4);
        if &fixed[..4] != MAGIC || !(RAW_RECORD_VERSION..=FORMAT_VERSION).contains(&version) {
            return Err(DecodeError::BadMagicOrVersion);
        }
        let encoding = if version == RAW_RECORD_VERSION {
            None
        } else {
            let codec = Codec::from_code(fixed[113])
                .filter(|c| *c != Codec::Raw)
                .ok_or(DecodeError::Invalid("codec"))?;
            let decoded_len = u64_at(116);
            if decoded_len == 0 || decoded_len > 1 << 31 {
                return Err(DecodeError::Invalid("decoded length"));
            }
            Some(Encoding { codec, decoded_len })
        };
        let kind = match fixed[6] {
            1 => Kind::Block,
            2 => Kind::Snapshot,
            3 => Kind::Object,
            _ => return Err(DecodeError::Invalid("kind")),
        };
        let token_count = u32_at(76) as u64;
        let payload_len = u64_at(96);
        let chunk_log2 = fixed[112];
        if !(9..=30).contains(&chunk_log2) {
            return Err(DecodeError::Invalid("chunk size"));
        }
        if token_count > 1 << 16 || payload_len > 1 << 31 {
            return Err(DecodeError::Invalid("token count or payload length"));
        }
        let chunks = Self::chunks_for(payload_len, chunk_log2);
        let tail_len = 4 * (token_count + chunks) as usize;
        let tail = bytes
            .get(RECORD_HEADER_LEN as usize..RECORD_HEADER_LEN as usize + tail_len)
            .ok_or(DecodeError::Truncated)?;
        let crc = crc_of(&[&fixed[..124], tail]);
        if crc != u32_at(124) {
            return Err(DecodeError::Checksum);
        }
        let word = |w: &[u8]| u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
        let (token_bytes, crc_bytes) = tail.split_at(4 * token_count as usize);
        let tokens: Vec<u32> = token_bytes.chunks_exact(4).map(word).collect();
        let chunk_crcs: Vec<u32> = crc_bytes.chunks_exact(4).map(word).collect();
        let mut key = [0u8; 32];
        key.copy_from_slice(&fixed[24..56]);
        Ok(Self {
            kind,
            layout: LayoutDigest(arr16(8)),
            key,
            parent: BlockHash(arr16(56)),
            position: u32_at(72),
            tokens,
            extra_tag: (fixed[7] & 1 == 1).then(|| arr16(80)),
            payload_len,
            created_ms: u64_at(104),
            chunk_log2,
            chunk_crcs,
            encoding,
        })
    }
}
