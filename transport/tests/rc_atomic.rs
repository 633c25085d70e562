//! Atomics, fences and the READ/atomic limit, one test per rule of issue 14:
//! CMP_SWAP and FETCH_ADD on 8-byte aligned addresses of MRs with the
//! remote-atomic right, the original value back in ATOMIC_ACKNOWLEDGE, a
//! duplicate answered from the saved result and never executed twice.

mod rc_util;

use rc_util::{Dir, Fate, Pair, Setup, MR_BASE};
use transport::mr::Access;
use transport::rc::{QpAccess, QpState, SendWr, Sge, WcOpcode, WcStatus, WrOp};
use transport::wire::Opcode;

/// B's operand, as the 8 bytes in host order the application sees.
fn b_u64(p: &Pair, off: u64) -> u64 {
    u64::from_ne_bytes(p.b_bytes(off, 8).try_into().unwrap())
}

fn a_u64(p: &Pair, off: u64) -> u64 {
    u64::from_ne_bytes(p.a_bytes(off, 8).try_into().unwrap())
}

fn set_b_u64(p: &mut Pair, off: u64, v: u64) {
    p.b.engine_mut()
        .mem_mut()
        .slice_mut(MR_BASE + off, 8)
        .copy_from_slice(&v.to_ne_bytes());
}

#[test]
fn fetch_add_adds_and_returns_the_original_value() {
    let mut p = Pair::new(Setup::default());
    set_b_u64(&mut p, 0x100, 40);
    let wr = p.wr(1, WrOp::FetchAdd { add: 2 }, 0x10, 0x100, 8);
    p.post(wr);
    let wr = p.wr(2, WrOp::FetchAdd { add: u64::MAX }, 0x18, 0x100, 8);
    p.post(wr);
    p.run(1_000_000_000);
    let a = p.completions_a();
    assert_eq!(
        a.iter()
            .map(|c| (c.wr_id, c.status, c.opcode, c.byte_len))
            .collect::<Vec<_>>(),
        [
            (1, WcStatus::Success, WcOpcode::FetchAdd, 8),
            (2, WcStatus::Success, WcOpcode::FetchAdd, 8)
        ]
    );
    assert_eq!((a_u64(&p, 0x10), a_u64(&p, 0x18)), (40, 42));
    assert_eq!(b_u64(&p, 0x100), 41, "40 + 2 - 1 (wrapping)");
    assert_eq!(p.ops(Dir::AtoB), [Opcode::FetchAdd, Opcode::FetchAdd]);
    assert!(p
        .ops(Dir::BtoA)
        .iter()
        .all(|&o| o == Opcode::AtomicAcknowledge));
}

#[test]
fn cmp_swap_swaps_only_when_the_value_matches() {
    let mut p = Pair::new(Setup::default());
    set_b_u64(&mut p, 0x200, 7);
    let wr = p.wr(
        1,
        WrOp::CmpSwap {
            compare: 8,
            swap: 100,
        },
        0x10,
        0x200,
        8,
    );
    p.post(wr);
    let wr = p.wr(
        2,
        WrOp::CmpSwap {
            compare: 7,
            swap: 100,
        },
        0x18,
        0x200,
        8,
    );
    p.post(wr);
    p.run(1_000_000_000);
    let a = p.completions_a();
    assert!(a
        .iter()
        .all(|c| c.status == WcStatus::Success && c.opcode == WcOpcode::CompSwap));
    assert_eq!((a_u64(&p, 0x10), a_u64(&p, 0x18)), (7, 7));
    assert_eq!(b_u64(&p, 0x200), 100);
}

#[test]
fn a_duplicate_atomic_is_answered_from_its_saved_result_and_never_executed_twice() {
    let mut p = Pair::new(Setup::default());
    // Every request arrives twice and the first acknowledgement is lost,
    // so the requester retries as well.
    let mut acks = 0;
    p.set_hook(Box::new(move |dir, k, _| match dir {
        Dir::AtoB => Fate::Duplicate,
        Dir::BtoA if k.repr.bth.opcode == Opcode::AtomicAcknowledge => {
            acks += 1;
            if acks == 1 {
                Fate::Drop
            } else {
                Fate::Deliver
            }
        }
        Dir::BtoA => Fate::Deliver,
    }));
    for i in 0..5 {
        let wr = p.wr(i, WrOp::FetchAdd { add: 1 }, 0x10 + 8 * i, 0x300, 8);
        p.post(wr);
    }
    p.run(1_000_000_000);
    let a = p.completions_a();
    assert!(a.iter().all(|c| c.status == WcStatus::Success), "{a:?}");
    assert_eq!(b_u64(&p, 0x300), 5, "five adds, each executed once");
    let got: Vec<u64> = (0..5).map(|i| a_u64(&p, 0x10 + 8 * i)).collect();
    assert_eq!(got, [0, 1, 2, 3, 4]);
    assert!(p.b.engine().qp_counters(p.b.qpn).unwrap().duplicates >= 5);
}

#[test]
fn a_misaligned_atomic_gets_invalid_request_and_memory_is_unchanged() {
    let mut p = Pair::new(Setup::default());
    set_b_u64(&mut p, 0x400, 9);
    let wr = p.wr(1, WrOp::FetchAdd { add: 1 }, 0x10, 0x404, 8);
    p.post(wr);
    p.run(1_000_000_000);
    assert_eq!(p.completions_a()[0].status, WcStatus::RemInvReqErr);
    assert_eq!(b_u64(&p, 0x400), 9);
    assert_eq!(p.b_bytes(0x404, 8), [0; 8]);
    assert_eq!(p.b.engine().qp_state(p.b.qpn).unwrap(), QpState::Err);
}

#[test]
fn an_atomic_out_of_bounds_or_on_a_region_without_the_atomic_right_gets_remote_access_error() {
    // Just past the region.
    let mut p = Pair::new(Setup::default());
    let end = rc_util::MR_LEN as u64;
    let wr = p.wr(1, WrOp::FetchAdd { add: 1 }, 0x10, end, 8);
    p.post(wr);
    p.run(1_000_000_000);
    assert_eq!(p.completions_a()[0].status, WcStatus::RemAccessErr);
    // A region registered without remote atomic.
    let mut p = Pair::new(Setup::default());
    let no_atomic = Access {
        remote_atomic: false,
        ..Access::ALL
    };
    let k =
        p.b.engine_mut()
            .register_mr(MR_BASE + 0x1000, 64, no_atomic);
    // Regions may not overlap in VecMemory, but keys may: this one is
    // inside the first region's bytes.
    let k = k.unwrap();
    set_b_u64(&mut p, 0x1000, 3);
    let wr = SendWr {
        rkey: k.rkey,
        ..p.wr(
            1,
            WrOp::CmpSwap {
                compare: 3,
                swap: 4,
            },
            0x10,
            0x1000,
            8,
        )
    };
    p.post(wr);
    p.run(1_000_000_000);
    assert_eq!(p.completions_a()[0].status, WcStatus::RemAccessErr);
    assert_eq!(b_u64(&p, 0x1000), 3);
}

#[test]
fn an_atomic_to_a_qp_without_remote_atomic_access_is_an_invalid_request() {
    let mut p = Pair::new(Setup {
        access_b: QpAccess {
            remote_write: true,
            remote_read: true,
            remote_atomic: false,
        },
        ..Setup::default()
    });
    let wr = p.wr(1, WrOp::FetchAdd { add: 1 }, 0x10, 0x100, 8);
    p.post(wr);
    p.run(1_000_000_000);
    assert_eq!(p.completions_a()[0].status, WcStatus::RemInvReqErr);
    assert_eq!(b_u64(&p, 0x100), 0);
}

#[test]
fn a_lost_atomic_acknowledgement_is_recovered_by_the_next_ack_as_an_implied_nak() {
    let mut p = Pair::new(Setup::default());
    let mut first = true;
    p.set_hook(Box::new(move |dir, k, _| {
        if dir == Dir::BtoA && k.repr.bth.opcode == Opcode::AtomicAcknowledge && first {
            first = false;
            return Fate::Drop;
        }
        Fate::Deliver
    }));
    let wr = p.wr(1, WrOp::FetchAdd { add: 5 }, 0x10, 0x100, 8);
    p.post(wr);
    let wr = p.wr(2, WrOp::Write, 0x100, 0x800, 64);
    p.post(wr);
    p.run(1_000_000_000);
    let a = p.completions_a();
    assert_eq!(
        a.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert_eq!(b_u64(&p, 0x100), 5);
    assert_eq!(a_u64(&p, 0x10), 0);
}

#[test]
fn a_fenced_wr_waits_for_the_reads_and_atomics_before_it() {
    let mut p = Pair::new(Setup::default());
    let wr = p.wr(1, WrOp::Read, 0x1000, 0x1000, 5000);
    p.post(wr);
    let wr = p.wr(2, WrOp::FetchAdd { add: 1 }, 0x10, 0x100, 8);
    p.post(wr);
    let wr = SendWr {
        fence: true,
        ..p.wr(3, WrOp::Write, 0x2000, 0x3000, 100)
    };
    p.post(wr);
    p.run(1_000_000_000);
    assert!(p
        .completions_a()
        .iter()
        .all(|c| c.status == WcStatus::Success));
    // On the wire B -> A the READ's last response and the atomic's
    // acknowledgement come before anything of the fenced WRITE A -> B.
    let log = p.frame_log();
    let write_at = log
        .iter()
        .position(|(d, op)| *d == Dir::AtoB && *op == Opcode::RdmaWriteOnly)
        .unwrap();
    let last_resp = log
        .iter()
        .rposition(|(d, op)| {
            *d == Dir::BtoA
                && matches!(op, Opcode::RdmaReadResponseLast | Opcode::AtomicAcknowledge)
        })
        .unwrap();
    assert!(last_resp < write_at, "{log:?}");
}

#[test]
fn an_unfenced_wr_does_not_wait_for_an_earlier_read() {
    let mut p = Pair::new(Setup::default());
    let wr = p.wr(1, WrOp::Read, 0x1000, 0x1000, 5000);
    p.post(wr);
    let wr = p.wr(3, WrOp::Write, 0x2000, 0x3000, 100);
    p.post(wr);
    p.run(1_000_000_000);
    let log = p.frame_log();
    let write_at = log
        .iter()
        .position(|(d, op)| *d == Dir::AtoB && *op == Opcode::RdmaWriteOnly)
        .unwrap();
    let first_resp = log.iter().position(|(d, _)| *d == Dir::BtoA).unwrap();
    assert!(write_at < first_resp, "{log:?}");
}

#[test]
fn at_most_max_rd_atomic_reads_and_atomics_are_outstanding() {
    let mut p = Pair::new(Setup {
        rd_atomic: 1,
        ..Setup::default()
    });
    let wr = p.wr(1, WrOp::FetchAdd { add: 1 }, 0x10, 0x100, 8);
    p.post(wr);
    let wr = p.wr(2, WrOp::Read, 0x1000, 0x1000, 100);
    p.post(wr);
    let wr = p.wr(
        3,
        WrOp::CmpSwap {
            compare: 1,
            swap: 9,
        },
        0x18,
        0x100,
        8,
    );
    p.post(wr);
    p.run(1_000_000_000);
    assert!(p
        .completions_a()
        .iter()
        .all(|c| c.status == WcStatus::Success));
    assert_eq!(b_u64(&p, 0x100), 9);
    // Requests and responses alternate: never two requests in flight.
    let log: Vec<Dir> = p.frame_log().into_iter().map(|(d, _)| d).collect();
    assert_eq!(
        log,
        [
            Dir::AtoB,
            Dir::BtoA,
            Dir::AtoB,
            Dir::BtoA,
            Dir::AtoB,
            Dir::BtoA
        ]
    );
}

#[test]
fn an_unsignaled_wr_completes_silently_unless_it_fails() {
    let mut p = Pair::new(Setup::default());
    let wr = SendWr {
        signaled: false,
        ..p.wr(1, WrOp::Write, 0, 0, 10)
    };
    p.post(wr);
    let wr = p.wr(2, WrOp::Write, 0, 0, 10);
    p.post(wr);
    let bad = SendWr {
        signaled: false,
        sg: transport::rc::SgList::one(Sge {
            lkey: p.a.mr.lkey,
            va: 1,
            len: 8,
        }),
        ..p.wr(3, WrOp::Write, 0, 0, 8)
    };
    p.post(bad);
    p.run(1_000_000_000);
    let a = p.completions_a();
    assert_eq!(
        a.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        [(2, WcStatus::Success), (3, WcStatus::LocProtErr)]
    );
    assert_eq!(p.a.engine().qp_state(p.a.qpn).unwrap(), QpState::Err);
}

/// A second QP pair between the same two engines, connected.
fn second_qp(p: &mut Pair) -> (u32, u32) {
    use transport::rc::{ConnectParams, Endpoint, PathMtu};
    let qa = p.a.engine_mut().create_qp(64, 0).unwrap();
    let qb = p.b.engine_mut().create_qp(64, 0).unwrap();
    let params = ConnectParams::new(PathMtu::Mtu1024);
    let end = |qpn, mac, ip| Endpoint {
        qpn,
        psn: 7,
        mac,
        ip,
    };
    p.a.engine_mut()
        .connect_to(qa, 7, &end(qb, rc_util::MAC_B, rc_util::IP_B), &params)
        .unwrap();
    p.b.engine_mut()
        .connect_to(qb, 7, &end(qa, rc_util::MAC_A, rc_util::IP_A), &params)
        .unwrap();
    (qa, qb)
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 24, ..Default::default() })]

    /// FETCH_ADDs from two QPs on one address, over a wire that drops and
    /// duplicates frames as the seed says: every add is applied exactly
    /// once, and the original values returned are all different (each add
    /// saw the others' effects whole).
    #[test]
    fn atomics_from_two_qps_on_one_address_are_atomic_and_exactly_once(
        seed in 0u64..u64::MAX,
        n in 1u64..40,
    ) {
        let mut p = Pair::new(Setup::default());
        let (qa2, _) = second_qp(&mut p);
        let mut x = seed | 1;
        p.set_hook(Box::new(move |_, _, _| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            match x % 10 {
                0 => Fate::Drop,
                1 => Fate::Duplicate,
                _ => Fate::Deliver,
            }
        }));
        let q1 = p.a.qpn;
        for i in 0..n {
            for (k, q) in [q1, qa2].into_iter().enumerate() {
                let slot = 0x10 + 8 * (2 * i + k as u64);
                let wr = p.wr(2 * i + k as u64, WrOp::FetchAdd { add: 1 }, slot, 0x100, 8);
                p.a.engine_mut().post_send(q, wr, 0).unwrap();
            }
        }
        p.run(10_000_000_000);
        let a = p.completions_a();
        proptest::prop_assert_eq!(a.len() as u64, 2 * n);
        proptest::prop_assert!(a.iter().all(|c| c.status == WcStatus::Success), "{:?}", a);
        proptest::prop_assert_eq!(b_u64(&p, 0x100), 2 * n);
        let mut seen: Vec<u64> = (0..2 * n).map(|i| a_u64(&p, 0x10 + 8 * i)).collect();
        seen.sort_unstable();
        proptest::prop_assert_eq!(seen, (0..2 * n).collect::<Vec<_>>());
    }
}

/// A READ request (`atomic` false) or FETCH_ADD of 1 (`atomic` true) from
/// A to B at `psn`, on B's 8 bytes at offset `off`.
fn request_to_b(p: &Pair, psn: u32, atomic: bool, off: u64) -> Vec<u8> {
    use transport::wire::{AtomicEthRepr, RethRepr};
    let op = if atomic {
        Opcode::FetchAdd
    } else {
        Opcode::RdmaReadRequest
    };
    let mut r = p.repr_to_b(op, psn);
    r.bth.ack_req = true;
    if atomic {
        r.atomic = Some(AtomicEthRepr {
            va: MR_BASE + off,
            r_key: p.b.mr.rkey,
            swap_add: 1,
            compare: 0,
        });
    } else {
        r.reth = Some(RethRepr {
            va: MR_BASE + off,
            r_key: p.b.mr.rkey,
            dma_len: 8,
        });
    }
    rc_util::emit(&r, &[])
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 64, ..Default::default() })]

    /// The responder remembers its last max_dest_rd_atomic READs and
    /// atomics: a duplicate of one of them is answered (a READ from memory,
    /// an atomic with its saved original value, never executed again); a
    /// duplicate of an older one is dropped.
    #[test]
    fn responder_resources_replay_the_last_max_dest_rd_atomic_requests(
        resources in 1u8..8,
        kinds in proptest::collection::vec(proptest::bool::ANY, 1..20),
        dups in proptest::collection::vec(0usize..20, 0..30),
    ) {
        let mut p = Pair::new(Setup { rd_atomic: resources, ..Setup::default() });
        let n = kinds.len();
        for (i, &atomic) in kinds.iter().enumerate() {
            set_b_u64(&mut p, 64 * i as u64, 1000 + i as u64);
            let f = request_to_b(&p, 100 + i as u32, atomic, 64 * i as u64);
            p.b.engine_mut().handle_packet(0, &f);
            let out = p.drain_b();
            proptest::prop_assert_eq!(out.len(), 1);
        }
        for d in dups {
            let i = d % n;
            let before: Vec<u64> = (0..n).map(|k| b_u64(&p, 64 * k as u64)).collect();
            let f = request_to_b(&p, 100 + i as u32, kinds[i], 64 * i as u64);
            p.b.engine_mut().handle_packet(0, &f);
            let out = p.drain_b();
            let remembered = i + usize::from(resources) >= n;
            if remembered {
                let want = if kinds[i] { Opcode::AtomicAcknowledge } else { Opcode::RdmaReadResponseOnly };
                proptest::prop_assert_eq!(out.len(), 1, "duplicate of {} ({:?})", i, out);
                proptest::prop_assert_eq!((out[0].0, out[0].1), (want, 100 + i as u32));
            } else {
                proptest::prop_assert!(out.is_empty(), "duplicate of forgotten {}: {:?}", i, out);
            }
            let after: Vec<u64> = (0..n).map(|k| b_u64(&p, 64 * k as u64)).collect();
            proptest::prop_assert_eq!(before, after, "a duplicate changed memory");
        }
        // Every atomic executed exactly once.
        for (i, &atomic) in kinds.iter().enumerate() {
            proptest::prop_assert_eq!(b_u64(&p, 64 * i as u64), 1000 + i as u64 + u64::from(atomic));
        }
    }
}

#[test]
fn a_failing_qp_reports_completed_unsignaled_wrs_no_more_than_before() {
    let mut p = Pair::new(Setup::default());
    let quiet = SendWr {
        signaled: false,
        ..p.wr(1, WrOp::Write, 0, 0, 10)
    };
    p.post(quiet);
    let bad = SendWr {
        rkey: p.b.mr.rkey ^ 0x55,
        ..p.wr(2, WrOp::Write, 0, 0, 10)
    };
    p.post(bad);
    p.run(1_000_000_000);
    let a = p.completions_a();
    assert_eq!(
        a.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        [(2, WcStatus::RemAccessErr)]
    );
}

#[test]
fn reads_beyond_max_dest_rd_atomic_get_an_invalid_request_nak() {
    let mut p = Pair::new(Setup {
        rd_atomic: 2,
        ..Setup::default()
    });
    for i in 0..3u32 {
        let f = request_to_b(&p, 100 + i, false, 64 * u64::from(i));
        p.b.engine_mut().handle_packet(0, &f);
    }
    let out = p.drain_b();
    let naks: Vec<u8> = out.iter().filter_map(|o| o.2).map(|a| a.syndrome).collect();
    assert!(naks.contains(&0x61), "{out:?}");
    assert_eq!(p.b.engine().qp_state(p.b.qpn).unwrap(), QpState::Err);
}
