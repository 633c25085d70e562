//! Path choice from telemetry (HPCC++ 2023 s9.4) through the engine: a QP
//! whose path is hot probes the others, moves to an idle one after the
//! dwell time, and loses, duplicates and reorders nothing across the move.

mod rc_util;

use std::collections::HashMap;

use rc_util::{Dir, Fate, Pair, Setup};
use transport::rc::{CcMode, EngineConfig, WcStatus, WrOp};
use transport::wire::{HopRecord, Opcode};

/// A switch on which the path of source port `hot` is saturated with a
/// standing queue and every other path carries 20% of its rate.
fn switch(hot: u16) -> impl FnMut(Dir, &transport::wire::Packet<'_>, usize) -> Fate {
    switch_with(hot, 1.0, 50_000)
}

/// [`switch`] with the hot path at `hot_util` of its rate and `hot_qlen`
/// bytes queued.
fn switch_with(
    hot: u16,
    hot_util: f64,
    hot_qlen: u32,
) -> impl FnMut(Dir, &transport::wire::Packet<'_>, usize) -> Fate {
    let mut clock: HashMap<u16, u32> = HashMap::new();
    move |dir, p, _| {
        if dir != Dir::AtoB || p.repr.tlm.is_none() {
            return Fate::Deliver;
        }
        let port = p.repr.udp.src_port;
        let ts = clock.entry(port).or_insert(0);
        *ts += 1_000;
        let (util, qlen) = if port == hot {
            (hot_util, hot_qlen)
        } else {
            (0.2, 0)
        };
        Fate::PushHop(HopRecord {
            ts_ns: *ts,
            tx_bytes: (f64::from(*ts) * 12.5 * util) as u32,
            qlen,
            rate: 1000,
            // The path id tells the paths apart.
            switch_id: (port & 0xFF) as u8,
            port_id: 1,
        })
    }
}

/// HPCC++ inband with an ACK asked for by every packet, as the
/// simulator and the testbeds run it (fresh telemetry per packet).
fn setup(paths: bool) -> Setup {
    Setup {
        cfg: if paths {
            |m, i| EngineConfig {
                cc: CcMode::HpccInband { maxhop: 3 },
                path_choice: Some(pacer::path::PathConfig::new(5_000)),
                ack_req_every: 1,
                ..EngineConfig::new(m, i, 100_000_000_000)
            }
        } else {
            |m, i| EngineConfig {
                cc: CcMode::HpccInband { maxhop: 3 },
                ack_req_every: 1,
                ..EngineConfig::new(m, i, 100_000_000_000)
            }
        },
        ..Setup::default()
    }
}

/// Writes `n` x 16 KiB through the switch; returns the pair.
fn run(paths: bool, n: u64) -> Pair {
    let mut p = Pair::new(setup(paths));
    let hot = transport::wire::udp::entropy_port(p.a.qpn, p.b.qpn);
    p.set_hook(Box::new(switch(hot)));
    for i in 0..n {
        let wr = p.wr(i, WrOp::Write, 0, (i % 8) * 16_384, 16_384);
        p.post(wr);
    }
    p.run(1_000_000_000);
    let done = p.completions_a();
    assert_eq!(done.len() as u64, n);
    assert!(done.iter().all(|c| c.status == WcStatus::Success));
    p
}

#[test]
fn a_flow_on_a_hot_path_moves_and_loses_duplicates_and_reorders_nothing() {
    let mut p = run(true, 200);
    let hot = transport::wire::udp::entropy_port(p.a.qpn, p.b.qpn);
    let a = p.a.nic.engine_mut().qp_counters(p.a.qpn).unwrap();
    let b = p.b.nic.engine_mut().qp_counters(p.b.qpn).unwrap();
    assert!(a.path_probes > 0 && a.path_probe_responses > 0, "{a:?}");
    assert_eq!(a.path_moves, 1, "one move, then it stays: {a:?}");
    assert_eq!(a.retransmitted, 0, "{a:?} {b:?}");
    assert_eq!((b.out_of_order, b.duplicates), (0, 0), "{b:?}");
    // The data went out in PSN order, first on the hot path, then on one
    // other, never back.
    let data: Vec<(u32, u16)> = p
        .logged(Dir::AtoB, |k| {
            (k.repr.bth.opcode != Opcode::TlmRequest)
                .then_some((k.repr.bth.psn, k.repr.udp.src_port))
        })
        .into_iter()
        .flatten()
        .collect();
    assert!(
        data.windows(2).all(|w| w[1].0 == (w[0].0 + 1) & 0xFF_FFFF),
        "PSNs in order, once each"
    );
    let moved = data
        .iter()
        .position(|d| d.1 != hot)
        .expect("moved off the hot path");
    assert!(moved > 0);
    assert!(data[moved..].iter().all(|d| d.1 == data[moved].1));
}

/// A keyed QP sees only relative records (every port 1.6 Tb/s wide): its
/// own rate is compared with the paths' spare capacity in those units. A
/// flow at line rate on a path 90% busy (mostly its own load) has more
/// than an 80%-free path would give it, and stays.
#[test]
fn a_keyed_flow_that_fills_its_own_path_stays_on_it() {
    let mut p = Pair::new(Setup {
        feedback_key: Some(transport::rc::auth::FeedbackKey([4; 16])),
        ..setup(true)
    });
    let own = transport::wire::udp::entropy_port(p.a.qpn, p.b.qpn);
    p.set_hook(Box::new(switch_with(own, 0.9, 0)));
    for i in 0..200 {
        let wr = p.wr(i, WrOp::Write, 0, (i % 8) * 16_384, 16_384);
        p.post(wr);
    }
    p.run(1_000_000_000);
    assert_eq!(p.completions_a().len(), 200);
    let a = p.a.nic.engine_mut().qp_counters(p.a.qpn).unwrap();
    assert!(
        a.path_probe_responses > 0 && a.feedback_forged == 0,
        "{a:?}"
    );
    assert_eq!(a.path_moves, 0, "{a:?}");
}

#[test]
fn without_path_choice_a_qp_keeps_its_one_port_and_sends_no_path_probe() {
    let mut p = run(false, 50);
    let hot = transport::wire::udp::entropy_port(p.a.qpn, p.b.qpn);
    let ports = p.logged(Dir::AtoB, |k| k.repr.udp.src_port);
    assert!(ports.iter().all(|&s| s == hot));
    let a = p.a.nic.engine_mut().qp_counters(p.a.qpn).unwrap();
    assert_eq!((a.path_probes, a.path_moves, a.retransmitted), (0, 0, 0));
}
