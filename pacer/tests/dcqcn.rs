//! DCQCN reaction and notification points, rule by rule.

use pacer::dcqcn::{CnpLimiter, Dcqcn, DcqcnParams};

const LINE: f64 = 100e9;

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1.0)
}

#[test]
fn starts_at_line_rate_with_no_timers() {
    let d = Dcqcn::new(DcqcnParams::new(LINE));
    assert_eq!(d.rate_bps(), LINE);
    assert_eq!(d.alpha(), 1.0);
    assert_eq!(d.poll_timeout(), None);
    assert_eq!(d.window_bytes(), u64::MAX);
}

#[test]
fn a_cnp_cuts_the_rate_by_alpha_over_two_and_raises_alpha() {
    let p = DcqcnParams::new(LINE);
    let mut d = Dcqcn::new(p);
    d.on_cnp(0);
    // Rt = Rc = 100G; Rc = 100G x (1 - 1/2); alpha = (1 - g) + g = 1.
    assert_eq!(d.target_bps(), LINE);
    assert_eq!(d.rate_bps(), 50e9);
    assert_eq!(d.alpha(), 1.0);
    // Let alpha decay for 10 periods, then a second CNP.
    d.handle_timeout(10 * 55_000);
    let a = (1.0 - p.g).powi(10);
    assert!(close(d.alpha(), a), "{} vs {a}", d.alpha());
    let rc = d.rate_bps();
    d.on_cnp(10 * 55_000 + 1);
    assert!(close(d.rate_bps(), rc * (1.0 - a / 2.0)));
    assert!(close(d.alpha(), (1.0 - p.g) * a + p.g));
}

#[test]
fn the_rate_never_falls_below_the_minimum() {
    let mut d = Dcqcn::new(DcqcnParams::new(LINE));
    for i in 0..100 {
        d.on_cnp(i);
    }
    assert_eq!(d.rate_bps(), 10e6);
}

#[test]
fn fast_recovery_halves_the_gap_to_the_target() {
    let mut d = Dcqcn::new(DcqcnParams::new(LINE));
    d.on_cnp(0);
    // The first F = 5 timer events: Rc = (Rt + Rc) / 2, Rt fixed.
    let mut rc = 50e9;
    for k in 1..=5u64 {
        d.handle_timeout(k * 55_000);
        rc = (LINE + rc) / 2.0;
        assert!(close(d.rate_bps(), rc), "stage {k}");
        assert_eq!(d.target_bps(), LINE);
    }
}

#[test]
fn additive_then_hyper_increase() {
    let mut p = DcqcnParams::new(LINE);
    p.byte_counter = 1_000;
    let mut d = Dcqcn::new(p);
    d.on_cnp(0);
    d.on_cnp(1); // Rt = 50G, Rc = 25G (alpha stays 1 - a tiny bit)
    let rt0 = d.target_bps();
    // The first F = 5 timer events (byte count 0): fast recovery.
    for k in 1..=5u64 {
        d.handle_timeout(1 + k * 55_000);
    }
    assert_eq!(d.target_bps(), rt0, "fast recovery keeps Rt");
    // Timer count 5 = F, byte count 0 < F: additive increase.
    d.handle_timeout(1 + 6 * 55_000);
    assert!(close(d.target_bps(), rt0 + p.rai_bps));
    // Byte events with counts 0..=5 are additive (min(6, b) <= F); the one
    // with count 6 has both counts above F: hyper increase by
    // (min(6, 6) - F) x R_HAI.
    let rt1 = d.target_bps();
    d.on_sent(7 * 1_000);
    let expected = rt1 + 6.0 * p.rai_bps + p.rhai_bps;
    assert!(
        close(d.target_bps(), expected),
        "{} vs {expected}",
        d.target_bps()
    );
}

#[test]
fn recovery_ends_at_line_rate_and_stops_the_timers() {
    let mut d = Dcqcn::new(DcqcnParams::new(LINE));
    d.on_cnp(0);
    d.handle_timeout(1_000_000_000); // a second later (catch-up is bounded)
    assert_eq!(d.rate_bps(), LINE);
    assert_eq!(d.poll_timeout(), None);
}

#[test]
fn the_notification_point_sends_at_most_one_cnp_per_interval() {
    let mut np = CnpLimiter::new(CnpLimiter::DEFAULT_INTERVAL_NS);
    assert!(np.on_ce(1_000));
    assert!(!np.on_ce(1_001));
    assert!(!np.on_ce(50_999));
    assert!(np.on_ce(51_000));
    assert_eq!(np.suppressed, 2);
}
