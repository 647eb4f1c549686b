//! `snapshot.put.us` and `snapshot.get.us`: a 1 MiB recurrent state behind a 2,048-token
//! prompt, against memcpy of the same bytes.

use std::hint::black_box;

use kvtier_core::tier::RamConfig;
use kvtier_core::{Engine, KvDtype, LayoutKey};

use super::measure::{median_of, memcpy_gbps, pattern, seconds};
use super::{Effort, Row};

const STATE_BYTES: usize = 1 << 20;
const PROMPT_TOKENS: usize = 2048;

pub fn rows(effort: Effort, wanted: &dyn Fn(&str) -> bool) -> anyhow::Result<Vec<Row>> {
    let (put_name, get_name) = ("snapshot.put.us", "snapshot.get.us");
    if !wanted(put_name) && !wanted(get_name) {
        return Ok(vec![]);
    }
    let engine = Engine::builder()
        .ram(RamConfig {
            capacity_bytes: 1 << 30,
        })
        .build()?;
    let layout =
        engine.register_layout(LayoutKey::new("bench-mamba", KvDtype::F32, 16, 24, 1, 1))?;
    let blob = pattern(STATE_BYTES, 3);
    let prompts: Vec<Vec<u32>> = (0..64u32)
        .map(|p| (0..PROMPT_TOKENS as u32).map(|t| t ^ (p << 20)).collect())
        .collect();
    let reps = 64 * effort.scale;
    let memcpy_us = STATE_BYTES as f64 / memcpy_gbps(STATE_BYTES, 256, effort.samples, 1) / 1e3;
    let mut rows = Vec::new();
    let put = median_of(effort.samples, || {
        seconds(|| {
            for i in 0..reps {
                let r =
                    engine.snapshot_put(layout.digest(), &prompts[i % prompts.len()], None, &blob);
                black_box(r.ok());
            }
        }) * 1e6
            / reps as f64
    });
    if wanted(put_name) {
        rows.push(Row::new(
            put_name,
            put,
            "us",
            memcpy_us,
            "memcpy of the state",
        ));
    }
    if wanted(get_name) {
        let get = median_of(effort.samples, || {
            seconds(|| {
                for i in 0..reps {
                    let r = engine.snapshot_get(layout.digest(), &prompts[i % prompts.len()], None);
                    assert!(matches!(r, Ok(Some(_))));
                }
            }) * 1e6
                / reps as f64
        });
        rows.push(Row::new(
            get_name,
            get,
            "us",
            memcpy_us,
            "memcpy of the state",
        ));
    }
    Ok(rows)
}
