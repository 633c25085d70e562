//! An in-memory link between two ports of one thread: what one end
//! transmits at `now` the other receives from `now + delay`, in order.
//! Tests, `bench torture` and the fuzz target join NICs with it (wrapped
//! in the fault injector when the wire should misbehave).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;

use transport::wire::MacAddr;

use crate::port::FramePort;

type Queue = VecDeque<(u64, Vec<u8>)>;

/// One end of an in-memory link.
#[derive(Debug)]
pub struct MemPort {
    mac: MacAddr,
    mtu: u32,
    delay_ns: u64,
    /// Frames towards this end, then frames towards the other end.
    queues: Rc<RefCell<[Queue; 2]>>,
    side: usize,
}

/// Two ports joined by a link of one-way delay `delay_ns`.
pub fn mem_link(macs: [MacAddr; 2], mtu: u32, delay_ns: u64) -> (MemPort, MemPort) {
    let queues = Rc::new(RefCell::new([Queue::new(), Queue::new()]));
    let end = |side: usize| MemPort {
        mac: macs[side],
        mtu,
        delay_ns,
        queues: queues.clone(),
        side,
    };
    (end(0), end(1))
}

impl MemPort {
    /// Puts a frame on the link towards this end, arriving at `at` (tests
    /// inject hand-made frames this way). Frames arrive in the order they
    /// were put on the link.
    pub fn inject(&self, at: u64, frame: Vec<u8>) {
        self.queues.borrow_mut()[self.side].push_back((at, frame));
    }

    /// Frames on their way to this end.
    pub fn in_flight(&self) -> usize {
        self.queues.borrow()[self.side].len()
    }
}

impl FramePort for MemPort {
    type Frame = Vec<u8>;

    fn rx_burst(&mut self, now: u64, out: &mut Vec<Vec<u8>>, max: usize) -> usize {
        let mut q = self.queues.borrow_mut();
        let inbound = &mut q[self.side];
        let mut n = 0;
        while n < max && inbound.front().is_some_and(|f| f.0 <= now) {
            let (_, f) = inbound.pop_front().expect("front checked");
            out.push(f);
            n += 1;
        }
        n
    }

    fn tx_burst(&mut self, now: u64, frames: &mut Vec<Vec<u8>>) -> usize {
        let mut q = self.queues.borrow_mut();
        let outbound = &mut q[1 - self.side];
        let n = frames.len();
        outbound.extend(frames.drain(..).map(|f| (now + self.delay_ns, f)));
        n
    }

    fn alloc(&mut self) -> Option<Vec<u8>> {
        Some(Vec::new())
    }

    fn next_event(&self) -> Option<u64> {
        self.queues.borrow()[self.side].front().map(|f| f.0)
    }

    fn mac(&self) -> MacAddr {
        self.mac
    }

    fn mtu(&self) -> u32 {
        self.mtu
    }

    fn link_up(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_arrive_after_the_delay_in_order() {
        let (mut a, mut b) = mem_link([MacAddr([2; 6]), MacAddr([3; 6])], 1500, 100);
        a.tx_burst(10, &mut vec![vec![1], vec![2]]);
        let mut got = Vec::new();
        assert_eq!(b.rx_burst(109, &mut got, 32), 0);
        assert_eq!(b.next_event(), Some(110));
        assert_eq!(b.rx_burst(110, &mut got, 1), 1);
        assert_eq!(b.rx_burst(110, &mut got, 32), 1);
        assert_eq!(got, vec![vec![1], vec![2]]);
        assert_eq!(a.next_event(), None);
        assert_eq!(a.rx_burst(1000, &mut got, 32), 0);
    }
}
