//! The object layout of the remote tier (docs/remote-tier.md).
//!
//! A **run object** holds the stored bytes of consecutive blocks of one chain, back to
//! back in chain order, nothing between them. A block is stored as its payload (`B`
//! bytes, the layout's block size) or, where the tier's codec shrank it, as a frame of
//! the codec (`kvtier_codec::frame`, ADR 0021). An object always starts at the chain's
//! first block when its writer could get the ancestors' bytes, so the KV of any
//! block-aligned prefix is the one range `[0, end of block k)` — a hit is one GET with
//! one Range. With every block raw, block `i` is bytes `[i·B, (i+1)·B)`.
//!
//! Its **manifest** (`….kvm`, JSON) names the layout, the block size, the first block's
//! position, and for every block its hash, parent, tokens, extra-key tag, the CRC-32C of
//! its stored bytes and, for an encoded block, the codec and the frame's length. The
//! manifest is written after the data object and is the commit point: an object without
//! a manifest is invisible (a crashed writer's leftover), and a reader verifies every
//! block it serves against the manifest's checksum (and a frame's segments against the
//! checksums of the bytes they decode to). A manifest with an encoded block is version
//! 2; one whose blocks are all raw is version 1, exactly as before codecs existed.
//!
//! Names: `PREFIX/LAYOUT/FIRST-LAST.kvo` and `.kvm`, hashes in hex; in cluster mode the
//! writer is part of the name, `PREFIX/LAYOUT/FIRST-LAST.w.REPLICA.GENERATION.SEQ.kvo`, so
//! two replicas storing the same run never write the same key (one's garbage collection
//! cannot remove the other's fresh object). Objects are immutable: growing a run writes a
//! new, longer object under a new name.

use std::sync::Arc;

use std::ops::Range;

use kvtier_codec::Codec;
use kvtier_core::hash::BlockHash;
use kvtier_core::layout::LayoutDigest;
use kvtier_core::tier::BlockMeta;
use serde::{Deserialize, Serialize};

use kvtier_core::hash::unhex;

use crate::sign::{BLOCK_TAG_BYTES, SigningKey, constant_time_eq};

/// Manifest format version of an object whose every block is stored raw.
pub const MANIFEST_VERSION: u32 = 1;
/// Manifest format version of an object with at least one encoded block. A build that
/// reads only version 1 refuses such a manifest, so it never serves a frame as a payload.
pub const ENCODED_MANIFEST_VERSION: u32 = 2;

/// How a block is stored in its object when it is not its payload's own bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Encoded {
    /// The codec of the frame (never raw).
    pub codec: Codec,
    /// Bytes of the frame in the object (fewer than the block's).
    pub bytes: u64,
}

/// One block in a manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestBlock {
    /// Block hash, hex.
    pub hash: String,
    /// Parent hash, hex.
    pub parent: String,
    /// The block's tokens.
    pub tokens: Vec<u32>,
    /// Extra-key tag, hex, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra_tag: Option<String>,
    /// CRC-32C of the block's bytes as stored (its payload, or its frame).
    pub crc32c: u32,
    /// The stored bytes' tag under the cluster's signing key, hex (`crate::sign`), when
    /// the writer had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// How the block is stored when it is encoded (version 2 only); absent: raw.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoded: Option<Encoded>,
}

/// The manifest of a run object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`MANIFEST_VERSION`], or [`ENCODED_MANIFEST_VERSION`] when a block is encoded.
    pub version: u32,
    /// Layout digest, hex.
    pub layout: String,
    /// Bytes per block, decoded.
    pub block_bytes: u64,
    /// Chain position of the object's first block.
    pub first_position: u32,
    /// The blocks, in chain order.
    pub blocks: Vec<ManifestBlock>,
    /// The writer's tag in the object's name (cluster mode), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writer: Option<String>,
    /// The manifest's seal under the cluster's signing key, hex: the keyed hash of the
    /// manifest serialized without it ([`Manifest::sealed_tags`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seal: Option<String>,
}

/// A run object as the tier keeps it in memory.
#[derive(Debug)]
pub struct RunObject {
    /// Which target holds it (index into the tier's targets).
    pub target: usize,
    /// Object name of the data.
    pub data_name: String,
    /// The blocks, in order.
    pub metas: Vec<BlockMeta>,
    /// CRC-32C of each block's stored bytes.
    pub crcs: Vec<u32>,
    /// Each block's tag under the signing key (empty when the tier has none): with a key,
    /// a block is served only when its tag holds, the CRC alone being forgeable.
    pub tags: Vec<[u8; BLOCK_TAG_BYTES]>,
    /// Bytes per block, decoded.
    pub block_bytes: u64,
    /// Where each block's stored bytes are in the data object, and how they are stored.
    pub spans: Spans,
    /// `Some(SHA-256 of the manifest)` while the object is known from a cluster record
    /// only: `metas` then have no tokens and `crcs` and `spans` are empty until the
    /// manifest is read and checked against the record (before any byte of the object is
    /// served).
    pub pending: Option<[u8; 32]>,
}

/// Where the blocks of a run object are in its data object, and how each is stored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Spans {
    /// Block `i` is bytes `offsets[i]..offsets[i + 1]`; one more entry than blocks.
    offsets: Vec<u64>,
    /// Each block's encoding; empty when every block is raw.
    encoded: Vec<Option<Encoded>>,
}

impl Spans {
    /// `blocks` blocks of `block_bytes`, every one raw.
    pub fn raw(blocks: usize, block_bytes: u64) -> Self {
        Self {
            offsets: (0..=blocks as u64).map(|i| i * block_bytes).collect(),
            encoded: Vec::new(),
        }
    }

    /// Blocks of `block_bytes` decoded, stored as `encoded` says (`None`: raw), or `None`
    /// when an encoding is impossible (a raw codec, an empty frame, a frame not smaller
    /// than its block) or the object would be larger than a `u64` counts.
    pub fn of(encoded: Vec<Option<Encoded>>, block_bytes: u64) -> Option<Self> {
        let mut offsets = Vec::with_capacity(encoded.len() + 1);
        let mut at = 0u64;
        offsets.push(at);
        for e in &encoded {
            let len = match e {
                None => block_bytes,
                Some(e) if e.codec != Codec::Raw && e.bytes > 0 && e.bytes < block_bytes => e.bytes,
                Some(_) => return None,
            };
            at = at.checked_add(len)?;
            offsets.push(at);
        }
        let encoded = if encoded.iter().any(Option::is_some) {
            encoded
        } else {
            Vec::new()
        };
        Some(Self { offsets, encoded })
    }

    /// Bytes of the data object that hold blocks `blocks`.
    pub fn range(&self, blocks: Range<usize>) -> Range<u64> {
        self.offsets[blocks.start]..self.offsets[blocks.end]
    }

    /// How block `i` is stored: `None` for raw.
    pub fn encoded(&self, i: usize) -> Option<Encoded> {
        self.encoded.get(i).copied().flatten()
    }

    /// Whether any block is encoded.
    pub fn any_encoded(&self) -> bool {
        !self.encoded.is_empty()
    }
}

impl RunObject {
    /// How a catalog describes this object, stored under `manifest` whose SHA-256 is
    /// `manifest_digest`.
    pub fn info(&self, manifest: String, manifest_digest: [u8; 32]) -> crate::ObjectInfo {
        let first = self.metas.first();
        crate::ObjectInfo {
            name: crate::ObjectName {
                endpoint: self.target,
                manifest,
            },
            layout: first.map(|m| m.layout).unwrap_or_default(),
            first_position: first.map_or(0, |m| m.position),
            first_parent: first.map(|m| m.parent).unwrap_or_default(),
            blocks: self.metas.iter().map(|m| m.hash).collect(),
            block_bytes: self.block_bytes,
            manifest_digest,
        }
    }
}

fn to_hex(bytes: &[u8]) -> String {
    kvtier_core::hash::hex(bytes)
}

/// Whether `tag` may stand in an object name as a writer's tag: 1 to 120 characters of
/// `[a-z0-9._-]`, not starting or ending with a dot.
pub fn valid_writer_tag(tag: &str) -> bool {
    !tag.is_empty()
        && tag.len() <= 120
        && !tag.starts_with('.')
        && !tag.ends_with('.')
        && tag
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
}

/// The name stem of a run from `first` to `last` of `layout` under `prefix`, with its
/// writer's tag.
pub fn stem(
    prefix: &str,
    layout: &LayoutDigest,
    first: &BlockHash,
    last: &BlockHash,
    writer: Option<&str>,
) -> String {
    let mut stem = format!(
        "{prefix}/{}/{}-{}",
        layout.to_hex(),
        first.to_hex(),
        last.to_hex()
    );
    if let Some(w) = writer {
        stem.push_str(".w.");
        stem.push_str(w);
    }
    stem
}

/// Object names for a run of `metas` under `prefix`, written by `writer` (cluster mode) or
/// named by content alone: `(data, manifest)`.
pub fn names(prefix: &str, metas: &[BlockMeta], writer: Option<&str>) -> Option<(String, String)> {
    let (first, last) = (metas.first()?, metas.last()?);
    let stem = stem(prefix, &first.layout, &first.hash, &last.hash, writer);
    Some((format!("{stem}.kvo"), format!("{stem}.kvm")))
}

/// The manifest name of a data name, and back.
pub fn manifest_of(data_name: &str) -> Option<String> {
    data_name.strip_suffix(".kvo").map(|s| format!("{s}.kvm"))
}

/// The data name of a manifest name.
pub fn data_of(manifest_name: &str) -> Option<String> {
    manifest_name
        .strip_suffix(".kvm")
        .map(|s| format!("{s}.kvo"))
}

impl Manifest {
    /// The manifest of `metas` (consecutive, one chain) stored as `spans` says, with
    /// their checksums and, when the writer has a signing key, their tags (one per block,
    /// or none).
    pub fn of(
        metas: &[BlockMeta],
        crcs: &[u32],
        tags: &[[u8; BLOCK_TAG_BYTES]],
        block_bytes: u64,
        spans: &Spans,
        writer: Option<String>,
    ) -> Option<Self> {
        let first = metas.first()?;
        let version = if spans.any_encoded() {
            ENCODED_MANIFEST_VERSION
        } else {
            MANIFEST_VERSION
        };
        Some(Self {
            writer,
            seal: None,
            version,
            layout: first.layout.to_hex(),
            block_bytes,
            first_position: first.position,
            blocks: metas
                .iter()
                .zip(crcs)
                .enumerate()
                .map(|(i, (m, c))| ManifestBlock {
                    hash: m.hash.to_hex(),
                    parent: m.parent.to_hex(),
                    tokens: m.tokens.to_vec(),
                    extra_tag: m.extra_tag.map(|t| to_hex(&t)),
                    crc32c: *c,
                    tag: tags.get(i).map(|t| to_hex(t)),
                    encoded: spans.encoded(i),
                })
                .collect(),
        })
    }

    /// The manifest's bytes, sealed with `key` when there is one.
    pub fn to_bytes(mut self, key: Option<&SigningKey>) -> serde_json::Result<Vec<u8>> {
        self.seal = None;
        if let Some(key) = key {
            let unsealed = serde_json::to_vec(&self)?;
            self.seal = Some(to_hex(&key.manifest_seal(&unsealed)));
        }
        serde_json::to_vec(&self)
    }

    /// Every block's tag, if the manifest was sealed with `key` and every block carries
    /// a well-formed tag: what a tier with a key requires before it serves an object. The
    /// seal is checked over the manifest as this build serializes it, so a field this
    /// build does not know (which it would drop) makes the check fail: a miss, never a
    /// block served on fields unchecked.
    pub fn sealed_tags(&self, key: &SigningKey) -> Option<Vec<[u8; BLOCK_TAG_BYTES]>> {
        let seal = self.seal.as_deref().and_then(unhex::<32>)?;
        let unsealed = Self {
            seal: None,
            ..self.clone()
        };
        let bytes = serde_json::to_vec(&unsealed).ok()?;
        if !constant_time_eq(&key.manifest_seal(&bytes), &seal) {
            return None;
        }
        self.blocks
            .iter()
            .map(|b| b.tag.as_deref().and_then(unhex::<BLOCK_TAG_BYTES>))
            .collect()
    }

    /// Where its blocks are in the data object, or `None` when the encodings are not
    /// ones this version may have (version 1 has none) or cannot be (see [`Spans::of`]).
    pub fn spans(&self) -> Option<Spans> {
        let encoded: Vec<Option<Encoded>> = self.blocks.iter().map(|b| b.encoded).collect();
        let any = encoded.iter().any(Option::is_some);
        if any != (self.version == ENCODED_MANIFEST_VERSION) {
            return None;
        }
        Spans::of(encoded, self.block_bytes)
    }

    /// The blocks it describes, or `None` when anything is malformed: a wrong version, a
    /// bad hex field, or a chain whose parents do not link up. A manifest that fails here
    /// is ignored (its object is never served).
    pub fn metas(&self) -> Option<Vec<BlockMeta>> {
        let known = [MANIFEST_VERSION, ENCODED_MANIFEST_VERSION].contains(&self.version);
        if !known || self.blocks.is_empty() || self.block_bytes == 0 {
            return None;
        }
        let layout = LayoutDigest(unhex::<16>(&self.layout)?);
        let mut out: Vec<BlockMeta> = Vec::with_capacity(self.blocks.len());
        for (i, b) in self.blocks.iter().enumerate() {
            let hash = BlockHash(unhex::<16>(&b.hash)?);
            let parent = BlockHash(unhex::<16>(&b.parent)?);
            if let Some(prev) = out.last()
                && prev.hash != parent
            {
                return None;
            }
            let extra_tag = match &b.extra_tag {
                Some(t) => Some(unhex::<16>(t)?),
                None => None,
            };
            // The manifest must be self-consistent: each hash is the chain hash of its
            // parent, tokens and tag, and a first block hangs off the layout's root. A
            // block is then served only under the exact prefix it was computed for.
            if kvtier_core::hash::block_hash(parent, &b.tokens, extra_tag) != hash {
                return None;
            }
            let position = self.first_position.checked_add(i as u32)?;
            if position == 0 && parent.0 != layout.0 {
                return None;
            }
            out.push(BlockMeta {
                layout,
                hash,
                parent,
                position,
                tokens: Arc::from(b.tokens.as_slice()),
                extra_tag,
            });
        }
        Some(out)
    }
}

/// CRC-32C of a payload.
pub fn crc(bytes: &[u8]) -> u32 {
    crc_fast::crc32_iscsi(bytes)
}
