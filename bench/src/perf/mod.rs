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
//! - [`patience`]: waits that give up without reading the clock per poll;
//! - [`report`]: tables, histograms, ratios and JSON.

pub mod args;
pub mod baseline;
pub mod breakdown;
pub mod bw;
pub mod conn;
pub mod daemon;
pub mod lat;
pub mod patience;
pub mod report;
pub mod xcore;

use std::time::Instant;

pub use args::{PerfArgs, Test};

/// Runs one benchmark; the error names what went wrong.
pub fn run(test: Test, a: &PerfArgs) -> Result<(), String> {
    a.validate(test)?;
    let daemon = if a.loopback { daemon::ensure(a)? } else { None };
    let daemon_cpu = daemon.as_ref().and_then(daemon::Daemon::cpu);
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
        // Asked before the run's clock starts: a resting daemon takes up
        // to a few ms to answer.
        let before = conn.is_local().then(|| daemon::busy(a)).flatten();
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
        // What the run cost the daemon, when this process drives both
        // ends (the daemon's counters then hold only this run's WRs).
        let secs = started.elapsed().as_secs_f64();
        if let Some(line) = before
            .zip(daemon::busy(a))
            .and_then(|(b, e)| daemon::busy_line(b, e, secs))
        {
            println!("{line}");
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
        let ratios = compare(test, a, &mut conn, size, daemon_cpu)?;
        json.ratios(&ratios);
    }
    conn.finish()?;
    if let Some(path) = &a.out_json {
        json.write(path)?;
    }
    Ok(())
}

/// Messages per `--compare` round of a bandwidth test: `-n`, but at least
/// 1000 messages and 16 MiB, at most 100 000 messages (a round of small
/// messages must outlast the pipeline filling up, one of large ones stay
/// short).
fn bw_round_iters(iters: u64, size: u32) -> u64 {
    let enough = (16u64 << 20) / u64::from(size.max(1));
    iters.clamp(1000, 100_000).max(enough.min(100_000))
}

/// The floors of one latency round trip measured as one sample, as ours
/// is: the DPDK echo of the message's frames, the cross-core round trip
/// and the ICRC work, in a row between two clock reads; the median over
/// `iters` samples, ns. (Summing the three medians would count the cost
/// of the clock three times where ours counts it once.)
fn floors_rtt_ns(
    floor: &mut baseline::Dpdk,
    echo: &mut baseline::Echo,
    xcore: &mut xcore::CrossCore,
    icrc: &baseline::IcrcFloor,
    iters: u64,
) -> Result<f64, String> {
    xcore.awake(|x| {
        let mut v = patience::Samples::with_capacity(iters);
        for _ in 0..iters.max(1) {
            floor.echo_prepare(echo)?;
            v.time(|| {
                floor.echo_once(echo)?;
                x.round()?;
                icrc.round()
            })?;
        }
        Ok(v.median())
    })
}

/// `--compare`: A B A B rounds of ours and each baseline at one size;
/// prints and returns the per-round ratio summaries.
fn compare(
    test: Test,
    a: &PerfArgs,
    conn: &mut conn::Conn,
    size: u32,
    daemon_cpu: Option<usize>,
) -> Result<Vec<report::Ratio>, String> {
    if !conn.is_local() {
        return Err("--compare needs --loopback (both sides in this process)".into());
    }
    let mut floor = baseline::Dpdk::start(&conn.backend)?;
    let mut udp = baseline::Udp::new()?;
    if test.is_latency() {
        let iters = a.iterations(test).clamp(1, 1000);
        let (mut r_dpdk, mut r_udp, mut r_xcore) = (Vec::new(), Vec::new(), Vec::new());
        let mut rtts = Vec::new();
        let mut xcore = xcore::CrossCore::new(test.is_read(), size, daemon_cpu);
        let mut icrc = baseline::IcrcFloor::new(test.is_read(), size, conn.mtu);
        let (mut r_floors, mut r_over_floors) = (Vec::new(), Vec::new());
        let moved = if test.is_read() {
            "the READ's WQE to that core, one completion back"
        } else {
            "each message and its stamp to that core, the message back, both ways"
        };
        println!(
            " compare: {} rounds of {iters} iterations at {size} B, interleaved: ours, raw DPDK echo over {}, kernel UDP over loopback, the cross-core floor (a helper thread on the daemon's core: {moved}; no protocol), the ICRCs of a round trip's frames (each computed and checked, one core), and floors: one sample of all three in a row (echo + xcore + icrc), the least a dataplane on another core than the application can take here; ours/floors is what ours spends over that least. Every sample, ours and each floor's, reads the clock twice",
            a.rounds, conn.backend
        );
        let mut echo_frames = baseline::Echo::new(size, conn.mtu);
        for round in 0..a.rounds {
            // Round trips, ours as the engine sees them (not halved).
            let ours = lat::run(test, a, conn, size, iters, Instant::now(), None)?.typical_rtt_ns();
            let echo = floor.echo_rtt_ns(size, conn.mtu, iters)?;
            let u = udp.ping_pong_rtt_ns(size, iters)?;
            let x = xcore.rtt_ns(iters)?;
            let crc = icrc.round_trip_ns(iters)?;
            let floors = floors_rtt_ns(&mut floor, &mut echo_frames, &mut xcore, &icrc, iters)?;
            r_dpdk.push(ours / echo);
            r_udp.push(ours / u);
            r_xcore.push(ours / x);
            r_floors.push(floors / echo);
            r_over_floors.push(ours / floors);
            rtts.push(ours / 1e3);
            println!(
                "   round {round:>2}: ours rtt {:.2} us  dpdk-echo {:.2} us  udp {:.2} us  xcore {:.2} us  icrc {:.3} us  floors {:.2} us",
                ours / 1e3,
                echo / 1e3,
                u / 1e3,
                x / 1e3,
                crc / 1e3,
                floors / 1e3
            );
        }
        let ratios = vec![
            report::Ratio::of("ours/dpdk-echo", &r_dpdk),
            report::Ratio::of("ours/udp", &r_udp),
            report::Ratio::of("ours/xcore", &r_xcore),
            report::Ratio::of("floors/dpdk-echo", &r_floors),
            report::Ratio::of("ours/floors", &r_over_floors),
        ];
        println!("{}", report::Ratio::of("ours rtt", &rtts).as_figure("us"));
        for r in &ratios {
            println!("{r}");
        }
        return Ok(ratios);
    }
    let iters = bw_round_iters(a.iterations(test), size);
    let frames_per_msg = baseline::frames_of(size, conn.mtu).len() as u64;
    let payload = size.min(conn.mtu);
    let mut bytes_floor = baseline::ByteFloor::new(size, conn.mtu, conn.zero_copy_tx_min);
    let (mut r_fwd, mut r_pps, mut r_floor, mut r_udp) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut rates = Vec::new();
    println!(
        " compare: {} rounds of {iters} messages of {size} B, interleaved: ours, raw DPDK forwarding of the same frames over {}, the per-byte floor (one core: ICRC each side and the receive copy; the send copy too for packets under {}), kernel UDP over loopback",
        a.rounds,
        conn.backend,
        conn.zero_copy_tx_min
            .map_or("any size (the device copies every payload)".to_string(), |m| format!("{m} B (the device's zero-copy size)"))
    );
    for round in 0..a.rounds {
        let r = bw::run(test, a, conn, size, iters, Instant::now())?;
        let bytes = u64::from(size) * iters;
        let (fwd_bps, fwd_pps) = floor.forward(payload, iters * frames_per_msg)?;
        let floor_bps = bytes_floor.bps(conn.mtu, bytes)?;
        let u = udp.stream_bps(size, bytes)?;
        let ours_pps = r.msg_rate * frames_per_msg as f64;
        r_fwd.push(r.avg_bps / fwd_bps);
        r_pps.push(ours_pps / fwd_pps);
        r_floor.push(r.avg_bps / floor_bps);
        r_udp.push(r.avg_bps / u);
        rates.push(r.msg_rate / 1e6);
        println!(
            "   round {round:>2}: ours {:.3} Gb/s {:.3} Mpps  dpdk-forward {:.3} Gb/s {:.3} Mpps  byte-floor {:.3} Gb/s  udp {:.3} Gb/s",
            r.avg_bps / 1e9,
            ours_pps / 1e6,
            fwd_bps / 1e9,
            fwd_pps / 1e6,
            floor_bps / 1e9,
            u / 1e9
        );
    }
    let ratios = vec![
        report::Ratio::of("ours/dpdk-fwd", &r_fwd),
        report::Ratio::of("ours/dpdk-fwd-pps", &r_pps),
        report::Ratio::of("ours/byte-floor", &r_floor),
        report::Ratio::of("ours/udp", &r_udp),
    ];
    println!(
        "{}",
        report::Ratio::of("ours msg rate", &rates).as_figure("M/s")
    );
    for r in &ratios {
        println!("{r}");
    }
    Ok(ratios)
}
