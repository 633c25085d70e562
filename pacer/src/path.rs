//! Path choice from telemetry (HPCC++ 2023 s9.4): a sender with several
//! paths to its peer (UDP source ports that ECMP hashes to different
//! routes) learns each path's load from inband telemetry and moves its flow
//! to a clearly less loaded one, with hysteresis so that it does not flap.
//!
//! This module owns the decision only, in path indices `0..paths` (the
//! caller maps them to source ports): each path's spare capacity from the
//! stacks of the current path's ACKs and of probes sent on the others,
//! when to probe which path, and when to move. A move is asked for; the
//! caller drains what is in flight on the old path (so that nothing arrives
//! out of order) and then calls [`PathChooser::moved`]. Time is passed in.
//!
//! Spare capacity, not U: HPCC++ holds every bottleneck near eta whatever
//! its speed, so a saturated 10G link and a saturated 100G link show the
//! same U. A path's spare is the least, over its hops, of B (1 - U) with U
//! measured as HPCC++ measures it (bytes per ns, EWMA over T). The flow
//! moves when another path's spare exceeds what it has now (its own rate
//! plus its path's spare) by a margin, after a dwell time on its path.

use crate::hpcc::hop_samples;
use crate::telemetry::HopStack;

/// When to move, and how often to look at the other paths.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PathConfig {
    /// Paths to choose from, the current one included (2..=16).
    pub paths: u8,
    /// One other path is probed per interval, in turn, while the flow
    /// has data in flight (ns).
    pub probe_interval_ns: u64,
    /// Move only to a path whose spare capacity is more than (1 + margin)
    /// times what the flow has now (its rate and its path's spare).
    pub margin: f64,
    /// Stay on a path at least this long after a move (ns).
    pub dwell_ns: u64,
    /// A path's U older than this is not trusted (ns).
    pub stale_ns: u64,
}

impl PathConfig {
    /// Four paths, a probe per base RTT `t_ns`, move for 50% more, at most
    /// once per 20 T, samples trusted for 4 probe rounds.
    pub fn new(t_ns: u64) -> Self {
        let t = t_ns.max(1);
        PathConfig {
            paths: 4,
            probe_interval_ns: t,
            margin: 0.5,
            dwell_ns: 20 * t,
            stale_ns: 4 * 4 * t,
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct PathState {
    /// The last stack seen on the path, and when.
    last: Option<(HopStack, u64)>,
    /// EWMA over T of the path's spare capacity (bytes per ns), and when
    /// it was last updated.
    spare: Option<(f64, u64)>,
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

    /// The path id the switches folded into `path`'s last stack.
    pub fn path_id(&self, path: usize) -> Option<u16> {
        let p = self.paths.get(path)?;
        p.last.map(|_| p.path_id)
    }

    /// Forgets what was learnt of `path` (the caller gave it another
    /// route).
    pub fn forget(&mut self, path: usize) {
        if path != self.current {
            if let Some(p) = self.paths.get_mut(path) {
                *p = PathState::default();
            }
        }
    }

    /// Whether a route with `path_id` is already known, on a path other
    /// than `except`.
    pub fn known_route(&self, path_id: u16, except: usize) -> bool {
        (0..self.paths.len())
            .filter(|&p| p != except)
            .any(|p| self.path_id(p) == Some(path_id))
    }

    /// The path a move was asked to and not yet done.
    pub fn moving_to(&self) -> Option<usize> {
        self.moving_to
    }

    /// Path `path`'s spare capacity at `now` (bytes per ns), if fresh.
    pub fn spare(&self, path: usize, now: u64) -> Option<f64> {
        let (s, at) = self.paths.get(path)?.spare?;
        (now.saturating_sub(at) <= self.cfg.stale_ns).then_some(s)
    }

    /// A stack that came back from `path` at `now` (an ACK's echo on the
    /// current path, a probe response on another) with the path id the
    /// switches folded into it.
    pub fn on_stack(&mut self, path: usize, now: u64, hops: &HopStack, path_id: u16) {
        let Some(p) = self.paths.get_mut(path) else {
            return;
        };
        let t = self.t_ns as f64;
        // A stack from another route (its path id changed), or after a
        // gap long enough for the counters to have wrapped, starts over.
        let stale = self.cfg.stale_ns;
        let usable = p
            .last
            .filter(|&(_, at)| p.path_id == path_id && now.saturating_sub(at) <= stale);
        if let Some((last, _)) = usable {
            // The tightest hop: least B (1 - U), and its ts delta.
            let tightest = hop_samples(hops, &last, t)
                .map(|(u, b, dt)| (b * (1.0 - u).max(0.0), dt))
                .min_by(|a, b| a.0.total_cmp(&b.0));
            if let Some((sample, dt)) = tightest {
                let tau = dt.min(t);
                let fresh = p
                    .spare
                    .filter(|&(_, at)| now.saturating_sub(at) <= self.cfg.stale_ns);
                let s = match fresh {
                    Some((s, _)) => (1.0 - tau / t) * s + tau / t * sample,
                    None => sample,
                };
                p.spare = Some((s, now));
                self.counters.samples += 1;
            }
        } else {
            p.spare = None;
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

    /// When the next probe is due (none while a move waits: no probe goes
    /// then).
    pub fn probe_deadline(&self) -> Option<u64> {
        self.moving_to.is_none().then_some(self.next_probe)
    }

    /// Whether to move at `now`, for a flow sending `own_rate` (bytes per
    /// ns), and where: only after the dwell time on the current path, only
    /// to the fresh path with the most spare capacity, and only when that
    /// exceeds what the flow has now (its rate plus its path's spare) by
    /// the margin. Once asked, the same move is returned until
    /// [`PathChooser::moved`].
    pub fn decide(&mut self, now: u64, own_rate: f64) -> Option<usize> {
        if let Some(to) = self.moving_to {
            return Some(to);
        }
        if now.saturating_sub(self.since) < self.cfg.dwell_ns {
            return None;
        }
        let have = own_rate.max(0.0) + self.spare(self.current, now)?;
        let (best, spare) = (0..self.paths.len())
            .filter(|&p| p != self.current)
            .filter_map(|p| self.spare(p, now).map(|s| (p, s)))
            .max_by(|a, b| a.1.total_cmp(&b.1))?;
        if spare <= have * (1.0 + self.cfg.margin) {
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

    /// 100G in bytes per ns.
    const B100: f64 = 12.5;

    #[test]
    fn a_flow_moves_to_a_path_with_clearly_more_spare_after_the_dwell_time() {
        let mut c = PathChooser::new(PathConfig::new(T), T, 0);
        feed(&mut c, 0, 0.95, 0, 30 * T);
        feed(&mut c, 2, 0.2, 0, 30 * T);
        feed(&mut c, 1, 0.9, 0, 30 * T);
        let spare = c.spare(2, 30 * T).unwrap();
        assert!((spare - 0.8 * B100).abs() < 0.05, "{spare}");
        // The flow has 1 byte/ns (8 Gb/s): 10 of spare on path 2 beats it.
        assert_eq!(c.decide(10 * T, 1.0), None, "within the dwell time");
        assert_eq!(c.decide(30 * T, 1.0), Some(2), "the most spare");
        assert_eq!(c.decide(31 * T, 1.0), Some(2), "asked until done");
        c.moved(2, 32 * T);
        assert_eq!((c.current(), c.counters().moves), (2, 1));
        assert_eq!(c.decide(33 * T, 1.0), None);
    }

    #[test]
    fn hysteresis_no_move_for_less_than_the_margin_or_on_stale_samples() {
        // The flow already has most of a 100G path: another path with 80%
        // of 100G spare is not 50% more.
        let mut c = PathChooser::new(PathConfig::new(T), T, 0);
        feed(&mut c, 0, 0.95, 0, 30 * T);
        feed(&mut c, 1, 0.2, 0, 30 * T);
        assert_eq!(c.decide(30 * T, 0.9 * B100), None);
        // Stale samples of another path are not trusted.
        let mut c = PathChooser::new(PathConfig::new(T), T, 0);
        feed(&mut c, 1, 0.0, 0, 2 * T);
        feed(&mut c, 0, 1.0, 0, 100 * T);
        assert_eq!(c.decide(100 * T, 0.1), None);
    }

    #[test]
    fn a_saturated_slow_path_loses_to_a_fast_one_with_room() {
        // Path 0: a 10G hop at U 0.95 (the flow gets 1.19 B/ns); path 1:
        // 100G at U 0.7. U alone would not tell them apart at saturation;
        // spare capacity does.
        let mut c = PathChooser::new(PathConfig::new(T), T, 0);
        for k in 0..30u64 {
            let t = k * T;
            let h = stack(t as u32, 0.95, 0).as_slice()[0];
            let slow = HopStack::from_slice(&[Hop {
                rate_100mbps: 100,
                tx_bytes: (t as f64 * 1.25 * 0.95) as u32,
                ..h
            }]);
            c.on_stack(0, t, &slow, 0);
            c.on_stack(1, t, &stack(t as u32, 0.7, 0), 1);
        }
        assert_eq!(c.decide(29 * T, 1.19), Some(1));
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
            assert_eq!(c.decide(t, 0.5 * B100), None);
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
        assert!(c.spare(1, 5 * T).is_some());
        // The route changed (another path id): no delta across it.
        c.on_stack(1, 6 * T, &stack(6 * T as u32, 0.9, 0), 77);
        assert_eq!(c.spare(1, 6 * T), None);
    }
}
