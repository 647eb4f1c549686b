//! The `model.*` rows of `kvtier bench --models`: time to first token of a prompt whose
//! 2,048-token prefix is cached, against computing it cold, for Gemma 3 (KV blocks),
//! Mamba (a state snapshot, or a checkpoint before a divergence) and the hybrid model (KV
//! blocks and a checkpoint together); the load's throughput against memcpy of the same bytes; and
//! how much of the load layer-wise loading hides behind the suffix's compute; a hit from
//! the SSD tier with and without the fp8 cold codec ([`ssd_hit`]); and what the cold-page
//! codecs do to these models' KV ([`codec`]).

pub mod codec;
mod ssd_hit;

use std::sync::Arc;

use crate::demo::median;
use crate::gemma::{GemmaWeights, locate_gguf};
use crate::mamba::{MambaModel, synthetic_config, write_synthetic};
use crate::prompts::{system_prompt, user_turn};
use crate::reuse::{Cache, GemmaRunner, HybridRunner, LoadMode, MambaRunner, ServeLauncher};
use crate::{Error, Result};

/// Tokens of the cached prefix.
pub const PREFIX_TOKENS: usize = 2048;
/// Tokens after it (the new question), computed in every run.
pub const SUFFIX_TOKENS: usize = 16;

/// One bench figure with the baseline it is read against.
#[derive(Debug, Clone)]
pub struct ModelRow {
    /// Row name.
    pub name: String,
    /// The figure.
    pub value: f64,
    /// Its unit.
    pub unit: &'static str,
    /// The baseline in the same unit.
    pub baseline: f64,
    /// What the baseline is.
    pub baseline_is: &'static str,
}

fn row(
    name: &str,
    value: f64,
    unit: &'static str,
    baseline: f64,
    baseline_is: &'static str,
) -> ModelRow {
    ModelRow {
        name: name.to_owned(),
        value,
        unit,
        baseline,
        baseline_is,
    }
}

/// The three TTFT rows of one scenario, `{prefix}.cold.ms`, `{hit}` and
/// `{prefix}.speedup`: cold read against the hit, the hit against cold, and the speedup
/// against the 10× target.
fn ttft_rows(
    prefix: &str,
    hit_name: &str,
    cold: f64,
    hit: f64,
    hit_is: &'static str,
    cold_is: &'static str,
) -> Vec<ModelRow> {
    vec![
        row(&format!("{prefix}.cold.ms"), cold, "ms", hit, hit_is),
        row(hit_name, hit, "ms", cold, cold_is),
        row(
            &format!("{prefix}.speedup"),
            cold / hit,
            "x",
            10.0,
            "target: 10x",
        ),
    ]
}

/// Runs the model rows: `cold_samples` cold prefills (about 20 s each for Gemma here) and
/// `hit_samples` hits per model; `memcpy_gbps` measures the copy baseline for a size.
/// The `*.served.*` rows need `serve` to start `kvtier serve` on loopback; without it
/// they are left out (with a note on stdout). A group of rows none of whose names
/// `wanted` accepts is not run at all.
pub fn rows(
    cold_samples: usize,
    hit_samples: usize,
    memcpy_gbps: &dyn Fn(usize) -> f64,
    serve: Option<&dyn ServeLauncher>,
    wanted: &dyn Fn(&str) -> bool,
) -> Result<Vec<ModelRow>> {
    let any = |names: &[&str]| names.iter().any(|n| wanted(n));
    let mut out = Vec::new();
    if any(&["model.gemma.ttft.cold.ms", "model.gemma.ttft.hit.served.ms"]) {
        out.extend(gemma_rows(cold_samples, hit_samples, memcpy_gbps, serve)?);
    }
    let mamba = bench_mamba()?;
    if any(&["model.mamba.snapshot.ttft.speedup"]) {
        out.extend(mamba_rows(&mamba, cold_samples, hit_samples)?);
    }
    if any(&["model.mamba.checkpoint.ttft.speedup"]) {
        out.extend(mamba_checkpoint_rows(&mamba, cold_samples, hit_samples)?);
    }
    if any(&["model.hybrid.ttft.speedup"]) {
        out.extend(hybrid_rows(cold_samples, hit_samples)?);
    }
    if any(&["codec.lossless.gemma_bf16.ratio"]) {
        out.extend(codec::rows(memcpy_gbps)?);
    }
    Ok(out)
}

fn gemma_prompt(w: &GemmaWeights) -> Vec<u32> {
    let mut words = 1500;
    loop {
        let mut p = vec![w.config().bos];
        p.extend(w.vocab().encode(&system_prompt(words)));
        if p.len() >= PREFIX_TOKENS {
            p.truncate(PREFIX_TOKENS);
            // A 16-token question: the prompt's last token is always computed, so exactly
            // the 2,048-token prefix (128 blocks) can come from the cache.
            p.extend(
                w.vocab()
                    .encode(&user_turn(0, 1))
                    .iter()
                    .take(SUFFIX_TOKENS),
            );
            return p;
        }
        words += 200;
    }
}

fn gemma_rows(
    cold_samples: usize,
    hit_samples: usize,
    memcpy_gbps: &dyn Fn(usize) -> f64,
    serve: Option<&dyn ServeLauncher>,
) -> Result<Vec<ModelRow>> {
    let weights = GemmaWeights::load(&locate_gguf(true)?, PREFIX_TOKENS + 256)?;
    let prompt = gemma_prompt(&weights);
    let engine = Arc::new(kvtier_core::Engine::builder().build()?);
    let mut runner = GemmaRunner::new(weights.clone(), Arc::new(Cache::embedded(engine)))?;
    let mut cold = Vec::new();
    runner.store = false;
    for _ in 0..cold_samples.max(1) {
        let r = runner.run_turn(&prompt, 1)?;
        if r.reused_tokens != 0 {
            return Err(Error::Invalid("the cold run reused a prefix".into()));
        }
        cold.push(r.ttft.as_secs_f64() * 1e3);
    }
    runner.store = true;
    runner.run_turn(&prompt, 1)?;
    let embedded = hit_figures(&mut runner, &prompt, hit_samples)?;

    let served = match serve {
        Some(launcher) => Some(served_hit_figures(
            launcher,
            &weights,
            &prompt,
            hit_samples,
        )?),
        None => {
            println!("model.gemma.*.served.* rows skipped: no way to start kvtier serve was given");
            None
        }
    };
    let cold = median(&mut cold);
    let load_gbps = embedded.bytes as f64 / embedded.load_s / 1e9;
    let mut rows = ttft_rows(
        "model.gemma.ttft",
        "model.gemma.ttft.hit.ms",
        cold,
        embedded.whole_ms,
        "TTFT with the 2,048-token prefix cached",
        "cold prefill of the same prompt",
    );
    rows.extend([
        row(
            "model.gemma.load.2048tok.GBps",
            load_gbps,
            "GB/s",
            memcpy_gbps(embedded.bytes as usize),
            "memcpy of the same bytes",
        ),
        row(
            "model.gemma.ttft.hit.layerwise.ms",
            embedded.layerwise_ms,
            "ms",
            embedded.whole_ms,
            "hit, whole blocks first",
        ),
        row(
            "model.gemma.layerwise.hidden.pct",
            embedded.hidden_pct,
            "%",
            100.0,
            "all of the load hidden",
        ),
    ]);
    rows.extend(ssd_hit::rows(&weights, &prompt, cold, hit_samples)?);
    let Some(served) = served else {
        return Ok(rows);
    };
    rows.extend([
        row(
            "model.gemma.ttft.hit.served.ms",
            served.whole_ms,
            "ms",
            embedded.whole_ms,
            "hit from the engine in-process",
        ),
        row(
            "model.gemma.ttft.hit.served.layerwise.ms",
            served.layerwise_ms,
            "ms",
            served.whole_ms,
            "served hit, whole blocks first",
        ),
        row(
            "model.gemma.layerwise.served.hidden.pct",
            served.hidden_pct,
            "%",
            100.0,
            "all of the load hidden",
        ),
    ]);
    Ok(rows)
}

/// The hit figures through `kvtier serve` on loopback, where the load is a network stream.
fn served_hit_figures(
    launcher: &dyn ServeLauncher,
    weights: &Arc<GemmaWeights>,
    prompt: &[u32],
    hit_samples: usize,
) -> Result<HitFigures> {
    let dir = std::env::temp_dir().join(format!("kvtier-bench-served-{}", std::process::id()));
    let settings = kvtier_node::Settings {
        listen: ([127, 0, 0, 1], 0).into(),
        data_dir: dir.clone(),
        ram: kvtier_node::units::ByteSize(1 << 30),
        ..Default::default()
    };
    let served = launcher.launch(settings).and_then(|server| {
        let backend = Arc::new(Cache::served(&server.url(), None)?);
        let mut runner = GemmaRunner::new(weights.clone(), backend)?;
        runner.store = true;
        runner.run_turn(prompt, 1)?;
        let figures = hit_figures(&mut runner, prompt, hit_samples);
        server.stop();
        figures
    });
    let _ = std::fs::remove_dir_all(&dir);
    served
}

/// Medians of hits loaded whole and layer by layer.
struct HitFigures {
    whole_ms: f64,
    layerwise_ms: f64,
    /// Median whole-block load (fetch and conversion), seconds.
    load_s: f64,
    bytes: u64,
    /// `100 × (whole TTFT − layer-wise TTFT) / whole load`: the share of the load the
    /// overlap took off the critical path (negative: layer-wise cost more than it saved).
    hidden_pct: f64,
}

fn hit_figures(runner: &mut GemmaRunner, prompt: &[u32], samples: usize) -> Result<HitFigures> {
    runner.store = false;
    let (mut whole, mut layerwise, mut loads, mut hidden) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut bytes = 0;
    for _ in 0..samples.max(1) {
        runner.load_mode = LoadMode::Whole;
        let w = runner.run_turn(prompt, 1)?;
        runner.load_mode = LoadMode::Layerwise;
        let l = runner.run_turn(prompt, 1)?;
        for r in [&w, &l] {
            if r.reused_tokens != PREFIX_TOKENS {
                return Err(Error::Invalid(format!(
                    "a hit reused {} tokens, not {PREFIX_TOKENS}",
                    r.reused_tokens
                )));
            }
        }
        bytes = w.bytes_loaded;
        whole.push(w.ttft.as_secs_f64() * 1e3);
        layerwise.push(l.ttft.as_secs_f64() * 1e3);
        loads.push(w.load.as_secs_f64());
        hidden.push(100.0 * (w.ttft.as_secs_f64() - l.ttft.as_secs_f64()) / w.load.as_secs_f64());
    }
    Ok(HitFigures {
        whole_ms: median(&mut whole),
        layerwise_ms: median(&mut layerwise),
        load_s: median(&mut loads),
        bytes,
        hidden_pct: median(&mut hidden),
    })
}

/// The byte-token models' cached prefix: the first 2,048 bytes of a system prompt.
fn byte_prefix() -> Result<Vec<u32>> {
    let prefix: Vec<u32> = system_prompt(600)
        .bytes()
        .map(u32::from)
        .take(PREFIX_TOKENS)
        .collect();
    if prefix.len() < PREFIX_TOKENS {
        return Err(Error::Invalid("the byte-token prompt is too short".into()));
    }
    Ok(prefix)
}

fn bench_mamba() -> Result<Arc<MambaModel>> {
    let dir = std::env::temp_dir().join(format!("kvtier-bench-mamba-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| Error::io("cannot create the bench directory", e))?;
    let path = dir.join("mamba.safetensors");
    let written = write_synthetic(&synthetic_config(), 7, &path);
    let model = written.and_then(|()| MambaModel::load(&path, synthetic_config()));
    let _ = std::fs::remove_dir_all(&dir);
    model
}

/// Where the checkpoint rows' prompt leaves the cached one, and the checkpoint distance.
const DIVERGE_AT: usize = 1900;
const CHECKPOINT_EVERY: usize = 64;

/// `model.mamba.checkpoint.*`: a 2,048-token prompt that shares its first 1,900 tokens
/// with a cached 2,048-token prompt read with checkpoints every 64 tokens restores the
/// checkpoint after 1,856 tokens and reads 192, against reading all 2,048 cold. Every warm
/// sample has a tail of its own (so it cannot find its own earlier checkpoints) and
/// stores its checkpoints, as in use.
fn mamba_checkpoint_rows(
    model: &Arc<MambaModel>,
    cold_samples: usize,
    hit_samples: usize,
) -> Result<Vec<ModelRow>> {
    let cached = byte_prefix()?;
    let diverging = |sample: usize| -> Vec<u32> {
        let mut p = cached[..DIVERGE_AT].to_vec();
        let tail = user_turn(sample + 2, sample);
        p.extend(
            tail.bytes()
                .cycle()
                .map(u32::from)
                .take(PREFIX_TOKENS - DIVERGE_AT),
        );
        p
    };
    let engine = Arc::new(kvtier_core::Engine::builder().build()?);
    let backend = Arc::new(Cache::embedded(engine));
    let mut cold_runner = MambaRunner::new(model.clone(), backend.clone())?;
    cold_runner.store = false;
    let mut cold = Vec::new();
    for s in 0..cold_samples.max(1) {
        cold.push(
            cold_runner
                .run_turn(&diverging(s), 1, &[])?
                .ttft
                .as_secs_f64()
                * 1e3,
        );
    }
    let runner = MambaRunner::new(model.clone(), backend)?.with_checkpoints(CHECKPOINT_EVERY)?;
    runner.run_turn(&cached, 1, &[])?;
    let restored = DIVERGE_AT / CHECKPOINT_EVERY * CHECKPOINT_EVERY;
    let mut hits = Vec::new();
    for s in 0..hit_samples.max(1) {
        let r = runner.run_turn(&diverging(1000 + s), 1, &[])?;
        if r.reused_tokens != restored || !r.from_checkpoint {
            return Err(Error::Invalid(format!(
                "the diverging prompt restored {} tokens, not the checkpoint after {restored}",
                r.reused_tokens
            )));
        }
        hits.push(r.ttft.as_secs_f64() * 1e3);
    }
    Ok(ttft_rows(
        "model.mamba.checkpoint.ttft",
        "model.mamba.checkpoint.ttft.ms",
        median(&mut cold),
        median(&mut hits),
        "TTFT from the checkpoint before the divergence",
        "cold prefill of the same 2,048 tokens",
    ))
}

/// `model.hybrid.*`: the synthetic hybrid (Mamba and attention layers) on a 2,064-token
/// prompt whose 2,048-token prefix is cached as KV blocks plus the checkpoint after it,
/// against computing it cold. A hit restores 128 blocks and the state, and reads the
/// 16-token question.
fn hybrid_rows(cold_samples: usize, hit_samples: usize) -> Result<Vec<ModelRow>> {
    let model = crate::conversation::hybrid_model(crate::conversation::HYBRID_SEED)?;
    let prefix = byte_prefix()?;
    let mut prompt = prefix.clone();
    prompt.extend(user_turn(0, 1).bytes().map(u32::from).take(SUFFIX_TOKENS));
    let engine = Arc::new(kvtier_core::Engine::builder().build()?);
    let backend = Arc::new(Cache::embedded(engine));
    let mut runner = HybridRunner::new(model, backend, CHECKPOINT_EVERY)?;
    runner.store_kv = false;
    runner.store_state = false;
    let mut cold = Vec::new();
    for _ in 0..cold_samples.max(1) {
        cold.push(runner.run_turn(&prompt, 1)?.ttft.as_secs_f64() * 1e3);
    }
    // A turn over exactly the prefix stores its blocks and the checkpoint at its end.
    runner.store_kv = true;
    runner.store_state = true;
    runner.run_turn(&prefix, 1)?;
    runner.store_kv = false;
    runner.store_state = false;
    let mut hits = Vec::new();
    for _ in 0..hit_samples.max(1) {
        let r = runner.run_turn(&prompt, 1)?;
        if r.reused_tokens != PREFIX_TOKENS {
            return Err(Error::Invalid(format!(
                "the hybrid hit reused {} tokens, not {PREFIX_TOKENS}",
                r.reused_tokens
            )));
        }
        hits.push(r.ttft.as_secs_f64() * 1e3);
    }
    Ok(ttft_rows(
        "model.hybrid.ttft",
        "model.hybrid.ttft.hit.ms",
        median(&mut cold),
        median(&mut hits),
        "TTFT with 128 KV blocks and the state after them restored",
        "cold prefill of the same prompt",
    ))
}

fn mamba_rows(
    model: &Arc<MambaModel>,
    cold_samples: usize,
    hit_samples: usize,
) -> Result<Vec<ModelRow>> {
    let model = model.clone();
    let prefix = byte_prefix()?;
    let mut prompt = prefix.clone();
    prompt.extend(user_turn(0, 1).bytes().map(u32::from).take(SUFFIX_TOKENS));
    let engine = Arc::new(kvtier_core::Engine::builder().build()?);
    let mut runner = MambaRunner::new(model, Arc::new(Cache::embedded(engine)))?;
    runner.store = false;
    let mut cold = Vec::new();
    for _ in 0..cold_samples.max(1) {
        cold.push(runner.run_turn(&prompt, 1, &[])?.ttft.as_secs_f64() * 1e3);
    }
    // A turn over exactly the prefix, decoding one token, leaves the state after the
    // prefix: that is the snapshot the hits restore.
    runner.store = true;
    runner.run_turn(&prefix, 1, &[])?;
    runner.store = false;
    let mut hits = Vec::new();
    for _ in 0..hit_samples.max(1) {
        let r = runner.run_turn(&prompt, 1, &[PREFIX_TOKENS])?;
        if r.reused_tokens != PREFIX_TOKENS {
            return Err(Error::Invalid(format!(
                "the Mamba hit reused {} tokens",
                r.reused_tokens
            )));
        }
        hits.push(r.ttft.as_secs_f64() * 1e3);
    }
    Ok(ttft_rows(
        "model.mamba.snapshot.ttft",
        "model.mamba.snapshot.ttft.hit.ms",
        median(&mut cold),
        median(&mut hits),
        "TTFT with the 2,048-token state restored",
        "cold prefill of the same prompt",
    ))
}
