//! What the daemon reads from an application: arbitrary bytes as a shared
//! segment holding an SQ ring (scribbled indices, garbage WQEs) and a CQ
//! ring (scribbled consumer index), and as control-socket frames. Nothing
//! may panic; every WQE the ring yields decodes or is refused by name.
#![no_main]

use std::cell::RefCell;

use libfuzzer_sys::fuzz_target;
use transport::abi::{Consumer, Cqe, Producer, RingLayout, SharedMem, Wqe};

struct Seg(RefCell<Vec<u8>>);

impl Seg {
    fn word(&self, off: usize) -> u32 {
        let b = self.0.borrow();
        b.get(off..off + 4)
            .map_or(0, |w| u32::from_le_bytes(w.try_into().unwrap()))
    }
}

impl SharedMem for Seg {
    fn load_acquire(&self, off: usize) -> u32 {
        self.word(off)
    }
    fn store_release(&self, off: usize, v: u32) {
        if let Some(w) = self.0.borrow_mut().get_mut(off..off + 4) {
            w.copy_from_slice(&v.to_le_bytes());
        }
    }
    fn swap(&self, off: usize, v: u32) -> u32 {
        let old = self.word(off);
        self.store_release(off, v);
        old
    }
    fn read_bytes(&self, off: usize, dst: &mut [u8]) {
        match self.0.borrow().get(off..off + dst.len()) {
            Some(src) => dst.copy_from_slice(src),
            None => dst.fill(0),
        }
    }
    fn write_bytes(&self, off: usize, src: &[u8]) {
        if let Some(dst) = self.0.borrow_mut().get_mut(off..off + src.len()) {
            dst.copy_from_slice(src);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut frames = data.to_vec();
    while let Ok(Some(_)) = verbs::proto::unframe::<verbs::proto::RequestMsg>(&mut frames) {}

    let sq_bytes = RingLayout::bytes(8, 64);
    let cq_bytes = RingLayout::bytes(8, 32);
    let mut mem = data.to_vec();
    mem.resize(sq_bytes + cq_bytes, 0);
    let seg = Seg(RefCell::new(mem));
    let mut sq = Consumer::<Wqe>::new(RingLayout::new(0, 8, 64).unwrap());
    let mut cq = Producer::<Cqe>::new(RingLayout::new(sq_bytes, 8, 32).unwrap());
    for _ in 0..16 {
        match sq.pop(&seg) {
            Ok(Some(w)) => {
                let _ = w.to_wr();
                let _ = cq.push(&seg, &Cqe { wr_id: w.wr_id, ..bytemuck::Zeroable::zeroed() });
            }
            Ok(None) | Err(_) => break,
        }
    }
    let _ = cq.take_armed(&seg);
});
