//! `model.gemma.ttft.hit.ssd.ms` and `model.gemma.ttft.hit.ssd.fp8.ms`: TTFT of the bench
//! prompt when its 2,048-token prefix comes from the SSD tier of a restarted node (RAM
//! empty, the page cache dropped first where this process may), stored under Gemma's
//! layout as it is and under the same layout registered with the fp8 cold codec (ADR
//! 0021: a quarter of the bytes to read, each page dequantized on the way up). The plain
//! hit is read against a cold prefill, the fp8 hit against the plain hit of the same
//! sample.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kvtier_core::tier::TierKind;
use kvtier_core::{ColdCodec, Engine, LayoutKey};

use super::{ModelRow, PREFIX_TOKENS, row};
use crate::conversation::ssd_settings;
use crate::demo::median;
use crate::gemma::GemmaWeights;
use crate::reuse::{Cache, GemmaRunner};
use crate::{Error, Result};

const PLAIN: &str = "model.gemma.ttft.hit.ssd.ms";
const FP8: &str = "model.gemma.ttft.hit.ssd.fp8.ms";
/// RAM of each node: enough for the turn's working set, not kept across restarts.
const RAM: u64 = 512 << 20;

fn open(dir: &Path) -> Result<Arc<Engine>> {
    let node = kvtier_node::Node::open(ssd_settings(dir, RAM))
        .map_err(|e| Error::Invalid(format!("cannot open a node on {}: {e}", dir.display())))?;
    Ok(node.engine.clone())
}

fn close(engine: &Engine) -> Result<()> {
    match engine.shutdown(Duration::from_secs(120)) {
        Some(s) if s.clean => Ok(()),
        _ => Err(Error::Invalid("the node did not shut down cleanly".into())),
    }
}

/// Drops the page cache when this process may (root), so the hit reads the disk; says
/// whether it did.
fn drop_page_cache() -> bool {
    // `sync` first: only clean pages are dropped, so every page written is on disk.
    let _ = std::process::Command::new("sync").status();
    std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok()
}

/// One turn of `prompt` on a node restarted on `dir`, its prefix stored under `key`:
/// the TTFT in ms, checked to be a hit of the whole prefix from the SSD.
fn hit_from_ssd(
    weights: &Arc<GemmaWeights>,
    key: &LayoutKey,
    dir: &Path,
    prompt: &[u32],
) -> Result<f64> {
    let engine = open(dir)?;
    let mut runner = GemmaRunner::with_layout(
        weights.clone(),
        Arc::new(Cache::embedded(engine.clone())),
        key.clone(),
    )?;
    runner.store = false;
    let r = runner.run_turn(prompt, 1)?;
    let ssd_hits = engine.stats().tier(TierKind::Ssd).map_or(0, |t| t.hits);
    close(&engine)?;
    if r.reused_tokens != PREFIX_TOKENS || ssd_hits == 0 {
        return Err(Error::Invalid(format!(
            "a hit reused {} tokens with {ssd_hits} SSD hits, not {PREFIX_TOKENS} from the SSD",
            r.reused_tokens
        )));
    }
    Ok(r.ttft.as_secs_f64() * 1e3)
}

/// The two rows, `cold_ms` being the cold prefill's median TTFT of the same prompt.
pub fn rows(
    weights: &Arc<GemmaWeights>,
    prompt: &[u32],
    cold_ms: f64,
    samples: usize,
) -> Result<Vec<ModelRow>> {
    let root = std::env::temp_dir().join(format!("kvtier-bench-ssd-hit-{}", std::process::id()));
    let measured = measure(weights, prompt, samples, &root);
    let _ = std::fs::remove_dir_all(&root);
    let (plain, fp8) = measured?;
    Ok(vec![
        row(
            PLAIN,
            plain,
            "ms",
            cold_ms,
            "cold prefill of the same prompt",
        ),
        row(
            FP8,
            fp8,
            "ms",
            plain,
            "hit from the SSD with the plain layout, in the same samples",
        ),
    ])
}

fn measure(
    weights: &Arc<GemmaWeights>,
    prompt: &[u32],
    samples: usize,
    root: &Path,
) -> Result<(f64, f64)> {
    let plain_key = GemmaRunner::layout_key(weights);
    let mut fp8_key = plain_key.clone();
    fp8_key.cold_codec = Some(ColdCodec::Fp8E4M3);
    let variants = [(plain_key, root.join("plain")), (fp8_key, root.join("fp8"))];
    // Turn one on each: the prefix reaches the SSD through the writer (which encodes).
    for (key, dir) in &variants {
        let engine = open(dir)?;
        let runner = GemmaRunner::with_layout(
            weights.clone(),
            Arc::new(Cache::embedded(engine.clone())),
            key.clone(),
        )?;
        runner.run_turn(prompt, 1)?;
        let fp8_bytes = engine
            .stats()
            .tier(TierKind::Ssd)
            .map_or(0, |t| t.codec.fp8_stored_bytes);
        close(&engine)?;
        if (key.cold_codec.is_some()) != (fp8_bytes > 0) {
            return Err(Error::Invalid(format!(
                "{fp8_bytes} fp8 bytes on the SSD for layout `{}`",
                key.digest()
            )));
        }
    }
    let (mut plain, mut fp8) = (Vec::new(), Vec::new());
    let mut dropped = true;
    for _ in 0..samples.max(1) {
        dropped &= drop_page_cache();
        let p = hit_from_ssd(weights, &variants[0].0, &variants[0].1, prompt)?;
        dropped &= drop_page_cache();
        let f = hit_from_ssd(weights, &variants[1].0, &variants[1].1, prompt)?;
        plain.push(p);
        fp8.push(f);
    }
    if !dropped {
        println!(
            "model.gemma.ttft.hit.ssd.*: the page cache could not be dropped (not root); the hits read it"
        );
    }
    Ok((median(&mut plain), median(&mut fp8)))
}
