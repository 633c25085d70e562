//! One QP context: state machine and attributes, the requester and
//! responder halves, its congestion controller and telemetry bookkeeping,
//! and how its packets are built.

use std::borrow::Cow;
use std::net::Ipv4Addr;

/// The smallest payload per packet `EngineConfig::segment_bytes` may set.
pub const MIN_SEGMENT: u32 = 256;

use pacer::dcqcn::{CnpLimiter, Dcqcn};
use pacer::fixed::Fixed;
use pacer::probe::{ProbeClock, ProbeRequest};
use pacer::rx_hpcc::{Notification, RxHpcc, RxHpccSender};
use pacer::scheduler::FlowId;
use pacer::telemetry::{Hop, HopStack};
use pacer::{CongestionControl, Controller, Hpcc};

use super::ah::AhTable;
use super::auth::{feedback_mac, int_token, AckId, Feedback, FeedbackKey, Freshness};
use super::counters::QpCounters;
use super::datagram::Dropped;
use super::paths::{probe_path, QpPaths};
use super::recv::RecvQueue;
use super::requester::{Fatal, Payload, Requester, TxItem};
use super::responder::{RecvDone, RespItem, Responder, Verdict};
use super::types::{
    Apart, PathMtu, QpAccess, QpState, QpUpdate, Qpn, RcError, RtrAttr, RtsAttr, SendLimits,
    WcStatus,
};
use super::ud_cc::{EchoTaken, Echoes, UdCc};
use super::EngineConfig;
use crate::mr::{Memory, MrTable, Pd};
use crate::wire::ethernet;
use crate::wire::packet::frame_len_of;
use crate::wire::{
    deth, udp, AethRepr, BthRepr, DethRepr, EthernetRepr, FrameTemplate, Ipv4Repr, NotifyRepr,
    Opcode, Packet, ProbeRepr, Service, Syndrome, TlmRepr, TransportRepr, UdpRepr,
};

/// A driver's offer to send payloads of at least `min` bytes from where
/// they lie, and where the packet built says it did.
#[derive(Debug, Clone, Copy)]
pub(super) struct Split {
    pub min: usize,
    pub apart: Option<Apart>,
}

/// Emits `t` behind `tpl` with the `len` bytes of memory at device address
/// `va` (checked already) as its payload: sent from where they lie when
/// they are at least `split.min` bytes and `mem` lends them out (the
/// headers in `buf`, the rest in `split.apart`), else copied into the
/// frame in `buf`. The bytes written to `buf`; `None` when it is too small.
fn emit_from(
    tpl: &FrameTemplate,
    t: &TransportRepr<'_>,
    ident: u16,
    (va, len): (u64, usize),
    mem: &impl Memory,
    buf: &mut [u8],
    split: &mut Split,
) -> Option<usize> {
    if len >= split.min {
        if let Some(bytes) = mem.bytes(va, len) {
            let (head, tail) = tpl.emit_head(t, ident, bytes, buf).ok()?;
            split.apart = Some(Apart {
                payload: va,
                payload_len: len as u32,
                tail,
            });
            return Some(head);
        }
    }
    tpl.emit_with(t, ident, len, buf, |dst| mem.read(va, dst))
        .ok()
}

/// Which congestion control the QPs of an engine run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CcMode {
    /// Line rate, no window.
    None,
    /// HPCC++ with telemetry in every data packet, echoed in ACKs.
    HpccInband { maxhop: u8 },
    /// HPCC++ with one TLM_REQUEST probe per RTT (the draft's RoCEv2
    /// reference); a probe unanswered for `timeout_ns` is replaced.
    HpccProbe { maxhop: u8, timeout_ns: u64 },
    /// Receiver-based HPCC++: the responder sends CC_NOTIFY.
    RxHpcc { maxhop: u8 },
    /// DCQCN: CNPs for CE-marked packets, rate-based sender.
    Dcqcn,
}

impl CcMode {
    /// The names configurations and tables use, in this order.
    pub const NAMES: [&'static str; 5] = ["hpcc", "hpcc-probe", "hpcc-rx", "dcqcn", "none"];

    /// The mode a configuration names: HPCC++ modes carry telemetry for
    /// `maxhop` hops, and a probe unanswered for three base RTTs is
    /// replaced. The one place congestion-control names are parsed.
    pub fn from_name(name: &str, maxhop: u8, base_rtt_ns: u64) -> Result<CcMode, UnknownCc> {
        Ok(match name {
            "hpcc" => CcMode::HpccInband { maxhop },
            "hpcc-probe" => CcMode::HpccProbe {
                maxhop,
                timeout_ns: 3 * base_rtt_ns,
            },
            "hpcc-rx" => CcMode::RxHpcc { maxhop },
            "dcqcn" => CcMode::Dcqcn,
            "none" => CcMode::None,
            other => return Err(UnknownCc(other.to_string())),
        })
    }

    /// Whether the mode puts our telemetry on the wire (TLM blocks,
    /// probes, notifications), which only peers that speak it accept.
    pub fn uses_telemetry(self) -> bool {
        matches!(
            self,
            CcMode::HpccInband { .. } | CcMode::HpccProbe { .. } | CcMode::RxHpcc { .. }
        )
    }

    /// Slots of the TLM blocks of an HPCC++ mode.
    pub fn hpcc_maxhop(self) -> Option<u8> {
        match self {
            CcMode::HpccInband { maxhop }
            | CcMode::HpccProbe { maxhop, .. }
            | CcMode::RxHpcc { maxhop } => Some(maxhop),
            CcMode::Dcqcn | CcMode::None => None,
        }
    }

    /// Slots of the TLM block data packets carry in this mode, if they
    /// carry one (inband and receiver-based HPCC++).
    pub fn data_tlm_maxhop(self) -> Option<u8> {
        match self {
            CcMode::HpccInband { maxhop } | CcMode::RxHpcc { maxhop } => Some(maxhop),
            _ => None,
        }
    }

    /// The mode's name in configurations and tables.
    pub fn name(self) -> &'static str {
        match self {
            CcMode::HpccInband { .. } => "hpcc",
            CcMode::HpccProbe { .. } => "hpcc-probe",
            CcMode::RxHpcc { .. } => "hpcc-rx",
            CcMode::Dcqcn => "dcqcn",
            CcMode::None => "none",
        }
    }
}

/// A congestion-control name that is none of [`CcMode::NAMES`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown congestion control {0:?} (hpcc, hpcc-probe, hpcc-rx, dcqcn, none)")]
pub struct UnknownCc(pub String);

/// What handling a packet did that the engine must act on.
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    /// The QP goes to ERR; the oldest WR completes with this status.
    pub fail: Option<WcStatus>,
    /// A receive WQE the packet finished.
    pub recv: Option<RecvDone>,
    /// Taking a receive WQE crossed the SRQ's armed limit.
    pub srq_limit: bool,
    /// The responder's error behind `fail`, for the async event.
    pub error: Option<super::QpError>,
    /// The responder now owes an ACK after its delay: a timer to file.
    pub ack_timer: bool,
}

/// The telemetry blocks a QP keeps (each ~250 bytes), allocated once with
/// the QP and kept out of line, so that the fields every packet touches
/// share a few cache lines.
#[derive(Default)]
struct QpTlm {
    /// Newest telemetry stack received (inband mode), echoed in ACKs.
    last: Option<TlmRepr>,
    /// The empty TLM block data packets carry (inband and receiver-based
    /// modes), kept to be borrowed by every packet.
    data: Option<TlmRepr>,
    /// A probe's answer waiting to go (probe mode's responder).
    probe_resp: Option<(ProbeRepr, TlmRepr)>,
    /// A notification waiting to go (receiver-based mode's responder).
    notify: Option<(Notification, TlmRepr)>,
    /// Blocks this QP allocates have 8-byte hop records.
    compact: bool,
    /// ... and ask for sojourn times.
    sojourn: bool,
}

pub(crate) struct Qp {
    pub qpn: Qpn,
    /// RC, UC or UD.
    pub service: Service,
    /// UD: the Q_Key datagrams to this QP must carry, and the one its
    /// WRs send in place of a controlled one.
    pub qkey: u32,
    /// UD: the outer headers of the datagram being built (its address
    /// handle's, with this QP's UDP source port).
    ud_tpl: Option<FrameTemplate>,
    /// UD: HPCC++ per destination that speaks our telemetry (when the
    /// engine's mode is an HPCC++ one), and the one the datagram being
    /// built samples.
    ud_cc: Option<Box<UdCc>>,
    ud_sampling: Option<Ipv4Addr>,
    /// UD: echoes of other NICs' samples, waiting to go.
    echoes: Echoes,
    /// The protection domain whose regions this QP reaches.
    pub pd: Pd,
    /// Index of its receive queue (its own, or a shared one) in the
    /// engine's table.
    pub rq: usize,
    pub state: QpState,
    access: QpAccess,
    pub rtr: Option<RtrAttr>,
    pub req: Requester,
    pub resp: Responder,
    pub flow: FlowId,
    pub cc: Controller,
    pub mode: CcMode,
    probe: Option<ProbeClock>,
    rx_hpcc: Option<RxHpcc>,
    cnp: CnpLimiter,
    /// Telemetry blocks, out of line.
    tlm: Box<QpTlm>,
    /// Outer headers of every frame to the peer (from RTR on).
    template: Option<FrameTemplate>,
    /// Payload bytes of every packet but a message's last (set at RTR).
    segment_bytes: u32,
    /// When a data packet with telemetry last arrived (receiver-measured N).
    pub rx_data_ns: u64,
    /// Take the receiver's flow counts (EngineConfig::report_flows).
    use_reported_n: bool,
    pending_probe: Option<ProbeRequest>,
    pending_cnp: bool,
    pub in_ctrl: bool,
    /// The deadline filed in the engine's timer heap.
    pub armed: Option<u64>,
    /// When the responder sends the ACK it owes to requests accepted
    /// without AckReq (first such request + [`super::ACK_DELAY_NS`]).
    ack_deadline: Option<u64>,
    /// In SQD: raise SqDrained once the send queue is empty.
    pub sqd_notify: bool,
    /// This QP's own bounds on its requester (the engine's otherwise).
    pub send_limits: Option<SendLimits>,
    /// Path choice from telemetry (EngineConfig::path_choice), from RTR on.
    paths: Option<Box<QpPaths>>,
    /// The newest feedback of each kind taken (keyed QPs refuse replays).
    fresh: Freshness,
    pub counters: QpCounters,
}

/// Tags the stack a feedback message `fb` echoes with its MAC under `key`
/// (last, over the stack as it goes; none without a key).
fn tag(key: Option<FeedbackKey>, fb: Feedback, t: &mut TlmRepr) {
    t.mac = None;
    t.mac = key.map(|k| feedback_mac(&k, fb, t));
}

fn hops_of(t: &TlmRepr) -> HopStack {
    let mut s = HopStack::new();
    for h in t.filled() {
        s.push(Hop {
            ts_ns: h.ts_ns,
            tx_bytes: h.tx_bytes,
            qlen: h.queue_bytes(t.sojourn),
            rate_100mbps: h.rate,
            switch_id: h.switch_id,
            port_id: h.port_id,
        });
    }
    s.with_wrap(wrap_of(t))
}

/// Where a stack's timestamps and byte counters wrap: 2^32, or the compact
/// records' 2^24 ns and 2^27 bytes.
pub(super) fn wrap_of(t: &TlmRepr) -> pacer::Wrap {
    if t.compact {
        pacer::Wrap {
            ts_mask: crate::wire::tlm::COMPACT_TS_MASK,
            bytes_mask: crate::wire::tlm::COMPACT_BYTES_MASK,
        }
    } else {
        pacer::Wrap::FULL
    }
}

fn check_bits(what: &'static str, value: u64, max: u64) -> Result<(), RcError> {
    if value > max {
        return Err(RcError::OutOfRange { what, value, max });
    }
    Ok(())
}

impl Qp {
    /// A QP of `service` in RESET. UC and UD QPs run no congestion
    /// controller of the QP's own (a peer's unreliable QPs answer
    /// nothing): UC sends at the line rate, UD per destination
    /// (`ud_cc`).
    pub fn new(
        qpn: Qpn,
        service: Service,
        pd: Pd,
        rq: usize,
        cap: usize,
        flow: FlowId,
        cfg: &EngineConfig,
    ) -> Self {
        let ud_cc = match (service, cfg.cc.hpcc_maxhop()) {
            (Service::Ud, Some(maxhop)) => Some(Box::new(UdCc::new(
                cfg.hpcc,
                cfg.line_rate_bps,
                TlmRepr {
                    compact: cfg.compact_int,
                    sojourn: cfg.int_sojourn,
                    ..TlmRepr::empty(maxhop)
                },
            ))),
            _ => None,
        };
        let cfg = &EngineConfig {
            cc: match service {
                Service::Rc => cfg.cc,
                Service::Uc | Service::Ud => CcMode::None,
            },
            ..*cfg
        };
        let cc = match cfg.cc {
            CcMode::None => Controller::Fixed(Fixed::line_rate(cfg.line_rate_bps)),
            CcMode::HpccInband { .. } | CcMode::HpccProbe { .. } => {
                Controller::Hpcc(Hpcc::new(cfg.hpcc))
            }
            CcMode::RxHpcc { .. } => Controller::RxHpcc(RxHpccSender::new(cfg.hpcc)),
            CcMode::Dcqcn => Controller::Dcqcn(Dcqcn::new(cfg.dcqcn)),
        };
        Qp {
            qpn,
            service,
            qkey: 0,
            ud_tpl: None,
            ud_cc,
            ud_sampling: None,
            echoes: Echoes::default(),
            pd,
            rq,
            state: QpState::Reset,
            access: QpAccess::default(),
            rtr: None,
            req: Requester::new(cap),
            resp: Responder::new(),
            flow,
            cc,
            mode: cfg.cc,
            probe: match cfg.cc {
                CcMode::HpccProbe { timeout_ns, .. } => Some(ProbeClock::new(timeout_ns)),
                _ => None,
            },
            rx_hpcc: matches!(cfg.cc, CcMode::RxHpcc { .. }).then(|| RxHpcc::new(cfg.hpcc)),
            cnp: CnpLimiter::new(cfg.cnp_interval_ns),
            tlm: Box::new(QpTlm {
                data: cfg.cc.data_tlm_maxhop().map(|m| TlmRepr {
                    compact: cfg.compact_int,
                    subscribe: cfg.int_subscribe,
                    sojourn: cfg.int_sojourn,
                    ..TlmRepr::empty(m)
                }),
                compact: cfg.compact_int,
                sojourn: cfg.int_sojourn,
                ..QpTlm::default()
            }),
            template: None,
            segment_bytes: 1024,
            rx_data_ns: 0,
            use_reported_n: cfg.report_flows,
            pending_probe: None,
            pending_cnp: false,
            in_ctrl: false,
            armed: None,
            ack_deadline: None,
            sqd_notify: false,
            send_limits: None,
            paths: None,
            fresh: Freshness::default(),
            counters: QpCounters::default(),
        }
    }

    fn need(&self, need: QpState, what: &'static str) -> Result<(), RcError> {
        if self.state != need {
            return Err(RcError::WrongState {
                qpn: self.qpn,
                state: self.state,
                need,
                what,
            });
        }
        Ok(())
    }

    pub fn modify_to_init(&mut self, access: QpAccess) -> Result<(), RcError> {
        self.need(QpState::Reset, "RESET -> INIT")?;
        self.access = access;
        self.resp.remote_write = access.remote_write;
        self.resp.remote_read = access.remote_read;
        self.resp.remote_atomic = access.remote_atomic;
        if self.service == Service::Uc {
            self.resp.make_unreliable();
        }
        self.state = QpState::Init;
        Ok(())
    }

    pub fn modify_to_rtr(&mut self, a: RtrAttr, cfg: &EngineConfig) -> Result<(), RcError> {
        self.need(QpState::Init, "INIT -> RTR")?;
        check_bits("dest_qpn", u64::from(a.dest_qpn), 0xFF_FFFF)?;
        check_bits("rq_psn", u64::from(a.rq_psn), 0xFF_FFFF)?;
        check_bits("max_dest_rd_atomic", u64::from(a.max_dest_rd_atomic), 255)?;
        check_bits("min_rnr_timer", u64::from(a.min_rnr_timer), 31)?;
        if let Some(d) = a.dscp {
            check_bits("dscp", u64::from(d), 63)?;
        }
        // Payload bytes per packet: the path MTU, or (simulation only) the
        // engine's segment size when it is smaller.
        // At least 256 bytes (the smallest path MTU): a message of up to
        // 2^31 bytes then stays within half the 24-bit PSN space.
        let mtu = a.path_mtu.bytes();
        self.segment_bytes = cfg
            .segment_bytes
            .map_or(mtu, |s| s.clamp(MIN_SEGMENT.min(mtu), mtu));
        self.resp.configure(
            self.segment_bytes,
            a.rq_psn,
            a.max_dest_rd_atomic,
            a.min_rnr_timer,
        );
        self.rtr = Some(a);
        // Path choice needs telemetry from the switches on the way back.
        self.paths = cfg
            .path_choice
            .filter(|_| self.service == Service::Rc)
            .filter(|_| matches!(cfg.cc, CcMode::HpccInband { .. } | CcMode::HpccProbe { .. }))
            .map(|pc| {
                let base = udp::entropy_port(self.qpn, a.dest_qpn);
                let mut p = QpPaths::new(pc, cfg.hpcc.t_ns, base);
                if a.feedback_key.is_some() {
                    p.own_scale = crate::wire::HopRecord::relative_rate_bps() as f64
                        / cfg.line_rate_bps.max(1) as f64;
                }
                Box::new(p)
            });
        self.arm_int_token();
        self.build_template(cfg);
        self.state = QpState::Rtr;
        Ok(())
    }

    /// A UD QP's INIT -> RTR: it has no peer; it takes datagrams of at
    /// most `mtu` bytes with its Q_Key from anyone.
    pub fn modify_ud_to_rtr(&mut self, mtu: PathMtu) -> Result<(), RcError> {
        self.need(QpState::Init, "INIT -> RTR")?;
        self.segment_bytes = mtu.bytes();
        self.resp.mtu = mtu.bytes();
        self.state = QpState::Rtr;
        Ok(())
    }

    /// A UD QP's RTR -> RTS: its first PSN.
    pub fn modify_ud_to_rts(&mut self, sq_psn: u32) -> Result<(), RcError> {
        self.need(QpState::Rtr, "RTR -> RTS")?;
        check_bits("sq_psn", u64::from(sq_psn), 0xFF_FFFF)?;
        self.req.configure(
            self.segment_bytes,
            sq_psn,
            0,
            0,
            0,
            1,
            SendLimits::STANDARD_PEER,
        );
        self.req.make_unreliable();
        self.state = QpState::Rts;
        Ok(())
    }

    /// Whether it may send and receive packets: a connected QP from RTR
    /// on has its peer; a UD QP needs none.
    fn ready(&self) -> bool {
        match self.service {
            Service::Ud => self.state.receives(),
            Service::Rc | Service::Uc => self.rtr.is_some(),
        }
    }

    /// Payload bytes per packet (the path MTU, from RTR on).
    pub fn mtu(&self) -> u32 {
        self.segment_bytes
    }

    pub fn modify_to_rts(&mut self, a: RtsAttr, limits: SendLimits) -> Result<(), RcError> {
        self.need(QpState::Rtr, "RTR -> RTS")?;
        check_bits("sq_psn", u64::from(a.sq_psn), 0xFF_FFFF)?;
        check_bits("timeout", u64::from(a.timeout), 31)?;
        check_bits("retry_cnt", u64::from(a.retry_cnt), 7)?;
        check_bits("rnr_retry", u64::from(a.rnr_retry), 7)?;
        self.req.configure(
            self.segment_bytes,
            a.sq_psn,
            a.timeout,
            a.retry_cnt,
            a.rnr_retry,
            a.max_rd_atomic,
            limits,
        );
        if self.service == Service::Uc {
            self.req.make_unreliable();
        }
        self.state = QpState::Rts;
        Ok(())
    }

    /// A modify that keeps the QP's connection: INIT->INIT, RTS->RTS,
    /// RTS->SQD, SQD->RTS, SQD->SQD, applying what `u` changes. Moving to
    /// SQD with `sqd_notify` asks for [`super::AsyncEvent::SqDrained`].
    pub fn modify_in_place(
        &mut self,
        to: QpState,
        u: &QpUpdate,
        sqd_notify: bool,
    ) -> Result<(), RcError> {
        use QpState::{Init, Rts, Sqd};
        let from = self.state;
        if !matches!(
            (from, to),
            (Init, Init) | (Rts, Rts) | (Rts, Sqd) | (Sqd, Rts) | (Sqd, Sqd)
        ) {
            return Err(RcError::NoTransition {
                qpn: self.qpn,
                from,
                to,
            });
        }
        // INIT->INIT changes access flags only: the rest is the
        // connection's, set on the way to RTS.
        for (what, v, max) in [
            ("min_rnr_timer", u.min_rnr_timer, 31),
            ("timeout", u.timeout, 31),
            ("retry_cnt", u.retry_cnt, 7),
            ("rnr_retry", u.rnr_retry, 7),
        ] {
            if let Some(v) = v {
                if from == Init {
                    return Err(RcError::NotYet { what, state: from });
                }
                check_bits(what, u64::from(v), max)?;
            }
        }
        if let Some(a) = u.access {
            self.access = a;
            self.resp.remote_write = a.remote_write;
            self.resp.remote_read = a.remote_read;
            self.resp.remote_atomic = a.remote_atomic;
        }
        if let Some(t) = u.min_rnr_timer {
            self.resp.min_rnr_timer = t;
        }
        self.req.set_retry(u.timeout, u.retry_cnt, u.rnr_retry);
        if to == Sqd && from == Rts {
            self.sqd_notify = sqd_notify;
        }
        self.state = to;
        Ok(())
    }

    /// Runs `cfg.cc` from now on, with fresh controller state (RESET or
    /// INIT only: nothing has been sent).
    pub fn set_cc(&mut self, cfg: &EngineConfig) -> Result<(), RcError> {
        if !matches!(self.state, QpState::Reset | QpState::Init) {
            return Err(RcError::WrongState {
                qpn: self.qpn,
                state: self.state,
                need: QpState::Init,
                what: "choosing the QP's congestion control",
            });
        }
        let fresh = Qp::new(
            self.qpn,
            self.service,
            self.pd,
            self.rq,
            self.req.capacity(),
            self.flow,
            cfg,
        );
        self.cc = fresh.cc;
        self.mode = fresh.mode;
        self.tlm.data = fresh.tlm.data;
        self.arm_int_token();
        self.tlm.compact = fresh.tlm.compact;
        self.probe = fresh.probe;
        self.rx_hpcc = fresh.rx_hpcc;
        Ok(())
    }

    /// Whether the QP, in SQD with notification asked for, has drained
    /// its send queue (true once: the notification is then consumed).
    pub fn take_drained(&mut self) -> bool {
        if self.state == QpState::Sqd && self.sqd_notify && self.req.is_empty() {
            self.sqd_notify = false;
            return true;
        }
        false
    }

    /// Does the packet come from this QP's peer?
    pub fn is_from_peer(&self, p: &Packet<'_>) -> bool {
        self.service == Service::Ud || self.rtr.is_some_and(|r| r.dest_ip == p.repr.ip.src)
    }

    /// The peer this QP is connected to: (its IPv4 address, its QPN).
    pub fn peer(&self) -> Option<(Ipv4Addr, Qpn)> {
        self.rtr.map(|r| (r.dest_ip, r.dest_qpn))
    }

    /// Hop slots of the TLM_REQUESTs this QP sends: the mode's, or its
    /// data packets', or 1.
    fn probe_maxhop(&self) -> u8 {
        match self.mode {
            CcMode::HpccProbe { maxhop, .. } => maxhop,
            _ => self.tlm.data.as_ref().map_or(1, |d| d.maxhop),
        }
    }

    fn is_path_probe(&self, probe: &Option<ProbeRepr>) -> bool {
        self.paths.is_some() && probe.is_some_and(|p| probe_path(p.probe_id).is_some())
    }

    /// This QP's feedback key, when its feedback is authenticated.
    fn key(&self) -> Option<FeedbackKey> {
        self.rtr.and_then(|r| r.feedback_key)
    }

    /// Whether this QP's feedback is authenticated.
    pub fn keyed(&self) -> bool {
        self.key().is_some()
    }

    /// The stack of feedback `fb` the sender may act on: `t` as it came
    /// without a feedback key; with one, only when `check` (the MAC or
    /// token of `fb` under the key) verifies and `fresh` (the feedback is
    /// newer than the last of its kind taken) holds, and then in its
    /// relative form (what the MAC covers). Anything else is counted and
    /// refused.
    ///
    /// Without a key the stack is lent, not copied (a TLM block is ~270
    /// bytes and an ACK of HPCC++ inband carries one).
    fn verified<'t>(
        &mut self,
        t: &'t TlmRepr,
        check: impl FnOnce(&FeedbackKey, &TlmRepr) -> bool,
        fresh: impl FnOnce(&mut Freshness) -> bool,
    ) -> Option<Cow<'t, TlmRepr>> {
        let Some(key) = self.key() else {
            return Some(Cow::Borrowed(t));
        };
        if !check(&key, t) {
            if t.mac.is_none() {
                self.counters.feedback_unkeyed += 1;
            } else {
                self.counters.feedback_forged += 1;
            }
            return None;
        }
        if !fresh(&mut self.fresh) {
            self.counters.feedback_replayed += 1;
            return None;
        }
        Some(Cow::Owned(t.relative()))
    }

    /// Whether a MAC of `fb` under the key is the one `t` carries.
    fn mac_matches(fb: Feedback) -> impl FnOnce(&FeedbackKey, &TlmRepr) -> bool {
        move |k, t| t.mac == Some(feedback_mac(k, fb, t))
    }

    /// An INT response for the packet of `psn`: the controller reacts when
    /// that PSN is in flight (sent, not yet acknowledged); anything else
    /// is late or forged and only counted. A keyed QP takes it only with
    /// the token its data packet of `psn` carried (`auth::int_token`).
    pub fn on_int_response(&mut self, now: u64, psn: u32, t: &TlmRepr) {
        let Some(dest_qp) = self.rtr.map(|r| r.dest_qpn) else {
            return;
        };
        if !self.req.in_flight(psn) {
            self.counters.int_responses_stale += 1;
            return;
        }
        let token = |k: &FeedbackKey, t: &TlmRepr| t.mac == Some(int_token(k, dest_qp, psn));
        let nhop = t.nhop;
        let Some(t) = self.verified(t, token, |_| true) else {
            return;
        };
        // A keyed QP takes one response per packet and switch: another
        // for a PSN that switch already answered (a retransmission's, or a
        // replay) is stale.
        let req = &self.req;
        if self.rtr.is_some_and(|r| r.feedback_key.is_some())
            && !self.fresh.int_response(psn, nhop, |p| req.in_flight(p))
        {
            self.counters.int_responses_stale += 1;
            return;
        }
        self.counters.int_responses += 1;
        let hops = hops_of(&t);
        self.cc.on_int_response(now, psn, self.req.snd_nxt(), &hops);
    }

    /// A keyed QP whose data packets subscribe to INT responses carries a
    /// token in each (`auth::int_token` of its PSN): its data stack has a
    /// MAC field from RTR on, so that its length is known before a packet
    /// is built.
    fn arm_int_token(&mut self) {
        let keyed = self.key().is_some();
        if let Some(d) = self.tlm.data.as_mut() {
            d.mac = (keyed && d.subscribe).then_some(0);
        }
    }

    /// Puts the token of `psn` in the data stack (see `arm_int_token`).
    fn stamp_int_token(&mut self, psn: u32) {
        let (Some(key), Some(dest_qp)) = (self.key(), self.rtr.map(|r| r.dest_qpn)) else {
            return;
        };
        if let Some(d) = self.tlm.data.as_mut().filter(|d| d.mac.is_some()) {
            d.mac = Some(int_token(&key, dest_qp, psn));
        }
    }

    pub fn has_ctrl(&self) -> bool {
        self.resp.has_ack()
            || !self.echoes.is_empty()
            || self.pending_probe.is_some()
            || self.pending_cnp
            || self.tlm.probe_resp.is_some()
            || self.tlm.notify.is_some()
            || (self.state.sends() && self.paths.as_ref().is_some_and(|p| p.pending.is_some()))
    }

    /// The earliest timer of this QP.
    pub fn timeout(&self) -> Option<u64> {
        let earliest = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let ack = self.ack_deadline.filter(|_| self.state.receives());
        if !self.state.sends() {
            return ack;
        }
        let t = earliest(ack, earliest(self.req.timer(), self.cc.poll_timeout()));
        let t = earliest(t, self.ud_cc.as_ref().and_then(|c| c.deadline()));
        let t = match &self.paths {
            // Not while a probe waits to go: its deadline has passed.
            Some(p) if self.req.has_outstanding() && p.pending.is_none() => {
                earliest(t, p.chooser.probe_deadline())
            }
            _ => t,
        };
        match &self.probe {
            Some(p) if self.pending_probe.is_none() => earliest(t, p.deadline()),
            _ => t,
        }
    }

    /// Runs the timers due at `now`; `Some` when retries are exhausted.
    pub fn on_timeout(&mut self, now: u64) -> Option<WcStatus> {
        // A timer filed before the QP left RTR/RTS/SQD finds nothing.
        if !self.state.receives() {
            return None;
        }
        if self.ack_deadline.is_some_and(|t| t <= now) {
            self.ack_deadline = None;
            self.resp.send_owed_ack();
        }
        if !self.state.sends() {
            return None;
        }
        match self.req.on_timer(now) {
            Ok(true) => self.counters.timeouts += 1,
            Ok(false) => {}
            Err(Fatal::Fail(s)) => {
                self.counters.timeouts += 1;
                return Some(s);
            }
        }
        if self.cc.poll_timeout().is_some_and(|t| t <= now) {
            self.cc.handle_timeout(now);
        }
        if let Some(c) = self.ud_cc.as_mut() {
            self.counters.ud_samples_lost += c.expire(now);
        }
        self.follow_path(now);
        self.poll_probe(now);
        None
    }

    fn poll_probe(&mut self, now: u64) {
        if let Some(paths) = self.paths.as_mut() {
            paths.poll(now, self.req.has_outstanding(), self.req.snd_nxt());
        }
        if let Some(probe) = self.probe.as_mut() {
            if self.pending_probe.is_none() {
                self.pending_probe =
                    probe.poll(now, self.req.has_outstanding(), self.req.snd_nxt());
            }
        }
    }

    fn telemetry(&mut self, now: u64, ack_seq: u32, t: &TlmRepr) {
        let hops = hops_of(t);
        self.cc
            .on_telemetry(now, ack_seq, self.req.snd_nxt(), &hops);
        if let Some(paths) = self.paths.as_mut() {
            let cur = paths.chooser.current();
            // Under NFLOWS the path id holds N: keep the path's own.
            let path_id = if t.nflows {
                paths.chooser.path_id(cur).unwrap_or(0)
            } else {
                t.path_id
            };
            paths.chooser.on_stack(cur, now, &hops, path_id);
        }
    }

    /// Moves to the path the chooser asks for once nothing is in flight on
    /// the current one (until then new packets wait: see `peek`).
    fn follow_path(&mut self, now: u64) {
        let Some(paths) = self.paths.as_mut() else {
            return;
        };
        let own = self.cc.rate_bps() as f64 / 8e9 * paths.own_scale;
        let Some(to) = paths.chooser.decide(now, own) else {
            return;
        };
        if self.req.has_outstanding() {
            return;
        }
        paths.chooser.moved(to, now);
        paths.drain_acked = false;
        let port = paths.current_port();
        paths.template = self.template.map(|t| t.with_src_port(port));
        self.cc.on_path_change();
        self.counters.path_moves += 1;
    }

    /// The requester's next packet, unless a path move holds new ones
    /// (retransmissions still go, on the old path). The first new packet
    /// after the move is decided still goes, asking for an ACK, so that
    /// the drain ends with an ACK rather than a timeout.
    fn peek(&self) -> Option<TxItem> {
        let mut t = self.req.peek(self.cc.window_bytes())?;
        match self.path_hold(t.retransmit)? {
            PathHold::AskAck => t.ack_req = true,
            PathHold::Go => {}
        }
        Some(t)
    }

    /// What a path move in progress does to the next packet: a new
    /// packet waits once the drain's last packet went (`None`), or is
    /// that last packet and asks for an ACK.
    fn path_hold(&self, retransmit: bool) -> Option<PathHold> {
        match self.paths.as_deref() {
            Some(p) if p.draining() && !retransmit => (!p.drain_acked).then_some(PathHold::AskAck),
            _ => Some(PathHold::Go),
        }
    }

    /// Handles a parsed packet for this QP.
    pub fn on_packet(
        &mut self,
        now: u64,
        p: &Packet<'_>,
        mrs: &MrTable,
        mem: &mut impl Memory,
        rq: &mut RecvQueue,
    ) -> Outcome {
        let mrs = mrs.pd(self.pd);
        let mut out = Outcome::default();
        self.counters.rx_packets += 1;
        self.counters.rx_bytes += p.payload.len() as u64;
        let op = p.repr.bth.opcode;
        let psn = p.repr.bth.psn;
        match op {
            Opcode::Acknowledge => {
                let Some(a) = p.repr.aeth else { return out };
                let r = match a.decoded() {
                    Syndrome::Ack { .. } => Ok(self.req.on_ack(psn, now)),
                    Syndrome::Nak(_) => {
                        let code = a.syndrome & 0x1f;
                        self.counters.naks_received[usize::from(code & 3)] += 1;
                        self.req.on_nak(psn, code, now)
                    }
                    Syndrome::RnrNak { timer } => {
                        self.counters.rnr_naks_received += 1;
                        self.req.on_rnr_nak(psn, timer, now)
                    }
                    Syndrome::Reserved(_) => Ok(false),
                };
                match r {
                    Ok(true) => {}
                    Ok(false) => self.counters.ignored_responses += 1,
                    Err(Fatal::Fail(s)) => out.fail = Some(s),
                }
                let id = AckId {
                    dest_qp: self.qpn,
                    psn,
                    syndrome: a.syndrome,
                    msn: a.msn,
                };
                // By reference: a TLM block is ~270 bytes.
                let tlm = p.repr.tlm.as_ref().filter(|t| t.echo).and_then(|t| {
                    self.verified(t, Self::mac_matches(Feedback::Ack(id)), |f| f.ack(psn))
                });
                if let (Some(t), CcMode::HpccInband { .. }) = (tlm, self.mode) {
                    if t.echo {
                        if t.nflows && self.use_reported_n {
                            self.counters.flow_reports += 1;
                            self.cc.on_flow_count(now, t.path_id);
                        }
                        self.telemetry(now, psn, &t);
                    }
                }
                self.follow_path(now);
            }
            Opcode::RdmaReadResponseFirst
            | Opcode::RdmaReadResponseMiddle
            | Opcode::RdmaReadResponseLast
            | Opcode::RdmaReadResponseOnly
            | Opcode::AtomicAcknowledge => {
                // An atomic's original value lands as 8 bytes in host order.
                let orig = p.repr.atomic_ack.map(u64::to_ne_bytes);
                let data = orig.as_ref().map_or(p.payload, |b| &b[..]);
                match self.req.on_read_response(psn, op, data.len()) {
                    // The region may have been deregistered since the post.
                    Some((local, off)) => {
                        let n = data.len() as u64;
                        let landed = match local {
                            Payload::One(s) => super::sgl::one_range(s, mrs, off, n, true)
                                .map(|va| mem.write(va, data)),
                            Payload::Sges(sg) => super::sgl::scatter(sg, mrs, mem, off, data),
                            Payload::Inline(_) => Err(crate::mr::MrError::AccessDenied(
                                "local write into inline data",
                            )),
                        };
                        match landed {
                            Ok(()) => self.req.read_landed(psn, now),
                            Err(_) => out.fail = Some(WcStatus::LocProtErr),
                        }
                    }
                    None => self.counters.ignored_responses += 1,
                }
                // A response may end a move's drain.
                self.follow_path(now);
            }
            Opcode::TlmRequest => {
                if let (Some(probe), Some(mut t)) = (p.repr.probe, p.repr.tlm) {
                    t.echo = true;
                    self.tlm.probe_resp = Some((probe, t));
                }
            }
            Opcode::TlmResponse if self.service == Service::Ud => {
                let snd_nxt = self.req.snd_nxt();
                let echo = p.repr.tlm.as_ref().filter(|t| t.echo);
                let taken = match (self.ud_cc.as_mut(), p.repr.probe, echo) {
                    (Some(c), Some(pr), Some(t)) => {
                        c.on_echo(p.repr.ip.src, pr.snd_psn, snd_nxt, &hops_of(t))
                    }
                    _ => EchoTaken::Stale,
                };
                match taken {
                    EchoTaken::Taken => self.counters.ud_echoes_taken += 1,
                    EchoTaken::Stale => self.counters.ud_echoes_stale += 1,
                }
            }
            Opcode::TlmResponse if self.is_path_probe(&p.repr.probe) => {
                let (qpn, probe) = (self.qpn, p.repr.probe.unwrap_or_default());
                let fb = Feedback::Probe {
                    dest_qp: qpn,
                    probe,
                };
                // Path probes are checked for freshness per path below.
                let t = p
                    .repr
                    .tlm
                    .as_ref()
                    .and_then(|t| self.verified(t, Self::mac_matches(fb), |_| true));
                if let (Some(pr), Some(t), Some(paths)) = (p.repr.probe, t, self.paths.as_mut()) {
                    let k = probe_path(pr.probe_id).unwrap_or(0);
                    if paths.answered(k, pr.probe_id) {
                        self.counters.path_probe_responses += 1;
                        // A route already known teaches nothing: that path
                        // tries another port instead.
                        if !paths.redraw_if_known(k, t.path_id) {
                            paths.chooser.on_stack(k, now, &hops_of(&t), t.path_id);
                            self.follow_path(now);
                        }
                    } else {
                        self.counters.ignored_responses += 1;
                    }
                }
            }
            Opcode::TlmResponse => {
                let (qpn, probe) = (self.qpn, p.repr.probe.unwrap_or_default());
                let fb = Feedback::Probe {
                    dest_qp: qpn,
                    probe,
                };
                let t = p.repr.tlm.as_ref().and_then(|t| {
                    self.verified(t, Self::mac_matches(fb), |f| f.probe(probe.probe_id))
                });
                if let (Some(pr), Some(t), Some(clock)) = (p.repr.probe, t, self.probe.as_mut()) {
                    if let Some(ack) =
                        clock.on_response(now, pr.probe_id, pr.snd_psn, pr.sender_ts_ns)
                    {
                        self.counters.probe_responses += 1;
                        self.counters.last_probe_rtt_ns = ack.rtt_ns;
                        self.telemetry(now, ack.ack_seq, &t);
                        self.poll_probe(now);
                    }
                }
            }
            Opcode::CcNotify => {
                let n = p.repr.notify.unwrap_or_default();
                let fb = Feedback::Notify {
                    dest_qp: self.qpn,
                    notify: n,
                };
                let t = p
                    .repr
                    .tlm
                    .as_ref()
                    .and_then(|t| self.verified(t, Self::mac_matches(fb), |f| f.notify(n.seq)));
                if let (Some(n), Some(_)) = (p.repr.notify, t) {
                    self.counters.notifies_received += 1;
                    let n = Notification {
                        window_bytes: n.window_bytes,
                        rate_mbps: n.rate_mbps,
                        seq: n.seq,
                    };
                    self.cc.on_notify(now, &n);
                }
            }
            Opcode::Cnp => {
                self.counters.cnps_received += 1;
                self.cc.on_cnp(now);
            }
            _ if self.service == Service::Ud => {
                let (qkey, mtu) = (self.qkey, self.resp.mtu);
                let crossed = &mut out.srq_limit;
                let received = super::datagram::receive(p, qkey, mtu, mrs, mem, rq, crossed);
                let qkey_ok = !matches!(received, Err(Dropped::QKey));
                match received {
                    Ok(done) => out.recv = Some(done),
                    Err(Dropped::QKey) => self.counters.qkey_violations += 1,
                    Err(Dropped::NoWqe) => self.counters.datagrams_no_wqe += 1,
                    Err(Dropped::TooLong) => self.counters.datagrams_too_long += 1,
                }
                // A sample is echoed whether or not a WQE took it (it
                // measured the path either way); not under a wrong Q_Key,
                // nor one to a group (its members would all answer).
                let sample = p.repr.tlm.is_some() && !p.repr.ip.dst.is_multicast();
                if sample && qkey_ok && !self.echoes.answer(p) {
                    self.counters.ud_echoes_dropped += 1;
                }
            }
            _ => {
                let verdict = self.resp.on_request(p, mrs, mem, rq);
                self.ack_deadline = match self.ack_deadline {
                    _ if !self.resp.ack_owed() => None,
                    Some(t) => Some(t),
                    None => {
                        out.ack_timer = true;
                        Some(now.saturating_add(super::ACK_DELAY_NS))
                    }
                };
                out.recv = self.resp.done.take();
                out.srq_limit = std::mem::take(&mut self.resp.srq_limit_crossed);
                match verdict {
                    Verdict::Accepted => {}
                    Verdict::ReceiverNotReady => self.counters.rnr_naks_sent += 1,
                    Verdict::Duplicate => {
                        self.counters.duplicates += 1;
                        if op == Opcode::RdmaReadRequest {
                            self.counters.read_replays += 1;
                        }
                    }
                    Verdict::OutOfOrder => self.counters.out_of_order += 1,
                    Verdict::Ignored => {}
                    Verdict::Dropped => self.counters.uc_dropped += 1,
                    Verdict::Fatal(code) => {
                        self.counters.naks_sent[usize::from(code & 3)] += 1;
                        out.fail = Some(WcStatus::WrFlushErr);
                        out.error = Some(match code {
                            super::responder::NAK_REMOTE_ACCESS => super::QpError::Access,
                            super::responder::NAK_INVALID_REQUEST => super::QpError::InvalidRequest,
                            _ => super::QpError::Fatal,
                        });
                    }
                }
                if verdict == Verdict::OutOfOrder && self.resp.has_ack() {
                    self.counters.naks_sent[0] += 1;
                }
                self.on_request_telemetry(now, p);
            }
        }
        out
    }

    /// Telemetry and ECN of an arriving request: remember the stack to echo
    /// (inband), run NewINT (receiver-based), answer CE with a CNP (DCQCN).
    fn on_request_telemetry(&mut self, now: u64, p: &Packet<'_>) {
        if let Some(t) = &p.repr.tlm {
            match self.mode {
                CcMode::HpccInband { .. } => self.tlm.last = Some(*t),
                CcMode::RxHpcc { .. } => {
                    if let Some(rx) = self.rx_hpcc.as_mut() {
                        if let Some(n) = rx.new_int(now, &hops_of(t)) {
                            let mut echo = *t;
                            echo.echo = true;
                            self.tlm.notify = Some((n, echo));
                        }
                    }
                }
                _ => {}
            }
        }
        // CE-marked frames are answered with CNPs whatever this QP's own
        // congestion control: the peer's may be DCQCN (a standard RoCE
        // NIC's is).
        if p.repr.ip.ecn == 3 && self.cnp.on_ce(now) {
            self.pending_cnp = true;
        }
    }

    /// The outer headers (Ethernet, IPv4, UDP) of every frame to the
    /// peer, built when the QP reaches RTR and again when the peer's MAC
    /// changes; each packet copies them and patches its lengths and ident.
    pub fn build_template(&mut self, cfg: &EngineConfig) {
        self.template = self.rtr.map(|rtr| {
            let eth = EthernetRepr {
                src: cfg.mac,
                dst: rtr.dest_mac,
                vlan: cfg.vlan,
            };
            let ip = Ipv4Repr {
                src: cfg.ip,
                dst: rtr.dest_ip,
                dscp: rtr.dscp.unwrap_or(cfg.dscp),
                // ECT(0) when a controller acts on congestion (DCQCN on the
                // CNPs that CE marks bring, HPCC++ on telemetry); with none,
                // Not-ECT, as rxe sends by default: nothing would react to
                // a mark.
                ecn: if self.mode == CcMode::None { 0 } else { 2 },
                ..Ipv4Repr::default()
            };
            let udp = UdpRepr {
                src_port: udp::entropy_port(self.qpn, rtr.dest_qpn),
            };
            FrameTemplate::new(&eth, &ip, &udp)
        });
        if let Some(p) = self.paths.as_deref_mut() {
            p.template = self.template.map(|t| t.with_src_port(p.current_port()));
        }
    }

    /// The BTH of a request packet.
    #[inline(always)]
    fn request_bth(&self, t: &TxItem) -> BthRepr {
        let dest = match t.ud {
            Some(d) => d.remote_qpn,
            None => self.rtr.map_or(0, |r| r.dest_qpn),
        };
        let mut bth = BthRepr::new(t.opcode, dest, t.psn);
        bth.service = self.service;
        bth.ack_req = t.ack_req;
        bth.solicited = t.solicited;
        bth
    }

    /// BTH of a packet to the peer, no other header yet.
    fn transport<'t>(&self, op: Opcode, psn: u32) -> TransportRepr<'t> {
        let dest_qp = self.rtr.map_or(0, |r| r.dest_qpn);
        TransportRepr::new(op, dest_qp, psn)
    }

    /// Emits `t` with `payload_len` bytes that `fill` writes, behind this
    /// QP's outer headers; `None` before RTR or when `buf` is too small.
    fn emit(
        &self,
        t: &TransportRepr<'_>,
        ident: u16,
        payload_len: usize,
        buf: &mut [u8],
        fill: impl FnOnce(&mut [u8]),
    ) -> Option<usize> {
        let tpl = self.template.as_ref()?;
        tpl.emit_with(t, ident, payload_len, buf, fill).ok()
    }

    /// The outer headers of requests: the current path's (responses and
    /// ACKs keep the QP's own, so that a move never reorders a READ
    /// response stream).
    fn req_template(&self) -> Option<&FrameTemplate> {
        if self.service == Service::Ud {
            return self.ud_tpl.as_ref();
        }
        match self.paths.as_deref() {
            Some(p) => p.template.as_ref(),
            None => self.template.as_ref(),
        }
    }

    /// [`Qp::emit`] of a request, behind [`Qp::req_template`].
    fn emit_req(
        &self,
        t: &TransportRepr<'_>,
        ident: u16,
        payload_len: usize,
        buf: &mut [u8],
        fill: impl FnOnce(&mut [u8]),
    ) -> Option<usize> {
        self.req_template()?
            .emit_with(t, ident, payload_len, buf, fill)
            .ok()
    }

    /// The request `t` whose payload `fill` writes, whole, behind
    /// [`Qp::req_template`]. A plain one (BTH and at most a RETH: no TLM,
    /// immediate or atomic) is emitted without a `TransportRepr` built or
    /// its nine optional headers checked; an opcode wanting more is
    /// refused there as the general emitter would refuse it.
    #[inline(always)]
    fn emit_request(
        &self,
        t: &TxItem,
        ident: u16,
        buf: &mut [u8],
        fill: impl FnOnce(&mut [u8]),
    ) -> Option<usize> {
        let len = t.len as usize;
        if t.atomic.is_none() && t.imm.is_none() && t.ud.is_none() && self.tlm.data.is_none() {
            let (bth, reth) = (self.request_bth(t), t.reth_repr());
            let tpl = self.req_template()?;
            return tpl
                .emit_plain(&bth, reth.as_ref(), ident, len, buf, fill)
                .ok();
        }
        let r = self.request_transport(t);
        self.emit_req(&r, ident, len, buf, fill)
    }

    fn response_transport(&self, r: &RespItem) -> TransportRepr<'static> {
        let mut t = self.transport(r.opcode, r.psn);
        if r.opcode.layout().aeth {
            t.aeth = Some(AethRepr {
                syndrome: crate::wire::aeth::ACK_UNLIMITED,
                msn: r.msn,
            });
        }
        t.atomic_ack = r.atomic;
        t
    }

    fn request_transport(&self, t: &TxItem) -> TransportRepr<'_> {
        let mut r = self.transport(t.opcode, t.psn);
        r.bth = self.request_bth(t);
        r.reth = t.reth_repr();
        r.atomic = t.atomic;
        r.imm = t.imm;
        r.tlm = match (&self.ud_cc, self.ud_sampling) {
            (Some(c), Some(_)) => Some(c.sample_tlm()),
            _ => self.tlm.data.as_ref(),
        };
        r.deth = t.ud.map(|d| DethRepr {
            q_key: if d.remote_qkey & deth::CONTROLLED_QKEY != 0 {
                self.qkey
            } else {
                d.remote_qkey
            },
            src_qp: self.qpn,
        });
        r
    }

    /// Size on the wire of the next paced packet (READ responses first,
    /// then requests), if any.
    #[inline]
    pub fn next_paced_size(&self, cfg: &EngineConfig, ahs: &AhTable) -> Option<u32> {
        if self.ud_cc.is_some() {
            // Whether a datagram samples depends on its destination.
            return self.next_paced_item(cfg, ahs).map(|(size, _)| size);
        }
        // The requester's gates, without building the packet.
        let tlm = self.tlm.data.as_ref().map_or(0, TlmRepr::block_len);
        let sized = self.next_paced(cfg, |q| {
            let (opcode, len, retransmit) = q.req.peek_frame(q.cc.window_bytes())?;
            q.path_hold(retransmit)?;
            Some((opcode, len, tlm, ()))
        });
        sized.map(|(size, _)| size)
    }

    /// Whether the QP may have a paced packet: when not (no response
    /// waits, every WR was sent), [`Qp::next_paced_size`] is `None`
    /// without the requester's gates asked.
    #[inline]
    pub fn may_have_paced(&self) -> bool {
        self.resp.has_response() || self.req.has_unsent()
    }

    /// [`Qp::next_paced_size`] and, when the packet is a request, the
    /// request itself: what [`Qp::emit_paced`] would peek again when it
    /// is built at once, in the same call, with nothing changed between.
    #[inline]
    pub fn next_paced_item(
        &self,
        cfg: &EngineConfig,
        ahs: &AhTable,
    ) -> Option<(u32, Option<TxItem>)> {
        self.next_paced(cfg, |q| {
            q.peek()
                .map(|t| (t.opcode, t.len, q.tlm_len_of(&t, ahs), t))
        })
    }

    /// The TLM block request `t` carries: a UD sample's, or the data
    /// packets' of the QP's mode.
    fn tlm_len_of(&self, t: &TxItem, ahs: &AhTable) -> usize {
        match (&self.ud_cc, self.ud_sample(t, ahs)) {
            (Some(c), Some(_)) => c.sample_tlm().block_len(),
            _ => self.tlm.data.as_ref().map_or(0, TlmRepr::block_len),
        }
    }

    /// The destination of datagram `t` when it speaks our telemetry and
    /// this QP runs a flow per destination.
    fn ud_dest(&self, t: &TxItem, ahs: &AhTable) -> Option<Ipv4Addr> {
        self.ud_cc.as_ref()?;
        let a = ahs.get(t.ud?.ah, self.pd)?;
        a.telemetry.then_some(a.dest_ip)
    }

    /// ... when `t` is to carry a sample (none is out to it).
    fn ud_sample(&self, t: &TxItem, ahs: &AhTable) -> Option<Ipv4Addr> {
        let ip = self.ud_dest(t, ahs)?;
        self.ud_cc.as_ref()?.wants_sample(ip).then_some(ip)
    }

    /// The rate the scheduler paces this QP at: its controller's; a UD
    /// QP's, that of the destination of its next datagram.
    #[inline]
    pub fn pacing_rate(&self, ahs: &AhTable) -> u64 {
        if let Some(c) = &self.ud_cc {
            if let Some(ip) = self.peek().and_then(|t| self.ud_dest(&t, ahs)) {
                return c.rate_bps(ip);
            }
        }
        self.cc.rate_bps()
    }

    /// Every destination flow of a UD QP.
    pub fn ud_flows(&self) -> Vec<super::ud_cc::UdFlowInfo> {
        self.ud_cc.as_ref().map_or_else(Vec::new, |c| c.flows())
    }

    /// The size of the next paced packet and, for a request, what
    /// `request` (the requester's gates) returns with its opcode and
    /// payload length.
    #[inline(always)]
    fn next_paced<T>(
        &self,
        cfg: &EngineConfig,
        request: impl FnOnce(&Self) -> Option<(Opcode, u32, usize, T)>,
    ) -> Option<(u32, Option<T>)> {
        if self.state == QpState::Err || !self.ready() || !self.may_have_paced() {
            return None;
        }
        // Sized from the opcode alone: no headers are built per packet here.
        let tag = cfg.vlan.map_or(0, |_| ethernet::VLAN_TAG_LEN);
        if let Some(r) = self.resp.peek_response() {
            let size = tag + frame_len_of(r.opcode.layout(), 0, r.len as usize);
            return Some((size as u32, None));
        }
        if !self.state.sends() {
            return None;
        }
        let (opcode, len, tlm, t) = request(self)?;
        Some((
            (tag + frame_len_of(opcode.layout_in(self.service), tlm, len as usize)) as u32,
            Some(t),
        ))
    }

    /// Builds the next paced packet into `buf`.
    /// Memory is re-checked against the regions before it is read (a region
    /// may have been deregistered since the request was accepted); a failed
    /// check is returned as the status to fail the QP with.
    /// `peeked` is the request [`Qp::next_paced_item`] returned in the
    /// same call, if it did; otherwise the requester is asked again.
    #[allow(clippy::too_many_arguments)]
    pub fn emit_paced(
        &mut self,
        now: u64,
        ident: u16,
        ahs: &AhTable,
        mrs: &MrTable,
        mem: &impl Memory,
        buf: &mut [u8],
        split: &mut Split,
        peeked: Option<TxItem>,
    ) -> Result<Option<usize>, WcStatus> {
        if self.state == QpState::Err || !self.ready() {
            return Ok(None);
        }
        let mrs = mrs.pd(self.pd);
        if let Some(r) = self.resp.peek_response() {
            let read = r.atomic.is_none();
            let dev = if read {
                let dev = super::responder::remote_addr(mrs, r.rkey, r.va, u64::from(r.len), false);
                let Some(dev) = dev else {
                    self.resp.refuse_read(r.psn);
                    self.counters.naks_sent[2] += 1;
                    return Err(WcStatus::WrFlushErr);
                };
                dev
            } else {
                r.va
            };
            let t = self.response_transport(&r);
            // Always copied: the application may write the region a READ
            // reads while the response is under way (RDMA lets it; the
            // requester gets the bytes as they were), and a payload read
            // again after its ICRC was computed would fail the ICRC then.
            // A request's buffer is left alone until its WR completes.
            let Some(n) = self.emit(&t, ident, r.len as usize, buf, |dst| mem.read(dev, dst))
            else {
                return Ok(None);
            };
            self.resp.response_sent();
            self.counters.tx_packets += 1;
            self.counters.tx_bytes += u64::from(r.len);
            return Ok(Some(n));
        }
        let Some(t) = peeked.or_else(|| self.peek()) else {
            return Ok(None);
        };
        let ud_dest = self.ud_dest(&t, ahs);
        self.ud_sampling = self.ud_sample(&t, ahs);
        if let Some(d) = t.ud {
            let port = udp::entropy_port(self.qpn, d.remote_qpn);
            self.ud_tpl = ahs.template(d.ah, self.pd).map(|t| t.with_src_port(port));
            if self.ud_tpl.is_none() {
                // Its address handle was destroyed after the post: the
                // datagram is lost, as one on the wire may be.
                self.counters.datagrams_unaddressed += 1;
                self.req.sent(&t, now);
                return Ok(None);
            }
        }
        self.stamp_int_token(t.psn);
        let Some(payload) = self.req.tx_payload() else {
            return Ok(None);
        };
        let (off, len) = (t.off as usize, t.len as usize);
        let emitted = match payload {
            Payload::Inline(d) => {
                let Some(bytes) = d.get(off..off + len) else {
                    return Ok(None);
                };
                self.emit_request(&t, ident, buf, |dst| dst.copy_from_slice(bytes))
            }
            Payload::One(s) => {
                let Ok(va) = super::sgl::one_range(s, mrs, t.off, u64::from(t.len), false) else {
                    // The region went since the post: this WR fails in its turn.
                    self.req.fail_tx(WcStatus::LocProtErr);
                    return Ok(None);
                };
                if len < split.min {
                    self.emit_request(&t, ident, buf, |dst| mem.read(va, dst))
                } else {
                    let r = self.request_transport(&t);
                    let tpl = self.req_template();
                    tpl.and_then(|tpl| emit_from(tpl, &r, ident, (va, len), mem, buf, split))
                }
            }
            Payload::Sges(sges) => {
                let ok = super::sgl::check_range(sges.clone(), mrs, t.off, u64::from(t.len), false);
                if ok.is_err() {
                    // The region went since the post: this WR fails in its turn.
                    self.req.fail_tx(WcStatus::LocProtErr);
                    return Ok(None);
                }
                self.emit_request(&t, ident, buf, |dst| {
                    super::sgl::read_range(sges, mrs, mem, t.off, dst)
                })
            }
        };
        let sampled = std::mem::take(&mut self.ud_sampling).is_some();
        let Some(n) = emitted else {
            return Ok(None);
        };
        self.req.sent(&t, now);
        if let (Some(ip), Some(c)) = (ud_dest, self.ud_cc.as_mut()) {
            c.sent(ip, t.psn, sampled, now);
            self.counters.ud_samples += u64::from(sampled);
        }
        if let Some(p) = self.paths.as_deref_mut().filter(|p| p.draining()) {
            p.drain_acked |= t.ack_req && !t.retransmit;
        }
        self.counters.tx_packets += 1;
        self.counters.tx_bytes += u64::from(t.len);
        if t.retransmit {
            self.counters.retransmitted += 1;
        }
        let wire = n + split.apart.as_ref().map_or(0, Apart::wire_len);
        self.cc.on_sent(now, wire as u64);
        self.poll_probe(now);
        Ok(Some(n))
    }

    /// Builds the next control packet (NAK/ACK, probe response, notify, CNP,
    /// probe) into `buf`.
    /// `flows`: N to report in an echoed stack (receiver-measured N).
    pub fn emit_ctrl(&mut self, ident: u16, buf: &mut [u8], flows: Option<u16>) -> Option<usize> {
        if let Some(e) = self.echoes.pop() {
            // UD: the echo of a sample, to the QP that sent it.
            let mut r = TransportRepr::new(Opcode::TlmResponse, e.dest_qp, 0);
            r.probe = Some(e.probe);
            r.tlm = Some(&e.tlm);
            let n = e.template.emit_with(&r, ident, 0, buf, |_| ()).ok();
            self.counters.ud_echoes_sent += u64::from(n.is_some());
            return n;
        }
        self.rtr?;
        let n = if let Some(a) = self.resp.take_ack() {
            let mut r = self.transport(Opcode::Acknowledge, a.psn);
            let aeth = AethRepr {
                syndrome: a.syndrome,
                msn: a.msn,
            };
            r.aeth = Some(aeth);
            // The newest telemetry is echoed once, by a positive ACK,
            // borrowed where it lies.
            let echo = a.syndrome == crate::wire::aeth::ACK_UNLIMITED;
            let key = self.key();
            let Some(t) = self.tlm.last.as_mut().filter(|_| echo) else {
                // Nothing to echo: BTH and AETH behind the template.
                let n = self.template.as_ref()?.emit_ack(&r.bth, &aeth, ident, buf);
                let n = n.ok()?;
                self.counters.tx_packets += 1;
                return Some(n);
            };
            let id = AckId {
                dest_qp: r.bth.dest_qp,
                psn: a.psn,
                syndrome: a.syndrome,
                msn: a.msn,
            };
            t.echo = true;
            // The sender's request flags are not echoed; NFLOWS only when
            // this receiver counted.
            t.subscribe = false;
            t.nflows = flows.is_some();
            if let Some(n) = flows {
                t.path_id = n;
            }
            // Tagged last, over the stack as it goes.
            tag(key, Feedback::Ack(id), t);
            r.tlm = self.tlm.last.as_ref();
            let n = self.emit(&r, ident, 0, buf, |_| ());
            self.tlm.last = None;
            n
        } else if let Some((probe, mut tlm)) = self.tlm.probe_resp.take() {
            let mut r = self.transport(Opcode::TlmResponse, 0);
            r.probe = Some(probe);
            let fb = Feedback::Probe {
                dest_qp: r.bth.dest_qp,
                probe,
            };
            tag(self.key(), fb, &mut tlm);
            r.tlm = Some(&tlm);
            self.emit(&r, ident, 0, buf, |_| ())
        } else if let Some((n, mut tlm)) = self.tlm.notify.take() {
            let mut r = self.transport(Opcode::CcNotify, 0);
            let notify = NotifyRepr {
                window_bytes: n.window_bytes,
                rate_mbps: n.rate_mbps,
                seq: n.seq,
            };
            r.notify = Some(notify);
            let fb = Feedback::Notify {
                dest_qp: r.bth.dest_qp,
                notify,
            };
            tag(self.key(), fb, &mut tlm);
            r.tlm = Some(&tlm);
            self.counters.notifies_sent += 1;
            self.emit(&r, ident, 0, buf, |_| ())
        } else if std::mem::take(&mut self.pending_cnp) {
            let mut r = self.transport(Opcode::Cnp, 0);
            r.bth.becn = true;
            self.counters.cnps_sent += 1;
            self.emit(&r, ident, 0, buf, |_| ())
        } else if let Some((k, pr)) = self
            .paths
            .as_mut()
            .filter(|_| self.state.sends())
            .and_then(|p| p.pending.take())
        {
            // A probe of another path: from that path's source port.
            let maxhop = self.probe_maxhop();
            let tlm = TlmRepr {
                compact: self.tlm.compact,
                sojourn: self.tlm.sojourn,
                ..TlmRepr::empty(maxhop)
            };
            let mut r = self.transport(Opcode::TlmRequest, 0);
            r.probe = Some(pr);
            r.tlm = Some(&tlm);
            let port = self.paths.as_ref().map_or(0, |p| p.port(k));
            let tpl = self.template.as_ref()?.with_src_port(port);
            let n = tpl.emit_with(&r, ident, 0, buf, |_| ()).ok();
            self.counters.path_probes += u64::from(n.is_some());
            n
        } else if let Some(pr) = self.pending_probe.take() {
            let maxhop = self.probe_maxhop();
            let tlm = TlmRepr {
                compact: self.tlm.compact,
                sojourn: self.tlm.sojourn,
                ..TlmRepr::empty(maxhop)
            };
            let mut r = self.transport(Opcode::TlmRequest, 0);
            r.probe = Some(ProbeRepr {
                probe_id: pr.probe_id,
                snd_psn: pr.snd_psn,
                sender_ts_ns: pr.sender_ts_ns,
            });
            r.tlm = Some(&tlm);
            self.counters.probes_sent += 1;
            self.emit(&r, ident, 0, buf, |_| ())
        } else {
            return None;
        }?;
        self.counters.tx_packets += 1;
        Some(n)
    }
}

/// See [`Qp::path_hold`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PathHold {
    Go,
    AskAck,
}
