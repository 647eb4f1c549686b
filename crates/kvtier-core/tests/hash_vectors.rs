//! The block-hash chain must give the same keys in every process, on every machine, in
//! every release: fixed vectors are committed in `tests/vectors/hash_chain_v1.txt`.
//!
//! A deliberate change of the scheme bumps its version and writes a new file with
//! `KVTIER_WRITE_VECTORS=1 cargo test -p kvtier-core --test hash_vectors`.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed expectation is a failed test"
)]

use std::collections::BTreeMap;
use std::path::PathBuf;

use kvtier_core::hash::{self, ExtraKeys};
use kvtier_core::{KvDtype, Layout, LayoutKey};

struct Case {
    name: &'static str,
    key: LayoutKey,
    tokens: Vec<u32>,
    extras: ExtraKeys,
}

fn gemma(tpb: u32) -> LayoutKey {
    let mut k = LayoutKey::new("google/gemma-3-270m", KvDtype::Bf16, tpb, 18, 1, 256);
    k.weights_digest = "sha256:5f1c".into();
    k.tokenizer_digest = "sha256:9a0e".into();
    k
}

fn tokens(n: u32) -> Vec<u32> {
    (0..n).map(|i| i.wrapping_mul(7919) % 262_144).collect()
}

fn cases() -> Vec<Case> {
    let mut salted = gemma(16);
    salted.tenant_salt = b"tenant-a".to_vec();
    salted.lora_id = Some("lora-7".into());
    salted.tp_size = 2;
    salted.tp_rank = 1;
    let mut extras = ExtraKeys::none();
    extras.push(1, b"image:0f3a".to_vec());
    extras.push(1, b"image:77c1".to_vec());
    vec![
        Case {
            name: "gemma_tpb16_4_blocks",
            key: gemma(16),
            tokens: tokens(64),
            extras: ExtraKeys::none(),
        },
        Case {
            name: "gemma_tpb16_partial_tail",
            key: gemma(16),
            tokens: tokens(70),
            extras: ExtraKeys::none(),
        },
        Case {
            name: "gemma_tpb20_two_compressions",
            key: gemma(20),
            tokens: tokens(60),
            extras: ExtraKeys::none(),
        },
        Case {
            name: "gemma_tpb8_padded",
            key: gemma(8),
            tokens: tokens(24),
            extras: ExtraKeys::none(),
        },
        Case {
            name: "salted_lora_tp",
            key: salted,
            tokens: tokens(48),
            extras: ExtraKeys::none(),
        },
        Case {
            name: "extras_on_block_1",
            key: gemma(16),
            tokens: tokens(48),
            extras,
        },
        Case {
            name: "max_token_ids",
            key: LayoutKey::new("m", KvDtype::F32, 16, 1, 1, 1),
            tokens: vec![u32::MAX; 32],
            extras: ExtraKeys::none(),
        },
    ]
}

fn render(case: &Case) -> Result<String, kvtier_core::Error> {
    let layout = Layout::new(case.key.clone())?;
    let chain = hash::chain(&layout, &case.tokens, &case.extras);
    let hashes: Vec<String> = chain.iter().map(|h| h.to_hex()).collect();
    Ok(format!(
        "{} {} {}",
        case.name,
        layout.digest(),
        hashes.join(" ")
    ))
}

fn vectors_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/vectors/hash_chain_v1.txt")
}

#[test]
fn chain_matches_committed_vectors() -> Result<(), Box<dyn std::error::Error>> {
    let rendered: Vec<String> = cases().iter().map(render).collect::<Result<_, _>>()?;
    if std::env::var_os("KVTIER_WRITE_VECTORS").is_some() {
        let header = "# kvtier block-hash chain v1: <case> <layout digest> <block hashes...>\n";
        std::fs::write(vectors_path(), format!("{header}{}\n", rendered.join("\n")))?;
    }
    let committed = std::fs::read_to_string(vectors_path())?;
    let expected: BTreeMap<&str, &str> = committed
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split_once(' '))
        .collect();
    assert_eq!(
        expected.len(),
        rendered.len(),
        "vector file and cases disagree in number"
    );
    for line in &rendered {
        let (name, rest) = line.split_once(' ').ok_or("bad rendered line")?;
        assert_eq!(
            expected.get(name).copied(),
            Some(rest),
            "case `{name}` changed"
        );
    }
    Ok(())
}

#[test]
fn a_single_link_agrees_with_the_whole_chain() -> Result<(), kvtier_core::Error> {
    // `block_hash` (one link, used by tiers to verify a record) and `chain` (the fast path
    // used for prompts) are separate code paths: they must agree.
    for case in cases() {
        let layout = Layout::new(case.key.clone())?;
        let chain = hash::chain(&layout, &case.tokens, &case.extras);
        let tpb = layout.tokens_per_block();
        let mut parent = hash::chain_root(&layout);
        for (i, h) in chain.iter().enumerate() {
            let link = hash::block_hash(
                parent,
                &case.tokens[i * tpb..(i + 1) * tpb],
                case.extras.tag(i),
            );
            assert_eq!(link, *h, "case {} block {i}", case.name);
            parent = link;
        }
    }
    Ok(())
}

#[test]
fn layout_encoding_is_stable() {
    let key = gemma(16);
    insta::assert_snapshot!(kvtier_core::hash::hex(&key.canonical_bytes()));
}

#[test]
fn an_independent_python_implementation_gives_the_same_vectors()
-> Result<(), Box<dyn std::error::Error>> {
    // tests/vectors/reference_chain.py implements the documented scheme from scratch
    // (including the SHA-256 compression function); it must reproduce the committed file.
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/vectors");
    let out = std::process::Command::new("python3")
        .arg(dir.join("reference_chain.py"))
        .output()
        .map_err(|e| {
            format!("python3 is needed for this test (scripts/setup.sh installs it): {e}")
        })?;
    assert!(
        out.status.success(),
        "reference_chain.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let committed = std::fs::read_to_string(vectors_path())?;
    let committed: Vec<&str> = committed.lines().filter(|l| !l.starts_with('#')).collect();
    let reference = String::from_utf8(out.stdout)?;
    let reference: Vec<&str> = reference.lines().collect();
    assert_eq!(reference, committed);
    Ok(())
}
