//! Loading the quantised Gemma 3 weights from a GGUF file.

use std::path::Path;
use std::sync::Arc;

use candle_core::quantized::{QMatMul, QTensor, gguf_file};
use candle_core::{Device, Tensor};

use super::config::GemmaConfig;
use super::vocab::Vocab;
use crate::{Error, Result};

/// One transformer block's weights.
pub(crate) struct Block {
    pub wq: QMatMul,
    pub wk: QMatMul,
    pub wv: QMatMul,
    pub wo: QMatMul,
    pub q_norm: Tensor,
    pub k_norm: Tensor,
    pub attn_norm: Tensor,
    pub post_attn_norm: Tensor,
    pub ffn_norm: Tensor,
    pub post_ffn_norm: Tensor,
    pub gate: QMatMul,
    pub up: QMatMul,
    pub down: QMatMul,
}

/// The whole model, immutable and shared by every sequence that runs on it.
pub struct GemmaWeights {
    pub(crate) config: GemmaConfig,
    /// Tied embedding: looked up row by row, and the output projection.
    pub(crate) embedding: Arc<QTensor>,
    pub(crate) output: QMatMul,
    pub(crate) final_norm: Tensor,
    pub(crate) blocks: Vec<Block>,
    /// RoPE tables `(cos, sin)` for global and for local layers, `[max_positions, head_dim/2]`.
    pub(crate) rope_global: (Tensor, Tensor),
    pub(crate) rope_local: (Tensor, Tensor),
    pub(crate) max_positions: usize,
    pub(crate) vocab: Vocab,
    /// SHA-256 of the GGUF file, hex, and how its weights are computed with
    /// (`+q5_0-as-q8_0`): different weights or kernels never share KV.
    pub(crate) weights_digest: String,
    pub(crate) device: Device,
}

impl std::fmt::Debug for GemmaWeights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GemmaWeights")
            .field("config", &self.config)
            .field("weights_digest", &self.weights_digest)
            .finish_non_exhaustive()
    }
}

impl GemmaWeights {
    /// Loads a Gemma 3 GGUF on the CPU. `max_positions` bounds the context a sequence may
    /// reach (the RoPE tables are built that long).
    pub fn load(path: &Path, max_positions: usize) -> Result<Arc<Self>> {
        let weights_digest = format!(
            "{}{}",
            crate::digest::file_sha256(path)?,
            super::requant::RECIPE
        );
        let mut file = std::fs::File::open(path)
            .map_err(|e| Error::io(format!("cannot open {}", path.display()), e))?;
        let mut reader = std::io::BufReader::new(&mut file);
        let content = gguf_file::Content::read(&mut reader)
            .map_err(|e| Error::Weights(format!("{} is not a GGUF file: {e}", path.display())))?;
        let config = GemmaConfig::from_gguf(&content)?;
        let vocab = Vocab::from_gguf(&content)?;
        let device = Device::Cpu;
        let mut read = |name: &str| -> Result<QTensor> {
            content
                .tensor(&mut reader, name, &device)
                .map_err(|e| Error::Weights(format!("tensor {name}: {e}")))
        };
        let final_norm = read("output_norm.weight")?.dequantize(&device)?;
        let mut blocks = Vec::with_capacity(config.num_layers);
        for i in 0..config.num_layers {
            let mut q = |part: &str| -> Result<QMatMul> {
                let t = super::requant::widen_q5_0(read(&format!("blk.{i}.{part}.weight"))?)?;
                Ok(QMatMul::from_qtensor(t)?)
            };
            let (wq, wk, wv, wo) = (q("attn_q")?, q("attn_k")?, q("attn_v")?, q("attn_output")?);
            let (gate, up, down) = (q("ffn_gate")?, q("ffn_up")?, q("ffn_down")?);
            let mut d = |part: &str| -> Result<Tensor> {
                Ok(read(&format!("blk.{i}.{part}.weight"))?.dequantize(&device)?)
            };
            blocks.push(Block {
                wq,
                wk,
                wv,
                wo,
                q_norm: d("attn_q_norm")?,
                k_norm: d("attn_k_norm")?,
                attn_norm: d("attn_norm")?,
                post_attn_norm: d("post_attention_norm")?,
                ffn_norm: d("ffn_norm")?,
                post_ffn_norm: d("post_ffw_norm")?,
                gate,
                up,
                down,
            });
        }
        // Gemma ties the output projection to the embedding when `output.weight` is absent.
        let embedding = Arc::new(read("token_embd.weight")?);
        let output = if content.tensor_infos.contains_key("output.weight") {
            QMatMul::from_qtensor(read("output.weight")?)?
        } else {
            QMatMul::from_arc(embedding.clone())?
        };
        let rope_global = rope_tables(config.head_dim, config.rope_base_global, max_positions)?;
        let rope_local = rope_tables(config.head_dim, config.rope_base_local, max_positions)?;
        Ok(Arc::new(Self {
            config,
            embedding,
            output,
            final_norm,
            blocks,
            rope_global,
            rope_local,
            max_positions,
            vocab,
            weights_digest,
            device,
        }))
    }

    /// The model's shape.
    pub fn config(&self) -> &GemmaConfig {
        &self.config
    }

    /// SHA-256 of the weights file, hex.
    pub fn weights_digest(&self) -> &str {
        &self.weights_digest
    }

    /// The vocabulary read from the GGUF.
    pub fn vocab(&self) -> &Vocab {
        &self.vocab
    }

    /// The longest context a sequence may reach.
    pub fn max_positions(&self) -> usize {
        self.max_positions
    }
}

/// `cos` and `sin` of every position's rotation angles, `[positions, head_dim / 2]`.
fn rope_tables(head_dim: usize, base: f32, positions: usize) -> Result<(Tensor, Tensor)> {
    let half = head_dim / 2;
    let inv_freq: Vec<f32> = (0..half)
        .map(|i| 1.0 / base.powf((2 * i) as f32 / head_dim as f32))
        .collect();
    let mut angles = Vec::with_capacity(positions * half);
    for p in 0..positions {
        angles.extend(inv_freq.iter().map(|f| p as f32 * f));
    }
    let angles = Tensor::from_vec(angles, (positions, half), &Device::Cpu)?;
    Ok((angles.cos()?, angles.sin()?))
}
