//! The error paths of a verbs application: `tests/c/verbs_errors.c`,
//! compiled against Debian's `<infiniband/verbs.h>` and linked with
//! `-libverbs` (not our header), runs over our libibverbs.so.1 and the
//! daemon: bad lkey, bad rkey (REM_ACCESS_ERR and the responder's
//! IBV_EVENT_QP_ACCESS_ERR), a region without REMOTE_WRITE, a WR on a QP
//! in RESET, modify with a wrong mask, deregistered MRs, SQD with
//! IBV_EVENT_SQ_DRAINED; then the daemon killed under the running
//! program: IBV_EVENT_DEVICE_FATAL and failing calls, not a hang.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

mod daemon_util;

/// Compiles the C program into `dir`.
fn build(dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/verbs_errors.c");
    let exe = dir.join("verbs_errors");
    daemon_util::compile(
        Command::new("cc")
            .args(["-std=c11", "-Wall", "-Wextra", "-Werror"])
            .arg(&src)
            .args(["-libverbs", "-o"])
            .arg(&exe),
    );
    exe
}

#[test]
fn error_paths_give_errors_statuses_and_async_events() {
    let tmp = tempfile::tempdir().unwrap();
    let libs = daemon_util::lib_dir(tmp.path());
    let exe = build(tmp.path());
    let d = daemon_util::start_daemon("ibverbs-errors");
    let text = daemon_util::run_over_lib(Command::new(&exe).arg("errors"), &libs, &d.socket);
    for want in [
        "post_send on a QP in RESET -> EINVAL",
        "-> EINVAL, QP unchanged",
        "WRITE with a bad lkey -> local protection error",
        "WRITE with a bad rkey -> remote access error",
        "responder QP -> local access violation work queue error",
        "WRITE to a region without REMOTE_WRITE -> remote access error",
        "WRITE with the rkey of a deregistered MR -> remote access error",
        "WRITE from the lkey of a deregistered MR -> local protection error",
        "SQD->RTS sends what waited",
        "ok: errors done",
    ] {
        assert!(text.contains(want), "missing {want:?}");
    }
}

#[test]
fn a_killed_daemon_is_a_fatal_device_event_then_errors_not_a_hang() {
    let tmp = tempfile::tempdir().unwrap();
    let libs = daemon_util::lib_dir(tmp.path());
    let exe = build(tmp.path());
    let mut d = daemon_util::start_daemon("ibverbs-fatal");
    let mut child = testkit::Running::spawn(
        Command::new(&exe)
            .arg("fatal")
            .env("LD_LIBRARY_PATH", &libs)
            .env("RNIC_SOCKET", &d.socket),
    )
    .unwrap();
    assert_eq!(
        child.line_starting("", daemon_util::RUN_LIMIT).as_deref(),
        Some("ready"),
        "the program did not connect"
    );
    d.stop(nix::sys::signal::Signal::SIGKILL);
    // A hang is a failure, found after a bound far above the few
    // milliseconds this takes.
    let f = child.finish(Duration::from_secs(120));
    assert!(
        f.status.is_some(),
        "the program hangs after the daemon died"
    );
    let rest = &f.stdout;
    println!("{rest}");
    assert!(
        f.success(),
        "verbs_errors fatal: {:?}\n{}",
        f.status,
        f.stderr
    );
    assert!(
        rest.contains("daemon killed -> local catastrophic error"),
        "{rest}"
    );
    assert!(rest.contains("no more events"), "{rest}");
}
