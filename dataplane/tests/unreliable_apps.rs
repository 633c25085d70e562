//! Unmodified Debian binaries on UD and UC QPs over our libibverbs and the
//! loopback daemon (issue 52): rdma-core's `ibv_ud_pingpong -c` and
//! `ibv_uc_pingpong -c` (received buffers validated; they print `invalid
//! data` and exit 0 on a bad byte, which `pair` reads), and perftest's
//! `ib_send_lat -c UD`, `ib_send_bw -c UD`, `ib_write_lat -c UC` and
//! `ib_send_bw -c UC` over all their sizes (`-a`), server on rnic1 and
//! client on rnic0, then at one size both on rnic0; `ib_send_bw -c UD -g`
//! to a multicast group. On the loopback nothing is lost,
//! so no datagram or UC message may be dropped: the daemon's counters
//! must show none (a bandwidth test whose receiver missed one would also
//! wait for it until perftest's own timeout and fail). Then QP1:
//! `bench/scripts/gsi_probe.c` (plain verbs, a UD QP) asks rnic1's QP1
//! five MADs and requires what Linux answers (GetResp with status 0x000C
//! to an unmatched Get, nothing to subnet management or an unmatched
//! Send, a REJ to rnic0's QP1 for a CM REQ nobody listens for), and the
//! daemon's counters must say so.

use std::process::Command;

mod daemon_util;

use daemon_util::pair_on;

/// The daemon's `dataplane stats` text.
fn stats(socket: &std::path::Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_dataplane"))
        .args(["stats", "--socket"])
        .arg(socket)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn main() {
    let tmp = tempfile::tempdir().unwrap();
    let libs = daemon_util::lib_dir(tmp.path());
    let d = daemon_util::start_daemon("unreliable-apps");
    let mut port = 18900;

    // rdma-core's examples, polling and with completion events, payloads
    // up to the path MTU (UD) and past it (UC: three packets a message).
    for (prog, sizes) in [
        ("ibv_ud_pingpong", &["1", "512", "1024"][..]),
        ("ibv_uc_pingpong", &["1", "1024", "3000", "65536"][..]),
    ] {
        for &size in sizes {
            for events in [false, true] {
                let mut a = vec!["-g", "1", "-c", "-n", "50", "-s", size];
                if events {
                    a.push("-e");
                }
                let (srv, cli) = pair_on(&libs, &d.socket, prog, port, ("rnic1", "rnic0"), &a);
                port += 1;
                for t in [&srv, &cli] {
                    assert!(t.contains("50 iters in"), "{t}");
                }
                println!("ok: {prog} {a:?}");
            }
        }
    }
    // A UD payload over the path MTU is refused before anything is sent.
    let out = daemon_util::tool("ibv_ud_pingpong")
        .env("LD_LIBRARY_PATH", &libs)
        .env("RNIC_SOCKET", &d.socket)
        .args([
            "-d",
            "rnic0",
            "-g",
            "1",
            "-s",
            "2048",
            "-p",
            &port.to_string(),
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("larger than port MTU"), "{text}");
    println!("ok: ibv_ud_pingpong -s 2048 refused: {}", text.trim());
    port += 1;

    for (server, client) in [("rnic1", "rnic0"), ("rnic0", "rnic0")] {
        for (prog, kind, table) in [
            ("ib_send_lat", "UD", "t_typical[usec]"),
            ("ib_send_bw", "UD", "BW average[MB/sec]"),
            ("ib_write_lat", "UC", "t_typical[usec]"),
            ("ib_send_bw", "UC", "BW average[MB/sec]"),
        ] {
            // UD is one packet a message: 100 iterations cost little; UC
            // goes to 8 MiB, so a few (as the RC runs do). All sizes
            // (`-a`) from rnic0 to rnic1; within rnic0 one (a sweep costs
            // perftest ~0.45 s a size of its own).
            let n = if kind == "UD" { "100" } else { "5" };
            let size = if kind == "UD" { "1024" } else { "65536" };
            let sweep = server == "rnic1";
            let mut a = vec!["-c", kind, "-x", "1", "-n", n, "-F"];
            if sweep {
                a.push("-a");
            } else {
                a.extend(["-s", size]);
            }
            let (_, cli) = pair_on(&libs, &d.socket, prog, port, (server, client), &a);
            port += 1;
            assert!(cli.contains(table), "{cli}");
            // UD ends at the path MTU, UC at perftest's 8 MiB.
            let last = match (kind, sweep) {
                ("UD", _) => "\n 1024 ",
                ("UC", true) => "\n 8388608 ",
                _ => "\n 65536 ",
            };
            assert!(cli.contains(last), "{cli}");
            println!("ok: {prog} {a:?} {server} <- {client}");
        }
    }

    // Multicast: perftest's `-g` attaches the server's QP to the group
    // `-M` names (an IPv4-mapped multicast GID: our port is RoCEv2 over
    // IPv4) and the client sends to it, DestQP 0xFFFFFF; on rnic0 alone
    // the datagrams come back to the NIC's own RX.
    let mgid = "0:0:0:0:0:0:0:0:0:0:255:255:239:1:1:1";
    for (server, client) in [("rnic1", "rnic0"), ("rnic0", "rnic0")] {
        let a = ["-c", "UD", "-x", "1", "-g", "-M", mgid, "-n", "1000", "-F"];
        let (srv, cli) = pair_on(&libs, &d.socket, "ib_send_bw", port, (server, client), &a);
        port += 1;
        for t in [&srv, &cli] {
            assert!(
                t.contains("MGID: 00:00:00:00:00:00:00:00:00:00:255:255:239:01:01:01"),
                "{t}"
            );
            assert!(t.contains("\n 1024       1000 "), "{t}");
        }
        println!("ok: ib_send_bw {a:?} {server} <- {client}");
    }

    let text = stats(&d.socket);
    print!("{text}");
    assert!(
        !text.contains(" dropped: UC"),
        "the loopback lost nothing, yet the NIC dropped: {text}"
    );
    println!("ok: no datagram or UC message dropped");

    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let probe = tmp.path().join("gsi_probe");
    daemon_util::compile(
        Command::new("cc")
            .args(["-O2", "-std=c11", "-Wall", "-Wextra", "-Werror"])
            .arg(root.join("bench/scripts/gsi_probe.c"))
            .args(["-libverbs", "-o"])
            .arg(&probe),
    );
    let out = daemon_util::run_over_lib(
        Command::new(&probe).args(["-d", "rnic0", "-w", "300", "10.0.0.2"]),
        &libs,
        &d.socket,
    );
    assert!(
        out.contains("gsi_probe: all 5 answered as Linux answers"),
        "{out}"
    );
    let text = stats(&d.socket);
    let qp1 = text
        .lines()
        .find(|l| l.starts_with("host 1 QP1:"))
        .unwrap_or_else(|| panic!("no QP1 line for rnic1: {text}"));
    assert!(
        qp1.contains("MADs received 5 sent 3;")
            && qp1.contains("answered unsupported 2;")
            && qp1.contains("subnet management 1,"),
        "{qp1}"
    );
    println!("ok: rnic1's QP1 answered as Linux: {qp1}");
    // The REQ for a port nobody listens on: rnic1's CM rejected it (to
    // rnic0's QP1, as Linux's does), and rnic0's CM got that REJ.
    let cm_line = |host: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("host {host} CM:")))
            .unwrap_or_else(|| panic!("no CM line for host {host}: {text}"))
            .to_string()
    };
    let (cm1, cm0) = (cm_line("1"), cm_line("0"));
    assert!(
        cm1.contains("REJ sent 1 received 0: stale 0, no listener 1;"),
        "{cm1}"
    );
    assert!(cm0.contains("REJ sent 0 received 1:"), "{cm0}");
    println!("ok: a REQ nobody listens for was rejected: {cm1} / {cm0}");
    drop(d);

    // UD congestion control between our own NICs: under an HPCC++ mode
    // the datagrams from rnic0 to rnic1 sample the path and rnic1 echoes
    // the samples; no datagram may be lost for it.
    let d = daemon_util::start_daemon_with("unreliable-apps-hpcc", "", "cc = \"hpcc\"");
    let a = ["-c", "UD", "-x", "1", "-a", "-n", "100", "-F"];
    let (_, cli) = pair_on(&libs, &d.socket, "ib_send_bw", port, ("rnic1", "rnic0"), &a);
    assert!(cli.contains("\n 1024 "), "{cli}");
    let text = stats(&d.socket);
    let line = |host: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("host {host} UD telemetry:")))
            .unwrap_or_else(|| panic!("no UD telemetry line for host {host}: {text}"))
            .to_string()
    };
    let number_after = |l: &str, key: &str| -> u64 {
        let at = l.find(key).unwrap_or_else(|| panic!("no {key:?} in {l}")) + key.len();
        l[at..]
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no number after {key:?} in {l}"))
    };
    let (l0, l1) = (line("0"), line("1"));
    let (samples, echoed) = (number_after(&l0, "samples "), number_after(&l0, "(echoed "));
    assert!(samples > 0 && echoed > 0 && echoed <= samples, "{l0}");
    assert!(number_after(&l1, "echoes sent ") >= echoed, "{l1}");
    assert!(!text.contains(" dropped: UC"), "{text}");
    println!("ok: ib_send_bw -c UD under hpcc: {l0} / {l1}");
}
