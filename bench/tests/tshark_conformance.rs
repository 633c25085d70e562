//! Conformance with Wireshark's InfiniBand dissector: one frame of every
//! standard opcode goes into a pcap, tshark reads it, and every field tshark
//! shows (opcode, DestQP, PSN, AckReq, RETH VA / R_Key / length, AETH
//! syndrome / MSN, ImmDt) must equal what we emitted.
//!
//! Needs tshark (`./x test` installs it). Telemetry opcodes are ours and
//! Wireshark does not know them: `tshark_dissector.rs` checks our own
//! dissector (`wireshark/rnic.lua`) for those.

use std::process::Command;

use std::time::Duration;
use testkit::OutputWithin;

use bench::pcap::Writer;
use bench::samples;

fn int(s: &str) -> u64 {
    let s = s.trim();
    match s {
        "True" | "true" => 1,
        "False" | "false" => 0,
        _ => match s.strip_prefix("0x") {
            Some(h) => u64::from_str_radix(h, 16),
            None => s.parse(),
        }
        .unwrap_or_else(|e| panic!("tshark printed {s:?}: {e}")),
    }
}

fn opt(s: &str) -> Option<u64> {
    // A repeated field prints as "a,b"; ImmDt does this in tshark 4.0.
    let first = s.split(',').next().unwrap_or("");
    (!first.trim().is_empty()).then(|| int(first))
}

#[test]
fn tshark_reads_every_standard_opcode_as_emitted() {
    let frames = samples::standard();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("conformance.pcap");
    let mut w = Writer::create(&path).unwrap();
    for (i, s) in frames.iter().enumerate() {
        w.write(Duration::from_micros(i as u64), &s.frame())
            .unwrap();
    }
    w.finish().unwrap();

    let fields = [
        "infiniband.bth.opcode",
        "infiniband.bth.destqp",
        "infiniband.bth.psn",
        "infiniband.bth.a",
        "infiniband.reth.va",
        "infiniband.reth.r_key",
        "infiniband.reth.dmalen",
        "infiniband.aeth.syndrome",
        "infiniband.aeth.msn",
        "infiniband.immdt",
        "infiniband.atomiceth.swapdt",
        "infiniband.atomiceth.cmpdt",
        "infiniband.atomicacketh.origremdt",
        "infiniband.ieth",
    ];
    let mut cmd = Command::new("tshark");
    cmd.arg("-r")
        .arg(&path)
        .args(["-T", "fields", "-E", "separator=;"]);
    for f in fields {
        cmd.args(["-e", f]);
    }
    // (./x test installs tshark: apt-get install tshark)
    let out = cmd.output_within(testkit::LIMIT);
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), frames.len(), "one line per frame:\n{text}");

    for (s, line) in frames.iter().zip(&lines) {
        let v: Vec<&str> = line.split(';').collect();
        assert_eq!(v.len(), fields.len(), "{line}");
        let r = &s.repr;
        let op = r.bth.opcode;
        assert_eq!(int(v[0]), u64::from(op.as_u8()), "opcode of {op}");
        assert_eq!(int(v[1]), u64::from(r.bth.dest_qp), "DestQP of {op}");
        assert_eq!(int(v[2]), u64::from(r.bth.psn), "PSN of {op}");
        assert_eq!(int(v[3]), u64::from(r.bth.ack_req), "AckReq of {op}");
        // Wireshark shows AtomicETH's VA and R_Key in RETH's fields.
        let va = r.reth.map(|x| x.va).or(r.atomic.map(|x| x.va));
        assert_eq!(opt(v[4]), va, "RETH/AtomicETH VA of {op}");
        let r_key = r.reth.map(|x| x.r_key).or(r.atomic.map(|x| x.r_key));
        assert_eq!(opt(v[5]), r_key.map(u64::from), "R_Key of {op}");
        assert_eq!(
            opt(v[6]),
            r.reth.map(|x| u64::from(x.dma_len)),
            "DMA length of {op}"
        );
        assert_eq!(
            opt(v[7]),
            r.aeth.map(|x| u64::from(x.syndrome)),
            "syndrome of {op}"
        );
        assert_eq!(opt(v[8]), r.aeth.map(|x| u64::from(x.msn)), "MSN of {op}");
        let imm = v[9].split(',').next().unwrap_or("").trim();
        let imm = (!imm.is_empty()).then(|| u64::from_str_radix(imm, 16).unwrap());
        assert_eq!(imm, r.imm.map(u64::from), "ImmDt of {op}");
        assert_eq!(opt(v[10]), r.atomic.map(|x| x.swap_add), "swap/add of {op}");
        assert_eq!(opt(v[11]), r.atomic.map(|x| x.compare), "compare of {op}");
        assert_eq!(opt(v[12]), r.atomic_ack, "original value of {op}");
        let ieth = v[13].split(',').next().unwrap_or("").trim();
        let ieth = (!ieth.is_empty()).then(|| u64::from_str_radix(ieth, 16).unwrap());
        assert_eq!(ieth, r.ieth.map(u64::from), "IETH of {op}");
    }
}
