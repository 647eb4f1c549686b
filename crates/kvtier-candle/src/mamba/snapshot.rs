//! Mamba's recurrent state as bytes, and back.
//!
//! The state after a prefix is, per layer, the SSM state `h` `[1, d_inner, d_state]` and
//! the convolution's last `d_conv` inputs `[1, d_inner]` each, plus the position (which
//! picks the slot the next input overwrites). The blob:
//!
//! ```text
//! "KVMS" | version u32 | layers u32 | d_inner u32 | d_state u32 | d_conv u32 | pos u64
//! then per layer: h (f32 LE), conv inputs 0..d_conv (f32 LE)
//! ```
//!
//! A blob whose header does not match the model exactly, or whose length is wrong, is
//! refused ([`crate::Error::Mismatch`]); the caller then computes the prefix instead.

use candle_core::{Device, Tensor};
use candle_transformers::models::mamba::{Config, State};

use super::weights::{D_CONV, D_STATE, d_inner};
use crate::{Error, Result};

const MAGIC: &[u8; 4] = b"KVMS";
const VERSION: u32 = 1;
const HEADER: usize = 4 + 4 * 5 + 8;

/// The state group that files this encoding of a model of shape `config` in a layout
/// key: the kind names the encoding (and its version) exactly, so no other encoding can
/// alias it.
pub fn state_group(config: &Config) -> kvtier_core::StateGroup {
    kvtier_core::StateGroup {
        kind: format!("kvtier-candle/mamba1/f32/d_state{D_STATE}/d_conv{D_CONV}/KVMS{VERSION}"),
        num_layers: config.n_layer as u32,
        state_bytes: encoded_len(config) as u64,
    }
}

/// Bytes of an encoded state of a model of shape `config`.
pub fn encoded_len(config: &Config) -> usize {
    let d_inner = d_inner(config);
    HEADER + (d_inner * D_STATE + D_CONV * d_inner) * 4 * config.n_layer
}

/// Serialises `state`.
pub fn encode(config: &Config, state: &State) -> Result<Vec<u8>> {
    let d_inner = d_inner(config);
    let per_layer = (d_inner * D_STATE + D_CONV * d_inner) * 4;
    let mut out = Vec::with_capacity(HEADER + per_layer * config.n_layer);
    out.extend_from_slice(MAGIC);
    for v in [
        VERSION,
        config.n_layer as u32,
        d_inner as u32,
        D_STATE as u32,
        D_CONV as u32,
    ] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&(state.pos as u64).to_le_bytes());
    for (h, xs) in state.hs.iter().zip(&state.prev_xs) {
        for t in std::iter::once(h).chain(xs.iter()) {
            let v = t.flatten_all()?.to_vec1::<f32>()?;
            out.extend_from_slice(bytemuck::cast_slice(&v));
        }
    }
    Ok(out)
}

/// The state `blob` holds, checked against `config`.
pub fn decode(config: &Config, blob: &[u8]) -> Result<State> {
    let d_inner = d_inner(config);
    let per_layer = (d_inner * D_STATE + D_CONV * d_inner) * 4;
    let want = HEADER + per_layer * config.n_layer;
    if blob.len() != want || &blob[..4] != MAGIC {
        return Err(Error::Mismatch(format!(
            "a state snapshot of {} bytes; this model's are {want} bytes starting KVMS",
            blob.len()
        )));
    }
    let word = |i: usize| {
        u32::from_le_bytes([
            blob[4 + 4 * i],
            blob[5 + 4 * i],
            blob[6 + 4 * i],
            blob[7 + 4 * i],
        ])
    };
    let header = [word(0), word(1), word(2), word(3), word(4)];
    let expected = [
        VERSION,
        config.n_layer as u32,
        d_inner as u32,
        D_STATE as u32,
        D_CONV as u32,
    ];
    if header != expected {
        return Err(Error::Mismatch(format!(
            "snapshot header {header:?}; this model needs {expected:?}"
        )));
    }
    let mut pos_bytes = [0u8; 8];
    pos_bytes.copy_from_slice(&blob[24..32]);
    let pos = u64::from_le_bytes(pos_bytes) as usize;
    let mut state = State::new(1, config, candle_core::DType::F32, &Device::Cpu)?;
    state.pos = pos;
    let mut at = HEADER;
    let mut take = |n: usize, shape: &[usize]| -> Result<Tensor> {
        let v = bytemuck::pod_collect_to_vec::<u8, f32>(&blob[at..at + n * 4]);
        at += n * 4;
        Ok(Tensor::from_vec(v, shape, &Device::Cpu)?)
    };
    for layer in 0..config.n_layer {
        state.hs[layer] = take(d_inner * D_STATE, &[1, d_inner, D_STATE])?;
        for slot in 0..D_CONV {
            state.prev_xs[layer][slot] = take(d_inner, &[1, d_inner])?;
        }
    }
    Ok(state)
}
