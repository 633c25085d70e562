//! The cross-core floor of `write-lat` and `read-lat --compare`: what
//! any NIC whose dataplane runs on another core than the application pays,
//! with no protocol at all. A helper thread stands for the dataplane: it
//! spins on the stamp the application side writes last, moves what a NIC
//! on that core must move into the receiving buffer, its last word last,
//! and the receiver spins on that word (as perftest spins on the last byte
//! of the data, or polls its CQ).
//!
//! What one round trip moves:
//! - WRITE ping-pong (`write-lat`): two hops, client -> server and server
//!   -> client. Each hop takes the message with its stamp written right
//!   after it to the helper's core (for 64 B, two lines, as a WQE with its
//!   data inline takes: its header with the stamp, then the data), and
//!   the message back into the receiver's buffer.
//! - READ (`read-lat`): one hop: the READ's WQE (its header and one SGE,
//!   one line, the stamp in it) to the helper's core, and a completion
//!   (one CQE, its stamp last) back; the READ's data is written into the
//!   client's buffer on the helper's core, which the client never reads in
//!   the loop, so it crosses nothing.
//!
//! Every buffer is in cache lines of its own (no line shared between the
//! two directions, or between a sender's and a receiver's buffers). The
//! helper runs where the daemon's lcore runs (its CPU when `--pin` placed
//! it, floating otherwise); outside a measurement it sleeps, so that it
//! takes no CPU from the rounds of ours and the other baselines. Each
//! sample reads the clock twice, before and after, and never while it
//! waits ([`super::patience`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::patience::{self, Patience, Samples};

/// One cache line of words.
#[repr(align(64))]
#[derive(Default)]
struct Line([AtomicU64; 8]);

/// `n` words laid out in cache lines of their own.
struct Words {
    lines: Vec<Line>,
    n: usize,
}

impl Words {
    fn new(n: usize) -> Words {
        Words {
            lines: (0..n.div_ceil(8)).map(|_| Line::default()).collect(),
            n,
        }
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        &self.lines[i / 8].0[i % 8]
    }

    fn iter(&self) -> impl Iterator<Item = &AtomicU64> {
        (0..self.n).map(|i| self.word(i))
    }
}

/// One direction's buffers: what the sender writes (its last word the
/// stamp), and what the helper writes for the receiver.
struct Hop {
    /// `src.n - 1` words, then the stamp.
    src: Words,
    dst: Words,
}

impl Hop {
    /// `there` words to the helper (the stamp among them, last), `back`
    /// words from it.
    fn new(there: usize, back: usize) -> Hop {
        Hop {
            src: Words::new(there.max(1)),
            dst: Words::new(back.max(1)),
        }
    }

    fn stamp(&self) -> &AtomicU64 {
        self.src.word(self.src.n - 1)
    }

    /// The application side writes what it sends, its stamp last.
    fn post(&self, seq: u64) {
        for w in self.src.iter().take(self.src.n - 1) {
            w.store(seq, Ordering::Relaxed);
        }
        self.stamp().store(seq, Ordering::Release);
    }

    /// The dataplane side: a new stamp has it read what was sent and
    /// write what the receiver gets, its last word last; returns whether
    /// one did.
    fn serve(&self, seen: &mut u64) -> bool {
        let seq = self.stamp().load(Ordering::Acquire);
        if seq == *seen {
            return false;
        }
        *seen = seq;
        let last = self.dst.n - 1;
        for i in 0..last {
            let v = self.src.word(i.min(self.src.n - 1)).load(Ordering::Relaxed);
            self.dst.word(i).store(v, Ordering::Relaxed);
        }
        // What the copy did not read is read too (a NIC reads a WQE whole).
        let mut rest = 0u64;
        for i in last..self.src.n {
            rest = rest.wrapping_add(self.src.word(i).load(Ordering::Relaxed));
        }
        std::hint::black_box(rest);
        self.dst.word(last).store(seq, Ordering::Release);
        true
    }

    /// The receiving application spins until `seq` is there (the last
    /// word of its buffer).
    fn wait(&self, seq: u64, stop: &AtomicBool) -> Result<(), String> {
        let mut p = Patience::new();
        let last = self.dst.word(self.dst.n - 1);
        while last.load(Ordering::Acquire) != seq {
            if !p.go_on() {
                stop.store(true, Ordering::Relaxed);
                return Err(format!(
                    "the cross-core helper did not move a message in {:?}",
                    patience::GIVE_UP
                ));
            }
        }
        Ok(())
    }
}

struct Shared {
    /// A WRITE ping-pong's two hops, or a READ's one.
    hops: Vec<Hop>,
    stop: AtomicBool,
    /// A measurement runs: the helper spins.
    active: AtomicBool,
}

/// The helper thread and the hops it serves.
pub struct CrossCore {
    shared: Arc<Shared>,
    helper: Option<JoinHandle<()>>,
    seq: u64,
}

/// Words of a READ's WQE (its header and one SGE: one line, the stamp in
/// it) and of its completion.
fn read_words() -> (usize, usize) {
    let wqe = shm::abi::WQE_HEADER_LEN + std::mem::size_of::<transport::rc::Sge>();
    (wqe / 8, std::mem::size_of::<shm::abi::Cqe>() / 8)
}

impl CrossCore {
    /// The hops of one round trip of `write-lat` (`read` false: messages
    /// of `size` bytes, rounded up to 8, each way) or of `read-lat`; the
    /// helper on CPU `cpu`, or floating.
    pub fn new(read: bool, size: u32, cpu: Option<usize>) -> CrossCore {
        let hops = if read {
            let (wqe, cqe) = read_words();
            vec![Hop::new(wqe, cqe)]
        } else {
            let words = (size as usize).div_ceil(8).max(1);
            vec![Hop::new(words + 1, words), Hop::new(words + 1, words)]
        };
        let shared = Arc::new(Shared {
            hops,
            stop: AtomicBool::new(false),
            active: AtomicBool::new(false),
        });
        let s = Arc::clone(&shared);
        let helper = std::thread::spawn(move || {
            if let Some(id) = cpu {
                core_affinity::set_for_current(core_affinity::CoreId { id });
            }
            let mut seen = vec![0u64; s.hops.len()];
            while !s.stop.load(Ordering::Relaxed) {
                if !s.active.load(Ordering::Acquire) {
                    std::thread::park_timeout(Duration::from_millis(1));
                    continue;
                }
                for (h, seen) in s.hops.iter().zip(seen.iter_mut()) {
                    h.serve(seen);
                }
            }
        });
        CrossCore {
            shared,
            helper: Some(helper),
            seq: 0,
        }
    }

    /// Wakes the helper: it spins until [`CrossCore::rest`].
    fn wake(&self) {
        self.shared.active.store(true, Ordering::Release);
        if let Some(h) = &self.helper {
            h.thread().unpark();
        }
    }

    /// Lets the helper sleep between measurements.
    fn rest(&self) {
        self.shared.active.store(false, Ordering::Release);
    }

    /// One round trip: each hop posted and waited for in turn (the helper
    /// awake).
    pub fn round(&mut self) -> Result<(), String> {
        self.seq += 1;
        for h in &self.shared.hops {
            h.post(self.seq);
            h.wait(self.seq, &self.shared.stop)?;
        }
        Ok(())
    }

    /// Runs `f` with the helper awake (it sleeps again after, also on
    /// an error).
    pub fn awake<T>(
        &mut self,
        f: impl FnOnce(&mut CrossCore) -> Result<T, String>,
    ) -> Result<T, String> {
        self.wake();
        let r = f(self);
        self.rest();
        r
    }

    /// Median round trip over `iters` round trips, ns.
    pub fn rtt_ns(&mut self, iters: u64) -> Result<f64, String> {
        self.awake(|x| {
            let mut v = Samples::with_capacity(iters);
            for _ in 0..iters.max(1) {
                v.time(|| x.round())?;
            }
            Ok(v.median())
        })
    }
}

impl Drop for CrossCore {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.helper.take() {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_ping_pong_moves_the_message_both_ways() {
        for size in [0, 12, 64, 4096] {
            let mut x = CrossCore::new(false, size, None);
            assert!(x.rtt_ns(100).unwrap() > 0.0);
            let words = (size as usize).div_ceil(8).max(1);
            assert_eq!(x.shared.hops.len(), 2);
            for h in &x.shared.hops {
                // The message and its stamp there, the message back.
                assert_eq!((h.src.n, h.dst.n), (words + 1, words));
                // Every word the helper copied holds the last message.
                assert!(h.dst.iter().all(|w| w.load(Ordering::Relaxed) == 100));
            }
        }
    }

    #[test]
    fn a_read_moves_one_wqe_there_and_one_completion_back() {
        let mut x = CrossCore::new(true, 4096, None);
        assert!(x.rtt_ns(100).unwrap() > 0.0);
        assert_eq!(x.shared.hops.len(), 1, "one hop, whatever the size");
        let h = &x.shared.hops[0];
        // A 64-byte WQE (header and one SGE), a 32-byte CQE.
        assert_eq!((h.src.n, h.dst.n), (8, 4));
        assert_eq!(h.src.lines.len(), 1);
        assert!(h.dst.iter().all(|w| w.load(Ordering::Relaxed) == 100));
    }
}
