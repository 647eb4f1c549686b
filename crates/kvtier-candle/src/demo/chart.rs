//! The demo's PNG: median time to first token per phase, one bar per model, log scale.
//! Cold bars are the median over all turns; the others over the turns that reused
//! cached state (the first turns of a phase may have nothing to reuse).

use std::path::Path;

use plotters::prelude::*;
use plotters::style::FontStyle;

use super::phase::PhaseSummary;
use crate::{Error, Result};

/// Fonts tried for the labels (the setup script installs DejaVu).
const FONTS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];

fn register_font() -> Result<()> {
    let Some(bytes) = FONTS.iter().find_map(|p| std::fs::read(p).ok()) else {
        return Err(Error::Invalid(format!(
            "no font for the chart's labels (looked for {}); install fonts-dejavu-core",
            FONTS.join(", ")
        )));
    };
    // plotters keeps the font for the whole process.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| Error::Invalid("the chart font could not be read".into()))
}

/// Draws `rows` (phases in order, for each model) to `path`.
pub fn draw(rows: &[PhaseSummary], path: &Path) -> Result<()> {
    register_font()?;
    let fail = |e: String| Error::Invalid(format!("chart {}: {e}", path.display()));
    let phases: Vec<String> = {
        let mut p: Vec<String> = Vec::new();
        for r in rows {
            if !p.contains(&r.phase) {
                p.push(r.phase.clone());
            }
        }
        p
    };
    let models: Vec<String> = {
        let mut m: Vec<String> = Vec::new();
        for r in rows {
            if !m.contains(&r.model) {
                m.push(r.model.clone());
            }
        }
        m
    };
    let value = |r: &PhaseSummary| {
        if r.phase == "cold" || r.ttft_hit_median_ms <= 0.0 {
            r.ttft_median_ms
        } else {
            r.ttft_hit_median_ms
        }
    };
    let max = rows.iter().map(value).fold(1.0, f64::max) * 2.0;
    let min = rows.iter().map(value).fold(max, f64::min).max(0.01) / 2.0;
    let root = BitMapBackend::new(path, (960, 540)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(e.to_string()))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "kvtier demo: median time to first token (cold: all turns; others: turns that hit)",
            ("sans-serif", 20),
        )
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..phases.len() as f64, (min..max).log_scale())
        .map_err(|e| fail(e.to_string()))?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(phases.len() * 2 + 1)
        .x_label_formatter(&|x| {
            let i = x.floor() as usize;
            if (x - x.floor() - 0.5).abs() < 1e-6 {
                phases.get(i).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_desc("TTFT, ms (log scale)")
        .y_label_formatter(&|v| format!("{v:.0}"))
        .light_line_style(WHITE)
        .label_style(("sans-serif", 15))
        .draw()
        .map_err(|e| fail(e.to_string()))?;
    let colors = [
        RGBColor(66, 104, 180),
        RGBColor(222, 130, 40),
        RGBColor(90, 160, 90),
    ];
    let width = 0.8 / models.len().max(1) as f64;
    for (mi, model) in models.iter().enumerate() {
        let color = colors[mi % colors.len()];
        let bars: Vec<Rectangle<(f64, f64)>> = rows
            .iter()
            .filter(|r| &r.model == model)
            .filter_map(|r| {
                let pi = phases.iter().position(|p| p == &r.phase)? as f64;
                let x0 = pi + 0.1 + width * mi as f64;
                Some(Rectangle::new(
                    [(x0, min), (x0 + width * 0.9, value(r).max(min))],
                    color.filled(),
                ))
            })
            .collect();
        chart
            .draw_series(bars)
            .map_err(|e| fail(e.to_string()))?
            .label(model.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 12, y + 6)], color.filled()));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 16))
        .draw()
        .map_err(|e| fail(e.to_string()))?;
    root.present().map_err(|e| fail(e.to_string()))?;
    Ok(())
}
