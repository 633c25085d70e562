//! Every dataplane configuration shipped in configs/ reads and checks
//! (including the real-NIC example, which cannot run here); a bad one is
//! refused before any port starts, with the file, the key and the value;
//! and the lossy loopback configuration verifies every byte over DPDK
//! while its counters show the drops by reason.

use std::process::Command;

/// How long one run of the daemon may take before it is killed and its
/// test fails.
const LIMIT: std::time::Duration = std::time::Duration::from_secs(300);

fn check(path: &std::path::Path) -> (bool, String) {
    let f = testkit::output_within(
        Command::new(env!("CARGO_BIN_EXE_dataplane"))
            .arg("--check")
            .arg("--config")
            .arg(path),
        LIMIT,
    )
    .unwrap();
    (f.success(), f.stderr)
}

#[test]
fn shipped_configurations_check() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "toml") {
            let (ok, err) = check(&p);
            assert!(ok, "{}: {err}", p.display());
            n += 1;
        }
    }
    assert!(n >= 5, "found {n} configurations");
}

#[test]
fn a_bad_configuration_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.toml");
    std::fs::write(&p, "[eal]\nargs = []\n[loopback]\nmem_bytez = 1\n").unwrap();
    let (ok, err) = check(&p);
    assert!(!ok);
    assert!(
        err.contains("bad.toml") && err.contains("mem_bytez"),
        "{err}"
    );
}

/// Checks a configuration made of `text`; returns (accepted, stderr).
fn check_text(text: &str) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("c.toml");
    std::fs::write(&p, text).unwrap();
    check(&p)
}

const EAL: &str = "[eal]\nargs = [\"--no-huge\", \"--no-pci\"]\n";
const LOOPBACK: &str = "[loopback]\nmem_bytes = 65536\nmtu = 1024\nsizes = [0, 1]\n";

#[test]
fn check_refuses_each_bad_value_by_key() {
    let device = "[[service.devices]]\nname = \"r\"\nport = 0\nip = \"10.1.2.3\"\n";
    let cases: [(String, &[&str]); 22] = [
        (
            format!("{EAL}{LOOPBACK}[service]\nsocket = \"/tmp/x.sock\"\npoll = \"busy\"\n"),
            &["service.poll", "\"busy\"", "one of spin, adaptive, event"],
        ),
        (
            format!("{EAL}{LOOPBACK}[service]\nsocket = \"/tmp/x.sock\"\nnap_us = 5\n"),
            &["service.nap_us", "5", "20 to 100000"],
        ),
        (
            format!("{EAL}{LOOPBACK}[service]\nsocket = \"/tmp/x.sock\"\n{device}vlan = 4095\n"),
            &["service.devices[0].vlan", "4095", "1 to 4094"],
        ),
        (
            format!("{EAL}{LOOPBACK}[service]\nsocket = \"/tmp/x.sock\"\n{device}vlan = 0\n"),
            &["service.devices[0].vlan", "= 0", "1 to 4094"],
        ),
        (
            format!("{EAL}{LOOPBACK}[service]\nsocket = \"/tmp/x.sock\"\n{device}vlan = 100\npriority = 8\n"),
            &["service.devices[0].priority", "8", "0 to 7"],
        ),
        (
            format!("{EAL}{LOOPBACK}[service]\nsocket = \"/tmp/x.sock\"\n{device}priority = 3\n"),
            &["service.devices[0].priority", "3", "needs vlan"],
        ),
        (
            format!("{EAL}{LOOPBACK}[service]\nsocket = \"/tmp/x.sock\"\n[[service.neighbours]]\nip = \"10.1.2.3\"\nmac = \"02:00:00:00:00\"\n"),
            &["service.neighbours[0].mac", "02:00:00:00:00"],
        ),
        (
            format!("{EAL}{LOOPBACK}[service]\nsocket = \"/tmp/x.sock\"\n[[service.neighbours]]\nip = \"10.1.2.300\"\nmac = \"02:00:00:00:00:01\"\n"),
            &["service.neighbours[0].ip", "10.1.2.300"],
        ),
        (
            format!("{EAL}{LOOPBACK}[service]\nsocket = \"/tmp/x.sock\"\ntap = \"/tmp/t.pcap\"\ntap_frames = 0\n"),
            &["service.tap_frames", "0"],
        ),
        (
            format!("{EAL}{LOOPBACK}[service]\nsocket = \"/tmp/x.sock\"\n[[service.devices]]\nname = \"r\"\nport = 0\nip = \"10.1.2\"\n"),
            &["service.devices[0].ip", "10.1.2"],
        ),
        (
            format!("{EAL}{LOOPBACK}[service]\nsocket = \"/tmp/x.sock\"\n[[service.devices]]\nname = \"r\"\nport = 0\nip = \"10.1.2.3\"\nmac = \"01:00:5e:00:00:01\"\n"),
            &["service.devices[0].mac", "01:00:5e:00:00:01", "multicast"],
        ),
        (
            format!("{EAL}{LOOPBACK}[service]\nsocket = \"/tmp/x.sock\"\ntelemetry_peers = [\"10.0.0.0/33\"]\n"),
            &["service.telemetry_peers", "10.0.0.0/33"],
        ),
        (
            format!("{EAL}{LOOPBACK}[service]\nsocket = \"/tmp/x.sock\"\nstandard_cc = \"hpcc\"\n"),
            &["service.standard_cc", "hpcc", "dcqcn or none"],
        ),
        (format!("{EAL}{LOOPBACK}colour = \"blue\"\n"), &["colour"]),
        (
            format!("{EAL}[loopback]\nmem_bytes = 65536\nmtu = 1000\nsizes = [0]\n"),
            &["loopback.mtu", "1000"],
        ),
        (
            format!("{EAL}{LOOPBACK}[service]\nsocket = \"/tmp/x.sock\"\ncc = \"bbr\"\n"),
            &["service.cc", "bbr"],
        ),
        (
            format!("{EAL}{LOOPBACK}[service]\nsocket = \"/tmp/x.sock\"\nline_gbps = -5.0\n"),
            &["service.line_gbps", "-5"],
        ),
        (
            format!(
                "{EAL}{LOOPBACK}[service]\nsocket = \"/tmp/x.sock\"\nidle_sleep_us = 200000\n"
            ),
            &["service.idle_sleep_us", "200000", "100 ms"],
        ),
        (
            format!("{EAL}{LOOPBACK}[service]\nsocket = \"/tmp/x.sock\"\nack_coalesce = 0\n"),
            &["service.ack_coalesce", "0", "1..=64"],
        ),
        (
            format!("{EAL}{LOOPBACK}[service]\nsocket = \"/tmp/x.sock\"\nack_coalesce = 65\n"),
            &["service.ack_coalesce", "65", "1..=64"],
        ),
        (
            format!(
                "{EAL}[loopback]\nports = [0, 1]\nmem_bytes = 65536\nmtu = 1024\nsizes = [0]\n"
            ),
            &["loopback.ports", "0", "vdev"],
        ),
        (
            format!("{EAL}{LOOPBACK}[loopback.faults]\nhost = 0\nloss = 1.5\n"),
            &["loopback.faults.loss", "1.5"],
        ),
    ];
    for (text, words) in &cases {
        let (ok, err) = check_text(text);
        assert!(!ok, "accepted:\n{text}");
        assert!(err.contains("c.toml"), "{err}");
        for w in *words {
            assert!(err.contains(w), "{w:?} not in {err:?}");
        }
    }
    let incast = "[incast]\nsenders = 2\nhost_gbps = -1.0\nbottleneck_gbps = 1.0\nbuffer_bytes = 1000\nbase_rtt_us = 10\nmtu = 1024\nmessage_bytes = 1000\ndepth = 1\nseconds = 1.0\ncc = [\"hpcc\"]\n";
    let (ok, err) = check_text(&format!("{EAL}{incast}"));
    assert!(
        !ok && err.contains("incast.host_gbps") && err.contains("-1"),
        "{err}"
    );
}

#[test]
fn a_lossy_link_still_verifies_every_byte() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = testkit::output_within(
        Command::new(env!("CARGO_BIN_EXE_dataplane"))
            .current_dir(&dir)
            .args(["--config", "configs/loopback_lossy.toml"])
            .arg(format!("--file-prefix=lossy-{}", std::process::id())),
        LIMIT,
    )
    .unwrap();
    let text = &out.stdout;
    assert!(out.success(), "{}", out.text());
    assert!(text.contains("16 WRITEs and READs verified"), "{text}");
    let drops = text
        .lines()
        .find(|l| l.starts_with("host 0 drops: faults lost"))
        .unwrap_or_else(|| panic!("no drop counters in {text}"));
    let num = |key: &str| -> u64 {
        let at = drops.find(key).unwrap() + key.len();
        drops[at..]
            .split_whitespace()
            .next()
            .unwrap()
            .trim_matches(|c: char| !c.is_ascii_digit())
            .parse()
            .unwrap()
    };
    assert!(num("lost ") > 0 && num("corrupted ") > 0, "{drops}");
    assert!(
        num("icrc ") > 0,
        "corrupted frames are caught by the ICRC: {drops}"
    );
}
