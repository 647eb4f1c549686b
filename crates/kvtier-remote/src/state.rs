//! Recurrent state on the remote tier: the engine's snapshots and checkpoints (issue 16,
//! `docs/hybrid.md`) as **state objects**, one self-verifying object per state.
//!
//! ```text
//! PREFIX/state/LAYOUT/KEY.kvs     KEY: the 32-byte snapshot key, hex
//! ┌──────────────────────── header, 96 bytes ─────────────────────────┐┌─ state ─┐
//! │ "KVTSTATE" │ version │ 96 │ key │ layout │ len │ crc32c(state) │ 0 │ crc32c(…)││  len B  │
//! │     8      │    4    │ 4  │ 32  │   16   │  8  │       4       │ 12│     4    ││         │
//! └────────────────────────────────────────────────────────────────────┘└─────────┘
//! ```
//!
//! A tier with a signing key (`crate::sign`) writes version 2, whose 128-byte header
//! carries, before its own checksum, the keyed tag of the header's first 92 bytes and the
//! state: `… │ crc32c(state) │ 0 (16) │ tag (32) │ crc32c(…) │`. Such a tier serves only
//! version 2 objects whose tag holds: a bucket writer without the key cannot make it
//! serve a state of their choosing.
//!
//! A tier with a codec (ADR 0021) stores a state that shrinks as a frame of the codec:
//! versions 3 (unsigned) and 4 (signed), the same headers with the codec's code at byte
//! 76 and the decoded length at bytes 80..88; `len`, the CRC and the tag are then of the
//! frame, and the frame's segments carry the checksums of the state they decode to.
//! Builds that know versions 1 and 2 only refuse them (a miss, never a frame served as a
//! state).
//!
//! - **One PUT, one GET.** The header travels with the state, so an object is complete
//!   or absent (an S3 PUT is atomic) and needs no manifest; a restore is one GET of the
//!   whole object.
//! - **Verified on read.** A read is served only when the header's own checksum holds,
//!   the key and layout in it are exactly the ones asked for, the length is the object's
//!   and the state's CRC-32C matches. Anything else is a miss, and the tier forgets the
//!   object: a name (listed, or advertised by another replica) only points, never vouches.
//! - **Immutable by name.** A key names the state after exactly one prefix of one
//!   layout, so every object under that name holds an equally valid state. The tier
//!   writes a key only when it does not know one under it already; two replicas racing
//!   on the same key replace one valid object with another (a PUT is atomic), never a
//!   torn one.
//! - **Found from memory.** The tier keeps which keys it holds: written here, listed
//!   under `PREFIX/state/` at open, or adopted from the cluster's advertisements
//!   ([`RemoteTier::adopt_state`]), so a lookup asks no endpoint.

use std::sync::Arc;

use bytes::Bytes;
use futures_util::StreamExt;
use kvtier_core::layout::LayoutDigest;
use kvtier_core::snapshot::SnapshotKey;
use kvtier_core::tier::SnapshotStore;
use kvtier_core::{Error, ErrorKind, Result};
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};

use kvtier_codec::{Codec, DecodeError, PageCoder};

use crate::RemoteTier;
use crate::catalog::Listed;
use crate::object::crc;
use crate::s3::Fetch;
use crate::sign::{SigningKey, constant_time_eq};
use kvtier_core::hash::unhex;

/// The first bytes of every state object.
const MAGIC: &[u8; 8] = b"KVTSTATE";
/// State object format version without a signing key.
const VERSION: u32 = 1;
/// Bytes of the header before the state.
pub const HEADER_BYTES: usize = 96;
/// The format version of signed state objects.
const SIGNED_VERSION: u32 = 2;
/// The versions of encoded state objects, unsigned and signed.
const ENCODED_VERSION: u32 = 3;
const SIGNED_ENCODED_VERSION: u32 = 4;
/// Where an encoded object's codec and decoded length are in its header.
const CODEC_AT: usize = 76;
const DECODED_LEN_AT: usize = 80;
/// Bytes of a signed object's header.
pub const SIGNED_HEADER_BYTES: usize = 128;
/// Where a signed header's tag starts (it covers the bytes before it, and the state).
const TAG_AT: usize = 92;

/// The header length of the state objects a tier with (or without) a signing key writes
/// and reads.
pub fn header_bytes(key: Option<&SigningKey>) -> usize {
    if key.is_some() {
        SIGNED_HEADER_BYTES
    } else {
        HEADER_BYTES
    }
}

/// Why a state object is not served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateRefusal {
    /// The tier has a signing key and the object is not signed with it.
    Unsigned,
    /// Damaged, or not the state asked for.
    Damaged(&'static str),
}
/// The largest state the tier writes or reads (a recurrent state is megabytes; this
/// bounds what one GET may allocate on a name that lies about its size).
const MAX_STATE_BYTES: u64 = 1 << 32;

/// A state object, by where it is and what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateName {
    /// Which of the tier's endpoints holds it.
    pub endpoint: usize,
    /// Its object name, `PREFIX/state/LAYOUT/KEY.kvs`.
    pub name: String,
    /// The layout its name says (checked against the header on read).
    pub layout: LayoutDigest,
    /// The snapshot key its name says (checked against the header on read).
    pub key: SnapshotKey,
}

/// The name of the state object for `key` under `layout`.
pub fn state_object_name(prefix: &str, layout: &LayoutDigest, key: &SnapshotKey) -> String {
    format!(
        "{prefix}/state/{}/{}.kvs",
        layout.to_hex(),
        kvtier_core::hash::hex(&key.0)
    )
}

/// The layout and key a state object's name says, if it is one under `prefix`.
pub fn parse_state_name(prefix: &str, name: &str) -> Option<(LayoutDigest, SnapshotKey)> {
    let rest = name.strip_prefix(prefix)?.strip_prefix("/state/")?;
    let (layout, file) = rest.split_once('/')?;
    let key = file.strip_suffix(".kvs")?;
    let layout = LayoutDigest(unhex::<16>(layout)?);
    Some((layout, SnapshotKey(unhex::<32>(key)?)))
}

/// How an encoded state object's state is stored: the frame's codec and the length of
/// the state it decodes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncodedState {
    /// The codec (never raw).
    pub codec: Codec,
    /// Bytes of the decoded state.
    pub decoded_len: u64,
}

/// A state object that passed every check: its stored state (a frame when `encoded`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// The bytes after the header.
    pub stored: Bytes,
    /// How they decode, if they are a frame.
    pub encoded: Option<EncodedState>,
}

/// The header of a state object storing `state` (the state, or its frame as `encoded`
/// says) under `key` and `layout`: version 1 or 3, or 2 or 4 signed with `signing`.
fn header(
    key: &SnapshotKey,
    layout: &LayoutDigest,
    state: &[u8],
    signing: Option<&SigningKey>,
    encoded: Option<EncodedState>,
) -> Vec<u8> {
    let len = header_bytes(signing);
    let version = match (signing.is_some(), encoded.is_some()) {
        (false, false) => VERSION,
        (true, false) => SIGNED_VERSION,
        (false, true) => ENCODED_VERSION,
        (true, true) => SIGNED_ENCODED_VERSION,
    };
    let mut h = vec![0u8; len];
    if let Some(e) = encoded {
        h[CODEC_AT] = e.codec.code();
        h[DECODED_LEN_AT..DECODED_LEN_AT + 8].copy_from_slice(&e.decoded_len.to_le_bytes());
    }
    h[0..8].copy_from_slice(MAGIC);
    h[8..12].copy_from_slice(&version.to_le_bytes());
    h[12..16].copy_from_slice(&(len as u32).to_le_bytes());
    h[16..48].copy_from_slice(&key.0);
    h[48..64].copy_from_slice(&layout.0);
    h[64..72].copy_from_slice(&(state.len() as u64).to_le_bytes());
    h[72..76].copy_from_slice(&crc(state).to_le_bytes());
    if let Some(signing) = signing {
        let tag = signing.state_tag(&h[..TAG_AT], state);
        h[TAG_AT..TAG_AT + 32].copy_from_slice(&tag);
    }
    let own = crc(&h[..len - 4]);
    h[len - 4..].copy_from_slice(&own.to_le_bytes());
    h
}

/// The stored state in `object` if it is a whole, intact state object for exactly `key`
/// under `layout` — signed with `signing` when the tier has a key —, `state_crc` being
/// the CRC-32C of the bytes after its header (computed as they arrived); otherwise why
/// not. An encoded state still has to decode to the bytes its frame's checksums name.
pub fn verified_state(
    object: &Bytes,
    key: &SnapshotKey,
    layout: &LayoutDigest,
    state_crc: u32,
    signing: Option<&SigningKey>,
) -> std::result::Result<Verified, StateRefusal> {
    use StateRefusal::{Damaged, Unsigned};
    if object.len() < 16 || &object[0..8] != MAGIC {
        return Err(Damaged("not a state object"));
    }
    let u32_at = |at: usize| {
        u32::from_le_bytes([object[at], object[at + 1], object[at + 2], object[at + 3]])
    };
    let (raw, encoded, len) = match signing {
        Some(_) => (SIGNED_VERSION, SIGNED_ENCODED_VERSION, SIGNED_HEADER_BYTES),
        None => (VERSION, ENCODED_VERSION, HEADER_BYTES),
    };
    let version = u32_at(8);
    if (version != raw && version != encoded) || u32_at(12) as usize != len {
        return Err(match signing {
            Some(_) => Unsigned,
            None => Damaged("unknown state object version"),
        });
    }
    if object.len() < len {
        return Err(Damaged("shorter than a state header"));
    }
    let h = &object[..len];
    if crc(&h[..len - 4]) != u32_at(len - 4) {
        return Err(Damaged("header checksum mismatch"));
    }
    if h[16..48] != key.0 {
        return Err(Damaged("holds another key's state"));
    }
    if h[48..64] != layout.0 {
        return Err(Damaged("holds another layout's state"));
    }
    let mut state_len = [0u8; 8];
    state_len.copy_from_slice(&h[64..72]);
    if u64::from_le_bytes(state_len) != (object.len() - len) as u64 {
        return Err(Damaged("length differs from its header"));
    }
    if state_crc != u32_at(72) {
        return Err(Damaged("state checksum mismatch"));
    }
    if let Some(signing) = signing {
        let tag = signing.state_tag(&h[..TAG_AT], &object[len..]);
        if !constant_time_eq(&tag, &h[TAG_AT..TAG_AT + 32]) {
            return Err(Unsigned);
        }
    }
    let encoded = if version == encoded {
        let codec = Codec::from_code(h[CODEC_AT])
            .filter(|c| *c != Codec::Raw)
            .ok_or(Damaged("unknown codec"))?;
        let mut decoded_len = [0u8; 8];
        decoded_len.copy_from_slice(&h[DECODED_LEN_AT..DECODED_LEN_AT + 8]);
        let decoded_len = u64::from_le_bytes(decoded_len);
        if decoded_len > MAX_STATE_BYTES {
            return Err(Damaged("decoded length past any state"));
        }
        Some(EncodedState { codec, decoded_len })
    } else {
        None
    };
    Ok(Verified {
        stored: object.slice(len..),
        encoded,
    })
}

/// The state `verified` holds: its stored bytes, or what their frame decodes to through
/// `coder` (checked segment by segment).
fn decoded_state(coder: &PageCoder, verified: Verified) -> std::result::Result<Bytes, DecodeError> {
    let Some(e) = verified.encoded else {
        return Ok(verified.stored);
    };
    let len = usize::try_from(e.decoded_len).map_err(|_| DecodeError::Truncated)?;
    let mut out = vec![0u8; len];
    coder.decode_frames(vec![(e.codec, &verified.stored[..], &mut out[..])])?;
    Ok(Bytes::from(out))
}

impl RemoteTier {
    /// Every state object listed under `PREFIX/state/` on every endpoint (an endpoint
    /// that cannot be listed within the deadline is skipped, as for run objects).
    pub fn list_states(&self) -> Vec<StateName> {
        let prefix = self.config().prefix.clone();
        self.list_under(&format!("{prefix}/state"))
            .iter()
            .filter_map(|o| self.state_of(o))
            .collect()
    }

    /// The state object a listed object is, if its name is one of the tier's state names.
    pub fn state_of(&self, listed: &Listed) -> Option<StateName> {
        let (layout, key) = parse_state_name(&self.config().prefix, &listed.name)?;
        Some(StateName {
            endpoint: listed.endpoint,
            name: listed.name.clone(),
            layout,
            key,
        })
    }

    /// Serves the state object `state` names from now on, without reading it (its first
    /// read verifies it). Refused (`false`) when the endpoint is unknown or the name is
    /// not the tier's own name for that key and layout.
    pub fn adopt_state(&self, state: &StateName) -> bool {
        let expected = state_object_name(&self.config().prefix, &state.layout, &state.key);
        if state.endpoint >= self.endpoints() || state.name != expected {
            return false;
        }
        self.states()
            .write()
            .insert(state.key, Arc::new(state.clone()));
        true
    }

    /// Stops serving the state object under `key` (it stays in the store). Returns
    /// whether it was served.
    pub fn forget_state(&self, key: &SnapshotKey) -> bool {
        self.states().write().remove(key).is_some()
    }

    /// Deletes the state object `state` from its endpoint (the cluster's GC, once no read
    /// of it can still be running). It is forgotten first, so no read starts meanwhile;
    /// an object already gone counts as deleted.
    pub fn delete_state(&self, state: &StateName) -> Result<()> {
        if state.endpoint >= self.endpoints() {
            return Err(Error::invalid(format!(
                "endpoint {} is not one of the tier's {}",
                state.endpoint,
                self.endpoints()
            )));
        }
        {
            let mut served = self.states().write();
            if served.get(&state.key).is_some_and(|s| s.name == state.name) {
                served.remove(&state.key);
            }
        }
        let store = self.store(state.endpoint);
        let path = Path::from(state.name.as_str());
        match self.call(async move { store.delete(&path).await }) {
            Fetch::Got(()) | Fetch::Gone => Ok(()),
            Fetch::Failed(e) => {
                self.count_io_error();
                Err(Error::new(
                    ErrorKind::Unavailable,
                    format!("cannot delete remote state object `{}`", state.name),
                )
                .with_source(e))
            }
        }
    }

    /// How many state objects the tier serves.
    pub fn state_count(&self) -> usize {
        self.states().read().len()
    }

    /// [`SnapshotStore::get_snapshot`]'s read through object_store: the object and the
    /// CRC-32C of its bytes after the header.
    fn get_state_via_store(&self, name: &str, endpoint: usize, limit: u64) -> Fetch<(Bytes, u32)> {
        let header = header_bytes(self.signing_key());
        let store = self.store(endpoint);
        let path = Path::from(name);
        let pool = self.recv_pool().clone();
        self.call(async move {
            let got = store.get(&path).await?;
            let too_large = || object_store::Error::Generic {
                store: "kvtier-remote",
                source: "a state object larger than any state".into(),
            };
            if got.meta.size > limit {
                return Err(too_large());
            }
            // Into a reused receive buffer, as ranged GETs of blocks (see `recv.rs`).
            let mut buf = pool.take(got.meta.size as usize);
            // The state's checksum is computed chunk by chunk as the body arrives, while
            // the next chunk is on its way, not in one pass after the last one.
            let mut digest = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
            let mut body = got.into_stream();
            while let Some(chunk) = body.next().await {
                let chunk = chunk?;
                if (buf.len() + chunk.len()) as u64 > limit {
                    return Err(too_large());
                }
                let skip = header.saturating_sub(buf.len()).min(chunk.len());
                digest.update(&chunk[skip..]);
                buf.extend_from_slice(&chunk);
            }
            Ok((pool.freeze(buf), digest.finalize() as u32))
        })
    }
}

impl SnapshotStore for RemoteTier {
    fn remove_layout_snapshots(&self, layout: LayoutDigest) -> Result<u64> {
        // This replica stops serving them; the objects in the shared store go with the
        // layout's other objects (`Tier::remove_layout`: deleted here, or by the cluster's
        // GC once the delete is recorded).
        let before = self.state_count();
        self.states().write().retain(|_, s| s.layout != layout);
        Ok((before - self.state_count()) as u64)
    }

    fn put_snapshot(&self, key: &SnapshotKey, layout: LayoutDigest, blob: &Bytes) -> Result<()> {
        if self.states().read().contains_key(key) {
            return Ok(()); // immutable by name: one valid state under a key is enough
        }
        if blob.len() as u64 > MAX_STATE_BYTES {
            return Err(Error::invalid(format!(
                "a state of {} bytes; the remote tier keeps states up to {MAX_STATE_BYTES} bytes",
                blob.len()
            )));
        }
        let name = state_object_name(&self.config().prefix, &layout, key);
        let endpoint = self.target_of(&name);
        // A state that shrinks is stored as a frame of the tier's codec (ADR 0021).
        let (stored, encoded) = match self.coder().encode_state(layout, blob) {
            Some(e) => {
                let encoded = EncodedState {
                    codec: e.codec,
                    decoded_len: blob.len() as u64,
                };
                (Bytes::from(e.frame), Some(encoded))
            }
            None => (blob.clone(), None),
        };
        // The header and the state go out as two parts of one body: the state is not
        // copied to sit behind its header.
        let head = Bytes::from(header(key, &layout, &stored, self.signing_key(), encoded));
        let payload: PutPayload = [head, stored].into_iter().collect();
        let store = self.store(endpoint);
        let path = Path::from(name.as_str());
        self.count_put();
        match self.call(async move { store.put(&path, payload).await.map(|_| ()) }) {
            Fetch::Got(()) => {}
            Fetch::Gone => {
                return Err(Error::new(
                    ErrorKind::Unavailable,
                    "remote state write failed: the bucket does not exist",
                ));
            }
            Fetch::Failed(e) => {
                self.count_io_error();
                return Err(
                    Error::new(ErrorKind::Unavailable, "remote state write failed").with_source(e),
                );
            }
        }
        let state = StateName {
            endpoint,
            name,
            layout,
            key: *key,
        };
        self.states().write().insert(*key, Arc::new(state.clone()));
        self.catalog().wrote_state(&state, blob.len() as u64);
        Ok(())
    }

    fn get_snapshot(&self, key: &SnapshotKey) -> Result<Option<Bytes>> {
        let Some(state) = self.states().read().get(key).cloned() else {
            return Ok(None);
        };
        self.count_get();
        // A body past any state the tier writes is not one of its objects: refused before
        // anything is allocated for it.
        let header = header_bytes(self.signing_key());
        let limit = MAX_STATE_BYTES + header as u64;
        let read = match self.direct_for(state.endpoint, &state.name) {
            Some(direct) => direct
                .get(&state.name, None, limit, Some(header), self.recv_pool())
                .map(|got| (self.recv_pool().freeze(got.body), got.crc)),
            None => self.get_state_via_store(&state.name, state.endpoint, limit),
        };
        match read {
            Fetch::Got((object, state_crc)) => {
                let verified =
                    verified_state(&object, key, &state.layout, state_crc, self.signing_key())
                        .and_then(|v| {
                            decoded_state(self.coder(), v)
                                .map_err(|_| StateRefusal::Damaged("the frame does not decode"))
                        });
                match verified {
                    Ok(blob) => Ok(Some(blob)),
                    Err(why) => {
                        match why {
                            StateRefusal::Unsigned => self.count_unsigned(),
                            StateRefusal::Damaged(_) => self.count_corrupt(),
                        }
                        tracing::error!(object = %state.name, ?why, "remote state object failed verification; forgetting it");
                        self.forget_state(key);
                        Ok(None)
                    }
                }
            }
            Fetch::Gone => {
                tracing::info!(object = %state.name, "remote state object is gone; forgetting it");
                self.forget_state(key);
                Ok(None)
            }
            Fetch::Failed(e) => {
                self.count_io_error();
                tracing::warn!(object = %state.name, error = %e, "remote state read failed; a miss");
                Ok(None)
            }
        }
    }

    fn contains_snapshot(&self, key: &SnapshotKey) -> bool {
        self.states().read().contains_key(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_foreign_names_are_refused() {
        let layout = LayoutDigest([7; 16]);
        let key = SnapshotKey([9; 32]);
        let name = state_object_name("pre", &layout, &key);
        assert_eq!(parse_state_name("pre", &name), Some((layout, key)));
        assert_eq!(parse_state_name("other", &name), None);
        assert_eq!(parse_state_name("pre", &name.replace(".kvs", ".kvo")), None);
        assert_eq!(parse_state_name("pre", "pre/state/abc/def.kvs"), None);
    }

    #[test]
    fn every_damage_to_a_state_object_is_refused() {
        let (layout, key) = (LayoutDigest([1; 16]), SnapshotKey([2; 32]));
        let state: Vec<u8> = (0..1000u32).map(|i| (i * 31) as u8).collect();
        let mut whole = header(&key, &layout, &state, None, None);
        whole.extend_from_slice(&state);
        let good = Bytes::from(whole.clone());
        let check = |o: &Bytes, key: &SnapshotKey, layout: &LayoutDigest| {
            let tail = o.get(HEADER_BYTES..).unwrap_or_default();
            verified_state(o, key, layout, crc(tail), None).map(|v| v.stored)
        };
        assert_eq!(check(&good, &key, &layout).as_deref(), Ok(&state[..]));
        assert!(check(&good, &SnapshotKey([3; 32]), &layout).is_err());
        assert!(check(&good, &key, &LayoutDigest([4; 16])).is_err());
        assert!(check(&good.slice(..good.len() - 1), &key, &layout).is_err());
        assert!(check(&good.slice(..50), &key, &layout).is_err());
        // One flipped bit anywhere, header or state, is caught.
        for at in [0, 9, 20, 50, 66, 73, 93, HEADER_BYTES, whole.len() - 1] {
            let mut bad = whole.clone();
            bad[at] ^= 0x10;
            assert!(
                check(&Bytes::from(bad), &key, &layout).is_err(),
                "a flip at byte {at} was served"
            );
        }
    }

    #[test]
    fn an_encoded_state_decodes_to_its_own_bytes_and_any_damage_is_refused() {
        use kvtier_codec::{CodecConfig, Element, Shape};
        let (layout, key) = (LayoutDigest([1; 16]), SnapshotKey([2; 32]));
        let ours = SigningKey::from_bytes(&[5; 32]);
        let coder = PageCoder::new(CodecConfig::default());
        // f32 words of a smooth signal: the byte planes shrink.
        let state: Vec<u8> = (0..8192u32)
            .flat_map(|i| ((i % 97) as f32 * 0.25).to_le_bytes())
            .collect();
        let shape = Shape {
            element: Element::Bytes { width: 4 },
            group: 1,
        };
        let frame =
            kvtier_codec::frame::encode(Codec::Lossless, shape, &state, 16 << 10, 1).unwrap();
        assert!(frame.len() < state.len());
        let encoded = EncodedState {
            codec: Codec::Lossless,
            decoded_len: state.len() as u64,
        };
        for signing in [None, Some(&ours)] {
            let at = header_bytes(signing);
            let mut whole = header(&key, &layout, &frame, signing, Some(encoded));
            whole.extend_from_slice(&frame);
            let check = |o: &[u8]| {
                let o = Bytes::copy_from_slice(o);
                let tail = crc(o.get(at..).unwrap_or_default());
                let v = verified_state(&o, &key, &layout, tail, signing)?;
                decoded_state(&coder, v).map_err(|_| StateRefusal::Damaged("decode"))
            };
            assert_eq!(check(&whole).as_deref(), Ok(&state[..]));
            // One flipped bit anywhere — the codec byte, the decoded length, the frame's
            // table or its segments — is never served.
            for flip in [CODEC_AT, DECODED_LEN_AT, at, at + 12, at + frame.len() / 2] {
                let mut bad = whole.clone();
                bad[flip] ^= 0x04;
                assert!(check(&bad).is_err(), "a flip at byte {flip} was served");
            }
            if signing.is_none() {
                // Damage inside the frame with the object's checksums made to match: the
                // frame's own checksums of the decoded state refuse it.
                let mut forged = whole.clone();
                let last = forged.len() - 1;
                forged[last] ^= 0x01;
                let state_crc = crc(&forged[at..]);
                forged[72..76].copy_from_slice(&state_crc.to_le_bytes());
                let own = crc(&forged[..at - 4]);
                forged[at - 4..at].copy_from_slice(&own.to_le_bytes());
                assert!(check(&forged).is_err(), "a re-checksummed frame was served");
                // A codec this build does not know is refused, not guessed at.
                let mut unknown = whole.clone();
                unknown[CODEC_AT] = 0xee;
                let own = crc(&unknown[..at - 4]);
                unknown[at - 4..at].copy_from_slice(&own.to_le_bytes());
                assert_eq!(check(&unknown), Err(StateRefusal::Damaged("unknown codec")));
            }
        }
    }

    #[test]
    fn with_a_key_only_an_object_signed_with_it_is_served() {
        let (layout, key) = (LayoutDigest([1; 16]), SnapshotKey([2; 32]));
        let ours = SigningKey::from_bytes(&[5; 32]);
        let theirs = SigningKey::from_bytes(&[6; 32]);
        let state: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        let object = |signing: Option<&SigningKey>, state: &[u8]| {
            let mut whole = header(&key, &layout, state, signing, None);
            whole.extend_from_slice(state);
            Bytes::from(whole)
        };
        let check = |o: &Bytes| {
            let tail = o.get(SIGNED_HEADER_BYTES..).unwrap_or_default();
            verified_state(o, &key, &layout, crc(tail), Some(&ours)).map(|v| v.stored)
        };
        assert_eq!(
            check(&object(Some(&ours), &state)).as_deref(),
            Ok(&state[..])
        );
        // Unsigned, or signed with another key: not served, and said so.
        assert_eq!(check(&object(None, &state)), Err(StateRefusal::Unsigned));
        assert_eq!(
            check(&object(Some(&theirs), &state)),
            Err(StateRefusal::Unsigned)
        );
        // A forger who rewrites the state and every checksum but cannot sign it.
        let mut forged = object(Some(&ours), &state).to_vec();
        forged[SIGNED_HEADER_BYTES + 10] ^= 0xff;
        let state_crc = crc(&forged[SIGNED_HEADER_BYTES..]);
        forged[72..76].copy_from_slice(&state_crc.to_le_bytes());
        let own = crc(&forged[..SIGNED_HEADER_BYTES - 4]);
        forged[SIGNED_HEADER_BYTES - 4..SIGNED_HEADER_BYTES].copy_from_slice(&own.to_le_bytes());
        assert_eq!(check(&Bytes::from(forged)), Err(StateRefusal::Unsigned));
        // A signed object read by a tier without the key is not one it reads.
        let signed = object(Some(&ours), &state);
        let tail = signed.slice(HEADER_BYTES..);
        assert!(verified_state(&signed, &key, &layout, crc(&tail), None).is_err());
    }
}
