//! The network API's wire format (docs/API.md is the prose version).
//!
//! JSON carries requests and small answers. Block bytes never go through JSON: a load
//! answers with a framed binary stream, and a store or snapshot put sends a framed binary
//! body, both described here. All integers are little-endian.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

mod bounded;
pub use bounded::{Limit, ParseError, ParseLimits, parse_within};

/// Content type of a load response (block frames).
pub const BLOCKS_CONTENT_TYPE: &str = "application/vnd.kvtier.blocks";
/// Content type of a store or snapshot-put request (JSON head, then payload bytes).
pub const UPLOAD_CONTENT_TYPE: &str = "application/vnd.kvtier.upload";

/// How the request lines of bulk calls begin: stores (`/v1/store`, `/v1/store/raw`),
/// whose bodies are block bytes written behind the engine's work. The server serves a
/// connection whose first request is one of these on its bulk lane, at a lower CPU
/// priority, so that lookups never wait behind a store's copy (docs/adr/0017-the-edge.md);
/// the client keeps them on connections of their own, so that a lookup never rides a
/// bulk connection. Loads are not bulk: an engine waits for a load as it waits for a
/// lookup (the load is its prefill), so a load keeps the request threads' priority.
pub const BULK_REQUESTS: [&str; 1] = ["POST /v1/store"];

/// Whether a request whose head begins with `head` moves block bytes ([`BULK_REQUESTS`]).
pub fn is_bulk(head: &[u8]) -> bool {
    BULK_REQUESTS.iter().any(|r| head.starts_with(r.as_bytes()))
}

/// A layout key as JSON: everything that decides what a KV byte means.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayoutSpec {
    /// Model identifier.
    pub model_id: String,
    /// Weights revision or digest.
    #[serde(default)]
    pub weights_digest: String,
    /// Tokenizer digest.
    #[serde(default)]
    pub tokenizer_digest: String,
    /// `f32`, `f16`, `bf16`, `fp8_e4m3`, `fp8_e5m2` or `i8`.
    pub dtype: String,
    /// Tokens per block.
    pub tokens_per_block: u32,
    /// Layers held by this shard.
    pub num_layers: u32,
    /// KV heads held by this shard.
    pub num_kv_heads: u32,
    /// Elements per head.
    pub head_dim: u32,
    /// Tensor-parallel rank (default 0).
    #[serde(default)]
    pub tp_rank: u32,
    /// Tensor-parallel size (default 1).
    #[serde(default = "one")]
    pub tp_size: u32,
    /// Pipeline stage (default 0).
    #[serde(default)]
    pub pp_stage: u32,
    /// Pipeline stages (default 1).
    #[serde(default = "one")]
    pub pp_size: u32,
    /// LoRA adapter id.
    #[serde(default)]
    pub lora_id: Option<String>,
    /// Tenant salt, hex.
    #[serde(default)]
    pub tenant_salt: String,
    /// The recurrent layer groups of a hybrid or recurrent model (default none); with
    /// them `num_layers` counts the attention layers alone and may be 0.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub state_groups: Vec<StateGroupSpec>,
    /// Tokens between checkpoints of this layout's prompts (rounded up to whole blocks;
    /// default: the server's, 256). A setting, not part of the layout's identity: the
    /// last registration's value is in force.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_every: Option<u32>,
    /// A lossy encoding the SSD and remote tiers may hold the layout's pages in:
    /// `fp8_e4m3` (default none: exact bytes). Part of the layout's identity (ADR 0021).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cold_codec: Option<String>,
}

/// One group of recurrent layers of a [`LayoutSpec`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateGroupSpec {
    /// What the layers are and how their state is encoded, e.g. `mamba1/f32`.
    pub kind: String,
    /// Layers in the group.
    pub num_layers: u32,
    /// Bytes of the group's state at one token boundary.
    pub state_bytes: u64,
}

fn one() -> u32 {
    1
}

/// The answer to registering a layout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayoutInfo {
    /// The layout digest (hex), used by every other call.
    pub layout: String,
    /// Bytes of one block.
    pub block_bytes: u64,
    /// Tokens per block.
    pub tokens_per_block: u32,
    /// Layers per block.
    pub num_layers: u32,
    /// For a layout with state groups, the tokens between its checkpoint boundaries (a
    /// checkpoint put is accepted only after a multiple of this many tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_every: Option<u32>,
}

/// Extra keys of one block (e.g. digests of images its tokens stand for), hex.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BlockExtraKeys {
    /// Block index in the prompt.
    pub block: usize,
    /// The block's keys, in order, hex.
    pub keys: Vec<String>,
}

/// A token sequence under a layout: the request of lookup and the head of a store.
///
/// Tokens go either as a JSON array (`tokens`) or, cheaper to encode and parse, as
/// standard base64 of their little-endian `u32` bytes (`tokens_b64`); not both.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PromptSpec {
    /// Layout digest (hex).
    pub layout: String,
    /// Token ids.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "bounded::tokens"
    )]
    pub tokens: Vec<u32>,
    /// Token ids as base64 of little-endian `u32`s (instead of `tokens`).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "bounded::tokens_b64"
    )]
    pub tokens_b64: Option<String>,
    /// Per-block extra keys.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "bounded::per_block"
    )]
    pub extra_keys: Vec<BlockExtraKeys>,
}

impl PromptSpec {
    /// A prompt with its tokens as a JSON array.
    pub fn new(layout: impl Into<String>, tokens: Vec<u32>) -> Self {
        Self {
            layout: layout.into(),
            tokens,
            ..Self::default()
        }
    }

    /// The same prompt with its tokens in the compact base64 form.
    pub fn compact(&self) -> Self {
        let mut out = self.clone();
        if !out.tokens.is_empty() {
            out.tokens_b64 = Some(tokens_to_b64(&out.tokens));
            out.tokens = Vec::new();
        }
        out
    }

    /// The tokens, from whichever form was sent.
    pub fn token_ids(&self) -> Result<Cow<'_, [u32]>, String> {
        match (&self.tokens_b64, self.tokens.is_empty()) {
            (None, _) => Ok(Cow::Borrowed(&self.tokens)),
            (Some(b), true) => tokens_from_b64(b).map(Cow::Owned),
            (Some(_), false) => Err("give `tokens` or `tokens_b64`, not both".into()),
        }
    }
}

/// Base64 of little-endian `u32`s.
pub fn tokens_to_b64(tokens: &[u32]) -> String {
    use base64::Engine as _;
    let mut bytes = Vec::with_capacity(4 * tokens.len());
    tokens_to_le(tokens, &mut bytes);
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Appends `tokens` to `out` as little-endian bytes, in whole words (see
/// [`tokens_from_le`]).
pub fn tokens_to_le(tokens: &[u32], out: &mut Vec<u8>) {
    let start = out.len();
    out.resize(start + 4 * tokens.len(), 0);
    let (words, _) = out[start..].as_chunks_mut::<4>();
    for (w, t) in words.iter_mut().zip(tokens) {
        *w = t.to_le_bytes();
    }
}

/// Decodes [`tokens_to_b64`].
pub fn tokens_from_b64(b: &str) -> Result<Vec<u32>, String> {
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b)
        .map_err(|e| format!("tokens_b64 is not base64: {e}"))?;
    if !bytes.len().is_multiple_of(4) {
        return Err(format!(
            "tokens_b64 holds {} bytes, not whole u32s",
            bytes.len()
        ));
    }
    Ok(tokens_from_le(&bytes))
}

/// Tokens from their little-endian bytes (a binary lookup's form, and `tokens_b64`'s
/// once decoded); a trailing part of a word is ignored, so callers check the length first. Fixed-size
/// chunks let the compiler copy the words in vector registers: a lookup of 2,048 tokens
/// spent 5% of the server's time here when each word was gathered from a slice.
pub fn tokens_from_le(bytes: &[u8]) -> Vec<u32> {
    let (words, _) = bytes.as_chunks::<4>();
    words.iter().map(|w| u32::from_le_bytes(*w)).collect()
}

/// Digits of one block handle in [`LookupAnswer::handles`].
pub const HANDLE_HEX_LEN: usize = 32;

/// The answer to a lookup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LookupAnswer {
    /// Tokens covered by the matched blocks.
    pub matched_tokens: usize,
    /// Handles of the matched leading blocks, in order: 32 hex digits per block,
    /// concatenated (one string, cheap to produce, parse and pass back to load; its
    /// first `32·k` digits name the first `k` blocks).
    pub handles: String,
    /// The fastest tier holding each block at lookup time, one letter per block:
    /// `r` RAM, `s` SSD, `o` object storage.
    pub tiers: String,
    /// For a layout with state groups, the checkpoint of the recurrent state at the end
    /// of the matched blocks (`matched_tokens` is then its boundary). Absent otherwise,
    /// and a layout with state groups without it is a miss.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<StateHit>,
}

/// A batch (`POST /v1/lookup/batch`, the JSON body; `POST /v1/store/batch`, the upload's
/// head, followed by every whole block of each prompt, prompt after prompt): many short
/// prompts of one layout in one request, as SGLang's pages are (each page a prompt of its
/// own).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchSpec {
    /// Layout digest (hex).
    pub layout: String,
    /// Each prompt's tokens as base64 of little-endian `u32`s ([`tokens_to_b64`]).
    #[serde(deserialize_with = "bounded::batch_prompts")]
    pub prompts: Vec<String>,
}

/// The answers to a batch of lookups, in the prompts' order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchLookupAnswer {
    /// One lookup's answer per prompt.
    pub hits: Vec<LookupAnswer>,
}

/// The answers to a batch of stores, in the prompts' order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchStoreAnswer {
    /// One store's answer per prompt.
    pub answers: Vec<StoreAnswer>,
}

/// Most prompts one batch may carry.
pub const MAX_BATCH_PROMPTS: usize = 4096;

/// The recurrent state a hybrid lookup found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateHit {
    /// Whole blocks of the prompt the state was reached after.
    pub blocks: usize,
    /// The fastest tier holding it: `r` RAM, `s` SSD, `o` object storage.
    pub tier: String,
}

/// The head of a checkpoint put (the state's bytes follow it): the prompt, and after how
/// many of its whole blocks the state was taken (a checkpoint boundary of its layout).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointSpec {
    /// Layout digest (hex).
    pub layout: String,
    /// The prompt's tokens (at least `blocks` whole blocks of them).
    #[serde(deserialize_with = "bounded::tokens")]
    pub tokens: Vec<u32>,
    /// Per-block extra keys.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "bounded::per_block"
    )]
    pub extra_keys: Vec<BlockExtraKeys>,
    /// Whole blocks of the prompt the state was reached after.
    pub blocks: usize,
}

/// The JSON head of a restore answer; `blocks · block_bytes` bytes of KV blocks, in order,
/// then `state_bytes` bytes of recurrent state follow it. All or nothing: `tokens` is 0
/// and nothing follows when any part could not be read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestoreHead {
    /// Prompt tokens the restored parts carry.
    pub tokens: usize,
    /// KV blocks that follow.
    pub blocks: usize,
    /// Bytes per block.
    pub block_bytes: u64,
    /// Bytes of state after the blocks (0 for an attention-only layout).
    pub state_bytes: u64,
}

impl LookupAnswer {
    /// Blocks matched.
    pub fn blocks(&self) -> usize {
        self.handles.len() / HANDLE_HEX_LEN
    }
}

/// A load request: handles from a lookup, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadRequest {
    /// Layout digest (hex).
    pub layout: String,
    /// Block handles as a lookup returned them (32 hex digits per block, concatenated),
    /// or a prefix of them.
    pub handles: String,
    /// Only these layers `[start, end)` of every block.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layers: Option<[u32; 2]>,
    /// The handles are this many chains, of these many blocks each, every one from the
    /// layout's root (the blocks of many short prompts, as SGLang's pages are, in one
    /// load); the blocks come back for the leading chains found whole. Absent: one chain.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "bounded::per_block_opt"
    )]
    pub chains: Option<Vec<u32>>,
}

/// The answer to a store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreAnswer {
    /// Blocks newly kept.
    pub stored: usize,
    /// Blocks already held.
    pub duplicates: usize,
    /// Blocks kept only below RAM.
    pub stored_lower_only: usize,
    /// Why the store stopped early, if it did (`no_space`, `parent_missing`, ...).
    pub stopped: Option<String>,
    /// What the kept blocks survive now: `queued`, `written` (a kill) or `synced` (a power
    /// loss). Absent from servers before issue 12: read as `queued`.
    #[serde(default = "queued")]
    pub durability: String,
}

fn queued() -> String {
    "queued".into()
}

/// The head of a snapshot put, or the request of a snapshot get.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotSpec {
    /// Layout digest (hex).
    pub layout: String,
    /// The exact token prefix the state was reached after.
    #[serde(deserialize_with = "bounded::tokens")]
    pub tokens: Vec<u32>,
    /// Optional session key, hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
}

/// An error answer: `{"error": {"code": ..., "message": ...}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// What went wrong.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// A stable machine-readable code (`bad_json`, `unknown_layout`, ...).
    pub code: String,
    /// What was wrong, for people.
    pub message: String,
}

/// `GET /health`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    /// `ok`.
    pub status: String,
    /// Tiers attached now (`ram`, `ssd`).
    pub tiers: Vec<String>,
    /// How the previous run ended: true after a clean shutdown, false after a partial
    /// flush, null after a crash or on first start.
    pub previous_shutdown_clean: Option<bool>,
    /// SSD writes that failed (I/O error, a full disk) or were refused for lack of space
    /// (capacity, the free-space watermark) since the start: a server on a full disk keeps
    /// serving and counts here. Absent from servers before issue 12.
    #[serde(default)]
    pub ssd_write_failures: u64,
}

/// `GET /readyz`: 200 when `ready`, 503 otherwise.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Readiness {
    /// Every check holds.
    pub ready: bool,
    /// Each check this node is configured for: `ssd` and `remote` (the tier is attached),
    /// `cluster` (registered and past its first replay).
    pub checks: std::collections::BTreeMap<String, bool>,
}

/// `POST /admin/ssd`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SsdAdmin {
    /// `enable` (attach with the settings given, or the current ones), `disable`
    /// (detach, stay detached), `reconfigure` (detach and reattach with changes).
    pub action: String,
    /// New store directory (the old one is left as it is: its blocks are not copied).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<String>,
    /// New capacity, e.g. `64GiB`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<String>,
    /// `write_through` or `evict_only`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// `queued`, `written` or `synced` (the names before issue 12, `best_effort`,
    /// `persistent` and `fsync`, are accepted as aliases).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub durability: Option<String>,
    /// New TTL, e.g. `7d`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<String>,
}

/// The answer to `POST /admin/ssd`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SsdAdminAnswer {
    /// The old tier's writer wrote everything queued in time.
    pub drained_clean: bool,
    /// Blocks still queued when the drain deadline passed.
    pub left_in_queue: u64,
    /// Blocks the index stopped attributing to the old tier.
    pub detached_blocks: u64,
    /// A tier is attached now.
    pub attached: bool,
    /// Blocks the new tier held when opened.
    pub attached_blocks: u64,
    /// The SSD settings now in force (null when detached).
    pub ssd: Option<serde_json::Value>,
}

/// The answer to `POST /admin/flush`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlushAnswer {
    /// Every queue emptied, every tier synced, and every block and snapshot queued since
    /// the previous flush reached its tier: everything acknowledged survives a power loss.
    pub drained: bool,
    /// Blocks and snapshots queued since the previous flush that were not written (a
    /// failed write, a refusal such as a full disk, a full queue's drop), over every tier.
    pub unwritten: u64,
    /// The same per tier below RAM, by tier name (`ssd`, `remote`).
    pub tiers: std::collections::BTreeMap<String, TierFlushAnswer>,
}

/// How one tier's flush went (see [`FlushAnswer`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TierFlushAnswer {
    /// Its queue emptied before the deadline.
    pub drained: bool,
    /// Its sync succeeded.
    pub synced: bool,
    /// Blocks and snapshots queued since the previous flush that did not reach it.
    pub unwritten: u64,
}

/// Binary framing of load responses and upload requests.
pub mod frame {
    /// First bytes of a load response.
    pub const STREAM_MAGIC: [u8; 4] = *b"KVTL";
    /// First bytes of an upload body.
    pub const UPLOAD_MAGIC: [u8; 4] = *b"KVTU";
    /// Version of both framings.
    pub const VERSION: u16 = 1;
    /// Bytes of the stream header and of every frame header.
    pub const HEADER_LEN: usize = 32;
    /// Frame tag: one block's bytes follow.
    pub const TAG_BLOCK: u8 = 1;
    /// Frame tag: the end of the stream.
    pub const TAG_END: u8 = 2;

    /// How a load stream ended.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    #[repr(u32)]
    pub enum EndStatus {
        /// Every requested block was sent.
        Complete = 0,
        /// The block after the last one sent is no longer held (evicted since the
        /// lookup, or its handle did not resolve): recompute from there.
        Lost = 1,
        /// The server failed reading the block after the last one sent.
        Failed = 2,
    }

    impl EndStatus {
        /// From its wire value.
        pub fn from_u32(v: u32) -> Option<Self> {
            match v {
                0 => Some(Self::Complete),
                1 => Some(Self::Lost),
                2 => Some(Self::Failed),
                _ => None,
            }
        }
    }

    /// The stream header: magic, version, blocks requested.
    pub fn stream_header(requested: u32) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[..4].copy_from_slice(&STREAM_MAGIC);
        h[4..6].copy_from_slice(&VERSION.to_le_bytes());
        h[8..12].copy_from_slice(&requested.to_le_bytes());
        h
    }

    /// A block frame header: tag, block index, byte length, block hash.
    pub fn block_header(index: u32, len: u64, hash: &[u8; 16]) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[0] = TAG_BLOCK;
        h[4..8].copy_from_slice(&index.to_le_bytes());
        h[8..16].copy_from_slice(&len.to_le_bytes());
        h[16..32].copy_from_slice(hash);
        h
    }

    /// The end frame: tag, blocks sent, status.
    pub fn end_frame(sent: u32, status: EndStatus) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[0] = TAG_END;
        h[4..8].copy_from_slice(&sent.to_le_bytes());
        h[8..12].copy_from_slice(&(status as u32).to_le_bytes());
        h
    }

    /// The head of an upload body: magic, version, then the JSON head's length; the
    /// JSON head and the payload bytes follow.
    pub fn upload_head(json_len: u32) -> [u8; 12] {
        let mut h = [0u8; 12];
        h[..4].copy_from_slice(&UPLOAD_MAGIC);
        h[4..6].copy_from_slice(&VERSION.to_le_bytes());
        h[8..12].copy_from_slice(&json_len.to_le_bytes());
        h
    }

    /// The length of the JSON head announced by an upload's first 12 bytes (which
    /// `body` must start with): the magic and the framing version are checked first. A
    /// reader that streams an upload needs this before the rest has arrived.
    pub fn upload_json_len(body: &[u8]) -> Result<usize, String> {
        if body.len() < 12 || body[..4] != UPLOAD_MAGIC {
            return Err("upload body does not start with the KVTU magic".into());
        }
        let version = u16::from_le_bytes([body[4], body[5]]);
        if version != VERSION {
            return Err(format!(
                "upload framing version {version} (this server speaks {VERSION})"
            ));
        }
        Ok(u32_at(body, 8) as usize)
    }

    fn u32_at(b: &[u8], at: usize) -> u32 {
        let mut w = [0u8; 4];
        w.copy_from_slice(&b[at..at + 4]);
        u32::from_le_bytes(w)
    }

    fn u64_at(b: &[u8], at: usize) -> u64 {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[at..at + 8]);
        u64::from_le_bytes(w)
    }

    /// Splits an upload body into its JSON head and its payload bytes.
    pub fn split_upload(body: &[u8]) -> Result<(&[u8], &[u8]), String> {
        let json_len = upload_json_len(body)?;
        let rest = &body[12..];
        if json_len > rest.len() {
            return Err(format!(
                "upload head says {json_len} bytes of JSON but only {} bytes follow",
                rest.len()
            ));
        }
        Ok(rest.split_at(json_len))
    }

    /// A decoded frame header.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Frame {
        /// A block of `len` bytes follows.
        Block {
            /// Block index in the request.
            index: u32,
            /// Bytes that follow.
            len: u64,
            /// Its hash.
            hash: [u8; 16],
        },
        /// The stream ends.
        End {
            /// Blocks sent.
            sent: u32,
            /// Why it ended.
            status: EndStatus,
        },
    }

    /// Decodes the stream header; returns the number of blocks requested.
    pub fn parse_stream_header(h: &[u8; HEADER_LEN]) -> Result<u32, String> {
        if h[..4] != STREAM_MAGIC {
            return Err("load stream does not start with the KVTL magic".into());
        }
        let version = u16::from_le_bytes([h[4], h[5]]);
        if version != VERSION {
            return Err(format!("load stream framing version {version}"));
        }
        Ok(u32_at(h, 8))
    }

    /// Decodes a frame header.
    pub fn parse_frame(h: &[u8; HEADER_LEN]) -> Result<Frame, String> {
        match h[0] {
            TAG_BLOCK => {
                let mut hash = [0u8; 16];
                hash.copy_from_slice(&h[16..32]);
                Ok(Frame::Block {
                    index: u32_at(h, 4),
                    len: u64_at(h, 8),
                    hash,
                })
            }
            TAG_END => {
                let status = EndStatus::from_u32(u32_at(h, 8))
                    .ok_or_else(|| format!("unknown end status {}", u32_at(h, 8)))?;
                Ok(Frame::End {
                    sent: u32_at(h, 4),
                    status,
                })
            }
            t => Err(format!("unknown frame tag {t}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_travel_as_little_endian_words() {
        let tokens = [1u32, 0x0102_0304, u32::MAX];
        let mut bytes = vec![9u8]; // appended after what is there
        tokens_to_le(&tokens, &mut bytes);
        assert_eq!(bytes, [9, 1, 0, 0, 0, 4, 3, 2, 1, 255, 255, 255, 255]);
        assert_eq!(tokens_from_le(&bytes[1..]), tokens);
        assert_eq!(tokens_from_b64(&tokens_to_b64(&tokens)).unwrap(), tokens);
    }
}
