//! Unreliable Datagram, one test per rule of issue 52 (IBA ch. 9-10 and
//! RoCEv2 annex A17 as rxe and hardware apply them): SEND_ONLY with the
//! DETH, Q_Keys, the path MTU, no ACKs or retransmission, the GRH area of
//! every receive buffer, drops that are counted, address handles.

mod rc_util;

use rc_util::{Dir, Fate, Pair, Setup, IP_A, IP_B, MAC_B, MR_BASE};
use transport::mr::DEFAULT_PD;
use transport::rc::{AhAttr, RcError, UdSource, WcOpcode, WcStatus, WrOp, GRH_LEN};
use transport::wire::{udp, Opcode, Service};

/// Offset of B's receive buffers in its region (A's data sits at 0).
const RX: u64 = 8 << 20;
const QKEY: u32 = 0x1111_1111;

fn ud() -> Pair {
    Pair::new(Setup {
        service: Service::Ud,
        qkey: QKEY,
        ..Setup::default()
    })
}

#[test]
fn a_datagram_is_a_send_only_with_a_deth_naming_the_qkey_and_the_source_qp() {
    let mut p = ud();
    p.post_recv_b(p.recv_wr(7, RX, 4096));
    p.fill_a(0, 300, 3);
    p.post(p.ud_wr(1, WrOp::Send, 0, 300, QKEY));
    p.run(1_000_000_000);
    let qa = p.a.qpn;
    let sent = p.logged(Dir::AtoB, |f| {
        (f.repr.bth.service, f.repr.bth.opcode, f.repr.deth)
    });
    assert_eq!(sent.len(), 1);
    let (service, op, deth) = sent[0];
    assert_eq!((service, op), (Service::Ud, Opcode::SendOnly));
    let deth = deth.expect("a DETH");
    assert_eq!((deth.q_key, deth.src_qp), (QKEY, qa));
}

#[test]
fn a_receive_buffer_gets_the_grh_then_the_payload_and_the_completion_names_the_sender() {
    let mut p = ud();
    p.post_recv_b(p.recv_wr(7, RX, 4096));
    p.fill_a(0, 1000, 9);
    p.post(p.ud_wr(1, WrOp::SendImm(0xABCD), 0, 1000, QKEY));
    p.run(1_000_000_000);
    let b = p.completions_b();
    assert_eq!(b.len(), 1);
    let c = b[0];
    assert_eq!(
        (c.wr_id, c.status, c.opcode, c.byte_len, c.imm),
        (7, WcStatus::Success, WcOpcode::Recv, 1040, Some(0xABCD))
    );
    assert_eq!(
        c.src,
        Some(UdSource {
            qpn: p.a.qpn,
            ip: IP_A
        })
    );
    let grh = p.b_bytes(RX, GRH_LEN);
    // RoCEv2 over IPv4: 20 zero bytes, then the datagram's IPv4 header.
    assert_eq!(grh[..20], [0u8; 20]);
    assert_eq!(grh[20], 0x45);
    assert_eq!(grh[29], 17, "protocol UDP");
    assert_eq!(grh[32..36], IP_A.octets());
    assert_eq!(grh[36..40], IP_B.octets());
    let total = u16::from_be_bytes([grh[22], grh[23]]) as usize;
    // IPv4 + UDP + BTH + DETH + ImmDt + payload + ICRC.
    assert_eq!(total, 20 + 8 + 12 + 8 + 4 + 1000 + 4);
    assert_eq!(p.b_bytes(RX + 40, 1000), p.a_bytes(0, 1000));
    let a = p.completions_a();
    assert_eq!(
        (a[0].wr_id, a[0].status, a[0].opcode),
        (1, WcStatus::Success, WcOpcode::Send)
    );
}

#[test]
fn a_datagram_with_another_qkey_is_dropped_and_counted() {
    let mut p = ud();
    p.post_recv_b(p.recv_wr(7, RX, 4096));
    p.post(p.ud_wr(1, WrOp::Send, 0, 64, 0x2222_2222));
    p.run(1_000_000_000);
    assert!(p.completions_b().is_empty());
    let qb = p.b.qpn;
    assert_eq!(p.b.engine().qp_counters(qb).unwrap().qkey_violations, 1);
    // The sender's WR completed all the same: UD promises no delivery.
    assert_eq!(p.completions_a()[0].status, WcStatus::Success);
}

#[test]
fn a_wr_naming_a_controlled_qkey_sends_the_qps_own() {
    let mut p = ud();
    p.post_recv_b(p.recv_wr(7, RX, 4096));
    // The top bit set: the QP's own Q_Key (QKEY) goes instead.
    p.post(p.ud_wr(1, WrOp::Send, 0, 64, 0x8000_0042));
    p.run(1_000_000_000);
    let keys = p.logged(Dir::AtoB, |f| f.repr.deth.map(|d| d.q_key));
    assert_eq!(keys, [Some(QKEY)]);
    assert_eq!(p.completions_b()[0].status, WcStatus::Success);
}

#[test]
fn a_datagram_finding_no_receive_wqe_is_dropped_and_counted_without_an_rnr_nak() {
    let mut p = ud();
    p.post(p.ud_wr(1, WrOp::Send, 0, 64, QKEY));
    p.run(1_000_000_000);
    let qb = p.b.qpn;
    assert_eq!(p.b.engine().qp_counters(qb).unwrap().datagrams_no_wqe, 1);
    assert!(p.frames(Dir::BtoA).is_empty(), "UD answers nothing");
    // The next datagram, with a WQE, lands.
    p.post_recv_b(p.recv_wr(7, RX, 4096));
    p.post(p.ud_wr(2, WrOp::Send, 0, 64, QKEY));
    p.run(1_000_000_000);
    assert_eq!(p.completions_b().len(), 1);
}

#[test]
fn a_datagram_longer_than_the_path_mtu_is_refused_at_post() {
    let p = ud();
    let mut p = p;
    let wr = p.ud_wr(1, WrOp::Send, 0, 1025, QKEY);
    let qa = p.a.qpn;
    let now = p.now;
    assert_eq!(
        p.a.engine_mut().post_send(qa, wr, now),
        Err(RcError::DatagramTooLong {
            len: 1025,
            mtu: 1024
        })
    );
    // Exactly the MTU goes.
    p.post_recv_b(p.recv_wr(7, RX, 4096));
    p.post(p.ud_wr(2, WrOp::Send, 0, 1024, QKEY));
    p.run(1_000_000_000);
    assert_eq!(p.completions_b()[0].byte_len, 1024 + 40);
}

#[test]
fn only_sends_are_posted_on_a_ud_qp() {
    let mut p = ud();
    let qa = p.a.qpn;
    let now = p.now;
    for (op, what) in [
        (WrOp::Write, "RDMA WRITE"),
        (WrOp::Read, "RDMA READ"),
        (WrOp::FetchAdd { add: 1 }, "FETCH_ADD"),
    ] {
        let wr = p.ud_wr(1, op, 0, 8, QKEY);
        assert_eq!(
            p.a.engine_mut().post_send(qa, wr, now),
            Err(RcError::NotOnService {
                what,
                service: "UD"
            })
        );
    }
    let mut wr = p.ud_wr(1, WrOp::Send, 0, 8, QKEY);
    wr.ud = None;
    assert_eq!(
        p.a.engine_mut().post_send(qa, wr, now),
        Err(RcError::NoAddress)
    );
}

#[test]
fn a_sender_completes_when_the_datagram_leaves_and_never_retransmits() {
    let mut p = ud();
    p.set_hook(Box::new(|_, _, _| Fate::Drop));
    for i in 0..5 {
        p.post(p.ud_wr(i, WrOp::Send, 0, 100, QKEY));
    }
    p.run(10_000_000_000);
    let a = p.completions_a();
    assert_eq!(a.len(), 5);
    assert!(a.iter().all(|c| c.status == WcStatus::Success));
    assert_eq!(
        p.frames(Dir::AtoB).len(),
        5,
        "one frame per datagram, none again"
    );
    let qa = p.a.qpn;
    assert_eq!(p.a.engine().qp_counters(qa).unwrap().retransmitted, 0);
}

#[test]
fn a_lost_datagram_is_gone_and_the_next_arrives_intact() {
    let mut p = ud();
    for i in 0..3 {
        p.post_recv_b(p.recv_wr(10 + i, RX + i * 4096, 4096));
    }
    // The fault injector loses the second datagram.
    p.set_hook(Box::new(
        |_, _, n| if n == 1 { Fate::Drop } else { Fate::Deliver },
    ));
    for i in 0..3u64 {
        p.fill_a(i * 4096, 500, i as u8 + 1);
        p.post(p.ud_wr(i, WrOp::Send, i * 4096, 500, QKEY));
    }
    p.run(1_000_000_000);
    let b = p.completions_b();
    assert_eq!(b.len(), 2);
    // The WQEs fill in order: the third datagram lands in the second.
    assert_eq!(p.b_bytes(RX + 40, 500), p.a_bytes(0, 500));
    assert_eq!(p.b_bytes(RX + 4096 + 40, 500), p.a_bytes(2 * 4096, 500));
}

#[test]
fn a_receive_buffer_too_small_for_the_grh_and_payload_completes_with_a_length_error() {
    let mut p = ud();
    p.post_recv_b(p.recv_wr(7, RX, 100));
    p.post_recv_b(p.recv_wr(8, RX + 4096, 4096));
    p.post(p.ud_wr(1, WrOp::Send, 0, 61, QKEY));
    p.post(p.ud_wr(2, WrOp::Send, 0, 60, QKEY));
    p.run(1_000_000_000);
    let b = p.completions_b();
    assert_eq!(
        b.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        [(7, WcStatus::LocLenErr), (8, WcStatus::Success)]
    );
    let qb = p.b.qpn;
    assert_eq!(
        p.b.engine().qp_state(qb).unwrap(),
        transport::rc::QpState::Rts,
        "a datagram does not break its receiver's QP"
    );
}

#[test]
fn each_destination_qp_gets_its_own_udp_source_port() {
    let mut p = ud();
    let qa = p.a.qpn;
    let (x, y) = (p.b.qpn, p.b.qpn + 1);
    for (i, dest) in [x, y].into_iter().enumerate() {
        let mut wr = p.ud_wr(i as u64, WrOp::Send, 0, 8, QKEY);
        wr.ud.as_mut().unwrap().remote_qpn = dest;
        p.post(wr);
    }
    p.run(1_000_000_000);
    let ports = p.logged(Dir::AtoB, |f| f.repr.udp.src_port);
    assert_eq!(ports, [udp::entropy_port(qa, x), udp::entropy_port(qa, y)]);
    assert_ne!(ports[0], ports[1]);
}

#[test]
fn an_address_handle_serves_only_its_protection_domain() {
    let mut p = ud();
    let attr = AhAttr {
        pd: DEFAULT_PD + 1,
        dest_ip: IP_B,
        dest_mac: MAC_B,
        dscp: None,
        telemetry: false,
    };
    let other = p.a.engine_mut().create_ah(attr).unwrap();
    let mut wr = p.ud_wr(1, WrOp::Send, 0, 8, QKEY);
    wr.ud.as_mut().unwrap().ah = other;
    let (qa, now) = (p.a.qpn, p.now);
    assert_eq!(
        p.a.engine_mut().post_send(qa, wr, now),
        Err(RcError::NoSuchAh(other))
    );
    assert_eq!(
        p.a.engine_mut().destroy_ah(other, DEFAULT_PD),
        Err(RcError::NoSuchAh(other))
    );
    p.a.engine_mut().destroy_ah(other, DEFAULT_PD + 1).unwrap();
}

#[test]
fn a_connected_packet_to_a_ud_qp_is_dropped_as_another_service() {
    let mut p = ud();
    p.post_recv_b(p.recv_wr(7, RX, 4096));
    // An RC SEND_ONLY to B's UD QP.
    let f = p.frame_to_b(Opcode::SendOnly, 0, true, None, &[1; 8]);
    let now = p.now;
    p.b.engine_mut().handle_packet(now, &f);
    assert_eq!(p.b.engine().counters().wrong_service, 1);
    assert!(p.completions_b().is_empty());
    let _ = MR_BASE;
}

#[test]
fn an_address_handle_on_a_connected_qps_wr_is_refused() {
    let mut p = Pair::new(Setup::default());
    let mut wr = p.wr(1, WrOp::Send, 0, 0, 8);
    wr.ud = Some(transport::rc::UdDest {
        ah: 0,
        remote_qpn: 5,
        remote_qkey: QKEY,
    });
    let (qa, now) = (p.a.qpn, p.now);
    assert_eq!(
        p.a.engine_mut().post_send(qa, wr, now),
        Err(RcError::NotOnService {
            what: "an address handle",
            service: "RC"
        })
    );
}
