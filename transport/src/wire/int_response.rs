//! INT responses (HPCC++ draft-00 s6.3): what a congested switch sends
//! straight back to the sender of a data packet that subscribed to them
//! (TLM flag SUBSCRIBE), so that the sender slows down half a round trip
//! sooner than an ACK would let it, and without waiting behind the queue.
//!
//! ```text
//! Eth (dst/src: the data's src/dst) | IPv4 (src/dst: the data's dst/src, its
//! DSCP) | UDP (the data's source port, to 4791) | BTH (0xC3, DestQP and PSN:
//! the data's) | TLM (ECHO set, SUBSCRIBE clear: the data's hops and the
//! switch's own record in the next slot) | ICRC
//! ```
//!
//! The DestQP is the receiver's QP (a switch knows no other): the sender
//! finds its QP by (the response's IPv4 source, DestQP), the peer it is
//! connected to. The PSN says which packet's telemetry it is.

use super::{EthernetRepr, HopRecord, Ipv4Repr, Opcode, Packet, PacketRepr, RoceFrame, WireError};

/// Whether a frame asks for INT responses: a RoCEv2 request with a TLM
/// block that has SUBSCRIBE set and is not an echoed stack.
pub fn subscribed<T: AsRef<[u8]>>(f: &RoceFrame<T>) -> bool {
    f.tlm().is_some_and(|t| t.subscribe() && !t.echo())
}

/// Why no response was built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoResponse {
    /// The frame is not a subscribed data packet.
    NotSubscribed,
    /// Its stack is full: no slot for the switch's record.
    NoRoom,
    /// The frame does not parse, or `out` is too short.
    Wire(WireError),
}

impl From<WireError> for NoResponse {
    fn from(e: WireError) -> Self {
        NoResponse::Wire(e)
    }
}

/// Writes into `out` the INT response to `data` carrying `hop` (the
/// switch's snapshot of the congested port) and returns its length. The
/// data frame's ICRC is not checked (a switch forwards what it cannot
/// verify); the response gets its own.
pub fn emit_int_response(
    data: &[u8],
    hop: &HopRecord,
    out: &mut [u8],
) -> Result<usize, NoResponse> {
    let d = Packet::parse_unverified(data)?.repr;
    let mut tlm = d
        .tlm
        .filter(|t| t.subscribe && !t.echo)
        .ok_or(NoResponse::NotSubscribed)?;
    if tlm.nhop >= tlm.maxhop {
        return Err(NoResponse::NoRoom);
    }
    tlm.hops[usize::from(tlm.nhop)] = *hop;
    tlm.nhop += 1;
    tlm.path_id ^= u16::from(hop.switch_id);
    tlm.echo = true;
    tlm.subscribe = false;
    let mut r = PacketRepr::new(Opcode::IntResponse, d.bth.dest_qp, d.bth.psn);
    r.eth = EthernetRepr {
        src: d.eth.dst,
        dst: d.eth.src,
        vlan: d.eth.vlan,
    };
    r.ip = Ipv4Repr {
        src: d.ip.dst,
        dst: d.ip.src,
        dscp: d.ip.dscp,
        ..Ipv4Repr::default()
    };
    r.udp = d.udp;
    r.tlm = Some(tlm);
    Ok(r.emit(&[], out)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{RethRepr, TlmRepr};
    use core::net::Ipv4Addr;

    fn data(subscribe: bool, nhop: u8, maxhop: u8) -> Vec<u8> {
        let mut r = PacketRepr::new(Opcode::RdmaWriteOnly, 0x12, 0x345);
        r.ip.src = Ipv4Addr::new(10, 0, 0, 1);
        r.ip.dst = Ipv4Addr::new(10, 0, 0, 2);
        r.eth.src = crate::wire::MacAddr([2, 0, 0, 0, 0, 1]);
        r.eth.dst = crate::wire::MacAddr([2, 0, 0, 0, 0, 2]);
        r.reth = Some(RethRepr {
            va: 0,
            r_key: 1,
            dma_len: 64,
        });
        let mut t = TlmRepr::empty(maxhop);
        t.subscribe = subscribe;
        for i in 0..nhop {
            t.hops[usize::from(i)].switch_id = i + 1;
        }
        t.nhop = nhop;
        r.tlm = Some(t);
        let mut b = vec![0; 512];
        let n = r.emit(&[7; 64], &mut b).unwrap();
        b.truncate(n);
        b
    }

    #[test]
    fn a_response_carries_the_psn_the_stack_and_the_switch_hop_back_to_the_sender() {
        let hop = HopRecord {
            ts_ns: 5,
            tx_bytes: 6,
            qlen: 70_000,
            rate: 1000,
            switch_id: 9,
            port_id: 3,
        };
        let mut out = [0u8; 256];
        let n = emit_int_response(&data(true, 1, 5), &hop, &mut out).unwrap();
        let p = Packet::parse(&out[..n]).expect("a valid frame with its own ICRC");
        assert_eq!(p.repr.bth.opcode, Opcode::IntResponse);
        assert_eq!((p.repr.bth.dest_qp, p.repr.bth.psn), (0x12, 0x345));
        assert_eq!(p.repr.ip.src, Ipv4Addr::new(10, 0, 0, 2));
        assert_eq!(p.repr.ip.dst, Ipv4Addr::new(10, 0, 0, 1));
        assert_eq!(p.repr.eth.dst, crate::wire::MacAddr([2, 0, 0, 0, 0, 1]));
        let t = p.repr.tlm.unwrap();
        assert!(t.echo && !t.subscribe);
        assert_eq!(t.nhop, 2);
        assert_eq!(t.hops[0].switch_id, 1);
        assert_eq!(t.hops[1], hop);
        assert!(p.payload.is_empty());
    }

    #[test]
    fn no_response_without_a_subscription_or_a_free_slot() {
        let hop = HopRecord::default();
        let mut out = [0u8; 256];
        assert_eq!(
            emit_int_response(&data(false, 0, 5), &hop, &mut out),
            Err(NoResponse::NotSubscribed)
        );
        assert_eq!(
            emit_int_response(&data(true, 2, 2), &hop, &mut out),
            Err(NoResponse::NoRoom)
        );
        assert!(matches!(
            emit_int_response(&data(true, 0, 2), &hop, &mut out[..40]),
            Err(NoResponse::Wire(_))
        ));
        assert!(matches!(
            emit_int_response(&[0u8; 10], &hop, &mut out),
            Err(NoResponse::Wire(_))
        ));
    }
}
