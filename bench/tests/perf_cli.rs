//! The perftest-style benchmarks end to end, against a daemon on the
//! loopback testbed (net_ring, --no-huge): every test's table and JSON, -a,
//! -q, the client/server mode across processes, --compare's ratio lines,
//! and bad flags refused by name. Numbers are not checked (timings belong
//! in benchmarks), only that they exist and are sane.

use std::path::{Path, PathBuf};

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};
use testkit::OutputWithin;

fn target_bin(name: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_BIN_EXE_bench")).with_file_name(name);
    assert!(
        p.exists(),
        "{} is not built (cargo test --workspace builds it; or cargo build -p dataplane)",
        p.display()
    );
    p
}

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn daemon(dir: &Path) -> (Daemon, PathBuf) {
    let sock = dir.join("rnic.sock");
    let cfg = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../configs/loopback.toml");
    let child = Command::new(target_bin("dataplane"))
        .arg("--config")
        .arg(&cfg)
        .arg("--serve")
        .arg("--socket")
        .arg(&sock)
        .arg("--file-prefix")
        .arg(format!("perf-cli-{}", std::process::id()))
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while std::os::unix::net::UnixStream::connect(&sock).is_err() {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "daemon did not listen"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    (Daemon(child), sock)
}

fn bench(args: &[&str], sock: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_bench"))
        .args(args)
        .arg("--socket")
        .arg(sock)
        .output_within(testkit::LIMIT)
}

fn ok(out: &Output) -> String {
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// The numbers of the result row for `bytes`.
fn row(text: &str, bytes: u32) -> Vec<f64> {
    text.lines()
        .map(str::split_whitespace)
        .map(|w| w.map(|x| x.parse::<f64>()).collect::<Result<Vec<f64>, _>>())
        .filter_map(Result::ok)
        .find(|v| v.first() == Some(&f64::from(bytes)) && v.len() >= 5)
        .unwrap_or_else(|| panic!("no row for {bytes} B in:\n{text}"))
}

/// One daemon for all runs, one run at a time (the machine has two cores).
#[test]
fn perftest_style_runs() {
    let dir = tempfile::tempdir().unwrap();
    let (_d, sock) = daemon(dir.path());
    every_test_on_the_loopback(dir.path(), &sock);
    client_and_server_in_two_processes(&sock);
}

fn every_test_on_the_loopback(dir: &Path, sock: &Path) {
    // write-lat: settings, connection, the latency columns, JSON.
    let json = dir.join("w.json");
    let t = ok(&bench(
        &[
            "write-lat",
            "--loopback",
            "-s",
            "64",
            "-n",
            "300",
            "-H",
            "--out_json",
            json.to_str().unwrap(),
        ],
        sock,
    ));
    for want in [
        "RDMA_Write Latency Test",
        "Port backend    : net_ring",
        "CC mode         : none",
        "local address: IP 10.0.0.1 QPN",
        "remote address: IP 10.0.0.2 QPN",
        "t_typical[usec]",
        "99.9% percentile[usec]",
        "histogram of 64 B",
    ] {
        assert!(t.contains(want), "missing {want:?} in:\n{t}");
    }
    let r = row(&t, 64);
    assert_eq!(r[1], 300.0);
    let (min, max, typical) = (r[2], r[3], r[4]);
    assert!(min > 0.0 && min <= typical && typical <= max, "{r:?}");
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(j["test"], "write-lat");
    assert_eq!(j["results"][0]["iterations"], 300);

    // read-lat over every size 2 B .. 8 MiB.
    let t = ok(&bench(&["read-lat", "--loopback", "-a", "-n", "3"], sock));
    for k in 1..=23 {
        row(&t, 1 << k);
    }

    // write-bw with two QPs, Gb/s.
    let t = ok(&bench(
        &[
            "write-bw",
            "--loopback",
            "-s",
            "4096",
            "-n",
            "3000",
            "-q",
            "2",
            "--report_gbits",
        ],
        sock,
    ));
    assert!(
        t.contains("BW average[Gb/sec]") && t.contains("Number of qps   : 2"),
        "{t}"
    );
    let r = row(&t, 4096);
    assert!(
        r[1] == 3000.0 && r[3] > 0.0 && r[2] >= r[3] * 0.999,
        "{r:?}"
    );

    // Small messages in batches keep the send ring full: the posting side
    // must see the room the daemon frees.
    let t = ok(&bench(
        &["write-bw", "--loopback", "-s", "64", "-n", "20000"],
        sock,
    ));
    assert_eq!(row(&t, 64)[1], 20000.0);

    // read-bw with 4 READs outstanding, for a duration.
    let t = ok(&bench(
        &[
            "read-bw",
            "--loopback",
            "-s",
            "65536",
            "-o",
            "4",
            "-D",
            "0.5",
        ],
        sock,
    ));
    assert!(t.contains("Outstand reads  : 4"), "{t}");
    assert!(row(&t, 65536)[1] > 0.0);

    // --compare prints its ratio lines and the median of ours alone.
    let t = ok(&bench(
        &[
            "read-lat",
            "--loopback",
            "-s",
            "64",
            "-n",
            "50",
            "--compare",
        ],
        sock,
    ));
    assert_summary_lines(
        &t,
        &[
            "ratio ours/dpdk-echo",
            "ratio ours/udp",
            "ratio floors/dpdk-echo",
            "ratio ours/floors",
            "ours rtt",
        ],
    );
    // A bandwidth test's --compare adds the forwarding packet rate and the
    // per-byte floor.
    let t = ok(&bench(
        &[
            "write-bw",
            "--loopback",
            "-s",
            "4096",
            "-n",
            "1000",
            "--compare",
        ],
        sock,
    ));
    assert_summary_lines(
        &t,
        &[
            "ratio ours/dpdk-fwd",
            "ratio ours/dpdk-fwd-pps",
            "ratio ours/byte-floor",
            "ratio ours/udp",
            "ours msg rate",
        ],
    );

    // --breakdown: every stage of every traced trip is found in the
    // daemon's trace (both directions for WRITE), and each one-way total
    // is no less than its first stage.
    for (test, trips, stages) in [("write-lat", 200.0, 13), ("read-lat", 100.0, 12)] {
        let t = ok(&bench(
            &[test, "--loopback", "-s", "64", "-n", "100", "--breakdown"],
            sock,
        ));
        let rows: Vec<Vec<&str>> = t
            .lines()
            .skip_while(|l| !l.starts_with(" stage "))
            .skip(1)
            .take_while(|l| !l.starts_with(" traced run"))
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(rows.len(), stages, "{t}");
        let num = |r: &Vec<&str>, back: usize| -> f64 { r[r.len() - back].parse().unwrap() };
        for r in &rows {
            assert_eq!(num(r, 1), trips, "every trip traced: {r:?}");
        }
        let (first, total) = (
            &rows[0],
            rows.iter().find(|r| r[0] == "one" || r[0] == "round"),
        );
        let total = total.unwrap_or_else(|| panic!("no total row in:\n{t}"));
        assert!(num(total, 3) >= num(first, 3), "{first:?} {total:?}");
    }
}

fn client_and_server_in_two_processes(sock: &Path) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    for test in ["write-lat", "read-bw"] {
        let mut server = testkit::Running::spawn(
            Command::new(env!("CARGO_BIN_EXE_bench"))
                .args([test, "-s", "1024", "-n", "200", "-p", &port, "--socket"])
                .arg(sock),
        )
        .unwrap();
        let client = bench(
            &[test, "127.0.0.1", "-s", "1024", "-n", "200", "-p", &port],
            sock,
        );
        let t = ok(&client);
        assert!(t.contains("Mode            : client"), "{t}");
        assert_eq!(row(&t, 1024)[1], 200.0);
        let s = server.finish(testkit::LIMIT);
        assert!(s.success(), "{}", s.text());
        let s = s.stdout;
        assert!(s.contains("Mode            : server"), "{s}");
    }
}

#[test]
fn bad_flags_are_refused_by_name() {
    let sock = Path::new("/nonexistent/rnic.sock");
    for (args, says) in [
        (vec!["write-lat", "--loopback", "-q", "0"], "-q 0"),
        (vec!["write-lat", "--compare"], "--compare needs --loopback"),
        (
            vec!["write-bw", "--loopback", "--breakdown"],
            "--breakdown traces",
        ),
        (vec!["read-lat", "--breakdown"], "--breakdown traces"),
        (vec!["write-lat", "--loopback", "-s", "0"], "-s 0"),
        (vec!["write-bw", "--loopback", "-m", "1000"], "-m 1000"),
        (
            vec!["read-lat", "127.0.0.1", "--loopback"],
            "no server address",
        ),
    ] {
        let out = bench(&args, sock);
        assert!(!out.status.success(), "{args:?} accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    }
    let out = bench(&["write-lat", "127.0.0.1", "-p", "1"], sock);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("/nonexistent/rnic.sock"),
        "{err}"
    );
}

/// Every named `NAME median=...` summary line (a `ratio ...` or one of
/// ours alone) is printed, over 10 rounds, with a positive median.
fn assert_summary_lines(t: &str, names: &[&str]) {
    for name in names {
        let line = t
            .lines()
            .find(|l| l.starts_with(&format!("{name} median=")))
            .unwrap_or_else(|| panic!("no {name} line in:\n{t}"));
        assert!(line.ends_with("rounds=10"), "{line}");
        let median: f64 = line[name.len() + " median=".len()..]
            .split_whitespace()
            .next()
            .and_then(|m| m.parse().ok())
            .unwrap_or_else(|| panic!("no median in {line}"));
        assert!(median > 0.0, "{line}");
    }
}
