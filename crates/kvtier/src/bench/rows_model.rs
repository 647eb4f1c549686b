//! `model.*` rows: real models through kvtier (crates/kvtier-candle), with `--models`.

use super::{Effort, Row};

#[cfg(feature = "models")]
pub fn rows(effort: Effort, wanted: &dyn Fn(&str) -> bool) -> anyhow::Result<Vec<Row>> {
    // Cold Gemma prefills of 2,064 tokens take about 20 s each: 3 of them in a full run.
    let (cold, hit) = if effort.scale > 1 { (3, 7) } else { (1, 3) };
    let memcpy = |size: usize| super::measure::memcpy_gbps(size, 4, effort.samples, 1);
    let got = kvtier_candle::bench::rows(
        cold,
        hit,
        &memcpy,
        Some(&crate::loopback::InProcess),
        wanted,
    )?;
    Ok(got
        .into_iter()
        .filter(|r| wanted(&r.name))
        .map(|r| Row::new(r.name, r.value, r.unit, r.baseline, r.baseline_is))
        .collect())
}

#[cfg(not(feature = "models"))]
pub fn rows(_effort: Effort, _wanted: &dyn Fn(&str) -> bool) -> anyhow::Result<Vec<Row>> {
    available().map(|()| Vec::new())
}

/// Whether this build can run the model rows; checked before any other row runs.
#[cfg(feature = "models")]
pub fn available() -> anyhow::Result<()> {
    Ok(())
}

/// Whether this build can run the model rows; checked before any other row runs.
#[cfg(not(feature = "models"))]
pub fn available() -> anyhow::Result<()> {
    anyhow::bail!(
        "the model rows need real models: `cargo run --release -p kvtier --features models -- bench --models`"
    )
}
