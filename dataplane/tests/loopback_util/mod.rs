//! What the DPDK tests share: the EAL arguments (no hugepages, no PCI, a
//! file prefix of their own) and the WRITE/READ exchange of the loopback
//! tests.
#![allow(dead_code)]

use dataplane::dpdk::Eal;
use std::path::Path;

use dataplane::testbed::{Loopback, LoopbackConfig};
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

/// A testbed configuration whose tap writes into a fresh temporary
/// directory (kept alive by the returned guard).
pub fn tapped(cfg: LoopbackConfig) -> (LoopbackConfig, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = LoopbackConfig {
        tap: Some(dir.path().join("tap.pcap")),
        ..cfg
    };
    (cfg, dir)
}

/// WRITE and READ of sizes 0 B .. 1 MiB from host 0 to host 1, every byte
/// verified; then every tapped frame (read back from the pcap file the tap
/// wrote) must parse with a good ICRC and no mbuf may be left. Returns
/// (sizes, tapped frames).
pub fn exchange(tb: &mut Loopback, tap: &Path) -> (usize, usize) {
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
    let written = tb.finish_tap().unwrap().expect("the tap is on");
    assert!(written > 0);
    let mut r = nic::pcap::Reader::open(tap).unwrap();
    let mut read = 0;
    while let Some(rec) = r.next_record() {
        let rec = rec.unwrap();
        let p = Packet::parse_unverified(&rec.data).expect("a RoCEv2 frame");
        assert!(p.icrc_ok(), "icrc=ok for every tapped frame");
        read += 1;
    }
    assert_eq!(read, written);
    assert_eq!(tb.tx_alloc_failures(), 0);
    assert_eq!(tb.mbufs_in_use(), 0, "no mbuf leaked");
    (sizes.len(), read as usize)
}
