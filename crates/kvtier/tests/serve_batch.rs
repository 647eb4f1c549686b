//! Batches of short prompts against a real `kvtier serve`: `POST /v1/lookup/batch`,
//! `POST /v1/store/batch` and a `/v1/load` of many chains (SGLang's pages, one prompt
//! each, in one request per call). Answered prompt by prompt as single calls are; bytes
//! checked; a chain that is not one from the layout's root is never served; bad batches
//! refused whole.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed expectation is a failed test"
)]

mod server;

use bytes::Bytes;
use kvtier_client::wire::{LoadRequest, MAX_BATCH_PROMPTS};
use server::{Server, api_error, layout_spec, payload, prompt, runtime};

#[test]
fn a_batch_is_answered_prompt_by_prompt_and_loaded_in_one_request() {
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::start(dir.path(), &["--set", "ssd.enabled=false"]);
    let c = srv.client();
    runtime().block_on(async {
        let layout = c.register_layout(&layout_spec("batch", 2)).await.unwrap();
        // Eight one-block prompts (pages); the odd ones stored in one batch request.
        let prompts: Vec<Vec<u32>> = (0..8).map(|s| prompt(&layout, s, 1).tokens).collect();
        let stored: Vec<&[u32]> = prompts.iter().skip(1).step_by(2).map(|p| &p[..]).collect();
        let bytes: Vec<Bytes> = (0..8).map(|s| payload(&layout, s, 0)).collect();
        let sent: Vec<&[u8]> = bytes.iter().skip(1).step_by(2).map(|b| &b[..]).collect();
        let answer = c
            .store_batch(&layout.layout, &stored, &sent, None)
            .await
            .unwrap();
        assert_eq!(answer.answers.len(), 4);
        assert!(answer.answers.iter().all(|a| a.stored == 1));
        // Looked up in one request: exactly the stored ones hit, in order.
        let all: Vec<&[u32]> = prompts.iter().map(|p| &p[..]).collect();
        let hits = c.lookup_batch(&layout.layout, &all).await.unwrap().hits;
        let found: Vec<usize> = hits.iter().map(|h| h.blocks()).collect();
        assert_eq!(found, [0, 1, 0, 1, 0, 1, 0, 1]);
        // The same as single lookups answer.
        for (p, h) in prompts.iter().zip(&hits) {
            let single = c
                .lookup(&kvtier_client::wire::PromptSpec::new(
                    layout.layout.clone(),
                    p.clone(),
                ))
                .await
                .unwrap();
            assert_eq!(&single, h);
        }
        // The four pages' blocks in one load of four chains, in order, byte for byte.
        let held: Vec<_> = hits.iter().filter(|h| h.blocks() == 1).collect();
        let request = LoadRequest {
            layout: layout.layout.clone(),
            handles: held.iter().map(|h| h.handles.as_str()).collect(),
            layers: None,
            chains: Some(vec![1; 4]),
        };
        let got = c.load(&request).await.unwrap();
        assert_eq!(got.blocks.len(), 4);
        for (k, block) in got.blocks.iter().enumerate() {
            assert_eq!(block, &bytes[2 * k + 1], "page {k}: wrong bytes");
        }
        // Without `chains` the same handles are one chain: only the first resolves (the
        // second block's parent is not the first), so nothing of another prefix is served.
        let one_chain = LoadRequest {
            chains: None,
            ..request.clone()
        };
        assert_eq!(c.load(&one_chain).await.unwrap().blocks.len(), 1);
        // A chain that does not start at the layout's root (block 1 of a two-block
        // prompt sent as a chain of its own) ends the load there: the leading whole
        // chains come back, nothing after.
        let two = prompt(&layout, 100, 2);
        c.store(
            &two,
            vec![payload(&layout, 100, 0), payload(&layout, 100, 1)],
        )
        .await
        .unwrap();
        let second = &c.lookup(&two).await.unwrap().handles[32..];
        let forged = LoadRequest {
            handles: format!("{}{second}{}", held[0].handles, held[1].handles),
            chains: Some(vec![1, 1, 1]),
            ..request.clone()
        };
        let got = c.load(&forged).await.unwrap();
        assert_eq!(got.blocks.len(), 1);
        assert_eq!(got.blocks[0], bytes[1]);
        // Chains that do not add up to the handles are refused.
        let ragged = LoadRequest {
            chains: Some(vec![1, 2]),
            ..request.clone()
        };
        let (status, code) = api_error(c.load(&ragged).await.unwrap_err());
        assert_eq!((status, code.as_str()), (400, "bad_chains"));
        let empty = LoadRequest {
            chains: Some(vec![0, 4]),
            ..request.clone()
        };
        let (status, code) = api_error(c.load(&empty).await.unwrap_err());
        assert_eq!((status, code.as_str()), (400, "bad_chains"));
    });
    srv.stop();
}

#[test]
fn bad_batches_are_refused_whole() {
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::start(dir.path(), &["--set", "ssd.enabled=false"]);
    let c = srv.client();
    runtime().block_on(async {
        let layout = c
            .register_layout(&layout_spec("batch-bad", 2))
            .await
            .unwrap();
        let p0 = prompt(&layout, 1, 1).tokens;
        let p1 = prompt(&layout, 2, 1).tokens;
        let b0 = payload(&layout, 1, 0);
        // A payload one block short: nothing of the batch is kept.
        let (status, code) = api_error(
            c.store_batch(&layout.layout, &[&p0, &p1], &[&b0], None)
                .await
                .unwrap_err(),
        );
        assert_eq!((status, code.as_str()), (400, "bad_payload_length"));
        let hits = c.lookup_batch(&layout.layout, &[&p0]).await.unwrap().hits;
        assert_eq!(hits[0].blocks(), 0, "a refused batch kept a block");
        // Too many prompts, an unknown layout.
        let many: Vec<&[u32]> = vec![&p0[..]; MAX_BATCH_PROMPTS + 1];
        let (status, code) = api_error(c.lookup_batch(&layout.layout, &many).await.unwrap_err());
        assert_eq!((status, code.as_str()), (400, "too_many_prompts"));
        let unknown = "0".repeat(32);
        let (status, code) = api_error(c.lookup_batch(&unknown, &[&p0]).await.unwrap_err());
        assert_eq!((status, code.as_str()), (404, "unknown_layout"));
        // An empty batch is an empty answer.
        assert!(
            c.lookup_batch(&layout.layout, &[])
                .await
                .unwrap()
                .hits
                .is_empty()
        );
        // A prompt shorter than a block stores nothing and is answered as a store is.
        let short = &p0[..3];
        let answer = c
            .store_batch(
                &layout.layout,
                &[short, &p1],
                &[&payload(&layout, 2, 0)],
                None,
            )
            .await
            .unwrap();
        assert_eq!(answer.answers[0].stored, 0);
        assert_eq!(answer.answers[1].stored, 1);
    });
    srv.stop();
}
