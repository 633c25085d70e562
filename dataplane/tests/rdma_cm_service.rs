//! The daemon's rdma_cm service over its control socket, as
//! `librdmacm.so.1` drives it (`shm::cma`): sessions on the loopback
//! testbed's two devices, event channels, address resolution, the
//! REQ/REP/RTU handshake with rdma_cm's header and private data, reject
//! by no listener and by the application, disconnect, and a session that
//! dies mid-handshake leaving nothing behind (its peer told by a REJ).

use std::net::Ipv4Addr;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

mod daemon_util;
use daemon_util::start_daemon;

use shm::cma::{
    CmAcceptReq, CmConnParams, CmConnectReq, CmEventMsg, CmEventType, CmListenAddr, DAEMON_ID,
};
use shm::proto::{
    read_message, send_message, ErrorKind, ErrorReply, QpType, Reply, ReplyMsg, Request, RequestMsg,
};

const RNIC0: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const RNIC1: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const PS_TCP: u16 = 0x0106;
const PS_UDP: u16 = 0x0111;

/// A connection to the daemon: a session, a channel, or neither yet.
struct Client {
    sock: UnixStream,
    next: u64,
}

impl Client {
    fn connect(socket: &Path) -> Client {
        let sock = UnixStream::connect(socket).expect("connect to the daemon");
        // A lost event fails the test instead of hanging it.
        sock.set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        Client { sock, next: 1 }
    }

    fn call(&mut self, req: Request) -> Result<Reply, ErrorReply> {
        let id = self.next;
        self.next += 1;
        let msg = RequestMsg {
            v: shm::VERSION,
            id,
            req,
        };
        send_message(&mut self.sock, &msg).unwrap();
        let r: ReplyMsg = read_message(&mut self.sock).unwrap();
        assert_eq!(r.id, id);
        r.result
    }

    fn session(socket: &Path, device: &str) -> (Client, u64) {
        let mut c = Client::connect(socket);
        match c.call(Request::CmOpen {
            device: device.into(),
        }) {
            Ok(Reply::CmOpened { session, .. }) => (c, session),
            other => panic!("CmOpen {device}: {other:?}"),
        }
    }

    fn channel(socket: &Path) -> (Client, u64) {
        let mut c = Client::connect(socket);
        match c.call(Request::CmChannel) {
            Ok(Reply::CmChannel { channel }) => (c, channel),
            other => panic!("CmChannel: {other:?}"),
        }
    }

    /// The next event pushed on this channel.
    fn event(&mut self) -> CmEventMsg {
        let r: ReplyMsg = read_message(&mut self.sock).expect("an event within a minute");
        assert_eq!(r.id, 0, "events come with id 0");
        match r.result {
            Ok(Reply::CmEvent(e)) => *e,
            other => panic!("not an event: {other:?}"),
        }
    }
}

fn ok(r: Result<Reply, ErrorReply>) -> Reply {
    r.unwrap_or_else(|e| panic!("refused: {e}"))
}

fn connect_req(id: u32, channel: u64, src_port: u16, dst_port: u16) -> CmConnectReq {
    CmConnectReq {
        id,
        channel,
        port_space: PS_TCP,
        src_port,
        dst: RNIC1,
        dst_port,
        qp_type: QpType::Rc,
        qpn: 0x51,
        starting_psn: 0x1234,
        conn: CmConnParams {
            responder_resources: 4,
            initiator_depth: 2,
            flow_control: true,
            retry_count: 7,
            rnr_retry_count: 6,
            srq: false,
            qp_num: 0x51,
        },
        private_data: b"hello from rnic0".to_vec(),
        traffic_class: 0,
        ack_timeout: None,
    }
}

/// Resolves RNIC1 for id `id` of session `s`; the id's port.
fn resolve(s: &mut Client, ch: &mut Client, channel: u64, id: u32) -> u16 {
    let port = match ok(s.call(Request::CmResolveAddr {
        id,
        channel,
        port_space: PS_TCP,
        src_port: 0,
        dst: RNIC1,
        timeout_ms: 2000,
    })) {
        Reply::CmPort { port } => port,
        other => panic!("{other:?}"),
    };
    let e = ch.event();
    assert_eq!(
        (e.id, e.event, e.status),
        (id, CmEventType::AddrResolved, 0)
    );
    port
}

fn listen_on(id: u32, channel: u64) -> Request {
    Request::CmListen {
        id,
        channel,
        port_space: PS_TCP,
        addr: CmListenAddr { ip: None, port: 0 },
    }
}

fn stats(socket: &Path) -> String {
    match Client::connect(socket).call(Request::Stats) {
        Ok(Reply::Stats { json }) => json,
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_rdma_cm_service_connects_rejects_disconnects_and_cleans_up() {
    let d = start_daemon("rdmacm-service");
    let sock = d.socket.as_path();
    let (mut srv, srv_session) = Client::session(sock, "rnic1");
    let (mut cli, cli_session) = Client::session(sock, "rnic0");
    let (mut srv_ch, srv_channel) = Client::channel(sock);
    let (mut cli_ch, cli_channel) = Client::channel(sock);

    // A session on a device that does not exist, and a request before
    // any session, are refused by name.
    let mut bad = Client::connect(sock);
    let e = bad
        .call(Request::CmOpen {
            device: "rnic9".into(),
        })
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::NoSuchDevice, "{e}");
    let e = bad.call(Request::CmDestroyId { id: 1 }).unwrap_err();
    assert_eq!(e.kind, ErrorKind::NotOpen, "{e}");

    // Listening: a port taken is EADDRINUSE; another device's address
    // EADDRNOTAVAIL.
    let listen = |id: u32, ip: Option<Ipv4Addr>, port: u16| Request::CmListen {
        id,
        channel: srv_channel,
        port_space: PS_TCP,
        addr: CmListenAddr { ip, port },
    };
    assert_eq!(
        ok(srv.call(listen(1, None, 7471))),
        Reply::CmPort { port: 7471 }
    );
    let e = srv.call(listen(2, None, 7471)).unwrap_err();
    assert_eq!(e.kind, ErrorKind::AddrInUse, "{e}");
    let e = srv.call(listen(2, Some(RNIC0), 7472)).unwrap_err();
    assert_eq!(e.kind, ErrorKind::AddrNotAvailable, "{e}");
    match ok(srv.call(listen(3, Some(RNIC1), 0))) {
        Reply::CmPort { port } => assert!(port >= 32768, "picked port {port}"),
        other => panic!("{other:?}"),
    }

    // Bind (rdma_bind_addr): port 0 gets a port at once; a port a
    // listener has is EADDRINUSE; the bound port can then be listened on.
    let bind = |id: u32, port: u16| Request::CmBind {
        id,
        channel: srv_channel,
        port_space: PS_TCP,
        addr: CmListenAddr { ip: None, port },
    };
    let bound = match ok(srv.call(bind(4, 0))) {
        Reply::CmPort { port } => port,
        other => panic!("{other:?}"),
    };
    assert!(bound >= 32768, "bound port {bound}");
    let e = srv.call(bind(6, 7471)).unwrap_err();
    assert_eq!(e.kind, ErrorKind::AddrInUse, "{e}");
    let e = srv.call(listen(6, None, bound)).unwrap_err();
    assert_eq!(e.kind, ErrorKind::AddrInUse, "another id's bound port: {e}");
    assert_eq!(
        ok(srv.call(listen(4, None, bound))),
        Reply::CmPort { port: bound }
    );
    ok(srv.call(Request::CmDestroyId { id: 4 }));

    // The handshake: CONNECT_REQUEST with the private data after the
    // rdma_cm header and the depths as the passive side reads them;
    // CONNECT_RESPONSE with the REP's; ESTABLISHED at the RTU.
    let port = resolve(&mut cli, &mut cli_ch, cli_channel, 1);
    ok(cli.call(Request::CmConnect(connect_req(1, cli_channel, port, 7471))));
    let req = srv_ch.event();
    assert_eq!(req.event, CmEventType::ConnectRequest, "{req:?}");
    assert_eq!(req.session, srv_session);
    assert_eq!(req.listener, Some(1));
    assert!(req.id & DAEMON_ID != 0, "a daemon-made id: {:#x}", req.id);
    assert_eq!(&req.private_data[..16], b"hello from rnic0");
    assert_eq!(req.private_data.len(), 56);
    assert_eq!(req.conn.responder_resources, 2, "the REQ's initiator depth");
    assert_eq!(req.conn.initiator_depth, 4, "the REQ's responder resources");
    assert_eq!((req.conn.retry_count, req.conn.rnr_retry_count), (7, 6));
    assert_eq!(req.conn.qp_num, 0x51);
    let path = req.path.expect("a path");
    assert_eq!((path.peer_ip, path.peer_port), (RNIC0, port));
    assert_eq!((path.local_ip, path.local_port), (RNIC1, 7471));
    assert_eq!((path.peer_psn, path.mtu), (0x1234, 1024));
    ok(srv.call(Request::CmAccept(CmAcceptReq {
        id: req.id,
        qpn: 0x61,
        starting_psn: 0x777,
        conn: CmConnParams {
            responder_resources: 2,
            initiator_depth: 4,
            rnr_retry_count: 5,
            ..CmConnParams::default()
        },
        private_data: b"welcome".to_vec(),
        qkey: 0,
    })));
    let rep = cli_ch.event();
    assert_eq!((rep.session, rep.id), (cli_session, 1));
    assert_eq!(rep.event, CmEventType::ConnectResponse, "{rep:?}");
    assert_eq!(&rep.private_data[..7], b"welcome");
    assert_eq!((rep.conn.qp_num, rep.conn.rnr_retry_count), (0x61, 5));
    assert_eq!(rep.path.expect("a path").peer_psn, 0x777);
    ok(cli.call(Request::CmEstablish { id: 1 }));
    let est = srv_ch.event();
    assert_eq!((est.id, est.event), (req.id, CmEventType::Established));

    // Disconnect: both sides hear DISCONNECTED (the DREQ, its DREP).
    ok(cli.call(Request::CmDisconnect { id: 1 }));
    let a = srv_ch.event();
    assert_eq!(
        (a.id, a.event, a.status),
        (req.id, CmEventType::Disconnected, 0)
    );
    ok(srv.call(Request::CmDisconnect { id: req.id }));
    let b = cli_ch.event();
    assert_eq!((b.id, b.event, b.status), (1, CmEventType::Disconnected, 0));

    // Nobody listens on 7999: REJECTED, reason 8 (invalid service ID).
    let port = resolve(&mut cli, &mut cli_ch, cli_channel, 2);
    ok(cli.call(Request::CmConnect(connect_req(2, cli_channel, port, 7999))));
    let e = cli_ch.event();
    assert_eq!((e.id, e.event, e.status), (2, CmEventType::Rejected, 8));

    // The application rejects, with private data: REJECTED, reason 28.
    let port = resolve(&mut cli, &mut cli_ch, cli_channel, 3);
    ok(cli.call(Request::CmConnect(connect_req(3, cli_channel, port, 7471))));
    let r = srv_ch.event();
    assert_eq!(r.event, CmEventType::ConnectRequest);
    ok(srv.call(Request::CmReject {
        id: r.id,
        private_data: b"go away".to_vec(),
        reason: None,
    }));
    let e = cli_ch.event();
    assert_eq!((e.id, e.event, e.status), (3, CmEventType::Rejected, 28));
    assert_eq!(&e.private_data[..7], b"go away");

    // UD (RDMA_PS_UDP): a SIDR_REQ is the CONNECT_REQUEST; the
    // SIDR_REP's QPN and Q_Key make the active side's ESTABLISHED; the
    // passive side hears nothing more.
    let ud_listen = Request::CmListen {
        id: 5,
        channel: srv_channel,
        port_space: PS_UDP,
        addr: CmListenAddr {
            ip: None,
            port: 7174,
        },
    };
    assert_eq!(ok(srv.call(ud_listen)), Reply::CmPort { port: 7174 });
    let port = resolve(&mut cli, &mut cli_ch, cli_channel, 5);
    ok(cli.call(Request::CmConnect(CmConnectReq {
        port_space: PS_UDP,
        qp_type: QpType::Ud,
        ..connect_req(5, cli_channel, port, 7174)
    })));
    let r = srv_ch.event();
    assert_eq!(
        (r.event, r.listener),
        (CmEventType::ConnectRequest, Some(5))
    );
    assert_eq!(r.private_data.len(), 180, "216 - the 36-byte header");
    assert_eq!(&r.private_data[..16], b"hello from rnic0");
    ok(srv.call(Request::CmAccept(CmAcceptReq {
        id: r.id,
        qpn: 0x99,
        starting_psn: 0,
        conn: CmConnParams::default(),
        private_data: b"ud ok".to_vec(),
        qkey: 0x0123_4567,
    })));
    let e = cli_ch.event();
    assert_eq!((e.id, e.event, e.status), (5, CmEventType::Established, 0));
    assert_eq!(e.conn.qp_num, 0x99);
    assert_eq!(e.path.expect("a path").qkey, 0x0123_4567);
    assert_eq!(&e.private_data[..5], b"ud ok");
    // Nobody listens on UD port 7175: UNREACHABLE with the SIDR status
    // (1: the service is not supported).
    let port = resolve(&mut cli, &mut cli_ch, cli_channel, 6);
    ok(cli.call(Request::CmConnect(CmConnectReq {
        port_space: PS_UDP,
        qp_type: QpType::Ud,
        ..connect_req(6, cli_channel, port, 7175)
    })));
    let e = cli_ch.event();
    assert_eq!((e.id, e.event, e.status), (6, CmEventType::Unreachable, 1));

    // A server that dies mid-handshake (its REQ not answered): its
    // session's close rejects the REQ and leaves no id or listener.
    let port = resolve(&mut cli, &mut cli_ch, cli_channel, 4);
    ok(cli.call(Request::CmConnect(connect_req(4, cli_channel, port, 7471))));
    assert_eq!(srv_ch.event().event, CmEventType::ConnectRequest);
    drop(srv);
    let e = cli_ch.event();
    assert_eq!((e.id, e.event, e.status), (4, CmEventType::Rejected, 28));
    let (mut srv2, _) = Client::session(sock, "rnic1");
    assert_eq!(
        ok(srv2.call(listen(1, None, 7471))),
        Reply::CmPort { port: 7471 },
        "the dead server's port is free again"
    );
    drop(srv2);
    for id in 1..=6 {
        ok(cli.call(Request::CmDestroyId { id }));
    }
    let e = cli.call(Request::CmDestroyId { id: 1 }).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
    ok(cli.call(listen_on(7, cli_channel)));
    assert_eq!(
        serde_json_sessions(&stats(sock)),
        2,
        "rnic0's session and its listener"
    );
    drop(cli);
    // Both sessions gone: no session or id is left on either device.
    let t0 = std::time::Instant::now();
    loop {
        let s = stats(sock);
        let left: u64 = serde_json_sessions(&s);
        if left == 0 {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "sessions left: {s}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The rdma_cm sessions and ids the stats report on every device.
fn serde_json_sessions(json: &str) -> u64 {
    let snap: dataplane::stats::Snapshot = serde_json::from_str(json).expect("stats parse");
    snap.ports
        .iter()
        .map(|p| p.rdma_cm.sessions + p.rdma_cm.ids)
        .sum()
}
