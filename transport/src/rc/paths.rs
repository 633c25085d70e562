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
    ports: Vec<u16>,
    /// A probe to send: its path and its header.
    pub pending: Option<(usize, ProbeRepr)>,
    seq: u32,
    /// During a move: a packet asking for an ACK has gone since the move
    /// was decided (no new packet goes after it).
    pub drain_acked: bool,
}

impl QpPaths {
    pub fn new(cfg: PathConfig, t_ns: u64, base_port: u16) -> Self {
        let chooser = PathChooser::new(cfg, t_ns, 0);
        let ports = (0..chooser.paths())
            .map(|k| path_port(base_port, k))
            .collect();
        QpPaths {
            chooser,
            ports,
            pending: None,
            seq: 0,
            drain_acked: false,
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
            self.pending = Some((
                k,
                ProbeRepr {
                    probe_id: PATH_PROBE | ((k as u32 & 0x7F) << 24) | (self.seq & 0xFF_FFFF),
                    snd_psn: snd_nxt,
                    sender_ts_ns: now,
                },
            ));
        }
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
    fn a_probe_id_names_its_path() {
        let mut p = QpPaths::new(PathConfig::new(1000), 1000, 0xC123);
        p.poll(0, true, 5);
        let (k, probe) = p.pending.unwrap();
        assert_eq!(probe_path(probe.probe_id), Some(k));
        assert_eq!(probe_path(7), None, "HPCC++ probe mode's ids");
    }
}
