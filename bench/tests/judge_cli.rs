//! `bench judge` as the interop script runs it: a pingpong run whose
//! output says `invalid data in page N` is refused though both sides
//! exited 0; a clean run passes; unreadable input is an error that names
//! it.

use std::path::Path;
use std::time::Duration;

const SERVER: &str =
    "  local address:  LID 0x0000, QPN 0x000011, PSN 0x000100, GID ::ffff:10.77.0.3
  remote address: LID 0x0000, QPN 0x000099, PSN 0x000200, GID ::ffff:10.77.0.2
5 bytes in 0.00 seconds = 1.00 Mbit/sec
5 iters in 0.00 seconds = 10.00 usec/iter
";

/// `bench judge` on a pingpong run in phase mtu1024 where both sides
/// exited 0, with these output files.
fn judge(ours: &Path, rxe: &Path) -> testkit::Finished {
    testkit::output_within(
        std::process::Command::new(env!("CARGO_BIN_EXE_bench"))
            .args([
                "judge",
                "--program",
                "ibv_rc_pingpong",
                "--phase",
                "mtu1024",
            ])
            .args(["--args", "-d roce0 -g 1 -c -m 1024 -s 1 -n 5"])
            .args(["--ours-rc", "0", "--rxe-rc", "0"])
            .args(["--our-mac", "02:77:00:00:00:03"])
            .arg("--ours-output")
            .arg(ours)
            .arg("--rxe-output")
            .arg(rxe),
        Duration::from_secs(120),
    )
    .unwrap()
}

/// [`judge`] of these outputs, written to files in `dir`.
fn judge_outputs(dir: &Path, ours: &str, rxe: &str) -> testkit::Finished {
    let (o, r) = (dir.join("ours.out"), dir.join("rxe.out"));
    std::fs::write(&o, ours).unwrap();
    std::fs::write(&r, rxe).unwrap();
    judge(&o, &r)
}

#[test]
fn a_corrupted_pingpong_page_is_refused_though_both_exited_0() {
    let dir = tempfile::tempdir().unwrap();
    let f = judge_outputs(
        dir.path(),
        SERVER,
        &format!("{SERVER}invalid data in page 0\n"),
    );
    assert_eq!(f.status.and_then(|s| s.code()), Some(1), "{}", f.text());
    assert_eq!(
        f.stdout,
        "FAIL ours rc=0, rxe rc=0: rxe: invalid data in page 0\n"
    );
}

#[test]
fn a_clean_run_passes() {
    let dir = tempfile::tempdir().unwrap();
    let f = judge_outputs(dir.path(), SERVER, SERVER);
    f.assert_success();
    assert_eq!(f.stdout, "ok\n");
}

#[test]
fn a_missing_output_file_is_named() {
    let f = judge(
        Path::new("/nonexistent/ours.out"),
        Path::new("/nonexistent/rxe.out"),
    );
    assert_eq!(f.status.and_then(|s| s.code()), Some(2));
    assert!(f.stderr.contains("/nonexistent/ours.out"), "{}", f.stderr);
}
