//! The sans-IO Reliable Connected engine of one NIC: QP contexts, the RC
//! requester and responder of `../shared/spec/rc.md`, memory regions, the
//! flow scheduler and a congestion controller per QP.
//!
//! Driven like quinn-proto: the caller owns time and the network.
//!
//! - inputs: [`Engine::handle_packet`] (a received frame, with `now`),
//!   [`Engine::post_send`], [`Engine::handle_timeout`];
//! - outputs: [`Engine::poll_transmit`] (the next frame to put on the wire),
//!   [`Engine::poll_timeout`] (when to call `handle_timeout` next),
//!   [`Engine::poll_completion`].
//!
//! Poll order after any input: call `poll_transmit` until it returns
//! `None`, drain `poll_completion`, then sleep until `poll_timeout` (or
//! the next frame). ACKs, NAKs, probes and CNPs leave before paced data.
//! Nothing here reads a clock or allocates per packet in steady state.

mod counters;
mod qp;
mod requester;
mod responder;
mod types;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::net::Ipv4Addr;

use pacer::hpcc::{HpccParams, HpccSettings, ParamError};
use pacer::scheduler::{FlowScheduler, SchedulerConfig};
use pacer::CongestionControl;

pub use counters::{EngineCounters, QpCounters};
pub use qp::{CcMode, UnknownCc};
pub use types::{
    ConnectParams, Cqe, Endpoint, PathMtu, QpAccess, QpState, Qpn, RcError, RtrAttr, RtsAttr,
    SendWr, WcOpcode, WcStatus, WrOp,
};

use crate::mr::{Access, Memory, MrError, MrKeys, MrTable, Pd, DEFAULT_PD};
use crate::wire::{MacAddr, Packet, WireError};
use qp::Qp;

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
    pub scheduler: SchedulerConfig,
    /// Unacknowledged PSNs a QP may have (the requester's PSN window).
    pub max_outstanding_psns: u32,
    /// AckReq at least every this many packets (1..=64; HPCC++ inband
    /// wants fresh telemetry, so small values suit it).
    pub ack_req_every: u32,
    /// DSCP of every packet.
    pub dscp: u8,
}

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
            scheduler: SchedulerConfig::default(),
            max_outstanding_psns: 1 << 16,
            ack_req_every: requester::ACK_REQ_EVERY,
            dscp: 26,
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
    qps: Vec<Option<Qp>>,
    /// Scheduler flow index -> QP index.
    flow_qp: Vec<u32>,
    sched: FlowScheduler,
    /// QPs with ACKs, NAKs or telemetry packets waiting.
    ctrl: VecDeque<u32>,
    cq: VecDeque<Cqe>,
    counters: EngineCounters,
    ip_ident: u16,
    /// (deadline, QP index) of every armed QP timer; entries whose QP has
    /// since re-armed or gone are stale and skipped. The top is always live.
    timers: BinaryHeap<Reverse<(u64, u32)>>,
}

impl<M: Memory> Engine<M> {
    /// An engine whose clock starts at `now`.
    pub fn new(cfg: EngineConfig, mem: M, now: u64) -> Self {
        Engine {
            cfg,
            mem,
            mrs: MrTable::new(),
            qps: Vec::new(),
            flow_qp: Vec::new(),
            sched: FlowScheduler::new(cfg.scheduler, now),
            ctrl: VecDeque::new(),
            cq: VecDeque::new(),
            counters: EngineCounters::default(),
            ip_ident: 0,
            timers: BinaryHeap::new(),
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
        let i = qpn.wrapping_sub(QPN_BASE) as usize;
        match self.qps.get(i) {
            Some(Some(_)) => Ok(i),
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
        if max_send_wr > MAX_SEND_WR {
            return Err(RcError::OutOfRange {
                what: "max_send_wr",
                value: max_send_wr as u64,
                max: MAX_SEND_WR as u64,
            });
        }
        let i = match self.qps.iter().position(Option::is_none) {
            Some(i) => i,
            None if self.qps.len() < MAX_QPS => {
                self.qps.push(None);
                self.qps.len() - 1
            }
            None => return Err(RcError::TooManyQps(MAX_QPS)),
        };
        let qpn = QPN_BASE + i as u32;
        let flow = self.sched.add_flow(self.cfg.line_rate_bps, u64::MAX, now);
        if self.flow_qp.len() <= flow.0 as usize {
            self.flow_qp.resize(flow.0 as usize + 1, u32::MAX);
        }
        self.flow_qp[flow.0 as usize] = i as u32;
        self.qps[i] = Some(Qp::new(qpn, pd, max_send_wr.max(1), flow, &self.cfg));
        Ok(qpn)
    }

    /// Destroys a QP; its outstanding WRs are dropped without completions.
    pub fn destroy_qp(&mut self, qpn: Qpn) -> Result<(), RcError> {
        let i = self.index(qpn)?;
        let qp = self.qps[i].take().expect("index checked");
        self.sched.remove_flow(qp.flow);
        self.ctrl.retain(|&q| q as usize != i);
        self.drop_stale_timers();
        Ok(())
    }

    pub fn qp_state(&self, qpn: Qpn) -> Result<QpState, RcError> {
        let i = self.index(qpn)?;
        Ok(self.qps[i].as_ref().expect("index checked").state)
    }

    pub fn qp_counters(&self, qpn: Qpn) -> Result<QpCounters, RcError> {
        let i = self.index(qpn)?;
        Ok(self.qps[i].as_ref().expect("index checked").counters)
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

    /// RESET -> INIT with the QP's access flags.
    pub fn modify_to_init(&mut self, qpn: Qpn, access: QpAccess) -> Result<(), RcError> {
        self.qp_mut(qpn)?.modify_to_init(access)
    }

    /// INIT -> RTR.
    pub fn modify_to_rtr(&mut self, qpn: Qpn, attr: RtrAttr) -> Result<(), RcError> {
        self.qp_mut(qpn)?.modify_to_rtr(attr)
    }

    /// RTR -> RTS.
    pub fn modify_to_rts(&mut self, qpn: Qpn, attr: RtsAttr) -> Result<(), RcError> {
        let (window, every) = (self.cfg.max_outstanding_psns, self.cfg.ack_req_every);
        self.qp_mut(qpn)?.modify_to_rts(attr, window, every)
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

    /// Any state -> ERR: every outstanding WR completes with WR_FLUSH_ERR.
    pub fn modify_to_err(&mut self, qpn: Qpn) -> Result<(), RcError> {
        let i = self.index(qpn)?;
        self.fail_qp(i, WcStatus::WrFlushErr);
        Ok(())
    }

    /// Posts a send WR. Refused at once when the QP is not in RTS, the
    /// send queue is full or the length exceeds 2^31; a bad local buffer
    /// completes with LOC_PROT_ERR and moves the QP to ERR, as a NIC does.
    pub fn post_send(&mut self, qpn: Qpn, wr: SendWr, now: u64) -> Result<(), RcError> {
        let i = self.index(qpn)?;
        let qp = self.qps[i].as_mut().expect("index checked");
        if qp.state != QpState::Rts {
            return Err(RcError::WrongState {
                qpn,
                state: qp.state,
                need: QpState::Rts,
                what: "posting a send WR",
            });
        }
        if u64::from(wr.len) > responder::MAX_DMA_LEN {
            return Err(RcError::TooLong(wr.len));
        }
        if qp.req.is_full() {
            return Err(RcError::SendQueueFull(qpn));
        }
        let write_local = wr.op == WrOp::Read;
        if self
            .mrs
            .pd(qp.pd)
            .check_local(wr.lkey, wr.local_va, u64::from(wr.len), write_local)
            .is_err()
        {
            qp.req.post(wr);
            self.fail_qp(i, WcStatus::LocProtErr);
            return Ok(());
        }
        qp.req.post(wr);
        self.refresh(i, now);
        Ok(())
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
        qp.req.flush(status, &mut |wr, st| {
            cq.push_back(requester::cqe(qpn, &wr, st))
        });
        qp.resp.reset_queues();
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

    /// Tells the scheduler the size of the QP's next paced packet and its
    /// controller's rate; moves completed WRs to the CQ.
    fn refresh(&mut self, i: usize, now: u64) {
        let Some(qp) = self.qps[i].as_mut() else {
            return;
        };
        let qpn = qp.qpn;
        while let Some((wr, st)) = qp.req.pop_completed() {
            if wr.signaled {
                self.cq.push_back(requester::cqe(qpn, &wr, st));
            }
        }
        let size = qp.next_paced_size(&self.cfg);
        self.sched.set_rate(qp.flow, qp.cc.rate_bps(), now);
        self.sched.set_next_packet(qp.flow, size, now);
        if qp.has_ctrl() {
            self.queue_ctrl(i);
        }
        self.arm(i);
    }

    /// Files the QP's earliest timer in the timer heap if it changed.
    fn arm(&mut self, i: usize) {
        if let Some(qp) = self.qps[i].as_mut() {
            let t = qp.timeout();
            if t != qp.armed {
                qp.armed = t;
                if let Some(t) = t {
                    self.timers.push(Reverse((t, i as u32)));
                }
            }
        }
        self.drop_stale_timers();
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
        self.counters.rx_frames += 1;
        let p = match Packet::parse(frame) {
            Ok(p) => p,
            Err(e) => {
                self.count_drop(e);
                if let WireError::BadIcrc { .. } = e {
                    self.count_icrc_drop(frame);
                }
                return;
            }
        };
        let qpn = p.repr.bth.dest_qp;
        let Ok(i) = self.index(qpn) else {
            self.counters.unknown_qp += 1;
            return;
        };
        let qp = self.qps[i].as_mut().expect("index checked");
        if !matches!(qp.state, QpState::Rtr | QpState::Rts) || !qp.is_from_peer(&p) {
            self.counters.wrong_state += 1;
            return;
        }
        let outcome = qp.on_packet(now, &p, &self.mrs, &mut self.mem);
        if let Some(status) = outcome.fail {
            self.fail_qp(i, status);
        }
        self.refresh(i, now);
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

    fn count_drop(&mut self, e: WireError) {
        self.counters.wire_drops[e.kind().index()] += 1;
    }

    /// The next frame to send at `now`, written into `buf` (at least
    /// MTU + 120 bytes); returns its length.
    pub fn poll_transmit(&mut self, now: u64, buf: &mut [u8]) -> Option<usize> {
        while let Some(i) = self.ctrl.pop_front() {
            let i = i as usize;
            let Some(qp) = self.qps[i].as_mut() else {
                continue;
            };
            qp.in_ctrl = false;
            self.ip_ident = self.ip_ident.wrapping_add(1);
            let n = qp.emit_ctrl(&self.cfg, self.ip_ident, buf);
            if qp.has_ctrl() {
                self.queue_ctrl(i);
            }
            if let Some(n) = n {
                self.counters.tx_frames += 1;
                return Some(n);
            }
        }
        while let Some(send) = self.sched.next_send(now) {
            let i = self.flow_qp[send.flow.0 as usize] as usize;
            let Some(qp) = self.qps[i].as_mut() else {
                continue;
            };
            self.ip_ident = self.ip_ident.wrapping_add(1);
            match qp.emit_paced(now, &self.cfg, self.ip_ident, &self.mrs, &self.mem, buf) {
                Ok(n) => {
                    self.refresh(i, now);
                    if let Some(n) = n {
                        self.counters.tx_frames += 1;
                        return Some(n);
                    }
                }
                Err(status) => {
                    self.fail_qp(i, status);
                    return self.poll_transmit(now, buf);
                }
            }
        }
        None
    }

    /// The earliest time `handle_timeout` (or `poll_transmit`, for paced
    /// packets) has work.
    pub fn poll_timeout(&self) -> Option<u64> {
        let qp = self.timers.peek().map(|r| r.0 .0);
        qp.into_iter().chain(self.sched.next_wakeup()).min()
    }

    /// Runs every timer due at `now`: retransmission timeouts, retry
    /// exhaustion, congestion-control timers, probe timeouts.
    pub fn handle_timeout(&mut self, now: u64) {
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
