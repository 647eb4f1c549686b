//! One pass of the workload over one cache: every conversation, turn by turn, with the
//! turns' timings and what they reused.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::workload::{Bytes as ByteText, Encoder, GemmaText, Workload, next_prompt};
use crate::Result;
use crate::gemma::GemmaWeights;
use crate::mamba::MambaModel;
use crate::reuse::{Cache, GemmaRunner, MambaRunner};

/// A model the demo runs.
#[derive(Debug, Clone)]
pub enum DemoModel {
    /// Gemma 3 270M, KV blocks.
    Gemma(Arc<GemmaWeights>),
    /// Synthetic Mamba, state snapshots.
    Mamba(Arc<MambaModel>),
}

impl DemoModel {
    /// `gemma` or `mamba`.
    pub fn name(&self) -> &'static str {
        match self {
            DemoModel::Gemma(_) => "gemma",
            DemoModel::Mamba(_) => "mamba",
        }
    }
}

/// One turn's outcome.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TurnResult {
    /// Conversation index.
    pub conversation: usize,
    /// Turn index.
    pub turn: usize,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Prompt tokens taken from kvtier.
    pub reused_tokens: usize,
    /// Time to first token, ms.
    pub ttft_ms: f64,
    /// Bytes loaded from kvtier.
    pub bytes_loaded: u64,
    /// Bytes sent to kvtier.
    pub bytes_stored: u64,
    /// The decoded tokens (compared across phases).
    pub tokens: Vec<u32>,
}

/// Runs the workload on `backend`; `store` decides whether turns keep their state.
pub fn run_phase(
    model: &DemoModel,
    backend: Arc<Cache>,
    store: bool,
    w: &Workload,
) -> Result<Vec<TurnResult>> {
    match model {
        DemoModel::Gemma(weights) => {
            let mut runner = GemmaRunner::new(weights.clone(), backend)?;
            runner.store = store;
            each_turn(w, &GemmaText(weights), |prompt, _| {
                let r = runner.run_turn(prompt, w.decode)?;
                Ok(Outcome {
                    reused_tokens: r.reused_tokens,
                    ttft: r.ttft,
                    bytes_loaded: r.bytes_loaded,
                    bytes_stored: r.bytes_stored,
                    tokens: r.tokens,
                })
            })
        }
        DemoModel::Mamba(m) => {
            let mut runner = MambaRunner::new(m.clone(), backend)?;
            runner.store = store;
            each_turn(w, &ByteText, |prompt, previous| {
                // The previous turn's snapshot covers its prompt and all but its last
                // decoded token; the shared system prompt has none (no turn ends there).
                let hints: Vec<usize> = previous.iter().map(|p| p.len() + w.decode - 1).collect();
                let r = runner.run_turn(prompt, w.decode, &hints)?;
                Ok(Outcome {
                    reused_tokens: r.reused_tokens,
                    ttft: r.ttft,
                    bytes_loaded: r.bytes_loaded,
                    bytes_stored: r.bytes_stored,
                    tokens: r.tokens,
                })
            })
        }
    }
}

/// What a model's turn reports back to the workload loop.
struct Outcome {
    reused_tokens: usize,
    ttft: std::time::Duration,
    bytes_loaded: u64,
    bytes_stored: u64,
    tokens: Vec<u32>,
}

/// Runs every turn of every conversation through `run(prompt, previous prompt)`; each
/// prompt extends the previous one with its answer and a new question.
fn each_turn(
    w: &Workload,
    enc: &dyn Encoder,
    mut run: impl FnMut(&[u32], Option<&[u32]>) -> Result<Outcome>,
) -> Result<Vec<TurnResult>> {
    let mut out = Vec::new();
    for c in 0..w.conversations {
        let mut previous: Option<(Vec<u32>, Vec<u32>)> = None;
        for t in 0..w.turns {
            let prompt = next_prompt(
                enc,
                w,
                c,
                t,
                previous.as_ref().map(|(p, a)| (p.as_slice(), a.as_slice())),
            );
            let o = run(&prompt, previous.as_ref().map(|(p, _)| p.as_slice()))?;
            out.push(TurnResult {
                conversation: c,
                turn: t,
                prompt_tokens: prompt.len(),
                reused_tokens: o.reused_tokens,
                ttft_ms: o.ttft.as_secs_f64() * 1e3,
                bytes_loaded: o.bytes_loaded,
                bytes_stored: o.bytes_stored,
                tokens: o.tokens.clone(),
            });
            previous = Some((prompt, o.tokens));
        }
    }
    Ok(out)
}

/// The ASCII-table line of a phase.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PhaseSummary {
    /// Model name.
    pub model: String,
    /// Phase name.
    pub phase: String,
    /// Median TTFT over all turns, ms.
    pub ttft_median_ms: f64,
    /// Median TTFT over turns that reused something, ms (0 if none did).
    pub ttft_hit_median_ms: f64,
    /// Turns that reused something / turns.
    pub turns_hit: (usize, usize),
    /// Reused prompt tokens / prompt tokens.
    pub token_hit_rate: f64,
    /// Bytes loaded from kvtier.
    pub bytes_loaded: u64,
    /// Bytes stored into kvtier.
    pub bytes_stored: u64,
    /// Turns whose decoded tokens equal the cold phase's.
    pub same_as_cold: usize,
}

/// Median of `v` (0 for none).
pub fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Summarises `turns` against the cold phase's turns.
pub fn summarize(
    model: &str,
    phase: &str,
    turns: &[TurnResult],
    cold: &[TurnResult],
) -> PhaseSummary {
    let mut all: Vec<f64> = turns.iter().map(|t| t.ttft_ms).collect();
    let mut hits: Vec<f64> = turns
        .iter()
        .filter(|t| t.reused_tokens > 0)
        .map(|t| t.ttft_ms)
        .collect();
    let prompt: usize = turns.iter().map(|t| t.prompt_tokens).sum();
    let reused: usize = turns.iter().map(|t| t.reused_tokens).sum();
    PhaseSummary {
        model: model.to_owned(),
        phase: phase.to_owned(),
        ttft_median_ms: median(&mut all),
        ttft_hit_median_ms: median(&mut hits),
        turns_hit: (hits.len(), turns.len()),
        token_hit_rate: if prompt == 0 {
            0.0
        } else {
            reused as f64 / prompt as f64
        },
        bytes_loaded: turns.iter().map(|t| t.bytes_loaded).sum(),
        bytes_stored: turns.iter().map(|t| t.bytes_stored).sum(),
        same_as_cold: turns
            .iter()
            .zip(cold)
            .filter(|(a, b)| a.tokens == b.tokens)
            .count(),
    }
}
