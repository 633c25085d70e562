//! Receive queues, SEND and immediate data, and RNR, one test per rule of
//! issue 14 (IBA ch. 9/10 as rc.md summarizes them; rxe's behaviour where
//! the spec leaves room).

mod rc_util;

use rc_util::{Dir, Fate, Pair, Setup, MR_BASE};
use transport::rc::{
    rnr_timer_ns, AsyncEvent, QpState, RcError, RecvWr, SgList, Sge, WcOpcode, WcStatus, WrOp,
};
use transport::wire::{Opcode, Syndrome};

/// Offset of B's receive buffers in its region (A's data sits at 0).
const RX: u64 = 8 << 20;

#[test]
fn a_send_lands_in_the_oldest_receive_wqe_and_both_sides_complete() {
    let mut p = Pair::new(Setup::default());
    let sizes = [0u32, 1, 1023, 1024, 1025, 3000];
    for i in 0..sizes.len() {
        let wr = p.recv_wr(100 + i as u64, RX + i as u64 * 4096, 4096);
        p.post_recv_b(wr);
    }
    for (i, &len) in sizes.iter().enumerate() {
        p.fill_a(i as u64 * 4096, len as usize, i as u8 + 1);
        let wr = p.wr(i as u64, WrOp::Send, i as u64 * 4096, 0, len);
        p.post(wr);
    }
    p.run(1_000_000_000);
    let a = p.completions_a();
    let b = p.completions_b();
    assert_eq!(a.len(), sizes.len());
    assert_eq!(b.len(), sizes.len());
    for (i, &len) in sizes.iter().enumerate() {
        assert_eq!(
            (a[i].wr_id, a[i].status, a[i].opcode),
            (i as u64, WcStatus::Success, WcOpcode::Send)
        );
        assert_eq!(
            (
                b[i].wr_id,
                b[i].status,
                b[i].opcode,
                b[i].byte_len,
                b[i].imm
            ),
            (100 + i as u64, WcStatus::Success, WcOpcode::Recv, len, None)
        );
        let at = RX + i as u64 * 4096;
        assert!(
            p.b_bytes(at, len as usize) == p.a_bytes(i as u64 * 4096, len as usize),
            "send {i}"
        );
    }
    let ops = p.ops(Dir::AtoB);
    assert!(ops.contains(&Opcode::SendFirst) && ops.contains(&Opcode::SendMiddle));
    assert!(ops.contains(&Opcode::SendLast) && ops.contains(&Opcode::SendOnly));
}

#[test]
fn a_send_scatters_over_the_receive_wqe_sges_and_gathers_from_the_send_sges() {
    let mut p = Pair::new(Setup::default());
    p.fill_a(0, 3000, 9);
    let k = p.b.mr.lkey;
    let rx = [
        (RX, 100u32),
        (RX + 5000, 0),
        (RX + 9000, 1500),
        (RX + 20_000, 2000),
    ];
    let sges: Vec<Sge> = rx
        .iter()
        .map(|&(va, len)| Sge {
            lkey: k,
            va: MR_BASE + va,
            len,
        })
        .collect();
    let wr = RecvWr {
        wr_id: 5,
        sg: SgList::new(&sges).unwrap(),
    };
    p.post_recv_b(wr);
    // The message is A's bytes [0, 1000) then [2000, 3000).
    let ka = p.a.mr.lkey;
    let send = transport::rc::SendWr {
        sg: SgList::new(&[
            Sge {
                lkey: ka,
                va: MR_BASE,
                len: 1000,
            },
            Sge {
                lkey: ka,
                va: MR_BASE + 2000,
                len: 1000,
            },
        ])
        .unwrap(),
        ..p.wr(1, WrOp::Send, 0, 0, 0)
    };
    p.post(send);
    p.run(1_000_000_000);
    let b = p.completions_b();
    assert_eq!((b[0].status, b[0].byte_len), (WcStatus::Success, 2000));
    let mut msg = p.a_bytes(0, 1000);
    msg.extend(p.a_bytes(2000, 1000));
    let mut got = p.b_bytes(RX, 100);
    got.extend(p.b_bytes(RX + 9000, 1500));
    got.extend(p.b_bytes(RX + 20_000, 400));
    assert!(got == msg);
    assert_eq!(
        p.b_bytes(RX + 20_400, 1600),
        vec![0; 1600],
        "past the message"
    );
}

#[test]
fn send_with_immediate_reports_the_value_in_the_receive_completion() {
    let mut p = Pair::new(Setup::default());
    let wr = p.recv_wr(7, RX, 4096);
    p.post_recv_b(wr);
    let wr = p.recv_wr(8, RX + 4096, 4096);
    p.post_recv_b(wr);
    let wr = p.wr(1, WrOp::SendImm(0xdead_beef), 0, 0, 2500);
    p.post(wr);
    let wr = p.wr(2, WrOp::SendImm(0x0102_0304), 0, 0, 0);
    p.post(wr);
    p.run(1_000_000_000);
    let b = p.completions_b();
    assert_eq!(
        (b[0].wr_id, b[0].opcode, b[0].byte_len, b[0].imm),
        (7, WcOpcode::Recv, 2500, Some(0xdead_beef))
    );
    assert_eq!(
        (b[1].wr_id, b[1].byte_len, b[1].imm),
        (8, 0, Some(0x0102_0304))
    );
    let ops = p.ops(Dir::AtoB);
    assert!(ops.contains(&Opcode::SendLastWithImmediate));
    assert!(ops.contains(&Opcode::SendOnlyWithImmediate));
}

#[test]
fn a_solicited_message_sets_the_se_bit_on_its_last_packet_only_and_its_receive_completion_says_so()
{
    let mut p = Pair::new(Setup::default());
    for i in 0..3 {
        let wr = p.recv_wr(10 + i, RX + i * 4096, 4096);
        p.post_recv_b(wr);
    }
    // 2500 B at MTU 1024: FIRST, MIDDLE, LAST; then an unsolicited SEND,
    // then a solicited WRITE with immediate (ONLY).
    let mut wr = p.wr(1, WrOp::Send, 0, 0, 2500);
    wr.solicited = true;
    p.post(wr);
    let wr = p.wr(2, WrOp::Send, 0, 0, 100);
    p.post(wr);
    let mut wr = p.wr(3, WrOp::WriteImm(9), 0, RX + 3 * 4096, 100);
    wr.solicited = true;
    p.post(wr);
    // A solicited READ asks nothing of the responder's CQ: no SE bit.
    let mut wr = p.wr(4, WrOp::Read, 8192, RX, 100);
    wr.solicited = true;
    p.post(wr);
    p.run(1_000_000_000);
    let se = p.logged(Dir::AtoB, |pk| (pk.repr.bth.opcode, pk.repr.bth.solicited));
    assert_eq!(
        se,
        [
            (Opcode::SendFirst, false),
            (Opcode::SendMiddle, false),
            (Opcode::SendLast, true),
            (Opcode::SendOnly, false),
            (Opcode::RdmaWriteOnlyWithImmediate, true),
            (Opcode::RdmaReadRequest, false),
        ]
    );
    let b = p.completions_b();
    let got: Vec<(u64, bool)> = b.iter().map(|c| (c.wr_id, c.solicited)).collect();
    assert_eq!(got, [(10, true), (11, false), (12, true)]);
    assert!(p.completions_a().iter().all(|c| !c.solicited));
}

#[test]
fn write_with_immediate_consumes_a_receive_wqe_and_reports_the_write_length() {
    let mut p = Pair::new(Setup::default());
    let wr = p.recv_wr(3, RX, 64);
    p.post_recv_b(wr);
    p.fill_a(0, 5000, 4);
    let wr = p.wr(1, WrOp::WriteImm(77), 0, 0x1000, 5000);
    p.post(wr);
    p.run(1_000_000_000);
    let b = p.completions_b();
    assert_eq!(
        (
            b[0].wr_id,
            b[0].status,
            b[0].opcode,
            b[0].byte_len,
            b[0].imm
        ),
        (
            3,
            WcStatus::Success,
            WcOpcode::RecvRdmaWithImm,
            5000,
            Some(77)
        )
    );
    assert!(p.b_bytes(0x1000, 5000) == p.a_bytes(0, 5000));
    assert_eq!(
        p.b_bytes(RX, 64),
        vec![0; 64],
        "the receive buffer is not written"
    );
    assert_eq!(p.completions_a()[0].opcode, WcOpcode::RdmaWrite);
}

#[test]
fn a_send_without_a_receive_wqe_gets_an_rnr_nak_and_is_resent_after_the_timer() {
    let mut p = Pair::new(Setup {
        min_rnr_timer: 14,
        ..Setup::default()
    }); // 1.28 ms
    p.fill_a(0, 3000, 2);
    let wr = p.wr(1, WrOp::Send, 0, 0, 3000);
    p.post(wr);
    p.run(5_000_000);
    let naks = p.logged(Dir::BtoA, |k| {
        k.repr.aeth.map(|a| (a.decoded(), k.repr.bth.psn))
    });
    let rnr: Vec<_> = naks
        .iter()
        .flatten()
        .filter(|(s, _)| matches!(s, Syndrome::RnrNak { .. }))
        .collect();
    assert!(rnr.len() >= 2, "{naks:?}");
    assert_eq!(rnr[0].0, Syndrome::RnrNak { timer: 14 });
    assert_eq!(rnr[0].1, 100, "the NAK names the SEND's first PSN");
    assert!(p.completions_a().is_empty());
    assert_eq!(p.a.engine().qp_state(p.a.qpn).unwrap(), QpState::Rts);
    // Resends are spaced by the timer: at most one per 1.28 ms in 5 ms.
    let firsts = p
        .logged(Dir::AtoB, |k| k.repr.bth.opcode == Opcode::SendFirst)
        .iter()
        .filter(|&&f| f)
        .count();
    assert!(
        firsts <= 1 + (5_000_000 / rnr_timer_ns(14)) as usize,
        "{firsts} SEND_FIRSTs"
    );
    let wr = p.recv_wr(9, RX, 4096);
    p.post_recv_b(wr);
    p.run(1_000_000_000);
    assert_eq!(p.completions_a()[0].status, WcStatus::Success);
    assert_eq!(p.completions_b()[0].byte_len, 3000);
    assert!(p.b_bytes(RX, 3000) == p.a_bytes(0, 3000));
    let c = p.a.engine().qp_counters(p.a.qpn).unwrap();
    assert!(c.rnr_naks_received >= 2);
    assert_eq!(
        p.b.engine().qp_counters(p.b.qpn).unwrap().rnr_naks_sent,
        c.rnr_naks_received
    );
}

#[test]
fn the_rnr_timer_codes_follow_the_iba_table() {
    assert_eq!(rnr_timer_ns(0), 655_360_000);
    assert_eq!(rnr_timer_ns(1), 10_000);
    assert_eq!(rnr_timer_ns(12), 640_000);
    assert_eq!(rnr_timer_ns(18), 5_120_000);
    assert_eq!(rnr_timer_ns(31), 491_520_000);
    for c in 2..32 {
        assert!(rnr_timer_ns(c) > rnr_timer_ns(c - 1), "code {c}");
    }
}

#[test]
fn rnr_retry_exhausted_completes_with_rnr_retry_exc_err_and_flushes_the_rest() {
    let mut p = Pair::new(Setup {
        rnr_retry: 2,
        ..Setup::default()
    });
    let wr = p.wr(1, WrOp::Send, 0, 0, 10);
    p.post(wr);
    let wr = p.wr(2, WrOp::Write, 0, 0, 10);
    p.post(wr);
    p.run(1_000_000_000);
    let a = p.completions_a();
    assert_eq!(
        a.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        [(1, WcStatus::RnrRetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    // The first try and two retries, each answered by an RNR NAK.
    assert_eq!(
        p.a.engine().qp_counters(p.a.qpn).unwrap().rnr_naks_received,
        3
    );
    assert_eq!(p.a.engine().qp_state(p.a.qpn).unwrap(), QpState::Err);
}

#[test]
fn rnr_retry_7_retries_for_ever() {
    let mut p = Pair::new(Setup::default());
    let wr = p.wr(1, WrOp::SendImm(5), 0, 0, 10);
    p.post(wr);
    p.run(2_000_000); // 10 us timer: many RNR NAKs
    let naks = p.a.engine().qp_counters(p.a.qpn).unwrap().rnr_naks_received;
    assert!(naks > 7, "{naks} RNR NAKs");
    let wr = p.recv_wr(4, RX, 16);
    p.post_recv_b(wr);
    p.run(1_000_000_000);
    assert_eq!(p.completions_a()[0].status, WcStatus::Success);
    assert_eq!(p.completions_b()[0].imm, Some(5));
}

#[test]
fn a_send_longer_than_its_receive_wqe_fails_both_sides() {
    let mut p = Pair::new(Setup::default());
    let wr = p.recv_wr(3, RX, 100);
    p.post_recv_b(wr);
    let wr = p.recv_wr(4, RX + 4096, 100);
    p.post_recv_b(wr);
    let wr = p.wr(1, WrOp::Send, 0, 0, 101);
    p.post(wr);
    p.run(1_000_000_000);
    assert_eq!(p.completions_a()[0].status, WcStatus::RemInvReqErr);
    let b = p.completions_b();
    assert_eq!(
        b.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        [(3, WcStatus::LocLenErr), (4, WcStatus::WrFlushErr)]
    );
    assert_eq!(p.b_bytes(RX, 100), vec![0; 100]);
}

#[test]
fn a_qp_in_error_flushes_every_receive_wqe_and_later_posts() {
    let mut p = Pair::new(Setup::default());
    for i in 0..3 {
        let wr = p.recv_wr(i, RX + i * 64, 64);
        p.post_recv_b(wr);
    }
    let q = p.b.qpn;
    p.b.engine_mut().modify_to_err(q).unwrap();
    let wr = p.recv_wr(9, RX, 64);
    p.post_recv_b(wr);
    let b = p.completions_b();
    assert_eq!(
        b.iter()
            .map(|c| (c.wr_id, c.status, c.opcode))
            .collect::<Vec<_>>(),
        [0, 1, 2, 9].map(|i| (i, WcStatus::WrFlushErr, WcOpcode::Recv))
    );
}

#[test]
fn a_duplicated_send_is_delivered_once() {
    let mut p = Pair::new(Setup::default());
    p.set_hook(Box::new(|dir, _, _| {
        if dir == Dir::AtoB {
            Fate::Duplicate
        } else {
            Fate::Drop
        }
    }));
    for i in 0..4 {
        let wr = p.recv_wr(i, RX + i * 4096, 4096);
        p.post_recv_b(wr);
    }
    let wr = p.wr(1, WrOp::Send, 0, 0, 2500);
    p.post(wr);
    p.run(20_000_000);
    p.set_hook(Box::new(|_, _, _| Fate::Deliver));
    p.run(1_000_000_000);
    assert_eq!(p.completions_a().len(), 1);
    let b = p.completions_b();
    assert_eq!(b.len(), 1, "{b:?}");
    assert!(p.b.engine().qp_counters(p.b.qpn).unwrap().duplicates > 0);
}

#[test]
fn a_shared_receive_queue_feeds_its_qp_raises_its_limit_once_and_refuses_post_recv() {
    let mut p = Pair::new(Setup {
        srq_b: Some(8),
        ..Setup::default()
    });
    let srq = p.b.srq.unwrap();
    let k = p.b.mr.lkey;
    let e = p.b.engine_mut();
    for i in 0..4u64 {
        let wr = RecvWr {
            wr_id: i,
            sg: SgList::one(Sge {
                lkey: k,
                va: MR_BASE + RX + i * 64,
                len: 64,
            }),
        };
        e.post_srq_recv(srq, wr).unwrap();
    }
    e.modify_srq_limit(srq, 3).unwrap();
    let q = p.b.qpn;
    let wr = p.recv_wr(50, RX, 64);
    assert_eq!(
        p.b.engine_mut().post_recv(q, wr),
        Err(RcError::QpUsesSrq(q))
    );
    for i in 0..3 {
        let wr = p.wr(i, WrOp::Send, 0, 0, 10);
        p.post(wr);
    }
    p.run(1_000_000_000);
    let b = p.completions_b();
    assert_eq!(b.iter().map(|c| c.wr_id).collect::<Vec<_>>(), [0, 1, 2]);
    let e = p.b.engine_mut();
    assert_eq!(e.poll_event(), Some(AsyncEvent::SrqLimitReached(srq)));
    assert_eq!(e.poll_event(), None, "the limit fires once per arming");
    assert_eq!(e.srq_len(srq).unwrap(), 1);
    assert_eq!(e.destroy_srq(srq), Err(RcError::SrqInUse(srq)));
    // Moving the QP to ERR leaves the SRQ's WQEs for its other QPs.
    e.modify_to_err(q).unwrap();
    assert_eq!(e.srq_len(srq).unwrap(), 1);
    e.destroy_qp(q).unwrap();
    e.destroy_srq(srq).unwrap();
    assert_eq!(
        e.post_srq_recv(
            srq,
            RecvWr {
                wr_id: 0,
                sg: SgList::EMPTY
            }
        ),
        Err(RcError::NoSuchSrq(srq))
    );
}

#[test]
fn a_wqe_with_too_many_sges_or_a_bad_sge_is_refused_by_name() {
    let mut p = Pair::new(Setup::default());
    let one = Sge {
        lkey: p.a.mr.lkey,
        va: MR_BASE,
        len: 1,
    };
    assert!(SgList::new(&[one; 17]).is_err());
    // An SGE outside the region: LOC_PROT_ERR, and the QP goes to ERR.
    let bad = transport::rc::SendWr {
        sg: SgList::one(Sge {
            lkey: p.a.mr.lkey,
            va: MR_BASE - 8,
            len: 16,
        }),
        ..p.wr(1, WrOp::Send, 0, 0, 0)
    };
    p.post(bad);
    let a = p.completions_a();
    assert_eq!((a[0].wr_id, a[0].status), (1, WcStatus::LocProtErr));
    // An atomic needs an 8-byte local buffer.
    let mut p = Pair::new(Setup::default());
    let wr = p.wr(1, WrOp::FetchAdd { add: 1 }, 0, 0, 4);
    let q = p.a.qpn;
    assert_eq!(
        p.a.engine_mut().post_send(q, wr, 0),
        Err(RcError::AtomicLength {
            what: "an atomic",
            len: 4
        })
    );
}

#[test]
fn inline_data_is_sent_from_the_wqe_not_from_memory() {
    let mut p = Pair::new(Setup::default());
    let wr = p.recv_wr(1, RX, 256);
    p.post_recv_b(wr);
    let data: Vec<u8> = (0..100u8).collect();
    let inline = Some(transport::rc::InlineData::new(&data).unwrap());
    let send = transport::rc::SendWr {
        sg: SgList::EMPTY,
        inline,
        ..p.wr(1, WrOp::SendImm(3), 0, 0, 0)
    };
    p.post(send);
    let write = transport::rc::SendWr {
        sg: SgList::EMPTY,
        inline,
        ..p.wr(2, WrOp::Write, 0, 0x2000, 0)
    };
    p.post(write);
    p.run(1_000_000_000);
    let a = p.completions_a();
    assert!(
        a.iter()
            .all(|c| c.status == WcStatus::Success && c.byte_len == 100),
        "{a:?}"
    );
    assert_eq!(p.b_bytes(RX, 100), data);
    assert_eq!(p.b_bytes(0x2000, 100), data);
    assert_eq!(p.completions_b()[0].byte_len, 100);
    // Inline is for SEND and WRITE only.
    let read = transport::rc::SendWr {
        inline,
        ..p.wr(3, WrOp::Read, 0, 0, 100)
    };
    let q = p.a.qpn;
    assert_eq!(
        p.a.engine_mut().post_send(q, read, 0),
        Err(RcError::InlineOp("RDMA READ"))
    );
    assert!(transport::rc::InlineData::new(&[0; transport::rc::MAX_INLINE_DATA + 1]).is_err());
}

#[test]
fn send_with_invalidate_is_parsed_and_refused_as_an_invalid_request() {
    // No memory windows here: the IETH parses, the request is refused by
    // name (NAK invalid request), not dropped at parse.
    let mut p = Pair::new(Setup::default());
    let wr = p.recv_wr(1, RX, 64);
    p.post_recv_b(wr);
    let mut r = p.repr_to_b(Opcode::SendOnlyWithInvalidate, 100);
    r.ieth = Some(0x1234);
    let f = rc_util::emit(&r, &[1; 8]);
    p.b.engine_mut().handle_packet(0, &f);
    let sent = p.drain_b();
    assert_eq!(sent[0].0, Opcode::Acknowledge);
    assert_eq!(sent[0].2.unwrap().syndrome, 0x61);
    assert_eq!(p.b.engine().qp_state(p.b.qpn).unwrap(), QpState::Err);
    assert_eq!(p.b.engine().counters().wire_drops.iter().sum::<u64>(), 0);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 32, ..Default::default() })]

    /// Whatever the RNR timer code and rnr_retry (0-6): a SEND that never
    /// finds a receive WQE goes out rnr_retry + 1 times, each resend at
    /// least the timer's wait after the previous one, then completes with
    /// RNR_RETRY_EXC_ERR.
    #[test]
    fn the_requester_waits_the_rnr_timer_and_gives_up_after_rnr_retry(
        code in 1u8..=20,
        retry in 0u8..=6,
    ) {
        let mut p = Pair::new(Setup { min_rnr_timer: code, rnr_retry: retry, ..Setup::default() });
        let wr = p.wr(1, WrOp::Send, 0, 0, 100);
        p.post(wr);
        p.run(100_000_000_000);
        let a = p.completions_a();
        proptest::prop_assert_eq!(a[0].status, WcStatus::RnrRetryExcErr);
        let sends: Vec<u64> = p
            .timed_ops(Dir::AtoB)
            .into_iter()
            .filter(|(_, op)| *op == Opcode::SendOnly)
            .map(|(t, _)| t)
            .collect();
        proptest::prop_assert_eq!(sends.len(), usize::from(retry) + 1);
        for w in sends.windows(2) {
            proptest::prop_assert!(w[1] - w[0] >= rnr_timer_ns(code), "{:?}", sends);
        }
    }
}
