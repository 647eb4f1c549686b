//! Deterministic Mamba weights: no Mamba checkpoint can be fetched on these machines, so
//! kvtier makes one from a seed, writes it as safetensors and loads it through candle's
//! ordinary loading path (`VarBuilder`), exactly as a downloaded checkpoint would be.
//!
//! The values follow Mamba's initialisation closely enough for the recurrence to stay
//! finite over long prompts: `A_log = log(1..=d_state)`, `D = 1`, a `dt_proj` bias that
//! puts the step size between 0.001 and 0.1, and small uniform projections.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};
use candle_transformers::models::mamba::Config;

use crate::{Error, Result};

/// Mamba's state size per channel (fixed in candle's implementation).
pub const D_STATE: usize = 16;
/// Mamba's convolution width (fixed in candle's implementation).
pub const D_CONV: usize = 4;

/// The synthetic model's shape: byte-level tokens, 8 layers of width 256.
pub fn synthetic_config() -> Config {
    Config {
        d_model: 256,
        n_layer: 8,
        vocab_size: 256,
        pad_vocab_size_multiple: 8,
    }
}

/// Inner width (`2 · d_model`).
pub fn d_inner(config: &Config) -> usize {
    config.d_model * 2
}

/// Rank of the step-size projection.
pub fn dt_rank(config: &Config) -> usize {
    config.d_model.div_ceil(16)
}

/// SplitMix64: tiny, fast and the same on every machine.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[-scale, scale)`.
    pub(crate) fn uniform(&mut self, scale: f32) -> f32 {
        let unit = (self.next() >> 40) as f32 / (1u64 << 24) as f32;
        (unit * 2.0 - 1.0) * scale
    }

    pub(crate) fn tensor(&mut self, shape: &[usize], scale: f32) -> Result<Tensor> {
        let n = shape.iter().product();
        let data: Vec<f32> = (0..n).map(|_| self.uniform(scale)).collect();
        Ok(Tensor::from_vec(data, shape, &Device::Cpu)?)
    }
}

/// Writes the weights of `config` made from `seed` to `path` (safetensors, with the
/// `backbone.` names of the published Mamba checkpoints).
pub fn write_synthetic(config: &Config, seed: u64, path: &Path) -> Result<()> {
    let mut rng = Rng(seed);
    let d_model = config.d_model;
    let vocab =
        config.vocab_size.div_ceil(config.pad_vocab_size_multiple) * config.pad_vocab_size_multiple;
    let mut t: HashMap<String, Tensor> = HashMap::new();
    t.insert(
        "backbone.embedding.weight".into(),
        rng.tensor(&[vocab, d_model], 1.0)?,
    );
    for i in 0..config.n_layer {
        let p = |name: &str| format!("backbone.layers.{i}.{name}");
        t.insert(
            p("norm.weight"),
            Tensor::ones(d_model, candle_core::DType::F32, &Device::Cpu)?,
        );
        insert_mixer(&mut rng, config, &p("mixer"), &mut t)?;
    }
    t.insert(
        "backbone.norm_f.weight".into(),
        Tensor::ones(d_model, candle_core::DType::F32, &Device::Cpu)?,
    );
    candle_core::safetensors::save(&t, path)
        .map_err(|e| Error::Weights(format!("cannot write {}: {e}", path.display())))
}

/// The weights of one Mamba mixer (a layer's SSM, without its norm) under `prefix` (e.g.
/// `backbone.layers.3.mixer`), drawn from `rng`.
pub(crate) fn insert_mixer(
    rng: &mut Rng,
    config: &Config,
    prefix: &str,
    t: &mut HashMap<String, Tensor>,
) -> Result<()> {
    let d_model = config.d_model;
    let d_inner = d_inner(config);
    let dt_rank = dt_rank(config);
    let p = |name: &str| format!("{prefix}.{name}");
    let lin = |fan_in: usize| 1.0 / (fan_in as f32).sqrt();
    t.insert(
        p("in_proj.weight"),
        rng.tensor(&[2 * d_inner, d_model], lin(d_model))?,
    );
    t.insert(
        p("conv1d.weight"),
        rng.tensor(&[d_inner, 1, D_CONV], lin(D_CONV))?,
    );
    t.insert(p("conv1d.bias"), rng.tensor(&[d_inner], lin(D_CONV))?);
    t.insert(
        p("x_proj.weight"),
        rng.tensor(&[dt_rank + 2 * D_STATE, d_inner], lin(d_inner))?,
    );
    t.insert(
        p("dt_proj.weight"),
        rng.tensor(&[d_inner, dt_rank], lin(dt_rank))?,
    );
    // softplus⁻¹ of a step size log-uniform in [0.001, 0.1].
    let bias: Vec<f32> = (0..d_inner)
        .map(|_| {
            let u = (rng.uniform(1.0) + 1.0) / 2.0;
            let dt = (0.001f32.ln() + u * (0.1f32.ln() - 0.001f32.ln())).exp();
            dt + (-(-dt).exp_m1()).ln()
        })
        .collect();
    t.insert(
        p("dt_proj.bias"),
        Tensor::from_vec(bias, d_inner, &Device::Cpu)?,
    );
    let a_log: Vec<f32> = (0..d_inner)
        .flat_map(|_| (1..=D_STATE).map(|s| (s as f32).ln()))
        .collect();
    t.insert(
        p("A_log"),
        Tensor::from_vec(a_log, (d_inner, D_STATE), &Device::Cpu)?,
    );
    t.insert(
        p("D"),
        Tensor::ones(d_inner, candle_core::DType::F32, &Device::Cpu)?,
    );
    t.insert(
        p("out_proj.weight"),
        rng.tensor(&[d_model, d_inner], lin(d_inner))?,
    );
    Ok(())
}
