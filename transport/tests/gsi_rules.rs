//! QP1, the General Services Interface, one test per rule of issue 52:
//! a UD SEND_ONLY with the GSI Q_Key and one 256-byte MAD reaches the
//! management agents with its sender; anything else to QP1 is dropped
//! and counted by reason; a MAD the agents send leaves from QP1 and
//! reaches the peer's QP1.

mod rc_util;

use rc_util::{Dir, Pair, Setup, IP_A, IP_B, MAC_A, MAC_B};
use transport::rc::OutMad;
use transport::wire::mad::{class, method, MadHeader, GSI_QKEY, GSI_QPN, MAD_LEN};
use transport::wire::{DethRepr, Opcode, Service};

fn mad(tid: u64) -> [u8; MAD_LEN] {
    let mut m = [0u8; MAD_LEN];
    MadHeader {
        base_version: 1,
        mgmt_class: class::CM,
        class_version: 2,
        method: method::SEND,
        tid,
        attr_id: 0x0010,
        ..MadHeader::default()
    }
    .emit(&mut m);
    m[100] = 0xAB;
    m
}

/// A UD SEND_ONLY from A's QP `src` to B's QP1 with Q_Key `qkey`.
fn to_qp1(p: &Pair, opcode: Opcode, service: Service, qkey: u32, payload: &[u8]) -> Vec<u8> {
    let mut r = p.repr_to_b(opcode, 7);
    r.bth.dest_qp = GSI_QPN;
    r.bth.service = service;
    r.deth = (service == Service::Ud).then_some(DethRepr {
        q_key: qkey,
        src_qp: 0x42,
    });
    rc_util::emit(&r, payload)
}

#[test]
fn a_mad_to_qp1_reaches_the_agents_with_its_sender() {
    let mut p = Pair::new(Setup::default());
    let f = to_qp1(&p, Opcode::SendOnly, Service::Ud, GSI_QKEY, &mad(9));
    let now = p.now;
    p.b.engine_mut().handle_packet(now, &f);
    let m = p.b.engine_mut().poll_mad().expect("a MAD");
    assert_eq!((m.src_ip, m.src_qpn), (IP_A, 0x42));
    assert_eq!(m.mad, mad(9));
    assert_eq!(
        m.grh[32..36],
        IP_A.octets(),
        "the GRH holds the IPv4 header"
    );
    assert_eq!(p.b.engine().gsi_counters().rx_mads, 1);
    assert!(p.b.engine_mut().poll_mad().is_none());
}

#[test]
fn anything_else_to_qp1_is_dropped_and_counted_by_reason() {
    let mut p = Pair::new(Setup::default());
    let cases = [
        to_qp1(&p, Opcode::SendOnly, Service::Ud, 0x1234, &mad(1)),
        to_qp1(&p, Opcode::SendOnly, Service::Ud, GSI_QKEY, &mad(1)[..200]),
        to_qp1(&p, Opcode::SendOnly, Service::Rc, 0, &mad(1)),
    ];
    let now = p.now;
    for f in &cases {
        p.b.engine_mut().handle_packet(now, f);
    }
    let c = p.b.engine().gsi_counters();
    assert_eq!(
        (c.bad_qkey, c.bad_length, c.not_ud_send, c.rx_mads),
        (1, 1, 1, 0)
    );
    assert!(p.b.engine_mut().poll_mad().is_none());
}

#[test]
fn a_mad_the_agents_send_leaves_from_qp1_and_reaches_the_peers_qp1() {
    let mut p = Pair::new(Setup::default());
    let out = OutMad {
        dest_ip: IP_B,
        dest_mac: MAC_B,
        dest_qpn: GSI_QPN,
        qkey: GSI_QKEY,
        dscp: None,
        mad: mad(77),
    };
    let now = p.now;
    p.a.engine_mut().send_mad(out, now).unwrap();
    p.run(1_000_000);
    let sent = p.logged(Dir::AtoB, |f| {
        (
            f.repr.bth.service,
            f.repr.bth.opcode,
            f.repr.bth.dest_qp,
            f.repr.deth,
            f.payload.len(),
        )
    });
    assert_eq!(
        sent,
        [(
            Service::Ud,
            Opcode::SendOnly,
            GSI_QPN,
            Some(DethRepr {
                q_key: GSI_QKEY,
                src_qp: GSI_QPN
            }),
            MAD_LEN
        )]
    );
    let m = p.b.engine_mut().poll_mad().expect("the MAD arrived");
    assert_eq!((m.src_ip, m.src_qpn, m.mad), (IP_A, GSI_QPN, mad(77)));
    assert_eq!(p.a.engine().gsi_counters().tx_mads, 1);
    let _ = MAC_A;
}
