//! A layout registered with a [`super::Cache`]: its key, its digest and what the callers
//! size buffers by.

use std::sync::Arc;

use kvtier_core::{Error, Layout, LayoutKey, Result};

/// A layout registered with a cache, embedded or served: what every block stored under
/// it is computed for. Blocks are never shared across layouts.
#[derive(Debug, Clone)]
pub struct CacheLayout {
    pub(super) key: LayoutKey,
    pub(super) digest: String,
    pub(super) block_bytes: u64,
    pub(super) checkpoint_every: Option<u32>,
    /// The engine's layout, for one registered with an embedded engine.
    pub(super) core: Option<Arc<Layout>>,
}

impl CacheLayout {
    /// The layout key it was registered under.
    pub fn key(&self) -> &LayoutKey {
        &self.key
    }

    /// The layout digest, hex: its name in the store and on the wire.
    pub fn digest_hex(&self) -> &str {
        &self.digest
    }

    /// Bytes of one block (every layer, K and V).
    pub fn block_bytes(&self) -> u64 {
        self.block_bytes
    }

    /// Tokens per block.
    pub fn tokens_per_block(&self) -> usize {
        self.key.tokens_per_block as usize
    }

    /// Layers per block (the attention layers of a hybrid layout).
    pub fn num_layers(&self) -> u32 {
        self.key.num_layers
    }

    /// Bytes of the recurrent state of every state group at one boundary (0 for an
    /// attention-only layout).
    pub fn state_bytes(&self) -> u64 {
        self.key.state_bytes()
    }

    /// For a layout with state groups, the tokens between checkpoint boundaries in force
    /// when it was registered; `None` otherwise.
    pub fn checkpoint_every(&self) -> Option<u32> {
        self.checkpoint_every
    }

    /// Checks that `state` is one whole recurrent state of this layout, before anything
    /// is sent or kept.
    pub fn check_state(&self, state: &[u8]) -> Result<()> {
        let want = self.state_bytes();
        if want == 0 {
            return Err(Error::invalid(format!(
                "layout {} names no state groups: it has no recurrent state to checkpoint",
                self.digest
            )));
        }
        if state.len() as u64 != want {
            return Err(Error::invalid(format!(
                "a state of {} bytes; layout {} names {want} bytes of state",
                state.len(),
                self.digest
            )));
        }
        Ok(())
    }

    /// The engine's layout; an error for one registered with a server.
    pub(super) fn core(&self) -> Result<&Arc<Layout>> {
        self.core.as_ref().ok_or_else(|| {
            Error::invalid(
                "this layout was registered through a Client of kvtier serve: register it with this Engine",
            )
        })
    }
}
