//! Our telemetry, negotiated by rdma_cm: two daemons (two NICs, a memif
//! link between them, neither in the other's `telemetry_peers`), both on
//! HPCC++ (`cc = "hpcc"`). A connection made with rdma_cm (`rping`) has
//! the REQ offer our telemetry and the REP take it, so its QPs keep
//! HPCC++ on both NICs (no QP falls back to the standard controller); one
//! connected without rdma_cm (`ibv_rc_pingpong`, QP numbers over TCP) runs
//! the standard controller on both, as with any peer not configured.

use std::path::Path;

mod daemon_util;

use daemon_util::{tool, RUN_LIMIT};

/// What the daemon's counters say of rdma_cm and of QPs moved to the
/// standard controller: (connections with our telemetry, plain-peer QPs).
fn telemetry_counts(socket: &Path) -> (u64, u64) {
    let snap = dataplane::service::query_stats(socket).expect("stats");
    let negotiated = snap
        .ports
        .iter()
        .map(|p| p.rdma_cm.telemetry_negotiated)
        .sum();
    let plain = snap.service.as_ref().map_or(0, |s| s.plain_peer_qps);
    (negotiated, plain)
}

fn daemon(name: &str, role: &str, memif: &Path, ip: &str, mac: &str) -> daemon_util::Daemon {
    daemon_util::start_daemon_with(
        name,
        &format!(
            ", \"--vdev=net_memif0,role={role},id=0,socket={}\"",
            memif.display()
        ),
        &format!(
            "cc = \"hpcc\"\n[[service.devices]]\nname = \"roce0\"\nport = 0\nip = \"{ip}\"\nmac = \"{mac}\""
        ),
    )
}

#[test]
fn rdma_cm_negotiates_our_telemetry_between_two_of_our_nics() {
    let tmp = tempfile::tempdir().unwrap();
    let libs = daemon_util::lib_dir(tmp.path());
    let memif = tmp.path().join("memif.sock");
    let a = daemon(
        "cm-tlm-a",
        "server",
        &memif,
        "10.9.0.1",
        "02:09:00:00:00:01",
    );
    let b = daemon(
        "cm-tlm-b",
        "client",
        &memif,
        "10.9.0.2",
        "02:09:00:00:00:02",
    );
    let run = |socket: &Path, prog: &str, args: &[&str]| {
        let mut c = tool(prog);
        c.args(args)
            .env("LD_LIBRARY_PATH", &libs)
            .env("RNIC_SOCKET", socket);
        c
    };

    // rping, server on B, client on A.
    let mut server = testkit::Running::spawn(&mut run(
        &b.socket,
        "rping",
        &["-s", "-a", "10.9.0.2", "-C", "5", "-V"],
    ))
    .unwrap();
    // The client retries until B's server listens (REJ: no listener).
    let t0 = std::time::Instant::now();
    let client = loop {
        let f = testkit::output_within(
            &mut run(
                &a.socket,
                "rping",
                &["-c", "-a", "10.9.0.2", "-C", "5", "-V", "-v"],
            ),
            RUN_LIMIT,
        )
        .unwrap();
        if f.success() || !f.text().contains("REJECTED") {
            break f;
        }
        assert!(t0.elapsed().as_secs() < 60, "rping -s on B never listened");
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let server = server.finish(RUN_LIMIT);
    print!("{}{}", server.text(), client.text());
    server.assert_success();
    client.assert_success();
    testkit::require_clean("rping -s", &server.text());
    testkit::require_clean("rping -c", &client.text());
    assert_eq!(client.text().matches("ping data: rdma-ping-").count(), 5);
    let (neg_a, plain_a) = telemetry_counts(&a.socket);
    let (neg_b, plain_b) = telemetry_counts(&b.socket);
    assert!(neg_a >= 1 && neg_b >= 1, "negotiated: A {neg_a}, B {neg_b}");
    assert_eq!((plain_a, plain_b), (0, 0), "rdma_cm's QPs kept HPCC++");

    // The same NICs without rdma_cm: standard congestion control.
    let port = "18777";
    let mut server = testkit::Running::spawn(&mut run(
        &b.socket,
        "ibv_rc_pingpong",
        &["-d", "roce0", "-g", "1", "-n", "5", "-p", port],
    ))
    .unwrap();
    daemon_util::wait_listening(18777);
    let client = testkit::output_within(
        &mut run(
            &a.socket,
            "ibv_rc_pingpong",
            &["-d", "roce0", "-g", "1", "-n", "5", "-p", port, "localhost"],
        ),
        RUN_LIMIT,
    )
    .unwrap();
    let server = server.finish(RUN_LIMIT);
    server.assert_success();
    client.assert_success();
    let (_, plain_a) = telemetry_counts(&a.socket);
    let (_, plain_b) = telemetry_counts(&b.socket);
    assert_eq!((plain_a, plain_b), (1, 1), "QPs connected without rdma_cm");
}
