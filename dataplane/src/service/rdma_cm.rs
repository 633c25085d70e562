//! The rdma_cm layer over each device's connection manager (what Linux's
//! `cma.c` is over `cm.c`): the sessions of `librdmacm.so.1` and their
//! ids, address resolution through the NIC's neighbour table, the
//! rdma_cm private-data header and service IDs on the wire, the checks a
//! listener makes of a REQ, and the CM's events turned into rdma_cm's,
//! pushed on the ids' event channels ([`shm::cma`] is the contract).
//!
//! QPs are not moved here: the library moves them with what the events
//! carry (`shm::cma::CmPath`), as rdma-core's does with the kernel's
//! `rdma_init_qp_attr`. What is decided here is whether a connection
//! runs our telemetry: a REQ offers it when the device runs an HPCC++
//! mode, a REP of ours takes it, and the peer QP is then remembered so
//! that the QP's RTR keeps its HPCC++ mode ([`RdmaCm::take_negotiated`]).

use std::collections::HashMap;
use std::net::Ipv4Addr;

use shm::cma::{
    CmAcceptReq, CmConnParams, CmConnectReq, CmEventMsg, CmEventType, CmId, CmListenAddr, CmPath,
    DAEMON_ID,
};
use shm::proto::{ErrorKind, ErrorReply, QpType, Reply, Request};
use transport::cm::{
    rep_speaks_telemetry, req_offers_telemetry, AcceptParams, CmCallError, CmEvent, CommId,
    ConnectParams, Peer,
};
use transport::wire::cm::{self as wcm, rej, service_id, sidr, CmaHeader, PortSpace};

use super::control::ConnId;
use super::Service;

type Answer = Result<(Reply, Vec<std::os::fd::OwnedFd>), ErrorReply>;

fn err(kind: ErrorKind, msg: impl Into<String>) -> ErrorReply {
    ErrorReply::new(kind, msg)
}

fn done(r: Reply) -> Answer {
    Ok((r, Vec::new()))
}

/// The rdma_cm port space numbered `ps` (`RDMA_PS_*`), or an error
/// naming it.
fn port_space(ps: u16) -> Result<PortSpace, ErrorReply> {
    PortSpace::from_number(ps).ok_or_else(|| {
        err(
            ErrorKind::InvalidArgument,
            format!("port space {ps:#x} is not rdma_cm's"),
        )
    })
}

fn refused(e: CmCallError) -> ErrorReply {
    err(ErrorKind::InvalidArgument, e.to_string())
}

/// Ports the daemon picks for port 0 (Linux's default local port range).
const EPHEMERAL: std::ops::Range<u16> = 32768..60999;

/// `ETIMEDOUT`, negated as rdma_cm reports it in an event's status.
const NEG_ETIMEDOUT: i32 = -110;

/// The IBA MTU code of a path MTU in bytes (1: 256 .. 5: 4096).
fn mtu_code(bytes: u32) -> u8 {
    (bytes.clamp(256, 4096).ilog2() - 7) as u8
}

/// The path MTU in bytes of an IBA code (256 for anything unknown).
fn mtu_bytes(code: u8) -> u32 {
    match code {
        1..=5 => 128 << code,
        _ => 256,
    }
}

/// One rdma_cm id of a session.
#[derive(Debug)]
struct CmaId {
    channel: u64,
    port_space: u16,
    /// Its own port (bound, listened on or picked at resolution).
    port: u16,
    role: Role,
}

#[derive(Debug)]
enum Role {
    Idle,
    Listening {
        service_id: u64,
        token: u64,
        ip: Option<Ipv4Addr>,
    },
    Resolving,
    /// A connection (or SIDR exchange) of the device's CM.
    Comm {
        comm: CommId,
        active: bool,
        ud: bool,
        /// The path as the events report it.
        path: CmPath,
    },
}

/// An application's ids on one device.
#[derive(Debug)]
struct Session {
    host: usize,
    ids: HashMap<CmId, CmaId>,
    next_child: u32,
}

/// An address being resolved for an id.
#[derive(Debug, Clone, Copy)]
struct Resolving {
    session: ConnId,
    id: CmId,
    dst: Ipv4Addr,
    deadline: u64,
}

/// What the layer counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RdmaCmCounters {
    /// Connection requests refused by the listener's checks (no rdma_cm
    /// header, another transport, another address).
    pub requests_refused: u64,
    pub events: u64,
    /// CM events for an id that no longer exists.
    pub events_unclaimed: u64,
    pub addr_resolved: u64,
    pub addr_errors: u64,
    /// Connections whose REQ and REP agreed on our telemetry.
    pub telemetry_negotiated: u64,
}

/// The rdma_cm state of one lcore.
#[derive(Debug, Default)]
pub struct RdmaCm {
    sessions: HashMap<ConnId, Session>,
    /// Which id each CM connection belongs to, per host.
    owners: HashMap<(usize, CommId), (ConnId, CmId)>,
    /// Listener tokens (what the CM's ConnectRequest names).
    listeners: HashMap<u64, (ConnId, CmId)>,
    next_token: u64,
    resolving: Vec<Resolving>,
    /// (our device's address, the peer's address, the peer's QPN) of
    /// connections that negotiated our telemetry, until the QP's RTR
    /// takes the mark or the connection ends (QP numbers are reused), and
    /// the id each belongs to.
    negotiated: HashMap<(Ipv4Addr, Ipv4Addr, u32), (ConnId, CmId)>,
    next_port: u16,
    /// Events for the event channels, sent by the lcore after its pass.
    pub outbox: Vec<(u64, CmEventMsg)>,
    /// Per host (index in the lcore's hosts).
    counters: HashMap<usize, RdmaCmCounters>,
}

impl RdmaCm {
    /// Whether a connection of our device at `local` with the peer QP
    /// `(peer, peer_qpn)` negotiated our telemetry; the mark is taken
    /// (the QP moving to RTR is the one the connection was made for).
    pub fn take_negotiated(&mut self, local: Ipv4Addr, peer: Ipv4Addr, peer_qpn: u32) -> bool {
        self.negotiated.remove(&(local, peer, peer_qpn)).is_some()
    }

    /// Forgets the marks of id `cid` of `session` (its connection ended).
    fn forget_negotiated(&mut self, session: ConnId, cid: CmId) {
        self.negotiated.retain(|_, owner| *owner != (session, cid));
    }

    /// Host `host`'s sessions, their ids and its counters.
    pub fn of_host(&self, host: usize) -> (usize, usize, RdmaCmCounters) {
        let mine = || self.sessions.values().filter(|s| s.host == host);
        let ids = mine().map(|s| s.ids.len()).sum();
        let c = self.counters.get(&host).copied().unwrap_or_default();
        (mine().count(), ids, c)
    }

    fn count(&mut self, host: usize) -> &mut RdmaCmCounters {
        self.counters.entry(host).or_default()
    }

    /// The soonest resolution deadline.
    pub fn next_deadline(&self) -> Option<u64> {
        self.resolving.iter().map(|r| r.deadline).min()
    }

    fn next_ephemeral(&mut self) -> u16 {
        if !EPHEMERAL.contains(&self.next_port) {
            self.next_port = EPHEMERAL.start + (std::process::id() % 1000) as u16;
        }
        let p = self.next_port;
        self.next_port += 1;
        p
    }

    fn push(&mut self, channel: u64, ev: CmEventMsg) {
        if let Some(h) = self.sessions.get(&ev.session).map(|s| s.host) {
            self.count(h).events += 1;
        }
        self.outbox.push((channel, ev));
    }
}

/// An event of an id with nothing but its type and status.
fn bare(session: ConnId, id: CmId, event: CmEventType, status: i32) -> CmEventMsg {
    CmEventMsg {
        session,
        id,
        listener: None,
        event,
        status,
        private_data: Vec::new(),
        conn: CmConnParams::default(),
        path: None,
    }
}

impl Service {
    /// Whether `req` is an rdma_cm request this layer answers.
    pub(super) fn is_cm_request(req: &Request) -> bool {
        matches!(
            req,
            Request::CmChannel
                | Request::CmOpen { .. }
                | Request::CmBind { .. }
                | Request::CmListen { .. }
                | Request::CmResolveAddr { .. }
                | Request::CmConnect(_)
                | Request::CmAccept(_)
                | Request::CmEstablish { .. }
                | Request::CmReject { .. }
                | Request::CmMigrate { .. }
                | Request::CmDisconnect { .. }
                | Request::CmDestroyId { .. }
        )
    }

    pub(super) fn cm_request(&mut self, conn: ConnId, req: Request) -> Answer {
        let now = self.clock.now_ns();
        match req {
            Request::CmChannel => return done(Reply::CmChannel { channel: conn }),
            Request::CmOpen { device } => return self.cm_open(conn, &device),
            _ => {}
        }
        if !self.cma.sessions.contains_key(&conn) {
            return Err(err(
                ErrorKind::NotOpen,
                "open an rdma_cm session (CmOpen) before any other rdma_cm request",
            ));
        }
        match req {
            Request::CmBind {
                id,
                channel,
                port_space,
                addr,
            } => self.cm_bind(conn, id, channel, port_space, addr),
            Request::CmListen {
                id,
                channel,
                port_space,
                addr,
            } => self.cm_listen(conn, id, channel, port_space, addr),
            Request::CmResolveAddr {
                id,
                channel,
                port_space,
                src_port,
                dst,
                timeout_ms,
            } => self.cm_resolve(
                conn, id, channel, port_space, src_port, dst, timeout_ms, now,
            ),
            Request::CmConnect(c) => self.cm_connect(conn, &c, now),
            Request::CmAccept(a) => self.cm_accept(conn, &a, now),
            Request::CmEstablish { id } => {
                let (host, comm, _) = self.comm_of(conn, id)?;
                self.hosts[host].cm().establish(comm).map_err(refused)?;
                done(Reply::Done)
            }
            Request::CmReject {
                id,
                private_data,
                reason,
            } => {
                let (host, comm, ud) = self.comm_of(conn, id)?;
                let cm = self.hosts[host].cm();
                if ud {
                    cm.sidr_reply(comm, sidr::REJECT, 0, 0, &private_data)
                } else {
                    let reason = reason.unwrap_or(rej::CONSUMER_DEFINED);
                    cm.reject(comm, reason, &private_data)
                }
                .map_err(refused)?;
                done(Reply::Done)
            }
            Request::CmMigrate { id, channel } => {
                let s = self.cma.sessions.get_mut(&conn).expect("checked");
                let i = s.ids.get_mut(&id).ok_or_else(|| {
                    err(ErrorKind::InvalidArgument, format!("no rdma_cm id {id}"))
                })?;
                i.channel = channel;
                done(Reply::Done)
            }
            Request::CmDisconnect { id } => {
                let (host, comm, _) = self.comm_of(conn, id)?;
                self.hosts[host]
                    .cm()
                    .disconnect(now, comm)
                    .map_err(refused)?;
                done(Reply::Done)
            }
            Request::CmDestroyId { id } => {
                if !self.cm_destroy_id(conn, id, now) {
                    return Err(err(
                        ErrorKind::InvalidArgument,
                        format!("no rdma_cm id {id}"),
                    ));
                }
                done(Reply::Done)
            }
            _ => unreachable!("is_cm_request"),
        }
    }

    fn cm_open(&mut self, conn: ConnId, device: &str) -> Answer {
        if self.cma.sessions.contains_key(&conn) || self.apps.contains_key(&conn) {
            return Err(err(
                ErrorKind::AlreadyOpen,
                "this connection has a device or rdma_cm session open",
            ));
        }
        // The CM of a QP-sharded device is its shard 0's (its QP1).
        let Some(host) = (0..self.hosts.len())
            .find(|&h| self.hosts[h].spec.name == device && self.hosts[h].qp_shard == 0)
        else {
            let names: Vec<&str> = self.peers.iter().map(|h| h.name.as_str()).collect();
            return Err(err(
                ErrorKind::NoSuchDevice,
                format!("no device {device:?} (the daemon has {})", names.join(", ")),
            ));
        };
        self.cma.sessions.insert(
            conn,
            Session {
                host,
                ids: HashMap::new(),
                next_child: 0,
            },
        );
        done(Reply::CmOpened {
            session: conn,
            ip: self.hosts[host].spec.ip,
            max_mtu: self.cfg.max_mtu.bytes(),
        })
    }

    /// The session's host and id `id`, which must exist or be new.
    fn session_id(&mut self, conn: ConnId, id: CmId, channel: u64, ps: u16) -> &mut CmaId {
        let s = self.cma.sessions.get_mut(&conn).expect("checked");
        s.ids.entry(id).or_insert(CmaId {
            channel,
            port_space: ps,
            port: 0,
            role: Role::Idle,
        })
    }

    /// Whether `port` of port space `ps` is taken on `host`: listened on
    /// or bound by an id.
    fn port_taken(&self, host: usize, ps: u16, port: u16) -> bool {
        self.cma
            .sessions
            .values()
            .filter(|s| s.host == host)
            .any(|s| {
                s.ids.values().any(|i| {
                    i.port_space == ps && i.port == port && !matches!(i.role, Role::Comm { .. })
                })
            })
    }

    /// A port of `ps` on `host` no listener or bound id has.
    fn free_port(&mut self, host: usize, ps: u16) -> Option<u16> {
        (0..EPHEMERAL.len()).find_map(|_| {
            let p = self.cma.next_ephemeral();
            (!self.port_taken(host, ps, p)).then_some(p)
        })
    }

    fn cm_bind(
        &mut self,
        conn: ConnId,
        id: CmId,
        channel: u64,
        ps: u16,
        addr: CmListenAddr,
    ) -> Answer {
        port_space(ps)?;
        let host = self.cma.sessions[&conn].host;
        let dev_ip = self.hosts[host].spec.ip;
        if let Some(ip) = addr.ip.filter(|&ip| ip != dev_ip) {
            return Err(err(
                ErrorKind::AddrNotAvailable,
                format!(
                    "{ip} is not the address of {} ({dev_ip})",
                    self.hosts[host].spec.name
                ),
            ));
        }
        if self.cma.sessions[&conn].ids.contains_key(&id) {
            return Err(err(
                ErrorKind::InvalidArgument,
                format!("rdma_cm id {id} is bound already"),
            ));
        }
        let port = if addr.port == 0 {
            self.free_port(host, ps)
                .ok_or_else(|| err(ErrorKind::AddrInUse, "no free port to bind"))?
        } else if self.port_taken(host, ps, addr.port) {
            return Err(err(
                ErrorKind::AddrInUse,
                format!(
                    "port {} of port space {ps:#x} is taken on {dev_ip}",
                    addr.port
                ),
            ));
        } else {
            addr.port
        };
        let i = self.session_id(conn, id, channel, ps);
        i.port = port;
        done(Reply::CmPort { port })
    }

    fn cm_listen(
        &mut self,
        conn: ConnId,
        id: CmId,
        channel: u64,
        ps: u16,
        addr: CmListenAddr,
    ) -> Answer {
        let space = port_space(ps)?;
        let host = self.cma.sessions[&conn].host;
        let dev_ip = self.hosts[host].spec.ip;
        if let Some(ip) = addr.ip.filter(|&ip| ip != dev_ip) {
            return Err(err(
                ErrorKind::AddrNotAvailable,
                format!(
                    "{ip} is not the address of {} ({dev_ip})",
                    self.hosts[host].spec.name
                ),
            ));
        }
        if self.cma.sessions[&conn]
            .ids
            .get(&id)
            .is_some_and(|i| !matches!(i.role, Role::Idle))
        {
            return Err(err(
                ErrorKind::InvalidArgument,
                format!("rdma_cm id {id} is listening or connected already"),
            ));
        }
        let token = self.cma.next_token;
        self.cma.next_token += 1;
        let own_port = self.cma.sessions[&conn].ids.get(&id).map(|i| i.port);
        if addr.port != 0 && own_port != Some(addr.port) && self.port_taken(host, ps, addr.port) {
            return Err(err(
                ErrorKind::AddrInUse,
                format!(
                    "port {} of port space {ps:#x} is taken on {dev_ip}",
                    addr.port
                ),
            ));
        }
        let port = if addr.port != 0 {
            let sid = service_id(space, addr.port);
            self.hosts[host].cm().listen(sid, token).map_err(|_| {
                err(
                    ErrorKind::AddrInUse,
                    format!(
                        "port {} of port space {ps:#x} has a listener on {dev_ip}",
                        addr.port
                    ),
                )
            })?;
            addr.port
        } else {
            let p = self
                .free_port(host, ps)
                .ok_or_else(|| err(ErrorKind::AddrInUse, "no free port to listen on"))?;
            self.hosts[host]
                .cm()
                .listen(service_id(space, p), token)
                .map_err(|e| err(ErrorKind::AddrInUse, e.to_string()))?;
            p
        };
        self.cma.listeners.insert(token, (conn, id));
        let i = self.session_id(conn, id, channel, ps);
        i.channel = channel;
        i.port_space = ps;
        i.port = port;
        i.role = Role::Listening {
            service_id: service_id(space, port),
            token,
            ip: addr.ip,
        };
        done(Reply::CmPort { port })
    }

    #[allow(clippy::too_many_arguments)]
    fn cm_resolve(
        &mut self,
        conn: ConnId,
        id: CmId,
        channel: u64,
        ps: u16,
        src_port: u16,
        dst: Ipv4Addr,
        timeout_ms: u32,
        now: u64,
    ) -> Answer {
        port_space(ps)?;
        if dst.is_unspecified() || dst.is_broadcast() {
            return Err(err(
                ErrorKind::InvalidArgument,
                format!("{dst} is not an address to resolve"),
            ));
        }
        let port = if src_port == 0 {
            self.cma.next_ephemeral()
        } else {
            src_port
        };
        let i = self.session_id(conn, id, channel, ps);
        if !matches!(i.role, Role::Idle | Role::Resolving) {
            return Err(err(
                ErrorKind::InvalidArgument,
                format!("rdma_cm id {id} is listening or connected already"),
            ));
        }
        i.channel = channel;
        i.port_space = ps;
        i.port = port;
        i.role = Role::Resolving;
        self.cma
            .resolving
            .retain(|r| (r.session, r.id) != (conn, id));
        self.cma.resolving.push(Resolving {
            session: conn,
            id,
            dst,
            deadline: now.saturating_add(u64::from(timeout_ms.max(1)) * 1_000_000),
        });
        self.cm_resolve_pass(now);
        done(Reply::CmPort { port })
    }

    /// Looks at the addresses being resolved: ADDR_RESOLVED for those
    /// whose MAC is known (the daemon's own devices at once), ADDR_ERROR
    /// for those past their timeout or given up on by ARP.
    pub(super) fn cm_resolve_pass(&mut self, now: u64) {
        if self.cma.resolving.is_empty() {
            return;
        }
        let mut left = Vec::new();
        for r in std::mem::take(&mut self.cma.resolving) {
            let Some(host) = self.cma.sessions.get(&r.session).map(|s| s.host) else {
                continue;
            };
            // The daemon's own devices need no ARP.
            let own = self.peers.iter().any(|h| h.ip == r.dst);
            let answer = if own {
                Some(true)
            } else {
                match self.hosts[host].nic.resolve_neighbour(r.dst, now) {
                    nic::Resolution::Known(_) => Some(true),
                    nic::Resolution::Failed => Some(false),
                    _ if now >= r.deadline => Some(false),
                    _ => None,
                }
            };
            let Some(ok) = answer else {
                left.push(r);
                continue;
            };
            let Some(i) = self
                .cma
                .sessions
                .get_mut(&r.session)
                .and_then(|s| s.ids.get_mut(&r.id))
            else {
                continue;
            };
            i.role = Role::Idle;
            let channel = i.channel;
            let ev = if ok {
                self.cma.count(host).addr_resolved += 1;
                bare(r.session, r.id, CmEventType::AddrResolved, 0)
            } else {
                self.cma.count(host).addr_errors += 1;
                bare(r.session, r.id, CmEventType::AddrError, NEG_ETIMEDOUT)
            };
            self.cma.push(channel, ev);
        }
        self.cma.resolving.extend(left);
    }

    fn cm_connect(&mut self, conn: ConnId, c: &CmConnectReq, now: u64) -> Answer {
        let space = port_space(c.port_space)?;
        let host = self.cma.sessions[&conn].host;
        if self.cma.sessions[&conn]
            .ids
            .get(&c.id)
            .is_some_and(|i| !matches!(i.role, Role::Idle))
        {
            return Err(err(
                ErrorKind::InvalidArgument,
                format!(
                    "rdma_cm id {} is listening, resolving or connected already",
                    c.id
                ),
            ));
        }
        let local_ip = self.hosts[host].spec.ip;
        let header = CmaHeader {
            src_port: c.src_port,
            src: local_ip,
            dst: c.dst,
        };
        let mut private = vec![0u8; CmaHeader::LEN];
        header.emit(&mut private);
        private.extend_from_slice(&c.private_data);
        let peer = Peer {
            ip: c.dst,
            mac: self.neighbour(host, c.dst),
        };
        let sid = service_id(space, c.dst_port);
        let mtu = self.cfg.max_mtu.bytes();
        let telemetry = self.cfg.cc.uses_telemetry();
        let ud = c.qp_type == QpType::Ud;
        let cm = self.hosts[host].cm();
        let ack_timeout = c.ack_timeout.unwrap_or_else(|| {
            let cfg = cm.config();
            transport::cm::ack_timeout(cfg.ca_ack_delay, cfg.packet_life_time)
        });
        let comm = if ud {
            cm.resolve(now, peer, sid, &private).map_err(refused)?
        } else {
            if private.len() > wcm::REQ_PRIVATE {
                return Err(err(
                    ErrorKind::InvalidArgument,
                    format!(
                        "REQ private data is {} bytes, at most {}",
                        c.private_data.len(),
                        wcm::REQ_PRIVATE - CmaHeader::LEN
                    ),
                ));
            }
            cm.connect(
                now,
                &ConnectParams {
                    peer,
                    service_id: sid,
                    qpn: c.qpn,
                    starting_psn: c.starting_psn & 0xFF_FFFF,
                    path_mtu: mtu_code(mtu),
                    responder_resources: c.conn.responder_resources,
                    initiator_depth: c.conn.initiator_depth,
                    retry_count: c.conn.retry_count.min(7),
                    rnr_retry_count: c.conn.rnr_retry_count.min(7),
                    srq: c.conn.srq,
                    flow_control: c.conn.flow_control,
                    transport: if c.qp_type == QpType::Uc { 1 } else { 0 },
                    traffic_class: c.traffic_class,
                    flow_label: 0,
                    private_data: private,
                    telemetry,
                },
            )
            .map_err(refused)?
        };
        self.cma.owners.insert((host, comm), (conn, c.id));
        let i = self.session_id(conn, c.id, c.channel, c.port_space);
        i.channel = c.channel;
        i.port = c.src_port;
        i.role = Role::Comm {
            comm,
            active: true,
            ud,
            path: CmPath {
                local_ip,
                local_port: c.src_port,
                peer_ip: c.dst,
                peer_port: c.dst_port,
                peer_psn: 0,
                mtu,
                ack_timeout,
                traffic_class: c.traffic_class,
                qkey: 0,
                telemetry: false,
            },
        };
        done(Reply::Done)
    }

    fn cm_accept(&mut self, conn: ConnId, a: &CmAcceptReq, now: u64) -> Answer {
        let host = self.cma.sessions[&conn].host;
        let Some(CmaId {
            role:
                Role::Comm {
                    comm,
                    active: false,
                    ud,
                    path,
                },
            ..
        }) = self.cma.sessions[&conn].ids.get(&a.id)
        else {
            return Err(err(
                ErrorKind::InvalidArgument,
                format!("rdma_cm id {} has no connection request to accept", a.id),
            ));
        };
        let (comm, ud, telemetry) = (*comm, *ud, path.telemetry);
        let cm = self.hosts[host].cm();
        if ud {
            cm.sidr_reply(comm, sidr::SUCCESS, a.qpn, a.qkey, &a.private_data)
                .map_err(refused)?;
            // The SIDR exchange is over: the id keeps no connection.
            self.cma.owners.remove(&(host, comm));
        } else {
            cm.accept(
                now,
                comm,
                &AcceptParams {
                    qpn: a.qpn,
                    starting_psn: a.starting_psn & 0xFF_FFFF,
                    responder_resources: a.conn.responder_resources,
                    initiator_depth: a.conn.initiator_depth,
                    rnr_retry_count: a.conn.rnr_retry_count.min(7),
                    srq: a.conn.srq,
                    flow_control: a.conn.flow_control,
                    private_data: a.private_data.clone(),
                    telemetry,
                },
            )
            .map_err(refused)?;
        }
        done(Reply::Done)
    }

    /// The host, CM connection and UD-ness of id `id`.
    fn comm_of(&self, conn: ConnId, id: CmId) -> Result<(usize, CommId, bool), ErrorReply> {
        let s = &self.cma.sessions[&conn];
        match s.ids.get(&id) {
            Some(CmaId {
                role: Role::Comm { comm, ud, .. },
                ..
            }) => Ok((s.host, *comm, *ud)),
            Some(_) => Err(err(
                ErrorKind::InvalidArgument,
                format!("rdma_cm id {id} has no connection"),
            )),
            None => Err(err(
                ErrorKind::InvalidArgument,
                format!("no rdma_cm id {id}"),
            )),
        }
    }

    /// Forgets id `id` of session `conn`, sending what its connection's
    /// state calls for; whether it existed.
    fn cm_destroy_id(&mut self, conn: ConnId, id: CmId, now: u64) -> bool {
        let Some(s) = self.cma.sessions.get_mut(&conn) else {
            return false;
        };
        let host = s.host;
        let Some(i) = s.ids.remove(&id) else {
            return false;
        };
        match i.role {
            Role::Idle => {}
            Role::Resolving => self
                .cma
                .resolving
                .retain(|r| (r.session, r.id) != (conn, id)),
            Role::Listening {
                service_id, token, ..
            } => {
                self.hosts[host].cm().unlisten(service_id);
                self.cma.listeners.remove(&token);
            }
            Role::Comm { comm, .. } => {
                self.cma.forget_negotiated(conn, id);
                if self.cma.owners.remove(&(host, comm)).is_some() {
                    self.hosts[host].cm().destroy(now, comm);
                }
            }
        }
        true
    }

    /// The session's socket closed: its ids go as `rdma_destroy_id`
    /// would take them.
    pub(super) fn cm_closed(&mut self, conn: ConnId) {
        let Some(s) = self.cma.sessions.get(&conn) else {
            return;
        };
        let now = self.clock.now_ns();
        let ids: Vec<CmId> = s.ids.keys().copied().collect();
        for id in ids {
            self.cm_destroy_id(conn, id, now);
        }
        self.cma.sessions.remove(&conn);
    }

    /// Turns host `host`'s CM events into rdma_cm events.
    pub(super) fn cm_events(&mut self, host: usize) {
        while let Some(ev) = self.hosts[host].cm().poll_event() {
            self.cm_event(host, ev);
        }
    }

    fn cm_event(&mut self, host: usize, ev: CmEvent) {
        let local_ip = self.hosts[host].spec.ip;
        match ev {
            CmEvent::ConnectRequest {
                listener, id, req, ..
            } => self.cm_connect_request(host, listener, id, &req.private_data, Some(&req)),
            CmEvent::SidrRequest {
                listener, id, req, ..
            } => self.cm_connect_request(host, listener, id, &req.private_data, None),
            CmEvent::RepReceived { id, rep } => {
                let Some((session, cid, mut path, channel)) = self.claim(host, id) else {
                    return;
                };
                path.peer_psn = rep.starting_psn;
                path.telemetry = rep_speaks_telemetry(&rep) && self.cfg.cc.uses_telemetry();
                if path.telemetry {
                    self.cma.count(host).telemetry_negotiated += 1;
                    self.cma
                        .negotiated
                        .insert((local_ip, path.peer_ip, rep.local_qpn), (session, cid));
                }
                self.set_path(session, cid, path);
                let ev = CmEventMsg {
                    private_data: rep.private_data.to_vec(),
                    conn: CmConnParams {
                        responder_resources: rep.responder_resources,
                        initiator_depth: rep.initiator_depth,
                        flow_control: rep.end_to_end_flow_control,
                        retry_count: 0,
                        rnr_retry_count: rep.rnr_retry_count,
                        srq: rep.srq,
                        qp_num: rep.local_qpn,
                    },
                    path: Some(path),
                    ..bare(session, cid, CmEventType::ConnectResponse, 0)
                };
                self.cma.push(channel, ev);
            }
            CmEvent::SidrReply { id, rep } => {
                let Some((session, cid, mut path, channel)) = self.claim(host, id) else {
                    return;
                };
                self.cma.owners.remove(&(host, id));
                self.reset_role(session, cid);
                let ev = if rep.status == sidr::SUCCESS {
                    path.qkey = rep.qkey;
                    CmEventMsg {
                        private_data: rep.private_data.to_vec(),
                        conn: CmConnParams {
                            qp_num: rep.qpn,
                            ..CmConnParams::default()
                        },
                        path: Some(path),
                        ..bare(session, cid, CmEventType::Established, 0)
                    }
                } else {
                    bare(
                        session,
                        cid,
                        CmEventType::Unreachable,
                        i32::from(rep.status),
                    )
                };
                self.cma.push(channel, ev);
            }
            CmEvent::Established { id } => {
                let Some((session, cid, path, channel)) = self.claim(host, id) else {
                    return;
                };
                // The active side's ESTABLISHED is the library's, made
                // when it sent the RTU.
                if self.is_active(session, cid) {
                    return;
                }
                let ev = CmEventMsg {
                    path: Some(path),
                    ..bare(session, cid, CmEventType::Established, 0)
                };
                self.cma.push(channel, ev);
            }
            CmEvent::Rejected { id, reason, rej } => {
                let Some((session, cid, _, channel)) = self.claim(host, id) else {
                    return;
                };
                self.cma.forget_negotiated(session, cid);
                let ev = CmEventMsg {
                    private_data: rej.private_data.to_vec(),
                    ..bare(session, cid, CmEventType::Rejected, i32::from(reason))
                };
                self.cma.push(channel, ev);
            }
            CmEvent::Unreachable { id } => {
                let Some((session, cid, _, channel)) = self.claim(host, id) else {
                    return;
                };
                self.cma.forget_negotiated(session, cid);
                self.cma.owners.remove(&(host, id));
                self.reset_role(session, cid);
                self.cma.push(
                    channel,
                    bare(session, cid, CmEventType::Unreachable, NEG_ETIMEDOUT),
                );
            }
            CmEvent::Disconnected { id, timed_out } => {
                let Some((session, cid, _, channel)) = self.claim(host, id) else {
                    return;
                };
                self.cma.forget_negotiated(session, cid);
                let status = if timed_out { NEG_ETIMEDOUT } else { 0 };
                self.cma.push(
                    channel,
                    bare(session, cid, CmEventType::Disconnected, status),
                );
            }
            CmEvent::TimewaitExit { id } => {
                let Some((session, cid, _, channel)) = self.claim(host, id) else {
                    return;
                };
                self.cma.owners.remove(&(host, id));
                self.cma.forget_negotiated(session, cid);
                self.cma
                    .push(channel, bare(session, cid, CmEventType::TimewaitExit, 0));
            }
        }
    }

    /// The session, id, path and channel of CM connection `comm` of
    /// `host`, counting an event nobody owns.
    fn claim(&mut self, host: usize, comm: CommId) -> Option<(ConnId, CmId, CmPath, u64)> {
        let found = self
            .cma
            .owners
            .get(&(host, comm))
            .and_then(|&(session, cid)| {
                let i = self.cma.sessions.get(&session)?.ids.get(&cid)?;
                match i.role {
                    Role::Comm { path, .. } => Some((session, cid, path, i.channel)),
                    _ => None,
                }
            });
        if found.is_none() {
            self.cma.count(host).events_unclaimed += 1;
        }
        found
    }

    fn id_mut(&mut self, session: ConnId, cid: CmId) -> Option<&mut CmaId> {
        self.cma.sessions.get_mut(&session)?.ids.get_mut(&cid)
    }

    fn set_path(&mut self, session: ConnId, cid: CmId, p: CmPath) {
        if let Some(CmaId {
            role: Role::Comm { path, .. },
            ..
        }) = self.id_mut(session, cid)
        {
            *path = p;
        }
    }

    fn reset_role(&mut self, session: ConnId, cid: CmId) {
        if let Some(i) = self.id_mut(session, cid) {
            i.role = Role::Idle;
        }
    }

    fn is_active(&self, session: ConnId, cid: CmId) -> bool {
        self.cma
            .sessions
            .get(&session)
            .and_then(|s| s.ids.get(&cid))
            .is_some_and(|i| matches!(i.role, Role::Comm { active: true, .. }))
    }

    /// A REQ (`req`) or SIDR_REQ (`None`) for a listener: checked as
    /// Linux's rdma_cm checks it, then a new id and CONNECT_REQUEST.
    fn cm_connect_request(
        &mut self,
        host: usize,
        token: u64,
        comm: CommId,
        private: &[u8],
        req: Option<&wcm::Req>,
    ) {
        let local_ip = self.hosts[host].spec.ip;
        // Refused as Linux refuses when its rdma_cm handler fails: a REJ
        // (consumer defined), or a SIDR_REP that rejects.
        let refuse = |s: &mut Service| {
            s.cma.count(host).requests_refused += 1;
            let cm = s.hosts[host].cm();
            let _ = if req.is_some() {
                cm.reject(comm, rej::CONSUMER_DEFINED, &[])
            } else {
                cm.sidr_reply(comm, sidr::REJECT, 0, 0, &[])
            };
        };
        // The listener is gone (destroyed while the CM held the REQ).
        let Some(&(session, lid)) = self.cma.listeners.get(&token) else {
            return refuse(self);
        };
        let Some(Role::Listening { ip, .. }) = self
            .cma
            .sessions
            .get(&session)
            .and_then(|s| s.ids.get(&lid))
            .map(|i| &i.role)
        else {
            return refuse(self);
        };
        let listen_ip = *ip;
        // No rdma_cm header (or an IPv6 one), or for another address.
        let Ok(h) = CmaHeader::parse(private) else {
            return refuse(self);
        };
        if listen_ip.is_some_and(|ip| ip != h.dst) || h.dst != local_ip {
            return refuse(self);
        }
        let l = &self.cma.sessions[&session].ids[&lid];
        let (channel, ps, port) = (l.channel, l.port_space, l.port);
        let rc_space = ps != PortSpace::Udp.number() && ps != PortSpace::Ipoib.number();
        match req {
            // RC's port space for a REQ of RC (or UC), UD's for SIDR.
            Some(r) if !rc_space || r.transport_service_type > 1 => return refuse(self),
            None if rc_space => return refuse(self),
            _ => {}
        }
        let telemetry = req.is_some_and(req_offers_telemetry) && self.cfg.cc.uses_telemetry();
        let max_mtu = self.cfg.max_mtu.bytes();
        let path = CmPath {
            local_ip,
            local_port: port,
            peer_ip: h.src,
            peer_port: h.src_port,
            peer_psn: req.map_or(0, |r| r.starting_psn),
            mtu: req.map_or(max_mtu, |r| mtu_bytes(r.path_mtu).min(max_mtu)),
            ack_timeout: req.map_or(0, |r| r.primary.local_ack_timeout),
            traffic_class: req.map_or(0, |r| r.primary.traffic_class),
            qkey: 0,
            telemetry,
        };
        // As rdma_cm shows a REQ to the passive side: the depths swapped
        // (what the peer reads is what we answer, and the other way).
        let conn = req.map_or(CmConnParams::default(), |r| CmConnParams {
            responder_resources: r.initiator_depth,
            initiator_depth: r.responder_resources,
            flow_control: r.end_to_end_flow_control,
            retry_count: r.retry_count,
            rnr_retry_count: r.rnr_retry_count,
            srq: r.srq,
            qp_num: r.local_qpn,
        });
        let s = self.cma.sessions.get_mut(&session).expect("found above");
        s.next_child = s.next_child.wrapping_add(1) & !DAEMON_ID;
        let cid = DAEMON_ID | s.next_child;
        s.ids.insert(
            cid,
            CmaId {
                channel,
                port_space: ps,
                port,
                role: Role::Comm {
                    comm,
                    active: false,
                    ud: req.is_none(),
                    path,
                },
            },
        );
        self.cma.owners.insert((host, comm), (session, cid));
        if telemetry {
            self.cma.count(host).telemetry_negotiated += 1;
            self.cma
                .negotiated
                .insert((local_ip, h.src, conn.qp_num), (session, cid));
        }
        let ev = CmEventMsg {
            listener: Some(lid),
            private_data: private[CmaHeader::LEN..].to_vec(),
            conn,
            path: Some(path),
            ..bare(session, cid, CmEventType::ConnectRequest, 0)
        };
        self.cma.push(channel, ev);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtu_codes_are_ibas() {
        assert_eq!(mtu_code(256), 1);
        assert_eq!(mtu_code(1024), 3);
        assert_eq!(mtu_code(4096), 5);
        assert_eq!(mtu_bytes(3), 1024);
        assert_eq!(mtu_bytes(5), 4096);
        assert_eq!(mtu_bytes(0), 256);
    }
}
