//! What the benchmarks print, in perftest's shape: the settings block, the
//! connection block, the result columns (microseconds for latency, MB/s or
//! Gb/s for bandwidth), the hdrhistogram dump of `-H`, the ratio lines of
//! `--compare`, and the same as JSON for `--out_json`.

use std::path::Path;

use serde_json::{json, Value};

use super::args::{PerfArgs, Test};
use super::bw::BwResult;
use super::conn::Conn;
use super::lat::LatResult;

const RULE: &str =
    "---------------------------------------------------------------------------------------";

pub fn settings(test: Test, a: &PerfArgs, c: &Conn) {
    println!("{RULE}");
    println!("                    {}", test.title());
    let mode = if a.loopback {
        "loopback (both ends here, one thread)"
    } else if a.is_client() {
        "client"
    } else {
        "server"
    };
    println!(" Mode            : {mode}");
    println!(" Daemon socket   : {}", a.socket.display());
    if a.loopback {
        println!(" Config          : {}", a.config.display());
    }
    println!(" Device          : {}", c.device);
    println!(" Port backend    : {}", c.backend);
    println!(
        " Shared memory   : {} MiB, {}",
        c.shm.0 >> 20,
        if c.shm.1 { "hugepages" } else { "normal pages" }
    );
    println!(" MTU             : {} B", c.mtu);
    println!(" Number of qps   : {}", a.qps);
    println!(" CC mode         : {}", c.cc);
    if test.is_latency() {
        println!(" TX depth        : 1");
    } else {
        println!(" TX depth        : {}", a.tx_depth);
    }
    if test.is_read() {
        println!(" Outstand reads  : {}", a.outs);
    } else {
        println!(" Max inline data : {} B", a.inline_size(test));
    }
    println!("{RULE}");
}

pub fn connection(c: &Conn) {
    let side = c.main_side();
    for (l, r) in side.endpoints.iter().zip(&c.remote_endpoints) {
        let lm = l.mr.expect("regions are exchanged");
        let rm = r.mr.expect("regions are exchanged");
        println!(
            " local address: IP {} QPN {:#06x} PSN {:#08x} RKey {:#010x} VAddr {:#018x}",
            l.ip, l.qpn, l.psn, lm.rkey, lm.va
        );
        println!(
            " remote address: IP {} QPN {:#06x} PSN {:#08x} RKey {:#010x} VAddr {:#018x}",
            r.ip, r.qpn, r.psn, rm.rkey, rm.va
        );
    }
    println!("{RULE}");
}

pub fn lat_header(_a: &PerfArgs) {
    println!(
        " {:<10} {:<12} {:>12} {:>12} {:>16} {:>12} {:>14} {:>22} {:>24}",
        "#bytes",
        "#iterations",
        "t_min[usec]",
        "t_max[usec]",
        "t_typical[usec]",
        "t_avg[usec]",
        "t_stdev[usec]",
        "99% percentile[usec]",
        "99.9% percentile[usec]"
    );
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1e3
}

pub fn lat_row(a: &PerfArgs, r: &LatResult) {
    if r.iters == 0 {
        return; // the server end measured nothing
    }
    let h = &r.hist;
    println!(
        " {:<10} {:<12} {:>12.2} {:>12.2} {:>16.2} {:>12.2} {:>14.2} {:>22.2} {:>24.2}",
        r.size,
        r.iters,
        us(h.min()),
        us(h.max()),
        us(h.value_at_quantile(0.5)),
        r.avg_ns / 1e3,
        r.stdev_ns / 1e3,
        us(h.value_at_quantile(0.99)),
        us(h.value_at_quantile(0.999))
    );
    if a.histogram {
        println!(" histogram of {} B (usec: count)", r.size);
        for v in h.iter_log(h.min().max(1), 1.25) {
            if v.count_since_last_iteration() > 0 {
                println!(
                    "   <= {:>10.2} : {}",
                    us(v.value_iterated_to()),
                    v.count_since_last_iteration()
                );
            }
        }
    }
}

pub fn bw_header(a: &PerfArgs) {
    let unit = if a.report_gbits { "Gb/sec" } else { "MB/sec" };
    println!(
        " {:<10} {:<12} {:>16} {:>19} {:>15}",
        "#bytes",
        "#iterations",
        format!("BW peak[{unit}]"),
        format!("BW average[{unit}]"),
        "MsgRate[Mpps]"
    );
}

fn bw_unit(a: &PerfArgs, bps: f64) -> f64 {
    if a.report_gbits {
        bps / 1e9
    } else {
        bps / 8.0 / 1e6
    }
}

pub fn bw_row(a: &PerfArgs, r: &BwResult) {
    if r.iters == 0 {
        return;
    }
    println!(
        " {:<10} {:<12} {:>16.2} {:>19.2} {:>15.6}",
        r.size,
        r.iters,
        bw_unit(a, r.peak_bps),
        bw_unit(a, r.avg_bps),
        r.msg_rate / 1e6
    );
}

/// The summary of one baseline's per-round ratios.
#[derive(Debug, Clone)]
pub struct Ratio {
    pub name: &'static str,
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub rounds: usize,
}

impl Ratio {
    pub fn of(name: &'static str, v: &[f64]) -> Ratio {
        let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
        let median = super::baseline::median(&mut s); // sorts `s`
        Ratio {
            name,
            median,
            min: s.first().copied().unwrap_or(f64::NAN),
            max: s.last().copied().unwrap_or(f64::NAN),
            rounds: s.len(),
        }
    }

    /// The same summary of plain figures in `unit` (ours alone, not a
    /// ratio): `NAME median=M min=A max=B UNIT rounds=N`.
    pub fn as_figure(&self, unit: &str) -> String {
        self.line("", &format!(" {unit}"))
    }

    /// `PREFIXNAME median=M min=A max=B[UNIT] rounds=N`.
    fn line(&self, prefix: &str, unit: &str) -> String {
        format!(
            "{prefix}{} median={:.3} min={:.3} max={:.3}{unit} rounds={}",
            self.name, self.median, self.min, self.max, self.rounds
        )
    }
}

impl std::fmt::Display for Ratio {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.line("ratio ", ""))
    }
}

/// The `--out_json` document.
pub struct Json(Value);

impl Json {
    pub fn new(test: Test, a: &PerfArgs, c: &Conn) -> Json {
        Json(json!({
            "test": test.name(),
            "settings": {
                "device": c.device, "backend": c.backend, "mtu": c.mtu, "qps": a.qps,
                "cc": c.cc, "tx_depth": a.tx_depth, "outs": a.outs, "inline_size": a.inline_size(test), "loopback": a.loopback,
            },
            "results": [],
        }))
    }

    fn push(&mut self, v: Value) {
        if let Some(r) = self.0["results"].as_array_mut() {
            r.push(v);
        }
    }

    pub fn lat(&mut self, r: &LatResult) {
        let h = &r.hist;
        self.push(json!({
            "bytes": r.size, "iterations": r.iters,
            "t_min_us": us(h.min()), "t_max_us": us(h.max()),
            "t_typical_us": us(h.value_at_quantile(0.5)), "t_avg_us": r.avg_ns / 1e3,
            "t_stdev_us": r.stdev_ns / 1e3, "p99_us": us(h.value_at_quantile(0.99)),
            "p999_us": us(h.value_at_quantile(0.999)),
        }));
    }

    pub fn bw(&mut self, r: &BwResult) {
        self.push(json!({
            "bytes": r.size, "iterations": r.iters, "bw_peak_gbps": r.peak_bps / 1e9,
            "bw_avg_gbps": r.avg_bps / 1e9, "msg_rate_mpps": r.msg_rate / 1e6,
        }));
    }

    pub fn ratios(&mut self, rs: &[Ratio]) {
        self.0["compare"] = rs
            .iter()
            .map(|r| {
                json!({"ratio": r.name, "median": r.median, "min": r.min, "max": r.max,
                       "rounds": r.rounds})
            })
            .collect();
    }

    pub fn breakdown(&mut self, rows: &[super::breakdown::Row]) {
        self.0["breakdown"] = rows
            .iter()
            .map(|r| {
                json!({"stage": r.name, "median_ns": r.median_ns, "p99_ns": r.p99_ns,
                       "samples": r.samples})
            })
            .collect();
    }

    pub fn write(&self, path: &Path) -> Result<(), String> {
        if let Some(d) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
        }
        let text = serde_json::to_string_pretty(&self.0).expect("JSON");
        std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratio_summary_is_median_min_max_of_the_rounds() {
        let r = Ratio::of("ours/udp", &[3.0, 1.0, 2.0, 10.0]);
        assert_eq!((r.median, r.min, r.max, r.rounds), (2.5, 1.0, 10.0, 4));
        assert_eq!(
            r.to_string(),
            "ratio ours/udp median=2.500 min=1.000 max=10.000 rounds=4"
        );
        let r = Ratio::of("x", &[f64::NAN, 4.0, 2.0, 3.0]);
        assert_eq!((r.median, r.rounds), (3.0, 3));
    }
}
