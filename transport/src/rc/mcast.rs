//! Multicast groups of one engine (ibverbs' `ibv_attach_mcast`): which UD
//! QPs receive the datagrams sent to an IPv4 multicast address, as rxe
//! maps a RoCEv2 multicast GID (IPv4-mapped, `::ffff:224.0.0.0/100`) to
//! IPv4 multicast. A datagram to a group carries the multicast QPN
//! (0xFFFFFF) as its DestQP; every QP attached to the group takes a copy
//! (each with its own Q_Key check and receive queue).

use std::collections::HashMap;
use std::net::Ipv4Addr;

use super::types::{Qpn, RcError};

/// The DestQP of a datagram to a multicast group (IBA 10.5.1.2).
pub const MULTICAST_QPN: Qpn = 0xFF_FFFF;

/// Groups an engine may have (rxe's `max_mcast_grp`).
pub const MAX_MCAST_GROUPS: usize = 8192;

/// QPs one group may have attached (rxe's `max_mcast_qp_attach`).
pub const MAX_MCAST_QP_ATTACH: usize = 56;

/// The engine's groups and their QPs.
#[derive(Debug, Default)]
pub struct McastGroups {
    groups: HashMap<Ipv4Addr, Vec<Qpn>>,
}

impl McastGroups {
    /// Attaches `qpn` to `group`; attaching it again is no error (as in
    /// rxe).
    pub fn attach(&mut self, qpn: Qpn, group: Ipv4Addr) -> Result<(), RcError> {
        if !group.is_multicast() {
            return Err(RcError::NotMulticast(group));
        }
        if !self.groups.contains_key(&group) && self.groups.len() >= MAX_MCAST_GROUPS {
            return Err(RcError::TooManyGroups(MAX_MCAST_GROUPS));
        }
        let qps = self.groups.entry(group).or_default();
        if qps.contains(&qpn) {
            return Ok(());
        }
        if qps.len() >= MAX_MCAST_QP_ATTACH {
            return Err(RcError::GroupFull {
                group,
                max: MAX_MCAST_QP_ATTACH,
            });
        }
        qps.push(qpn);
        Ok(())
    }

    /// Detaches `qpn` from `group`; the group goes with its last QP.
    pub fn detach(&mut self, qpn: Qpn, group: Ipv4Addr) -> Result<(), RcError> {
        let qps = self
            .groups
            .get_mut(&group)
            .filter(|q| q.contains(&qpn))
            .ok_or(RcError::NotAttached { qpn, group })?;
        qps.retain(|&q| q != qpn);
        if qps.is_empty() {
            self.groups.remove(&group);
        }
        Ok(())
    }

    /// Detaches `qpn` from every group (the QP is destroyed).
    pub fn forget(&mut self, qpn: Qpn) {
        self.groups.retain(|_, qps| {
            qps.retain(|&q| q != qpn);
            !qps.is_empty()
        });
    }

    /// The `k`th QP attached to `group`.
    pub fn member(&self, group: Ipv4Addr, k: usize) -> Option<Qpn> {
        self.groups.get(&group)?.get(k).copied()
    }

    /// Whether any QP is attached to `group`.
    pub fn has(&self, group: Ipv4Addr) -> bool {
        self.groups.contains_key(&group)
    }

    /// The groups `qpn` is attached to.
    pub fn groups_of(&self, qpn: Qpn) -> Vec<Ipv4Addr> {
        let mut g: Vec<_> = self
            .groups
            .iter()
            .filter(|(_, qps)| qps.contains(&qpn))
            .map(|(&g, _)| g)
            .collect();
        g.sort();
        g
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: Ipv4Addr = Ipv4Addr::new(239, 1, 2, 3);

    #[test]
    fn a_group_is_an_ipv4_multicast_address() {
        let mut m = McastGroups::default();
        let e = m.attach(5, Ipv4Addr::new(10, 0, 0, 1)).unwrap_err();
        assert_eq!(e, RcError::NotMulticast(Ipv4Addr::new(10, 0, 0, 1)));
        m.attach(5, G).unwrap();
        m.attach(5, G).unwrap();
        assert_eq!((m.member(G, 0), m.member(G, 1)), (Some(5), None));
    }

    #[test]
    fn a_group_takes_at_most_its_attach_limit() {
        let mut m = McastGroups::default();
        for q in 0..MAX_MCAST_QP_ATTACH as u32 {
            m.attach(q, G).unwrap();
        }
        assert!(matches!(m.attach(1000, G), Err(RcError::GroupFull { .. })));
    }

    #[test]
    fn detaching_what_is_not_attached_is_an_error_and_the_last_qp_ends_the_group() {
        let mut m = McastGroups::default();
        assert!(m.detach(5, G).is_err());
        m.attach(5, G).unwrap();
        m.attach(6, G).unwrap();
        m.detach(5, G).unwrap();
        assert!(m.has(G));
        m.forget(6);
        assert!(!m.has(G));
    }
}
