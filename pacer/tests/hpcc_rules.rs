//! One test per rule of hpcc.md's sender-based algorithm and care list,
//! plus a worked example computed by hand from the draft's formulas.

use pacer::hpcc::{Hpcc, HpccParams, ParamError, Update, QLEN_MAX};
use pacer::telemetry::{Hop, HopStack};

/// T = 10 us, eta = 0.95, maxStage = 5, 100 Gb/s: W_init = 125,000 B;
/// N = 10: W_ai = 125,000 x 0.05 / 10 = 625 B; W_min = 1,000 B.
fn params() -> HpccParams {
    let p = HpccParams::new(100_000_000_000, 10_000, 10, 1000).unwrap();
    assert_eq!(p.w_init, 125_000.0);
    assert!((p.w_ai - 625.0).abs() < 1e-9);
    p
}

/// A hop of a 100 Gb/s port (B = 12.5 bytes/ns).
fn hop(sw: u8, ts_ns: u32, tx_bytes: u32, qlen: u32) -> Hop {
    Hop {
        ts_ns,
        tx_bytes,
        qlen,
        rate_100mbps: 1000,
        switch_id: sw,
        port_id: 1,
    }
}

fn one(h: Hop) -> HopStack {
    HopStack::from_slice(&[h])
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1.0)
}

#[test]
fn initial_state_is_w_init_with_u_one_and_stage_zero() {
    let h = Hpcc::new(params());
    let c = h.core();
    assert_eq!(
        (c.w(), c.wc(), c.u(), c.inc_stage()),
        (125_000.0, 125_000.0, 1.0, 0)
    );
    assert_eq!(
        c.rate_bps(),
        100e9,
        "flows start at line rate: R = W_init / T"
    );
}

#[test]
fn worked_example_from_the_draft_formulas() {
    let mut h = Hpcc::new(params());

    // Event 1: first telemetry. Only L is stored; lastUpdateSeq = snd_nxt = 100.
    assert_eq!(
        h.new_ack(90, 100, &one(hop(1, 1_000, 0, 0))),
        Update::FirstTelemetry
    );
    assert_eq!(h.last_update_seq(), 100);
    assert_eq!(h.core().w(), 125_000.0);

    // Event 2: ack.seq 50 <= 100, no commit. dt = 5,000 ns, 50,000 B sent:
    // txRate = 10 B/ns, txRate/B = 0.8; min(qlen) = min(12,500, 0) = 0.
    // u' = 0.8; tau/T = 0.5; U = 0.5 x 1 + 0.5 x 0.8 = 0.9 < eta, stage 0:
    // W = Wc + W_ai = 125,625, clamped to W_init = 125,000.
    let r = h.new_ack(50, 120, &one(hop(1, 6_000, 50_000, 12_500)));
    assert_eq!(r, Update::Window { committed: false });
    assert!(close(h.core().u(), 0.9));
    assert_eq!(h.core().w(), 125_000.0);
    assert_eq!(h.core().inc_stage(), 0, "no commit, no stage change");

    // Event 3: ack.seq 130 > 100: commit. dt = 10,000 = T, so tau/T = 1.
    // 125,000 B in 10,000 ns: txRate/B = 1.0; min(qlen) = min(25,000,
    // 12,500) = 12,500: 12,500 / (12.5 x 10,000) = 0.1. u' = 1.1, U = 1.1.
    // U >= eta: W = Wc / (U/eta) + W_ai = 125,000 x 0.95 / 1.1 + 625
    //           = 107,954.5454... + 625 = 108,579.5454...
    // Wc = W, incStage = 0, lastUpdateSeq = 200.
    let r = h.new_ack(130, 200, &one(hop(1, 16_000, 175_000, 25_000)));
    assert_eq!(r, Update::Window { committed: true });
    let w3 = 118_750.0 / 1.1 + 625.0;
    assert!(close(h.core().u(), 1.1));
    assert!(close(h.core().w(), w3), "{} vs {w3}", h.core().w());
    assert!(close(h.core().wc(), w3));
    assert_eq!(h.last_update_seq(), 200);
    // R = W / T = W x 8e9 / 10,000 ns = 86,863,636,363.6 b/s.
    assert!(close(h.core().rate_bps(), w3 * 8e5));

    // Event 4: ack.seq 150 <= 200: no commit. dt = 2,000 (tau/T = 0.2),
    // 10,000 B: txRate/B = 0.4; min(qlen) = 0. u' = 0.4.
    // U = 0.8 x 1.1 + 0.2 x 0.4 = 0.96 >= eta:
    // W = Wc x 0.95 / 0.96 + 625 = 108,073.5085...; Wc stays.
    let r = h.new_ack(150, 260, &one(hop(1, 18_000, 185_000, 0)));
    assert_eq!(r, Update::Window { committed: false });
    let w4 = w3 * 0.95 / 0.96 + 625.0;
    assert!(close(h.core().u(), 0.96));
    assert!(close(h.core().w(), w4), "{} vs {w4}", h.core().w());
    assert!(close(h.core().wc(), w3));

    // Event 5: ack.seq 201 > 200: commit. dt = T, 50,000 B: u' = 0.4, U = 0.4
    // < eta and incStage 0 < 5: additive increase W = Wc + W_ai =
    // 109,204.5454...; incStage = 1, Wc = W.
    let r = h.new_ack(201, 300, &one(hop(1, 28_000, 235_000, 0)));
    assert_eq!(r, Update::Window { committed: true });
    assert!(close(h.core().u(), 0.4));
    assert!(close(h.core().w(), w3 + 625.0));
    assert!(close(h.core().wc(), w3 + 625.0));
    assert_eq!(h.core().inc_stage(), 1);
    assert_eq!(h.last_update_seq(), 300);
}

#[test]
fn first_telemetry_only_stores_l_and_sets_last_update_seq() {
    let mut h = Hpcc::new(params());
    let before = *h.core();
    assert_eq!(
        h.new_ack(5, 77, &one(hop(1, 100, 0, 50_000))),
        Update::FirstTelemetry
    );
    assert_eq!(h.last_update_seq(), 77);
    assert_eq!(h.core().w(), before.w());
    assert_eq!(h.core().u(), before.u());
}

#[test]
fn ts_and_tx_bytes_deltas_wrap_mod_2_pow_32() {
    // Same intervals as event 3 of the worked example, but both counters
    // wrap between the two samples.
    let mut a = Hpcc::new(params());
    a.new_ack(0, 1, &one(hop(1, 1_000, 1_000, 12_500)));
    a.new_ack(2, 3, &one(hop(1, 11_000, 126_000, 25_000)));
    let mut b = Hpcc::new(params());
    b.new_ack(
        0,
        1,
        &one(hop(1, u32::MAX - 4_999, u32::MAX - 99_999, 12_500)),
    );
    b.new_ack(2, 3, &one(hop(1, 5_000, 25_000, 25_000)));
    assert!(close(a.core().u(), 1.1));
    assert_eq!(a.core().u(), b.core().u());
    assert_eq!(a.core().w(), b.core().w());
}

#[test]
fn compact_telemetry_deltas_wrap_at_2_pow_24_ns_and_2_pow_27_bytes() {
    // The same intervals again, with counters as compact hop records carry
    // them (24 bits of ns, 2^27 bytes), wrapping between the samples.
    let wrap = pacer::Wrap {
        ts_mask: (1 << 24) - 1,
        bytes_mask: (1 << 27) - 1,
    };
    let narrow = |h: Hop| one(h).with_wrap(wrap);
    let mut a = Hpcc::new(params());
    a.new_ack(0, 1, &one(hop(1, 1_000, 1_000, 12_500)));
    a.new_ack(2, 3, &one(hop(1, 11_000, 126_000, 25_000)));
    let mut c = Hpcc::new(params());
    c.new_ack(
        0,
        1,
        &narrow(hop(1, (1 << 24) - 5_000, (1 << 27) - 100_000, 12_500)),
    );
    c.new_ack(2, 3, &narrow(hop(1, 5_000, 25_000, 25_000)));
    assert!(close(c.core().u(), 1.1), "{}", c.core().u());
    assert_eq!(a.core().w(), c.core().w());
}

#[test]
fn zero_ts_delta_gives_no_sample_and_changes_nothing() {
    let mut h = Hpcc::new(params());
    h.new_ack(0, 1, &one(hop(1, 1_000, 0, 0)));
    let before = *h.core();
    let r = h.new_ack(2, 3, &one(hop(1, 1_000, 99_999, 1_000_000)));
    assert_eq!(r, Update::NoSample);
    assert_eq!(
        (
            h.core().u(),
            h.core().w(),
            h.core().wc(),
            h.core().inc_stage()
        ),
        (before.u(), before.w(), before.wc(), before.inc_stage())
    );
    assert_eq!(h.last_update_seq(), 1, "no sample, no commit");
}

#[test]
fn a_changed_switch_or_port_gives_no_sample_but_becomes_l() {
    let mut h = Hpcc::new(params());
    h.new_ack(0, 1, &one(hop(1, 1_000, 0, 0)));
    let mut moved = hop(2, 11_000, 125_000, 0);
    assert_eq!(h.new_ack(2, 3, &one(moved)), Update::NoSample);
    assert_eq!(h.core().u(), 1.0);
    // Same switch, other port: also a new hop.
    moved.port_id = 9;
    moved.ts_ns = 21_000;
    assert_eq!(h.new_ack(4, 5, &one(moved)), Update::NoSample);
    // The next event on that port samples against it.
    moved.ts_ns = 31_000;
    moved.tx_bytes = 125_000 + 62_500;
    assert_eq!(
        h.new_ack(6, 7, &one(moved)),
        Update::Window { committed: true }
    );
    assert!(close(h.core().u(), 0.5));
}

#[test]
fn a_new_hop_gives_no_sample_while_known_hops_do() {
    let mut h = Hpcc::new(params());
    h.new_ack(0, 1, &one(hop(1, 1_000, 0, 0)));
    // The path grows by a hop: hop 0 samples (u' = 0.5), hop 1 is new.
    let two = HopStack::from_slice(&[hop(1, 11_000, 62_500, 0), hop(2, 11_500, 0, 999_999)]);
    assert_eq!(h.new_ack(2, 3, &two), Update::Window { committed: true });
    assert!(
        close(h.core().u(), 0.5),
        "only hop 0 counted: {}",
        h.core().u()
    );
}

#[test]
fn the_hop_with_the_largest_u_wins_and_gives_tau() {
    let mut h = Hpcc::new(params());
    h.new_ack(
        0,
        1,
        &HopStack::from_slice(&[hop(1, 0, 0, 0), hop(2, 0, 0, 0), hop(3, 0, 0, 0)]),
    );
    // Hop 1 (u' = 0.2, dt = 10,000), hop 2 (u' = 0.9, dt = 4,000), hop 3
    // (u' = 0.5, dt = 10,000). Hop 2 wins: tau/T = 0.4, U = 0.6 + 0.36 = 0.96.
    let hops = HopStack::from_slice(&[
        hop(1, 10_000, 25_000, 0),
        hop(2, 4_000, 45_000, 0),
        hop(3, 10_000, 62_500, 0),
    ]);
    h.new_ack(2, 3, &hops);
    assert!(
        close(h.core().u(), 0.6 * 1.0 + 0.4 * 0.9),
        "{}",
        h.core().u()
    );
}

#[test]
fn tau_is_capped_at_t() {
    let mut h = Hpcc::new(params());
    h.new_ack(0, 1, &one(hop(1, 0, 0, 0)));
    // dt = 3 T: tau = T, so U takes u' entirely (0.25).
    h.new_ack(2, 3, &one(hop(1, 30_000, 93_750, 0)));
    assert!(close(h.core().u(), 0.25));
}

#[test]
fn wc_is_committed_at_most_once_per_rtt() {
    let mut h = Hpcc::new(params());
    h.new_ack(0, 100, &one(hop(1, 0, 0, 0)));
    // Overloaded link, events every T/10, acks below lastUpdateSeq = 100:
    // W falls each time, Wc stays at W_init.
    let mut ts = 0;
    let mut tx = 0u32;
    for seq in [10, 20, 40, 99, 100] {
        ts += 1_000;
        tx += 12_500;
        let r = h.new_ack(seq, 150, &one(hop(1, ts, tx, 50_000)));
        assert_eq!(r, Update::Window { committed: false }, "seq {seq}");
        assert_eq!(h.core().wc(), 125_000.0);
        assert!(h.core().w() < 125_000.0);
    }
    // ack.seq 101 > 100 commits and moves lastUpdateSeq to snd_nxt = 150.
    ts += 1_000;
    tx += 12_500;
    assert_eq!(
        h.new_ack(101, 150, &one(hop(1, ts, tx, 50_000))),
        Update::Window { committed: true }
    );
    assert_eq!(h.core().wc(), h.core().w());
    assert_eq!(h.last_update_seq(), 150);
    ts += 1_000;
    tx += 12_500;
    assert_eq!(
        h.new_ack(149, 160, &one(hop(1, ts, tx, 50_000))),
        Update::Window { committed: false }
    );
}

#[test]
fn ack_seq_comparison_is_24_bit() {
    let mut h = Hpcc::new(params());
    h.new_ack(0, 0xFF_FFF0, &one(hop(1, 0, 0, 0)));
    // 5 is after 0xFFFFF0 once PSNs wrap.
    let r = h.new_ack(5, 20, &one(hop(1, 10_000, 50_000, 0)));
    assert_eq!(r, Update::Window { committed: true });
    // 0xFFFFF8 is before 20.
    let r = h.new_ack(0xFF_FFF8, 30, &one(hop(1, 20_000, 100_000, 0)));
    assert_eq!(r, Update::Window { committed: false });
}

#[test]
fn additive_increase_for_max_stage_commits_then_multiplicative() {
    let p = params();
    let mut h = Hpcc::new(p);
    let mut ts = 0;
    let mut tx = 0u32;
    h.new_ack(0, 1, &one(hop(1, ts, tx, 125_000)));
    // A full link with a queue of one BDP: u' = 2, U = 2, W = 125,000 x
    // 0.95 / 2 + 625 = 60,000 (multiplicative, stage 0).
    ts += 10_000;
    tx += 125_000;
    h.new_ack(2, 2, &one(hop(1, ts, tx, 125_000)));
    ts += 1; // keep min(qlen) from leaking into the next sample
    h.new_ack(2, 2, &one(hop(1, ts, tx, 0)));
    assert!(close(h.core().wc(), 60_000.0), "{}", h.core().wc());
    let mut seq = 2;
    let mut w_prev = h.core().wc();
    for stage in 1..=5 {
        ts += 10_000;
        tx += 62_500; // u' = 0.5 < eta
        seq += 1;
        h.new_ack(seq, seq, &one(hop(1, ts, tx, 0)));
        assert_eq!(h.core().inc_stage(), stage);
        assert!(
            close(h.core().w(), w_prev + p.w_ai),
            "stage {stage}: additive"
        );
        w_prev = h.core().w();
    }
    // incStage = maxStage: multiplicative increase W = Wc / (0.5/0.95) + W_ai.
    ts += 10_000;
    tx += 62_500;
    seq += 1;
    h.new_ack(seq, seq, &one(hop(1, ts, tx, 0)));
    assert!(close(h.core().w(), w_prev / (0.5 / 0.95) + p.w_ai));
    assert_eq!(h.core().inc_stage(), 0);
}

#[test]
fn w_is_clamped_to_w_min_and_w_init_and_wc_takes_the_clamped_w() {
    let mut h = Hpcc::new(params());
    h.new_ack(0, 1, &one(hop(1, 0, 0, 100_000_000)));
    // A 100 MB standing queue: U = 800 and W = 125,000 / 842 + 625 < W_min.
    h.new_ack(2, 3, &one(hop(1, 10_000, 125_000, 100_000_000)));
    assert_eq!(h.core().w(), 1000.0);
    assert_eq!(h.core().wc(), 1000.0);
    // An idle link grows W back but never past W_init.
    let mut ts = 10_000;
    for seq in 4..200 {
        ts += 10_000;
        h.new_ack(seq, seq + 1, &one(hop(1, ts, 125_000, 0)));
        assert!(h.core().w() <= 125_000.0 && h.core().w() >= 1000.0);
    }
    assert_eq!(h.core().w(), 125_000.0);
    assert_eq!(h.core().wc(), 125_000.0);
}

#[test]
fn u_is_floored_before_the_division() {
    let mut p = params();
    p.max_stage = 0; // always multiplicative (the paper's corrected setting)
    let mut h = Hpcc::new(p);
    h.new_ack(0, 1, &one(hop(1, 0, 0, 0)));
    // An idle link: u' = 0 and tau = T, so U = 0. Wc / (0 / eta) would be
    // infinite; with the floor it is finite and clamped to W_init.
    h.new_ack(2, 3, &one(hop(1, 10_000, 0, 0)));
    assert_eq!(h.core().u(), 0.0);
    assert_eq!(h.core().w(), 125_000.0);
    assert!(h.core().w().is_finite());
}

#[test]
fn absurd_qlen_and_zero_capacity_are_tamed() {
    let mut h = Hpcc::new(params());
    let mut dead = hop(1, 0, 0, u32::MAX);
    dead.rate_100mbps = 0;
    h.new_ack(0, 1, &HopStack::from_slice(&[dead, hop(2, 0, 0, u32::MAX)]));
    dead.ts_ns = 10_000;
    // Hop 1 has B = 0 (invalid): skipped. Hop 2's qlen is clamped to QLEN_MAX.
    h.new_ack(
        2,
        3,
        &HopStack::from_slice(&[dead, hop(2, 10_000, 0, u32::MAX)]),
    );
    let expected_u = f64::from(QLEN_MAX) / (12.5 * 10_000.0);
    assert!(close(h.core().u(), expected_u), "{}", h.core().u());
    assert_eq!(h.core().w(), 1000.0);
}

#[test]
fn parameters_are_checked_and_errors_name_the_value() {
    assert_eq!(
        HpccParams::new(0, 5_000, 16, 1024),
        Err(ParamError::ZeroRate(0))
    );
    assert_eq!(
        HpccParams::new(1, 5_000, 0, 1024),
        Err(ParamError::ZeroN(0))
    );
    let mut p = params();
    p.eta = 1.5;
    assert_eq!(p.validate(), Err(ParamError::Eta(1.5)));
    assert_eq!(
        p.validate().unwrap_err().to_string(),
        "eta must be in (0, 1], got 1.5"
    );
    let mut p = params();
    p.w_min = 200_000.0;
    assert!(matches!(p.validate(), Err(ParamError::Window { .. })));
    let mut p = params();
    p.t_ns = 0;
    assert_eq!(p.validate(), Err(ParamError::ZeroT(0)));
    let mut p = params();
    p.w_ai = f64::NAN;
    assert!(matches!(p.validate(), Err(ParamError::WAi(_))));
}

/// draft-00 s6.3: a switch's INT response makes the sender slow down at
/// once, on the flow's first feedback too: U from the congested hop alone
/// (its queue is past the threshold, so it sends at B: u' = qlen/(B T) + 1).
#[test]
fn an_int_response_cuts_the_window_from_the_congested_hop_alone() {
    let mut h = Hpcc::new(params());
    // B T = 125,000 B; a 250,000 B queue: u' = 2 + 1 = 3.
    let stack = HopStack::from_slice(&[hop(1, 500, 0, 0), hop(2, 900, 7, 250_000)]);
    assert_eq!(
        h.new_int_response(40, 100, &stack),
        Some(Update::Window { committed: true })
    );
    let w = 125_000.0 / (3.0 / 0.95) + 625.0;
    assert!(close(h.core().w(), w), "W {}", h.core().w());
    assert!(close(h.core().wc(), w), "the first feedback commits Wc");
    assert!(close(h.core().u(), 3.0));
    assert_eq!(h.last_update_seq(), 100);
    // L is untouched: the next ACK is still the flow's first telemetry.
    assert_eq!(
        h.new_ack(30, 100, &one(hop(1, 1_000, 0, 0))),
        Update::FirstTelemetry
    );
}

/// A second response in the same round trip moves W but not Wc (NewAck's
/// once-per-RTT commit, by PSN).
#[test]
fn int_responses_commit_wc_once_per_round_trip() {
    let mut h = Hpcc::new(params());
    let congested = |q| HopStack::from_slice(&[hop(2, 900, 7, q)]);
    h.new_int_response(40, 100, &congested(250_000));
    let wc = h.core().wc();
    // PSN 60 is not past lastUpdateSeq = 100.
    assert_eq!(
        h.new_int_response(60, 120, &congested(500_000)),
        Some(Update::Window { committed: false })
    );
    assert_eq!(h.core().wc(), wc);
    assert!(close(h.core().w(), wc / (5.0 / 0.95) + 625.0));
    // PSN 101 is past it: committed, lastUpdateSeq = snd_nxt.
    assert_eq!(
        h.new_int_response(101, 130, &congested(500_000)),
        Some(Update::Window { committed: true })
    );
    assert_eq!(h.last_update_seq(), 130);
}

#[test]
fn an_int_response_without_a_hop_or_a_rate_changes_nothing() {
    let mut h = Hpcc::new(params());
    let before = *h.core();
    assert_eq!(h.new_int_response(1, 2, &HopStack::default()), None);
    let mut dead = hop(2, 900, 7, 250_000);
    dead.rate_100mbps = 0;
    assert_eq!(h.new_int_response(1, 2, &one(dead)), None);
    assert_eq!(*h.core(), before);
}

/// draft-00 s6.2: a receiver-reported N sets W_AI = W_init (1 - eta) / N;
/// without reports for 4 T the configured W_AI comes back.
#[test]
fn a_reported_flow_count_sets_w_ai_until_reports_stop() {
    let mut h = Hpcc::new(params());
    assert!(close(h.w_ai(), 625.0));
    h.set_flow_count(1_000, 50);
    assert!(close(h.w_ai(), 125_000.0 * 0.05 / 50.0));
    h.expire_flow_count(1_000 + 40_000);
    assert!(close(h.w_ai(), 125.0), "still within 4 T");
    h.expire_flow_count(1_000 + 40_001);
    assert!(close(h.w_ai(), 625.0), "back to the configured W_AI");
    h.set_flow_count(50_000, 0);
    assert!(close(h.w_ai(), 125_000.0 * 0.05), "N = 0 counts as 1");
}
