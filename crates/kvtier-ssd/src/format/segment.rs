//! The segment file header: the first 4 KiB of every `.seg` file.
//!
//! ```text
//! offset size field
//!      0    8 magic "KVTSEG\0\0"
//!      8    2 format version (1)
//!     10    2 reserved, zero
//!     12    4 reserved, zero
//!     16    8 segment id
//!     24    8 created, milliseconds since the Unix epoch
//!     32    4 CRC-32C of bytes 0..32
//!     36 4060 zero
//! ```

use super::{ALIGN, RAW_RECORD_VERSION, crc};

/// Bytes reserved for the segment header (records start after it).
pub const SEGMENT_HEADER_LEN: u64 = ALIGN;

const MAGIC: &[u8; 8] = b"KVTSEG\0\0";

/// A decoded segment header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentHeader {
    /// The segment's id (also its file name).
    pub id: u64,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_ms: u64,
}

impl SegmentHeader {
    /// The full 4 KiB header.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![0u8; SEGMENT_HEADER_LEN as usize];
        out[..8].copy_from_slice(MAGIC);
        out[8..10].copy_from_slice(&RAW_RECORD_VERSION.to_le_bytes());
        out[16..24].copy_from_slice(&self.id.to_le_bytes());
        out[24..32].copy_from_slice(&self.created_ms.to_le_bytes());
        let c = crc(&out[..32]);
        out[32..36].copy_from_slice(&c.to_le_bytes());
        out
    }

    /// Decodes and checks a header; `None` when it is not a valid version-1 header.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let b = bytes.get(..36)?;
        if &b[..8] != MAGIC || b[8..10] != RAW_RECORD_VERSION.to_le_bytes() {
            return None;
        }
        let stored = u32::from_le_bytes([b[32], b[33], b[34], b[35]]);
        if crc(&b[..32]) != stored {
            return None;
        }
        let u64_at = |o: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[o..o + 8]);
            u64::from_le_bytes(w)
        };
        Some(Self {
            id: u64_at(16),
            created_ms: u64_at(24),
        })
    }
}
