//! Scoped tokens (issue 39, item 1): a tenant's token reaches only its tenant's layouts —
//! store, look up, load, delete, snapshots and restores of another tenant's layout are
//! refused (403 `wrong_tenant`) and change nothing — and a layout registered with it gets
//! the tenant's salt, any salt the request gives nested under it. The data token keeps
//! every tenant's scope; the counters need it.

#![allow(clippy::unwrap_used, reason = "test code")]

mod server;

use kvtier_client::wire::{LayoutInfo, LoadRequest, SnapshotSpec};
use server::{Server, api_error, layout_spec, payloads, prompt, runtime};

const DATA: &str = "data-token-for-tests-0001";
const ACME: &str = "acme-token-for-tests-0001";
const GLOBEX: &str = "globex-token-for-tests-01";

fn start(dir: &std::path::Path) -> Server {
    let config = dir.join("tenants.toml");
    std::fs::write(
        &config,
        format!(
            "[auth.tenants.acme]\ntoken = \"{ACME}\"\nsalt = \"ac01\"\n\n\
             [auth.tenants.globex]\ntoken = \"{GLOBEX}\"\nsalt = \"90b1\"\n"
        ),
    )
    .unwrap();
    Server::start(
        &dir.join("data"),
        &["--config", config.to_str().unwrap(), "--data-token", DATA],
    )
}

/// The status and code a refused call answered.
fn refused<T: std::fmt::Debug>(r: Result<T, kvtier_client::ClientError>) -> (u16, String) {
    api_error(r.unwrap_err())
}

#[test]
fn a_tenant_token_reaches_only_its_tenants_layouts() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());
    let (acme, globex, all) = (
        server.client().with_token(ACME),
        server.client().with_token(GLOBEX),
        server.client().with_token(DATA),
    );
    runtime().block_on(async {
        // Registered by acme with no salt, the layout is acme's: the same digest the data
        // token gets for the layout with acme's salt, and another than the unsalted one.
        let spec = layout_spec("tenants", 2);
        let mine: LayoutInfo = acme.register_layout(&spec).await.unwrap();
        let mut salted = spec.clone();
        salted.tenant_salt = "ac01".into();
        assert_eq!(
            all.register_layout(&salted).await.unwrap().layout,
            mine.layout
        );
        let unsalted = all.register_layout(&spec).await.unwrap();
        assert_ne!(unsalted.layout, mine.layout);
        // Asking for another tenant's salt gets it nested under acme's (`ac01` `/` `90b1`):
        // a caller keeps its own users apart inside its tenant, never outside.
        let mut theirs = spec.clone();
        theirs.tenant_salt = "90b1".into();
        let nested = acme.register_layout(&theirs).await.unwrap();
        let globex_own = globex.register_layout(&spec).await.unwrap();
        assert_ne!(nested.layout, globex_own.layout);
        assert_ne!(nested.layout, mine.layout);
        let mut spelled = spec.clone();
        spelled.tenant_salt = "ac012f90b1".into();
        assert_eq!(
            all.register_layout(&spelled).await.unwrap().layout,
            nested.layout
        );
        assert_eq!(
            refused(globex.lookup(&prompt(&nested, 1, 1)).await),
            (403, "wrong_tenant".into())
        );
        assert_eq!(
            acme.lookup(&prompt(&nested, 1, 1))
                .await
                .unwrap()
                .matched_tokens,
            0
        );

        let p = prompt(&mine, 7, 3);
        let blocks = payloads(&mine, 7, 3);
        assert_eq!(acme.store(&p, blocks.clone()).await.unwrap().stored, 3);
        let found = acme.lookup(&p).await.unwrap();
        assert_eq!(found.matched_tokens, 3 * mine.tokens_per_block as usize);
        let load = LoadRequest {
            layout: mine.layout.clone(),
            handles: found.handles.clone(),
            layers: None,
            chains: None,
        };
        assert_eq!(acme.load(&load).await.unwrap().blocks, blocks);

        // Globex: every call on acme's layout is refused.
        let wrong = (403, "wrong_tenant".to_string());
        assert_eq!(refused(globex.lookup(&p).await), wrong);
        assert_eq!(
            refused(globex.lookup_batch(&mine.layout, &[&p.tokens]).await),
            wrong
        );
        assert_eq!(refused(globex.load(&load).await), wrong);
        let other = payloads(&mine, 8, 3);
        assert_eq!(
            refused(globex.store(&prompt(&mine, 8, 3), other).await),
            wrong
        );
        assert_eq!(refused(globex.delete_layout(&mine.layout).await), wrong);
        let snap = SnapshotSpec {
            layout: mine.layout.clone(),
            tokens: p.tokens.clone(),
            session: None,
        };
        assert_eq!(
            refused(
                globex
                    .snapshot_put(&snap, bytes::Bytes::from_static(b"s"))
                    .await
            ),
            wrong
        );
        assert_eq!(refused(globex.snapshot_get(&snap).await), wrong);
        assert_eq!(refused(globex.restore(&p).await), wrong);
        // Nor may acme reach the unsalted layout (the data token's, every tenant's).
        assert_eq!(refused(acme.lookup(&prompt(&unsalted, 7, 1)).await), wrong);

        // Nothing globex did changed acme's blocks.
        let again = acme.lookup(&p).await.unwrap();
        assert_eq!(again.matched_tokens, found.matched_tokens);
        assert_eq!(acme.load(&load).await.unwrap().blocks, blocks);
        assert_eq!(
            acme.lookup(&prompt(&mine, 8, 3))
                .await
                .unwrap()
                .matched_tokens,
            0
        );

        // The counters are every tenant's: the data token's, not a tenant's.
        assert_eq!(refused(acme.stats().await), (403, "wrong_scope".into()));
        assert_eq!(refused(acme.metrics().await), (403, "wrong_scope".into()));
        assert!(
            all.stats()
                .await
                .unwrap()
                .contains_key("engine_lookup_tokens_promised")
        );
        // A tenant's token is no admin token, and no token is no token.
        assert_eq!(refused(acme.admin_flush().await), (403, "bad_token".into()));
        assert_eq!(
            refused(server.client().lookup(&p).await),
            (401, "token_required".into())
        );
        let stranger = server.client().with_token("not-a-token-of-this-server");
        assert_eq!(
            refused(stranger.lookup(&p).await),
            (403, "bad_token".into())
        );

        // The data token reaches acme's layout, and acme may delete its own.
        assert_eq!(
            all.lookup(&p).await.unwrap().matched_tokens,
            found.matched_tokens
        );
        assert_eq!(acme.delete_layout(&mine.layout).await.unwrap(), 3);
    });
    assert!(server.stop().success());
}

#[test]
fn tenant_tokens_are_refused_at_start_when_they_cannot_be_told_apart() {
    let dir = tempfile::tempdir().unwrap();
    for (config, says) in [
        (
            format!(
                "[auth.tenants.a]\ntoken = \"{ACME}\"\nsalt = \"01\"\n\
                 [auth.tenants.b]\ntoken = \"{ACME}\"\nsalt = \"02\"\n"
            ),
            "are the same",
        ),
        (
            format!(
                "[auth.tenants.a]\ntoken = \"{ACME}\"\nsalt = \"01\"\n\
                 [auth.tenants.b]\ntoken = \"{GLOBEX}\"\nsalt = \"0102\"\n"
            ),
            "begins with the other",
        ),
        (
            format!("[auth.tenants.a]\ntoken = \"{DATA}\"\nsalt = \"01\"\n"),
            "are the same",
        ),
        (
            "[auth.tenants.a]\ntoken = \"short\"\nsalt = \"01\"\n".to_string(),
            "at least 16 characters",
        ),
        (
            format!("[auth.tenants.a]\ntoken = \"{ACME}\"\nsalt = \"xyz\"\n"),
            "not hex",
        ),
    ] {
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, &config).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvtier"))
            .args(["serve", "--listen", "127.0.0.1:0", "--data-token", DATA])
            .arg("--config")
            .arg(&path)
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{config}: started");
        assert!(stderr.contains(says), "{config}: {stderr}");
    }
}
