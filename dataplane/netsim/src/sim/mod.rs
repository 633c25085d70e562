//! A deterministic virtual-time network simulator. Hosts run the real RC
//! engine (`transport::rc`) and congestion controllers (`pacer`); switches
//! run the software INT switch ([`crate::switch`]); links have a bandwidth
//! and a propagation delay. Everything happens in one event queue ordered
//! by (time, sequence), so a seed fixes the run exactly.
//!
//! A host is the one NIC pipeline (`nic::Nic::poll`) on a [`SimLink`]: it
//! puts a frame on its link whenever the link is free and the engine has
//! one, and sleeps until the engine's next timer otherwise. Flows are RDMA
//! WRITEs over a QP pair made for the flow.

mod metrics;
pub mod scenario;
pub mod topology;

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeSet, BinaryHeap, HashMap};

use dary_heap::QuaternaryHeap;

use nic::{Completions, Nic};
use pacer::HpccSettings;
use transport::mr::{Access, Memory, MrKeys};
use transport::rc::DEFAULT_DSCP;
use transport::rc::{
    CcMode, ConnectParams, Cqe, Endpoint, Engine, EngineConfig, PathMtu, Qpn, SendWr, Sge,
    WcStatus, WrOp,
};
use transport::wire::{MacAddr, Opcode, RoceFrame};

use crate::int_response::IntResponseConfig;
use crate::link::SimLink;
use crate::mmu::{IngressLimits, PfcConfig};
use crate::qos::QosConfig;
use crate::switch::{class_of, serialization_ns, EcnConfig, PortConfig, Switch};
use metrics::Monitor;
pub use metrics::{
    Bucket, CountGroup, FeedbackSummary, FlowResult, IntResponseSummary, PathSummary, PfcSummary,
    PortStat, SimResult, BURST_DRAINED_BYTES,
};
use topology::{host_index, host_ip, End, NodeKind, Topology};
use transport::wire::pfc::{self, PfcRepr};

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
    /// HPCC++ T (known base RTT), N, eta and maxStage.
    pub hpcc: HpccSettings,
    /// Switch ECN marking (used by DCQCN runs).
    pub ecn: Option<EcnConfig>,
    /// With ECN: thresholds are for ports of this rate and scale with a
    /// port's rate (the HPCC authors' KMIN_MAP/KMAX_MAP: x4 at 400G);
    /// `None` gives every port the same.
    pub ecn_ref_bps: Option<u64>,
    /// DCQCN's reaction point (its line rate is each host's link rate).
    pub dcqcn: pacer::dcqcn::DcqcnParams,
    /// DCQCN's notification point: one CNP per QP per this interval.
    pub cnp_interval_ns: u64,
    /// Local ACK timeout exponent of every QP.
    pub timeout: u8,
    /// AckReq at least every this many packets (HPCC++ inband reacts to
    /// the telemetry of each ACK, so 1 gives it the freshest).
    pub ack_req_every: u32,
    /// Flows start before this virtual time; the monitored port is
    /// measured up to it.
    pub duration_ns: u64,
    /// After `duration_ns`, keep running up to this long while flows that
    /// started are unfinished (ns-3 lets its runs drain likewise); what is
    /// still unfinished then is reported as such.
    pub drain_ns: u64,
    /// Statistics (queue percentiles, utilization) start here.
    pub measure_from_ns: u64,
    /// Width of the buckets of the time series (queue, rates, fairness).
    pub sample_ns: u64,
    /// The egress port whose queue, utilization and fairness are reported.
    pub monitor: Option<End>,
    /// Lossless switches: the buffer given to [`Simulator::new`] is each
    /// switch's shared buffer, with PFC by these rules (headroom and
    /// share per port as the HPCC authors set them); `None`: drop-tail
    /// per port.
    pub pfc: Option<PfcConfig>,
    /// Switches send ACKs, NAKs and CNPs before data, never paused (the
    /// authors' ACK_HIGH_PRIO, on in their DCQCN runs).
    pub control_first: bool,
    /// Hosts whose NIC stops taking frames from this time on and holds
    /// its link with PAUSE frames for ever (a stuck receiver: the start
    /// of a PFC storm).
    pub stuck_hosts: Vec<(usize, u64)>,
    /// A port paused this long without a break is reported as stormed.
    pub storm_ns: u64,
    /// Senders ask for 8-byte telemetry hop records (wire::tlm COMPACT)
    /// instead of 16-byte ones.
    pub compact_int: bool,
    /// Switches answer subscribed packets in queues at or above a
    /// threshold with INT responses, and senders subscribe their data
    /// packets (HPCC++ draft-00 s6.3); `None`: off.
    pub int_response: Option<IntResponseConfig>,
    /// Payload bytes per packet instead of the path MTU (the HPCC authors'
    /// simulator sends 1000); our own engines at both ends only.
    pub payload_bytes: Option<u32>,
    /// Receiver-measured N (HPCC++ draft-00 s6.2): receivers count the
    /// flows through their last hop and senders take W_AI from the count.
    pub receiver_n: bool,
    /// QoS classes at every switch port (HPCC++ 2023 s9.3); `None`: one
    /// FIFO per port.
    pub qos: Option<QosConfig>,
    /// Senders ask switches for sojourn times instead of queue lengths.
    pub int_sojourn: bool,
    /// Path choice from telemetry (HPCC++ 2023 s9.4); `None`: one path per
    /// flow.
    pub path_choice: Option<pacer::path::PathConfig>,
    /// Every connection gets a feedback key (drawn from the seed): ACKs
    /// carry a MAC over their echoed telemetry (rc::auth).
    pub feedback_auth: bool,
    /// The network is a telemetry domain whose boundary is every switch
    /// port facing a host (HPCC++ 2023 s9.1): hosts see only relative
    /// load (docs/wire.md, "Relative telemetry").
    pub relative_boundary: bool,
}

impl SimConfig {
    pub fn new(cc: CcMode, duration_ns: u64) -> Self {
        SimConfig {
            seed: 1,
            cc,
            mtu: PathMtu::Mtu1024,
            hpcc: HpccSettings {
                t_ns: 8_000,
                ..HpccSettings::default()
            },
            ecn: None,
            ecn_ref_bps: None,
            dcqcn: pacer::dcqcn::DcqcnParams::new(100e9),
            cnp_interval_ns: pacer::dcqcn::CnpLimiter::DEFAULT_INTERVAL_NS,
            timeout: 10,
            ack_req_every: 1,
            duration_ns,
            drain_ns: 0,
            measure_from_ns: 0,
            sample_ns: 10_000,
            monitor: None,
            pfc: None,
            control_first: false,
            stuck_hosts: Vec::new(),
            storm_ns: 1_000_000,
            compact_int: false,
            int_response: None,
            payload_bytes: None,
            receiver_n: false,
            qos: None,
            int_sojourn: false,
            path_choice: None,
            feedback_auth: false,
            relative_boundary: false,
        }
    }
}

/// Why a simulation cannot be built, naming the bad value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SimError {
    #[error("host {host} has {links} links; a host has exactly one")]
    HostLinks { host: usize, links: usize },
    #[error("HPCC++ parameters of host {host}: {source}")]
    Hpcc {
        host: usize,
        source: pacer::ParamError,
    },
    #[error("registering the hosts' memory: {0}")]
    Memory(String),
    #[error("the monitored node {0} is not a switch")]
    MonitorNotSwitch(usize),
    #[error("the monitored switch has no port {0}")]
    MonitorPort(usize),
    #[error("stuck host {host}: there are {hosts} hosts")]
    StuckHost { host: usize, hosts: usize },
    #[error("QoS at switch node {node}: {source}")]
    Qos {
        node: usize,
        source: crate::qos::QosError,
    },
    #[error("switch {node}: {source}")]
    Switch {
        node: usize,
        source: crate::switch::SwitchError,
    },
    #[error("flow {src} -> {dst}: bad hosts (there are {hosts})")]
    FlowHosts {
        src: usize,
        dst: usize,
        hosts: usize,
    },
}

/// A flow: `size` bytes written from host `src` to host `dst` at `start_ns`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowSpec {
    pub src: usize,
    pub dst: usize,
    pub size: u64,
    pub start_ns: u64,
    /// The flow's DSCP (its QoS class); `None`: the engines' (26).
    pub dscp: Option<u8>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// A frame (slot in `frames`) reaches `node` on its `port`.
    Arrive {
        node: u32,
        port: u32,
        frame: u32,
    },
    /// A switch port finished sending.
    PortFree {
        node: u32,
        port: u32,
    },
    /// A host's NIC should look for work.
    HostWake {
        host: u32,
    },
    /// A switch refreshes the PAUSE frames it holds its upstreams with.
    PfcRefresh {
        node: u32,
    },
    /// A stuck host's NIC sends PAUSE again.
    StuckPause {
        host: u32,
    },
    Sample,
}

/// An index (node, port, host, frame slot) as an event holds it: 32 bits
/// keep a queued event at 32 bytes, two to a cache line.
fn ix(i: usize) -> u32 {
    u32::try_from(i).expect("fewer than 2^32 nodes, ports, hosts and frames in flight")
}

/// An event at its time; the earliest (then the first queued) is the
/// greatest, for the max-heap.
struct Scheduled {
    at: u64,
    seq: u64,
    event: Event,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for Scheduled {}

impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Scheduled {
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

struct Host {
    node: usize,
    nic: Nic<SimLink, NullMemory>,
    keys: MrKeys,
    peer: End,
    delay_ns: u64,
    /// Times of this host's HostWake events in the heap (a few at most:
    /// one is added only when none falls between now and the time
    /// wanted, since a poll reschedules the next).
    wakes: Vec<u64>,
    retransmitted: u64,
    /// Stuck from this time on (see [`SimConfig::stuck_hosts`]).
    stuck_from: Option<u64>,
    /// Frames a stuck host did not take.
    stuck_drops: u64,
}

struct FlowState {
    spec: FlowSpec,
    qps: Option<(Qpn, Qpn)>,
    done_ns: Option<u64>,
    status: Option<WcStatus>,
    /// The flow's FCT alone on an idle path (see [`Simulator::ideal_fct_ns`]).
    ideal_ns: u64,
}

/// Largest WRITE posted at once (flows above are split).
const MAX_WRITE: u64 = 1 << 30;

/// Bytes every packet of a flow carries besides its payload (Ethernet,
/// IPv4, UDP, BTH, ICRC), and the RETH of a WRITE's first packet.
const PACKET_OVERHEAD: u64 = (transport::wire::ethernet::HEADER_LEN
    + transport::wire::ipv4::HEADER_LEN
    + transport::wire::udp::HEADER_LEN
    + transport::wire::bth::HEADER_LEN
    + transport::wire::icrc::ICRC_LEN) as u64;
const RETH_BYTES: u64 = transport::wire::reth::HEADER_LEN as u64;

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
    /// Pending events: a 4-ary heap (half the depth of a binary one, the
    /// four children of a node in two cache lines).
    events: QuaternaryHeap<Scheduled>,
    /// Flows not started yet, by (start time, flow).
    starts: BinaryHeap<Reverse<(u64, usize)>>,
    /// Flows started and not finished, in flow order.
    active: BTreeSet<usize>,
    seq: u64,
    frames: Vec<Vec<u8>>,
    free_frames: Vec<usize>,
    now: u64,
    monitor: Option<Monitor>,
    /// Completions of the host being polled.
    cqes: Vec<Cqe>,
    events_run: u64,
    /// A flow whose telemetry events are recorded (hpcc-replay lines).
    trace: Option<(usize, Vec<String>)>,
    /// Bytes hosts put on their links, and those of TLM_REQUEST /
    /// TLM_RESPONSE probes among them.
    host_tx_bytes: u64,
    probe_bytes: u64,
    /// Frames a switch could not route (not RoCEv2, or to no host).
    unroutable: u64,
    /// Per switch node: the time of its queued PFC refresh (u64::MAX: none).
    refresh_at: Vec<u64>,
}

fn mac_of(host: usize) -> MacAddr {
    let b = (host as u32).to_be_bytes();
    MacAddr([0x02, 0, b[0], b[1], b[2], b[3]])
}

impl Simulator {
    /// Builds hosts (an RC engine each) and switches for `topo`.
    pub fn new(cfg: SimConfig, topo: Topology, buffer_bytes: u64) -> Result<Self, SimError> {
        let routes = topo.routes();
        let host_nodes = topo.hosts();
        let mut hosts = Vec::with_capacity(host_nodes.len());
        for (i, &node) in host_nodes.iter().enumerate() {
            if topo.ports[node].len() != 1 {
                return Err(SimError::HostLinks {
                    host: i,
                    links: topo.ports[node].len(),
                });
            }
            let (peer, link) = topo.peer(node, 0);
            let mut ec = EngineConfig::new(mac_of(i), host_ip(i), link.rate_bps)
                .with_cc(cfg.cc, &cfg.hpcc, cfg.mtu.bytes())
                .map_err(|e| SimError::Hpcc { host: i, source: e })?;
            ec.ack_req_every = cfg.ack_req_every;
            ec.dcqcn = pacer::dcqcn::DcqcnParams {
                line_rate_bps: link.rate_bps as f64,
                ..cfg.dcqcn
            };
            ec.cnp_interval_ns = cfg.cnp_interval_ns;
            ec.compact_int = cfg.compact_int;
            ec.int_subscribe = cfg.int_response.is_some();
            ec.segment_bytes = cfg.payload_bytes;
            ec.report_flows = cfg.receiver_n;
            ec.int_sojourn = cfg.int_sojourn;
            ec.path_choice = cfg.path_choice;
            let mut engine = Engine::new(ec, NullMemory, 0);
            let keys = engine
                .register_mr(0, 1 << 40, Access::ALL)
                .map_err(|e| SimError::Memory(e.to_string()))?;
            let port = SimLink::new(mac_of(i), cfg.mtu.bytes(), link.rate_bps);
            hosts.push(Host {
                node,
                nic: Nic::new(engine, port, cfg.mtu.bytes()),
                keys,
                peer,
                delay_ns: link.delay_ns,
                wakes: Vec::new(),
                retransmitted: 0,
                stuck_from: None,
                stuck_drops: 0,
            });
        }
        for &(h, from) in &cfg.stuck_hosts {
            let hosts_n = hosts.len();
            let host = hosts.get_mut(h).ok_or(SimError::StuckHost {
                host: h,
                hosts: hosts_n,
            })?;
            host.stuck_from = Some(from);
        }
        // The hosts' rate: a port this fast gets 1/8 of the free buffer.
        let host_rate = hosts.first().map_or(0, |h| h.nic.port().rate_bps());
        let mut switches: Vec<Option<Switch>> = Vec::with_capacity(topo.nodes.len());
        let mut sid = 0u8;
        for n in 0..topo.nodes.len() {
            if topo.nodes[n] != NodeKind::Switch {
                switches.push(None);
                continue;
            }
            sid = sid.wrapping_add(1);
            let ports: Vec<PortConfig> = (0..topo.ports[n].len())
                .map(|p| {
                    let rate_bps = topo.peer(n, p).1.rate_bps;
                    PortConfig {
                        rate_bps,
                        buffer_bytes,
                        ecn: cfg.ecn.map(|e| match cfg.ecn_ref_bps {
                            Some(r) => e.scaled(rate_bps as f64 / r.max(1) as f64),
                            None => e,
                        }),
                    }
                })
                .collect();
            let mut sw = Switch::new(sid, &ports, cfg.seed);
            // Per switch, as ns-3 seeds its ECMP hash with the node id.
            sw.set_ecmp_seed(n as u32);
            sw.set_control_first(cfg.control_first);
            if let Some(r) = cfg.int_response {
                sw.enable_int_responses(r);
            }
            if cfg.relative_boundary {
                for p in 0..topo.ports[n].len() {
                    let host = topo.nodes[topo.peer(n, p).0.node] == NodeKind::Host;
                    sw.set_relative_telemetry(p, host);
                }
            }
            if let Some(q) = &cfg.qos {
                sw.set_qos(q.clone())
                    .map_err(|source| SimError::Qos { node: n, source })?;
            }
            if let Some(pfc) = cfg.pfc {
                let limits: Vec<IngressLimits> = (0..topo.ports[n].len())
                    .map(|p| {
                        let link = topo.peer(n, p).1;
                        IngressLimits::for_link(link.rate_bps, link.delay_ns, host_rate)
                    })
                    .collect();
                let pfc = PfcConfig {
                    buffer_bytes,
                    ..pfc
                };
                sw.enable_pfc(pfc, &limits)
                    .map_err(|source| SimError::Switch { node: n, source })?;
            }
            switches.push(Some(sw));
        }
        let monitor = match cfg.monitor {
            Some(e) => {
                let sw = switches
                    .get(e.node)
                    .and_then(Option::as_ref)
                    .ok_or(SimError::MonitorNotSwitch(e.node))?;
                if e.port >= sw.port_count() {
                    return Err(SimError::MonitorPort(e.port));
                }
                Some(Monitor::new(e, sw.port_config(e.port).rate_bps, &cfg))
            }
            None => None,
        };
        let refresh_at = vec![u64::MAX; topo.nodes.len()];
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
            events: QuaternaryHeap::new(),
            starts: BinaryHeap::new(),
            active: BTreeSet::new(),
            seq: 0,
            frames: Vec::new(),
            free_frames: Vec::new(),
            now: 0,
            monitor,
            cqes: Vec::new(),
            events_run: 0,
            trace: None,
            host_tx_bytes: 0,
            probe_bytes: 0,
            unroutable: 0,
            refresh_at,
        };
        if s.monitor.is_some() {
            s.push(s.cfg.sample_ns, Event::Sample);
        }
        for h in 0..s.hosts.len() {
            if let Some(t) = s.hosts[h].stuck_from {
                s.push(t, Event::StuckPause { host: ix(h) });
            }
        }
        Ok(s)
    }

    pub fn host_count(&self) -> usize {
        self.hosts.len()
    }

    /// The completion time of a flow of `size` bytes from `src` to `dst`
    /// alone on an idle path, as the HPCC authors' ns-3 computes it
    /// (`qp_finish` in `third.cc`): the round trip's propagation delay,
    /// one MTU-sized packet serialized at every hop of the way there, and
    /// the flow's bytes with their per-packet headers (ours, without
    /// telemetry) at the path's slowest link.
    pub fn ideal_fct_ns(&self, src: usize, dst: usize, size: u64) -> u64 {
        let mtu = u64::from(self.cfg.mtu.bytes());
        let mtu = self
            .cfg
            .payload_bytes
            .map_or(mtu, |p| u64::from(p).clamp(1, mtu));
        let (mut n, mut delay, mut per_hop, mut slowest) =
            (self.hosts[src].node, 0u64, 0u64, u64::MAX);
        let mut hops = 0;
        while n != self.hosts[dst].node && hops < 64 {
            let Some(&port) = self.routes[n][dst].first() else {
                break;
            };
            let (e, link) = self.topo.peer(n, port);
            delay += link.delay_ns;
            per_hop += crate::switch::serialization_ns(mtu as usize, link.rate_bps);
            slowest = slowest.min(link.rate_bps);
            n = e.node;
            hops += 1;
        }
        let packets = size.div_ceil(mtu).max(1);
        let bytes = size + packets * PACKET_OVERHEAD + RETH_BYTES;
        2 * delay + per_hop + crate::switch::serialization_ns(bytes as usize, slowest)
    }

    /// Adds a flow.
    pub fn add_flow(&mut self, spec: FlowSpec) -> Result<usize, SimError> {
        if spec.src >= self.hosts.len() || spec.dst >= self.hosts.len() || spec.src == spec.dst {
            return Err(SimError::FlowHosts {
                src: spec.src,
                dst: spec.dst,
                hosts: self.hosts.len(),
            });
        }
        let ideal_ns = self.ideal_fct_ns(spec.src, spec.dst, spec.size);
        let id = self.flows.len();
        self.flows.push(FlowState {
            spec,
            qps: None,
            done_ns: None,
            status: None,
            ideal_ns,
        });
        // Flow starts wait in their own queue, not in the event heap (a
        // workload of 100k flows would make every heap operation walk a
        // 100k-entry heap).
        self.starts.push(Reverse((spec.start_ns, id)));
        Ok(id)
    }

    fn push(&mut self, t: u64, e: Event) {
        self.seq += 1;
        self.events.push(Scheduled {
            at: t,
            seq: self.seq,
            event: e,
        });
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

    /// Puts `frame` on a link: it reaches `to` at `at`.
    fn send_frame(&mut self, at: u64, to: End, frame: Vec<u8>) {
        let slot = self.store(frame);
        self.push(
            at,
            Event::Arrive {
                node: ix(to.node),
                port: ix(to.port),
                frame: ix(slot),
            },
        );
    }

    /// Makes host `h` poll at `t` at the latest. A wake already queued
    /// for `t` or earlier does (every queued wake is at now or later): that
    /// poll asks for the next one. (Waking only when no earlier wake is
    /// queued, rather than queuing every time asked and skipping stale
    /// ones, keeps the heap from filling with far timer deadlines that
    /// every poll would add again.)
    fn wake(&mut self, h: usize, t: u64) {
        let host = &mut self.hosts[h];
        if host.wakes.iter().any(|&w| w <= t) {
            return;
        }
        host.wakes.push(t);
        self.push(t, Event::HostWake { host: ix(h) });
    }

    /// Runs until the duration ends or nothing is left to happen.
    pub fn run(&mut self) {
        let stop = self.cfg.duration_ns.saturating_add(self.cfg.drain_ns);
        loop {
            // A flow starts before any event of the same time.
            let next_start = self.starts.peek().map(|s| s.0 .0);
            let next_event = self.events.peek().map(|e| e.at);
            if next_start.is_some_and(|a| next_event.is_none_or(|b| a <= b)) {
                let Some(Reverse((t, flow))) = self.starts.pop() else {
                    break;
                };
                if t > stop {
                    break;
                }
                self.now = t;
                self.events_run += 1;
                self.start_flow(flow);
                continue;
            }
            let Some(Scheduled {
                at: t, event: e, ..
            }) = self.events.pop()
            else {
                break;
            };
            if t > stop {
                break;
            }
            self.now = t;
            self.events_run += 1;
            match e {
                Event::Arrive { node, port, frame } => {
                    self.arrive(node as usize, port as usize, frame as usize)
                }
                Event::PortFree { node, port } => self.port_free(node as usize, port as usize),
                Event::HostWake { host } => {
                    let host = host as usize;
                    let wakes = &mut self.hosts[host].wakes;
                    if let Some(i) = wakes.iter().position(|&w| w == t) {
                        wakes.swap_remove(i);
                    }
                    self.poll_host(host);
                }
                Event::PfcRefresh { node } => {
                    let node = node as usize;
                    if self.refresh_at[node] == t {
                        self.refresh_at[node] = u64::MAX;
                        if let Some(sw) = self.switches[node].as_mut() {
                            sw.refresh_pauses(t);
                        }
                        self.send_pfc(node);
                    }
                }
                Event::StuckPause { host } => self.stuck_pause(host as usize),
                Event::Sample => {
                    let active = self.active_flows();
                    if let Some(m) = self.monitor.as_mut() {
                        let sw = self.switches[m.end.node].as_mut();
                        let q = sw.as_ref().map_or(0, |s| s.qlen(m.end.port));
                        if let Some(sw) = sw {
                            m.classes_at(t, sw);
                        }
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
        self.active.iter().copied().collect()
    }

    fn start_flow(&mut self, id: usize) {
        let spec = self.flows[id].spec;
        let now = self.now;
        let qa = self.hosts[spec.src]
            .nic
            .engine_mut()
            .create_qp(1 + (spec.size / MAX_WRITE) as usize, now);
        let qb = self.hosts[spec.dst].nic.engine_mut().create_qp(1, now);
        let (Ok(qa), Ok(qb)) = (qa, qb) else {
            self.flows[id].done_ns = Some(now);
            self.flows_done += 1;
            return;
        };
        let feedback_key = self.cfg.feedback_auth.then(|| {
            use rand::{RngCore, SeedableRng};
            let mut k = [0u8; 16];
            rand_chacha::ChaCha8Rng::seed_from_u64(self.cfg.seed ^ (id as u64) << 20)
                .fill_bytes(&mut k);
            transport::rc::auth::FeedbackKey(k)
        });
        let params = ConnectParams {
            timeout: self.cfg.timeout,
            dscp: spec.dscp,
            feedback_key,
            ..ConnectParams::new(self.cfg.mtu)
        };
        for (h, q, peer_q, peer) in [(spec.src, qa, qb, spec.dst), (spec.dst, qb, qa, spec.src)] {
            let end = Endpoint {
                qpn: peer_q,
                psn: 0,
                mac: mac_of(peer),
                ip: host_ip(peer),
            };
            let ok = self.hosts[h]
                .nic
                .engine_mut()
                .connect_to(q, 0, &end, &params)
                .is_ok();
            debug_assert!(ok, "QP bring-up of a fresh QP");
        }
        let (lkey, rkey) = (
            self.hosts[spec.src].keys.lkey,
            self.hosts[spec.dst].keys.rkey,
        );
        let engine = self.hosts[spec.src].nic.engine_mut();
        let mut off = 0u64;
        loop {
            let len = (spec.size - off).min(MAX_WRITE);
            let last = off + len >= spec.size;
            let local = Sge {
                lkey,
                va: off,
                len: len as u32,
            };
            let wr = SendWr {
                signaled: last,
                ..SendWr::new(id as u64, WrOp::Write, local, rkey, off)
            };
            if engine.post_send(qa, wr, now).is_err() {
                break;
            }
            off += len;
            if last {
                break;
            }
        }
        self.flows[id].qps = Some((qa, qb));
        self.active.insert(id);
        self.by_qp.insert((spec.dst, qb), id);
        self.wake(spec.src, now);
    }

    /// One pass of host `h`'s NIC: what it put on its link travels to the
    /// peer; it wakes again when its link frees, or at its next timer.
    fn poll_host(&mut self, h: usize) {
        let now = self.now;
        let mut done = Completions(std::mem::take(&mut self.cqes));
        let host = &mut self.hosts[h];
        host.nic.poll(now, &mut done);
        let (peer, delay) = (host.peer, host.delay_ns);
        if let Some((left, frame)) = host.nic.port_mut().take_sent() {
            self.host_tx_bytes += frame.len() as u64;
            let probing =
                matches!(self.cfg.cc, CcMode::HpccProbe { .. }) || self.cfg.path_choice.is_some();
            let probe = probing
                && RoceFrame::new_checked(&frame[..]).is_ok_and(|f| {
                    [Opcode::TlmRequest as u8, Opcode::TlmResponse as u8].contains(&f.opcode_raw())
                });
            if probe {
                self.probe_bytes += frame.len() as u64;
            }
            self.send_frame(left + delay, peer, frame);
        }
        let nic = &self.hosts[h].nic;
        let busy = nic.port().busy_until();
        if busy > now {
            self.wake(h, busy);
        } else if let Some(t) = nic.next_wakeup(now) {
            self.wake(h, t.max(now + 1));
        }
        for c in done.0.drain(..) {
            self.complete(c);
        }
        self.cqes = done.0;
    }

    fn complete(&mut self, c: Cqe) {
        let id = c.wr_id as usize;
        let Some(f) = self.flows.get_mut(id) else {
            return;
        };
        if f.done_ns.is_some() {
            return;
        }
        f.done_ns = Some(self.now);
        f.status = Some(c.status);
        self.flows_done += 1;
        self.active.remove(&id);
        if let Some((qa, qb)) = f.qps {
            let (src, dst) = (f.spec.src, f.spec.dst);
            let ea = self.hosts[src].nic.engine_mut();
            if let Ok(cn) = ea.qp_counters(qa) {
                self.hosts[src].retransmitted += cn.retransmitted;
            }
            let _ = self.hosts[src].nic.engine_mut().destroy_qp(qa);
            let _ = self.hosts[dst].nic.engine_mut().destroy_qp(qb);
            self.by_qp.remove(&(dst, qb));
        }
    }

    fn arrive(&mut self, node: usize, in_port: usize, slot: usize) {
        let frame = std::mem::take(&mut self.frames[slot]);
        self.free_frames.push(slot);
        if self.topo.nodes[node] == NodeKind::Host {
            let h = self.node_host[node];
            if self.hosts[h].stuck_from.is_some_and(|t| t <= self.now) {
                self.hosts[h].stuck_drops += 1;
                return;
            }
            if self.trace.is_some() {
                self.record_trace(h, &frame);
            }
            self.hosts[h].nic.port_mut().deliver(frame);
            self.poll_host(h);
            return;
        }
        self.forward(node, Some(in_port), frame);
    }

    /// Switch `node` takes `frame` (from `ingress`, or its own INT
    /// response): routes it, queues it, sends what PFC asks for and starts
    /// the port. One view of the frame gives the route, the ECMP key and
    /// the queue class.
    fn forward(&mut self, node: usize, ingress: Option<usize>, frame: Vec<u8>) {
        let route = RoceFrame::new_checked(&frame[..]).ok().and_then(|f| {
            let dst = host_index(f.dst_ip())?;
            Some((dst, crate::switch::tuple_of(&f), class_of(&f)))
        });
        let Some((choices, key, class)) =
            route.and_then(|(dst, key, class)| Some((self.routes[node].get(dst)?, key, class)))
        else {
            // Not RoCEv2: PFC from downstream, or nothing to route.
            match ingress {
                Some(port) if pfc::is_mac_control(&frame) => self.switch_pfc(node, port, &frame),
                _ => self.unroutable += 1,
            }
            return;
        };
        let sw = self.switches[node].as_mut().expect("switch node");
        let Some(out) = sw.ecmp_by_key(key, choices) else {
            self.unroutable += 1;
            return;
        };
        sw.enqueue_as(self.now, ingress, out, frame, class);
        let pfc = sw.has_pfc();
        let q = sw.qlen(out);
        let response = sw.pop_int_response();
        if let Some(m) = self
            .monitor
            .as_mut()
            .filter(|m| m.end.node == node && m.end.port == out)
        {
            m.queue_changed(self.now, q);
        }
        if pfc {
            self.send_pfc(node);
        }
        self.port_free(node, out);
        if let Some(r) = response {
            self.forward(node, None, r);
        }
    }

    /// A PFC frame from downstream on `port` of switch `node`: holds (or
    /// frees) the port's data; the port is looked at again when the pause
    /// ends (at once for a RESUME).
    fn switch_pfc(&mut self, node: usize, port: usize, frame: &[u8]) {
        let Some(sw) = self.switches[node].as_mut() else {
            return;
        };
        let end = PfcRepr::parse(frame)
            .ok()
            .and_then(|p| sw.receive_pfc(self.now, port, &p));
        if let Some(end) = end {
            self.push(
                end,
                Event::PortFree {
                    node: ix(node),
                    port: ix(port),
                },
            );
        }
    }

    /// Puts the PFC frames switch `node` asked for on their links (a MAC
    /// control frame goes out as soon as the frame on the wire has left,
    /// ahead of the queue; its own 60 bytes take no turn of the queue),
    /// and queues the switch's next PAUSE refresh.
    fn send_pfc(&mut self, node: usize) {
        let Some(sw) = self.switches[node].as_mut() else {
            return;
        };
        let out: Vec<(usize, PfcRepr)> = sw.take_pfc().collect();
        for (port, msg) in out {
            let sw = self.switches[node].as_ref().expect("switch node");
            let frame = msg.to_frame(sw.port_mac(port));
            let leaves = sw.busy_until(port).max(self.now);
            let (peer, link) = self.topo.peer(node, port);
            let at = leaves + serialization_ns(frame.len(), link.rate_bps) + link.delay_ns;
            self.send_frame(at, peer, frame);
        }
        let next = self.switches[node].as_ref().and_then(|s| s.next_refresh());
        if let Some(t) = next.filter(|&t| t < self.refresh_at[node]) {
            self.refresh_at[node] = t;
            self.push(t, Event::PfcRefresh { node: ix(node) });
        }
    }

    /// A stuck host's NIC holds its link: PAUSE for the longest time,
    /// again before it runs out.
    fn stuck_pause(&mut self, h: usize) {
        let host = &self.hosts[h];
        let (peer, delay, rate) = (host.peer, host.delay_ns, host.nic.port().rate_bps());
        let pfc = self.cfg.pfc.unwrap_or(PfcConfig::new(0));
        let quanta = pfc.pause_quanta;
        let frame = PfcRepr::one(pfc.priority, quanta).to_frame(mac_of(h));
        let at = self.now + serialization_ns(frame.len(), rate) + delay;
        self.send_frame(at, peer, frame);
        let again = (pfc::quanta_ns(quanta, rate) / 2).max(1);
        self.push(self.now + again, Event::StuckPause { host: ix(h) });
    }

    fn port_free(&mut self, node: usize, port: usize) {
        let now = self.now;
        let sw = self.switches[node].as_mut().expect("switch node");
        let Some((frame, done)) = sw.dequeue(now, port) else {
            return;
        };
        if sw.has_pfc() {
            self.send_pfc(node);
        }
        let sw = self.switches[node].as_ref().expect("switch node");
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
        self.send_frame(done + link.delay_ns, peer, frame);
        self.push(
            done,
            Event::PortFree {
                node: ix(node),
                port: ix(port),
            },
        );
    }

    /// Results of the run so far.
    pub fn result(&self, label: &str) -> SimResult {
        let flows: Vec<FlowResult> = self
            .flows
            .iter()
            .map(|f| {
                let fct = f
                    .done_ns
                    .filter(|_| f.status == Some(WcStatus::Success))
                    .map(|d| d - f.spec.start_ns);
                FlowResult {
                    src: f.spec.src,
                    dst: f.spec.dst,
                    size: f.spec.size,
                    start_ns: f.spec.start_ns,
                    fct_ns: fct,
                    ideal_ns: f.ideal_ns,
                    // Clamped at 1 as the authors' fct_analysis.py does (a
                    // flow can beat the ideal by a few ns of rounding).
                    slowdown: fct.map(|x| (x as f64 / f.ideal_ns.max(1) as f64).max(1.0)),
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
                    f.qps.and_then(|(qa, _)| {
                        self.hosts[f.spec.src].nic.engine().qp_counters(qa).ok()
                    })
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
        r.unroutable = self.unroutable;
        r.ports = self.port_stats();
        r.pfc = self.pfc_summary(&r.ports);
        r.int_response = self.cfg.int_response.map(|_| self.int_response_summary());
        let mut t = transport::rc::QpCounters::default();
        for h in &self.hosts {
            t.accumulate(&h.nic.engine().qp_totals());
        }
        r.paths = self.cfg.path_choice.map(|_| PathSummary {
            probes: t.path_probes,
            answered: t.path_probe_responses,
            moves: t.path_moves,
        });
        r.feedback = self.cfg.feedback_auth.then_some(FeedbackSummary {
            forged: t.feedback_forged,
            replayed: t.feedback_replayed,
            unkeyed: t.feedback_unkeyed,
        });
        r.relative_rewrites = self.cfg.relative_boundary.then(|| {
            self.switches
                .iter()
                .flatten()
                .flat_map(|sw| (0..sw.port_count()).map(|p| sw.counters(p).tlm_relative))
                .sum()
        });
        if let (Some(m), Some(q)) = (self.monitor.as_ref(), self.cfg.qos.as_ref()) {
            let sw = self.switches[m.end.node].as_ref();
            r.classes = sw.map_or_else(Vec::new, |sw| m.class_results(self.now, sw, q));
            for f in &self.flows {
                let c = q.class_of(f.spec.dscp.unwrap_or(DEFAULT_DSCP));
                if let Some(cr) = r.classes.get_mut(c) {
                    cr.flows += 1;
                }
            }
        }
        r
    }

    /// INT responses over the run: the switches' counters and what the
    /// senders' QPs took.
    fn int_response_summary(&self) -> IntResponseSummary {
        let mut s = IntResponseSummary::default();
        for c in self
            .switches
            .iter()
            .flatten()
            .filter_map(|w| w.int_response_counters())
        {
            s.sent += c.sent;
            s.suppressed += c.suppressed;
            s.no_room += c.no_room;
        }
        for h in &self.hosts {
            let t = h.nic.engine().qp_totals();
            s.taken += t.int_responses;
            s.stale += t.int_responses_stale;
        }
        s
    }

    /// PFC over the run, from the ports' and the NICs' counters.
    fn pfc_summary(&self, ports: &[PortStat]) -> PfcSummary {
        let now = self.now;
        let held: Vec<&PortStat> = ports.iter().filter(|p| p.paused_ns > 0).collect();
        let hol_frames: u64 = self
            .switches
            .iter()
            .flatten()
            .flat_map(|sw| (0..sw.port_count()).map(|p| sw.counters(p).hol_frames))
            .sum();
        let hol_ns: u64 = ports.iter().map(|p| p.hol_ns).sum();
        let host_paused: Vec<u64> = self
            .hosts
            .iter()
            .map(|h| h.nic.pause().paused_ns(now))
            .filter(|&t| t > 0)
            .collect();
        PfcSummary {
            pause_frames: ports.iter().map(|p| p.pause_tx).sum(),
            resume_frames: ports.iter().map(|p| p.resume_tx).sum(),
            ports_paused: held.len(),
            switch_paused_ns: held.iter().map(|p| p.paused_ns).sum(),
            hosts_paused: host_paused.len(),
            host_paused_ns: host_paused.iter().sum(),
            hol_mean_ns: hol_ns / hol_frames.max(1),
            hol_max_ns: ports.iter().map(|p| p.hol_max_ns).max().unwrap_or(0),
            storm_ports: held
                .iter()
                .filter(|p| p.longest_pause_ns >= self.cfg.storm_ns)
                .map(|p| (p.node, p.port, p.longest_pause_ns))
                .collect(),
            stuck_drops: self.hosts.iter().map(|h| h.stuck_drops).sum(),
        }
    }

    /// Every switch egress port's counters over the run so far.
    fn port_stats(&self) -> Vec<PortStat> {
        let tiers = self.topo.tiers();
        let name = |n: usize| match (self.topo.nodes[n], tiers[n]) {
            (NodeKind::Host, _) => "host".to_string(),
            (_, 1) => "tor".to_string(),
            (_, 2) => "agg".to_string(),
            (_, 3) => "core".to_string(),
            (_, t) => format!("tier{t}"),
        };
        let span = self.now.max(1) as f64;
        let mut out = Vec::new();
        for (node, sw) in self.switches.iter().enumerate() {
            let Some(sw) = sw else { continue };
            for port in 0..sw.port_count() {
                let c = sw.counters(port);
                let paused = sw.paused_ns(self.now, port);
                let (peer, link) = self.topo.peer(node, port);
                out.push(PortStat {
                    node,
                    port,
                    tier: format!("{}->{}", name(node), name(peer.node)),
                    tx_bytes: c.tx_bytes,
                    utilization: c.tx_bytes as f64 * 8e9 / (link.rate_bps as f64 * span),
                    max_qlen_bytes: c.max_qlen,
                    drops: c.dropped,
                    ecn_marked: c.ecn_marked,
                    pause_tx: c.pause_tx,
                    resume_tx: c.resume_tx,
                    pause_rx: c.pause_rx,
                    paused_ns: paused.0,
                    longest_pause_ns: paused.1,
                    hol_ns: c.hol_ns,
                    hol_max_ns: c.hol_max_ns,
                });
            }
        }
        out
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
        // INT responses name the receiver's QP, which may have the same
        // number as the sender's: not ACK telemetry.
        let ours = p.repr.bth.dest_qp == qa && p.repr.bth.opcode != Opcode::IntResponse;
        let (Some(t), true) = (p.repr.tlm, ours) else {
            return;
        };
        if !t.echo {
            return;
        }
        let ack_seq = p
            .repr
            .probe
            .map_or(p.repr.bth.psn, |pr| pr.snd_psn & 0x00FF_FFFF);
        let Ok(snd_nxt) = self.hosts[h].nic.engine().qp_snd_nxt(qa) else {
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

/// (destination host, DestQP) of a RoCEv2 frame.
fn flow_key(frame: &[u8]) -> Option<(usize, Qpn)> {
    let f = RoceFrame::new_checked(frame).ok()?;
    Some((host_index(f.dst_ip())?, f.dest_qp()))
}
