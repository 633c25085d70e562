//! One connection of the CM: its state (IBA 12.9's, as Linux's
//! `enum ib_cm_state` names them), the peer it talks to, the transaction
//! IDs its messages carry, and the one message it may be waiting to have
//! answered (retransmitted after each timeout, as Linux's MAD layer does,
//! until its retries run out).

use std::net::Ipv4Addr;

use crate::rc::Qpn;
use crate::wire::mad::MAD_LEN;
use crate::wire::MacAddr;

/// A connection's local communication ID.
pub type CommId = u32;

/// Where a connection's MADs go: the peer's QP1 at this address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    pub ip: Ipv4Addr,
    /// The zero MAC: not known yet (the pipeline resolves it by ARP).
    pub mac: MacAddr,
}

/// The states a connection passes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Active: REQ sent, no answer yet.
    ReqSent,
    /// Passive: REQ received, the consumer has not answered.
    ReqRcvd,
    /// Passive: REP sent, waiting for the RTU.
    RepSent,
    /// Active: REP received, the consumer has not moved its QP yet.
    RepRcvd,
    Established,
    DreqSent,
    DreqRcvd,
    /// Disconnected; the QP number may not be reused until this ends.
    TimeWait,
    /// Active SIDR: SIDR_REQ sent, waiting for the SIDR_REP.
    SidrReqSent,
    /// Passive SIDR: SIDR_REQ received, the consumer has not answered.
    SidrReqRcvd,
}

impl State {
    pub fn name(self) -> &'static str {
        match self {
            State::ReqSent => "REQ_SENT",
            State::ReqRcvd => "REQ_RCVD",
            State::RepSent => "REP_SENT",
            State::RepRcvd => "REP_RCVD",
            State::Established => "ESTABLISHED",
            State::DreqSent => "DREQ_SENT",
            State::DreqRcvd => "DREQ_RCVD",
            State::TimeWait => "TIMEWAIT",
            State::SidrReqSent => "SIDR_REQ_SENT",
            State::SidrReqRcvd => "SIDR_REQ_RCVD",
        }
    }
}

/// A sent message waiting for its answer.
#[derive(Debug, Clone)]
pub struct Pending {
    pub mad: Box<[u8; MAD_LEN]>,
    pub deadline: u64,
    pub timeout_ns: u64,
    pub retries_left: u8,
    /// The peer asked for more time (an MRA) already: later MRAs are
    /// dropped, as Linux's MRA_*_RCVD states drop them.
    pub mra_taken: bool,
}

/// One connection.
#[derive(Debug, Clone)]
pub struct Conn {
    pub state: State,
    pub local_id: CommId,
    /// The peer's communication ID (0 until it is known: an active
    /// connection learns it from the REP).
    pub remote_id: CommId,
    pub remote_guid: u64,
    pub local_qpn: Qpn,
    pub remote_qpn: Qpn,
    pub peer: Peer,
    /// The TID of the connection's REQ (its REP, MRA, REJ and RTU carry
    /// it too).
    pub tid: u64,
    /// The TID of the DREQ being answered (the DREP echoes it).
    pub dreq_tid: u64,
    /// The listener's token (passive connections).
    pub listener: Option<u64>,
    /// The service ID (SIDR's reply echoes it).
    pub service_id: u64,
    /// The path's ACK timeout (IBA's 4.096 us * 2^t exponent): how long
    /// TIMEWAIT lasts.
    pub ack_timeout: u8,
    /// Timeout and retries of this connection's requests (REQ or REP,
    /// then DREQ).
    pub timeout_ns: u64,
    pub max_retries: u8,
    pub pending: Option<Pending>,
    /// When TIMEWAIT ends.
    pub timewait_until: Option<u64>,
}

impl Conn {
    /// A connection `id` in `state` with `peer`: no peer IDs, timers or
    /// limits yet (the caller sets what it knows).
    pub fn new(id: CommId, state: State, peer: Peer, tid: u64, service_id: u64) -> Conn {
        Conn {
            state,
            local_id: id,
            remote_id: 0,
            remote_guid: 0,
            local_qpn: 0,
            remote_qpn: 0,
            peer,
            tid,
            dreq_tid: 0,
            listener: None,
            service_id,
            ack_timeout: 0,
            timeout_ns: 0,
            max_retries: 0,
            pending: None,
            timewait_until: None,
        }
    }

    /// The earliest of its deadlines.
    pub fn deadline(&self) -> Option<u64> {
        match (
            self.pending.as_ref().map(|p| p.deadline),
            self.timewait_until,
        ) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// Nanoseconds of an IBA time exponent as Linux's CM takes it
/// (`cm_convert_to_ms`: 2^(t - 8) ms, at least 1 ms).
pub fn exp_to_ns(t: u8) -> u64 {
    (1u64 << t.saturating_sub(8).min(31)) * 1_000_000
}

/// The ACK timeout of a path from a CA's ACK delay and the packet
/// lifetime (Linux's `cm_ack_timeout`).
pub fn ack_timeout(ca_ack_delay: u8, packet_life_time: u8) -> u8 {
    let mut t = i32::from(packet_life_time) + 1;
    let d = i32::from(ca_ack_delay);
    if t >= d {
        t += i32::from(d >= t - 1);
    } else {
        t = d + i32::from(t >= d - 1);
    }
    t.min(31) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_convert_as_linux_does() {
        assert_eq!(exp_to_ns(20), 4_096_000_000);
        assert_eq!(exp_to_ns(18), 1_024_000_000);
        assert_eq!(exp_to_ns(3), 1_000_000);
        assert_eq!(ack_timeout(15, 18), 19, "rxe's");
        assert_eq!(ack_timeout(20, 10), 20);
        assert_eq!(ack_timeout(0, 31), 31);
    }
}
