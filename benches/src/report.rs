//! `report BENCH.json DIR`: the charts of the book's performance chapter,
//! drawn with `plotters` from the JSON a run wrote, so no figure is ever
//! retyped:
//!
//! * one horizontal bar chart per comparison (`<slug>.svg`): the median of
//!   every system, Ringmail's bar dark, each bar labelled with its figure
//!   and its ratio to Ringmail;
//! * one latency-percentile chart per `msg-lat` rate and side
//!   (`msg-lat-<rate>-<side>-percentiles.svg`): latency (log scale) against
//!   the percentile, p1 to p99.99, one line per system.
//!
//! `scripts/bench_table.py` writes the tables that link them.

use std::collections::BTreeMap;
use std::error::Error;
use std::path::Path;

use plotters::prelude::*;
use serde_json::Value;

type Res = Result<(), Box<dyn Error>>;

/// File name for a comparison's chart (the same rule as bench_table.py).
pub fn slug(name: &str) -> String {
    let mut out = String::new();
    for c in name.to_lowercase().chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c);
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    out.trim_matches('-').to_string()
}

fn short(v: f64, unit: &str) -> String {
    match unit {
        "msg/s" | "msgs/s" | "fds/s" | "req/s" | "actors/s" if v >= 1e6 => {
            format!("{:.2} M", v / 1e6)
        }
        "msg/s" | "msgs/s" | "fds/s" | "req/s" | "actors/s" => format!("{:.1} k", v / 1e3),
        "ns" if v >= 1000.0 => format!("{:.1} µs", v / 1e3),
        _ => format!("{v:.1}"),
    }
}

fn bar_chart(c: &Value, path: &Path) -> Res {
    let rows = c["rows"].as_array().ok_or("rows")?;
    let unit = c["unit"].as_str().unwrap_or("");
    let better = if c["better"] == "Higher" { "higher is better" } else { "lower is better" };
    let title = format!("{} ({unit}, {better})", c["name"].as_str().unwrap_or(""));
    let bars: Vec<(String, f64, f64)> = rows
        .iter()
        .map(|r| {
            (
                r["system"].as_str().unwrap_or("").to_string(),
                r["median"].as_f64().unwrap_or(0.0),
                r["ratio_to_ringmail"].as_f64().unwrap_or(f64::NAN),
            )
        })
        .collect();
    let n = bars.len();
    let top = bars.iter().map(|b| b.1).fold(0.0, f64::max).max(1e-9) * 1.45;
    let root = SVGBackend::new(path, (720, 70 + 26 * n as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 15))
        .margin(10)
        .x_label_area_size(24)
        .y_label_area_size(190)
        .build_cartesian_2d(0f64..top, -0.5f64..(n as f64 - 0.5))?;
    let names: Vec<String> = bars.iter().map(|b| b.0.clone()).collect();
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(n.max(2))
        .y_label_formatter(&|y| {
            let i = y.round();
            if (y - i).abs() > 0.01 || i < 0.0 {
                return String::new();
            }
            // Top to bottom in the table's order.
            names.get(n.wrapping_sub(1).wrapping_sub(i as usize)).cloned().unwrap_or_default()
        })
        .x_label_formatter(&|x| short(*x, unit))
        .x_labels(5)
        .draw()?;
    for (i, (_, v, ratio)) in bars.iter().enumerate() {
        let y = (n - 1 - i) as f64;
        let colour = if i == 0 { RGBColor(0x2b, 0x4c, 0x7e) } else { RGBColor(0x9d, 0xb4, 0xd6) };
        chart.draw_series(std::iter::once(Rectangle::new(
            [(0.0, y - 0.35), (*v, y + 0.35)],
            colour.filled(),
        )))?;
        chart.draw_series(std::iter::once(Text::new(
            format!(" {} (x{ratio:.2})", short(*v, unit)),
            (*v, y + 0.2),
            ("sans-serif", 12),
        )))?;
    }
    root.present()?;
    Ok(())
}

/// Percentile -> "nines" (p50 -> 0.3, p90 -> 1, p99 -> 2, p99.99 -> 4).
fn nines(p: f64) -> f64 {
    -(1.0 - p / 100.0).log10()
}

fn percentile_chart(title: &str, lines: &BTreeMap<String, Vec<(f64, f64)>>, path: &Path) -> Res {
    let lo = lines.values().flatten().map(|p| p.1).fold(f64::INFINITY, f64::min).max(1.0);
    let hi = lines.values().flatten().map(|p| p.1).fold(1.0, f64::max);
    let root = SVGBackend::new(path, (720, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 15))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..nines(99.99), (lo / 1.5..hi * 1.5).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("percentile")
        .x_labels(5)
        .y_desc("latency")
        .x_label_formatter(&|x| {
            let p = 100.0 * (1.0 - 10f64.powf(-x));
            if p >= 99.0 {
                format!("p{p:.2}").trim_end_matches('0').trim_end_matches('.').to_string()
            } else {
                format!("p{p:.0}")
            }
        })
        .y_label_formatter(&|y| short(*y, "ns"))
        .draw()?;
    for (i, (system, pts)) in lines.iter().enumerate() {
        let colour = Palette99::pick(i).to_rgba();
        let width = if system == "ringmail" { 3 } else { 1 };
        chart
            .draw_series(LineSeries::new(
                pts.iter().map(|&(p, v)| (nines(p), v.max(1.0))),
                colour.stroke_width(width),
            ))?
            .label(system.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], colour));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

/// Draws every chart of `json` into `dir`.
pub fn run(json: &str, dir: &str) -> Res {
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(json)?)?;
    std::fs::create_dir_all(dir)?;
    let mut drawn = 0;
    for c in doc["comparisons"].as_array().ok_or("no comparisons")? {
        let name = c["name"].as_str().ok_or("a comparison without a name")?;
        bar_chart(c, &Path::new(dir).join(format!("{}.svg", slug(name))))?;
        drawn += 1;
    }
    // (rate, side) -> system -> [(percentile, ns)]
    type Lines = BTreeMap<String, Vec<(f64, f64)>>;
    let mut pct: BTreeMap<(u64, String), Lines> = BTreeMap::new();
    for r in doc["records"].as_array().map(Vec::as_slice).unwrap_or_default() {
        let Some(side) = r["metric"].as_str().and_then(|m| m.strip_suffix("_ns_at_percentile"))
        else {
            continue;
        };
        let rate = r["params"]["rate"].as_u64().unwrap_or(0);
        let p = r["params"]["percentile"].as_f64().unwrap_or(0.0);
        let v = r["value"].as_f64().unwrap_or(0.0);
        let system = r["system"].as_str().unwrap_or("").to_string();
        pct.entry((rate, side.to_string())).or_default().entry(system).or_default().push((p, v));
    }
    for ((rate, side), lines) in &pct {
        let title = format!("msg-lat {rate} msg/s: {side} latency by percentile");
        let path = Path::new(dir).join(format!("msg-lat-{rate}-{side}-percentiles.svg"));
        percentile_chart(&title, lines, &path)?;
        drawn += 1;
    }
    println!("report: {drawn} charts in {dir}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs_match_the_table_script() {
        assert_eq!(slug("msg-lat 13000 msg/s, receiver p50"), "msg-lat-13000-msg-s-receiver-p50");
        assert_eq!(slug("spawn + 1 message"), "spawn-1-message");
    }

    #[test]
    fn percentiles_map_to_nines() {
        assert!((nines(99.0) - 2.0).abs() < 1e-9);
        assert!((nines(90.0) - 1.0).abs() < 1e-9);
    }
}
