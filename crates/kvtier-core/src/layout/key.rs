//! [`LayoutKey`], its validation, canonical encoding and digest.

use std::fmt;

use sha2::{Digest, Sha256};

use super::{BlockGeometry, ColdCodec, KvDtype};
use crate::error::{Error, Result};

/// Version of the canonical [`LayoutKey`] encoding. Bump it whenever the encoding or the
/// meaning of a field changes: every digest changes with it, so no old block is reused.
pub const LAYOUT_SCHEMA_VERSION: u16 = 1;

/// The largest block payload a layout may describe (1 GiB).
pub const MAX_BLOCK_BYTES: u64 = 1 << 30;

/// Longest accepted identity string (model id, digests, LoRA id) and tenant salt, in bytes.
const MAX_STRING_BYTES: usize = 1024;

/// Most recurrent-state groups a layout may name.
const MAX_STATE_GROUPS: usize = 64;

/// Largest accepted tokens-per-block.
const MAX_TOKENS_PER_BLOCK: u32 = 1 << 16;

const MAGIC: &[u8; 4] = b"KVTL";

/// Everything that decides what a KV byte means.
///
/// Fields describe the shard of the model that produced the bytes: with tensor parallelism,
/// `num_kv_heads` is the number of KV heads held by rank `tp_rank`; with pipeline
/// parallelism, `num_layers` is the number of layers in stage `pp_stage`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LayoutKey {
    /// Model identifier, e.g. `google/gemma-3-270m`.
    pub model_id: String,
    /// Weights revision or content digest. Different weights give different KV.
    pub weights_digest: String,
    /// Tokenizer digest. Different tokenizers give different token ids for the same text.
    pub tokenizer_digest: String,
    /// Element encoding of K and V.
    pub dtype: KvDtype,
    /// Tokens in one block. Only whole blocks are cached.
    pub tokens_per_block: u32,
    /// Layers held by this shard.
    pub num_layers: u32,
    /// KV heads held by this shard.
    pub num_kv_heads: u32,
    /// Elements per head.
    pub head_dim: u32,
    /// Tensor-parallel rank of this shard (`< tp_size`).
    pub tp_rank: u32,
    /// Tensor-parallel world size (default 1).
    pub tp_size: u32,
    /// Pipeline stage of this shard (`< pp_size`).
    pub pp_stage: u32,
    /// Pipeline stages (default 1).
    pub pp_size: u32,
    /// LoRA adapter id, if one is applied (default none).
    pub lora_id: Option<String>,
    /// Tenant salt: tenants with different salts never share blocks (default empty).
    pub tenant_salt: Vec<u8>,
    /// The recurrent layers of a hybrid or recurrent model, one entry per group, in layer
    /// order (default none: an attention-only model). A layout with state groups is served
    /// only at boundaries where their state is stored too (see `docs/hybrid.md`); its
    /// `num_layers` counts the attention layers alone and may then be 0.
    pub state_groups: Vec<StateGroup>,
    /// A lossy encoding the cold tiers may hold this layout's pages in (default none:
    /// every tier gives back exactly the bytes stored). With fp8, a hit served from the
    /// SSD or the bucket carries values within fp8's precision of the stored ones; the
    /// field is part of the digest (ADR 0021).
    pub cold_codec: Option<ColdCodec>,
}

/// A group of recurrent layers (Mamba, gated delta net, RWKV, ...): what carries their
/// state from one token to the next, which no KV block can stand in for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StateGroup {
    /// What the layers are and how their state is encoded, e.g. `mamba1/f32`. Groups of
    /// different kinds never share state.
    pub kind: String,
    /// Layers in the group.
    pub num_layers: u32,
    /// Bytes of the group's whole state (all its layers) at one token boundary.
    pub state_bytes: u64,
}

impl StateGroup {
    /// Bytes of the state of all of `groups` at one boundary (saturating).
    pub fn total_bytes(groups: &[StateGroup]) -> u64 {
        groups
            .iter()
            .fold(0u64, |sum, g| sum.saturating_add(g.state_bytes))
    }
}

impl LayoutKey {
    /// A layout with the given shape, no parallelism, no adapter and no salt. Identity
    /// strings start empty; set them before use (an empty `model_id` is refused).
    pub fn new(
        model_id: impl Into<String>,
        dtype: KvDtype,
        tokens_per_block: u32,
        num_layers: u32,
        num_kv_heads: u32,
        head_dim: u32,
    ) -> Self {
        Self {
            model_id: model_id.into(),
            weights_digest: String::new(),
            tokenizer_digest: String::new(),
            dtype,
            tokens_per_block,
            num_layers,
            num_kv_heads,
            head_dim,
            tp_rank: 0,
            tp_size: 1,
            pp_stage: 0,
            pp_size: 1,
            lora_id: None,
            tenant_salt: Vec::new(),
            state_groups: Vec::new(),
            cold_codec: None,
        }
    }

    /// Bytes of the whole recurrent state at one boundary: the sum over the state groups
    /// (0 for an attention-only layout).
    pub fn state_bytes(&self) -> u64 {
        StateGroup::total_bytes(&self.state_groups)
    }

    /// Checks every field and returns the block geometry it implies.
    pub fn validate(&self) -> Result<BlockGeometry> {
        let bad = |msg: String| Err(Error::invalid(format!("invalid layout: {msg}")));
        if self.model_id.is_empty() {
            return bad("model_id is empty".into());
        }
        for (name, value) in [
            ("model_id", self.model_id.as_bytes()),
            ("weights_digest", self.weights_digest.as_bytes()),
            ("tokenizer_digest", self.tokenizer_digest.as_bytes()),
            ("lora_id", self.lora_id.as_deref().unwrap_or("").as_bytes()),
            ("tenant_salt", &self.tenant_salt),
        ] {
            if value.len() > MAX_STRING_BYTES {
                return bad(format!(
                    "{name} is {} bytes; at most {MAX_STRING_BYTES} are allowed",
                    value.len()
                ));
            }
        }
        self.validate_state_groups()?;
        if self.cold_codec.is_some()
            && !matches!(self.dtype, KvDtype::F32 | KvDtype::F16 | KvDtype::Bf16)
        {
            return bad(format!(
                "a lossy cold codec needs a float dtype (f32, f16, bf16), not {}",
                self.dtype
            ));
        }
        if self.num_layers == 0 && self.state_groups.is_empty() {
            return bad(
                "num_layers is 0 and no state group is named: the layout holds nothing".into(),
            );
        }
        for (name, value) in [
            ("tokens_per_block", self.tokens_per_block),
            ("num_kv_heads", self.num_kv_heads),
            ("head_dim", self.head_dim),
            ("tp_size", self.tp_size),
            ("pp_size", self.pp_size),
        ] {
            if value == 0 {
                return bad(format!("{name} is 0; it must be at least 1"));
            }
        }
        if self.tokens_per_block > MAX_TOKENS_PER_BLOCK {
            return bad(format!(
                "tokens_per_block is {}; at most {MAX_TOKENS_PER_BLOCK} are allowed",
                self.tokens_per_block
            ));
        }
        if self.tp_rank >= self.tp_size {
            return bad(format!(
                "tp_rank {} is not below tp_size {}",
                self.tp_rank, self.tp_size
            ));
        }
        if self.pp_stage >= self.pp_size {
            return bad(format!(
                "pp_stage {} is not below pp_size {}",
                self.pp_stage, self.pp_size
            ));
        }
        let half_page = [
            u64::from(self.tokens_per_block),
            u64::from(self.num_kv_heads),
            u64::from(self.head_dim),
            self.dtype.size_bytes(),
        ]
        .into_iter()
        .try_fold(1u64, u64::checked_mul);
        let geometry = half_page.map(|half_page_bytes| BlockGeometry {
            tokens_per_block: self.tokens_per_block,
            num_layers: self.num_layers,
            half_page_bytes,
        });
        match geometry {
            Some(g)
                if g.page_bytes() <= MAX_BLOCK_BYTES
                    && u64::from(g.num_layers) * g.page_bytes() <= MAX_BLOCK_BYTES =>
            {
                Ok(g)
            }
            _ => bad(format!(
                "a block would exceed {MAX_BLOCK_BYTES} bytes \
                 ({} tokens x {} layers x {} KV heads x {} head_dim x 2 x {} bytes)",
                self.tokens_per_block,
                self.num_layers,
                self.num_kv_heads,
                self.head_dim,
                self.dtype.size_bytes()
            )),
        }
    }

    fn validate_state_groups(&self) -> Result<()> {
        let bad = |msg: String| Err(Error::invalid(format!("invalid layout: {msg}")));
        if self.state_groups.len() > MAX_STATE_GROUPS {
            return bad(format!(
                "{} state groups; at most {MAX_STATE_GROUPS} are allowed",
                self.state_groups.len()
            ));
        }
        for (i, g) in self.state_groups.iter().enumerate() {
            if g.kind.is_empty() || g.kind.len() > MAX_STRING_BYTES {
                return bad(format!(
                    "state group {i} has a kind of {} bytes; 1 to {MAX_STRING_BYTES} are allowed",
                    g.kind.len()
                ));
            }
            if g.num_layers == 0 || g.state_bytes == 0 {
                return bad(format!(
                    "state group {i} (`{}`) has {} layers and {} state bytes; both must be at least 1",
                    g.kind, g.num_layers, g.state_bytes
                ));
            }
        }
        if self.state_bytes() > MAX_BLOCK_BYTES {
            return bad(format!(
                "the recurrent state takes {} bytes; at most {MAX_BLOCK_BYTES} are allowed",
                self.state_bytes()
            ));
        }
        Ok(())
    }

    /// The canonical encoding: magic, schema version, then every field in a fixed order,
    /// integers little-endian, strings and byte strings prefixed by their u32 length.
    /// Equal keys encode to equal bytes; different keys to different bytes.
    pub fn canonical_bytes(&self) -> Vec<u8> {
        fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
            // Lengths are bounded by validation; saturate rather than wrap for unvalidated keys.
            let len = u32::try_from(b.len()).unwrap_or(u32::MAX);
            out.extend_from_slice(&len.to_le_bytes());
            out.extend_from_slice(b);
        }
        let mut out = Vec::with_capacity(128);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&LAYOUT_SCHEMA_VERSION.to_le_bytes());
        put_bytes(&mut out, self.model_id.as_bytes());
        put_bytes(&mut out, self.weights_digest.as_bytes());
        put_bytes(&mut out, self.tokenizer_digest.as_bytes());
        out.push(self.dtype.code());
        for v in [
            self.tokens_per_block,
            self.num_layers,
            self.num_kv_heads,
            self.head_dim,
            self.tp_rank,
            self.tp_size,
            self.pp_stage,
            self.pp_size,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        match &self.lora_id {
            None => out.push(0),
            Some(id) => {
                out.push(1);
                put_bytes(&mut out, id.as_bytes());
            }
        }
        put_bytes(&mut out, &self.tenant_salt);
        // Appended only when present, so an attention-only layout keeps the digest it had
        // before state groups existed; the salt before it is length-prefixed, so the two
        // forms cannot be confused.
        if !self.state_groups.is_empty() {
            out.push(b'S');
            out.extend_from_slice(&(self.state_groups.len() as u32).to_le_bytes());
            for g in &self.state_groups {
                put_bytes(&mut out, g.kind.as_bytes());
                out.extend_from_slice(&g.num_layers.to_le_bytes());
                out.extend_from_slice(&g.state_bytes.to_le_bytes());
            }
        }
        // Also only when present (no digest of an exact layout changes); the marker byte
        // differs from the state groups' and both sections have a known length, so every
        // combination encodes differently.
        if let Some(codec) = self.cold_codec {
            out.push(b'C');
            out.push(codec.code());
        }
        out
    }

    /// The 128-bit digest of the canonical encoding: the first 16 bytes of its SHA-256.
    pub fn digest(&self) -> LayoutDigest {
        let full = Sha256::digest(self.canonical_bytes());
        let mut d = [0u8; 16];
        d.copy_from_slice(&full[..16]);
        LayoutDigest(d)
    }
}

/// The 128-bit digest of a [`LayoutKey`]; it names the layout and seeds its hash chains.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct LayoutDigest(pub [u8; 16]);

impl LayoutDigest {
    /// Lower-case hex.
    pub fn to_hex(&self) -> String {
        crate::hash::hex(&self.0)
    }

    /// The digest spelled by 32 hex digits (either case), or `None`.
    pub fn from_hex(s: &str) -> Option<Self> {
        crate::hash::unhex(s).map(Self)
    }
}

impl fmt::Debug for LayoutDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LayoutDigest({})", self.to_hex())
    }
}

impl fmt::Display for LayoutDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// A validated [`LayoutKey`] with its digest and geometry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    key: LayoutKey,
    digest: LayoutDigest,
    geometry: BlockGeometry,
}

impl Layout {
    /// Validates `key`; refuses invalid values with an [`crate::ErrorKind::Invalid`] error.
    pub fn new(key: LayoutKey) -> Result<Self> {
        let geometry = key.validate()?;
        let digest = key.digest();
        Ok(Self {
            key,
            digest,
            geometry,
        })
    }

    /// The key this layout was built from.
    pub fn key(&self) -> &LayoutKey {
        &self.key
    }

    /// The layout's digest.
    pub fn digest(&self) -> LayoutDigest {
        self.digest
    }

    /// The payload geometry.
    pub fn geometry(&self) -> BlockGeometry {
        self.geometry
    }

    /// Tokens per block.
    pub fn tokens_per_block(&self) -> usize {
        self.geometry.tokens_per_block as usize
    }

    /// Bytes of one block payload; every store is checked against it. 0 for a layout
    /// without attention layers (it keeps only recurrent state).
    pub fn block_bytes(&self) -> u64 {
        self.geometry.block_bytes()
    }

    /// Whether the layout has attention layers, whose KV is kept in blocks.
    pub fn has_kv(&self) -> bool {
        self.key.num_layers > 0
    }

    /// Whether the layout has recurrent layers, whose state is kept in checkpoints.
    pub fn has_state(&self) -> bool {
        !self.key.state_groups.is_empty()
    }

    /// Bytes of the whole recurrent state at one boundary (0 without state groups).
    pub fn state_bytes(&self) -> u64 {
        self.key.state_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> LayoutKey {
        let mut k = LayoutKey::new("m", KvDtype::F16, 16, 2, 4, 8);
        k.weights_digest = "w".into();
        k.tokenizer_digest = "t".into();
        k
    }

    #[test]
    fn every_field_changes_the_digest() {
        let b = base();
        let mut variants = vec![b.clone()];
        let edits: Vec<fn(&mut LayoutKey)> = vec![
            |k| k.model_id.push('x'),
            |k| k.weights_digest.push('x'),
            |k| k.tokenizer_digest.push('x'),
            |k| k.dtype = KvDtype::Bf16,
            |k| k.tokens_per_block = 32,
            |k| k.num_layers = 3,
            |k| k.num_kv_heads = 5,
            |k| k.head_dim = 16,
            |k| {
                k.tp_size = 2;
                k.tp_rank = 1
            },
            |k| k.tp_size = 2,
            |k| k.pp_size = 2,
            |k| {
                k.pp_size = 2;
                k.pp_stage = 1
            },
            |k| k.lora_id = Some(String::new()),
            |k| k.lora_id = Some("a".into()),
            |k| k.tenant_salt = b"s".to_vec(),
            |k| k.state_groups = vec![group("mamba1/f32", 2, 64)],
            |k| k.state_groups = vec![group("mamba2/f32", 2, 64)],
            |k| k.state_groups = vec![group("mamba1/f32", 3, 64)],
            |k| k.state_groups = vec![group("mamba1/f32", 2, 65)],
            |k| k.state_groups = vec![group("mamba1/f32", 1, 32), group("mamba1/f32", 1, 32)],
            |k| {
                k.num_layers = 0;
                k.state_groups = vec![group("mamba1/f32", 2, 64)];
            },
            |k| k.cold_codec = Some(ColdCodec::Fp8E4M3),
            |k| {
                k.state_groups = vec![group("mamba1/f32", 2, 64)];
                k.cold_codec = Some(ColdCodec::Fp8E4M3);
            },
        ];
        for e in edits {
            let mut k = b.clone();
            e(&mut k);
            variants.push(k);
        }
        let digests: std::collections::HashSet<_> = variants.iter().map(|k| k.digest()).collect();
        assert_eq!(digests.len(), variants.len());
    }

    fn group(kind: &str, num_layers: u32, state_bytes: u64) -> StateGroup {
        StateGroup {
            kind: kind.into(),
            num_layers,
            state_bytes,
        }
    }

    #[test]
    fn an_attention_only_layout_keeps_its_encoding() {
        // No state groups: nothing is appended after the tenant salt.
        let b = base();
        let bytes = b.canonical_bytes();
        assert_eq!(
            bytes.last(),
            Some(&0u8),
            "ends with the empty salt's length"
        );
        let mut with = b.clone();
        with.state_groups = vec![group("mamba1/f32", 2, 64)];
        assert!(with.canonical_bytes().starts_with(&bytes));
        assert_ne!(with.digest(), b.digest());
    }

    #[test]
    fn a_cold_codec_is_appended_only_when_set_and_needs_a_float_dtype() {
        let b = base();
        let mut with = b.clone();
        with.cold_codec = Some(ColdCodec::Fp8E4M3);
        let bytes = with.canonical_bytes();
        assert!(bytes.starts_with(&b.canonical_bytes()));
        assert_eq!(&bytes[bytes.len() - 2..], b"C\x01");
        assert!(with.validate().is_ok());
        with.dtype = KvDtype::I8;
        assert!(
            with.validate()
                .unwrap_err()
                .to_string()
                .contains("float dtype")
        );
        assert_eq!("fp8_e4m3".parse::<ColdCodec>().unwrap(), ColdCodec::Fp8E4M3);
        assert!("int4".parse::<ColdCodec>().is_err());
    }

    #[test]
    fn state_groups_are_validated() {
        let cases: Vec<(Vec<StateGroup>, u32, &str)> = vec![
            (vec![], 0, "holds nothing"),
            (vec![group("", 1, 8)], 2, "kind of 0 bytes"),
            (vec![group("m", 0, 8)], 2, "0 layers"),
            (vec![group("m", 1, 0)], 2, "0 state bytes"),
            (
                vec![group("m", 1, MAX_BLOCK_BYTES + 1)],
                2,
                "recurrent state takes",
            ),
            (
                vec![group("m", 1, 8); MAX_STATE_GROUPS + 1],
                2,
                "state groups; at most",
            ),
        ];
        for (groups, layers, needle) in cases {
            let mut k = base();
            k.num_layers = layers;
            k.state_groups = groups;
            let err = Layout::new(k)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(err.contains(needle), "`{err}` should mention `{needle}`");
        }
        let mut recurrent = base();
        recurrent.num_layers = 0;
        recurrent.state_groups = vec![group("m", 4, 1024)];
        let l = Layout::new(recurrent).expect("a recurrent-only layout is valid");
        assert!(!l.has_kv() && l.has_state());
        assert_eq!((l.block_bytes(), l.state_bytes()), (0, 1024));
    }

    #[test]
    fn string_boundaries_do_not_alias() {
        let mut a = base();
        a.model_id = "ab".into();
        a.weights_digest = "c".into();
        let mut b = base();
        b.model_id = "a".into();
        b.weights_digest = "bc".into();
        assert_ne!(a.digest(), b.digest());
    }

    #[test]
    fn zero_and_out_of_range_values_are_refused() {
        type Edit = fn(&mut LayoutKey);
        let cases: Vec<(Edit, &str)> = vec![
            (|k| k.tokens_per_block = 0, "tokens_per_block is 0"),
            (|k| k.num_layers = 0, "num_layers is 0"),
            (|k| k.num_kv_heads = 0, "num_kv_heads is 0"),
            (|k| k.head_dim = 0, "head_dim is 0"),
            (|k| k.model_id.clear(), "model_id is empty"),
            (|k| k.tp_rank = 1, "tp_rank 1 is not below tp_size 1"),
            (|k| k.pp_stage = 3, "pp_stage 3 is not below pp_size 1"),
            (|k| k.head_dim = u32::MAX, "would exceed"),
        ];
        for (edit, needle) in cases {
            let mut k = base();
            edit(&mut k);
            let err = Layout::new(k)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(err.contains(needle), "`{err}` should mention `{needle}`");
        }
    }

    #[test]
    fn unknown_dtype_is_refused_by_name() {
        let err = "fp4".parse::<KvDtype>().err().map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("unknown KV dtype `fp4`")));
        assert_eq!("BF16".parse::<KvDtype>().ok(), Some(KvDtype::Bf16));
    }

    #[test]
    fn geometry_follows_the_layout() -> Result<()> {
        let l = Layout::new(base())?;
        let g = l.geometry();
        assert_eq!(g.half_page_bytes, 16 * 4 * 8 * 2);
        assert_eq!(l.block_bytes(), 2 * 2 * 16 * 4 * 8 * 2);
        assert_eq!(
            g.layer_range(1..2),
            Some(g.page_bytes()..2 * g.page_bytes())
        );
        assert_eq!(g.layer_range(1..3), None);
        assert_eq!(g.layer_range(1..1), None);
        Ok(())
    }
}
