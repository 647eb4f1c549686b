//! vLLM's KV-event wire format: the msgpack payload of one message.
//!
//! An `EventBatch` is encoded as an array `[ts, events, data_parallel_rank]` (vLLM's
//! `array_like` struct); each event as a map tagged by its class name under `"type"` (vLLM's
//! `tag=True` structs), with every field vLLM declares without a default present (as nil
//! when unknown) and defaulted fields present only when set. Decoders that ignore unknown
//! map keys (msgspec, serde) read it as vLLM's own events.

/// A block hash on the wire: kvtier's 16-byte chain hash, as msgpack bytes (vLLM's
/// `ExternalBlockHash` is `bytes | int`).
pub type WireHash = [u8; 16];

/// One event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireEvent {
    /// `BlockStored`: a run of blocks, each the child of the one before, now held.
    Stored {
        /// The blocks, parent first.
        hashes: Vec<WireHash>,
        /// The first block's parent; `None` for the first block of a prompt.
        parent: Option<WireHash>,
        /// Every block's tokens, concatenated (empty when not known: a block another
        /// replica advertised, whose tokens are checked when it is read).
        tokens: Vec<u32>,
        /// Tokens per block.
        block_size: u32,
        /// Where: the tier.
        medium: &'static str,
        /// `LOCAL` or `REMOTE` relative to this process.
        locality: &'static str,
    },
    /// `BlockRemoved`: blocks no longer held by one tier.
    Removed {
        /// The blocks.
        hashes: Vec<WireHash>,
        /// The tier.
        medium: &'static str,
        /// `LOCAL` or `REMOTE`.
        locality: &'static str,
    },
    /// `AllBlocksCleared`: forget everything this publisher said before.
    AllCleared,
}

/// Who generated the events (vLLM's `ownership`: the offloading tier's name).
pub const OWNERSHIP: &str = "kvtier";

/// The payload of one message: `events` as one `EventBatch` stamped `ts` (Unix seconds).
pub fn encode_batch(ts: f64, events: &[WireEvent], data_parallel_rank: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + events.len() * 64);
    let w = &mut out;
    array_len(w, 3);
    f64_(w, ts);
    array_len(w, events.len());
    for e in events {
        event(w, e);
    }
    uint(w, u64::from(data_parallel_rank));
    out
}

fn event(w: &mut Vec<u8>, e: &WireEvent) {
    match e {
        WireEvent::Stored {
            hashes,
            parent,
            tokens,
            block_size,
            medium,
            locality,
        } => {
            map_len(w, 10);
            str_(w, "type");
            str_(w, "BlockStored");
            str_(w, "block_hashes");
            hash_list(w, hashes);
            str_(w, "parent_block_hash");
            match parent {
                Some(p) => bin(w, p),
                None => nil(w),
            }
            str_(w, "token_ids");
            array_len(w, tokens.len());
            for t in tokens {
                uint(w, u64::from(*t));
            }
            str_(w, "block_size");
            uint(w, u64::from(*block_size));
            // kvtier keys adapters through the layout, not a LoRA id: declared, unknown.
            str_(w, "lora_id");
            nil(w);
            str_(w, "medium");
            str_(w, medium);
            str_(w, "lora_name");
            nil(w);
            str_(w, "locality");
            str_(w, locality);
            str_(w, "ownership");
            str_(w, OWNERSHIP);
        }
        WireEvent::Removed {
            hashes,
            medium,
            locality,
        } => {
            map_len(w, 5);
            str_(w, "type");
            str_(w, "BlockRemoved");
            str_(w, "block_hashes");
            hash_list(w, hashes);
            str_(w, "medium");
            str_(w, medium);
            str_(w, "locality");
            str_(w, locality);
            str_(w, "ownership");
            str_(w, OWNERSHIP);
        }
        WireEvent::AllCleared => {
            map_len(w, 1);
            str_(w, "type");
            str_(w, "AllBlocksCleared");
        }
    }
}

fn hash_list(w: &mut Vec<u8>, hashes: &[WireHash]) {
    array_len(w, hashes.len());
    for h in hashes {
        bin(w, h);
    }
}

// The msgpack encodings used here (https://github.com/msgpack/msgpack/blob/master/spec.md),
// each in its shortest form.

fn nil(w: &mut Vec<u8>) {
    w.push(0xc0);
}

fn f64_(w: &mut Vec<u8>, v: f64) {
    w.push(0xcb);
    w.extend_from_slice(&v.to_be_bytes());
}

fn uint(w: &mut Vec<u8>, v: u64) {
    if v < 0x80 {
        w.push(v as u8);
    } else if v <= u64::from(u8::MAX) {
        w.extend_from_slice(&[0xcc, v as u8]);
    } else if v <= u64::from(u16::MAX) {
        w.push(0xcd);
        w.extend_from_slice(&(v as u16).to_be_bytes());
    } else if v <= u64::from(u32::MAX) {
        w.push(0xce);
        w.extend_from_slice(&(v as u32).to_be_bytes());
    } else {
        w.push(0xcf);
        w.extend_from_slice(&v.to_be_bytes());
    }
}

/// A length with a short "fix" form below `fix_limit` (`fix_tag | len`) and 16- and 32-bit
/// forms tagged `tag16` and `tag16 + 1`.
fn len_prefix(w: &mut Vec<u8>, len: usize, fix_tag: u8, fix_limit: usize, tag16: u8) {
    if len < fix_limit {
        w.push(fix_tag | len as u8);
    } else if len <= usize::from(u16::MAX) {
        w.push(tag16);
        w.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        w.push(tag16 + 1);
        w.extend_from_slice(&(len as u32).to_be_bytes());
    }
}

fn array_len(w: &mut Vec<u8>, len: usize) {
    len_prefix(w, len, 0x90, 16, 0xdc);
}

fn map_len(w: &mut Vec<u8>, len: usize) {
    len_prefix(w, len, 0x80, 16, 0xde);
}

fn str_(w: &mut Vec<u8>, s: &str) {
    let len = s.len();
    if len < 32 {
        w.push(0xa0 | len as u8);
    } else if len <= usize::from(u8::MAX) {
        w.extend_from_slice(&[0xd9, len as u8]);
    } else {
        len_prefix(w, len, 0, 0, 0xda);
    }
    w.extend_from_slice(s.as_bytes());
}

fn bin(w: &mut Vec<u8>, b: &[u8]) {
    let len = b.len();
    if len <= usize::from(u8::MAX) {
        w.extend_from_slice(&[0xc4, len as u8]);
    } else {
        len_prefix(w, len, 0, 0, 0xc5);
    }
    w.extend_from_slice(b);
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmpv::Value;

    fn decode(bytes: &[u8]) -> Value {
        let mut r = bytes;
        let v = rmpv::decode::read_value(&mut r).unwrap_or(Value::Nil);
        assert!(r.is_empty(), "trailing bytes after the batch");
        v
    }

    fn field<'a>(map: &'a Value, key: &str) -> &'a Value {
        map.as_map()
            .and_then(|m| m.iter().find(|(k, _)| k.as_str() == Some(key)))
            .map(|(_, v)| v)
            .unwrap_or(&Value::Nil)
    }

    #[test]
    fn a_batch_decodes_to_vllms_shape() {
        let stored = WireEvent::Stored {
            hashes: vec![[1; 16], [2; 16]],
            parent: None,
            tokens: (0..64).chain(70_000..70_064).collect(),
            block_size: 64,
            medium: "CPU",
            locality: "LOCAL",
        };
        let removed = WireEvent::Removed {
            hashes: vec![[3; 16]],
            medium: "SSD",
            locality: "LOCAL",
        };
        let bytes = encode_batch(1.5, &[stored, removed, WireEvent::AllCleared], 0);
        let v = decode(&bytes);
        let top = v.as_array().map(Vec::as_slice).unwrap_or_default();
        assert_eq!(top.len(), 3);
        assert_eq!(top[0].as_f64(), Some(1.5));
        assert_eq!(top[2].as_u64(), Some(0));
        let events = top[1].as_array().map(Vec::as_slice).unwrap_or_default();
        assert_eq!(events.len(), 3);

        let s = &events[0];
        assert_eq!(field(s, "type").as_str(), Some("BlockStored"));
        let hashes = field(s, "block_hashes")
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert_eq!(hashes[1].as_slice(), Some(&[2u8; 16][..]));
        assert!(field(s, "parent_block_hash").is_nil());
        let tokens = field(s, "token_ids")
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert_eq!(tokens.len(), 128);
        assert_eq!(tokens[127].as_u64(), Some(70_063));
        assert_eq!(field(s, "block_size").as_u64(), Some(64));
        assert_eq!(field(s, "medium").as_str(), Some("CPU"));
        // Declared without a default in vLLM: present even when unknown.
        for required in ["lora_id", "lora_name"] {
            assert!(
                s.as_map()
                    .is_some_and(|m| m.iter().any(|(k, _)| k.as_str() == Some(required))),
                "{required} missing"
            );
        }

        assert_eq!(field(&events[1], "type").as_str(), Some("BlockRemoved"));
        assert_eq!(field(&events[1], "medium").as_str(), Some("SSD"));
        assert_eq!(field(&events[2], "type").as_str(), Some("AllBlocksCleared"));
    }

    #[test]
    fn lengths_cross_every_form() {
        for n in [0usize, 15, 16, 65_535, 65_536] {
            let hashes = vec![[7u8; 16]; n];
            let bytes = encode_batch(
                0.0,
                &[WireEvent::Removed {
                    hashes,
                    medium: "CPU",
                    locality: "LOCAL",
                }],
                0,
            );
            let v = decode(&bytes);
            let events = v.as_array().and_then(|a| a[1].as_array()).cloned();
            let got = events
                .and_then(|e| field(&e[0], "block_hashes").as_array().map(Vec::len))
                .unwrap_or(usize::MAX);
            assert_eq!(got, n);
        }
        for v in [
            0u64,
            127,
            128,
            255,
            256,
            65_535,
            65_536,
            u64::from(u32::MAX) + 1,
        ] {
            let mut w = Vec::new();
            uint(&mut w, v);
            assert_eq!(decode(&w).as_u64(), Some(v));
        }
        for len in [0usize, 31, 32, 255, 256, 70_000] {
            let s = "x".repeat(len);
            let mut w = Vec::new();
            str_(&mut w, &s);
            assert_eq!(decode(&w).as_str().map(str::len), Some(len));
            let mut w = Vec::new();
            bin(&mut w, s.as_bytes());
            assert_eq!(decode(&w).as_slice().map(<[u8]>::len), Some(len));
        }
    }
}
