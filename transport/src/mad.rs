//! The management agents behind QP1 and how a received MAD reaches one,
//! as Linux's MAD layer (`drivers/infiniband/core/mad.c`) decides on a
//! RoCE port, so that a peer sees the same answers from our NIC as from
//! rxe:
//!
//! - dropped (and counted): a base version other than 1; subnet
//!   management (classes 0x01 and 0x81: QP0's, which a RoCE port lacks);
//!   a CM MAD that is neither a Send nor about ClassPortInfo;
//! - a response (the R bit, TrapRepress, or a BM MAD with attribute
//!   modifier bit 1) goes to the agent whose number is in its TID's upper
//!   32 bits (the agent put it there in its request), or is dropped;
//! - a request goes to the agent registered for its class, class version
//!   and method; with none, a Get or Set is answered with GetResp and
//!   status 0x000C (unsupported method/attribute), everything else in it
//!   echoed (TID, attribute, modifier, data), and any other method is
//!   dropped. A RoCE port's Linux host registers only the CM (class 0x07,
//!   version 2, Send); so does this one, once the CM exists (issue 53).
//!
//! Answers go back from QP1 to the sender's QP (the DETH's source QP) and
//! address, with the GSI Q_Key. Sans-IO: the caller moves MADs between
//! the engine (`Engine::poll_mad`, `Engine::send_mad`) and here.

use crate::rc::{OutMad, ReceivedMad};
use crate::wire::mad::{attr, class, method, status, MadHeader, BASE_VERSION, GSI_QKEY, MAD_LEN};

/// What an agent takes: its class, class version and request methods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registration {
    pub mgmt_class: u8,
    pub class_version: u8,
    /// The request methods (without the R bit) it handles.
    pub methods: &'static [u8],
}

/// A management agent (the connection manager, ...).
pub trait MadAgent {
    fn registration(&self) -> Registration;
    /// Itself, for [`MadAgents::agent`] and [`MadAgents::agent_mut`]
    /// (`self`).
    fn as_any(&self) -> &dyn std::any::Any;
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any;
    /// A request of its class and methods, or a response whose TID's
    /// upper 32 bits are its agent number; MADs to send go into `out`.
    fn on_mad(&mut self, now: u64, m: &ReceivedMad, out: &mut Vec<OutMad>);
}

/// What the dispatch did with the MADs it saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MadCounters {
    /// Handed to an agent: requests and responses.
    pub requests: u64,
    pub responses: u64,
    /// Gets and Sets no agent takes, answered with status 0x000C.
    pub answered_unsupported: u64,
    /// Dropped: base version not 1.
    pub bad_base_version: u64,
    /// Dropped: subnet management on QP1.
    pub subnet_mgmt: u64,
    /// Dropped: a CM MAD neither a Send nor about ClassPortInfo.
    pub cm_method: u64,
    /// Dropped: a request no agent takes that is not a Get or Set.
    pub unmatched: u64,
    /// Dropped: a response for no agent of ours.
    pub stray_responses: u64,
}

/// The agents of one NIC port, by registration order (agent number =
/// index + 1).
#[derive(Default)]
pub struct MadAgents {
    agents: Vec<Box<dyn MadAgent + Send>>,
    pub counters: MadCounters,
}

impl std::fmt::Debug for MadAgents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MadAgents")
            .field("agents", &self.agents.len())
            .field("counters", &self.counters)
            .finish()
    }
}

/// Whether a MAD is a response (Linux's `ib_response_mad`).
fn is_response(h: &MadHeader) -> bool {
    h.is_response()
        || h.method == method::TRAP_REPRESS
        || (h.mgmt_class == class::BM && h.attr_mod & 1 != 0)
}

/// A MAD back to the sender of `m` (from QP1, with the GSI Q_Key).
pub fn reply_to(m: &ReceivedMad, mad: [u8; MAD_LEN]) -> OutMad {
    OutMad {
        dest_ip: m.src_ip,
        dest_mac: m.src_mac,
        dest_qpn: m.src_qpn,
        qkey: GSI_QKEY,
        dscp: None,
        mad,
    }
}

impl MadAgents {
    /// Registers an agent; returns its number (what it puts in its
    /// requests' TID bits 63..32, so that their responses find it).
    pub fn register(&mut self, agent: Box<dyn MadAgent + Send>) -> u32 {
        self.agents.push(agent);
        self.agents.len() as u32
    }

    /// The agent of `number` as its own type.
    pub fn agent<T: 'static>(&self, number: u32) -> Option<&T> {
        let i = (number as usize).checked_sub(1)?;
        self.agents.get(i)?.as_any().downcast_ref::<T>()
    }

    /// ... to change (the daemon drives its CM through it).
    pub fn agent_mut<T: 'static>(&mut self, number: u32) -> Option<&mut T> {
        let i = (number as usize).checked_sub(1)?;
        self.agents.get_mut(i)?.as_any_mut().downcast_mut::<T>()
    }

    /// The number the next agent registered gets.
    pub fn next_number(&self) -> u32 {
        self.agents.len() as u32 + 1
    }

    /// Dispatches one received MAD; MADs to send go into `out`.
    pub fn handle(&mut self, now: u64, m: &ReceivedMad, out: &mut Vec<OutMad>) {
        let Ok(h) = MadHeader::parse(&m.mad) else {
            return;
        };
        if h.base_version != BASE_VERSION {
            self.counters.bad_base_version += 1;
            return;
        }
        if matches!(
            h.mgmt_class,
            class::SUBN_LID_ROUTED | class::SUBN_DIRECTED_ROUTE
        ) {
            self.counters.subnet_mgmt += 1;
            return;
        }
        if h.mgmt_class == class::CM
            && h.attr_id != attr::CLASS_PORT_INFO
            && h.method != method::SEND
        {
            self.counters.cm_method += 1;
            return;
        }
        if is_response(&h) {
            let id = (h.tid >> 32) as usize;
            match id.checked_sub(1).and_then(|i| self.agents.get_mut(i)) {
                Some(a) => {
                    self.counters.responses += 1;
                    a.on_mad(now, m, out);
                }
                None => self.counters.stray_responses += 1,
            }
            return;
        }
        let taker = self.agents.iter_mut().find(|a| {
            let r = a.registration();
            r.mgmt_class == h.mgmt_class
                && r.class_version == h.class_version
                && r.methods.contains(&h.method)
        });
        if let Some(a) = taker {
            self.counters.requests += 1;
            a.on_mad(now, m, out);
            return;
        }
        if !matches!(h.method, method::GET | method::SET) {
            self.counters.unmatched += 1;
            return;
        }
        // The request itself, as a GetResp saying so.
        let mut reply = m.mad;
        reply[3] = method::GET | method::RESP;
        reply[4..6].copy_from_slice(&status::UNSUPPORTED_METHOD_ATTRIB.to_be_bytes());
        self.counters.answered_unsupported += 1;
        out.push(reply_to(m, reply));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::MacAddr;
    use std::net::Ipv4Addr;

    fn received(h: MadHeader) -> ReceivedMad {
        let mut mad = [0u8; MAD_LEN];
        h.emit(&mut mad);
        mad[200] = 0x5A;
        ReceivedMad {
            src_ip: Ipv4Addr::new(10, 0, 0, 9),
            src_mac: MacAddr([2, 0, 0, 0, 0, 9]),
            src_qpn: 0x33,
            pkey: 0xFFFF,
            grh: [0; 40],
            mad,
        }
    }

    fn get(class: u8, version: u8, attr_id: u16) -> MadHeader {
        MadHeader {
            base_version: 1,
            mgmt_class: class,
            class_version: version,
            method: method::GET,
            tid: 0x1234_5678_9abc_def0,
            attr_id,
            attr_mod: 7,
            ..MadHeader::default()
        }
    }

    #[test]
    fn an_unmatched_get_is_answered_unsupported_with_the_rest_echoed() {
        let mut a = MadAgents::default();
        let mut out = Vec::new();
        let m = received(get(class::CM, 2, attr::CLASS_PORT_INFO));
        a.handle(0, &m, &mut out);
        assert_eq!(out.len(), 1);
        let r = out[0];
        assert_eq!(
            (r.dest_ip, r.dest_mac, r.dest_qpn, r.qkey),
            (m.src_ip, m.src_mac, 0x33, GSI_QKEY)
        );
        let h = MadHeader::parse(&r.mad).unwrap();
        assert_eq!(h.method, method::GET | method::RESP);
        assert_eq!(h.status, status::UNSUPPORTED_METHOD_ATTRIB);
        assert_eq!(
            (h.tid, h.attr_id, h.attr_mod),
            (0x1234_5678_9abc_def0, 1, 7)
        );
        assert_eq!(r.mad[24..], m.mad[24..]);
        // A Set too (still answered as GetResp), and a perf-management
        // Get of any version.
        let mut set = get(class::PERF_MGMT, 1, 0x12);
        set.method = method::SET;
        a.handle(0, &received(set), &mut out);
        assert_eq!(out[1].mad[3], method::GET | method::RESP);
        assert_eq!(a.counters.answered_unsupported, 2);
    }

    #[test]
    fn subnet_management_and_bad_versions_and_cm_non_sends_are_dropped() {
        let mut a = MadAgents::default();
        let mut out = Vec::new();
        a.handle(
            0,
            &received(get(class::SUBN_LID_ROUTED, 1, attr::PORT_INFO)),
            &mut out,
        );
        a.handle(
            0,
            &received(get(class::SUBN_DIRECTED_ROUTE, 1, attr::PORT_INFO)),
            &mut out,
        );
        let mut bad = get(class::CM, 2, 1);
        bad.base_version = 2;
        a.handle(0, &received(bad), &mut out);
        // A CM Get of anything but ClassPortInfo.
        a.handle(0, &received(get(class::CM, 2, 0x0010)), &mut out);
        // A Send nobody takes; a response for no agent.
        let mut send = get(class::PERF_MGMT, 1, 1);
        send.method = method::SEND;
        a.handle(0, &received(send), &mut out);
        let mut resp = get(class::CM, 2, 1);
        resp.method = method::GET | method::RESP;
        a.handle(0, &received(resp), &mut out);
        assert!(out.is_empty());
        let c = a.counters;
        assert_eq!(
            (
                c.subnet_mgmt,
                c.bad_base_version,
                c.cm_method,
                c.unmatched,
                c.stray_responses
            ),
            (2, 1, 1, 1, 1)
        );
    }

    struct Echo(u64);
    impl MadAgent for Echo {
        fn registration(&self) -> Registration {
            Registration {
                mgmt_class: class::CM,
                class_version: 2,
                methods: &[method::SEND],
            }
        }
        fn as_any(&self) -> &dyn std::any::Any {
            self
        }
        fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
            self
        }
        fn on_mad(&mut self, _: u64, m: &ReceivedMad, out: &mut Vec<OutMad>) {
            self.0 += 1;
            out.push(reply_to(m, m.mad));
        }
    }

    #[test]
    fn a_registered_agent_takes_its_requests_and_the_responses_to_its_own() {
        let mut a = MadAgents::default();
        let id = a.register(Box::new(Echo(0)));
        let mut out = Vec::new();
        let mut send = get(class::CM, 2, 0x0010);
        send.method = method::SEND;
        a.handle(0, &received(send), &mut out);
        // Another class version is not its.
        send.class_version = 1;
        a.handle(0, &received(send), &mut out);
        let mut resp = get(class::PERF_MGMT, 1, 1);
        resp.method = method::GET | method::RESP;
        resp.tid = u64::from(id) << 32 | 5;
        a.handle(0, &received(resp), &mut out);
        assert_eq!(out.len(), 2);
        assert_eq!((a.counters.requests, a.counters.responses), (1, 1));
        assert_eq!(a.agent_mut::<Echo>(id).map(|e| e.0), Some(2));
        assert_eq!(a.agent::<Echo>(id).map(|e| e.0), Some(2));
        assert!(a.agent_mut::<u8>(id).is_none(), "not of that type");
        assert!(a.agent_mut::<Echo>(id + 1).is_none());
        assert_eq!(a.counters.unmatched, 1);
    }
}
