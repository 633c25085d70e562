//! Applications in separate processes against the daemon on the loopback
//! testbed (`dataplane --serve`, net_ring ports, no hugepages).
//!
//! This test binary is also the applications: run with `--role NAME` it
//! plays one (see `role`). The orchestrating run starts the daemon, then:
//!
//! 1. two apps (rnic0 and rnic1) WRITE and READ 0 B .. 1 MiB, every byte
//!    checked by the side that did not move it, the larger payloads sent
//!    from the apps' memory where it lies (zero-copy TX);
//! 2. an app that posts garbage WQEs (unknown L_Key, another app's L_Key
//!    and R_Key, out-of-range buffer, unknown opcode, too many SGEs, an SGE
//!    outside its segment, an atomic on a non-atomic MR or with a short
//!    buffer, QP not in RTS, random bytes, a scribbled ring index, a
//!    receive WQE outside its segment, post_recv on an SRQ-attached QP)
//!    gets error CQEs or named refusals while a second pair's traffic keeps
//!    flowing and verifying;
//! 3. an app killed with SIGKILL mid-transfer: its peer sees errors, the
//!    daemon releases its resources (apps, QPs, regions, CQs back to zero)
//!    and serves a new pair;
//! 4. SIGTERM stops the daemon cleanly;
//! 5. a daemon with two dataplane lcores (a device each) serves a pair
//!    across them, lists its devices in order and reports both hosts'
//!    counters and the apps of both lcores in one snapshot;
//! 6. a daemon whose lcore is pinned runs its control thread on the
//!    process's other CPUs (when it has any).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

mod daemon_util;
use daemon_util::{start_daemon, start_daemon_with, RUN_LIMIT};
use testkit::Running;

use verbs::oob::Session;
use verbs::{
    poll_one, Completion, Cq, Device, LocalBuf, Mr, MrAccess, Qp, RecvRequest, RemoteMr, WcStatus,
};

const ALL: MrAccess = MrAccess {
    local_write: true,
    remote_write: true,
    remote_read: true,
    remote_atomic: true,
};

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|k| (k as u8).wrapping_mul(29) ^ seed)
        .collect()
}

struct Args {
    role: String,
    socket: PathBuf,
    addr: String,
    extra: Vec<String>,
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

/// One side of a connected pair: device, PD, region, CQ, QP and the
/// peer's region.
struct Side {
    // Drop order: QP, region and CQ before their PD and device.
    qp: Qp,
    mr: Mr,
    cq: Cq,
    _pd: verbs::Pd,
    _dev: Device,
    remote: RemoteMr,
    session: Session,
}

fn side(a: &Args, device: &str, mr_bytes: u64, server: bool, timeout: (u8, u8)) -> Side {
    let dev = Device::open_with(&a.socket, device, mr_bytes + (8 << 20)).expect("open device");
    let pd = dev.alloc_pd().expect("PD");
    let mr = pd.alloc_mr(mr_bytes, ALL).expect("MR");
    let cq = dev.create_cq(256).expect("CQ");
    let prepared = pd
        .qp_builder(&cq)
        .timeout(timeout.0, timeout.1)
        .build()
        .expect("QP");
    let mut mine = prepared.endpoint();
    mine.mr = Some(mr.remote());
    let mut session = if server {
        Session::accept(&TcpListener::bind(&a.addr).expect("listen")).expect("accept")
    } else {
        Session::connect(a.addr.as_str(), Duration::from_secs(60)).expect("connect")
    };
    let peer = session.exchange(&mine).expect("exchange");
    let qp = prepared.connect(&peer).expect("connect QP");
    Side {
        _pd: pd,
        _dev: dev,
        mr,
        cq,
        qp,
        remote: peer.mr.expect("peer region"),
        session,
    }
}

fn wait_ok(cq: &Cq, what: &str) -> Completion {
    let c = poll_one(cq, Duration::from_secs(60))
        .expect("poll")
        .unwrap_or_else(|| panic!("{what}: no completion in 60 s"));
    assert_eq!(c.status, WcStatus::Success, "{what}");
    c
}

/// Client of phase 1 and 3: WRITE each size into the server's region (the
/// server checks it), READ it back into our second half and check it.
fn exchange_client(a: &Args, sizes: &[u32]) {
    let max = u64::from(*sizes.iter().max().unwrap()).max(1);
    let mut s = side(a, "rnic0", 2 * max, false, (14, 7));
    for (i, &len) in sizes.iter().enumerate() {
        let n = len as usize;
        s.mr.as_mut_slice()[..n].copy_from_slice(&pattern(n, i as u8));
        s.qp.post_write(LocalBuf::of(&s.mr, 0, len), &s.remote, 0, i as u64, true)
            .unwrap();
        // Sleep on the CQ's eventfd instead of spinning.
        assert!(
            s.cq.wait(Duration::from_secs(60)).unwrap(),
            "WRITE {len}: no wake-up"
        );
        wait_ok(&s.cq, &format!("WRITE {len}"));
        assert_eq!(s.session.sync("written").unwrap(), "wait");
        assert_eq!(
            s.session.sync("check?").unwrap(),
            "ok",
            "server check of {len}"
        );
        s.qp.post_read(LocalBuf::of(&s.mr, max, len), &s.remote, 0, i as u64, true)
            .unwrap();
        wait_ok(&s.cq, &format!("READ {len}"));
        let m = max as usize;
        assert!(
            s.mr.as_slice()[m..m + n] == pattern(n, i as u8)[..],
            "READ of {len} B: bytes differ"
        );
        println!("client: {len} B WRITE and READ verified");
    }
    s.session.sync("bye").unwrap();
}

fn exchange_server(a: &Args, sizes: &[u32]) {
    let max = u64::from(*sizes.iter().max().unwrap()).max(1);
    let s = side(a, "rnic1", 2 * max, true, (14, 7));
    let mut session = s.session;
    for (i, &len) in sizes.iter().enumerate() {
        assert_eq!(session.sync("wait").unwrap(), "written");
        let n = len as usize;
        let ok = s.mr.as_slice()[..n] == pattern(n, i as u8)[..];
        session.sync(if ok { "ok" } else { "bad" }).unwrap();
        assert!(ok, "WRITE of {len} B: bytes differ at the server");
    }
    session.sync("bye").unwrap();
}

/// Phase 2's steady pair: WRITE + READ of 4 KiB, each READ checked,
/// until the orchestrator creates the stop file (the garbage app is done);
/// prints progress so the orchestrator knows it is flowing.
fn steady_client(a: &Args) {
    let stop = PathBuf::from(arg(&a.extra, "--stop-file").expect("--stop-file"));
    let mut s = side(a, "rnic0", 8192, false, (14, 7));
    let mut r = 0u32;
    while !stop.exists() {
        let p = pattern(4096, r as u8);
        s.mr.as_mut_slice()[..4096].copy_from_slice(&p);
        s.qp.post_write(LocalBuf::of(&s.mr, 0, 4096), &s.remote, 0, 1, true)
            .unwrap();
        wait_ok(&s.cq, "steady WRITE");
        s.qp.post_read(LocalBuf::of(&s.mr, 4096, 4096), &s.remote, 0, 2, true)
            .unwrap();
        wait_ok(&s.cq, "steady READ");
        assert!(
            s.mr.as_slice()[4096..] == p[..],
            "steady round {r}: bytes differ"
        );
        if r == 0 {
            println!("steady: flowing");
        }
        r += 1;
    }
    println!("steady: {r} rounds verified while the garbage app ran");
    s.session.sync("bye").unwrap();
}

fn steady_server(a: &Args) {
    let mut s = side(a, "rnic1", 8192, true, (14, 7));
    // Print the region's keys for the garbage app to try.
    println!("keys lkey={} rkey={} va={}", s.mr.lkey, s.mr.rkey, s.mr.va);
    s.session.sync("bye").unwrap();
}

/// Phase 2's hostile app: two devices in one process (rnic0 and rnic1),
/// a QP pair per case, every bad WQE answered by an error CQE.
fn garbage(a: &Args) {
    let victim_lkey: u32 = arg(&a.extra, "--victim-lkey").unwrap().parse().unwrap();
    let victim_rkey: u32 = arg(&a.extra, "--victim-rkey").unwrap().parse().unwrap();
    let victim_va: u64 = arg(&a.extra, "--victim-va").unwrap().parse().unwrap();
    let d0 = Device::open_with(&a.socket, "rnic0", 8 << 20).unwrap();
    let d1 = Device::open_with(&a.socket, "rnic1", 8 << 20).unwrap();
    // The limits the device reports are the ones the ABI enforces.
    let caps = d0.info().caps;
    assert_eq!(
        (caps.max_send_sge, caps.max_recv_sge, caps.max_inline_data),
        (
            shm::abi::WQE_MAX_SGE as u32,
            shm::abi::RECV_WQE_MAX_SGE as u32,
            transport::rc::MAX_INLINE_DATA as u32
        )
    );
    println!("garbage: device caps {caps:?}");
    let pd0 = d0.alloc_pd().unwrap();
    let pd1 = d1.alloc_pd().unwrap();
    let mr0 = pd0.alloc_mr(4096, ALL).unwrap();
    let mr1 = pd1.alloc_mr(4096, ALL).unwrap();
    let cq0 = d0.create_cq(1024).unwrap();
    let cq1 = d1.create_cq(1024).unwrap();
    let pair = || -> (Qp, Qp) {
        let p0 = pd0.qp_builder(&cq0).timeout(8, 1).build().unwrap();
        let p1 = pd1.qp_builder(&cq1).timeout(8, 1).build().unwrap();
        let (e0, e1) = (p0.endpoint(), p1.endpoint());
        (p0.connect(&e1).unwrap(), p1.connect(&e0).unwrap())
    };
    let expect = |what: &str, want: WcStatus| {
        let c = poll_one(&cq0, Duration::from_secs(30))
            .unwrap()
            .unwrap_or_else(|| panic!("{what}: no CQE"));
        assert_eq!(c.status, want, "{what}");
        println!("garbage: {what} -> {:?}", c.status);
    };
    let wqe = |op: u8, lkey: u32, va: u64, len: u32, rkey: u32, rva: u64| {
        let mut w = shm::abi::Wqe {
            wr_id: 77,
            remote_va: rva,
            rkey,
            opcode: op,
            flags: shm::abi::WQE_SIGNALED,
            num_sge: 1,
            ..bytemuck::Zeroable::zeroed()
        };
        w.sges[0] = shm::abi::WqeSge { va, lkey, len };
        w
    };
    use shm::abi::wqe_op::{ATOMIC_FETCH_AND_ADD, RDMA_READ, RDMA_WRITE};
    let mine = mr1.remote();
    // A region of the peer without the remote-atomic right.
    let no_atomic = pd1
        .alloc_mr(
            64,
            MrAccess {
                remote_atomic: false,
                ..ALL
            },
        )
        .unwrap();
    let many = {
        let mut w = wqe(RDMA_WRITE, mr0.lkey, mr0.va, 8, mine.rkey, mine.va);
        w.num_sge = shm::abi::WQE_MAX_SGE as u8 + 1;
        w
    };
    let cases: [(&str, shm::abi::Wqe, WcStatus); 9] = [
        ("a WQE with too many SGEs", many, WcStatus::LocQpOpErr),
        (
            "an SGE outside the app's segment",
            wqe(
                RDMA_WRITE,
                mr0.lkey,
                0x7fff_0000_0000,
                64,
                mine.rkey,
                mine.va,
            ),
            WcStatus::LocProtErr,
        ),
        (
            "an atomic on a non-atomic MR",
            wqe(
                ATOMIC_FETCH_AND_ADD,
                mr0.lkey,
                mr0.va,
                8,
                no_atomic.rkey,
                no_atomic.va,
            ),
            WcStatus::RemAccessErr,
        ),
        (
            "an atomic with a 4-byte local buffer",
            wqe(
                ATOMIC_FETCH_AND_ADD,
                mr0.lkey,
                mr0.va,
                4,
                mine.rkey,
                mine.va,
            ),
            WcStatus::LocLenErr,
        ),
        (
            "unknown L_Key",
            wqe(RDMA_WRITE, 0x00ab_cdef, mr0.va, 64, mine.rkey, mine.va),
            WcStatus::LocProtErr,
        ),
        (
            "another app's L_Key",
            wqe(RDMA_WRITE, victim_lkey, victim_va, 64, mine.rkey, mine.va),
            WcStatus::LocProtErr,
        ),
        (
            "buffer outside the region",
            wqe(RDMA_READ, mr0.lkey, mr0.va + 4000, 200, mine.rkey, mine.va),
            WcStatus::LocProtErr,
        ),
        (
            "unknown opcode",
            wqe(77, mr0.lkey, mr0.va, 64, mine.rkey, mine.va),
            WcStatus::LocQpOpErr,
        ),
        (
            "another app's R_Key",
            wqe(RDMA_WRITE, mr0.lkey, mr0.va, 64, victim_rkey, victim_va),
            WcStatus::RemAccessErr,
        ),
    ];
    for (what, w, want) in cases {
        let (q0, _q1) = pair();
        q0.post_raw(&w).unwrap();
        expect(what, want);
        // The QP is in ERR now: the next WQE is flushed.
        q0.post_raw(&wqe(RDMA_WRITE, mr0.lkey, mr0.va, 8, mine.rkey, mine.va))
            .unwrap();
        expect(&format!("{what}, then a good WQE"), WcStatus::WrFlushErr);
    }
    // RTR towards an address nobody owns: accepted (its MAC is resolved
    // by ARP when frames go), and a WRITE to it fails once its retries
    // are spent, as with any unreachable peer.
    let p = pd0.qp_builder(&cq0).build().unwrap();
    let q = p
        .connect(&verbs::Endpoint {
            qpn: 1,
            psn: 0,
            ip: "10.9.9.9".parse().unwrap(),
            mr: None,
        })
        .expect("RTR towards an address not yet resolved");
    q.post_raw(&wqe(RDMA_WRITE, mr0.lkey, mr0.va, 8, mine.rkey, mine.va))
        .unwrap();
    expect(
        "WRITE to 10.9.9.9, which never answers ARP",
        WcStatus::RetryExcErr,
    );
    let q_init = pd0.qp_builder(&cq0).build().unwrap();
    q_init
        .qp()
        .post_raw(&wqe(RDMA_WRITE, mr0.lkey, mr0.va, 8, mine.rkey, mine.va))
        .unwrap();
    expect("QP in INIT", WcStatus::LocQpOpErr);
    // Random bytes as WQEs: each completes (with whatever error fits) and
    // nothing else happens.
    let (q0, _q1) = pair();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..64 {
        let mut bytes = [0u8; 256];
        for b in bytes.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        let mut w: shm::abi::Wqe = bytemuck::cast(bytes);
        w.flags &= 1;
        let _ = q0.post_raw(&w);
    }
    let mut n = 0;
    while let Some(c) = poll_one(&cq0, Duration::from_secs(1)).unwrap() {
        assert_ne!(
            c.status,
            WcStatus::Success,
            "random WQE {} succeeded",
            c.wr_id
        );
        n += 1;
    }
    println!("garbage: {n} error CQEs for 64 random WQEs");
    assert!(n >= 1);
    // A scribbled producer index: the QP goes to ERR, nothing else.
    let (q0, _q1) = pair();
    q0.scribble_sq_index(0xdead_beef);
    std::thread::sleep(Duration::from_millis(50));
    let st = q0.query().unwrap().state;
    assert_eq!(st, "ERR", "scribbled SQ index");
    println!("garbage: scribbled SQ index -> QP {st}");
    assert!(d0.query_port().unwrap().link_up, "the port is still up");
    // post_recv on a QP attached to an SRQ is refused by name.
    let srq = pd1.create_srq(16).unwrap();
    let q_srq = pd1.qp_builder(&cq1).srq(&srq).build().unwrap();
    let r = q_srq
        .qp()
        .post_recv(&[verbs::RecvRequest::new(1, LocalBuf::of(&mr1, 0, 64))]);
    let e = r.expect_err("post_recv on an SRQ-attached QP refused");
    assert!(e.to_string().contains("shared receive queue"), "{e}");
    println!("garbage: post_recv on an SRQ-attached QP -> {e}");
    // A shared receive queue feeds a QP's SENDs; its limit event reaches
    // the application once.
    let srq2 = pd1.create_srq(8).unwrap();
    let recvs: Vec<verbs::RecvRequest> = (0..4)
        .map(|i| verbs::RecvRequest::new(100 + i, LocalBuf::of(&mr1, 64 * i, 64)))
        .collect();
    srq2.post_recv(&recvs).unwrap();
    srq2.set_limit(3).unwrap();
    let p0 = pd0.qp_builder(&cq0).build().unwrap();
    // Receive completions on a CQ of their own.
    let cq1r = d1.create_cq(64).unwrap();
    let p1 = pd1
        .qp_builder(&cq1)
        .srq(&srq2)
        .recv_cq(&cq1r)
        .build()
        .unwrap();
    let (e0, e1) = (p0.endpoint(), p1.endpoint());
    let (s0, _s1) = (p0.connect(&e1).unwrap(), p1.connect(&e0).unwrap());
    for i in 0..2 {
        s0.post_send(LocalBuf::of(&mr0, 0, 16), Some(i), u64::from(i), true)
            .unwrap();
        expect("a SEND into the SRQ", WcStatus::Success);
        let c = poll_one(&cq1r, Duration::from_secs(30))
            .unwrap()
            .expect("receive CQE");
        assert_eq!(
            (c.wr_id, c.status, c.imm),
            (100 + u64::from(i), WcStatus::Success, Some(i))
        );
    }
    assert!(
        poll_one(&cq1, Duration::from_millis(50)).unwrap().is_none(),
        "receive completions go to the receive CQ only"
    );
    let info = srq2.query().unwrap();
    assert_eq!(
        (info.wqes, info.limit, info.limit_events),
        (2, 0, 1),
        "{info:?}"
    );
    println!("garbage: SRQ after 2 SENDs -> {info:?}");
    // A receive request with more scatter/gather entries than a receive
    // WQE holds is refused by name.
    let eight = [LocalBuf::of(&mr1, 0, 8); 8].map(|b| transport::rc::Sge {
        lkey: b.lkey,
        va: b.va,
        len: b.len,
    });
    let too_many = verbs::RecvRequest {
        sges: Some(transport::rc::SgList::new(&eight).unwrap()),
        ..verbs::RecvRequest::new(1, LocalBuf::of(&mr1, 0, 8))
    };
    let (_q0, q1) = pair();
    let e = q1
        .post_recv(&[too_many])
        .expect_err("8 receive SGEs refused");
    assert!(e.to_string().contains("scatter/gather"), "{e}");
    println!("garbage: a receive WQE with 8 SGEs -> {e}");
    // A receive WQE whose SGE is outside the receiver's regions: the SEND
    // that lands on it fails the receive WQE (LOC_PROT_ERR) and the
    // sender's (REM_OP_ERR).
    let (q0, q1) = pair();
    q1.post_recv(&[verbs::RecvRequest::new(
        5,
        LocalBuf {
            lkey: mr1.lkey,
            va: 0x7fff_0000_0000,
            len: 64,
        },
    )])
    .unwrap();
    q0.post_send(LocalBuf::of(&mr0, 0, 64), None, 6, true)
        .unwrap();
    expect(
        "a SEND into a receive WQE outside the segment",
        WcStatus::RemOpErr,
    );
    let c = poll_one(&cq1, Duration::from_secs(30))
        .unwrap()
        .expect("receive CQE");
    assert_eq!((c.wr_id, c.status), (5, WcStatus::LocProtErr));
    println!("garbage: its receive WQE -> {:?}", c.status);
    println!("garbage: done");
}

/// Phase 3's victim: WRITEs 1 MiB messages forever, until killed.
fn victim_client(a: &Args) {
    let s = side(a, "rnic0", 1 << 20, false, (10, 3));
    println!("victim: running");
    let mut k = 0u64;
    loop {
        for _ in 0..4 {
            let _ =
                s.qp.post_write(LocalBuf::of(&s.mr, 0, 1 << 20), &s.remote, 0, k, true);
            k += 1;
        }
        let mut out = [verbs::empty_completion(); 8];
        let _ = s.cq.poll(&mut out);
    }
}

/// Phase 3's peer: READs the victim's region in a loop; after the victim
/// dies a READ must fail (retries run out), which it reports.
fn victim_server(a: &Args) {
    let s = side(a, "rnic1", 1 << 20, true, (10, 3));
    let t0 = Instant::now();
    loop {
        s.qp.post_read(LocalBuf::of(&s.mr, 0, 65536), &s.remote, 0, 1, true)
            .unwrap();
        let c = poll_one(&s.cq, Duration::from_secs(60))
            .unwrap()
            .expect("a READ completion");
        if c.status != WcStatus::Success {
            println!(
                "peer: READ failed with {:?} after the victim died",
                c.status
            );
            return;
        }
        assert!(t0.elapsed() < Duration::from_secs(120), "victim never died");
    }
}

fn role(a: Args) {
    let sizes = [0u32, 1, 1023, 1024, 1025, 4096, 65_536, 1 << 20];
    match a.role.as_str() {
        "client" => exchange_client(&a, &sizes),
        "server" => exchange_server(&a, &sizes),
        "small-client" => exchange_client(&a, &[64, 65_536]),
        "small-server" => exchange_server(&a, &[64, 65_536]),
        "steady-client" => steady_client(&a),
        "steady-server" => steady_server(&a),
        "garbage" => garbage(&a),
        "victim-client" => victim_client(&a),
        "victim-server" => victim_server(&a),
        r => panic!("unknown role {r}"),
    }
}

// ---------------------------------------------------------------------
// The orchestrator.

fn free_addr() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

fn app(socket: &Path, role: &str, addr: &str, extra: &[String]) -> Running {
    Running::spawn(
        Command::new(std::env::current_exe().unwrap())
            .args(["--role", role, "--socket"])
            .arg(socket)
            .args(["--addr", addr])
            .args(extra),
    )
    .unwrap_or_else(|e| panic!("start {role}: {e}"))
}

/// Waits for an app (at most [`RUN_LIMIT`]); returns its output,
/// panicking if it failed.
fn finish(mut child: Running, role: &str) -> String {
    let f = child.finish(RUN_LIMIT);
    print!("{}", f.stdout);
    eprint!("{}", f.stderr);
    assert!(f.success(), "{role} failed: {:?}", f.status);
    f.stdout
}

fn read_line_with(child: &mut Running, prefix: &str) -> String {
    child
        .line_starting(prefix, RUN_LIMIT)
        .unwrap_or_else(|| panic!("no {prefix:?} line"))
}

fn stats(socket: &Path) -> dataplane::service::ServiceCounters {
    dataplane::service::query_stats(socket)
        .expect("stats over the socket")
        .service
        .expect("service counters")
}

/// Phase 0: the control socket answers bad requests with typed errors naming
/// the bad value, and closes a connection that sends garbage.
/// What `dataplane stats --socket` prints about the running daemon.
fn stats_cli(sock: &Path) -> String {
    let f = testkit::output_within(
        Command::new(env!("CARGO_BIN_EXE_dataplane"))
            .args(["stats", "--socket"])
            .arg(sock),
        RUN_LIMIT,
    )
    .unwrap();
    assert!(f.success(), "dataplane stats: {}", f.text());
    f.stdout
}

fn control_errors(sock: &Path) {
    use shm::proto::{self, ErrorKind, ReplyMsg, Request, RequestMsg};
    use shm::VERSION;
    let mut s = std::os::unix::net::UnixStream::connect(sock).unwrap();
    let mut ask = |v: u32, req: Request| -> shm::proto::ErrorReply {
        proto::send_message(&mut s, &RequestMsg { v, id: 5, req }).unwrap();
        let r: ReplyMsg = proto::read_message(&mut s).unwrap();
        assert_eq!(r.id, 5);
        r.result.expect_err("an error")
    };
    let open = |device: &str, shm_bytes: u64| Request::OpenDevice {
        device: device.into(),
        shm_bytes,
    };
    // A client of another contract version is refused by name at its
    // first message (the connection stays usable for the right one).
    let older = VERSION - 1;
    let cases = [
        (
            ask(older, open("rnic0", 1 << 24)),
            ErrorKind::Version,
            format!("contract version {older}, this daemon {VERSION}"),
        ),
        (
            ask(VERSION, Request::AllocPd),
            ErrorKind::NotOpen,
            "OpenDevice".into(),
        ),
        (
            ask(99, Request::QueryPort),
            ErrorKind::Version,
            "version 99".into(),
        ),
        (
            ask(VERSION, open("rnic9", 1 << 24)),
            ErrorKind::NoSuchDevice,
            "rnic9".into(),
        ),
        (
            ask(VERSION, open("rnic0", 1 << 50)),
            ErrorKind::InvalidArgument,
            "1125899906842624".into(),
        ),
    ];
    for (e, kind, names) in cases {
        assert_eq!(e.kind, kind, "{e}");
        assert!(e.message.contains(&names), "{e} should name {names}");
        println!("control: {e}");
    }
    // A frame that is not a request: a Malformed reply, then the close.
    std::io::Write::write_all(&mut s, b"\x03\0\0\0{x}").unwrap();
    let r: ReplyMsg = proto::read_message(&mut s).unwrap();
    assert_eq!(r.result.unwrap_err().kind, ErrorKind::Malformed);
    let mut rest = Vec::new();
    assert_eq!(
        std::io::Read::read_to_end(&mut s, &mut rest).unwrap(),
        0,
        "closed"
    );
    println!("ok: bad control requests get typed errors; garbage closes the connection");
}

/// CQs by slot: a destroyed CQ's slot goes to the next CQ created, and
/// each completion reaches the CQ its QP names for it (sends and receives
/// apart), in a QP connected to itself.
fn cq_slots(sock: &Path) {
    let dev = Device::open_with(sock, "rnic0", 8 << 20).expect("open device");
    let pd = dev.alloc_pd().expect("PD");
    let mut mr = pd.alloc_mr(8192, ALL).expect("MR");
    let gone = dev.create_cq(16).expect("CQ");
    let recv_cq = dev.create_cq(16).expect("CQ");
    drop(gone);
    let send_cq = dev.create_cq(16).expect("CQ in the freed slot");
    let prepared = pd
        .qp_builder(&send_cq)
        .recv_cq(&recv_cq)
        .build()
        .expect("QP");
    let mut me = prepared.endpoint();
    me.mr = Some(mr.remote());
    let qp = prepared.connect(&me).expect("QP connected to itself");
    qp.post_recv(&[RecvRequest::new(7, LocalBuf::of(&mr, 4096, 64))])
        .unwrap();
    mr.as_mut_slice()[..64].copy_from_slice(&pattern(64, 3));
    qp.post_send(LocalBuf::of(&mr, 0, 64), None, 8, true)
        .unwrap();
    assert_eq!(wait_ok(&send_cq, "SEND").wr_id, 8);
    assert_eq!(wait_ok(&recv_cq, "receive").wr_id, 7);
    assert_eq!(mr.as_slice()[4096..4160], pattern(64, 3)[..]);
    for cq in [&send_cq, &recv_cq] {
        let extra = poll_one(cq, Duration::from_millis(50)).unwrap();
        assert!(extra.is_none(), "one CQE each, then {extra:?}");
    }
    assert_eq!(stats(sock).cqs, 2);
    drop((qp, send_cq, recv_cq, mr, pd, dev));
    println!(
        "ok: a freed CQ slot serves the next CQ; sends and receives complete into their own CQs"
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(r) = arg(&args, "--role") {
        role(Args {
            role: r,
            socket: arg(&args, "--socket").unwrap().into(),
            addr: arg(&args, "--addr").unwrap(),
            extra: args.clone(),
        });
        return;
    }
    let mut d = start_daemon("apps-shm");
    let sock = d.socket.clone();

    control_errors(&sock);
    cq_slots(&sock);

    // 1. Two apps, WRITE and READ 0 B .. 1 MiB.
    let addr = free_addr();
    let s = app(&sock, "server", &addr, &[]);
    let c = app(&sock, "client", &addr, &[]);
    finish(c, "client");
    finish(s, "server");
    // The payloads of 1 KiB and more went from the apps' memory where it
    // lies (net_ring ports, zero-copy TX on by default).
    let text = stats_cli(&sock);
    let zero_copy: u64 = text
        .lines()
        .filter_map(|l| l.split("zero-copy TX: ").nth(1))
        .filter_map(|r| r.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    assert!(
        zero_copy > 1000,
        "frames sent zero-copy: {zero_copy}\n{text}"
    );
    println!("ok: two apps WRITE and READ 0 B .. 1 MiB, bytes verified ({zero_copy} frames sent zero-copy)");

    // 2. Garbage beside a steady pair.
    let addr = free_addr();
    let stop_file = d.dir.path().join("garbage-done");
    let mut ss = app(&sock, "steady-server", &addr, &[]);
    let mut sc = app(
        &sock,
        "steady-client",
        &addr,
        &["--stop-file".to_string(), stop_file.display().to_string()],
    );
    let keys = read_line_with(&mut ss, "keys ");
    read_line_with(&mut sc, "steady: flowing");
    let field = |k: &str| {
        keys.split_whitespace()
            .find_map(|f| f.strip_prefix(k))
            .unwrap()
            .to_string()
    };
    let extra = [
        "--victim-lkey".to_string(),
        field("lkey="),
        "--victim-rkey".to_string(),
        field("rkey="),
        "--victim-va".to_string(),
        field("va="),
    ];
    let g = app(&sock, "garbage", &free_addr(), &extra);
    let out = finish(g, "garbage");
    assert!(out.contains("garbage: done"));
    std::fs::write(&stop_file, b"").unwrap();
    finish(sc, "steady-client");
    finish(ss, "steady-server");
    let st = stats(&sock);
    assert!(st.wqe_errors >= 3 && st.sq_corrupt == 1, "{st:?}");
    // The steady pair kept the dataplane busy: its busy time counts.
    assert!(st.busy_ns > 0 && st.passes > st.idle_passes, "{st:?}");
    println!("ok: garbage WQEs got error CQEs while the steady pair kept flowing");

    // 3. SIGKILL mid-transfer.
    let addr = free_addr();
    let vs = app(&sock, "victim-server", &addr, &[]);
    let mut vc = app(&sock, "victim-client", &addr, &[]);
    read_line_with(&mut vc, "victim: running");
    std::thread::sleep(Duration::from_millis(300));
    vc.kill();
    let out = finish(vs, "victim-server");
    assert!(out.contains("READ failed"), "the peer saw no error");
    let t0 = Instant::now();
    loop {
        let st = stats(&sock);
        if (st.apps, st.qps, st.mrs, st.cqs) == (0, 0, 0, 0) {
            println!("ok: after SIGKILL every resource is released: {st:?}");
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "left behind: {st:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let addr = free_addr();
    let s = app(&sock, "small-server", &addr, &[]);
    let c = app(&sock, "small-client", &addr, &[]);
    finish(c, "small-client");
    finish(s, "small-server");
    println!("ok: the daemon serves a new pair after the kill");

    // Counters of the running daemon, from the command line.
    let text = stats_cli(&sock);
    assert!(text.contains("service: apps 0 (opened 11"), "{text}");
    assert!(text.contains("rx_pkts"), "{text}");
    println!("ok: dataplane stats --socket reads the running daemon");

    // 4. SIGTERM.
    let (status, out) = d.stop(nix::sys::signal::Signal::SIGTERM);
    print!("{out}");
    assert!(
        status.is_some_and(|s| s.success()),
        "daemon exit {status:?}"
    );
    assert!(out.contains("stopped: apps opened"), "{out}");
    println!("ok: SIGTERM stops the daemon");

    // 5. Two dataplane lcores.
    let d2 = start_daemon_with("apps-shm-2", "", "lcores = 2");
    let sock = d2.socket.clone();
    let names: Vec<String> = verbs::list_devices(&sock)
        .unwrap()
        .into_iter()
        .map(|d| d.name)
        .collect();
    assert_eq!(names, ["rnic0", "rnic1"], "in the daemon's order");
    let addr = free_addr();
    let s = app(&sock, "small-server", &addr, &[]);
    let c = app(&sock, "small-client", &addr, &[]);
    finish(c, "small-client");
    finish(s, "small-server");
    let text = stats_cli(&sock);
    assert!(
        text.contains("service: apps 0 (opened 2 closed 2)"),
        "{text}"
    );
    for host in ["host 0 all QPs", "host 1 all QPs"] {
        assert!(text.contains(host), "{host}: {text}");
    }
    println!("ok: two dataplane lcores serve a pair across them, one snapshot of both");
    drop(d2);

    // 6. The control thread does not share the pinned lcore's CPU (where
    // it would wait for the spinning lcore's time slice before each
    // reply), when the process has another.
    let this = nix::unistd::Pid::from_raw(0);
    let allowed = dataplane::service::cpus_in(&nix::sched::sched_getaffinity(this).unwrap());
    if let [.., last] = allowed[..] {
        if allowed.len() < 2 {
            println!("skipped: the control thread's CPUs (one CPU here)");
            return;
        }
        let d3 = start_daemon_with("apps-shm-pin", &format!(", \"--lcores=0@({last})\""), "");
        let cpus_of = |name: &str| -> Vec<usize> {
            let tasks = format!("/proc/{}/task", d3.child.id());
            let tid = std::fs::read_dir(&tasks)
                .unwrap()
                .flatten()
                .find(|t| {
                    std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == name)
                })
                .unwrap_or_else(|| panic!("no {name} thread in {tasks}"));
            let tid: i32 = tid.file_name().to_str().unwrap().parse().unwrap();
            let set = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(tid)).unwrap();
            dataplane::service::cpus_in(&set)
        };
        // A reply means the control thread runs: it named itself and
        // chose its CPUs before it served the socket.
        verbs::list_devices(&d3.socket).expect("the pinned daemon answers");
        assert_eq!(cpus_of("dataplane"), [last], "the main lcore's CPU");
        let control = cpus_of("rnic-control");
        let expect: Vec<usize> = allowed.iter().copied().filter(|&c| c != last).collect();
        assert_eq!(control, expect, "the control thread's CPUs");
        println!("ok: the control thread runs on CPUs {control:?}, the lcore alone on CPU {last}");
    }
}
