//! A small SVG chart for `bench sim --plot`: the monitored queue over time
//! and each flow's rate over time, one panel each, one colour per run or
//! flow; with QoS classes, two more panels: each class's rate and the mean
//! sojourn time of its frames, one colour per run and class. Hand-written SVG (polylines and text), so that it needs no font
//! files or drawing crate.

use std::fmt::Write as _;

use netsim::sim::SimResult;

const W: f64 = 900.0;
const PANEL_H: f64 = 260.0;
const LEFT: f64 = 80.0;
pub(crate) const COLORS: [&str; 10] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];

/// A line through `pts` (SVG coordinates).
pub(crate) fn polyline(s: &mut String, pts: &[(f64, f64)], color: &str) {
    let mut d = String::new();
    for (x, y) in pts {
        let _ = write!(d, "{x:.1},{y:.1} ");
    }
    let _ = writeln!(
        s,
        r#"<polyline fill="none" stroke="{color}" stroke-width="1.2" points="{}"/>"#,
        d.trim_end()
    );
}

fn panel(s: &mut String, top: f64, title: &str, unit: &str, y_max: f64, t_max: f64) {
    let h = PANEL_H - 50.0;
    let _ = writeln!(
        s,
        r#"<text x="{LEFT}" y="{:.0}" font-family="sans-serif" font-size="14">{title}</text>"#,
        top + 16.0
    );
    let _ = writeln!(
        s,
        r##"<rect x="{LEFT}" y="{:.0}" width="{:.0}" height="{h:.0}" fill="none" stroke="#888"/>"##,
        top + 25.0,
        W - LEFT - 20.0
    );
    for i in 0..=4 {
        let y = top + 25.0 + h * (1.0 - f64::from(i) / 4.0);
        let v = y_max * f64::from(i) / 4.0;
        let _ = writeln!(
            s,
            r#"<text x="{:.0}" y="{y:.0}" font-family="sans-serif" font-size="10" text-anchor="end">{v:.1} {unit}</text>"#,
            LEFT - 5.0
        );
        let t = t_max * f64::from(i) / 4.0 / 1e3;
        let x = LEFT + (W - LEFT - 20.0) * f64::from(i) / 4.0;
        let _ = writeln!(
            s,
            r#"<text x="{x:.0}" y="{:.0}" font-family="sans-serif" font-size="10" text-anchor="middle">{t:.0} us</text>"#,
            top + 25.0 + h + 14.0
        );
    }
}

/// The SVG document for `runs`.
pub fn svg(runs: &[&SimResult]) -> String {
    let mut s = String::new();
    let classes = runs.iter().any(|r| !r.class_series.is_empty());
    let height = if classes { 4.0 } else { 2.0 } * PANEL_H + 30.0;
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W:.0}" height="{height:.0}" viewBox="0 0 {W:.0} {height:.0}">"#
    );
    let t_max = runs
        .iter()
        .flat_map(|r| r.queue_series.last().map(|p| p.0))
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let x = |t: u64| LEFT + (W - LEFT - 20.0) * t as f64 / t_max;
    let h = PANEL_H - 50.0;
    // Queue panel: one line per run.
    let q_max = runs
        .iter()
        .flat_map(|r| r.queue_series.iter().map(|p| p.1))
        .max()
        .unwrap_or(1)
        .max(1) as f64
        / 1e3;
    panel(&mut s, 0.0, "bottleneck queue", "KB", q_max, t_max);
    for (i, r) in runs.iter().enumerate() {
        let pts: Vec<(f64, f64)> = r
            .queue_series
            .iter()
            .map(|&(t, q)| (x(t), 25.0 + h * (1.0 - q as f64 / 1e3 / q_max)))
            .collect();
        polyline(&mut s, &pts, COLORS[i % COLORS.len()]);
        let _ = writeln!(
            s,
            r#"<text x="{:.0}" y="{:.0}" font-family="sans-serif" font-size="12" fill="{}">{}</text>"#,
            W - 140.0,
            40.0 + 14.0 * i as f64,
            COLORS[i % COLORS.len()],
            r.cc
        );
    }
    // Rate panel: each flow of the first run.
    let top = PANEL_H;
    if let Some(r) = runs.first() {
        let r_max = r
            .rate_series
            .iter()
            .flat_map(|(_, v)| v.iter().map(|x| x.1))
            .fold(1.0, f64::max)
            / 1e9;
        panel(
            &mut s,
            top,
            &format!("per-flow rate ({})", r.cc),
            "Gb/s",
            r_max,
            t_max,
        );
        let mut flows: Vec<usize> = r
            .rate_series
            .iter()
            .flat_map(|(_, v)| v.iter().map(|x| x.0))
            .collect();
        flows.sort_unstable();
        flows.dedup();
        for (i, f) in flows.iter().enumerate() {
            let pts: Vec<(f64, f64)> = r
                .rate_series
                .iter()
                .filter_map(|(t, v)| v.iter().find(|x| x.0 == *f).map(|x| (*t, x.1)))
                .map(|(t, b)| (x(t), top + 25.0 + h * (1.0 - b / 1e9 / r_max)))
                .collect();
            polyline(&mut s, &pts, COLORS[i % COLORS.len()]);
        }
    }
    if classes {
        class_panels(&mut s, runs, 2.0 * PANEL_H, t_max);
    }
    let _ = writeln!(s, "</svg>");
    s
}

/// Per class of each run: its rate (Gb/s) and its frames' mean sojourn
/// time (us) per sample, from `top` down.
fn class_panels(s: &mut String, runs: &[&SimResult], top: f64, t_max: f64) {
    let x = |t: u64| LEFT + (W - LEFT - 20.0) * t as f64 / t_max;
    let h = PANEL_H - 50.0;
    for (k, (title, unit, scale)) in [
        ("per-class rate", "Gb/s", 1.0),
        ("per-class mean sojourn", "us", 1e-3),
    ]
    .into_iter()
    .enumerate()
    {
        let top = top + k as f64 * PANEL_H;
        let value = |p: &(f64, f64)| if k == 0 { p.0 } else { p.1 * scale };
        let y_max = runs
            .iter()
            .flat_map(|r| r.class_series.iter().flat_map(|(_, v)| v.iter().map(value)))
            .fold(1e-9, f64::max);
        panel(s, top, title, unit, y_max, t_max);
        let mut line = 0;
        for r in runs {
            let n = r.class_series.first().map_or(0, |p| p.1.len());
            for c in 0..n {
                let color = COLORS[line % COLORS.len()];
                let pts: Vec<(f64, f64)> = r
                    .class_series
                    .iter()
                    .filter_map(|(t, v)| v.get(c).map(|p| (x(*t), value(p))))
                    .map(|(px, v)| (px, top + 25.0 + h * (1.0 - v / y_max)))
                    .collect();
                polyline(s, &pts, color);
                let _ = writeln!(
                    s,
                    r#"<text x="{:.0}" y="{:.0}" font-family="sans-serif" font-size="12" fill="{color}">{} class {c}</text>"#,
                    W - 190.0,
                    top + 40.0 + 14.0 * line as f64,
                    r.cc
                );
                line += 1;
            }
        }
    }
}
