//! A deterministic virtual-time network simulator. Hosts run the real RC
//! engine (`transport::rc`) and congestion controllers (`pacer`); switches
//! run the software INT switch ([`crate::switch`]); links have a bandwidth
//! and a propagation delay. Everything happens in one event queue ordered
//! by (time, sequence), so a seed fixes the run exactly.
//!
//! A host's NIC puts a frame on its link whenever the link is free and the
//! engine has one (`poll_transmit`), and sleeps until the engine's next
//! timer otherwise. Flows are RDMA WRITEs over a QP pair made for the flow.

mod metrics;
pub mod scenario;
pub mod topology;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use transport::mr::{Access, Memory, MrKeys};
use transport::rc::{
    CcMode, Engine, EngineConfig, PathMtu, QpAccess, Qpn, RtrAttr, RtsAttr, SendWr, WcStatus, WrOp,
};
use transport::wire::{bth, ethernet, ipv4, udp, Ipv4Packet, MacAddr};

use crate::switch::{serialization_ns, EcnConfig, PortConfig, Switch};
use metrics::Monitor;
pub use metrics::{Bucket, FlowResult, SimResult};
use topology::{host_index, host_ip, End, NodeKind, Topology};

/// Memory that is all zeros and forgets what is written: the simulator
/// moves bytes but does not keep them.
#[derive(Debug, Default, Clone, Copy)]
pub struct NullMemory;

impl Memory for NullMemory {
    fn read(&self, _va: u64, dst: &mut [u8]) {
        dst.fill(0);
    }
    fn write(&mut self, _va: u64, _src: &[u8]) {}
}

/// Settings of one simulation run.
#[derive(Debug, Clone, PartialEq)]
pub struct SimConfig {
    pub seed: u64,
    pub cc: CcMode,
    pub mtu: PathMtu,
    /// HPCC++ T (known base RTT), ns.
    pub base_rtt_ns: u64,
    /// HPCC++ N (W_ai = W_init (1 - eta) / N) and eta, maxStage.
    pub hpcc_n: u32,
    pub eta: f64,
    pub max_stage: u32,
    /// Switch ECN marking (used by DCQCN runs).
    pub ecn: Option<EcnConfig>,
    /// Local ACK timeout exponent of every QP.
    pub timeout: u8,
    /// AckReq at least every this many packets (HPCC++ inband reacts to
    /// the telemetry of each ACK, so 1 gives it the freshest).
    pub ack_req_every: u32,
    /// Stop at this virtual time.
    pub duration_ns: u64,
    /// Statistics (queue percentiles, utilization) start here.
    pub measure_from_ns: u64,
    /// Width of the buckets of the time series (queue, rates, fairness).
    pub sample_ns: u64,
    /// The egress port whose queue, utilization and fairness are reported.
    pub monitor: Option<End>,
}

impl SimConfig {
    pub fn new(cc: CcMode, duration_ns: u64) -> Self {
        SimConfig {
            seed: 1,
            cc,
            mtu: PathMtu::Mtu1024,
            base_rtt_ns: 8_000,
            hpcc_n: 16,
            eta: 0.95,
            max_stage: 5,
            ecn: None,
            timeout: 10,
            ack_req_every: 1,
            duration_ns,
            measure_from_ns: 0,
            sample_ns: 10_000,
            monitor: None,
        }
    }
}

/// A flow: `size` bytes written from host `src` to host `dst` at `start_ns`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowSpec {
    pub src: usize,
    pub dst: usize,
    pub size: u64,
    pub start_ns: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// A frame (slot in `frames`) reaches `node`.
    Arrive {
        node: usize,
        frame: usize,
    },
    /// A switch port finished sending.
    PortFree {
        node: usize,
        port: usize,
    },
    /// A host's NIC should look for work.
    HostWake {
        host: usize,
    },
    FlowStart {
        flow: usize,
    },
    Sample,
}

struct Host {
    node: usize,
    engine: Engine<NullMemory>,
    keys: MrKeys,
    peer: End,
    rate_bps: u64,
    delay_ns: u64,
    busy_until: u64,
    wake_at: Option<u64>,
    retransmitted: u64,
}

struct FlowState {
    spec: FlowSpec,
    qps: Option<(Qpn, Qpn)>,
    done_ns: Option<u64>,
    status: Option<WcStatus>,
    base_rtt_ns: u64,
}

/// Largest WRITE posted at once (flows above are split).
const MAX_WRITE: u64 = 1 << 30;

/// The simulator.
pub struct Simulator {
    cfg: SimConfig,
    topo: Topology,
    routes: Vec<Vec<Vec<usize>>>,
    hosts: Vec<Host>,
    /// Node -> host index (usize::MAX for switches).
    node_host: Vec<usize>,
    switches: Vec<Option<Switch>>,
    flows_done: usize,
    flows: Vec<FlowState>,
    /// (destination host, QPN) -> flow, for attributing frames.
    by_qp: HashMap<(usize, Qpn), usize>,
    events: BinaryHeap<Reverse<(u64, u64, Event)>>,
    seq: u64,
    frames: Vec<Vec<u8>>,
    free_frames: Vec<usize>,
    now: u64,
    monitor: Option<Monitor>,
    buf: Vec<u8>,
    events_run: u64,
    /// A flow whose telemetry events are recorded (hpcc-replay lines).
    trace: Option<(usize, Vec<String>)>,
    /// Bytes hosts put on their links, and those of TLM_REQUEST /
    /// TLM_RESPONSE probes among them.
    host_tx_bytes: u64,
    probe_bytes: u64,
}

fn mac_of(host: usize) -> MacAddr {
    let b = (host as u32).to_be_bytes();
    MacAddr([0x02, 0, b[0], b[1], b[2], b[3]])
}

impl Simulator {
    /// Builds hosts (an RC engine each) and switches for `topo`.
    pub fn new(cfg: SimConfig, topo: Topology, buffer_bytes: u64) -> Result<Self, String> {
        let routes = topo.routes();
        let host_nodes = topo.hosts();
        let mut hosts = Vec::with_capacity(host_nodes.len());
        for (i, &node) in host_nodes.iter().enumerate() {
            if topo.ports[node].len() != 1 {
                return Err(format!(
                    "host {i} has {} links; a host has exactly one",
                    topo.ports[node].len()
                ));
            }
            let (peer, link) = topo.peer(node, 0);
            let mut ec = EngineConfig::new(mac_of(i), host_ip(i), link.rate_bps);
            ec.cc = cfg.cc;
            ec.ack_req_every = cfg.ack_req_every;
            let mut hp =
                pacer::HpccParams::new(link.rate_bps, cfg.base_rtt_ns, cfg.hpcc_n, cfg.mtu.bytes())
                    .map_err(|e| e.to_string())?;
            hp.eta = cfg.eta;
            hp.max_stage = cfg.max_stage;
            hp.w_ai = hp.w_init * (1.0 - cfg.eta) / f64::from(cfg.hpcc_n.max(1));
            ec.hpcc = hp;
            let mut engine = Engine::new(ec, NullMemory, 0);
            let keys = engine
                .register_mr(0, 1 << 40, Access::ALL)
                .map_err(|e| e.to_string())?;
            hosts.push(Host {
                node,
                engine,
                keys,
                peer,
                rate_bps: link.rate_bps,
                delay_ns: link.delay_ns,
                busy_until: 0,
                wake_at: None,
                retransmitted: 0,
            });
        }
        let mut switches: Vec<Option<Switch>> = Vec::with_capacity(topo.nodes.len());
        let mut sid = 0u8;
        for n in 0..topo.nodes.len() {
            if topo.nodes[n] != NodeKind::Switch {
                switches.push(None);
                continue;
            }
            sid = sid.wrapping_add(1);
            let ports: Vec<PortConfig> = (0..topo.ports[n].len())
                .map(|p| PortConfig {
                    rate_bps: topo.peer(n, p).1.rate_bps,
                    buffer_bytes,
                    ecn: cfg.ecn,
                })
                .collect();
            switches.push(Some(Switch::new(sid, &ports, cfg.seed)));
        }
        let monitor = match cfg.monitor {
            Some(e) => {
                let sw = switches
                    .get(e.node)
                    .and_then(Option::as_ref)
                    .ok_or("the monitored node is not a switch")?;
                if e.port >= sw.port_count() {
                    return Err(format!("the monitored switch has no port {}", e.port));
                }
                Some(Monitor::new(e, sw.port_config(e.port).rate_bps, &cfg))
            }
            None => None,
        };
        let mut node_host = vec![usize::MAX; topo.nodes.len()];
        for (i, h) in hosts.iter().enumerate() {
            node_host[h.node] = i;
        }
        let mut s = Simulator {
            cfg,
            topo,
            routes,
            hosts,
            node_host,
            flows_done: 0,
            switches,
            flows: Vec::new(),
            by_qp: HashMap::new(),
            events: BinaryHeap::new(),
            seq: 0,
            frames: Vec::new(),
            free_frames: Vec::new(),
            now: 0,
            monitor,
            buf: vec![0u8; 16 * 1024],
            events_run: 0,
            trace: None,
            host_tx_bytes: 0,
            probe_bytes: 0,
        };
        if s.monitor.is_some() {
            s.push(s.cfg.sample_ns, Event::Sample);
        }
        Ok(s)
    }

    pub fn host_count(&self) -> usize {
        self.hosts.len()
    }

    /// Hops (links) between two hosts.
    fn hops(&self, src: usize, dst: usize) -> u64 {
        let mut n = self.hosts[src].node;
        let mut hops = 0;
        while n != self.hosts[dst].node && hops < 64 {
            let port = self.routes[n][dst][0];
            n = self.topo.peer(n, port).0.node;
            hops += 1;
        }
        hops
    }

    /// Adds a flow.
    pub fn add_flow(&mut self, spec: FlowSpec) -> Result<usize, String> {
        if spec.src >= self.hosts.len() || spec.dst >= self.hosts.len() || spec.src == spec.dst {
            return Err(format!(
                "flow {} -> {}: bad hosts (there are {})",
                spec.src,
                spec.dst,
                self.hosts.len()
            ));
        }
        let hops = self.hops(spec.src, spec.dst);
        let delay = self.hosts[spec.src].delay_ns;
        let id = self.flows.len();
        self.flows.push(FlowState {
            spec,
            qps: None,
            done_ns: None,
            status: None,
            base_rtt_ns: 2 * hops * delay,
        });
        self.push(spec.start_ns, Event::FlowStart { flow: id });
        Ok(id)
    }

    fn push(&mut self, t: u64, e: Event) {
        self.seq += 1;
        self.events.push(Reverse((t, self.seq, e)));
    }

    fn store(&mut self, f: Vec<u8>) -> usize {
        match self.free_frames.pop() {
            Some(i) => {
                self.frames[i] = f;
                i
            }
            None => {
                self.frames.push(f);
                self.frames.len() - 1
            }
        }
    }

    fn wake(&mut self, h: usize, t: u64) {
        let host = &mut self.hosts[h];
        if host.wake_at.is_some_and(|w| w <= t) {
            return;
        }
        host.wake_at = Some(t);
        self.push(t, Event::HostWake { host: h });
    }

    /// Runs until the duration ends or nothing is left to happen.
    pub fn run(&mut self) {
        while let Some(Reverse((t, _, e))) = self.events.pop() {
            if t > self.cfg.duration_ns {
                break;
            }
            self.now = t;
            self.events_run += 1;
            match e {
                Event::Arrive { node, frame } => self.arrive(node, frame),
                Event::PortFree { node, port } => self.port_free(node, port),
                Event::HostWake { host } => {
                    if self.hosts[host].wake_at == Some(t) {
                        self.hosts[host].wake_at = None;
                        self.hosts[host].engine.handle_timeout(t);
                        self.host_send(host);
                        self.completions(host);
                    }
                }
                Event::FlowStart { flow } => self.start_flow(flow),
                Event::Sample => {
                    let active = self.active_flows();
                    if let Some(m) = self.monitor.as_mut() {
                        let q = self.switches[m.end.node]
                            .as_ref()
                            .map_or(0, |s| s.qlen(m.end.port));
                        m.sample(t, q, &active);
                    }
                    self.push(t + self.cfg.sample_ns, Event::Sample);
                }
            }
            if self.flows_done == self.flows.len() && !self.flows.is_empty() {
                break; // every flow has finished
            }
        }
    }

    fn active_flows(&self) -> Vec<usize> {
        self.flows
            .iter()
            .enumerate()
            .filter(|(_, f)| f.qps.is_some() && f.done_ns.is_none())
            .map(|(i, _)| i)
            .collect()
    }

    fn start_flow(&mut self, id: usize) {
        let spec = self.flows[id].spec;
        let now = self.now;
        let mtu = self.cfg.mtu;
        let timeout = self.cfg.timeout;
        let (src_mac, dst_mac) = (mac_of(spec.src), mac_of(spec.dst));
        let qa = self.hosts[spec.src]
            .engine
            .create_qp(1 + (spec.size / MAX_WRITE) as usize, now);
        let qb = self.hosts[spec.dst].engine.create_qp(1, now);
        let (Ok(qa), Ok(qb)) = (qa, qb) else {
            self.flows[id].done_ns = Some(now);
            self.flows_done += 1;
            return;
        };
        let access = QpAccess {
            remote_write: true,
            remote_read: true,
        };
        for (h, q, peer_q, peer_mac, peer) in [
            (spec.src, qa, qb, dst_mac, spec.dst),
            (spec.dst, qb, qa, src_mac, spec.src),
        ] {
            let ok = self.hosts[h]
                .engine
                .connect(
                    q,
                    access,
                    RtrAttr {
                        path_mtu: mtu,
                        dest_qpn: peer_q,
                        dest_mac: peer_mac,
                        dest_ip: host_ip(peer),
                        rq_psn: 0,
                        max_dest_rd_atomic: 16,
                    },
                    RtsAttr {
                        sq_psn: 0,
                        timeout,
                        retry_cnt: 7,
                        rnr_retry: 7,
                        max_rd_atomic: 16,
                    },
                )
                .is_ok();
            debug_assert!(ok, "QP bring-up of a fresh QP");
        }
        let (lkey, rkey) = (
            self.hosts[spec.src].keys.lkey,
            self.hosts[spec.dst].keys.rkey,
        );
        let mut off = 0u64;
        loop {
            let len = (spec.size - off).min(MAX_WRITE);
            let last = off + len >= spec.size;
            let wr = SendWr {
                wr_id: id as u64,
                op: WrOp::Write,
                lkey,
                local_va: off,
                len: len as u32,
                rkey,
                remote_va: off,
                signaled: last,
            };
            if self.hosts[spec.src].engine.post_send(qa, wr, now).is_err() {
                break;
            }
            off += len;
            if last {
                break;
            }
        }
        self.flows[id].qps = Some((qa, qb));
        self.by_qp.insert((spec.dst, qb), id);
        self.wake(spec.src, now);
    }

    fn host_send(&mut self, h: usize) {
        let now = self.now;
        if self.hosts[h].busy_until > now {
            let t = self.hosts[h].busy_until;
            self.wake(h, t);
            return;
        }
        let mut buf = std::mem::take(&mut self.buf);
        let sent = self.hosts[h].engine.poll_transmit(now, &mut buf);
        match sent {
            Some(n) => {
                self.host_tx_bytes += n as u64;
                let opcode_at = ethernet::HEADER_LEN + ipv4::HEADER_LEN + udp::HEADER_LEN;
                if matches!(buf.get(opcode_at), Some(0xC0 | 0xC1)) {
                    self.probe_bytes += n as u64;
                }
                let host = &mut self.hosts[h];
                let done = now + serialization_ns(n, host.rate_bps);
                host.busy_until = done;
                let (peer, delay) = (host.peer, host.delay_ns);
                let slot = self.store(buf[..n].to_vec());
                self.push(
                    done + delay,
                    Event::Arrive {
                        node: peer.node,
                        frame: slot,
                    },
                );
                self.wake(h, done);
            }
            None => {
                if let Some(t) = self.hosts[h].engine.poll_timeout() {
                    self.wake(h, t.max(now + 1));
                }
            }
        }
        self.buf = buf;
    }

    fn completions(&mut self, h: usize) {
        while let Some(c) = self.hosts[h].engine.poll_completion() {
            let id = c.wr_id as usize;
            let Some(f) = self.flows.get_mut(id) else {
                continue;
            };
            if f.done_ns.is_some() {
                continue;
            }
            f.done_ns = Some(self.now);
            f.status = Some(c.status);
            self.flows_done += 1;
            if let Some((qa, qb)) = f.qps {
                let (src, dst) = (f.spec.src, f.spec.dst);
                if let Ok(cn) = self.hosts[src].engine.qp_counters(qa) {
                    self.hosts[src].retransmitted += cn.retransmitted;
                }
                let _ = self.hosts[src].engine.destroy_qp(qa);
                let _ = self.hosts[dst].engine.destroy_qp(qb);
                self.by_qp.remove(&(dst, qb));
            }
        }
    }

    fn arrive(&mut self, node: usize, slot: usize) {
        let frame = std::mem::take(&mut self.frames[slot]);
        self.free_frames.push(slot);
        if self.topo.nodes[node] == NodeKind::Host {
            let h = self.node_host[node];
            let now = self.now;
            if self.trace.is_some() {
                self.record_trace(h, &frame);
            }
            self.hosts[h].engine.handle_packet(now, &frame);
            self.host_send(h);
            self.completions(h);
            return;
        }
        let Some(dst) = dst_host(&frame) else { return };
        let Some(choices) = self.routes[node].get(dst) else {
            return;
        };
        let Some(out) = crate::switch::ecmp(&frame, choices) else {
            return;
        };
        let sw = self.switches[node].as_mut().expect("switch node");
        sw.enqueue(out, frame);
        let q = sw.qlen(out);
        if let Some(m) = self
            .monitor
            .as_mut()
            .filter(|m| m.end.node == node && m.end.port == out)
        {
            m.queue_changed(self.now, q);
        }
        self.port_free(node, out);
    }

    fn port_free(&mut self, node: usize, port: usize) {
        let now = self.now;
        let sw = self.switches[node].as_mut().expect("switch node");
        let Some((frame, done)) = sw.dequeue(now, port) else {
            return;
        };
        let q = sw.qlen(port);
        if let Some(m) = self
            .monitor
            .as_mut()
            .filter(|m| m.end.node == node && m.end.port == port)
        {
            m.queue_changed(now, q);
            let flow = flow_key(&frame).and_then(|k| self.by_qp.get(&k).copied());
            m.sent(now, frame.len() as u64, flow);
        }
        let (peer, link) = self.topo.peer(node, port);
        let delay = link.delay_ns;
        let slot = self.store(frame);
        self.push(
            done + delay,
            Event::Arrive {
                node: peer.node,
                frame: slot,
            },
        );
        self.push(done, Event::PortFree { node, port });
    }

    /// Results of the run so far.
    pub fn result(&self, label: &str) -> SimResult {
        let host_bps = self.hosts.first().map_or(1, |h| h.rate_bps);
        let flows: Vec<FlowResult> = self
            .flows
            .iter()
            .map(|f| {
                let fct = f
                    .done_ns
                    .filter(|_| f.status == Some(WcStatus::Success))
                    .map(|d| d - f.spec.start_ns);
                let ideal = f.base_rtt_ns + f.spec.size * 8 * 1_000_000_000 / host_bps;
                FlowResult {
                    src: f.spec.src,
                    dst: f.spec.dst,
                    size: f.spec.size,
                    start_ns: f.spec.start_ns,
                    fct_ns: fct,
                    slowdown: fct.map(|x| x as f64 / ideal.max(1) as f64),
                }
            })
            .collect();
        let drops = self
            .switches
            .iter()
            .flatten()
            .map(|s| {
                (0..s.port_count())
                    .map(|p| s.counters(p).dropped)
                    .sum::<u64>()
            })
            .sum();
        let retransmitted = self.hosts.iter().map(|h| h.retransmitted).sum::<u64>()
            + self
                .flows
                .iter()
                .filter(|f| f.done_ns.is_none())
                .filter_map(|f| {
                    f.qps
                        .and_then(|(qa, _)| self.hosts[f.spec.src].engine.qp_counters(qa).ok())
                })
                .map(|c| c.retransmitted)
                .sum::<u64>();
        let mut r = SimResult::new(
            label,
            self.now,
            self.monitor.as_ref(),
            flows,
            drops,
            retransmitted,
            self.events_run,
        );
        r.probe_overhead = self.probe_bytes as f64 / self.host_tx_bytes.max(1) as f64;
        r
    }

    /// Records the telemetry events that reach flow `id`'s sender, as
    /// `bench hpcc-replay` input lines.
    pub fn trace_flow(&mut self, id: usize) {
        self.trace = Some((id, Vec::new()));
    }

    /// The recorded trace (see [`Simulator::trace_flow`]).
    pub fn trace_lines(&self) -> &[String] {
        self.trace.as_ref().map_or(&[], |t| &t.1)
    }

    fn record_trace(&mut self, h: usize, frame: &[u8]) {
        let Some((id, lines)) = self.trace.as_mut() else {
            return;
        };
        let Some(f) = self.flows.get(*id) else { return };
        let (Some((qa, _)), true) = (f.qps, f.spec.src == h) else {
            return;
        };
        let Ok(p) = transport::wire::Packet::parse(frame) else {
            return;
        };
        let (Some(t), true) = (p.repr.tlm, p.repr.bth.dest_qp == qa) else {
            return;
        };
        if !t.echo {
            return;
        }
        let ack_seq = p
            .repr
            .probe
            .map_or(p.repr.bth.psn, |pr| pr.snd_psn & 0x00FF_FFFF);
        let Ok(snd_nxt) = self.hosts[h].engine.qp_snd_nxt(qa) else {
            return;
        };
        let hops: Vec<pacer::Hop> = t
            .filled()
            .iter()
            .map(|x| pacer::Hop {
                ts_ns: x.ts_ns,
                tx_bytes: x.tx_bytes,
                qlen: x.qlen,
                rate_100mbps: x.rate,
                switch_id: x.switch_id,
                port_id: x.port_id,
            })
            .collect();
        let ev = pacer::trace::TraceEvent {
            ack_seq,
            snd_nxt,
            hops: pacer::HopStack::from_slice(&hops),
        };
        lines.push(ev.to_string());
    }

    /// Events handled so far.
    pub fn events_run(&self) -> u64 {
        self.events_run
    }
}

/// Destination host of an IPv4 frame.
fn dst_host(frame: &[u8]) -> Option<usize> {
    let ip = Ipv4Packet::new_checked(frame.get(ethernet::HEADER_LEN..)?).ok()?;
    Some(host_index(ip.dst()))
}

/// (destination host, DestQP) of a RoCEv2 frame.
fn flow_key(frame: &[u8]) -> Option<(usize, Qpn)> {
    let dst = dst_host(frame)?;
    let at = ethernet::HEADER_LEN + ipv4::HEADER_LEN + udp::HEADER_LEN;
    let b = bth::Bth::new_checked(frame.get(at..)?).ok()?;
    Some((dst, b.dest_qp()))
}
