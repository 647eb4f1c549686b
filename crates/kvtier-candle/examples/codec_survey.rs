//! Which entropy coder the lossless codec should use (ADR 0021): the codec's own (a
//! Huffman code per byte plane), zstd at several levels and lz4, with and without the
//! byte-plane split, on the real pages of the `codec.*` bench rows (Gemma 3's KV in bf16
//! and f32, the Mamba model's f32 state), one core.
//!
//! ```text
//! cargo run --profile test -p kvtier-candle --example codec_survey
//! ```
//!
//! Prints, per corpus and coder: ratio, encode and decode GB/s (decoded bytes), and
//! ratio × decode rate, the figure a disk-bound load gains by.

use std::time::Instant;

use kvtier_candle::bench::codec::{Corpus, corpora, measure, order0_bound};
use kvtier_codec::Codec;

fn split(page: &[u8], w: usize) -> Vec<u8> {
    let n = page.len() / w;
    let mut out = Vec::with_capacity(page.len());
    for p in 0..w {
        out.extend((0..n).map(|i| page[i * w + p]));
    }
    out.extend_from_slice(&page[n * w..]);
    out
}

/// A coder of one plane, as the survey calls it.
type Coder = dyn Fn(&[u8]) -> Vec<u8>;

/// `coder` over each plane of each page (after the split when `w > 1`), `decoder` back:
/// ratio, encode, decode GB/s.
fn per_plane(
    corpus: &Corpus,
    w: usize,
    coder: &dyn Fn(&[u8]) -> Vec<u8>,
    decoder: &dyn Fn(&[u8], usize) -> usize,
) -> (f64, f64, f64) {
    let mut stored = 0;
    let mut enc = f64::MAX;
    let mut dec = f64::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        let coded: Vec<Vec<u8>> = corpus
            .pages
            .iter()
            .map(|p| {
                let planes = split(p, w);
                let n = planes.len() / w.max(1);
                // Each plane on its own, like the codec.
                let mut out = Vec::new();
                for chunk in planes.chunks(n.max(1)) {
                    let c = coder(chunk);
                    out.extend((c.len() as u32).to_le_bytes());
                    out.extend((chunk.len() as u32).to_le_bytes());
                    out.extend(c);
                }
                out
            })
            .collect();
        enc = enc.min(t.elapsed().as_secs_f64());
        stored = coded.iter().map(Vec::len).sum::<usize>();
        let t = Instant::now();
        for (c, p) in coded.iter().zip(&corpus.pages) {
            let mut rest = c.as_slice();
            let mut got = 0;
            while rest.len() >= 4 {
                let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
                let plain = u32::from_le_bytes([rest[4], rest[5], rest[6], rest[7]]) as usize;
                got += decoder(&rest[8..8 + len], plain);
                rest = &rest[8 + len..];
            }
            assert_eq!(got, p.len());
        }
        dec = dec.min(t.elapsed().as_secs_f64());
    }
    let bytes = corpus.bytes() as f64;
    (bytes / stored as f64, bytes / enc / 1e9, bytes / dec / 1e9)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let corpora = corpora()?;
    println!("corpus\tcoder\tratio\tencode_GBps\tdecode_GBps\tratio_x_decode");
    for corpus in &corpora {
        let w = corpus.shape.element.width();
        println!(
            "{}\torder-0 bound\t{:.3}\t\t\t",
            corpus.name,
            order0_bound(corpus)
        );
        for (split_label, shape) in [
            ("planes", corpus.shape),
            ("no split", kvtier_codec::Shape::BYTES),
        ] {
            let c = Corpus {
                shape,
                ..corpus.clone()
            };
            let m = measure(&c, Codec::Lossless, 3)?;
            println!(
                "{}\tkvtier lossless (Huffman) {split_label}\t{:.3}\t{:.2}\t{:.2}\t{:.2}",
                corpus.name,
                m.ratio,
                m.encode_gbps,
                m.decode_gbps,
                m.ratio * m.decode_gbps
            );
        }
        let lz4_decode = |c: &[u8], _: usize| {
            lz4_flex::decompress_size_prepended(c)
                .map(|d| d.len())
                .unwrap_or(0)
        };
        let mut coders: Vec<(String, Box<Coder>, usize)> = Vec::new();
        for level in [-5, -1, 1, 3, 6] {
            for (label, width) in [("planes", w), ("no split", 1)] {
                coders.push((
                    format!("zstd {level} {label}"),
                    Box::new(move |p: &[u8]| zstd::bulk::compress(p, level).unwrap_or_default()),
                    width,
                ));
            }
        }
        for (label, width) in [("lz4 planes", w), ("lz4 no split", 1)] {
            let (ratio, e, d) = per_plane(
                corpus,
                width,
                &|p: &[u8]| lz4_flex::compress_prepend_size(p),
                &lz4_decode,
            );
            println!(
                "{}\t{label}\t{ratio:.3}\t{e:.2}\t{d:.2}\t{:.2}",
                corpus.name,
                ratio * d
            );
        }
        let zstd_decode = |c: &[u8], plain: usize| {
            zstd::bulk::decompress(c, plain)
                .map(|d| d.len())
                .unwrap_or(0)
        };
        for (label, coder, width) in &coders {
            let (ratio, e, d) = per_plane(corpus, *width, coder.as_ref(), &zstd_decode);
            println!(
                "{}\t{label}\t{ratio:.3}\t{e:.2}\t{d:.2}\t{:.2}",
                corpus.name,
                ratio * d
            );
        }
    }
    Ok(())
}
