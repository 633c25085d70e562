//! The cost of authenticated feedback per ACK: the MAC over an echoed
//! stack of 1, 3 and 5 hops (what the receiver computes once per ACK and
//! the sender once more to verify), the token of a subscribed data
//! packet, and a domain boundary's rewrite of a 5-hop stack into relative
//! load (per frame it forwards).

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use transport::rc::auth::{ack_mac, int_token, AckId, FeedbackKey};
use transport::wire::{HopRecord, Tlm, TlmRepr};

fn bench(c: &mut Criterion) {
    let key = FeedbackKey([7; 16]);
    let id = AckId {
        dest_qp: 0x12,
        psn: 100,
        syndrome: 0x1f,
        msn: 7,
    };
    for hops in [1u8, 3, 5] {
        let mut t = TlmRepr::empty(5);
        t.echo = true;
        t.nhop = hops;
        for (i, h) in t.hops.iter_mut().take(usize::from(hops)).enumerate() {
            *h = HopRecord {
                ts_ns: 1000 * i as u32,
                tx_bytes: 77 * i as u32,
                qlen: 3000,
                rate: 1000,
                switch_id: i as u8,
                port_id: 1,
            };
        }
        c.bench_function(&format!("ack_mac/{hops}_hops"), |b| {
            b.iter(|| ack_mac(black_box(&key), black_box(id), black_box(&t)))
        });
        if hops == 5 {
            let mut block = vec![0u8; t.block_len()];
            t.emit(&mut block);
            c.bench_function("make_relative/5_hops", |b| {
                b.iter(|| {
                    let mut v = Tlm::new_checked(black_box(&mut block[..])).unwrap();
                    v.make_relative()
                })
            });
        }
    }
    c.bench_function("int_token", |b| {
        b.iter(|| int_token(black_box(&key), black_box(0x12), black_box(100)))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
