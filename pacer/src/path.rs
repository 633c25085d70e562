//! Path choice from telemetry (HPCC++ 2023 s9.4): a sender with several
//! paths to its peer (UDP source ports that ECMP hashes to different
//! routes) learns each path's load from inband telemetry and moves its flow
//! to a clearly less loaded one, with hysteresis so that it does not flap.
//!
//! This module owns the decision only, in path indices `0..paths` (the
//! caller maps them to source ports): each path's utilization U (the most
//! utilized hop, as HPCC++ measures it) from the stacks of the current
//! path's ACKs and of probes sent on the others, when to probe which path,
//! and when to move. A move is asked for; the caller drains what is in
//! flight on the old path (so that nothing arrives out of order) and then
//! calls [`PathChooser::moved`]. Time is passed in.

use crate::hpcc::busiest_hop;
use crate::telemetry::HopStack;

/// When to move, and how often to look at the other paths.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PathConfig {
    /// Paths to choose from, the current one included (2..=16).
    pub paths: u8,
    /// One other path is probed per interval, in turn, while the flow
    /// has data in flight (ns).
    pub probe_interval_ns: u64,
    /// Move only off a path whose U is at least this.
    pub busy_u: f64,
    /// ... to a path whose U is lower by at least this much.
    pub margin: f64,
    /// Stay on a path at least this long after a move (ns).
    pub dwell_ns: u64,
    /// A path's U older than this is not trusted (ns).
    pub stale_ns: u64,
}

impl PathConfig {
    /// Four paths, a probe per base RTT `t_ns`, move off U >= 0.95 to a
    /// path 0.3 lower, at most once per 20 T, samples trusted for 4 probe
    /// rounds.
    pub fn new(t_ns: u64) -> Self {
        let t = t_ns.max(1);
        PathConfig {
            paths: 4,
            probe_interval_ns: t,
            busy_u: 0.95,
            margin: 0.3,
            dwell_ns: 20 * t,
            stale_ns: 4 * 4 * t,
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct PathState {
    /// The last stack seen on the path, and when.
    last: Option<(HopStack, u64)>,
    /// EWMA of the busiest hop's U over T, and when it was last updated.
    u: Option<(f64, u64)>,
    /// The path id the switches folded into the last stack.
    path_id: u16,
}

/// Counters of a chooser.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PathCounters {
    pub probes: u64,
    pub samples: u64,
    pub moves: u64,
}

/// The path decision of one flow.
#[derive(Debug, Clone)]
pub struct PathChooser {
    cfg: PathConfig,
    t_ns: u64,
    paths: Vec<PathState>,
    current: usize,
    /// When the flow came to the current path.
    since: u64,
    next_probe: u64,
    /// The path probed last.
    turn: usize,
    /// A move asked for and not done yet.
    moving_to: Option<usize>,
    counters: PathCounters,
}

impl PathChooser {
    /// A flow on path 0 at `now`, with base RTT `t_ns`.
    pub fn new(cfg: PathConfig, t_ns: u64, now: u64) -> Self {
        let n = usize::from(cfg.paths.clamp(2, 16));
        PathChooser {
            cfg,
            t_ns: t_ns.max(1),
            paths: vec![PathState::default(); n],
            current: 0,
            since: now,
            next_probe: now,
            turn: 0,
            moving_to: None,
            counters: PathCounters::default(),
        }
    }

    pub fn current(&self) -> usize {
        self.current
    }

    pub fn paths(&self) -> usize {
        self.paths.len()
    }

    pub fn counters(&self) -> PathCounters {
        self.counters
    }

    /// The path a move was asked to and not yet done.
    pub fn moving_to(&self) -> Option<usize> {
        self.moving_to
    }

    /// Path `path`'s U at `now`, if fresh.
    pub fn utilization(&self, path: usize, now: u64) -> Option<f64> {
        let (u, at) = self.paths.get(path)?.u?;
        (now.saturating_sub(at) <= self.cfg.stale_ns).then_some(u)
    }

    /// A stack that came back from `path` at `now` (an ACK's echo on the
    /// current path, a probe response on another) with the path id the
    /// switches folded into it.
    pub fn on_stack(&mut self, path: usize, now: u64, hops: &HopStack, path_id: u16) {
        let Some(p) = self.paths.get_mut(path) else {
            return;
        };
        let t = self.t_ns as f64;
        // A stack from another route (its path id changed) starts over.
        if let Some((last, _)) = p.last.filter(|_| p.path_id == path_id) {
            if let Some((sample, dt)) = busiest_hop(hops, &last, t) {
                let tau = dt.min(t);
                let u = match p
                    .u
                    .filter(|&(_, at)| now.saturating_sub(at) <= self.cfg.stale_ns)
                {
                    Some((u, _)) => (1.0 - tau / t) * u + tau / t * sample,
                    None => sample,
                };
                p.u = Some((u, now));
                self.counters.samples += 1;
            }
        } else {
            p.u = None;
        }
        p.last = Some((*hops, now));
        p.path_id = path_id;
    }

    /// The other path to probe at `now`, if one is due and the flow has
    /// data in flight; the probe's answer goes to [`PathChooser::on_stack`].
    pub fn poll_probe(&mut self, now: u64, in_flight: bool) -> Option<usize> {
        if !in_flight || now < self.next_probe || self.moving_to.is_some() {
            return None;
        }
        self.next_probe = now + self.cfg.probe_interval_ns.max(1);
        let n = self.paths.len();
        self.turn = (self.turn + 1) % n;
        if self.turn == self.current {
            self.turn = (self.turn + 1) % n;
        }
        self.counters.probes += 1;
        Some(self.turn)
    }

    /// When the next probe is due.
    pub fn probe_deadline(&self) -> u64 {
        self.next_probe
    }

    /// Whether to move at `now`, and where: only after the dwell time on
    /// the current path, only off a busy path (U >= `busy_u`), only to
    /// the least utilized fresh path, and only when that is lower by the
    /// margin. Once asked, the same move is returned until
    /// [`PathChooser::moved`].
    pub fn decide(&mut self, now: u64) -> Option<usize> {
        if let Some(to) = self.moving_to {
            return Some(to);
        }
        if now.saturating_sub(self.since) < self.cfg.dwell_ns {
            return None;
        }
        let cur = self.utilization(self.current, now)?;
        if cur < self.cfg.busy_u {
            return None;
        }
        let (best, u) = (0..self.paths.len())
            .filter(|&p| p != self.current)
            .filter_map(|p| self.utilization(p, now).map(|u| (p, u)))
            .min_by(|a, b| a.1.total_cmp(&b.1))?;
        if u > cur - self.cfg.margin {
            return None;
        }
        self.moving_to = Some(best);
        Some(best)
    }

    /// The caller finished moving the flow to `path` at `now` (nothing of
    /// it was left in flight on the old path).
    pub fn moved(&mut self, path: usize, now: u64) {
        if path >= self.paths.len() {
            return;
        }
        if path != self.current {
            self.counters.moves += 1;
        }
        self.current = path;
        self.since = now;
        self.moving_to = None;
        // The stacks seen before the move describe the old load.
        self.paths[path].last = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::Hop;

    const T: u64 = 10_000;

    /// A one-hop stack of a 100G port that has sent at `util` of its
    /// rate since time 0, with `qlen` queued, at `ts`.
    fn stack(ts: u32, util: f64, qlen: u32) -> HopStack {
        HopStack::from_slice(&[Hop {
            ts_ns: ts,
            tx_bytes: (f64::from(ts) * 12.5 * util) as u32,
            qlen,
            rate_100mbps: 1000,
            switch_id: 1,
            port_id: 1,
        }])
    }

    /// Feeds path `p` a stack per T from `from` to `to` at `util`.
    fn feed(c: &mut PathChooser, p: usize, util: f64, from: u64, to: u64) {
        let mut t = from;
        while t <= to {
            c.on_stack(p, t, &stack(t as u32, util, 0), p as u16);
            t += T;
        }
    }

    #[test]
    fn a_busy_path_moves_to_a_clearly_idler_one_after_the_dwell_time() {
        let mut c = PathChooser::new(PathConfig::new(T), T, 0);
        feed(&mut c, 0, 1.0, 0, 30 * T);
        feed(&mut c, 2, 0.3, 0, 30 * T);
        feed(&mut c, 1, 0.9, 0, 30 * T);
        assert!((c.utilization(0, 30 * T).unwrap() - 1.0).abs() < 0.01);
        assert_eq!(c.decide(10 * T), None, "within the dwell time");
        assert_eq!(c.decide(30 * T), Some(2), "the least utilized");
        assert_eq!(c.decide(31 * T), Some(2), "asked until done");
        c.moved(2, 32 * T);
        assert_eq!((c.current(), c.counters().moves), (2, 1));
        assert_eq!(c.decide(33 * T), None);
    }

    #[test]
    fn hysteresis_no_move_off_a_path_below_busy_or_for_a_small_gain() {
        let mut c = PathChooser::new(PathConfig::new(T), T, 0);
        // Current below busy_u: stays however idle the others are.
        feed(&mut c, 0, 0.9, 0, 30 * T);
        feed(&mut c, 1, 0.0, 0, 30 * T);
        assert_eq!(c.decide(30 * T), None);
        // Busy, but the best other path is only 0.2 lower.
        let mut c = PathChooser::new(PathConfig::new(T), T, 0);
        feed(&mut c, 0, 1.0, 0, 30 * T);
        feed(&mut c, 1, 0.8, 0, 30 * T);
        assert_eq!(c.decide(30 * T), None);
        // Stale samples of another path are not trusted.
        let mut c = PathChooser::new(PathConfig::new(T), T, 0);
        feed(&mut c, 1, 0.0, 0, 2 * T);
        feed(&mut c, 0, 1.0, 0, 100 * T);
        assert_eq!(c.decide(100 * T), None);
    }

    #[test]
    fn two_equally_busy_paths_never_flap() {
        // Both paths carry the same load: no move, ever.
        let mut c = PathChooser::new(PathConfig::new(T), T, 0);
        for k in 0..200u64 {
            let t = k * T;
            for p in 0..2 {
                c.on_stack(p, t, &stack(t as u32, 1.0, 20_000), p as u16);
            }
            assert_eq!(c.decide(t), None);
        }
        assert_eq!(c.counters().moves, 0);
    }

    #[test]
    fn probes_take_the_other_paths_in_turn_only_while_data_is_in_flight() {
        let mut c = PathChooser::new(PathConfig::new(T), T, 0);
        assert_eq!(c.poll_probe(0, false), None, "an idle flow does not probe");
        let mut seen = Vec::new();
        for k in 0..6 {
            seen.push(c.poll_probe(k * T, true));
            assert_eq!(c.poll_probe(k * T + 1, true), None, "one per interval");
        }
        assert_eq!(seen, [Some(1), Some(2), Some(3), Some(1), Some(2), Some(3)]);
        c.moved(2, 6 * T);
        let next: Vec<_> = (7..10).map(|k| c.poll_probe(k * T, true)).collect();
        assert_eq!(next, [Some(0), Some(1), Some(3)], "never the current path");
    }

    #[test]
    fn a_new_path_id_restarts_the_estimate() {
        let mut c = PathChooser::new(PathConfig::new(T), T, 0);
        feed(&mut c, 1, 0.2, 0, 5 * T);
        assert!(c.utilization(1, 5 * T).is_some());
        // The route changed (another path id): no delta across it.
        c.on_stack(1, 6 * T, &stack(6 * T as u32, 0.9, 0), 77);
        assert_eq!(c.utilization(1, 6 * T), None);
    }
}
