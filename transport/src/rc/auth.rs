//! Authenticated feedback (HPCC++ draft-00 s9, 2023 s9.1: "RECOMMENDED
//! that the notification feedback message is at least integrity checked").
//!
//! Two ends of a connection that share a 128-bit feedback key (set at
//! connection time, `ConnectParams::feedback_key`) tag the telemetry a
//! receiver echoes in its ACKs with a truncated keyed MAC: SipHash-2-4 (a
//! keyed PRF with a 64-bit output) over the ACK's identity (its DestQP,
//! PSN, syndrome and MSN) and the echoed stack as the receiver read it
//! (flags, slots, path id, every filled hop's fields). The sender acts on
//! echoed telemetry only when the MAC verifies and the ACK is newer than
//! the last feedback it took (a replayed ACK is refused); anything else is
//! dropped and counted and never reaches the controller.
//!
//! This module owns the key type and the MAC's exact input.

use std::hash::Hasher;

use siphasher::sip::SipHasher24;

use crate::wire::TlmRepr;

/// A connection's feedback key (both ends hold the same).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct FeedbackKey(pub [u8; 16]);

impl std::fmt::Debug for FeedbackKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Keys stay out of logs.
        f.write_str("FeedbackKey(..)")
    }
}

/// What an ACK says besides its telemetry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckId {
    pub dest_qp: u32,
    pub psn: u32,
    pub syndrome: u8,
    pub msn: u32,
}

/// The MAC of an ACK `id` echoing `t` (its own `mac` field is not input).
pub fn ack_mac(key: &FeedbackKey, id: AckId, t: &TlmRepr) -> u64 {
    let mut h = SipHasher24::new_with_key(&key.0);
    // Domain separation: what kind of feedback this is.
    h.write(b"rnic-ack");
    h.write_u32(id.dest_qp & 0xFF_FFFF);
    h.write_u32(id.psn & 0xFF_FFFF);
    h.write_u8(id.syndrome);
    h.write_u32(id.msn & 0xFF_FFFF);
    let flags = u8::from(t.echo)
        | u8::from(t.compact) << 1
        | u8::from(t.subscribe) << 2
        | u8::from(t.nflows) << 3
        | u8::from(t.sojourn) << 4;
    h.write_u8(flags);
    h.write_u8(t.nhop);
    h.write_u8(t.maxhop);
    h.write_u16(t.path_id);
    for hop in t.filled() {
        h.write_u32(hop.ts_ns);
        h.write_u32(hop.tx_bytes);
        h.write_u32(hop.qlen);
        h.write_u16(hop.rate);
        h.write_u8(hop.switch_id);
        h.write_u8(hop.port_id);
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::HopRecord;

    fn stack() -> TlmRepr {
        let mut t = TlmRepr::empty(3);
        t.echo = true;
        t.nhop = 1;
        t.hops[0] = HopRecord {
            ts_ns: 1,
            tx_bytes: 2,
            qlen: 3,
            rate: 1000,
            switch_id: 4,
            port_id: 5,
        };
        t
    }

    const ID: AckId = AckId {
        dest_qp: 0x12,
        psn: 100,
        syndrome: 0x1f,
        msn: 7,
    };

    #[test]
    fn every_field_the_sender_acts_on_moves_the_mac() {
        let key = FeedbackKey([9; 16]);
        let base = ack_mac(&key, ID, &stack());
        assert_ne!(base, ack_mac(&FeedbackKey([8; 16]), ID, &stack()), "key");
        assert_ne!(
            base,
            ack_mac(&key, AckId { psn: 101, ..ID }, &stack()),
            "PSN"
        );
        assert_ne!(
            base,
            ack_mac(
                &key,
                AckId {
                    dest_qp: 0x13,
                    ..ID
                },
                &stack()
            )
        );
        let mut t = stack();
        t.hops[0].qlen = 4;
        assert_ne!(base, ack_mac(&key, ID, &t), "qlen");
        let mut t = stack();
        t.path_id = 9;
        assert_ne!(base, ack_mac(&key, ID, &t), "path id (or N)");
        let mut t = stack();
        t.nflows = true;
        assert_ne!(base, ack_mac(&key, ID, &t), "flags");
        // The MAC field itself is not input.
        let mut t = stack();
        t.mac = Some(base);
        assert_eq!(base, ack_mac(&key, ID, &t));
        assert_eq!(format!("{key:?}"), "FeedbackKey(..)");
    }
}
