//! Unmodified rdma_cm binaries from Debian over our librdmacm.so.1 and
//! libibverbs.so.1 and the daemon on the loopback testbed (rnic0 10.0.0.1,
//! rnic1 10.0.0.2): the library exports every function of Debian's
//! librdmacm.so.1 in its version node; with no daemon rping says there is
//! no device; then, server on rnic1 and client on rnic0 (the address picks
//! the device, as with the kernel's rdma_cm): `rping -V` (data verified,
//! every ping printed), `ucmatose`, `udaddy` (UD over SIDR),
//! `rdma_server`/`rdma_client` (the synchronous API),
//! `rdma_xserver`/`rdma_xclient -c r`, `mckey` (UD multicast over
//! rdma_cm joins, the sender a full member, then send-only), perftest's
//! `ib_write_lat`,
//! `ib_read_lat` and `ib_send_bw` with `-R` (and `ib_send_bw -R -c UD`),
//! `qperf -cm1 rc_lat` and libfabric's `fi_pingpong -p verbs -e msg`;
//! each program's output read for its own words of success and failure.
//! qperf and fi_pingpong exchange addresses over TCP first: those two run
//! in a network namespace whose veth pair holds 10.0.0.1 and 10.0.0.2.
//! Last, an `rping -s` killed with SIGKILL while it listens leaves no
//! session or id in the daemon, and its port serves the next server.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

mod daemon_util;

use daemon_util::{tool, RUN_LIMIT};

/// A network namespace with a veth pair holding the testbed's two
/// addresses, for the programs that talk TCP before rdma_cm; removed on
/// drop.
struct Netns(String);

impl Netns {
    fn new() -> Netns {
        let name = format!("rnic-cm-{}", std::process::id());
        let ip = |args: &[&str]| {
            let out = Command::new("ip").args(args).output().expect("run ip");
            assert!(
                out.status.success(),
                "ip {args:?}: {} (this test needs root for a network namespace)",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        ip(&["netns", "add", &name]);
        let ns = Netns(name.clone());
        let inside = |args: &[&str]| ip(&[&["netns", "exec", &name, "ip"], args].concat());
        inside(&["link", "set", "lo", "up"]);
        inside(&["link", "add", "rv0", "type", "veth", "peer", "name", "rv1"]);
        inside(&["addr", "add", "10.0.0.1/24", "dev", "rv0"]);
        inside(&["addr", "add", "10.0.0.2/24", "dev", "rv1"]);
        inside(&["link", "set", "rv0", "up"]);
        inside(&["link", "set", "rv1", "up"]);
        ns
    }

    /// `prog` run inside the namespace.
    fn tool(&self, prog: &str) -> Command {
        let path = tool(prog).get_program().to_owned();
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.0]).arg(path);
        c
    }

    /// Waits until a TCP server listens on `port` in the namespace.
    fn wait_listening(&self, port: u16) {
        let want = format!(":{port:04X} ");
        let t0 = Instant::now();
        loop {
            // qperf listens on IPv6 (tcp6), fi_pingpong on IPv4.
            let out = Command::new("ip")
                .args([
                    "netns",
                    "exec",
                    &self.0,
                    "cat",
                    "/proc/net/tcp",
                    "/proc/net/tcp6",
                ])
                .output()
                .unwrap();
            let tcp = String::from_utf8_lossy(&out.stdout);
            if tcp.lines().any(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() > 3 && format!("{} ", f[1]).ends_with(&want) && f[3] == "0A"
            }) {
                return;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "nothing listens on {port}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// The daemon's rdma_cm ids (all devices), from its counters.
fn cm_ids(socket: &Path) -> u64 {
    let snap = dataplane::service::query_stats(socket).expect("stats");
    snap.ports.iter().map(|p| p.rdma_cm.ids).sum()
}

/// The daemon's rdma_cm sessions (all devices).
fn cm_sessions(socket: &Path) -> u64 {
    let snap = dataplane::service::query_stats(socket).expect("stats");
    snap.ports.iter().map(|p| p.rdma_cm.sessions).sum()
}

/// How a server shows it is ready for its client.
enum Ready {
    /// It listens with rdma_cm: the daemon has more ids than before.
    Listener(u64),
    /// It listens on this TCP port in the namespace.
    Tcp(u16),
}

struct Run<'a> {
    libs: &'a Path,
    socket: &'a Path,
}

impl Run<'_> {
    fn env<'c>(&self, c: &'c mut Command) -> &'c mut Command {
        c.env("LD_LIBRARY_PATH", self.libs)
            .env("RNIC_SOCKET", self.socket)
    }

    /// Runs `server`, then, once it is ready, `client`; both must exit 0
    /// (a server that runs until stopped, `kill_server`, is killed after
    /// the client) and print no failure words. Their outputs.
    fn pair(
        &self,
        ns: &Netns,
        server: &[&str],
        client: &[&str],
        ready: Ready,
        kill_server: bool,
    ) -> (String, String) {
        let t0 = Instant::now();
        let mut s = ns.tool(server[0]);
        let mut srv = testkit::Running::spawn(self.env(s.args(&server[1..])))
            .unwrap_or_else(|e| panic!("{server:?}: {e}"));
        match ready {
            Ready::Tcp(port) => ns.wait_listening(port),
            Ready::Listener(before) => {
                while cm_ids(self.socket) <= before {
                    assert!(
                        t0.elapsed() < Duration::from_secs(60),
                        "{server:?} never listened"
                    );
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
        let mut c = ns.tool(client[0]);
        let cli = testkit::output_within(self.env(c.args(&client[1..])), RUN_LIMIT)
            .unwrap_or_else(|e| panic!("{client:?}: {e}"));
        if kill_server {
            srv.kill();
        }
        let srv = srv.finish(RUN_LIMIT);
        let (st, ct) = (srv.text(), cli.text());
        println!(
            "--- {server:?}\n{st}--- {client:?} ({:.1} s)\n{ct}",
            t0.elapsed().as_secs_f64()
        );
        if !kill_server {
            srv.assert_success();
        }
        cli.assert_success();
        testkit::require_clean(&srv.what, &st);
        testkit::require_clean(&cli.what, &ct);
        (st, ct)
    }
}

/// The group mckey's runs join.
const GROUP: &str = "239.1.2.3";

impl Run<'_> {
    /// mckey: a receiver on rnic1 joins [`GROUP`] and waits for 10
    /// datagrams; once it says it joined (its QP is attached: it has no
    /// listener to wait for, and a datagram sent before would be lost), a
    /// sender on rnic0 joins (`sender_flags`: `-o` for send-only) and, 3 s
    /// later, sends them to the group. Both must exit 0 and say they are
    /// done. Their outputs.
    ///
    /// The sender destroys its QP right after posting its sends, without
    /// waiting for them: the daemon takes what the ring holds before it
    /// destroys a QP, so none may be lost.
    fn mckey(&self, sender_flags: &[&str]) -> (String, String) {
        let t0 = Instant::now();
        let mckey = tool("mckey").get_program().to_owned();
        // mckey's stdout is a pipe: line-buffered, to see it join.
        let mut r = Command::new("stdbuf");
        r.arg("-oL")
            .arg(&mckey)
            .args(["-m", GROUP, "-b", "10.0.0.2", "-C", "10"]);
        let mut rcv = testkit::Running::spawn(self.env(&mut r)).unwrap();
        if rcv
            .line_starting("mckey: joined dgid:", Duration::from_secs(60))
            .is_none()
        {
            panic!(
                "the receiver never joined: {}",
                rcv.finish(RUN_LIMIT).text()
            );
        }
        let mut s = Command::new(&mckey);
        s.args(["-m", GROUP, "-b", "10.0.0.1", "-s", "-C", "10"])
            .args(sender_flags);
        let snd = testkit::output_within(self.env(&mut s), RUN_LIMIT)
            .unwrap_or_else(|e| panic!("{s:?}: {e}"));
        let sent = snd.text();
        println!("--- {s:?}\n{sent}");
        snd.assert_success();
        testkit::require_clean(&snd.what, &sent);
        let rcv = rcv.finish(RUN_LIMIT);
        let got = rcv.text();
        println!(
            "--- {:?} ({:.1} s)\n{got}",
            rcv.what,
            t0.elapsed().as_secs_f64()
        );
        rcv.assert_success();
        testkit::require_clean(&rcv.what, &got);
        (got, sent)
    }
}

fn main() {
    let tmp = tempfile::tempdir().unwrap();
    let libs = daemon_util::lib_dir(tmp.path());

    // Every function of Debian's librdmacm, in the same version node.
    let ours = daemon_util::versioned_symbols("RDMACM", &libs.join("librdmacm.so.1"));
    let theirs = daemon_util::versioned_symbols(
        "RDMACM",
        Path::new("/usr/lib/x86_64-linux-gnu/librdmacm.so.1"),
    );
    assert_eq!(theirs.len(), 68, "Debian's librdmacm: {theirs:?}");
    let missing: Vec<_> = theirs.iter().filter(|s| !ours.contains(s)).collect();
    assert!(missing.is_empty(), "not exported as Debian's: {missing:?}");
    println!("ok: {} functions in their version nodes", theirs.len());

    // No daemon: rping finds no device and says so.
    let out = tool("rping")
        .args(["-s", "-a", "10.0.0.2", "-C", "1"])
        .env("LD_LIBRARY_PATH", &libs)
        .env("RNIC_SOCKET", tmp.path().join("nobody.sock"))
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("No RDMA devices were detected"), "{text}");
    println!("ok: no daemon -> {}", text.trim());

    let d = daemon_util::start_daemon("rdmacm-apps");
    let sock = d.socket.as_path();
    let ns = Netns::new();
    let run = Run {
        libs: &libs,
        socket: sock,
    };
    let listener = || Ready::Listener(cm_ids(sock));

    // rping: 20 pings of 64 B, each verified by both sides (-V) and
    // printed (-v).
    let (st, ct) = run.pair(
        &ns,
        &[
            "rping", "-s", "-a", "10.0.0.2", "-p", "7174", "-C", "20", "-S", "64", "-V", "-v",
        ],
        &[
            "rping", "-c", "-a", "10.0.0.2", "-p", "7174", "-C", "20", "-S", "64", "-V", "-v",
        ],
        listener(),
        false,
    );
    assert_eq!(ct.matches("ping data: rdma-ping-").count(), 20, "{ct}");
    assert_eq!(
        st.matches("server ping data: rdma-ping-").count(),
        20,
        "{st}"
    );
    println!("ok: rping -V, 20 pings verified");

    for (prog, server, client) in [
        (
            "ucmatose",
            vec!["-b", "10.0.0.2", "-p", "7471", "-c", "2", "-C", "20"],
            vec!["-s", "10.0.0.2", "-p", "7471", "-c", "2", "-C", "20"],
        ),
        (
            "udaddy",
            vec!["-b", "10.0.0.2", "-c", "2", "-C", "20"],
            vec!["-s", "10.0.0.2", "-c", "2", "-C", "20"],
        ),
    ] {
        let (st, ct) = run.pair(
            &ns,
            &[&[prog], &server[..]].concat(),
            &[&[prog], &client[..]].concat(),
            listener(),
            false,
        );
        for out in [&st, &ct] {
            assert!(
                out.contains("test complete") && out.contains("return status 0"),
                "{out}"
            );
        }
        println!("ok: {prog}");
    }

    let (st, ct) = run.pair(
        &ns,
        &["rdma_server", "-s", "10.0.0.2", "-p", "7472"],
        &["rdma_client", "-s", "10.0.0.2", "-p", "7472"],
        listener(),
        false,
    );
    assert!(st.contains("rdma_server: end 0"), "{st}");
    assert!(ct.contains("rdma_client: end 0"), "{ct}");
    println!("ok: rdma_server / rdma_client");
    let (st, ct) = run.pair(
        &ns,
        &["rdma_xserver", "-c", "r", "-p", "7473"],
        &["rdma_xclient", "-c", "r", "-s", "10.0.0.2", "-p", "7473"],
        listener(),
        false,
    );
    assert!(st.contains("rdma_xserver: end 0"), "{st}");
    assert!(ct.contains("rdma_xclient: end 0"), "{ct}");
    println!("ok: rdma_xserver / rdma_xclient -c r");

    // mckey: multicast joins; the sender a full member, then send-only.
    for flags in [&[][..], &["-o"][..]] {
        let (rt, st) = run.mckey(flags);
        let joined = format!("mckey: joined dgid: ::ffff:{GROUP} mlid 0x0 sl 0");
        for out in [&rt, &st] {
            assert!(out.contains(&joined), "{out}");
            assert!(
                out.contains("data transfers complete")
                    && out.contains("test complete")
                    && out.contains("return status 0"),
                "{out}"
            );
        }
        assert!(rt.contains("receiving data transfers"), "{rt}");
        assert!(st.contains("initiating data transfers"), "{st}");
        println!("ok: mckey {flags:?}, 10 datagrams to {GROUP}");
    }

    // perftest over rdma_cm (-R), server on rnic1, client on rnic0.
    for (i, (prog, extra, table)) in [
        ("ib_write_lat", &["-s", "64"][..], "t_typical[usec]"),
        ("ib_read_lat", &["-s", "4096"][..], "t_typical[usec]"),
        ("ib_send_bw", &["-s", "65536"][..], "BW average[MB/sec]"),
        (
            "ib_send_bw",
            &["-c", "UD", "-s", "1024"][..],
            "BW average[MB/sec]",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let port = (18600 + i).to_string();
        let common = [&["-R", "-n", "200", "-F", "-p", &port], extra].concat();
        let (_, ct) = run.pair(
            &ns,
            &[&[prog, "-d", "rnic1"], &common[..]].concat(),
            &[&[prog, "-d", "rnic0"], &common[..], &["10.0.0.2"]].concat(),
            listener(),
            false,
        );
        assert!(ct.contains(table), "{ct}");
        assert!(ct.contains("rdma_cm QPs\t : ON"), "{ct}");
        println!("ok: {prog} -R {extra:?}");
    }

    // qperf: its server runs until stopped; the client's -cm1 connects the
    // test's QPs with rdma_cm.
    // qperf's own TCP synchronisation after a test sometimes times out
    // (about one run in four here, with no retransmission, timeout or
    // RNR NAK in the daemon's counters: not understood yet, see
    // docs/rdmacm.md); such a run is tried again, at most twice, and
    // says so.
    let mut tries = 0;
    loop {
        tries += 1;
        let mut s = ns.tool("qperf");
        let mut srv = testkit::Running::spawn(run.env(s.args(["-lp", "19765"]))).unwrap();
        ns.wait_listening(19765);
        let mut c = ns.tool("qperf");
        let cli = testkit::output_within(
            run.env(c.args(["-lp", "19765", "-cm1", "-t", "1", "10.0.0.2", "rc_lat"])),
            RUN_LIMIT,
        )
        .unwrap();
        srv.kill();
        let ct = cli.text();
        println!("--- qperf -cm1 rc_lat (try {tries})\n{ct}");
        if cli.success() && ct.contains("latency  =") {
            testkit::require_clean(&cli.what, &ct);
            break;
        }
        assert!(
            tries < 3 && ct.contains(": timed out"),
            "qperf -cm1 rc_lat failed: {ct}"
        );
        println!("note: qperf timed out waiting for its peer over TCP; once more");
    }
    println!("ok: qperf -cm1 rc_lat");

    // libfabric's verbs provider (its MSG endpoints are rdma_cm ids).
    let (_, ct) = run.pair(
        &ns,
        &[
            "fi_pingpong",
            "-p",
            "verbs",
            "-e",
            "msg",
            "-I",
            "50",
            "-c",
            "-B",
            "47600",
        ],
        &[
            "fi_pingpong",
            "-p",
            "verbs",
            "-e",
            "msg",
            "-I",
            "50",
            "-c",
            "-P",
            "47600",
            "10.0.0.2",
        ],
        Ready::Tcp(47600),
        false,
    );
    assert!(ct.contains("usec/xfer") && ct.contains("\n1m "), "{ct}");
    println!("ok: fi_pingpong -p verbs -e msg");

    // A listening server killed: nothing of it stays in the daemon, and
    // its port takes the next server.
    let before = cm_ids(sock);
    let mut s = ns.tool("rping");
    let mut killed =
        testkit::Running::spawn(run.env(s.args(["-s", "-a", "10.0.0.2", "-p", "7175"]))).unwrap();
    let t0 = Instant::now();
    while cm_ids(sock) <= before {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "rping -s never listened"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    killed.kill();
    let _ = killed.finish(RUN_LIMIT);
    while cm_sessions(sock) + cm_ids(sock) > 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the killed server's ids stay"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (_, ct) = run.pair(
        &ns,
        &[
            "rping", "-s", "-a", "10.0.0.2", "-p", "7175", "-C", "2", "-V",
        ],
        &[
            "rping", "-c", "-a", "10.0.0.2", "-p", "7175", "-C", "2", "-V", "-v",
        ],
        Ready::Listener(0),
        false,
    );
    assert_eq!(ct.matches("ping data: rdma-ping-").count(), 2, "{ct}");
    println!("ok: a killed rping -s leaves nothing behind; its port serves again");
}
