//! A daemon whose devices' QPs are sharded over two engines on two lcores
//! (`qp_shards = 2`, `lcores = 2`; each engine on its own queue pair of the
//! device's net_ring port), and unmodified verbs binaries over it:
//! `ibv_rc_pingpong` (data validated) with server and client QPs on the
//! same shard and on different shards both ways round, both ends on one
//! device (its frames go from one shard to the other through the port's
//! steering), `rc_verify` (every byte of SEND, WRITE with immediate, READ
//! and FETCH_ADD checked) across rnic0's shards, and perftest's WRITE and
//! READ sweeps to rnic1 and 8 MiB runs within rnic0. The counters show
//! all four engines carried traffic, frames passed between shards and
//! none dropped.

use std::process::Command;

mod daemon_util;

use daemon_util::{pair_on, tool, wait_listening};

/// The `dataplane stats` table of the daemon at `socket`.
fn stats(socket: &std::path::Path) -> String {
    let f = testkit::output_within(
        Command::new(env!("CARGO_BIN_EXE_dataplane"))
            .args(["stats", "--socket"])
            .arg(socket),
        daemon_util::RUN_LIMIT,
    )
    .unwrap();
    f.assert_success();
    f.stdout
}

/// The QP shard (of 2) of the QP an `ibv_rc_pingpong` printed as its
/// local address.
fn qp_shard(out: &str) -> u32 {
    let (qpn, _) =
        testkit::verbs_output::local_qp(out).unwrap_or_else(|| panic!("no local QPN in\n{out}"));
    transport::rc::QpnSpace::owner(qpn, 2)
}

/// The number after `key` on the line starting with `prefix`.
fn field(text: &str, prefix: &str, key: &str) -> u64 {
    let line = text
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line {prefix:?} in\n{text}"));
    let at = line
        .find(key)
        .unwrap_or_else(|| panic!("no {key:?} in {line:?}"));
    line[at + key.len()..]
        .split(|c: char| !c.is_ascii_digit())
        .find(|w| !w.is_empty())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no number after {key:?} in {line:?}"))
}

fn main() {
    let tmp = tempfile::tempdir().unwrap();
    let libs = daemon_util::lib_dir(tmp.path());
    let d = daemon_util::start_daemon_with("qp-shards", "", "lcores = 2\nqp_shards = 2");
    let run = |cmd: &mut Command| daemon_util::run_over_lib(cmd, &libs, &d.socket);

    // Each device is listed once.
    let text = run(&mut tool("ibv_devices"));
    assert_eq!(text.matches("rnic0").count(), 1, "{text}");
    assert_eq!(text.matches("rnic1").count(), 1, "{text}");

    let mut port = 18900;
    // ibv_rc_pingpong, data validated; returns the shards of the server's
    // and the client's QPs (from the QPNs they print).
    let pingpong = |port: u16, server: &str, client: &str, size: &str| -> (u32, u32) {
        let a = ["-g", "1", "-c", "-n", "20", "-s", size];
        let (srv, cli) = pair_on(
            &libs,
            &d.socket,
            "ibv_rc_pingpong",
            port,
            (server, client),
            &a,
        );
        for t in [&srv, &cli] {
            assert!(t.contains("20 iters in"), "{t}");
        }
        (qp_shard(&srv), qp_shard(&cli))
    };
    // Start a server and leave it waiting for its client: an application
    // open on `device` (killed when dropped, also when a check fails).
    let hold = |port: u16, device: &str| {
        let mut c = tool("ibv_rc_pingpong");
        let child = testkit::Running::spawn(
            c.env("LD_LIBRARY_PATH", &libs)
                .env("RNIC_SOCKET", &d.socket)
                .args(["-d", device, "-g", "1", "-p", &port.to_string()]),
        )
        .unwrap();
        wait_listening(port);
        child
    };
    // An application goes to the shard of its device serving the fewest:
    // with none open, both ends on shard 0 (lcore 0), every frame on its
    // own shard's queue.
    // With a third application open on a device's shard 0, that device's
    // end gets shard 1 (and its frames arrive on shard 0's queue, passed
    // on).
    for (held, shards, says) in [
        (None, (0, 0), "server and client on shard 0"),
        (
            Some("rnic1"),
            (1, 0),
            "server on shard 1, client on shard 0",
        ),
        (
            Some("rnic0"),
            (0, 1),
            "server on shard 0, client on shard 1",
        ),
    ] {
        let h = held.map(|device| {
            port += 1;
            hold(port - 1, device)
        });
        for size in ["1", "4096", "1048576"] {
            assert_eq!(pingpong(port, "rnic1", "rnic0", size), shards);
            port += 1;
        }
        drop(h);
        println!("ok: ibv_rc_pingpong -c, {says}");
    }
    // Both ends on rnic0, on its two shards: every frame is the device's
    // own, passed from one shard to the other.
    for size in ["1", "65536"] {
        assert_eq!(pingpong(port, "rnic0", "rnic0", size), (0, 1));
        port += 1;
    }
    println!("ok: ibv_rc_pingpong -c, both ends on rnic0, one per shard");
    // Every byte checked (the pingpong checks one per page, on the server
    // only): SEND, WRITE with immediate, READ and FETCH_ADD between the
    // shards of rnic0.
    let verify = daemon_util::rc_verify(tmp.path(), 0);
    let verify = verify.to_str().unwrap();
    for size in ["1", "65536", "1048576"] {
        let a = ["-g", "1", "-n", "5", "-s", size];
        let (srv, cli) = pair_on(&libs, &d.socket, verify, port, ("rnic0", "rnic0"), &a);
        port += 1;
        for t in [&srv, &cli] {
            assert!(t.contains("every byte checked"), "{t}");
        }
    }
    println!("ok: rc_verify (every byte checked), both ends on rnic0, one per shard");

    for (server, client) in [("rnic1", "rnic0"), ("rnic0", "rnic0")] {
        for (prog, table) in [
            ("ib_write_bw", "BW average[MB/sec]"),
            ("ib_read_lat", "t_typical[usec]"),
        ] {
            // All sizes to rnic1; within rnic0 8 MiB (a sweep costs
            // perftest ~0.45 s a size of its own).
            let (a, last) = if server == "rnic1" {
                (vec!["-a", "-n", "5", "-F"], "\n 8388608 ")
            } else {
                (vec!["-s", "8388608", "-n", "5", "-F"], "\n 8388608 ")
            };
            let (_, cli) = pair_on(&libs, &d.socket, prog, port, (server, client), &a);
            port += 1;
            assert!(cli.contains(table) && cli.contains(last), "{cli}");
            println!("ok: {prog} {a:?} {server} <- {client}");
        }
    }

    let text = stats(&d.socket);
    print!("{text}");
    let mut passed = 0;
    for host in ["0", "0.1", "1", "1.1"] {
        let rx = field(&text, &format!("host {host} all QPs"), "rx_pkts ");
        assert!(rx > 0, "shard {host} received nothing");
        passed += field(&text, &format!("host {host} steering"), "shard ");
        assert_eq!(
            field(&text, &format!("host {host} steering"), "want of a buffer "),
            0
        );
    }
    assert!(passed > 100, "only {passed} frames passed between shards");
    let looped = field(&text, "host 0 steering", "own device ")
        + field(&text, "host 0.1 steering", "own device ");
    assert!(looped > 100, "rnic0 sent only {looped} frames to itself");
    println!(
        "ok: all four engines carried traffic; {passed} frames passed between shards, {looped} within rnic0"
    );
}
