//! A QP shard's port (`ShardPort`) on the two queue pairs of a net_ring
//! port, a peer port sending on its queue 0 (so every frame arrives at
//! shard 0's queue):
//! - a frame for a QP of shard 1 reaches shard 1, a frame for shard 0's
//!   stays there, a non-RoCE IPv4 frame stays where it arrived;
//! - an ARP frame reaches both shards;
//! - more frames for shard 1 than its inbox holds, while shard 1 reads
//!   none, all arrive, in order, once it reads (they wait, none dropped);
//! - a frame a shard sends to its own device's MAC reaches the shard of
//!   its QP and does not leave through the port.
//!
//! One EAL per process (harness = false).

mod loopback_util;

use std::sync::Arc;

use dataplane::dpdk::{ring_pair_queues, Mbuf, Mempool, Port};
use dataplane::shard_port::{Inboxes, ShardPort, INBOX_FRAMES};
use nic::{Frame, FramePort};
use transport::rc::{QpnSpace, QPN_BASE};
use transport::wire::MacAddr;

const DEVICE: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);

/// A RoCEv2 frame's headers (Ethernet, IPv4, UDP to 4791, BTH) to `dst`
/// for QP `qpn`, numbered `seq` in the BTH's PSN, and an ICRC's room.
fn roce(dst: MacAddr, qpn: u32, seq: u32) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&dst.0);
    f.extend_from_slice(&[2, 0, 0, 0, 0, 2, 0x08, 0x00]);
    let ip_len = 20 + 8 + 12 + 4;
    f.extend_from_slice(&[0x45, 0, 0, ip_len, 0, 0, 0x40, 0, 64, 17, 0, 0]);
    f.extend_from_slice(&[10, 0, 0, 2, 10, 0, 0, 1]);
    f.extend_from_slice(&[0x12, 0xb7, 0x12, 0xb7, 0, 8 + 12 + 4, 0, 0]);
    let q = qpn.to_be_bytes();
    let p = seq.to_be_bytes();
    f.extend_from_slice(&[
        0x0a, 0, 0xff, 0xff, 0, q[1], q[2], q[3], 0, p[1], p[2], p[3],
    ]);
    f.extend_from_slice(&[0; 4]);
    f
}

/// The PSN a `roce` frame carries.
fn seq_of(f: &Mbuf) -> u32 {
    let d = f.data();
    u32::from_be_bytes([0, d[51], d[52], d[53]])
}

fn mbuf(pool: &Mempool, bytes: &[u8]) -> Mbuf {
    let mut m = pool.alloc().expect("an mbuf");
    assert!(m.set(bytes));
    m
}

/// Everything `port` yields over `passes` bursts.
fn drain(port: &mut ShardPort, passes: usize) -> Vec<Mbuf> {
    let mut out = Vec::new();
    for _ in 0..passes {
        port.rx_burst(0, &mut out, 32);
    }
    out
}

/// Sends `frames` from the peer (its TX queue 0: shard 0's RX queue).
fn send(peer: &mut Port, frames: Vec<Mbuf>) {
    let mut frames = frames;
    while !frames.is_empty() {
        assert!(peer.tx_burst(0, &mut frames) > 0, "the ring took nothing");
    }
}

fn main() {
    let eal = loopback_util::eal("shard-steering", &[]);
    let pool = Arc::new(Mempool::with_frames(&eal, "shard_steering", 8191, 0, 2048).expect("pool"));
    let (a, b) = ring_pair_queues(&eal, "steer", 4096, 2).expect("ring pair");
    let port = Port::start_queues(&eal, a, &pool, 1024, 2).expect("port a");
    assert_eq!(port.queues, 2);
    let mut peer = Port::start_queues(&eal, b, &pool, 1024, 2).expect("port b");
    let inboxes = Inboxes::new(2);
    let mut shards: Vec<ShardPort> = port
        .into_queues()
        .into_iter()
        .enumerate()
        .map(|(k, q)| ShardPort::new(q, DEVICE, k as u32, inboxes.clone()))
        .collect();
    let qp = |shard: u32| QpnSpace::new(shard, 2).unwrap().qpn(3);
    assert_eq!(QpnSpace::owner(qp(1), 2), 1);

    // Each frame to its QP's shard; a non-RoCE frame stays.
    let mut udp = roce(DEVICE, qp(1), 0);
    udp[36..38].copy_from_slice(&9999u16.to_be_bytes());
    send(
        &mut peer,
        vec![
            mbuf(&pool, &roce(DEVICE, qp(1), 1)),
            mbuf(&pool, &roce(DEVICE, qp(0), 2)),
            mbuf(&pool, &udp),
        ],
    );
    let at0 = drain(&mut shards[0], 2);
    let at1 = drain(&mut shards[1], 2);
    assert_eq!(at0.iter().map(seq_of).collect::<Vec<_>>(), [2, 0]);
    assert_eq!(at1.iter().map(seq_of).collect::<Vec<_>>(), [1]);
    assert_eq!(shards[0].counters().passed, 1);
    assert_eq!(shards[1].counters().taken, 1);
    println!("ok: a frame reaches its QP's shard; a non-RoCE frame stays where it arrived");

    // ARP: every shard.
    let arp = transport::wire::ArpRepr::request(
        MacAddr([2, 0, 0, 0, 0, 2]),
        "10.0.0.2".parse().unwrap(),
        "10.0.0.1".parse().unwrap(),
    );
    let mut bytes = [0u8; 64];
    let n = arp.emit_tagged(None, &mut bytes).unwrap();
    send(&mut peer, vec![mbuf(&pool, &bytes[..n])]);
    let (at0, at1) = (drain(&mut shards[0], 2), drain(&mut shards[1], 2));
    assert_eq!((at0.len(), at1.len()), (1, 1));
    assert_eq!(at0[0].data(), at1[0].data());
    assert_eq!(shards[0].counters().copied, 1);
    println!("ok: an ARP frame reaches both shards");

    // More than an inbox holds, shard 1 not reading: they wait, in order.
    let many = INBOX_FRAMES + 500;
    let frames: Vec<Mbuf> = (0..many as u32)
        .map(|i| mbuf(&pool, &roce(DEVICE, qp(1), 100 + i)))
        .collect();
    send(&mut peer, frames);
    assert!(drain(&mut shards[0], 200).is_empty());
    assert!(shards[0].counters().waited_full > 0);
    let mut got = Vec::new();
    for _ in 0..500 {
        shards[0].rx_burst(0, &mut Vec::new(), 32);
        shards[1].rx_burst(0, &mut got, 32);
    }
    let seqs: Vec<u32> = got.iter().map(seq_of).collect();
    assert_eq!(seqs, (100..100 + many as u32).collect::<Vec<_>>());
    println!(
        "ok: {many} frames for a shard that did not read, {} of them waited for its full inbox: all arrived, in order",
        shards[0].counters().waited_full
    );
    drop(got);

    // Sent to the own device: to the QP's shard, not out of the port.
    let mut out = vec![
        mbuf(&pool, &roce(DEVICE, qp(0), 7)),
        mbuf(&pool, &roce(MacAddr([2, 0, 0, 0, 0, 2]), QPN_BASE, 8)),
    ];
    assert_eq!(shards[1].tx_burst(0, &mut out), 2);
    assert!(out.is_empty());
    let at0 = drain(&mut shards[0], 2);
    assert_eq!(at0.iter().map(seq_of).collect::<Vec<_>>(), [7]);
    let mut wire = Vec::new();
    peer.rx_burst(0, &mut wire, 32);
    assert_eq!(wire.iter().map(seq_of).collect::<Vec<_>>(), [8]);
    assert_eq!(shards[1].counters().looped, 1);
    println!("ok: a frame to the own device reaches its QP's shard, the other leaves");
}
