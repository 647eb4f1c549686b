//! The exact-prefix key of a snapshot.

use std::fmt;

use sha2::{Digest, Sha256};

use crate::hash::BlockHash;
use crate::layout::LayoutDigest;

/// Layout digest ⊕ hash of the exact full prompt ⊕ optional session key, as one SHA-256.
/// Any difference in any token, in the prompt's length, in the layout or in the session
/// gives another key.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SnapshotKey(pub [u8; 32]);

impl SnapshotKey {
    /// The key of the state reached after `tokens` under `layout`, for `session` if given.
    pub fn new(layout: LayoutDigest, tokens: &[u32], session: Option<&[u8]>) -> Self {
        let mut h = Sha256::new();
        h.update(b"kvtier/snapshot/v1");
        h.update(layout.0);
        match session {
            None => h.update([0u8]),
            Some(s) => {
                h.update([1u8]);
                h.update((s.len() as u64).to_le_bytes());
                h.update(s);
            }
        }
        h.update((tokens.len() as u64).to_le_bytes());
        let mut buf = [0u8; 4096];
        for chunk in tokens.chunks(buf.len() / 4) {
            for (dst, t) in buf.chunks_exact_mut(4).zip(chunk) {
                dst.copy_from_slice(&t.to_le_bytes());
            }
            h.update(&buf[..chunk.len() * 4]);
        }
        SnapshotKey(h.finalize().into())
    }

    /// The key of a checkpoint: the recurrent state reached after the first `blocks`
    /// whole blocks of a prompt whose block `blocks - 1` hashes to `last`. The block hash
    /// already names the layout, every earlier token and the extra keys (see
    /// [`crate::hash`]); the layout and the count are hashed again so no checkpoint key
    /// can equal another's or an exact-prefix snapshot's (another domain string).
    pub fn checkpoint(layout: LayoutDigest, last: BlockHash, blocks: usize) -> Self {
        let mut h = Sha256::new();
        h.update(b"kvtier/checkpoint/v1");
        h.update(layout.0);
        h.update(last.0);
        h.update((blocks as u64).to_le_bytes());
        SnapshotKey(h.finalize().into())
    }
}

impl fmt::Debug for SnapshotKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SnapshotKey({})", crate::hash::hex(&self.0))
    }
}
