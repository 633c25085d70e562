//! Our Wireshark dissector (`wireshark/rnic.lua`) against `bench decode`:
//! tshark reads `bench demo`'s pcap with the dissector loaded, and every
//! telemetry field it shows (BTH, TLM header and flags, every hop record,
//! full and compact, N, PROBE, NOTIFY, INT_RESPONSE) must equal what our own
//! decoder prints for the same frame; frames without telemetry must still
//! be Wireshark's InfiniBand dissector's, and a standard opcode with a TLM
//! block must have its RETH decoded by it too.
//!
//! Needs tshark with Lua (`./x test` installs Debian's tshark).

use std::collections::HashMap;

use std::path::Path;
use std::process::Command;
use testkit::OutputWithin;

use transport::wire::Opcode;

fn bench() -> Command {
    Command::new(env!("CARGO_BIN_EXE_bench"))
}

/// `bench decode`'s line for one frame: its `key=value` fields, and the
/// hop records as lists per field (`hop.ts_ns` -> "1,2").
fn decoded(line: &str) -> HashMap<String, String> {
    let mut m = HashMap::new();
    let mut hops: Vec<HashMap<String, String>> = Vec::new();
    for tok in line.split(' ').skip(1) {
        let Some((k, v)) = tok.split_once('=') else {
            continue;
        };
        if k.starts_with("hop") && v.starts_with('{') {
            let inner = v.trim_start_matches('{').trim_end_matches('}');
            hops.push(
                inner
                    .split(',')
                    .filter_map(|kv| kv.split_once('='))
                    .map(|(a, b)| (a.to_string(), b.to_string()))
                    .collect(),
            );
        } else {
            m.insert(k.to_string(), v.to_string());
        }
    }
    for key in [
        "switch",
        "port",
        "ts_ns",
        "tx_bytes",
        "qlen",
        "sojourn_ns",
        "rate_mbps",
    ] {
        // qlen or, under SOJOURN, sojourn_ns.
        let list: Vec<&str> = hops
            .iter()
            .filter_map(|h| h.get(key).map(String::as_str))
            .collect();
        m.insert(format!("hop.{key}"), list.join(","));
    }
    m
}

/// A number as tshark or `bench decode` prints it (decimal or 0x hex).
fn num(s: &str) -> u64 {
    let s = s.trim();
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    }
    .unwrap_or_else(|e| panic!("{s:?} is not a number: {e}"))
}

fn nums(s: &str) -> Vec<u64> {
    s.split(',').filter(|x| !x.is_empty()).map(num).collect()
}

const FIELDS: [&str; 30] = [
    "frame.number",
    "rnic.bth.opcode",
    "rnic.bth.destqp",
    "rnic.bth.psn",
    "rnic.tlm.nhop",
    "rnic.tlm.maxhop",
    "rnic.tlm.echo",
    "rnic.tlm.compact",
    "rnic.tlm.subscribe",
    "rnic.tlm.sojourn",
    "rnic.tlm.mac",
    "rnic.tlm.path_id",
    "rnic.tlm.nflows",
    "rnic.tlm.n",
    "rnic.hop.ts_ns",
    "rnic.hop.tx_bytes",
    "rnic.hop.qlen",
    "rnic.hop.sojourn_ns",
    "rnic.hop.rate_mbps",
    "rnic.hop.switch_id",
    "rnic.hop.port_id",
    "rnic.probe.id",
    "rnic.probe.snd_psn",
    "rnic.probe.ts_ns",
    "rnic.notify.window",
    "rnic.notify.rate_mbps",
    "rnic.notify.seq",
    "rnic.int_response.hop",
    "infiniband.bth.opcode",
    "infiniband.reth.va",
];

#[test]
fn tshark_with_our_dissector_shows_every_telemetry_field_as_bench_decode() {
    let dir = tempfile::tempdir().unwrap();
    let pcap = dir.path().join("demo.pcap");
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
    let out = bench()
        .arg("decode")
        .arg(&pcap)
        .output_within(testkit::LIMIT);
    assert!(out.status.success());
    let ours: Vec<HashMap<String, String>> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(decoded)
        .collect();

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../wireshark/rnic.lua");
    let mut cmd = Command::new("tshark");
    cmd.arg("-X")
        .arg(format!("lua_script:{}", script.display()))
        .arg("-r")
        .arg(&pcap)
        .args(["-T", "fields", "-E", "separator=;", "-E", "aggregator=,"]);
    for f in FIELDS {
        cmd.args(["-e", f]);
    }
    // (./x test installs tshark: apt-get install tshark)
    let out = cmd.output_within(testkit::LIMIT);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "tshark failed: {err}");
    assert!(
        !err.contains("Lua: Error"),
        "the dissector failed to load: {err}"
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let rows: Vec<HashMap<&str, &str>> = text
        .lines()
        .map(|l| FIELDS.iter().copied().zip(l.split(';')).collect())
        .collect();
    assert_eq!(rows.len(), ours.len(), "one row per frame:\n{text}");

    let mut seen = [false; 8]; // tlm, compact, probe, notify, int_response, N, sojourn, mac
    for (i, (t, d)) in rows.iter().zip(&ours).enumerate() {
        let frame = i + 1;
        let ctx = format!("frame {frame}: tshark {t:?}\nbench decode {d:?}");
        let Some(nhop) = d.get("tlm.nhop") else {
            // No telemetry: nothing of ours, and RoCEv2 stays Wireshark's.
            assert_eq!(t["rnic.bth.opcode"], "", "{ctx}");
            if d.get("op").is_some_and(|op| op != "?") {
                assert_ne!(t["infiniband.bth.opcode"], "", "{ctx}");
            }
            continue;
        };
        seen[0] = true;
        let op = Opcode::from_u8(num(t["rnic.bth.opcode"]) as u8).expect("a known opcode");
        assert_eq!(op.name(), d["op"], "{ctx}");
        assert_eq!(num(t["rnic.bth.destqp"]), num(&d["qpn"]), "{ctx}");
        assert_eq!(num(t["rnic.bth.psn"]), num(&d["psn"]), "{ctx}");
        assert_eq!(num(t["rnic.tlm.nhop"]), num(nhop), "{ctx}");
        assert_eq!(num(t["rnic.tlm.maxhop"]), num(&d["tlm.maxhop"]), "{ctx}");
        assert_eq!(num(t["rnic.tlm.echo"]), num(&d["tlm.echo"]), "{ctx}");
        let flag = |k: &str| d.get(k).map_or(0, |v| num(v));
        assert_eq!(num(t["rnic.tlm.nflows"]), flag("tlm.nflows"), "{ctx}");
        match d.get("tlm.n") {
            // N in place of the path id.
            Some(n) => {
                assert_eq!(num(t["rnic.tlm.n"]), num(n), "{ctx}");
                assert_eq!(t["rnic.tlm.path_id"], "", "{ctx}");
                seen[5] = true;
            }
            None => {
                assert_eq!(num(t["rnic.tlm.path_id"]), num(&d["tlm.path_id"]), "{ctx}");
            }
        }
        assert_eq!(num(t["rnic.tlm.compact"]), flag("tlm.compact"), "{ctx}");
        assert_eq!(num(t["rnic.tlm.subscribe"]), flag("tlm.subscribe"), "{ctx}");
        assert_eq!(num(t["rnic.tlm.sojourn"]), flag("tlm.sojourn"), "{ctx}");
        seen[1] |= flag("tlm.compact") == 1;
        seen[6] |= flag("tlm.sojourn") == 1 && flag("tlm.compact") == 1;
        match d.get("tlm.mac") {
            Some(m) => {
                assert_eq!(num(t["rnic.tlm.mac"]), num(m), "{ctx}");
                seen[7] = true;
            }
            None => assert_eq!(t["rnic.tlm.mac"], "", "{ctx}"),
        }
        for (ts, dk) in [
            ("rnic.hop.ts_ns", "hop.ts_ns"),
            ("rnic.hop.tx_bytes", "hop.tx_bytes"),
            ("rnic.hop.qlen", "hop.qlen"),
            ("rnic.hop.sojourn_ns", "hop.sojourn_ns"),
            ("rnic.hop.rate_mbps", "hop.rate_mbps"),
            ("rnic.hop.switch_id", "hop.switch"),
            ("rnic.hop.port_id", "hop.port"),
        ] {
            assert_eq!(nums(t[ts]), nums(&d[dk]), "{ts} {ctx}");
        }
        for (ts, dk) in [
            ("rnic.probe.id", "probe.id"),
            ("rnic.probe.snd_psn", "probe.snd_psn"),
            ("rnic.probe.ts_ns", "probe.ts_ns"),
            ("rnic.notify.window", "notify.window"),
            ("rnic.notify.rate_mbps", "notify.rate_mbps"),
            ("rnic.notify.seq", "notify.seq"),
        ] {
            match d.get(dk) {
                Some(v) => assert_eq!(num(t[ts]), num(v), "{ts} {ctx}"),
                None => assert_eq!(t[ts], "", "{ts} {ctx}"),
            }
        }
        seen[2] |= d.contains_key("probe.id");
        seen[3] |= d.contains_key("notify.window");
        match op {
            Opcode::IntResponse => {
                seen[4] = true;
                assert_eq!(num(t["rnic.int_response.hop"]), num(nhop) - 1, "{ctx}");
            }
            op if op.is_standard() => {
                // The rest of the frame is Wireshark's InfiniBand dissector's.
                assert_eq!(
                    num(t["infiniband.bth.opcode"]),
                    u64::from(op.as_u8()),
                    "{ctx}"
                );
                if let Some(va) = d.get("reth.va") {
                    assert_eq!(num(t["infiniband.reth.va"]), num(va), "{ctx}");
                }
            }
            _ => assert_eq!(t["infiniband.bth.opcode"], "", "{ctx}"),
        }
    }
    assert_eq!(
        seen, [true; 8],
        "the demo has every kind of telemetry frame"
    );
}
