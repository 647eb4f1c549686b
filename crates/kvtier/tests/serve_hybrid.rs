//! `kvtier serve` for hybrid and recurrent models (issue 16): layouts with state groups
//! and their checkpoint distance, checkpoint puts refused off their boundaries and sizes,
//! the composed lookup's `state`, and restores that return the KV blocks and the state
//! of one boundary or nothing, before and after a restart.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed expectation is a failed test"
)]

mod server;

use bytes::Bytes;
use kvtier_client::wire::{CheckpointSpec, LayoutInfo, LayoutSpec, PromptSpec, StateGroupSpec};
use server::{Server, api_error as refused, layout_spec, payloads, prompt, runtime};

const STATE_BYTES: u64 = 5_000;

fn hybrid_spec() -> LayoutSpec {
    let mut spec = layout_spec("hybrid", 2);
    spec.state_groups = vec![StateGroupSpec {
        kind: "mamba1/f32".into(),
        num_layers: 2,
        state_bytes: STATE_BYTES,
    }];
    spec.checkpoint_every = Some(32);
    spec
}

fn state(seed: u8) -> Bytes {
    (0..STATE_BYTES as u32)
        .map(|i| (i.wrapping_mul(31) as u8) ^ seed)
        .collect::<Vec<u8>>()
        .into()
}

fn checkpoint(layout: &LayoutInfo, p: &PromptSpec, blocks: usize) -> CheckpointSpec {
    CheckpointSpec {
        layout: layout.layout.clone(),
        tokens: p.tokens.clone(),
        extra_keys: Vec::new(),
        blocks,
    }
}

#[test]
fn checkpoints_compose_with_their_blocks_over_http_and_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    let server = Server::start(dir.path(), &[]);
    let c = server.client();
    let (layout, full) = rt.block_on(async {
        let layout = c.register_layout(&hybrid_spec()).await.unwrap();
        assert_eq!(layout.checkpoint_every, Some(32));
        // 4 blocks of KV, checkpoints after 2 and 4 blocks.
        let full = prompt(&layout, 1, 4);
        c.store(&full, payloads(&layout, 1, 4)).await.unwrap();
        assert!(
            c.checkpoint_put(&checkpoint(&layout, &full, 2), state(2))
                .await
                .unwrap()
        );
        // Off a boundary, the wrong size, past the prompt: refused (422), nothing kept.
        for (blocks, s) in [(3, state(3)), (2, state(2).slice(1..)), (6, state(6))] {
            let e = c
                .checkpoint_put(&checkpoint(&layout, &full, blocks), s)
                .await
                .unwrap_err();
            assert_eq!(refused(e).0, 422, "a checkpoint after {blocks} blocks");
        }
        // The checkpoint after 4 blocks is missing: the hit is cut back to 2 blocks.
        let hit = c.lookup(&full).await.unwrap();
        assert_eq!(hit.matched_tokens, 32);
        assert_eq!(hit.blocks(), 2);
        let st = hit.state.clone().expect("a state in the answer");
        assert_eq!((st.blocks, st.tier.as_str()), (2, "r"));
        let r = c.restore(&full).await.unwrap();
        assert_eq!(r.tokens, 32);
        assert_eq!(r.blocks, payloads(&layout, 1, 2));
        assert_eq!(r.state, Some(state(2)));
        // Now after 4 blocks too.
        assert!(
            c.checkpoint_put(&checkpoint(&layout, &full, 4), state(4))
                .await
                .unwrap()
        );
        let r = c.restore(&full).await.unwrap();
        assert_eq!((r.tokens, r.blocks.len()), (64, 4));
        assert_eq!(r.state, Some(state(4)));

        // KV without a checkpoint, and a checkpoint without KV: misses.
        let kv_only = prompt(&layout, 2, 4);
        c.store(&kv_only, payloads(&layout, 2, 4)).await.unwrap();
        let state_only = prompt(&layout, 3, 4);
        assert!(
            c.checkpoint_put(&checkpoint(&layout, &state_only, 2), state(9))
                .await
                .unwrap()
        );
        for p in [&kv_only, &state_only] {
            let hit = c.lookup(p).await.unwrap();
            assert_eq!((hit.matched_tokens, hit.blocks(), hit.state), (0, 0, None));
            let r = c.restore(p).await.unwrap();
            assert_eq!((r.tokens, r.blocks.len(), r.state), (0, 0, None));
        }
        // An attention-only layout restores its blocks, and takes no checkpoint setting.
        let plain = c.register_layout(&layout_spec("plain", 2)).await.unwrap();
        assert_eq!(plain.checkpoint_every, None);
        let p = prompt(&plain, 4, 3);
        c.store(&p, payloads(&plain, 4, 3)).await.unwrap();
        let r = c.restore(&p).await.unwrap();
        assert_eq!((r.tokens, r.state), (48, None));
        assert_eq!(r.blocks, payloads(&plain, 4, 3));
        let mut bad = layout_spec("plain", 2);
        bad.checkpoint_every = Some(32);
        assert_eq!(refused(c.register_layout(&bad).await.unwrap_err()).0, 422);
        (layout, full)
    });
    assert!(server.stop().success());

    // From the SSD after a restart: both parts, byte for byte.
    let server = Server::start(dir.path(), &[]);
    let c = server.client();
    rt.block_on(async {
        c.register_layout(&hybrid_spec()).await.unwrap();
        let hit = c.lookup(&full).await.unwrap();
        assert_eq!(hit.state.map(|s| s.blocks), Some(4));
        let r = c.restore(&full).await.unwrap();
        assert_eq!(r.tokens, 64);
        assert_eq!(r.blocks, payloads(&layout, 1, 4));
        assert_eq!(r.state, Some(state(4)));
    });
    assert!(server.stop().success());
}
