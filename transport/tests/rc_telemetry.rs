//! Telemetry through the engine in each congestion-control mode: the
//! switch hop records reach the pacer and its W and R gate the requester.

mod rc_util;

use rc_util::{Dir, Fate, Pair, Setup};
use transport::rc::{CcMode, EngineConfig, WcStatus, WrOp};
use transport::wire::{HopRecord, MacAddr, Opcode};

const LINE: u64 = 100_000_000_000;

fn setup(cc: CcMode) -> Setup {
    let cfg: fn(MacAddr, std::net::Ipv4Addr) -> EngineConfig = match cc {
        CcMode::HpccInband { .. } => |m, i| EngineConfig {
            cc: CcMode::HpccInband { maxhop: 3 },
            ..EngineConfig::new(m, i, LINE)
        },
        CcMode::HpccProbe { .. } => |m, i| EngineConfig {
            cc: CcMode::HpccProbe {
                maxhop: 3,
                timeout_ns: 15_000,
            },
            ..EngineConfig::new(m, i, LINE)
        },
        CcMode::RxHpcc { .. } => |m, i| EngineConfig {
            cc: CcMode::RxHpcc { maxhop: 3 },
            ..EngineConfig::new(m, i, LINE)
        },
        CcMode::Dcqcn => |m, i| EngineConfig {
            cc: CcMode::Dcqcn,
            ..EngineConfig::new(m, i, LINE)
        },
        CcMode::None => |m, i| EngineConfig::new(m, i, LINE),
    };
    Setup {
        cfg,
        ..Setup::default()
    }
}

/// A congested 100 Gb/s switch port: the queue grows by what the flow sends
/// beyond 50 Gb/s, and tx_bytes counts 50 Gb/s of departures.
fn congested_switch() -> impl FnMut(Dir, &transport::wire::Packet<'_>, usize) -> Fate {
    switch_reporting(200_000)
}

/// [`congested_switch`] with `qlen` in every record's qlen field.
fn switch_reporting(qlen: u32) -> impl FnMut(Dir, &transport::wire::Packet<'_>, usize) -> Fate {
    let mut ts = 0u32;
    move |dir, p, _| {
        if dir == Dir::AtoB && p.repr.tlm.is_some() {
            ts += 1_000;
            Fate::PushHop(HopRecord {
                ts_ns: ts,
                tx_bytes: ts.wrapping_mul(6), // 6.25 B/ns = 50 Gb/s
                qlen,
                rate: 1000,
                switch_id: 7,
                port_id: 1,
            })
        } else {
            Fate::Deliver
        }
    }
}

/// Twenty 8 KiB WRITEs through the congested switch; all must succeed.
fn write_through_congestion(p: &mut Pair) {
    p.set_hook(Box::new(congested_switch()));
    write_all(p, 20);
}

/// `n` 8 KiB WRITEs through whatever the wire does; all must succeed.
fn write_all(p: &mut Pair, n: u64) {
    for i in 0..n {
        let wr = p.wr(i, WrOp::Write, 0, 0, 8192);
        p.post(wr);
    }
    p.run(100_000_000);
    assert!(p
        .completions_a()
        .iter()
        .all(|c| c.status == WcStatus::Success));
}

#[test]
fn inband_acks_echo_the_stack_and_hpcc_cuts_the_window() {
    let mut p = Pair::new(setup(CcMode::HpccInband { maxhop: 3 }));
    let (w0, r0) = p.a.nic.engine_mut().qp_cc(p.a.qpn).unwrap();
    assert_eq!(r0, LINE);
    write_through_congestion(&mut p);
    // ACKs carry the echoed stack with the switch's hop.
    let echoed = p.logged(Dir::BtoA, |k| {
        k.repr
            .tlm
            .map(|t| (t.echo, t.nhop, t.filled().first().map(|h| h.switch_id)))
    });
    assert!(echoed.contains(&Some((true, 1, Some(7)))), "{echoed:?}");
    let (w1, r1) = p.a.nic.engine_mut().qp_cc(p.a.qpn).unwrap();
    assert!(
        w1 < w0 && r1 < r0,
        "a standing queue shrinks W and R: {w0} -> {w1}, {r0} -> {r1}"
    );
}

#[test]
fn probe_mode_sends_tlm_requests_and_feeds_responses_to_hpcc() {
    let mut p = Pair::new(setup(CcMode::HpccProbe {
        maxhop: 3,
        timeout_ns: 15_000,
    }));
    write_through_congestion(&mut p);
    let ops = p.ops(Dir::AtoB);
    assert!(ops.contains(&Opcode::TlmRequest));
    assert!(p.ops(Dir::BtoA).contains(&Opcode::TlmResponse));
    // Data packets carry no TLM in probe mode.
    assert!(p
        .logged(Dir::AtoB, |k| k.repr.bth.opcode != Opcode::TlmRequest
            && k.repr.tlm.is_some())
        .iter()
        .all(|&x| !x));
    let c = p.a.nic.engine_mut().qp_counters(p.a.qpn).unwrap();
    assert!(c.probes_sent >= 2 && c.probe_responses >= 2, "{c:?}");
    assert!(
        c.probes_sent <= c.probe_responses + 1,
        "one probe outstanding at a time"
    );
    assert!(c.last_probe_rtt_ns >= 2 * rc_util::DELAY_NS);
    let (w, _) = p.a.nic.engine_mut().qp_cc(p.a.qpn).unwrap();
    assert!(w < 62_500, "HPCC++ reacted to the probed queue: W = {w}");
}

#[test]
fn receiver_based_mode_sends_cc_notify_and_the_sender_adopts_it() {
    let mut p = Pair::new(setup(CcMode::RxHpcc { maxhop: 3 }));
    write_through_congestion(&mut p);
    let notifies: Vec<_> = p
        .logged(Dir::BtoA, |k| k.repr.notify)
        .into_iter()
        .flatten()
        .collect();
    assert!(!notifies.is_empty());
    let last = notifies.last().unwrap();
    let (w, r) = p.a.nic.engine_mut().qp_cc(p.a.qpn).unwrap();
    assert_eq!(
        w,
        u64::from(last.window_bytes).max(1024),
        "the sender runs at the notified window"
    );
    assert!(r < LINE);
    assert_eq!(
        p.a.nic
            .engine_mut()
            .qp_counters(p.a.qpn)
            .unwrap()
            .notifies_received,
        notifies.len() as u64
    );
}

#[test]
fn a_receiver_answers_ce_marked_frames_with_cnps_in_every_cc_mode() {
    for mode in [
        CcMode::None,
        CcMode::HpccInband { maxhop: 3 },
        CcMode::HpccProbe {
            maxhop: 3,
            timeout_ns: 15_000,
        },
        CcMode::RxHpcc { maxhop: 3 },
        CcMode::Dcqcn,
    ] {
        let mut s = setup(mode);
        if mode == CcMode::None {
            // A sender without a controller sends Not-ECT, which a switch
            // never marks: here A runs DCQCN, B (the receiver) none.
            s.cfg = |m, i| EngineConfig {
                cc: if m == rc_util::MAC_A {
                    CcMode::Dcqcn
                } else {
                    CcMode::None
                },
                ..EngineConfig::new(m, i, LINE)
            };
        }
        let mut p = Pair::new(s);
        p.set_hook(Box::new(|dir, k, _| {
            if dir == Dir::AtoB && !k.payload.is_empty() {
                Fate::MarkCe
            } else {
                Fate::Deliver
            }
        }));
        for i in 0..3 {
            let wr = p.wr(i, WrOp::Write, 0, 0, 4096);
            p.post(wr);
        }
        p.run(10_000_000);
        let c = p.completions_a();
        assert!(c.iter().all(|c| c.status == WcStatus::Success), "{mode:?}");
        let b = p.b.nic.engine_mut().qp_counters(p.b.qpn).unwrap();
        let a = p.a.nic.engine_mut().qp_counters(p.a.qpn).unwrap();
        assert!(b.cnps_sent >= 1, "{mode:?}: no CNP");
        assert_eq!(a.cnps_received, b.cnps_sent, "{mode:?}");
    }
}

#[test]
fn packets_are_ect0_when_a_controller_reacts_and_not_ect_without_one() {
    for (mode, ecn) in [
        (CcMode::None, 0),
        (CcMode::Dcqcn, 2),
        (CcMode::HpccInband { maxhop: 3 }, 2),
    ] {
        let mut p = Pair::new(setup(mode));
        let wr = p.wr(1, WrOp::Write, 0, 0, 4096);
        p.post(wr);
        p.run(10_000_000);
        let seen = p.logged(Dir::AtoB, |k| k.repr.ip.ecn);
        assert!(!seen.is_empty());
        assert!(seen.iter().all(|&e| e == ecn), "{mode:?}: {seen:?}");
    }
}

#[test]
fn dcqcn_ce_marks_bring_cnps_and_a_lower_rate() {
    let mut p = Pair::new(setup(CcMode::Dcqcn));
    p.set_hook(Box::new(|dir, k, _| {
        if dir == Dir::AtoB && !k.payload.is_empty() {
            Fate::MarkCe
        } else {
            Fate::Deliver
        }
    }));
    for i in 0..10 {
        let wr = p.wr(i, WrOp::Write, 0, 0, 4096);
        p.post(wr);
    }
    p.run(20_000);
    let (_, rate) = p.a.nic.engine_mut().qp_cc(p.a.qpn).unwrap();
    assert!(rate < LINE, "a CNP cut the rate: {rate}");
    p.run(10_000_000);
    let b = p.b.nic.engine_mut().qp_counters(p.b.qpn).unwrap();
    let a = p.a.nic.engine_mut().qp_counters(p.a.qpn).unwrap();
    assert!(b.cnps_sent >= 1 && a.cnps_received == b.cnps_sent);
    assert!(p.ops(Dir::BtoA).contains(&Opcode::Cnp));
    // At most one CNP per 50 us per flow.
    assert!(
        b.cnps_sent <= 1 + p.now / 50_000,
        "{} CNPs in {} ns",
        b.cnps_sent,
        p.now
    );
}

#[test]
fn without_congestion_control_flows_run_at_line_rate() {
    let mut p = Pair::new(setup(CcMode::None));
    let wr = p.wr(1, WrOp::Write, 0, 0, 1 << 20);
    p.post(wr);
    p.run(100_000_000);
    assert_eq!(p.completions_a()[0].status, WcStatus::Success);
    assert_eq!(
        p.a.nic.engine_mut().qp_cc(p.a.qpn).unwrap(),
        (u64::MAX, LINE)
    );
    // 1 MiB at 100 Gb/s is about 84 us on the wire (headers included).
    let last = p.timed_ops(Dir::AtoB).last().expect("frames sent").0;
    assert!(
        last > 80_000 && last < 100_000,
        "last packet sent at {last} ns"
    );
}

#[test]
fn a_qp_can_run_its_own_congestion_control_chosen_before_it_connects() {
    use transport::mr::{Access, VecMemory};
    use transport::rc::{ConnectParams, Endpoint, Engine, PathMtu, QpState, RcError, SendWr, Sge};
    use transport::wire::Packet;
    let (mac, ip) = (rc_util::MAC_A, rc_util::IP_A);
    let mut mem = VecMemory::new();
    mem.add(0x1000, 1 << 16);
    // The engine's default is no congestion control.
    let mut e = Engine::new(EngineConfig::new(mac, ip, LINE), mem, 0);
    let mr = e.register_mr(0x1000, 1 << 16, Access::ALL).unwrap();
    let plain = e.create_qp(4, 0).unwrap();
    let hpcc = e.create_qp(4, 0).unwrap();
    e.set_qp_cc(hpcc, CcMode::HpccInband { maxhop: 3 }).unwrap();
    assert_eq!(e.qp_cc_mode(plain).unwrap(), CcMode::None);
    assert_eq!(
        e.qp_cc_mode(hpcc).unwrap(),
        CcMode::HpccInband { maxhop: 3 }
    );
    let peer = Endpoint {
        qpn: 0x99,
        psn: 0,
        mac: rc_util::MAC_B,
        ip: rc_util::IP_B,
    };
    let p = ConnectParams::new(PathMtu::Mtu1024);
    // Data packets of the HPCC++ QP carry the telemetry block; the other
    // QP's do not.
    let mut tlm = Vec::new();
    for q in [plain, hpcc] {
        e.connect_to(q, 0, &peer, &p).unwrap();
        let sge = Sge {
            lkey: mr.lkey,
            va: 0x1000,
            len: 64,
        };
        e.post_send(q, SendWr::new(1, WrOp::Write, sge, 7, 0x2000), 0)
            .unwrap();
        let mut buf = vec![0; 4096];
        let n = e.poll_transmit(0, &mut buf).expect("a WRITE to send");
        tlm.push(Packet::parse(&buf[..n]).unwrap().repr.tlm.is_some());
    }
    assert_eq!(tlm, [false, true]);
    // Once connected, the choice is made.
    assert!(matches!(
        e.set_qp_cc(hpcc, CcMode::Dcqcn),
        Err(RcError::WrongState {
            state: QpState::Rts,
            ..
        })
    ));
}

/// What a congested switch (300 KB queued at a 100G port) sends back for
/// the data frame `data`.
fn int_response(data: &[u8]) -> Vec<u8> {
    let congested = HopRecord {
        ts_ns: 1,
        tx_bytes: 2,
        qlen: 300_000,
        rate: 1000,
        switch_id: 4,
        port_id: 2,
    };
    let mut out = vec![0u8; 512];
    let n = transport::wire::emit_int_response(data, &congested, &mut out).unwrap();
    out.truncate(n);
    out
}

/// HPCC++ inband engines whose data packets subscribe to INT responses,
/// keyed with `key`.
fn subscribed(key: Option<transport::rc::auth::FeedbackKey>) -> Setup {
    Setup {
        cfg: |m, i| EngineConfig {
            cc: CcMode::HpccInband { maxhop: 3 },
            int_subscribe: true,
            ..EngineConfig::new(m, i, LINE)
        },
        feedback_key: key,
        ..Setup::default()
    }
}

/// draft-00 s6.3: data packets subscribe to INT responses when the engine
/// is told to; a switch's response for a PSN in flight reaches the QP
/// connected to its (source, DestQP) and HPCC++ cuts the window at once;
/// one for a PSN not in flight, or naming no connected peer, changes
/// nothing and is counted.
#[test]
fn an_int_response_for_a_psn_in_flight_cuts_the_window_and_others_are_counted() {
    let mut p = Pair::new(subscribed(None));
    // No ACK comes back: what A sent stays in flight.
    p.set_hook(rc_util::cut(Dir::BtoA));
    let wr = p.wr(1, WrOp::Write, 0, 0, 16_384);
    p.post(wr);
    p.run(20_000);
    let data: Vec<_> = p.logged(Dir::AtoB, |k| (k.repr, k.payload.to_vec()));
    assert!(!data.is_empty());
    assert!(
        data.iter().all(|(r, _)| r.tlm.is_some_and(|t| t.subscribe)),
        "every data packet subscribes"
    );
    let (repr, payload) = &data[0];
    let frame = rc_util::emit(repr, payload);
    let (w0, _) = p.a.nic.engine_mut().qp_cc(p.a.qpn).unwrap();
    let now = p.now;
    p.a.nic
        .engine_mut()
        .handle_packet(now, &int_response(&frame));
    let c = p.a.nic.engine_mut().qp_counters(p.a.qpn).unwrap();
    assert_eq!((c.int_responses, c.int_responses_stale), (1, 0));
    let (w1, _) = p.a.nic.engine_mut().qp_cc(p.a.qpn).unwrap();
    // 300 KB over B T = 62.5 KB: u = 5.8; W = W_init / (5.8 / 0.95) + W_ai.
    assert!(w1 * 5 < w0, "W {w0} -> {w1}");
    // A PSN far from what is in flight: stale.
    let mut late = *repr;
    late.bth.psn = (repr.bth.psn + 100_000) & 0xFF_FFFF;
    p.a.nic
        .engine_mut()
        .handle_packet(now, &int_response(&rc_util::emit(&late, payload)));
    let c = p.a.nic.engine_mut().qp_counters(p.a.qpn).unwrap();
    assert_eq!((c.int_responses, c.int_responses_stale), (1, 1));
    // From a peer A is not connected to: unknown.
    let mut other = *repr;
    other.ip.dst = std::net::Ipv4Addr::new(10, 9, 9, 9);
    p.a.nic
        .engine_mut()
        .handle_packet(now, &int_response(&rc_util::emit(&other, payload)));
    assert_eq!(p.a.nic.engine().counters().int_response_unknown, 1);
    assert_eq!(p.a.nic.engine_mut().qp_cc(p.a.qpn).unwrap().0, w1);
}

/// draft-00 s6.2: a receiver whose last hop is the congestion point counts
/// the flows through it and reports N in the ACKs' echoed stack (NFLOWS,
/// path_id = N); the sender takes W_AI = W_init (1 - eta) / N from it.
#[test]
fn a_receiver_behind_a_congested_last_hop_reports_n_and_the_sender_takes_w_ai_from_it() {
    let mut p = Pair::new(Setup {
        cfg: |m, i| EngineConfig {
            cc: CcMode::HpccInband { maxhop: 3 },
            report_flows: true,
            ..EngineConfig::new(m, i, LINE)
        },
        ..Setup::default()
    });
    write_through_congestion(&mut p);
    let reports: Vec<_> = p
        .logged(Dir::BtoA, |k| {
            k.repr.tlm.filter(|t| t.nflows).map(|t| t.path_id)
        })
        .into_iter()
        .flatten()
        .collect();
    assert!(!reports.is_empty(), "ACKs carry N");
    assert!(reports.iter().all(|&n| n == 1), "one flow: {reports:?}");
}

#[test]
fn without_flow_counting_no_ack_carries_n() {
    let mut p = Pair::new(setup(CcMode::HpccInband { maxhop: 3 }));
    write_through_congestion(&mut p);
    assert!(p
        .logged(Dir::BtoA, |k| k.repr.tlm.is_some_and(|t| t.nflows))
        .iter()
        .all(|&x| !x));
}

/// An engine whose data packets do not subscribe takes no INT response,
/// however well formed: it is counted and W stays.
#[test]
fn an_int_response_to_an_engine_that_did_not_subscribe_changes_nothing() {
    let mut p = Pair::new(setup(CcMode::HpccInband { maxhop: 3 }));
    p.set_hook(rc_util::cut(Dir::BtoA));
    let wr = p.wr(1, WrOp::Write, 0, 0, 16_384);
    p.post(wr);
    p.run(20_000);
    let (mut repr, payload) = p
        .logged(Dir::AtoB, |k| (k.repr, k.payload.to_vec()))
        .remove(0);
    // As if it had subscribed: the switch answers what it is given.
    if let Some(t) = repr.tlm.as_mut() {
        t.subscribe = true;
    }
    let hop = HopRecord {
        qlen: 300_000,
        rate: 1000,
        ..HopRecord::default()
    };
    let mut out = vec![0u8; 512];
    let n = transport::wire::emit_int_response(&rc_util::emit(&repr, &payload), &hop, &mut out)
        .unwrap();
    let (w0, _) = p.a.nic.engine_mut().qp_cc(p.a.qpn).unwrap();
    let now = p.now;
    p.a.nic.engine_mut().handle_packet(now, &out[..n]);
    assert_eq!(p.a.nic.engine().counters().int_response_unknown, 1);
    assert_eq!(p.a.nic.engine_mut().qp_cc(p.a.qpn).unwrap().0, w0);
    assert_eq!(
        p.a.nic
            .engine_mut()
            .qp_counters(p.a.qpn)
            .unwrap()
            .int_responses,
        0
    );
}

/// The window after twenty WRITEs through a switch that puts `qlen` in its
/// records, with data packets asking for sojourn times or not.
fn window_after(sojourn: bool, qlen: u32) -> (u64, Vec<Option<(bool, bool)>>) {
    let mut s = setup(CcMode::HpccInband { maxhop: 3 });
    if sojourn {
        s.cfg = |m, i| EngineConfig {
            cc: CcMode::HpccInband { maxhop: 3 },
            int_sojourn: true,
            ..EngineConfig::new(m, i, LINE)
        };
    }
    let mut p = Pair::new(s);
    p.set_hook(Box::new(switch_reporting(qlen)));
    write_all(&mut p, 20);
    let flags = p.logged(Dir::BtoA, |k| k.repr.tlm.map(|t| (t.echo, t.sojourn)));
    (p.a.nic.engine_mut().qp_cc(p.a.qpn).unwrap().0, flags)
}

#[test]
fn a_sojourn_time_counts_as_the_bytes_the_port_sends_in_it() {
    // 16 us of sojourn at 100 Gb/s is 200,000 bytes of queue.
    let (by_sojourn, flags) = window_after(true, 16_000);
    let (by_bytes, _) = window_after(false, 200_000);
    let (misread, _) = window_after(false, 16_000);
    assert_eq!(by_sojourn, by_bytes);
    assert!(
        misread > by_sojourn,
        "16,000 read as bytes is a short queue"
    );
    // The ACKs echo the stack with SOJOURN kept, so the sender reads it so.
    assert!(flags.contains(&Some((true, true))), "{flags:?}");
}

#[test]
fn a_qp_sends_the_dscp_its_connection_names() {
    for (dscp, want) in [(None, 26), (Some(10), 10)] {
        let mut p = Pair::new(Setup {
            dscp,
            ..setup(CcMode::HpccInband { maxhop: 3 })
        });
        let wr = p.wr(1, WrOp::Write, 0, 0, 4096);
        p.post(wr);
        p.run(10_000_000);
        for dir in [Dir::AtoB, Dir::BtoA] {
            let seen = p.logged(dir, |k| k.repr.ip.dscp);
            assert!(
                !seen.is_empty() && seen.iter().all(|&d| d == want),
                "{dir:?}: {seen:?}"
            );
        }
    }
}

/// Both ends with the same feedback key: ACKs carry a MAC over their echoed
/// stack and the sender takes it; `forge` rewrites each ACK's stack (or
/// replays) before it arrives.
fn keyed(forge: Option<fn(&mut transport::wire::TlmRepr)>) -> (u64, transport::rc::QpCounters) {
    let mut p = Pair::new(Setup {
        feedback_key: Some(transport::rc::auth::FeedbackKey([7; 16])),
        ..setup(CcMode::HpccInband { maxhop: 3 })
    });
    let mut inner = congested_switch();
    p.set_hook(Box::new(move |dir, pk, n| match (dir, forge) {
        (Dir::BtoA, Some(f)) if pk.repr.tlm.is_some_and(|t| t.echo) => {
            let mut t = pk.repr.tlm.unwrap();
            f(&mut t);
            Fate::ReplaceTlm(Box::new(t))
        }
        _ => inner(dir, pk, n),
    }));
    write_all(&mut p, 20);
    let w = p.a.nic.engine_mut().qp_cc(p.a.qpn).unwrap().0;
    (w, p.a.nic.engine_mut().qp_counters(p.a.qpn).unwrap())
}

#[test]
fn a_keyed_ack_is_taken_and_a_bad_mac_never_changes_the_window() {
    let w0 = {
        let mut p = Pair::new(setup(CcMode::HpccInband { maxhop: 3 }));
        p.a.nic.engine_mut().qp_cc(p.a.qpn).unwrap().0
    };
    // Genuine ACKs: the congestion cuts W as without a key.
    let (w, c) = keyed(None);
    assert!(w < w0, "{w} < {w0}");
    assert_eq!((c.feedback_forged, c.feedback_replayed), (0, 0), "{c:?}");
    // A forged stack (an idle path claimed) or a stripped MAC: refused,
    // counted, W untouched.
    let idle: fn(&mut transport::wire::TlmRepr) = |t| {
        t.hops[0].qlen = 0;
    };
    let flip: fn(&mut transport::wire::TlmRepr) = |t| t.mac = t.mac.map(|m| m ^ 1);
    for f in [idle, flip] {
        let (w, c) = keyed(Some(f));
        assert_eq!(w, w0, "no forged ACK changed W");
        assert!(c.feedback_forged > 0, "{c:?}");
    }
}

#[test]
fn a_replayed_keyed_ack_is_refused_and_counted() {
    let mut p = Pair::new(Setup {
        feedback_key: Some(transport::rc::auth::FeedbackKey([7; 16])),
        ..setup(CcMode::HpccInband { maxhop: 3 })
    });
    let mut inner = congested_switch();
    p.set_hook(Box::new(move |dir, pk, n| {
        if dir == Dir::BtoA && pk.repr.tlm.is_some_and(|t| t.echo) {
            Fate::Duplicate
        } else {
            inner(dir, pk, n)
        }
    }));
    write_all(&mut p, 10);
    let c = p.a.nic.engine_mut().qp_counters(p.a.qpn).unwrap();
    assert!(c.feedback_replayed > 0 && c.feedback_forged == 0, "{c:?}");
}

const KEY: transport::rc::auth::FeedbackKey = transport::rc::auth::FeedbackKey([7; 16]);

/// A keyed engine in `mode` through the congested switch, with `forge`
/// rewriting (or not: `None` from it) the stack of each frame B sends.
type Forge = fn(&transport::wire::Packet<'_>) -> Option<transport::wire::TlmRepr>;

fn keyed_run(mode: CcMode, forge: Forge) -> (u64, transport::rc::QpCounters) {
    let mut p = Pair::new(Setup {
        feedback_key: Some(KEY),
        ..setup(mode)
    });
    let mut inner = congested_switch();
    p.set_hook(Box::new(move |dir, pk, n| match (dir, forge(pk)) {
        (Dir::BtoA, Some(t)) => Fate::ReplaceTlm(Box::new(t)),
        _ => inner(dir, pk, n),
    }));
    write_all(&mut p, 20);
    let w = p.a.nic.engine_mut().qp_cc(p.a.qpn).unwrap().0;
    (w, p.a.nic.engine_mut().qp_counters(p.a.qpn).unwrap())
}

fn untouched(_: &transport::wire::Packet<'_>) -> Option<transport::wire::TlmRepr> {
    None
}

/// The stack of `op` frames with a flipped MAC.
fn flip_mac_of(op: Opcode, p: &transport::wire::Packet<'_>) -> Option<transport::wire::TlmRepr> {
    (p.repr.bth.opcode == op).then_some(())?;
    let mut t = p.repr.tlm?;
    t.mac = t.mac.map(|m| m ^ 1);
    Some(t)
}

/// wire.md "Authenticated feedback": probe answers (TLM_RESPONSE) carry a
/// MAC; a keyed sender takes genuine ones and refuses a bad MAC.
#[test]
fn keyed_probe_answers_are_taken_and_a_bad_mac_never_changes_the_window() {
    let mode = CcMode::HpccProbe {
        maxhop: 3,
        timeout_ns: 15_000,
    };
    let (w, c) = keyed_run(mode, untouched);
    assert!(c.probe_responses >= 2 && c.feedback_forged == 0, "{c:?}");
    assert!(w < 62_500, "HPCC++ reacted to the probed queue: W = {w}");
    let (w, c) = keyed_run(mode, |p| flip_mac_of(Opcode::TlmResponse, p));
    assert_eq!(c.probe_responses, 0, "{c:?}");
    assert!(c.feedback_forged >= 1, "{c:?}");
    assert_eq!(w, 62_500, "no forged answer changed W");
}

/// The same for CC_NOTIFY (receiver-based HPCC): the window a notification
/// names is adopted only with its MAC.
#[test]
fn keyed_notifications_are_taken_and_a_bad_mac_never_changes_the_window() {
    let mode = CcMode::RxHpcc { maxhop: 3 };
    let (w, c) = keyed_run(mode, untouched);
    assert!(c.notifies_received >= 1 && c.feedback_forged == 0, "{c:?}");
    assert!(w < 62_500, "W = {w}");
    let (w, c) = keyed_run(mode, |p| flip_mac_of(Opcode::CcNotify, p));
    assert_eq!(c.notifies_received, 0, "{c:?}");
    assert!(c.feedback_forged >= 1, "{c:?}");
    assert_eq!(w, 62_500);
}

/// wire.md "Relative telemetry": a domain boundary rewriting the echoed
/// stacks into relative load leaves the MAC valid (it covers the relative
/// form) and the keyed sender's window exactly as without the boundary.
#[test]
fn a_boundary_rewriting_echoed_stacks_to_relative_load_keeps_keyed_feedback_exact() {
    let mode = CcMode::HpccInband { maxhop: 3 };
    let (w, c) = keyed_run(mode, untouched);
    let (w_rel, c_rel) = keyed_run(mode, |p| {
        let t = p.repr.tlm.filter(|t| t.echo)?;
        assert!(t.filled().iter().all(|h| h.rate == 1000), "raw records");
        Some(t.relative())
    });
    assert_eq!((c.feedback_forged, c_rel.feedback_forged), (0, 0));
    assert_eq!(w_rel, w);
    assert!(w < 62_500);
}

/// An unkeyed sender reading relative records computes the same load (to
/// the counter's rounding): its window stays within 2% of the raw run's.
#[test]
fn relative_records_give_an_unkeyed_sender_the_same_window() {
    let run = |relative: bool| {
        let mut p = Pair::new(setup(CcMode::HpccInband { maxhop: 3 }));
        let mut inner = congested_switch();
        p.set_hook(Box::new(move |dir, pk, n| match pk.repr.tlm {
            Some(t) if relative && dir == Dir::BtoA && t.echo => {
                Fate::ReplaceTlm(Box::new(t.relative()))
            }
            _ => inner(dir, pk, n),
        }));
        write_all(&mut p, 20);
        p.a.nic.engine_mut().qp_cc(p.a.qpn).unwrap().0
    };
    let (raw, rel) = (run(false), run(true));
    assert!(raw < 62_500);
    assert!(
        raw.abs_diff(rel) * 50 <= raw,
        "raw W {raw}, relative W {rel}"
    );
}

/// wire.md "Authenticated feedback": a keyed QP's subscribed data packets
/// carry the token of their PSN; a switch's response copies it, and the
/// sender takes a response only with the token of that PSN, once.
#[test]
fn a_keyed_int_response_needs_the_token_of_its_psn_and_is_taken_once() {
    let mut p = Pair::new(subscribed(Some(KEY)));
    p.set_hook(rc_util::cut(Dir::BtoA));
    let wr = p.wr(1, WrOp::Write, 0, 0, 16_384);
    p.post(wr);
    p.run(20_000);
    let data: Vec<_> = p.logged(Dir::AtoB, |k| (k.repr, k.payload.to_vec()));
    assert!(data.len() >= 2);
    let dest_qp = data[0].0.bth.dest_qp;
    for (r, _) in &data {
        let want = transport::rc::auth::int_token(&KEY, dest_qp, r.bth.psn);
        assert_eq!(
            r.tlm.and_then(|t| t.mac),
            Some(want),
            "each packet its token"
        );
    }
    let response = |repr: &transport::wire::PacketRepr, payload: &[u8]| {
        int_response(&rc_util::emit(repr, payload))
    };
    let (w0, _) = p.a.nic.engine_mut().qp_cc(p.a.qpn).unwrap();
    let now = p.now;
    let counters = |p: &mut Pair| p.a.nic.engine_mut().qp_counters(p.a.qpn).unwrap();
    // Another packet's token under this PSN, or a flipped one: forged.
    let (first, second) = (&data[0], &data[1]);
    let mut swapped = first.0;
    swapped.bth.psn = second.0.bth.psn;
    let mut flipped = first.0;
    if let Some(t) = flipped.tlm.as_mut() {
        t.mac = t.mac.map(|m| m ^ 1);
    }
    for r in [swapped, flipped] {
        p.a.nic
            .engine_mut()
            .handle_packet(now, &response(&r, &first.1));
    }
    let c = counters(&mut p);
    assert_eq!((c.int_responses, c.feedback_forged), (0, 2), "{c:?}");
    assert_eq!(p.a.nic.engine_mut().qp_cc(p.a.qpn).unwrap().0, w0);
    // The genuine one is taken, and only once.
    let genuine = response(&first.0, &first.1);
    p.a.nic.engine_mut().handle_packet(now, &genuine);
    let (w1, _) = p.a.nic.engine_mut().qp_cc(p.a.qpn).unwrap();
    assert!(w1 * 5 < w0, "W {w0} -> {w1}");
    p.a.nic.engine_mut().handle_packet(now, &genuine);
    let c = counters(&mut p);
    assert_eq!(
        (c.int_responses, c.int_responses_stale, c.feedback_replayed),
        (1, 1, 0),
        "{c:?}"
    );
    assert_eq!(p.a.nic.engine_mut().qp_cc(p.a.qpn).unwrap().0, w1);
}
