//! The model's own vocabulary, read from the GGUF: token ids to text and a small greedy
//! encoder, enough to build prompts and show what the model wrote.
//!
//! This is not the SentencePiece algorithm (no merge scores): it takes the longest
//! vocabulary entry at each position. Prompts built with it are valid token sequences for
//! the model; they are not always the ids the reference tokenizer would pick.

use std::collections::HashMap;

use candle_core::quantized::gguf_file;
use sha2::{Digest, Sha256};

use crate::{Error, Result};

/// SentencePiece's visible space.
const SPACE: char = '\u{2581}';

/// Token strings by id, and ids by string.
#[derive(Debug, Clone)]
pub struct Vocab {
    pieces: Vec<String>,
    ids: HashMap<String, u32>,
    longest: usize,
    digest: String,
}

impl Vocab {
    pub(crate) fn from_gguf(content: &gguf_file::Content) -> Result<Self> {
        let Some(list) = content.metadata.get("tokenizer.ggml.tokens") else {
            return Err(Error::Weights(
                "the GGUF has no tokenizer.ggml.tokens".into(),
            ));
        };
        let mut pieces = Vec::new();
        for v in list.to_vec()? {
            pieces.push(v.to_string()?.clone());
        }
        Ok(Self::new(pieces))
    }

    /// A vocabulary of these pieces, id = position.
    pub fn new(pieces: Vec<String>) -> Self {
        let mut hasher = Sha256::new();
        let mut ids = HashMap::with_capacity(pieces.len());
        let mut longest = 0;
        for (id, piece) in pieces.iter().enumerate() {
            hasher.update((piece.len() as u64).to_le_bytes());
            hasher.update(piece.as_bytes());
            longest = longest.max(piece.chars().count());
            // The first id wins for duplicate pieces.
            ids.entry(piece.clone()).or_insert(id as u32);
        }
        let digest = kvtier_core::hash::hex(&hasher.finalize());
        Self {
            pieces,
            ids,
            longest,
            digest,
        }
    }

    /// SHA-256 of the token list, hex: the tokenizer part of the layout key.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.pieces.len()
    }

    /// True for an empty vocabulary.
    pub fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }

    /// Text of `tokens`: visible spaces become spaces, byte tokens `<0xNN>` become bytes,
    /// unknown ids become `�`.
    pub fn decode(&self, tokens: &[u32]) -> String {
        let mut bytes = Vec::new();
        for &t in tokens {
            let Some(piece) = self.pieces.get(t as usize) else {
                bytes.extend_from_slice("\u{fffd}".as_bytes());
                continue;
            };
            if let Some(byte) = byte_token(piece) {
                bytes.push(byte);
            } else {
                bytes.extend_from_slice(piece.replace(SPACE, " ").as_bytes());
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Greedy longest-match encoding of `text` (spaces as SentencePiece writes them).
    /// Characters with no piece fall back to byte tokens, and are skipped if the
    /// vocabulary has none.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let chars: Vec<char> = text
            .chars()
            .map(|c| if c == ' ' { SPACE } else { c })
            .collect();
        let mut out = Vec::new();
        let mut i = 0;
        while i < chars.len() {
            let mut matched = None;
            let mut piece = String::new();
            for (n, c) in chars[i..].iter().take(self.longest).enumerate() {
                piece.push(*c);
                if let Some(&id) = self.ids.get(&piece) {
                    matched = Some((id, n + 1));
                }
            }
            match matched {
                Some((id, n)) => {
                    out.push(id);
                    i += n;
                }
                None => {
                    let mut buf = [0u8; 4];
                    for b in chars[i].encode_utf8(&mut buf).bytes() {
                        if let Some(&id) = self.ids.get(&format!("<0x{b:02X}>")) {
                            out.push(id);
                        }
                    }
                    i += 1;
                }
            }
        }
        out
    }
}

fn byte_token(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab() -> Vocab {
        let pieces = ["<pad>", "a", "ab", "\u{2581}b", "<0x0A>", "c"];
        Vocab::new(pieces.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn encodes_longest_match_and_decodes_back() {
        let v = vocab();
        let ids = v.encode("ab b\nc");
        assert_eq!(ids, vec![2, 3, 4, 5]);
        assert_eq!(v.decode(&ids), "ab b\nc");
    }

    #[test]
    fn digest_changes_with_any_piece() {
        let a = vocab();
        let mut pieces: Vec<String> = ["<pad>", "a", "ab", "\u{2581}b", "<0x0A>", "d"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let b = Vocab::new(pieces.clone());
        assert_ne!(a.digest(), b.digest());
        pieces.pop();
        assert_ne!(b.digest(), Vocab::new(pieces).digest());
    }
}
