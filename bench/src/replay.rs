//! `bench hpcc-replay`: feeds a telemetry trace (see `pacer::trace`) through
//! the same sender-based HPCC++ code the transport uses and prints what it
//! decided after every event, as CSV:
//!
//! ```text
//! event,U,W,Wc,rate_bps,inc_stage
//! ```
//!
//! W and Wc in bytes, rate in bits per second; floating-point values are
//! printed in Rust's shortest round-trip form, so another implementation can
//! be compared at any tolerance. Bad lines are reported on stderr with their
//! line number and skipped.

use std::io::{self, BufRead, Write};
use std::path::PathBuf;

use pacer::hpcc::{Hpcc, HpccParams, HpccSettings, ParamError};
use pacer::trace::parse_line;

/// Flags of `bench hpcc-replay`.
#[derive(Debug, Clone, clap::Args)]
pub struct ReplayArgs {
    /// Trace file, one event per line: `ack_seq snd_nxt nhop [ts_ns tx_bytes
    /// qlen rate_100mbps switch_id port_id] x nhop`; `-` reads stdin.
    pub file: PathBuf,
    /// T: base RTT in nanoseconds.
    #[arg(long, default_value_t = 5000)]
    pub t_ns: u64,
    /// eta: target utilization.
    #[arg(long, default_value_t = 0.95)]
    pub eta: f64,
    /// maxStage: additive-increase stages before multiplicative increase.
    #[arg(long, default_value_t = 5)]
    pub max_stage: u32,
    /// W_init in bytes [default: line rate x T].
    #[arg(long)]
    pub w_init: Option<f64>,
    /// NIC line rate in Gb/s, for the default W_init.
    #[arg(long, default_value_t = 100.0)]
    pub line_gbps: f64,
    /// W_ai in bytes [default: W_init x (1 - eta) / N].
    #[arg(long)]
    pub w_ai: Option<f64>,
    /// N: expected concurrent flows per link, for the default W_ai.
    #[arg(long, default_value_t = 16)]
    pub n: u32,
    /// W_min in bytes [default: --mtu].
    #[arg(long)]
    pub w_min: Option<f64>,
    /// Path MTU in bytes, the default W_min.
    #[arg(long, default_value_t = 1024)]
    pub mtu: u32,
}

impl ReplayArgs {
    /// The HPCC++ parameters these flags describe.
    pub fn params(&self) -> Result<HpccParams, ParamError> {
        if self.n == 0 {
            return Err(ParamError::ZeroN(self.n));
        }
        let settings = HpccSettings {
            t_ns: self.t_ns,
            n: self.n,
            eta: self.eta,
            max_stage: self.max_stage,
        };
        let w_min = self.w_min.unwrap_or(f64::from(self.mtu));
        // The link's parameters, then the windows the flags set by hand.
        let mut p = settings.params_at_least_one_mtu((self.line_gbps * 1e9) as u64, 1)?;
        p.w_min = w_min;
        if let Some(w) = self.w_init {
            p.w_init = w;
            p.w_ai = w * (1.0 - self.eta) / f64::from(self.n);
        }
        if let Some(w) = self.w_ai {
            p.w_ai = w;
        }
        p.validate()?;
        Ok(p)
    }
}

/// Counts of one replay.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplaySummary {
    pub events: u64,
    pub bad_lines: u64,
}

/// Replays `input` through one HPCC++ flow, writing CSV to `out` and bad
/// lines to `err`.
pub fn replay(
    params: HpccParams,
    input: impl BufRead,
    mut out: impl Write,
    mut err: impl Write,
) -> io::Result<ReplaySummary> {
    let mut flow = Hpcc::new(params);
    let mut s = ReplaySummary::default();
    writeln!(out, "event,U,W,Wc,rate_bps,inc_stage")?;
    for (n, line) in input.lines().enumerate() {
        let line = line?;
        match parse_line(&line) {
            Ok(None) => {}
            Ok(Some(e)) => {
                flow.new_ack(e.ack_seq, e.snd_nxt, &e.hops);
                s.events += 1;
                let c = flow.core();
                writeln!(
                    out,
                    "{},{},{},{},{},{}",
                    s.events,
                    c.u(),
                    c.w(),
                    c.wc(),
                    c.rate_bps(),
                    c.inc_stage()
                )?;
            }
            Err(e) => {
                s.bad_lines += 1;
                writeln!(err, "line {}: {e}; skipped", n + 1)?;
            }
        }
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ReplayArgs,
    }

    fn args(extra: &[&str]) -> ReplayArgs {
        let mut v = vec!["replay", "trace.txt"];
        v.extend_from_slice(extra);
        Cli::parse_from(v).args
    }

    #[test]
    fn defaults_are_the_issue_s() {
        let p = args(&[]).params().unwrap();
        assert_eq!(p.t_ns, 5000);
        assert_eq!(p.eta, 0.95);
        assert_eq!(p.max_stage, 5);
        assert_eq!(p.w_init, 62_500.0, "100 Gb/s x 5 us");
        assert!((p.w_ai - 62_500.0 * 0.05 / 16.0).abs() < 1e-9);
        assert_eq!(p.w_min, 1024.0);
        let p = args(&["--w-init", "1e5", "--w-ai", "80", "--w-min", "2048"])
            .params()
            .unwrap();
        assert_eq!((p.w_init, p.w_ai, p.w_min), (1e5, 80.0, 2048.0));
    }

    #[test]
    fn bad_parameters_are_named() {
        let e = args(&["--eta", "2"]).params().unwrap_err();
        assert_eq!(e.to_string(), "eta must be in (0, 1], got 2");
        assert!(args(&["--n", "0"]).params().is_err());
        assert!(args(&["--w-min", "1e9"]).params().is_err());
    }

    #[test]
    fn prints_one_row_per_event_and_reports_bad_lines() {
        let trace = "# a hand-written trace\n\
                     0 100 1 1000 0 0 1000 1 1\n\
                     this is not an event\n\
                     \n\
                     130 200 1 6000 62500 0 1000 1 1\n\
                     1 2 1 1 2 3\n";
        let p = args(&[]).params().unwrap();
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let s = replay(p, trace.as_bytes(), &mut out, &mut err).unwrap();
        assert_eq!(
            s,
            ReplaySummary {
                events: 2,
                bad_lines: 2
            }
        );
        let out = String::from_utf8(out).unwrap();
        let rows: Vec<&str> = out.lines().collect();
        assert_eq!(rows[0], "event,U,W,Wc,rate_bps,inc_stage");
        assert_eq!(rows[1], "1,1,62500,62500,100000000000,0");
        // dt = 5,000 = T, 62,500 B: txRate/B = 1, U = 1 >= eta: W = 62,500 x
        // 0.95 + 195.3125 = 59,570.3125; committed (130 > 100).
        assert_eq!(rows[2], "2,1,59570.3125,59570.3125,95312500000,0");
        let err = String::from_utf8(err).unwrap();
        assert!(
            err.contains("line 3: field 1 (ack_seq) is not a decimal"),
            "{err}"
        );
        assert!(
            err.contains("line 6: nhop 1 announces 9 fields, the line has 6"),
            "{err}"
        );
    }
}
