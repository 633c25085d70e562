//! The IB connection manager of one device (IBA vol. 1 ch. 12) as Linux's
//! `drivers/infiniband/core/cm.c` runs it on a RoCE port (docs/cm-linux.md
//! has the facts this follows), so that a Linux peer cannot tell it from
//! its own: REQ / REP / RTU to connect, REJ, MRA, DREQ / DREP and
//! TIMEWAIT, duplicate and stale REQs, requests retransmitted after their
//! timeout until their retries run out.
//!
//! Sans-IO: MADs come in through [`Cm::on_mad`] (QP1's, through the MAD
//! agents' dispatch), the consumer (the daemon's rdma_cm layer) calls
//! [`Cm::listen`], [`Cm::connect`], [`Cm::accept`], [`Cm::reject`],
//! [`Cm::establish`], [`Cm::disconnect`] and [`Cm::destroy`], time comes
//! in through [`Cm::on_timeout`]; MADs to send and events for the
//! consumer come out of [`Cm::poll_mad`] and [`Cm::poll_event`]. The
//! consumer moves its QPs: the CM only says when and with what.
//!
//! SIDR resolves a service ID to a UD QP ([`Cm::resolve`],
//! [`Cm::sidr_reply`]). LAP and APR (alternate paths, which RoCE does not
//! use) are counted and dropped.

mod conn;
mod recv;

use std::collections::{HashMap, VecDeque};
use std::net::Ipv4Addr;

pub use conn::{ack_timeout, exp_to_ns, CommId, Peer, State};
use conn::{Conn, Pending};

use crate::mad::{MadAgent, Registration};
use crate::rc::{OutMad, Qpn, ReceivedMad};
use crate::wire::cm::{self, CmMsg, CmPath, Drep, Dreq, Rej, Rep, Req, Rtu};
use crate::wire::mad::{method, GSI_QKEY, GSI_QPN, MAD_LEN};

/// The CM's settings for one device.
#[derive(Debug, Clone, Copy)]
pub struct CmConfig {
    /// The device's node GUID (LocalCAGUID).
    pub node_guid: u64,
    /// The device's IPv4 address (its GID is the IPv4-mapped one).
    pub ip: Ipv4Addr,
    /// The CA's ACK delay exponent (rxe: 15).
    pub ca_ack_delay: u8,
    /// The packet lifetime exponent of a path (Linux's
    /// CMA_IBOE_PACKET_LIFETIME, 18).
    pub packet_life_time: u8,
    /// The response timeout exponent of our CM (CMA_CM_RESPONSE_TIMEOUT,
    /// 20: 4.1 s) and how often a request is retried (CMA_MAX_CM_RETRIES,
    /// 15).
    pub response_timeout: u8,
    pub max_retries: u8,
    /// The upper 32 bits of the TIDs of our requests (the MAD agent's
    /// number), and a seed that makes communication IDs unpredictable.
    pub agent: u32,
    pub id_seed: u32,
}

impl CmConfig {
    /// Linux's values for a device of `ip` and `node_guid`.
    pub fn new(ip: Ipv4Addr, node_guid: u64) -> Self {
        CmConfig {
            node_guid,
            ip,
            ca_ack_delay: 15,
            packet_life_time: 18,
            response_timeout: 20,
            max_retries: 15,
            agent: 1,
            id_seed: 0x5EED_0001,
        }
    }
}

/// What the active side asks for (the REQ's fields that are not the
/// CM's own).
#[derive(Debug, Clone)]
pub struct ConnectParams {
    pub peer: Peer,
    pub service_id: u64,
    pub qpn: Qpn,
    pub starting_psn: u32,
    /// The IBA MTU code (1: 256 .. 5: 4096).
    pub path_mtu: u8,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: bool,
    pub flow_control: bool,
    /// 0 RC, 1 UC.
    pub transport: u8,
    pub traffic_class: u8,
    pub flow_label: u32,
    /// The REQ's private data (rdma_cm's header first), at most 92 bytes.
    pub private_data: Vec<u8>,
    /// Offer our telemetry (HPCC++): a peer that is one of our NICs
    /// answers whether it speaks it too ([`rep_speaks_telemetry`]).
    pub telemetry: bool,
}

/// The capability mark our NICs put in a REQ's alternate path, which
/// RoCE does not use and Linux ignores while the alternate LID is 0 and
/// the GID's interface ID is not OPA's (`cm_req_has_alt_path`): "RNIC",
/// a version, then capability bits (bit 0: our telemetry).
const REQ_MARK: [u8; 4] = *b"RNIC";
const REQ_MARK_VERSION: u8 = 1;
const CAP_TELEMETRY: u8 = 0x01;

/// Whether a REQ comes from one of our NICs offering our telemetry.
pub fn req_offers_telemetry(req: &Req) -> bool {
    let g = &req.alternate.local_gid;
    req.alternate.local_lid == 0
        && g[..4] == REQ_MARK
        && g[4] == REQ_MARK_VERSION
        && g[5] & CAP_TELEMETRY != 0
}

/// Whether a REP comes from one of our NICs that takes our telemetry.
pub fn rep_speaks_telemetry(rep: &Rep) -> bool {
    rep.reserved_flags & cm::REP_TELEMETRY != 0
}

/// What the passive side answers with (the REP's fields).
#[derive(Debug, Clone)]
pub struct AcceptParams {
    pub qpn: Qpn,
    pub starting_psn: u32,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub rnr_retry_count: u8,
    pub srq: bool,
    pub flow_control: bool,
    /// At most 196 bytes.
    pub private_data: Vec<u8>,
    /// Say we speak our telemetry (only when the REQ offered it).
    pub telemetry: bool,
}

/// What the CM tells its consumer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmEvent {
    /// Passive: a REQ for the listener of token `listener`; answer with
    /// accept or reject.
    ConnectRequest {
        listener: u64,
        id: CommId,
        req: Box<Req>,
        from: Peer,
    },
    /// Active: the REP; move the QP to RTR and RTS, then establish.
    RepReceived { id: CommId, rep: Box<Rep> },
    /// Passive: the RTU came (or, active, establish sent it).
    Established { id: CommId },
    /// The peer rejected (`reason` from `wire::cm::rej`); the connection
    /// is gone (or in TIMEWAIT for a stale one).
    Rejected {
        id: CommId,
        reason: u16,
        rej: Box<Rej>,
    },
    /// The peer never answered (its retries ran out): gone.
    Unreachable { id: CommId },
    /// A DREQ came, or our DREQ was answered (or timed out).
    Disconnected { id: CommId, timed_out: bool },
    /// TIMEWAIT ended: the connection is gone.
    TimewaitExit { id: CommId },
    /// Passive: a SIDR_REQ for the listener of token `listener`; answer
    /// with `sidr_reply`.
    SidrRequest {
        listener: u64,
        id: CommId,
        req: Box<cm::SidrReq>,
        from: Peer,
    },
    /// Active: the SIDR_REP (its status says whether it resolved).
    SidrReply { id: CommId, rep: Box<cm::SidrRep> },
}

/// Why a consumer's call was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CmCallError {
    #[error("no connection {0:#x}")]
    NoConnection(CommId),
    #[error("connection {id:#x} is in {state}, not {need}")]
    WrongState {
        id: CommId,
        state: &'static str,
        need: &'static str,
    },
    #[error("service ID {0:#018x} has a listener already")]
    Listening(u64),
    #[error("{what} private data is {len} bytes, at most {max}")]
    PrivateData {
        what: &'static str,
        len: usize,
        max: usize,
    },
}

/// What the CM saw and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CmCounters {
    pub received: u64,
    pub sent: u64,
    pub retransmitted: u64,
    /// Not a CM message this CM reads (class, version, method,
    /// attribute: `wire::cm::CmError`), SIDR, LAP and APR among them.
    pub malformed: u64,
    pub unsupported: u64,
    /// For no connection of ours, or one in a state that does not take
    /// it (a late or duplicated message).
    pub unmatched: u64,
    pub duplicates: u64,
    /// REQs or REPs from a QP that still has a connection here (REJ
    /// STALE_CONN).
    pub stale: u64,
    /// REQs for a service nobody listens on (REJ INVALID_SERVICE_ID).
    pub no_listener: u64,
    pub rejects_sent: u64,
    pub rejects_received: u64,
    /// Requests whose retries ran out.
    pub timeouts: u64,
}

/// The connection manager of one device.
#[derive(Debug)]
pub struct Cm {
    cfg: CmConfig,
    next_id: u32,
    conns: HashMap<CommId, Conn>,
    listeners: HashMap<u64, u64>,
    /// Connections (not in TIMEWAIT) by the peer's (comm ID, CA GUID) and
    /// by its (QPN, CA GUID): duplicate and stale REQs.
    by_remote_id: HashMap<(CommId, u64), CommId>,
    by_remote_qpn: HashMap<(Qpn, u64), CommId>,
    events: VecDeque<CmEvent>,
    out: VecDeque<OutMad>,
    pub counters: CmCounters,
}

fn fill<const N: usize>(what: &'static str, data: &[u8]) -> Result<[u8; N], CmCallError> {
    if data.len() > N {
        return Err(CmCallError::PrivateData {
            what,
            len: data.len(),
            max: N,
        });
    }
    let mut a = [0u8; N];
    a[..data.len()].copy_from_slice(data);
    Ok(a)
}

/// The IPv4-mapped GID of an address.
pub fn gid_of(ip: Ipv4Addr) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&ip.octets());
    g
}

impl Cm {
    pub fn new(cfg: CmConfig) -> Self {
        Cm {
            cfg,
            next_id: 0,
            conns: HashMap::new(),
            listeners: HashMap::new(),
            by_remote_id: HashMap::new(),
            by_remote_qpn: HashMap::new(),
            events: VecDeque::new(),
            out: VecDeque::new(),
            counters: CmCounters::default(),
        }
    }

    pub fn config(&self) -> &CmConfig {
        &self.cfg
    }

    /// A communication ID no connection has (never 0).
    fn new_id(&mut self) -> CommId {
        loop {
            self.next_id = self.next_id.wrapping_add(1);
            let id = self.next_id.wrapping_mul(0x9E37_79B9) ^ self.cfg.id_seed;
            if id != 0 && !self.conns.contains_key(&id) {
                return id;
            }
        }
    }

    /// The TID of a request of connection `id`.
    fn tid(&self, id: CommId) -> u64 {
        u64::from(self.cfg.agent) << 32 | u64::from(id)
    }

    /// Listens on `service_id`; its connection requests carry `token`.
    pub fn listen(&mut self, service_id: u64, token: u64) -> Result<(), CmCallError> {
        if self.listeners.contains_key(&service_id) {
            return Err(CmCallError::Listening(service_id));
        }
        self.listeners.insert(service_id, token);
        Ok(())
    }

    /// Stops listening on `service_id`.
    pub fn unlisten(&mut self, service_id: u64) {
        self.listeners.remove(&service_id);
    }

    /// A connection's state.
    pub fn state(&self, id: CommId) -> Option<State> {
        self.conns.get(&id).map(|c| c.state)
    }

    /// Connections the CM holds (TIMEWAIT included).
    pub fn len(&self) -> usize {
        self.conns.len()
    }

    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }

    pub fn poll_event(&mut self) -> Option<CmEvent> {
        self.events.pop_front()
    }

    pub fn poll_mad(&mut self) -> Option<OutMad> {
        self.out.pop_front()
    }

    fn send(&mut self, to: Peer, mad: [u8; MAD_LEN]) {
        self.counters.sent += 1;
        self.out.push_back(OutMad {
            dest_ip: to.ip,
            dest_mac: to.mac,
            dest_qpn: GSI_QPN,
            qkey: GSI_QKEY,
            dscp: None,
            mad,
        });
    }

    /// Sends a request of connection `id` and waits for its answer.
    fn send_request(&mut self, now: u64, id: CommId, mad: [u8; MAD_LEN]) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let to = c.peer;
        c.pending = Some(Pending {
            mad: Box::new(mad),
            deadline: now.saturating_add(c.timeout_ns),
            timeout_ns: c.timeout_ns,
            retries_left: c.max_retries,
            mra_taken: false,
        });
        self.send(to, mad);
    }

    fn conn(&mut self, id: CommId, need: State) -> Result<&mut Conn, CmCallError> {
        let c = self
            .conns
            .get_mut(&id)
            .ok_or(CmCallError::NoConnection(id))?;
        if c.state != need {
            return Err(CmCallError::WrongState {
                id,
                state: c.state.name(),
                need: need.name(),
            });
        }
        Ok(c)
    }

    /// Active: sends a REQ; the answer comes as an event.
    pub fn connect(&mut self, now: u64, p: &ConnectParams) -> Result<CommId, CmCallError> {
        let private_data = fill("REQ", &p.private_data)?;
        let id = self.new_id();
        let ack = ack_timeout(self.cfg.ca_ack_delay, self.cfg.packet_life_time);
        let req = Req {
            local_comm_id: id,
            vendor_id: 0,
            service_id: p.service_id,
            local_ca_guid: self.cfg.node_guid,
            local_qkey: 0,
            local_qpn: p.qpn,
            responder_resources: p.responder_resources,
            local_eecn: 0,
            initiator_depth: p.initiator_depth,
            remote_eecn: 0,
            remote_cm_response_timeout: self.cfg.response_timeout,
            transport_service_type: p.transport,
            end_to_end_flow_control: p.flow_control,
            starting_psn: p.starting_psn & 0xFF_FFFF,
            local_cm_response_timeout: self.cfg.response_timeout,
            retry_count: p.retry_count.min(7),
            pkey: 0xFFFF,
            path_mtu: p.path_mtu,
            rdc_exists: false,
            rnr_retry_count: p.rnr_retry_count.min(7),
            max_cm_retries: self.cfg.max_retries,
            srq: p.srq,
            extended_transport_type: 0,
            primary: CmPath {
                local_lid: 0xFFFF,
                remote_lid: 0xFFFF,
                local_gid: gid_of(self.cfg.ip),
                remote_gid: gid_of(p.peer.ip),
                flow_label: p.flow_label & 0xF_FFFF,
                packet_rate: 7,
                traffic_class: p.traffic_class,
                hop_limit: 64,
                sl: 0,
                subnet_local: false,
                local_ack_timeout: ack,
            },
            alternate: CmPath {
                local_gid: if p.telemetry {
                    let mut g = [0u8; 16];
                    g[..4].copy_from_slice(&REQ_MARK);
                    g[4] = REQ_MARK_VERSION;
                    g[5] = CAP_TELEMETRY;
                    g
                } else {
                    [0; 16]
                },
                ..CmPath::default()
            },
            sap_supported: false,
            private_data,
        };
        // Linux: twice the packet lifetime plus the peer's response time.
        let timeout_ns =
            2 * exp_to_ns(self.cfg.packet_life_time) + exp_to_ns(self.cfg.response_timeout);
        let tid = self.tid(id);
        self.conns.insert(
            id,
            Conn {
                local_qpn: p.qpn,
                ack_timeout: ack,
                timeout_ns,
                max_retries: self.cfg.max_retries,
                ..Conn::new(id, State::ReqSent, p.peer, tid, p.service_id)
            },
        );
        let mad = CmMsg::Req(Box::new(req)).emit(tid);
        self.send_request(now, id, mad);
        Ok(id)
    }

    /// Active SIDR: asks the peer which UD QP serves `service_id`
    /// (`private`: rdma_cm's header and the application's data, at most
    /// 216 bytes); the answer comes as [`CmEvent::SidrReply`], or
    /// [`CmEvent::Unreachable`] when the retries run out.
    pub fn resolve(
        &mut self,
        now: u64,
        to: Peer,
        service_id: u64,
        private: &[u8],
    ) -> Result<CommId, CmCallError> {
        let private_data = fill("SIDR_REQ", private)?;
        let id = self.new_id();
        let tid = self.tid(id);
        self.conns.insert(
            id,
            Conn {
                timeout_ns: exp_to_ns(self.cfg.response_timeout),
                max_retries: self.cfg.max_retries,
                ..Conn::new(id, State::SidrReqSent, to, tid, service_id)
            },
        );
        let req = cm::SidrReq {
            request_id: id,
            pkey: 0xFFFF,
            service_id,
            private_data,
        };
        let mad = CmMsg::SidrReq(Box::new(req)).emit(tid);
        self.send_request(now, id, mad);
        Ok(id)
    }

    /// Passive SIDR: answers the SIDR_REQ of `id` with `status`
    /// (`wire::cm::sidr`), the UD QP and its Q_Key; the request is done.
    pub fn sidr_reply(
        &mut self,
        id: CommId,
        status: u8,
        qpn: Qpn,
        qkey: u32,
        private: &[u8],
    ) -> Result<(), CmCallError> {
        let private_data = fill("SIDR_REP", private)?;
        let c = self.conn(id, State::SidrReqRcvd)?;
        let rep = cm::SidrRep {
            request_id: c.remote_id,
            status,
            info_length: 0,
            vendor_id: 0,
            qpn,
            service_id: c.service_id,
            qkey,
            info: [0; cm::SIDR_REP_INFO],
            private_data,
        };
        let (to, tid) = (c.peer, c.tid);
        self.send(to, CmMsg::SidrRep(Box::new(rep)).emit(tid));
        self.forget(id);
        Ok(())
    }

    /// Passive: accepts the REQ of `id` with a REP (the QP is in RTS).
    pub fn accept(&mut self, now: u64, id: CommId, p: &AcceptParams) -> Result<(), CmCallError> {
        let private_data = fill("REP", &p.private_data)?;
        let guid = self.cfg.node_guid;
        let ack_delay = self.cfg.ca_ack_delay;
        let c = self.conn(id, State::ReqRcvd)?;
        c.local_qpn = p.qpn;
        c.state = State::RepSent;
        let rep = Rep {
            local_comm_id: id,
            remote_comm_id: c.remote_id,
            local_qkey: 0,
            local_qpn: p.qpn,
            vendor_id: 0,
            local_eecn: 0,
            starting_psn: p.starting_psn & 0xFF_FFFF,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            target_ack_delay: ack_delay,
            failover_accepted: 0,
            end_to_end_flow_control: p.flow_control,
            rnr_retry_count: p.rnr_retry_count.min(7),
            srq: p.srq,
            reserved_flags: if p.telemetry { cm::REP_TELEMETRY } else { 0 },
            local_ca_guid: guid,
            private_data,
        };
        let mad = CmMsg::Rep(Box::new(rep)).emit(c.tid);
        self.send_request(now, id, mad);
        Ok(())
    }

    /// Active: the QP is in RTS after the REP; sends the RTU.
    pub fn establish(&mut self, id: CommId) -> Result<(), CmCallError> {
        let c = self.conn(id, State::RepRcvd)?;
        c.state = State::Established;
        let rtu = Rtu {
            local_comm_id: id,
            remote_comm_id: c.remote_id,
            private_data: [0; cm::RTU_PRIVATE],
        };
        let (to, tid) = (c.peer, c.tid);
        self.send(to, CmMsg::Rtu(Box::new(rtu)).emit(tid));
        self.events.push_back(CmEvent::Established { id });
        Ok(())
    }

    /// Rejects the REQ (passive) or the REP (active) of `id` with
    /// `reason`; the connection is gone.
    pub fn reject(&mut self, id: CommId, reason: u16, private: &[u8]) -> Result<(), CmCallError> {
        let private_data = fill("REJ", private)?;
        let c = self.conns.get(&id).ok_or(CmCallError::NoConnection(id))?;
        let rejected = match c.state {
            State::ReqRcvd => cm::msg::REQ,
            State::RepRcvd => cm::msg::REP,
            s => {
                return Err(CmCallError::WrongState {
                    id,
                    state: s.name(),
                    need: "REQ_RCVD or REP_RCVD",
                })
            }
        };
        let rej = Rej {
            // Linux names itself only once it has answered the REQ.
            local_comm_id: if c.state == State::ReqRcvd { 0 } else { id },
            remote_comm_id: c.remote_id,
            message_rejected: rejected,
            ari_length: 0,
            reason,
            ari: [0; cm::REJ_ARI],
            private_data,
        };
        let (to, tid) = (c.peer, c.tid);
        self.counters.rejects_sent += 1;
        self.send(to, CmMsg::Rej(Box::new(rej)).emit(tid));
        self.forget(id);
        Ok(())
    }

    /// Disconnects `id`: a DREQ from ESTABLISHED, the DREP from
    /// DREQ_RCVD (the peer asked first); in any other state nothing goes
    /// on the wire (as rdma_disconnect).
    pub fn disconnect(&mut self, now: u64, id: CommId) -> Result<(), CmCallError> {
        let c = self.conns.get(&id).ok_or(CmCallError::NoConnection(id))?;
        match c.state {
            State::Established => {
                self.send_dreq(now, id);
                Ok(())
            }
            State::DreqRcvd => {
                self.send_drep(now, id);
                Ok(())
            }
            s => Err(CmCallError::WrongState {
                id,
                state: s.name(),
                need: "ESTABLISHED or DREQ_RCVD",
            }),
        }
    }

    fn send_dreq(&mut self, now: u64, id: CommId) {
        let tid = self.tid(id);
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.state = State::DreqSent;
        let dreq = Dreq {
            local_comm_id: id,
            remote_comm_id: c.remote_id,
            remote_qpn: c.remote_qpn,
            private_data: [0; cm::DREQ_PRIVATE],
        };
        let mad = CmMsg::Dreq(Box::new(dreq)).emit(tid);
        self.send_request(now, id, mad);
    }

    fn send_drep(&mut self, now: u64, id: CommId) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        let drep = Drep {
            local_comm_id: id,
            remote_comm_id: c.remote_id,
            private_data: [0; cm::DREP_PRIVATE],
        };
        let (to, tid) = (c.peer, c.dreq_tid);
        self.send(to, CmMsg::Drep(Box::new(drep)).emit(tid));
        self.enter_timewait(now, id);
    }

    /// The consumer is done with `id` (rdma_destroy_id): what Linux's
    /// `cm_destroy_id` sends from each state, then the connection goes
    /// (through TIMEWAIT when it was connected).
    pub fn destroy(&mut self, now: u64, id: CommId) {
        let Some(c) = self.conns.get(&id).cloned() else {
            return;
        };
        match c.state {
            State::Established => {
                self.send_dreq(now, id);
                self.enter_timewait(now, id);
            }
            State::DreqRcvd => self.send_drep(now, id),
            State::DreqSent => self.enter_timewait(now, id),
            State::ReqSent | State::ReqRcvd | State::RepSent | State::RepRcvd => {
                let (reason, ari_guid) = if c.state == State::ReqSent {
                    (cm::rej::TIMEOUT, Some(self.cfg.node_guid))
                } else {
                    (cm::rej::CONSUMER_DEFINED, None)
                };
                let mut ari = [0u8; cm::REJ_ARI];
                if let Some(g) = ari_guid {
                    ari[..8].copy_from_slice(&g.to_be_bytes());
                }
                let rej = Rej {
                    local_comm_id: if c.state == State::ReqRcvd { 0 } else { id },
                    remote_comm_id: c.remote_id,
                    message_rejected: match c.state {
                        State::ReqRcvd => cm::msg::REQ,
                        State::RepRcvd => cm::msg::REP,
                        _ => cm::msg::OTHER,
                    },
                    ari_length: if ari_guid.is_some() { 8 } else { 0 },
                    reason,
                    ari,
                    private_data: [0; cm::REJ_PRIVATE],
                };
                let (to, tid) = (c.peer, c.tid);
                self.counters.rejects_sent += 1;
                self.send(to, CmMsg::Rej(Box::new(rej)).emit(tid));
                if c.state == State::RepSent {
                    // Its QP was in RTS already: TIMEWAIT protects it.
                    self.enter_timewait(now, id);
                } else {
                    self.forget(id);
                }
            }
            State::TimeWait => {}
            State::SidrReqSent => self.forget(id),
            State::SidrReqRcvd => {
                let _ = self.sidr_reply(id, cm::sidr::REJECT, 0, 0, &[]);
            }
        }
        // A destroyed connection's events are of no one's interest.
        if let Some(c) = self.conns.get_mut(&id) {
            c.listener = None;
        }
    }

    /// Drops a connection and its entries in the duplicate tables.
    fn forget(&mut self, id: CommId) {
        self.unindex(id);
        self.conns.remove(&id);
    }

    fn unindex(&mut self, id: CommId) {
        self.by_remote_id.retain(|_, v| *v != id);
        self.by_remote_qpn.retain(|_, v| *v != id);
    }

    /// Enters TIMEWAIT: the connection leaves the duplicate tables and
    /// goes after the path's ACK timeout.
    fn enter_timewait(&mut self, now: u64, id: CommId) {
        self.unindex(id);
        if let Some(c) = self.conns.get_mut(&id) {
            c.state = State::TimeWait;
            c.pending = None;
            c.timewait_until = Some(now.saturating_add(exp_to_ns(c.ack_timeout)));
        }
    }

    /// The earliest deadline (a retransmission or a TIMEWAIT's end).
    pub fn poll_timeout(&self) -> Option<u64> {
        self.conns.values().filter_map(Conn::deadline).min()
    }

    /// Runs the deadlines due at `now`.
    pub fn on_timeout(&mut self, now: u64) {
        let due: Vec<CommId> = self
            .conns
            .values()
            .filter(|c| c.deadline().is_some_and(|d| d <= now))
            .map(|c| c.local_id)
            .collect();
        for id in due {
            self.timeout(now, id);
        }
    }

    fn timeout(&mut self, now: u64, id: CommId) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if c.timewait_until.is_some_and(|t| t <= now) {
            self.conns.remove(&id);
            self.events.push_back(CmEvent::TimewaitExit { id });
            return;
        }
        let Some(p) = c.pending.as_mut().filter(|p| p.deadline <= now) else {
            return;
        };
        if p.retries_left > 0 {
            p.retries_left -= 1;
            p.deadline = now.saturating_add(p.timeout_ns);
            let (to, mad) = (c.peer, *p.mad);
            self.counters.retransmitted += 1;
            self.send(to, mad);
            return;
        }
        self.counters.timeouts += 1;
        c.pending = None;
        match c.state {
            State::DreqSent => {
                self.enter_timewait(now, id);
                self.events.push_back(CmEvent::Disconnected {
                    id,
                    timed_out: true,
                });
            }
            _ => {
                self.forget(id);
                self.events.push_back(CmEvent::Unreachable { id });
            }
        }
    }

    /// A MAD of the CM's class from QP1.
    pub fn on_mad(&mut self, now: u64, m: &ReceivedMad) {
        self.counters.received += 1;
        let (h, msg) = match CmMsg::parse(&m.mad) {
            Ok(x) => x,
            Err(cm::CmError::Attribute(a)) if a != 0 && a <= cm::attr::APR => {
                self.counters.unsupported += 1;
                return;
            }
            Err(_) => {
                self.counters.malformed += 1;
                return;
            }
        };
        let from = Peer {
            ip: m.src_ip,
            mac: m.src_mac,
        };
        recv::handle(self, now, h.tid, from, msg);
    }
}

/// The CM takes the Sends of its class (0x07, version 2) from the MAD
/// agents' dispatch; what it sends leaves through `out`.
impl MadAgent for Cm {
    fn registration(&self) -> Registration {
        Registration {
            mgmt_class: crate::wire::mad::class::CM,
            class_version: cm::CLASS_VERSION,
            methods: &[method::SEND],
        }
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }

    fn on_mad(&mut self, now: u64, m: &ReceivedMad, out: &mut Vec<OutMad>) {
        Cm::on_mad(self, now, m);
        out.extend(self.out.drain(..));
    }
}
