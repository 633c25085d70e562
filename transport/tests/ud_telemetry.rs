//! Congestion control of UD per destination (issue 52): towards a
//! destination that speaks our telemetry a UD QP samples the path with one
//! TLM block per round trip, our receiver echoes it to the sending QP, and
//! the datagrams to that destination are paced by HPCC++ on the echoes;
//! towards anyone else no TLM block ever goes.

mod rc_util;

use std::net::Ipv4Addr;

use rc_util::{Dir, Fate, Pair, Setup, IP_B};
use transport::mr::DEFAULT_PD;
use transport::rc::{AhAttr, CcMode, EngineConfig, WrOp, SAMPLE_TIMEOUT_T};
use transport::wire::{HopRecord, MacAddr, Opcode, Packet, Service};

const LINE: u64 = 100_000_000_000;
const QKEY: u32 = 0x1111_1111;
/// Offset of B's receive buffers in its region.
const RX: u64 = 8 << 20;
/// A third host nobody answers for.
const IP_C: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 9);

fn hpcc(m: MacAddr, i: Ipv4Addr) -> EngineConfig {
    EngineConfig {
        cc: CcMode::HpccInband { maxhop: 3 },
        ..EngineConfig::new(m, i, LINE)
    }
}

/// UD QPs on engines running `cfg`, their AHs saying the other end speaks
/// telemetry when `telemetry`.
fn ud(cfg: fn(MacAddr, Ipv4Addr) -> EngineConfig, telemetry: bool) -> Pair {
    Pair::new(Setup {
        service: Service::Ud,
        qkey: QKEY,
        cfg,
        ah_telemetry: telemetry,
        ..Setup::default()
    })
}

/// Posts `n` receive WQEs at B and `n` datagrams of `len` bytes at A.
fn send(p: &mut Pair, n: u64, len: u32) {
    for i in 0..n {
        p.post_recv_b(p.recv_wr(i, RX + i * 4096, 4096));
    }
    for i in 0..n {
        p.post(p.ud_wr(i, WrOp::Send, 0, len, QKEY));
    }
}

fn has_tlm(dir: Dir) -> impl Fn(&Packet<'_>) -> bool {
    move |f| match dir {
        Dir::AtoB => f.repr.tlm.is_some(),
        Dir::BtoA => f.repr.bth.opcode == Opcode::TlmResponse,
    }
}

/// A congested 100 Gb/s switch port on A's datagrams' way: every sample
/// gets its record (a queue of `qlen` bytes, 50 Gb/s of departures).
fn congested(qlen: u32) -> impl FnMut(Dir, &Packet<'_>, usize) -> Fate {
    let mut ts = 0u32;
    move |dir, p, _| {
        if dir == Dir::AtoB && p.repr.tlm.is_some() {
            ts += 10_000;
            Fate::PushHop(HopRecord {
                ts_ns: ts,
                tx_bytes: ts.wrapping_mul(6),
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

#[test]
fn a_datagram_to_a_destination_that_speaks_telemetry_samples_the_path_once_per_round_trip() {
    let mut p = ud(hpcc, true);
    send(&mut p, 5, 256);
    p.run(1_000_000_000);
    let tlm = p.logged(Dir::AtoB, has_tlm(Dir::AtoB));
    // The five go before the first echo is back: the first alone samples.
    assert_eq!(tlm, [true, false, false, false, false]);
    let echoes = p.logged(Dir::BtoA, |f| {
        (
            f.repr.bth.opcode,
            f.repr.bth.dest_qp,
            f.repr.probe,
            f.repr.tlm,
        )
    });
    assert_eq!(echoes.len(), 1);
    let (op, dest_qp, probe, tlm) = echoes[0];
    assert_eq!((op, dest_qp), (Opcode::TlmResponse, p.a.qpn));
    assert_eq!(
        probe.expect("a PROBE block").snd_psn,
        100,
        "the sample's PSN"
    );
    assert!(tlm.expect("the stack").echo);
    assert_eq!(p.completions_b().len(), 5, "every datagram delivered");
    // The echo is back: the next datagram samples again.
    send(&mut p, 1, 256);
    p.run(1_000_000_000);
    assert_eq!(p.logged(Dir::AtoB, has_tlm(Dir::AtoB)).last(), Some(&true));
    let a = p.a.engine().qp_counters(p.a.qpn).unwrap();
    let b = p.b.engine().qp_counters(p.b.qpn).unwrap();
    assert_eq!(
        (a.ud_samples, a.ud_echoes_taken, a.ud_echoes_stale),
        (2, 2, 0)
    );
    assert_eq!(b.ud_echoes_sent, 2);
    let flows = p.a.engine().ud_flows(p.a.qpn).unwrap();
    assert_eq!(flows.len(), 1);
    assert_eq!(flows[0].dest_ip, IP_B);
}

#[test]
fn no_tlm_block_goes_to_a_destination_that_does_not_speak_telemetry() {
    let mut p = ud(hpcc, false);
    send(&mut p, 5, 256);
    p.run(1_000_000_000);
    assert_eq!(p.logged(Dir::AtoB, has_tlm(Dir::AtoB)), [false; 5]);
    assert!(p.logged(Dir::BtoA, has_tlm(Dir::BtoA)).is_empty());
    assert!(p.a.engine().ud_flows(p.a.qpn).unwrap().is_empty());
    assert_eq!(p.completions_b().len(), 5);
}

#[test]
fn an_engine_without_an_hpcc_mode_never_samples() {
    let mut p = ud(|m, i| EngineConfig::new(m, i, LINE), true);
    send(&mut p, 3, 256);
    p.run(1_000_000_000);
    assert_eq!(p.logged(Dir::AtoB, has_tlm(Dir::AtoB)), [false; 3]);
    assert_eq!(p.completions_b().len(), 3);
}

#[test]
fn a_congested_echo_slows_the_datagrams_to_that_destination_alone() {
    let mut p = ud(hpcc, true);
    p.set_hook(Box::new(congested(400_000)));
    // Datagrams one at a time, each after the last echo: a sample each.
    for _ in 0..10 {
        send(&mut p, 1, 1024);
        p.run(1_000_000_000);
    }
    let flows = p.a.engine().ud_flows(p.a.qpn).unwrap();
    let rate = flows[0].rate_bps;
    assert!(rate < LINE / 4, "rate to B after congestion: {rate}");
    // Datagrams to B now leave at that rate: past the scheduler's burst
    // of credit, 40 of 1024 bytes take their frame times at it.
    let before = p.timed_ops(Dir::AtoB).len();
    send(&mut p, 40, 1024);
    p.run(1_000_000_000);
    let times: Vec<u64> = p
        .timed_ops(Dir::AtoB)
        .into_iter()
        .skip(before)
        .map(|(t, _)| t)
        .collect();
    assert_eq!(times.len(), 40);
    let spread = times[39] - times[0];
    let frame = 1024 + 14 + 20 + 8 + 12 + 8 + 4;
    let burst = u64::from(hpcc(MacAddr::default(), IP_B).scheduler.burst_bytes);
    let at_rate = (40 * frame - burst) * 8 * 1_000_000_000 / rate;
    assert!(
        spread >= at_rate * 9 / 10,
        "{spread} ns for 40 datagrams; {at_rate} at {rate} b/s"
    );
    // Another destination keeps the line rate.
    let attr = AhAttr {
        pd: DEFAULT_PD,
        dest_ip: IP_C,
        dest_mac: MacAddr([2, 0, 0, 0, 0, 9]),
        dscp: None,
        telemetry: true,
    };
    let ah_c = p.a.engine_mut().create_ah(attr).unwrap();
    let mut wr = p.ud_wr(99, WrOp::Send, 0, 64, QKEY);
    wr.ud.as_mut().unwrap().ah = ah_c;
    p.post(wr);
    p.run(1_000);
    let flows = p.a.engine().ud_flows(p.a.qpn).unwrap();
    let to = |ip| flows.iter().find(|f| f.dest_ip == ip).unwrap().rate_bps;
    assert_eq!(to(IP_C), LINE);
    assert!(to(IP_B) < LINE / 4);
}

#[test]
fn a_sample_whose_echo_is_lost_is_given_up_and_the_next_datagram_samples() {
    let mut p = ud(hpcc, true);
    p.set_hook(Box::new(|dir, f, _| {
        if dir == Dir::BtoA && f.repr.bth.opcode == Opcode::TlmResponse {
            Fate::Drop
        } else {
            Fate::Deliver
        }
    }));
    send(&mut p, 1, 256);
    p.run(1_000_000_000);
    send(&mut p, 1, 256);
    p.run(1_000_000_000);
    let a = p.a.engine().qp_counters(p.a.qpn).unwrap();
    assert_eq!((a.ud_samples, a.ud_samples_lost), (2, 2));
    assert_eq!(p.logged(Dir::AtoB, has_tlm(Dir::AtoB)), [true, true]);
    // Given up after SAMPLE_TIMEOUT_T T, not before: the second sample
    // went once the first's deadline had passed.
    let t = p.timed_ops(Dir::AtoB);
    let t_ns = EngineConfig::new(MacAddr::default(), IP_B, LINE).hpcc.t_ns;
    assert!(t[1].0 - t[0].0 >= SAMPLE_TIMEOUT_T * t_ns);
}

#[test]
fn a_duplicated_echo_is_taken_once() {
    let mut p = ud(hpcc, true);
    p.set_hook(Box::new(|dir, f, _| {
        if dir == Dir::BtoA && f.repr.bth.opcode == Opcode::TlmResponse {
            Fate::Duplicate
        } else {
            Fate::Deliver
        }
    }));
    send(&mut p, 1, 256);
    p.run(1_000_000_000);
    let a = p.a.engine().qp_counters(p.a.qpn).unwrap();
    assert_eq!((a.ud_echoes_taken, a.ud_echoes_stale), (1, 1));
}

#[test]
fn a_sample_under_a_wrong_qkey_is_not_echoed() {
    let mut p = ud(hpcc, true);
    p.post_recv_b(p.recv_wr(1, RX, 4096));
    p.post(p.ud_wr(1, WrOp::Send, 0, 64, 0x2222_2222));
    p.run(1_000_000_000);
    let b = p.b.engine().qp_counters(p.b.qpn).unwrap();
    assert_eq!((b.qkey_violations, b.ud_echoes_sent), (1, 0));
    assert!(p.logged(Dir::BtoA, has_tlm(Dir::BtoA)).is_empty());
}

#[test]
fn a_sample_without_a_receive_wqe_is_echoed_all_the_same() {
    let mut p = ud(hpcc, true);
    p.post(p.ud_wr(1, WrOp::Send, 0, 64, QKEY));
    p.run(1_000_000_000);
    let b = p.b.engine().qp_counters(p.b.qpn).unwrap();
    assert_eq!((b.datagrams_no_wqe, b.ud_echoes_sent), (1, 1));
    let a = p.a.engine().qp_counters(p.a.qpn).unwrap();
    assert_eq!(a.ud_echoes_taken, 1);
}
