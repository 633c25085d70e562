//! The Rust examples of the verbs API (`transport/verbs/examples/`) run as
//! separate processes against the daemon on the loopback testbed: the
//! SEND/RECV ping-pong (server and client) and the FETCH_ADD counter (a
//! server and two clients adding concurrently).

use std::path::PathBuf;
use std::process::Command;

use testkit::Running;

mod daemon_util;

/// The example binary, built beside this test (`cargo test --workspace`
/// builds every package's examples; otherwise they are built here).
fn example(name: &str) -> PathBuf {
    let deps = std::env::current_exe().unwrap();
    let dir = deps.parent().unwrap().parent().unwrap().join("examples");
    let exe = dir.join(name);
    if !exe.exists() {
        daemon_util::compile(
            Command::new(env!("CARGO"))
                .args(["build", "-q", "-p", "verbs", "--example", name])
                .current_dir(env!("CARGO_MANIFEST_DIR")),
        );
    }
    assert!(exe.exists(), "{} not built", exe.display());
    exe
}

fn spawn(exe: &PathBuf, socket: &PathBuf, args: &[&str]) -> Running {
    Running::spawn(Command::new(exe).arg("--socket").arg(socket).args(args))
        .expect("start the example")
}

/// Waits for an example (at most `RUN_LIMIT`); its stdout.
fn finish(mut c: Running, what: &str) -> String {
    let f = c.finish(daemon_util::RUN_LIMIT);
    print!("{}", f.stdout);
    eprint!("{}", f.stderr);
    assert!(f.success(), "{what} failed: {:?}", f.status);
    f.stdout
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn main() {
    let d = daemon_util::start_daemon("rust-examples");

    let exe = example("sendrecv");
    let addr = format!("127.0.0.1:{}", free_port());
    let server = spawn(&exe, &d.socket, &["--device", "rnic1", "--listen", &addr]);
    let client = spawn(&exe, &d.socket, &["--device", "rnic0", "--connect", &addr]);
    let c = finish(client, "sendrecv client");
    let s = finish(server, "sendrecv server");
    assert_eq!(c.matches("bytes and immediate verified").count(), 6, "{c}");
    assert_eq!(s.matches("received with imm").count(), 6, "{s}");
    println!("ok: the SEND/RECV ping-pong example runs between two processes");

    let exe = example("counter");
    let addr = format!("127.0.0.1:{}", free_port());
    let server = spawn(
        &exe,
        &d.socket,
        &["--device", "rnic1", "--listen", &addr, "--clients", "2"],
    );
    let args = ["--device", "rnic0", "--connect", &addr, "--adds", "400"];
    let clients = [spawn(&exe, &d.socket, &args), spawn(&exe, &d.socket, &args)];
    for c in clients {
        let t = finish(c, "counter client");
        assert!(t.contains("400 FETCH_ADDs"), "{t}");
    }
    let s = finish(server, "counter server");
    assert!(
        s.contains("counter = 800 after 800 FETCH_ADDs from 2 clients"),
        "{s}"
    );
    println!("ok: the FETCH_ADD counter example runs with two client processes");
}
