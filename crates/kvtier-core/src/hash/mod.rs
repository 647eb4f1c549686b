//! Block keys: the hash chain that names every block by its layout and its whole prefix.
//!
//! `h[-1]` is the [`LayoutDigest`]; for block `i`,
//!
//! ```text
//! h[i] = first 128 bits of SHA256-compress(state = h[i-1] ‖ x[i], message = tokens of block i)
//! ```
//!
//! where `x[i]` is 128 zero bits for a block without extra keys and the first 128 bits of a
//! domain-separated SHA-256 of the block's extra keys otherwise, and the tokens are
//! little-endian `u32`s, zero-padded to whole 64-byte message blocks (the length is fixed by
//! the layout, which is already in `h[-1]`). With 16 tokens per block that is exactly one
//! SHA-256 compression per block — no padding block, no length block — which is what keeps
//! hashing under 5 ns per token with the SHA extensions. See `docs/adr/0001-block-hash.md`
//! for why this is collision-resistant and why SHA-256 rather than BLAKE3.
//!
//! Only whole blocks are hashed; a trailing partial block has no key.

mod extras;
#[cfg(target_arch = "x86_64")]
mod shani;

use std::fmt;

use sha2::block_api::compress256;

pub use extras::ExtraKeys;

use crate::layout::{Layout, LayoutDigest};

/// The 128-bit key of one block: its layout, its tokens and every token before it.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct BlockHash(pub [u8; 16]);

impl BlockHash {
    /// Lower-case hex.
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }

    /// The low 64 bits, used to pick index shards and hash-map buckets. The hash is already
    /// uniformly distributed, so no further hashing is needed.
    pub fn low64(&self) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.0[8..]);
        u64::from_le_bytes(b)
    }
}

impl std::hash::Hash for BlockHash {
    /// Feeds only the low 64 bits: the hash is uniform already, and hash maps keyed by
    /// block hashes use a pass-through hasher, so one word is all they need.
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(self.low64());
    }
}

impl From<LayoutDigest> for BlockHash {
    fn from(d: LayoutDigest) -> Self {
        BlockHash(d.0)
    }
}

impl fmt::Debug for BlockHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BlockHash({})", self.to_hex())
    }
}

impl fmt::Display for BlockHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
    s
}

/// The `N` bytes that `s` spells in exactly `2·N` hex digits (either case), or `None`.
pub fn unhex<const N: usize>(s: &str) -> Option<[u8; N]> {
    // Digits only: `from_str_radix` alone would take a leading `+`.
    if s.len() != 2 * N || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut out = [0u8; N];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// The seed of every chain of `layout`: `h[-1]`.
pub fn chain_root(layout: &Layout) -> BlockHash {
    layout.digest().into()
}

/// Computes one link of the chain: the hash of a block given its parent's hash, its tokens
/// (exactly one block's worth) and its extra-key tag.
pub fn block_hash(parent: BlockHash, tokens: &[u32], extra_tag: Option<[u8; 16]>) -> BlockHash {
    let mut scratch = Vec::new();
    BlockHash(words_to_bytes(link(
        bytes_to_words(&parent.0),
        tokens,
        extra_tag.map(|t| bytes_to_words(&t)),
        &mut scratch,
    )))
}

/// The hashes of every whole block of `tokens` under `layout`, in order. Extra keys of a
/// block whose index is past the last whole block are ignored (that block has no key).
pub fn chain(layout: &Layout, tokens: &[u32], extras: &ExtraKeys) -> Vec<BlockHash> {
    let blocks = tokens.len() / layout.tokens_per_block();
    let tags = extras.tags(blocks);
    let mut out = Vec::with_capacity(blocks);
    chain_extend(layout, tokens, &tags, &mut out, blocks);
    out
}

/// Extends `out`, the hashes of the first `out.len()` whole blocks of `tokens` under
/// `layout`, to the first `blocks` whole blocks (fewer if `tokens` has fewer). `tags[i]` is
/// block `i`'s extra-key tag; `tags` is empty for a prompt without extra keys. A lookup
/// hashes a prompt this way as far as its walk goes, not further (see `Prompt`).
pub fn chain_extend(
    layout: &Layout,
    tokens: &[u32],
    tags: &[Option<[u8; 16]>],
    out: &mut Vec<BlockHash>,
    blocks: usize,
) {
    let tpb = layout.tokens_per_block();
    let done = out.len();
    let blocks = blocks.min(tokens.len() / tpb);
    if blocks <= done {
        return;
    }
    let parent = out.last().copied().unwrap_or_else(|| chain_root(layout));
    let todo = &tokens[done * tpb..blocks * tpb];
    #[cfg(target_arch = "x86_64")]
    if tpb == 16 && tags.is_empty() && shani::available() {
        shani::chain16(bytes_to_words(&parent.0), todo, out);
        return;
    }
    let mut parent = bytes_to_words(&parent.0);
    let mut scratch = Vec::with_capacity(tpb.div_ceil(16));
    for (i, block) in todo.chunks_exact(tpb).enumerate() {
        let tag = tags
            .get(done + i)
            .copied()
            .flatten()
            .map(|t| bytes_to_words(&t));
        parent = link(parent, block, tag, &mut scratch);
        out.push(BlockHash(words_to_bytes(parent)));
    }
}

/// One chain step on big-endian words: the state is the parent's four words and the tag's
/// four (zero without extra keys); the message is the block's tokens, little-endian,
/// zero-padded to whole 64-byte blocks; the result is the first four state words.
#[inline]
fn link(
    parent: [u32; 4],
    tokens: &[u32],
    tag: Option<[u32; 4]>,
    scratch: &mut Vec<[u8; 64]>,
) -> [u32; 4] {
    let t = tag.unwrap_or([0; 4]);
    let mut state = [
        parent[0], parent[1], parent[2], parent[3], t[0], t[1], t[2], t[3],
    ];
    if let Ok(sixteen) = <&[u32; 16]>::try_from(tokens) {
        // The common case (16 tokens per block): one message block on the stack.
        let mut msg = [0u8; 64];
        for (dst, tok) in msg.chunks_exact_mut(4).zip(sixteen) {
            dst.copy_from_slice(&tok.to_le_bytes());
        }
        compress256(&mut state, std::slice::from_ref(&msg));
    } else {
        scratch.clear();
        for chunk in tokens.chunks(16) {
            let mut msg = [0u8; 64];
            for (dst, tok) in msg.chunks_exact_mut(4).zip(chunk) {
                dst.copy_from_slice(&tok.to_le_bytes());
            }
            scratch.push(msg);
        }
        compress256(&mut state, scratch);
    }
    [state[0], state[1], state[2], state[3]]
}

fn bytes_to_words(b: &[u8; 16]) -> [u32; 4] {
    let w = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    [w(0), w(4), w(8), w(12)]
}

fn words_to_bytes(w: [u32; 4]) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (dst, w) in out.chunks_exact_mut(4).zip(w) {
        dst.copy_from_slice(&w.to_be_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{KvDtype, LayoutKey};

    fn layout(tpb: u32) -> Layout {
        match Layout::new(LayoutKey::new("m", KvDtype::F16, tpb, 1, 1, 8)) {
            Ok(l) => l,
            Err(e) => unreachable!("{e}"),
        }
    }

    #[test]
    fn unhex_reads_back_what_hex_writes_and_nothing_else() {
        let bytes = [0u8, 1, 0x7f, 0x80, 0xab, 0xff];
        assert_eq!(unhex::<6>(&hex(&bytes)), Some(bytes));
        assert_eq!(unhex::<2>("ABcd"), Some([0xab, 0xcd]));
        for bad in ["abc", "abcdef", "zz00", "+1ab", "é0"] {
            assert_eq!(unhex::<2>(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_register_path_equals_the_portable_path() {
        let l = layout(16);
        let root = bytes_to_words(&chain_root(&l).0);
        for n in [0usize, 15, 16, 17, 160, 1000] {
            let t: Vec<u32> = (0..n as u32)
                .map(|i| i.wrapping_mul(0x9e37_79b9) ^ (i << 7))
                .collect();
            let mut portable = Vec::new();
            let mut parent = root;
            let mut scratch = Vec::new();
            for block in t.chunks_exact(16) {
                parent = link(parent, block, None, &mut scratch);
                portable.push(BlockHash(words_to_bytes(parent)));
            }
            assert_eq!(chain(&l, &t, &ExtraKeys::none()), portable, "{n} tokens");
        }
    }

    #[test]
    fn chain_is_prefix_stable_and_whole_blocks_only() {
        let l = layout(16);
        let t: Vec<u32> = (0..100).collect();
        let full = chain(&l, &t, &ExtraKeys::none());
        assert_eq!(full.len(), 6);
        let prefix = chain(&l, &t[..40], &ExtraKeys::none());
        assert_eq!(prefix, full[..2]);
    }

    #[test]
    fn one_token_changes_this_and_every_later_hash() {
        let l = layout(16);
        let a: Vec<u32> = (0..64).collect();
        let mut b = a.clone();
        b[20] = 999;
        let (ha, hb) = (
            chain(&l, &a, &ExtraKeys::none()),
            chain(&l, &b, &ExtraKeys::none()),
        );
        assert_eq!(ha[0], hb[0]);
        assert!(ha[1..].iter().zip(&hb[1..]).all(|(x, y)| x != y));
    }

    #[test]
    fn layouts_and_extras_separate_chains() {
        let t: Vec<u32> = (0..32).collect();
        let mut k = LayoutKey::new("m", KvDtype::F16, 16, 1, 1, 8);
        k.tenant_salt = b"other".to_vec();
        let other = Layout::new(k).ok();
        let base = chain(&layout(16), &t, &ExtraKeys::none());
        assert_ne!(
            Some(base.clone()),
            other.map(|o| chain(&o, &t, &ExtraKeys::none()))
        );
        let mut ex = ExtraKeys::none();
        ex.push(1, b"image-digest".to_vec());
        let with = chain(&layout(16), &t, &ex);
        assert_eq!(with[0], base[0]);
        assert_ne!(with[1], base[1]);
    }

    #[test]
    fn large_blocks_use_several_compressions_and_zero_padding_is_unambiguous() {
        // 20 tokens: 80 bytes, two compressions. A block of 20 tokens ending in zeros must
        // still differ from the same block under a layout of a different size (the layout
        // seeds the chain).
        let t: Vec<u32> = (1..=20).collect();
        let h20 = chain(&layout(20), &t, &ExtraKeys::none());
        let mut t32 = t.clone();
        t32.resize(32, 0);
        let h32 = chain(&layout(32), &t32, &ExtraKeys::none());
        assert_ne!(h20[0], h32[0]);
    }
}
