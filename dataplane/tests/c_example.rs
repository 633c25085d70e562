//! The C examples (`transport/verbs/examples/c/`: WRITE and READ; a
//! SEND/RECV ping-pong between two processes; a counter shared by two
//! processes over FETCH_ADD) compile against `rnic_verbs.h` and
//! `libverbs.so` with -Wall -Werror, and run against the daemon on the
//! loopback testbed.

use std::path::PathBuf;
use std::process::Command;

mod daemon_util;

fn main() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    // Integration tests live in target/<profile>/deps, beside libverbs.so.
    let deps = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    let lib = deps.join("libverbs.so");
    assert!(lib.exists(), "{} not built", lib.display());
    let d = daemon_util::start_daemon("c-example");
    let run = |name: &str| -> String {
        let exe = d.dir.path().join(name);
        let cc = Command::new("cc")
            .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-I"])
            .arg(root.join("transport/verbs/include"))
            .arg(root.join(format!("transport/verbs/examples/c/{name}.c")))
            .arg("-L")
            .arg(&deps)
            .arg("-lverbs")
            .arg(format!("-Wl,-rpath,{}", deps.display()))
            .arg("-o")
            .arg(&exe)
            .status()
            .expect("run cc (apt-get install gcc)");
        assert!(cc.success(), "the C example {name} does not compile");
        let out = Command::new(&exe).arg(&d.socket).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        print!("{text}");
        eprint!("{}", String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "{name} failed: {:?}", out.status);
        text
    };
    let text = run("write_read");
    assert!(text.contains("ok: 65536 B WRITE"), "{text}");
    assert!(text.contains("unknown opcode 99"), "{text}");
    let text = run("sendrecv");
    assert!(
        text.contains("ok: SEND/RECV ping-pong between two processes"),
        "{text}"
    );
    assert!(
        text.contains("client: 4096 B SEND/RECV round trip"),
        "{text}"
    );
    let text = run("counter");
    assert!(
        text.contains("ok: counter = 1000 after 1000 FETCH_ADDs from 2 processes"),
        "{text}"
    );
    println!("ok: the C examples build and run");
}
