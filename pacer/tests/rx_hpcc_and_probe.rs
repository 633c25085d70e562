//! Receiver-based HPCC++ (NewINT) and probe-mode bookkeeping, rule by rule.

use pacer::hpcc::HpccParams;
use pacer::probe::ProbeClock;
use pacer::rx_hpcc::{Notification, RxHpcc, RxHpccSender};
use pacer::telemetry::{Hop, HopStack};

const T: u64 = 10_000;

fn params() -> HpccParams {
    HpccParams::new(100_000_000_000, T, 10, 1000).unwrap()
}

fn at(ts_ns: u32, tx_bytes: u32, qlen: u32) -> HopStack {
    HopStack::from_slice(&[Hop {
        ts_ns,
        tx_bytes,
        qlen,
        rate_100mbps: 1000,
        switch_id: 4,
        port_id: 2,
    }])
}

#[test]
fn new_int_first_telemetry_only_stores_l() {
    let mut rx = RxHpcc::new(params());
    assert_eq!(rx.new_int(0, &at(0, 0, 0)), None);
    assert_eq!(rx.core().w(), 125_000.0);
}

#[test]
fn new_int_sends_a_window_at_most_once_per_t() {
    let mut rx = RxHpcc::new(params());
    rx.new_int(0, &at(0, 0, 0));
    // First sampled event: nothing committed yet, so it commits and sends.
    // Line rate, and min(qlen) = min(62,500, 0) = 0: u' = 1, tau = T, U = 1,
    // W = 125,000 x 0.95 / 1 + 625.
    let n = rx
        .new_int(1_000, &at(10_000, 125_000, 62_500))
        .expect("first sample commits");
    let w = 125_000.0 * 0.95 / 1.0 + 625.0;
    assert!((rx.core().w() - w).abs() < 1e-6, "{}", rx.core().w());
    assert_eq!(n.window_bytes, w as u32);
    assert_eq!(n.rate_mbps, (w * 8e9 / T as f64 / 1e6) as u32);
    assert_eq!(n.seq, 1);
    // Within T of that commit: W changes locally, nothing is sent.
    let wc = rx.core().wc();
    for (i, now) in [2_000u64, 6_000, 11_000].into_iter().enumerate() {
        let ts = 10_000 + 2_000 * (i as u32 + 1);
        let r = rx.new_int(now, &at(ts, 125_000 + 25_000 * (i as u32 + 1), 62_500));
        assert_eq!(r, None, "at {now}");
        assert_eq!(rx.core().wc(), wc, "Wc only moves on a commit");
    }
    assert!(rx.core().w() < wc, "the queue pushed W down locally");
    // More than T after the last commit (now > 1,000 + T): commit and send.
    let n = rx.new_int(11_001, &at(18_000, 225_000, 62_500)).unwrap();
    assert_eq!(n.seq, 2);
    assert_eq!(rx.core().wc(), rx.core().w());
}

#[test]
fn the_sender_adopts_notified_windows_in_order_and_clamped() {
    let p = params();
    let mut tx = RxHpccSender::new(p);
    assert_eq!(tx.w(), 125_000.0);
    let n = |w, seq| Notification {
        window_bytes: w,
        rate_mbps: 0,
        seq,
    };
    assert!(tx.on_notify(&n(50_000, 1)));
    assert_eq!(tx.w(), 50_000.0);
    assert_eq!(tx.rate_bps(), 50_000.0 * 8e9 / T as f64);
    assert!(!tx.on_notify(&n(90_000, 1)), "a repeat is stale");
    assert!(tx.on_notify(&n(10, 2)));
    assert_eq!(tx.w(), 1000.0, "clamped to W_min");
    assert!(tx.on_notify(&n(u32::MAX, 3)));
    assert_eq!(tx.w(), 125_000.0, "clamped to W_init");
    assert!(!tx.on_notify(&n(5_000, 2)), "older than the last one");
    assert!(!tx.on_notify(&n(5_000, 0)));
    // Sequence numbers wrap.
    let mut tx = RxHpccSender::new(p);
    assert!(tx.on_notify(&n(5_000, u32::MAX)));
    assert!(tx.on_notify(&n(6_000, 0)));
}

#[test]
fn no_probe_without_data_in_flight() {
    let mut c = ProbeClock::new(3 * T);
    assert_eq!(c.poll(0, false, 10), None);
    assert_eq!(c.deadline(), None);
}

#[test]
fn one_probe_per_rtt_the_next_when_the_response_arrives() {
    let mut c = ProbeClock::new(3 * T);
    let p = c.poll(100, true, 42).expect("data in flight: probe");
    assert_eq!((p.snd_psn, p.sender_ts_ns), (42, 100));
    assert_eq!(c.poll(200, true, 50), None, "one outstanding at a time");
    assert_eq!(c.deadline(), Some(100 + 3 * T));
    // The response maps onto NewAck with ack.seq = the probe's snd_psn.
    let ack = c
        .on_response(5_100, p.probe_id, p.snd_psn, p.sender_ts_ns)
        .unwrap();
    assert_eq!((ack.ack_seq, ack.rtt_ns), (42, 5_000));
    let q = c
        .poll(5_100, true, 60)
        .expect("a new probe right after the response");
    assert_ne!(q.probe_id, p.probe_id);
    assert_eq!(q.snd_psn, 60);
}

#[test]
fn an_unanswered_probe_is_replaced_after_the_timeout() {
    let mut c = ProbeClock::new(3 * T);
    let p = c.poll(0, true, 1).unwrap();
    assert_eq!(c.poll(3 * T - 1, true, 2), None);
    let q = c.poll(3 * T, true, 3).expect("timed out: next probe");
    assert_eq!(c.timed_out, 1);
    // The late response still gives telemetry, but the newer probe stays
    // outstanding.
    assert!(c.on_response(3 * T + 10, p.probe_id, 1, 0).is_some());
    assert_eq!(c.poll(3 * T + 20, true, 4), None);
    assert!(c.on_response(3 * T + 30, q.probe_id, 3, 3 * T).is_some());
    assert!(c.poll(3 * T + 40, true, 5).is_some());
}

/// A probe whose answer is lost after the flow's last data was
/// acknowledged is given up at its timeout: no deadline stays armed in the
/// past (a timer that would fire again at once, forever).
#[test]
fn an_unanswered_probe_with_nothing_in_flight_is_given_up() {
    let mut c = ProbeClock::new(3 * T);
    c.poll(0, true, 1).unwrap();
    assert_eq!(c.poll(3 * T - 1, false, 2), None);
    assert_eq!(c.deadline(), Some(3 * T), "still waiting for its answer");
    assert_eq!(c.poll(3 * T, false, 2), None);
    assert_eq!((c.deadline(), c.timed_out), (None, 1));
    assert!(
        c.poll(4 * T, true, 3).is_some(),
        "the next data probes again"
    );
}

#[test]
fn responses_to_probes_never_sent_are_refused() {
    let mut c = ProbeClock::new(3 * T);
    assert_eq!(c.on_response(0, 1, 0, 0), None, "nothing sent yet");
    let p = c.poll(0, true, 1).unwrap();
    assert_eq!(c.on_response(1, p.probe_id + 1, 0, 0), None);
    assert_eq!(c.on_response(1, 0, 0, 0), None);
    assert_eq!(c.answered, 0);
}
