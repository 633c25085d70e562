//! Starts the daemon for the multi-process tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Daemon {
    pub child: Child,
    pub socket: PathBuf,
    pub dir: tempfile::TempDir,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Daemon {
    /// Sends `signal` and waits for the daemon to exit, at most
    /// [`RUN_LIMIT`] (killed past that): its exit status (None: killed)
    /// and what it printed on stdout.
    pub fn stop(
        &mut self,
        signal: nix::sys::signal::Signal,
    ) -> (Option<std::process::ExitStatus>, String) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, signal).expect("signal the daemon");
        let status = testkit::wait_within(&mut self.child, RUN_LIMIT);
        let mut out = String::new();
        if let Some(o) = self.child.stdout.as_mut() {
            // It has exited (or was killed): its stdout is at its end.
            let _ = std::io::Read::read_to_string(o, &mut out);
        }
        (status, out)
    }
}

/// Starts `dataplane --serve` on the loopback testbed (net_ring, no
/// hugepages) with its socket in a fresh directory, and waits until it
/// listens.
pub fn start_daemon(name: &str) -> Daemon {
    start_daemon_with(name, "", "")
}

/// [`start_daemon`] with more EAL arguments (`"--vdev=..."`, quoted and
/// comma-separated) and more keys in its `[service]` section.
pub fn start_daemon_with(name: &str, eal: &str, service: &str) -> Daemon {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("rnic.sock");
    let cfg = dir.path().join("loopback.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"[eal]
args = ["--no-huge", "--no-pci", "--no-telemetry", "-m", "256", "--log-level=lib.eal:warning"{}]
[loopback]
mem_bytes = 4096
mtu = 1024
sizes = []
[service]
socket = "{}"
max_shm_bytes = 67108864
hugepages = false
{}
"#,
            eal,
            socket.display(),
            service
        ),
    )
    .unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_dataplane"))
        .args(["--config"])
        .arg(&cfg)
        .args(["--serve", "--file-prefix"])
        .arg(format!("{name}-{}", std::process::id()))
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the daemon");
    let t0 = Instant::now();
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "daemon did not listen"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Daemon { child, socket, dir }
}

/// A directory holding our libibverbs and librdmacm (built beside the
/// integration tests) under their sonames, for LD_LIBRARY_PATH.
pub fn lib_dir(tmp: &Path) -> PathBuf {
    let deps = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    let dir = tmp.join("ibverbs");
    std::fs::create_dir_all(&dir).unwrap();
    for name in ["libibverbs", "librdmacm"] {
        let lib = deps.join(format!("{name}.so"));
        assert!(lib.exists(), "{} not built", lib.display());
        std::os::unix::fs::symlink(&lib, dir.join(format!("{name}.so.1"))).unwrap();
    }
    dir
}

/// How long a verbs program may run before it is killed and the test
/// fails (a hung program must not hang the suite).
pub const RUN_LIMIT: Duration = testkit::LIMIT;

/// Runs `cmd` over our libibverbs (`libs` first on LD_LIBRARY_PATH) and
/// the daemon at `socket`; prints its output, requires exit 0 within
/// [`RUN_LIMIT`] (killed and failed otherwise), and returns its stdout
/// (for the caller to check: our error-path programs print errors on
/// purpose; [`pair`] reads the verbs tools' failure words).
pub fn run_over_lib(cmd: &mut Command, libs: &Path, socket: &Path) -> String {
    let f = testkit::output_within(
        cmd.env("LD_LIBRARY_PATH", libs).env("RNIC_SOCKET", socket),
        RUN_LIMIT,
    )
    .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    print!("{}", f.stdout);
    eprint!("{}", f.stderr);
    f.assert_success();
    f.stdout
}

/// An unmodified verbs binary of Debian's (ibverbs-utils, perftest), or
/// one at a path (with a `/`).
pub fn tool(name: &str) -> Command {
    let path = if name.contains('/') {
        PathBuf::from(name)
    } else {
        Path::new("/usr/bin").join(name)
    };
    assert!(
        path.exists(),
        "{} is missing: apt-get install -y ibverbs-utils perftest (./x test installs them)",
        path.display()
    );
    Command::new(path)
}

/// Builds `rc_verify` (bench/scripts/rc_verify.c: SEND, WRITE with
/// immediate, READ and FETCH_ADD with every byte checked) into `dir`
/// against Debian's libibverbs; with `wrong_byte` non-zero, a sender that
/// XORs the middle byte of each message with it (to show the check fails).
pub fn rc_verify(dir: &Path, wrong_byte: u8) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../bench/scripts/rc_verify.c");
    let exe = dir.join(format!("rc_verify-{wrong_byte}"));
    compile(
        Command::new("cc")
            .args(["-O2", "-std=c11", "-Wall", "-Wextra", "-Werror"])
            .arg(format!("-DRC_VERIFY_WRONG_BYTE={wrong_byte}"))
            .arg(&src)
            .args(["-libverbs", "-o"])
            .arg(&exe),
    );
    exe
}

/// Runs a compiler (or build) command, at most [`RUN_LIMIT`]; panics with
/// its output unless it succeeded.
pub fn compile(cmd: &mut Command) {
    testkit::output_within(cmd, RUN_LIMIT)
        .unwrap_or_else(|e| panic!("{cmd:?}: {e} (apt-get install gcc libibverbs-dev)"))
        .assert_success();
}

/// Waits until some process listens on TCP `port` of localhost (read
/// from /proc/net/tcp, so that no connection is made to the server).
pub fn wait_listening(port: u16) {
    let want = format!(":{port:04X} ");
    let t0 = std::time::Instant::now();
    loop {
        let tcp = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
        // State 0A is LISTEN.
        if tcp.lines().any(|l| {
            l.split_whitespace()
                .nth(1)
                .is_some_and(|a| format!("{a} ").ends_with(&want))
                && l.split_whitespace().nth(3) == Some("0A")
        }) {
            return;
        }
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(60),
            "no server listens on port {port}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// [`pair`] with the same `args` on both sides, the server on device
/// `server` and the client on device `client` (`-d`).
pub fn pair_on(
    libs: &Path,
    socket: &Path,
    prog: &str,
    port: u16,
    (server, client): (&str, &str),
    args: &[&str],
) -> (String, String) {
    pair(
        libs,
        socket,
        prog,
        port,
        &[&["-d", server], args].concat(),
        &[&["-d", client], args].concat(),
    )
}

/// Runs `server_args` as the server and `client_args` + localhost as the
/// client of one verbs program; both must exit 0 within [`RUN_LIMIT`] and
/// print no failure words (`ibv_rc_pingpong -c` prints `invalid data in
/// page N` and exits 0). Returns their outputs.
pub fn pair(
    libs: &Path,
    socket: &Path,
    prog: &str,
    port: u16,
    server_args: &[&str],
    client_args: &[&str],
) -> (String, String) {
    let env = |c: &mut Command| {
        c.env("LD_LIBRARY_PATH", libs).env("RNIC_SOCKET", socket);
    };
    let t0 = Instant::now();
    let mut s = tool(prog);
    env(&mut s);
    let mut server = testkit::Running::spawn(s.args(server_args).args(["-p", &port.to_string()]))
        .unwrap_or_else(|e| panic!("{prog}: {e}"));
    wait_listening(port);
    let mut c = tool(prog);
    env(&mut c);
    let client = testkit::output_within(
        c.args(client_args)
            .args(["-p", &port.to_string(), "localhost"]),
        RUN_LIMIT,
    )
    .unwrap_or_else(|e| panic!("{prog}: {e}"));
    let server = server.finish(RUN_LIMIT);
    let (st, ct) = (server.text(), client.text());
    println!(
        "--- {prog} server {server_args:?}\n{st}--- {prog} client {client_args:?} ({:.1} s)\n{ct}",
        t0.elapsed().as_secs_f64()
    );
    server.assert_success();
    client.assert_success();
    testkit::require_clean(&server.what, &st);
    testkit::require_clean(&client.what, &ct);
    (st, ct)
}

/// `objdump -T` lines `VERSION NAME` of a library's defined symbols whose
/// version node starts with `node` (`IBVERBS`, `RDMACM`), node names
/// themselves left out; sorted.
pub fn versioned_symbols(node: &str, lib: &Path) -> Vec<(String, String)> {
    let out = Command::new("objdump")
        .arg("-T")
        .arg(lib)
        .output()
        .expect("run objdump (binutils)");
    assert!(out.status.success());
    let mut v: Vec<(String, String)> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.contains("*UND*"))
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (ver, name) = (f.get(f.len().wrapping_sub(2))?, f.last()?);
            (ver.starts_with(node) && !name.starts_with(node))
                .then(|| (ver.to_string(), name.to_string()))
        })
        .collect();
    v.sort();
    v
}
