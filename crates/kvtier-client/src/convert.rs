//! The one mapping between the engine's types and the wire's: a layout key and its JSON
//! spec both ways, a store report and its answer, a client error and the engine's error
//! kinds. The server's routes, the caller API (`kvtier_node::Cache`), Python and the
//! tests all convert through here, so a field added to the key is mapped once.

use kvtier_core::{Error, ErrorKind, KvDtype, LayoutKey, StateGroup, StoreReport};

use crate::ClientError;
use crate::wire::{LayoutSpec, StateGroupSpec, StoreAnswer};

/// Why a [`LayoutSpec`] names no layout key: the error code the server answers with
/// (`bad_layout`, `bad_hex`) and what was wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadSpec {
    /// The server's error code.
    pub code: &'static str,
    /// What was wrong, naming the value.
    pub message: String,
}

impl LayoutSpec {
    /// `key` as the registration request asks for it, with `checkpoint_every` if given
    /// (a setting of the layout, not part of its identity).
    pub fn of_key(key: &LayoutKey, checkpoint_every: Option<u32>) -> Self {
        LayoutSpec {
            model_id: key.model_id.clone(),
            weights_digest: key.weights_digest.clone(),
            tokenizer_digest: key.tokenizer_digest.clone(),
            dtype: key.dtype.name().to_owned(),
            tokens_per_block: key.tokens_per_block,
            num_layers: key.num_layers,
            num_kv_heads: key.num_kv_heads,
            head_dim: key.head_dim,
            tp_rank: key.tp_rank,
            tp_size: key.tp_size,
            pp_stage: key.pp_stage,
            pp_size: key.pp_size,
            lora_id: key.lora_id.clone(),
            tenant_salt: kvtier_core::hash::hex(&key.tenant_salt),
            state_groups: key
                .state_groups
                .iter()
                .map(|g| StateGroupSpec {
                    kind: g.kind.clone(),
                    num_layers: g.num_layers,
                    state_bytes: g.state_bytes,
                })
                .collect(),
            checkpoint_every,
            cold_codec: key.cold_codec.map(|c| c.name().to_owned()),
        }
    }

    /// The layout key this spec names. Only the spelling is checked here (the dtype's
    /// name, the salt's hex); the engine checks the values when the key is registered.
    pub fn to_key(&self) -> Result<LayoutKey, BadSpec> {
        let dtype: KvDtype = self.dtype.parse().map_err(|e: Error| BadSpec {
            code: "bad_layout",
            message: e.message().to_owned(),
        })?;
        let mut key = LayoutKey::new(
            self.model_id.clone(),
            dtype,
            self.tokens_per_block,
            self.num_layers,
            self.num_kv_heads,
            self.head_dim,
        );
        key.weights_digest = self.weights_digest.clone();
        key.tokenizer_digest = self.tokenizer_digest.clone();
        key.tp_rank = self.tp_rank;
        key.tp_size = self.tp_size;
        key.pp_stage = self.pp_stage;
        key.pp_size = self.pp_size;
        key.lora_id = self.lora_id.clone();
        key.tenant_salt = hex_bytes(&self.tenant_salt).ok_or_else(|| BadSpec {
            code: "bad_hex",
            message: format!("tenant salt `{}` is not hex", self.tenant_salt),
        })?;
        key.state_groups = self
            .state_groups
            .iter()
            .map(|g| StateGroup {
                kind: g.kind.clone(),
                num_layers: g.num_layers,
                state_bytes: g.state_bytes,
            })
            .collect();
        key.cold_codec = match &self.cold_codec {
            None => None,
            Some(name) => Some(name.parse().map_err(|e: Error| BadSpec {
                code: "bad_layout",
                message: e.message().to_owned(),
            })?),
        };
        Ok(key)
    }
}

/// `s` as bytes, two hex digits each; `None` unless it is whole hex digits.
fn hex_bytes(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| s.get(i..i + 2).and_then(|b| u8::from_str_radix(b, 16).ok()))
        .collect()
}

impl From<&StoreReport> for StoreAnswer {
    fn from(r: &StoreReport) -> Self {
        StoreAnswer {
            stored: r.stored,
            duplicates: r.duplicates,
            stored_lower_only: r.stored_lower_only,
            stopped: r.stopped.map(|s| s.name().to_owned()),
            durability: r.ack.name().to_owned(),
        }
    }
}

impl ClientError {
    /// What the caller should do about this error, in the engine's kinds: the server's
    /// error code where it names a kind (`invalid`, `no_space`, …), else the HTTP status;
    /// no answer at all is `Unavailable`, an answer that breaks the wire format
    /// `Internal`… except that a malformed answer is most often a server going away
    /// mid-answer, so it too is `Unavailable` (retrying may succeed).
    pub fn kind(&self) -> ErrorKind {
        match self {
            ClientError::Api { status, code, .. } => {
                ErrorKind::from_name(code).unwrap_or(match *status {
                    503 => ErrorKind::Unavailable,
                    507 => ErrorKind::NoSpace,
                    400..=499 => ErrorKind::Invalid,
                    _ => ErrorKind::Internal,
                })
            }
            ClientError::Transport(_) | ClientError::Protocol(_) | ClientError::Deadline { .. } => {
                ErrorKind::Unavailable
            }
        }
    }

    /// The server's error code (`unknown_layout`, `bad_json`, …), when it answered with
    /// one.
    pub fn code(&self) -> Option<&str> {
        match self {
            ClientError::Api { code, .. } => Some(code),
            _ => None,
        }
    }
}

impl From<ClientError> for Error {
    /// The engine's error of the client error's kind, with the client error (and its
    /// server code) as the source.
    fn from(e: ClientError) -> Self {
        Error::new(e.kind(), "call to kvtier serve").with_source(e)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use super::*;

    #[test]
    fn a_key_round_trips_through_its_spec() {
        let mut key = LayoutKey::new("m", KvDtype::Bf16, 16, 4, 2, 64);
        key.tp_rank = 1;
        key.tp_size = 2;
        key.pp_stage = 1;
        key.pp_size = 3;
        key.lora_id = Some("adapter".into());
        key.tenant_salt = vec![0xab, 0x01];
        key.weights_digest = "w".into();
        key.tokenizer_digest = "t".into();
        key.state_groups = vec![StateGroup {
            kind: "mamba1/f32".into(),
            num_layers: 3,
            state_bytes: 96,
        }];
        key.cold_codec = Some(kvtier_core::ColdCodec::Fp8E4M3);
        let spec = LayoutSpec::of_key(&key, Some(64));
        assert_eq!(spec.tenant_salt, "ab01");
        assert_eq!(spec.checkpoint_every, Some(64));
        assert_eq!(spec.cold_codec.as_deref(), Some("fp8_e4m3"));
        assert_eq!(spec.to_key().unwrap(), key);
    }

    #[test]
    fn bad_spellings_name_the_server_codes() {
        let key = LayoutKey::new("m", KvDtype::F16, 16, 4, 2, 64);
        let mut spec = LayoutSpec::of_key(&key, None);
        spec.tenant_salt = "abc".into();
        assert_eq!(spec.to_key().unwrap_err().code, "bad_hex");
        spec.tenant_salt = "zz".into();
        assert_eq!(spec.to_key().unwrap_err().code, "bad_hex");
        spec.tenant_salt.clear();
        spec.dtype = "f13".into();
        assert_eq!(spec.to_key().unwrap_err().code, "bad_layout");
        spec.dtype = "f16".into();
        spec.cold_codec = Some("int4".into());
        assert_eq!(spec.to_key().unwrap_err().code, "bad_layout");
    }

    #[test]
    fn api_errors_take_the_kind_their_code_names_else_their_status() {
        let api = |status, code: &str| ClientError::Api {
            status,
            code: code.into(),
            message: String::new(),
        };
        assert_eq!(api(507, "no_space").kind(), ErrorKind::NoSpace);
        assert_eq!(api(503, "closed").kind(), ErrorKind::Closed);
        assert_eq!(api(404, "unknown_layout").kind(), ErrorKind::Invalid);
        assert_eq!(api(503, "stopping").kind(), ErrorKind::Unavailable);
        assert_eq!(api(500, "panic").kind(), ErrorKind::Internal);
        let e: Error = api(404, "unknown_layout").into();
        assert_eq!(e.kind(), ErrorKind::Invalid);
        let source = std::error::Error::source(&e).unwrap();
        let client = source.downcast_ref::<ClientError>().unwrap();
        assert_eq!(client.code(), Some("unknown_layout"));
    }
}
