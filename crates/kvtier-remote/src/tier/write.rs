//! The write path: the blocks of a store become run objects (consecutive blocks of one
//! chain, the longer prefix repeated from an object that starts at the chain's root),
//! each page encoded by the tier's codec where it shrinks, data first, manifest last.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use kvtier_core::hash::BlockHash;
use kvtier_core::tier::{BlockMeta, TierKind};
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};
use sha2::{Digest, Sha256};

use crate::object::{Encoded, Manifest, RunObject, Spans, crc, names};
use crate::s3::{CallError, Fetch};

use super::{RemoteTier, Slot};

/// Why writing a run failed.
#[derive(Debug, thiserror::Error)]
pub(super) enum WriteError {
    #[error("empty run")]
    EmptyRun,
    #[error("the run's object would be larger than 2^64 bytes")]
    TooLarge,
    #[error("cannot encode the manifest")]
    Manifest(#[source] serde_json::Error),
    #[error("the bucket does not exist")]
    NoBucket,
    #[error(transparent)]
    Call(CallError),
}

/// Blocks as they go into a run object: their stored bytes (payload or frame) and what
/// the manifest says of each.
#[derive(Default)]
pub(super) struct Stored {
    metas: Vec<BlockMeta>,
    crcs: Vec<u32>,
    tags: Vec<[u8; crate::sign::BLOCK_TAG_BYTES]>,
    encoded: Vec<Option<Encoded>>,
    bytes: Vec<Bytes>,
}

impl RemoteTier {
    /// The stored bytes of the run that ends with `parent` from the chain's root, if one
    /// object of `block_bytes` blocks holds it from position 0 and it can be read in time
    /// (as stored: frames are copied, not decoded and encoded again).
    pub(super) fn ancestors(&self, parent: &BlockHash, block_bytes: u64) -> Option<Stored> {
        let slot = self.blocks.read().get(parent).cloned()?;
        if slot.object.metas.first()?.position != 0 || slot.object.block_bytes != block_bytes {
            return None;
        }
        let (object, bytes) = self.fetch_stored(&slot.object, 0..slot.index + 1).ok()?;
        let tags = object.tags.get(..=slot.index).unwrap_or_default().to_vec();
        if self.config.signing_key.is_some() && tags.len() != bytes.len() {
            return None;
        }
        Some(Stored {
            metas: object.metas[..=slot.index].to_vec(),
            crcs: object.crcs[..=slot.index].to_vec(),
            tags,
            encoded: (0..=slot.index).map(|i| object.spans.encoded(i)).collect(),
            bytes,
        })
    }

    /// Writes one run (consecutive blocks of one chain) as one object, its ancestors first
    /// when they can be had; with `encode`, each new page goes through the tier's codec.
    pub(super) fn write_run(
        &self,
        run: &[(BlockMeta, Bytes)],
        encode: bool,
    ) -> std::result::Result<(), WriteError> {
        let (first, _) = run.first().ok_or(WriteError::EmptyRun)?;
        let block_bytes = run[0].1.len() as u64;
        let before = if first.position > 0 {
            self.ancestors(&first.parent, block_bytes)
        } else {
            None
        };
        let Stored {
            mut metas,
            mut crcs,
            mut tags,
            mut encoded,
            mut bytes,
        } = before.unwrap_or_default();
        let key = self.config.signing_key.as_ref();
        for (m, p) in run {
            let frame = encode
                .then(|| self.coder.encode_block(m.layout, p))
                .flatten();
            let (b, e) = match frame {
                Some(f) => {
                    let e = Encoded {
                        codec: f.codec,
                        bytes: f.frame.len() as u64,
                    };
                    (Bytes::from(f.frame), Some(e))
                }
                None => (p.clone(), None),
            };
            metas.push(m.clone());
            crcs.push(crc(&b));
            if let Some(key) = key {
                tags.push(key.block_tag(&b));
            }
            encoded.push(e);
            bytes.push(b);
        }
        let spans = Spans::of(encoded, block_bytes).ok_or(WriteError::TooLarge)?;
        let writer = self
            .catalog
            .writer_tag()
            .filter(|t| crate::object::valid_writer_tag(t));
        let (data_name, manifest_name) =
            names(&self.config.prefix, &metas, writer.as_deref()).ok_or(WriteError::EmptyRun)?;
        let manifest = Manifest::of(&metas, &crcs, &tags, block_bytes, &spans, writer)
            .ok_or(WriteError::EmptyRun)?
            .to_bytes(key)
            .map_err(WriteError::Manifest)?;
        let manifest_digest: [u8; 32] = Sha256::digest(&manifest).into();
        // The blocks go out as parts of one body, not copied into one buffer first.
        let data: PutPayload = bytes.into_iter().collect();
        let target = self.target_of(&data_name);
        let store = self.stores[target].clone();
        let (dpath, mpath) = (
            Path::from(data_name.as_str()),
            Path::from(manifest_name.as_str()),
        );
        self.counters.puts.fetch_add(1, Ordering::Relaxed);
        // Data first, manifest last: the manifest is the commit point.
        match self.call(async move {
            store.put(&dpath, data).await?;
            store.put(&mpath, PutPayload::from(manifest)).await?;
            Ok(())
        }) {
            Fetch::Got(()) => {}
            Fetch::Gone => return Err(WriteError::NoBucket),
            Fetch::Failed(e) => return Err(WriteError::Call(e)),
        }
        let object = Arc::new(RunObject {
            target,
            data_name,
            metas,
            crcs,
            tags,
            block_bytes,
            spans,
            pending: None,
        });
        self.objects
            .write()
            .insert(object.data_name.clone(), object.clone());
        let mut blocks = self.blocks.write();
        for (i, m) in object.metas.iter().enumerate() {
            let new = !blocks.contains_key(&m.hash);
            blocks.insert(
                m.hash,
                Slot {
                    object: object.clone(),
                    index: i,
                },
            );
            if new {
                self.sink.inserted(TierKind::Remote, m);
            }
        }
        drop(blocks);
        self.catalog
            .wrote(&object.info(manifest_name, manifest_digest));
        Ok(())
    }
}

/// Splits `items` into runs: consecutive blocks of one chain (each the parent of the
/// next, same layout and size), at most `max` blocks each.
pub(super) fn runs(items: &[(BlockMeta, Bytes)], max: usize) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    for i in 1..=items.len() {
        let cut = i == items.len()
            || i - start >= max
            || items[i].0.parent != items[i - 1].0.hash
            || items[i].0.layout != items[i - 1].0.layout
            || items[i].1.len() != items[i - 1].1.len();
        if cut {
            out.push(start..i);
            start = i;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    fn meta(hash: u8, parent: u8) -> (BlockMeta, Bytes) {
        (
            BlockMeta {
                layout: kvtier_core::layout::LayoutDigest([7; 16]),
                hash: BlockHash([hash; 16]),
                parent: BlockHash([parent; 16]),
                position: 0,
                tokens: Arc::from(&[1u32][..]),
                extra_tag: None,
            },
            Bytes::from_static(b"abcd"),
        )
    }

    #[test]
    fn runs_cut_where_the_chain_breaks_or_grows_too_long() {
        let items = vec![meta(1, 0), meta(2, 1), meta(3, 2), meta(9, 8), meta(10, 9)];
        assert_eq!(runs(&items, 100), vec![0..3, 3..5]);
        assert_eq!(runs(&items, 2), vec![0..2, 2..3, 3..5]);
        assert!(runs(&[], 4).is_empty());
    }
}
