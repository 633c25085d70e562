//! What the simulator must show (the simulator issue), on small fast
//! topologies: HPCC++ against DCQCN in an incast, reaction and fairness when
//! a flow joins, and determinism.

use netsim::sim::scenario::{Overrides, ScenarioSpec, BUILTIN};
use netsim::sim::SimResult;

fn scenario(name: &str) -> ScenarioSpec {
    ScenarioSpec::parse(BUILTIN.iter().find(|s| s.0 == name).unwrap().1).unwrap()
}

fn run(s: &ScenarioSpec, cc: &str, o: &Overrides) -> SimResult {
    let mode = s.sim.cc(cc).unwrap();
    let mut b = s.build(mode, o).unwrap();
    b.sim.run();
    b.sim.result(cc)
}

#[test]
fn incast_hpcc_keeps_the_queue_10x_below_dcqcn_at_high_utilization() {
    let s = scenario("incast");
    let o = Overrides {
        senders: Some(8),
        duration_us: Some(800),
        ..Overrides::default()
    };
    let hpcc = run(&s, "hpcc", &o);
    let dcqcn = run(&s, "dcqcn", &o);
    assert!(
        hpcc.queue_p99_bytes * 10 <= dcqcn.queue_p99_bytes,
        "queue p99: HPCC++ {} B, DCQCN {} B",
        hpcc.queue_p99_bytes,
        dcqcn.queue_p99_bytes
    );
    assert!(
        hpcc.utilization >= 0.9 * 0.95,
        "utilization {}",
        hpcc.utilization
    );
    assert_eq!(hpcc.drops, 0);
    // The first round trip's burst is reported, and HPCC++ drains it.
    assert!(
        hpcc.first_burst_peak_bytes > 100_000,
        "{}",
        hpcc.first_burst_peak_bytes
    );
    assert!(hpcc.first_burst_drained_ns.is_some());
}

#[test]
fn a_joining_flow_gets_a_reaction_within_two_rtts_and_jain_reaches_0_99() {
    let s = scenario("converge");
    let r = run(&s, "hpcc", &Overrides::default());
    let join = s.workload.join_us * 1_000;
    let rtt = s.sim.base_rtt_ns;
    let bucket = s.sim.sample_us * 1_000;
    let old_rate = |t: u64| -> f64 {
        r.rate_series
            .iter()
            .find(|(ts, _)| *ts == t)
            .map(|(_, rates)| rates.iter().filter(|(f, _)| *f < 2).map(|x| x.1).sum())
            .unwrap()
    };
    let before = old_rate(join);
    // The first bucket in which the two old flows sent < 75% of before.
    let reacted = r
        .rate_series
        .iter()
        .map(|(t, _)| *t)
        .filter(|&t| t > join)
        .find(|&t| old_rate(t) < 0.75 * before)
        .expect("the old flows slow down");
    // The joiner's first telemetry returns one RTT after it starts; the
    // bucket that ends after two more RTTs must show the cut.
    assert!(
        reacted <= join + 3 * rtt + bucket,
        "reacted at {reacted} ns, joined at {join} ns"
    );
    assert!(r.jain_fairness >= 0.99, "Jain {}", r.jain_fairness);
}

#[test]
fn the_same_seed_gives_byte_identical_json() {
    let s = scenario("fb_hadoop");
    let o = Overrides {
        duration_us: Some(200),
        seed: Some(7),
        ..Overrides::default()
    };
    let a = serde_json::to_string(&run(&s, "hpcc", &o)).unwrap();
    let b = serde_json::to_string(&run(&s, "hpcc", &o)).unwrap();
    assert_eq!(a, b);
    let c = serde_json::to_string(&run(&s, "hpcc", &Overrides { seed: Some(8), ..o })).unwrap();
    assert_ne!(a, c, "another seed, another workload");
}

/// A star of two hosts (100G, 1 us links, MTU 1024) and one 1000 B flow
/// that starts `start_us` into a run of `duration_us` draining `drain_us`.
fn lone_flow(start_us: u64, duration_us: u64, drain_us: u64) -> SimResult {
    use netsim::sim::{FlowSpec, SimConfig, Simulator};
    let topo = toml::from_str::<netsim::sim::topology::TopologySpec>("kind = \"star\"\nhosts = 2")
        .unwrap()
        .build()
        .unwrap();
    let mut cfg = SimConfig::new(transport::rc::CcMode::None, duration_us * 1_000);
    cfg.drain_ns = drain_us * 1_000;
    let mut sim = Simulator::new(cfg, topo, 1 << 20).unwrap();
    sim.add_flow(FlowSpec {
        src: 0,
        dst: 1,
        size: 1000,
        start_ns: start_us * 1_000,
        dscp: None,
    })
    .unwrap();
    sim.run();
    sim.result("none")
}

#[test]
fn the_ideal_fct_counts_propagation_a_packet_per_hop_and_the_headers() {
    let r = lone_flow(0, 100, 0);
    // 2 x 2 links x 1 us, one 1024 B packet serialized at each of the two
    // 100G hops (82 ns each), and 1000 B + 58 B of headers + a 16 B RETH
    // at 100G (86 ns).
    assert_eq!(r.flows[0].ideal_ns, 4_000 + 2 * 82 + 86);
    // Alone on the path the flow is close to it, and never below 1.
    let s = r.flows[0].slowdown.unwrap();
    assert!((1.0..1.5).contains(&s), "slowdown {s}");
}

#[test]
fn a_drained_run_finishes_what_started_and_reports_what_did_not() {
    // Starts 1 us before the end: unfinished without a drain, and counted
    // as such, not dropped from the statistics.
    let cut = lone_flow(99, 100, 0);
    assert_eq!(cut.flows_done, 0);
    assert_eq!(cut.slowdown[0].unfinished, 1);
    assert_eq!(cut.slowdown[0].flows, 0);
    let drained = lone_flow(99, 100, 50);
    assert_eq!(drained.flows_done, 1);
    assert_eq!(drained.slowdown[0].unfinished, 0);
    assert!(drained.simulated_ns > 100_000, "ran past the duration");
}

#[test]
fn the_papers_incast_keeps_the_queue_p95_at_4_kb_with_w_ai_at_most_150_bytes() {
    // 16-to-1 at 100G, T = 4 us: W_AI = 50 KB x 0.05 / N.
    let mut s = scenario("paper-incast");
    let o = Overrides {
        duration_us: Some(3_000),
        ..Overrides::default()
    };
    let w_ai = |n: u32| 100e9 / 8.0 * 4e-6 * 0.05 / f64::from(n);
    assert!(w_ai(s.sim.hpcc_n) <= 150.0);
    let small = run(&s, "hpcc", &o);
    s.sim.hpcc_n = 8; // W_AI 312 B
    assert!(w_ai(s.sim.hpcc_n) >= 300.0);
    let large = run(&s, "hpcc", &o);
    assert!(
        small.queue_p95_bytes <= 4_096,
        "W_AI <= 150 B: queue p95 {} B",
        small.queue_p95_bytes
    );
    assert!(
        large.queue_p95_bytes > 2 * small.queue_p95_bytes,
        "W_AI 300 B queues more: {} B vs {} B",
        large.queue_p95_bytes,
        small.queue_p95_bytes
    );
    // The first round trip's burst: reported, and drained.
    assert!(small.first_burst_peak_bytes > 100_000);
    assert!(small.first_burst_drained_ns.is_some());
    assert!(small.utilization > 0.95 && small.drops == 0);
}

#[test]
fn compact_8_byte_hops_give_hpcc_its_samples_and_bad_sizes_are_refused() {
    // Five slots of 8 bytes (the authors' INT overhead) instead of 16:
    // HPCC++ still holds the incast's queue down and the link busy.
    let mut s = scenario("paper-incast");
    s.sim.maxhop = 5;
    s.sim.int_hop_bytes = 8;
    let o = Overrides {
        duration_us: Some(3_000),
        ..Overrides::default()
    };
    let r = run(&s, "hpcc", &o);
    assert!(r.queue_p95_bytes <= 4_096, "{}", r.queue_p95_bytes);
    assert!(r.utilization > 0.95 && r.drops == 0);
    s.sim.int_hop_bytes = 12;
    let e = s
        .build(s.sim.cc("hpcc").unwrap(), &o)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("int_hop_bytes = 12"), "{e}");
}

/// HPCC++ draft-00 s6.3 in the 24-to-1 incast: with switch INT responses
/// the senders hear of the queue half a round trip sooner and without
/// waiting behind it, so the first round trip's burst peaks lower and
/// drains sooner; every response sent is taken by its sender; off, the
/// run reports none.
#[test]
fn int_responses_shrink_and_shorten_the_first_burst_of_an_incast() {
    let s = scenario("incast");
    let o = |on| Overrides {
        senders: Some(24),
        duration_us: Some(400),
        int_response: Some(on),
        ..Overrides::default()
    };
    let off = run(&s, "hpcc", &o(false));
    let on = run(&s, "hpcc", &o(true));
    assert!(off.int_response.is_none());
    let ir = on.int_response.clone().expect("counted when on");
    assert!(
        ir.sent > 0 && ir.taken == ir.sent && ir.stale == 0,
        "{ir:?}"
    );
    assert!(
        on.first_burst_peak_bytes < off.first_burst_peak_bytes,
        "peak {} B with, {} B without",
        on.first_burst_peak_bytes,
        off.first_burst_peak_bytes
    );
    let drained = |r: &SimResult| r.first_burst_drained_ns.unwrap_or(u64::MAX);
    assert!(
        drained(&on) < drained(&off),
        "drained at {:?} ns with, {:?} ns without",
        on.first_burst_drained_ns,
        off.first_burst_drained_ns
    );
    assert_eq!((on.drops, off.drops), (0, 0));
}

/// `payload_bytes` (the HPCC authors' 1000 B packets): a 2048 B flow takes
/// three packets instead of two (one more packet's 58 B of headers on the
/// wire), finishes, and its ideal FCT counts the smaller packets.
#[test]
fn a_smaller_payload_per_packet_segments_flows_into_more_packets() {
    use netsim::sim::{FlowSpec, SimConfig, Simulator};
    let run = |payload: Option<u32>| {
        let topo =
            toml::from_str::<netsim::sim::topology::TopologySpec>("kind = \"star\"\nhosts = 2")
                .unwrap()
                .build()
                .unwrap();
        let mut cfg = SimConfig::new(transport::rc::CcMode::None, 100_000);
        cfg.payload_bytes = payload;
        let mut sim = Simulator::new(cfg, topo, 1 << 20).unwrap();
        sim.add_flow(FlowSpec {
            src: 0,
            dst: 1,
            size: 2048,
            start_ns: 0,
            dscp: None,
        })
        .unwrap();
        sim.run();
        sim.result("none")
    };
    let (mtu, small) = (run(None), run(Some(1000)));
    assert_eq!((mtu.flows_done, small.flows_done), (1, 1));
    let to_host1 = |r: &SimResult| r.ports.iter().map(|p| p.tx_bytes).max().unwrap();
    assert_eq!(to_host1(&small), to_host1(&mtu) + 58);
    // One more packet's headers at 100G, and a 1000 B packet per hop
    // instead of a 1024 B one (2 hops x 2 ns).
    assert_eq!(
        small.flows[0].ideal_ns as i64 - mtu.flows[0].ideal_ns as i64,
        5 - 4
    );
}

/// HPCC++ draft-00 s6.2 in the `converge` scenario run with hpcc.md's
/// default N = 16 (three flows share the link: W_AI is 5x too small): with
/// receiver-measured N the flows reach Jain >= 0.99 for good much sooner;
/// with N = 1 (W_AI 3x too large) the queue is lower with it.
#[test]
fn receiver_measured_n_converges_sooner_than_a_too_large_n_and_queues_less_than_a_too_small_one() {
    let text = BUILTIN.iter().find(|s| s.0 == "converge").unwrap().1;
    let with_n = |n: u32| {
        ScenarioSpec::parse(&text.replace("hpcc_n = 3", &format!("hpcc_n = {n}"))).unwrap()
    };
    let o = |on| Overrides {
        receiver_n: Some(on),
        ..Overrides::default()
    };
    // The first sample from which Jain stays >= 0.99.
    let settled = |r: &SimResult| {
        let i = r
            .jain_series
            .iter()
            .rposition(|&(_, j)| j < 0.99)
            .map_or(0, |i| i + 1);
        r.jain_series.get(i).map_or(u64::MAX, |s| s.0)
    };
    let (fixed, measured) = (
        run(&with_n(16), "hpcc", &o(false)),
        run(&with_n(16), "hpcc", &o(true)),
    );
    assert!(
        settled(&measured) * 2 < settled(&fixed),
        "Jain >= 0.99 from {} ns with N measured, {} ns with N = 16",
        settled(&measured),
        settled(&fixed)
    );
    let (fixed, measured) = (
        run(&with_n(1), "hpcc", &o(false)),
        run(&with_n(1), "hpcc", &o(true)),
    );
    assert!(
        measured.queue_p99_bytes * 2 < fixed.queue_p99_bytes,
        "queue p99 {} B with N measured, {} B with N = 1",
        measured.queue_p99_bytes,
        fixed.queue_p99_bytes
    );
}

/// Every scenario file shipped in configs/sim (built in or not) parses.
#[test]
fn every_shipped_scenario_file_parses() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/sim");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "toml") {
            let text = std::fs::read_to_string(&p).unwrap();
            ScenarioSpec::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            n += 1;
        }
    }
    assert!(n > BUILTIN.len(), "found {n} scenario files");
}

/// HPCC++ 2023 s9.3: with DWRR classes weighted 3:1, backlogged classes
/// share the bottleneck 3:1 whatever their flow counts (one flow against
/// three); with one FIFO the four flows share it equally.
#[test]
fn dwrr_classes_share_a_bottleneck_by_weight_and_a_fifo_by_flow() {
    let s = scenario("qos-2class");
    // No congestion control: every flow at line rate, both classes always
    // backlogged.
    let share = |qos: bool| {
        let r = run(
            &s,
            "none",
            &Overrides {
                qos: Some(qos),
                duration_us: Some(1_500),
                ..Overrides::default()
            },
        );
        r.classes.iter().map(|c| c.share).collect::<Vec<f64>>()
    };
    let dwrr = share(true);
    assert_eq!(dwrr.len(), 2);
    assert!((dwrr[0] - 0.75).abs() <= 0.05 * 0.75, "{dwrr:?}");
    assert!((dwrr[1] - 0.25).abs() <= 0.05 * 0.25, "{dwrr:?}");
    assert!(share(false).is_empty(), "no classes to report without QoS");
    // With one FIFO the flows share per flow: the class-0 flow gets a
    // quarter.
    let fifo = run(
        &s,
        "none",
        &Overrides {
            qos: Some(false),
            duration_us: Some(1_500),
            ..Overrides::default()
        },
    );
    assert!(fifo.jain_fairness > 0.99, "{}", fifo.jain_fairness);
}

/// Sojourn times reach HPCC++: with them, the lighter class's packets wait
/// less at the median than with queue lengths (which hide a queue served
/// at a quarter of the port's rate), and the classes' weights still order
/// their shares.
#[test]
fn hpcc_reading_sojourn_times_keeps_the_light_class_from_a_standing_queue() {
    let s = scenario("qos-2class");
    let go = |sojourn: bool| {
        run(
            &s,
            "hpcc",
            &Overrides {
                sojourn: Some(sojourn),
                ..Overrides::default()
            },
        )
        .classes
    };
    let (qlen, soj) = (go(false), go(true));
    assert!(
        soj[1].sojourn_p50_ns * 4 < qlen[1].sojourn_p50_ns,
        "class 1 sojourn p50: {} ns with sojourn times, {} ns with queue lengths",
        soj[1].sojourn_p50_ns,
        qlen[1].sojourn_p50_ns
    );
    for c in [&qlen, &soj] {
        assert!(c[0].share > 1.5 * c[1].share, "{c:?}");
    }
}

/// HPCC++ 2023 s9.4: on a fat tree with one 10G core link, flows that
/// choose paths from telemetry move off it, lose nothing, retransmit
/// nothing, and put fewer bytes through the hot link than ECMP alone.
#[test]
fn path_choice_moves_flows_off_a_hot_link_and_loses_nothing() {
    let s = scenario("hot-core");
    let go = |on: bool| {
        run(
            &s,
            "hpcc",
            &Overrides {
                path_choice: Some(on),
                duration_us: Some(1_000),
                ..Overrides::default()
            },
        )
    };
    let (ecmp, chosen) = (go(false), go(true));
    for r in [&ecmp, &chosen] {
        assert_eq!(r.flows_done, r.flows_total, "{}", r.cc);
        assert_eq!((r.drops, r.retransmitted), (0, 0));
    }
    assert!(ecmp.paths.is_none());
    let p = chosen.paths.as_ref().unwrap();
    assert!(p.moves > 0 && p.probes > 0 && p.answered > 0, "{p:?}");
    assert!(chosen.probe_overhead > 0.0);
    // The hot link's two egress ports, from the topology.
    let topo = s.topology.build().unwrap();
    let link = topo
        .links
        .iter()
        .find(|l| l.rate_bps == 10_000_000_000)
        .expect("the hot link");
    let ends = [(link.a.node, link.a.port), (link.b.node, link.b.port)];
    let hot = |r: &SimResult| -> u64 {
        r.ports
            .iter()
            .filter(|p| ends.contains(&(p.node, p.port)))
            .map(|p| p.tx_bytes)
            .sum()
    };
    assert!(
        hot(&chosen) < hot(&ecmp),
        "bytes through the hot link: {} with path choice, {} without",
        hot(&chosen),
        hot(&ecmp)
    );
}

/// Keyed connections (authenticated feedback) run the incast as unkeyed
/// ones do: every ACK's MAC verifies (nothing refused) and HPCC++ keeps the
/// queue as small.
#[test]
fn keyed_connections_verify_every_ack_and_keep_the_queue() {
    let s = scenario("incast");
    let go = |on: bool| {
        run(
            &s,
            "hpcc",
            &Overrides {
                feedback_auth: Some(on),
                duration_us: Some(500),
                ..Overrides::default()
            },
        )
    };
    let (plain, keyed) = (go(false), go(true));
    assert!(plain.feedback.is_none());
    let f = keyed.feedback.as_ref().unwrap();
    assert_eq!((f.forged, f.replayed), (0, 0), "{f:?}");
    assert!(keyed.queue_p95_bytes <= plain.queue_p95_bytes * 2 + 4096);
}

/// HPCC++ 2023 s9.1: behind a domain boundary that rewrites every stack
/// into relative load, HPCC++ computes the same U and keeps the incast's
/// queue as small; keyed connections verify every ACK (the MAC covers the
/// relative form), and off, the boundary is not there.
#[test]
fn a_relative_boundary_keeps_hpcc_and_keyed_feedback_working() {
    let s = scenario("incast");
    let go = |relative: bool, keyed: bool| {
        run(
            &s,
            "hpcc",
            &Overrides {
                relative_boundary: Some(relative),
                feedback_auth: Some(keyed),
                duration_us: Some(500),
                ..Overrides::default()
            },
        )
    };
    let plain = go(false, false);
    assert_eq!(plain.relative_rewrites, None);
    for keyed in [false, true] {
        let r = go(true, keyed);
        assert!(
            r.relative_rewrites.is_some_and(|n| n > 1000),
            "{:?}",
            r.relative_rewrites
        );
        if keyed {
            let f = r.feedback.as_ref().unwrap();
            assert_eq!((f.forged, f.replayed), (0, 0), "{f:?}");
        }
        assert!(
            r.queue_p95_bytes <= plain.queue_p95_bytes * 2 + 4096,
            "queue p95 {} behind the boundary, {} without",
            r.queue_p95_bytes,
            plain.queue_p95_bytes
        );
        let done = |r: &SimResult| r.flows.iter().filter(|f| f.fct_ns.is_some()).count();
        assert_eq!(done(&r), done(&plain));
    }
}
