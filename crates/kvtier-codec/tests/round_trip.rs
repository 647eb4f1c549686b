//! Every codec against random pages of every width: the lossless codec gives back exactly
//! what it was given (or declines, and the page is stored raw), fp8 gives back each value
//! within its group's precision, and no stream — cut short, over-long or flipped — makes a
//! decoder panic or write past its output.

use kvtier_codec::{Codec, Element, Shape, decode, encode, lossless};
use proptest::prelude::*;

fn element(width: u8) -> Element {
    match width {
        2 => Element::Bf16,
        4 => Element::F32,
        w => Element::Bytes { width: w },
    }
}

/// Pages that look like KV (a few distinct high bytes), like noise, like zeros, or whose
/// bytes are geometric (a Huffman code deeper than the coder's 11-bit limit).
fn pages() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(
            any::<u64>().prop_map(|x| x.trailing_zeros() as u8),
            0..20000
        ),
        proptest::collection::vec(any::<u8>(), 0..5000),
        proptest::collection::vec(
            prop_oneof![Just(0u8), Just(0x3c), Just(0xbc), any::<u8>()],
            0..5000
        ),
        (0usize..5000).prop_map(|n| vec![0u8; n]),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn lossless_gives_back_every_byte_or_declines(
        page in pages(),
        width in prop_oneof![Just(1u8), Just(2), Just(3), Just(4), Just(8)],
    ) {
        let shape = Shape { element: element(width), group: 1 };
        match encode(Codec::Lossless, shape, &page) {
            Some(enc) => {
                prop_assert!(enc.len() < page.len());
                let mut out = vec![0xAAu8; page.len()];
                decode(Codec::Lossless, &enc, &mut out).unwrap();
                prop_assert_eq!(out, page);
            }
            None => {
                // Declined only because it did not shrink: the stream itself still decodes.
                let enc = lossless::encode(usize::from(width), &page).unwrap();
                prop_assert!(enc.len() >= page.len());
                let mut out = vec![0u8; page.len()];
                decode(Codec::Lossless, &enc, &mut out).unwrap();
                prop_assert_eq!(out, page);
            }
        }
    }

    #[test]
    fn no_damaged_stream_panics(page in pages(), flips in proptest::collection::vec((any::<usize>(), 1u8..), 1..4), cut in any::<usize>()) {
        let shape = Shape { element: Element::Bf16, group: 8 };
        for codec in [Codec::Lossless, Codec::Fp8E4M3] {
            let enc = match codec {
                Codec::Lossless => lossless::encode(2, &page).unwrap(),
                _ => match kvtier_codec::fp8::encode(shape, &page) { Some(e) => e, None => continue },
            };
            let mut bad = enc.clone();
            for (at, x) in &flips {
                if !bad.is_empty() {
                    let i = at % bad.len();
                    bad[i] ^= x;
                }
            }
            let mut out = vec![0u8; page.len()];
            let _ = decode(codec, &bad, &mut out);
            let short = &enc[..cut % (enc.len() + 1)];
            if short.len() < enc.len() {
                prop_assert!(decode(codec, short, &mut out).is_err());
            }
        }
    }

    #[test]
    fn fp8_keeps_each_value_within_its_groups_precision(
        values in proptest::collection::vec(-1000f32..1000f32, 1..2000),
        group in 1u32..300,
    ) {
        let page: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let shape = Shape { element: Element::F32, group };
        let enc = kvtier_codec::fp8::encode(shape, &page).unwrap();
        let mut out = vec![0u8; page.len()];
        decode(Codec::Fp8E4M3, &enc, &mut out).unwrap();
        for (g, chunk) in values.chunks(group as usize).enumerate() {
            let amax = chunk.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (i, v) in chunk.iter().enumerate() {
                let at = 4 * (g * group as usize + i);
                let got = f32::from_le_bytes([out[at], out[at + 1], out[at + 2], out[at + 3]]);
                prop_assert!((got - v).abs() <= amax / 15.0 + f32::MIN_POSITIVE, "{} → {}", v, got);
            }
        }
    }
}
