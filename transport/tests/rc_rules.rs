//! One test per rule of docs/spec/rc.md, named after the rule.

mod rc_util;

use rc_util::{Dir, Fate, Pair, Setup, DELAY_NS, MR_BASE};
use transport::mr::Access;
use transport::rc::{
    AsyncEvent, ConnectParams, Endpoint, PathMtu, QpAccess, QpError, QpState, QpUpdate, RcError,
    RtrAttr, RtsAttr, WcStatus, WrOp,
};
use transport::wire::{AethRepr, Opcode, Packet, RethRepr};

// ---- Promises to the application ----

#[test]
fn in_order_exactly_once_duplicates_are_never_applied_twice() {
    let mut p = Pair::new(Setup::default());
    // Every frame in both directions is delivered twice.
    p.set_hook(Box::new(|_, _, _| Fate::Duplicate));
    p.fill_a(0, 5000, 1);
    let first = p.wr(1, WrOp::Write, 0, 0, 5000);
    p.post(first);
    p.run(10_000_000);
    // A second WRITE to the same place; a late duplicate of the first must
    // not clobber it.
    p.fill_a(0, 5000, 2);
    let second = p.wr(2, WrOp::Write, 0, 0, 5000);
    p.post(second);
    p.run(10_000_000);
    let c = p.completions_a();
    assert_eq!(
        c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert_eq!(p.b_bytes(0, 5000), p.a_bytes(0, 5000));
    assert!(
        p.b.nic
            .engine_mut()
            .qp_counters(p.b.qpn)
            .unwrap()
            .duplicates
            > 0
    );
}

#[test]
fn no_silent_corruption_bad_icrc_is_dropped_and_recovered() {
    let mut p = Pair::new(Setup::default());
    // Corrupt the payload of the second data packet once.
    p.set_hook(Box::new(|dir, pk, i| {
        if dir == Dir::AtoB && pk.repr.bth.opcode == Opcode::RdmaWriteMiddle && i < 3 {
            Fate::Corrupt(100)
        } else {
            Fate::Deliver
        }
    }));
    p.fill_a(0, 3000, 9);
    let wr = p.wr(1, WrOp::Write, 0, 0, 3000);
    p.post(wr);
    p.run(100_000_000);
    assert_eq!(p.completions_a()[0].status, WcStatus::Success);
    assert_eq!(p.b_bytes(0, 3000), p.a_bytes(0, 3000));
    assert_eq!(p.b.nic.engine_mut().counters().icrc_drops(), 1);
    assert_eq!(
        p.b.nic
            .engine_mut()
            .qp_counters(p.b.qpn)
            .unwrap()
            .icrc_drops,
        1
    );
    // Dropped silently: no NAK for the bad frame itself; the gap it left
    // gets the one sequence NAK.
    assert_eq!(
        p.b.nic.engine_mut().qp_counters(p.b.qpn).unwrap().naks_sent[0],
        1
    );
}

#[test]
fn failure_is_reported_retry_exhaustion_then_flush_even_unsignaled() {
    let mut p = Pair::new(Setup {
        timeout: 4,
        retry_cnt: 3,
        ..Setup::default()
    });
    p.set_hook(rc_util::cut(Dir::AtoB));
    for i in 0..3 {
        let mut wr = p.wr(i, WrOp::Write, 0, 0, 100);
        wr.signaled = false;
        p.post(wr);
    }
    p.run(1_000_000_000);
    let c = p.completions_a();
    assert_eq!(
        c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        [
            (0, WcStatus::RetryExcErr),
            (1, WcStatus::WrFlushErr),
            (2, WcStatus::WrFlushErr)
        ]
    );
    assert_eq!(
        p.a.nic.engine_mut().qp_state(p.a.qpn).unwrap(),
        QpState::Err
    );
    // Within the configured timeout x (retries + 1): 65.5 us x 4.
    assert!(
        p.now <= 4 * 65_536 + 10 * DELAY_NS,
        "gave up at {} ns",
        p.now
    );
    let wr = p.wr(9, WrOp::Write, 0, 0, 1);
    assert!(matches!(
        p.a.nic.engine_mut().post_send(p.a.qpn, wr, p.now),
        Err(RcError::WrongState {
            state: QpState::Err,
            ..
        })
    ));
}

// ---- QP states ----

#[test]
fn posting_to_a_qp_not_in_rts_is_an_immediate_error() {
    let mut p = Pair::new(Setup::default());
    let wr = p.wr(1, WrOp::Write, 0, 0, 1);
    let e = p.a.nic.engine_mut();
    let q = e.create_qp(4, 0).unwrap();
    for step in 0..3 {
        match step {
            1 => e.modify_to_init(q, QpAccess::default()).unwrap(),
            2 => e
                .modify_to_rtr(
                    q,
                    RtrAttr {
                        path_mtu: PathMtu::Mtu1024,
                        dest_qpn: 1,
                        dest_mac: rc_util::MAC_B,
                        dest_ip: rc_util::IP_B,
                        rq_psn: 0,
                        max_dest_rd_atomic: 1,
                        min_rnr_timer: 12,
                        dscp: None,
                        feedback_key: None,
                    },
                )
                .unwrap(),
            _ => {}
        }
        assert!(matches!(
            e.post_send(q, wr, 0),
            Err(RcError::WrongState {
                need: QpState::Rts,
                ..
            })
        ));
    }
}

#[test]
fn states_go_reset_init_rtr_rts_and_attributes_are_checked() {
    let mut p = Pair::new(Setup::default());
    let e = p.a.nic.engine_mut();
    let q = e.create_qp(4, 0).unwrap();
    assert_eq!(e.qp_state(q).unwrap(), QpState::Reset);
    let rts = RtsAttr {
        sq_psn: 0,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 1,
    };
    assert!(matches!(
        e.modify_to_rts(q, rts),
        Err(RcError::WrongState { .. })
    ));
    e.modify_to_init(q, QpAccess::default()).unwrap();
    let rtr = RtrAttr {
        path_mtu: PathMtu::Mtu1024,
        dest_qpn: 0x100_0000,
        dest_mac: rc_util::MAC_B,
        dest_ip: rc_util::IP_B,
        rq_psn: 0,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 12,
        dscp: None,
        feedback_key: None,
    };
    let err = e.modify_to_rtr(q, rtr).unwrap_err();
    assert_eq!(
        err.to_string(),
        "dest_qpn 16777216 out of range (max 16777215)"
    );
    e.modify_to_rtr(q, RtrAttr { dest_qpn: 5, ..rtr }).unwrap();
    for bad in [
        RtsAttr {
            sq_psn: 1 << 24,
            ..rts
        },
        RtsAttr { timeout: 32, ..rts },
        RtsAttr {
            retry_cnt: 8,
            ..rts
        },
        RtsAttr {
            rnr_retry: 8,
            ..rts
        },
    ] {
        assert!(
            matches!(e.modify_to_rts(q, bad), Err(RcError::OutOfRange { .. })),
            "{bad:?}"
        );
    }
    e.modify_to_rts(q, rts).unwrap();
    assert_eq!(e.qp_state(q).unwrap(), QpState::Rts);
    e.modify_to_err(q).unwrap();
    assert_eq!(e.qp_state(q).unwrap(), QpState::Err);
    assert_eq!(
        e.modify_to_init(0xdead, QpAccess::default()),
        Err(RcError::NoSuchQp(0xdead))
    );
}

#[test]
fn sqd_finishes_the_wrs_taken_refuses_new_ones_says_drained_and_returns_to_rts() {
    let mut p = Pair::new(Setup::default());
    for i in 0..4 {
        p.post(p.wr(i, WrOp::Write, 0, 0, 65536));
    }
    // A few passes: some of the four are on the wire.
    for _ in 0..4 {
        p.step(u64::MAX);
    }
    let (qa, now) = (p.a.qpn, p.now);
    let e = p.a.nic.engine_mut();
    e.modify_qp(qa, QpState::Sqd, &QpUpdate::default(), true, now)
        .unwrap();
    assert_eq!(e.qp_state(qa).unwrap(), QpState::Sqd);
    assert!(e.poll_event().is_none(), "not drained yet");
    let wr = p.wr(9, WrOp::Write, 0, 0, 64);
    assert!(matches!(
        p.a.nic.engine_mut().post_send(qa, wr, now),
        Err(RcError::WrongState { .. })
    ));
    p.run(10_000_000);
    let done = p.completions_a();
    assert_eq!(done.len(), 4);
    assert!(done.iter().all(|c| c.status == WcStatus::Success));
    let e = p.a.nic.engine_mut();
    assert_eq!(e.poll_event(), Some(AsyncEvent::SqDrained(qa)));
    assert_eq!(e.poll_event(), None, "drained is said once");
    // SQD -> RTS with a new retry count; sending resumes.
    let u = QpUpdate {
        retry_cnt: Some(3),
        ..QpUpdate::default()
    };
    e.modify_qp(qa, QpState::Rts, &u, false, now).unwrap();
    p.post(p.wr(10, WrOp::Write, 0, 0, 64));
    p.run(10_000_000);
    assert_eq!(p.completions_a()[0].status, WcStatus::Success);
}

#[test]
fn in_place_modifies_change_access_and_other_transitions_are_refused() {
    let mut p = Pair::new(Setup::default());
    let (qb, now) = (p.b.qpn, p.now);
    // RTS -> RTS taking remote write away from B: A's WRITE is refused
    // (an opcode the QP does not take: invalid request, as rxe answers).
    let u = QpUpdate {
        access: Some(QpAccess {
            remote_read: true,
            ..QpAccess::default()
        }),
        min_rnr_timer: Some(3),
        ..QpUpdate::default()
    };
    let e = p.b.nic.engine_mut();
    e.modify_qp(qb, QpState::Rts, &u, false, now).unwrap();
    let bad = QpUpdate {
        timeout: Some(32),
        ..QpUpdate::default()
    };
    assert!(matches!(
        e.modify_qp(qb, QpState::Rts, &bad, false, now),
        Err(RcError::OutOfRange { .. })
    ));
    for to in [QpState::Init, QpState::Rtr, QpState::Reset, QpState::Err] {
        assert!(
            matches!(
                e.modify_qp(qb, to, &QpUpdate::default(), false, now),
                Err(RcError::NoTransition { .. })
            ),
            "RTS -> {to:?} in place"
        );
    }
    // INIT -> INIT may not touch the requester's retries.
    let q = e.create_qp(4, 0).unwrap();
    e.modify_to_init(q, QpAccess::default()).unwrap();
    let retry = QpUpdate {
        retry_cnt: Some(1),
        ..QpUpdate::default()
    };
    assert!(matches!(
        e.modify_qp(q, QpState::Init, &retry, false, now),
        Err(RcError::NotYet { .. })
    ));
    let access = QpUpdate {
        min_rnr_timer: None,
        ..u
    };
    e.modify_qp(q, QpState::Init, &access, false, now).unwrap();
    p.post(p.wr(1, WrOp::Write, 0, 0, 64));
    p.run(10_000_000);
    assert_eq!(p.completions_a()[0].status, WcStatus::RemInvReqErr);
    assert_eq!(
        p.b.nic.engine_mut().poll_event(),
        Some(AsyncEvent::QpError(qb, QpError::InvalidRequest))
    );
}

#[test]
fn a_qp_on_an_srq_that_goes_to_err_says_last_wqe_reached_once() {
    let mut p = Pair::new(Setup {
        srq_b: Some(16),
        ..Setup::default()
    });
    let qb = p.b.qpn;
    let e = p.b.nic.engine_mut();
    e.modify_to_err(qb).unwrap();
    e.modify_to_err(qb).unwrap();
    assert_eq!(e.poll_event(), Some(AsyncEvent::LastWqeReached(qb)));
    assert_eq!(e.poll_event(), None);
}

#[test]
fn reset_drops_wrs_without_completions_and_the_qp_connects_again() {
    let mut p = Pair::new(Setup::default());
    // A WRITE that never arrives, then both QPs back to RESET.
    p.set_hook(Box::new(|_, _, _| Fate::Drop));
    p.post(p.wr(1, WrOp::Write, 0, 0, 4096));
    p.step(u64::MAX);
    let (qa, qb) = (p.a.qpn, p.b.qpn);
    p.post_recv_b(p.recv_wr(7, 0, 64));
    p.a.nic.engine_mut().reset_qp(qa).unwrap();
    p.b.nic.engine_mut().reset_qp(qb).unwrap();
    p.set_hook(Box::new(|_, _, _| Fate::Deliver));
    p.run(100_000_000);
    assert!(p.completions_a().is_empty(), "RESET completes nothing");
    assert!(p.completions_b().is_empty(), "RESET completes nothing");
    assert_eq!(p.a.nic.engine_mut().qp_state(qa).unwrap(), QpState::Reset);
    let wr = p.wr(2, WrOp::Write, 0, 0, 64);
    assert!(p.a.nic.engine_mut().post_send(qa, wr, p.now).is_err());
    // Connected again with new PSNs, the pair works.
    let params = ConnectParams::new(PathMtu::Mtu1024);
    let end = |qpn, mac, ip, psn| Endpoint { qpn, psn, mac, ip };
    p.a.nic
        .engine_mut()
        .connect_to(qa, 7, &end(qb, rc_util::MAC_B, rc_util::IP_B, 9), &params)
        .unwrap();
    p.b.nic
        .engine_mut()
        .connect_to(qb, 9, &end(qa, rc_util::MAC_A, rc_util::IP_A, 7), &params)
        .unwrap();
    p.fill_a(0, 64, 5);
    p.post(p.wr(3, WrOp::Write, 0, 100, 64));
    p.run(10_000_000);
    let done = p.completions_a();
    assert_eq!((done[0].wr_id, done[0].status), (3, WcStatus::Success));
    assert_eq!(p.b_bytes(100, 64), p.a_bytes(0, 64));
}

// ---- Requester ----

#[test]
fn requester_splits_messages_into_path_mtu_packets_with_reth_on_first_and_only() {
    let mut p = Pair::new(Setup {
        mtu: PathMtu::Mtu256,
        ..Setup::default()
    });
    let wr = p.wr(1, WrOp::Write, 0, 0, 600);
    p.post(wr);
    let wr = p.wr(2, WrOp::Read, 0, 1000, 513);
    p.post(wr);
    p.run(10_000_000);
    let sent = p.logged(Dir::AtoB, |k| {
        (
            k.repr.bth.opcode,
            k.repr.bth.psn,
            k.payload.len(),
            k.repr.reth.map(|r| r.dma_len),
        )
    });
    assert_eq!(
        sent,
        [
            (Opcode::RdmaWriteFirst, 100, 256, Some(600)),
            (Opcode::RdmaWriteMiddle, 101, 256, None),
            (Opcode::RdmaWriteLast, 102, 88, None),
            (Opcode::RdmaReadRequest, 103, 0, Some(513)),
        ]
    );
    // The READ used ceil(513/256) = 3 PSNs, matched by its responses.
    let resp = p.logged(Dir::BtoA, |k| (k.repr.bth.opcode, k.repr.bth.psn));
    assert!(resp.contains(&(Opcode::RdmaReadResponseFirst, 103)));
    assert!(resp.contains(&(Opcode::RdmaReadResponseLast, 105)));
    let wr = p.wr(3, WrOp::Write, 0, 0, 1);
    p.post(wr);
    p.run(10_000_000);
    assert_eq!(
        p.logged(Dir::AtoB, |k| k.repr.bth.psn).last(),
        Some(&106),
        "next PSN after the READ's three"
    );
}

#[test]
fn pad_is_zeroed_and_counted_in_padcnt() {
    let mut p = Pair::new(Setup::default());
    for (i, len) in [1023u32, 1, 2, 3, 4].into_iter().enumerate() {
        p.fill_a(0, 1024, 0xff);
        let wr = p.wr(i as u64, WrOp::Write, 0, 0, len);
        p.post(wr);
    }
    p.run(10_000_000);
    for f in p.frames(Dir::AtoB) {
        let k = Packet::parse(&f).unwrap();
        assert_eq!(usize::from(k.pad), (4 - k.payload.len() % 4) % 4);
        let pad_at = f.len() - 4 - usize::from(k.pad);
        assert!(
            f[pad_at..f.len() - 4].iter().all(|&b| b == 0),
            "pad bytes are zero"
        );
    }
}

#[test]
fn ack_req_on_the_last_packet_and_at_least_every_64_packets() {
    let mut p = Pair::new(Setup::default());
    let wr = p.wr(1, WrOp::Write, 0, 0, 150 * 1024);
    p.post(wr);
    p.run(10_000_000);
    assert_eq!(ack_req_psns(&p), [63, 127, 149]);
}

#[test]
fn ack_req_is_set_on_read_requests_atomics_and_message_ends_as_rxe_sets_it() {
    let mut p = Pair::new(Setup::default());
    let wr = p.recv_wr(1, 0x10_0000, 4096);
    p.post_recv_b(wr);
    for (i, op) in [
        WrOp::Read,
        WrOp::FetchAdd { add: 1 },
        WrOp::CmpSwap {
            compare: 0,
            swap: 1,
        },
        WrOp::Send,
    ]
    .into_iter()
    .enumerate()
    {
        let len = if op.is_atomic() { 8 } else { 2500 };
        let wr = p.wr(i as u64, op, 0x1000 * i as u64, 0x8000, len);
        p.post(wr);
    }
    p.run(10_000_000);
    let sent = p.logged(Dir::AtoB, |k| (k.repr.bth.opcode, k.repr.bth.ack_req));
    assert_eq!(
        sent,
        [
            (Opcode::RdmaReadRequest, true),
            (Opcode::FetchAdd, true),
            (Opcode::CompareSwap, true),
            (Opcode::SendFirst, false),
            (Opcode::SendMiddle, false),
            (Opcode::SendLast, true),
        ]
    );
}

/// The PSNs (from A's first, 100) of A's packets that asked for an ACK.
fn ack_req_psns(p: &Pair) -> Vec<u32> {
    p.logged(Dir::AtoB, |k| (k.repr.bth.psn - 100, k.repr.bth.ack_req))
        .into_iter()
        .filter(|(_, a)| *a)
        .map(|(psn, _)| psn)
        .collect()
}

/// Posts `n` 64 B WRITEs from A, unsignaled but those in `signaled`.
fn post_small_writes(p: &mut Pair, n: u64, signaled: &[u64]) {
    for i in 0..n {
        let mut wr = p.wr(i, WrOp::Write, 0, 64 * i, 64);
        wr.signaled = signaled.contains(&i);
        p.post(wr);
    }
}

#[test]
fn ack_coalescing_an_unsignaled_message_asks_for_an_ack_every_16th_a_signaled_one_always() {
    let mut p = Pair::new(Setup::default());
    post_small_writes(&mut p, 40, &[20]);
    p.run(10_000_000);
    let flagged = ack_req_psns(&p);
    // The 16th unasked, the signaled one, 16 after it; 37..=39 go unasked.
    assert_eq!(flagged, [15, 20, 36]);
    let c = p.a.nic.engine_mut().qp_counters(p.a.qpn).unwrap();
    assert_eq!((c.timeouts, c.retransmitted), (0, 0));
    let cqes = p.completions_a();
    assert_eq!(cqes.iter().map(|c| c.wr_id).collect::<Vec<_>>(), [20]);
}

#[test]
fn ack_coalescing_still_asks_at_least_every_64_packets_across_unasked_message_ends() {
    let mut p = Pair::new(Setup::default());
    for i in 0..10u64 {
        let mut wr = p.wr(i, WrOp::Write, 0, 16 * 1024 * i, 16 * 1024);
        wr.signaled = false;
        p.post(wr);
    }
    p.run(10_000_000);
    let flagged = ack_req_psns(&p);
    // Ten messages of 16 packets: the 64th and 128th packets ask; the
    // last two messages are ACKed after the responder's delay.
    assert_eq!(flagged, [63, 127]);
    let c = p.a.nic.engine_mut().qp_counters(p.a.qpn).unwrap();
    assert_eq!((c.timeouts, c.retransmitted), (0, 0));
    assert_eq!(p.b_bytes(0, 16), p.a_bytes(0, 16));
}

#[test]
fn ack_coalescing_the_responder_acks_unasked_requests_after_its_ack_delay() {
    let mut p = Pair::new(Setup::default());
    post_small_writes(&mut p, 3, &[]);
    p.run(10_000_000);
    let sent = p.timed_ops(Dir::AtoB);
    let acks = p.timed_ops(Dir::BtoA);
    assert_eq!(sent.len(), 3);
    assert_eq!(acks.len(), 1, "one ACK for the three");
    let first = sent[0].0 + DELAY_NS;
    assert!(
        acks[0].0 >= first + transport::rc::ACK_DELAY_NS,
        "ACK at {} ns, the first request arrived at {first} ns",
        acks[0].0
    );
    assert_eq!(p.logged(Dir::BtoA, |k| k.repr.bth.psn), [102]);
    let c = p.a.nic.engine_mut().qp_counters(p.a.qpn).unwrap();
    assert_eq!((c.timeouts, c.retransmitted), (0, 0));
}

#[test]
fn ack_coalescing_is_off_with_a_timeout_near_the_ack_delay_and_towards_a_standard_peer() {
    let short = Pair::new(Setup {
        timeout: 3, // 32 us, under twice the ACK delay
        ..Setup::default()
    });
    let mut standard = Pair::new(Setup::default());
    standard
        .a
        .nic
        .engine_mut()
        .set_qp_send_limits(standard.a.qpn, transport::rc::SendLimits::STANDARD_PEER)
        .unwrap();
    for mut p in [short, standard] {
        post_small_writes(&mut p, 5, &[]);
        p.run(10_000_000);
        assert_eq!(p.logged(Dir::AtoB, |k| k.repr.bth.ack_req), [true; 5]);
    }
}

#[test]
fn at_most_a_bounded_number_of_unacknowledged_psns() {
    let mut p = Pair::new(Setup {
        cfg: |mac, ip| {
            let mut c = transport::rc::EngineConfig::new(mac, ip, 100_000_000_000);
            c.max_outstanding_psns = 8;
            c
        },
        ..Setup::default()
    });
    p.set_hook(rc_util::cut(Dir::BtoA));
    let wr = p.wr(1, WrOp::Write, 0, 0, 20 * 1024);
    p.post(wr);
    p.run(100_000); // less than one ACK timeout
    let psns: Vec<u32> = p.logged(Dir::AtoB, |k| k.repr.bth.psn);
    assert_eq!(psns, (100..108).collect::<Vec<_>>());
}

#[test]
fn a_qp_towards_a_standard_peer_keeps_rxes_bounds_128_unacked_psns_ackreq_every_32() {
    let mut p = Pair::new(Setup::default());
    p.a.nic
        .engine_mut()
        .set_qp_send_limits(p.a.qpn, transport::rc::SendLimits::STANDARD_PEER)
        .unwrap();
    p.set_hook(rc_util::cut(Dir::BtoA));
    let wr = p.wr(1, WrOp::Write, 0, 0, 300 * 1024);
    p.post(wr);
    p.run(100_000); // less than one ACK timeout
    let sent = p.logged(Dir::AtoB, |k| (k.repr.bth.psn - 100, k.repr.bth.ack_req));
    assert_eq!(sent.len(), 128, "PSNs sent with no ACK back");
    let flagged: Vec<u32> = sent.iter().filter(|s| s.1).map(|s| s.0).collect();
    assert_eq!(flagged, [31, 63, 95, 127]);
}

#[test]
fn at_most_w_bytes_in_flight_under_hpcc() {
    let mut p = Pair::new(Setup {
        cfg: |mac, ip| {
            let mut c = transport::rc::EngineConfig::new(mac, ip, 100_000_000_000);
            c.cc = transport::rc::CcMode::HpccInband { maxhop: 2 };
            c.hpcc.w_init = 4096.0;
            c
        },
        ..Setup::default()
    });
    assert_eq!(p.a.nic.engine_mut().qp_cc(p.a.qpn).unwrap().0, 4096);
    p.set_hook(rc_util::cut(Dir::BtoA));
    let wr = p.wr(1, WrOp::Write, 0, 0, 20 * 1024);
    p.post(wr);
    p.run(100_000);
    let bytes: usize = p.logged(Dir::AtoB, |k| k.payload.len()).iter().sum();
    assert_eq!(
        bytes, 4096,
        "one window of payload, then nothing until an ACK"
    );
    assert!(
        p.logged(Dir::AtoB, |k| k.repr.tlm.is_some())
            .iter()
            .all(|&t| t),
        "inband: every data packet carries TLM"
    );
}

#[test]
fn go_back_n_on_nak_psn_sequence_error() {
    let mut p = Pair::new(Setup::default());
    let mut dropped = false;
    p.set_hook(Box::new(move |dir, k, _| {
        if dir == Dir::AtoB && k.repr.bth.psn == 102 && !dropped {
            dropped = true;
            return Fate::Drop;
        }
        Fate::Deliver
    }));
    p.fill_a(0, 6 * 1024, 3);
    let wr = p.wr(1, WrOp::Write, 0, 0, 6 * 1024);
    p.post(wr);
    p.run(10_000_000);
    assert_eq!(p.completions_a()[0].status, WcStatus::Success);
    assert_eq!(p.b_bytes(0, 6 * 1024), p.a_bytes(0, 6 * 1024));
    let psns: Vec<u32> = p.logged(Dir::AtoB, |k| k.repr.bth.psn);
    assert_eq!(
        psns,
        [100, 101, 102, 103, 104, 105, 102, 103, 104, 105],
        "restart at the NAKed PSN"
    );
    assert_eq!(
        p.a.nic
            .engine_mut()
            .qp_counters(p.a.qpn)
            .unwrap()
            .naks_received[0],
        1
    );
    assert_eq!(
        p.a.nic.engine_mut().qp_counters(p.a.qpn).unwrap().timeouts,
        0
    );
}

#[test]
fn go_back_n_on_local_ack_timeout() {
    let mut p = Pair::new(Setup {
        timeout: 4,
        ..Setup::default()
    });
    let mut dropped = false;
    p.set_hook(Box::new(move |dir, k, _| {
        if dir == Dir::AtoB && k.repr.bth.psn == 101 && !dropped {
            dropped = true; // the last packet: no later packet reveals the gap
            return Fate::Drop;
        }
        Fate::Deliver
    }));
    let wr = p.wr(1, WrOp::Write, 0, 0, 2048);
    p.post(wr);
    p.run(10_000_000);
    assert_eq!(p.completions_a()[0].status, WcStatus::Success);
    let c = p.a.nic.engine_mut().qp_counters(p.a.qpn).unwrap();
    assert_eq!(c.timeouts, 1);
    // Nothing was acknowledged (only the lost LAST asked for an ACK), so
    // both packets go again, from the oldest unacknowledged PSN; after a
    // timeout with nothing heard the first one goes twice.
    assert_eq!(c.retransmitted, 3);
    assert_eq!(
        p.logged(Dir::AtoB, |k| k.repr.bth.psn),
        [100, 101, 100, 100, 101]
    );
    // The NIC-wide totals keep a QP's counters after it is destroyed.
    let e = p.a.nic.engine_mut();
    let before = e.qp_totals();
    assert_eq!((before.timeouts, before.retransmitted), (1, 3));
    e.destroy_qp(p.a.qpn).unwrap();
    assert_eq!(e.qp_totals(), before);
}

#[test]
fn after_a_timeout_one_packet_goes_and_an_ack_for_all_ends_the_retransmission() {
    let mut p = Pair::new(Setup::default());
    let mut acks = 0;
    p.set_hook(Box::new(move |dir, _, _| {
        if dir == Dir::BtoA {
            acks += 1;
            if acks == 1 {
                // The one ACK of the message is late (lost here): every
                // original arrived, only the requester does not know.
                return Fate::Drop;
            }
        }
        Fate::Deliver
    }));
    let wr = p.wr(1, WrOp::Write, 0, 0, 16 * 1024);
    p.post(wr);
    p.run(10_000_000);
    assert_eq!(p.completions_a()[0].status, WcStatus::Success);
    let mut expected: Vec<u32> = (100..116).collect();
    // Nothing heard before the timeout: the oldest packet goes twice, and
    // the ACK it brings back covers the whole message.
    expected.extend([100, 100]);
    assert_eq!(p.logged(Dir::AtoB, |k| k.repr.bth.psn), expected);
    let c = p.a.nic.engine_mut().qp_counters(p.a.qpn).unwrap();
    assert_eq!((c.timeouts, c.retransmitted), (1, 2));
}

#[test]
fn local_ack_timeout_is_4_096_us_times_2_pow_timeout_and_0_disables_it() {
    for timeout in [3u8, 6] {
        let mut p = Pair::new(Setup {
            timeout,
            ..Setup::default()
        });
        p.set_hook(rc_util::cut(Dir::AtoB));
        let wr = p.wr(1, WrOp::Write, 0, 0, 10);
        p.post(wr);
        let rto = 4096u64 << timeout;
        assert_eq!(
            p.a.nic.engine_mut().poll_timeout(),
            Some(0),
            "a packet to send now"
        );
        p.step(0);
        assert_eq!(
            p.a.nic.engine_mut().poll_timeout(),
            Some(rto),
            "then the ACK timeout"
        );
    }
    let mut p = Pair::new(Setup {
        timeout: 0,
        ..Setup::default()
    });
    p.set_hook(rc_util::cut(Dir::AtoB));
    let wr = p.wr(1, WrOp::Write, 0, 0, 10);
    p.post(wr);
    p.run(1_000_000_000);
    assert_eq!(p.a.nic.engine_mut().poll_timeout(), None);
    assert!(p.completions_a().is_empty(), "timeout 0: waits forever");
}

#[test]
fn a_read_reissues_a_request_for_the_bytes_not_yet_received() {
    let mut p = Pair::new(Setup::default());
    let mut dropped = false;
    p.set_hook(Box::new(move |dir, k, _| {
        if dir == Dir::BtoA && k.repr.bth.psn == 102 && !dropped {
            dropped = true;
            return Fate::Drop;
        }
        Fate::Deliver
    }));
    p.fill_b(0, 5000, 7);
    let wr = p.wr(1, WrOp::Read, 0, 0, 5000);
    p.post(wr);
    p.run(10_000_000);
    assert_eq!(p.completions_a()[0].status, WcStatus::Success);
    assert_eq!(p.a_bytes(0, 5000), p.b_bytes(0, 5000));
    let reqs = p.logged(Dir::AtoB, |k| {
        (
            k.repr.bth.psn,
            k.repr.reth.map(|r| (r.va - MR_BASE, r.dma_len)),
        )
    });
    assert_eq!(
        reqs,
        [(100, Some((0, 5000))), (102, Some((2048, 5000 - 2048)))]
    );
    assert_eq!(
        p.b.nic
            .engine_mut()
            .qp_counters(p.b.qpn)
            .unwrap()
            .read_replays,
        1
    );
}

fn is_read_response(op: Opcode) -> bool {
    matches!(
        op,
        Opcode::RdmaReadResponseFirst
            | Opcode::RdmaReadResponseMiddle
            | Opcode::RdmaReadResponseLast
            | Opcode::RdmaReadResponseOnly
    )
}

#[test]
fn read_responses_after_a_lost_one_land_where_their_psn_says() {
    // 4% of B's READ responses lost, whichever pass they belong to. The
    // responses after each lost one land out of order (the bytes compared
    // below show where); the request asked again fills the hole.
    let mut p = Pair::new(Setup::default());
    let mut responses = 0u32;
    p.set_hook(Box::new(move |dir, k, _| {
        if dir == Dir::BtoA && is_read_response(k.repr.bth.opcode) {
            responses += 1;
            if responses % 25 == 12 {
                return Fate::Drop;
            }
        }
        Fate::Deliver
    }));
    let len = 512 * 1024;
    p.fill_b(0, len, 3);
    let wr = p.wr(1, WrOp::Read, 8 << 20, 0, len as u32);
    p.post(wr);
    p.run(100_000_000);
    assert_eq!(p.completions_a()[0].status, WcStatus::Success);
    assert_eq!(p.a_bytes(8 << 20, len), p.b_bytes(0, len));
    let sent = p.logged(Dir::BtoA, |k| is_read_response(k.repr.bth.opcode));
    let sent = sent.iter().filter(|r| **r).count();
    assert!(sent < 2 * 512, "{sent} responses for 512");
    let requests = p.logged(Dir::AtoB, |k| k.repr.bth.opcode == Opcode::RdmaReadRequest);
    let requests = requests.iter().filter(|r| **r).count();
    // Our responder cuts a stream short for a request asked again: one
    // request per response lost in the first stream at most.
    assert!(requests <= 1 + 512 / 25, "{requests} READ requests");
}

#[test]
fn an_ack_past_a_read_whose_responses_were_lost_retries_the_read() {
    let mut p = Pair::new(Setup {
        timeout: 14,
        ..Setup::default()
    }); // 67 ms: no timeout here
    let mut dropped = 0;
    p.set_hook(Box::new(move |dir, k, _| {
        if dir == Dir::BtoA && k.repr.bth.opcode == Opcode::RdmaReadResponseOnly && dropped == 0 {
            dropped += 1;
            return Fate::Drop;
        }
        Fate::Deliver
    }));
    p.fill_b(0, 100, 5);
    let wr = p.wr(1, WrOp::Read, 0, 0, 100);
    p.post(wr);
    let wr = p.wr(2, WrOp::Write, 200, 200, 10);
    p.post(wr);
    p.run(1_000_000);
    let c = p.completions_a();
    assert_eq!(
        c.iter().map(|c| c.status).collect::<Vec<_>>(),
        [WcStatus::Success, WcStatus::Success]
    );
    assert_eq!(p.a_bytes(0, 100), p.b_bytes(0, 100));
    assert_eq!(
        p.a.nic.engine_mut().qp_counters(p.a.qpn).unwrap().timeouts,
        0,
        "retried on the ACK, not a timeout"
    );
    assert!(p.now < 1_000_000);
}

#[test]
fn nak_codes_map_to_completion_statuses_and_the_qp_goes_to_err() {
    for (syndrome, status) in [
        (0x61u8, WcStatus::RemInvReqErr),
        (0x62, WcStatus::RemAccessErr),
        (0x63, WcStatus::RemOpErr),
    ] {
        let mut p = Pair::new(Setup::default());
        p.set_hook(rc_util::cut(Dir::AtoB));
        let wr = p.wr(1, WrOp::Write, 0, 0, 10);
        p.post(wr);
        let wr = p.wr(2, WrOp::Write, 0, 0, 10);
        p.post(wr);
        p.step(0);
        let nak = p.frame_to_a(
            Opcode::Acknowledge,
            100,
            Some(AethRepr { syndrome, msn: 0 }),
        );
        let now = p.now;
        p.a.nic.engine_mut().handle_packet(now, &nak);
        let c = p.completions_a();
        assert_eq!(
            c.iter().map(|c| c.status).collect::<Vec<_>>(),
            [status, WcStatus::WrFlushErr]
        );
        assert_eq!(
            p.a.nic.engine_mut().qp_state(p.a.qpn).unwrap(),
            QpState::Err
        );
    }
}

// ---- Responder ----

#[test]
fn psn_greater_than_epsn_gets_one_nak_per_episode_then_silence() {
    let mut p = Pair::new(Setup::default());
    let f = |psn| {
        p.frame_to_b(
            Opcode::RdmaWriteOnly,
            psn,
            true,
            Some(RethRepr {
                va: MR_BASE,
                r_key: p.b.mr.rkey,
                dma_len: 4,
            }),
            &[1, 2, 3, 4],
        )
    };
    let (f101, f102, f103, f100) = (f(101), f(102), f(103), f(100));
    for fr in [&f101, &f102, &f103] {
        p.b.nic.engine_mut().handle_packet(0, fr);
    }
    let out = p.drain_b();
    assert_eq!(
        out,
        [(
            Opcode::Acknowledge,
            100,
            Some(AethRepr {
                syndrome: 0x60,
                msn: 0
            })
        )]
    );
    assert_eq!(
        p.b_bytes(0, 4),
        [0, 0, 0, 0],
        "nothing out of order is applied"
    );
    // ePSN arrives: accepted, ACKed, and the next gap gets a new NAK.
    p.b.nic.engine_mut().handle_packet(0, &f100);
    p.b.nic.engine_mut().handle_packet(0, &f102);
    let out = p.drain_b();
    assert_eq!(out[0].0, Opcode::Acknowledge);
    assert!(out
        .iter()
        .any(|o| o.2.map(|a| a.syndrome) == Some(0x60) && o.1 == 101));
}

#[test]
fn a_duplicate_write_is_acknowledged_whatever_its_ack_req() {
    let mut p = Pair::new(Setup::default());
    let reth = Some(RethRepr {
        va: MR_BASE,
        r_key: p.b.mr.rkey,
        dma_len: 4,
    });
    let first = p.frame_to_b(Opcode::RdmaWriteOnly, 100, false, reth, &[1, 1, 1, 1]);
    p.b.nic.engine_mut().handle_packet(0, &first);
    assert!(p.drain_b().is_empty(), "no AckReq, no ACK yet");
    p.b.nic.engine_mut().handle_packet(0, &first); // the same, again
    let out = p.drain_b();
    assert!(!out.is_empty(), "the duplicate is acknowledged");
    assert!(out.iter().all(|o| o.0 == Opcode::Acknowledge
        && o.1 == 100
        && o.2.map(|a| a.syndrome) == Some(0x1f)));
    assert_eq!(p.b_bytes(0, 4), [1, 1, 1, 1]);
}

#[test]
fn duplicates_are_re_acked_and_never_re_applied() {
    let mut p = Pair::new(Setup::default());
    let reth = Some(RethRepr {
        va: MR_BASE,
        r_key: p.b.mr.rkey,
        dma_len: 4,
    });
    let first = p.frame_to_b(Opcode::RdmaWriteOnly, 100, true, reth, &[1, 1, 1, 1]);
    let second = p.frame_to_b(Opcode::RdmaWriteOnly, 101, true, reth, &[2, 2, 2, 2]);
    p.b.nic.engine_mut().handle_packet(0, &first);
    p.b.nic.engine_mut().handle_packet(0, &second);
    p.drain_b();
    p.b.nic.engine_mut().handle_packet(0, &first); // a late duplicate
    assert_eq!(p.b_bytes(0, 4), [2, 2, 2, 2]);
    // The ACK answers a retransmission (its predecessor was probably lost),
    // so it goes twice.
    let ack = (
        Opcode::Acknowledge,
        101,
        Some(AethRepr {
            syndrome: 0x1f,
            msn: 2,
        }),
    );
    assert_eq!(p.drain_b(), [ack, ack]);
    assert_eq!(
        p.b.nic
            .engine_mut()
            .qp_counters(p.b.qpn)
            .unwrap()
            .duplicates,
        1
    );
}

#[test]
fn a_duplicate_read_request_is_replayed_from_memory() {
    let mut p = Pair::new(Setup::default());
    p.fill_b(0, 3000, 4);
    let reth = RethRepr {
        va: MR_BASE,
        r_key: p.b.mr.rkey,
        dma_len: 3000,
    };
    let req = p.frame_to_b(Opcode::RdmaReadRequest, 100, false, Some(reth), &[]);
    p.b.nic.engine_mut().handle_packet(0, &req);
    let first: Vec<_> = p.drain_b().into_iter().map(|o| (o.0, o.1)).collect();
    assert_eq!(
        first,
        [
            (Opcode::RdmaReadResponseFirst, 100),
            (Opcode::RdmaReadResponseMiddle, 101),
            (Opcode::RdmaReadResponseLast, 102)
        ]
    );
    // The tail again, from PSN 101.
    let tail = RethRepr {
        va: MR_BASE + 1024,
        r_key: p.b.mr.rkey,
        dma_len: 3000 - 1024,
    };
    let again = p.frame_to_b(Opcode::RdmaReadRequest, 101, false, Some(tail), &[]);
    p.b.nic.engine_mut().handle_packet(0, &again);
    let replay: Vec<_> = p.drain_b().into_iter().map(|o| (o.0, o.1)).collect();
    // From inside the READ, the responses continue as MIDDLE/LAST, as rxe
    // replays them.
    assert_eq!(
        replay,
        [
            (Opcode::RdmaReadResponseMiddle, 101),
            (Opcode::RdmaReadResponseLast, 102)
        ]
    );
    // A part of the READ (the last 100 bytes) from PSN 102: LAST alone; a
    // request reaching past the READ's bytes, or with another R_Key, is
    // dropped.
    let part = RethRepr {
        va: MR_BASE + 2900,
        r_key: p.b.mr.rkey,
        dma_len: 100,
    };
    let again = p.frame_to_b(Opcode::RdmaReadRequest, 102, false, Some(part), &[]);
    p.b.nic.engine_mut().handle_packet(0, &again);
    let replay: Vec<_> = p.drain_b().into_iter().map(|o| (o.0, o.1)).collect();
    assert_eq!(replay, [(Opcode::RdmaReadResponseLast, 102)]);
    for bad in [
        RethRepr {
            dma_len: 101,
            ..part
        },
        RethRepr {
            r_key: part.r_key ^ 1,
            ..part
        },
    ] {
        let f = p.frame_to_b(Opcode::RdmaReadRequest, 102, false, Some(bad), &[]);
        p.b.nic.engine_mut().handle_packet(0, &f);
        assert!(p.drain_b().is_empty(), "{bad:?}");
    }
    // The whole READ again from its first PSN: FIRST, MIDDLE, LAST.
    let again = p.frame_to_b(Opcode::RdmaReadRequest, 100, false, Some(reth), &[]);
    p.b.nic.engine_mut().handle_packet(0, &again);
    let ops: Vec<_> = p.drain_b().into_iter().map(|o| o.0).collect();
    assert_eq!(ops[0], Opcode::RdmaReadResponseFirst);
    assert_eq!(
        p.b.nic
            .engine_mut()
            .qp_counters(p.b.qpn)
            .unwrap()
            .read_replays,
        3
    );
}

#[test]
fn length_rules_refuse_bad_first_middle_last_only_and_dma_length() {
    let mtu = 1024usize;
    let cases: Vec<(Opcode, usize, u32)> = vec![
        (Opcode::RdmaWriteFirst, mtu - 1, 4096), // FIRST shorter than MTU
        (Opcode::RdmaWriteOnly, mtu + 4, 1028),  // ONLY longer than MTU
        (Opcode::RdmaWriteOnly, 8, 16),          // total differs from RETH
        (Opcode::RdmaWriteFirst, mtu, 1024),     // FIRST of a message that fits one packet
        (Opcode::RdmaReadRequest, 0, (1 << 31) + 1), // DMA length over 2^31
    ];
    for (op, len, dma_len) in cases {
        let mut p = Pair::new(Setup::default());
        let reth = Some(RethRepr {
            va: MR_BASE,
            r_key: p.b.mr.rkey,
            dma_len,
        });
        let f = p.frame_to_b(op, 100, true, reth, &vec![7u8; len]);
        p.b.nic.engine_mut().handle_packet(0, &f);
        let out = p.drain_b();
        assert_eq!(
            out,
            [(
                Opcode::Acknowledge,
                100,
                Some(AethRepr {
                    syndrome: 0x61,
                    msn: 0
                })
            )],
            "{op} {len} {dma_len}"
        );
        assert_eq!(
            p.b.nic.engine_mut().qp_state(p.b.qpn).unwrap(),
            QpState::Err
        );
        assert!(p.b_bytes(0, 8).iter().all(|&b| b == 0));
    }
    // LAST with no payload, and MIDDLE shorter than MTU, inside a message.
    for (op, len) in [(Opcode::RdmaWriteLast, 0), (Opcode::RdmaWriteMiddle, 100)] {
        let mut p = Pair::new(Setup::default());
        let reth = Some(RethRepr {
            va: MR_BASE,
            r_key: p.b.mr.rkey,
            dma_len: 3 * 1024,
        });
        let first = p.frame_to_b(Opcode::RdmaWriteFirst, 100, false, reth, &[1u8; 1024]);
        p.b.nic.engine_mut().handle_packet(0, &first);
        let bad = p.frame_to_b(op, 101, true, None, &vec![2u8; len]);
        p.b.nic.engine_mut().handle_packet(0, &bad);
        assert_eq!(
            p.drain_b(),
            [(
                Opcode::Acknowledge,
                101,
                Some(AethRepr {
                    syndrome: 0x61,
                    msn: 0
                })
            )],
            "{op}"
        );
    }
}

#[test]
fn opcode_sequence_and_qp_access_are_checked() {
    // MIDDLE without FIRST.
    let mut p = Pair::new(Setup::default());
    let f = p.frame_to_b(Opcode::RdmaWriteMiddle, 100, true, None, &[0u8; 1024]);
    p.b.nic.engine_mut().handle_packet(0, &f);
    assert_eq!(p.drain_b()[0].2.unwrap().syndrome, 0x61);
    // A QP without remote write access refuses WRITEs with invalid request.
    let mut p = Pair::new(Setup {
        access_b: QpAccess {
            remote_write: false,
            remote_read: true,
            remote_atomic: true,
        },
        ..Setup::default()
    });
    let wr = p.wr(1, WrOp::Write, 0, 0, 8);
    p.post(wr);
    p.run(10_000_000);
    assert_eq!(p.completions_a()[0].status, WcStatus::RemInvReqErr);
}

#[test]
fn zero_length_write_and_read_do_not_check_the_r_key_c9_88() {
    let mut p = Pair::new(Setup::default());
    for (id, op) in [(1, WrOp::Write), (2, WrOp::Read)] {
        let mut wr = p.wr(id, op, 0, 0, 0);
        wr.rkey ^= 0x100; // no such region: a zero-length request reaches no memory
        wr.remote_va = 0xdead_0000;
        p.post(wr);
    }
    p.run(10_000_000);
    let c = p.completions_a();
    assert_eq!(
        c.iter().map(|c| c.status).collect::<Vec<_>>(),
        [WcStatus::Success; 2]
    );
    // One byte with the same key is refused.
    let mut wr = p.wr(3, WrOp::Write, 0, 0, 1);
    wr.rkey ^= 0x100;
    p.post(wr);
    p.run(10_000_000);
    assert_eq!(p.completions_a()[0].status, WcStatus::RemAccessErr);
}

#[test]
fn bad_rkey_out_of_bounds_and_missing_access_give_rem_access_err_with_memory_untouched() {
    // A region registered without remote write beside the main one.
    for case in 0..3 {
        let mut p = Pair::new(Setup::default());
        let ro =
            p.b.nic
                .engine_mut()
                .register_mr(
                    MR_BASE + (8 << 20),
                    4096,
                    Access {
                        remote_read: true,
                        ..Access::default()
                    },
                )
                .unwrap();
        p.fill_a(0, 64, 3);
        let mut wr = p.wr(1, WrOp::Write, 0, 0, 64);
        match case {
            0 => wr.rkey ^= 0x100,                         // unknown R_Key
            1 => wr.remote_va = MR_BASE + (16 << 20) - 10, // runs past the end
            _ => {
                wr.rkey = ro.rkey; // no remote write
                wr.remote_va = MR_BASE + (8 << 20);
            }
        }
        p.post(wr);
        p.run(10_000_000);
        assert_eq!(
            p.completions_a()[0].status,
            WcStatus::RemAccessErr,
            "case {case}"
        );
        assert!(p.b_bytes(0, 64).iter().all(|&b| b == 0));
        assert!(p.b_bytes((8 << 20) as u64, 64).iter().all(|&b| b == 0));
        assert!(p
            .b_bytes((16 << 20) as u64 - 10, 10)
            .iter()
            .all(|&b| b == 0));
        assert_eq!(
            p.b.nic.engine_mut().qp_state(p.b.qpn).unwrap(),
            QpState::Err
        );
        assert_eq!(
            p.b.nic.engine_mut().qp_counters(p.b.qpn).unwrap().naks_sent[2],
            1
        );
        // The responder's error no completion reports is an async event.
        assert_eq!(
            p.b.nic.engine_mut().poll_event(),
            Some(AsyncEvent::QpError(p.b.qpn, QpError::Access))
        );
    }
}

#[test]
fn msn_increments_per_completed_message_and_per_accepted_read() {
    let mut p = Pair::new(Setup::default());
    let reth = |n| {
        Some(RethRepr {
            va: MR_BASE,
            r_key: p.b.mr.rkey,
            dma_len: n,
        })
    };
    let w1 = p.frame_to_b(Opcode::RdmaWriteOnly, 100, false, reth(4), &[1; 4]);
    let rd = p.frame_to_b(Opcode::RdmaReadRequest, 101, false, reth(4), &[]);
    let w2 = p.frame_to_b(Opcode::RdmaWriteOnly, 102, true, reth(4), &[2; 4]);
    for f in [&w1, &rd, &w2] {
        p.b.nic.engine_mut().handle_packet(0, f);
    }
    let out = p.drain_b();
    assert_eq!(
        out[0],
        (
            Opcode::RdmaReadResponseOnly,
            101,
            Some(AethRepr {
                syndrome: 0x1f,
                msn: 2
            })
        )
    );
    assert_eq!(
        out[1],
        (
            Opcode::Acknowledge,
            102,
            Some(AethRepr {
                syndrome: 0x1f,
                msn: 3
            })
        )
    );
}

#[test]
fn acks_are_coalesced_and_only_for_packets_that_ask() {
    let mut p = Pair::new(Setup::default());
    let reth = Some(RethRepr {
        va: MR_BASE,
        r_key: p.b.mr.rkey,
        dma_len: 4,
    });
    let frames: Vec<Vec<u8>> = (100..105)
        .map(|psn| p.frame_to_b(Opcode::RdmaWriteOnly, psn, psn != 100, reth, &[1; 4]))
        .collect();
    p.b.nic.engine_mut().handle_packet(0, &frames[0]);
    assert_eq!(p.drain_b(), [], "no AckReq, no ACK");
    for f in &frames[1..] {
        p.b.nic.engine_mut().handle_packet(0, f);
    }
    assert_eq!(
        p.drain_b(),
        [(
            Opcode::Acknowledge,
            104,
            Some(AethRepr {
                syndrome: 0x1f,
                msn: 5
            })
        )]
    );
}

// ---- Numbers that define 'it works' ----

#[test]
fn a_flow_that_crosses_the_24_bit_psn_wrap_keeps_working() {
    let mut p = Pair::new(Setup {
        psn_a: 0xFF_FFF0,
        psn_b: 0xFF_FFFA,
        ..Setup::default()
    });
    p.fill_a(0, 40 * 1024, 1);
    p.fill_b(100_000, 20 * 1024, 2);
    let wr = p.wr(1, WrOp::Write, 0, 0, 40 * 1024);
    p.post(wr);
    let wr = p.wr(2, WrOp::Read, 100_000, 100_000, 20 * 1024);
    p.post(wr);
    p.run(100_000_000);
    let c = p.completions_a();
    assert_eq!(
        c.iter().map(|c| c.status).collect::<Vec<_>>(),
        [WcStatus::Success, WcStatus::Success]
    );
    assert_eq!(p.b_bytes(0, 40 * 1024), p.a_bytes(0, 40 * 1024));
    assert_eq!(p.a_bytes(100_000, 20 * 1024), p.b_bytes(100_000, 20 * 1024));
    assert!(
        p.logged(Dir::AtoB, |k| k.repr.bth.psn).contains(&0),
        "PSN 0 follows 0xFFFFFF"
    );
}

#[test]
fn messages_of_0_1_mtu_minus_1_mtu_mtu_plus_1_and_8_mib() {
    let mut p = Pair::new(Setup::default());
    let sizes = [0u32, 1, 1023, 1024, 1025, 8 << 20];
    for (i, &len) in sizes.iter().enumerate() {
        p.fill_a(0, len as usize, i as u8);
        let wr = p.wr(i as u64, WrOp::Write, 0, 0, len);
        p.post(wr);
        p.run(1_000_000_000);
        assert_eq!(p.completions_a()[0].status, WcStatus::Success, "{len}");
        assert_eq!(
            p.b_bytes(0, len as usize),
            p.a_bytes(0, len as usize),
            "write {len}"
        );
        p.fill_b(0, len as usize, 0x80 | i as u8);
        let wr = p.wr(i as u64, WrOp::Read, 0, 0, len);
        p.post(wr);
        p.run(1_000_000_000);
        assert_eq!(p.completions_a()[0].status, WcStatus::Success, "{len}");
        assert_eq!(
            p.a_bytes(0, len as usize),
            p.b_bytes(0, len as usize),
            "read {len}"
        );
    }
    let c = p.a.nic.engine_mut().qp_counters(p.a.qpn).unwrap();
    assert_eq!(c.retransmitted, 0);
}
