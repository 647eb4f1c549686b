//! Requests parsed within limits: a count is checked as a sequence is read, never after.
//!
//! A JSON body of `n` bytes can become far more memory once parsed: `[1,1,1,…]` is two
//! bytes per token and four once a `u32`, so a body within the size limit could still
//! grow to twice that before `max_tokens` was checked. Here each bounded field stops at
//! its limit while it is read, so a request holds at most its body.
//!
//! serde hands a `Deserialize` impl no context, and the limit (`max_tokens`) is the
//! server's setting: [`parse_within`] sets it for the one parse it runs, on the parsing
//! thread, and clears it after. Outside a [`parse_within`] (a client decoding, a test)
//! only the fixed limits ([`MAX_BATCH_PROMPTS`](super::MAX_BATCH_PROMPTS)) apply.

use std::cell::{Cell, RefCell};
use std::fmt;
use std::marker::PhantomData;

use serde::Deserialize;
use serde::de::{self, DeserializeOwned, Deserializer, SeqAccess, Visitor};

/// What a request may hold, checked while it is parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParseLimits {
    /// Tokens in one prompt (`max_tokens`); also bounds the per-block lists of a prompt
    /// (extra keys, chains), which have at most one entry per token.
    pub max_tokens: usize,
}

/// Which limit a request went over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// A prompt's tokens, or a per-block list of one (`max_tokens`).
    Tokens,
    /// The prompts of a batch ([`MAX_BATCH_PROMPTS`](super::MAX_BATCH_PROMPTS)).
    Prompts,
}

/// Why a request could not be parsed.
#[derive(Debug)]
pub enum ParseError {
    /// Not the JSON the request needs.
    Malformed(serde_json::Error),
    /// Over a limit, found while parsing (nothing more of the body was parsed).
    OverLimit {
        /// Which limit.
        limit: Limit,
        /// What was over it, for people.
        message: String,
    },
}

thread_local! {
    static MAX_TOKENS: Cell<Option<usize>> = const { Cell::new(None) };
    static OVER: RefCell<Option<(Limit, String)>> = const { RefCell::new(None) };
}

/// Parses `bytes` as JSON, refusing any bounded field over `limits` as it is read.
pub fn parse_within<T: DeserializeOwned>(
    bytes: &[u8],
    limits: ParseLimits,
) -> Result<T, ParseError> {
    /// Clears the limits however the parse ends (a panic in a visitor included).
    struct Scope(Option<usize>);
    impl Drop for Scope {
        fn drop(&mut self) {
            MAX_TOKENS.with(|m| m.set(self.0));
        }
    }
    let _scope = Scope(MAX_TOKENS.with(|m| m.replace(Some(limits.max_tokens))));
    OVER.with(|o| o.borrow_mut().take());
    serde_json::from_slice(bytes).map_err(|e| match OVER.with(|o| o.borrow_mut().take()) {
        Some((limit, message)) => ParseError::OverLimit { limit, message },
        None => ParseError::Malformed(e),
    })
}

fn max_tokens() -> usize {
    MAX_TOKENS.with(Cell::get).unwrap_or(usize::MAX)
}

/// Records which limit was passed, and gives serde the error that stops the parse.
fn over<E: de::Error>(limit: Limit, message: String) -> E {
    let e = E::custom(&message);
    OVER.with(|o| *o.borrow_mut() = Some((limit, message)));
    e
}

/// A sequence of at most `max` items, refused at item `max + 1`.
struct Bounded<T> {
    max: usize,
    limit: Limit,
    what: &'static str,
    item: PhantomData<T>,
}

impl<'de, T: Deserialize<'de>> Visitor<'de> for Bounded<T> {
    type Value = Vec<T>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "a list of at most {} {}", self.max, self.what)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
        // The hint is the sender's claim (for JSON, none): never reserve past the limit.
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(self.max).min(4096));
        while let Some(item) = seq.next_element()? {
            if out.len() == self.max {
                return Err(over(
                    self.limit,
                    format!("more than {} {}", self.max, self.what),
                ));
            }
            out.push(item);
        }
        Ok(out)
    }
}

fn bounded<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
    max: usize,
    limit: Limit,
    what: &'static str,
) -> Result<Vec<T>, D::Error> {
    d.deserialize_seq(Bounded {
        max,
        limit,
        what,
        item: PhantomData,
    })
}

/// A prompt's tokens as a JSON array: at most `max_tokens`.
pub(super) fn tokens<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u32>, D::Error> {
    bounded(d, max_tokens(), Limit::Tokens, "tokens (max_tokens)")
}

/// A per-block list of a prompt (extra keys, chains): at most one entry per token.
pub(super) fn per_block<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Vec<T>, D::Error> {
    bounded(
        d,
        max_tokens(),
        Limit::Tokens,
        "entries (one per block at most; max_tokens)",
    )
}

/// [`per_block`], optional (absent or `null`: `None`).
pub(super) fn per_block_opt<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<Vec<T>>, D::Error> {
    struct PerBlock<T>(Vec<T>);
    impl<'de, T: Deserialize<'de>> Deserialize<'de> for PerBlock<T> {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            per_block(d).map(PerBlock)
        }
    }
    Ok(Option::<PerBlock<T>>::deserialize(d)?.map(|p| p.0))
}

/// The prompts of a batch, each base64 of a prompt's tokens: at most
/// [`MAX_BATCH_PROMPTS`](super::MAX_BATCH_PROMPTS) of them, each at most `max_tokens`.
pub(super) fn batch_prompts<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    let prompts: Vec<B64Tokens> = bounded(
        d,
        super::MAX_BATCH_PROMPTS,
        Limit::Prompts,
        "prompts in one batch",
    )?;
    Ok(prompts.into_iter().map(|p| p.0).collect())
}

/// Base64 of a prompt's tokens, as `tokens_b64` (absent or `null`: `None`).
pub(super) fn tokens_b64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(Option::<B64Tokens>::deserialize(d)?.map(|b| b.0))
}

/// A base64 string of little-endian `u32` tokens, refused before it is copied when it
/// decodes to more than `max_tokens` tokens.
struct B64Tokens(String);

impl<'de> Deserialize<'de> for B64Tokens {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(B64(max_tokens())).map(B64Tokens)
    }
}

struct B64(usize);

impl Visitor<'_> for B64 {
    type Value = String;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "base64 of at most {} tokens", self.0)
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<String, E> {
        // Every 4 base64 digits are 3 bytes; every 4 bytes a token.
        let tokens = s.len() / 4 * 3 / 4;
        if tokens > self.0 {
            return Err(over(
                Limit::Tokens,
                format!("base64 of {tokens} tokens; at most {} (max_tokens)", self.0),
            ));
        }
        Ok(s.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{BatchSpec, LoadRequest, MAX_BATCH_PROMPTS, PromptSpec, tokens_to_b64};

    const FEW: ParseLimits = ParseLimits { max_tokens: 8 };

    fn over_limit<T: DeserializeOwned + fmt::Debug>(json: &str) -> Limit {
        match parse_within::<T>(json.as_bytes(), FEW) {
            Err(ParseError::OverLimit { limit, .. }) => limit,
            other => panic!("{json}: expected a refusal over a limit, got {other:?}"),
        }
    }

    #[test]
    fn tokens_at_the_limit_parse_and_one_more_is_refused_while_parsing() {
        let eight = r#"{"layout":"00","tokens":[1,2,3,4,5,6,7,8]}"#;
        let p: PromptSpec = parse_within(eight.as_bytes(), FEW).unwrap();
        assert_eq!(p.tokens, (1..=8).collect::<Vec<u32>>());
        // The ninth is refused even though the JSON after it is broken: the parse stopped.
        let nine = r#"{"layout":"00","tokens":[1,2,3,4,5,6,7,8,9,"#;
        assert_eq!(over_limit::<PromptSpec>(nine), Limit::Tokens);
    }

    #[test]
    fn base64_tokens_over_the_limit_are_refused() {
        let ok = format!(
            r#"{{"layout":"00","tokens_b64":"{}"}}"#,
            tokens_to_b64(&[7; 8])
        );
        let p: PromptSpec = parse_within(ok.as_bytes(), FEW).unwrap();
        assert_eq!(p.token_ids().unwrap(), vec![7; 8]);
        let long = format!(
            r#"{{"layout":"00","tokens_b64":"{}"}}"#,
            tokens_to_b64(&[7; 9])
        );
        assert_eq!(over_limit::<PromptSpec>(&long), Limit::Tokens);
    }

    #[test]
    fn per_block_lists_and_batches_are_bounded() {
        let chains = r#"{"layout":"00","handles":"","chains":[1,1,1,1,1,1,1,1,1]}"#;
        assert_eq!(over_limit::<LoadRequest>(chains), Limit::Tokens);
        let keys = format!(
            r#"{{"layout":"00","tokens":[1],"extra_keys":[{}]}}"#,
            [r#"{"block":0,"keys":[]}"#; 9].join(",")
        );
        assert_eq!(over_limit::<PromptSpec>(&keys), Limit::Tokens);
        let prompt = format!("\"{}\"", tokens_to_b64(&[1]));
        let batch = format!(
            r#"{{"layout":"00","prompts":[{}]}}"#,
            vec![prompt.as_str(); MAX_BATCH_PROMPTS + 1].join(",")
        );
        assert_eq!(over_limit::<BatchSpec>(&batch), Limit::Prompts);
        let long = format!(
            r#"{{"layout":"00","prompts":["{}"]}}"#,
            tokens_to_b64(&[1; 9])
        );
        assert_eq!(over_limit::<BatchSpec>(&long), Limit::Tokens);
    }

    #[test]
    fn malformed_json_is_not_mistaken_for_a_limit_and_limits_end_with_the_parse() {
        assert!(matches!(
            parse_within::<PromptSpec>(b"{\"layout\":", FEW),
            Err(ParseError::Malformed(_))
        ));
        // `null` stands for an absent optional list, as without the bounds.
        let nulls = r#"{"layout":"00","tokens":[1],"tokens_b64":null}"#;
        let p: PromptSpec = parse_within(nulls.as_bytes(), FEW).unwrap();
        assert_eq!(p.token_ids().unwrap(), vec![1]);
        let load = r#"{"layout":"00","handles":"","chains":null}"#;
        let l: LoadRequest = parse_within(load.as_bytes(), FEW).unwrap();
        assert_eq!(l.chains, None);
        // Outside parse_within nothing bounds the tokens.
        let many: PromptSpec = serde_json::from_str(&format!(
            r#"{{"layout":"00","tokens":{:?}}}"#,
            vec![1u32; 100]
        ))
        .unwrap();
        assert_eq!(many.tokens.len(), 100);
    }
}
