//! Property tests: HPCC++ stays within its clamps on any telemetry, and the
//! flow scheduler never exceeds a window or a flow's rate plus its burst.

use pacer::hpcc::{Hpcc, HpccParams};
use pacer::scheduler::{FlowScheduler, PktSend, SchedulerConfig};
use pacer::telemetry::{Hop, HopStack};
use pacer::trace::{parse_line, TraceEvent};
use proptest::prelude::*;

fn hop() -> impl Strategy<Value = Hop> {
    (
        any::<u32>(),
        any::<u32>(),
        any::<u32>(),
        prop_oneof![Just(0u16), 1u16..4000],
        0u8..3,
        0u8..2,
    )
        .prop_map(
            |(ts_ns, tx_bytes, qlen, rate_100mbps, switch_id, port_id)| Hop {
                ts_ns,
                tx_bytes,
                qlen,
                rate_100mbps,
                switch_id,
                port_id,
            },
        )
}

fn event() -> impl Strategy<Value = (u32, u32, Vec<Hop>)> {
    (
        0u32..1 << 24,
        0u32..1 << 24,
        prop::collection::vec(hop(), 0..5),
    )
}

proptest! {
    #[test]
    fn hpcc_window_stays_in_its_clamps_and_finite(
        max_stage in 0u32..6,
        eta in 0.5f64..1.0,
        events in prop::collection::vec(event(), 1..60),
    ) {
        let mut p = HpccParams::new(100_000_000_000, 5_000, 16, 1024).unwrap();
        p.max_stage = max_stage;
        p.eta = eta;
        let mut h = Hpcc::new(p);
        for (ack, nxt, hops) in events {
            h.new_ack(ack, nxt, &HopStack::from_slice(&hops));
            let c = h.core();
            prop_assert!(c.w().is_finite() && c.wc().is_finite() && c.u().is_finite());
            prop_assert!(c.w() >= p.w_min && c.w() <= p.w_init, "W {}", c.w());
            prop_assert!(c.wc() >= p.w_min && c.wc() <= p.w_init, "Wc {}", c.wc());
            prop_assert!(c.u() >= 0.0);
        }
    }

    #[test]
    fn trace_lines_round_trip(ack in 0u32..1 << 24, nxt in 0u32..1 << 24,
                              hops in prop::collection::vec(hop(), 0..15)) {
        let e = TraceEvent { ack_seq: ack, snd_nxt: nxt, hops: HopStack::from_slice(&hops) };
        prop_assert_eq!(parse_line(&e.to_string()), Ok(Some(e)));
    }

    #[test]
    fn trace_parser_never_panics(line in ".{0,200}") {
        let _ = parse_line(&line);
    }

    #[test]
    fn the_scheduler_keeps_windows_and_rates(
        flows in prop::collection::vec((1u64..200, 1u64..64, 100u32..4000), 1..8),
        ops in prop::collection::vec((0usize..8, 0u8..6, 1u64..5_000), 1..400),
    ) {
        let burst = 8192u32;
        let cfg = SchedulerConfig { burst_bytes: burst, tick_ns: 64, wheel_slots: 256 };
        let mut s = FlowScheduler::new(cfg, 0);
        let ids: Vec<_> = flows
            .iter()
            .map(|&(gbps, win_pkts, pkt)| {
                let id = s.add_flow(gbps * 100_000_000, win_pkts * u64::from(pkt), 0);
                s.set_next_packet(id, Some(pkt), 0);
                id
            })
            .collect();
        let mut sent = vec![0u64; ids.len()];
        let mut now = 0u64;
        for (which, op, dt) in ops {
            now += dt;
            let k = which % ids.len();
            let (gbps, win_pkts, pkt) = flows[k];
            match op {
                0 => s.on_acked(ids[k], u64::from(pkt), now),
                1 => s.set_next_packet(ids[k], None, now),
                2 => s.set_next_packet(ids[k], Some(pkt), now),
                3 => s.set_window(ids[k], (win_pkts + 2) * u64::from(pkt), now),
                _ => {
                    let mut n = 0;
                    while let Some(p) = s.next_send(now) {
                        let i = ids.iter().position(|&f| f == p.flow).unwrap();
                        sent[i] += u64::from(p.bytes);
                        let info = s.info(p.flow, now).unwrap();
                        prop_assert!(
                            info.inflight_bytes <= info.window_bytes.max(u64::from(p.bytes)),
                            "window exceeded: {info:?}"
                        );
                        s.set_next_packet(p.flow, Some(flows[i].2), now);
                        n += 1;
                        prop_assert!(n < 100_000);
                    }
                }
            }
            // No flow ever sends more than its burst plus its rate x time
            // (plus one packet that may exceed the burst).
            let limit = f64::from(burst) + f64::from(pkt) + now as f64 * (gbps as f64 * 0.1) / 8.0;
            prop_assert!((sent[k] as f64) <= limit, "flow {k} sent {} > {limit}", sent[k]);
        }
    }
}

proptest! {
    /// `send_now` decides what filing the packet and asking `next_send`
    /// decides, and leaves every flow as they leave it: two schedulers,
    /// one filing every post, one trying `send_now` first, make the same
    /// decisions through any sequence of posts, sends, ACKs, rate and
    /// window changes.
    #[test]
    fn send_now_is_filing_then_next_send(
        flows in prop::collection::vec((1u64..200, 1u64..64, 100u32..4000), 1..6),
        tick_ns in prop::sample::select(vec![64u64, 100]),
        ops in prop::collection::vec((0usize..6, 0u8..6, 0u64..3_000), 1..300),
    ) {
        let cfg = SchedulerConfig { burst_bytes: 6000, tick_ns, wheel_slots: 256 };
        let mut a = FlowScheduler::new(cfg, 0);
        let mut b = FlowScheduler::new(cfg, 0);
        let ids: Vec<_> = flows
            .iter()
            .map(|&(gbps, win_pkts, pkt)| {
                let w = win_pkts * u64::from(pkt);
                let id = a.add_flow(gbps * 100_000_000, w, 0);
                prop_assert_eq!(b.add_flow(gbps * 100_000_000, w, 0), id);
                Ok(id)
            })
            .collect::<Result<_, TestCaseError>>()?;
        let mut now = 0u64;
        for (which, op, dt) in ops {
            now += dt;
            let k = which % ids.len();
            let (gbps, _, pkt) = flows[k];
            // A rate that moves with the op, so that send_now sets it too.
            let rate = (gbps + u64::from(op)) * 100_000_000;
            let id = ids[k];
            match op {
                0 => {
                    a.on_acked(id, u64::from(pkt), now);
                    b.on_acked(id, u64::from(pkt), now);
                }
                1 => {
                    a.set_next_packet(id, None, now);
                    b.set_next_packet(id, None, now);
                }
                2 => {
                    a.set_window(id, u64::from(pkt) * 3, now);
                    b.set_window(id, u64::from(pkt) * 3, now);
                }
                3 => {
                    let x = a.next_send(now);
                    prop_assert_eq!(x, b.next_send(now));
                }
                _ => {
                    // A post: filed and asked for, or sent at once.
                    a.set_rate_and_next(id, rate, Some(pkt), now);
                    let x = a.next_send(now);
                    let y = if b.send_now(id, rate, pkt, now) {
                        Some(PktSend { flow: id, bytes: pkt })
                    } else {
                        b.set_rate_and_next(id, rate, Some(pkt), now);
                        b.next_send(now)
                    };
                    prop_assert_eq!(x, y);
                }
            }
            for &f in &ids {
                prop_assert_eq!(a.info(f, now), b.info(f, now));
            }
            prop_assert_eq!(a.next_wakeup(), b.next_wakeup());
        }
    }
}
