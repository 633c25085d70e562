//! The C example (`transport/verbs/examples/c/write_read.c`) compiles
//! against `rnic_verbs.h` and `libverbs.so` with -Wall -Werror, and runs
//! against the daemon on the loopback testbed.

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
    let exe = d.dir.path().join("write_read");
    let cc = Command::new("cc")
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(root.join("transport/verbs/include"))
        .arg(root.join("transport/verbs/examples/c/write_read.c"))
        .arg("-L")
        .arg(&deps)
        .arg("-lverbs")
        .arg(format!("-Wl,-rpath,{}", deps.display()))
        .arg("-o")
        .arg(&exe)
        .status()
        .expect("run cc (apt-get install gcc)");
    assert!(cc.success(), "the C example does not compile");
    let out = Command::new(&exe).arg(&d.socket).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    print!("{text}");
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "write_read failed: {:?}", out.status);
    assert!(text.contains("ok: 65536 B WRITE"), "{text}");
    assert!(text.contains("unknown opcode 99"), "{text}");
    println!("ok: the C example builds and runs");
}
