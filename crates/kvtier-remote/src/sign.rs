//! The cluster's signing key: what lets a replica tell objects and records written by a
//! holder of the key from ones written by anyone else who can reach the bucket or etcd
//! (docs/adr/0020-trust.md, "Signed objects and records").
//!
//! CRC-32C and the manifest's SHA-256 detect damage, not forgery: whoever can write the
//! bucket can write a payload with a matching CRC, and whoever can write etcd can name
//! any manifest digest. With a key, every object and record carries a tag only a key
//! holder can compute — keyed BLAKE3, a MAC, one primitive for all four uses, each under
//! its own derived key so a tag made for one kind of thing is never valid for another:
//!
//! | what | tag over | where the tag lives |
//! | --- | --- | --- |
//! | a block's payload | the payload | its manifest entry (`tag`), 16 bytes |
//! | a run manifest | the manifest without its seal | the manifest (`seal`) |
//! | a state object | its header and state | the header's last 32 bytes (version 2) |
//! | an etcd record | the key it is stored under, and its JSON | after the JSON (`JSON\nHEX`) |
//!
//! Keyed BLAKE3 rather than HMAC-SHA-256 because a replica checks every block it serves:
//! BLAKE3 runs several times faster than SHA-256 on these machines (AVX-512), and its
//! keyed mode is a PRF by design, so it needs no HMAC construction around it.

use std::fmt;

/// A 32-byte cluster key and the keys derived from it for each kind of tag.
#[derive(Clone, PartialEq, Eq)]
pub struct SigningKey {
    blocks: [u8; 32],
    manifests: [u8; 32],
    states: [u8; 32],
    records: [u8; 32],
}

/// Bytes of a block's tag (128 bits: forging one is a 2⁻¹²⁸ guess).
pub const BLOCK_TAG_BYTES: usize = 16;

impl SigningKey {
    /// The key whose 32 bytes `hex` spells (64 hex digits), or why not.
    pub fn from_hex(hex: &str) -> Result<Self, String> {
        let hex = hex.trim();
        if hex.len() != 64 {
            return Err(format!(
                "a signing key is 64 hex digits (32 bytes), not {} characters",
                hex.len()
            ));
        }
        let key = kvtier_core::hash::unhex::<32>(hex).ok_or("a signing key is hex digits only")?;
        Ok(Self::from_bytes(&key))
    }

    /// The key of these 32 bytes.
    pub fn from_bytes(key: &[u8; 32]) -> Self {
        let derive = |purpose: &str| blake3::derive_key(purpose, key);
        Self {
            blocks: derive("kvtier 2026-11 remote block payload tag"),
            manifests: derive("kvtier 2026-11 remote run manifest seal"),
            states: derive("kvtier 2026-11 remote state object tag"),
            records: derive("kvtier 2026-11 cluster etcd record tag"),
        }
    }

    /// The tag of a block's payload.
    pub fn block_tag(&self, payload: &[u8]) -> [u8; BLOCK_TAG_BYTES] {
        let full = blake3::keyed_hash(&self.blocks, payload);
        let mut tag = [0u8; BLOCK_TAG_BYTES];
        tag.copy_from_slice(&full.as_bytes()[..BLOCK_TAG_BYTES]);
        tag
    }

    /// Whether `tag` is `payload`'s (compared in constant time).
    pub fn block_tag_holds(&self, payload: &[u8], tag: &[u8; BLOCK_TAG_BYTES]) -> bool {
        constant_time_eq(&self.block_tag(payload), tag)
    }

    /// The seal of a manifest's bytes (serialized without a seal).
    pub fn manifest_seal(&self, unsealed: &[u8]) -> [u8; 32] {
        *blake3::keyed_hash(&self.manifests, unsealed).as_bytes()
    }

    /// The tag of a state object: its header (without the tag) and its state.
    pub fn state_tag(&self, header: &[u8], state: &[u8]) -> [u8; 32] {
        let mut h = blake3::Hasher::new_keyed(&self.states);
        h.update(&(header.len() as u64).to_le_bytes());
        h.update(header);
        h.update(state);
        *h.finalize().as_bytes()
    }

    /// The tag of record `value` stored under etcd key `key` (the key is part of what is
    /// signed, so a record copied under another key does not verify).
    pub fn record_tag(&self, key: &[u8], value: &[u8]) -> [u8; 32] {
        let mut h = blake3::Hasher::new_keyed(&self.records);
        h.update(&(key.len() as u64).to_le_bytes());
        h.update(key);
        h.update(value);
        *h.finalize().as_bytes()
    }
}

/// Whether two tags are equal, in time independent of where they differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SigningKey(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_of_tag_has_its_own_key_and_a_changed_byte_changes_it() {
        let key = SigningKey::from_bytes(&[7; 32]);
        let other = SigningKey::from_bytes(&[8; 32]);
        let payload = b"the payload";
        // The same bytes tagged for two purposes give two tags.
        assert_ne!(
            key.manifest_seal(payload),
            key.record_tag(b"", payload),
            "a manifest seal must not pass as a record tag"
        );
        assert_ne!(key.state_tag(b"", payload), key.record_tag(b"", payload));
        assert_ne!(key.block_tag(payload)[..], key.manifest_seal(payload)[..16]);
        // Another key, another tag.
        assert!(!other.block_tag_holds(payload, &key.block_tag(payload)));
        assert!(key.block_tag_holds(payload, &key.block_tag(payload)));
        let mut flipped = *payload;
        flipped[3] ^= 1;
        assert!(!key.block_tag_holds(&flipped, &key.block_tag(payload)));
        // The key a record is stored under is signed with it.
        assert_ne!(key.record_tag(b"a/b", b"{}"), key.record_tag(b"a/c", b"{}"));
        // Where the key ends and the value begins is signed too.
        assert_ne!(key.record_tag(b"ab", b"c"), key.record_tag(b"a", b"bc"));
    }

    #[test]
    fn a_key_is_64_hex_digits_and_never_printed() {
        let hex = "00".repeat(31) + "ff";
        let key = SigningKey::from_hex(&hex).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            key,
            SigningKey::from_bytes(&{
                let mut k = [0u8; 32];
                k[31] = 0xff;
                k
            })
        );
        assert!(SigningKey::from_hex("abcd").is_err());
        assert!(SigningKey::from_hex(&"zz".repeat(32)).is_err());
        assert_eq!(format!("{key:?}"), "SigningKey(<redacted>)");
    }
}
