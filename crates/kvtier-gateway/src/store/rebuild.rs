//! Rebuilding the in-memory index at open from the records recovery keeps.
//!
//! Recovery hands over the newest record of every record key. A gateway record key names
//! a bucket, an object, an upload or a part, so for each of those at most one record
//! arrives, and the rules here are:
//!
//! - a **deletion marker** (`Deleted`, `BucketDeleted`) is the newest record of its key:
//!   the object (bucket) stays deleted, whatever older copies the segments still hold;
//! - an object **older than its bucket's first record** belongs to an earlier bucket of
//!   the same name (deleted, then created again) and is dropped. "Older" is the record's
//!   place in the log, (segment, offset): a bucket must exist before an object's place in
//!   the log is taken, so a live object always lies after its bucket's first record. A
//!   bucket record that compaction moved names that first place (`since`);
//! - parts of unknown uploads, and objects of unknown buckets, are dropped.

use std::collections::BTreeMap;
use std::sync::Arc;

use kvtier_ssd::format::Kind;
use kvtier_ssd::store::Recovered;

use super::{Bucket, Entry, GatewayStore, Index, Object, Opened, Part, PartView, Rec, Upload};

/// A record's place in the log: later places are newer.
pub(super) fn place(rec: &Rec) -> (u64, u64) {
    (rec.loc.segment, rec.loc.offset)
}

pub(super) fn rebuild(store: &GatewayStore, recovered: Vec<Recovered>) -> Opened {
    let mut opened = Opened::default();
    let mut described = Vec::with_capacity(recovered.len());
    for r in recovered {
        let rec = Rec {
            loc: r.loc,
            header: Arc::new(r.header),
        };
        if rec.header.kind != Kind::Object {
            opened.dropped += 1;
            continue;
        }
        match store.describe(&rec) {
            Some((entry, size)) => described.push((rec, entry, size)),
            None => {
                opened.dropped += 1;
                opened.unreadable += 1;
            }
        }
    }
    // Buckets, then what lives in them, then parts of the uploads.
    described.sort_by_key(|(rec, e, _)| {
        let rank = match e {
            Entry::Bucket { .. } | Entry::BucketDeleted { .. } => 0,
            Entry::Object { .. } | Entry::Upload { .. } | Entry::Deleted { .. } => 1,
            Entry::Part { .. } => 2,
        };
        (rank, place(rec))
    });
    let mut index = Index::default();
    for (rec, entry, size) in described {
        match entry {
            Entry::Bucket {
                bucket,
                public_read,
                location,
                since,
            } => {
                opened.buckets += 1;
                let created_ms = rec.header.created_ms;
                index.buckets.insert(
                    bucket,
                    Bucket {
                        since: since.unwrap_or_else(|| place(&rec)),
                        rec,
                        created_ms,
                        public_read,
                        location,
                        objects: BTreeMap::new(),
                    },
                );
            }
            Entry::Object { bucket, key, info } => match index.buckets.get_mut(&bucket) {
                Some(b) if place(&rec) > b.since => {
                    opened.objects += 1;
                    b.objects.insert(key, Arc::new(Object { rec, size, info }));
                }
                _ => opened.dropped += 1,
            },
            Entry::Deleted { .. } | Entry::BucketDeleted { .. } => opened.markers += 1,
            Entry::Upload {
                bucket,
                key,
                upload_id,
                info,
            } => match index.buckets.get(&bucket) {
                Some(b) if place(&rec) > b.since => {
                    opened.uploads += 1;
                    index.uploads.insert(
                        upload_id,
                        Upload {
                            rec,
                            bucket,
                            key,
                            info,
                            parts: BTreeMap::new(),
                        },
                    );
                }
                _ => opened.dropped += 1,
            },
            Entry::Part {
                upload_id,
                part_number,
                etag,
            } => match index.uploads.get_mut(&upload_id) {
                Some(u) => {
                    let view = PartView {
                        number: part_number,
                        size,
                        etag,
                        modified_ms: rec.header.created_ms,
                    };
                    u.parts.insert(part_number, Part { rec, view });
                }
                None => opened.dropped += 1,
            },
        }
    }
    // Which completed upload each object came from (a retried completion answers 200).
    for (name, b) in &index.buckets {
        for (key, o) in &b.objects {
            if let Some(id) = &o.info.upload_id {
                index
                    .completed
                    .insert(id.clone(), (name.clone(), key.clone()));
            }
        }
    }
    *store.index.write() = index;
    opened
}
