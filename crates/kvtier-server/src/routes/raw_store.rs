//! `POST /v1/store/raw?layout=…&tokens=1,2,3`: a store a shell can send.
//!
//! The store endpoint takes an upload body (a binary head, a JSON head, then the payload),
//! which is what clients should send but which `curl` cannot build without a helper. This
//! form takes the payload as the raw body (`curl --data-binary @kv.bin`) and the rest from
//! the query string, then stores exactly as `POST /v1/store` does — past the head, both
//! hand the body to the same reader and handler, so validation and answers cannot differ.

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{Extension, State};
use axum::http::Uri;
use bytes::Bytes;
use kvtier_client::wire::{PromptSpec, StoreAnswer};

use super::auth::Scope;
use super::data;
use super::upload::BodyChunks;
use crate::error::ApiError;
use crate::state::AppState;

/// The query of a raw store: `layout=<32 hex>&tokens=<u32>,<u32>,…`, and the store
/// endpoint's own `durability=…`, returned as the query to hand on to it.
fn parse_query(query: Option<&str>) -> Result<(PromptSpec, String), ApiError> {
    let bad = |m: String| ApiError::bad("bad_query", m);
    let mut layout = None;
    let mut tokens = None;
    let mut passed = Vec::new();
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "layout" => layout = Some(value.to_owned()),
            "tokens" => {
                let list = value.replace("%2C", ",").replace("%2c", ",");
                let parsed = list
                    .split(',')
                    .filter(|t| !t.is_empty())
                    .map(|t| {
                        t.parse::<u32>()
                            .map_err(|_| bad(format!("token `{t}` is not a u32")))
                    })
                    .collect::<Result<Vec<u32>, _>>()?;
                tokens = Some(parsed);
            }
            "durability" => passed.push(pair),
            other => {
                return Err(bad(format!(
                    "unknown query parameter `{other}` (layout, tokens, durability)"
                )));
            }
        }
    }
    match (layout, tokens) {
        (Some(layout), Some(tokens)) => Ok((PromptSpec::new(layout, tokens), passed.join("&"))),
        _ => Err(bad(
            "a raw store needs `?layout=<32 hex digits>&tokens=<comma-separated u32s>`".into(),
        )),
    }
}

/// `POST /v1/store/raw`: the body is the payload (whole blocks, block 0 first).
pub async fn store_raw(
    State(app): State<Arc<AppState>>,
    Extension(scope): Extension<Scope>,
    uri: Uri,
    body: Body,
) -> Result<Json<StoreAnswer>, ApiError> {
    // The body first: one over the limit is answered 413 whatever else is wrong.
    let limit = app.node.settings.read().max_body.0;
    let mut chunks = BodyChunks::new(body, limit)?;
    let query = parse_query(uri.query()).and_then(|(spec, passed)| {
        let passed: Uri = format!("/v1/store?{passed}")
            .parse()
            .map_err(|_| ApiError::bad("bad_query", "the durability parameter is not URI text"))?;
        Ok((spec, data::asked_ack(&passed)?))
    });
    let (spec, ack) = match query {
        Ok(q) => q,
        Err(e) => return Err(chunks.refuse(e).await),
    };
    data::store_payload(app, &scope, ack, spec, chunks, Bytes::new()).await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use super::*;

    #[test]
    fn the_query_names_the_layout_and_tokens_and_nothing_else() {
        let (spec, passed) =
            parse_query(Some("layout=ab12&tokens=1,2%2C3,&durability=synced")).unwrap();
        assert_eq!(spec.layout, "ab12");
        assert_eq!(spec.token_ids().unwrap(), vec![1, 2, 3]);
        assert_eq!(passed, "durability=synced");
        for bad in [
            None,
            Some("layout=ab12"),
            Some("tokens=1,2"),
            Some("layout=ab&tokens=1,x"),
            Some("layout=ab&tokens=1&durable=yes"),
            Some("layout=ab&tokens=1&extra_keys=x"),
            Some("layout=ab&tokens=-1"),
        ] {
            let e = parse_query(bad).unwrap_err();
            assert_eq!(e.code, "bad_query", "{bad:?}");
        }
    }
}
