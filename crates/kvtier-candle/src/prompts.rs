//! Text for prompts: a long shared system prompt and short user turns, made from a fixed
//! set of sentences so runs are repeatable.

const SENTENCES: &[&str] = &[
    "You are a careful assistant for the operators of a storage cluster.",
    "Answer briefly, cite the runbook section you rely on, and never guess a number.",
    "The cluster keeps hot data in memory, warm data on local flash and cold data in object storage.",
    "A block that fails its checksum is dropped and read again from the next tier.",
    "Writes are acknowledged only after the journal entry is durable.",
    "During a rolling restart at most one replica per shard may be down.",
    "Capacity alarms fire at eighty percent of the quota and page at ninety.",
    "Every change to a production setting needs a ticket and a second reviewer.",
    "Latency budgets are measured at the ninety-ninth percentile over five minutes.",
    "When two runbook sections disagree, the newer one wins and the older one is filed for review.",
];

const QUESTIONS: &[&str] = &[
    "Which tier holds warm data?",
    "What happens to a block with a bad checksum?",
    "When is a write acknowledged?",
    "How many replicas per shard may be down during a restart?",
    "At what level do capacity alarms page?",
    "Who must approve a production change?",
    "How are latency budgets measured?",
    "What if two runbook sections disagree?",
];

/// A system prompt of roughly `words` words: the sentences, numbered, repeated in order.
pub fn system_prompt(words: usize) -> String {
    let mut out = String::from("System instructions for this session.\n");
    let mut n = 0;
    let mut i = 0;
    while n < words {
        let s = SENTENCES[i % SENTENCES.len()];
        out.push_str(&format!("Rule {}: {s}\n", i + 1));
        n += s.split_whitespace().count() + 2;
        i += 1;
    }
    out
}

/// The `turn`-th question of conversation `conversation`.
pub fn user_turn(conversation: usize, turn: usize) -> String {
    let q = QUESTIONS[(conversation * 3 + turn) % QUESTIONS.len()];
    format!("\nUser {conversation}, turn {turn}: {q}\nAssistant:")
}
