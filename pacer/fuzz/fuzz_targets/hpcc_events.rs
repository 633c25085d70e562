//! Fuzz HPCC++ with arbitrary sequences of telemetry events (sender- and
//! receiver-based): no panic, W always finite and within [W_min, W_init].
#![no_main]

use libfuzzer_sys::fuzz_target;
use pacer::hpcc::{Hpcc, HpccParams};
use pacer::rx_hpcc::RxHpcc;
use pacer::telemetry::{Hop, HopStack};

fuzz_target!(|data: &[u8]| {
    let p = HpccParams::new(100_000_000_000, 5_000, 16, 1024).unwrap();
    let mut tx = Hpcc::new(p);
    let mut rx = RxHpcc::new(p);
    let mut now = 0u64;
    // Each event: ack_seq(3) snd_nxt(3) nhop(1) then nhop x 16-byte hops.
    let mut rest = data;
    while rest.len() >= 7 {
        let ack = u32::from_be_bytes([0, rest[0], rest[1], rest[2]]);
        let nxt = u32::from_be_bytes([0, rest[3], rest[4], rest[5]]);
        let nhop = usize::from(rest[6] % 4);
        rest = &rest[7..];
        let mut hops = HopStack::new();
        for _ in 0..nhop {
            if rest.len() < 16 {
                return;
            }
            let r = |i: usize| u32::from_be_bytes([rest[i], rest[i + 1], rest[i + 2], rest[i + 3]]);
            hops.push(Hop {
                ts_ns: r(0),
                tx_bytes: r(4),
                qlen: r(8),
                rate_100mbps: u16::from_be_bytes([rest[12], rest[13]]),
                switch_id: rest[14] % 4,
                port_id: rest[15] % 2,
            });
            rest = &rest[16..];
        }
        now += u64::from(ack % 10_000);
        tx.new_ack(ack, nxt, &hops);
        let _ = rx.new_int(now, &hops);
        for c in [tx.core(), rx.core()] {
            assert!(c.w().is_finite() && c.u().is_finite());
            assert!(c.w() >= p.w_min && c.w() <= p.w_init);
        }
    }
});
