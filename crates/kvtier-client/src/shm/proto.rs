//! The shared arena's protocol over its Unix socket (docs/adr/0019-shared-arena.md).
//!
//! Every message, either way, is one frame: a `u32` length (little-endian, the bytes after
//! it), a one-byte op (a request) or status (an answer: 0 ok, 1 error), a `u32` head length,
//! a JSON head, and a binary tail. Heads are the small typed parts; tails carry what a
//! load or store has per block (handles, slot entries) so that a 1 GiB prompt's 512 blocks
//! cost no JSON. The only answer with file descriptors attached is `Hello`'s (the arena's
//! memory file, then the client's staging memory file).

use std::io::{Read, Write};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::wire::{ErrorDetail, PromptSpec};

/// The protocol version a client and server speak.
pub const VERSION: u32 = 1;

/// The largest frame either side accepts (a head and tail of a long prompt fit easily).
pub const MAX_FRAME: usize = 64 << 20;

/// What a request asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Op {
    /// The arena and this client's staging memory (answered with two descriptors).
    Hello = 1,
    /// Lease the blocks named by lookup handles: where each lies in the arena.
    Load = 2,
    /// End a lease.
    Release = 3,
    /// Reserve room for a store: where in staging memory to write each block.
    Reserve = 4,
    /// Copy a reservation's blocks from staging memory into the arena and keep them.
    Commit = 5,
    /// Give a reservation's room back without storing.
    Cancel = 6,
}

impl Op {
    /// The op of a request byte, if it names one.
    pub fn from_byte(b: u8) -> Option<Self> {
        Some(match b {
            1 => Self::Hello,
            2 => Self::Load,
            3 => Self::Release,
            4 => Self::Reserve,
            5 => Self::Commit,
            6 => Self::Cancel,
            _ => return None,
        })
    }
}

/// `Hello`'s head.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// The protocol version.
    pub version: u32,
}

/// `Hello`'s answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Welcome {
    /// The protocol version the server speaks.
    pub version: u32,
    /// Bytes of the arena's memory file (map all of it, read-only).
    pub arena_bytes: u64,
    /// Bytes of this client's staging memory file (map all of it, read-write).
    pub staging_bytes: u64,
    /// Bytes of blocks this client may hold leased at once.
    pub max_leased: u64,
}

/// `Load`'s head; its tail is the blocks' handles, 16 bytes each, from block 0 on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoadHead {
    /// Layout digest (hex).
    pub layout: String,
}

/// `Load`'s answer head; its tail is one [`Slot`] per leased block, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Leased {
    /// The lease, to release.
    pub lease: u64,
    /// Whether every named block is leased (false: those after the last one were evicted
    /// since the lookup, or did not fit in this client's lease budget).
    pub complete: bool,
}

/// `Release`'s head (and `Cancel`'s, with the reservation's id).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Id {
    /// A lease or reservation.
    pub id: u64,
}

/// `Reserve`'s head.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReserveHead {
    /// The prompt to store blocks of.
    pub prompt: PromptSpec,
    /// The prompt's block the first reserved block is (default 0; block `first_block - 1`
    /// must be held already: a long prompt is stored in pieces).
    #[serde(default)]
    pub first_block: u32,
    /// Blocks to store, from `first_block` on.
    pub blocks: u32,
}

/// `Reserve`'s answer head; its tail is one `u64` staging offset per block.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reserved {
    /// The reservation, to commit or cancel.
    pub reservation: u64,
    /// Bytes of each block.
    pub block_bytes: u64,
    /// Milliseconds until an uncommitted reservation is freed.
    pub ttl_ms: u64,
}

/// `Commit`'s head; its tail is one [`Slot`] per block (staging offset, length, CRC32C of
/// the payload written there), in reservation order. A reservation may be committed in
/// parts, in order: each part's blocks are stored when it is committed, so a client can
/// write the next part while the server copies this one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitHead {
    /// The reservation.
    pub reservation: u64,
    /// The reservation's block this part starts at (default 0: the whole reservation, or
    /// its first part); it must be the first block not committed yet.
    #[serde(default)]
    pub first: u32,
    /// `queued`, `written` or `synced` (default: the server's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub durability: Option<String>,
}

/// A block's place: in the arena (loads) or in staging memory (commits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    /// Offset from the start of the memory file.
    pub offset: u64,
    /// Bytes.
    pub len: u64,
    /// CRC32C of the bytes.
    pub crc: u32,
}

impl Slot {
    /// Encoded size in a tail.
    pub const BYTES: usize = 24;

    /// Appends the slot to a tail.
    pub fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
        out.extend_from_slice(&self.crc.to_le_bytes());
        out.extend_from_slice(&[0; 4]);
    }

    /// The slots of a tail, or `None` when it is not whole slots.
    pub fn parse_all(tail: &[u8]) -> Option<Vec<Slot>> {
        if !tail.len().is_multiple_of(Self::BYTES) {
            return None;
        }
        Some(
            tail.chunks_exact(Self::BYTES)
                .map(|c| Slot {
                    offset: u64_at(c, 0),
                    len: u64_at(c, 8),
                    crc: u32::from_le_bytes([c[16], c[17], c[18], c[19]]),
                })
                .collect(),
        )
    }
}

/// The `u64`s of a tail, or `None` when it is not whole `u64`s.
pub fn parse_u64s(tail: &[u8]) -> Option<Vec<u64>> {
    tail.len()
        .is_multiple_of(8)
        .then(|| tail.chunks_exact(8).map(|c| u64_at(c, 0)).collect())
}

fn u64_at(c: &[u8], at: usize) -> u64 {
    let mut b = [0; 8];
    b.copy_from_slice(&c[at..at + 8]);
    u64::from_le_bytes(b)
}

/// One frame, read.
#[derive(Debug)]
pub struct Frame {
    /// The op (a request) or status (an answer) byte.
    pub kind: u8,
    /// The JSON head.
    pub head: Vec<u8>,
    /// The binary tail.
    pub tail: Vec<u8>,
}

impl Frame {
    /// The head as `T`.
    pub fn head<T: DeserializeOwned>(&self) -> Result<T, ErrorDetail> {
        serde_json::from_slice(&self.head).map_err(|e| ErrorDetail {
            code: "bad_head".into(),
            message: format!("the message's head is not what its op needs: {e}"),
        })
    }

    /// The head of a request as `T`, its prompt's tokens counted as they are parsed (see
    /// [`crate::wire::parse_within`]).
    pub fn head_within<T: DeserializeOwned>(
        &self,
        limits: crate::wire::ParseLimits,
    ) -> Result<T, ErrorDetail> {
        crate::wire::parse_within(&self.head, limits).map_err(|e| match e {
            crate::wire::ParseError::Malformed(e) => ErrorDetail {
                code: "bad_head".into(),
                message: format!("the message's head is not what its op needs: {e}"),
            },
            crate::wire::ParseError::OverLimit { message, .. } => ErrorDetail {
                code: kvtier_core::ErrorKind::Invalid.name().into(),
                message,
            },
        })
    }
}

/// Status byte of an answer.
pub const OK: u8 = 0;
/// Status byte of an error answer (its head is an [`ErrorDetail`]).
pub const ERROR: u8 = 1;

/// The bytes of a frame.
pub fn encode(kind: u8, head: &impl Serialize, tail: &[u8]) -> Vec<u8> {
    let head = serde_json::to_vec(head).unwrap_or_else(|_| b"{}".to_vec());
    encode_raw(kind, &head, tail)
}

/// The bytes of a frame whose head is JSON already.
pub fn encode_raw(kind: u8, head: &[u8], tail: &[u8]) -> Vec<u8> {
    let len = 1 + 4 + head.len() + tail.len();
    let mut out = Vec::with_capacity(4 + len);
    out.extend_from_slice(&(len as u32).to_le_bytes());
    out.push(kind);
    out.extend_from_slice(&(head.len() as u32).to_le_bytes());
    out.extend_from_slice(head);
    out.extend_from_slice(tail);
    out
}

/// Writes a frame.
pub fn write(
    to: &mut impl Write,
    kind: u8,
    head: &impl Serialize,
    tail: &[u8],
) -> std::io::Result<()> {
    to.write_all(&encode(kind, head, tail))
}

/// Reads a frame: `Ok(None)` at a clean end of the stream (before a frame's first byte).
pub fn read(from: &mut impl Read) -> std::io::Result<Option<Frame>> {
    let mut len = [0u8; 4];
    match from.read(&mut len[..1])? {
        0 => return Ok(None),
        _ => from.read_exact(&mut len[1..])?,
    }
    let len = u32::from_le_bytes(len) as usize;
    let bad = |what: String| std::io::Error::new(std::io::ErrorKind::InvalidData, what);
    if !(5..=MAX_FRAME).contains(&len) {
        return Err(bad(format!("a frame of {len} bytes (5 to {MAX_FRAME})")));
    }
    let mut body = vec![0; len];
    from.read_exact(&mut body)?;
    let head_len = u32::from_le_bytes([body[1], body[2], body[3], body[4]]) as usize;
    if head_len > len - 5 {
        return Err(bad(format!(
            "a head of {head_len} bytes in a frame of {len}"
        )));
    }
    let tail = body.split_off(5 + head_len);
    let head = body[5..].to_vec();
    Ok(Some(Frame {
        kind: body[0],
        head,
        tail,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_and_slots_round_trip_and_bad_lengths_are_refused() {
        let slots = [
            Slot {
                offset: 1 << 40,
                len: 2 << 20,
                crc: 0xfeed_f00d,
            },
            Slot {
                offset: 4096,
                len: 1,
                crc: 7,
            },
        ];
        let mut tail = Vec::new();
        slots.iter().for_each(|s| s.put(&mut tail));
        let bytes = encode(
            Op::Load as u8,
            &LoadHead {
                layout: "ab".into(),
            },
            &tail,
        );
        let frame = read(&mut &bytes[..]).unwrap().unwrap();
        assert_eq!(Op::from_byte(frame.kind), Some(Op::Load));
        assert_eq!(frame.head::<LoadHead>().unwrap().layout, "ab");
        assert_eq!(Slot::parse_all(&frame.tail).unwrap(), slots);
        assert!(Slot::parse_all(&frame.tail[1..]).is_none());
        assert!(read(&mut &b""[..]).unwrap().is_none());
        let mut huge = (MAX_FRAME as u32 + 1).to_le_bytes().to_vec();
        huge.extend_from_slice(&[0; 16]);
        assert!(read(&mut &huge[..]).is_err());
        let mut lying = encode(Op::Hello as u8, &Hello { version: 1 }, b"");
        lying[5..9].copy_from_slice(&1000u32.to_le_bytes());
        assert!(read(&mut &lying[..]).is_err());
        assert!(frame.head::<Hello>().is_err(), "a head of another op");
    }
}
