//! `dataplane --config FILE.toml`: brings up the testbed a configuration
//! describes on DPDK (the loopback testbed or the incast testbed), runs it
//! and prints what it measured.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

use dataplane::config::{Config, Plan};
use dataplane::dpdk::Eal;
use dataplane::incast::{self, IncastConfig};
use dataplane::service::ServiceConfig;
use dataplane::testbed::{Loopback, LoopbackConfig};
use transport::rc::WrOp;

#[derive(Parser)]
#[command(
    name = "dataplane",
    version,
    about = "The software RDMA NIC's DPDK dataplane"
)]
struct Cli {
    /// Configuration file (see configs/*.toml) of the testbed to run.
    #[arg(long)]
    config: Option<PathBuf>,
    /// DPDK file prefix [default: rnic-PID, unique per process].
    #[arg(long)]
    file_prefix: Option<String>,
    /// Only read and check the whole configuration (sizes, MTU, congestion
    /// control and its parameters, faults, sockets, ports), then exit.
    #[arg(long)]
    check: bool,
    /// While running, keep this file rewritten with per-port, per-QP (and
    /// switch) counters; read it with `dataplane stats FILE`.
    #[arg(long)]
    stats: Option<PathBuf>,
    /// Serve applications (the verbs API) on the [service] control socket
    /// until SIGINT or SIGTERM, instead of running the loopback testbed's
    /// own WRITEs and READs.
    #[arg(long)]
    serve: bool,
    /// Control socket to serve on [default: `socket` of [service]].
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Run the dataplane's lcore on these CPUs only (a list such as `1`,
    /// `2-3` or `0,2`) instead of floating over every online CPU, so that
    /// it has a core of its own; refused when the config's EAL arguments
    /// name lcores themselves. With several lcores (`--lcores`), lcore k
    /// runs on the k-th CPU of the list (wrapping around). The control
    /// thread then runs on the process's other CPUs, if it has any.
    #[arg(long, value_name = "LIST")]
    cpus: Option<String>,
    /// Dataplane lcores for --serve, each running its share of the
    /// devices (device i on lcore i % N; with --qp-shards, its share of
    /// the devices' shards) [default: `lcores` of [service], else 1].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=i64::from(dataplane::config::MAX_LCORES)))]
    lcores: Option<u32>,
    /// Engines each device's QPs are sharded over for --serve, each on its
    /// own queue pair of the device's port (shard k of device i on lcore
    /// (i * N + k) % lcores) [default: `qp_shards` of [service], else 1].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=i64::from(transport::rc::MAX_SHARDS)))]
    qp_shards: Option<u32>,
    #[command(subcommand)]
    cmd: Option<Cmd>,
}

#[derive(clap::Subcommand)]
enum Cmd {
    /// Print the counters of a running dataplane: from the file it
    /// writes with --stats, or asked over its control socket.
    Stats {
        /// The file given to --stats.
        file: Option<PathBuf>,
        /// Ask the daemon serving on this socket instead.
        #[arg(long, conflicts_with = "file")]
        socket: Option<PathBuf>,
    },
}

/// Serves applications on the configured devices (or the loopback
/// testbed's two hosts) until SIGINT or SIGTERM.
fn serve(
    eal: &Eal,
    mut cfg: ServiceConfig,
    ports: Option<[u16; 2]>,
    socket: Option<PathBuf>,
    stats: Option<&std::path::Path>,
    cpus: &[usize],
    allowed: Option<&nix::sched::CpuSet>,
) -> Result<(), String> {
    use dataplane::service::{HostSpec, Service};
    use dataplane::stats::Snapshot;
    use std::sync::atomic::AtomicBool;
    use std::sync::{Arc, Mutex};
    if let Some(s) = socket {
        cfg.socket = s;
    }
    let hosts: Vec<HostSpec> = if cfg.devices.is_empty() {
        // A ring pair made here carries only what the two hosts send.
        let internal = ports.is_none();
        let (pa, pb) = match ports {
            Some([a, b]) => (a, b),
            None => {
                let queues = u16::try_from(cfg.qp_shards.max(1)).unwrap_or(u16::MAX);
                dataplane::dpdk::ring_pair_queues(eal, "service", 1024, queues)
                    .map_err(|e| e.to_string())?
            }
        };
        [pa, pb]
            .iter()
            .enumerate()
            .map(|(i, &port)| HostSpec {
                name: format!("rnic{i}"),
                mac: dataplane::testbed::host_mac(i as u8),
                ip: dataplane::testbed::host_ip(i as u8),
                port,
                vlan: None,
                internal,
            })
            .collect()
    } else {
        cfg.devices.clone()
    };
    let mut shards =
        Service::shards(eal, cfg.clone(), &hosts, cfg.lcores).map_err(|e| e.to_string())?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).map_err(|e| format!("signal {sig}: {e}"))?;
    }
    for h in &hosts {
        let vlan = h
            .vlan
            .map(|t| format!(" vlan {} priority {}", t.vid, t.pcp))
            .unwrap_or_default();
        println!(
            "device {} ip {} mac {} port {}{vlan}",
            h.name, h.ip, h.mac, h.port
        );
    }
    if shards.len() > 1 || cfg.qp_shards > 1 {
        let pinned = if cpus.is_empty() {
            String::new()
        } else {
            format!(" on CPUs {cpus:?}")
        };
        let n = shards.len();
        match cfg.qp_shards {
            0 | 1 => println!("{n} dataplane lcores{pinned} (device i on lcore i % {n})"),
            k => println!(
                "{n} dataplane lcore(s){pinned}, each device's QPs sharded over {k} engines \
                 (device i's shard k on lcore (i * {k} + k) % {n})"
            ),
        }
    }
    println!(
        "serving on {} (stop with SIGINT or SIGTERM)",
        cfg.socket.display()
    );
    // Each lcore leaves its part of the counters here; the file holds
    // them all.
    let parts: Mutex<Vec<Option<Snapshot>>> = Mutex::new(vec![None; shards.len()]);
    dataplane::service::serve(&mut shards, &stop, cpus, allowed, |k, svc| {
        if let Some(path) = stats {
            let mut parts = parts.lock().unwrap_or_else(|p| p.into_inner());
            parts[k] = Some(svc.snapshot());
            let all = Snapshot::merge(parts.iter().flatten().cloned().collect());
            if let Err(e) = all.write(path) {
                eprintln!("dataplane: {}: {e}", path.display());
            }
        }
    })
    .map_err(|e| e.to_string())?;
    report_lost(
        &cfg.faults,
        shards[0].finish_lost().map_err(|e| e.to_string())?,
    );
    if let (Some((path, _)), Some((written, skipped))) =
        (&cfg.tap, shards[0].finish_tap().map_err(|e| e.to_string())?)
    {
        println!(
            "tap: {written} frames written to {} ({skipped} past the limit left out; bench decode reads it)",
            path.display()
        );
    }
    let c = Snapshot::merge(shards.iter().map(|s| s.snapshot()).collect())
        .service
        .unwrap_or_default();
    println!(
        "stopped: apps opened {} closed {}, WQEs posted {}, CQEs delivered {}, WQE errors {}",
        c.apps_opened, c.apps_closed, c.wqes_posted, c.cqes_delivered, c.wqe_errors
    );
    Ok(())
}

fn loopback(
    eal: &Eal,
    cfg: &LoopbackConfig,
    ports: Option<[u16; 2]>,
    sizes: &[u32],
    stats: Option<&std::path::Path>,
) -> Result<(), String> {
    let mut tb = match ports {
        Some([a, b]) => Loopback::on_ports(eal, cfg, a, b),
        None => Loopback::new(eal, cfg),
    }
    .map_err(|e| e.to_string())?;
    let t0 = std::time::Instant::now();
    while !tb.links_up() {
        if t0.elapsed().as_secs() > 30 {
            return Err("the testbed's links did not come up within 30 s".into());
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    if let Some(hf) = &cfg.faults {
        let f = hf.faults;
        println!(
            "faults on host {}'s port ({:?}): loss {} duplicate {} reorder {} corrupt {} delay {} ns, seed {}",
            hf.host, f.direction, f.loss, f.duplicate, f.reorder, f.corrupt, f.delay_ns, f.seed
        );
    }
    let write_stats = |tb: &Loopback| -> Result<(), String> {
        match stats {
            Some(path) => tb
                .snapshot()
                .write(path)
                .map_err(|e| format!("{}: {e}", path.display())),
            None => Ok(()),
        }
    };
    let t0 = tb.now();
    for (i, &len) in sizes.iter().enumerate() {
        for op in [WrOp::Write, WrOp::Read] {
            tb.verified_op(op, len, i as u8)
                .map_err(|e| e.to_string())?;
            println!("{op:?} {len} B: success, bytes verified");
            write_stats(&tb)?;
        }
    }
    let us = (tb.now() - t0) as f64 / 1e3;
    for _ in 0..1000 {
        tb.poll();
    }
    println!(
        "loopback: {} WRITEs and READs verified in {us:.0} us",
        2 * sizes.len()
    );
    write_stats(&tb)?;
    if let Some(path) = stats {
        println!("stats: {}", path.display());
    }
    if cfg.faults.is_some() {
        print!("{}", tb.snapshot().table());
    }
    report_lost(&cfg.faults, tb.finish_lost().map_err(|e| e.to_string())?);
    if let (Some(path), Some(frames)) = (&cfg.tap, tb.finish_tap().map_err(|e| e.to_string())?) {
        println!(
            "tap: {frames} frames written to {} (bench decode {} reads them)",
            path.display(),
            path.display()
        );
    }
    Ok(())
}

fn incast(
    eal: &Eal,
    runs: &[(String, IncastConfig)],
    seconds: f64,
    stats: Option<&std::path::Path>,
) -> Result<(), String> {
    for (name, cfg) in runs {
        if let Some(dir) = cfg
            .tap
            .as_ref()
            .and_then(|p| p.parent())
            .filter(|d| !d.as_os_str().is_empty())
        {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        let cfg = IncastConfig {
            stats: stats.map(|p| p.to_path_buf()),
            ..cfg.clone()
        };
        let r = incast::run(eal, &cfg, seconds).map_err(|e| e.to_string())?;
        println!(
            "{name:<10} queue p50/p95/p99/max = {:.1}/{:.1}/{:.1}/{:.1} KB  goodput {:.3} Gb/s  bottleneck utilization {:.3}  drops {}  retransmitted {}  WRITEs done {} failed {}",
            r.queue_p50 as f64 / 1e3,
            r.queue_p95 as f64 / 1e3,
            r.queue_p99 as f64 / 1e3,
            r.queue_max as f64 / 1e3,
            r.goodput_bps / 1e9,
            r.utilization,
            r.drops,
            r.retransmitted,
            r.completed,
            r.failed
        );
        if cfg.pfc {
            println!(
                "{name:<10} pfc: {} pause / {} resume frames to the senders, NICs held {:.1} ms in all, {} waits for an mbuf",
                r.pause_frames,
                r.resume_frames,
                r.host_paused_ns as f64 / 1e6,
                r.pfc_no_buffer
            );
        }
        if cfg.receiver_n {
            println!(
                "{name:<10} receiver-measured N: {} ACKs with N taken by the senders",
                r.flow_reports
            );
        }
        if cfg.int_response.is_some() {
            println!(
                "{name:<10} int responses: {} sent, {} taken by senders ({} stale), {} lost for want of an mbuf",
                r.int_responses, r.int_responses_taken, r.int_responses_stale, r.int_response_no_buffer
            );
        }
        if cfg.feedback_auth {
            println!(
                "{name:<10} authenticated feedback refused: {} bad MAC or token, {} not newer (replays), {} without a MAC",
                r.feedback_forged, r.feedback_replayed, r.feedback_unkeyed
            );
        }
        if cfg.relative_telemetry {
            println!(
                "{name:<10} relative telemetry: {} frames left the switch with relative load only",
                r.tlm_relative
            );
        }
        for (k, c) in r.classes.iter().enumerate() {
            println!(
                "{name:<10} class {k}: share {:.3}, sojourn p50/p99 {:.1}/{:.1} us{}",
                c.share,
                c.sojourn_p50_ns as f64 / 1e3,
                c.sojourn_p99_ns as f64 / 1e3,
                if cfg.int_sojourn {
                    " (senders read sojourn times)"
                } else {
                    ""
                }
            );
        }
    }
    Ok(())
}

/// Longest frame `replay` reads whole: a 9000-byte jumbo frame with its
/// Ethernet header and an 802.1Q tag.
const REPLAY_FRAME: usize = 9022;

fn replay(eal: &Eal, port: u16, out_port: Option<u16>) -> Result<(), String> {
    use dataplane::dpdk::{Mempool, Port};
    use nic::FramePort;
    // One segment per frame for any capture up to jumbo frames (a path
    // MTU of 4096 makes frames longer than a default mbuf).
    let pool = std::sync::Arc::new(
        Mempool::with_frames(eal, "replay_pool", 4095, 0, REPLAY_FRAME)
            .map_err(|e| e.to_string())?,
    );
    let mut port = Port::start(eal, port, &pool, 1024).map_err(|e| e.to_string())?;
    let mut out = match out_port {
        Some(p) => Some(Port::start(eal, p, &pool, 1024).map_err(|e| e.to_string())?),
        None => None,
    };
    let (mut frames, mut roce, mut icrc_bad, mut errors, mut idle) = (0u64, 0u64, 0u64, 0u64, 0u32);
    let mut rx = Vec::new();
    let mut pending = Vec::new();
    while idle < 100_000 {
        rx.clear();
        if port.rx_burst(0, &mut rx, 32) == 0 {
            idle += 1;
        } else {
            idle = 0;
        }
        for m in rx.drain(..) {
            frames += 1;
            match transport::wire::Packet::parse_unverified(m.data()) {
                Ok(p) => {
                    roce += 1;
                    icrc_bad += u64::from(!p.icrc_ok());
                }
                Err(_) => errors += 1,
            }
            pending.push(m);
        }
        match out.as_mut() {
            Some(o) => {
                while !pending.is_empty() {
                    o.tx_burst(0, &mut pending);
                }
            }
            None => pending.clear(),
        }
    }
    println!("replay: frames={frames} roce={roce} icrc_bad={icrc_bad} errors={errors}");
    drop(out);
    drop(port);
    drop(pool);
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(Cmd::Stats { file, socket }) = &cli.cmd {
        let snap = match (file, socket) {
            (Some(f), None) => dataplane::stats::Snapshot::read(f).map_err(|e| e.to_string()),
            (None, Some(s)) => dataplane::service::query_stats(s).map_err(|e| e.to_string()),
            _ => Err("give the --stats FILE of a running dataplane, or --socket PATH".into()),
        };
        return match snap {
            Ok(s) => {
                print!("{}", s.table());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("dataplane stats: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let Some(config) = &cli.config else {
        eprintln!("dataplane: give --config FILE (a testbed to run) or `stats FILE`");
        return ExitCode::from(2);
    };
    let checked = match Config::load(config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("dataplane: {e}");
            return ExitCode::from(2);
        }
    };
    let service = match &checked.plan {
        Plan::Loopback { service, .. } => service.clone(),
        _ => None,
    };
    if cli.serve && service.is_none() {
        eprintln!(
            "dataplane: {}: --serve needs a [loopback] and a [service] section",
            config.display()
        );
        return ExitCode::from(2);
    }
    if let Some(s) = cli.socket.as_deref() {
        if let Err(e) = dataplane::config::check_socket_arg(s) {
            eprintln!("dataplane: {e}");
            return ExitCode::from(2);
        }
    }
    if cli.check {
        println!("{}: ok", config.display());
        return ExitCode::SUCCESS;
    }
    let mut args = checked.eal_args.clone();
    match lcore_placement(&args, cli.cpus.as_deref()) {
        Ok(Some(lcores)) => args.push(lcores),
        Ok(None) => {}
        Err(e) => {
            eprintln!("dataplane: {}: {e}", config.display());
            return ExitCode::from(2);
        }
    }
    let prefix = cli
        .file_prefix
        .unwrap_or_else(|| format!("rnic-{}", std::process::id()));
    args.push(format!("--file-prefix={prefix}"));
    // The CPUs the process may use, before the EAL pins this thread (its
    // main lcore): the control thread's are those no lcore takes.
    let allowed = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).ok();
    let eal = match Eal::init(&args) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("dataplane: {e}");
            return ExitCode::FAILURE;
        }
    };
    let r = match checked.plan {
        Plan::Loopback { ports, .. } if cli.serve => {
            let mut cfg = *service.expect("checked");
            if let Some(n) = cli.lcores {
                cfg.lcores = n as usize;
            }
            if let Some(n) = cli.qp_shards {
                cfg.qp_shards = n as usize;
            }
            let cpus = cli.cpus.as_deref().and_then(cpu_list).unwrap_or_default();
            serve(
                &eal,
                cfg,
                ports,
                cli.socket.clone(),
                cli.stats.as_deref(),
                &cpus,
                allowed.as_ref(),
            )
        }
        Plan::Loopback {
            cfg, ports, sizes, ..
        } => loopback(&eal, &cfg, ports, &sizes, cli.stats.as_deref()),
        Plan::Incast { runs, seconds } => incast(&eal, &runs, seconds, cli.stats.as_deref()),
        Plan::Replay { port, out_port } => replay(&eal, port, out_port),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dataplane: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Where the dataplane's lcore runs. With `--cpus LIST`, on those CPUs.
/// Otherwise, unless the config's EAL arguments name the lcores (`-l`,
/// `-c`, `--lcores`), the EAL would pin its main lcore to CPU 0, where it
/// competes with whatever else the machine pins there; instead it floats
/// over every online CPU and the scheduler places it.
fn lcore_placement(args: &[String], cpus: Option<&str>) -> Result<Option<String>, String> {
    let named = args.iter().any(|a| {
        a == "-l" || a == "-c" || a.starts_with("--lcores") || (a.starts_with("-l") && a.len() > 2)
    });
    if let Some(list) = cpus {
        if named {
            return Err(format!(
                "--cpus {list}: the config's [eal] args name the lcores already; drop one of the two"
            ));
        }
        if !is_cpu_list(list) {
            return Err(format!(
                "--cpus {list:?}: not a CPU list (numbers, ranges a-b, separated by commas)"
            ));
        }
        return Ok(Some(format!("--lcores=0@({list})")));
    }
    if named {
        return Ok(None);
    }
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| is_cpu_list(s));
    Ok(online.map(|o| format!("--lcores=0@({o})")))
}

/// A CPU list as the kernel prints one: `0`, `0-3`, `0,2-3`.
fn is_cpu_list(s: &str) -> bool {
    cpu_list(s).is_some()
}

/// The CPUs of a list as the kernel prints one, in its order.
fn cpu_list(s: &str) -> Option<Vec<usize>> {
    let num = |x: &str| {
        (!x.is_empty() && x.len() < 5 && x.bytes().all(|b| b.is_ascii_digit()))
            .then(|| x.parse::<usize>().ok())
            .flatten()
    };
    let mut cpus = Vec::new();
    for part in s.split(',') {
        match part.split_once('-') {
            None => cpus.push(num(part)?),
            Some((a, b)) => cpus.extend(num(a)?..=num(b)?),
        }
    }
    (!cpus.is_empty()).then_some(cpus)
}

/// Says where the frames the faults lost were recorded, and how many.
fn report_lost(faults: &Option<dataplane::testbed::HostFaults>, written: Option<u64>) {
    if let (Some(path), Some(n)) = (faults.as_ref().and_then(|f| f.lost_pcap.as_ref()), written) {
        println!(
            "lost: {n} frames the faults lost written to {}",
            path.display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_as_the_kernel_prints_them() {
        for ok in ["0", "1", "0-1", "0,2-3", "12"] {
            assert!(is_cpu_list(ok), "{ok}");
        }
        for bad in ["", "a", "0-", "-1", "1,,2", "0-1-2", "1 ", "123456", "3-1"] {
            assert!(!is_cpu_list(bad), "{bad:?}");
        }
        assert_eq!(cpu_list("1,0"), Some(vec![1, 0]), "in the list's order");
        assert_eq!(cpu_list("0,2-4"), Some(vec![0, 2, 3, 4]));
    }

    #[test]
    fn cpus_pin_the_lcore_unless_the_config_names_lcores() {
        let plain = vec!["--no-huge".to_string()];
        assert_eq!(
            lcore_placement(&plain, Some("1")),
            Ok(Some("--lcores=0@(1)".into()))
        );
        let named = vec!["-l".to_string(), "0".to_string()];
        let e = lcore_placement(&named, Some("1")).unwrap_err();
        assert!(e.contains("--cpus 1"), "{e}");
        assert_eq!(lcore_placement(&named, None), Ok(None));
        assert!(lcore_placement(&plain, Some("x"))
            .unwrap_err()
            .contains("\"x\""));
    }
}
