//! The daemon's latency trace (`bench write-lat --breakdown`): while on,
//! every stage of every frame of every host's pipeline (`nic::Stage`),
//! every doorbell taken and every CQE published is recorded as a TSC stamp
//! and a packed key, up to a capacity fixed when the trace starts. Off (the
//! default), the pipeline and the application side pay one branch per
//! burst.

use nic::{FrameKey, Stage};

use crate::dpdk::rdtsc;

/// Most stamps one trace holds.
pub const MAX_STAMPS: u32 = 1 << 20;

/// Stamps one `TraceRecords` reply carries (a control message is at most
/// 1 MiB of JSON).
pub const STAMPS_PER_REPLY: usize = 8192;

/// The stamps taken since the trace started.
#[derive(Debug, Default)]
pub struct Trace {
    /// (TSC, packed key) pairs, flattened.
    stamps: Vec<u64>,
    cap: usize,
    /// Stamps not taken: the trace was full.
    pub dropped: u64,
}

impl Trace {
    /// A trace that keeps up to `cap` stamps.
    pub fn new(cap: u32) -> Trace {
        let cap = cap.min(MAX_STAMPS) as usize;
        Trace {
            stamps: Vec::with_capacity(2 * cap),
            cap,
            dropped: 0,
        }
    }

    /// Stamps `key` at `stage` of host `host` now.
    pub fn record(&mut self, host: usize, stage: Stage, key: FrameKey) {
        if self.stamps.len() / 2 >= self.cap {
            self.dropped += 1;
            return;
        }
        self.stamps.push(rdtsc());
        self.stamps.push(key.pack(host, stage));
    }

    /// Stamps taken.
    pub fn len(&self) -> usize {
        self.stamps.len() / 2
    }

    pub fn is_empty(&self) -> bool {
        self.stamps.is_empty()
    }

    /// Up to [`STAMPS_PER_REPLY`] stamps from stamp `from` on, flattened
    /// (TSC, packed key) pairs.
    pub fn page(&self, from: usize) -> Vec<u64> {
        let a = (2 * from).min(self.stamps.len());
        let b = (a + 2 * STAMPS_PER_REPLY).min(self.stamps.len());
        self.stamps[a..b].to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_trace_counts_what_it_drops_and_pages_what_it_kept() {
        let mut t = Trace::new(3);
        for psn in 0..5 {
            let key = FrameKey {
                opcode: 0x0a,
                dest_qp: 0x11,
                psn,
            };
            t.record(1, Stage::Built, key);
        }
        assert_eq!((t.len(), t.dropped), (3, 2));
        let p = t.page(1);
        assert_eq!(p.len(), 4);
        assert!(p[0] <= p[2], "stamps in the order taken");
        let (host, stage, key) = FrameKey::unpack(p[3]).expect("a stage");
        assert_eq!((host, stage, key.psn), (1, Stage::Built, 2));
        assert!(t.page(3).is_empty());
    }
}
