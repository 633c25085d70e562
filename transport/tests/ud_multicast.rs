//! UD multicast (issue 52, as rxe maps RoCEv2 multicast GIDs to IPv4
//! multicast): a datagram to a group carries DestQP 0xFFFFFF and reaches
//! every UD QP attached to the group, each with its own Q_Key check and
//! receive queue; only UD QPs attach, only to multicast addresses.

mod rc_util;

use std::net::Ipv4Addr;

use rc_util::{Dir, Pair, Setup, IP_A};
use transport::mr::DEFAULT_PD;
use transport::rc::{
    AhAttr, PathMtu, QpAccess, QpInit, Qpn, RcError, UdSource, WcStatus, WrOp, MULTICAST_QPN,
};
use transport::wire::{MacAddr, Service};

const QKEY: u32 = 0x1111_1111;
const GROUP: Ipv4Addr = Ipv4Addr::new(239, 1, 2, 3);
/// Offset of B's receive buffers in its region.
const RX: u64 = 8 << 20;

fn ud() -> Pair {
    Pair::new(Setup {
        service: Service::Ud,
        qkey: QKEY,
        ..Setup::default()
    })
}

/// Another UD QP of B in RTS with Q_Key `qkey`.
fn ud_qp_b(p: &mut Pair, qkey: u32) -> Qpn {
    let e = p.b.engine_mut();
    let qpn = e
        .create_qp_with(
            QpInit {
                service: Service::Ud,
                ..QpInit::new(64)
            },
            0,
        )
        .unwrap();
    e.set_qp_qkey(qpn, qkey).unwrap();
    e.modify_to_init(qpn, QpAccess::default()).unwrap();
    e.modify_ud_to_rtr(qpn, PathMtu::Mtu1024).unwrap();
    e.modify_ud_to_rts(qpn, 0).unwrap();
    qpn
}

/// Posts a receive WQE (wr_id = `qpn`) to B's QP `qpn`.
fn recv_on(p: &mut Pair, qpn: Qpn, slot: u64) {
    let wr = p.recv_wr(u64::from(qpn), RX + slot * 4096, 4096);
    p.b.engine_mut().post_recv(qpn, wr).unwrap();
}

/// Sends `len` bytes from A to the group with Q_Key `qkey`.
fn send_to_group(p: &mut Pair, wr_id: u64, len: u32, qkey: u32) {
    let ip = GROUP.octets();
    let attr = AhAttr {
        pd: DEFAULT_PD,
        dest_ip: GROUP,
        dest_mac: MacAddr([0x01, 0x00, 0x5e, ip[1] & 0x7f, ip[2], ip[3]]),
        dscp: None,
        telemetry: false,
    };
    let ah = p.a.engine_mut().create_ah(attr).unwrap();
    let mut wr = p.ud_wr(wr_id, WrOp::Send, 0, len, qkey);
    let d = wr.ud.as_mut().unwrap();
    d.ah = ah;
    d.remote_qpn = MULTICAST_QPN;
    p.post(wr);
    p.run(1_000_000_000);
}

/// B's successful receive completions: (QP, wr_id, sender).
fn received(p: &mut Pair) -> Vec<(Qpn, u64, Option<UdSource>)> {
    let mut v: Vec<_> = p
        .completions_b()
        .into_iter()
        .filter(|c| c.status == WcStatus::Success)
        .map(|c| (c.qpn, c.wr_id, c.src))
        .collect();
    v.sort_by_key(|c| c.0);
    v
}

#[test]
fn a_datagram_to_a_group_reaches_every_qp_attached_and_no_other() {
    let mut p = ud();
    let (q1, q2, q3) = (ud_qp_b(&mut p, QKEY), ud_qp_b(&mut p, QKEY), p.b.qpn);
    for (k, q) in [q1, q2, q3].into_iter().enumerate() {
        recv_on(&mut p, q, k as u64);
    }
    p.b.engine_mut().attach_mcast(q1, GROUP).unwrap();
    p.b.engine_mut().attach_mcast(q2, GROUP).unwrap();
    p.fill_a(0, 100, 4);
    send_to_group(&mut p, 1, 100, QKEY);
    let dest = p.logged(Dir::AtoB, |f| (f.repr.bth.dest_qp, f.repr.ip.dst));
    assert_eq!(dest, [(MULTICAST_QPN, GROUP)]);
    let src = Some(UdSource {
        qpn: p.a.qpn,
        ip: IP_A,
    });
    let mut want = vec![(q1, u64::from(q1), src), (q2, u64::from(q2), src)];
    want.sort_by_key(|c| c.0);
    assert_eq!(received(&mut p), want, "q3 ({q3:#x}) did not join");
    // Each copy landed in its own QP's buffer, behind the GRH.
    for slot in [0, 1] {
        assert_eq!(p.b_bytes(RX + slot * 4096 + 40, 100), p.a_bytes(0, 100));
    }
}

#[test]
fn a_detached_qp_receives_no_more_from_the_group() {
    let mut p = ud();
    let q = ud_qp_b(&mut p, QKEY);
    recv_on(&mut p, q, 0);
    recv_on(&mut p, q, 1);
    p.b.engine_mut().attach_mcast(q, GROUP).unwrap();
    send_to_group(&mut p, 1, 8, QKEY);
    assert_eq!(received(&mut p).len(), 1);
    p.b.engine_mut().detach_mcast(q, GROUP).unwrap();
    send_to_group(&mut p, 2, 8, QKEY);
    assert!(received(&mut p).is_empty());
    assert_eq!(p.b.engine().counters().mcast_unjoined, 1);
    assert_eq!(
        p.b.engine_mut().detach_mcast(q, GROUP),
        Err(RcError::NotAttached {
            qpn: q,
            group: GROUP
        })
    );
}

#[test]
fn each_member_checks_its_own_qkey() {
    let mut p = ud();
    let (good, other) = (ud_qp_b(&mut p, QKEY), ud_qp_b(&mut p, 0x4444));
    recv_on(&mut p, good, 0);
    recv_on(&mut p, other, 1);
    for q in [good, other] {
        p.b.engine_mut().attach_mcast(q, GROUP).unwrap();
    }
    send_to_group(&mut p, 1, 8, QKEY);
    assert_eq!(
        received(&mut p).iter().map(|c| c.0).collect::<Vec<_>>(),
        [good]
    );
    assert_eq!(p.b.engine().qp_counters(other).unwrap().qkey_violations, 1);
}

#[test]
fn only_ud_qps_attach_and_only_to_multicast_addresses() {
    let mut p = ud();
    let q = p.b.qpn;
    let unicast = Ipv4Addr::new(10, 0, 0, 7);
    assert_eq!(
        p.b.engine_mut().attach_mcast(q, unicast),
        Err(RcError::NotMulticast(unicast))
    );
    let mut rc = Pair::new(Setup::default());
    let qrc = rc.b.qpn;
    assert_eq!(
        rc.b.engine_mut().attach_mcast(qrc, GROUP),
        Err(RcError::NotOnService {
            what: "multicast",
            service: "RC"
        })
    );
}

#[test]
fn a_destroyed_qp_leaves_its_groups() {
    let mut p = ud();
    let q = ud_qp_b(&mut p, QKEY);
    p.b.engine_mut().attach_mcast(q, GROUP).unwrap();
    assert!(p.b.engine().joined(GROUP));
    p.b.engine_mut().destroy_qp(q).unwrap();
    assert!(!p.b.engine().joined(GROUP));
}
