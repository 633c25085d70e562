//! `bench hpcc-replay` as a user runs it, on the hand-written trace of the
//! worked example (bench/traces/worked_example.trace).

use std::process::Command;

use testkit::OutputWithin;

fn replay(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_bench"))
        .arg("hpcc-replay")
        .args(args)
        .output_within(testkit::LIMIT);
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

fn trace() -> String {
    format!("{}/traces/worked_example.trace", env!("CARGO_MANIFEST_DIR"))
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * b.abs()
}

#[test]
fn the_worked_example_trace_replays_to_the_hand_computed_values() {
    let (ok, out, err) = replay(&[&trace(), "--t-ns", "10000", "--n", "10", "--w-min", "1000"]);
    assert!(ok, "{err}");
    let rows: Vec<Vec<f64>> = out
        .lines()
        .skip(1)
        .map(|l| l.split(',').map(|v| v.parse().unwrap()).collect())
        .collect();
    assert_eq!(rows.len(), 7);
    let w3 = 118_750.0 / 1.1 + 625.0;
    let w4 = w3 * 0.95 / 0.96 + 625.0;
    // (U, W, Wc, incStage) after each event.
    let want = [
        (1.0, 125_000.0, 125_000.0, 0.0),
        (0.9, 125_000.0, 125_000.0, 0.0),
        (1.1, w3, w3, 0.0),
        (0.96, w4, w3, 0.0),
        (0.4, w3 + 625.0, w3 + 625.0, 1.0),
        (0.4, w3 + 625.0, w3 + 625.0, 1.0),
        (0.4, w3 + 625.0, w3 + 625.0, 1.0),
    ];
    for (i, (row, (u, w, wc, stage))) in rows.iter().zip(want).enumerate() {
        assert_eq!(row[0], (i + 1) as f64);
        assert!(close(row[1], u), "event {}: U {} vs {u}", i + 1, row[1]);
        assert!(close(row[2], w), "event {}: W {} vs {w}", i + 1, row[2]);
        assert!(close(row[3], wc), "event {}: Wc {} vs {wc}", i + 1, row[3]);
        assert!(close(row[4], w * 8e9 / 10_000.0), "event {}: rate", i + 1);
        assert_eq!(row[5], stage);
    }
}

#[test]
fn bad_lines_are_reported_by_number_and_the_exit_code_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("t.trace");
    std::fs::write(&f, "0 1 0\n1 2 1 5 5 5\n2 3 0\n").unwrap();
    let (ok, out, err) = replay(&[f.to_str().unwrap()]);
    assert!(!ok);
    assert_eq!(out.lines().count(), 3, "header and two events");
    assert!(
        err.contains("line 2: nhop 1 announces 9 fields, the line has 6; skipped"),
        "{err}"
    );
    assert!(
        err.contains("2 events replayed, 1 bad lines skipped"),
        "{err}"
    );
}

#[test]
fn bad_flags_and_missing_files_are_named() {
    let (ok, _, err) = replay(&[&trace(), "--eta", "0"]);
    assert!(!ok);
    assert!(err.contains("eta must be in (0, 1], got 0"), "{err}");
    let (ok, _, err) = replay(&["/nonexistent/x.trace"]);
    assert!(!ok);
    assert!(err.contains("/nonexistent/x.trace"), "{err}");
}
