//! The credit-based round-robin flow scheduler, rule by rule (hpcc.md and
//! the pacer issue).

use pacer::scheduler::{FlowId, FlowScheduler, PktSend, SchedulerConfig};

const G: u64 = 1_000_000_000;
const PKT: u32 = 1000;

fn sched() -> FlowScheduler {
    FlowScheduler::new(SchedulerConfig::default(), 0)
}

/// Sends everything allowed at `now`, refilling each sender's next packet.
fn drain(s: &mut FlowScheduler, now: u64, sent: &mut [u64]) -> usize {
    let mut n = 0;
    while let Some(PktSend { flow, bytes }) = s.next_send(now) {
        sent[flow.0 as usize] += u64::from(bytes);
        s.set_next_packet(flow, Some(PKT), now);
        n += 1;
        assert!(n < 100_000, "the scheduler never stops sending at {now}");
    }
    n
}

#[test]
fn rates_one_two_four_get_byte_shares_within_one_percent() {
    let mut s = sched();
    let flows: Vec<FlowId> = [G, 2 * G, 4 * G]
        .iter()
        .map(|&r| s.add_flow(r, u64::MAX, 0))
        .collect();
    for &f in &flows {
        s.set_next_packet(f, Some(PKT), 0);
    }
    let mut sent = vec![0u64; 3];
    let mut now = 0;
    while now < 20_000_000 {
        drain(&mut s, now, &mut sent);
        now += 50;
    }
    let total: u64 = sent.iter().sum();
    for (i, want) in [1.0 / 7.0, 2.0 / 7.0, 4.0 / 7.0].iter().enumerate() {
        let share = sent[i] as f64 / total as f64;
        assert!(
            (share - want).abs() / want < 0.01,
            "flow {i}: share {share:.5}, want {want:.5}"
        );
    }
    // And each rate is met: 20 ms at 1 Gb/s = 2.5 MB (+ the first burst).
    let expect = 20_000_000.0 / 8.0;
    assert!((sent[0] as f64 - expect).abs() < 20_000.0, "{}", sent[0]);
}

#[test]
fn a_window_full_flow_sends_nothing_until_an_ack_frees_room() {
    let mut s = sched();
    let f = s.add_flow(100 * G, 4 * u64::from(PKT), 0);
    s.set_next_packet(f, Some(PKT), 0);
    let mut sent = [0u64; 1];
    let mut now = 0;
    for _ in 0..1000 {
        drain(&mut s, now, &mut sent);
        now += 100;
    }
    assert_eq!(sent[0], 4 * u64::from(PKT), "exactly one window");
    assert_eq!(s.next_wakeup(), None, "a window-full flow is not tracked");
    s.on_acked(f, u64::from(PKT), now);
    assert_eq!(drain(&mut s, now, &mut sent), 1, "one packet of room");
    assert_eq!(drain(&mut s, now + 1_000_000, &mut sent), 0);
    // A bigger window lets it go on.
    s.set_window(f, 6 * u64::from(PKT), now + 1_000_000);
    assert_eq!(drain(&mut s, now + 1_000_000, &mut sent), 2);
}

#[test]
fn a_window_smaller_than_a_packet_still_lets_one_packet_fly() {
    let mut s = sched();
    let f = s.add_flow(10 * G, 10, 0);
    s.set_next_packet(f, Some(PKT), 0);
    assert!(s.next_send(0).is_some());
    s.set_next_packet(f, Some(PKT), 0);
    assert!(s.next_send(1_000_000).is_none());
}

#[test]
fn an_idle_flow_keeps_at_most_the_burst_cap_of_credit() {
    let cfg = SchedulerConfig {
        burst_bytes: 8 * PKT,
        ..SchedulerConfig::default()
    };
    let mut s = FlowScheduler::new(cfg, 0);
    let f = s.add_flow(G, u64::MAX, 0);
    // Spend the initial burst, leaving 3 packets of credit when it goes idle.
    s.set_next_packet(f, Some(PKT), 0);
    let mut sent = [0u64; 1];
    for _ in 0..5 {
        assert!(s.next_send(0).is_some());
        sent[0] += u64::from(PKT);
        s.set_next_packet(f, Some(PKT), 0);
    }
    s.set_next_packet(f, None, 0);
    let left = s.info(f, 0).unwrap().credit_bytes;
    assert_eq!(left, 3.0 * f64::from(PKT));
    // Idle for a second: at 1 Gb/s that is 125 MB of credit, capped at 8 packets.
    let later = G;
    assert_eq!(s.info(f, later).unwrap().credit_bytes, f64::from(8 * PKT));
    s.set_next_packet(f, Some(PKT), later);
    let mut burst = [0u64; 1];
    drain(&mut s, later, &mut burst);
    assert_eq!(burst[0], 8 * u64::from(PKT), "a burst of exactly the cap");
    // A short idle loses nothing below the cap.
    let mut s = FlowScheduler::new(cfg, 0);
    let f = s.add_flow(G, u64::MAX, 0);
    s.set_next_packet(f, None, 0);
    assert_eq!(s.info(f, 8_000).unwrap().credit_bytes, f64::from(8 * PKT));
}

#[test]
fn a_rate_change_takes_effect_on_the_next_decision() {
    let cfg = SchedulerConfig {
        burst_bytes: PKT,
        ..SchedulerConfig::default()
    };
    let mut s = FlowScheduler::new(cfg, 0);
    let f = s.add_flow(1_000_000, u64::MAX, 0); // 1 Mb/s: 8 ms per packet
    s.set_next_packet(f, Some(PKT), 0);
    assert!(s.next_send(0).is_some(), "the initial burst");
    s.set_next_packet(f, Some(PKT), 0);
    assert!(s.next_send(10_000).is_none(), "8 ms away at the old rate");
    s.set_rate(f, 100 * G, 10_000);
    // At 100 Gb/s a packet takes 80 ns: due by the next decision after that.
    assert!(s.next_send(10_000 + 80 + 128).is_some());
    // Slowing down also applies at once.
    s.set_next_packet(f, Some(PKT), 20_000);
    s.set_rate(f, 0, 20_000);
    assert!(
        s.next_send(G).is_some(),
        "credit earned before stays usable"
    );
    s.set_next_packet(f, Some(PKT), G);
    assert!(s.next_send(100 * G).is_none(), "rate 0: no new credit");
}

#[test]
fn ready_flows_take_turns() {
    let mut s = sched();
    let flows: Vec<FlowId> = (0..4).map(|_| s.add_flow(G, u64::MAX, 0)).collect();
    for &f in &flows {
        s.set_next_packet(f, Some(PKT), 0);
    }
    let mut order = vec![];
    for _ in 0..12 {
        let p = s.next_send(0).unwrap();
        order.push(p.flow.0);
        s.set_next_packet(p.flow, Some(PKT), 0);
    }
    assert_eq!(order, [0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3]);
}

#[test]
fn slow_flows_beyond_the_wheel_horizon_are_paced_exactly() {
    let cfg = SchedulerConfig {
        burst_bytes: PKT,
        ..SchedulerConfig::default()
    };
    let mut s = FlowScheduler::new(cfg, 0);
    // 1 Mb/s: a 1000-byte packet every 8 ms, far beyond the ~1 ms wheel.
    let f = s.add_flow(1_000_000, u64::MAX, 0);
    s.set_next_packet(f, Some(PKT), 0);
    let mut times = vec![];
    let mut now = 0;
    while times.len() < 5 {
        if s.next_send(now).is_some() {
            times.push(now);
            s.set_next_packet(f, Some(PKT), now);
        }
        now = s.next_wakeup().unwrap().max(now + 1);
    }
    for w in times.windows(2) {
        let gap = w[1] - w[0];
        assert!((8_000_000..8_000_000 + 256).contains(&gap), "gap {gap} ns");
    }
}

#[test]
fn idle_flows_do_not_disturb_active_ones() {
    let mut s = sched();
    for _ in 0..100_000 {
        s.add_flow(G, u64::MAX, 0);
    }
    let a = s.add_flow(10 * G, u64::MAX, 0);
    s.set_next_packet(a, Some(PKT), 0);
    let mut sent = vec![0u64; s.len()];
    let mut now = 0;
    while now < 1_000_000 {
        drain(&mut s, now, &mut sent);
        now += 100;
    }
    let got = sent[a.0 as usize];
    // 1 ms at 10 Gb/s = 1.25 MB, plus the starting burst.
    assert!(
        (1_250_000..=1_250_000 + 16_384 + 1000).contains(&got),
        "{got}"
    );
    assert_eq!(sent.iter().sum::<u64>(), got);
}

#[test]
fn removed_flows_never_send_and_ids_are_reused() {
    let mut s = sched();
    let a = s.add_flow(G, u64::MAX, 0);
    let b = s.add_flow(G, u64::MAX, 0);
    s.set_next_packet(a, Some(PKT), 0);
    s.set_next_packet(b, Some(PKT), 0);
    s.remove_flow(a);
    assert_eq!(s.next_send(0).map(|p| p.flow), Some(b));
    assert_eq!(s.next_send(0), None);
    let c = s.add_flow(G, u64::MAX, 0);
    assert_eq!(c, a, "the slot is reused");
    assert_eq!(s.len(), 2);
    s.remove_flow(FlowId(999));
    s.set_next_packet(FlowId(999), Some(1), 0);
    assert_eq!(s.info(FlowId(999), 0), None);
}

#[test]
fn next_wakeup_is_when_the_first_waiting_flow_has_credit() {
    let cfg = SchedulerConfig {
        burst_bytes: PKT,
        tick_ns: 100,
        ..SchedulerConfig::default()
    };
    let mut s = FlowScheduler::new(cfg, 0);
    let f = s.add_flow(8 * G, u64::MAX, 0); // 1000 B per 1000 ns
    s.set_next_packet(f, Some(PKT), 0);
    assert_eq!(s.next_wakeup(), Some(0), "ready now");
    assert!(s.next_send(0).is_some());
    s.set_next_packet(f, Some(PKT), 0);
    assert_eq!(s.next_wakeup(), Some(1000));
    assert!(s.next_send(999).is_none());
    assert!(s.next_send(1000).is_some());
}

#[test]
fn has_ready_says_whether_next_send_can_find_a_flow() {
    // 1 Gb/s, no credit to spare: after its burst, a 1000 B packet needs
    // 8 us of credit.
    let cfg = SchedulerConfig {
        burst_bytes: PKT,
        ..SchedulerConfig::default()
    };
    let mut s = FlowScheduler::new(cfg, 0);
    assert!(!s.has_ready(0), "no flow at all");
    let f = s.add_flow(G, u64::MAX, 0);
    assert!(!s.has_ready(0), "an idle flow");
    s.set_next_packet(f, Some(PKT), 0);
    assert!(s.has_ready(0), "a packet and the credit for it");
    assert!(s.next_send(0).is_some());
    s.set_next_packet(f, Some(PKT), 0);
    assert!(!s.has_ready(4_000), "half the credit earned");
    assert!(s.next_send(4_000).is_none());
    assert!(s.has_ready(8_200), "the credit earned (within a tick)");
    assert!(s.next_send(8_200).is_some());
}

#[test]
fn send_now_grants_an_idle_flow_only_when_it_would_be_next_anyway() {
    let cfg = SchedulerConfig {
        burst_bytes: 2 * PKT,
        ..SchedulerConfig::default()
    };
    let mut s = FlowScheduler::new(cfg, 0);
    let f = s.add_flow(G, 2 * u64::from(PKT), 0);
    let g = s.add_flow(G, u64::MAX, 0);
    assert!(
        s.send_now(f, G, PKT, 0),
        "idle, credit, room, no flow ready"
    );
    let info = s.info(f, 0).unwrap();
    assert_eq!(
        (info.credit_bytes, info.inflight_bytes),
        (f64::from(PKT), 1000)
    );
    assert_eq!(info.pending_bytes, None, "charged, nothing filed");
    assert_eq!(
        s.next_send(0),
        None,
        "the packet went; nothing else is owed"
    );
    // Another flow ready first: it keeps its turn.
    s.set_next_packet(g, Some(PKT), 0);
    assert!(!s.send_now(f, G, PKT, 0));
    assert_eq!(s.next_send(0).map(|p| p.flow), Some(g));
    // The window: one more packet fits, then it is full.
    assert!(s.send_now(f, G, PKT, 0));
    assert!(!s.send_now(f, G, PKT, 0), "the window is full");
    s.on_acked(f, 2 * u64::from(PKT), 0);
    // The credit: both packets of the burst spent; half of one earned.
    assert!(!s.send_now(f, G, PKT, 4_000), "half the credit");
    assert!(s.send_now(f, G, PKT, 8_000), "the credit earned");
    // A flow with a packet filed already is not sent again.
    s.set_next_packet(f, Some(PKT), 8_000);
    assert!(!s.send_now(f, G, PKT, 100_000));
}
