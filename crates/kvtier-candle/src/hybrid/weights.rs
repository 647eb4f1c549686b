//! Deterministic weights for the hybrid model, written as safetensors and loaded through
//! candle's ordinary path. The Mamba mixers are drawn exactly as the synthetic Mamba's
//! (`crate::mamba`); the attention projections are small uniform matrices.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};

use super::config::{HybridConfig, LayerKind};
use crate::mamba::weights::{Rng, insert_mixer};
use crate::{Error, Result};

/// Writes the weights of `config` made from `seed` to `path`.
pub fn write_synthetic(config: &HybridConfig, seed: u64, path: &Path) -> Result<()> {
    let mut rng = Rng(seed);
    let d = config.d_model;
    let inner = config.num_heads * config.head_dim;
    let mamba = config.mamba_config();
    let lin = |fan_in: usize| 1.0 / (fan_in as f32).sqrt();
    let mut t: HashMap<String, Tensor> = HashMap::new();
    t.insert(
        "embedding.weight".into(),
        rng.tensor(&[config.padded_vocab(), d], 1.0)?,
    );
    for (i, kind) in config.layers.iter().enumerate() {
        let p = |name: &str| format!("layers.{i}.{name}");
        t.insert(p("norm.weight"), Tensor::ones(d, DType::F32, &Device::Cpu)?);
        match kind {
            LayerKind::Mamba => insert_mixer(&mut rng, &mamba, &p("mixer"), &mut t)?,
            LayerKind::Attention => {
                for name in ["q_proj", "k_proj", "v_proj"] {
                    t.insert(
                        p(&format!("attn.{name}.weight")),
                        rng.tensor(&[inner, d], lin(d))?,
                    );
                }
                t.insert(
                    p("attn.o_proj.weight"),
                    rng.tensor(&[d, inner], lin(inner))?,
                );
            }
        }
    }
    t.insert(
        "norm_f.weight".into(),
        Tensor::ones(d, DType::F32, &Device::Cpu)?,
    );
    candle_core::safetensors::save(&t, path)
        .map_err(|e| Error::Weights(format!("cannot write {}: {e}", path.display())))
}
