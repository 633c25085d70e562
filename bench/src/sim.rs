//! `bench sim`: runs a simulator scenario under one or every congestion
//! controller (same seed, same workload) and prints one table; writes the
//! results as JSON and a flow's telemetry trace when asked.

use std::fmt::Write as _;
use std::path::PathBuf;

use netsim::sim::scenario::{Overrides, ScenarioSpec, BUILTIN};
use netsim::sim::SimResult;

/// Flags of `bench sim`.
#[derive(Debug, Clone, clap::Args)]
pub struct SimArgs {
    /// Scenario: incast, dumbbell, converge, fb_hadoop, websearch,
    /// paper-fig11a, paper-incast, fat-incast, qos-2class or hot-core
    /// (configs/sim/NAME.toml, built in).
    #[arg(long, default_value = "incast")]
    pub scenario: String,
    /// A scenario file to use instead of the built-in one.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Congestion control: hpcc, hpcc-probe, hpcc-rx, dcqcn, none, a
    /// comma-separated list of them, or all.
    #[arg(long, default_value = "all")]
    pub cc: String,
    /// Seed of the workload and of the switches' ECN marking.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Simulated time in microseconds [default: the scenario's].
    #[arg(long)]
    pub duration_us: Option<u64>,
    /// After the duration, run up to this many more microseconds while
    /// flows that started are unfinished (the rest is reported as
    /// unfinished) [default: the scenario's drain_us].
    #[arg(long)]
    pub drain_us: Option<u64>,
    /// HPCC++ maxStage (multiplicative-increase stages before additive
    /// increase) [default: the scenario's max_stage]; the HPCC paper's text
    /// says 5, the authors' results page ran 0.
    #[arg(long)]
    pub max_stage: Option<u32>,
    /// Incast senders [default: the scenario's].
    #[arg(long)]
    pub senders: Option<usize>,
    /// Load of the Poisson workloads, 0..1 [default: the scenario's].
    #[arg(long)]
    pub load: Option<f64>,
    /// Switch buffers: `pfc` (lossless: a shared buffer per switch with
    /// priority flow control) or `drop-tail` (per port) [default: the
    /// scenario's `pfc` key].
    #[arg(long, value_parser = ["pfc", "drop-tail"])]
    pub buffer: Option<String>,
    /// Write every run's results to this JSON file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write an SVG plot of the queue and per-flow rates over time.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Record flow ID's telemetry events (hpcc-replay format) to FILE; with
    /// --cc all, one file per controller (FILE.CC).
    #[arg(long, num_args = 2, value_names = ["ID", "FILE"])]
    pub trace_flow: Option<Vec<String>>,
    /// Print the switches' egress ports by tier (tor->agg, agg->core, ...):
    /// utilization (mean, lowest, highest), deepest queue, drops, PAUSE
    /// frames received and time held by PFC, and
    /// the busiest ports, so that a hot spot or an uneven ECMP split shows
    /// (the JSON has every port either way).
    #[arg(long)]
    pub port_stats: bool,
    /// Print the FCT slowdown by groups of 5% of the finished flows sorted
    /// by size, as the HPCC authors' fct_analysis.py does (each group's
    /// largest size, p50/p95/p99).
    #[arg(long)]
    pub fct_groups: bool,
    /// Switch INT responses (HPCC++ draft-00 s6.3): `on` makes congested
    /// switches answer subscribed data packets' senders directly, `off`
    /// turns them off, `both` runs each controller without and then with
    /// them (the second labelled CC+intresp), side by side in the table,
    /// JSON and plot [default: the scenario's `int_response` key]
    #[arg(long, value_parser = ["on", "off", "both"])]
    pub int_response: Option<String>,
    /// Receiver-measured N (HPCC++ draft-00 s6.2): `on` makes receivers
    /// whose last hop is the bottleneck report how many flows cross it and
    /// senders take W_AI from it, `off` uses the scenario's fixed N, `both`
    /// runs each controller both ways (the second labelled CC+rxn)
    /// [default: the scenario's `receiver_n` key]
    #[arg(long, value_parser = ["on", "off", "both"])]
    pub receiver_n: Option<String>,
    /// Sojourn time (HPCC++ 2023 s9.3): `on` makes senders ask the switches
    /// for each packet's sojourn time (egress minus ingress) instead of the
    /// queue length, `off` for queue lengths, `both` runs each controller
    /// both ways (the second labelled CC+sojourn) [default: the scenario's
    /// `int_sojourn` key]
    #[arg(long, value_parser = ["on", "off", "both"])]
    pub sojourn: Option<String>,
    /// QoS classes at the switch ports (the scenario's `[qos]` section):
    /// `off` gives every port one FIFO, `both` runs each controller with
    /// one FIFO (labelled CC+fifo) and then with the classes [default: on
    /// when the scenario has `[qos]`]
    #[arg(long, value_parser = ["on", "off", "both"])]
    pub qos: Option<String>,
    /// Path choice from telemetry (HPCC++ 2023 s9.4): `on` lets each flow
    /// probe other UDP source ports (ECMP paths) and move to a clearly less
    /// loaded one, `off` keeps every flow on its hashed path, `both` runs
    /// each controller both ways (the second labelled CC+paths) [default:
    /// the scenario's `path_choice` key]
    #[arg(long, value_parser = ["on", "off", "both"])]
    pub paths: Option<String>,
    /// Authenticated feedback (HPCC++ draft-00 s9): `on` gives every
    /// connection a key and its ACKs a MAC over the echoed telemetry,
    /// `both` runs each controller without and with (the second labelled
    /// CC+auth) [default: the scenario's `feedback_auth` key]
    #[arg(long, value_parser = ["on", "off", "both"])]
    pub auth: Option<String>,
    /// Relative telemetry (HPCC++ 2023 s9.1): `on` makes every switch port
    /// facing a host a domain boundary that rewrites telemetry into
    /// relative load (no rates, bytes or switch ids leave the network),
    /// `both` runs each controller without and with (the second labelled
    /// CC+relative) [default: the scenario's `relative_boundary` key]
    #[arg(long, value_parser = ["on", "off", "both"])]
    pub relative: Option<String>,
}

/// One controller's run: its result and the wall-clock seconds it took.
pub struct Run {
    pub result: SimResult,
    pub wall_s: f64,
    pub trace: Vec<String>,
}

/// Runs the scenario for each controller asked for.
pub fn run(args: &SimArgs, mut progress: impl FnMut(&str)) -> Result<Vec<Run>, String> {
    let text = match &args.config {
        Some(p) => std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?,
        None => BUILTIN
            .iter()
            .find(|s| s.0 == args.scenario)
            .map(|s| s.1.to_string())
            .ok_or_else(|| {
                let names: Vec<&str> = BUILTIN.iter().map(|s| s.0).collect();
                format!(
                    "unknown --scenario {:?} ({})",
                    args.scenario,
                    names.join(", ")
                )
            })?,
    };
    let source = match &args.config {
        Some(p) => p.display().to_string(),
        None => format!("scenario {}", args.scenario),
    };
    let spec = ScenarioSpec::parse(&text).map_err(|e| format!("{source}: {e}"))?;
    let ccs: Vec<&str> = if args.cc == "all" {
        transport::rc::CcMode::NAMES.to_vec()
    } else {
        args.cc.split(',').map(str::trim).collect()
    };
    let trace_id = match &args.trace_flow {
        Some(v) => Some(
            v[0].parse::<usize>()
                .map_err(|_| format!("--trace-flow ID must be a number, got {:?}", v[0]))?,
        ),
        None => None,
    };
    let o = Overrides {
        seed: Some(args.seed),
        duration_us: args.duration_us,
        drain_us: args.drain_us,
        max_stage: args.max_stage,
        senders: args.senders,
        load: args.load,
        pfc: args.buffer.as_deref().map(|b| b == "pfc"),
        int_response: args.int_response.as_deref().map(|v| v == "on"),
        receiver_n: args.receiver_n.as_deref().map(|v| v == "on"),
        sojourn: args.sojourn.as_deref().map(|v| v == "on"),
        qos: args.qos.as_deref().map(|v| v != "off"),
        path_choice: args.paths.as_deref().map(|v| v == "on"),
        feedback_auth: args.auth.as_deref().map(|v| v == "on"),
        relative_boundary: args.relative.as_deref().map(|v| v == "on"),
    };
    // (controller, label, overrides): `both` of a mechanism's flag runs
    // each controller without and then with it, the label naming the
    // variant (off, on).
    type Set = fn(&mut Overrides, bool);
    let toggles: [(&Option<String>, [&str; 2], Set); 7] = [
        (&args.int_response, ["", "+intresp"], |o, v| {
            o.int_response = Some(v)
        }),
        (&args.receiver_n, ["", "+rxn"], |o, v| {
            o.receiver_n = Some(v)
        }),
        (&args.sojourn, ["", "+sojourn"], |o, v| o.sojourn = Some(v)),
        (&args.qos, ["+fifo", ""], |o, v| o.qos = Some(v)),
        (&args.paths, ["", "+paths"], |o, v| o.path_choice = Some(v)),
        (&args.auth, ["", "+auth"], |o, v| o.feedback_auth = Some(v)),
        (&args.relative, ["", "+relative"], |o, v| {
            o.relative_boundary = Some(v)
        }),
    ];
    let mut plan: Vec<(&str, String, Overrides)> = ccs
        .iter()
        .map(|&name| (name, name.to_string(), o.clone()))
        .collect();
    for (flag, suffix, set) in toggles {
        if flag.as_deref() != Some("both") {
            continue;
        }
        plan = plan
            .into_iter()
            .flat_map(|(name, label, o)| {
                [false, true].map(|on| {
                    let mut o = o.clone();
                    set(&mut o, on);
                    (name, format!("{label}{}", suffix[usize::from(on)]), o)
                })
            })
            .collect();
    }
    let mut runs = Vec::new();
    for (cc_name, label, o) in plan {
        let name = label.as_str();
        let cc = spec.sim.cc(cc_name).map_err(|e| format!("--cc: {e}"))?;
        let mut built = spec.build(cc, &o).map_err(|e| format!("{source}: {e}"))?;
        if let Some(id) = trace_id {
            if id >= built.flows {
                return Err(format!(
                    "--trace-flow {id}: the workload has {} flows",
                    built.flows
                ));
            }
            built.sim.trace_flow(id);
        }
        let offered = built.offered.map_or(String::new(), |o| {
            format!(
                " (background load {:.3}, {} incasts: load {:.4})",
                o.background_load, o.incasts, o.incast_load
            )
        });
        progress(&format!(
            "{name}: {} hosts, {} flows{offered}",
            built.sim.host_count(),
            built.flows
        ));
        let t0 = std::time::Instant::now();
        built.sim.run();
        let wall_s = t0.elapsed().as_secs_f64();
        let result = built.sim.result(name);
        progress(&format!(
            "{name}: {} events in {wall_s:.2} s ({:.2} M events/s)",
            result.events,
            result.events as f64 / wall_s.max(1e-9) / 1e6
        ));
        runs.push(Run {
            result,
            wall_s,
            trace: built.sim.trace_lines().to_vec(),
        });
    }
    Ok(runs)
}

/// The table printed by `bench sim`.
pub fn table(runs: &[Run]) -> String {
    // Labels (CC and its variants, e.g. hpcc+auth+relative) set the width.
    let w = runs
        .iter()
        .map(|r| r.result.cc.len())
        .max()
        .unwrap_or(0)
        .max(11);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<w$} {:>9} {:>9} {:>9} {:>9} {:>6} {:>6} {:>8} {:>7} {:>7} {:>11}",
        "cc",
        "q_p50_KB",
        "q_p95_KB",
        "q_p99_KB",
        "q_max_KB",
        "util",
        "jain",
        "drops",
        "retx",
        "probe%",
        "flows_done"
    );
    for r in runs.iter().map(|r| &r.result) {
        let _ = writeln!(
            s,
            "{:<w$} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>6.3} {:>6.3} {:>8} {:>7} {:>7.3} {:>5}/{:<5}",
            r.cc,
            r.queue_p50_bytes as f64 / 1e3,
            r.queue_p95_bytes as f64 / 1e3,
            r.queue_p99_bytes as f64 / 1e3,
            r.queue_max_bytes as f64 / 1e3,
            r.utilization,
            r.jain_fairness,
            r.drops,
            r.retransmitted,
            r.probe_overhead * 100.0,
            r.flows_done,
            r.flows_total
        );
    }
    for r in runs.iter().map(|r| &r.result) {
        if r.first_burst_peak_bytes == 0 {
            continue;
        }
        let drained = r.first_burst_drained_ns.map_or("never".to_string(), |t| {
            format!("at {:.1} us", t as f64 / 1e3)
        });
        let _ = writeln!(
            s,
            "{:<w$} first burst: peak {:.1} KB, back to {} KB {drained}",
            r.cc,
            r.first_burst_peak_bytes as f64 / 1e3,
            netsim::sim::BURST_DRAINED_BYTES / 1024
        );
    }
    for r in runs.iter().map(|r| &r.result) {
        // From when on the flows share within Jain 0.99, to the end.
        let settled = r
            .jain_series
            .iter()
            .rposition(|&(_, j)| j < 0.99)
            .map_or(r.jain_series.first(), |i| r.jain_series.get(i + 1));
        if let (Some(&(t, _)), true) = (settled, r.jain_series.len() > 1) {
            let _ = writeln!(
                s,
                "{:<w$} Jain >= 0.99 from {:.0} us on",
                r.cc,
                t as f64 / 1e3
            );
        }
    }
    for r in runs.iter().map(|r| &r.result) {
        let p = &r.pfc;
        if p.pause_frames == 0 && p.hosts_paused == 0 {
            continue;
        }
        let _ = writeln!(
            s,
            "{:<w$} pfc: {} pause / {} resume frames; {} switch ports held {:.1} us, {} hosts held {:.1} us in all; HOL delay mean {:.2} us, max {:.1} us",
            r.cc,
            p.pause_frames,
            p.resume_frames,
            p.ports_paused,
            p.switch_paused_ns as f64 / 1e3,
            p.hosts_paused,
            p.host_paused_ns as f64 / 1e3,
            p.hol_mean_ns as f64 / 1e3,
            p.hol_max_ns as f64 / 1e3
        );
        if !p.storm_ports.is_empty() || p.stuck_drops > 0 {
            let longest = p.storm_ports.iter().map(|x| x.2).max().unwrap_or(0);
            let _ = writeln!(
                s,
                "{:<w$} PFC STORM: {} ports held without a break past storm_us (longest {:.1} us); stuck hosts refused {} frames",
                r.cc,
                p.storm_ports.len(),
                longest as f64 / 1e3,
                p.stuck_drops
            );
        }
    }
    for r in runs.iter().map(|r| &r.result) {
        for c in &r.classes {
            let _ = writeln!(
                s,
                "{:<w$} class {} (weight {}, {} flows): {:.1} Gb/s, share {:.3}; sojourn p50/p99/max {:.2}/{:.2}/{:.2} us; deepest queue {:.1} KB",
                r.cc,
                c.class,
                c.weight,
                c.flows,
                c.gbps,
                c.share,
                c.sojourn_p50_ns as f64 / 1e3,
                c.sojourn_p99_ns as f64 / 1e3,
                c.sojourn_max_ns as f64 / 1e3,
                c.max_qlen_bytes as f64 / 1e3
            );
        }
    }
    for r in runs.iter().map(|r| &r.result) {
        if let Some(f) = &r.feedback {
            let _ = writeln!(
                s,
                "{:<w$} feedback refused: {} forged, {} replayed, {} without a MAC",
                r.cc, f.forged, f.replayed, f.unkeyed
            );
        }
        if let Some(n) = r.relative_rewrites {
            let _ = writeln!(
                s,
                "{:<w$} relative telemetry: {n} frames left the network with relative load only",
                r.cc
            );
        }
    }
    for r in runs.iter().map(|r| &r.result) {
        if let Some(p) = &r.paths {
            let _ = writeln!(
                s,
                "{:<w$} paths: {} probes of other paths ({} answered), {} moves",
                r.cc, p.probes, p.answered, p.moves
            );
        }
    }
    for r in runs.iter().map(|r| &r.result) {
        if let Some(i) = &r.int_response {
            let _ = writeln!(
                s,
                "{:<w$} int responses: {} sent, {} taken by senders ({} stale), {} held back by the filter, {} without a free slot",
                r.cc, i.sent, i.taken, i.stale, i.suppressed, i.no_room
            );
        }
    }
    if runs
        .iter()
        .any(|r| r.result.slowdown.iter().any(|b| b.flows > 0))
    {
        let _ = writeln!(s, "FCT slowdown p50/p95/p99 by flow size:");
        let labels: Vec<String> = runs[0]
            .result
            .slowdown
            .iter()
            .map(|b| b.label.clone())
            .collect();
        let _ = write!(s, "{:<w$}", "cc");
        for l in &labels {
            let _ = write!(s, " {:>24}", l);
        }
        let _ = writeln!(s);
        for r in runs.iter().map(|r| &r.result) {
            let _ = write!(s, "{:<w$}", r.cc);
            for b in &r.slowdown {
                let cell = if b.flows == 0 {
                    "-".to_string()
                } else {
                    format!("{:.2}/{:.2}/{:.2} n={}", b.p50, b.p95, b.p99, b.flows)
                };
                let _ = write!(s, " {cell:>24}");
                if b.unfinished > 0 {
                    let _ = write!(s, " +{} unfinished", b.unfinished);
                }
            }
            let _ = writeln!(s);
        }
    }
    s
}

/// Busiest ports listed by `--port-stats`.
const HOT_PORTS: usize = 8;

/// The `--port-stats` report of each run: per tier, then the busiest ports.
pub fn port_table(runs: &[Run]) -> String {
    let mut s = String::new();
    for r in runs.iter().map(|r| &r.result) {
        let _ = writeln!(s, "switch ports of {} ({} ports):", r.cc, r.ports.len());
        let _ = writeln!(
            s,
            "  {:<12} {:>5} {:>9} {:>9} {:>9} {:>11} {:>8} {:>8} {:>9}",
            "tier",
            "ports",
            "util_mean",
            "util_min",
            "util_max",
            "max_q_KB",
            "drops",
            "pause_rx",
            "held_ms"
        );
        let mut tiers: Vec<&str> = r.ports.iter().map(|p| p.tier.as_str()).collect();
        tiers.sort_unstable();
        tiers.dedup();
        for t in tiers {
            let ps: Vec<_> = r.ports.iter().filter(|p| p.tier == t).collect();
            let u: Vec<f64> = ps.iter().map(|p| p.utilization).collect();
            let _ = writeln!(
                s,
                "  {:<12} {:>5} {:>9.3} {:>9.3} {:>9.3} {:>11.1} {:>8} {:>8} {:>9.3}",
                t,
                ps.len(),
                u.iter().sum::<f64>() / u.len().max(1) as f64,
                u.iter().copied().fold(f64::INFINITY, f64::min),
                u.iter().copied().fold(0.0, f64::max),
                ps.iter().map(|p| p.max_qlen_bytes).max().unwrap_or(0) as f64 / 1e3,
                ps.iter().map(|p| p.drops).sum::<u64>(),
                ps.iter().map(|p| p.pause_rx).sum::<u64>(),
                ps.iter().map(|p| p.paused_ns).sum::<u64>() as f64 / 1e6
            );
        }
        let mut hot: Vec<_> = r.ports.iter().collect();
        hot.sort_by(|a, b| b.utilization.total_cmp(&a.utilization));
        let _ = writeln!(s, "  busiest:");
        for p in hot.iter().take(HOT_PORTS) {
            let _ = writeln!(
                s,
                "    node {:>4} port {:>2} {:<12} util {:.3}  max queue {:.1} KB  drops {}",
                p.node,
                p.port,
                p.tier,
                p.utilization,
                p.max_qlen_bytes as f64 / 1e3,
                p.drops
            );
        }
    }
    s
}

/// The `--fct-groups` table: per controller, the slowdown of each 5% of
/// the finished flows by size.
pub fn group_table(runs: &[Run]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "FCT slowdown by 5% groups of the finished flows, by size (fct_analysis.py):"
    );
    let _ = write!(s, "{:>6} ", "from");
    for r in runs {
        let _ = write!(
            s,
            " {:>34}",
            format!("{}: max_size p50/p95/p99", r.result.cc)
        );
    }
    let _ = writeln!(s);
    let rows = runs
        .iter()
        .map(|r| r.result.count_groups.len())
        .max()
        .unwrap_or(0);
    for i in 0..rows {
        let from = runs
            .iter()
            .find_map(|r| r.result.count_groups.get(i).map(|g| g.from))
            .unwrap_or(0.0);
        let _ = write!(s, "{:>6.2} ", from);
        for r in runs {
            let cell = r.result.count_groups.get(i).map_or("-".to_string(), |g| {
                format!("{:>9} {:.2}/{:.2}/{:.2}", g.max_size, g.p50, g.p95, g.p99)
            });
            let _ = write!(s, " {cell:>34}");
        }
        let _ = writeln!(s);
    }
    s
}
