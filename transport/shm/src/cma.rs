//! The rdma_cm part of the contract: what `librdmacm.so.1` asks the
//! daemon's connection manager for, and the events it pushes back.
//!
//! Two kinds of connection carry it (both framed as [`crate::proto`]):
//!
//! - a **session** (`Request::CmOpen { device }`): the rdma_cm ids of one
//!   process on one device. Requests on it name an id by the number the
//!   library gave it ([`CmId`]); ids the daemon creates (a listener's
//!   connection requests) take numbers with [`DAEMON_ID`] set. Closing
//!   the session destroys every id it holds, sending what the CM sends for
//!   each one's state (REJ, DREQ).
//! - an **event channel** (`Request::CmChannel`): after its reply, the
//!   daemon writes only events on it, as `ReplyMsg { id: 0, result:
//!   Ok(Reply::CmEvent(..)) }`, in the order they happened. Its socket is
//!   the fd an application polls (`rdma_event_channel.fd`); its end of
//!   file means the daemon is gone (DEVICE_REMOVAL). Requests that start
//!   something name the channel its events go to.

use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};

/// An rdma_cm id within its session.
pub type CmId = u32;

/// The bit of the ids the daemon numbers (a listener's new connections).
pub const DAEMON_ID: CmId = 1 << 31;

/// rdma_cm's event types, numbered as `enum rdma_cm_event_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CmEventType {
    AddrResolved = 0,
    AddrError = 1,
    RouteResolved = 2,
    RouteError = 3,
    ConnectRequest = 4,
    /// Active, RC: the REP came; the library moves its QP to RTR and RTS,
    /// then sends `CmEstablish` (the RTU) and reports ESTABLISHED.
    ConnectResponse = 5,
    ConnectError = 6,
    Unreachable = 7,
    Rejected = 8,
    Established = 9,
    Disconnected = 10,
    DeviceRemoval = 11,
    MulticastJoin = 12,
    MulticastError = 13,
    AddrChange = 14,
    TimewaitExit = 15,
}

/// The connection parameters of `struct rdma_conn_param` a side asks for
/// or the peer's message carried (its `qp_num` is the sender's QPN).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CmConnParams {
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: bool,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: bool,
    pub qp_num: u32,
}

/// Where a connection runs, as the library needs it to move its QP
/// (`rdma_init_qp_attr`) and fill the id's route.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CmPath {
    pub local_ip: Ipv4Addr,
    pub local_port: u16,
    pub peer_ip: Ipv4Addr,
    pub peer_port: u16,
    /// The starting PSN the peer announced (the REQ's to the passive
    /// side, the REP's to the active side). As Linux's CM uses them, it
    /// is where this side's send queue starts (RTS `sq_psn`); the
    /// starting PSN this side announced (`CmConnectReq::starting_psn`,
    /// `CmAcceptReq::starting_psn`) is where its receive queue starts
    /// (RTR `rq_psn`).
    pub peer_psn: u32,
    /// The path MTU, bytes.
    pub mtu: u32,
    /// The local ACK timeout code for RTS (`ibv_qp_attr.timeout`).
    pub ack_timeout: u8,
    /// The GRH traffic class the connection uses.
    pub traffic_class: u8,
    /// UD: the peer QP's Q_Key.
    pub qkey: u32,
    /// Both ends are our NICs and run our telemetry (HPCC++) on it.
    pub telemetry: bool,
}

/// One event of an id, pushed on its channel.
///
/// `conn` is what the application reads in `event->param.conn`: in a
/// CONNECT_REQUEST the REQ's depths swapped (its initiator depth as
/// `responder_resources`, its responder resources as `initiator_depth`,
/// as rdma_cm shows a REQ to the passive side); in CONNECT_RESPONSE and
/// ESTABLISHED the REP's as they came.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CmEventMsg {
    /// The session of the id (`Reply::CmOpened::session`).
    pub session: u64,
    pub id: CmId,
    /// CONNECT_REQUEST: the listener it came to (`id` is the new one).
    pub listener: Option<CmId>,
    pub event: CmEventType,
    /// As rdma_cm gives it: 0, a reject reason (REJECTED), a SIDR status
    /// (UNREACHABLE of UD), or a negative errno (-ETIMEDOUT...).
    pub status: i32,
    /// The peer's private data (rdma_cm's header taken off a request's).
    pub private_data: Vec<u8>,
    /// The peer's parameters (CONNECT_REQUEST, CONNECT_RESPONSE,
    /// ESTABLISHED).
    pub conn: CmConnParams,
    pub path: Option<CmPath>,
}

/// The address an id listens on: one device's, or any of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CmListenAddr {
    /// `None`: INADDR_ANY.
    pub ip: Option<Ipv4Addr>,
    /// 0: the daemon picks a free port.
    pub port: u16,
}

/// What `rdma_connect` sends (a REQ, or a SIDR_REQ for UD).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CmConnectReq {
    pub id: CmId,
    pub channel: u64,
    /// `RDMA_PS_*`: TCP 0x0106 (RC), UDP 0x0111 (UD), IB 0x013F.
    pub port_space: u16,
    /// The id's own port (from `CmResolveAddr`).
    pub src_port: u16,
    pub dst: Ipv4Addr,
    pub dst_port: u16,
    /// The QP (RC or UD; UD sends a SIDR_REQ and takes no QPN).
    pub qp_type: crate::proto::QpType,
    pub qpn: u32,
    /// The REQ's starting PSN: where the QP's receive queue starts (the
    /// peer sends from it; see [`CmPath::peer_psn`]).
    pub starting_psn: u32,
    pub conn: CmConnParams,
    pub private_data: Vec<u8>,
    pub traffic_class: u8,
    /// `RDMA_OPTION_ID_ACK_TIMEOUT`, when the application set it.
    pub ack_timeout: Option<u8>,
}

/// What `rdma_accept` sends (a REP, or a SIDR_REP for UD).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CmAcceptReq {
    pub id: CmId,
    pub qpn: u32,
    /// The REP's starting PSN: where the QP's receive queue starts.
    pub starting_psn: u32,
    pub conn: CmConnParams,
    pub private_data: Vec<u8>,
    /// UD: the QP's Q_Key.
    pub qkey: u32,
}
