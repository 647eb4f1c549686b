//! Records signed with the cluster's signing key (`kvtier_remote::sign`): a party that can
//! write etcd but does not hold the key cannot make a replica adopt an advertisement,
//! delete with a tombstone or a delete marker, or serve a state of its choosing.
//!
//! A signed value is the record's JSON, a newline, and the hex tag of the key it is
//! stored under and the JSON: `{"v":1,…}\n5f3a…`. The key is signed with the value, so a
//! valid record copied under another key (another run, another layout) does not verify.
//! A replica with a key refuses every record that is unsigned or whose tag does not hold,
//! and counts it (`cluster_records_forged`); a replica without one reads both kinds (it
//! has nothing to check them with).
//!
//! Member keys and generation counters are not signed: they carry liveness and fencing,
//! which whoever can write etcd can disturb anyway by deleting keys — a denial, never
//! bytes served (docs/adr/0020-trust.md).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use kvtier_remote::SigningKey;
use kvtier_remote::sign::constant_time_eq;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Hex digits of a record's tag.
const TAG_HEX: usize = 64;

/// How a cluster's records are signed and checked: its key, if it has one, and the count
/// of records refused for their signature.
#[derive(Debug, Clone, Default)]
pub struct RecordSigning {
    key: Option<SigningKey>,
    forged: Arc<AtomicU64>,
}

/// Why a record is not used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unreadable {
    /// Unsigned, or its tag does not hold under this cluster's key.
    Forged,
    /// Not a record this build reads.
    Malformed(String),
}

impl std::fmt::Display for Unreadable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Forged => f.write_str("not signed with this cluster's key"),
            Self::Malformed(why) => f.write_str(why),
        }
    }
}

impl RecordSigning {
    /// Signing with `key` (none: records are written and read unsigned), refusals counted
    /// into `forged`.
    pub fn new(key: Option<SigningKey>, forged: Arc<AtomicU64>) -> Self {
        Self { key, forged }
    }

    /// Whether records are signed.
    pub fn signs(&self) -> bool {
        self.key.is_some()
    }

    /// The value to store `record` under etcd key `key`.
    pub fn seal<T: Serialize>(&self, key: &str, record: &T) -> String {
        let mut value = serde_json::to_string(record).unwrap_or_default();
        if let Some(signing) = &self.key {
            let tag = signing.record_tag(key.as_bytes(), value.as_bytes());
            value.push('\n');
            value.push_str(&kvtier_core::hash::hex(&tag));
        }
        value
    }

    /// The record stored as `value` under `key`, if it is one this build reads and, with
    /// a key, signed with it (a forged one is counted).
    pub fn open<T: DeserializeOwned>(&self, key: &[u8], value: &[u8]) -> Result<T, Unreadable> {
        let (json, tag) = split(value);
        if let Some(signing) = &self.key {
            let holds =
                tag.is_some_and(|tag| constant_time_eq(&signing.record_tag(key, json), &tag));
            if !holds {
                self.forged.fetch_add(1, Ordering::Relaxed);
                return Err(Unreadable::Forged);
            }
        }
        serde_json::from_slice(json).map_err(|e| Unreadable::Malformed(e.to_string()))
    }

    /// Records refused for their signature so far.
    pub fn forged(&self) -> u64 {
        self.forged.load(Ordering::Relaxed)
    }
}

/// A value's JSON and its tag, if it ends in `\n` and 64 hex digits.
fn split(value: &[u8]) -> (&[u8], Option<[u8; 32]>) {
    let Some(cut) = value.len().checked_sub(TAG_HEX + 1) else {
        return (value, None);
    };
    if value[cut] != b'\n' {
        return (value, None);
    }
    let tag = std::str::from_utf8(&value[cut + 1..])
        .ok()
        .and_then(kvtier_core::hash::unhex::<32>);
    match tag {
        Some(tag) => (&value[..cut], Some(tag)),
        None => (value, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::LayoutDeleted;

    fn marker() -> LayoutDeleted {
        LayoutDeleted {
            v: 1,
            by: "a".into(),
            at_ms: 5,
        }
    }

    #[test]
    fn a_signed_record_opens_only_under_its_key_with_the_same_signing_key() {
        let ours = RecordSigning::new(Some(SigningKey::from_bytes(&[1; 32])), Arc::default());
        let theirs = RecordSigning::new(Some(SigningKey::from_bytes(&[2; 32])), Arc::default());
        let unsigned = RecordSigning::default();
        let value = ours.seal("k/deleted/aa", &marker());
        assert_eq!(
            ours.open::<LayoutDeleted>(b"k/deleted/aa", value.as_bytes()),
            Ok(marker())
        );
        // Under another key, by another cluster key, or unsigned: forged, and counted.
        assert_eq!(
            ours.open::<LayoutDeleted>(b"k/deleted/bb", value.as_bytes()),
            Err(Unreadable::Forged)
        );
        assert_eq!(
            theirs.open::<LayoutDeleted>(b"k/deleted/aa", value.as_bytes()),
            Err(Unreadable::Forged)
        );
        let plain = unsigned.seal("k/deleted/aa", &marker());
        assert!(!plain.contains('\n'));
        assert_eq!(
            ours.open::<LayoutDeleted>(b"k/deleted/aa", plain.as_bytes()),
            Err(Unreadable::Forged)
        );
        // A changed byte of the JSON, the tag kept.
        let edited = value.replacen("\"by\":\"a\"", "\"by\":\"b\"", 1);
        assert_eq!(
            ours.open::<LayoutDeleted>(b"k/deleted/aa", edited.as_bytes()),
            Err(Unreadable::Forged)
        );
        assert_eq!(ours.forged(), 3);
        assert_eq!(theirs.forged(), 1);
        // A replica without a key reads signed and unsigned records alike.
        assert_eq!(
            unsigned.open::<LayoutDeleted>(b"k/deleted/aa", value.as_bytes()),
            Ok(marker())
        );
        assert_eq!(
            unsigned.open::<LayoutDeleted>(b"k/deleted/aa", plain.as_bytes()),
            Ok(marker())
        );
        assert!(matches!(
            unsigned.open::<LayoutDeleted>(b"k", b"not json"),
            Err(Unreadable::Malformed(_))
        ));
    }
}
