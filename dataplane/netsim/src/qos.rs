//! Quality-of-service queues of a switch egress port (HPCC++ 2023 s9.3):
//! data frames are sorted by DSCP into classes, each with its own FIFO,
//! and the port picks the next class by deficit weighted round robin
//! (each class's share of the port follows its weight while it has
//! frames) or by strict priority (class 0 first).
//!
//! This module owns the classes of one port: their queues and byte counts,
//! the scheduler's state (round-robin position and deficits) and the
//! per-class counters, including the sojourn time of every frame sent
//! (egress minus ingress timestamp). Without a [`QosConfig`] a port has
//! one class, which is today's single FIFO.

use std::collections::VecDeque;

use hdrhistogram::Histogram;

/// How a port picks the class that sends next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheduler {
    /// Deficit weighted round robin: per round a class may send
    /// `weight x quantum_bytes` (what it did not use carries over while
    /// it has frames).
    Dwrr,
    /// The lowest-numbered class with a frame always goes first.
    Strict,
}

/// The classes of every data port of a switch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QosConfig {
    pub scheduler: Scheduler,
    /// One weight per class (DWRR; strict priority ignores them), each
    /// at least 1.
    pub weights: Vec<u32>,
    /// The class of each DSCP value; values at or past the number of
    /// classes mean the last class.
    pub dscp_class: [u8; 64],
    /// Bytes per unit of weight per DWRR round (at least one MTU-sized
    /// frame keeps a round to one visit per class).
    pub quantum_bytes: u32,
}

/// Why a QoS configuration cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QosError {
    #[error("QoS needs 1 to {max} classes; {0} given", max = MAX_CLASSES)]
    Classes(usize),
    #[error("QoS class {class} has weight 0; weights are at least 1")]
    Weight { class: usize },
    #[error("QoS quantum_bytes = 0; it must be at least 1")]
    Quantum,
}

/// Most classes a port has (as 802.1p priorities).
pub const MAX_CLASSES: usize = 8;

impl QosConfig {
    /// DWRR over `weights`, every DSCP in the last class until
    /// [`QosConfig::map_dscp`] says otherwise, a quantum of 4 KiB.
    pub fn dwrr(weights: &[u32]) -> Self {
        QosConfig {
            scheduler: Scheduler::Dwrr,
            weights: weights.to_vec(),
            dscp_class: [u8::MAX; 64],
            quantum_bytes: 4096,
        }
    }

    /// Puts DSCP `dscp` (0..64) into `class`.
    pub fn map_dscp(mut self, dscp: u8, class: u8) -> Self {
        self.dscp_class[usize::from(dscp & 63)] = class;
        self
    }

    pub fn check(&self) -> Result<(), QosError> {
        if self.weights.is_empty() || self.weights.len() > MAX_CLASSES {
            return Err(QosError::Classes(self.weights.len()));
        }
        if let Some(class) = self.weights.iter().position(|&w| w == 0) {
            return Err(QosError::Weight { class });
        }
        if self.quantum_bytes == 0 {
            return Err(QosError::Quantum);
        }
        Ok(())
    }

    /// The class frames of DSCP `dscp` go to.
    pub fn class_of(&self, dscp: u8) -> usize {
        usize::from(self.dscp_class[usize::from(dscp & 63)]).min(self.weights.len() - 1)
    }
}

/// Counters of one class of one port.
#[derive(Debug, Clone)]
pub struct ClassCounters {
    pub enqueued: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    /// Sojourn times of the frames sent (ns): egress minus ingress
    /// (recorded with QoS on), and their sum.
    pub sojourn_ns: Option<Histogram<u64>>,
    pub sojourn_sum_ns: u64,
    pub max_qlen: u64,
}

impl ClassCounters {
    /// Counters with a sojourn histogram (QoS on) or without.
    fn new(record: bool) -> Self {
        ClassCounters {
            enqueued: 0,
            tx_packets: 0,
            tx_bytes: 0,
            // 1 ns to 100 s, 3 significant digits; longer saturates.
            sojourn_ns: record
                .then(|| Histogram::new_with_bounds(1, 100_000_000_000, 3).expect("valid bounds")),
            sojourn_sum_ns: 0,
            max_qlen: 0,
        }
    }

    /// The sojourn time at quantile `q` (0 without a histogram).
    pub fn sojourn_at(&self, q: f64) -> u64 {
        self.sojourn_ns
            .as_ref()
            .map_or(0, |h| h.value_at_quantile(q))
    }
}

/// A queued data frame, with the ingress port whose shared-buffer bytes
/// it holds (`u32::MAX`: none), the port's paused-time clock when it was
/// queued (for PFC's head-of-line delay) and when it arrived.
#[derive(Debug)]
pub(crate) struct Queued<F> {
    pub frame: F,
    pub ingress: u32,
    pub paused_clock: u64,
    pub arrived: u64,
}

#[derive(Debug)]
struct Class<F> {
    queue: VecDeque<Queued<F>>,
    bytes: u64,
    /// Bytes this class sent before the frame being sent now.
    tx_bytes: u64,
    deficit: u64,
    counters: ClassCounters,
}

/// The data classes of one port and its scheduler.
#[derive(Debug)]
pub(crate) struct Classes<F> {
    classes: Vec<Class<F>>,
    scheduler: Scheduler,
    /// Per class, bytes per DWRR round.
    quanta: Vec<u64>,
    /// DWRR: the class whose turn it is, and whether it has had its
    /// quantum for this turn.
    turn: usize,
    topped_up: bool,
    /// Record sojourn histograms (with QoS on; a single FIFO does not).
    record: bool,
}

impl<F: AsRef<[u8]>> Classes<F> {
    /// One FIFO (no QoS).
    pub fn single() -> Self {
        Self::build(Scheduler::Strict, vec![1], false)
    }

    pub fn new(cfg: &QosConfig) -> Self {
        let quanta = cfg
            .weights
            .iter()
            .map(|&w| u64::from(w) * u64::from(cfg.quantum_bytes))
            .collect();
        Self::build(cfg.scheduler, quanta, true)
    }

    fn build(scheduler: Scheduler, quanta: Vec<u64>, record: bool) -> Self {
        Classes {
            classes: quanta
                .iter()
                .map(|_| Class {
                    queue: VecDeque::new(),
                    bytes: 0,
                    tx_bytes: 0,
                    deficit: 0,
                    counters: ClassCounters::new(record),
                })
                .collect(),
            scheduler,
            quanta,
            turn: 0,
            topped_up: false,
            record,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.classes.iter().all(|c| c.queue.is_empty())
    }

    pub fn len(&self) -> usize {
        self.classes.len()
    }

    /// Bytes queued in `class`.
    pub fn bytes(&self, class: usize) -> u64 {
        self.classes[class].bytes
    }

    /// Bytes `class` has sent.
    pub fn tx_bytes(&self, class: usize) -> u64 {
        self.classes[class].tx_bytes
    }

    /// How long the frame at the head of `class` has waited at `now` (0
    /// when the class is empty).
    pub fn head_wait(&self, class: usize, now: u64) -> u64 {
        self.classes[class]
            .queue
            .front()
            .map_or(0, |q| now.saturating_sub(q.arrived))
    }

    pub fn counters(&self, class: usize) -> &ClassCounters {
        &self.classes[class].counters
    }

    /// Forgets the sojourn times recorded so far (a measured window opens).
    pub fn reset_sojourn(&mut self) {
        for c in &mut self.classes {
            if let Some(h) = c.counters.sojourn_ns.as_mut() {
                h.reset();
            }
        }
    }

    pub fn push(&mut self, class: usize, q: Queued<F>) {
        let c = &mut self.classes[class];
        c.bytes += q.frame.as_ref().len() as u64;
        c.counters.enqueued += 1;
        c.counters.max_qlen = c.counters.max_qlen.max(c.bytes);
        c.queue.push_back(q);
    }

    /// Takes the next frame by the scheduler, and its class, sent at
    /// `start` (its sojourn is counted).
    pub fn pop(&mut self, start: u64) -> Option<(Queued<F>, usize)> {
        let class = self.pick()?;
        let c = &mut self.classes[class];
        let q = c.queue.pop_front()?;
        let len = q.frame.as_ref().len() as u64;
        c.bytes -= len;
        c.tx_bytes += len;
        c.counters.tx_packets += 1;
        c.counters.tx_bytes += len;
        if self.record {
            let sojourn = start.saturating_sub(q.arrived);
            if let Some(h) = c.counters.sojourn_ns.as_mut() {
                h.saturating_record(sojourn);
            }
            c.counters.sojourn_sum_ns += sojourn;
        }
        Some((q, class))
    }

    /// The class whose frame goes next.
    fn pick(&mut self) -> Option<usize> {
        if self.classes.len() == 1 || self.scheduler == Scheduler::Strict {
            return self.classes.iter().position(|c| !c.queue.is_empty());
        }
        if self.is_empty() {
            return None;
        }
        // Each visit to a class with frames adds its quantum, so a frame
        // of any size is reached after finitely many rounds.
        loop {
            let n = self.classes.len();
            let c = &mut self.classes[self.turn];
            match c.queue.front() {
                None => c.deficit = 0,
                Some(head) => {
                    if !self.topped_up {
                        c.deficit += self.quanta[self.turn];
                        self.topped_up = true;
                    }
                    let len = head.frame.as_ref().len() as u64;
                    if len <= c.deficit {
                        c.deficit -= len;
                        let class = self.turn;
                        if c.queue.len() == 1 {
                            // Its last frame: the class leaves the round
                            // with nothing saved.
                            c.deficit = 0;
                            self.next(n);
                        }
                        return Some(class);
                    }
                }
            }
            self.next(n);
        }
    }

    fn next(&mut self, n: usize) {
        self.turn = (self.turn + 1) % n;
        self.topped_up = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(len: usize, arrived: u64) -> Queued<Vec<u8>> {
        Queued {
            frame: vec![0; len],
            ingress: u32::MAX,
            paused_clock: 0,
            arrived,
        }
    }

    /// Bytes each class sends while every class stays backlogged.
    fn shares(cfg: &QosConfig, lens: &[usize], frames: usize) -> Vec<f64> {
        let mut c = Classes::new(cfg);
        for (class, &len) in lens.iter().enumerate() {
            for _ in 0..frames * 4 {
                c.push(class, q(len, 0));
            }
        }
        let mut sent = vec![0u64; lens.len()];
        for _ in 0..frames {
            let (f, class) = c.pop(0).unwrap();
            sent[class] += f.frame.len() as u64;
        }
        let total: u64 = sent.iter().sum();
        sent.iter().map(|&s| s as f64 / total as f64).collect()
    }

    #[test]
    fn dwrr_shares_follow_the_weights_within_5_percent() {
        for (weights, lens) in [
            (vec![3, 1], vec![1078, 1078]),
            (vec![3, 1], vec![1078, 4150]),
            (vec![1, 1, 2], vec![300, 1078, 9000]),
            (vec![5, 1], vec![64, 4150]),
        ] {
            let cfg = QosConfig::dwrr(&weights);
            let got = shares(&cfg, &lens, 20_000);
            let sum: u32 = weights.iter().sum();
            for (class, (&w, &g)) in weights.iter().zip(&got).enumerate() {
                let want = f64::from(w) / f64::from(sum);
                assert!(
                    (g - want).abs() <= 0.05 * want,
                    "weights {weights:?} lens {lens:?}: class {class} got {g:.4}, want {want:.4}"
                );
            }
        }
    }

    #[test]
    fn strict_priority_sends_class_0_while_it_has_frames() {
        let cfg = QosConfig {
            scheduler: Scheduler::Strict,
            ..QosConfig::dwrr(&[1, 1])
        };
        let mut c = Classes::new(&cfg);
        c.push(1, q(100, 0));
        c.push(0, q(100, 0));
        c.push(0, q(100, 0));
        let order: Vec<usize> = std::iter::from_fn(|| c.pop(0).map(|x| x.1)).collect();
        assert_eq!(order, [0, 0, 1]);
    }

    #[test]
    fn an_idle_class_leaves_the_port_to_the_others() {
        // Weight 1 of 4, but alone: it gets every turn.
        let mut c = Classes::new(&QosConfig::dwrr(&[3, 1]));
        for _ in 0..10 {
            c.push(1, q(1000, 0));
        }
        assert!((0..10).all(|_| c.pop(0).map(|x| x.1) == Some(1)));
        assert!(c.pop(0).is_none() && c.is_empty());
    }

    #[test]
    fn sojourn_is_egress_minus_ingress_per_class() {
        let mut c = Classes::new(&QosConfig::dwrr(&[1, 1]));
        c.push(0, q(100, 1_000));
        c.push(1, q(100, 1_500));
        assert_eq!(c.head_wait(1, 2_000), 500);
        assert_eq!(c.head_wait(0, 500), 0, "no negative waits");
        c.pop(3_000);
        c.pop(3_000);
        let h0 = c.counters(0).sojourn_ns.as_ref().unwrap();
        let h1 = c.counters(1).sojourn_ns.as_ref().unwrap();
        assert!(h0.equivalent(h0.max(), 2_000) && h1.equivalent(h1.max(), 1_500));
        assert_eq!((c.tx_bytes(0), c.tx_bytes(1)), (100, 100));
    }

    #[test]
    fn bad_configs_are_named() {
        assert_eq!(QosConfig::dwrr(&[]).check(), Err(QosError::Classes(0)));
        assert_eq!(
            QosConfig::dwrr(&[1, 0]).check(),
            Err(QosError::Weight { class: 1 })
        );
        let cfg = QosConfig::dwrr(&[3, 1]).map_dscp(26, 0).map_dscp(10, 1);
        assert_eq!(cfg.check(), Ok(()));
        assert_eq!(
            (cfg.class_of(26), cfg.class_of(10), cfg.class_of(0)),
            (0, 1, 1)
        );
    }
}
