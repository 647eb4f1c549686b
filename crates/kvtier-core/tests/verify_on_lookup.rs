//! A hash match alone never serves a block: the index checks parent, position, tokens and
//! extra keys. Simulated here by planting an entry whose hash matches a prompt's block but
//! whose contents do not (what a hash collision would look like).

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed expectation is a failed test"
)]

mod common;

use std::sync::Arc;

use kvtier_core::tier::{BlockMeta, ResidencySink, TierKind};
use kvtier_core::{Engine, ExtraKeys};

/// The honest metadata of `prompt`'s first block.
fn first_block(prompt: &kvtier_core::index::Prompt) -> BlockMeta {
    BlockMeta {
        layout: prompt.layout().digest(),
        hash: prompt.hashes()[0],
        parent: prompt.parent_of(0),
        position: 0,
        tokens: Arc::from(prompt.block_tokens(0)),
        extra_tag: None,
    }
}

fn planted(
    engine: &Engine,
    tokens: &[u32],
    edit: impl Fn(&mut BlockMeta),
) -> Result<usize, kvtier_core::Error> {
    let layout = engine.register_layout(common::small_key())?;
    let prompt = engine.prompt(layout.digest(), tokens, &ExtraKeys::none())?;
    let mut meta = first_block(&prompt);
    edit(&mut meta);
    engine.index().inserted(TierKind::Ram, &meta);
    Ok(engine.lookup(&prompt).blocks.len())
}

#[test]
fn an_entry_with_the_right_hash_but_other_contents_is_a_miss() -> Result<(), kvtier_core::Error> {
    let tokens: Vec<u32> = (100..116).collect();
    // Control: the honest entry matches.
    assert_eq!(planted(&Engine::builder().build()?, &tokens, |_| {})?, 1);
    type Edit = Box<dyn Fn(&mut BlockMeta)>;
    let edits: Vec<(&str, Edit)> = vec![
        (
            "tokens",
            Box::new(|m| m.tokens = Arc::from(&[7u32; 16][..])),
        ),
        ("parent", Box::new(|m| m.parent.0[0] ^= 1)),
        ("position", Box::new(|m| m.position = 3)),
        ("extra keys", Box::new(|m| m.extra_tag = Some([9; 16]))),
    ];
    for (what, edit) in edits {
        let engine = Engine::builder().build()?;
        assert_eq!(
            planted(&engine, &tokens, edit)?,
            0,
            "a block with other {what} was served"
        );
        assert_eq!(engine.stats().index.verify_mismatches, 1, "{what}");
    }
    Ok(())
}

#[test]
fn long_walks_verify_too() -> Result<(), kvtier_core::Error> {
    // Past the first 32 blocks the walk switches to a two-pass mode; plant a bad block there.
    let engine = Engine::builder().build()?;
    let layout = engine.register_layout(common::small_key())?;
    let tokens: Vec<u32> = (0..16 * 40).collect();
    common::store_all(&engine, &layout, &tokens)?;
    let prompt = engine.prompt(layout.digest(), &tokens, &ExtraKeys::none())?;
    assert_eq!(engine.lookup(&prompt).blocks.len(), 40);
    let i = 35;
    let meta = BlockMeta {
        layout: layout.digest(),
        hash: prompt.hashes()[i],
        parent: prompt.parent_of(i),
        position: i as u32,
        tokens: Arc::from(&[1u32; 16][..]),
        extra_tag: None,
    };
    // Replacing the entry with different contents drops it (a collision keeps neither).
    engine.index().inserted(TierKind::Ram, &meta);
    assert_eq!(engine.lookup(&prompt).blocks.len(), i);
    Ok(())
}

/// A block learned from a cluster record is known by its place in the chain only: the
/// index matches it by hash, parent and position, learns its tokens when the remote tier
/// has checked its manifest (or another tier holds it), and still refuses another place.
#[test]
fn a_block_known_by_its_place_matches_by_hash_and_learns_its_tokens()
-> Result<(), kvtier_core::Error> {
    let engine = Engine::builder().build()?;
    let layout = engine.register_layout(common::small_key())?;
    let tokens: Vec<u32> = (200..216).collect();
    let prompt = engine.prompt(layout.digest(), &tokens, &ExtraKeys::none())?;
    let full = first_block(&prompt);
    let described = BlockMeta::described(full.layout, full.hash, full.parent, 0);
    assert!(!described.tokens_known() && described.same_place(&full));
    engine.index().inserted(TierKind::Remote, &described);
    assert_eq!(
        engine.lookup(&prompt).blocks.len(),
        1,
        "matched by its hash chain"
    );
    // The checked manifest (or a store into RAM) brings the tokens: one entry, two tiers.
    engine.index().inserted(TierKind::Ram, &full);
    assert_eq!(engine.index().meta_of(&full.hash), Some(full.clone()));
    assert_eq!(
        engine.index().tiers_of(&full.hash),
        TierKind::Ram.bit() | TierKind::Remote.bit()
    );
    // Known by place again later: the tokens stay.
    engine.index().inserted(TierKind::Remote, &described);
    assert_eq!(engine.index().meta_of(&full.hash), Some(full.clone()));
    // A description of another place under the same hash is a collision: dropped.
    let mut elsewhere = described.clone();
    elsewhere.position = 4;
    engine.index().inserted(TierKind::Remote, &elsewhere);
    assert_eq!(engine.lookup(&prompt).blocks.len(), 0);
    Ok(())
}
