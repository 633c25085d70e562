//! The sans-IO Reliable Connected engine of one NIC: QP contexts, the RC
//! requester and responder of `docs/spec/rc.md`, memory regions, the
//! flow scheduler and a congestion controller per QP.
//!
//! Driven like quinn-proto: the caller owns time and the network.
//!
//! - inputs: [`Engine::handle_packet`] (a received frame, with `now`),
//!   [`Engine::post_send`], [`Engine::post_recv`],
//!   [`Engine::post_srq_recv`], [`Engine::handle_timeout`];
//! - outputs: [`Engine::poll_transmit`] (the next frame to put on the wire),
//!   [`Engine::poll_timeout`] (when to call `handle_timeout` next),
//!   [`Engine::poll_completion`] (send and receive completions),
//!   [`Engine::poll_event`] (asynchronous events: SRQ limit reached).
//!
//! Poll order after any input: call `poll_transmit` until it returns
//! `None`, drain `poll_completion`, then sleep until `poll_timeout` (or
//! the next frame). ACKs, NAKs, probes and CNPs leave before paced data.
//! Nothing here reads a clock or allocates per packet in steady state.

mod ah;
pub mod auth;
mod counters;
mod datagram;
mod gsi;
mod mcast;
pub mod paths;
mod qp;
mod qpn_space;
mod read_recovery;
mod recv;
mod requester;
mod responder;
pub mod rx_flows;
pub use requester::ACK_REQ_MSGS_MAX;
pub use responder::MAX_DMA_LEN;
mod sgl;
mod types;
mod ud_cc;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::net::Ipv4Addr;

use pacer::hpcc::{HpccParams, HpccSettings, ParamError};
use pacer::scheduler::{FlowScheduler, SchedulerConfig};
use pacer::CongestionControl;

pub use ah::{AhAttr, MAX_AHS};
pub use counters::{EngineCounters, QpCounters};
pub use datagram::{grh_of, GRH_LEN};
pub use gsi::{GsiCounters, OutMad, ReceivedMad, GSI_QUEUE};
pub use mcast::{MAX_MCAST_GROUPS, MAX_MCAST_QP_ATTACH, MULTICAST_QPN};
pub use qp::{CcMode, UnknownCc, MIN_SEGMENT};
pub use qpn_space::{BadShard, QpnSpace, MAX_SHARDS};
pub use recv::MAX_RECV_WR;
pub use types::{
    rnr_timer_ns, AhId, Apart, ConnectParams, Cqe, Endpoint, InlineData, InlineTooLong, PathMtu,
    QpAccess, QpState, QpUpdate, Qpn, RcError, RecvWr, RtrAttr, RtsAttr, SendLimits, SendWr,
    SgList, Sge, TooManySges, TxFrame, UdDest, UdSource, WcOpcode, WcStatus, WrHead, WrOp, WrParts,
    WrPayload, MAX_INLINE_DATA, MAX_SGE,
};
pub use ud_cc::{UdFlowInfo, MAX_DEST_FLOWS, MAX_ECHOES, SAMPLE_TIMEOUT_T};

use crate::mr::{Access, Memory, MrError, MrKeys, MrTable, Pd, DEFAULT_PD};
use crate::wire::{check_vlan, MacAddr, Opcode, Packet, Service, VlanTag, WireError};
use qp::Qp;
use recv::RecvQueue;
use requester::TxItem;

/// A `split_min` no payload reaches: every frame is built whole.
const NEVER_SPLIT: usize = usize::MAX;

/// A shared receive queue of an engine.
pub type SrqId = u32;

/// Shared receive queues per engine.
pub const MAX_SRQS: usize = 1 << 12;

/// Asynchronous events (ibverbs' `ibv_async_event`) the engine raises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsyncEvent {
    /// The SRQ fell below its armed limit (which is now disarmed).
    SrqLimitReached(SrqId),
    /// The responder of the QP found an error no completion reports and
    /// moved the QP to ERR (IBA's affiliated asynchronous errors).
    QpError(Qpn, QpError),
    /// The QP, moved to SQD with notification asked for, has no send WR
    /// left in flight.
    SqDrained(Qpn),
    /// The QP, attached to an SRQ, went to ERR: no more receive WQEs of
    /// the SRQ complete on it.
    LastWqeReached(Qpn),
}

/// The responder error behind [`AsyncEvent::QpError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpError {
    /// A request outside the QP's access flags or the R_Key's region
    /// (IBV_EVENT_QP_ACCESS_ERR).
    Access,
    /// A request that breaks the protocol (IBV_EVENT_QP_REQ_ERR).
    InvalidRequest,
    /// Any other failure (IBV_EVENT_QP_FATAL).
    Fatal,
}

/// How a QP is created: its protection domain, queue sizes, and where its
/// receive WQEs come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpInit {
    pub pd: Pd,
    pub max_send_wr: usize,
    /// Its own receive queue's size (ignored with an SRQ).
    pub max_recv_wr: usize,
    /// Take receive WQEs from this shared receive queue.
    pub srq: Option<SrqId>,
    /// RC (the default), UC or UD.
    pub service: Service,
}

impl QpInit {
    /// A QP of the default PD with its own receive queue of 256 WQEs.
    pub fn new(max_send_wr: usize) -> Self {
        QpInit {
            pd: DEFAULT_PD,
            max_send_wr,
            max_recv_wr: 256,
            srq: None,
            service: Service::Rc,
        }
    }
}

/// QPNs start here (0 and 1 are special in InfiniBand).
pub const QPN_BASE: u32 = 0x11;
/// QPs per engine.
pub const MAX_QPS: usize = 1 << 16;
/// Outstanding send WRs per QP.
pub const MAX_SEND_WR: usize = 1 << 16;

/// Settings of one engine (one NIC port).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineConfig {
    pub mac: MacAddr,
    pub ip: Ipv4Addr,
    /// NIC line rate, b/s: the initial pacing rate of every QP.
    pub line_rate_bps: u64,
    pub cc: CcMode,
    /// HPCC++ parameters (all three HPCC++ modes).
    pub hpcc: HpccParams,
    /// DCQCN's reaction point (`CcMode::Dcqcn`): its rate steps, timers
    /// and stages.
    pub dcqcn: pacer::dcqcn::DcqcnParams,
    /// DCQCN's notification point: at most one CNP per QP per this many
    /// nanoseconds (so at most one rate cut per interval at the sender).
    pub cnp_interval_ns: u64,
    pub scheduler: SchedulerConfig,
    /// Unacknowledged PSNs a QP may have (the requester's PSN window).
    pub max_outstanding_psns: u32,
    /// AckReq at least every this many packets (1..=64; HPCC++ inband
    /// wants fresh telemetry, so small values suit it).
    pub ack_req_every: u32,
    /// AckReq at least every this many messages (1..=64; 1: on every
    /// message end, as rc.md and rxe). Above 1, ACKs are coalesced: the
    /// end of an unsignaled WR's message may go without AckReq, and our
    /// responder ACKs such requests after [`ACK_DELAY_NS`] if nothing
    /// asked first. A QP towards a standard peer gets 1
    /// ([`SendLimits::STANDARD_PEER`]).
    pub ack_req_msgs: u32,
    /// DSCP of every packet of a QP whose RTR attributes name none.
    pub dscp: u8,
    /// The 802.1Q tag of every frame sent (its PCP is the priority); frames
    /// received must carry the same VLAN id. None: untagged.
    pub vlan: Option<VlanTag>,
    /// Telemetry with 8-byte hop records (wire::tlm's COMPACT flag), as the
    /// HPCC authors' simulator carries it, instead of 16-byte ones.
    pub compact_int: bool,
    /// Data packets subscribe to INT responses (wire::tlm's SUBSCRIBE
    /// flag): congested switches answer the sender directly.
    pub int_subscribe: bool,
    /// Data packets ask the switches for their sojourn time instead of the
    /// queue length (wire::tlm's SOJOURN flag, HPCC++ 2023 s9.3): with QoS
    /// queues a queue's bytes do not tell the delay a packet meets there.
    pub int_sojourn: bool,
    /// Simulation only: packets carry this many payload bytes (at most the
    /// path MTU) instead of the path MTU, as the HPCC authors' simulator
    /// sends 1000-byte payloads. A RoCE peer expects every packet of a
    /// message but the last to carry exactly the path MTU, so this is for
    /// two of our own engines; `None` (the default) everywhere else.
    pub segment_bytes: Option<u32>,
    /// Receiver-measured N (HPCC++ draft-00 s6.2): as a receiver, count
    /// the flows through the last hop when it is the congestion point and
    /// report N in the ACKs' echoed telemetry; as a sender, set W_AI =
    /// W_init (1 - eta) / N from the reports.
    pub report_flows: bool,
    /// Path choice from telemetry (HPCC++ 2023 s9.4): a QP probes other
    /// UDP source ports (ECMP paths) and moves to a clearly less loaded one
    /// (hpcc and hpcc-probe modes); `None`: one path.
    pub path_choice: Option<pacer::path::PathConfig>,
    /// The QPNs this engine hands out: all, or its shard's when one
    /// device's QPs are sharded over several engines.
    pub qpns: QpnSpace,
}

/// The DSCP of an engine's packets unless configured (26, AF31, as RoCE
/// deployments commonly mark RDMA traffic).
pub const DEFAULT_DSCP: u8 = 26;

/// How long the responder holds the ACK of requests that did not ask for
/// one (a coalescing requester's unsignaled messages) before it sends it
/// anyway: one ACK for the lot when no AckReq comes first.
pub const ACK_DELAY_NS: u64 = 20_000;

/// [`EngineConfig::ack_req_msgs`]'s default: one AckReq per 16
/// unsignaled messages between two of our NICs.
pub const ACK_REQ_MSGS: u32 = 16;

impl EngineConfig {
    /// Defaults: no congestion control, HPCC++ parameters for the line rate
    /// with T = 5 us, N = 16 and 1 KiB MTU (W_init at least one MTU, for
    /// links whose BDP is smaller), a PSN window of 2^16.
    pub fn new(mac: MacAddr, ip: Ipv4Addr, line_rate_bps: u64) -> Self {
        let hpcc = HpccSettings::default()
            .params_at_least_one_mtu(line_rate_bps.max(1), 1024)
            .expect("the default settings are valid on any link");
        EngineConfig {
            mac,
            ip,
            line_rate_bps,
            cc: CcMode::None,
            hpcc,
            dcqcn: pacer::dcqcn::DcqcnParams::new(line_rate_bps as f64),
            cnp_interval_ns: pacer::dcqcn::CnpLimiter::DEFAULT_INTERVAL_NS,
            scheduler: SchedulerConfig::default(),
            max_outstanding_psns: 1 << 16,
            ack_req_every: requester::ACK_REQ_EVERY,
            ack_req_msgs: ACK_REQ_MSGS,
            dscp: DEFAULT_DSCP,
            vlan: None,
            compact_int: false,
            int_subscribe: false,
            int_sojourn: false,
            segment_bytes: None,
            report_flows: false,
            path_choice: None,
            qpns: QpnSpace::default(),
        }
    }

    /// Congestion control `cc` for every QP, with HPCC++ `settings` for
    /// this engine's line rate and a path MTU of `mtu` bytes. The one place
    /// an engine's congestion control is set from a configuration.
    pub fn with_cc(
        mut self,
        cc: CcMode,
        settings: &HpccSettings,
        mtu: u32,
    ) -> Result<Self, ParamError> {
        self.cc = cc;
        self.hpcc = settings.params(self.line_rate_bps, mtu)?;
        Ok(self)
    }
}

/// The RC engine of one NIC.
pub struct Engine<M: Memory> {
    cfg: EngineConfig,
    mem: M,
    mrs: MrTable,
    ahs: ah::AhTable,
    mcast: mcast::McastGroups,
    /// QP1, and when the last MAD to send was queued.
    gsi: gsi::Gsi,
    gsi_since: u64,
    qps: Vec<Option<Qp>>,
    /// Scheduler flow index -> QP index.
    flow_qp: Vec<u32>,
    sched: FlowScheduler,
    /// QPs with ACKs, NAKs or telemetry packets waiting.
    ctrl: VecDeque<u32>,
    cq: VecDeque<Cqe>,
    /// Receive queues: each QP's own and the shared ones, by index.
    rqs: Vec<Option<RecvQueue>>,
    events: VecDeque<AsyncEvent>,
    counters: EngineCounters,
    ip_ident: u16,
    /// (deadline, QP index) of every armed QP timer; entries whose QP has
    /// since re-armed or gone are stale and skipped. The top is always live.
    timers: BinaryHeap<Reverse<(u64, u32)>>,
    /// (peer IPv4 address, peer QPN) -> our QPN, for INT responses (a
    /// switch names the receiver's QP, the only one it knows).
    by_peer: HashMap<(Ipv4Addr, Qpn), Qpn>,
    /// The last hop's utilization, for receiver-measured N.
    last_hop: rx_flows::LastHop,
    /// N as last counted, and when.
    flows_counted: (u64, u16),
    /// (QP index, time) of the QP whose next packet the scheduler has
    /// not been told yet: after accepted posts (posts to one QP at one
    /// time refresh it once) or after a packet it sent (see
    /// `settle_posts` and `emit_granted`).
    post_owed: Option<(usize, u64)>,
    /// The time of the last accepted post or paced send not yet followed
    /// by a call that settles what is owed: `may_transmit` and
    /// `poll_timeout` report work then, without moving the scheduler's
    /// clock, whether or not it left a filing owed (a post behind an
    /// unsent WR, or a send that left its QP nothing, owes none), so
    /// that their answers, and what the scheduler decides after them,
    /// do not depend on which.
    owed_since: Option<u64>,
    /// A received frame in pieces put together (see
    /// `handle_packet_split`), kept for the next.
    rx_whole: Vec<u8>,
}

impl<M: Memory> Engine<M> {
    /// An engine whose clock starts at `now`.
    pub fn new(cfg: EngineConfig, mem: M, now: u64) -> Self {
        Engine {
            cfg,
            mem,
            mrs: MrTable::new(),
            ahs: ah::AhTable::default(),
            mcast: mcast::McastGroups::default(),
            gsi: gsi::Gsi::default(),
            gsi_since: now,
            qps: Vec::new(),
            flow_qp: Vec::new(),
            sched: FlowScheduler::new(cfg.scheduler, now),
            ctrl: VecDeque::new(),
            cq: VecDeque::new(),
            rqs: Vec::new(),
            events: VecDeque::new(),
            counters: EngineCounters::default(),
            ip_ident: 0,
            timers: BinaryHeap::new(),
            by_peer: HashMap::new(),
            last_hop: rx_flows::LastHop::new(cfg.hpcc.t_ns, cfg.hpcc.eta),
            flows_counted: (0, 0),
            post_owed: None,
            owed_since: None,
            rx_whole: Vec::new(),
        }
    }

    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    pub fn mem(&self) -> &M {
        &self.mem
    }

    pub fn mem_mut(&mut self) -> &mut M {
        &mut self.mem
    }

    pub fn counters(&self) -> &EngineCounters {
        &self.counters
    }

    /// Registers `[va, va + len)` of the engine's memory.
    pub fn register_mr(&mut self, va: u64, len: u64, access: Access) -> Result<MrKeys, MrError> {
        self.mrs.register(va, len, access)
    }

    /// Registers `[va, va + len)` for the QPs of protection domain `pd`
    /// only.
    pub fn register_mr_in(
        &mut self,
        pd: Pd,
        va: u64,
        len: u64,
        access: Access,
    ) -> Result<MrKeys, MrError> {
        self.mrs.register_in(pd, va, len, access)
    }

    /// Registers `[va, va + len)` of protection domain `pd` whose bytes
    /// are at device addresses `[dev, dev + len)` of the engine's memory
    /// (an application's own buffer, at its own address, mapped by the
    /// dataplane elsewhere). Work requests and the peer use `va`.
    pub fn register_mr_at(
        &mut self,
        pd: Pd,
        va: u64,
        len: u64,
        access: Access,
        dev: u64,
    ) -> Result<MrKeys, MrError> {
        self.mrs.register_at(pd, va, len, access, dev)
    }

    /// Registered regions (all PDs).
    pub fn mr_count(&self) -> usize {
        self.mrs.len()
    }

    /// QPs that exist (any state).
    pub fn qp_count(&self) -> usize {
        self.qps.iter().filter(|q| q.is_some()).count()
    }

    pub fn deregister_mr(&mut self, lkey: u32) -> Result<(), MrError> {
        self.mrs.deregister(lkey)
    }

    fn index(&self, qpn: Qpn) -> Result<usize, RcError> {
        let i = self.cfg.qpns.slot(qpn);
        match i.map(|i| (i, self.qps.get(i))) {
            Some((i, Some(Some(_)))) => Ok(i),
            _ => Err(RcError::NoSuchQp(qpn)),
        }
    }

    fn qp_mut(&mut self, qpn: Qpn) -> Result<&mut Qp, RcError> {
        let i = self.index(qpn)?;
        Ok(self.qps[i].as_mut().expect("index checked"))
    }

    /// Creates a QP in RESET with room for `max_send_wr` outstanding WRs,
    /// in the default protection domain.
    pub fn create_qp(&mut self, max_send_wr: usize, now: u64) -> Result<Qpn, RcError> {
        self.create_qp_in(DEFAULT_PD, max_send_wr, now)
    }

    /// Creates a QP of protection domain `pd`: it reaches only that PD's
    /// regions, as requester and as responder.
    pub fn create_qp_in(&mut self, pd: Pd, max_send_wr: usize, now: u64) -> Result<Qpn, RcError> {
        self.create_qp_with(
            QpInit {
                pd,
                ..QpInit::new(max_send_wr)
            },
            now,
        )
    }

    /// Creates a QP as `init` says.
    pub fn create_qp_with(&mut self, init: QpInit, now: u64) -> Result<Qpn, RcError> {
        let max_send_wr = init.max_send_wr;
        check_bits("max_send_wr", max_send_wr as u64, MAX_SEND_WR as u64)?;
        check_bits("max_recv_wr", init.max_recv_wr as u64, MAX_RECV_WR as u64)?;
        if let Some(srq) = init.srq {
            let srq_pd = self.srq(srq)?.pd;
            if srq_pd != init.pd {
                return Err(RcError::SrqOtherPd {
                    srq,
                    srq_pd,
                    qp_pd: init.pd,
                });
            }
        }
        let i = match self.qps.iter().position(Option::is_none) {
            Some(i) => i,
            None if self.qps.len() < self.cfg.qpns.max_qps() => {
                self.qps.push(None);
                self.qps.len() - 1
            }
            None => return Err(RcError::TooManyQps(self.cfg.qpns.max_qps())),
        };
        let qpn = self.cfg.qpns.qpn(i);
        let rq = match init.srq {
            Some(srq) => srq as usize,
            None => self.add_rq(RecvQueue::new(init.pd, init.max_recv_wr, false))?,
        };
        if let Some(q) = self.rqs[rq].as_mut() {
            q.users += 1;
        }
        let flow = self.sched.add_flow(self.cfg.line_rate_bps, u64::MAX, now);
        if self.flow_qp.len() <= flow.0 as usize {
            self.flow_qp.resize(flow.0 as usize + 1, u32::MAX);
        }
        self.flow_qp[flow.0 as usize] = i as u32;
        self.qps[i] = Some(Qp::new(
            qpn,
            init.service,
            init.pd,
            rq,
            max_send_wr.max(1),
            flow,
            &self.cfg,
        ));
        Ok(qpn)
    }

    fn add_rq(&mut self, q: RecvQueue) -> Result<usize, RcError> {
        if let Some(i) = self.rqs.iter().position(Option::is_none) {
            self.rqs[i] = Some(q);
            return Ok(i);
        }
        if self.rqs.len() >= MAX_QPS + MAX_SRQS {
            return Err(RcError::TooManySrqs(MAX_SRQS));
        }
        self.rqs.push(Some(q));
        Ok(self.rqs.len() - 1)
    }

    fn srq(&mut self, srq: SrqId) -> Result<&mut RecvQueue, RcError> {
        match self.rqs.get_mut(srq as usize) {
            Some(Some(q)) if q.shared => Ok(q),
            _ => Err(RcError::NoSuchSrq(srq)),
        }
    }

    /// Creates a shared receive queue of protection domain `pd` holding up
    /// to `max_wr` receive WQEs.
    pub fn create_srq(&mut self, pd: Pd, max_wr: usize) -> Result<SrqId, RcError> {
        check_bits("max_srq_wr", max_wr as u64, MAX_RECV_WR as u64)?;
        let shared = self.rqs.iter().flatten().filter(|q| q.shared).count();
        if shared >= MAX_SRQS {
            return Err(RcError::TooManySrqs(MAX_SRQS));
        }
        Ok(self.add_rq(RecvQueue::new(pd, max_wr, true))? as SrqId)
    }

    /// Destroys an SRQ no QP uses any more; its WQEs are dropped.
    pub fn destroy_srq(&mut self, srq: SrqId) -> Result<(), RcError> {
        if self.srq(srq)?.users > 0 {
            return Err(RcError::SrqInUse(srq));
        }
        self.rqs[srq as usize] = None;
        Ok(())
    }

    /// Arms the SRQ's limit: when a SEND leaves fewer than `limit` WQEs,
    /// [`AsyncEvent::SrqLimitReached`] is raised once (0 disarms).
    pub fn modify_srq_limit(&mut self, srq: SrqId, limit: u32) -> Result<(), RcError> {
        self.srq(srq)?.set_limit(limit);
        Ok(())
    }

    /// Receive WQEs waiting in the SRQ.
    pub fn srq_len(&mut self, srq: SrqId) -> Result<usize, RcError> {
        Ok(self.srq(srq)?.len())
    }

    /// The SRQ's armed limit (0: disarmed).
    pub fn srq_limit(&mut self, srq: SrqId) -> Result<u32, RcError> {
        Ok(self.srq(srq)?.limit())
    }

    /// Posts a receive WR to the SRQ.
    pub fn post_srq_recv(&mut self, srq: SrqId, wr: RecvWr) -> Result<(), RcError> {
        if !self.srq(srq)?.post(wr) {
            return Err(RcError::SrqFull(srq));
        }
        Ok(())
    }

    /// Posts a receive WR to the QP's own receive queue (any state but
    /// RESET; in ERR it completes at once with WR_FLUSH_ERR). Refused for a
    /// QP attached to an SRQ.
    pub fn post_recv(&mut self, qpn: Qpn, wr: RecvWr) -> Result<(), RcError> {
        let i = self.index(qpn)?;
        let qp = self.qps[i].as_ref().expect("index checked");
        let (state, rq) = (qp.state, qp.rq);
        if state == QpState::Reset {
            return Err(RcError::WrongState {
                qpn,
                state,
                need: QpState::Init,
                what: "posting a receive WR",
            });
        }
        let Some(q) = self.rqs[rq].as_mut() else {
            return Err(RcError::NoSuchQp(qpn));
        };
        if q.shared {
            return Err(RcError::QpUsesSrq(qpn));
        }
        if state == QpState::Err {
            self.cq.push_back(recv_flush(qpn, &wr));
            return Ok(());
        }
        if !q.post(wr) {
            return Err(RcError::RecvQueueFull(qpn));
        }
        Ok(())
    }

    /// The next asynchronous event.
    pub fn poll_event(&mut self) -> Option<AsyncEvent> {
        self.events.pop_front()
    }

    /// Destroys a QP; its outstanding WRs (send and receive) are dropped
    /// without completions.
    pub fn destroy_qp(&mut self, qpn: Qpn) -> Result<(), RcError> {
        self.settle_posts();
        let i = self.index(qpn)?;
        let qp = self.qps[i].take().expect("index checked");
        self.counters.closed_qps.accumulate(&qp.counters);
        self.forget_peer(&qp);
        self.mcast.forget(qpn);
        if let Some(q) = self.rqs[qp.rq].as_mut() {
            q.users = q.users.saturating_sub(1);
            if !q.shared {
                self.rqs[qp.rq] = None;
            }
        }
        self.sched.remove_flow(qp.flow);
        self.ctrl.retain(|&q| q as usize != i);
        self.drop_stale_timers();
        Ok(())
    }

    pub fn qp_state(&self, qpn: Qpn) -> Result<QpState, RcError> {
        let i = self.index(qpn)?;
        Ok(self.qps[i].as_ref().expect("index checked").state)
    }

    /// The MAC of `ip` is `mac` (the pipeline resolved it): QPs connected
    /// to that address send to it from now on. A QP moved to RTR with the
    /// zero MAC (address not yet resolved) leaves its frames to the
    /// pipeline's resolution until then.
    pub fn set_neighbour(&mut self, ip: Ipv4Addr, mac: MacAddr) {
        for qp in self.qps.iter_mut().flatten() {
            if let Some(r) = qp
                .rtr
                .as_mut()
                .filter(|r| r.dest_ip == ip && r.dest_mac != mac)
            {
                r.dest_mac = mac;
                qp.build_template(&self.cfg);
            }
        }
        self.ahs.set_neighbour(ip, mac, &self.cfg);
    }

    /// Creates an address handle (ibv_create_ah): where a UD QP of its
    /// PD sends the datagrams of the WRs that name it.
    pub fn create_ah(&mut self, attr: AhAttr) -> Result<AhId, RcError> {
        let cfg = self.cfg;
        self.ahs.create(attr, &cfg)
    }

    /// Destroys an address handle of `pd`. WRs posted with it and not
    /// sent yet lose their datagrams (counted as `datagrams_unaddressed`).
    pub fn destroy_ah(&mut self, ah: AhId, pd: Pd) -> Result<(), RcError> {
        self.ahs.destroy(ah, pd)
    }

    /// What an address handle of `pd` names (ibv_query_ah).
    pub fn ah_attr(&self, ah: AhId, pd: Pd) -> Result<AhAttr, RcError> {
        self.ahs.get(ah, pd).ok_or(RcError::NoSuchAh(ah))
    }

    /// Address handles alive.
    pub fn ah_count(&self) -> usize {
        self.ahs.len()
    }

    /// Attaches UD QP `qpn` to multicast group `group` (ibv_attach_mcast):
    /// it receives the datagrams sent to the group from now on.
    pub fn attach_mcast(&mut self, qpn: Qpn, group: Ipv4Addr) -> Result<(), RcError> {
        let i = self.index(qpn)?;
        let service = self.qps[i].as_ref().expect("index checked").service;
        if service != Service::Ud {
            return Err(RcError::NotOnService {
                what: "multicast",
                service: service.name(),
            });
        }
        self.mcast.attach(qpn, group)
    }

    /// Detaches `qpn` from `group` (ibv_detach_mcast).
    pub fn detach_mcast(&mut self, qpn: Qpn, group: Ipv4Addr) -> Result<(), RcError> {
        self.index(qpn)?;
        self.mcast.detach(qpn, group)
    }

    /// Whether a QP of this engine is attached to `group` (a datagram
    /// this NIC sends there comes back to its own RX too).
    pub fn joined(&self, group: Ipv4Addr) -> bool {
        self.mcast.has(group)
    }

    /// The groups `qpn` is attached to.
    pub fn mcast_groups_of(&self, qpn: Qpn) -> Vec<Ipv4Addr> {
        self.mcast.groups_of(qpn)
    }

    /// The next MAD QP1 received, for the management agents.
    pub fn poll_mad(&mut self) -> Option<ReceivedMad> {
        self.gsi.poll()
    }

    /// Queues a MAD to send from QP1 at `now` (it goes before paced
    /// traffic); refused when [`GSI_QUEUE`] wait already.
    pub fn send_mad(&mut self, m: OutMad, now: u64) -> Result<(), RcError> {
        self.gsi.send(m)?;
        self.gsi_since = now;
        Ok(())
    }

    /// What QP1 received, sent and dropped.
    pub fn gsi_counters(&self) -> GsiCounters {
        self.gsi.counters
    }

    /// Sets a UD QP's Q_Key (in RESET -> INIT, INIT -> INIT, RTS -> RTS,
    /// as ibverbs' IBV_QP_QKEY does).
    pub fn set_qp_qkey(&mut self, qpn: Qpn, qkey: u32) -> Result<(), RcError> {
        let qp = self.qp_mut(qpn)?;
        if qp.service != Service::Ud {
            return Err(RcError::NotOnService {
                what: "a Q_Key",
                service: qp.service.name(),
            });
        }
        qp.qkey = qkey;
        Ok(())
    }

    /// A UD QP's INIT -> RTR: datagrams of at most `mtu` bytes.
    pub fn modify_ud_to_rtr(&mut self, qpn: Qpn, mtu: PathMtu) -> Result<(), RcError> {
        let qp = self.qp_mut(qpn)?;
        if qp.service != Service::Ud {
            return Err(RcError::NotOnService {
                what: "INIT -> RTR without a destination",
                service: qp.service.name(),
            });
        }
        qp.modify_ud_to_rtr(mtu)
    }

    /// A UD QP's RTR -> RTS with its first PSN.
    pub fn modify_ud_to_rts(&mut self, qpn: Qpn, sq_psn: u32) -> Result<(), RcError> {
        let qp = self.qp_mut(qpn)?;
        if qp.service != Service::Ud {
            return Err(RcError::NotOnService {
                what: "RTR -> RTS without retry attributes",
                service: qp.service.name(),
            });
        }
        qp.modify_ud_to_rts(sq_psn)
    }

    /// The transport service of a QP.
    pub fn qp_service(&self, qpn: Qpn) -> Result<Service, RcError> {
        let i = self.index(qpn)?;
        Ok(self.qps[i].as_ref().expect("index checked").service)
    }

    /// The congestion control a QP runs.
    pub fn qp_cc_mode(&self, qpn: Qpn) -> Result<CcMode, RcError> {
        let i = self.index(qpn)?;
        Ok(self.qps[i].as_ref().expect("index checked").mode)
    }

    /// Whether a QP's feedback is authenticated (it reached RTR with a
    /// feedback key).
    pub fn qp_feedback_keyed(&self, qpn: Qpn) -> Result<bool, RcError> {
        let i = self.index(qpn)?;
        Ok(self.qps[i].as_ref().expect("index checked").keyed())
    }

    /// Gives one QP its own congestion control (the engine's is the
    /// default), before it connects: in RESET or INIT. Both ends of a
    /// connection must run the same mode (telemetry is echoed, probed or
    /// notified by the responder as its own mode says).
    pub fn set_qp_cc(&mut self, qpn: Qpn, mode: CcMode) -> Result<(), RcError> {
        self.settle_posts();
        let cfg = EngineConfig {
            cc: mode,
            ..self.cfg
        };
        self.qp_mut(qpn)?.set_cc(&cfg)
    }

    /// Every QP's counters summed, those destroyed or reset included.
    pub fn qp_totals(&self) -> QpCounters {
        let mut t = self.counters.closed_qps;
        for qp in self.qps.iter().flatten() {
            t.accumulate(&qp.counters);
        }
        t
    }

    pub fn qp_counters(&self, qpn: Qpn) -> Result<QpCounters, RcError> {
        let i = self.index(qpn)?;
        Ok(self.qps[i].as_ref().expect("index checked").counters)
    }

    /// Send WRs of the QP taken and not completed yet (a WR leaves once
    /// it completes, signaled or not; an application sees it as a free
    /// slot of its send queue).
    pub fn qp_send_queued(&self, qpn: Qpn) -> Result<usize, RcError> {
        let i = self.index(qpn)?;
        Ok(self.qps[i].as_ref().expect("index checked").req.queued())
    }

    /// The QP's snd_nxt (the PSN its requester sends next), as congestion
    /// control sees it.
    pub fn qp_snd_nxt(&self, qpn: Qpn) -> Result<u32, RcError> {
        let i = self.index(qpn)?;
        Ok(self.qps[i].as_ref().expect("index checked").req.snd_nxt())
    }

    /// Current window (bytes) and pacing rate (b/s) of a QP's controller.
    pub fn qp_cc(&self, qpn: Qpn) -> Result<(u64, u64), RcError> {
        let i = self.index(qpn)?;
        let qp = self.qps[i].as_ref().expect("index checked");
        Ok((qp.cc.window_bytes(), qp.cc.rate_bps()))
    }

    /// A UD QP's flow per destination that speaks our telemetry (none
    /// unless the engine runs an HPCC++ mode).
    pub fn ud_flows(&self, qpn: Qpn) -> Result<Vec<UdFlowInfo>, RcError> {
        let i = self.index(qpn)?;
        Ok(self.qps[i].as_ref().expect("index checked").ud_flows())
    }

    /// RESET -> INIT with the QP's access flags.
    pub fn modify_to_init(&mut self, qpn: Qpn, access: QpAccess) -> Result<(), RcError> {
        self.qp_mut(qpn)?.modify_to_init(access)
    }

    /// INIT -> RTR.
    pub fn modify_to_rtr(&mut self, qpn: Qpn, attr: RtrAttr) -> Result<(), RcError> {
        let cfg = self.cfg;
        let qp = self.qp_mut(qpn)?;
        if qp.service == Service::Ud {
            return Err(RcError::NotOnService {
                what: "a destination at RTR",
                service: "UD",
            });
        }
        qp.modify_to_rtr(attr, &cfg)?;
        self.by_peer.insert((attr.dest_ip, attr.dest_qpn), qpn);
        Ok(())
    }

    /// Forgets `qp`'s peer in the INT response index.
    fn forget_peer(&mut self, qp: &Qp) {
        if let Some(peer) = qp.peer() {
            if self.by_peer.get(&peer) == Some(&qp.qpn) {
                self.by_peer.remove(&peer);
            }
        }
    }

    /// RTR -> RTS.
    pub fn modify_to_rts(&mut self, qpn: Qpn, attr: RtsAttr) -> Result<(), RcError> {
        let defaults = SendLimits {
            max_outstanding_psns: self.cfg.max_outstanding_psns,
            ack_req_every: self.cfg.ack_req_every,
            ack_req_msgs: self.cfg.ack_req_msgs,
        };
        let qp = self.qp_mut(qpn)?;
        if qp.service == Service::Ud {
            return Err(RcError::NotOnService {
                what: "retry attributes at RTS",
                service: "UD",
            });
        }
        let limits = qp.send_limits.unwrap_or(defaults);
        qp.modify_to_rts(attr, limits)
    }

    /// Gives one QP its own [`SendLimits`] (kept until RESET), applied at
    /// once when it is connected already.
    pub fn set_qp_send_limits(&mut self, qpn: Qpn, limits: SendLimits) -> Result<(), RcError> {
        self.settle_posts();
        let qp = self.qp_mut(qpn)?;
        qp.send_limits = Some(limits);
        if matches!(qp.state, QpState::Rts | QpState::Sqd) {
            qp.req.set_limits(limits);
        }
        Ok(())
    }

    /// RESET -> INIT -> RTR -> RTS in one call: the usual bring-up once
    /// the peer's endpoint (QPN, PSN, address) is known.
    pub fn connect(
        &mut self,
        qpn: Qpn,
        access: QpAccess,
        rtr: RtrAttr,
        rts: RtsAttr,
    ) -> Result<(), RcError> {
        self.modify_to_init(qpn, access)?;
        self.modify_to_rtr(qpn, rtr)?;
        self.modify_to_rts(qpn, rts)
    }

    /// RESET -> RTS towards `peer` with this QP's first PSN `sq_psn`: the
    /// attributes come from [`ConnectParams::attrs`].
    pub fn connect_to(
        &mut self,
        qpn: Qpn,
        sq_psn: u32,
        peer: &Endpoint,
        params: &ConnectParams,
    ) -> Result<(), RcError> {
        let (rtr, rts) = params.attrs(sq_psn, peer);
        self.connect(qpn, params.access, rtr, rts)
    }

    /// A modify that keeps the connection (INIT->INIT, RTS->RTS, RTS->SQD,
    /// SQD->RTS, SQD->SQD) with the attributes `u` changes. In SQD the
    /// requester finishes the WRs it has and takes no new ones; with
    /// `sqd_notify`, [`AsyncEvent::SqDrained`] follows once they are done.
    pub fn modify_qp(
        &mut self,
        qpn: Qpn,
        to: QpState,
        u: &QpUpdate,
        sqd_notify: bool,
        now: u64,
    ) -> Result<(), RcError> {
        self.settle_posts();
        let i = self.index(qpn)?;
        self.qps[i]
            .as_mut()
            .expect("index checked")
            .modify_in_place(to, u, sqd_notify)?;
        self.refresh(i, now);
        Ok(())
    }

    /// Any state -> RESET: the QP keeps its number, PD and queues but
    /// forgets its connection; its WRs (send, and receive on its own
    /// queue) are dropped without completions, as IBA's RESET does.
    pub fn reset_qp(&mut self, qpn: Qpn) -> Result<(), RcError> {
        self.settle_posts();
        let i = self.index(qpn)?;
        let old = self.qps[i].take().expect("index checked");
        self.counters.closed_qps.accumulate(&old.counters);
        self.forget_peer(&old);
        if let Some(q) = self.rqs[old.rq].as_mut().filter(|q| !q.shared) {
            q.drain().for_each(drop);
        }
        self.sched.set_next_packet(old.flow, None, 0);
        // Timers armed for the old QP are found stale (`armed` is None).
        let cap = old.req.capacity();
        let (pd, rq, flow) = (old.pd, old.rq, old.flow);
        self.qps[i] = Some(Qp::new(qpn, old.service, pd, rq, cap, flow, &self.cfg));
        self.drop_stale_timers();
        Ok(())
    }

    /// Any state -> ERR: every outstanding WR completes with WR_FLUSH_ERR.
    pub fn modify_to_err(&mut self, qpn: Qpn) -> Result<(), RcError> {
        self.settle_posts();
        let i = self.index(qpn)?;
        self.fail_qp(i, WcStatus::WrFlushErr);
        Ok(())
    }

    /// Posts a send WR. Refused at once when the QP is not in RTS, the
    /// send queue is full, the length exceeds 2^31 or an atomic's local
    /// buffer is not 8 bytes; a bad local buffer completes with LOC_PROT_ERR
    /// once the WRs before it have completed, and moves the QP to ERR, as a
    /// NIC does.
    pub fn post_send(&mut self, qpn: Qpn, wr: SendWr, now: u64) -> Result<(), RcError> {
        self.post_send_parts(qpn, &WrParts::of(&wr), now)
    }

    /// [`Engine::post_send`] of a WR given as borrowed parts.
    pub fn post_send_parts(&mut self, qpn: Qpn, wr: &WrParts<'_>, now: u64) -> Result<(), RcError> {
        let i = self.index(qpn)?;
        // A WR queued behind one not yet sent leaves the QP's next paced
        // packet (the first unsent WR's) as it is: nothing is owed for
        // it, and what is owed stays so (it is not this WR's).
        let behind = self.qps[i].as_ref().is_some_and(|q| q.req.has_unsent());
        // What is owed is of its own time: filed before this WR joins
        // the queue (after a send, the QP owed may be this one, whose
        // next packet this WR would otherwise become as of then).
        if !behind && self.post_owed.is_some_and(|owed| owed != (i, now)) {
            self.settle_posts();
        }
        let qp = self.qps[i].as_mut().expect("index checked");
        if qp.state != QpState::Rts {
            return Err(RcError::WrongState {
                qpn,
                state: qp.state,
                need: QpState::Rts,
                what: "posting a send WR",
            });
        }
        let total = wr.total();
        if total > responder::MAX_DMA_LEN {
            return Err(RcError::TooLong(total.min(u64::from(u32::MAX)) as u32));
        }
        let inline = matches!(wr.payload, WrPayload::Inline(_));
        if inline && wr.head.op.is_read_or_atomic() {
            let what = if wr.head.op == WrOp::Read {
                "RDMA READ"
            } else {
                "an atomic"
            };
            return Err(RcError::InlineOp(what));
        }
        if qp.service != Service::Rc {
            check_unreliable(qp, wr, &self.ahs)?;
        }
        if wr.head.ud.is_some() && qp.service != Service::Ud {
            return Err(RcError::NotOnService {
                what: "an address handle",
                service: qp.service.name(),
            });
        }
        if wr.head.op.is_atomic() && total != 8 {
            return Err(RcError::AtomicLength {
                what: "an atomic",
                len: total,
            });
        }
        match wr.payload {
            WrPayload::Sges(s) if s.len() > MAX_SGE => {
                return Err(RcError::TooManySges(TooManySges(s.len())));
            }
            WrPayload::Inline(d) if d.len() > MAX_INLINE_DATA => {
                return Err(RcError::OutOfRange {
                    what: "inline bytes",
                    value: d.len() as u64,
                    max: MAX_INLINE_DATA as u64,
                });
            }
            _ => {}
        }
        if qp.req.is_full() {
            return Err(RcError::SendQueueFull(qpn));
        }
        let write_local = wr.head.op.is_read_or_atomic();
        let mrs = self.mrs.pd(qp.pd);
        let bad_local = match wr.payload {
            WrPayload::Sges(sges) => sges.iter().filter(|s| s.len > 0).any(|s| {
                mrs.check_local(s.lkey, s.va, u64::from(s.len), write_local)
                    .is_err()
            }),
            WrPayload::Inline(_) => false,
        };
        qp.req.post(wr, bad_local.then_some(WcStatus::LocProtErr));
        if bad_local {
            self.settle_posts();
            self.refresh(i, now);
        } else {
            if !behind {
                // Anything else owed was filed above.
                self.post_owed = Some((i, now));
            }
            self.owed_since = Some(now);
        }
        Ok(())
    }

    /// Tells the scheduler the next paced packet of the QP whose posts
    /// (or whose packet just sent, see `refresh_sent_owing`) are owed
    /// it. A valid post changes nothing a refresh reads but the
    /// QP's next paced packet (no WR completes, no timer starts, no
    /// control packet is owed, the state stays RTS), so that is all it
    /// refreshes, and for a burst of posts to one QP at one time, as an
    /// application's doorbell brings them, once: here, before any
    /// call whose work depends on what the refresh computes or that may
    /// free or replace the QP (`poll_transmit`, `handle_packet`,
    /// `handle_timeout`, `modify_qp`, `modify_to_err`, `reset_qp`,
    /// `destroy_qp`, `set_qp_cc`, `set_qp_send_limits`, and a post of
    /// another QP or time that will change its QP's next packet, before
    /// its WR is queued), with the time owed. A post behind unsent WRs
    /// changes no QP's next packet, so it owes and settles nothing.
    /// Calls that skip it (queries, `post_recv`, the modifies to INIT,
    /// RTR and RTS) neither read the scheduler nor change a QP's next
    /// packet: the QP owed may be in RTR after sending a READ response,
    /// and moving it to RTS gives it an empty send queue. `poll_timeout`
    /// reports what is owed as due; `next_timer` need not, as neither a
    /// post nor the filing owed starts a timer.
    fn settle_posts(&mut self) {
        self.owed_since = None;
        if let Some((i, now)) = self.post_owed.take() {
            self.refresh_next(i, now);
        }
    }

    /// The next completion, in post order per QP.
    pub fn poll_completion(&mut self) -> Option<Cqe> {
        self.cq.pop_front()
    }

    /// Moves the QP to ERR: the oldest WR completes with `status`, the rest
    /// with WR_FLUSH_ERR; a NAK already queued still goes out.
    fn fail_qp(&mut self, i: usize, status: WcStatus) {
        let Some(qp) = self.qps[i].as_mut() else {
            return;
        };
        let qpn = qp.qpn;
        let cq = &mut self.cq;
        // Completed WRs still queued report only if signaled; failed and
        // flushed ones always do.
        qp.req.flush(status, &mut |wr, st| {
            if wr.signaled || st != WcStatus::Success {
                cq.push_back(requester::cqe(qpn, &wr, st))
            }
        });
        // Receive WQEs: the one a SEND held, then the QP's own queue (an
        // SRQ's WQEs stay for its other QPs).
        if let Some(wr) = qp.resp.reset_queues() {
            cq.push_back(recv_flush(qpn, &wr));
        }
        match self.rqs[qp.rq].as_mut() {
            Some(q) if !q.shared => cq.extend(q.drain().map(|wr| recv_flush(qpn, &wr))),
            Some(_) if qp.state != QpState::Err => {
                self.events.push_back(AsyncEvent::LastWqeReached(qpn));
            }
            _ => {}
        }
        qp.state = QpState::Err;
        self.sched.set_next_packet(qp.flow, None, 0);
        if qp.resp.has_ack() {
            self.queue_ctrl(i);
        }
        self.arm(i);
    }

    fn queue_ctrl(&mut self, i: usize) {
        if let Some(qp) = self.qps[i].as_mut() {
            if !qp.in_ctrl {
                qp.in_ctrl = true;
                self.ctrl.push_back(i as u32);
            }
        }
    }

    /// Moves the QP's completed send WRs to the CQ (signaled ones
    /// report).
    fn complete_sent(&mut self, i: usize) {
        let Some(qp) = self.qps[i].as_mut() else {
            return;
        };
        let qpn = qp.qpn;
        while let Some(done) = qp.req.pop_completed() {
            if done.signaled {
                self.cq
                    .push_back(requester::cqe(qpn, &done, WcStatus::Success));
            }
        }
        // A UC or UD WR completes as it is sent: its QP may drain so.
        if qp.service != Service::Rc && qp.req.failed_front().is_none() && qp.take_drained() {
            self.events.push_back(AsyncEvent::SqDrained(qpn));
        }
    }

    /// Tells the scheduler the size of the QP's next paced packet and its
    /// controller's rate; moves completed WRs to the CQ.
    fn refresh(&mut self, i: usize, now: u64) {
        self.complete_sent(i);
        let Some(qp) = self.qps[i].as_mut() else {
            return;
        };
        let qpn = qp.qpn;
        if let Some(status) = qp.req.failed_front() {
            self.fail_qp(i, status);
            return;
        }
        if qp.take_drained() {
            self.events.push_back(AsyncEvent::SqDrained(qpn));
        }
        self.refresh_sent(i, now);
    }

    /// What a packet sent can change of a QP: its next paced packet (and
    /// its rate), a control packet owed (a probe due), its timers. No WR
    /// completes or fails by being sent and the send queue does not
    /// drain, so [`Engine::refresh`]'s other checks are left out.
    fn refresh_sent(&mut self, i: usize, now: u64) {
        self.refresh_next(i, now);
        if self.qps[i].as_ref().is_some_and(Qp::has_ctrl) {
            self.queue_ctrl(i);
        }
        self.arm(i);
    }

    /// [`Engine::refresh_sent`] with the scheduler's part owed, as after
    /// posts: the next call of `poll_transmit` at the same time may then
    /// grant the QP's next packet at once ([`Engine::grant_posted`]) when
    /// no other flow is ready (a QP sending a burst alone), instead of
    /// filing it and taking it out of the ready FIFO again; any other
    /// call files it first. The same decisions either way:
    /// [`FlowScheduler::send_now`] is filing followed by `next_send`.
    /// A QP left with nothing to send (a ping-pong's WRITE, a burst's
    /// last) is filed at once as having no packet, which needs none of
    /// the requester's gates.
    fn refresh_sent_owing(&mut self, i: usize, now: u64) {
        // Nothing else is owed here (a grant or a send settles it first).
        debug_assert!(
            self.post_owed.is_none(),
            "owed at a send: {:?}",
            self.post_owed
        );
        self.settle_posts();
        match self.qps[i].as_ref() {
            // Nothing left to send: the filing is of no packet, at once
            // (no gates to ask; a no-op unless the rate changed).
            Some(qp) if !qp.may_have_paced() => {
                // What `next_paced` skips: no response, no request.
                debug_assert!(qp.resp.peek_response().is_none());
                debug_assert!(qp.req.peek_frame(u64::MAX).is_none());
                let rate = qp.pacing_rate(&self.ahs);
                self.sched.set_rate_and_next(qp.flow, rate, None, now);
            }
            _ => self.post_owed = Some((i, now)),
        }
        self.owed_since = Some(now);
        if self.qps[i].as_ref().is_some_and(Qp::has_ctrl) {
            self.queue_ctrl(i);
        }
        self.arm(i);
    }

    /// Tells the scheduler the QP's rate and the size of its next paced
    /// packet: all a valid post changes (see [`Engine::settle_posts`]).
    fn refresh_next(&mut self, i: usize, now: u64) {
        if let Some(qp) = self.qps[i].as_ref() {
            let size = qp.next_paced_size(&self.cfg, &self.ahs);
            let rate = qp.pacing_rate(&self.ahs);
            self.sched.set_rate_and_next(qp.flow, rate, size, now);
        }
    }

    /// Files the QP's earliest timer in the timer heap if it came earlier.
    /// Lazily: a deadline moved later (the retransmission timer restarted
    /// by an ACK, once per ACK) or gone (the last ACK stopped it, once per
    /// message) keeps the entry filed, which fires early, finds nothing
    /// due and files the real deadline then; so a QP exchanging messages
    /// faster than its timeout files one entry per timeout, not one per
    /// message.
    fn arm(&mut self, i: usize) {
        if let Some(qp) = self.qps[i].as_mut() {
            if let Some(t) = qp.timeout() {
                if qp.armed.is_none_or(|a| t < a) {
                    qp.armed = Some(t);
                    self.timers.push(Reverse((t, i as u32)));
                }
            }
        }
        // The top stays live without a look: an entry filed here is
        // either the new top (earlier than the QP's old one, which only
        // then goes stale) or not the top at all.
    }

    fn timer_is_live(&self, t: u64, i: u32) -> bool {
        self.qps
            .get(i as usize)
            .and_then(Option::as_ref)
            .is_some_and(|qp| qp.armed == Some(t))
    }

    fn drop_stale_timers(&mut self) {
        while let Some(&Reverse((t, i))) = self.timers.peek() {
            if self.timer_is_live(t, i) {
                break;
            }
            self.timers.pop();
        }
    }

    /// Handles one received frame at `now`.
    pub fn handle_packet(&mut self, now: u64, frame: &[u8]) {
        self.settle_posts();
        self.counters.rx_frames += 1;
        if !self.on_own_vlan(frame) {
            return;
        }
        self.handle_frame(now, frame);
    }

    /// Handles a received frame on the engine's VLAN, counted already.
    fn handle_frame(&mut self, now: u64, frame: &[u8]) {
        // Borrowed from the result, not moved out of it: a Packet is
        // ~400 bytes.
        let parsed = Packet::parse(frame);
        let p = match &parsed {
            Ok(p) => p,
            Err(e) => {
                self.count_drop(*e);
                if let WireError::BadIcrc { .. } = e {
                    self.count_icrc_drop(frame);
                }
                return;
            }
        };
        self.handle_parsed(now, p);
    }

    /// Handles one received frame at `now` that arrives in three pieces:
    /// its headers, its payload and its tail (pad and ICRC), as a frame
    /// sent from separate buffers ([`TxFrame::Split`]) arrives when the
    /// port hands the buffers on. The same as [`Engine::handle_packet`]
    /// of the pieces in one buffer, without copying the payload there
    /// when the frame is a data packet of the kinds read at fixed offsets.
    pub fn handle_packet_split(&mut self, now: u64, head: &[u8], payload: &[u8], tail: &[u8]) {
        self.settle_posts();
        self.counters.rx_frames += 1;
        // The Ethernet header is in `head`.
        if !self.on_own_vlan(head) {
            return;
        }
        if let Some(p) = Packet::parse_split(head, payload, tail) {
            self.handle_parsed(now, &p);
            return;
        }
        // Anything else is parsed from one buffer, which names what is
        // wrong with it.
        let mut whole = std::mem::take(&mut self.rx_whole);
        whole.clear();
        whole.extend_from_slice(head);
        whole.extend_from_slice(payload);
        whole.extend_from_slice(tail);
        self.handle_frame(now, &whole);
        self.rx_whole = whole;
    }

    /// Handles a frame parsed and verified.
    fn handle_parsed(&mut self, now: u64, p: &Packet<'_>) {
        if p.repr.bth.opcode == Opcode::IntResponse {
            self.int_response(now, p);
            return;
        }
        let qpn = p.repr.bth.dest_qp;
        if qpn == crate::wire::mad::GSI_QPN {
            self.gsi.on_packet(p);
            return;
        }
        if qpn == MULTICAST_QPN {
            self.multicast(now, p);
            return;
        }
        let Ok(i) = self.index(qpn) else {
            self.counters.unknown_qp += 1;
            return;
        };
        self.deliver(now, i, p);
    }

    /// A datagram to a multicast group: a copy to each QP attached.
    fn multicast(&mut self, now: u64, p: &Packet<'_>) {
        let group = p.repr.ip.dst;
        if !self.mcast.has(group) {
            self.counters.mcast_unjoined += 1;
            return;
        }
        let mut k = 0;
        while let Some(qpn) = self.mcast.member(group, k) {
            k += 1;
            if let Ok(i) = self.index(qpn) {
                self.deliver(now, i, p);
            }
        }
    }

    /// Hands a packet for the QP of index `i` to it.
    fn deliver(&mut self, now: u64, i: usize, p: &Packet<'_>) {
        let qp = self.qps[i].as_mut().expect("index checked");
        let qpn = qp.qpn;
        if !qp.state.receives() || !qp.is_from_peer(p) {
            self.counters.wrong_state += 1;
            return;
        }
        // (A UD QP's samples are echoed with TLM_RESPONSE, an opcode of
        // no service.)
        let echo = qp.service == Service::Ud && p.repr.bth.opcode == Opcode::TlmResponse;
        if p.repr.bth.service != qp.service && !echo {
            self.counters.wrong_service += 1;
            return;
        }
        let Some(rq) = self.rqs[qp.rq].as_mut() else {
            return;
        };
        let outcome = qp.on_packet(now, p, &self.mrs, &mut self.mem, rq);
        if let Some(r) = outcome.recv {
            self.cq.push_back(Cqe {
                wr_id: r.wr_id,
                qpn,
                status: r.status,
                opcode: r.opcode,
                byte_len: r.byte_len,
                imm: r.imm,
                solicited: r.solicited,
                src: r.src,
            });
        }
        if outcome.srq_limit {
            self.events
                .push_back(AsyncEvent::SrqLimitReached(qp.rq as SrqId));
        }
        if let Some(e) = outcome.error {
            self.events.push_back(AsyncEvent::QpError(qpn, e));
        }
        if let Some(status) = outcome.fail {
            self.fail_qp(i, status);
            self.refresh(i, now);
            return;
        }
        let op = p.repr.bth.opcode;
        if self.cfg.report_flows && op.is_request() {
            if let Some(t) = p.repr.tlm.as_ref().filter(|t| !t.echo) {
                self.last_hop.on_data(t);
                if let Some(q) = self.qps[i].as_mut() {
                    q.rx_data_ns = now;
                }
            }
        }
        // A SEND or WRITE packet moves only the responder: no WR of this
        // QP's requester completes, its timers and its next paced packet
        // stay as they were; only an ACK, NAK or CNP may now wait.
        let pushes_data = op.is_request()
            && !matches!(
                op,
                Opcode::RdmaReadRequest | Opcode::CompareSwap | Opcode::FetchAdd
            );
        if pushes_data {
            if self.qps[i].as_ref().is_some_and(Qp::has_ctrl) {
                self.queue_ctrl(i);
            }
            if outcome.ack_timer {
                self.arm(i);
            }
            return;
        }
        self.refresh(i, now);
    }

    /// An INT response: a switch names the peer's QP (DestQP) and the peer
    /// (IPv4 source); the QP connected to them takes it.
    fn int_response(&mut self, now: u64, p: &Packet<'_>) {
        if !self.cfg.int_subscribe {
            // Nobody asked: a response here is forged or misrouted.
            self.counters.int_response_unknown += 1;
            return;
        }
        let peer = (p.repr.ip.src, p.repr.bth.dest_qp);
        let found = self.by_peer.get(&peer).and_then(|&q| self.index(q).ok());
        let Some(i) = found.filter(|&i| {
            self.qps[i]
                .as_ref()
                .is_some_and(|q| q.peer() == Some(peer) && q.state.sends())
        }) else {
            self.counters.int_response_unknown += 1;
            return;
        };
        let qp = self.qps[i].as_mut().expect("index checked");
        if let Some(t) = &p.repr.tlm {
            qp.on_int_response(now, p.repr.bth.psn, t);
        }
        self.refresh(i, now);
    }

    /// N to report, when counting is on and the last hop is the congestion
    /// point: the QPs that received data within the last 4 T, counted again
    /// at most once per T.
    fn flows_through_last_hop(&mut self, now: u64) -> Option<u16> {
        if !self.cfg.report_flows || !self.last_hop.is_bottleneck() {
            return None;
        }
        let t = self.cfg.hpcc.t_ns.max(1);
        let (at, n) = self.flows_counted;
        if n == 0 || now.saturating_sub(at) >= t {
            let window = t.saturating_mul(4);
            let n = self
                .qps
                .iter()
                .flatten()
                .filter(|q| q.rx_data_ns > 0 && now.saturating_sub(q.rx_data_ns) <= window)
                .count();
            self.flows_counted = (now, n.clamp(1, usize::from(u16::MAX)) as u16);
        }
        Some(self.flows_counted.1)
    }

    /// Charges a bad-ICRC frame to the QP its (unverified) DestQP names.
    fn count_icrc_drop(&mut self, frame: &[u8]) {
        if let Ok(p) = Packet::parse_unverified(frame) {
            if let Ok(i) = self.index(p.repr.bth.dest_qp) {
                if let Some(qp) = self.qps[i].as_mut() {
                    qp.counters.icrc_drops += 1;
                }
            }
        }
    }

    /// Whether `frame` belongs to this engine's VLAN. Another VLAN's frame
    /// (or an untagged one on a VLAN device) is counted as `wrong_vlan`,
    /// whatever else it holds; the pipeline asks this of ARP frames too
    /// (which are not in `rx_frames`: the NIC's own counters have them).
    pub fn on_own_vlan(&mut self, frame: &[u8]) -> bool {
        match check_vlan(frame, self.cfg.vlan.map(|t| t.vid)) {
            Ok(()) => true,
            Err(e) => {
                self.count_drop(e);
                false
            }
        }
    }

    fn count_drop(&mut self, e: WireError) {
        self.counters.wire_drops[e.kind().index()] += 1;
    }

    /// The next frame to send at `now`, written into `buf` (at least
    /// MTU + 120 bytes); returns its length.
    pub fn poll_transmit(&mut self, now: u64, buf: &mut [u8]) -> Option<usize> {
        match self.poll_transmit_split(now, buf, NEVER_SPLIT)? {
            TxFrame::Whole(n) => Some(n),
            // Not built: no payload reaches NEVER_SPLIT bytes.
            TxFrame::Split { .. } => None,
        }
    }

    /// [`Engine::poll_transmit`] for a driver that can send a frame's
    /// payload from where it lies (an mbuf attached to the application's
    /// memory): a data packet whose payload is one range of registered
    /// memory of at least `split_min` bytes, which the engine's memory
    /// lends out ([`Memory::bytes`]), comes back as [`TxFrame::Split`]:
    /// its headers in `buf`, the range and the tail to send after them.
    /// Every other frame is built whole in `buf`: control frames, inline
    /// and scattered payloads, and READ responses (whose region the
    /// application may write meanwhile; see `Qp::emit_paced`). A
    /// `split_min` of 0 is taken as 1: an empty payload is never apart.
    pub fn poll_transmit_split(
        &mut self,
        now: u64,
        buf: &mut [u8],
        split_min: usize,
    ) -> Option<TxFrame> {
        let split_min = split_min.max(1);
        if let Some((i, peeked)) = self.grant_posted(now) {
            if let Some(frame) = self.emit_granted(i, now, buf, split_min, peeked) {
                return frame;
            }
        }
        self.settle_posts();
        if self.gsi.has_tx() {
            self.ip_ident = self.ip_ident.wrapping_add(1);
            if let Some(n) = self.gsi.emit(&self.cfg, self.ip_ident, buf) {
                self.counters.tx_frames += 1;
                return Some(TxFrame::Whole(n));
            }
        }
        while let Some(i) = self.ctrl.pop_front() {
            let i = i as usize;
            let flows = self.flows_through_last_hop(now);
            let Some(qp) = self.qps[i].as_mut() else {
                continue;
            };
            qp.in_ctrl = false;
            self.ip_ident = self.ip_ident.wrapping_add(1);
            let n = qp.emit_ctrl(self.ip_ident, buf, flows);
            if qp.has_ctrl() {
                self.queue_ctrl(i);
            }
            if let Some(n) = n {
                self.counters.tx_frames += 1;
                return Some(TxFrame::Whole(n));
            }
        }
        while let Some(send) = self.sched.next_send(now) {
            let i = self.flow_qp[send.flow.0 as usize] as usize;
            if let Some(frame) = self.emit_granted(i, now, buf, split_min, None) {
                return frame;
            }
        }
        None
    }

    /// The QP whose posts of this very time may go straight to TX: a
    /// WQE posted to an idle QP, with no control packet waiting and no
    /// other flow ready, is granted by the scheduler at once
    /// ([`FlowScheduler::send_now`]),
    /// the same decision filing it and asking for the next send would
    /// make, without the bookkeeping. `None` leaves the posts owed, to be
    /// filed as usual. With the QP, the request the scheduler sized, if
    /// the packet is one: the emit takes it rather than asking again.
    fn grant_posted(&mut self, now: u64) -> Option<(usize, Option<TxItem>)> {
        let (i, t) = self.post_owed?;
        if t != now || !self.ctrl.is_empty() {
            return None;
        }
        let qp = self.qps[i].as_ref()?;
        if !self.sched.may_send_now(qp.flow) {
            return None; // refused whatever the packet: not sized
        }
        let (size, peeked) = qp.next_paced_item(&self.cfg, &self.ahs)?;
        if !self
            .sched
            .send_now_unasked(qp.flow, qp.pacing_rate(&self.ahs), size, now)
        {
            return None;
        }
        self.post_owed = None;
        self.owed_since = None;
        Some((i, peeked))
    }

    /// Builds the paced packet the scheduler granted QP `i`: `Some` of
    /// what `poll_transmit_split` returns, or `None` when the QP had none
    /// to build after all (the caller asks the scheduler again).
    /// `peeked`: the request [`Engine::grant_posted`] sized, if any.
    fn emit_granted(
        &mut self,
        i: usize,
        now: u64,
        buf: &mut [u8],
        split_min: usize,
        peeked: Option<TxItem>,
    ) -> Option<Option<TxFrame>> {
        let qp = self.qps[i].as_mut()?;
        self.ip_ident = self.ip_ident.wrapping_add(1);
        // A UC or UD WR completes when its packet is built: its payload
        // is copied, never lent out to a frame sent later (the
        // application may reuse the buffer on the completion).
        let min = if qp.service == Service::Rc {
            split_min
        } else {
            NEVER_SPLIT
        };
        let mut split = qp::Split { min, apart: None };
        let (ahs, mrs, mem) = (&self.ahs, &self.mrs, &self.mem);
        let emitted = qp.emit_paced(now, self.ip_ident, ahs, mrs, mem, buf, &mut split, peeked);
        let unreliable = qp.service != Service::Rc;
        match emitted {
            Ok(Some(n)) => {
                if unreliable {
                    // Sent is done: its WR may complete now.
                    self.complete_sent(i);
                }
                self.refresh_sent_owing(i, now);
                self.counters.tx_frames += 1;
                Some(Some(match split.apart {
                    None => TxFrame::Whole(n),
                    Some(apart) => TxFrame::Split { head: n, apart },
                }))
            }
            Ok(None) => {
                self.refresh(i, now);
                None
            }
            Err(status) => {
                // A READ whose region went: the responder's access error.
                let qpn = qp.qpn;
                self.events
                    .push_back(AsyncEvent::QpError(qpn, QpError::Access));
                self.fail_qp(i, status);
                Some(self.poll_transmit_split(now, buf, split_min))
            }
        }
    }

    /// Whether `poll_transmit` at `now` may have a frame: a control
    /// packet owed, posts not yet filed, or a flow the scheduler may let
    /// send. When not, it has none; a pipeline asks before it takes a
    /// buffer to build in. Unless a control packet waits or a post or
    /// send is unsettled, it moves the scheduler's clock to `now` (flows
    /// due by then join its ready FIFO), as `poll_transmit` would.
    pub fn may_transmit(&mut self, now: u64) -> bool {
        !self.ctrl.is_empty()
            || self.owed_since.is_some()
            || self.gsi.has_tx()
            || self.sched.has_ready(now)
    }

    /// The earliest time `handle_timeout` (or `poll_transmit`, for paced
    /// packets) has work.
    pub fn poll_timeout(&self) -> Option<u64> {
        let qp = self.timers.peek().map(|r| r.0 .0);
        // A MAD waiting to go is due now: its time is the last one seen.
        let posted = self
            .owed_since
            .or(self.gsi.has_tx().then_some(self.gsi_since));
        qp.into_iter()
            .chain(self.sched.next_wakeup())
            .chain(posted)
            .min()
    }

    /// The earliest timer (retransmission, congestion control, probe),
    /// leaving out when the scheduler has packets to send: what a NIC
    /// whose transmitter is held by PFC waits for.
    pub fn next_timer(&self) -> Option<u64> {
        self.timers.peek().map(|r| r.0 .0)
    }

    /// Runs every timer due at `now`: retransmission timeouts, retry
    /// exhaustion, congestion-control timers, probe timeouts.
    pub fn handle_timeout(&mut self, now: u64) {
        self.settle_posts();
        while let Some(&Reverse((t, i))) = self.timers.peek() {
            if t > now {
                break;
            }
            self.timers.pop();
            if !self.timer_is_live(t, i) {
                continue;
            }
            let i = i as usize;
            let Some(qp) = self.qps[i].as_mut() else {
                continue;
            };
            qp.armed = None;
            if let Some(status) = qp.on_timeout(now) {
                self.fail_qp(i, status);
            }
            self.refresh(i, now);
        }
        self.drop_stale_timers();
    }
}

/// The rules of a send WR on a UC or UD QP: UC has SEND and RDMA WRITE
/// (with immediate), UD SEND (with immediate) of at most the path MTU to
/// an address handle of the QP's PD.
fn check_unreliable(qp: &Qp, wr: &WrParts<'_>, ahs: &ah::AhTable) -> Result<(), RcError> {
    let service = qp.service;
    let op = wr.head.op;
    let allowed = match service {
        Service::Rc => true,
        Service::Uc => matches!(
            op,
            WrOp::Send | WrOp::SendImm(_) | WrOp::Write | WrOp::WriteImm(_)
        ),
        Service::Ud => op.is_send(),
    };
    if !allowed {
        let what = match op {
            WrOp::Read => "RDMA READ",
            WrOp::Write | WrOp::WriteImm(_) => "RDMA WRITE",
            WrOp::CmpSwap { .. } => "COMPARE_SWAP",
            WrOp::FetchAdd { .. } => "FETCH_ADD",
            WrOp::Send | WrOp::SendImm(_) => "SEND",
        };
        return Err(RcError::NotOnService {
            what,
            service: service.name(),
        });
    }
    if service == Service::Ud {
        let d = wr.head.ud.ok_or(RcError::NoAddress)?;
        ahs.get(d.ah, qp.pd).ok_or(RcError::NoSuchAh(d.ah))?;
        let total = wr.total();
        if total > u64::from(qp.mtu()) {
            return Err(RcError::DatagramTooLong {
                len: total,
                mtu: qp.mtu(),
            });
        }
    }
    Ok(())
}

/// A receive WR flushed by a QP in ERR.
fn recv_flush(qpn: Qpn, wr: &RecvWr) -> Cqe {
    Cqe {
        wr_id: wr.wr_id,
        qpn,
        status: WcStatus::WrFlushErr,
        opcode: WcOpcode::Recv,
        byte_len: 0,
        imm: None,
        solicited: false,
        src: None,
    }
}

fn check_bits(what: &'static str, value: u64, max: u64) -> Result<(), RcError> {
    if value > max {
        return Err(RcError::OutOfRange { what, value, max });
    }
    Ok(())
}
