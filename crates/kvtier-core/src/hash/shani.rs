//! The chain for the common case (16 tokens per block, no extra keys) on CPUs with the SHA
//! extensions, keeping the SHA-256 state in registers from one block to the next.
//!
//! The portable path calls `sha2`'s compression once per block, which loads the state from
//! memory, reorders it for the SHA instructions, and stores it back: about 20% on top of
//! the compression itself, all of it on the chain's critical path. Here the next block's
//! state is one blend away from the previous block's output, and the message words are
//! loaded straight from the token slice (little-endian `u32`s are exactly the bytes the
//! scheme hashes). Results are identical to the portable path: tests compare the two.
#![expect(unsafe_code, reason = "SHA-NI intrinsics from core::arch")]

use std::arch::x86_64::{
    __m128i, _mm_add_epi32, _mm_alignr_epi8, _mm_blend_epi16, _mm_extract_epi32, _mm_loadu_si128,
    _mm_set_epi32, _mm_set_epi64x, _mm_sha256msg1_epu32, _mm_sha256msg2_epu32,
    _mm_sha256rnds2_epu32, _mm_shuffle_epi8, _mm_shuffle_epi32,
};

use super::BlockHash;

/// SHA-256 round constants.
const K: [u32; 64] = [
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
];

/// Whether this CPU can run [`chain16`].
pub fn available() -> bool {
    std::arch::is_x86_feature_detected!("sha")
        && std::arch::is_x86_feature_detected!("sse4.1")
        && std::arch::is_x86_feature_detected!("ssse3")
}

/// Appends the hash of every whole 16-token block of `tokens` to `out`, starting from
/// `root`, the hash before the first of them (the chain root, or the last block already
/// hashed), as four big-endian words; with zero extra-key tags.
/// The caller must have checked [`available`].
pub fn chain16(root: [u32; 4], tokens: &[u32], out: &mut Vec<BlockHash>) {
    if !available() {
        return;
    }
    // SAFETY: the required CPU features were just detected.
    unsafe { chain16_inner(root, tokens, out) }
}

#[target_feature(enable = "sha,sse2,ssse3,sse4.1")]
unsafe fn chain16_inner(root: [u32; 4], tokens: &[u32], out: &mut Vec<BlockHash>) {
    let as_i = |w: u32| w as i32;
    // Lanes are listed high to low: ABEF holds A in lane 3, CDGH holds C in lane 3.
    // The tag words (E..H) are zero without extra keys.
    let mut abef = _mm_set_epi32(as_i(root[0]), as_i(root[1]), 0, 0);
    let mut cdgh = _mm_set_epi32(as_i(root[2]), as_i(root[3]), 0, 0);
    let zero_tag = _mm_set_epi32(0, 0, 0, 0);
    // Swaps the bytes of each 32-bit lane: message words are big-endian.
    let bswap = _mm_set_epi64x(0x0c0d_0e0f_0809_0a0b, 0x0405_0607_0001_0203);
    let k: [__m128i; 16] = std::array::from_fn(|g| {
        _mm_set_epi32(
            as_i(K[4 * g + 3]),
            as_i(K[4 * g + 2]),
            as_i(K[4 * g + 1]),
            as_i(K[4 * g]),
        )
    });
    for block in tokens.chunks_exact(16) {
        let mut w = [zero_tag; 16];
        for (q, quad) in block.chunks_exact(4).enumerate() {
            // SAFETY: `quad` is 4 u32s = 16 readable bytes; unaligned loads are allowed.
            let raw = unsafe { _mm_loadu_si128(quad.as_ptr().cast::<__m128i>()) };
            w[q] = _mm_shuffle_epi8(raw, bswap);
        }
        let (abef_in, cdgh_in) = (abef, cdgh);
        for g in 0..16 {
            // Each message group is scheduled right before its rounds, which keeps the
            // schedule in registers and lets it overlap the previous rounds.
            if g >= 4 {
                let x = _mm_sha256msg1_epu32(w[g - 4], w[g - 3]);
                let x = _mm_add_epi32(x, _mm_alignr_epi8(w[g - 1], w[g - 2], 4));
                w[g] = _mm_sha256msg2_epu32(x, w[g - 1]);
            }
            // Two rounds update ABEF from CDGH; the old ABEF takes the CDGH role. Two more
            // rounds the other way round leave both registers in their roles again.
            let msg = _mm_add_epi32(w[g], k[g]);
            cdgh = _mm_sha256rnds2_epu32(cdgh, abef, msg);
            let msg = _mm_shuffle_epi32(msg, 0x0E);
            abef = _mm_sha256rnds2_epu32(abef, cdgh, msg);
        }
        abef = _mm_add_epi32(abef, abef_in);
        cdgh = _mm_add_epi32(cdgh, cdgh_in);
        let words = [
            _mm_extract_epi32(abef, 3) as u32,
            _mm_extract_epi32(abef, 2) as u32,
            _mm_extract_epi32(cdgh, 3) as u32,
            _mm_extract_epi32(cdgh, 2) as u32,
        ];
        out.push(BlockHash(super::words_to_bytes(words)));
        // The next state: this output's A..D, then the (zero) tag in E..H.
        abef = _mm_blend_epi16(zero_tag, abef, 0xF0);
        cdgh = _mm_blend_epi16(zero_tag, cdgh, 0xF0);
    }
}
