//! Receive queues: the receive WQEs a QP's incoming SENDs (and RDMA WRITEs
//! with immediate) consume, either the QP's own or a shared receive queue
//! (SRQ) that several QPs of one protection domain draw from. An SRQ can be
//! armed with a limit: when it falls below, one limit event is raised and
//! the limit disarms (ibverbs' IBV_EVENT_SRQ_LIMIT_REACHED).

use std::collections::VecDeque;

use super::types::RecvWr;
use crate::mr::Pd;

/// Receive WQEs one queue may hold.
pub const MAX_RECV_WR: usize = 1 << 16;

#[derive(Debug)]
pub(crate) struct RecvQueue {
    q: VecDeque<RecvWr>,
    cap: usize,
    pub pd: Pd,
    /// A shared receive queue (else one QP's own).
    pub shared: bool,
    /// QPs that draw from it.
    pub users: u32,
    /// Armed SRQ limit (0: disarmed).
    limit: u32,
}

impl RecvQueue {
    pub fn new(pd: Pd, cap: usize, shared: bool) -> Self {
        RecvQueue {
            q: VecDeque::new(),
            cap: cap.max(1),
            pd,
            shared,
            users: 0,
            limit: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.q.len()
    }

    /// Queues a WQE; `false` when the queue is full.
    pub fn post(&mut self, wr: RecvWr) -> bool {
        if self.q.len() >= self.cap {
            return false;
        }
        self.q.push_back(wr);
        true
    }

    /// Takes the oldest WQE; the second value says the armed limit was just
    /// crossed (the limit is then disarmed).
    pub fn pop(&mut self) -> Option<(RecvWr, bool)> {
        let wr = self.q.pop_front()?;
        let crossed = self.limit > 0 && (self.q.len() as u64) < u64::from(self.limit);
        if crossed {
            self.limit = 0;
        }
        Some((wr, crossed))
    }

    /// Arms (or with 0 disarms) the limit; an SRQ already below it raises
    /// the event at its next use.
    pub fn set_limit(&mut self, limit: u32) {
        self.limit = limit;
    }

    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// Takes every WQE (the queue's QP went to ERR).
    pub fn drain(&mut self) -> impl Iterator<Item = RecvWr> + '_ {
        self.q.drain(..)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rc::SgList;
    use proptest::prelude::*;

    fn wr(id: u64) -> RecvWr {
        RecvWr {
            wr_id: id,
            sg: SgList::EMPTY,
        }
    }

    proptest! {
        /// Any sequence of posts and takes: WQEs come out in post order, the
        /// queue never holds more than its capacity, and the limit event
        /// fires exactly when a take leaves fewer WQEs than the armed limit,
        /// once per arming.
        #[test]
        fn a_receive_queue_is_a_bounded_fifo_with_a_one_shot_limit(
            cap in 1usize..20,
            ops in prop::collection::vec((any::<bool>(), 0u32..6), 0..200),
        ) {
            let mut q = RecvQueue::new(0, cap, true);
            let (mut next_in, mut next_out) = (0u64, 0u64);
            for (post, arm) in ops {
                if arm == 5 {
                    q.set_limit(3);
                }
                if post {
                    let ok = q.post(wr(next_in));
                    prop_assert_eq!(ok, (next_in - next_out) < cap as u64);
                    if ok {
                        next_in += 1;
                    }
                } else {
                    let armed = q.limit();
                    match q.pop() {
                        Some((w, crossed)) => {
                            prop_assert_eq!(w.wr_id, next_out);
                            next_out += 1;
                            let left = next_in - next_out;
                            prop_assert_eq!(crossed, armed > 0 && left < u64::from(armed));
                            if crossed {
                                prop_assert_eq!(q.limit(), 0);
                            }
                        }
                        None => prop_assert_eq!(next_in, next_out),
                    }
                }
                prop_assert!(q.len() <= cap);
            }
        }
    }
}
