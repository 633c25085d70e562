//! What the DPDK tests share: the EAL arguments (no hugepages, no PCI, a
//! file prefix of their own) and the WRITE/READ exchange of the loopback
//! tests.
#![allow(dead_code)]

use dataplane::dpdk::Eal;
use dataplane::testbed::Loopback;
use transport::rc::WrOp;
use transport::wire::Packet;

/// Initialises the EAL for test `name` without hugepages or PCI, plus
/// `extra` arguments (vdevs).
pub fn eal(name: &str, extra: &[String]) -> Eal {
    let mut args: Vec<String> = [
        "--no-huge",
        "--no-pci",
        "--no-telemetry",
        "-m",
        "512",
        "--log-level=lib.eal:warning",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.push(format!("--file-prefix={name}-{}", std::process::id()));
    args.extend_from_slice(extra);
    Eal::init(&args).expect("EAL")
}

/// WRITE and READ of sizes 0 B .. 1 MiB from host 0 to host 1, every byte
/// verified; then every tapped frame must parse with a good ICRC and no
/// mbuf may be left. Returns (sizes, tapped frames).
pub fn exchange(tb: &mut Loopback) -> (usize, usize) {
    let sizes = [0u32, 1, 1023, 1024, 1025, 4096, 65_536, 1 << 20];
    for (i, &len) in sizes.iter().enumerate() {
        for op in [WrOp::Write, WrOp::Read] {
            let seed = (i as u8).wrapping_mul(31) ^ u8::from(op == WrOp::Read);
            if let Err(e) = tb.verified_op(op, len, seed) {
                panic!("{e}");
            }
        }
    }
    // Let the last ACKs drain, then check the tap and the mbufs.
    for _ in 0..1000 {
        tb.poll();
    }
    let tap = tb.tap.take().unwrap_or_default();
    assert!(!tap.is_empty());
    // The tap goes to a pcap file (as `bench decode` and tshark read it);
    // every frame read back must be RoCEv2 with a good ICRC.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tap.pcap");
    let mut w = nic::pcap::Writer::create(&path).unwrap();
    for (i, f) in tap.iter().enumerate() {
        w.write(std::time::Duration::from_nanos(i as u64), f)
            .unwrap();
    }
    w.finish().unwrap();
    let mut r = nic::pcap::Reader::open(&path).unwrap();
    let mut read = 0;
    while let Some(rec) = r.next_record() {
        let rec = rec.unwrap();
        let p = Packet::parse_unverified(&rec.data).expect("a RoCEv2 frame");
        assert!(p.icrc_ok(), "icrc=ok for every tapped frame");
        read += 1;
    }
    assert_eq!(read, tap.len());
    assert_eq!(tb.tx_alloc_failures, 0);
    assert_eq!(tb.mbufs_in_use(), 0, "no mbuf leaked");
    (sizes.len(), tap.len())
}
