//! The RC engine end to end between two engines, without faults: WRITE and
//! READ of every size class land byte for byte and complete in order.

mod rc_util;

use rc_util::{Dir, Pair, Setup};
use transport::rc::{WcOpcode, WcStatus, WrOp};
use transport::wire::Opcode;

#[test]
fn writes_of_every_size_class_land_byte_for_byte() {
    let mut p = Pair::new(Setup::default());
    let sizes = [0u32, 1, 1023, 1024, 1025, 4096, 100_000, 1 << 20];
    let mut off = 0u64;
    for (i, &len) in sizes.iter().enumerate() {
        p.fill_a(off, len as usize, i as u8);
        let wr = p.wr(i as u64, WrOp::Write, off, off, len);
        p.post(wr);
        off += u64::from(len) + 64;
    }
    p.run(1_000_000_000);
    let cqes = p.completions_a();
    assert_eq!(cqes.len(), sizes.len());
    let mut off = 0u64;
    for (i, (&len, c)) in sizes.iter().zip(&cqes).enumerate() {
        assert_eq!(c.wr_id, i as u64, "completions in post order");
        assert_eq!(c.status, WcStatus::Success);
        assert_eq!(c.opcode, WcOpcode::RdmaWrite);
        assert_eq!(c.byte_len, len);
        assert_eq!(
            p.a_bytes(off, len as usize),
            p.b_bytes(off, len as usize),
            "write {i}"
        );
        off += u64::from(len) + 64;
    }
}

#[test]
fn reads_of_every_size_class_land_byte_for_byte() {
    let mut p = Pair::new(Setup::default());
    let sizes = [0u32, 1, 1023, 1024, 1025, 8192, 300_000];
    let mut off = 0u64;
    for (i, &len) in sizes.iter().enumerate() {
        p.fill_b(off, len as usize, 0x40 + i as u8);
        let wr = p.wr(i as u64, WrOp::Read, off, off, len);
        p.post(wr);
        off += u64::from(len) + 64;
    }
    p.run(1_000_000_000);
    let cqes = p.completions_a();
    assert_eq!(cqes.len(), sizes.len());
    let mut off = 0u64;
    for (i, (&len, c)) in sizes.iter().zip(&cqes).enumerate() {
        assert_eq!(
            (c.wr_id, c.status, c.opcode),
            (i as u64, WcStatus::Success, WcOpcode::RdmaRead)
        );
        assert_eq!(
            p.a_bytes(off, len as usize),
            p.b_bytes(off, len as usize),
            "read {i}"
        );
        off += u64::from(len) + 64;
    }
}

#[test]
fn segmentation_uses_first_middle_last_and_only() {
    let mut p = Pair::new(Setup::default());
    let wr = p.wr(1, WrOp::Write, 0, 0, 3000);
    p.post(wr);
    let wr = p.wr(2, WrOp::WriteImm(7), 0, 0, 10);
    p.post(wr);
    let rwr = p.recv_wr(9, 0, 0);
    p.post_recv_b(rwr);
    p.run(1_000_000_000);
    let ops: Vec<Opcode> = p.ops(Dir::AtoB);
    assert_eq!(
        ops,
        [
            Opcode::RdmaWriteFirst,
            Opcode::RdmaWriteMiddle,
            Opcode::RdmaWriteLast,
            Opcode::RdmaWriteOnlyWithImmediate
        ]
    );
}

#[test]
fn interleaved_reads_and_writes_all_complete() {
    let mut p = Pair::new(Setup::default());
    for i in 0..40u64 {
        let len = [0u32, 5, 1024, 3000, 70_000][(i % 5) as usize];
        let off = i * 80_000;
        let op = if i % 3 == 0 { WrOp::Read } else { WrOp::Write };
        p.fill_a(off, len as usize, i as u8);
        p.fill_b(off, len as usize, 0x80 | i as u8);
        let wr = p.wr(i, op, off, off, len);
        p.post(wr);
    }
    p.run(1_000_000_000);
    let cqes = p.completions_a();
    assert_eq!(
        cqes.len(),
        40,
        "{:?}",
        p.a.nic.engine_mut().qp_counters(p.a.qpn)
    );
    for (i, c) in cqes.iter().enumerate() {
        assert_eq!((c.wr_id, c.status), (i as u64, WcStatus::Success));
        let len = [0usize, 5, 1024, 3000, 70_000][i % 5];
        let off = i as u64 * 80_000;
        assert_eq!(p.a_bytes(off, len), p.b_bytes(off, len), "op {i}");
    }
}

/// A burst of posts to one QP at one time (as a doorbell brings them; the
/// engine refreshes the QP once for the burst) sends every WR, and a WR
/// with a bad local key in the middle still fails in its turn: the ones
/// before it complete, it completes with LOC_PROT_ERR, the ones after it
/// are flushed.
#[test]
fn a_burst_of_posts_goes_in_order_and_a_bad_local_key_in_it_fails_in_its_turn() {
    let mut p = Pair::new(Setup::default());
    for i in 0..12u64 {
        let mut wr = p.wr(i, WrOp::Write, i * 100, i * 100, 64);
        if i == 8 {
            let mut sge = wr.sg.as_slice()[0];
            sge.lkey ^= 0x5a5a;
            wr.sg = transport::rc::SgList::one(sge);
        }
        p.fill_a(i * 100, 64, i as u8);
        p.post(wr);
    }
    assert_eq!(
        p.a.nic.engine_mut().poll_timeout(),
        Some(0),
        "the posts are due at once"
    );
    p.run(1_000_000_000);
    let got: Vec<(u64, WcStatus)> = p
        .completions_a()
        .iter()
        .map(|c| (c.wr_id, c.status))
        .collect();
    let mut want: Vec<(u64, WcStatus)> = (0..8).map(|i| (i, WcStatus::Success)).collect();
    want.push((8, WcStatus::LocProtErr));
    want.extend((9..12).map(|i| (i, WcStatus::WrFlushErr)));
    assert_eq!(got, want);
    for i in 0..8u64 {
        assert_eq!(p.a_bytes(i * 100, 64), p.b_bytes(i * 100, 64), "WR {i}");
    }
    assert_eq!(
        p.ops(Dir::AtoB).len(),
        8,
        "only the WRs before the bad one went"
    );
}

#[test]
fn engine_defaults_are_valid_for_slow_and_fast_links() {
    for rate in [1_000_000u64, 1_000_000_000, 400_000_000_000] {
        let c = transport::rc::EngineConfig::new(rc_util::MAC_A, rc_util::IP_A, rate);
        assert!(c.hpcc.validate().is_ok(), "{rate}");
        assert!(c.hpcc.w_init >= c.hpcc.w_min);
    }
}

/// A region whose virtual addresses (the application's) are not its
/// device addresses: every access, local and remote, lands at the device
/// address the region maps it to (what `ibv_reg_mr` of an application's
/// own buffer needs).
#[test]
fn a_region_at_its_own_virtual_address_is_reached_at_its_device_address() {
    use rc_util::MR_BASE;
    use transport::mr::{Access, DEFAULT_PD};
    use transport::rc::{RecvWr, SendWr, SgList, Sge};
    const APP_VA: u64 = 0x7f12_3456_7000;
    const DEV_OFF: u64 = 8 << 20;
    const LEN: u64 = 1 << 20;
    let mut p = Pair::new(Setup::default());
    let ka =
        p.a.engine_mut()
            .register_mr_at(DEFAULT_PD, APP_VA, LEN, Access::ALL, MR_BASE + DEV_OFF)
            .unwrap();
    let kb =
        p.b.engine_mut()
            .register_mr_at(DEFAULT_PD, APP_VA, LEN, Access::ALL, MR_BASE + DEV_OFF)
            .unwrap();
    let sge = |k: transport::mr::MrKeys, off: u64, len: u32| Sge {
        lkey: k.lkey,
        va: APP_VA + off,
        len,
    };
    // WRITE 3000 B (3 packets) from A's app VA 0 to B's app VA 100.
    p.fill_a(DEV_OFF, 3000, 7);
    p.post(SendWr::new(
        1,
        WrOp::Write,
        sge(ka, 0, 3000),
        kb.rkey,
        APP_VA + 100,
    ));
    // READ 2500 B of B at app VA 200_000 into A at app VA 300_000.
    p.fill_b(DEV_OFF + 200_000, 2500, 9);
    p.post(SendWr::new(
        2,
        WrOp::Read,
        sge(ka, 300_000, 2500),
        kb.rkey,
        APP_VA + 200_000,
    ));
    // FETCH_ADD on B's app VA 8000, original into A's app VA 8000.
    p.fill_b(DEV_OFF + 8000, 8, 0);
    let add = WrOp::FetchAdd { add: 5 };
    p.post(SendWr::new(
        3,
        add,
        sge(ka, 8000, 8),
        kb.rkey,
        APP_VA + 8000,
    ));
    // SEND 1500 B into a receive WQE over B's app VA 400_000.
    p.fill_a(DEV_OFF + 50_000, 1500, 3);
    p.post_recv_b(RecvWr {
        wr_id: 9,
        sg: SgList::one(sge(kb, 400_000, 4096)),
    });
    p.post(SendWr::new(4, WrOp::Send, sge(ka, 50_000, 1500), 0, 0));
    p.run(1_000_000_000);
    let done: Vec<_> = p
        .completions_a()
        .iter()
        .map(|c| (c.wr_id, c.status))
        .collect();
    assert_eq!(
        done,
        (1..=4).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>()
    );
    assert_eq!(p.b_bytes(DEV_OFF + 100, 3000), p.a_bytes(DEV_OFF, 3000));
    assert_eq!(
        p.a_bytes(DEV_OFF + 300_000, 2500),
        p.b_bytes(DEV_OFF + 200_000, 2500)
    );
    let before = u64::from_ne_bytes(p.a_bytes(DEV_OFF + 8000, 8).try_into().unwrap());
    let after = u64::from_ne_bytes(p.b_bytes(DEV_OFF + 8000, 8).try_into().unwrap());
    assert_eq!(after, before.wrapping_add(5));
    assert_eq!(
        p.b_bytes(DEV_OFF + 400_000, 1500),
        p.a_bytes(DEV_OFF + 50_000, 1500)
    );
    // Nothing landed at the application addresses themselves.
    assert!(p.b_bytes(100, 3000) != p.a_bytes(DEV_OFF, 3000));
}

/// A pipeline asks `may_transmit` before it takes a buffer to build in:
/// it is false only when `poll_transmit` has nothing to send.
#[test]
fn may_transmit_is_false_only_when_poll_transmit_has_nothing() {
    let mut p = Pair::new(Setup::default());
    let mut buf = vec![0u8; 16 * 1024];
    let e = p.a.nic.engine_mut();
    assert!(!e.may_transmit(0), "an idle engine");
    assert!(e.poll_transmit(0, &mut buf).is_none());
    p.fill_a(0, 5000, 7);
    let wr = p.wr(0, WrOp::Write, 0, 0, 5000);
    p.post(wr);
    let e = p.a.nic.engine_mut();
    let mut sent = 0;
    loop {
        let may = e.may_transmit(0);
        let frame = e.poll_transmit(0, &mut buf);
        if !may {
            assert!(frame.is_none(), "a frame after may_transmit said none");
            break;
        }
        match frame {
            Some(_) => sent += 1,
            None => assert!(!e.may_transmit(0), "nothing sent, yet more to send"),
        }
    }
    assert_eq!(sent, 5, "a 5000 B WRITE at MTU 1024");
}

/// Two engines A and B at `line_rate_bps`, each with a 64 KiB region at
/// `BASE` and two QPs, A's connected to B's pairwise; and a 64 B WRITE
/// from A's region to B's.
fn two_qp_engines(
    line_rate_bps: u64,
) -> (
    transport::rc::Engine<transport::mr::VecMemory>,
    [u32; 2],
    [u32; 2],
    impl Fn(u64) -> transport::rc::SendWr,
) {
    use std::net::Ipv4Addr;
    use transport::mr::{Access, VecMemory};
    use transport::rc::{ConnectParams, Endpoint, Engine, EngineConfig, PathMtu, SendWr, Sge};
    use transport::wire::MacAddr;

    const BASE: u64 = 0x10_0000;
    let engine = |i: u8| {
        let mut mem = VecMemory::new();
        mem.add(BASE, 1 << 16);
        let cfg = EngineConfig::new(
            MacAddr([2, 0, 0, 0, 0, i + 1]),
            Ipv4Addr::new(10, 0, 0, i + 1),
            line_rate_bps,
        );
        let mut e = Engine::new(cfg, mem, 0);
        let keys = e.register_mr(BASE, 1 << 16, Access::ALL).unwrap();
        let qps = [e.create_qp(256, 0).unwrap(), e.create_qp(256, 0).unwrap()];
        (e, keys, qps)
    };
    let (mut a, ka, qa) = engine(0);
    let (mut b, kb, qb) = engine(1);
    let end = |e: &Engine<VecMemory>, qpn| Endpoint {
        qpn,
        psn: 0,
        mac: e.config().mac,
        ip: e.config().ip,
    };
    let p = ConnectParams::new(PathMtu::Mtu1024);
    for k in 0..2 {
        let (ea, eb) = (end(&a, qa[k]), end(&b, qb[k]));
        a.connect_to(qa[k], 0, &eb, &p).unwrap();
        b.connect_to(qb[k], 0, &ea, &p).unwrap();
    }
    let local = Sge {
        lkey: ka.lkey,
        va: BASE,
        len: 64,
    };
    let rkey = kb.rkey;
    let wr = move |id| SendWr::new(id, WrOp::Write, local, rkey, BASE + 4096);
    (a, qa, qb, wr)
}

/// (destination QP, PSN) of each frame `a` sends at `now` until it has
/// none.
fn frames_at(a: &mut transport::rc::Engine<transport::mr::VecMemory>, now: u64) -> Vec<(u32, u32)> {
    let mut buf = vec![0u8; 2048];
    let mut out = Vec::new();
    while let Some(n) = a.poll_transmit(now, &mut buf) {
        let p = transport::wire::Packet::parse(&buf[..n]).unwrap();
        out.push((p.repr.bth.dest_qp, p.repr.bth.psn));
    }
    out
}

/// hpcc.md, the flow scheduler: flows with packets to send take turns,
/// one packet each (round robin); a QP sending alone sends its packets
/// back to back, in PSN order, each granted as it goes.
#[test]
fn qps_with_packets_to_send_take_turns_one_packet_each() {
    let (mut a, qa, qb, wr) = two_qp_engines(100_000_000_000);
    // Alone: four posts to the first QP go back to back.
    for id in 0..4 {
        a.post_send(qa[0], wr(id), 1_000).unwrap();
    }
    let alone: Vec<_> = (0..4).map(|k| (qb[0], k)).collect();
    assert_eq!(frames_at(&mut a, 1_000), alone);
    // Together: three posts to each QP at one time take turns.
    for id in 0..3 {
        a.post_send(qa[0], wr(10 + id), 2_000).unwrap();
    }
    for id in 0..3 {
        a.post_send(qa[1], wr(20 + id), 2_000).unwrap();
    }
    let frames = frames_at(&mut a, 2_000);
    assert_eq!(frames.len(), 6);
    let order: Vec<u32> = frames.iter().map(|f| f.0).collect();
    assert!(
        order == [qb[0], qb[1], qb[0], qb[1], qb[0], qb[1]]
            || order == [qb[1], qb[0], qb[1], qb[0], qb[1], qb[0]],
        "not one packet each in turn: {order:?}"
    );
    for q in [qb[0], qb[1]] {
        let psns: Vec<u32> = frames.iter().filter(|f| f.0 == q).map(|f| f.1).collect();
        let first = if q == qb[0] { 4 } else { 0 };
        assert_eq!(psns, vec![first, first + 1, first + 2], "QP {q}'s PSNs");
    }
    // Posted in turn (each post but the first two behind an unsent WR of
    // its QP), and one sent between posts: the same turns, nothing lost.
    for id in 0..3 {
        a.post_send(qa[0], wr(30 + id), 3_000).unwrap();
        a.post_send(qa[1], wr(40 + id), 3_000).unwrap();
    }
    let mut buf = vec![0u8; 2048];
    let n = a.poll_transmit(3_000, &mut buf).expect("the first");
    let p = transport::wire::Packet::parse(&buf[..n]).unwrap();
    let mut frames = vec![(p.repr.bth.dest_qp, p.repr.bth.psn)];
    a.post_send(qa[0], wr(33), 3_000).unwrap();
    a.post_send(qa[1], wr(43), 4_000).unwrap();
    frames.extend(frames_at(&mut a, 4_000));
    let order: Vec<u32> = frames.iter().map(|f| f.0).collect();
    assert_eq!(order.len(), 8, "frames: {frames:?}");
    for q in [qb[0], qb[1]] {
        let psns: Vec<u32> = frames.iter().filter(|f| f.0 == q).map(|f| f.1).collect();
        let first = if q == qb[0] { 7 } else { 3 };
        assert_eq!(
            psns,
            (first..first + 4).collect::<Vec<_>>(),
            "QP {q}'s PSNs"
        );
    }
    assert!(
        order.windows(2).all(|w| w[0] != w[1]),
        "not one packet each in turn: {order:?}"
    );
}

/// A pipeline asks `may_transmit` before it builds; asking changes
/// nothing the engine decides. QP 0 waits for credit with a WR unsent
/// and gets another posted behind it when the credit is due; QP 1, idle,
/// is posted to at that same time. The frames and their order are the
/// same whether or not `may_transmit` was asked between the two posts.
#[test]
fn asking_may_transmit_changes_no_decision() {
    let run = |ask: bool| {
        let (mut a, qa, _, wr) = two_qp_engines(1_000_000_000);
        let mut buf = vec![0u8; 2048];
        // QP 0 sends until its credit is spent; its last WR waits.
        let mut id = 0;
        loop {
            a.post_send(qa[0], wr(id), 1_000).unwrap();
            id += 1;
            if a.poll_transmit(1_000, &mut buf).is_none() {
                break;
            }
        }
        let due = a.poll_timeout().expect("the WR waiting for credit");
        a.post_send(qa[0], wr(100), due).unwrap();
        if ask {
            assert!(a.may_transmit(due));
        }
        a.post_send(qa[1], wr(200), due).unwrap();
        frames_at(&mut a, due)
    };
    let (plain, asked) = (run(false), run(true));
    assert!(plain.len() >= 2, "frames: {plain:?}");
    assert_eq!(plain, asked);
}

/// hpcc.md, the flow scheduler: credit accrues with elapsed time x R and
/// a flow whose credit covers its packet sends it. A WR posted when the
/// QP has earned the credit for its packet leaves at once, whatever
/// the QP sent before and however little the engine was called since.
#[test]
fn a_post_leaves_at_once_when_its_qp_has_earned_the_credit() {
    const RATE: u64 = 1_000_000_000; // 8 ns per byte
    const BURST: u64 = 16 * 1024; // the scheduler's default credit cap
                                  // The size of one frame on the wire.
    let (mut a, qa, _, wr) = two_qp_engines(RATE);
    a.post_send(qa[0], wr(0), 1_000).unwrap();
    let mut buf = vec![0u8; 2048];
    let size = a.poll_transmit(1_000, &mut buf).expect("the first WRITE") as u64;
    for t0 in [1_000u64, 1_001] {
        // At t0, as many WRITEs as the full credit covers, sent until
        // the last: the QP is left with less credit than a frame and
        // nothing to send, and is not called again.
        let (mut a, qa, _, wr) = two_qp_engines(RATE);
        let n = BURST / size;
        for id in 0..n {
            a.post_send(qa[0], wr(id), t0).unwrap();
        }
        for _ in 0..n {
            assert!(a.poll_transmit(t0, &mut buf).is_some());
        }
        let left = BURST - n * size;
        // The moment the QP has earned a frame's credit again.
        let t1 = t0 + (size - left) * 8;
        a.post_send(qa[0], wr(99), t1).unwrap();
        assert!(
            a.poll_transmit(t1, &mut buf).is_some(),
            "a WR posted at {t1} ns, when its QP had the credit, did not leave then (t0 {t0})"
        );
    }
}

/// An engine that is one shard of a device's QPs (one engine per
/// dataplane lcore) hands out only its shard's QPNs, and a QP of it works
/// as any other.
#[test]
fn a_shard_engine_hands_out_its_shards_qpns_and_its_qps_work() {
    use transport::rc::{EngineConfig, QpnSpace};
    let mut p = Pair::new(Setup {
        cfg: |mac, ip| EngineConfig {
            qpns: QpnSpace::new(2, 3).unwrap(),
            ..EngineConfig::new(mac, ip, 100_000_000_000)
        },
        ..Setup::default()
    });
    for q in [p.a.qpn, p.b.qpn] {
        assert_eq!(QpnSpace::owner(q, 3), 2, "QPN {q:#x}");
    }
    p.fill_a(0, 3000, 7);
    let wr = p.wr(1, WrOp::Write, 0, 0, 3000);
    p.post(wr);
    p.run(1_000_000_000);
    let cqes = p.completions_a();
    assert_eq!(cqes.len(), 1);
    assert_eq!(cqes[0].status, WcStatus::Success);
    assert_eq!(p.a_bytes(0, 3000), p.b_bytes(0, 3000));
}
