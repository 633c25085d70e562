//! `dataplane --config FILE.toml`: brings up the testbed a configuration
//! describes on DPDK (the loopback testbed or the incast testbed), runs it
//! and prints what it measured.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use serde::Deserialize;

use dataplane::dpdk::Eal;
use dataplane::incast::{self, IncastConfig};
use dataplane::testbed::{Loopback, LoopbackConfig};
use transport::rc::{CcMode, PathMtu, WrOp};

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
    /// Only read and check the configuration, then exit.
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    eal: EalSection,
    loopback: Option<LoopbackSection>,
    incast: Option<IncastSection>,
    replay: Option<ReplaySection>,
    service: Option<ServiceSection>,
}

/// The application service of `--serve` (loopback testbed: devices rnic0
/// and rnic1, one per host).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ServiceSection {
    /// The control socket applications connect to.
    socket: PathBuf,
    /// Largest shared segment an application may ask for [default: 1 GiB].
    max_shm_bytes: Option<u64>,
    /// Try hugepage-backed segments first [default: true].
    hugepages: Option<bool>,
    /// Congestion control of every QP: hpcc, hpcc-probe, hpcc-rx, dcqcn,
    /// none [default: none].
    cc: Option<String>,
    /// Line rate the engines pace at, Gb/s [default: 10].
    line_gbps: Option<f64>,
}

/// Reads every frame a port receives (a net_pcap port replaying a capture)
/// until it stays idle, decodes each, and forwards it to `out_port` (a
/// net_pcap port writing a capture, say).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplaySection {
    port: u16,
    out_port: Option<u16>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EalSection {
    args: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LoopbackSection {
    /// Two existing ports (from vdevs or PCI devices in [eal]) instead of a
    /// net_ring pair.
    ports: Option<[u16; 2]>,
    /// Mbufs in the pool both ports share [default: 4095].
    mbufs: Option<u32>,
    /// RX/TX queues per port, up to what the device offers (RSS when it
    /// hashes UDP) [default: 1].
    queues: Option<u16>,
    mem_bytes: usize,
    mtu: u32,
    sizes: Vec<u32>,
    tap: Option<PathBuf>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct IncastSection {
    /// Mirror the bottleneck port to this pcap (one file per controller:
    /// the controller's name is appended).
    tap: Option<PathBuf>,
    /// Mbufs in the pool [default: 16383; the switch holds queued frames
    /// in mbufs, so at least buffer_bytes / 1 KiB x senders].
    mbufs: Option<u32>,
    senders: usize,
    host_gbps: f64,
    bottleneck_gbps: f64,
    buffer_bytes: u64,
    base_rtt_us: u64,
    mtu: u32,
    message_bytes: u32,
    depth: usize,
    seconds: f64,
    cc: Vec<String>,
}

fn mtu(b: u32) -> Result<PathMtu, String> {
    PathMtu::from_bytes(b).ok_or(format!("mtu {b} is not 256, 512, 1024, 2048 or 4096"))
}

/// The congestion control a config names; probes time out after three
/// base RTTs.
fn cc_mode(name: &str, base_rtt_ns: u64, section: &str) -> Result<CcMode, String> {
    Ok(match name {
        "hpcc" => CcMode::HpccInband { maxhop: 3 },
        "hpcc-probe" => CcMode::HpccProbe {
            maxhop: 3,
            timeout_ns: 3 * base_rtt_ns,
        },
        "hpcc-rx" => CcMode::RxHpcc { maxhop: 3 },
        "dcqcn" => CcMode::Dcqcn,
        "none" => CcMode::None,
        other => {
            return Err(format!(
                "unknown cc {other:?} in {section} (hpcc, hpcc-probe, hpcc-rx, dcqcn, none)"
            ))
        }
    })
}

/// Serves applications on the loopback testbed's two hosts until SIGINT
/// or SIGTERM.
fn serve(
    eal: &Eal,
    l: &LoopbackSection,
    s: &ServiceSection,
    socket: Option<PathBuf>,
    stats: Option<&std::path::Path>,
) -> Result<(), String> {
    use dataplane::service::{HostSpec, Service, ServiceConfig};
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;
    let (pa, pb) = match l.ports {
        Some([a, b]) => (a, b),
        None => dataplane::dpdk::ring_pair(eal, "service", 1024).map_err(|e| e.to_string())?,
    };
    let cfg = ServiceConfig {
        socket: socket.unwrap_or_else(|| s.socket.clone()),
        max_mtu: mtu(l.mtu)?,
        mbufs: l.mbufs.unwrap_or(LoopbackConfig::default().mbufs),
        line_rate_bps: (s.line_gbps.unwrap_or(10.0) * 1e9) as u64,
        max_shm_bytes: s.max_shm_bytes.unwrap_or(1 << 30),
        hugepages: s.hugepages.unwrap_or(true),
        cc: cc_mode(s.cc.as_deref().unwrap_or("none"), 10_000, "[service]")?,
        queues: l.queues.unwrap_or(1),
    };
    let hosts: Vec<HostSpec> = [pa, pb]
        .iter()
        .enumerate()
        .map(|(i, &port)| HostSpec {
            name: format!("rnic{i}"),
            mac: dataplane::testbed::host_mac(i as u8),
            ip: dataplane::testbed::host_ip(i as u8),
            port,
        })
        .collect();
    let mut svc = Service::new(eal, cfg.clone(), &hosts).map_err(|e| e.to_string())?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).map_err(|e| format!("signal {sig}: {e}"))?;
    }
    for h in &hosts {
        println!(
            "device {} ip {} mac {} port {}",
            h.name, h.ip, h.mac, h.port
        );
    }
    println!(
        "serving on {} (stop with SIGINT or SIGTERM)",
        cfg.socket.display()
    );
    svc.run(&stop, |svc| {
        if let Some(path) = stats {
            if let Err(e) = svc.snapshot().write(path) {
                eprintln!("dataplane: {}: {e}", path.display());
            }
        }
    })
    .map_err(|e| e.to_string())?;
    let c = svc.snapshot().service.unwrap_or_default();
    println!(
        "stopped: apps opened {} closed {}, WQEs posted {}, CQEs delivered {}, WQE errors {}",
        c.apps_opened, c.apps_closed, c.wqes_posted, c.cqes_delivered, c.wqe_errors
    );
    Ok(())
}

fn loopback(eal: &Eal, s: &LoopbackSection, stats: Option<&std::path::Path>) -> Result<(), String> {
    let defaults = LoopbackConfig::default();
    let cfg = LoopbackConfig {
        mem_bytes: s.mem_bytes,
        mtu: mtu(s.mtu)?,
        tap: s.tap.is_some(),
        mbufs: s.mbufs.unwrap_or(defaults.mbufs),
        queues: s.queues.unwrap_or(1),
        ..defaults
    };
    let mut tb = match s.ports {
        Some([a, b]) => Loopback::on_ports(eal, &cfg, a, b),
        None => Loopback::new(eal, &cfg),
    }
    .map_err(|e| e.to_string())?;
    let t0 = std::time::Instant::now();
    while !tb.links_up() {
        if t0.elapsed().as_secs() > 30 {
            return Err("the testbed's links did not come up within 30 s".into());
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let t0 = tb.now();
    for (i, &len) in s.sizes.iter().enumerate() {
        for op in [WrOp::Write, WrOp::Read] {
            tb.verified_op(op, len, i as u8)?;
            println!("{op:?} {len} B: success, bytes verified");
            if let Some(path) = stats {
                tb.snapshot()
                    .write(path)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
            }
        }
    }
    let us = (tb.now() - t0) as f64 / 1e3;
    for _ in 0..1000 {
        tb.poll();
    }
    println!(
        "loopback: {} WRITEs and READs verified in {us:.0} us",
        2 * s.sizes.len()
    );
    if let Some(path) = stats {
        tb.snapshot()
            .write(path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        println!("stats: {}", path.display());
    }
    if let (Some(path), Some(frames)) = (&s.tap, tb.tap.take()) {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        let mut w = nic::pcap::Writer::create(path).map_err(|e| e.to_string())?;
        for (i, f) in frames.iter().enumerate() {
            w.write(std::time::Duration::from_micros(i as u64), f)
                .map_err(|e| e.to_string())?;
        }
        w.finish().map_err(|e| e.to_string())?;
        println!(
            "tap: {} frames written to {} (bench decode {} reads them)",
            frames.len(),
            path.display(),
            path.display()
        );
    }
    Ok(())
}

fn incast(eal: &Eal, s: &IncastSection, stats: Option<&std::path::Path>) -> Result<(), String> {
    if let Some(dir) = s
        .tap
        .as_ref()
        .and_then(|p| p.parent())
        .filter(|d| !d.as_os_str().is_empty())
    {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    for (k, name) in s.cc.iter().enumerate() {
        let cc = cc_mode(name, s.base_rtt_us * 1000, "[incast]")?;
        let cfg = IncastConfig {
            senders: s.senders,
            host_bps: (s.host_gbps * 1e9) as u64,
            bottleneck_bps: (s.bottleneck_gbps * 1e9) as u64,
            buffer_bytes: s.buffer_bytes,
            cc,
            base_rtt_ns: s.base_rtt_us * 1000,
            mtu: mtu(s.mtu)?,
            message_bytes: s.message_bytes,
            depth: s.depth.max(1),
            ecn: (cc == CcMode::Dcqcn).then_some(netsim::switch::EcnConfig {
                kmin: s.buffer_bytes / 10,
                kmax: s.buffer_bytes / 2,
                pmax: 0.2,
            }),
            name: format!("incast{k}"),
            mbufs: s.mbufs.unwrap_or(16383),
            tap: s
                .tap
                .as_ref()
                .map(|p| PathBuf::from(format!("{}.{name}", p.display()))),
            stats: stats.map(|p| p.to_path_buf()),
        };
        let r = incast::run(eal, &cfg, s.seconds).map_err(|e| e.to_string())?;
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
    }
    Ok(())
}

fn replay(eal: &Eal, s: &ReplaySection) -> Result<(), String> {
    use dataplane::dpdk::{Mempool, Port};
    let pool = Mempool::new(eal, "replay_pool", 8191, 0).map_err(|e| e.to_string())?;
    let port = Port::start(eal, s.port, &pool, 1024).map_err(|e| e.to_string())?;
    let out = match s.out_port {
        Some(p) => Some(Port::start(eal, p, &pool, 1024).map_err(|e| e.to_string())?),
        None => None,
    };
    let (mut frames, mut roce, mut icrc_bad, mut errors, mut idle) = (0u64, 0u64, 0u64, 0u64, 0u32);
    let mut rx = Vec::new();
    let mut pending = Vec::new();
    while idle < 100_000 {
        rx.clear();
        if port.rx_burst(&mut rx) == 0 {
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
        match &out {
            Some(o) => {
                while !pending.is_empty() {
                    o.tx_burst(&mut pending);
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
            (Some(f), None) => dataplane::stats::Snapshot::read(f),
            (None, Some(s)) => dataplane::service::query_stats(s),
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
    let text = match std::fs::read_to_string(config) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("dataplane: {}: {e}", config.display());
            return ExitCode::from(2);
        }
    };
    let cfg: Config = match toml::from_str(&text) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("dataplane: {}: {e}", config.display());
            return ExitCode::from(2);
        }
    };
    let sections = [
        cfg.loopback.is_some(),
        cfg.incast.is_some(),
        cfg.replay.is_some(),
    ];
    if sections.iter().filter(|&&s| s).count() != 1 {
        eprintln!(
            "dataplane: {}: needs exactly one of [loopback], [incast] and [replay]",
            config.display()
        );
        return ExitCode::from(2);
    }
    if cli.serve && (cfg.loopback.is_none() || cfg.service.is_none()) {
        eprintln!(
            "dataplane: {}: --serve needs a [loopback] and a [service] section",
            config.display()
        );
        return ExitCode::from(2);
    }
    if cli.check {
        println!("{}: ok", config.display());
        return ExitCode::SUCCESS;
    }
    let mut args = cfg.eal.args.clone();
    let prefix = cli
        .file_prefix
        .unwrap_or_else(|| format!("rnic-{}", std::process::id()));
    args.push(format!("--file-prefix={prefix}"));
    let eal = match Eal::init(&args) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("dataplane: {e}");
            return ExitCode::FAILURE;
        }
    };
    let r = match (&cfg.loopback, &cfg.incast, &cfg.replay) {
        (Some(l), None, None) if cli.serve => serve(
            &eal,
            l,
            cfg.service.as_ref().expect("checked"),
            cli.socket.clone(),
            cli.stats.as_deref(),
        ),
        (Some(l), None, None) => loopback(&eal, l, cli.stats.as_deref()),
        (None, Some(i), None) => incast(&eal, i, cli.stats.as_deref()),
        (None, None, Some(r)) => replay(&eal, r),
        _ => Err("the configuration needs exactly one of [loopback], [incast] and [replay]".into()),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dataplane: {e}");
            ExitCode::FAILURE
        }
    }
}
