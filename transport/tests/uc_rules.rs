//! Unreliable Connected, one test per rule of issue 52 (IBA 9.7.5 and
//! rxe's UC responder): SEND and RDMA WRITE with PSNs and no ACKs, a
//! message with a lost packet dropped whole and the next one clean,
//! READ and atomics refused at post, no RNR.

mod rc_util;

use rc_util::{Dir, Fate, Pair, Setup};
use transport::rc::{RcError, WcOpcode, WcStatus, WrOp};
use transport::wire::{Opcode, Service};

/// Offset of B's receive buffers and WRITE targets (A's data sits at 0).
const RX: u64 = 8 << 20;

fn uc() -> Pair {
    Pair::new(Setup {
        service: Service::Uc,
        ..Setup::default()
    })
}

#[test]
fn sends_and_writes_complete_when_sent_and_nothing_comes_back() {
    let mut p = uc();
    p.post_recv_b(p.recv_wr(7, RX, 8192));
    p.post_recv_b(p.recv_wr(8, RX + 8192, 16));
    p.fill_a(0, 3000, 4);
    p.post(p.wr(1, WrOp::Send, 0, 0, 3000));
    p.post(p.wr(2, WrOp::Write, 0, RX + 65536, 3000));
    p.post(p.wr(3, WrOp::WriteImm(5), 0, RX + 2 * 65536, 100));
    p.run(1_000_000_000);
    assert!(p.frames(Dir::BtoA).is_empty(), "UC answers nothing");
    let services = p.logged(Dir::AtoB, |f| (f.repr.bth.service, f.repr.bth.ack_req));
    assert!(services.iter().all(|&s| s == (Service::Uc, false)));
    let a = p.completions_a();
    assert_eq!(
        a.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        [
            (1, WcStatus::Success),
            (2, WcStatus::Success),
            (3, WcStatus::Success)
        ]
    );
    let b = p.completions_b();
    assert_eq!(
        b.iter()
            .map(|c| (c.wr_id, c.opcode, c.byte_len, c.imm))
            .collect::<Vec<_>>(),
        [
            (7, WcOpcode::Recv, 3000, None),
            (8, WcOpcode::RecvRdmaWithImm, 100, Some(5))
        ]
    );
    assert_eq!(p.b_bytes(RX, 3000), p.a_bytes(0, 3000));
    assert_eq!(p.b_bytes(RX + 65536, 3000), p.a_bytes(0, 3000));
}

#[test]
fn a_send_with_a_lost_packet_is_dropped_whole_and_its_wqe_takes_the_next() {
    let mut p = uc();
    p.post_recv_b(p.recv_wr(7, RX, 8192));
    // The middle packet of the first (three-packet) SEND is lost.
    p.set_hook(Box::new(
        |_, _, n| if n == 1 { Fate::Drop } else { Fate::Deliver },
    ));
    p.fill_a(0, 3000, 1);
    p.fill_a(4096, 2500, 2);
    p.post(p.wr(1, WrOp::Send, 0, 0, 3000));
    p.post(p.wr(2, WrOp::Send, 4096, 0, 2500));
    p.run(1_000_000_000);
    let b = p.completions_b();
    assert_eq!(
        b.iter()
            .map(|c| (c.wr_id, c.status, c.byte_len))
            .collect::<Vec<_>>(),
        [(7, WcStatus::Success, 2500)]
    );
    assert_eq!(p.b_bytes(RX, 2500), p.a_bytes(4096, 2500));
    let qb = p.b.qpn;
    assert_eq!(p.b.engine().qp_counters(qb).unwrap().uc_dropped, 1);
    assert_eq!(p.completions_a().len(), 2, "the sender never knows");
}

#[test]
fn a_write_with_a_lost_first_packet_is_dropped_and_the_next_lands() {
    let mut p = uc();
    p.post_recv_b(p.recv_wr(7, RX, 16));
    p.post_recv_b(p.recv_wr(8, RX + 16, 16));
    p.set_hook(Box::new(
        |_, _, n| if n == 0 { Fate::Drop } else { Fate::Deliver },
    ));
    p.fill_a(0, 2048, 6);
    p.post(p.wr(1, WrOp::WriteImm(1), 0, RX + 65536, 2048));
    p.post(p.wr(2, WrOp::WriteImm(2), 0, RX + 2 * 65536, 2048));
    p.run(1_000_000_000);
    let b = p.completions_b();
    assert_eq!(
        b.iter().map(|c| (c.wr_id, c.imm)).collect::<Vec<_>>(),
        [(7, Some(2))],
        "the first WRITE's immediate never completes"
    );
    assert_eq!(p.b_bytes(RX + 2 * 65536, 2048), p.a_bytes(0, 2048));
    assert_eq!(p.b_bytes(RX + 65536 + 1024, 1024), vec![0; 1024]);
}

#[test]
fn reads_and_atomics_are_refused_at_post() {
    let mut p = uc();
    let (qa, now) = (p.a.qpn, p.now);
    for (op, what) in [
        (WrOp::Read, "RDMA READ"),
        (
            WrOp::CmpSwap {
                compare: 0,
                swap: 1,
            },
            "COMPARE_SWAP",
        ),
        (WrOp::FetchAdd { add: 1 }, "FETCH_ADD"),
    ] {
        let wr = p.wr(1, op, 0, RX, 8);
        assert_eq!(
            p.a.engine_mut().post_send(qa, wr, now),
            Err(RcError::NotOnService {
                what,
                service: "UC"
            })
        );
    }
}

#[test]
fn a_send_finding_no_receive_wqe_is_dropped_without_an_rnr_nak() {
    let mut p = uc();
    p.post(p.wr(1, WrOp::Send, 0, 0, 100));
    p.run(1_000_000_000);
    assert!(p.frames(Dir::BtoA).is_empty());
    let qb = p.b.qpn;
    assert_eq!(p.b.engine().qp_counters(qb).unwrap().uc_dropped, 1);
    assert_eq!(
        p.b.engine().qp_state(qb).unwrap(),
        transport::rc::QpState::Rts
    );
    p.post_recv_b(p.recv_wr(7, RX, 4096));
    p.post(p.wr(2, WrOp::Send, 0, 0, 100));
    p.run(1_000_000_000);
    assert_eq!(p.completions_b().len(), 1);
}

#[test]
fn a_write_outside_the_rkeys_region_is_dropped_and_the_qp_lives_on() {
    let mut p = uc();
    p.post_recv_b(p.recv_wr(7, RX, 16));
    let mut bad = p.wr(1, WrOp::WriteImm(1), 0, RX, 64);
    bad.rkey ^= 0x55;
    p.post(bad);
    p.post(p.wr(2, WrOp::WriteImm(2), 0, RX + 4096, 64));
    p.run(1_000_000_000);
    let b = p.completions_b();
    assert_eq!(b.iter().map(|c| c.imm).collect::<Vec<_>>(), [Some(2)]);
    assert!(p.frames(Dir::BtoA).is_empty());
}

#[test]
fn an_rc_packet_to_a_uc_qp_is_dropped_as_another_service() {
    let mut p = uc();
    p.post_recv_b(p.recv_wr(7, RX, 4096));
    let f = p.frame_to_b(Opcode::SendOnly, 5000, true, None, &[1; 8]);
    let now = p.now;
    p.b.engine_mut().handle_packet(now, &f);
    assert_eq!(p.b.engine().counters().wrong_service, 1);
    assert!(p.drain_b().is_empty());
}

#[test]
fn a_duplicated_message_is_delivered_once() {
    let mut p = uc();
    for i in 0..4 {
        p.post_recv_b(p.recv_wr(10 + i, RX + i * 4096, 4096));
    }
    // Every frame is delivered twice; the second SEND is two packets.
    p.set_hook(Box::new(|_, _, _| Fate::Duplicate));
    p.fill_a(0, 100, 1);
    p.fill_a(4096, 1500, 2);
    p.post(p.wr(1, WrOp::Send, 0, 0, 100));
    p.post(p.wr(2, WrOp::Send, 4096, 0, 1500));
    p.run(1_000_000_000);
    let b = p.completions_b();
    assert_eq!(
        b.iter().map(|c| (c.wr_id, c.byte_len)).collect::<Vec<_>>(),
        [(10, 100), (11, 1500)]
    );
    assert_eq!(p.b_bytes(RX + 4096, 1500), p.a_bytes(4096, 1500));
}

#[test]
fn a_peer_that_starts_again_far_behind_is_taken_at_its_first_packet() {
    let mut p = uc();
    p.post_recv_b(p.recv_wr(7, RX, 4096));
    // B expects PSN 100; a SEND_ONLY 100000 PSNs behind is no duplicate
    // but a peer that began again: it is delivered.
    let f = p.frame_to_b(
        Opcode::SendOnly,
        100u32.wrapping_sub(100_000) & 0xFF_FFFF,
        false,
        None,
        &[3; 16],
    );
    let mut r = transport::wire::Packet::parse(&f).unwrap().repr;
    r.bth.service = Service::Uc;
    let f = rc_util::emit(&r, &[3; 16]);
    let now = p.now;
    p.b.engine_mut().handle_packet(now, &f);
    assert_eq!(p.completions_b().len(), 1);
}
