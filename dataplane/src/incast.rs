//! The incast testbed on DPDK: N sender hosts and one receiver, each an RC
//! engine in the one NIC pipeline (`nic::Nic::poll`) on its own port, all
//! joined to one software INT switch by net_ring pairs; the switch port
//! towards the receiver drains at a configured bottleneck rate (wall
//! time), so congestion is real on this machine. The switch forwards by
//! destination address, read through the wire codec's in-flight view.
//! Everything runs to completion on the calling lcore.

use std::net::Ipv4Addr;
use std::sync::Arc;

use hdrhistogram::Histogram;
use netsim::int_response::IntResponseConfig;
use netsim::mmu::{IngressLimits, PfcConfig};
use netsim::qos::QosConfig;
use netsim::switch::{EcnConfig, PortConfig, Switch};
use nic::{Completions, FramePort, Nic};
use pacer::HpccSettings;
use transport::mr::{Access, MrKeys, VecMemory};
use transport::rc::{
    CcMode, ConnectParams, Cqe, Endpoint, Engine, EngineConfig, PathMtu, Qpn, SendWr, Sge,
    WcStatus, WrOp,
};
use transport::wire::pfc::{self, PfcRepr};
use transport::wire::{MacAddr, RoceFrame};

use crate::dpdk::{ring_pair, DpdkError, Eal, Mbuf, Mempool, Port, TscClock};
use crate::host_port::HostPort;

/// Settings of one incast run.
#[derive(Debug, Clone)]
pub struct IncastConfig {
    pub senders: usize,
    /// Host NIC line rate (each engine paces at most this), b/s.
    pub host_bps: u64,
    /// Capacity of the switch port towards the receiver, b/s.
    pub bottleneck_bps: u64,
    /// Switch buffer per port, bytes (with `pfc`: the switch's whole
    /// buffer, shared).
    pub buffer_bytes: u64,
    /// Lossless: a shared buffer with priority flow control; the switch
    /// sends PAUSE/RESUME to the hosts' NICs, which hold their TX.
    pub pfc: bool,
    pub cc: CcMode,
    /// HPCC++ T, ns (the testbed's base RTT: software hops take microseconds).
    pub base_rtt_ns: u64,
    pub mtu: PathMtu,
    /// Size of each WRITE a sender keeps posting.
    pub message_bytes: u32,
    /// WRITEs each sender keeps outstanding.
    pub depth: usize,
    pub ecn: Option<EcnConfig>,
    /// A unique name for this run's rings and pool.
    pub name: String,
    /// Mbufs in the pool (queued frames wait in mbufs).
    pub mbufs: u32,
    /// Mirror what the bottleneck port sends to this pcap (at most
    /// `TAP_FRAMES` frames; the file is written through a buffer).
    pub tap: Option<std::path::PathBuf>,
    /// Keep this file rewritten with counters every 100 ms while running.
    pub stats: Option<std::path::PathBuf>,
    /// Switch INT responses (HPCC++ draft-00 s6.3): the senders subscribe
    /// their data packets, the switch answers those that find a queue at
    /// or above the threshold; `None`: off.
    pub int_response: Option<IntResponseConfig>,
    /// Receiver-measured N (HPCC++ draft-00 s6.2): the receiver reports the
    /// flows through its last hop, senders take W_AI from the count.
    pub receiver_n: bool,
    /// QoS classes at the switch ports (HPCC++ 2023 s9.3); `None`: one
    /// FIFO per port.
    pub qos: Option<QosConfig>,
    /// DSCP of each sender's QP in turn (sender i: `sender_dscp[i % len]`);
    /// empty: the engines' default.
    pub sender_dscp: Vec<u8>,
    /// Senders ask the switch for sojourn times instead of queue lengths.
    pub int_sojourn: bool,
    /// Every sender-receiver connection has a feedback key: ACKs carry a
    /// MAC over their echoed telemetry (rc::auth).
    pub feedback_auth: bool,
    /// The switch is a telemetry domain's boundary (HPCC++ 2023 s9.1):
    /// every stack it sends out is rewritten into relative load.
    pub relative_telemetry: bool,
}

/// One QoS class of the bottleneck port over a run.
#[derive(Debug, Clone, PartialEq)]
pub struct ClassReport {
    /// Its share of the bytes the port sent, and its frames' sojourn
    /// times (ns).
    pub share: f64,
    pub sojourn_p50_ns: u64,
    pub sojourn_p99_ns: u64,
}

/// Most frames the incast tap records.
pub const TAP_FRAMES: u64 = 100_000;

/// What one run measured.
#[derive(Debug, Clone, PartialEq)]
pub struct IncastReport {
    pub cc: CcMode,
    pub seconds: f64,
    /// Time-weighted queue percentiles at the bottleneck port, bytes.
    pub queue_p50: u64,
    pub queue_p95: u64,
    pub queue_p99: u64,
    pub queue_max: u64,
    /// WRITE bytes completed per second, over all senders, b/s.
    pub goodput_bps: f64,
    /// Bytes the bottleneck port sent per second / its capacity.
    pub utilization: f64,
    /// Frames the switch's buffers dropped.
    pub drops: u64,
    /// Frames the switch could not route (not RoCEv2, or to no host).
    pub unroutable: u64,
    /// Frames the hosts' pipelines lost for want of an mbuf.
    pub tx_no_buffer: u64,
    pub retransmitted: u64,
    pub completed: u64,
    pub failed: u64,
    /// PFC frames the switch sent (PAUSE with refreshes, RESUME) and the
    /// time the hosts' NICs were held, all together.
    pub pause_frames: u64,
    pub resume_frames: u64,
    pub host_paused_ns: u64,
    /// Times a PFC frame found no mbuf (it waits and is sent later).
    pub pfc_no_buffer: u64,
    /// INT responses the switch built, those the senders' controllers
    /// took (and ones for a PSN no longer in flight), and those lost for
    /// want of an mbuf (responses are not retried).
    pub int_responses: u64,
    pub int_responses_taken: u64,
    pub int_responses_stale: u64,
    pub int_response_no_buffer: u64,
    /// ACKs with the receiver's flow count that senders took.
    pub flow_reports: u64,
    /// The bottleneck port's QoS classes (empty without QoS).
    pub classes: Vec<ClassReport>,
    /// With feedback keys: echoed telemetry refused for a bad MAC, and
    /// for a PSN not newer than the last taken (a replay or a duplicate).
    pub feedback_forged: u64,
    pub feedback_replayed: u64,
    pub feedback_unkeyed: u64,
    /// Frames whose telemetry the switch rewrote into relative load.
    pub tlm_relative: u64,
}

/// Why an incast run could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum IncastError {
    #[error(transparent)]
    Dpdk(#[from] DpdkError),
    #[error("HPCC++ parameters (is host rate x T at least one MTU?): {0}")]
    Hpcc(#[from] pacer::ParamError),
    #[error("host setup: {0}")]
    Host(String),
    #[error("tap: {0}")]
    Tap(#[from] nic::pcap::PcapFileError),
    #[error("stats {path}: {source}")]
    Stats {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
}

/// A sender's application: it keeps `depth` WRITEs of `message_bytes`
/// outstanding and counts what completes.
struct Writer {
    qpn: Qpn,
    lkey: u32,
    rkey: u32,
    message_bytes: u32,
    depth: usize,
    outstanding: usize,
    completed: u64,
    failed: u64,
    bytes_done: u64,
}

impl nic::Host<VecMemory> for Writer {
    fn doorbells(&mut self, engine: &mut Engine<VecMemory>, now: u64) -> bool {
        let mut posted = false;
        while self.outstanding < self.depth {
            let slot = self.outstanding as u64 * u64::from(self.message_bytes);
            let local = Sge {
                lkey: self.lkey,
                va: MEM + slot,
                len: self.message_bytes,
            };
            let wr = SendWr::new(0, WrOp::Write, local, self.rkey, MEM);
            if engine.post_send(self.qpn, wr, now).is_err() {
                break;
            }
            self.outstanding += 1;
            posted = true;
        }
        posted
    }

    fn completion(&mut self, _: &mut Engine<VecMemory>, c: Cqe) {
        self.outstanding = self.outstanding.saturating_sub(1);
        if c.status == WcStatus::Success {
            self.completed += 1;
            self.bytes_done += u64::from(c.byte_len);
        } else {
            self.failed += 1;
        }
    }
}

struct Host {
    nic: Nic<HostPort, VecMemory>,
    mr: MrKeys,
    qpns: Vec<Qpn>,
}

const MEM: u64 = 0x1000_0000;

fn mac(i: usize) -> MacAddr {
    MacAddr([0x02, 0, 0, 0, 1, i as u8])
}

fn ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 1, 0, i as u8 + 1)
}

/// The switch port towards a host address (host `i` hangs off port `i`).
fn route(frame: &[u8], hosts: usize) -> Option<usize> {
    let dst = RoceFrame::new_checked(frame).ok()?.dst_ip().octets();
    let i = usize::from(dst[3]).checked_sub(1)?;
    (dst[..3] == [10, 1, 0] && i < hosts).then_some(i)
}

/// Runs the incast for `seconds` of wall time.
pub fn run(eal: &Eal, cfg: &IncastConfig, seconds: f64) -> Result<IncastReport, IncastError> {
    let n = cfg.senders;
    let recv = n;
    let frame = cfg.mtu.bytes() as usize + nic::MAX_HEADERS;
    let pool = Arc::new(Mempool::with_frames(
        eal,
        &format!("{}_pool", cfg.name),
        cfg.mbufs,
        0,
        frame,
    )?);
    let hpcc = HpccSettings {
        t_ns: cfg.base_rtt_ns,
        n: n.max(1) as u32,
        ..HpccSettings::default()
    };
    let host_err = |e: &dyn std::fmt::Display| IncastError::Host(e.to_string());
    let mut hosts = Vec::with_capacity(n + 1);
    let mut sw_ports = Vec::with_capacity(n + 1);
    for i in 0..=n {
        let (h, s) = ring_pair(eal, &format!("{}_{i}", cfg.name), 4096)?;
        let mut ec = EngineConfig::new(mac(i), ip(i), cfg.host_bps).with_cc(
            cfg.cc,
            &hpcc,
            cfg.mtu.bytes(),
        )?;
        ec.ack_req_every = 1;
        ec.int_subscribe = cfg.int_response.is_some();
        ec.report_flows = cfg.receiver_n;
        ec.int_sojourn = cfg.int_sojourn;
        let mut mem = VecMemory::new();
        let bytes = cfg.message_bytes as usize * cfg.depth.max(1);
        mem.add(MEM, bytes.max(4096));
        let mut engine = Engine::new(ec, mem, 0);
        let mr = engine
            .register_mr(MEM, bytes.max(4096) as u64, Access::ALL)
            .map_err(|e| host_err(&e))?;
        let port = crate::testbed::host_port(
            crate::host_port::DpdkLink::Port(Port::start(eal, h, &pool, 1024)?),
            None,
            None,
            None,
            nic::Direction::Tx,
        )
        .map_err(|e| host_err(&e))?;
        hosts.push(Host {
            nic: Nic::new(engine, port, cfg.mtu.bytes()),
            mr,
            qpns: Vec::new(),
        });
        sw_ports.push(Port::start(eal, s, &pool, 1024)?);
    }
    // QP i on sender i <-> QP i on the receiver.
    let params = ConnectParams {
        timeout: 10,
        ..ConnectParams::new(cfg.mtu)
    };
    for s in 0..n {
        let mut key = [0u8; 16];
        key[..8].copy_from_slice(&(s as u64 + 1).to_le_bytes());
        key[8..].copy_from_slice(&t0_key_salt().to_le_bytes());
        let params = ConnectParams {
            feedback_key: cfg
                .feedback_auth
                .then_some(transport::rc::auth::FeedbackKey(key)),
            dscp: (!cfg.sender_dscp.is_empty()).then(|| cfg.sender_dscp[s % cfg.sender_dscp.len()]),
            ..params
        };
        let qs = hosts[s]
            .nic
            .engine_mut()
            .create_qp(cfg.depth * 2 + 2, 0)
            .map_err(|e| host_err(&e))?;
        let qr = hosts[recv]
            .nic
            .engine_mut()
            .create_qp(2, 0)
            .map_err(|e| host_err(&e))?;
        for (h, q, peer, pq) in [(s, qs, recv, qr), (recv, qr, s, qs)] {
            let end = Endpoint {
                qpn: pq,
                psn: 0,
                mac: mac(peer),
                ip: ip(peer),
            };
            hosts[h]
                .nic
                .engine_mut()
                .connect_to(q, 0, &end, &params)
                .map_err(|e| host_err(&e))?;
            hosts[h].qpns.push(q);
        }
    }
    let rkey = hosts[recv].mr.rkey;
    let mut writers: Vec<Writer> = (0..n)
        .map(|s| Writer {
            qpn: hosts[s].qpns[0],
            lkey: hosts[s].mr.lkey,
            rkey,
            message_bytes: cfg.message_bytes,
            depth: cfg.depth,
            outstanding: 0,
            completed: 0,
            failed: 0,
            bytes_done: 0,
        })
        .collect();
    let mut receiver = Completions::default();
    let port_cfg: Vec<PortConfig> = (0..=n)
        .map(|i| PortConfig {
            rate_bps: if i == recv {
                cfg.bottleneck_bps
            } else {
                cfg.host_bps
            },
            buffer_bytes: cfg.buffer_bytes,
            ecn: cfg.ecn,
        })
        .collect();
    // The switch queues and stamps the mbufs themselves: no copy.
    let mut switch: Switch<Mbuf> = Switch::new(1, &port_cfg, 1);
    // The poll loop visits ports late by its iteration time; let ports
    // catch up by up to 200 us so they keep their rate.
    switch.set_catch_up(200_000);
    if cfg.pfc {
        // The ring hop has no propagation delay; what is in flight when a
        // PAUSE leaves is what a sender's pass puts out before it reads
        // the PAUSE at its next pass: a burst of full frames (payload and
        // headers with a full telemetry stack).
        let full_frame = u64::from(cfg.mtu.bytes()) + 256;
        let limits: Vec<IngressLimits> = port_cfg
            .iter()
            .map(|p| IngressLimits {
                headroom_bytes: nic::BURST as u64 * full_frame,
                ..IngressLimits::for_link(p.rate_bps, 0, cfg.host_bps)
            })
            .collect();
        switch
            .enable_pfc(PfcConfig::new(cfg.buffer_bytes), &limits)
            .map_err(|e| IncastError::Host(e.to_string()))?;
    }
    if let Some(r) = cfg.int_response {
        switch.enable_int_responses(r);
    }
    for p in 0..=n {
        switch.set_relative_telemetry(p, cfg.relative_telemetry);
    }
    if let Some(q) = &cfg.qos {
        switch
            .set_qos(q.clone())
            .map_err(|e| IncastError::Host(e.to_string()))?;
    }
    let mut pfc_no_buffer = 0u64;
    let mut int_response_no_buffer = 0u64;
    // PFC messages waiting for an mbuf, and PFC frames waiting for the
    // ring, per port: they go out in order, before any data of the port,
    // and none is lost (a RESUME overtaking its PAUSE would hold a
    // sender for the whole pause time).
    let mut pfc_wait: Vec<std::collections::VecDeque<PfcRepr>> =
        (0..=n).map(|_| Default::default()).collect();
    let mut pfc_tx: Vec<Vec<Mbuf>> = (0..=n).map(|_| Vec::new()).collect();
    let mut sw_tx: Vec<Vec<Mbuf>> = (0..=n).map(|_| Vec::new()).collect();
    let mut unroutable = 0u64;
    let mut hist = Histogram::<u64>::new_with_bounds(1, 1 << 40, 3).expect("valid bounds");
    let clock = TscClock::new(eal);
    let mut rx = Vec::with_capacity(64);
    let end = (seconds * 1e9) as u64;
    let mut last_t = 0u64;
    let mut last_q = 0u64;
    let sent0 = switch.counters(recv).tx_bytes;
    let mut tap = match &cfg.tap {
        Some(p) => Some(nic::pcap::Writer::create(p)?),
        None => None,
    };
    let mut tapped = 0u64;
    let mut next_stats = 0u64;
    loop {
        let now = clock.now_ns();
        if now >= end {
            break;
        }
        // Queue at the bottleneck, weighted by time.
        if now > last_t {
            hist.saturating_record_n(last_q, now - last_t);
            last_t = now;
        }
        // Hosts: the pipeline; senders keep `depth` WRITEs in flight.
        for (i, h) in hosts.iter_mut().enumerate() {
            match writers.get_mut(i) {
                Some(w) => h.nic.poll(now, w),
                None => h.nic.poll(now, &mut receiver),
            };
        }
        receiver.0.clear();
        // The switch: RX on every port, forward by destination address;
        // PFC frames hold or free the port they came in on.
        for (p, port) in sw_ports.iter_mut().enumerate() {
            rx.clear();
            port.rx_burst(now, &mut rx, crate::dpdk::port::BURST);
            for m in rx.drain(..) {
                if pfc::is_mac_control(m.data()) {
                    if let Ok(msg) = PfcRepr::parse(m.data()) {
                        switch.receive_pfc(now, p, &msg);
                    }
                    continue;
                }
                match route(m.data(), n + 1) {
                    Some(dst) => {
                        switch.enqueue(now, Some(p), dst, m); // dropped frames are freed and counted
                    }
                    None => unroutable += 1,
                }
                // INT responses go back towards their senders.
                while let Some(r) = switch.pop_int_response() {
                    let Some(dst) = route(&r, n + 1) else {
                        unroutable += 1;
                        continue;
                    };
                    match nic::copy_frame(port, &r) {
                        Some(f) => {
                            switch.enqueue(now, None, dst, f);
                        }
                        None => int_response_no_buffer += 1,
                    }
                }
            }
        }
        switch.refresh_pauses(now);
        for (p, out) in sw_tx.iter_mut().enumerate() {
            while let Some((m, _)) = switch.dequeue(now, p) {
                if p == recv && tapped < TAP_FRAMES {
                    if let Some(w) = tap.as_mut() {
                        w.write(std::time::Duration::from_nanos(now), m.data())?;
                        tapped += 1;
                    }
                }
                out.push(m);
            }
        }
        for (q, msg) in switch.take_pfc() {
            pfc_wait[q].push_back(msg);
        }
        for (q, port) in sw_ports.iter_mut().enumerate() {
            while let Some(msg) = pfc_wait[q].front() {
                let bytes = msg.to_frame(switch.port_mac(q));
                let Some(f) = nic::copy_frame(port, &bytes) else {
                    pfc_no_buffer += 1; // tried again at the next pass
                    break;
                };
                pfc_tx[q].push(f);
                pfc_wait[q].pop_front();
            }
            if !pfc_tx[q].is_empty() {
                port.tx_burst(now, &mut pfc_tx[q]);
            }
            // Data only behind every PFC frame of the port.
            if pfc_tx[q].is_empty() && pfc_wait[q].is_empty() && !sw_tx[q].is_empty() {
                port.tx_burst(now, &mut sw_tx[q]);
            }
        }
        last_q = switch.qlen(recv);
        if let Some(path) = cfg.stats.as_deref().filter(|_| now >= next_stats) {
            next_stats = now + 100_000_000;
            let mut snap = crate::stats::Snapshot {
                at_ns: now,
                ..Default::default()
            };
            for (k, h) in hosts.iter().enumerate() {
                snap.add_nic(k, &h.nic, &h.qpns);
            }
            snap.add_switch(&switch);
            snap.write(path).map_err(|source| IncastError::Stats {
                path: path.to_owned(),
                source,
            })?;
        }
    }
    if let Some(w) = tap {
        w.finish()?;
    }
    let t_end = clock.now_ns();
    let t = t_end as f64 / 1e9;
    let retransmitted = hosts
        .iter()
        .flat_map(|h| h.qpns.iter().map(move |q| (h, q)))
        .filter_map(|(h, q)| h.nic.engine().qp_counters(*q).ok())
        .map(|c| c.retransmitted)
        .sum();
    let c = switch.counters(recv);
    let drops = (0..=n).map(|p| switch.counters(p).dropped).sum();
    let mut totals = transport::rc::QpCounters::default();
    for h in &hosts {
        totals.accumulate(&h.nic.engine().qp_totals());
    }
    Ok(IncastReport {
        cc: cfg.cc,
        seconds: t,
        queue_p50: hist.value_at_quantile(0.5),
        queue_p95: hist.value_at_quantile(0.95),
        queue_p99: hist.value_at_quantile(0.99),
        queue_max: c.max_qlen,
        goodput_bps: writers.iter().map(|w| w.bytes_done).sum::<u64>() as f64 * 8.0 / t,
        utilization: (c.tx_bytes - sent0) as f64 * 8.0 / t / cfg.bottleneck_bps as f64,
        drops,
        unroutable,
        tx_no_buffer: hosts.iter().map(|h| h.nic.counters().tx_no_buffer).sum(),
        retransmitted,
        completed: writers.iter().map(|w| w.completed).sum(),
        failed: writers.iter().map(|w| w.failed).sum(),
        pause_frames: (0..=n).map(|p| switch.counters(p).pause_tx).sum(),
        resume_frames: (0..=n).map(|p| switch.counters(p).resume_tx).sum(),
        host_paused_ns: hosts.iter().map(|h| h.nic.pause().paused_ns(t_end)).sum(),
        pfc_no_buffer,
        int_responses: switch.int_response_counters().map_or(0, |c| c.sent),
        int_responses_taken: totals.int_responses,
        int_responses_stale: totals.int_responses_stale,
        int_response_no_buffer,
        flow_reports: totals.flow_reports,
        feedback_forged: totals.feedback_forged,
        feedback_replayed: totals.feedback_replayed,
        feedback_unkeyed: totals.feedback_unkeyed,
        tlm_relative: (0..=n).map(|p| switch.counters(p).tlm_relative).sum(),
        classes: class_reports(&switch, recv),
    })
}

/// Per-run salt of the connections' feedback keys (the wall clock: a
/// testbed key, not a secret anyone provisions).
fn t0_key_salt() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The bottleneck port's classes (none without QoS).
fn class_reports(switch: &Switch<Mbuf>, port: usize) -> Vec<ClassReport> {
    if switch.class_count() < 2 {
        return Vec::new();
    }
    let counters: Vec<_> = (0..switch.class_count())
        .filter_map(|c| switch.class_counters(port, c))
        .collect();
    let total = counters.iter().map(|k| k.tx_bytes).sum::<u64>().max(1);
    counters
        .iter()
        .map(|k| ClassReport {
            share: k.tx_bytes as f64 / total as f64,
            sojourn_p50_ns: k.sojourn_at(0.5),
            sojourn_p99_ns: k.sojourn_at(0.99),
        })
        .collect()
}
