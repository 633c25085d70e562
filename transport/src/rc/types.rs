//! What applications hand the engine and get back: work requests,
//! completions and their statuses, QP attributes, and the errors of the
//! control path.

use core::net::Ipv4Addr;

use crate::wire::MacAddr;

pub use super::sgl::{SgList, Sge, TooManySges, MAX_SGE};

/// Queue pair number (24 bits).
pub type Qpn = u32;

/// QP states of rc.md. An RC QP never enters SQE (Send Queue Error is
/// for UD and UC: an RC send error moves the QP to ERR).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpState {
    Reset,
    Init,
    Rtr,
    Rts,
    /// Send Queue Drain: WRs already taken finish, new ones wait; the
    /// responder works as in RTS.
    Sqd,
    Err,
}

impl QpState {
    /// Whether the requester runs (RTS, and SQD while it drains).
    pub fn sends(self) -> bool {
        matches!(self, QpState::Rts | QpState::Sqd)
    }

    /// Whether the QP takes packets from its peer (RTR and after).
    pub fn receives(self) -> bool {
        matches!(self, QpState::Rtr | QpState::Rts | QpState::Sqd)
    }
}

/// Path MTU: payload bytes per packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PathMtu {
    Mtu256 = 256,
    Mtu512 = 512,
    Mtu1024 = 1024,
    Mtu2048 = 2048,
    Mtu4096 = 4096,
}

impl PathMtu {
    pub const fn bytes(self) -> u32 {
        self as u32
    }

    /// The path MTU of this many bytes, if it is one of the five.
    pub const fn from_bytes(b: u32) -> Option<PathMtu> {
        Some(match b {
            256 => PathMtu::Mtu256,
            512 => PathMtu::Mtu512,
            1024 => PathMtu::Mtu1024,
            2048 => PathMtu::Mtu2048,
            4096 => PathMtu::Mtu4096,
            _ => return None,
        })
    }
}

/// QP access flags set on the way to INIT: what the peer may do to us.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpAccess {
    pub remote_write: bool,
    pub remote_read: bool,
    pub remote_atomic: bool,
}

/// Attributes of the INIT -> RTR transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtrAttr {
    pub path_mtu: PathMtu,
    pub dest_qpn: Qpn,
    pub dest_mac: MacAddr,
    pub dest_ip: Ipv4Addr,
    /// First PSN expected from the peer (24 bits).
    pub rq_psn: u32,
    /// READ requests and atomics remembered for duplicates (responder
    /// side), >= 1.
    pub max_dest_rd_atomic: u8,
    /// The RNR NAK timer code this responder sends (5 bits, see
    /// [`rnr_timer_ns`]).
    pub min_rnr_timer: u8,
    /// DSCP of this QP's packets (the top six bits of the GRH traffic
    /// class); `None`: the engine's.
    pub dscp: Option<u8>,
    /// The connection's feedback key (`rc::auth`): echoed telemetry is
    /// MACed by the receiver and verified by the sender. `None`: off.
    pub feedback_key: Option<super::auth::FeedbackKey>,
}

/// The wait an RNR NAK timer code asks for, in nanoseconds (IBA table
/// 45): code 0 is 655.36 ms, codes 1..=31 run from 0.01 ms to 491.52 ms.
pub const fn rnr_timer_ns(code: u8) -> u64 {
    const US_X100: [u32; 32] = [
        65536, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024,
        1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152,
    ];
    US_X100[(code & 31) as usize] as u64 * 10_000
}

/// What a modify that stays in (or returns to) a sending state may change:
/// IBA's optional attributes of INIT->INIT, RTS->RTS, RTS->SQD, SQD->RTS
/// and SQD->SQD that an RC QP here has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpUpdate {
    pub access: Option<QpAccess>,
    pub min_rnr_timer: Option<u8>,
    pub timeout: Option<u8>,
    pub retry_cnt: Option<u8>,
    pub rnr_retry: Option<u8>,
}

/// Attributes of the RTR -> RTS transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtsAttr {
    /// First PSN to send (24 bits).
    pub sq_psn: u32,
    /// Local ACK timeout: 4.096 us x 2^timeout; 0 disables it (5 bits).
    pub timeout: u8,
    /// Retries after a timeout before RETRY_EXC_ERR (3 bits).
    pub retry_cnt: u8,
    /// Retries after RNR NAKs (3 bits; 7 = infinite).
    pub rnr_retry: u8,
    /// READ requests outstanding at once (requester side), >= 1.
    pub max_rd_atomic: u8,
}

/// How far a QP's requester runs ahead of the peer's ACKs: PSNs sent and
/// not yet acknowledged at most, an AckReq at least every this many
/// packets and at least every this many messages. The engine's defaults
/// suit our own NIC; a standard peer is given rxe's bounds (128
/// unacknowledged PSNs), so that a slow peer is not flooded past its
/// input queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendLimits {
    pub max_outstanding_psns: u32,
    pub ack_req_every: u32,
    /// AckReq at least every this many messages (1..=64): above 1, the
    /// end of an unsignaled WR's message may go without one (ACK
    /// coalescing, for a peer that ACKs by itself after an idle delay, as
    /// our responder does; rxe ACKs only what asks).
    pub ack_req_msgs: u32,
}

impl SendLimits {
    /// What a QP towards a standard RoCEv2 peer gets: rxe's 128
    /// unacknowledged PSNs (RXE_MAX_UNACKED_PSNS), four AckReqs per
    /// window, so that ACKs keep coming while the window is full, and an
    /// AckReq on every message end (rxe ACKs nothing else).
    pub const STANDARD_PEER: SendLimits = SendLimits {
        max_outstanding_psns: 128,
        ack_req_every: 32,
        ack_req_msgs: 1,
    };
}

/// The far end of an RC connection, as exchanged out of band (perftest
/// exchanges these over TCP).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoint {
    pub qpn: Qpn,
    /// The first PSN the peer sends (our RQ PSN).
    pub psn: u32,
    pub mac: MacAddr,
    pub ip: Ipv4Addr,
}

/// How a QP is brought up, apart from its peer: path MTU, what the peer
/// may do, and how it retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectParams {
    pub mtu: PathMtu,
    pub access: QpAccess,
    /// Local ACK timeout exponent: 4.096 us x 2^timeout.
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    /// READs and atomics outstanding each way (max_rd_atomic and
    /// max_dest_rd_atomic).
    pub rd_atomic: u8,
    /// RNR NAK timer code this QP's responder sends.
    pub min_rnr_timer: u8,
    /// DSCP of this QP's packets; `None`: the engine's.
    pub dscp: Option<u8>,
    /// The connection's feedback key (both ends the same); `None`: off.
    pub feedback_key: Option<super::auth::FeedbackKey>,
}

impl ConnectParams {
    /// Remote WRITE, READ and atomics allowed, timeout 14 (67 ms), 7
    /// retries, RNR retry 7 (infinite), 16 READs or atomics outstanding,
    /// RNR timer 12 (0.64 ms, what perftest sets).
    pub fn new(mtu: PathMtu) -> Self {
        ConnectParams {
            mtu,
            access: QpAccess {
                remote_write: true,
                remote_read: true,
                remote_atomic: true,
            },
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            rd_atomic: 16,
            min_rnr_timer: 12,
            dscp: None,
            feedback_key: None,
        }
    }

    /// The INIT -> RTR and RTR -> RTS attributes of a QP whose first PSN is
    /// `sq_psn`, connecting to `peer`: the one place they are built.
    pub fn attrs(&self, sq_psn: u32, peer: &Endpoint) -> (RtrAttr, RtsAttr) {
        (
            RtrAttr {
                path_mtu: self.mtu,
                dest_qpn: peer.qpn,
                dest_mac: peer.mac,
                dest_ip: peer.ip,
                rq_psn: peer.psn,
                max_dest_rd_atomic: self.rd_atomic,
                min_rnr_timer: self.min_rnr_timer,
                dscp: self.dscp,
                feedback_key: self.feedback_key,
            },
            RtsAttr {
                sq_psn,
                timeout: self.timeout,
                retry_cnt: self.retry_cnt,
                rnr_retry: self.rnr_retry,
                max_rd_atomic: self.rd_atomic,
            },
        )
    }
}

/// What a send work request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WrOp {
    Write,
    WriteImm(u32),
    Read,
    Send,
    SendImm(u32),
    /// 8 bytes at the remote VA: if they equal `compare`, write `swap`; the
    /// original value lands in the local buffer.
    CmpSwap {
        compare: u64,
        swap: u64,
    },
    /// Adds `add` to the 8 bytes at the remote VA; the original value lands
    /// in the local buffer.
    FetchAdd {
        add: u64,
    },
}

impl WrOp {
    /// CMP_SWAP or FETCH_ADD.
    pub const fn is_atomic(self) -> bool {
        matches!(self, WrOp::CmpSwap { .. } | WrOp::FetchAdd { .. })
    }

    /// A READ or an atomic: bounded by max_rd_atomic, waited for by a
    /// fence, and writes its local buffer.
    pub const fn is_read_or_atomic(self) -> bool {
        matches!(self, WrOp::Read) || self.is_atomic()
    }

    /// SEND or SEND_WITH_IMM: consumes a receive WQE at the peer.
    pub const fn is_send(self) -> bool {
        matches!(self, WrOp::Send | WrOp::SendImm(_))
    }

    /// The completion opcode of a WR of this kind.
    pub const fn wc_opcode(self) -> WcOpcode {
        match self {
            WrOp::Write | WrOp::WriteImm(_) => WcOpcode::RdmaWrite,
            WrOp::Read => WcOpcode::RdmaRead,
            WrOp::Send | WrOp::SendImm(_) => WcOpcode::Send,
            WrOp::CmpSwap { .. } => WcOpcode::CompSwap,
            WrOp::FetchAdd { .. } => WcOpcode::FetchAdd,
        }
    }
}

/// An address handle of an engine (`Engine::create_ah`).
pub type AhId = u32;

/// Where a UD send goes: an address handle (the destination's IPv4 and
/// MAC address, its traffic class), the remote QP and the Q_Key it
/// checks. A Q_Key with the controlled bit (the top one) is replaced by
/// the sending QP's own (IBA C10-15: a WR may not use a controlled Q_Key
/// it was not given).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdDest {
    pub ah: AhId,
    pub remote_qpn: Qpn,
    pub remote_qkey: u32,
}

/// The sender of a datagram (a UD receive completion): its QP and the
/// IPv4 address in the GRH (ibverbs' `src_qp` and `IBV_WC_GRH`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdSource {
    pub qpn: Qpn,
    pub ip: Ipv4Addr,
}

/// A send work request: local buffers (a scatter/gather list) and, for
/// RDMA and atomic operations, the remote buffer (R_Key, VA).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendWr {
    pub wr_id: u64,
    pub op: WrOp,
    /// Local buffers: what a SEND or WRITE sends, where a READ's data or an
    /// atomic's original value (8 bytes) lands.
    pub sg: SgList,
    pub rkey: u32,
    pub remote_va: u64,
    /// Whether a successful completion is reported (errors always are).
    pub signaled: bool,
    /// IBV_SEND_FENCE: wait until every earlier READ and atomic of the QP
    /// has completed before starting.
    pub fence: bool,
    /// IBV_SEND_SOLICITED: the last packet of a SEND or RDMA WRITE with
    /// immediate carries the BTH's Solicited Event bit, so that the
    /// receiver's CQ signals a solicited-only waiter.
    pub solicited: bool,
    /// IBV_SEND_INLINE: the bytes of a SEND or WRITE, copied at post (the
    /// local buffers are then not read).
    pub inline: Option<InlineData>,
    /// A UD QP's SEND: where it goes (`None` on connected QPs).
    pub ud: Option<UdDest>,
}

/// Bytes a WR may carry inline (max_inline_data).
pub const MAX_INLINE_DATA: usize = 128;

/// The bytes of an inline SEND or WRITE.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct InlineData {
    len: u8,
    bytes: [u8; MAX_INLINE_DATA],
}

impl core::fmt::Debug for InlineData {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "InlineData({} bytes)", self.len)
    }
}

/// More inline bytes than [`MAX_INLINE_DATA`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{0} bytes of inline data (at most {MAX_INLINE_DATA})")]
pub struct InlineTooLong(pub usize);

impl InlineData {
    /// No bytes.
    pub const EMPTY: InlineData = InlineData {
        len: 0,
        bytes: [0; MAX_INLINE_DATA],
    };

    pub fn new(data: &[u8]) -> Result<InlineData, InlineTooLong> {
        if data.len() > MAX_INLINE_DATA {
            return Err(InlineTooLong(data.len()));
        }
        let mut bytes = [0u8; MAX_INLINE_DATA];
        bytes[..data.len()].copy_from_slice(data);
        Ok(InlineData {
            len: data.len() as u8,
            bytes,
        })
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len).min(MAX_INLINE_DATA)]
    }
}

impl SendWr {
    /// A signaled, unfenced WR over one local buffer.
    pub fn new(wr_id: u64, op: WrOp, local: Sge, rkey: u32, remote_va: u64) -> SendWr {
        SendWr {
            wr_id,
            op,
            sg: SgList::one(local),
            rkey,
            remote_va,
            signaled: true,
            fence: false,
            solicited: false,
            inline: None,
            ud: None,
        }
    }

    /// Message length: the inline bytes, or the bytes of every local
    /// buffer (saturating).
    pub fn byte_len(&self) -> u32 {
        match &self.inline {
            Some(d) => d.as_slice().len() as u32,
            None => self.sg.total().min(u64::from(u32::MAX)) as u32,
        }
    }
}

/// The operation fields of a send work request (everything but its local
/// buffers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WrHead {
    pub wr_id: u64,
    pub op: WrOp,
    pub rkey: u32,
    pub remote_va: u64,
    pub signaled: bool,
    pub fence: bool,
    pub solicited: bool,
    /// A UD QP's SEND: where it goes.
    pub ud: Option<UdDest>,
}

/// A send work request as borrowed parts: what the engine queues, so that
/// a WR read from shared memory is posted without building a [`SendWr`].
#[derive(Debug, Clone, Copy)]
pub struct WrParts<'a> {
    pub head: WrHead,
    pub payload: WrPayload<'a>,
}

/// Where a send WR's message comes from.
#[derive(Debug, Clone, Copy)]
pub enum WrPayload<'a> {
    /// Local buffers.
    Sges(&'a [Sge]),
    /// The bytes themselves (inline).
    Inline(&'a [u8]),
}

impl<'a> WrParts<'a> {
    /// The parts of `wr`.
    pub fn of(wr: &'a SendWr) -> Self {
        WrParts {
            head: WrHead {
                wr_id: wr.wr_id,
                op: wr.op,
                rkey: wr.rkey,
                remote_va: wr.remote_va,
                signaled: wr.signaled,
                fence: wr.fence,
                solicited: wr.solicited,
                ud: wr.ud,
            },
            payload: match &wr.inline {
                Some(d) => WrPayload::Inline(d.as_slice()),
                None => WrPayload::Sges(wr.sg.as_slice()),
            },
        }
    }

    /// Message length: the inline bytes or every local buffer's.
    pub fn total(&self) -> u64 {
        match self.payload {
            WrPayload::Sges(s) => s.iter().map(|s| u64::from(s.len)).sum(),
            WrPayload::Inline(d) => d.len() as u64,
        }
    }
}

/// A receive work request: where the data of an incoming SEND lands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvWr {
    pub wr_id: u64,
    pub sg: SgList,
}

/// Completion statuses (ibverbs names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WcStatus {
    Success,
    /// The local buffer's L_Key, bounds or access right is wrong.
    LocProtErr,
    /// The work request is malformed or not allowed on this QP (unknown
    /// opcode, QP not in RTS); from the verbs service, never the engine.
    LocQpOpErr,
    /// The message is longer than the QP allows (2^31 bytes).
    LocLenErr,
    RemInvReqErr,
    RemAccessErr,
    RemOpErr,
    RetryExcErr,
    RnrRetryExcErr,
    WrFlushErr,
}

/// Completion opcode (ibverbs `ibv_wc_opcode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WcOpcode {
    Send,
    RdmaWrite,
    RdmaRead,
    CompSwap,
    FetchAdd,
    /// A receive WQE consumed by a SEND.
    Recv,
    /// A receive WQE consumed by an RDMA WRITE with immediate.
    RecvRdmaWithImm,
}

impl WcOpcode {
    /// A completion of the receive queue.
    pub const fn is_recv(self) -> bool {
        matches!(self, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm)
    }
}

/// A completion queue entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cqe {
    pub wr_id: u64,
    pub qpn: Qpn,
    pub status: WcStatus,
    pub opcode: WcOpcode,
    pub byte_len: u32,
    /// Immediate data of a SEND_WITH_IMM or WRITE_WITH_IMM (receive
    /// completions), as the value the sender posted.
    pub imm: Option<u32>,
    /// A receive completion of a message whose last packet carried the
    /// Solicited Event bit.
    pub solicited: bool,
    /// A UD receive completion: who sent the datagram (its GRH is in the
    /// first 40 bytes of the receive buffer).
    pub src: Option<UdSource>,
}

/// Why a control-path call or a post was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RcError {
    #[error("no QP {0:#x}")]
    NoSuchQp(Qpn),
    #[error("QP {qpn:#x} is in {state:?}; {what} needs {need:?}")]
    WrongState {
        qpn: Qpn,
        state: QpState,
        need: QpState,
        what: &'static str,
    },
    #[error("{what} {value} out of range (max {max})")]
    OutOfRange {
        what: &'static str,
        value: u64,
        max: u64,
    },
    #[error("send queue of QP {0:#x} is full")]
    SendQueueFull(Qpn),
    #[error("receive queue of QP {0:#x} is full")]
    RecvQueueFull(Qpn),
    #[error("shared receive queue {0} is full")]
    SrqFull(u32),
    #[error("no shared receive queue {0}")]
    NoSuchSrq(u32),
    #[error("QP {0:#x} takes its receive WQEs from a shared receive queue; post to the SRQ")]
    QpUsesSrq(Qpn),
    #[error("shared receive queue {srq} belongs to PD {srq_pd}, the QP to PD {qp_pd}")]
    SrqOtherPd { srq: u32, srq_pd: u32, qp_pd: u32 },
    #[error("shared receive queue {0} still has QPs attached")]
    SrqInUse(u32),
    #[error("too many shared receive queues (at most {0})")]
    TooManySrqs(usize),
    #[error(transparent)]
    TooManySges(#[from] TooManySges),
    #[error("inline data is for SEND and RDMA WRITE, not {0}")]
    InlineOp(&'static str),
    #[error("{what} needs a local buffer of 8 bytes, got {len}")]
    AtomicLength { what: &'static str, len: u64 },

    #[error("local buffer refused: {0}")]
    LocalAccess(#[from] crate::mr::MrError),
    #[error("message of {0} bytes is longer than 2^31")]
    TooLong(u32),
    #[error("too many QPs (at most {0})")]
    TooManyQps(usize),
    #[error("QP {qpn:#x} cannot go from {from:?} to {to:?}")]
    NoTransition {
        qpn: Qpn,
        from: QpState,
        to: QpState,
    },
    #[error("{what} cannot change in {state:?} (only once the QP sends)")]
    NotYet { what: &'static str, state: QpState },
    #[error("too many address handles (at most {0})")]
    TooManyAhs(usize),
    #[error("no address handle {0} in the QP's protection domain")]
    NoSuchAh(u32),
    #[error("{what} is not an operation of {service} QPs")]
    NotOnService {
        what: &'static str,
        service: &'static str,
    },
    #[error("a datagram of {len} bytes is longer than the path MTU ({mtu})")]
    DatagramTooLong { len: u64, mtu: u32 },
    #[error("a UD SEND needs an address handle, a remote QPN and a Q_Key")]
    NoAddress,
    #[error("{0} is not an IPv4 multicast address (224.0.0.0/4): no multicast group")]
    NotMulticast(std::net::Ipv4Addr),
    #[error("multicast groups exhausted (at most {0} per device)")]
    TooManyGroups(usize),
    #[error("multicast group {group} has its {max} QPs attached already")]
    GroupFull {
        group: std::net::Ipv4Addr,
        max: usize,
    },
    #[error("QP {qpn:#x} is not attached to multicast group {group}")]
    NotAttached { qpn: Qpn, group: std::net::Ipv4Addr },
}

/// A frame [`Engine::poll_transmit_split`](super::Engine::poll_transmit_split)
/// built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxFrame {
    /// The whole frame: this many bytes of the buffer.
    Whole(usize),
    /// A frame whose payload is sent from where it lies: `head` bytes of
    /// the buffer (every header), then what `apart` says.
    Split { head: usize, apart: Apart },
}

/// The part of a frame sent in pieces after its headers: `payload_len`
/// bytes of registered memory at device address `payload`, then `tail`
/// (pad and ICRC). The memory is checked against its region already; the
/// driver attaches it to the frame, or copies it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Apart {
    pub payload: u64,
    pub payload_len: u32,
    pub tail: crate::wire::FrameTail,
}

impl Apart {
    /// Bytes of the frame after its headers.
    pub fn wire_len(&self) -> usize {
        self.payload_len as usize + self.tail.as_slice().len()
    }
}

impl TxFrame {
    /// The frame's length on the wire.
    pub fn wire_len(&self) -> usize {
        match *self {
            TxFrame::Whole(n) => n,
            TxFrame::Split { head, apart } => head + apart.wire_len(),
        }
    }
}
