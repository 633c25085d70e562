//! The control protocol between applications and the daemon, over the
//! daemon's Unix stream socket: every message is a little-endian `u32`
//! length and that many bytes of JSON. A request carries the contract's
//! [`VERSION`](crate::VERSION) and an id; the reply carries the same
//! version and id and either a result or a typed error. File descriptors
//! (the segment's memfd, a CQ's eventfd) travel beside a message as
//! `SCM_RIGHTS` ([`crate::fds`]).
//!
//! The first request of a connection is [`Request::OpenDevice`]; closing
//! the socket closes the device and frees everything it holds.

use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};

use serde::{Deserialize, Serialize};

use crate::cma::{CmAcceptReq, CmConnectReq, CmEventMsg, CmId, CmListenAddr};
use crate::fds::{recv_with_fds, Wait};
pub use crate::fds::{send_with_fds, MAX_FDS};

/// Largest message either side accepts.
pub const MAX_MESSAGE: usize = 1 << 20;

/// A piece of an application's buffer: `len` bytes of the memfd sent as
/// descriptor number `fd` of the request, from `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MapPiece {
    pub fd: u32,
    pub offset: u64,
    pub len: u64,
}

/// Access rights of a memory region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct MrAccess {
    pub local_write: bool,
    pub remote_write: bool,
    pub remote_read: bool,
    #[serde(default)]
    pub remote_atomic: bool,
}

/// The RNR NAK timer code a QP's responder sends unless told otherwise
/// (0.64 ms, what perftest sets).
pub const DEFAULT_MIN_RNR_TIMER: u8 = 12;

fn default_min_rnr_timer() -> u8 {
    DEFAULT_MIN_RNR_TIMER
}

/// A QP's transport service (ibverbs' `IBV_QPT_RC`, `_UC`, `_UD`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum QpType {
    #[default]
    Rc,
    Uc,
    Ud,
}

/// A QP state transition and its attributes (`docs/spec/rc.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Modify {
    Init {
        remote_write: bool,
        remote_read: bool,
        #[serde(default)]
        remote_atomic: bool,
        /// UD: the QP's Q_Key.
        #[serde(default)]
        qkey: Option<u32>,
    },
    /// A UD QP's INIT -> RTR (no destination: datagrams up to the port's
    /// MTU from anyone with its Q_Key).
    UdRtr,
    /// A UD QP's RTR -> RTS with its first PSN.
    UdRts {
        sq_psn: u32,
    },
    Rtr {
        mtu: u32,
        dest_qpn: u32,
        dest_ip: std::net::Ipv4Addr,
        rq_psn: u32,
        max_dest_rd_atomic: u8,
        /// RNR NAK timer code (5 bits).
        #[serde(default = "default_min_rnr_timer")]
        min_rnr_timer: u8,
        /// The GRH traffic class (IPv4 TOS: DSCP and ECN); the DSCP goes
        /// on the QP's packets. `None`: the daemon's DSCP.
        #[serde(default)]
        traffic_class: Option<u8>,
    },
    Rts {
        sq_psn: u32,
        timeout: u8,
        retry_cnt: u8,
        rnr_retry: u8,
        max_rd_atomic: u8,
    },
    Err,
    /// Any state -> RESET: the QP forgets its connection and its WRs.
    Reset,
    /// A modify that keeps the connection: INIT->INIT, RTS->RTS,
    /// RTS->SQD, SQD->RTS, SQD->SQD, with what it changes.
    Update {
        to: UpdateTo,
        #[serde(default)]
        access: Option<QpAccessFlags>,
        #[serde(default)]
        min_rnr_timer: Option<u8>,
        #[serde(default)]
        timeout: Option<u8>,
        #[serde(default)]
        retry_cnt: Option<u8>,
        #[serde(default)]
        rnr_retry: Option<u8>,
        /// RTS->SQD: raise SQ_DRAINED once the send queue is empty.
        #[serde(default)]
        sqd_notify: bool,
        /// UD: a new Q_Key.
        #[serde(default)]
        qkey: Option<u32>,
    },
}

/// The state an in-place modify goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum UpdateTo {
    Init,
    Rts,
    Sqd,
}

/// What the peer may do to a QP (its remote access flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpAccessFlags {
    pub remote_write: bool,
    pub remote_read: bool,
    pub remote_atomic: bool,
}

impl Request {
    /// Descriptors that travel with this request.
    pub fn fd_count(&self) -> usize {
        match self {
            Request::RegUserMr { pieces, .. } => {
                pieces.iter().map(|p| p.fd as usize + 1).max().unwrap_or(0)
            }
            _ => 0,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// The devices the daemon serves (allowed before `OpenDevice`; opens
    /// nothing).
    ListDevices,
    /// Opens `device` with a shared segment of `shm_bytes`.
    OpenDevice {
        device: String,
        shm_bytes: u64,
    },
    AllocPd,
    DeallocPd {
        pd: u32,
    },
    /// Allocates `len` bytes of the segment and registers them.
    RegMr {
        pd: u32,
        len: u64,
        access: MrAccess,
    },
    /// Registers the application's own buffer `[va, va + len)`: its pages
    /// were moved into memfds (sent with the request) that the daemon maps
    /// back to back (`pieces`, page-aligned); `va` is at `start` bytes into
    /// that mapping. Work requests and the peer name the buffer by `va`.
    RegUserMr {
        pd: u32,
        va: u64,
        len: u64,
        access: MrAccess,
        start: u64,
        pieces: Vec<MapPiece>,
    },
    DeregMr {
        lkey: u32,
    },
    CreateCq {
        depth: u32,
    },
    DestroyCq {
        cq: u32,
    },
    CreateQp {
        pd: u32,
        cq: u32,
        /// Where receive completions go (default: `cq`).
        #[serde(default)]
        recv_cq: Option<u32>,
        depth: u32,
        /// Its own receive queue's depth (0: none; with `srq`, ignored).
        #[serde(default)]
        rq_depth: u32,
        /// Take receive WQEs from this shared receive queue.
        #[serde(default)]
        srq: Option<u32>,
        #[serde(default)]
        qp_type: QpType,
    },
    /// An address handle of `pd` to `dest_ip` (a UD WQE names it).
    CreateAh {
        pd: u32,
        dest_ip: std::net::Ipv4Addr,
        /// The GRH traffic class (its top six bits are the DSCP); `None`:
        /// the daemon's DSCP.
        #[serde(default)]
        traffic_class: Option<u8>,
    },
    DestroyAh {
        ah: u32,
    },
    /// Attaches UD QP `qpn` to the IPv4 multicast group `group`
    /// (ibv_attach_mcast with an IPv4-mapped multicast GID).
    AttachMcast {
        qpn: u32,
        group: std::net::Ipv4Addr,
    },
    DetachMcast {
        qpn: u32,
        group: std::net::Ipv4Addr,
    },
    /// A shared receive queue of `depth` receive WQEs, its ring in the
    /// segment.
    CreateSrq {
        pd: u32,
        depth: u32,
    },
    /// Arms the SRQ limit (0 disarms).
    ModifySrq {
        srq: u32,
        limit: u32,
    },
    DestroySrq {
        srq: u32,
    },
    /// WQEs waiting in an SRQ, its armed limit and the limit events so far.
    QuerySrq {
        srq: u32,
    },
    ModifyQp {
        qpn: u32,
        modify: Modify,
    },
    DestroyQp {
        qpn: u32,
    },
    QueryQp {
        qpn: u32,
    },
    /// Gives a QP in RESET or INIT its own congestion control (a name of
    /// `transport::rc::CcMode::NAMES`).
    SetQpCc {
        qpn: u32,
        cc: String,
    },
    /// Gives a QP in RESET or INIT the 128-bit key that authenticates its
    /// congestion feedback (HPCC++ draft-00 s9; both ends must hold the
    /// same); `None` takes an explicit key back (the QP then gets the
    /// daemon's domain-derived key, if it has one).
    SetQpFeedbackKey {
        qpn: u32,
        key: Option<[u8; 16]>,
    },
    QueryPort,
    /// Counters of every port, engine and QP of the daemon, as JSON.
    Stats,
    /// The eventfd the daemon signals when it has asynchronous events for
    /// this connection (comes with the reply `Done`).
    AsyncEventFd,
    /// The asynchronous events waiting, oldest first (taken).
    AsyncEvents,
    /// Starts the daemon's latency trace afresh, keeping up to `capacity`
    /// stamps (0: stops it; the stamps taken stay readable).
    Trace {
        capacity: u32,
    },
    /// The trace's stamps from stamp `from` on (a page at a time).
    TraceStamps {
        from: u64,
    },
    /// Makes this connection an rdma_cm event channel (allowed as the
    /// first request; see [`crate::cma`]): the reply is
    /// `Reply::CmChannel`, then only events come.
    CmChannel,
    /// Makes this connection an rdma_cm session on `device` (the first
    /// request): `Reply::CmOpened`.
    CmOpen {
        device: String,
    },
    /// Binds id `id` to `addr` (`rdma_bind_addr`): `Reply::CmPort` names
    /// its port, one the daemon picks for port 0 (free of listeners and
    /// other bound ids on the device), as the kernel assigns at bind.
    CmBind {
        id: CmId,
        channel: u64,
        port_space: u16,
        addr: CmListenAddr,
    },
    /// Listens for connection requests to `addr` in `port_space`
    /// (`RDMA_PS_*`); they come to `channel` as CONNECT_REQUEST events.
    /// `Reply::CmPort` names the port (the one picked for port 0).
    CmListen {
        id: CmId,
        channel: u64,
        port_space: u16,
        addr: CmListenAddr,
    },
    /// Resolves `dst` to a neighbour's MAC within `timeout_ms`:
    /// ADDR_RESOLVED or ADDR_ERROR on `channel`. `Reply::CmPort` gives
    /// the id its own port (`src_port`, or one picked for 0).
    CmResolveAddr {
        id: CmId,
        channel: u64,
        port_space: u16,
        src_port: u16,
        dst: std::net::Ipv4Addr,
        timeout_ms: u32,
    },
    /// Sends the REQ (SIDR_REQ for UD).
    CmConnect(CmConnectReq),
    /// Answers a CONNECT_REQUEST with a REP (SIDR_REP for UD).
    CmAccept(CmAcceptReq),
    /// Active: the QP is in RTS; sends the RTU.
    CmEstablish {
        id: CmId,
    },
    /// Answers a CONNECT_REQUEST with a REJ (`reason`, default 28
    /// consumer-defined; `rdma_reject_ece` gives 35) or a SIDR_REP that
    /// rejects.
    CmReject {
        id: CmId,
        private_data: Vec<u8>,
        #[serde(default)]
        reason: Option<u16>,
    },
    /// The id's events go to `channel` from now on (`rdma_migrate_id`).
    CmMigrate {
        id: CmId,
        channel: u64,
    },
    /// Sends the DREQ (or, after the peer's, the DREP).
    CmDisconnect {
        id: CmId,
    },
    /// Forgets the id, sending what its state calls for.
    CmDestroyId {
        id: CmId,
    },
}

/// An asynchronous event of a connection's objects (ibverbs'
/// `ibv_async_event`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum AsyncEventMsg {
    /// The QP's responder met a request outside its access rights (QP
    /// now in ERR).
    QpAccessErr { qpn: u32 },
    /// The QP's responder met a request that breaks the protocol.
    QpReqErr { qpn: u32 },
    /// The QP failed for another reason no completion reports.
    QpFatal { qpn: u32 },
    /// The QP in SQD has no send WR left in flight.
    SqDrained { qpn: u32 },
    /// The QP, on an SRQ, went to ERR.
    QpLastWqeReached { qpn: u32 },
    /// The SRQ fell below its armed limit (now disarmed).
    SrqLimitReached { srq: u32 },
    /// The CQ overran (its QPs were moved to ERR).
    CqErr { cq: u32 },
}

/// The device an application opened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceInfo {
    pub name: String,
    pub ip: std::net::Ipv4Addr,
    pub mac: [u8; 6],
    /// Largest path MTU the port carries.
    pub max_mtu: u32,
    pub shm_bytes: u64,
    pub hugepages: bool,
    /// The port's PMD (net_ring, net_memif, ...).
    #[serde(default)]
    pub backend: String,
    /// The least payload of a packet the device sends from where it lies
    /// in the application's memory (none: every payload is copied into
    /// the frame).
    #[serde(default)]
    pub zero_copy_tx_min: Option<u32>,
    /// Congestion control of the device's QPs.
    #[serde(default)]
    pub cc: String,
    /// Device limits a verbs application asks `ibv_query_device` for.
    #[serde(default)]
    pub caps: DeviceCaps,
    /// The rate the engine paces QPs at (the port's line rate), Gb/s.
    #[serde(default)]
    pub line_gbps: u32,
    /// Offset of the application's doorbell block in its segment
    /// (`crate::abi::Doorbells`; none before a segment exists).
    #[serde(default)]
    pub doorbells: Option<u64>,
}

/// What a device supports per QP and WR.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DeviceCaps {
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
    /// READs and atomics outstanding per QP, each way.
    pub max_qp_rd_atom: u32,
    pub max_qp_wr: u32,
    pub max_srq_wr: u32,
    /// Atomics are atomic against other QPs of the device (IBV_ATOMIC_HCA).
    pub atomic_hca: bool,
    /// QPs, CQ entries per CQ, memory regions and SRQs the device holds.
    #[serde(default)]
    pub max_qp: u32,
    #[serde(default)]
    pub max_cqe: u32,
    #[serde(default)]
    pub max_mr: u32,
    #[serde(default)]
    pub max_srq: u32,
    /// Largest memory region, in bytes.
    #[serde(default)]
    pub max_mr_size: u64,
}

/// A QP's state and counters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpInfo {
    pub qpn: u32,
    pub state: String,
    pub tx_packets: u64,
    pub rx_packets: u64,
    pub retransmits: u64,
    pub timeouts: u64,
    pub window_bytes: u64,
    pub rate_bps: u64,
    /// The QP's congestion control.
    #[serde(default)]
    pub cc: String,
    /// Its congestion feedback is authenticated (it has a feedback key),
    /// and the feedback it refused: a bad MAC or token, not newer than
    /// the last taken (a replay), no MAC at all (the peer has no key).
    #[serde(default)]
    pub feedback_auth: bool,
    #[serde(default)]
    pub feedback_forged: u64,
    #[serde(default)]
    pub feedback_replayed: u64,
    #[serde(default)]
    pub feedback_unkeyed: u64,
}

/// The port's link and counters.
/// The state of a shared receive queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SrqInfo {
    /// Receive WQEs the daemon holds for it (not counting those still in
    /// the ring).
    pub wqes: u32,
    /// The armed limit (0: disarmed; an event disarms it).
    pub limit: u32,
    /// SRQ_LIMIT_REACHED events so far.
    pub limit_events: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortInfo {
    pub link_up: bool,
    pub rx_packets: u64,
    pub tx_packets: u64,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    /// With two descriptors: the segment's memfd, then the eventfd that
    /// wakes the device's lcore when it sleeps
    /// ([`crate::abi::Doorbells::take_asleep`]).
    DeviceOpened(DeviceInfo),
    /// Every device, in the daemon's order (no segment: `shm_bytes` 0).
    Devices(Vec<DeviceInfo>),
    Pd {
        pd: u32,
    },
    /// `offset` in the segment; `va` is the device address the region
    /// has in work requests and on the wire.
    Mr {
        lkey: u32,
        rkey: u32,
        va: u64,
        offset: u64,
        len: u64,
    },
    /// With the CQ's eventfd; the ring's header is at `offset`.
    Cq {
        cq: u32,
        offset: u64,
        depth: u32,
    },
    Qp {
        qpn: u32,
        sq_offset: u64,
        depth: u32,
        /// The receive queue's ring (depth 0: none).
        #[serde(default)]
        rq_offset: u64,
        #[serde(default)]
        rq_depth: u32,
    },
    Srq {
        srq: u32,
        offset: u64,
        depth: u32,
    },
    Ah {
        ah: u32,
    },
    SrqInfo(SrqInfo),
    Done,
    QpInfo(QpInfo),
    PortInfo(PortInfo),
    Stats {
        json: String,
    },
    AsyncEvents(Vec<AsyncEventMsg>),
    /// This connection is an event channel; events name it so.
    CmChannel {
        channel: u64,
    },
    /// An rdma_cm session on a device.
    CmOpened {
        session: u64,
        ip: std::net::Ipv4Addr,
        /// Largest path MTU the port carries, bytes.
        max_mtu: u32,
    },
    CmPort {
        port: u16,
    },
    /// An rdma_cm event, pushed on an event channel.
    CmEvent(Box<CmEventMsg>),
    /// A page of the latency trace: (TSC, packed key) pairs flattened
    /// (`nic::FrameKey::unpack`), the TSC's rate, the stamps the trace
    /// holds and those it dropped when full. A daemon with several
    /// dataplane lcores keeps a trace per lcore: `from` is a position in
    /// each, `total` the longest, and `next` the `from` of the next page.
    TraceStamps {
        tsc_hz: u64,
        total: u64,
        dropped: u64,
        stamps: Vec<u64>,
        #[serde(default)]
        next: u64,
    },
}

/// What kind of error a request met.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorKind {
    /// Protocol or ABI version mismatch.
    Version,
    /// A request before OpenDevice, or a second OpenDevice.
    NotOpen,
    AlreadyOpen,
    NoSuchDevice,
    NoSuchPd,
    NoSuchMr,
    NoSuchCq,
    NoSuchQp,
    NoSuchSrq,
    /// The object is still used (a PD with regions or QPs, a CQ with QPs).
    Busy,
    InvalidArgument,
    /// The segment, a table or the engine has no room.
    NoSpace,
    /// The message could not be read.
    Malformed,
    /// rdma_cm: the port is taken (EADDRINUSE).
    AddrInUse,
    /// rdma_cm: no device has the address (EADDRNOTAVAIL).
    AddrNotAvailable,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{kind:?}: {message}")]
pub struct ErrorReply {
    pub kind: ErrorKind,
    pub message: String,
}

impl ErrorReply {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        ErrorReply {
            kind,
            message: message.into(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestMsg {
    pub v: u32,
    pub id: u64,
    pub req: Request,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplyMsg {
    pub v: u32,
    pub id: u64,
    pub result: Result<Reply, ErrorReply>,
}

/// A message framed for the socket: length prefix and JSON.
pub fn frame<T: Serialize>(msg: &T) -> Vec<u8> {
    let body = serde_json::to_vec(msg).expect("messages serialize");
    let mut out = Vec::with_capacity(4 + body.len());
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

/// A frame that cannot be a message: the stream is out of step.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("message of {0} bytes (at most {MAX_MESSAGE})")]
    TooLong(usize),
    #[error("not a message of this protocol: {0}")]
    NotAMessage(String),
}

/// Splits one whole message off the front of `buf`, if it holds one.
/// `Err` names a frame longer than [`MAX_MESSAGE`] or bytes that are not
/// the expected message.
pub fn unframe<T: for<'de> Deserialize<'de>>(buf: &mut Vec<u8>) -> Result<Option<T>, FrameError> {
    let Some(head) = buf.first_chunk::<4>() else {
        return Ok(None);
    };
    let n = u32::from_le_bytes(*head) as usize;
    if n > MAX_MESSAGE {
        return Err(FrameError::TooLong(n));
    }
    let Some(body) = buf.get(4..4 + n) else {
        return Ok(None);
    };
    let parsed = serde_json::from_slice(body).map_err(|e| FrameError::NotAMessage(e.to_string()));
    buf.drain(..4 + n);
    parsed.map(Some)
}

/// Reads from a blocking socket until one whole message is in `buf`,
/// collecting any file descriptors that arrive.
pub fn recv_message<T: for<'de> Deserialize<'de>>(
    sock: &mut std::os::unix::net::UnixStream,
    buf: &mut Vec<u8>,
    fds: &mut Vec<OwnedFd>,
) -> std::io::Result<T> {
    let bad = |e: FrameError| std::io::Error::new(std::io::ErrorKind::InvalidData, e);
    loop {
        if let Some(m) = unframe(buf).map_err(bad)? {
            return Ok(m);
        }
        let mut chunk = [0u8; 4096];
        let n = recv_with_fds(sock.as_fd(), &mut chunk, fds, Wait::Block)?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the daemon closed the connection",
            ));
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Writes a whole message on a blocking stream.
pub fn send_message<T: Serialize>(sock: &mut impl Write, msg: &T) -> std::io::Result<()> {
    sock.write_all(&frame(msg))
}

/// Reads a whole message from a blocking stream that carries no file
/// descriptors.
pub fn read_message<T: for<'de> Deserialize<'de>>(sock: &mut impl Read) -> std::io::Result<T> {
    let mut len = [0u8; 4];
    sock.read_exact(&mut len)?;
    let n = u32::from_le_bytes(len) as usize;
    if n > MAX_MESSAGE {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            FrameError::TooLong(n),
        ));
    }
    let mut body = vec![0u8; n];
    sock.read_exact(&mut body)?;
    serde_json::from_slice(&body)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_split_at_message_boundaries() {
        let a = RequestMsg {
            v: crate::VERSION,
            id: 1,
            req: Request::CreateCq { depth: 64 },
        };
        let b = RequestMsg {
            v: crate::VERSION,
            id: 2,
            req: Request::QueryPort,
        };
        let mut buf = frame(&a);
        buf.extend(frame(&b));
        let half = buf.split_off(5);
        let mut head = buf;
        assert_eq!(unframe::<RequestMsg>(&mut head), Ok(None));
        head.extend(half);
        assert_eq!(unframe::<RequestMsg>(&mut head), Ok(Some(a)));
        assert_eq!(unframe::<RequestMsg>(&mut head), Ok(Some(b)));
        assert!(head.is_empty());
    }

    #[test]
    fn oversized_and_garbled_frames_are_refused_by_name() {
        let mut big = ((MAX_MESSAGE + 1) as u32).to_le_bytes().to_vec();
        assert_eq!(
            unframe::<RequestMsg>(&mut big),
            Err(FrameError::TooLong(MAX_MESSAGE + 1))
        );
        let mut junk = 3u32.to_le_bytes().to_vec();
        junk.extend(b"{x}");
        assert!(matches!(
            unframe::<RequestMsg>(&mut junk),
            Err(FrameError::NotAMessage(_))
        ));
    }

    #[test]
    fn descriptors_travel_beside_a_message() {
        let (mut a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
        let (_seg, memfd) = crate::Segment::create("t", 4096, false).unwrap();
        let msg = frame(&ReplyMsg {
            v: crate::VERSION,
            id: 7,
            result: Ok(Reply::Done),
        });
        let sent = send_with_fds(a.as_fd(), &msg, &[memfd.as_fd()]).unwrap();
        a.write_all(&msg[sent..]).unwrap();
        let (mut buf, mut fds) = (Vec::new(), Vec::new());
        let got: ReplyMsg = recv_message(&mut b, &mut buf, &mut fds).unwrap();
        assert_eq!(got.id, 7);
        assert_eq!(fds.len(), 1);
        assert!(crate::Segment::map(&fds[0], 4096).is_ok());
    }
}
