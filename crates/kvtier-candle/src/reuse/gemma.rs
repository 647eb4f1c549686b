//! One Gemma turn with kvtier: find the longest cached prefix, load it into a fresh KV
//! cache (whole, or layer by layer while the suffix computes), prefill only the rest,
//! decode greedily, and store the turn's whole blocks for the next one.

use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use kvtier_core::{KvDtype, LayoutKey};

use crate::gemma::{GemmaWeights, KvCache, LayerTensors, argmax};
use crate::{Error, Result};
use kvtier_node::{Cache, CacheLayout, Hit};

/// Tokens per kvtier block, and the prefill chunk: a restored prefix is always a whole
/// number of chunks, which keeps the arithmetic of a warm turn identical to a cold one.
pub const GEMMA_TOKENS_PER_BLOCK: u32 = 16;

/// How a cached prefix is brought into the KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadMode {
    /// Every block whole, before any compute.
    Whole,
    /// One layer at a time on a loader thread; layer `l` of the suffix runs as soon as
    /// layer `l` of the prefix has arrived.
    Layerwise,
}

/// What one turn did and how long it took.
#[derive(Debug, Clone, Default)]
pub struct TurnReport {
    /// Greedily decoded tokens.
    pub tokens: Vec<u32>,
    /// The logits each decoded token was chosen from.
    pub logits: Vec<Vec<f32>>,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Prompt tokens whose KV came from kvtier.
    pub reused_tokens: usize,
    /// Prompt arrival to the first token's logits.
    pub ttft: Duration,
    /// Time spent loading cached blocks (summed over layers when layer-wise).
    pub load: Duration,
    /// Time the prefill of the uncached suffix took; when layer-wise, the wall time of
    /// the load and the prefill together (they overlap).
    pub prefill: Duration,
    /// Bytes brought in from kvtier.
    pub bytes_loaded: u64,
    /// Blocks kvtier newly kept at the turn's end.
    pub blocks_stored: usize,
    /// Bytes sent to kvtier at the turn's end.
    pub bytes_stored: u64,
    /// Why a cached prefix was not used, if one was found and refused.
    pub refused: Option<String>,
}

/// Gemma 3 on the CPU, caching its KV in kvtier.
#[derive(Debug)]
pub struct GemmaRunner {
    weights: Arc<GemmaWeights>,
    backend: Arc<Cache>,
    layout: CacheLayout,
    /// Store the turn's blocks at its end (on by default).
    pub store: bool,
    /// How a hit is loaded.
    pub load_mode: LoadMode,
}

impl GemmaRunner {
    /// The layout key of this model's KV: f32, every layer, 16 tokens per block, weights
    /// and tokenizer digests from the files.
    pub fn layout_key(weights: &GemmaWeights) -> LayoutKey {
        let c = weights.config();
        let mut key = LayoutKey::new(
            "google/gemma-3-270m",
            KvDtype::F32,
            GEMMA_TOKENS_PER_BLOCK,
            c.num_layers as u32,
            c.num_kv_heads as u32,
            c.head_dim as u32,
        );
        key.weights_digest = weights.weights_digest().to_owned();
        key.tokenizer_digest = weights.vocab().digest().to_owned();
        key
    }

    /// A runner storing under [`Self::layout_key`].
    pub fn new(weights: Arc<GemmaWeights>, backend: Arc<Cache>) -> Result<Self> {
        let key = Self::layout_key(&weights);
        Self::with_layout(weights, backend, key)
    }

    /// A runner storing under `key`, which must describe this model's KV exactly
    /// (f32, its layers, KV heads and head size); anything else is refused.
    pub fn with_layout(
        weights: Arc<GemmaWeights>,
        backend: Arc<Cache>,
        key: LayoutKey,
    ) -> Result<Self> {
        let c = weights.config();
        if key.dtype != KvDtype::F32
            || key.num_layers as usize != c.num_layers
            || key.num_kv_heads as usize != c.num_kv_heads
            || key.head_dim as usize != c.head_dim
            || key.tokens_per_block == 0
        {
            return Err(Error::Invalid(format!(
                "layout {key:?} does not describe this model's KV (f32, {} layers, {} KV heads of {})",
                c.num_layers, c.num_kv_heads, c.head_dim
            )));
        }
        let layout = backend.register_layout(key, None)?;
        Ok(Self {
            weights,
            backend,
            layout,
            store: true,
            load_mode: LoadMode::Whole,
        })
    }

    /// The layout this runner stores under.
    pub fn layout(&self) -> &CacheLayout {
        &self.layout
    }

    /// The backend.
    pub fn backend(&self) -> &Arc<Cache> {
        &self.backend
    }

    /// The weights.
    pub fn weights(&self) -> &Arc<GemmaWeights> {
        &self.weights
    }

    /// Runs one turn: `prompt` in, `max_new` greedy tokens out (at least one).
    pub fn run_turn(&self, prompt: &[u32], max_new: usize) -> Result<TurnReport> {
        if prompt.is_empty() || max_new == 0 {
            return Err(Error::Invalid(
                "a turn needs a prompt and at least one new token".into(),
            ));
        }
        let started = Instant::now();
        let tpb = self.layout.tokens_per_block();
        let mut report = TurnReport {
            prompt_tokens: prompt.len(),
            ..TurnReport::default()
        };
        let capacity = prompt.len() + max_new;
        let mut kv = KvCache::with_capacity(self.weights.config(), capacity);
        let hit = self.backend.lookup(&self.layout, prompt)?;
        // The last prompt token is always computed: its logits choose the first new token.
        let usable_blocks = hit.blocks().min((prompt.len() - 1) / tpb);
        let logits = if usable_blocks == 0 {
            let t = Instant::now();
            let logits = self.weights.prefill(&mut kv, prompt, tpb)?;
            report.prefill = t.elapsed();
            logits
        } else {
            match self.warm_prefill(&mut kv, prompt, &hit, usable_blocks, &mut report) {
                Ok(logits) => logits,
                Err(e @ (Error::Mismatch(_) | Error::Engine(_))) => {
                    // Whatever went wrong with the cached prefix, the answer must not
                    // depend on it: start over cold.
                    report.refused = Some(e.to_string());
                    report.reused_tokens = 0;
                    kv = KvCache::with_capacity(self.weights.config(), capacity);
                    let t = Instant::now();
                    let logits = self.weights.prefill(&mut kv, prompt, tpb)?;
                    report.prefill = t.elapsed();
                    logits
                }
                Err(e) => return Err(e),
            }
        };
        report.ttft = started.elapsed();
        // Greedy decode: the prompt's logits give token 0, each token fed gives the next.
        let mut sequence = prompt.to_vec();
        let mut current = logits;
        for i in 0..max_new {
            let next = argmax(&current);
            report.tokens.push(next);
            report.logits.push(std::mem::take(&mut current));
            if i + 1 < max_new {
                current = self.weights.forward(&mut kv, &[next])?;
                sequence.push(next);
            }
        }
        if self.store {
            // Everything the cache holds in whole blocks: the prompt and what was decoded
            // and fed back, ready for the next turn of the conversation.
            let whole = kv.len() / tpb;
            let mut payloads = Vec::with_capacity(whole);
            for b in 0..whole {
                payloads.push(kv.block_payload(b, tpb)?);
            }
            report.bytes_stored = payloads.iter().map(|p| p.len() as u64).sum();
            let payloads: Vec<&[u8]> = payloads.iter().map(|p| &p[..]).collect();
            report.blocks_stored = self
                .backend
                .store(&self.layout, &sequence[..whole * tpb], &payloads)?
                .stored;
        }
        Ok(report)
    }

    fn warm_prefill(
        &self,
        kv: &mut KvCache,
        prompt: &[u32],
        hit: &Hit,
        blocks: usize,
        report: &mut TurnReport,
    ) -> Result<Vec<f32>> {
        let tpb = self.layout.tokens_per_block();
        let reused = blocks * tpb;
        match self.load_mode {
            LoadMode::Whole => {
                let t = Instant::now();
                let payloads = self.backend.load(&hit.prefix(blocks)?, None)?;
                if payloads.len() != blocks {
                    return Err(Error::Mismatch(format!(
                        "{} of {blocks} blocks arrived",
                        payloads.len()
                    )));
                }
                report.bytes_loaded = payloads.iter().map(|p| p.len() as u64).sum();
                kv.import_blocks(&payloads, tpb)?;
                report.load = t.elapsed();
                report.reused_tokens = reused;
                let t = Instant::now();
                let logits = self.weights.prefill(kv, prompt, tpb);
                report.prefill = t.elapsed();
                logits
            }
            LoadMode::Layerwise => {
                let layers = self.weights.config().num_layers;
                type Arrival = Result<(LayerTensors, u64, Duration)>;
                let (tx, rx) = mpsc::sync_channel::<Arrival>(layers);
                let backend = self.backend.clone();
                let hit = hit.prefix(blocks)?;
                let shape = kv.shape();
                // The loader fetches and converts each layer, so the compute thread only
                // appends it: the fetch and the conversion overlap the layers before.
                let loader = std::thread::Builder::new()
                    .name("kvtier-layer-load".into())
                    .spawn(move || {
                        for layer in 0..layers {
                            let t = Instant::now();
                            let arrival = backend
                                .load(&hit, Some((layer as u32, layer as u32 + 1)))
                                .map_err(Error::from)
                                .and_then(|pages| {
                                    if pages.len() != blocks {
                                        return Err(Error::Mismatch(format!(
                                            "{} of {blocks} pages of layer {layer} arrived",
                                            pages.len()
                                        )));
                                    }
                                    let bytes = pages.iter().map(|p| p.len() as u64).sum();
                                    let tensors = shape.layer_tensors(layer, &pages, tpb)?;
                                    Ok((tensors, bytes, t.elapsed()))
                                });
                            let failed = arrival.is_err();
                            if tx.send(arrival).is_err() || failed {
                                return;
                            }
                        }
                    })
                    .map_err(|e| Error::io("cannot start the layer loader", e))?;
                let mut loaded = 0u64;
                let mut load_time = Duration::ZERO;
                let mut fill = |layer: usize, kv: &mut KvCache| -> Result<()> {
                    let (tensors, bytes, took) = rx
                        .recv()
                        .map_err(|_| Error::Mismatch(format!("layer {layer} never arrived")))??;
                    loaded += bytes;
                    load_time += took;
                    kv.append_layer(layer, tensors)
                };
                // The first chunk after the prefix pulls each layer in just before it
                // needs it; later chunks find every layer filled.
                let first_end = (reused + tpb).min(prompt.len());
                let t = Instant::now();
                let result = self
                    .weights
                    .forward_with(kv, &prompt[reused..first_end], &mut fill)
                    .and_then(|logits| {
                        if first_end == prompt.len() {
                            Ok(logits)
                        } else {
                            self.weights.prefill(kv, prompt, tpb)
                        }
                    });
                drop(rx);
                let _ = loader.join();
                // Wall time of the overlapped load and suffix compute.
                report.prefill = t.elapsed();
                report.bytes_loaded = loaded;
                report.load = load_time;
                report.reused_tokens = reused;
                result
            }
        }
    }
}
