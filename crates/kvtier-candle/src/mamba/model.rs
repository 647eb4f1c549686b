//! A loaded Mamba model: weights through `VarBuilder`, token-by-token forward.

use std::path::Path;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::mamba::{Config, Model, State};

use crate::{Error, Result};

/// A Mamba model and what identifies it.
pub struct MambaModel {
    model: Model,
    config: Config,
    weights_digest: String,
}

impl std::fmt::Debug for MambaModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MambaModel")
            .field("config", &self.config)
            .field("weights_digest", &self.weights_digest)
            .finish_non_exhaustive()
    }
}

impl MambaModel {
    /// Loads safetensors weights of shape `config`.
    pub fn load(path: &Path, config: Config) -> Result<Arc<Self>> {
        let weights_digest = crate::digest::file_sha256(path)?;
        let bytes = std::fs::read(path)
            .map_err(|e| Error::io(format!("cannot read {}", path.display()), e))?;
        let vb = VarBuilder::from_buffered_safetensors(bytes, DType::F32, &Device::Cpu)?;
        let model = Model::new(&config, vb.pp("backbone"))?;
        Ok(Arc::new(Self {
            model,
            config,
            weights_digest,
        }))
    }

    /// The model's shape.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// SHA-256 of the weights file, hex.
    pub fn weights_digest(&self) -> &str {
        &self.weights_digest
    }

    /// A zero state.
    pub fn fresh_state(&self) -> Result<State> {
        Ok(State::new(1, &self.config, DType::F32, &Device::Cpu)?)
    }

    /// Feeds `token`; returns the logits of the next token.
    pub fn step(&self, state: &mut State, token: u32) -> Result<Vec<f32>> {
        if token as usize >= self.config.vocab_size {
            return Err(Error::Invalid(format!(
                "token {token} is outside the vocabulary of {}",
                self.config.vocab_size
            )));
        }
        let input = Tensor::new(&[token], &Device::Cpu)?;
        let logits = self.model.forward(&input, state)?;
        let mut v = logits.flatten_all()?.to_vec1::<f32>()?;
        v.truncate(self.config.vocab_size);
        Ok(v)
    }

    /// Feeds every token of `tokens`; returns the logits after the last.
    pub fn feed(&self, state: &mut State, tokens: &[u32]) -> Result<Vec<f32>> {
        let Some((last, rest)) = tokens.split_last() else {
            return Err(Error::Invalid("no tokens to feed".into()));
        };
        for &t in rest {
            self.step(state, t)?;
        }
        self.step(state, *last)
    }
}
