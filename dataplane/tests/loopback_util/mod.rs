//! What the DPDK tests share: the EAL arguments (no hugepages, no PCI, a
//! file prefix of their own) and the WRITE/READ exchange of the loopback
//! tests.
#![allow(dead_code)]

use dataplane::dpdk::Eal;
use dataplane::testbed::{Loopback, MEM_BASE};
use transport::rc::{SendWr, WcStatus, WrOp};
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
pub fn exchange(tb: &mut Loopback, mem_bytes: usize) -> (usize, usize) {
    let cfg_half = (mem_bytes / 2) as u64;
    let sizes = [0u32, 1, 1023, 1024, 1025, 4096, 65_536, 1 << 20];
    let half = cfg_half;
    for (i, &len) in sizes.iter().enumerate() {
        for op in [WrOp::Write, WrOp::Read] {
            // A writes its first half into B's second half; a READ fetches
            // B's first half into A's second half.
            let (local, remote) = match op {
                WrOp::Read => (half, 0u64),
                _ => (0, half),
            };
            let (src_host, src_off) = if op == WrOp::Read {
                (1, remote)
            } else {
                (0, local)
            };
            let seed = (i as u8).wrapping_mul(31) ^ u8::from(op == WrOp::Read);
            {
                let mem = tb.hosts[src_host]
                    .engine
                    .mem_mut()
                    .slice_mut(MEM_BASE + src_off, len as usize);
                for (k, b) in mem.iter_mut().enumerate() {
                    *b = (k as u8).wrapping_mul(7) ^ seed;
                }
            }
            let wr = SendWr {
                wr_id: i as u64,
                op,
                lkey: tb.hosts[0].mr.lkey,
                local_va: MEM_BASE + local,
                len,
                rkey: tb.hosts[1].mr.rkey,
                remote_va: MEM_BASE + remote,
                signaled: true,
            };
            let now = tb.now();
            let qpn = tb.hosts[0].qpn;
            tb.hosts[0].engine.post_send(qpn, wr, now).expect("post");
            let cqe = loop {
                tb.poll();
                if let Some(c) = tb.hosts[0].engine.poll_completion() {
                    break c;
                }
            };
            assert_eq!(cqe.status, WcStatus::Success, "{op:?} {len}");
            let a = tb.hosts[0]
                .engine
                .mem()
                .slice(MEM_BASE + local, len as usize)
                .to_vec();
            let b = tb.hosts[1]
                .engine
                .mem()
                .slice(MEM_BASE + remote, len as usize)
                .to_vec();
            assert_eq!(a, b, "{op:?} of {len} bytes arrived intact");
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
    let mut w = dataplane::pcap::Writer::create(&path).unwrap();
    for (i, f) in tap.iter().enumerate() {
        w.write(std::time::Duration::from_nanos(i as u64), f)
            .unwrap();
    }
    w.finish().unwrap();
    let mut r = dataplane::pcap::Reader::open(&path).unwrap();
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
