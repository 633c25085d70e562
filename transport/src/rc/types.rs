//! What applications hand the engine and get back: work requests,
//! completions and their statuses, QP attributes, and the errors of the
//! control path.

use core::net::Ipv4Addr;

use crate::wire::MacAddr;

/// Queue pair number (24 bits).
pub type Qpn = u32;

/// QP states of rc.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpState {
    Reset,
    Init,
    Rtr,
    Rts,
    Err,
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
    /// READ requests remembered for duplicates (responder side), >= 1.
    pub max_dest_rd_atomic: u8,
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
    /// READs outstanding each way (max_rd_atomic and max_dest_rd_atomic).
    pub rd_atomic: u8,
}

impl ConnectParams {
    /// Remote WRITE and READ allowed, timeout 14 (67 ms), 7 retries, RNR
    /// retry 7 (infinite), 16 READs outstanding.
    pub fn new(mtu: PathMtu) -> Self {
        ConnectParams {
            mtu,
            access: QpAccess {
                remote_write: true,
                remote_read: true,
            },
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            rd_atomic: 16,
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
}

/// A send work request: local buffer (L_Key, VA, length) and remote buffer
/// (R_Key, VA).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendWr {
    pub wr_id: u64,
    pub op: WrOp,
    pub lkey: u32,
    pub local_va: u64,
    pub len: u32,
    pub rkey: u32,
    pub remote_va: u64,
    /// Whether a successful completion is reported (errors always are).
    pub signaled: bool,
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

/// Completion opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WcOpcode {
    RdmaWrite,
    RdmaRead,
}

/// A completion queue entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cqe {
    pub wr_id: u64,
    pub qpn: Qpn,
    pub status: WcStatus,
    pub opcode: WcOpcode,
    pub byte_len: u32,
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
    #[error("local buffer refused: {0}")]
    LocalAccess(#[from] crate::mr::MrError),
    #[error("message of {0} bytes is longer than 2^31")]
    TooLong(u32),
    #[error("too many QPs (at most {0})")]
    TooManyQps(usize),
}
