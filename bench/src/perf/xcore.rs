//! The cross-core floor of `write-lat --compare`: what any NIC whose
//! dataplane runs on another core than the application pays, with no
//! protocol at all. A helper thread stands for the dataplane: it spins on
//! the stamp the application side writes right after the message (for
//! 64 B, in a second line, as a WQE with its data inline takes two: its
//! header with the stamp, then the data), copies the message into
//! the receiver's buffer, its last word last, and the receiver spins on
//! that word (as perftest spins on the last byte of the data). One round
//! trip is two such hops (client -> server, server -> client), as a WRITE
//! ping-pong through our daemon; each hop moves the message and its stamp
//! to the helper's core and the message back, each buffer in cache lines
//! of its own (no line shared between the two directions, or between the
//! sender's and the receiver's buffers). The helper runs where the daemon's lcore runs (its CPU when
//! `--pin` placed it, floating otherwise); outside a measurement it
//! sleeps, so that it takes no CPU from the rounds of ours and the other
//! baselines.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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

/// One direction's buffers: the sender's message followed by its stamp,
/// and the receiver's copy.
struct Hop {
    /// `words` message words, then the stamp.
    src: Words,
    dst: Words,
    words: usize,
}

impl Hop {
    fn new(words: usize) -> Hop {
        Hop {
            src: Words::new(words + 1),
            dst: Words::new(words),
            words,
        }
    }

    /// The application side writes the message, then its stamp.
    fn post(&self, seq: u64) {
        for w in self.src.iter().take(self.words) {
            w.store(seq, Ordering::Relaxed);
        }
        self.src.word(self.words).store(seq, Ordering::Release);
    }

    /// The dataplane side: a new stamp moves the message, its last word
    /// last; returns whether one did.
    fn serve(&self, seen: &mut u64) -> bool {
        let seq = self.src.word(self.words).load(Ordering::Acquire);
        if seq == *seen {
            return false;
        }
        *seen = seq;
        let last = self.words - 1;
        for i in 0..last {
            let v = self.src.word(i).load(Ordering::Relaxed);
            self.dst.word(i).store(v, Ordering::Relaxed);
        }
        let v = self.src.word(last).load(Ordering::Relaxed);
        self.dst.word(last).store(v, Ordering::Release);
        true
    }

    /// The receiving application spins until the message `seq` is there
    /// (its last word).
    fn wait(&self, seq: u64, stop: &AtomicBool) -> Result<(), String> {
        let t0 = Instant::now();
        let mut k = 0u32;
        let last = self.dst.word(self.words - 1);
        while last.load(Ordering::Acquire) != seq {
            k = k.wrapping_add(1);
            if k % 4096 == 0 && t0.elapsed() > Duration::from_secs(30) {
                stop.store(true, Ordering::Relaxed);
                return Err("the cross-core helper did not move a message in 30 s".into());
            }
        }
        Ok(())
    }
}

struct Shared {
    there: Hop,
    back: Hop,
    stop: AtomicBool,
    /// A measurement runs: the helper spins.
    active: AtomicBool,
}

/// The helper thread and the two directions it serves.
pub struct CrossCore {
    shared: Arc<Shared>,
    helper: Option<JoinHandle<()>>,
    seq: u64,
}

impl CrossCore {
    /// Buffers for messages of `size` bytes (rounded up to 8); the helper
    /// on CPU `cpu`, or floating.
    pub fn new(size: u32, cpu: Option<usize>) -> CrossCore {
        let words = (size as usize).div_ceil(8).max(1);
        let shared = Arc::new(Shared {
            there: Hop::new(words),
            back: Hop::new(words),
            stop: AtomicBool::new(false),
            active: AtomicBool::new(false),
        });
        let s = Arc::clone(&shared);
        let helper = std::thread::spawn(move || {
            if let Some(id) = cpu {
                core_affinity::set_for_current(core_affinity::CoreId { id });
            }
            let (mut a, mut b) = (0, 0);
            while !s.stop.load(Ordering::Relaxed) {
                if !s.active.load(Ordering::Acquire) {
                    std::thread::park_timeout(Duration::from_millis(1));
                    continue;
                }
                s.there.serve(&mut a);
                s.back.serve(&mut b);
            }
        });
        CrossCore {
            shared,
            helper: Some(helper),
            seq: 0,
        }
    }

    /// Median round trip (two hops) over `iters` ping-pongs, ns.
    pub fn rtt_ns(&mut self, iters: u64) -> Result<f64, String> {
        let s = Arc::clone(&self.shared);
        s.active.store(true, Ordering::Release);
        if let Some(h) = &self.helper {
            h.thread().unpark();
        }
        let mut v = Vec::with_capacity(iters as usize);
        let mut run = || -> Result<(), String> {
            for _ in 0..iters.max(1) {
                self.seq += 1;
                let t0 = Instant::now();
                s.there.post(self.seq);
                s.there.wait(self.seq, &s.stop)?;
                s.back.post(self.seq);
                s.back.wait(self.seq, &s.stop)?;
                v.push(t0.elapsed().as_nanos() as f64);
            }
            Ok(())
        };
        let r = run();
        s.active.store(false, Ordering::Release);
        r?;
        Ok(super::baseline::median(&mut v))
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
    fn every_hop_delivers_the_message() {
        for size in [0, 12, 64, 4096] {
            let mut x = CrossCore::new(size, None);
            assert!(x.rtt_ns(100).unwrap() > 0.0);
            let s = &x.shared;
            for h in [&s.there, &s.back] {
                // Every word the helper copied holds the last message.
                assert_eq!(h.dst.n, (size as usize).div_ceil(8).max(1));
                assert!(h.dst.iter().all(|w| w.load(Ordering::Relaxed) == 100));
            }
        }
    }
}
