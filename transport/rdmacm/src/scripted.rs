//! The library against a scripted daemon: a Unix socket that answers the
//! rdma_cm requests as the daemon's contract says and pairs an active id
//! with a listener in the same process, pushing the events each side
//! would get. Devices have no verbs device (no QPs), so these tests
//! follow the paths of applications that move their own QPs (`rping -q`:
//! CONNECT_RESPONSE, `rdma_init_qp_attr`, `rdma_establish`), the
//! synchronous calls, event counting and the daemon's death.

use std::collections::HashMap;
use std::ffi::c_void;
use std::io::Write;
use std::net::Ipv4Addr;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::{Arc, Mutex};

use shm::cma::{CmConnParams, CmEventMsg, CmEventType, CmId, CmPath, DAEMON_ID};
use shm::proto::{self, Reply, ReplyMsg, Request, RequestMsg};

use crate::sys::*;

/// One side of a paired connection: (session, id, channel).
type Side = (u64, CmId, u64);

#[derive(Default)]
struct Script {
    channels: HashMap<u64, UnixStream>,
    listeners: HashMap<u16, Side>,
    /// Active side -> passive side, and back.
    peer: HashMap<(u64, CmId), Side>,
    chan_of: HashMap<(u64, CmId), u64>,
    next_child: u32,
    all: Vec<UnixStream>,
    requests: Vec<Request>,
    /// Events a request made, sent after its reply (as the daemon's
    /// reply is written before the events it causes can be read).
    deferred: Vec<(u64, CmEventMsg)>,
}

fn bare(side: Side, event: CmEventType, status: i32) -> CmEventMsg {
    CmEventMsg {
        session: side.0,
        id: side.1,
        listener: None,
        event,
        status,
        private_data: Vec::new(),
        conn: CmConnParams::default(),
        path: None,
    }
}

fn path(local: Ipv4Addr, peer: Ipv4Addr, psn: u32) -> CmPath {
    CmPath {
        local_ip: local,
        local_port: 7174,
        peer_ip: peer,
        peer_port: 40001,
        peer_psn: psn,
        mtu: 1024,
        ack_timeout: 14,
        traffic_class: 0,
        qkey: RDMA_UDP_QKEY,
        telemetry: false,
    }
}

impl Script {
    fn push(&mut self, channel: u64, ev: CmEventMsg) {
        self.deferred.push((channel, ev));
    }

    fn flush(&mut self) {
        for (channel, ev) in std::mem::take(&mut self.deferred) {
            self.send_event(channel, ev);
        }
    }

    fn send_event(&mut self, channel: u64, ev: CmEventMsg) {
        if let Some(s) = self.channels.get_mut(&channel) {
            let m = ReplyMsg {
                v: shm::VERSION,
                id: 0,
                result: Ok(Reply::CmEvent(Box::new(ev))),
            };
            let _ = s.write_all(&proto::frame(&m));
        }
    }

    fn answer(&mut self, conn: u64, sock: &UnixStream, req: Request) -> Reply {
        self.requests.push(req.clone());
        let side =
            |s: &Script, id: CmId| (conn, id, s.chan_of.get(&(conn, id)).copied().unwrap_or(0));
        match req {
            Request::CmChannel => {
                self.channels.insert(conn, sock.try_clone().unwrap());
                Reply::CmChannel { channel: conn }
            }
            Request::CmOpen { .. } => Reply::CmOpened {
                session: conn,
                ip: Ipv4Addr::new(10, 0, 0, 1),
                max_mtu: 1024,
            },
            Request::CmResolveAddr { id, channel, .. } => {
                self.chan_of.insert((conn, id), channel);
                self.push(
                    channel,
                    bare((conn, id, channel), CmEventType::AddrResolved, 0),
                );
                Reply::CmPort { port: 40001 }
            }
            Request::CmListen {
                id, channel, addr, ..
            } => {
                let port = if addr.port == 0 { 50000 } else { addr.port };
                self.chan_of.insert((conn, id), channel);
                self.listeners.insert(port, (conn, id, channel));
                Reply::CmPort { port }
            }
            Request::CmConnect(c) => {
                let active = (conn, c.id, c.channel);
                self.chan_of.insert((conn, c.id), c.channel);
                let Some(&l) = self.listeners.get(&c.dst_port) else {
                    self.push(c.channel, bare(active, CmEventType::Rejected, 8));
                    return Reply::Done;
                };
                self.next_child += 1;
                let child = (l.0, DAEMON_ID | self.next_child, l.2);
                self.chan_of.insert((child.0, child.1), child.2);
                self.peer.insert((conn, c.id), child);
                self.peer.insert((child.0, child.1), active);
                let ev = CmEventMsg {
                    listener: Some(l.1),
                    private_data: c.private_data.clone(),
                    conn: CmConnParams {
                        responder_resources: c.conn.initiator_depth,
                        initiator_depth: c.conn.responder_resources,
                        qp_num: c.qpn,
                        ..c.conn
                    },
                    path: Some(path(c.dst, Ipv4Addr::new(10, 0, 0, 1), c.starting_psn)),
                    ..bare(child, CmEventType::ConnectRequest, 0)
                };
                self.push(l.2, ev);
                Reply::Done
            }
            Request::CmAccept(a) => {
                let Some(&act) = self.peer.get(&(conn, a.id)) else {
                    return Reply::Done;
                };
                let ev = CmEventMsg {
                    private_data: a.private_data.clone(),
                    conn: CmConnParams {
                        qp_num: a.qpn,
                        ..a.conn
                    },
                    path: Some(path(
                        Ipv4Addr::new(10, 0, 0, 1),
                        Ipv4Addr::new(10, 0, 0, 2),
                        a.starting_psn,
                    )),
                    ..bare(act, CmEventType::ConnectResponse, 0)
                };
                self.push(act.2, ev);
                Reply::Done
            }
            Request::CmEstablish { id } => {
                if let Some(&p) = self.peer.get(&(conn, id)) {
                    self.push(p.2, bare(p, CmEventType::Established, 0));
                }
                Reply::Done
            }
            Request::CmReject { id, .. } => {
                if let Some(&p) = self.peer.get(&(conn, id)) {
                    self.push(p.2, bare(p, CmEventType::Rejected, 28));
                }
                Reply::Done
            }
            Request::CmMigrate { id, channel } => {
                self.chan_of.insert((conn, id), channel);
                for side in self.peer.values_mut() {
                    if (side.0, side.1) == (conn, id) {
                        side.2 = channel;
                    }
                }
                Reply::Done
            }
            Request::CmDisconnect { id } => {
                let me = side(self, id);
                if let Some(&p) = self.peer.get(&(conn, id)) {
                    self.push(p.2, bare(p, CmEventType::Disconnected, 0));
                }
                self.push(me.2, bare(me, CmEventType::Disconnected, 0));
                Reply::Done
            }
            _ => Reply::Done,
        }
    }
}

/// Serves `path` until killed; returns the shared script.
fn serve(path: &std::path::Path) -> Arc<Mutex<Script>> {
    let _ = std::fs::remove_file(path);
    let l = UnixListener::bind(path).unwrap();
    let script = Arc::new(Mutex::new(Script::default()));
    let s = script.clone();
    std::thread::spawn(move || {
        for (n, sock) in l.incoming().enumerate() {
            let Ok(mut sock) = sock else { break };
            let conn = n as u64 + 1;
            s.lock().unwrap().all.push(sock.try_clone().unwrap());
            let s = s.clone();
            std::thread::spawn(move || {
                while let Ok(m) = proto::read_message::<RequestMsg>(&mut sock) {
                    let reply = s.lock().unwrap().answer(conn, &sock, m.req);
                    let r = ReplyMsg {
                        v: m.v,
                        id: m.id,
                        result: Ok(reply),
                    };
                    if proto::send_message(&mut sock, &r).is_err() {
                        break;
                    }
                    s.lock().unwrap().flush();
                }
            });
        }
    });
    script
}

unsafe fn get(ch: *mut rdma_event_channel) -> rdma_cm_event {
    let mut ev = std::ptr::null_mut();
    // SAFETY: a live channel and our slot.
    assert_eq!(unsafe { crate::event::rdma_get_cm_event(ch, &mut ev) }, 0);
    // SAFETY: an event just delivered.
    let e = unsafe { *ev };
    // SAFETY: ours, acked once.
    assert_eq!(unsafe { crate::event::rdma_ack_cm_event(ev) }, 0);
    e
}

fn readable(ch: *mut rdma_event_channel) -> bool {
    let mut pfd = libc::pollfd {
        // SAFETY: a live channel.
        fd: unsafe { (*ch).fd },
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd, no waiting.
    unsafe { libc::poll(&mut pfd, 1, 0) == 1 }
}

fn sent(script: &Arc<Mutex<Script>>, f: impl Fn(&Request) -> bool) -> bool {
    script.lock().unwrap().requests.iter().any(f)
}

/// An id on `ch` that resolved `dst:port` and its route.
unsafe fn resolved(ch: *mut rdma_event_channel, port: u16) -> *mut rdma_cm_id {
    use crate::id::*;
    let mut id = std::ptr::null_mut();
    // SAFETY: the C API as documented.
    unsafe {
        assert_eq!(
            rdma_create_id(ch, &mut id, std::ptr::null_mut(), RDMA_PS_TCP),
            0
        );
        let mut d = sin(Ipv4Addr::new(10, 0, 0, 2), port);
        let dp = (&mut d as *mut libc::sockaddr_in).cast();
        assert_eq!(rdma_resolve_addr(id, std::ptr::null_mut(), dp, 2000), 0);
        assert_eq!(get(ch).event, RDMA_CM_EVENT_ADDR_RESOLVED);
        assert_eq!(rdma_resolve_route(id, 2000), 0);
        assert_eq!(get(ch).event, RDMA_CM_EVENT_ROUTE_RESOLVED);
    }
    id
}

fn sin(ip: Ipv4Addr, port: u16) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(ip).to_be(),
        },
        sin_zero: [0; 8],
    }
}

/// Multicast joins on `ch` (the library alone: no request reaches the
/// daemon but the bind of a resolve; the devices have no QPs, so nothing
/// is attached).
unsafe fn multicast(script: &Arc<Mutex<Script>>, ch: *mut rdma_event_channel) {
    use crate::id::*;
    use crate::mcast::*;
    let sa = |ip: [u8; 4]| sin(Ipv4Addr::from(ip), 0);
    let ptr = |a: &mut libc::sockaddr_in| (a as *mut libc::sockaddr_in).cast::<sockaddr>();
    let (mut g, mut g2, mut g3) = (sa([239, 1, 2, 3]), sa([239, 1, 2, 4]), sa([239, 1, 2, 5]));
    let fails = |r: i32, e: i32| {
        assert_eq!(r, -1);
        assert_eq!(crate::util::errno(), e);
    };
    // SAFETY: the C API used as rdma_cma.h documents it.
    unsafe {
        let mut id = std::ptr::null_mut();
        assert_eq!(
            rdma_create_id(ch, &mut id, 9 as *mut c_void, RDMA_PS_UDP),
            0
        );
        // No device yet: EINVAL (ucma's check).
        fails(
            rdma_join_multicast(id, ptr(&mut g), std::ptr::null_mut()),
            libc::EINVAL,
        );
        // A group resolves at once, without the daemon; the id is bound.
        assert_eq!(
            rdma_resolve_addr(id, std::ptr::null_mut(), ptr(&mut g), 2000),
            0
        );
        assert_eq!(get(ch).event, RDMA_CM_EVENT_ADDR_RESOLVED);
        assert!(!sent(script, |r| matches!(
            r,
            Request::CmResolveAddr { dst, .. } if dst.is_multicast()
        )));
        assert!(sent(script, |r| matches!(
            r,
            Request::CmBind { addr, .. } if addr.ip == Some(Ipv4Addr::new(10, 0, 0, 1))
        )));
        assert_eq!((*id).port_num, 1);
        let dst = std::ptr::addr_of!((*id).route.addr).cast::<u8>().add(128);
        assert_eq!(
            crate::util::read_sockaddr(dst.cast()),
            Some(crate::util::SockAddr::V4(crate::util::Addr4 {
                ip: Ipv4Addr::new(239, 1, 2, 3),
                port: 0,
                v6: false
            }))
        );
        // Not a group: EINVAL; no address: EINVAL.
        let mut uni = sa([10, 0, 0, 2]);
        fails(
            rdma_join_multicast(id, ptr(&mut uni), std::ptr::null_mut()),
            libc::EINVAL,
        );
        let mut any = sa([0, 0, 0, 0]);
        fails(
            rdma_join_multicast(id, ptr(&mut any), std::ptr::null_mut()),
            libc::EINVAL,
        );
        fails(
            rdma_join_multicast(id, std::ptr::null_mut(), std::ptr::null_mut()),
            libc::EINVAL,
        );
        // The join's answer: the group's AH, its QPN and Q_Key, the
        // context as private data; the id's TOS as traffic class.
        let mut tos = 32u8;
        let opt = (&mut tos as *mut u8).cast();
        assert_eq!(
            rdma_set_option(id, RDMA_OPTION_ID as i32, RDMA_OPTION_ID_TOS as i32, opt, 1),
            0
        );
        assert_eq!(rdma_join_multicast(id, ptr(&mut g), 0x77 as *mut c_void), 0);
        let e = get(ch);
        assert_eq!(
            (e.event, e.status, e.id),
            (RDMA_CM_EVENT_MULTICAST_JOIN, 0, id)
        );
        let u = e.param.ud;
        assert_eq!((u.private_data as usize, u.private_data_len), (0x77, 0));
        assert_eq!((u.qp_num, u.qkey), (MULTICAST_QPN, RDMA_UDP_QKEY));
        assert_eq!(
            u.ah_attr.grh.dgid.raw,
            crate::util::mapped_gid(Ipv4Addr::new(239, 1, 2, 3))
        );
        assert_eq!(
            (u.ah_attr.grh.hop_limit, u.ah_attr.grh.traffic_class),
            (HOP_LIMIT, 32)
        );
        assert_eq!(
            (
                u.ah_attr.is_global,
                u.ah_attr.grh.sgid_index,
                u.ah_attr.port_num
            ),
            (1, 1, 1)
        );
        // Joining it again is no error (as Linux): a second answer.
        assert_eq!(rdma_join_multicast(id, ptr(&mut g), 0x78 as *mut c_void), 0);
        let e = get(ch);
        assert_eq!(
            (e.event, e.param.ud.private_data as usize),
            (RDMA_CM_EVENT_MULTICAST_JOIN, 0x78)
        );
        // rdma_join_multicast_ex: rdma-core's mask checks, the kernel's
        // flags.
        let mut attr = rdma_cm_join_mc_attr_ex {
            comp_mask: RDMA_CM_JOIN_MC_ATTR_ADDRESS,
            join_flags: RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER,
            addr: ptr(&mut g2),
        };
        fails(
            rdma_join_multicast_ex(id, &mut attr, std::ptr::null_mut()),
            libc::EINVAL,
        );
        attr.comp_mask = RDMA_CM_JOIN_MC_ATTR_RESERVED | RDMA_CM_JOIN_MC_ATTR_ADDRESS;
        fails(
            rdma_join_multicast_ex(id, &mut attr, std::ptr::null_mut()),
            libc::EOPNOTSUPP,
        );
        attr.comp_mask = RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS;
        attr.join_flags = RDMA_MC_JOIN_FLAG_RESERVED;
        fails(
            rdma_join_multicast_ex(id, &mut attr, std::ptr::null_mut()),
            libc::EINVAL,
        );
        attr.join_flags = RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER;
        assert_eq!(
            rdma_join_multicast_ex(id, &mut attr, 0x79 as *mut c_void),
            0
        );
        assert_eq!(get(ch).event, RDMA_CM_EVENT_MULTICAST_JOIN);
        // Left before its answer is taken: the answer goes too.
        assert_eq!(
            rdma_join_multicast(id, ptr(&mut g3), std::ptr::null_mut()),
            0
        );
        assert!(readable(ch));
        assert_eq!(rdma_leave_multicast(id, ptr(&mut g3)), 0);
        assert!(!readable(ch));
        // Each join is left once; then EADDRNOTAVAIL.
        assert_eq!(rdma_leave_multicast(id, ptr(&mut g)), 0);
        assert_eq!(rdma_leave_multicast(id, ptr(&mut g)), 0);
        fails(rdma_leave_multicast(id, ptr(&mut g)), libc::EADDRNOTAVAIL);
        fails(rdma_leave_multicast(id, std::ptr::null_mut()), libc::EINVAL);
        // Destroying the id leaves the rest (the send-only join).
        assert_eq!(rdma_destroy_id(id), 0);

        // A routed id cannot join.
        let rid = resolved(ch, 7999);
        fails(
            rdma_join_multicast(rid, ptr(&mut g), std::ptr::null_mut()),
            libc::EINVAL,
        );
        assert_eq!(rdma_destroy_id(rid), 0);

        // A synchronous id waits for the answer; an IPoIB id gets
        // MULTICAST_ERROR -ENODEV (no broadcast group on RoCE), ENODEV.
        for (ps, want) in [(RDMA_PS_UDP, 0), (RDMA_PS_IPOIB, libc::ENODEV)] {
            let mut sid = std::ptr::null_mut();
            let nul = std::ptr::null_mut();
            assert_eq!(rdma_create_id(nul, &mut sid, std::ptr::null_mut(), ps), 0);
            let mut b = sa([10, 0, 0, 2]);
            assert_eq!(rdma_bind_addr(sid, ptr(&mut b)), 0);
            let r = rdma_join_multicast(sid, ptr(&mut g), 0x55 as *mut c_void);
            let ev = *(*sid).event;
            assert_eq!(ev.param.ud.private_data as usize, 0x55);
            if want == 0 {
                assert_eq!(r, 0);
                assert_eq!(ev.event, RDMA_CM_EVENT_MULTICAST_JOIN);
            } else {
                fails(r, want);
                assert_eq!(
                    (ev.event, ev.status),
                    (RDMA_CM_EVENT_MULTICAST_ERROR, -want)
                );
            }
            assert_eq!(rdma_leave_multicast(sid, ptr(&mut g)), 0);
            assert_eq!(rdma_destroy_id(sid), 0);
        }
    }
}

#[test]
fn rdma_cm_over_a_scripted_daemon() {
    use crate::conn::*;
    use crate::id::*;
    let path = std::env::temp_dir().join(format!("rdmacm-scripted-{}.sock", std::process::id()));
    std::env::set_var(verbs::SOCKET_ENV, &path);
    let script = serve(&path);
    crate::devices::install_without_verbs(&[
        ("rnic0", Ipv4Addr::new(10, 0, 0, 1)),
        ("rnic1", Ipv4Addr::new(10, 0, 0, 2)),
    ]);
    // SAFETY: the C API used as rdma_cma.h documents it.
    unsafe {
        // Passive: a listener on rnic1's address.
        let chs = crate::channel::rdma_create_event_channel();
        assert!(!chs.is_null());
        let mut lid = std::ptr::null_mut();
        assert_eq!(
            rdma_create_id(chs, &mut lid, 5 as *mut c_void, RDMA_PS_TCP),
            0
        );
        let mut a = sin(Ipv4Addr::new(10, 0, 0, 2), 7174);
        assert_eq!(
            rdma_bind_addr(lid, (&mut a as *mut libc::sockaddr_in).cast()),
            0
        );
        let mut bad = sin(Ipv4Addr::new(10, 9, 9, 9), 1);
        let mut other = std::ptr::null_mut();
        assert_eq!(
            rdma_create_id(chs, &mut other, std::ptr::null_mut(), RDMA_PS_TCP),
            0
        );
        assert_eq!(
            rdma_bind_addr(other, (&mut bad as *mut libc::sockaddr_in).cast()),
            -1
        );
        assert_eq!(crate::util::errno(), libc::EADDRNOTAVAIL);
        assert_eq!(rdma_destroy_id(other), 0);
        assert_eq!(rdma_listen(lid, 8), 0);
        assert_eq!(rdma_get_src_port(lid), 7174u16.to_be());
        // The explicit port was reserved at bind too.
        assert!(sent(&script, |r| matches!(
            r,
            Request::CmBind { addr, .. } if addr.port == 7174
        )));

        // Active: resolve from rnic0 (same /24, not the destination).
        let chc = crate::channel::rdma_create_event_channel();
        let mut cid = std::ptr::null_mut();
        assert_eq!(
            rdma_create_id(chc, &mut cid, std::ptr::null_mut(), RDMA_PS_TCP),
            0
        );
        let mut d = sin(Ipv4Addr::new(10, 0, 0, 2), 7174);
        assert_eq!(
            rdma_resolve_addr(
                cid,
                std::ptr::null_mut(),
                (&mut d as *mut libc::sockaddr_in).cast(),
                2000
            ),
            0
        );
        assert_eq!(get(chc).event, RDMA_CM_EVENT_ADDR_RESOLVED);
        assert_eq!(rdma_get_src_port(cid), 40001u16.to_be());
        assert_eq!(rdma_get_dst_port(cid), 7174u16.to_be());
        assert_eq!(rdma_resolve_route(cid, 2000), 0);
        assert_eq!(get(chc).event, RDMA_CM_EVENT_ROUTE_RESOLVED);
        assert_eq!((*cid).route.num_paths, 1);

        // Nothing more: O_NONBLOCK gives EAGAIN.
        let fd = (*chc).fd;
        libc::fcntl(
            fd,
            libc::F_SETFL,
            libc::fcntl(fd, libc::F_GETFL) | libc::O_NONBLOCK,
        );
        let mut ev = std::ptr::null_mut();
        assert_eq!(crate::event::rdma_get_cm_event(chc, &mut ev), -1);
        assert_eq!(crate::util::errno(), libc::EAGAIN);
        libc::fcntl(
            fd,
            libc::F_SETFL,
            libc::fcntl(fd, libc::F_GETFL) & !libc::O_NONBLOCK,
        );

        // No QP and no parameters: EINVAL; too deep: EINVAL.
        assert_eq!(rdma_connect(cid, std::ptr::null_mut()), -1);
        let hello = *b"hello";
        let mut p = rdma_conn_param {
            private_data: hello.as_ptr().cast(),
            private_data_len: 5,
            responder_resources: 17,
            initiator_depth: 1,
            retry_count: 5,
            rnr_retry_count: 6,
            qp_num: 0x11,
            ..Default::default()
        };
        assert_eq!(rdma_connect(cid, &mut p), -1);
        assert_eq!(crate::util::errno(), libc::EINVAL);
        p.responder_resources = 2;
        assert_eq!(rdma_connect(cid, &mut p), 0);

        // The request: a new id on the listener's channel.
        let mut ev = std::ptr::null_mut();
        assert_eq!(crate::event::rdma_get_cm_event(chs, &mut ev), 0);
        let req = *ev;
        assert_eq!(req.event, RDMA_CM_EVENT_CONNECT_REQUEST);
        assert_eq!(req.listen_id, lid);
        let child = req.id;
        assert!(!child.is_null() && child != lid);
        assert_eq!((*child).context as usize, 5);
        assert_eq!((*child).channel, chs);
        let c = req.param.conn;
        assert_eq!(
            std::slice::from_raw_parts(c.private_data.cast::<u8>(), 5),
            b"hello"
        );
        assert_eq!(
            (c.responder_resources, c.initiator_depth, c.qp_num),
            (1, 2, 0x11)
        );
        assert_eq!(crate::event::rdma_ack_cm_event(ev), 0);

        // The app moves its own QP: INIT / RTR / RTS attributes.
        let mut qa = ibv_qp_attr {
            qp_state: IBV_QPS_RTR,
            ..Default::default()
        };
        let mut mask = 0;
        assert_eq!(rdma_init_qp_attr(child, &mut qa, &mut mask), 0);
        assert_eq!((qa.dest_qp_num, qa.max_dest_rd_atomic), (0x11, 1));
        // RDMA_OPTION_ID_ACK_TIMEOUT reaches the passive side's RTS too.
        let mut t = 20u8;
        assert_eq!(
            rdma_set_option(
                child,
                RDMA_OPTION_ID as i32,
                RDMA_OPTION_ID_ACK_TIMEOUT as i32,
                (&mut t as *mut u8).cast(),
                1
            ),
            0
        );
        let mut qa = ibv_qp_attr {
            qp_state: IBV_QPS_RTS,
            ..Default::default()
        };
        assert_eq!(rdma_init_qp_attr(child, &mut qa, &mut mask), 0);
        assert_eq!(qa.timeout, 20);
        let mut ap = rdma_conn_param {
            qp_num: 0x22,
            responder_resources: 1,
            initiator_depth: 1,
            rnr_retry_count: 4,
            ..Default::default()
        };
        assert_eq!(rdma_accept(child, &mut ap), 0);

        // Active: CONNECT_RESPONSE (no QP), then rdma_establish.
        let e = get(chc);
        assert_eq!(e.event, RDMA_CM_EVENT_CONNECT_RESPONSE);
        assert_eq!(e.param.conn.qp_num, 0x22);
        let mut qa = ibv_qp_attr {
            qp_state: IBV_QPS_RTS,
            ..Default::default()
        };
        assert_eq!(rdma_init_qp_attr(cid, &mut qa, &mut mask), 0);
        assert_eq!((qa.retry_cnt, qa.rnr_retry, qa.timeout), (5, 4, 14));
        // The READs we answer: as many as the REP says the peer issues
        // (its initiator depth 1), not the 2 we offered.
        let mut qa = ibv_qp_attr {
            qp_state: IBV_QPS_RTR,
            ..Default::default()
        };
        assert_eq!(rdma_init_qp_attr(cid, &mut qa, &mut mask), 0);
        assert_eq!(qa.max_dest_rd_atomic, 1);
        assert_eq!(rdma_establish(cid), 0);
        let e = get(chs);
        assert_eq!((e.event, e.id), (RDMA_CM_EVENT_ESTABLISHED, child));

        // The passive id moves to a channel of its own: the daemon is
        // told, and its events come there.
        let chm = crate::channel::rdma_create_event_channel();
        assert_eq!(rdma_migrate_id(child, chm), 0);
        assert_eq!((*child).channel, chm);
        assert!(sent(&script, |r| matches!(r, Request::CmMigrate { .. })));

        // Disconnect: both sides hear it.
        assert_eq!(rdma_disconnect(cid), 0);
        assert_eq!(get(chm).event, RDMA_CM_EVENT_DISCONNECTED);
        assert_eq!(get(chc).event, RDMA_CM_EVENT_DISCONNECTED);
        assert!(!readable(chs));
        assert_eq!(rdma_destroy_id(child), 0);
        assert_eq!(rdma_destroy_id(cid), 0);
        crate::channel::rdma_destroy_event_channel(chm);

        // rdma_reject_ece rejects with reason 35.
        let cid = resolved(chc, 7174);
        let mut p = rdma_conn_param {
            qp_num: 0x66,
            ..Default::default()
        };
        assert_eq!(rdma_connect(cid, &mut p), 0);
        let mut ev = std::ptr::null_mut();
        assert_eq!(crate::event::rdma_get_cm_event(chs, &mut ev), 0);
        let child = (*ev).id;
        assert_eq!(crate::event::rdma_ack_cm_event(ev), 0);
        assert_eq!(rdma_reject_ece(child, std::ptr::null(), 0), 0);
        assert!(sent(&script, |r| matches!(
            r,
            Request::CmReject {
                reason: Some(35),
                ..
            }
        )));
        assert_eq!(get(chc).event, RDMA_CM_EVENT_REJECTED);
        assert_eq!(rdma_destroy_id(child), 0);
        assert_eq!(rdma_destroy_id(cid), 0);

        // A listener destroyed with a request not taken: the request's id
        // is destroyed at the daemon, and the channel is not left saying
        // readable.
        let mut lid2 = std::ptr::null_mut();
        assert_eq!(
            rdma_create_id(chs, &mut lid2, std::ptr::null_mut(), RDMA_PS_TCP),
            0
        );
        let mut a = sin(Ipv4Addr::new(10, 0, 0, 2), 7175);
        assert_eq!(
            rdma_bind_addr(lid2, (&mut a as *mut libc::sockaddr_in).cast()),
            0
        );
        assert_eq!(rdma_listen(lid2, 8), 0);
        let cid = resolved(chc, 7175);
        assert_eq!(rdma_connect(cid, &mut p), 0);
        let mut waited = 0;
        while !readable(chs) && waited < 200 {
            std::thread::sleep(std::time::Duration::from_millis(5));
            waited += 1;
        }
        assert!(readable(chs));
        let child_num = {
            let s = script.lock().unwrap();
            s.peer
                .keys()
                .map(|k| k.1)
                .filter(|n| n & DAEMON_ID != 0)
                .max()
                .unwrap()
        };
        assert_eq!(rdma_destroy_id(lid2), 0);
        assert!(!readable(chs));
        assert!(sent(&script, |r| *r == Request::CmDestroyId { id: child_num }));
        assert_eq!(rdma_destroy_id(cid), 0);

        // A synchronous id: the call waits for its event.
        let mut sid = std::ptr::null_mut();
        assert_eq!(
            rdma_create_id(
                std::ptr::null_mut(),
                &mut sid,
                std::ptr::null_mut(),
                RDMA_PS_TCP
            ),
            0
        );
        let mut d = sin(Ipv4Addr::new(10, 0, 0, 2), 9999);
        assert_eq!(
            rdma_resolve_addr(
                sid,
                std::ptr::null_mut(),
                (&mut d as *mut libc::sockaddr_in).cast(),
                2000
            ),
            0
        );
        assert_eq!((*(*sid).event).event, RDMA_CM_EVENT_ADDR_RESOLVED);
        assert_eq!(rdma_resolve_route(sid, 2000), 0);
        let mut p = rdma_conn_param {
            qp_num: 0x33,
            ..Default::default()
        };
        // Nobody listens on 9999: REJECTED is ECONNREFUSED.
        assert_eq!(rdma_connect(sid, &mut p), -1);
        assert_eq!(crate::util::errno(), libc::ECONNREFUSED);
        assert_eq!(rdma_destroy_id(sid), 0);

        // Endpoints: a synchronous listener's request gets an id of its
        // own whose events are forwarded to it.
        let (node, service) = (c"10.0.0.2", c"7471");
        let hints = rdma_addrinfo {
            ai_flags: RAI_PASSIVE as i32,
            ai_port_space: RDMA_PS_TCP as i32,
            ..Default::default()
        };
        let mut res = std::ptr::null_mut();
        assert_eq!(
            crate::addrinfo::rdma_getaddrinfo(node.as_ptr(), service.as_ptr(), &hints, &mut res),
            0
        );
        assert_eq!((*res).ai_qp_type, IBV_QPT_RC as i32);
        assert_eq!((*res).ai_src_len, 16);
        let mut listen = std::ptr::null_mut();
        let nul = std::ptr::null_mut();
        assert_eq!(
            crate::ep::rdma_create_ep(&mut listen, res, nul, std::ptr::null_mut()),
            0
        );
        crate::addrinfo::rdma_freeaddrinfo(res);
        assert_eq!(rdma_listen(listen, 0), 0);
        let l = listen as usize;
        let server = std::thread::spawn(move || {
            let mut id = std::ptr::null_mut();
            let r = crate::ep::rdma_get_request(l as *mut rdma_cm_id, &mut id);
            assert_eq!(r, 0);
            assert_eq!((*(*id).event).event, RDMA_CM_EVENT_CONNECT_REQUEST);
            let mut p = rdma_conn_param {
                qp_num: 0x44,
                ..Default::default()
            };
            // Waits for the ESTABLISHED that the active side's RTU makes.
            assert_eq!(rdma_accept(id, &mut p), 0);
            assert_eq!((*(*id).event).event, RDMA_CM_EVENT_ESTABLISHED);
            crate::ep::rdma_destroy_ep(id);
        });
        let hints = rdma_addrinfo {
            ai_port_space: RDMA_PS_TCP as i32,
            ..Default::default()
        };
        let mut res = std::ptr::null_mut();
        assert_eq!(
            crate::addrinfo::rdma_getaddrinfo(node.as_ptr(), service.as_ptr(), &hints, &mut res),
            0
        );
        assert_eq!((*res).ai_dst_len, 16);
        let mut ep = std::ptr::null_mut();
        assert_eq!(
            crate::ep::rdma_create_ep(&mut ep, res, nul, std::ptr::null_mut()),
            0
        );
        crate::addrinfo::rdma_freeaddrinfo(res);
        let mut p = rdma_conn_param {
            qp_num: 0x55,
            ..Default::default()
        };
        assert_eq!(rdma_connect(ep, &mut p), 0);
        assert_eq!((*(*ep).event).event, RDMA_CM_EVENT_CONNECT_RESPONSE);
        assert_eq!(rdma_establish(ep), 0);
        server.join().unwrap();
        crate::ep::rdma_destroy_ep(ep);
        crate::ep::rdma_destroy_ep(listen);

        multicast(&script, chc);

        // A synchronous listener's request's id waits in rdma_accept for
        // an ESTABLISHED that never comes (the active side does not
        // establish) when the daemon dies below: it gets DEVICE_REMOVAL.
        let (node, service) = (c"10.0.0.2", c"7472");
        let hints = rdma_addrinfo {
            ai_flags: RAI_PASSIVE as i32,
            ai_port_space: RDMA_PS_TCP as i32,
            ..Default::default()
        };
        let mut res = std::ptr::null_mut();
        assert_eq!(
            crate::addrinfo::rdma_getaddrinfo(node.as_ptr(), service.as_ptr(), &hints, &mut res),
            0
        );
        let mut listen = std::ptr::null_mut();
        assert_eq!(
            crate::ep::rdma_create_ep(&mut listen, res, nul, std::ptr::null_mut()),
            0
        );
        crate::addrinfo::rdma_freeaddrinfo(res);
        assert_eq!(rdma_listen(listen, 0), 0);
        let l = listen as usize;
        let (tx, rx) = std::sync::mpsc::channel();
        let server = std::thread::spawn(move || {
            let mut id = std::ptr::null_mut();
            assert_eq!(
                crate::ep::rdma_get_request(l as *mut rdma_cm_id, &mut id),
                0
            );
            let mut p = rdma_conn_param {
                qp_num: 0x77,
                ..Default::default()
            };
            tx.send(()).unwrap();
            let r = rdma_accept(id, &mut p);
            let e = crate::util::errno();
            let ev = (*(*id).event).event;
            crate::ep::rdma_destroy_ep(id);
            (r, e, ev)
        });
        let cid = resolved(chc, 7472);
        let mut p = rdma_conn_param {
            qp_num: 0x88,
            ..Default::default()
        };
        assert_eq!(rdma_connect(cid, &mut p), 0);
        rx.recv().unwrap();
        assert_eq!(get(chc).event, RDMA_CM_EVENT_CONNECT_RESPONSE);

        // The daemon dies: each id of the channel gets DEVICE_REMOVAL,
        // then ENODEV.
        for s in script.lock().unwrap().all.drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        assert_eq!(
            server.join().unwrap(),
            (-1, libc::ENODEV, RDMA_CM_EVENT_DEVICE_REMOVAL)
        );
        crate::ep::rdma_destroy_ep(listen);
        assert_eq!(get(chc).event, RDMA_CM_EVENT_DEVICE_REMOVAL);
        assert_eq!(rdma_destroy_id(cid), 0);
        let e = get(chs);
        assert_eq!((e.event, e.id), (RDMA_CM_EVENT_DEVICE_REMOVAL, lid));
        let mut ev = std::ptr::null_mut();
        assert_eq!(crate::event::rdma_get_cm_event(chs, &mut ev), -1);
        assert_eq!(crate::util::errno(), libc::ENODEV);
        // The fd stays readable: a poller wakes to see ENODEV.
        assert!(readable(chs));
        assert_eq!(rdma_destroy_id(lid), 0);
        crate::channel::rdma_destroy_event_channel(chs);
        crate::channel::rdma_destroy_event_channel(chc);
    }
    let reqs = &script.lock().unwrap().requests;
    assert!(reqs
        .iter()
        .any(|r| matches!(r, Request::CmEstablish { .. })));
    let _ = std::fs::remove_file(&path);
}
