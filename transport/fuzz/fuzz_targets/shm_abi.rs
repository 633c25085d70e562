//! What the daemon reads from an application: arbitrary bytes as a shared
//! segment holding an SQ ring (scribbled indices, garbage WQEs) and a CQ
//! ring (scribbled consumer index), and as control-socket frames. Nothing
//! may panic; every WQE the ring yields decodes or is refused by name.
#![no_main]

use libfuzzer_sys::fuzz_target;
use transport::abi::{Consumer, Cqe, HeapSegment, Producer, RingLayout, Wqe};

fuzz_target!(|data: &[u8]| {
    let mut frames = data.to_vec();
    while let Ok(Some(_)) = verbs::proto::unframe::<verbs::proto::RequestMsg>(&mut frames) {}

    let sq_bytes = RingLayout::bytes(8, 64);
    let cq_bytes = RingLayout::bytes(8, 32);
    let mut mem = data.to_vec();
    mem.resize(sq_bytes + cq_bytes, 0);
    let seg = HeapSegment::from_bytes(mem);
    let mut sq = Consumer::<Wqe>::new(RingLayout::new(0, 8, 64).unwrap());
    let mut cq = Producer::<Cqe>::new(RingLayout::new(sq_bytes, 8, 32).unwrap());
    for _ in 0..16 {
        match sq.pop(&seg) {
            Ok(Some(w)) => {
                let _ = w.to_wr();
                let _ = cq.push(
                    &seg,
                    &Cqe {
                        wr_id: w.wr_id,
                        ..bytemuck::Zeroable::zeroed()
                    },
                );
            }
            Ok(None) | Err(_) => break,
        }
    }
    let _ = cq.take_armed(&seg);
});
