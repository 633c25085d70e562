//! The incast testbed on DPDK: N sender hosts and one receiver, each an RC
//! engine on its own port, all joined to one software INT switch by
//! net_ring pairs; the switch port towards the receiver drains at a
//! configured bottleneck rate (wall time), so congestion is real on this
//! machine. Everything runs to completion on the calling lcore.

use std::net::Ipv4Addr;

use hdrhistogram::Histogram;
use transport::mr::{Access, MrKeys, VecMemory};
use transport::rc::{
    CcMode, Engine, EngineConfig, PathMtu, QpAccess, Qpn, RtrAttr, RtsAttr, SendWr, WcStatus, WrOp,
};
use transport::wire::MacAddr;

use crate::dpdk::{ring_pair, DpdkError, Eal, Mbuf, Mempool, Port, TscClock};
use netsim::switch::{EcnConfig, PortConfig, Switch};

/// Settings of one incast run.
#[derive(Debug, Clone)]
pub struct IncastConfig {
    pub senders: usize,
    /// Host NIC line rate (each engine paces at most this), b/s.
    pub host_bps: u64,
    /// Capacity of the switch port towards the receiver, b/s.
    pub bottleneck_bps: u64,
    /// Switch buffer per port, bytes.
    pub buffer_bytes: u64,
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
    pub drops: u64,
    pub retransmitted: u64,
    pub completed: u64,
    pub failed: u64,
}

struct Host {
    engine: Engine<VecMemory>,
    mr: MrKeys,
    qpns: Vec<Qpn>,
    port: Port,
    tx: Vec<Mbuf>,
    outstanding: usize,
}

const MEM: u64 = 0x1000_0000;

fn mac(i: usize) -> MacAddr {
    MacAddr([0x02, 0, 0, 0, 1, i as u8])
}

fn ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 1, 0, i as u8 + 1)
}

/// Runs the incast for `seconds` of wall time.
pub fn run(eal: &Eal, cfg: &IncastConfig, seconds: f64) -> Result<IncastReport, DpdkError> {
    let err = |what: &str, e: String| DpdkError {
        what: what.into(),
        reason: e,
    };
    let n = cfg.senders;
    let recv = n;
    let frame = cfg.mtu.bytes() as usize + crate::nic::MAX_HEADERS;
    let pool = Mempool::with_frames(eal, &format!("{}_pool", cfg.name), cfg.mbufs, 0, frame)?;
    let mut hosts = Vec::with_capacity(n + 1);
    let mut sw_ports = Vec::with_capacity(n + 1);
    for i in 0..=n {
        let (h, s) = ring_pair(eal, &format!("{}_{i}", cfg.name), 4096)?;
        let mut ec = EngineConfig::new(mac(i), ip(i), cfg.host_bps);
        ec.cc = cfg.cc;
        ec.ack_req_every = 1;
        let hp = pacer::HpccParams::new(
            cfg.host_bps,
            cfg.base_rtt_ns,
            n.max(1) as u32,
            cfg.mtu.bytes(),
        )
        .map_err(|e| {
            err(
                "HPCC++ parameters (is host rate x T at least one MTU?)",
                e.to_string(),
            )
        })?;
        ec.hpcc = hp;
        let mut mem = VecMemory::new();
        let bytes = cfg.message_bytes as usize * cfg.depth.max(1);
        mem.add(MEM, bytes.max(4096));
        let mut engine = Engine::new(ec, mem, 0);
        let mr = engine
            .register_mr(MEM, bytes.max(4096) as u64, Access::ALL)
            .map_err(|e| err("register", e.to_string()))?;
        hosts.push(Host {
            engine,
            mr,
            qpns: Vec::new(),
            port: Port::start(eal, h, &pool, 1024)?,
            tx: Vec::new(),
            outstanding: 0,
        });
        sw_ports.push(Port::start(eal, s, &pool, 1024)?);
    }
    // QP i on sender i <-> QP i on the receiver.
    for s in 0..n {
        let qs = hosts[s]
            .engine
            .create_qp(cfg.depth * 2 + 2, 0)
            .map_err(|e| err("create QP", e.to_string()))?;
        let qr = hosts[recv]
            .engine
            .create_qp(2, 0)
            .map_err(|e| err("create QP", e.to_string()))?;
        for (h, q, peer, pq) in [(s, qs, recv, qr), (recv, qr, s, qs)] {
            let e = &mut hosts[h].engine;
            e.connect(
                q,
                QpAccess {
                    remote_write: true,
                    remote_read: true,
                },
                RtrAttr {
                    path_mtu: cfg.mtu,
                    dest_qpn: pq,
                    dest_mac: mac(peer),
                    dest_ip: ip(peer),
                    rq_psn: 0,
                    max_dest_rd_atomic: 16,
                },
                RtsAttr {
                    sq_psn: 0,
                    timeout: 10,
                    retry_cnt: 7,
                    rnr_retry: 7,
                    max_rd_atomic: 16,
                },
            )
            .map_err(|e| err("QP bring-up", e.to_string()))?;
            hosts[h].qpns.push(q);
        }
    }
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
    let mut sw_tx: Vec<Vec<Mbuf>> = (0..=n).map(|_| Vec::new()).collect();
    let mut hist = Histogram::<u64>::new_with_bounds(1, 1 << 40, 3).expect("valid bounds");
    let clock = TscClock::new(eal);
    let mut scratch = vec![0u8; 16 * 1024];
    let mut rx = Vec::with_capacity(64);
    let (mut completed, mut failed, mut bytes_done) = (0u64, 0u64, 0u64);
    let end = (seconds * 1e9) as u64;
    let mut last_t = 0u64;
    let mut last_q = 0u64;
    let sent0 = switch.counters(recv).tx_bytes;
    let mut tap = match &cfg.tap {
        Some(p) => Some(nic::pcap::Writer::create(p).map_err(|e| err("tap", e.to_string()))?),
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
        // Senders keep `depth` WRITEs in flight.
        for s in 0..n {
            while hosts[s].outstanding < cfg.depth {
                let h = &mut hosts[s];
                let slot = h.outstanding as u64 * u64::from(cfg.message_bytes);
                let wr = SendWr {
                    wr_id: 0,
                    op: WrOp::Write,
                    lkey: h.mr.lkey,
                    local_va: MEM + slot,
                    len: cfg.message_bytes,
                    rkey: 0,
                    remote_va: MEM,
                    signaled: true,
                };
                let rkey = hosts[recv].mr.rkey;
                let h = &mut hosts[s];
                let q = h.qpns[0];
                if h.engine.post_send(q, SendWr { rkey, ..wr }, now).is_err() {
                    break;
                }
                h.outstanding += 1;
            }
        }
        // Hosts: RX, timers, TX.
        for (i, h) in hosts.iter_mut().enumerate() {
            rx.clear();
            h.port.rx_burst(&mut rx);
            for m in rx.drain(..) {
                h.engine.handle_packet(now, m.data());
            }
            if h.engine.poll_timeout().is_some_and(|t| t <= now) {
                h.engine.handle_timeout(now);
            }
            while h.tx.len() < 32 {
                let Some(len) = h.engine.poll_transmit(now, &mut scratch) else {
                    break;
                };
                if let Some(mut m) = pool.alloc() {
                    if let Some(dst) = m.append(len) {
                        dst.copy_from_slice(&scratch[..len]);
                        h.tx.push(m);
                    }
                }
            }
            if !h.tx.is_empty() {
                h.port.tx_burst(&mut h.tx);
            }
            if i < n {
                while let Some(c) = h.engine.poll_completion() {
                    h.outstanding = h.outstanding.saturating_sub(1);
                    if c.status == WcStatus::Success {
                        completed += 1;
                        bytes_done += u64::from(c.byte_len);
                    } else {
                        failed += 1;
                    }
                }
            }
        }
        // The switch: RX on every port, forward by destination address.
        for port in &sw_ports {
            rx.clear();
            port.rx_burst(&mut rx);
            for m in rx.drain(..) {
                let dst = m
                    .data()
                    .get(33)
                    .map_or(usize::MAX, |&b| usize::from(b).wrapping_sub(1));
                if dst <= n {
                    switch.enqueue(dst, m); // dropped frames are freed here
                }
            }
        }
        for p in 0..=n {
            while let Some((m, _)) = switch.dequeue(now, p) {
                if p == recv && tapped < TAP_FRAMES {
                    if let Some(w) = tap.as_mut() {
                        w.write(std::time::Duration::from_nanos(now), m.data())
                            .map_err(|e| err("tap", e.to_string()))?;
                        tapped += 1;
                    }
                }
                sw_tx[p].push(m);
            }
            if !sw_tx[p].is_empty() {
                sw_ports[p].tx_burst(&mut sw_tx[p]);
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
                snap.add_host(k, h.port.id, h.port.stats(), &h.engine, &h.qpns);
            }
            snap.add_switch(&switch);
            snap.write(path)
                .map_err(|e| err("stats", format!("{}: {e}", path.display())))?;
        }
    }
    if let Some(w) = tap {
        w.finish().map_err(|e| err("tap", e.to_string()))?;
    }
    let t = clock.now_ns() as f64 / 1e9;
    let retransmitted = hosts
        .iter()
        .flat_map(|h| h.qpns.iter().map(move |q| (h, q)))
        .filter_map(|(h, q)| h.engine.qp_counters(*q).ok())
        .map(|c| c.retransmitted)
        .sum();
    let c = switch.counters(recv);
    let drops = (0..=n).map(|p| switch.counters(p).dropped).sum();
    Ok(IncastReport {
        cc: cfg.cc,
        seconds: t,
        queue_p50: hist.value_at_quantile(0.5),
        queue_p95: hist.value_at_quantile(0.95),
        queue_p99: hist.value_at_quantile(0.99),
        queue_max: c.max_qlen,
        goodput_bps: bytes_done as f64 * 8.0 / t,
        utilization: (c.tx_bytes - sent0) as f64 * 8.0 / t / cfg.bottleneck_bps as f64,
        drops,
        retransmitted,
        completed,
        failed,
    })
}
