//! A QP's paths (HPCC++ 2023 s9.4): the UDP source ports it may send from
//! (each an ECMP path through the fabric), the probes it sends on the ones
//! it is not using, and a move in progress.
//!
//! The decision is `pacer::path`'s. This module maps its path indices to
//! source ports, builds the probes' identity (a TLM_REQUEST whose probe id
//! names the path) and holds a move until nothing of the QP is in flight
//! on the old path: new packets wait, retransmissions may still go, so the
//! responder never sees a PSN arrive ahead of an earlier one and nothing is
//! sent twice for the move.

use pacer::path::{PathChooser, PathConfig};

use crate::wire::ProbeRepr;

/// Probe ids with this bit set are path probes: bits 30..24 the path,
/// 23..0 a sequence number.
pub const PATH_PROBE: u32 = 0x8000_0000;

/// The path a probe id names, when it is a path probe.
pub fn probe_path(id: u32) -> Option<usize> {
    (id & PATH_PROBE != 0).then_some(((id >> 24) & 0x7F) as usize)
}

/// The source port of path `k` of a QP whose own port is `base`: the
/// RoCEv2 range (0xC000..) with the low 14 bits mixed by `k`; path 0 is
/// `base` itself.
pub fn path_port(base: u16, k: usize) -> u16 {
    let mix = (k as u16).wrapping_mul(0x2F1D);
    0xC000 | ((base ^ mix) & 0x3FFF)
}

pub(crate) struct QpPaths {
    pub chooser: PathChooser,
    base: u16,
    ports: Vec<u16>,
    /// Per path, how often its port was drawn again.
    draws: Vec<u16>,
    /// A probe to send: its path and its header.
    pub pending: Option<(usize, ProbeRepr)>,
    seq: u32,
    /// During a move: a packet asking for an ACK has gone since the move
    /// was decided (no new packet goes after it).
    pub drain_acked: bool,
    /// The requests' outer headers on the current path (the QP's own
    /// template, with the path's source port).
    pub template: Option<crate::wire::FrameTemplate>,
    /// Per path, the sequence numbers of the newest probe sent and of
    /// the newest answer taken.
    sent_seq: Vec<Option<u32>>,
    taken_seq: Vec<Option<u32>>,
    /// What the flow's own rate is multiplied by to be in the units of
    /// the paths' spare capacity: 1, or, for a keyed QP (which sees only
    /// relative records, every port 1.6 Tb/s wide), the virtual port's
    /// rate over the NIC's line rate: the flow's share of its line.
    pub own_scale: f64,
}

/// Answers to a path's probes are taken up to this many probes late (a
/// probe's answer may come back behind a queue longer than the probe
/// interval).
const LATE_PROBES: u32 = 64;

impl QpPaths {
    pub fn new(cfg: PathConfig, t_ns: u64, base_port: u16) -> Self {
        let chooser = PathChooser::new(cfg, t_ns, 0);
        let n = chooser.paths();
        let ports = (0..n).map(|k| path_port(base_port, k)).collect();
        QpPaths {
            chooser,
            base: base_port,
            ports,
            draws: vec![0; n],
            pending: None,
            seq: 0,
            drain_acked: false,
            template: None,
            sent_seq: vec![None; n],
            taken_seq: vec![None; n],
            own_scale: 1.0,
        }
    }

    /// The source port of path `k`.
    pub fn port(&self, k: usize) -> u16 {
        self.ports.get(k).copied().unwrap_or(self.ports[0])
    }

    /// The port the QP sends from now.
    pub fn current_port(&self) -> u16 {
        self.port(self.chooser.current())
    }

    /// Asks for a probe of another path when one is due.
    pub fn poll(&mut self, now: u64, in_flight: bool, snd_nxt: u32) {
        if self.pending.is_some() {
            return;
        }
        if let Some(k) = self.chooser.poll_probe(now, in_flight) {
            self.seq = self.seq.wrapping_add(1);
            let seq = self.seq & 0xFF_FFFF;
            let probe_id = PATH_PROBE | ((k as u32 & 0x7F) << 24) | seq;
            if let Some(s) = self.sent_seq.get_mut(k) {
                *s = Some(seq);
            }
            self.pending = Some((
                k,
                ProbeRepr {
                    probe_id,
                    snd_psn: snd_nxt,
                    sender_ts_ns: now,
                },
            ));
        }
    }

    /// Whether `probe_id` answers a probe sent on path `k`: one of its
    /// last [`LATE_PROBES`] probes, newer than the last answer taken (a
    /// duplicate, a replay or an id never sent is not taken).
    pub fn answered(&mut self, k: usize, probe_id: u32) -> bool {
        let seq = probe_id & 0xFF_FFFF;
        let (Some(Some(sent)), Some(taken)) = (self.sent_seq.get(k), self.taken_seq.get_mut(k))
        else {
            return false;
        };
        let behind = sent.wrapping_sub(seq) & 0xFF_FFFF;
        let newer = taken.is_none_or(|t| {
            let d = seq.wrapping_sub(t) & 0xFF_FFFF;
            d != 0 && d < 0x80_0000
        });
        if behind >= LATE_PROBES || !newer {
            return false;
        }
        *taken = Some(seq);
        true
    }

    /// A probe of path `k` came back over a route already known (its
    /// port hashes where another path's does): gives `k` another port,
    /// and forgets it. Returns whether it did (never the current path).
    pub fn redraw_if_known(&mut self, k: usize, path_id: u16) -> bool {
        if k == self.chooser.current() || !self.chooser.known_route(path_id, k) {
            return false;
        }
        let n = self.ports.len();
        let Some(d) = self.draws.get_mut(k) else {
            return false;
        };
        *d = d.wrapping_add(1);
        self.ports[k] = path_port(self.base, k + n * usize::from(*d));
        self.chooser.forget(k);
        true
    }

    /// Whether new packets must wait for a move.
    pub fn draining(&self) -> bool {
        self.chooser.moving_to().is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_ports_stay_in_the_rocev2_range_and_differ() {
        for base in [0xC000u16, 0xD123, 0xFFFF] {
            let ports: Vec<u16> = (0..16).map(|k| path_port(base, k)).collect();
            assert_eq!(ports[0], base);
            assert!(ports.iter().all(|&p| p >= 0xC000));
            let mut d = ports.clone();
            d.sort_unstable();
            d.dedup();
            assert_eq!(d.len(), 16, "{ports:x?}");
        }
    }

    #[test]
    fn a_path_whose_probe_came_back_over_a_known_route_draws_another_port() {
        let mut p = QpPaths::new(PathConfig::new(1000), 1000, 0xC123);
        let stack = pacer::HopStack::new();
        // The current path (0) is known as route 7.
        p.chooser.on_stack(0, 0, &stack, 7);
        let before = p.port(1);
        assert!(p.redraw_if_known(1, 7), "route 7 is path 0's");
        assert_ne!(p.port(1), before);
        assert!(p.port(1) >= 0xC000);
        assert!(!p.redraw_if_known(1, 8), "a new route is kept");
        assert!(!p.redraw_if_known(0, 7), "never the current path");
    }

    #[test]
    fn a_probe_id_names_its_path() {
        let mut p = QpPaths::new(PathConfig::new(1000), 1000, 0xC123);
        p.poll(0, true, 5);
        let (k, probe) = p.pending.unwrap();
        assert_eq!(probe_path(probe.probe_id), Some(k));
        assert_eq!(probe_path(7), None, "HPCC++ probe mode's ids");
        assert!(!p.answered(k, probe.probe_id + 1), "not a probe it sent");
        assert!(p.answered(k, probe.probe_id));
        assert!(!p.answered(k, probe.probe_id), "answered once");
        // Three more rounds: a late answer to an earlier probe of the
        // path is taken, one older than the newest taken is not.
        let mut ids = Vec::new();
        for r in 1..=9u64 {
            p.pending = None;
            p.poll(r * 1000, true, 5);
            let (kk, pr) = p.pending.unwrap();
            if kk == k {
                ids.push(pr.probe_id);
            }
        }
        assert_eq!(ids.len(), 3);
        assert!(p.answered(k, ids[1]), "late but newer");
        assert!(!p.answered(k, ids[0]), "older than one taken");
        assert!(p.answered(k, ids[2]));
    }
}
