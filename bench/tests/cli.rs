//! The `bench` binary as a user runs it: the demo writes a pcap that decode
//! reads back; decode refuses unreadable files with a message naming them.

use std::process::Command;

use testkit::OutputWithin;

fn bench() -> Command {
    Command::new(env!("CARGO_BIN_EXE_bench"))
}

#[test]
fn demo_writes_a_pcap_that_decode_reads() {
    let dir = tempfile::tempdir().unwrap();
    let pcap = dir.path().join("sub/demo.pcap");
    let out = bench()
        .arg("demo")
        .arg("--pcap")
        .arg(&pcap)
        .output_within(testkit::LIMIT);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let demo = String::from_utf8(out.stdout).unwrap();
    assert!(
        demo.contains("frames=37 roce=36 icrc_bad=1 other=1 errors=0"),
        "{demo}"
    );

    let out = bench()
        .arg("decode")
        .arg(&pcap)
        .output_within(testkit::LIMIT);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 38);
    for name in [
        "RDMA_WRITE_ONLY",
        "RDMA_READ_REQUEST",
        "ACKNOWLEDGE",
        "CNP",
        "COMPARE_SWAP",
        "FETCH_ADD",
        "ATOMIC_ACKNOWLEDGE",
        "SEND_ONLY_WITH_INVALIDATE",
        "TLM_REQUEST",
        "TLM_RESPONSE",
        "CC_NOTIFY",
        "INT_RESPONSE",
    ] {
        assert!(text.contains(&format!(" op={name} ")), "{name} missing");
    }
    assert_eq!(lines[37], "frames=37 roce=36 icrc_bad=1 other=1 errors=0");
}

#[test]
fn decode_names_the_file_it_cannot_read() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("garbage.pcap");
    std::fs::write(&f, b"not a capture at all").unwrap();
    let out = bench().arg("decode").arg(&f).output_within(testkit::LIMIT);
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("garbage.pcap") && err.contains("not a pcap file"),
        "{err}"
    );
}

#[test]
fn decode_reports_a_truncated_file_after_the_frames_it_read() {
    let dir = tempfile::tempdir().unwrap();
    let pcap = dir.path().join("t.pcap");
    assert!(bench()
        .arg("demo")
        .arg("--pcap")
        .arg(&pcap)
        .output_within(testkit::LIMIT)
        .status
        .success());
    let bytes = std::fs::read(&pcap).unwrap();
    std::fs::write(&pcap, &bytes[..bytes.len() - 20]).unwrap();
    let out = bench()
        .arg("decode")
        .arg(&pcap)
        .output_within(testkit::LIMIT);
    assert!(!out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.ends_with("frames=36 roce=36 icrc_bad=1 other=0 errors=0\n"),
        "{text}"
    );
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("record 37"), "{err}");
}
