//! Priority flow control in the simulator, as issue 18 asks: under a
//! lossless configuration nothing is dropped at any load; drop-tail stays
//! selectable (and drops under the same load); a stuck receiver's PFC
//! storm is reported and the run still ends.

use netsim::sim::scenario::{Overrides, ScenarioSpec};
use netsim::sim::SimResult;

/// A 16-to-1 incast into a switch with 1 MB of buffer (a shared buffer
/// with PFC when `pfc`), and a 4-ary fat tree under a Poisson load with
/// incasts, 500 KB per switch.
const INCAST: &str = r#"
[topology]
kind = "star"
hosts = 17
host_gbps = 100
link_delay_ns = 1000
buffer_bytes = 1000000

[workload]
kind = "incast"
senders = 16
size_bytes = 0

[sim]
duration_us = 300
base_rtt_ns = 8000
pfc = true
"#;

const FABRIC: &str = r#"
[topology]
kind = "fat-tree"
k = 4
host_gbps = 100
fabric_gbps = 100
link_delay_ns = 1000
buffer_bytes = 500000

[workload]
kind = "poisson"
cdf = "websearch"
load = 0.8
incast_senders = 8
incast_size_bytes = 200000
incast_load = 0.1

[sim]
duration_us = 300
drain_us = 3000
base_rtt_ns = 12000
pfc = true
"#;

fn run(text: &str, cc: &str, o: &Overrides) -> SimResult {
    let s = ScenarioSpec::parse(text).unwrap();
    let mut b = s.build(s.sim.cc(cc).unwrap(), o).unwrap();
    b.sim.run();
    b.sim.result(cc)
}

#[test]
fn a_lossless_incast_drops_nothing_and_pauses_the_senders() {
    for cc in ["none", "dcqcn", "hpcc"] {
        let r = run(INCAST, cc, &Overrides::default());
        assert_eq!(r.drops, 0, "{cc}: lossless");
        assert_eq!(r.retransmitted, 0, "{cc}: nothing to recover");
        if cc != "hpcc" {
            assert!(r.pfc.pause_frames > 0, "{cc}: the buffer filled");
            assert!(r.pfc.hosts_paused > 0 && r.pfc.host_paused_ns > 0);
        }
        assert!(r.utilization > 0.9, "{cc}: {}", r.utilization);
    }
    // The same load on drop-tail ports of the same size drops.
    let o = Overrides {
        pfc: Some(false),
        ..Overrides::default()
    };
    let r = run(INCAST, "none", &o);
    assert!(r.drops > 0);
    assert_eq!(r.pfc.pause_frames, 0);
}

#[test]
fn a_lossless_fabric_drops_nothing_at_80_percent_load_with_incasts() {
    let r = run(FABRIC, "none", &Overrides::default());
    assert_eq!(r.drops, 0, "lossless");
    assert!(r.pfc.pause_frames > 0);
    // Pauses spread into the fabric: switch ports were held, and the
    // frames behind them waited (head-of-line delay).
    assert!(r.pfc.ports_paused > 0, "{:?}", r.pfc);
    assert!(r.pfc.hol_max_ns > 0);
    assert!(r.flows_done > 0);
    let o = Overrides {
        pfc: Some(false),
        ..Overrides::default()
    };
    assert!(run(FABRIC, "none", &o).drops > 0, "drop-tail drops");
}

#[test]
fn a_stuck_receiver_is_reported_as_a_pfc_storm_and_the_run_ends() {
    // Host 16 (the incast's receiver) stops taking frames at 50 us.
    let text = format!("{INCAST}stuck_hosts = [16]\nstuck_from_us = 50\nstorm_us = 100\n");
    let r = run(&text, "hpcc", &Overrides::default());
    assert!(!r.pfc.storm_ports.is_empty(), "{:?}", r.pfc);
    let (_, _, longest) = r.pfc.storm_ports[0];
    assert!(longest >= 200_000, "held since ~50 us: {longest}");
    assert!(r.pfc.stuck_drops > 0);
    assert_eq!(r.drops, 0, "held, not dropped");
    // The senders are held too (the storm spreads back to them).
    assert_eq!(r.pfc.hosts_paused, 16);
    assert_eq!(r.simulated_ns, 300_000, "ran to its end");
}

#[test]
fn a_lossless_run_is_byte_identical_for_the_same_seed() {
    let o = Overrides {
        seed: Some(5),
        ..Overrides::default()
    };
    let a = serde_json::to_string(&run(FABRIC, "dcqcn", &o)).unwrap();
    let b = serde_json::to_string(&run(FABRIC, "dcqcn", &o)).unwrap();
    assert!(a == b, "same seed, same JSON");
    assert!(a.contains("\"pause_frames\""));
    let c =
        serde_json::to_string(&run(FABRIC, "dcqcn", &Overrides { seed: Some(6), ..o })).unwrap();
    assert!(a != c, "another seed, another run");
}
