//! perftest-style benchmarks through the verbs API against a running
//! daemon: `write-lat`, `read-lat`, `write-bw`, `read-bw` with perftest's
//! flags where they apply, its settings and connection blocks and its
//! result columns; `--compare` runs the baselines (a raw DPDK echo /
//! forwarding loop over the same port backend, kernel UDP over loopback)
//! interleaved with ours and prints per-round ratios.
//!
//! - [`args`]: the flags;
//! - [`conn`]: devices, regions, QPs and the endpoint exchange;
//! - [`lat`], [`bw`]: our measurements;
//! - [`baseline`]: the raw DPDK and kernel UDP loops;
//! - [`breakdown`]: `--breakdown`, where a small message's time goes;
//! - [`daemon`]: the daemon `--loopback` starts when none serves;
//! - [`report`]: tables, histograms, ratios and JSON.

pub mod args;
pub mod baseline;
pub mod breakdown;
pub mod bw;
pub mod conn;
pub mod daemon;
pub mod lat;
pub mod report;

use std::time::Instant;

pub use args::{PerfArgs, Test};

/// Runs one benchmark; the error names what went wrong.
pub fn run(test: Test, a: &PerfArgs) -> Result<(), String> {
    a.validate(test)?;
    let _daemon = if a.loopback { daemon::ensure(a)? } else { None };
    let mut conn = conn::Conn::establish(test, a)?;
    report::settings(test, a, &conn);
    report::connection(&conn);
    let sizes = a.sizes(test);
    let mut json = report::Json::new(test, a, &conn);
    if test.is_latency() {
        report::lat_header(a);
    } else {
        report::bw_header(a);
    }
    for &size in &sizes {
        let started = Instant::now();
        if test.is_latency() {
            let r = lat::run(test, a, &mut conn, size, a.iterations(test), started, None)?;
            report::lat_row(a, &r);
            json.lat(&r);
        } else {
            let r = bw::run(test, a, &mut conn, size, a.iterations(test), started)?;
            report::bw_row(a, &r);
            json.bw(&r);
        }
    }
    if a.breakdown {
        let size = *sizes.last().expect("at least one size");
        let iters = a.iterations(test).min(100_000);
        let (rows, traced) = breakdown::run(test, a, &mut conn, size, iters)?;
        breakdown::print(test, size, &rows);
        println!(
            " traced run: median {:.0} ns ({} iterations); the untraced one above is t_typical",
            traced, iters
        );
        json.breakdown(&rows);
    }
    if a.compare {
        let size = *sizes.last().expect("at least one size");
        let ratios = compare(test, a, &mut conn, size)?;
        json.ratios(&ratios);
    }
    conn.finish()?;
    if let Some(path) = &a.out_json {
        json.write(path)?;
    }
    Ok(())
}

/// `--compare`: A B A B rounds of ours and each baseline at one size;
/// prints and returns the per-round ratio summaries.
fn compare(
    test: Test,
    a: &PerfArgs,
    conn: &mut conn::Conn,
    size: u32,
) -> Result<Vec<report::Ratio>, String> {
    if !conn.is_local() {
        return Err("--compare needs --loopback (both sides in this process)".into());
    }
    let mut floor = baseline::Dpdk::start(&conn.backend)?;
    let mut udp = baseline::Udp::new()?;
    let iters = a.iterations(test).clamp(1, 1000);
    let (mut r_dpdk, mut r_udp) = (Vec::new(), Vec::new());
    println!(
        " compare: {} rounds of {} iterations at {size} B, interleaved: ours, raw DPDK {} over {}, kernel UDP over loopback",
        a.rounds,
        iters,
        if test.is_latency() { "echo" } else { "forwarding" },
        conn.backend
    );
    for round in 0..a.rounds {
        let t0 = Instant::now();
        if test.is_latency() {
            // Round trips, ours as the engine sees them (not halved).
            let ours = lat::run(test, a, conn, size, iters, t0, None)?.typical_rtt_ns();
            let echo = floor.echo_rtt_ns(size, conn.mtu, iters)?;
            let u = udp.ping_pong_rtt_ns(size, iters)?;
            r_dpdk.push(ours / echo);
            r_udp.push(ours / u);
            println!(
                "   round {round:>2}: ours rtt {:.2} us  dpdk-echo {:.2} us  udp {:.2} us",
                ours / 1e3,
                echo / 1e3,
                u / 1e3
            );
        } else {
            let ours = bw::run(test, a, conn, size, iters, t0)?.avg_bps;
            let fwd = floor.forward_bps(conn.mtu, u64::from(size) * iters)?;
            let u = udp.stream_bps(size, u64::from(size) * iters)?;
            r_dpdk.push(ours / fwd);
            r_udp.push(ours / u);
            println!(
                "   round {round:>2}: ours {:.3} Gb/s  dpdk-forward {:.3} Gb/s  udp {:.3} Gb/s",
                ours / 1e9,
                fwd / 1e9,
                u / 1e9
            );
        }
    }
    let ratios = vec![
        report::Ratio::of("ours/dpdk-echo", &r_dpdk),
        report::Ratio::of("ours/udp", &r_udp),
    ];
    for r in &ratios {
        println!("{r}");
    }
    Ok(ratios)
}
