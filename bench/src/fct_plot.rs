//! `bench fct-plot`: the HPCC paper's Figure 11a from `bench sim --json`
//! files: FCT slowdown (p95 solid, p50 dashed) against flow size, by the
//! count groups of fct_analysis.py, one line per controller and seed, both
//! axes logarithmic; reference points (such as the paper's) can be drawn
//! as labelled marks. Hand-written SVG, like [`crate::plot`].

use std::fmt::Write as _;

use crate::plot::{polyline, COLORS};

/// One line of the figure: its label and (largest flow size of the
/// group, p50, p95) per group.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub label: String,
    pub points: Vec<(u64, f64, f64)>,
}

/// The series of every run in a `bench sim --json` document, labelled
/// `cc` plus `suffix`.
pub fn series_of(json: &str, suffix: &str) -> Result<Vec<Series>, String> {
    let v: serde_json::Value = serde_json::from_str(json).map_err(|e| e.to_string())?;
    let runs = v
        .as_array()
        .ok_or("not a `bench sim --json` document (an array of runs)")?;
    let mut out = Vec::new();
    for (i, r) in runs.iter().enumerate() {
        let cc = r["cc"]
            .as_str()
            .ok_or_else(|| format!("run {i}: no \"cc\""))?;
        let groups = r["count_groups"]
            .as_array()
            .ok_or_else(|| format!("run {i} ({cc}): no \"count_groups\""))?;
        let mut points = Vec::new();
        for g in groups {
            let (Some(size), Some(p50), Some(p95)) =
                (g["max_size"].as_u64(), g["p50"].as_f64(), g["p95"].as_f64())
            else {
                return Err(format!(
                    "run {i} ({cc}): a count group without max_size/p50/p95"
                ));
            };
            points.push((size, p50, p95));
        }
        out.push(Series {
            label: format!("{cc}{suffix}"),
            points,
        });
    }
    Ok(out)
}

/// `text` with the characters XML gives meaning to escaped, for labels
/// the user chose.
fn xml_text(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

const W: f64 = 900.0;
const H: f64 = 520.0;
const LEFT: f64 = 70.0;
const TOP: f64 = 40.0;
const PLOT_W: f64 = 640.0;
const PLOT_H: f64 = 420.0;

/// The figure: `series`, and `marks` (label, size, p95) drawn as crosses.
pub fn svg(title: &str, series: &[Series], marks: &[(String, u64, f64)]) -> String {
    let sizes = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .chain(marks.iter().map(|m| m.1))
        .filter(|&x| x > 0);
    let (x_lo, x_hi) = sizes.fold((u64::MAX, 1u64), |(lo, hi), x| (lo.min(x), hi.max(x)));
    let x_lo = (x_lo.min(x_hi) as f64).log10().floor();
    let x_hi = (x_hi as f64).log10().ceil().max(x_lo + 1.0);
    let y_top = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.2))
        .chain(marks.iter().map(|m| m.2))
        .fold(2.0f64, f64::max)
        .log10()
        .ceil();
    let x = |size: u64| LEFT + PLOT_W * ((size.max(1) as f64).log10() - x_lo) / (x_hi - x_lo);
    let y = |v: f64| TOP + PLOT_H * (1.0 - v.max(1.0).log10() / y_top);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W:.0}" height="{H:.0}" viewBox="0 0 {W:.0} {H:.0}">"#
    );
    let _ = writeln!(
        s,
        r#"<text x="{LEFT}" y="20" font-family="sans-serif" font-size="14">{}</text>"#,
        xml_text(title)
    );
    let _ = writeln!(
        s,
        r##"<rect x="{LEFT}" y="{TOP}" width="{PLOT_W}" height="{PLOT_H}" fill="none" stroke="#888"/>"##
    );
    for d in 0..=(x_hi - x_lo) as i32 {
        let e = x_lo as i32 + d;
        let px = LEFT + PLOT_W * f64::from(d) / (x_hi - x_lo);
        let label = match e {
            e if e >= 6 => format!("{}MB", 10u64.pow((e - 6) as u32)),
            e if e >= 3 => format!("{}KB", 10u64.pow((e - 3) as u32)),
            e => format!("{}B", 10u64.pow(e.max(0) as u32)),
        };
        let _ = writeln!(
            s,
            r##"<line x1="{px:.1}" y1="{TOP}" x2="{px:.1}" y2="{:.0}" stroke="#ddd"/><text x="{px:.1}" y="{:.0}" font-family="sans-serif" font-size="10" text-anchor="middle">{label}</text>"##,
            TOP + PLOT_H,
            TOP + PLOT_H + 14.0
        );
    }
    for d in 0..=y_top as i32 {
        let v = 10f64.powi(d);
        let py = y(v);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{py:.1}" x2="{:.0}" y2="{py:.1}" stroke="#ddd"/><text x="{:.0}" y="{py:.1}" font-family="sans-serif" font-size="10" text-anchor="end">{v}</text>"##,
            LEFT + PLOT_W,
            LEFT - 5.0
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{:.0}" y="{:.0}" font-family="sans-serif" font-size="11" text-anchor="middle">flow size (largest of each 5% of the flows)</text>"#,
        LEFT + PLOT_W / 2.0,
        TOP + PLOT_H + 32.0
    );
    let _ = writeln!(
        s,
        r#"<text x="16" y="{:.0}" font-family="sans-serif" font-size="11" transform="rotate(-90 16 {:.0})" text-anchor="middle">FCT slowdown (p95 solid, p50 dashed)</text>"#,
        TOP + PLOT_H / 2.0,
        TOP + PLOT_H / 2.0
    );
    for (i, ser) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let p95: Vec<(f64, f64)> = ser.points.iter().map(|p| (x(p.0), y(p.2))).collect();
        polyline(&mut s, &p95, color);
        let mut d = String::new();
        for p in &ser.points {
            let _ = write!(d, "{:.1},{:.1} ", x(p.0), y(p.1));
        }
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{color}" stroke-width="1" stroke-dasharray="4 3" points="{}"/>"#,
            d.trim_end()
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.0}" y="{:.0}" font-family="sans-serif" font-size="12" fill="{color}">{}</text>"#,
            LEFT + PLOT_W + 15.0,
            TOP + 14.0 + 16.0 * i as f64,
            xml_text(&ser.label)
        );
    }
    for (i, (label, size, v)) in marks.iter().enumerate() {
        let (px, py) = (x(*size), y(*v));
        let _ = writeln!(
            s,
            r##"<path d="M{:.1},{:.1} l8,8 m0,-8 l-8,8" stroke="#000" stroke-width="1.5"/><text x="{:.1}" y="{:.1}" font-family="sans-serif" font-size="10">{}</text>"##,
            px - 4.0,
            py - 4.0,
            px + 6.0,
            py - 6.0 - 10.0 * (i % 2) as f64,
            xml_text(label)
        );
    }
    let _ = writeln!(s, "</svg>");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_come_from_the_json_of_bench_sim_and_errors_name_what_is_missing() {
        let json = r#"[{"cc":"hpcc","count_groups":[
            {"from":0.0,"max_size":300,"flows":5,"p50":1.0,"p95":1.5,"p99":2.0},
            {"from":0.05,"max_size":50000,"flows":5,"p50":1.2,"p95":3.0,"p99":9.0}]}]"#;
        let s = series_of(json, " seed 1").unwrap();
        assert_eq!(s[0].label, "hpcc seed 1");
        assert_eq!(s[0].points, vec![(300, 1.0, 1.5), (50_000, 1.2, 3.0)]);
        assert!(series_of("{}", "").unwrap_err().contains("array"));
        assert!(series_of(r#"[{"cc":"x"}]"#, "")
            .unwrap_err()
            .contains("count_groups"));
        let svg = svg("t <3KB", &s, &[("paper <3KB & more".into(), 1000, 1.6)]);
        assert!(svg.starts_with("<svg") && svg.contains("hpcc seed 1"));
        assert!(svg.contains("paper &lt;3KB &amp; more"), "labels escaped");
        assert!(svg.contains("t &lt;3KB") && svg.trim_end().ends_with("</svg>"));
    }
}
