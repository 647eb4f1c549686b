//! The answer to a lookup of a [`super::Cache`]: how much of a prompt is cached, where,
//! and what loading it takes.

use kvtier_core::{Error, Lookup, Result, TierKind};

use super::CacheLayout;

/// Where a hit came from.
#[derive(Debug, Clone)]
pub(super) enum Found {
    /// The embedded engine's lookup.
    Local(Lookup),
    /// A server's answer: the handles (32 hex digits per block) a load sends back, the
    /// tiers one letter per block, and for hits joined from several lookups the blocks of
    /// each (a load resolves each from the layout's root).
    Served {
        handles: String,
        tiers: String,
        chains: Option<Vec<u32>>,
    },
}

/// How much of a prompt is cached: the leading whole blocks found, and where.
#[derive(Debug, Clone)]
pub struct Hit {
    /// Tokens covered by the matched blocks (a layout with state groups: the boundary of
    /// the state found with them).
    pub matched_tokens: usize,
    /// For a layout with state groups, the fastest tier holding the recurrent state at
    /// the end of the matched blocks (a hit of such a layout always has one).
    pub state_tier: Option<TierKind>,
    pub(super) layout: String,
    pub(super) block_bytes: u64,
    pub(super) num_layers: u32,
    pub(super) found: Found,
}

impl Hit {
    pub(super) fn local(lookup: Lookup, layout: &CacheLayout) -> Self {
        Self {
            matched_tokens: lookup.matched_tokens,
            state_tier: lookup.state.map(|s| s.tier),
            layout: layout.digest.clone(),
            block_bytes: layout.block_bytes,
            num_layers: layout.num_layers(),
            found: Found::Local(lookup),
        }
    }

    pub(super) fn served(answer: kvtier_client::wire::LookupAnswer, layout: &CacheLayout) -> Self {
        Self {
            matched_tokens: answer.matched_tokens,
            state_tier: answer
                .state
                .as_ref()
                .and_then(|s| s.tier.chars().next())
                .and_then(TierKind::from_letter),
            layout: layout.digest.clone(),
            block_bytes: layout.block_bytes,
            num_layers: layout.num_layers(),
            found: Found::Served {
                handles: answer.handles,
                tiers: answer.tiers,
                chains: None,
            },
        }
    }

    /// Blocks matched.
    pub fn blocks(&self) -> usize {
        match &self.found {
            Found::Local(l) => l.blocks.len(),
            Found::Served { handles, .. } => handles.len() / kvtier_client::wire::HANDLE_HEX_LEN,
        }
    }

    /// The fastest tier holding each matched block at lookup time (`ram`, `ssd`,
    /// `remote`; `unknown` for a letter a newer server sent).
    pub fn tier_names(&self) -> Vec<&'static str> {
        match &self.found {
            Found::Local(l) => l.blocks.iter().map(|b| b.tier.name()).collect(),
            Found::Served { tiers, .. } => tiers
                .chars()
                .map(|c| TierKind::from_letter(c).map_or("unknown", TierKind::name))
                .collect(),
        }
    }

    /// The digest (hex) of the layout it was looked up under.
    pub fn layout_hex(&self) -> &str {
        &self.layout
    }

    /// The first `blocks` matched blocks of this hit (a load of fewer than were found).
    pub fn prefix(&self, blocks: usize) -> Result<Hit> {
        if blocks > self.blocks() {
            return Err(Error::invalid(format!(
                "{blocks} blocks asked of a hit of {}",
                self.blocks()
            )));
        }
        let mut out = self.clone();
        match &mut out.found {
            Found::Local(l) => l.blocks.truncate(blocks),
            Found::Served {
                handles,
                tiers,
                chains,
            } => {
                handles.truncate(blocks * kvtier_client::wire::HANDLE_HEX_LEN);
                tiers.truncate(blocks);
                if let Some(chains) = chains {
                    // The leading chains that fit, and the part of the next one that does.
                    let mut left = blocks as u32;
                    chains.retain_mut(|c| {
                        let keep = (*c).min(left);
                        left -= keep;
                        *c = keep;
                        keep > 0
                    });
                }
            }
        }
        if blocks < self.blocks() {
            // A prefix carries tokens of whole blocks and no state: the state belongs
            // to the end of the whole hit.
            out.matched_tokens = self.matched_tokens / self.blocks().max(1) * blocks;
            out.state_tier = None;
            if let Found::Local(l) = &mut out.found {
                l.matched_tokens = out.matched_tokens;
                l.state = None;
            }
        }
        Ok(out)
    }

    /// The blocks of `hits` (lookups of one layout by one cache, without recurrent state)
    /// as one hit, in order: one load of many short prompts' blocks, as SGLang's pages
    /// are loaded (a server's hits become one `/v1/load` of many chains, each resolved
    /// from the layout's root; an engine's lookups are its own, loaded as they are).
    pub fn join(hits: &[Hit]) -> Result<Hit> {
        let Some(first) = hits.first() else {
            return Err(Error::invalid("no hits to join"));
        };
        let mut out = first.clone();
        for hit in &hits[1..] {
            if hit.layout != out.layout {
                return Err(Error::invalid("hits of different layouts cannot be joined"));
            }
            match (&mut out.found, &hit.found) {
                (Found::Local(a), Found::Local(b)) => {
                    a.blocks.extend(b.blocks.iter().cloned());
                    a.matched_tokens += b.matched_tokens;
                }
                (
                    Found::Served {
                        handles,
                        tiers,
                        chains,
                    },
                    Found::Served {
                        handles: h,
                        tiers: t,
                        chains: c,
                    },
                ) => {
                    let own = |n: usize| vec![n as u32];
                    let mut joined = chains.take().unwrap_or_else(|| {
                        own(handles.len() / kvtier_client::wire::HANDLE_HEX_LEN)
                    });
                    joined.extend(
                        c.clone()
                            .unwrap_or_else(|| own(h.len() / kvtier_client::wire::HANDLE_HEX_LEN)),
                    );
                    // An empty hit is no chain: a load's chains are never empty.
                    joined.retain(|&n| n > 0);
                    *chains = Some(joined);
                    handles.push_str(h);
                    tiers.push_str(t);
                }
                _ => return Err(Error::invalid("hits of different caches cannot be joined")),
            }
            out.matched_tokens += hit.matched_tokens;
        }
        if hits.iter().any(|h| h.state_tier.is_some()) {
            return Err(Error::invalid(
                "hits with recurrent state cannot be joined (a state belongs to its own prompt)",
            ));
        }
        Ok(out)
    }

    /// Bytes of one block a load of `layers` fills: the whole block, or its pages of
    /// layers `start..end` (every layer's page is the same size). An error for an empty
    /// range or one past the layout's layers.
    pub fn bytes_per_block(&self, layers: Option<(u32, u32)>) -> Result<usize> {
        match layers {
            None => Ok(self.block_bytes as usize),
            Some((start, end)) if start < end && end <= self.num_layers => {
                Ok(self.block_bytes as usize / self.num_layers as usize * (end - start) as usize)
            }
            Some((start, end)) => Err(Error::invalid(format!(
                "layers ({start}, {end}) is empty or past the layout's {} layers",
                self.num_layers
            ))),
        }
    }

    /// Bytes a load of every matched block (or of `layers` of each) fills.
    pub fn nbytes(&self, layers: Option<(u32, u32)>) -> Result<usize> {
        Ok(self.blocks() * self.bytes_per_block(layers)?)
    }
}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::unwrap_used,
        clippy::expect_used,
        reason = "test code: a failed expectation is a failed test"
    )]

    use kvtier_client::wire::LookupAnswer;
    use kvtier_core::{KvDtype, LayoutKey};

    use super::*;

    fn layout(digest: &str) -> CacheLayout {
        CacheLayout {
            key: LayoutKey::new("m", KvDtype::F16, 16, 2, 2, 64),
            digest: digest.into(),
            block_bytes: 8192,
            checkpoint_every: None,
            core: None,
        }
    }

    /// A server's answer of `blocks` blocks whose handles are all the digit `d`.
    fn served(blocks: usize, d: char, on: &CacheLayout) -> Hit {
        let answer = LookupAnswer {
            matched_tokens: blocks * 16,
            handles: d.to_string().repeat(blocks * 32),
            tiers: "r".repeat(blocks),
            state: None,
        };
        Hit::served(answer, on)
    }

    fn chains(hit: &Hit) -> Option<Vec<u32>> {
        match &hit.found {
            Found::Served { chains, .. } => chains.clone(),
            Found::Local(_) => None,
        }
    }

    #[test]
    fn a_joined_hit_names_its_chains_and_a_prefix_cuts_them() {
        let on = layout("aa");
        let joined = Hit::join(&[
            served(2, '1', &on),
            served(0, '2', &on),
            served(3, '3', &on),
        ])
        .unwrap();
        assert_eq!((joined.blocks(), joined.matched_tokens), (5, 80));
        assert_eq!(
            chains(&joined),
            Some(vec![2, 3]),
            "an empty hit is no chain"
        );
        assert_eq!(joined.tier_names(), ["ram"; 5]);
        // A prefix keeps the leading chains that fit and the part of the next one.
        assert_eq!(chains(&joined.prefix(3).unwrap()), Some(vec![2, 1]));
        assert_eq!(chains(&joined.prefix(2).unwrap()), Some(vec![2]));
        assert_eq!(chains(&joined.prefix(0).unwrap()), Some(vec![]));
        assert!(joined.prefix(6).is_err());
        // One hit joined is that hit: one chain.
        assert_eq!(chains(&Hit::join(&[served(2, '1', &on)]).unwrap()), None);
    }

    #[test]
    fn hits_of_other_layouts_states_or_nothing_are_not_joined() {
        let (a, b) = (layout("aa"), layout("bb"));
        assert!(Hit::join(&[]).is_err());
        assert!(Hit::join(&[served(1, '1', &a), served(1, '2', &b)]).is_err());
        let mut with_state = served(1, '2', &a);
        with_state.state_tier = TierKind::from_letter('r');
        assert!(with_state.state_tier.is_some());
        assert!(Hit::join(&[served(1, '1', &a), with_state]).is_err());
    }
}
