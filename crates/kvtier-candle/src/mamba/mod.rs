//! Mamba (pure SSM) through candle-transformers' implementation, with deterministic
//! weights and a state that can be snapshotted into kvtier's snapshot bucket.

mod model;
mod snapshot;
pub(crate) mod weights;

pub use model::MambaModel;
pub use snapshot::{
    decode as decode_state, encode as encode_state, encoded_len as state_len, state_group,
};
pub use weights::{D_CONV, D_STATE, synthetic_config, write_synthetic};
