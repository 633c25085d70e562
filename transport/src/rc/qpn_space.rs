//! Which QPNs an engine hands out: all of them, or, when one device's QPs
//! are sharded over several engines (one per dataplane lcore), every
//! `shards`-th one from its own offset, so that a frame's destination QPN
//! alone names the engine that owns the QP ([`QpnSpace::owner`]).

use super::{Qpn, MAX_QPS, QPN_BASE};

/// Most engines one device's QPs may be sharded over.
pub const MAX_SHARDS: u32 = 64;

/// The QPNs of one engine: `QPN_BASE + i * shards + shard` for its QP
/// slot `i`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpnSpace {
    shard: u32,
    shards: u32,
}

/// A shard that cannot be: none of `shards`, or more shards than
/// [`MAX_SHARDS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("QPN shard {shard} of {shards}: shards must be 1..={MAX_SHARDS} and the shard below them")]
pub struct BadShard {
    pub shard: u32,
    pub shards: u32,
}

impl Default for QpnSpace {
    /// Every QPN: one engine per device.
    fn default() -> Self {
        QpnSpace {
            shard: 0,
            shards: 1,
        }
    }
}

impl QpnSpace {
    /// Shard `shard` of `shards`.
    pub fn new(shard: u32, shards: u32) -> Result<QpnSpace, BadShard> {
        if shards == 0 || shards > MAX_SHARDS || shard >= shards {
            return Err(BadShard { shard, shards });
        }
        Ok(QpnSpace { shard, shards })
    }

    pub fn shard(&self) -> u32 {
        self.shard
    }

    pub fn shards(&self) -> u32 {
        self.shards
    }

    /// QPs the engine may hold: its share of [`MAX_QPS`], so that every
    /// QPN of the device stays below `QPN_BASE + MAX_QPS` (the doorbell
    /// block has a bit for each).
    pub fn max_qps(&self) -> usize {
        MAX_QPS / self.shards as usize
    }

    /// The QPN of QP slot `i`.
    pub fn qpn(&self, i: usize) -> Qpn {
        QPN_BASE + (i as u32) * self.shards + self.shard
    }

    /// The slot of `qpn`, when the QPN is this engine's.
    pub fn slot(&self, qpn: Qpn) -> Option<usize> {
        let d = qpn.checked_sub(QPN_BASE)?;
        (d % self.shards == self.shard).then_some((d / self.shards) as usize)
    }

    /// The shard (of `shards`) owning `qpn`; QPNs below [`QPN_BASE`]
    /// (special in InfiniBand, never a QP of ours) belong to shard 0.
    pub fn owner(qpn: Qpn, shards: u32) -> u32 {
        match qpn.checked_sub(QPN_BASE) {
            Some(d) if shards > 0 => d % shards,
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_hand_out_disjoint_qpns_and_the_qpn_names_its_owner() {
        let spaces: Vec<QpnSpace> = (0..3).map(|s| QpnSpace::new(s, 3).unwrap()).collect();
        let mut seen = std::collections::HashSet::new();
        for s in &spaces {
            for i in 0..100 {
                let q = s.qpn(i);
                assert!(seen.insert(q), "QPN {q} handed out twice");
                assert_eq!(s.slot(q), Some(i));
                assert_eq!(QpnSpace::owner(q, 3), s.shard());
                for other in spaces.iter().filter(|o| o.shard() != s.shard()) {
                    assert_eq!(other.slot(q), None);
                }
            }
            assert!(s.qpn(s.max_qps() - 1) < QPN_BASE + MAX_QPS as u32);
        }
        assert_eq!(QpnSpace::default().qpn(0), QPN_BASE);
        assert_eq!(QpnSpace::default().slot(QPN_BASE - 1), None);
        assert_eq!(QpnSpace::owner(1, 3), 0);
    }

    #[test]
    fn a_shard_outside_its_count_is_refused() {
        assert!(QpnSpace::new(0, 0).is_err());
        assert!(QpnSpace::new(2, 2).is_err());
        assert!(QpnSpace::new(0, MAX_SHARDS + 1).is_err());
        assert!(QpnSpace::new(MAX_SHARDS - 1, MAX_SHARDS).is_ok());
    }
}
