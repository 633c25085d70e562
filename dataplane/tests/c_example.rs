//! The C examples (`transport/ibverbs/examples/c/`: WRITE and READ with
//! per-QP congestion control from `rnicdv.h`; a SEND/RECV ping-pong between
//! two processes, one sleeping on a completion channel; a counter shared by
//! two processes over FETCH_ADD; forks after registering heap memory with
//! both processes busy in malloc; a completion channel armed for
//! solicited events only) compile against `<infiniband/verbs.h>`
//! with -Wall -Werror and run over our libibverbs.so.1 and the daemon on
//! the loopback testbed. The ping-pong and the counter link Debian's
//! `-libverbs` and get ours from LD_LIBRARY_PATH (the drop-in); write_read
//! links ours, which has the rnicdv calls.

use std::path::PathBuf;
use std::process::Command;

mod daemon_util;

fn main() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let d = daemon_util::start_daemon("c-example");
    let libs = daemon_util::lib_dir(d.dir.path());
    let run = |name: &str, ours: bool| -> String {
        let exe = d.dir.path().join(name);
        let mut cc = Command::new("cc");
        cc.args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-I"])
            .arg(root.join("transport/ibverbs/include"))
            .arg(root.join(format!("transport/ibverbs/examples/c/{name}.c")));
        if ours {
            cc.arg("-L").arg(&libs).arg("-l:libibverbs.so.1");
        } else {
            cc.arg("-libverbs");
        }
        daemon_util::compile(cc.arg("-o").arg(&exe));
        daemon_util::run_over_lib(&mut Command::new(&exe), &libs, &d.socket)
    };
    let text = run("write_read", true);
    assert!(text.contains("ok: 65536 B WRITE"), "{text}");
    assert!(text.contains("opcode 99 -> EINVAL"), "{text}");
    assert!(text.contains("cc hpcc, window"), "{text}");
    let text = run("sendrecv", false);
    assert!(
        text.contains("ok: SEND/RECV ping-pong between two processes"),
        "{text}"
    );
    assert!(
        text.contains("client: 4096 B SEND/RECV round trip"),
        "{text}"
    );
    let text = run("counter", false);
    assert!(
        text.contains("ok: counter = 1000 after 1000 FETCH_ADDs from 2 processes"),
        "{text}"
    );
    let text = run("fork_heap", false);
    assert!(
        text.contains("ok: 40 forks after registering heap memory"),
        "{text}"
    );
    let text = run("solicited", false);
    assert!(
        text.contains("ok: solicited-only arming woke for the solicited SEND only"),
        "{text}"
    );
    println!("ok: the C examples build and run");
}
