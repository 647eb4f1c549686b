//! Golden fixture of on-disk format v2: a raw record header (version 1, unchanged since
//! before codecs), an encoded record header (version 2), a segment header and both kinds
//! of index entry, as hex. A change to any byte fails here,
//! so a format change is always deliberate (bump `FORMAT_VERSION`, update
//! docs/ssd-format.md, then `INSTA_UPDATE=always cargo test -p kvtier-ssd --test format_golden`).

#![allow(clippy::unwrap_used, reason = "test code")]

use kvtier_codec::Codec;
use kvtier_core::hash::{BlockHash, hex};
use kvtier_core::layout::LayoutDigest;
use kvtier_ssd::format::{
    Encoding, FORMAT_VERSION, IndexEntry, Kind, RAW_RECORD_VERSION, RecordHeader, SegmentHeader,
    chunk_crcs, decode_index_entries, encode_index_entry,
};

fn header() -> RecordHeader {
    let payload: Vec<u8> = (0..1500u32).map(|i| (i * 7) as u8).collect();
    let mut key = [0u8; 32];
    key[..16].copy_from_slice(&[0xab; 16]);
    RecordHeader {
        kind: Kind::Block,
        layout: LayoutDigest([0x11; 16]),
        key,
        parent: BlockHash([0x22; 16]),
        position: 3,
        tokens: vec![1, 2, 3, 4],
        extra_tag: Some([0x33; 16]),
        payload_len: payload.len() as u64,
        created_ms: 1_700_000_000_000,
        chunk_log2: 9,
        chunk_crcs: chunk_crcs(&payload, 9),
        encoding: None,
    }
}

fn dump(bytes: &[u8]) -> String {
    bytes.chunks(32).map(hex).collect::<Vec<_>>().join("\n")
}

#[test]
fn format_version_is_2_and_raw_records_stay_version_1() {
    assert_eq!(FORMAT_VERSION, 2);
    assert_eq!(RAW_RECORD_VERSION, 1);
    assert_eq!(header().encode()[4..6], [1, 0]);
}

#[test]
fn encoded_record_header_bytes() {
    let mut h = header();
    h.encoding = Some(Encoding {
        codec: Codec::Lossless,
        decoded_len: 4096,
    });
    let bytes = h.encode();
    assert_eq!(bytes[4..6], [2, 0]);
    assert_eq!(bytes[113], Codec::Lossless.code());
    assert_eq!(RecordHeader::decode(&bytes).unwrap(), h);
    assert_eq!(h.decoded_len(), 4096);
    // A version-2 header naming no codec (or raw, or one this build does not know) is
    // damaged: never read as a raw payload.
    for code in [0u8, 9] {
        let mut bad = bytes.clone();
        bad[113] = code;
        let crc = kvtier_ssd::format::crc_of(&[&bad[..124], &bad[128..]]);
        bad[124..128].copy_from_slice(&crc.to_le_bytes());
        assert!(RecordHeader::decode(&bad).is_err(), "codec {code}");
    }
    insta::assert_snapshot!(dump(&bytes));
}

#[test]
fn record_header_bytes() {
    let h = header();
    let bytes = h.encode();
    assert_eq!(bytes.len() as u64, h.meta_len());
    assert_eq!((h.payload_offset(), h.record_len()), (4096, 8192));
    assert_eq!(RecordHeader::decode(&bytes).unwrap(), h);
    insta::assert_snapshot!(dump(&bytes));
}

#[test]
fn segment_header_bytes() {
    let h = SegmentHeader {
        id: 7,
        created_ms: 1_700_000_000_000,
    };
    let bytes = h.encode();
    assert_eq!(bytes.len(), 4096);
    assert!(bytes[36..].iter().all(|b| *b == 0));
    assert_eq!(SegmentHeader::decode(&bytes), Some(h));
    insta::assert_snapshot!(dump(&bytes[..36]));
}

#[test]
fn index_entries_bytes() {
    let entries = vec![
        IndexEntry::Record {
            offset: 4096,
            header: header(),
        },
        IndexEntry::Tombstone {
            offset: 4096,
            key: header().key,
        },
    ];
    let mut bytes = Vec::new();
    for e in &entries {
        bytes.extend_from_slice(&encode_index_entry(e));
    }
    let (decoded, valid) = decode_index_entries(&bytes);
    assert_eq!((decoded, valid), (entries, bytes.len()));
    insta::assert_snapshot!(dump(&bytes));
}

#[test]
fn any_single_flipped_bit_in_a_header_is_caught() {
    let bytes = header().encode();
    for i in 0..bytes.len() {
        for bit in 0..8 {
            let mut b = bytes.clone();
            b[i] ^= 1 << bit;
            assert!(
                RecordHeader::decode(&b).is_err(),
                "flip of byte {i} bit {bit} went unnoticed"
            );
        }
    }
}
