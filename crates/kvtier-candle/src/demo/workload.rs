//! The demo's conversations: one shared system prompt, then turns that each append the
//! previous answer and a new question, for Gemma (its vocabulary) and Mamba (bytes).

use crate::gemma::GemmaWeights;
use crate::prompts::{system_prompt, user_turn};

/// The shape of the workload.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
pub struct Workload {
    /// Conversations sharing the system prompt.
    pub conversations: usize,
    /// Turns per conversation.
    pub turns: usize,
    /// Rough length of the system prompt, in words.
    pub system_words: usize,
    /// Tokens decoded per turn.
    pub decode: usize,
}

/// Turns a token list of text into the model's tokens.
pub trait Encoder {
    /// The first tokens of every prompt (e.g. BOS).
    fn start(&self) -> Vec<u32>;
    /// Tokens of `text`.
    fn encode(&self, text: &str) -> Vec<u32>;
}

/// Gemma: BOS and the GGUF vocabulary.
pub struct GemmaText<'a>(pub &'a GemmaWeights);

impl Encoder for GemmaText<'_> {
    fn start(&self) -> Vec<u32> {
        vec![self.0.config().bos]
    }
    fn encode(&self, text: &str) -> Vec<u32> {
        self.0.vocab().encode(text)
    }
}

/// Mamba's synthetic model: one token per byte.
pub struct Bytes;

impl Encoder for Bytes {
    fn start(&self) -> Vec<u32> {
        Vec::new()
    }
    fn encode(&self, text: &str) -> Vec<u32> {
        text.bytes().map(u32::from).collect()
    }
}

/// The prompt of turn `turn` of `conversation`, given the previous prompt and answer.
pub fn next_prompt(
    enc: &dyn Encoder,
    w: &Workload,
    conversation: usize,
    turn: usize,
    previous: Option<(&[u32], &[u32])>,
) -> Vec<u32> {
    let mut p = match previous {
        None => {
            let mut p = enc.start();
            p.extend(enc.encode(&system_prompt(w.system_words)));
            p
        }
        Some((prompt, answer)) => {
            let mut p = prompt.to_vec();
            p.extend_from_slice(answer);
            p
        }
    };
    p.extend(enc.encode(&user_turn(conversation, turn)));
    p
}
