//! The fault injector: a port wrapper that loses, duplicates, reorders,
//! delays and corrupts the frames passing through it, either at random
//! from a seed ([`FaultConfig`]) or by a script that decides each frame
//! ([`Fault`]). Like smoltcp's fault-injecting device, it wraps any port:
//! the in-memory link of tests and `bench torture`, the fuzz target's link,
//! or a DPDK port made lossy from the configuration.
//!
//! Corruption flips one bit that the ICRC protects and that no switch
//! rewrites ([`RoceFrame::rewritten_in_flight`]): TTL, ECN, the checksums,
//! BTH byte 4 and the TLM block are left alone, so every corrupted frame
//! must be caught by the receiver's ICRC check. Frames that are not RoCEv2
//! are never corrupted (counted in `not_corruptible`).
//!
//! Every frame the injector takes out of the stream is counted by reason,
//! and a lost frame can be recorded ([`FaultInjector::record_losses`]): the
//! evidence that a frame a peer sent was taken by our own lossy link, not
//! never sent.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use transport::wire::{MacAddr, RoceFrame};

use crate::port::{copy_frame, Frame, FramePort};
use crate::tap::SharedCapture;

/// Which frames the injector touches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Direction {
    /// Frames the wrapped port receives.
    Rx,
    /// Frames sent through the wrapped port.
    Tx,
    #[default]
    Both,
}

/// Seeded random faults; probabilities are per frame, in [0, 1].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FaultConfig {
    pub seed: u64,
    pub loss: f64,
    pub duplicate: f64,
    pub reorder: f64,
    /// Probability that one bit of a frame is flipped.
    pub corrupt: f64,
    /// Probability that a connection-setup MAD (a RoCEv2 frame to QP1
    /// that is not a CM DREQ or DREP) is lost, on top of `loss`: the CMs'
    /// retries under test. Teardown is spared: a program that destroys
    /// its rdma_cm id right after its DREQ stops that DREQ's retries (as
    /// Linux's CM does), so a lost DREQ leaves its peer waiting for good.
    pub mad_loss: f64,
    /// Every frame is held this long (added latency), ns.
    pub delay_ns: u64,
    /// A reordered frame is held 1 ..= `reorder_ns` longer than the rest;
    /// a duplicate follows its original within half of it.
    pub reorder_ns: u64,
    pub direction: Direction,
}

impl Default for FaultConfig {
    fn default() -> Self {
        FaultConfig {
            seed: 1,
            loss: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            corrupt: 0.0,
            mad_loss: 0.0,
            delay_ns: 0,
            reorder_ns: 8_000,
            direction: Direction::Both,
        }
    }
}

/// A probability outside [0, 1], named.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
#[error("{name} = {value} is not a probability in [0, 1]")]
pub struct BadProbability {
    pub name: &'static str,
    pub value: f64,
}

impl FaultConfig {
    /// Checks every probability.
    pub fn validate(&self) -> Result<(), BadProbability> {
        for (name, value) in [
            ("loss", self.loss),
            ("duplicate", self.duplicate),
            ("reorder", self.reorder),
            ("corrupt", self.corrupt),
            ("mad_loss", self.mad_loss),
        ] {
            if !(0.0..=1.0).contains(&value) {
                return Err(BadProbability { name, value });
            }
        }
        Ok(())
    }
}

/// What a script does with one frame.
pub enum Fault {
    Deliver,
    Drop,
    /// Deliver it twice, back to back.
    Duplicate,
    /// Deliver it this many ns late (later frames may overtake it).
    Delay(u64),
    /// Flip bit `bit` of the byte at offset `at`.
    FlipBit {
        at: usize,
        bit: u8,
    },
    /// Rewrite it as a network element would (mark CE, push a hop record).
    Rewrite(Rewrite),
}

/// A rewrite of a frame in flight.
pub type Rewrite = Box<dyn FnOnce(&mut [u8])>;

/// Decides each frame: its direction, its bytes and its number (from 0, in
/// the order the injector saw frames).
pub type Script = Box<dyn FnMut(Direction, &[u8], u64) -> Fault + Send>;

/// What the injector did, by reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FaultCounters {
    /// Frames that went through the injector.
    pub frames: u64,
    pub lost: u64,
    pub duplicated: u64,
    /// Frames held back past later ones (reordered or delayed by a script).
    pub reordered: u64,
    pub corrupted: u64,
    /// Corrupted frames (duplicates included) passed on.
    pub corrupted_delivered: u64,
    pub rewritten: u64,
    /// Frames picked for corruption that are not RoCEv2 (left intact).
    pub not_corruptible: u64,
    /// Duplicates not made because the port had no buffer, and frames
    /// held in pieces dropped because their buffer could not hold them
    /// whole for a fault to act on.
    pub no_buffer: u64,
}

enum Policy {
    /// Frames pass untouched (a port configured without faults).
    None,
    Seeded(FaultConfig, Box<ChaCha8Rng>),
    Script(Script),
}

/// A frame waiting for its release time.
struct Held<F> {
    at: u64,
    seq: u64,
    corrupted: bool,
    frame: F,
}

impl<F> PartialEq for Held<F> {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl<F> Eq for Held<F> {}
impl<F> PartialOrd for Held<F> {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl<F> Ord for Held<F> {
    /// Reversed: the heap's top is the earliest release.
    fn cmp(&self, o: &Self) -> Ordering {
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

/// A port whose frames meet faults.
pub struct FaultInjector<P: FramePort> {
    policy: Policy,
    direction: Direction,
    delay_ns: u64,
    rx_held: BinaryHeap<Held<P::Frame>>,
    tx_held: BinaryHeap<Held<P::Frame>>,
    /// Released frames the inner port did not take yet.
    tx_due: Vec<P::Frame>,
    scratch: Vec<P::Frame>,
    seq: u64,
    counters: FaultCounters,
    /// Where lost frames are recorded, when asked.
    lost: Option<SharedCapture>,
    // Last: held frames are freed before the port (and its pool).
    inner: P,
}

impl<P: FramePort> FaultInjector<P> {
    /// Seeded random faults on `inner` (the configuration is checked).
    pub fn new(inner: P, cfg: FaultConfig) -> Result<Self, BadProbability> {
        cfg.validate()?;
        let rng = Box::new(ChaCha8Rng::seed_from_u64(cfg.seed));
        Ok(Self::with_policy(
            inner,
            Policy::Seeded(cfg, rng),
            cfg.direction,
            cfg.delay_ns,
        ))
    }

    /// No faults: every frame passes untouched, at the cost of a branch.
    pub fn passthrough(inner: P) -> Self {
        Self::with_policy(inner, Policy::None, Direction::Both, 0)
    }

    /// Seeded faults when `cfg` is given, else a pass-through.
    pub fn maybe(inner: P, cfg: Option<FaultConfig>) -> Result<Self, BadProbability> {
        match cfg {
            Some(c) => Self::new(inner, c),
            None => Ok(Self::passthrough(inner)),
        }
    }

    /// Faults decided frame by frame by `script`, on frames going `direction`.
    pub fn scripted(inner: P, direction: Direction, script: Script) -> Self {
        Self::with_policy(inner, Policy::Script(script), direction, 0)
    }

    fn with_policy(inner: P, policy: Policy, direction: Direction, delay_ns: u64) -> Self {
        FaultInjector {
            inner,
            policy,
            direction,
            delay_ns,
            rx_held: BinaryHeap::new(),
            tx_held: BinaryHeap::new(),
            tx_due: Vec::new(),
            scratch: Vec::new(),
            seq: 0,
            counters: FaultCounters::default(),
            lost: None,
        }
    }

    /// Records every frame the injector loses, both directions, into
    /// `capture` (whose Ethernet source tells which way each went).
    pub fn record_losses(mut self, capture: Option<SharedCapture>) -> Self {
        self.lost = capture;
        self
    }

    /// Counts a lost frame and records it when asked.
    fn lose(&mut self, now: u64, frame: &[u8]) {
        self.counters.lost += 1;
        if let Some(c) = &self.lost {
            c.lock()
                .unwrap_or_else(|p| p.into_inner())
                .record(now, frame);
        }
    }

    pub fn counters(&self) -> &FaultCounters {
        &self.counters
    }

    pub fn inner(&self) -> &P {
        &self.inner
    }

    pub fn inner_mut(&mut self) -> &mut P {
        &mut self.inner
    }

    fn touches(&self, d: Direction) -> bool {
        self.direction == Direction::Both || self.direction == d
    }

    /// Decides one frame and files what survives (with its copies) in
    /// `held`, to leave at their release times.
    fn apply(&mut self, dir: Direction, now: u64, mut frame: P::Frame, rx: bool) {
        self.counters.frames += 1;
        let n = self.counters.frames - 1;
        let mut at = now.saturating_add(self.delay_ns);
        let mut dup_at = None;
        let mut corrupted = false;
        let mut lost = false;
        // Faults read and change a frame's bytes as one buffer.
        if !matches!(self.policy, Policy::None) && !frame.linearize() {
            self.counters.no_buffer += 1;
            return;
        }
        match &mut self.policy {
            Policy::None => {}
            Policy::Seeded(cfg, rng) => {
                // (No draw for MADs without mad_loss: a seed's faults stay
                // what they were.)
                let mad = cfg.mad_loss > 0.0 && setup_mad(frame.as_ref());
                if rng.gen_bool(cfg.loss) || (mad && rng.gen_bool(cfg.mad_loss)) {
                    lost = true;
                } else {
                    if rng.gen_bool(cfg.corrupt) {
                        corrupted = flip_random_bit(frame.as_mut(), rng);
                        if !corrupted {
                            self.counters.not_corruptible += 1;
                        }
                    }
                    let span = cfg.reorder_ns.max(2);
                    if rng.gen_bool(cfg.reorder) {
                        at = at.saturating_add(rng.gen_range(1..=span));
                        self.counters.reordered += 1;
                    }
                    if rng.gen_bool(cfg.duplicate) {
                        dup_at = Some(at.saturating_add(rng.gen_range(1..=span / 2)));
                    }
                }
            }
            Policy::Script(script) => match script(dir, frame.as_ref(), n) {
                Fault::Deliver => {}
                Fault::Drop => lost = true,
                Fault::Duplicate => dup_at = Some(at),
                Fault::Delay(ns) => {
                    at = at.saturating_add(ns);
                    self.counters.reordered += 1;
                }
                Fault::FlipBit { at: i, bit } => {
                    if let Some(b) = frame.as_mut().get_mut(i) {
                        *b ^= 1 << (bit & 7);
                        corrupted = true;
                    }
                }
                Fault::Rewrite(f) => {
                    f(frame.as_mut());
                    self.counters.rewritten += 1;
                }
            },
        }
        if lost {
            self.lose(now, frame.as_ref());
            return;
        }
        self.counters.corrupted += u64::from(corrupted);
        if let Some(t) = dup_at {
            match copy_frame(&mut self.inner, frame.as_ref()) {
                Some(copy) => {
                    self.counters.duplicated += 1;
                    self.hold(rx, t, corrupted, copy);
                }
                None => self.counters.no_buffer += 1,
            }
        }
        self.hold(rx, at, corrupted, frame);
    }

    fn hold(&mut self, rx: bool, at: u64, corrupted: bool, frame: P::Frame) {
        self.seq += 1;
        let h = Held {
            at,
            seq: self.seq,
            corrupted,
            frame,
        };
        if rx {
            self.rx_held.push(h);
        } else {
            self.tx_held.push(h);
        }
    }

    /// Passes released transmit frames to the inner port.
    fn flush_tx(&mut self, now: u64) {
        while self.tx_held.peek().is_some_and(|h| h.at <= now) {
            let h = self.tx_held.pop().expect("peeked");
            self.counters.corrupted_delivered += u64::from(h.corrupted);
            self.tx_due.push(h.frame);
        }
        if !self.tx_due.is_empty() {
            self.inner.tx_burst(now, &mut self.tx_due);
        }
    }
}

/// Flips one random bit the ICRC protects and no switch rewrites; false
/// when the frame is not RoCEv2.
/// Whether a frame is a RoCEv2 packet to QP1 (a MAD) other than a CM
/// DREQ or DREP.
fn setup_mad(frame: &[u8]) -> bool {
    /// CM attributes DREQ and DREP (IBA 12.6).
    const TEARDOWN: [u16; 2] = [0x0015, 0x0016];
    transport::wire::Packet::parse_unverified(frame).is_ok_and(|p| {
        let attr = p
            .payload
            .get(16..18)
            .map(|a| u16::from_be_bytes([a[0], a[1]]));
        p.repr.bth.dest_qp == 1 && !attr.is_some_and(|a| TEARDOWN.contains(&a))
    })
}

fn flip_random_bit(frame: &mut [u8], rng: &mut ChaCha8Rng) -> bool {
    let Ok(v) = RoceFrame::new_checked(&*frame) else {
        return false;
    };
    let spots: Vec<usize> = v
        .icrc_covered()
        .filter(|&i| !v.rewritten_in_flight(i))
        .collect();
    if spots.is_empty() {
        return false;
    }
    let at = spots[rng.gen_range(0..spots.len())];
    frame[at] ^= 1 << rng.gen_range(0..8);
    true
}

impl<P: FramePort> FaultInjector<P> {
    fn rx_faulty(&mut self, now: u64, out: &mut Vec<P::Frame>, max: usize) -> usize {
        if !self.tx_held.is_empty() || !self.tx_due.is_empty() {
            self.flush_tx(now);
        }
        if !self.touches(Direction::Rx) {
            return self.inner.rx_burst(now, out, max);
        }
        let mut fresh = std::mem::take(&mut self.scratch);
        self.inner.rx_burst(now, &mut fresh, max);
        for f in fresh.drain(..) {
            self.apply(Direction::Rx, now, f, true);
        }
        self.scratch = fresh;
        let mut n = 0;
        while n < max && self.rx_held.peek().is_some_and(|h| h.at <= now) {
            let h = self.rx_held.pop().expect("peeked");
            self.counters.corrupted_delivered += u64::from(h.corrupted);
            out.push(h.frame);
            n += 1;
        }
        n
    }

    fn tx_faulty(&mut self, now: u64, frames: &mut Vec<P::Frame>) -> usize {
        if !self.touches(Direction::Tx) {
            if !self.tx_held.is_empty() || !self.tx_due.is_empty() {
                self.flush_tx(now);
            }
            return self.inner.tx_burst(now, frames);
        }
        let n = frames.len();
        for f in frames.drain(..) {
            self.apply(Direction::Tx, now, f, false);
        }
        self.flush_tx(now);
        n
    }
}

impl<P: FramePort> FramePort for FaultInjector<P> {
    type Frame = P::Frame;

    #[inline]
    fn rx_burst(&mut self, now: u64, out: &mut Vec<P::Frame>, max: usize) -> usize {
        if matches!(self.policy, Policy::None) {
            // A port configured without faults: straight through.
            return self.inner.rx_burst(now, out, max);
        }
        self.rx_faulty(now, out, max)
    }

    #[inline]
    fn tx_burst(&mut self, now: u64, frames: &mut Vec<P::Frame>) -> usize {
        if matches!(self.policy, Policy::None) {
            return self.inner.tx_burst(now, frames);
        }
        self.tx_faulty(now, frames)
    }

    #[inline]
    fn alloc(&mut self) -> Option<P::Frame> {
        self.inner.alloc()
    }

    fn recycle(&mut self, frames: &mut Vec<P::Frame>) {
        self.inner.recycle(frames)
    }

    fn buffers_held(&self) -> usize {
        self.inner.buffers_held()
    }

    fn tx_ready(&self, now: u64) -> usize {
        if self.tx_due.is_empty() {
            self.inner.tx_ready(now)
        } else {
            0
        }
    }

    fn next_event(&self) -> Option<u64> {
        [
            self.inner.next_event(),
            self.rx_held.peek().map(|h| h.at),
            self.tx_held.peek().map(|h| h.at),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    fn mac(&self) -> MacAddr {
        self.inner.mac()
    }

    fn mtu(&self) -> u32 {
        self.inner.mtu()
    }

    fn link_up(&self) -> bool {
        self.inner.link_up()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::mem_link;
    use transport::wire::{Opcode, Packet, PacketRepr, RethRepr, TlmRepr};

    fn frame(i: u32) -> Vec<u8> {
        let mut r = PacketRepr::new(Opcode::RdmaWriteOnly, 0x12, i);
        r.reth = Some(RethRepr {
            va: 0,
            r_key: 1,
            dma_len: 64,
        });
        r.tlm = Some(TlmRepr::empty(2));
        let mut b = vec![0u8; r.frame_len(64)];
        r.emit(&[i as u8; 64], &mut b).unwrap();
        b
    }

    fn run(cfg: FaultConfig, n: u32) -> (Vec<Vec<u8>>, FaultCounters) {
        let macs = [MacAddr([2; 6]), MacAddr([3; 6])];
        let (mut a, b) = mem_link(macs, 1500, 10);
        let mut b = FaultInjector::new(b, cfg).unwrap();
        a.tx_burst(0, &mut (0..n).map(frame).collect());
        let mut got = Vec::new();
        let mut now = 0;
        while let Some(t) = b.next_event() {
            now = t.max(now);
            b.rx_burst(now, &mut got, 32);
        }
        (got, *b.counters())
    }

    #[test]
    fn mad_loss_takes_connection_setup_mads_only() {
        let macs = [MacAddr([2; 6]), MacAddr([3; 6])];
        let (mut a, b) = mem_link(macs, 1500, 10);
        let mut b = FaultInjector::new(
            b,
            FaultConfig {
                mad_loss: 1.0,
                ..FaultConfig::default()
            },
        )
        .unwrap();
        let mut mad = PacketRepr::new(Opcode::SendOnly, 1, 7);
        mad.bth.service = transport::wire::Service::Ud;
        mad.deth = Some(transport::wire::deth::DethRepr {
            q_key: 0x8001_0000,
            src_qp: 1,
        });
        let mut m = vec![0u8; mad.frame_len(256)];
        let mut req = [0u8; 256];
        req[16..18].copy_from_slice(&0x0010u16.to_be_bytes());
        mad.emit(&req, &mut m).unwrap();
        // A DREQ is spared.
        let mut d = vec![0u8; mad.frame_len(256)];
        let mut dreq = [0u8; 256];
        dreq[16..18].copy_from_slice(&0x0015u16.to_be_bytes());
        mad.emit(&dreq, &mut d).unwrap();
        a.tx_burst(0, &mut vec![frame(1), m, d.clone(), frame(2)]);
        let mut got = Vec::new();
        let mut now = 0;
        while let Some(t) = b.next_event() {
            now = t.max(now);
            b.rx_burst(now, &mut got, 32);
        }
        assert_eq!(got, vec![frame(1), d, frame(2)]);
        assert_eq!(b.counters().lost, 1);
    }

    #[test]
    fn the_same_seed_gives_the_same_faults() {
        let cfg = FaultConfig {
            seed: 7,
            loss: 0.1,
            duplicate: 0.1,
            reorder: 0.1,
            corrupt: 0.1,
            ..FaultConfig::default()
        };
        let (a, ca) = run(cfg, 500);
        let (b, cb) = run(cfg, 500);
        assert_eq!((a, ca), (b, cb));
        let (c, _) = run(FaultConfig { seed: 8, ..cfg }, 500);
        assert_ne!(run(cfg, 500).0, c);
    }

    #[test]
    fn every_frame_is_delivered_or_counted() {
        let cfg = FaultConfig {
            seed: 3,
            loss: 0.2,
            duplicate: 0.2,
            reorder: 0.3,
            corrupt: 0.2,
            delay_ns: 500,
            ..FaultConfig::default()
        };
        let (got, c) = run(cfg, 1000);
        assert_eq!(c.frames, 1000);
        assert_eq!(got.len() as u64, c.frames - c.lost + c.duplicated);
        assert!(c.lost > 150 && c.duplicated > 100 && c.reordered > 200 && c.corrupted > 100);
        let bad = got
            .iter()
            .filter(|f| !Packet::parse_unverified(f).is_ok_and(|p| p.icrc_ok()))
            .count() as u64;
        assert_eq!(
            bad, c.corrupted_delivered,
            "every flipped bit breaks the ICRC"
        );
        let psns: Vec<u32> = got
            .iter()
            .filter_map(|f| Packet::parse(f).ok())
            .map(|p| p.repr.bth.psn)
            .collect();
        assert!(
            psns.windows(2).any(|w| w[0] > w[1]),
            "some frames reordered"
        );
    }

    #[test]
    fn every_lost_frame_is_recorded_and_only_those() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lost.pcap");
        let capture = crate::Capture::create(&path, u64::MAX).unwrap();
        let macs = [MacAddr([2; 6]), MacAddr([3; 6])];
        let (mut a, b) = mem_link(macs, 1500, 10);
        let cfg = FaultConfig {
            seed: 5,
            loss: 0.3,
            ..FaultConfig::default()
        };
        let mut b = FaultInjector::new(b, cfg)
            .unwrap()
            .record_losses(Some(capture.clone()));
        a.tx_burst(0, &mut (0..300).map(frame).collect());
        let mut got = Vec::new();
        let mut now = 0;
        while let Some(t) = b.next_event() {
            now = t.max(now);
            b.rx_burst(now, &mut got, 32);
        }
        let lost = b.counters().lost;
        assert_eq!(
            capture.lock().unwrap().finish().unwrap(),
            lost,
            "one record per lost frame"
        );
        let psn = |f: &[u8]| Packet::parse(f).unwrap().repr.bth.psn;
        let mut recorded = Vec::new();
        let mut r = crate::pcap::Reader::open(&path).unwrap();
        while let Some(rec) = r.next_record() {
            recorded.push(psn(&rec.unwrap().data));
        }
        let delivered: Vec<u32> = got.iter().map(|f| psn(f)).collect();
        // The recorded and the delivered frames are all 300, once each.
        let mut all: Vec<u32> = recorded.iter().chain(&delivered).copied().collect();
        all.sort_unstable();
        assert_eq!(all, (0..300).collect::<Vec<_>>());
        assert!(lost > 50, "{lost}");
    }

    #[test]
    fn flips_never_touch_fields_rewritten_in_flight() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let orig = frame(1);
        for _ in 0..2000 {
            let mut f = orig.clone();
            assert!(flip_random_bit(&mut f, &mut rng));
            let v = RoceFrame::new_checked(&orig[..]).unwrap();
            let at = (0..f.len()).find(|&i| f[i] != orig[i]).unwrap();
            assert!(!v.rewritten_in_flight(at) && v.icrc_covered().contains(&at));
        }
        let mut junk = vec![0u8; 60];
        assert!(!flip_random_bit(&mut junk, &mut rng));
    }

    #[test]
    fn a_script_decides_each_frame() {
        let macs = [MacAddr([2; 6]), MacAddr([3; 6])];
        let (a, mut b) = mem_link(macs, 1500, 10);
        let mut a = FaultInjector::scripted(
            a,
            Direction::Tx,
            Box::new(|_, _, n| match n {
                0 => Fault::Drop,
                1 => Fault::Duplicate,
                2 => Fault::Delay(100),
                _ => Fault::FlipBit { at: 60, bit: 0 },
            }),
        );
        a.tx_burst(0, &mut (0..4).map(frame).collect());
        let mut got = Vec::new();
        b.rx_burst(10, &mut got, 32);
        assert_eq!(got.len(), 3, "the duplicate pair and the flipped frame");
        assert!(a.next_event().is_some(), "the delayed frame is held");
        a.rx_burst(100, &mut Vec::new(), 32); // any call releases what is due
        b.rx_burst(1000, &mut got, 32);
        assert_eq!(got.len(), 4);
        let c = a.counters();
        assert_eq!(
            (c.lost, c.duplicated, c.reordered, c.corrupted),
            (1, 1, 1, 1)
        );
    }

    #[test]
    fn probabilities_are_checked() {
        let (a, _) = mem_link([MacAddr([2; 6]), MacAddr([3; 6])], 1500, 0);
        let e = FaultInjector::new(
            a,
            FaultConfig {
                loss: 1.5,
                ..FaultConfig::default()
            },
        )
        .err()
        .unwrap();
        assert_eq!(e.to_string(), "loss = 1.5 is not a probability in [0, 1]");
    }
}
