//! The incast testbed on DPDK ports (net_ring, no hugepages) with the INT
//! switch: under HPCC++ the bottleneck queue stays small and nothing is
//! dropped; without congestion control the buffer overflows and senders
//! retransmit. Rates are low enough for an unoptimised build; the check is
//! a comparison made in one run, not a speed bound.

mod loopback_util;

use dataplane::incast::{run, IncastConfig};
use transport::rc::{CcMode, PathMtu};

fn main() {
    let eal = loopback_util::eal("incast-test", &[]);
    let cfg = |cc, name: &str| IncastConfig {
        senders: 3,
        host_bps: 1_000_000_000,
        bottleneck_bps: 200_000_000,
        buffer_bytes: 256 * 1024,
        pfc: false,
        cc,
        base_rtt_ns: 100_000,
        mtu: PathMtu::Mtu1024,
        message_bytes: 32 * 1024,
        depth: 4,
        ecn: None,
        name: name.into(),
        mbufs: 8191,
        tap: None,
        stats: None,
        int_response: None,
        receiver_n: false,
        qos: None,
        sender_dscp: Vec::new(),
        int_sojourn: false,
        feedback_auth: false,
        relative_telemetry: false,
    };
    let hpcc =
        run(&eal, &cfg(CcMode::HpccInband { maxhop: 3 }, "t_hpcc"), 1.5).expect("HPCC++ run");
    let none = run(&eal, &cfg(CcMode::None, "t_none"), 1.5).expect("no-CC run");
    println!("incast_dpdk: HPCC++ {hpcc:?}");
    println!("incast_dpdk: no CC  {none:?}");
    assert!(
        none.drops > 0 && none.retransmitted > 0,
        "no CC overflows the buffer and retransmits"
    );
    assert_eq!(hpcc.drops, 0, "HPCC++ drops nothing");
    assert!(
        hpcc.queue_p99 * 4 < none.queue_p99,
        "HPCC++ keeps the queue well below the buffer"
    );
    assert!(hpcc.completed > 0 && hpcc.failed == 0);
    // The same overload on a lossless switch: PAUSE frames hold the
    // senders' NICs and nothing is dropped.
    let lossless = IncastConfig {
        pfc: true,
        ..cfg(CcMode::None, "t_pfc")
    };
    let pfc = run(&eal, &lossless, 1.5).expect("PFC run");
    println!("incast_dpdk: no CC, PFC {pfc:?}");
    assert_eq!(pfc.drops, 0, "lossless");
    assert!(pfc.pause_frames > 0 && pfc.resume_frames > 0);
    assert!(pfc.host_paused_ns > 0, "the senders' NICs were held");
    assert!(pfc.completed > 0 && pfc.failed == 0);
    // Switch INT responses on DPDK mbufs: the switch answers the senders
    // of packets that find the bottleneck queue past 2 KB, they take the
    // responses, and nothing is lost.
    let answered = IncastConfig {
        int_response: Some(netsim::int_response::IntResponseConfig::new(2048, 100_000)),
        ..cfg(CcMode::HpccInband { maxhop: 3 }, "t_intresp")
    };
    let ir = run(&eal, &answered, 1.5).expect("INT response run");
    println!("incast_dpdk: HPCC++ with INT responses {ir:?}");
    assert!(ir.int_responses > 0, "the switch answered");
    assert!(ir.int_responses_taken > 0, "senders took responses");
    assert!(ir.int_responses_taken <= ir.int_responses);
    assert_eq!(ir.drops, 0);
    assert!(ir.completed > 0 && ir.failed == 0);
    // Receiver-measured N: the receiver behind the bottleneck reports the
    // flows through it and the senders take the reports.
    let counted = IncastConfig {
        receiver_n: true,
        ..cfg(CcMode::HpccInband { maxhop: 3 }, "t_rxn")
    };
    let rxn = run(&eal, &counted, 1.5).expect("receiver-measured N run");
    println!("incast_dpdk: HPCC++ with receiver-measured N {rxn:?}");
    assert!(rxn.flow_reports > 0, "ACKs carried N");
    assert_eq!(rxn.drops, 0);
    assert!(rxn.completed > 0 && rxn.failed == 0);
    // QoS classes on DPDK mbufs (HPCC++ 2023 s9.3): one sender in class 0
    // (weight 3) against two in class 1 (weight 1), HPCC++ reading sojourn
    // times. By flow count class 0 would get a third; by weight it gets
    // more than class 1.
    let classes = IncastConfig {
        qos: Some(
            netsim::qos::QosConfig::dwrr(&[3, 1])
                .map_dscp(26, 0)
                .map_dscp(10, 1),
        ),
        sender_dscp: vec![26, 10],
        int_sojourn: true,
        ..cfg(CcMode::HpccInband { maxhop: 3 }, "t_qos")
    };
    let qos = run(&eal, &classes, 1.5).expect("QoS run");
    println!("incast_dpdk: HPCC++ with QoS classes and sojourn times {qos:?}");
    assert_eq!(qos.classes.len(), 2);
    assert!(
        qos.classes[0].share > qos.classes[1].share,
        "{:?}",
        qos.classes
    );
    assert!(qos.classes.iter().all(|c| c.sojourn_p99_ns > 0));
    assert_eq!(qos.drops, 0);
    assert!(qos.completed > 0 && qos.failed == 0);
    // Authenticated feedback on DPDK mbufs, behind a switch that is a
    // domain's boundary (every stack leaves it relative) and sends INT
    // responses: every ACK's MAC verifies (it covers the relative form),
    // every response carries its packet's token back and is taken, the
    // queue stays as small as without keys, nothing is dropped.
    let keyed = IncastConfig {
        feedback_auth: true,
        relative_telemetry: true,
        int_response: Some(netsim::int_response::IntResponseConfig::new(2048, 100_000)),
        ..cfg(CcMode::HpccInband { maxhop: 3 }, "t_auth")
    };
    let auth = run(&eal, &keyed, 1.5).expect("keyed run");
    println!("incast_dpdk: HPCC++ with authenticated feedback and relative telemetry {auth:?}");
    assert!(auth.tlm_relative > 0);
    // Every response that reached its sender was taken: none refused for
    // its token; the few the run's end caught on their way back are
    // neither taken nor refused. A packet sent again (see below) passes
    // the switch again and is answered again; the QP takes one response
    // per packet and switch, so the second is stale: at most one per
    // retransmission (a loaded CI machine's run: 253 retransmitted,
    // 21 854 taken and 253 stale of 22 107).
    assert!(auth.int_responses > 0);
    assert!(auth.int_responses_taken <= auth.int_responses);
    assert!(auth.int_responses_stale <= auth.retransmitted, "{auth:?}");
    assert!(
        (auth.int_responses_taken + auth.int_responses_stale) * 100 >= auth.int_responses * 99,
        "{auth:?}"
    );
    // No feedback forged or unkeyed. A request sent again (this run is
    // in wall-clock time with a 4 ms ACK timeout, which a stalled thread
    // of a busy machine can reach) brings its ACK a second time, whose
    // feedback is refused as a replay, as it must be: at most one per
    // retransmission.
    assert_eq!(
        (auth.feedback_forged, auth.feedback_unkeyed),
        (0, 0),
        "{auth:?}"
    );
    assert!(auth.feedback_replayed <= auth.retransmitted, "{auth:?}");
    assert_eq!(auth.drops, 0);
    assert!(auth.queue_p99 * 4 < none.queue_p99);
    assert!(auth.completed > 0 && auth.failed == 0);
    drop(eal);
}
