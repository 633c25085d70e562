//! What the daemon reads from an application: arbitrary bytes as a shared
//! segment holding a send ring (scribbled indices, garbage WQEs: any
//! opcode, SGE count, inline length), a receive ring (garbage receive
//! WQEs) and a CQ ring (scribbled consumer index), and as control-socket
//! frames. Nothing may panic; every WQE the rings yield decodes or is
//! refused by name.
#![no_main]

use std::mem::size_of;

use libfuzzer_sys::fuzz_target;
use shm::abi::{Consumer, Cqe, HeapSegment, Producer, RecvWqe, RingLayout, Wqe};

fuzz_target!(|data: &[u8]| {
    let mut frames = data.to_vec();
    while let Ok(Some(_)) = shm::proto::unframe::<shm::proto::RequestMsg>(&mut frames) {}

    let sq_bytes = RingLayout::bytes(8, size_of::<Wqe>());
    let rq_bytes = RingLayout::bytes(8, size_of::<RecvWqe>());
    let cq_bytes = RingLayout::bytes(8, size_of::<Cqe>());
    let mut mem = data.to_vec();
    mem.resize(sq_bytes + rq_bytes + cq_bytes, 0);
    let seg = HeapSegment::from_bytes(mem);
    let mut sq = Consumer::<Wqe>::new(RingLayout::new(0, 8, size_of::<Wqe>()).unwrap());
    let mut rq =
        Consumer::<RecvWqe>::new(RingLayout::new(sq_bytes, 8, size_of::<RecvWqe>()).unwrap());
    let cq_at = sq_bytes + rq_bytes;
    let mut cq = Producer::<Cqe>::new(RingLayout::new(cq_at, 8, size_of::<Cqe>()).unwrap());
    for _ in 0..16 {
        match sq.pop(&seg) {
            Ok(Some(w)) => {
                if let Ok(wr) = w.to_wr() {
                    // What decodes encodes back to the same request.
                    let again = Wqe::from_wr(&wr).expect("a decoded WQE encodes");
                    assert_eq!(again.to_wr(), Ok(wr));
                }
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
    for _ in 0..16 {
        match rq.pop(&seg) {
            Ok(Some(w)) => {
                if let Ok(wr) = w.to_wr() {
                    let again = RecvWqe::from_wr(&wr).expect("a decoded receive WQE encodes");
                    assert_eq!(again.to_wr(), Ok(wr));
                }
            }
            Ok(None) | Err(_) => break,
        }
    }
    let _ = cq.take_armed(&seg);
});
