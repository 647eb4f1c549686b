//! ListObjectsV2 over the ordered index: prefix, delimiter, max-keys, continuation token
//! and start-after.
//!
//! Keys and common prefixes count together toward `max_keys`, in key order. The
//! continuation token names the last item returned (a key, or a common prefix whose
//! keys the next page must skip); it is hex so that it is opaque and URL-safe.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

use super::Object;

/// What to list.
#[derive(Debug, Clone, Default)]
pub struct ListQuery {
    /// Only keys starting with this.
    pub prefix: String,
    /// Roll keys up to their first `delimiter` after the prefix.
    pub delimiter: Option<String>,
    /// At most this many keys and common prefixes (S3 caps it at 1,000).
    pub max_keys: usize,
    /// Resume after the item this token names.
    pub continuation: Option<String>,
    /// Only keys after this one.
    pub start_after: Option<String>,
}

/// One page.
#[derive(Debug, Clone, Default)]
pub struct ListPage {
    /// Objects, in key order.
    pub objects: Vec<(String, Arc<Object>)>,
    /// Common prefixes, in order.
    pub common_prefixes: Vec<String>,
    /// More items follow: ask again with `next_token`.
    pub truncated: bool,
    /// The token for the next page, when truncated.
    pub next_token: Option<String>,
}

/// Encodes the last item of a page: `k` + key or `p` + common prefix.
fn token(is_prefix: bool, name: &str) -> String {
    let mut raw = Vec::with_capacity(name.len() + 1);
    raw.push(if is_prefix { b'p' } else { b'k' });
    raw.extend_from_slice(name.as_bytes());
    kvtier_core::hash::hex(&raw)
}

/// Decodes a token; `None` when it is not one of ours.
pub fn decode_token(token: &str) -> Option<(bool, String)> {
    if !token.len().is_multiple_of(2) {
        return None;
    }
    let raw: Option<Vec<u8>> = (0..token.len() / 2)
        .map(|i| u8::from_str_radix(token.get(2 * i..2 * i + 2)?, 16).ok())
        .collect();
    let raw = raw?;
    let (&kind, name) = raw.split_first()?;
    let name = String::from_utf8(name.to_vec()).ok()?;
    match kind {
        b'k' => Some((false, name)),
        b'p' => Some((true, name)),
        _ => None,
    }
}

pub(super) fn page(objects: &BTreeMap<String, Arc<Object>>, q: &ListQuery) -> ListPage {
    let mut out = ListPage::default();
    // Where to start: after the token's item, after start-after, at the prefix.
    let mut after: Option<String> = q.start_after.clone();
    let mut skip_prefix: Option<String> = None;
    if let Some((is_prefix, name)) = q.continuation.as_deref().and_then(decode_token) {
        if is_prefix {
            skip_prefix = Some(name.clone());
        }
        if after.as_ref().is_none_or(|a| *a < name) {
            after = Some(name);
        }
    }
    let lower = match &after {
        Some(a) if a.as_str() >= q.prefix.as_str() => Bound::Excluded(a.clone()),
        _ => Bound::Included(q.prefix.clone()),
    };
    let mut last: Option<(bool, String)> = None;
    let mut count = 0usize;
    for (key, object) in objects.range((lower, Bound::Unbounded)) {
        if !key.starts_with(q.prefix.as_str()) {
            break;
        }
        if skip_prefix
            .as_ref()
            .is_some_and(|p| key.starts_with(p.as_str()))
        {
            continue;
        }
        let rolled = q
            .delimiter
            .as_deref()
            .filter(|d| !d.is_empty())
            .and_then(|d| {
                key[q.prefix.len()..]
                    .find(d)
                    .map(|at| key[..q.prefix.len() + at + d.len()].to_owned())
            });
        if let Some(cp) = &rolled
            && after.as_ref().is_some_and(|a| cp.as_str() <= a.as_str())
        {
            // A common prefix at or before the marker was returned by an earlier page.
            skip_prefix = Some(cp.clone());
            continue;
        }
        if count == q.max_keys {
            out.truncated = true;
            break;
        }
        match rolled {
            Some(cp) => {
                skip_prefix = Some(cp.clone());
                out.common_prefixes.push(cp.clone());
                last = Some((true, cp));
            }
            None => {
                out.objects.push((key.clone(), object.clone()));
                last = Some((false, key.clone()));
            }
        }
        count += 1;
    }
    if last.is_none() {
        // max-keys 0: nothing returned, and no token a client could loop on.
        out.truncated = false;
    }
    if out.truncated {
        out.next_token = last.map(|(p, name)| token(p, &name));
    }
    out
}
