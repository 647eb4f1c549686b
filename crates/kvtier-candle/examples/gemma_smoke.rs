//! Quick look at the Gemma forward pass: greedy continuation of a prompt.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "an example")]
use kvtier_candle::gemma::{GemmaWeights, KvCache, argmax, locate_gguf};

fn main() {
    let path = locate_gguf(false).unwrap();
    let t = std::time::Instant::now();
    let w = GemmaWeights::load(&path, 4096).unwrap();
    eprintln!("loaded in {:?}", t.elapsed());
    let text = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "The capital of France is".into());
    let mut prompt = vec![w.config().bos];
    prompt.extend(w.vocab().encode(&text));
    eprintln!("prompt {:?}", prompt);
    let mut kv = KvCache::new(w.config());
    let t = std::time::Instant::now();
    let chunk: usize = std::env::var("CHUNK")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(16);
    let mut logits = w.prefill(&mut kv, &prompt, chunk).unwrap();
    eprintln!("prefill {} tokens in {:?}", prompt.len(), t.elapsed());
    let mut out = Vec::new();
    let t = std::time::Instant::now();
    for _ in 0..20 {
        let next = argmax(&logits);
        out.push(next);
        logits = w.forward(&mut kv, &[next]).unwrap();
    }
    eprintln!("decode 20 in {:?}", t.elapsed());
    println!("{}{}", text, w.vocab().decode(&out));
}
