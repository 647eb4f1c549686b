//! The `codec.*` rows of `kvtier bench --models`: what the cold-page codecs (kvtier-codec)
//! do to real KV — Gemma 3's blocks for the 2,048-token prefix, in bf16 (rounded from the
//! model's f32, as a bf16 engine would hold them) and f32, and the Mamba model's f32
//! state — on one core.
//!
//! Each ratio is read against the order-0 bound of the same pages: the entropy of each
//! byte plane of each page, i.e. the best any coder of single bytes without context could
//! do after the same split. Each throughput is read against memcpy of the same bytes.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use kvtier_codec::{Codec, Element, Shape};

use super::{ModelRow, PREFIX_TOKENS, bench_mamba, byte_prefix, gemma_prompt, row};
use crate::demo::median;
use crate::gemma::{GemmaWeights, locate_gguf};
use crate::reuse::{Cache, GemmaRunner, MambaRunner};
use crate::{Error, Result};

/// Pages of one kind of real KV or state.
#[derive(Debug, Clone)]
pub struct Corpus {
    /// Short name used in row names (`gemma_bf16`).
    pub name: &'static str,
    /// Element type of the pages.
    pub shape: Shape,
    /// The pages, one block or one state each.
    pub pages: Vec<Bytes>,
}

impl Corpus {
    /// Bytes of all pages.
    pub fn bytes(&self) -> usize {
        self.pages.iter().map(Bytes::len).sum()
    }
}

/// Real pages: Gemma 3's KV blocks of the bench prompt's 2,048-token prefix (f32 as the
/// model computes them, and rounded to bf16) and the Mamba model's f32 state after the
/// byte prompt's 2,048 tokens.
pub fn corpora() -> Result<Vec<Corpus>> {
    let weights = GemmaWeights::load(&locate_gguf(true)?, PREFIX_TOKENS + 256)?;
    let prompt = gemma_prompt(&weights);
    let engine = Arc::new(kvtier_core::Engine::builder().build()?);
    let runner = GemmaRunner::new(weights.clone(), Arc::new(Cache::embedded(engine.clone())))?;
    runner.run_turn(&prompt, 1)?;
    let digest = GemmaRunner::layout_key(&weights).digest();
    let mut held: Vec<_> = engine
        .ram()
        .held_blocks()
        .into_iter()
        .filter(|(meta, _)| meta.layout == digest)
        .collect();
    held.sort_by_key(|(meta, _)| meta.position);
    let f32_pages: Vec<Bytes> = held.into_iter().map(|(_, block)| block).collect();
    if f32_pages.is_empty() {
        return Err(Error::Invalid("the Gemma turn stored no blocks".into()));
    }
    let bf16_pages = f32_pages.iter().map(|p| rounded_to_bf16(p)).collect();
    let head_dim = weights.config().head_dim as u32;

    let mamba = bench_mamba()?;
    let engine = Arc::new(kvtier_core::Engine::builder().build()?);
    let runner = MambaRunner::new(mamba.clone(), Arc::new(Cache::embedded(engine.clone())))?;
    let prefix = byte_prefix()?;
    runner.run_turn(&prefix, 1, &[])?;
    let digest = MambaRunner::layout_key(&mamba).digest();
    let state = engine
        .snapshot_get(digest, &prefix, None)?
        .ok_or_else(|| Error::Invalid("the Mamba turn stored no state".into()))?;

    let shape = |element| Shape {
        element,
        group: head_dim,
    };
    Ok(vec![
        Corpus {
            name: "gemma_bf16",
            shape: shape(Element::Bf16),
            pages: bf16_pages,
        },
        Corpus {
            name: "gemma_f32",
            shape: shape(Element::F32),
            pages: f32_pages,
        },
        Corpus {
            name: "mamba_f32",
            shape: Shape {
                element: Element::F32,
                group: 1,
            },
            pages: vec![state],
        },
    ])
}

/// An f32 page rounded to bf16, as a bf16 engine would hold the same KV.
pub fn rounded_to_bf16(page: &[u8]) -> Bytes {
    let out: Vec<u8> = page
        .chunks_exact(4)
        .flat_map(|b| {
            half::bf16::from_f32(f32::from_le_bytes([b[0], b[1], b[2], b[3]])).to_le_bytes()
        })
        .collect();
    Bytes::from(out)
}

/// Shannon entropy of `bytes` in bits per byte.
fn entropy(bytes: &[u8]) -> f64 {
    let mut counts = [0u64; 256];
    for &b in bytes {
        counts[usize::from(b)] += 1;
    }
    let n = bytes.len() as f64;
    counts
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let p = c as f64 / n;
            -p * p.log2()
        })
        .sum()
}

/// The order-0 bound of `corpus`: its bytes over the entropy of each byte plane of each
/// page (planes by the element width).
pub fn order0_bound(corpus: &Corpus) -> f64 {
    let w = corpus.shape.element.width();
    let mut bits = 0.0;
    for page in &corpus.pages {
        for p in 0..w {
            let plane: Vec<u8> = page.iter().skip(p).step_by(w).copied().collect();
            bits += entropy(&plane) * plane.len() as f64;
        }
    }
    corpus.bytes() as f64 * 8.0 / bits
}

/// What one codec did to one corpus: ratio, and encode and decode rates (decoded bytes
/// per second, one thread, median of `passes`).
#[derive(Debug, Clone, Copy)]
pub struct Measured {
    /// Decoded bytes over stored bytes (pages that did not shrink count raw).
    pub ratio: f64,
    /// Encode rate, GB/s of decoded bytes.
    pub encode_gbps: f64,
    /// Decode rate, GB/s of decoded bytes.
    pub decode_gbps: f64,
}

/// Encodes and decodes every page of `corpus` with `codec`, `passes` times; checks that
/// every lossless page comes back exactly.
pub fn measure(corpus: &Corpus, codec: Codec, passes: usize) -> Result<Measured> {
    let mut enc_s = Vec::new();
    let mut dec_s = Vec::new();
    let mut stored = 0usize;
    for _ in 0..passes.max(1) {
        let t = Instant::now();
        let encoded: Vec<Option<Vec<u8>>> = corpus
            .pages
            .iter()
            .map(|p| kvtier_codec::encode(codec, corpus.shape, p))
            .collect();
        enc_s.push(t.elapsed().as_secs_f64());
        stored = encoded
            .iter()
            .zip(&corpus.pages)
            .map(|(e, p)| e.as_ref().map_or(p.len(), Vec::len))
            .sum();
        let mut outs: Vec<Vec<u8>> = corpus.pages.iter().map(|p| vec![0u8; p.len()]).collect();
        let t = Instant::now();
        for ((e, p), out) in encoded.iter().zip(&corpus.pages).zip(&mut outs) {
            match e {
                Some(e) => kvtier_codec::decode(codec, e, out)
                    .map_err(|e| Error::Invalid(format!("a page did not decode: {e}")))?,
                None => out.copy_from_slice(p),
            }
        }
        dec_s.push(t.elapsed().as_secs_f64());
        if codec.is_lossless()
            && outs
                .iter()
                .zip(&corpus.pages)
                .any(|(o, p)| o.as_slice() != p.as_ref())
        {
            return Err(Error::Invalid(format!(
                "{codec} did not give back {}'s pages",
                corpus.name
            )));
        }
    }
    let bytes = corpus.bytes() as f64;
    Ok(Measured {
        ratio: bytes / stored.max(1) as f64,
        encode_gbps: bytes / median(&mut enc_s) / 1e9,
        decode_gbps: bytes / median(&mut dec_s) / 1e9,
    })
}

/// `codec.lossless.{corpus}.{ratio,encode.GBps,decode.GBps}` for every corpus, and
/// `codec.fp8.gemma_bf16.ratio`.
pub fn rows(memcpy_gbps: &dyn Fn(usize) -> f64) -> Result<Vec<ModelRow>> {
    let mut out = Vec::new();
    for corpus in corpora()? {
        let m = measure(&corpus, Codec::Lossless, 5)?;
        let copy = memcpy_gbps(corpus.pages[0].len());
        let name = |what: &str| format!("codec.lossless.{}.{what}", corpus.name);
        out.extend([
            row(
                &name("ratio"),
                m.ratio,
                "x",
                order0_bound(&corpus),
                "order-0 bound of the same byte planes",
            ),
            row(
                &name("encode.GBps"),
                m.encode_gbps,
                "GB/s",
                copy,
                "memcpy of the same bytes",
            ),
            row(
                &name("decode.GBps"),
                m.decode_gbps,
                "GB/s",
                copy,
                "memcpy of the same bytes",
            ),
        ]);
        if corpus.name == "gemma_bf16" {
            let fp8 = measure(&corpus, Codec::Fp8E4M3, 3)?;
            out.push(row(
                "codec.fp8.gemma_bf16.ratio",
                fp8.ratio,
                "x",
                m.ratio,
                "the lossless codec on the same pages",
            ));
        }
    }
    Ok(out)
}
