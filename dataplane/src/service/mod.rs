//! The daemon's service for applications: the hosts it runs (an RC engine
//! each, on a DPDK port, in the one NIC pipeline `nic::Nic::poll`), the
//! applications attached to them, and the run-to-completion loop that
//! moves everything:
//!
//! control requests (from [`control`]) -> per host, the pipeline: RX burst
//! -> engine -> timers -> doorbells (the send and receive rings of active
//! QPs and the shared receive queues' rings, read by `Apps`) -> TX burst
//! -> completions (routed by `Apps` into the applications' CQ rings).
//!
//! Everything an application writes into shared memory is untrusted: a bad
//! WQE completes with an error CQE (and moves its QP to ERR, as a NIC
//! does), a scribbled ring index moves the QP to ERR, and no value can make
//! the daemon touch memory outside the application's segment or another
//! application's regions (protection domains are per application). When an
//! application's socket closes, its QPs, regions, CQs and segment are
//! released and its peers' QPs see retry errors.

mod alloc;
pub mod control;
mod cqs;
pub mod memory;
mod qp_table;
mod rdma_cm;
mod requests;
mod router;
pub mod sleep;
pub mod trace;

use std::collections::VecDeque;

// The service's tables are looked up per completion: a fast hasher for
// their small integer keys.
use rustc_hash::FxHashMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use nic::stage::NO_OPCODE;
use nic::{Direction, FrameKey, Nic, Stage};
use nix::sys::eventfd::EventFd;
use serde::{Deserialize, Serialize};
use shm::abi::{self, Consumer};
use shm::segment::Segment;
use transport::cm::{Cm, CmConfig};
use transport::rc::{
    CcMode, Cqe, Engine, EngineConfig, PathMtu, Qpn, QpnSpace, RcError, WcOpcode, WcStatus,
};
use transport::wire::{MacAddr, VlanTag};

use crate::dpdk::{DpdkError, Eal, Mempool, Port, TscClock};
use crate::host_port::{DpdkLink, HostPort};
use crate::shard_port::{Inboxes, ShardPort};
use crate::stats::StatsError;
use alloc::SegmentAlloc;
use control::{ConnId, Control, ShardLink, ToControl, ToDataplane};
use cqs::{CqRt, Cqs};
use memory::AppMemory;
use qp_table::QpTable;

/// Settings of the service.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// The control socket.
    pub socket: PathBuf,
    /// Largest path MTU QPs may use.
    pub max_mtu: PathMtu,
    pub mbufs: u32,
    pub line_rate_bps: u64,
    /// Largest segment one application may ask for.
    pub max_shm_bytes: u64,
    /// Try hugepage-backed segments first.
    pub hugepages: bool,
    /// Sleep between passes after a long idle stretch, us (0: yield), with
    /// `poll = spin`.
    pub idle_sleep_us: u32,
    /// What an idle lcore does.
    pub poll: sleep::PollPolicy,
    /// The longest nap of a sleeping lcore whose port has no wake-up for
    /// its frames, us.
    pub nap_us: u32,
    /// AckReq at least every this many messages towards our own peers
    /// (`EngineConfig::ack_req_msgs`).
    pub ack_coalesce: u32,
    /// Payloads of at least this many bytes are sent from where they lie
    /// on ports that allow it (0: always copied).
    pub zero_copy_tx_min: usize,
    /// Dataplane lcores (device `i`'s QP shard `k` runs on lcore
    /// `(i * qp_shards + k) % lcores`).
    pub lcores: usize,
    /// Engines each device's QPs are sharded over, each on its own queue
    /// pair of the device's port (1: one engine per device).
    pub qp_shards: usize,
    pub cc: CcMode,
    /// The devices to serve (`[[service.devices]]`); none: the loopback
    /// testbed's two hosts. A zero MAC is the port's own.
    pub devices: Vec<HostSpec>,
    /// Subnets (network, prefix) whose peers speak our telemetry, besides
    /// the daemon's own hosts.
    pub telemetry_peers: Vec<(Ipv4Addr, u8)>,
    /// What QPs towards other peers run when `cc` uses telemetry.
    pub standard_cc: CcMode,
    /// The domain key QPs towards telemetry peers derive their feedback
    /// keys from (`rc::auth::connection_key`); none: not authenticated.
    pub feedback_domain_key: Option<transport::rc::auth::FeedbackKey>,
    /// RX/TX queues per port (up to what the device offers).
    pub queues: u16,
    /// Seeded faults on one host's port.
    pub faults: Option<crate::testbed::HostFaults>,
    /// Static neighbours (IPv4, MAC) of every device.
    pub neighbours: Vec<(Ipv4Addr, MacAddr)>,
    /// A pcap of every frame the devices receive and send, and the most
    /// frames it records.
    pub tap: Option<(PathBuf, u64)>,
}

/// One host the daemon runs: a device applications open by name.
#[derive(Debug, Clone)]
pub struct HostSpec {
    pub name: String,
    pub mac: MacAddr,
    pub ip: Ipv4Addr,
    pub port: u16,
    /// The 802.1Q tag of its frames (VLAN id and priority); None: untagged.
    pub vlan: Option<VlanTag>,
    /// Its port receives only what the daemon's own devices send (one end
    /// of a ring pair the daemon made): a sleeping lcore is woken for its
    /// frames by the lcore that sent them, and needs no nap.
    pub internal: bool,
}

/// Counters of the service itself.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ServiceCounters {
    pub apps: u64,
    pub qps: u64,
    pub mrs: u64,
    pub cqs: u64,
    pub apps_opened: u64,
    pub apps_closed: u64,
    pub requests: u64,
    pub request_errors: u64,
    pub wqes_posted: u64,
    /// WQEs completed with an error by the service (bad opcode, QP not in
    /// RTS, too long) before reaching the engine.
    pub wqe_errors: u64,
    /// SQ rings whose producer index was scribbled (QP moved to ERR).
    pub sq_corrupt: u64,
    /// Receive WQEs taken from receive and shared receive queue rings.
    #[serde(default)]
    pub recv_wqes_posted: u64,
    /// Receive rings whose producer index was scribbled (QP moved to ERR;
    /// an SRQ's ring is no longer read).
    #[serde(default)]
    pub rq_corrupt: u64,
    /// SRQ limit events (an SRQ fell below its armed limit).
    #[serde(default)]
    pub srq_limit_events: u64,
    pub cqes_delivered: u64,
    /// CQEs dropped because an application let its CQ overflow far past
    /// its depth (its QPs are moved to ERR).
    pub cq_overruns: u64,
    pub tx_alloc_failures: u64,
    /// QPs moved from the device's HPCC++ mode to the standard controller
    /// because their peer does not speak our telemetry.
    #[serde(default)]
    pub plain_peer_qps: u64,
    /// Asynchronous events queued for applications.
    #[serde(default)]
    pub async_events: u64,
    /// Asynchronous events dropped: the application let its queue fill.
    #[serde(default)]
    pub async_events_dropped: u64,
    /// Passes of the dataplane loop (every host's pipeline once), and
    /// those that moved nothing: with the run time, the length of a pass.
    #[serde(default)]
    pub passes: u64,
    #[serde(default)]
    pub idle_passes: u64,
    /// Sleeps (or yields) of an idle dataplane.
    #[serde(default)]
    pub rests: u64,
    /// Nanoseconds spent in passes that moved something (from the start
    /// of such a pass to the start of the next): the dataplane's CPU cost,
    /// which divided by the messages of a run gives its cost per message
    /// whatever the application's side spends.
    #[serde(default)]
    pub busy_ns: u64,
}

impl ServiceCounters {
    /// Adds another lcore's counters (every field is a count).
    pub fn add(&mut self, o: &ServiceCounters) {
        let ServiceCounters {
            apps,
            qps,
            mrs,
            cqs,
            apps_opened,
            apps_closed,
            requests,
            request_errors,
            wqes_posted,
            wqe_errors,
            sq_corrupt,
            recv_wqes_posted,
            rq_corrupt,
            srq_limit_events,
            cqes_delivered,
            cq_overruns,
            tx_alloc_failures,
            plain_peer_qps,
            async_events,
            async_events_dropped,
            passes,
            idle_passes,
            rests,
            busy_ns,
        } = o;
        self.apps += apps;
        self.qps += qps;
        self.mrs += mrs;
        self.cqs += cqs;
        self.apps_opened += apps_opened;
        self.apps_closed += apps_closed;
        self.requests += requests;
        self.request_errors += request_errors;
        self.wqes_posted += wqes_posted;
        self.wqe_errors += wqe_errors;
        self.sq_corrupt += sq_corrupt;
        self.recv_wqes_posted += recv_wqes_posted;
        self.rq_corrupt += rq_corrupt;
        self.srq_limit_events += srq_limit_events;
        self.cqes_delivered += cqes_delivered;
        self.cq_overruns += cq_overruns;
        self.tx_alloc_failures += tx_alloc_failures;
        self.plain_peer_qps += plain_peer_qps;
        self.async_events += async_events;
        self.async_events_dropped += async_events_dropped;
        self.passes += passes;
        self.idle_passes += idle_passes;
        self.rests += rests;
        self.busy_ns += busy_ns;
    }
}

/// Passes without work before the loop starts to give the CPU away.
const IDLE_PASSES: u32 = 20_000;

/// Whether pass `pass`, after `idle` idle passes in a row, looks at the
/// control requests. They are rare: a busy lcore looks every 64 passes.
/// A resting one (past [`IDLE_PASSES`], a sleep between passes) looks
/// after every rest, so that a request waits at most one sleep, not 64:
/// an application's setup (a QP created, modified to RTR and RTS) is a
/// chain of requests to an idle lcore.
fn looks_at_control(pass: u32, idle: u32) -> bool {
    pass % 64 == 0 || idle > IDLE_PASSES
}

/// Drivers that read a frame's bytes in software, segment by segment (or
/// hand the mbufs to a peer port that does), so that a payload segment
/// pointing into an application's memory needs no DMA mapping: these get
/// zero-copy TX. A hardware NIC's driver would need the segments
/// registered for its DMA first, which the daemon does not do.
const ZERO_COPY_DRIVERS: [&str; 3] = ["net_ring", "net_tap", "net_af_packet"];

/// The least payload a device on `driver` sends from where it lies (none:
/// every payload is copied into the frame).
fn zero_copy_min(cfg: &ServiceConfig, driver: &str) -> Option<usize> {
    (cfg.zero_copy_tx_min > 0 && ZERO_COPY_DRIVERS.contains(&driver))
        .then_some(cfg.zero_copy_tx_min)
}

/// WQEs taken from one SQ per pass.
const SQ_BUDGET: usize = 32;
/// Receive WQEs taken from one RQ or SRQ ring per pass: moving one puts
/// nothing on the wire, and a datagram or UC message that finds the
/// engine's queue empty while WQEs wait in the ring is dropped (an RC
/// SEND gets an RNR NAK), so a whole ring's worth goes at once.
const RQ_BUDGET: usize = 1024;
/// CQEs a CQ may hold back beyond its ring before it overruns.
const CQ_BACKLOG: usize = 1 << 16;

struct QpRt {
    app: ConnId,
    /// The owner's segment (the SQ ring lives in it).
    seg: Arc<Segment>,
    /// Its CQ's slot (see [`Cqs`]).
    cq: usize,
    /// Where receive completions go (the send CQ unless the QP named
    /// another), by slot.
    recv_cq: usize,
    pd: u32,
    sq: Consumer<abi::Wqe>,
    /// The WQE being read (only its used bytes are read from the ring).
    wqe: abi::Wqe,
    ring: (u64, u64),
    /// Its own receive queue's ring (none with an SRQ).
    rq: Option<RqRt>,
    /// A ring index was scribbled: the rings are no longer read.
    broken: bool,
    /// In SQD: WQEs wait in the SQ ring until the QP is back in RTS.
    sq_paused: bool,
    /// The application chose the QP's congestion control (rnicdv).
    cc_explicit: bool,
    /// The application gave the QP its feedback key (rnicdv); else the
    /// daemon's domain key derives one at RTR.
    feedback_key: Option<transport::rc::auth::FeedbackKey>,
    /// Not watched: its rings are read again once the application rings
    /// its doorbell (see [`PARK_AFTER`]).
    parked: bool,
    /// Its rings had entries since `park_idle`'s last look (one every
    /// [`PARK_EVERY`] passes).
    busy: bool,
    /// Looks in a row (one every [`PARK_EVERY`] passes) that found its
    /// rings empty all along.
    idle: u32,
}

/// About how many passes in a row with both rings of a QP empty after
/// which the pass stops reading them, while few QPs are watched (counted
/// in looks of [`PARK_EVERY`] passes, so 241-271; with more watched,
/// fewer: [`park_looks`]): the QP is parked (its rings ask the
/// application for a doorbell, and are checked once more) and costs the
/// pass nothing until the bell rings.
const PARK_AFTER: u32 = 256;

/// Passes between two looks for QPs to park: a look walks every watched
/// QP, which a busy pass need not pay for each time.
const PARK_EVERY: u32 = 16;
const _: () = assert!(PARK_AFTER % PARK_EVERY == 0);

/// Watched QPs up to which a QP parks after [`PARK_AFTER`] passes; with
/// more, sooner, in proportion (down to one look: 16-31 passes). Every
/// pass reads each watched QP's rings, so a walk of thousands of QPs
/// that post now and then costs more than parking them and taking their
/// doorbells (10 000 QPs posting in turn kept ~3500 watched, a third of
/// the daemon's time in their rings' empty reads).
const WATCH_CHEAP: usize = 64;

/// Empty looks in a row after which a QP parks, with `watched` QPs
/// watched.
fn park_looks(watched: usize) -> u32 {
    let most = PARK_AFTER / PARK_EVERY;
    let scaled = most as usize * WATCH_CHEAP / watched.max(1);
    (scaled as u32).clamp(1, most)
}

/// A receive ring in an application's segment, and its block.
struct RqRt {
    ring: Consumer<abi::RecvWqe>,
    block: (u64, u64),
}

/// A shared receive queue's ring.
struct SrqRt {
    app: ConnId,
    seg: Arc<Segment>,
    ring: RqRt,
    broken: bool,
    /// SRQ_LIMIT_REACHED events so far.
    limit_events: u64,
}

struct App {
    host: usize,
    slot: usize,
    seg: Arc<Segment>,
    alloc: SegmentAlloc,
    /// Its doorbell block in the segment.
    bells: abi::Doorbells,
    pds: Vec<u32>,
    mrs: FxHashMap<u32, requests::MrRt>,
    /// Its CQs' slots in the lcore's [`Cqs`], by the ids it knows them by.
    cqs: FxHashMap<u32, usize>,
    qps: Vec<Qpn>,
    /// Its shared receive queues (engine SRQ ids on its host).
    srqs: Vec<u32>,
    /// Its address handles (engine AH ids on its host) and their PDs.
    ahs: Vec<(u32, u32)>,
    next_cq: u32,
    /// Asynchronous events not yet taken, and the eventfd that says so.
    events: VecDeque<shm::proto::AsyncEventMsg>,
    event_fd: Option<EventFd>,
    /// The wake-up time it stamped last, as the lcore last read it.
    last_rung: u64,
}

/// Asynchronous events an application may leave untaken.
const MAX_EVENTS: usize = 4096;

impl App {
    /// Queues an asynchronous event and wakes the application.
    fn raise(&mut self, e: shm::proto::AsyncEventMsg, counters: &mut ServiceCounters) {
        if self.events.len() >= MAX_EVENTS {
            counters.async_events_dropped += 1;
            return;
        }
        counters.async_events += 1;
        self.events.push_back(e);
        if let Some(fd) = &self.event_fd {
            let _ = fd.write(1);
        }
    }
}

struct Host {
    /// Its place among the daemon's hosts (every lcore's).
    index: usize,
    /// Its QP shard of the device (0 unless `qp_shards` > 1).
    qp_shard: u32,
    spec: HostSpec,
    nic: Nic<HostPort, AppMemory>,
    /// The port's PMD.
    driver: String,
    /// QPs of applications on this host.
    qps: QpTable<QpRt>,
    /// The QPs whose rings the pass reads (the others are parked).
    active: Vec<Qpn>,
    /// QPs of `qps` parked (broken ones included): while none is, no
    /// bell can matter and the pass does not look at them.
    parked: usize,
    /// Passes of the host's doorbells so far (for [`PARK_EVERY`]).
    passes: u32,
    /// Shared receive queues of applications on this host.
    srqs: FxHashMap<u32, SrqRt>,
    /// The management agents behind its QP1: the connection manager
    /// (agent `cm_agent`).
    mads: transport::mad::MadAgents,
    cm_agent: u32,
}

/// The management agents of a device's QP1: its connection manager
/// (node GUID the EUI-64 of its MAC, as the device reports it), and its
/// agent number.
fn management_agents(spec: &HostSpec) -> (transport::mad::MadAgents, u32) {
    let mut mads = transport::mad::MadAgents::default();
    let mut cfg = CmConfig::new(spec.ip, u64::from_be_bytes(spec.mac.eui64()));
    cfg.agent = mads.next_number();
    // Communication IDs a restarted daemon does not repeat.
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() ^ d.as_secs() as u32);
    cfg.id_seed = t ^ std::process::id().rotate_left(16);
    let n = mads.register(Box::new(Cm::new(cfg)));
    (mads, n)
}

impl Host {
    /// The device's connection manager.
    fn cm(&mut self) -> &mut Cm {
        self.mads
            .agent_mut::<Cm>(self.cm_agent)
            .expect("the CM is registered at the host's creation")
    }

    /// Hands the MADs QP1 received to the management agents, runs the
    /// CM's timers and queues what they send; whether any came.
    fn serve_mads(&mut self, now: u64) -> bool {
        let mut out = Vec::new();
        let mut any = false;
        while let Some(m) = self.nic.engine_mut().poll_mad() {
            any = true;
            self.mads.handle(now, &m, &mut out);
        }
        let cm = self.cm();
        if cm.poll_timeout().is_some_and(|t| t <= now) {
            cm.on_timeout(now);
        }
        out.extend(std::iter::from_fn(|| cm.poll_mad()));
        let engine = self.nic.engine_mut();
        for o in out {
            // A full queue is counted by the engine (tx_overflow).
            let _ = engine.send_mad(o, now);
        }
        any
    }

    /// Removes QP `qpn` from the table and from the watched QPs (a QPN
    /// the engine hands out again must not be watched twice).
    fn forget_qp(&mut self, qpn: Qpn) -> Option<QpRt> {
        self.forget_qps(&[qpn]).pop().flatten()
    }

    /// [`Host::forget_qp`] of each of `qpns`, in one pass over the
    /// watched QPs.
    fn forget_qps(&mut self, qpns: &[Qpn]) -> Vec<Option<QpRt>> {
        let gone: Vec<Option<QpRt>> = qpns.iter().map(|q| self.qps.remove(q)).collect();
        self.parked -= gone.iter().flatten().filter(|rt| rt.parked).count();
        let qps = &self.qps;
        self.active.retain(|q| qps.get(q).is_some());
        gone
    }
}

/// The hosts one dataplane lcore runs and the applications that opened
/// them (a daemon with several lcores has a `Service` on each, serving
/// disjoint sets of hosts).
pub struct Service {
    // Field order is drop order: ports and mbufs before their pool.
    hosts: Vec<Host>,
    /// Every host of the daemon, this lcore's and the others' (MACs
    /// resolved): QPs between them need no ARP and speak telemetry.
    peers: Vec<HostSpec>,
    apps: FxHashMap<ConnId, App>,
    pool: std::sync::Arc<Mempool>,
    clock: TscClock,
    cfg: ServiceConfig,
    next_pd: u32,
    counters: ServiceCounters,
    /// The CQs of its applications.
    cqs: Cqs,
    /// Slots of CQs with CQEs waiting to enter their ring.
    pending: Vec<usize>,
    /// The pcap tap's file, when one is configured.
    capture: Option<nic::SharedCapture>,
    /// The pcap of the frames the faults lost, when asked for.
    lost: Option<nic::SharedCapture>,
    /// The latency trace, and whether it is taking stamps.
    trace: trace::Trace,
    tracing: bool,
    /// The start of the last pass and whether it moved something (for
    /// `busy_ns` and the lcore's time working and spinning); none after
    /// a sleep.
    last_pass: Option<(u64, bool)>,
    /// Its lcore's wake-up descriptors.
    wake: Arc<sleep::LcoreWake>,
    /// The lcores this one passes frames to (other ends of its hosts'
    /// ring pairs, other QP shards of its devices), nudged after a pass
    /// that moved something while they sleep.
    downstream: Vec<Arc<sleep::LcoreWake>>,
    /// The RX interrupt descriptors of its hosts' ports that have them,
    /// and whether a host receives frames from outside the daemon on a
    /// port without one (a sleeping lcore then naps).
    rx_wakeups: Vec<crate::dpdk::RxWakeup>,
    naps: bool,
    /// Its sleep accounting, whether it shares its core, its naps, its
    /// scheduling class and when it last woke.
    sleep: sleep::SleepStats,
    class: sleep::LcoreClass,
    awake_since: u64,
    sharing: sleep::Sharing,
    nap: sleep::Nap,
    /// The rdma_cm sessions of its devices' CMs.
    cma: rdma_cm::RdmaCm,
}

impl Service {
    /// Starts a port and an engine per host, all on one lcore.
    pub fn new(eal: &Eal, cfg: ServiceConfig, hosts: &[HostSpec]) -> Result<Service, DpdkError> {
        let mut one = Self::shards(eal, cfg, hosts, 1)?;
        Ok(one.remove(0))
    }

    /// Starts a port and an engine per host (per QP shard of each, with
    /// `qp_shards` > 1), and deals the engines out to `lcores` services
    /// (host `i`'s shard `k` to service `(i * qp_shards + k) % lcores`; no
    /// more services than engines), which share one mbuf pool and the
    /// tap.
    pub fn shards(
        eal: &Eal,
        cfg: ServiceConfig,
        hosts: &[HostSpec],
        lcores: usize,
    ) -> Result<Vec<Service>, DpdkError> {
        let frame = cfg.max_mtu.bytes() as usize + nic::MAX_HEADERS;
        let pool = std::sync::Arc::new(Mempool::with_frames(
            eal,
            "service_pool",
            cfg.mbufs,
            0,
            frame,
        )?);
        let capture = match &cfg.tap {
            Some((path, limit)) => {
                Some(nic::Capture::create(path, *limit).map_err(|e| DpdkError {
                    what: "service.tap".into(),
                    reason: e.to_string(),
                })?)
            }
            None => None,
        };
        let lost =
            crate::testbed::HostFaults::lost_capture(&cfg.faults).map_err(|e| DpdkError {
                what: "loopback.faults.lost_pcap".into(),
                reason: e.to_string(),
            })?;
        let per_host = cfg.qp_shards.max(1);
        let n = lcores.clamp(1, (hosts.len() * per_host).max(1));
        let cpus = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0))
            .map(|set| cpus_in(&set).len())
            .unwrap_or(1);
        let wakes = (0..n)
            .map(|_| sleep::LcoreWake::new().map(Arc::new))
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(|e| DpdkError {
                what: "an lcore's wake-up eventfds".into(),
                reason: e.to_string(),
            })?;
        let mut shards: Vec<Service> = wakes
            .into_iter()
            .enumerate()
            .map(|(lcore, wake)| Service {
                hosts: Vec::new(),
                peers: Vec::new(),
                apps: FxHashMap::default(),
                pool: pool.clone(),
                clock: TscClock::new(eal),
                cfg: cfg.clone(),
                next_pd: 1,
                counters: ServiceCounters::default(),
                cqs: Cqs::default(),
                pending: Vec::new(),
                capture: capture.clone(),
                lost: lost.clone(),
                trace: trace::Trace::default(),
                tracing: false,
                last_pass: None,
                wake,
                downstream: Vec::new(),
                rx_wakeups: Vec::new(),
                naps: false,
                sleep: sleep::SleepStats::new(lcore, cfg.poll),
                class: sleep::LcoreClass::default(),
                awake_since: 0,
                sharing: sleep::Sharing::new(cpus),
                nap: sleep::Nap::new(u64::from(cfg.nap_us) * 1_000),
                cma: rdma_cm::RdmaCm::default(),
            })
            .collect();
        for (i, spec) in hosts.iter().enumerate() {
            for host in Self::start_host(eal, &cfg, &pool, (&capture, &lost), i, spec)? {
                let engine = i * per_host + host.qp_shard as usize;
                shards[lcore_of(engine, n)].hosts.push(host);
            }
        }
        // Every host's spec, its MAC now resolved, in the daemon's order.
        let mut peers: Vec<(usize, HostSpec)> = shards
            .iter()
            .flat_map(|s| s.hosts.iter().map(|h| (h.index, h.spec.clone())))
            .collect();
        peers.sort_by_key(|p| p.0);
        peers.dedup_by_key(|p| p.0);
        let peers: Vec<HostSpec> = peers.into_iter().map(|p| p.1).collect();
        for s in &mut shards {
            s.peers = peers.clone();
        }
        // Frames of a ring pair's host reach the lcores of the device at
        // its other end; frames a QP shard steers reach its siblings'.
        let lcores_of = |host: usize| -> Vec<usize> {
            (0..n)
                .filter(|&l| shards[l].hosts.iter().any(|h| h.index == host))
                .collect()
        };
        let downstream: Vec<Vec<usize>> = (0..n)
            .map(|l| {
                let mut to: Vec<usize> = shards[l]
                    .hosts
                    .iter()
                    .flat_map(|h| {
                        let mut reach = Vec::new();
                        if per_host > 1 {
                            reach.extend(lcores_of(h.index));
                        }
                        if h.spec.internal {
                            let others = hosts
                                .iter()
                                .enumerate()
                                .filter(|(i, o)| *i != h.index && o.internal);
                            for (i, _) in others {
                                reach.extend(lcores_of(i));
                            }
                        }
                        reach
                    })
                    .filter(|&o| o != l)
                    .collect();
                to.sort_unstable();
                to.dedup();
                to
            })
            .collect();
        for (l, to) in downstream.into_iter().enumerate() {
            shards[l].downstream = to.iter().map(|&o| shards[o].wake.clone()).collect();
        }
        for s in &mut shards {
            for h in &s.hosts {
                if h.spec.internal {
                    continue;
                }
                match crate::host_port::link(h.nic.port()).rx_wakeups() {
                    Some(w) => s.rx_wakeups.extend(w),
                    None => s.naps = true,
                }
            }
        }
        Ok(shards)
    }

    /// Host `i`: its port, started, and its engine, or with `qp_shards`
    /// > 1 an engine per QP shard, each on its own queue pair of the port.
    fn start_host(
        eal: &Eal,
        cfg: &ServiceConfig,
        pool: &Arc<Mempool>,
        (capture, lost): (&Option<nic::SharedCapture>, &Option<nic::SharedCapture>),
        i: usize,
        spec: &HostSpec,
    ) -> Result<Vec<Host>, DpdkError> {
        let k = cfg.qp_shards.max(1);
        let queues = if k > 1 { k as u16 } else { cfg.queues };
        let port = Port::start_queues(eal, spec.port, pool, 1024, queues)?;
        let mut spec = spec.clone();
        if spec.mac == MacAddr::default() {
            spec.mac = nic::FramePort::mac(&port);
        }
        let driver = port.driver.clone();
        let links = if k == 1 {
            vec![DpdkLink::Port(port)]
        } else {
            if usize::from(port.queues) < k {
                return Err(DpdkError {
                    what: format!("device {} (port {}, {driver})", spec.name, spec.port),
                    reason: format!(
                        "offers {} queue pair(s); qp_shards = {k} needs one per shard",
                        port.queues
                    ),
                });
            }
            let inboxes = Inboxes::new(k);
            port.into_queues()
                .into_iter()
                .enumerate()
                .map(|(s, q)| {
                    DpdkLink::Shard(ShardPort::new(q, spec.mac, s as u32, inboxes.clone()))
                })
                .collect()
        };
        let faults = crate::testbed::HostFaults::of(&cfg.faults, i);
        let mut hosts = Vec::with_capacity(k);
        for (shard, link) in links.into_iter().enumerate() {
            let mut ec = EngineConfig::new(spec.mac, spec.ip, cfg.line_rate_bps);
            ec.cc = cfg.cc;
            ec.ack_req_msgs = cfg.ack_coalesce;
            ec.vlan = spec.vlan;
            ec.qpns = QpnSpace::new(shard as u32, k as u32).map_err(|e| DpdkError {
                what: format!("device {}", spec.name),
                reason: e.to_string(),
            })?;
            // Frames between two of the daemon's own devices are recorded
            // twice: sent by one, received by the other.
            let port = crate::testbed::host_port(
                link,
                faults,
                lost.clone(),
                capture.clone(),
                Direction::Both,
            )
            .map_err(|e| DpdkError {
                what: format!("faults of host {i}"),
                reason: e.to_string(),
            })?;
            let engine = Engine::new(ec, AppMemory::default(), 0);
            let mut nic = Nic::new(engine, port, cfg.max_mtu.bytes());
            if k > 1 {
                nic = nic.as_shard(shard == 0);
            }
            if let Some(min) = zero_copy_min(cfg, &driver) {
                nic = nic.with_split_tx(min, memory::attach_payload);
            }
            for &(ip, mac) in &cfg.neighbours {
                nic.neighbours_mut().add_static(ip, mac);
            }
            let (mads, cm_agent) = management_agents(&spec);
            hosts.push(Host {
                index: i,
                qp_shard: shard as u32,
                spec: spec.clone(),
                nic,
                driver: driver.clone(),
                qps: QpTable::default(),
                active: Vec::new(),
                parked: 0,
                passes: 0,
                srqs: FxHashMap::default(),
                mads,
                cm_agent,
            });
        }
        Ok(hosts)
    }

    /// The daemon's hosts, in order, with the lcore (index into the
    /// services of [`Service::shards`]) each runs on: a host sharded over
    /// several lcores is named once for each.
    fn placement(shards: &[Service]) -> Vec<(String, usize)> {
        // A device's QP shards in their order: shard 0 first (the router
        // sends rdma_cm sessions to it).
        let all: std::collections::BTreeSet<(usize, u32, usize, String)> = shards
            .iter()
            .enumerate()
            .flat_map(|(l, s)| {
                s.hosts
                    .iter()
                    .map(move |h| (h.index, h.qp_shard, l, h.spec.name.clone()))
            })
            .collect();
        all.into_iter().map(|(_, _, l, name)| (name, l)).collect()
    }

    /// Closes the tap's pcap file: the frames it recorded and those it
    /// left out past its limit (None without a tap).
    pub fn finish_tap(&mut self) -> Result<Option<(u64, u64)>, nic::pcap::PcapFileError> {
        nic::tap::close(self.capture.take())
    }

    /// Closes the pcap of the frames the faults lost: the frames in it
    /// (None when none is recorded).
    pub fn finish_lost(&mut self) -> Result<Option<u64>, nic::pcap::PcapFileError> {
        Ok(nic::tap::close(self.lost.take())?.map(|(written, _)| written))
    }

    /// Serves until `stop` is set, on the calling thread alone.
    pub fn run(
        &mut self,
        stop: &AtomicBool,
        every: impl Fn(&Service) + Sync,
    ) -> std::io::Result<()> {
        serve(std::slice::from_mut(self), stop, &[], None, |_, s| every(s))
    }

    /// One lcore's loop until `stop` is set: its control requests, then
    /// its hosts' pipelines. An idle lcore gives its CPU away as its
    /// policy says (`ServiceConfig::poll`); `every` sees the service
    /// every 200 ms.
    fn run_lcore(&mut self, link: &ShardLink, stop: &AtomicBool, every: &dyn Fn(&Service)) {
        self.class = sleep::LcoreClass::start(self.cfg.poll);
        self.awake_since = self.clock.now_ns();
        let mut idle = 0u32;
        let mut idle_since = 0u64;
        let mut last_report = 0u64;
        let mut pass = 0u32;
        let mut nudged = false;
        while !stop.load(Ordering::Relaxed) {
            let mut busy = false;
            pass = pass.wrapping_add(1);
            if std::mem::take(&mut nudged) || looks_at_control(pass, idle) {
                while let Ok(m) = link.requests.try_recv() {
                    busy = true;
                    self.on_control(link, m);
                }
            }
            busy |= self.poll();
            busy |= self.send_cm_events(link);
            self.counters.passes += 1;
            if let Some((now, _)) = self.last_pass {
                self.class.worked(now.saturating_sub(self.awake_since));
            }
            if busy {
                idle = 0;
            } else {
                self.counters.idle_passes += 1;
                idle = idle.saturating_add(1);
                let now = self.clock.now_ns();
                if idle == 1 {
                    idle_since = now;
                }
                match self.cfg.poll {
                    sleep::PollPolicy::Spin => {
                        if idle > IDLE_PASSES {
                            self.counters.rests += 1;
                            self.rest();
                        }
                    }
                    sleep::PollPolicy::Event => nudged = self.sleep_if_idle(link, stop),
                    sleep::PollPolicy::Adaptive => {
                        let apps = &self.apps;
                        let shared = self.sharing.shared(now, || {
                            apps.values().map(|a| a.bells.owner_pid(&*a.seg)).collect()
                        });
                        self.class.want(shared);
                        let long = now.saturating_sub(idle_since) >= sleep::ADAPTIVE_SPIN_NS;
                        if long || shared {
                            nudged = self.sleep_if_idle(link, stop);
                        }
                    }
                }
            }
            // The report clock, like the control channel, every 64 passes.
            if pass % 64 == 0 {
                let now = self.clock.now_ns();
                if now.saturating_sub(last_report) > 200_000_000 {
                    last_report = now;
                    every(self);
                }
            }
        }
    }

    /// Gives the CPU away between two idle passes: a sleep (an idle
    /// daemon costs its neighbours nothing), or with `idle_sleep_us = 0`
    /// a yield (the next pass as soon as the CPU is free).
    fn rest(&self) {
        match self.cfg.idle_sleep_us {
            0 => std::thread::yield_now(),
            us => std::thread::sleep(std::time::Duration::from_micros(u64::from(us))),
        }
    }

    /// After an idle pass: sleeps until something gives the lcore work.
    /// It first says so (in every application's segment and to the other
    /// lcores), asks every watched ring for a doorbell, and runs one more
    /// pass: what was posted before the flags were seen is taken by that
    /// pass, and whoever posts after them wakes the lcore. Whether a
    /// nudge (a control request, perhaps) woke it.
    fn sleep_if_idle(&mut self, link: &ShardLink, stop: &AtomicBool) -> bool {
        self.wake.set_asleep();
        for app in self.apps.values() {
            app.bells.set_asleep(&*app.seg);
        }
        for h in &self.hosts {
            for qpn in &h.active {
                if let Some(rt) = h.qps.get(qpn) {
                    rt.sq.arm(&*rt.seg);
                    if let Some(rq) = &rt.rq {
                        rq.ring.arm(&*rt.seg);
                    }
                }
            }
            for rt in h.srqs.values() {
                rt.ring.ring.arm(&*rt.seg);
            }
        }
        let moved = self.poll() | self.send_cm_events(link);
        let now = self.clock.now_ns();
        // The NICs' timers and the CMs' (retransmissions, TIMEWAIT), and
        // rdma_cm's address resolutions (looked at every 100 ms for ARP's
        // retries).
        let resolving = self.cma.next_deadline().map(|t| t.min(now + 100_000_000));
        let due = self
            .hosts
            .iter()
            .flat_map(|h| {
                let cm = h.mads.agent::<Cm>(h.cm_agent).and_then(Cm::poll_timeout);
                [h.nic.next_wakeup(now), cm]
            })
            .flatten()
            .chain(resolving)
            .min();
        if moved
            || !link.requests.is_empty()
            || stop.load(Ordering::Relaxed)
            || due.is_some_and(|t| t <= now)
        {
            self.sleep.counters.sleeps_aborted += 1;
            self.awake();
            return false;
        }
        let mut timeout = due
            .map_or(sleep::MAX_SLEEP_NS, |t| t - now)
            .min(sleep::MAX_SLEEP_NS);
        let timer = timeout < sleep::MAX_SLEEP_NS;
        let mut nap = false;
        if !self.pending.is_empty() && sleep::BACKLOG_NAP_NS < timeout {
            timeout = sleep::BACKLOG_NAP_NS;
            nap = true;
        }
        if self.naps && self.nap.length_ns() < timeout {
            timeout = self.nap.length_ns();
            nap = true;
        }
        self.sleep.counters.sleeps += 1;
        self.class.before_sleep();
        let rx: Vec<std::os::fd::BorrowedFd<'_>> = self
            .rx_wakeups
            .iter()
            .map(std::os::fd::AsFd::as_fd)
            .collect();
        let woken = self.wake.wait(&rx, timeout);
        let after = self.clock.now_ns();
        self.awake_since = after;
        self.sleep.counters.sleeping_ns += after.saturating_sub(now);
        self.last_pass = None;
        let c = &mut self.sleep.counters;
        if woken.bell {
            c.woken_bell += 1;
            let mono = sleep::monotonic_ns();
            for app in self.apps.values_mut() {
                let rung = app.bells.rung_at(&*app.seg);
                if rung != app.last_rung {
                    app.last_rung = rung;
                    // A stamp from the future or from long ago is not a
                    // wake-up of this sleep (or was scribbled).
                    if let Some(ns) = mono.checked_sub(rung).filter(|&ns| ns < 1_000_000_000) {
                        self.sleep.bell_latency(ns);
                    }
                }
            }
        } else if woken.nudge {
            c.woken_nudge += 1;
        } else if woken.rx {
            c.woken_rx += 1;
        } else if woken.timeout && nap {
            c.woken_nap += 1;
        } else if woken.timeout && timer {
            c.woken_timer += 1;
            self.sleep.timer_late(after.saturating_sub(now + timeout));
        } else if woken.timeout {
            c.woken_limit += 1;
        }
        self.awake();
        if nap && woken.timeout {
            // Whether the nap's pass finds frames is the next pass's to
            // say; a nap that ends in work starts the next one short.
            let found = self.poll();
            self.nap.after(found);
        } else {
            self.nap.after(true);
        }
        woken.nudge
    }

    /// Clears the "asleep" flags [`Service::sleep_if_idle`] set.
    fn awake(&mut self) {
        self.wake.set_awake();
        for app in self.apps.values() {
            app.bells.clear_asleep(&*app.seg);
        }
    }

    fn on_control(&mut self, control: &ShardLink, m: ToDataplane) {
        match m {
            ToDataplane::Request { conn, id, req, fds } => {
                self.counters.requests += 1;
                let (result, fds) = match self.handle(conn, req, fds) {
                    Ok((r, fds)) => (Ok(r), fds),
                    Err(e) => {
                        self.counters.request_errors += 1;
                        (Err(e), Vec::new())
                    }
                };
                control.reply(ToControl {
                    conn,
                    msg: shm::proto::ReplyMsg {
                        v: shm::VERSION,
                        id,
                        result,
                    },
                    fds,
                });
            }
            ToDataplane::Closed { conn } => self.close_app(conn),
        }
    }

    /// One pass of every host's pipeline; returns whether anything moved.
    pub fn poll(&mut self) -> bool {
        let now = self.clock.now_ns();
        match self.last_pass {
            Some((t, true)) => {
                self.counters.busy_ns += now.saturating_sub(t);
                self.sleep.counters.working_ns += now.saturating_sub(t);
            }
            Some((t, false)) => self.sleep.counters.spinning_ns += now.saturating_sub(t),
            None => {}
        }
        let mut moved = false;
        for h in 0..self.hosts.len() {
            let (nic, mut apps) = self.host_apps(h);
            moved |= nic.poll(now, &mut apps);
            moved |= apps.drain_pending();
            // A QP shard's frames passed to another: work, though none
            // was its own.
            moved |= crate::host_port::link_mut(nic.port_mut()).take_moved();
            moved |= self.hosts[h].serve_mads(now);
            self.cm_events(h);
        }
        self.cm_resolve_pass(now);
        self.cqs.wake_owed();
        self.last_pass = Some((now, moved));
        if moved {
            for l in &self.downstream {
                l.nudge_if_asleep();
            }
        }
        moved
    }

    /// Host `h`'s pipeline and the application side it serves.
    fn host_apps(&mut self, h: usize) -> (&mut Nic<HostPort, AppMemory>, Apps<'_>) {
        let Host {
            nic,
            qps,
            active,
            parked,
            passes,
            srqs,
            index,
            ..
        } = &mut self.hosts[h];
        let apps = Apps {
            qps,
            active,
            parked,
            passes,
            local: h,
            srqs,
            apps: &mut self.apps,
            counters: &mut self.counters,
            cqs: &mut self.cqs,
            pending: &mut self.pending,
            host: *index,
            trace: self.tracing.then_some(&mut self.trace),
        };
        (nic, apps)
    }

    /// Routes the completions host `h`'s engine holds (outside a pass:
    /// after the control path flushed QPs).
    fn route_completions(&mut self, h: usize) {
        let (nic, mut apps) = self.host_apps(h);
        apps.route(nic.engine_mut());
        apps.drain_pending();
        self.cqs.wake_owed();
    }

    /// Counters of every port, engine and QP, and of the service.
    pub fn snapshot(&self) -> crate::stats::Snapshot {
        let mut s = crate::stats::Snapshot {
            at_ns: self.clock.now_ns(),
            ..Default::default()
        };
        for (hi, h) in self.hosts.iter().enumerate() {
            let qpns: Vec<Qpn> = h.qps.iter().map(|(q, _)| q).collect();
            s.add_nic(h.index, &h.nic, &qpns);
            if let Some(p) = s.ports.last_mut() {
                let g = h.nic.engine().gsi_counters();
                p.gsi = crate::stats::GsiEntry::of(&g, &h.mads.counters);
                if let Some(cm) = h.mads.agent::<Cm>(h.cm_agent) {
                    p.cm = crate::stats::CmEntry::of(&cm.counters, cm.len());
                }
                let (sessions, ids, c) = self.cma.of_host(hi);
                p.rdma_cm = crate::stats::RdmaCmEntry {
                    sessions: sessions as u64,
                    ids: ids as u64,
                    events: c.events,
                    events_unclaimed: c.events_unclaimed,
                    addr_resolved: c.addr_resolved,
                    addr_errors: c.addr_errors,
                    requests_refused: c.requests_refused,
                    telemetry_negotiated: c.telemetry_negotiated,
                };
            }
        }
        let mut c = self.counters.clone();
        c.apps = self.apps.len() as u64;
        c.qps = self.hosts.iter().map(|h| h.qps.len() as u64).sum();
        c.mrs = self.apps.values().map(|a| a.mrs.len() as u64).sum();
        c.cqs = self.cqs.len() as u64;
        c.tx_alloc_failures = self
            .hosts
            .iter()
            .map(|h| h.nic.counters().tx_no_buffer + h.nic.counters().tx_buffer_too_small)
            .sum();
        s.service = Some(c);
        s.lcores = vec![self.sleep.snapshot(&self.sharing, &self.class)];
        s
    }

    /// Releases everything an application held: its QPs go to ERR and
    /// are destroyed (their peers see retry errors), its regions are
    /// deregistered, its CQs and segment freed.
    /// Writes the rdma_cm events of the pass on their event channels;
    /// whether there were any.
    fn send_cm_events(&mut self, link: &ShardLink) -> bool {
        if self.cma.outbox.is_empty() {
            return false;
        }
        for (channel, ev) in self.cma.outbox.drain(..) {
            link.reply(ToControl {
                conn: channel,
                msg: shm::proto::ReplyMsg {
                    v: shm::VERSION,
                    id: 0,
                    result: Ok(shm::proto::Reply::CmEvent(Box::new(ev))),
                },
                fds: Vec::new(),
            });
        }
        true
    }

    fn close_app(&mut self, conn: ConnId) {
        self.cm_closed(conn);
        let Some(app) = self.apps.remove(&conn) else {
            return;
        };
        self.counters.apps_closed += 1;
        let host = &mut self.hosts[app.host];
        for qpn in &app.qps {
            let _ = host.nic.engine_mut().modify_to_err(*qpn);
            let _ = host.nic.engine_mut().destroy_qp(*qpn);
        }
        host.forget_qps(&app.qps);
        for srq in &app.srqs {
            let _ = host.nic.engine_mut().destroy_srq(*srq);
            host.srqs.remove(srq);
        }
        for &(ah, pd) in &app.ahs {
            let _ = host.nic.engine_mut().destroy_ah(ah, pd);
        }
        for (lkey, mr) in &app.mrs {
            let _ = host.nic.engine_mut().deregister_mr(*lkey);
            if let requests::MrBacking::Mapped { slot } = mr.backing {
                host.nic.engine_mut().mem_mut().detach(slot);
            }
        }
        // Flushed completions of the destroyed QPs have no CQ left.
        self.route_completions(app.host);
        for &slot in app.cqs.values() {
            self.cqs.remove(slot);
        }
        self.pending.retain(|&s| self.cqs.get(s).is_some());
        self.hosts[app.host]
            .nic
            .engine_mut()
            .mem_mut()
            .detach(app.slot);
    }
}

/// The lcore of host `i` among `lcores`.
fn lcore_of(i: usize, lcores: usize) -> usize {
    i % lcores.max(1)
}

/// The CPUs of `set`, in order.
pub fn cpus_in(set: &nix::sched::CpuSet) -> Vec<usize> {
    (0..nix::sched::CpuSet::count())
        .filter(|&c| set.is_set(c).unwrap_or(false))
        .collect()
}

/// The CPUs of the control thread: those of `allowed` (the process's
/// CPUs, read before the EAL pinned the calling thread, its main lcore)
/// that no lcore spins on: not the calling thread's CPUs (`main`) nor
/// `cpus` (the other lcores'). `None` when no CPU is left (the lcore
/// floats over all of them, or pins every one): the control thread then
/// runs where it is put. On a CPU of a spinning lcore it would wait for
/// the lcore's time slice (about 1 ms) before each reply.
pub fn control_cpus(
    allowed: &nix::sched::CpuSet,
    main: &nix::sched::CpuSet,
    cpus: &[usize],
) -> Option<nix::sched::CpuSet> {
    let mut left = nix::sched::CpuSet::new();
    let mut any = false;
    for cpu in cpus_in(allowed) {
        let free = !main.is_set(cpu).unwrap_or(false) && !cpus.contains(&cpu);
        if free && left.set(cpu).is_ok() {
            any = true;
        }
    }
    any.then_some(left)
}

/// Serves until `stop` is set with `shards` (from [`Service::shards`]):
/// the control thread routes each application's requests to the service
/// of the device it opened; the calling thread runs the first service and
/// a thread of its own (a DPDK lcore) each of the others. With more than
/// one, service `k` runs on CPU `cpus[k % cpus.len()]` when CPUs are
/// given. The control thread runs on the CPUs of `allowed` (the process's,
/// from before the EAL pinned this thread) that no lcore takes, if any
/// ([`control_cpus`]). `every(k, service)` sees each every 200 ms, on its
/// thread.
pub fn serve(
    shards: &mut [Service],
    stop: &AtomicBool,
    cpus: &[usize],
    allowed: Option<&nix::sched::CpuSet>,
    every: impl Fn(usize, &Service) + Sync,
) -> std::io::Result<()> {
    let Some(first) = shards.first() else {
        return Ok(());
    };
    let socket = first.cfg.socket.clone();
    let this = nix::unistd::Pid::from_raw(0);
    let lcore_cpus = if shards.len() > 1 { cpus } else { &[] };
    let control_set = allowed
        .zip(nix::sched::sched_getaffinity(this).ok())
        .and_then(|(allowed, main)| control_cpus(allowed, &main, lcore_cpus));
    let wakes = shards.iter().map(|s| s.wake.clone()).collect();
    let (control, links) = Control::spawn(&socket, Service::placement(shards), wakes, control_set)?;
    let lcores = shards.len();
    let pin = move |k: usize| -> std::io::Result<()> {
        if lcores < 2 || cpus.is_empty() {
            return Ok(());
        }
        let cpu = cpus[k % cpus.len()];
        let mut set = nix::sched::CpuSet::new();
        set.set(cpu)
            .and_then(|()| nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set))
            .map_err(|e| std::io::Error::other(format!("dataplane lcore {k} on CPU {cpu}: {e}")))
    };
    let every = &every;
    let result = std::thread::scope(|scope| -> std::io::Result<()> {
        let mut rest = shards.iter_mut().zip(&links).enumerate();
        let (_, (svc0, link0)) = rest.next().expect("one service at least");
        let mut threads = Vec::new();
        for (k, (svc, link)) in rest {
            let t = std::thread::Builder::new()
                .name(format!("rnic-lcore{k}"))
                .spawn_scoped(scope, move || {
                    let lcore = pin(k).and_then(|()| {
                        crate::dpdk::LcoreGuard::register(&svc.pool)
                            .map_err(|e| std::io::Error::other(e.to_string()))
                    });
                    match lcore {
                        Ok(_lcore) => {
                            svc.run_lcore(link, stop, &|s| every(k, s));
                            Ok(())
                        }
                        Err(e) => {
                            // Without this lcore the daemon cannot serve
                            // its devices: everyone stops.
                            stop.store(true, Ordering::Relaxed);
                            Err(e)
                        }
                    }
                });
            match t {
                Ok(t) => threads.push(t),
                Err(e) => {
                    stop.store(true, Ordering::Relaxed);
                    return Err(e);
                }
            }
        }
        let mut r = match pin(0) {
            Ok(()) => {
                svc0.run_lcore(link0, stop, &|s| every(0, s));
                Ok(())
            }
            Err(e) => {
                stop.store(true, Ordering::Relaxed);
                Err(e)
            }
        };
        for t in threads {
            let rt = t
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("a dataplane lcore panicked")));
            r = r.and(rt);
        }
        r
    });
    drop(control);
    result
}

/// The application side of one host's pipeline: it takes WQEs from the
/// send and receive rings of the host's QPs and its SRQs' rings (the
/// doorbells) and routes completions into
/// the owners' CQ rings, in batches, one index store each.
struct Apps<'a> {
    qps: &'a mut QpTable<QpRt>,
    /// The QPs the pass reads the rings of.
    active: &'a mut Vec<Qpn>,
    /// How many of `qps` are parked ([`Host::parked`]).
    parked: &'a mut usize,
    /// [`Host::passes`].
    passes: &'a mut u32,
    /// The host's index among this lcore's hosts (`App::host`).
    local: usize,
    srqs: &'a mut FxHashMap<u32, SrqRt>,
    apps: &'a mut FxHashMap<ConnId, App>,
    counters: &'a mut ServiceCounters,
    cqs: &'a mut Cqs,
    /// Slots of CQs with CQEs waiting to enter their ring.
    pending: &'a mut Vec<usize>,
    /// The host's index, and the latency trace when it is on.
    host: usize,
    trace: Option<&'a mut trace::Trace>,
}

impl nic::Host<AppMemory> for Apps<'_> {
    /// Takes WQEs from the send and receive rings of this host's QPs and
    /// from its SRQs' rings into the engine.
    fn doorbells(&mut self, engine: &mut Engine<AppMemory>, now: u64) -> bool {
        // Bells ring only for parked rings: with none parked, no bell
        // can matter.
        if *self.parked > 0 {
            self.wake_rung();
        }
        // One look at each watched QP: its receive ring, then its send
        // ring.
        let mut moved = false;
        let mut errors: Vec<(usize, abi::Cqe)> = Vec::new();
        for &qpn in self.active.iter() {
            let Some(rt) = self.qps.get_mut(&qpn) else {
                continue;
            };
            moved |= take_recv_wqes(qpn, rt, engine, self.counters, &mut errors);
            if rt.broken || rt.sq_paused {
                continue;
            }
            let seg = &*rt.seg;
            let n = match rt.sq.available(seg) {
                Ok(n) => n as usize,
                Err(_) => {
                    rt.broken = true;
                    self.counters.sq_corrupt += 1;
                    let _ = engine.modify_to_err(qpn);
                    continue;
                }
            };
            rt.busy |= n > 0;
            for _ in 0..n.min(SQ_BUDGET) {
                rt.sq.peek_used_into(seg, &mut rt.wqe, abi::Wqe::used_len);
                let wqe = &rt.wqe;
                // The PSN the WR's first packet gets when nothing is
                // queued before it (a latency trace's one WR in flight).
                let psn = self
                    .trace
                    .as_ref()
                    .and_then(|_| engine.qp_snd_nxt(qpn).ok());
                let status = match wqe.parts() {
                    Err(_) => {
                        let _ = engine.modify_to_err(qpn);
                        Some(WcStatus::LocQpOpErr)
                    }
                    Ok(wr) => match engine.post_send_parts(qpn, &wr, now) {
                        Ok(()) => {
                            self.counters.wqes_posted += 1;
                            if let (Some(t), Some(psn)) = (self.trace.as_deref_mut(), psn) {
                                let key = FrameKey {
                                    opcode: NO_OPCODE,
                                    dest_qp: qpn,
                                    psn,
                                };
                                t.record(self.host, Stage::Doorbell, key);
                            }
                            None
                        }
                        Err(RcError::SendQueueFull(_)) => break,
                        Err(RcError::TooLong(_) | RcError::AtomicLength { .. }) => {
                            let _ = engine.modify_to_err(qpn);
                            Some(WcStatus::LocLenErr)
                        }
                        // A datagram over the MTU fails alone (the library
                        // refuses it before it gets here).
                        Err(RcError::DatagramTooLong { .. }) => Some(WcStatus::LocLenErr),
                        Err(RcError::WrongState {
                            state: transport::rc::QpState::Err,
                            ..
                        }) => Some(WcStatus::WrFlushErr),
                        // Not in RTS yet: refused, the QP stays as it is.
                        Err(RcError::WrongState { .. }) => Some(WcStatus::LocQpOpErr),
                        // A malformed WQE moves the QP to ERR, as a NIC does.
                        Err(_) => {
                            let _ = engine.modify_to_err(qpn);
                            Some(WcStatus::LocQpOpErr)
                        }
                    },
                };
                rt.sq.advance(seg);
                moved = true;
                if let Some(st) = status {
                    self.counters.wqe_errors += 1;
                    let c = transport::rc::Cqe {
                        wr_id: wqe.wr_id,
                        qpn,
                        status: st,
                        opcode: wqe.op().map_or(WcOpcode::RdmaWrite, |o| o.wc_opcode()),
                        byte_len: 0,
                        imm: None,
                        solicited: false,
                        src: None,
                    };
                    errors.push((rt.cq, abi::Cqe::from_rc(&c)));
                }
            }
        }
        moved |= self.srq_doorbells(engine);
        while let Some(e) = engine.poll_event() {
            self.raise(e);
        }
        *self.passes = self.passes.wrapping_add(1);
        if *self.passes % PARK_EVERY == 0 {
            self.park_idle();
        }
        if !errors.is_empty() {
            // Completions the engine already has (flushes of older WRs)
            // go first: a QP's completions stay in post order.
            self.route(engine);
            for (cq, c) in errors {
                self.push_cqe(engine, cq, c);
            }
        }
        moved
    }

    fn completion(&mut self, engine: &mut Engine<AppMemory>, c: Cqe) {
        let Some(rt) = self.qps.get(&c.qpn) else {
            return; // the QP is gone with its application
        };
        let cq = if c.opcode.is_recv() {
            rt.recv_cq
        } else {
            rt.cq
        };
        self.push_cqe(engine, cq, abi::Cqe::from_rc(&c));
    }

    fn tracing(&self) -> bool {
        self.trace.is_some()
    }

    fn stamp(&mut self, stage: Stage, key: FrameKey) {
        if let Some(t) = self.trace.as_deref_mut() {
            t.record(self.host, stage, key);
        }
    }
}

impl Apps<'_> {
    /// Watches again the parked QPs whose doorbells the applications of
    /// this host rang (a bell of a QP that is not the ringer's, or not
    /// parked, changes nothing).
    fn wake_rung(&mut self) {
        let (qps, active, parked) = (&mut *self.qps, &mut *self.active, &mut *self.parked);
        for (&conn, app) in self.apps.iter() {
            if app.host != self.local {
                continue;
            }
            app.bells.take(&*app.seg, |qpn| {
                if let Some(rt) = qps.get_mut(&qpn) {
                    if rt.app == conn && rt.parked && !rt.broken {
                        rt.parked = false;
                        *parked -= 1;
                        rt.idle = 0;
                        active.push(qpn);
                    }
                }
            });
        }
    }

    /// Stops watching QPs whose rings stayed empty for
    /// [`park_looks`] looks in a row (about [`PARK_AFTER`] passes while
    /// few are watched), and those destroyed or broken: each ring is
    /// asked for a doorbell and checked once more, so that a WQE written
    /// meanwhile is not missed.
    fn park_idle(&mut self) {
        let (qps, parked) = (&mut *self.qps, &mut *self.parked);
        let looks = park_looks(self.active.len());
        self.active.retain(|qpn| {
            let Some(rt) = qps.get_mut(qpn) else {
                return false;
            };
            if rt.broken {
                park(rt, parked);
                return false;
            }
            if std::mem::take(&mut rt.busy) {
                rt.idle = 0;
                return true;
            }
            rt.idle += 1;
            if rt.idle < looks {
                return true;
            }
            let seg = &*rt.seg;
            let sq_empty = rt.sq.park(seg).unwrap_or(false);
            let rq_empty = match rt.rq.as_mut() {
                Some(rq) => rq.ring.park(seg).unwrap_or(false),
                None => true,
            };
            if sq_empty && rq_empty {
                park(rt, parked);
                false
            } else {
                rt.idle = 0;
                true
            }
        });
    }

    /// Hands an engine event to the application that owns its object.
    fn raise(&mut self, e: transport::rc::AsyncEvent) {
        use shm::proto::AsyncEventMsg as M;
        use transport::rc::{AsyncEvent as E, QpError};
        let qp_owner = |qpn: Qpn| self.qps.get(&qpn).map(|rt| rt.app);
        let (app, msg) = match e {
            E::SrqLimitReached(srq) => {
                self.counters.srq_limit_events += 1;
                let Some(rt) = self.srqs.get_mut(&srq) else {
                    return;
                };
                rt.limit_events += 1;
                (Some(rt.app), M::SrqLimitReached { srq })
            }
            E::QpError(qpn, QpError::Access) => (qp_owner(qpn), M::QpAccessErr { qpn }),
            E::QpError(qpn, QpError::InvalidRequest) => (qp_owner(qpn), M::QpReqErr { qpn }),
            E::QpError(qpn, QpError::Fatal) => (qp_owner(qpn), M::QpFatal { qpn }),
            E::SqDrained(qpn) => (qp_owner(qpn), M::SqDrained { qpn }),
            E::LastWqeReached(qpn) => (qp_owner(qpn), M::QpLastWqeReached { qpn }),
        };
        if let Some(a) = app.and_then(|a| self.apps.get_mut(&a)) {
            a.raise(msg, self.counters);
        }
    }

    /// Takes receive WQEs from the SRQs' rings.
    fn srq_doorbells(&mut self, engine: &mut Engine<AppMemory>) -> bool {
        let mut moved = false;
        for (&srq, rt) in self.srqs.iter_mut() {
            if rt.broken {
                continue;
            }
            let mut bad = 0;
            let r = drain_recv(&rt.seg, &mut rt.ring, self.counters, |w| match w.to_wr() {
                Ok(wr) => engine.post_srq_recv(srq, wr).map(|()| true),
                Err(_) => {
                    // No QP owns it yet, so no CQ to report to: dropped
                    // and counted.
                    bad += 1;
                    Ok(false)
                }
            });
            self.counters.wqe_errors += bad;
            match r {
                Some(m) => moved |= m,
                None => rt.broken = true,
            }
        }
        moved
    }

    /// Routes every completion the engine holds.
    fn route(&mut self, engine: &mut Engine<AppMemory>) {
        while let Some(c) = engine.poll_completion() {
            nic::Host::completion(self, engine, c);
        }
    }

    /// Writes a CQE into the ring of the CQ in `slot` at once when
    /// nothing waits before it and the ring has room; otherwise holds it
    /// behind the others, and `drain_pending` moves it when the
    /// application has read.
    fn push_cqe(&mut self, engine: &mut Engine<AppMemory>, slot: usize, c: abi::Cqe) {
        let trace = self.trace.as_deref_mut().map(|t| (t, self.host));
        if self.cqs.write_now(slot, &c, self.counters, trace) {
            return;
        }
        let Some(q) = self.cqs.get_mut(slot) else {
            return;
        };
        if q.backlog.is_empty() {
            self.pending.push(slot);
        }
        q.backlog.push_back(c);
        if q.backlog.len() > CQ_BACKLOG {
            // The application does not poll: stop its QPs on this CQ.
            self.counters.cq_overruns += q.backlog.len() as u64;
            q.backlog.clear();
            if let Some(a) = self.apps.get_mut(&q.app) {
                a.raise(shm::proto::AsyncEventMsg::CqErr { cq: q.id }, self.counters);
            }
            let qps: Vec<Qpn> = self
                .qps
                .iter()
                .filter(|(_, r)| r.cq == slot || r.recv_cq == slot)
                .map(|(q, _)| q)
                .collect();
            for qpn in qps {
                let _ = engine.modify_to_err(qpn);
            }
        }
    }

    /// Moves held-back CQEs into rings that have room.
    fn drain_pending(&mut self) -> bool {
        let mut moved = false;
        let mut i = 0;
        while i < self.pending.len() {
            let slot = self.pending[i];
            let trace = self.trace.as_deref_mut().map(|t| (t, self.host));
            moved |= self.cqs.drain_backlog(slot, self.counters, trace);
            let drained = self.cqs.get(slot).is_none_or(|q| q.backlog.is_empty());
            if drained {
                self.pending.swap_remove(i);
            } else {
                i += 1;
            }
        }
        moved
    }
}

/// Marks a watched QP parked, counted once in its host's `parked`.
fn park(rt: &mut QpRt, parked: &mut usize) {
    if !std::mem::replace(&mut rt.parked, true) {
        *parked += 1;
    }
}

/// Asks the daemon serving on `socket` for its counters.
pub fn query_stats(socket: &std::path::Path) -> Result<crate::stats::Snapshot, StatsError> {
    use shm::proto::{self, Reply, ReplyMsg, Request, RequestMsg};
    let daemon = |why: String| StatsError::Daemon {
        path: socket.to_owned(),
        why,
    };
    let mut s =
        std::os::unix::net::UnixStream::connect(socket).map_err(|source| StatsError::Io {
            path: socket.to_owned(),
            source,
        })?;
    proto::send_message(
        &mut s,
        &RequestMsg {
            v: shm::VERSION,
            id: 1,
            req: Request::Stats,
        },
    )
    .map_err(|e| daemon(e.to_string()))?;
    let r: ReplyMsg = proto::read_message(&mut s).map_err(|e| daemon(e.to_string()))?;
    match r.result {
        Ok(Reply::Stats { json }) => {
            serde_json::from_str(&json).map_err(|e| StatsError::NotSnapshot {
                path: socket.to_owned(),
                why: e.to_string(),
            })
        }
        Ok(other) => Err(daemon(format!("unexpected reply {other:?}"))),
        Err(e) => Err(daemon(e.to_string())),
    }
}

/// Takes receive WQEs from the own receive ring of QP `qpn` (once the QP
/// is out of RESET: until then they wait in the ring); a malformed one
/// fails by name in `errors` and stops the QP, as a NIC does, and a
/// scribbled ring index breaks the QP (moved to ERR, its rings no longer
/// read). A broken QP, or one without a ring of its own (an SRQ's), is
/// left alone. Returns whether any WQE was taken.
fn take_recv_wqes(
    qpn: Qpn,
    rt: &mut QpRt,
    engine: &mut Engine<AppMemory>,
    counters: &mut ServiceCounters,
    errors: &mut Vec<(usize, abi::Cqe)>,
) -> bool {
    let Some(rq) = rt.rq.as_mut().filter(|_| !rt.broken) else {
        return false;
    };
    let mut bad = None;
    let r = drain_recv(&rt.seg, rq, counters, |w| match w.to_wr() {
        Ok(wr) => engine.post_recv(qpn, wr).map(|()| true),
        Err(_) => {
            bad = Some(w.wr_id);
            Ok(false)
        }
    });
    if let Some(wr_id) = bad {
        counters.wqe_errors += 1;
        let _ = engine.modify_to_err(qpn);
        let c = Cqe {
            wr_id,
            qpn,
            status: WcStatus::LocQpOpErr,
            opcode: WcOpcode::Recv,
            byte_len: 0,
            imm: None,
            solicited: false,
            src: None,
        };
        errors.push((rt.recv_cq, abi::Cqe::from_rc(&c)));
    }
    match r {
        Some(m) => {
            rt.busy |= m;
            m
        }
        None => {
            rt.broken = true;
            let _ = engine.modify_to_err(qpn);
            false
        }
    }
}

/// Moves receive WQEs from a ring into the engine with `post` while it
/// takes them (a full receive queue leaves the rest in the ring; `post`
/// says whether a consumed WQE was posted or refused as malformed, and
/// stops after a malformed one), counting them; returns whether any moved,
/// `None` (counted) when the ring's producer index was scribbled.
fn drain_recv(
    seg: &Segment,
    rq: &mut RqRt,
    counters: &mut ServiceCounters,
    mut post: impl FnMut(&abi::RecvWqe) -> Result<bool, RcError>,
) -> Option<bool> {
    let Ok(n) = rq.ring.available(seg) else {
        counters.rq_corrupt += 1;
        return None;
    };
    let mut taken = 0;
    for _ in 0..(n as usize).min(RQ_BUDGET) {
        let wqe = rq.ring.peek_used(seg, abi::RecvWqe::used_len);
        let Ok(posted) = post(&wqe) else {
            break;
        };
        rq.ring.advance(seg);
        if !posted {
            break;
        }
        taken += 1;
    }
    counters.recv_wqes_posted += taken;
    Some(taken > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_lcore_looks_at_control_requests_every_64_passes() {
        let looked: Vec<u32> = (1..=256).filter(|&p| looks_at_control(p, 0)).collect();
        assert_eq!(looked, [64, 128, 192, 256]);
        // Idle, not yet resting: the same.
        assert!(!looks_at_control(65, IDLE_PASSES));
    }

    fn set(cpus: &[usize]) -> nix::sched::CpuSet {
        let mut s = nix::sched::CpuSet::new();
        for &c in cpus {
            s.set(c).unwrap();
        }
        s
    }

    #[test]
    fn the_control_thread_runs_where_no_lcore_spins() {
        // One lcore pinned to CPU 1 of two: the control thread gets CPU 0.
        let cc = |allowed: &[usize], main: &[usize], cpus: &[usize]| {
            control_cpus(&set(allowed), &set(main), cpus).map(|s| cpus_in(&s))
        };
        assert_eq!(cc(&[0, 1], &[1], &[]), Some(vec![0]));
        // Lcores on CPUs 1 and 2 of four: 0 and 3 are left.
        assert_eq!(cc(&[0, 1, 2, 3], &[1], &[1, 2]), Some(vec![0, 3]));
        // A CPU the process may not use is not given.
        assert_eq!(cc(&[1, 2, 3], &[1], &[1, 2]), Some(vec![3]));
        // An lcore floating over every CPU, or lcores on all of them:
        // none is left, and the control thread stays where it is put.
        assert_eq!(cc(&[0, 1], &[0, 1], &[]), None);
        assert_eq!(cc(&[0, 1], &[1], &[1, 0]), None);
    }

    #[test]
    fn many_watched_qps_park_sooner() {
        // Up to 64 watched: 16 looks (about 256 passes).
        for w in [0, 1, 8, 64] {
            assert_eq!(park_looks(w), 16, "{w} watched");
        }
        // Beyond, in proportion, down to one look.
        assert_eq!(park_looks(128), 8);
        assert_eq!(park_looks(512), 2);
        for w in [1024, 3500, 1 << 20] {
            assert_eq!(park_looks(w), 1, "{w} watched");
        }
    }

    #[test]
    fn a_resting_lcore_looks_after_every_rest() {
        for pass in 1..=256 {
            assert!(looks_at_control(pass, IDLE_PASSES + 1), "pass {pass}");
        }
    }
}
