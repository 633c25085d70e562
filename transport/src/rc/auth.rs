//! Authenticated feedback (HPCC++ draft-00 s9, 2023 s9.1: "RECOMMENDED
//! that the notification feedback message is at least integrity checked").
//!
//! Two ends of a connection that share a 128-bit feedback key (set at
//! connection time: `ConnectParams::feedback_key`, verbs' RTR attribute,
//! or derived from a domain key by [`connection_key`]) tag every piece of
//! feedback a sender acts on:
//!
//! - the receiver's ACKs that echo telemetry, its TLM_RESPONSEs (probe
//!   answers) and its CC_NOTIFYs carry a truncated keyed MAC, SipHash-2-4
//!   (a keyed PRF with a 64-bit output), over what the message says
//!   ([`Feedback`]) and the echoed stack in its relative form
//!   ([`TlmRepr::relative`]: what a domain's boundary may rewrite it to, so
//!   the MAC verifies either way, and the sender acts on exactly that);
//! - a switch has no key, so INT responses are checked by a token: the
//!   sender puts [`int_token`] (a PRF of its key and the packet's PSN) in
//!   each data packet that subscribes, a switch copies the data packet's
//!   block, token included, into its response, and the sender takes a
//!   response only when the token is the one of that PSN. That proves the
//!   response was made by something that saw the packet (on its path);
//!   what that switch reports is trusted as its record always is.
//!
//! The sender acts only on feedback whose MAC or token verifies and that
//! is newer than the last of its kind it took (a replay is refused);
//! anything else is dropped and counted and never reaches the controller.
//!
//! This module owns the key type and the exact inputs of the MACs.

use std::hash::Hasher;

use siphasher::sip::SipHasher24;

use crate::wire::tlm::MAX_HOPS;
use crate::wire::{NotifyRepr, ProbeRepr, TlmRepr};

/// A connection's feedback key (both ends hold the same).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct FeedbackKey(pub [u8; 16]);

impl std::fmt::Debug for FeedbackKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Keys stay out of logs.
        f.write_str("FeedbackKey(..)")
    }
}

/// Why a feedback key's text is not a key (it never quotes the key).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BadKey {
    #[error("a feedback key is hex digits; it has other characters")]
    NotAscii,
    #[error("a feedback key is 32 hex digits (128 bits), got {0} characters")]
    Length(usize),
    #[error("a feedback key is hex digits; character {0} is not")]
    NotHex(usize),
}

impl FeedbackKey {
    /// Parses 32 hex digits (a key in a config file or on a command line);
    /// the error names what is wrong, never the key.
    pub fn from_hex(s: &str) -> Result<Self, BadKey> {
        let s = s.trim();
        if !s.is_ascii() {
            return Err(BadKey::NotAscii);
        }
        if s.len() != 32 {
            return Err(BadKey::Length(s.len()));
        }
        if let Some(at) = s.bytes().position(|c| !c.is_ascii_hexdigit()) {
            return Err(BadKey::NotHex(at));
        }
        // Every character is a hex digit (checked above).
        let nibble = |c: u8| char::from(c).to_digit(16).unwrap_or(0) as u8;
        let d = s.as_bytes();
        let mut k = [0u8; 16];
        for (i, b) in k.iter_mut().enumerate() {
            *b = nibble(d[2 * i]) << 4 | nibble(d[2 * i + 1]);
        }
        Ok(FeedbackKey(k))
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

/// A piece of feedback a receiver sends, besides the stack it echoes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feedback {
    /// An ACK.
    Ack(AckId),
    /// A TLM_RESPONSE to the sender's QP `dest_qp`, echoing its probe.
    Probe { dest_qp: u32, probe: ProbeRepr },
    /// A CC_NOTIFY to the sender's QP `dest_qp`.
    Notify { dest_qp: u32, notify: NotifyRepr },
}

fn keyed(key: &FeedbackKey, domain: &[u8]) -> SipHasher24 {
    let mut h = SipHasher24::new_with_key(&key.0);
    // Domain separation: what kind of message this is.
    h.write(domain);
    h
}

/// The MAC of the feedback `fb` echoing `t` (its own `mac` field is not
/// input; its hops enter in their relative form).
pub fn feedback_mac(key: &FeedbackKey, fb: Feedback, t: &TlmRepr) -> u64 {
    let mut h = match fb {
        Feedback::Ack(id) => {
            let mut h = keyed(key, b"rnic-ack");
            h.write_u32(id.dest_qp & 0xFF_FFFF);
            h.write_u32(id.psn & 0xFF_FFFF);
            h.write_u8(id.syndrome);
            h.write_u32(id.msn & 0xFF_FFFF);
            h
        }
        Feedback::Probe { dest_qp, probe } => {
            let mut h = keyed(key, b"rnic-probe");
            h.write_u32(dest_qp & 0xFF_FFFF);
            h.write_u32(probe.probe_id);
            h.write_u32(probe.snd_psn);
            h.write_u64(probe.sender_ts_ns);
            h
        }
        Feedback::Notify { dest_qp, notify } => {
            let mut h = keyed(key, b"rnic-notify");
            h.write_u32(dest_qp & 0xFF_FFFF);
            h.write_u32(notify.window_bytes);
            h.write_u32(notify.rate_mbps);
            h.write_u32(notify.seq);
            h
        }
    };
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
        let r = hop.relative(t.compact, t.sojourn);
        h.write_u32(r.ts_ns);
        h.write_u32(r.tx_bytes);
        h.write_u32(r.qlen);
        h.write_u16(r.rate);
    }
    h.finish()
}

/// The MAC of an ACK `id` echoing `t`.
pub fn ack_mac(key: &FeedbackKey, id: AckId, t: &TlmRepr) -> u64 {
    feedback_mac(key, Feedback::Ack(id), t)
}

/// The token a sender puts in its data packet of `psn` to the peer's QP
/// `dest_qp`, which a switch's INT response for that packet carries back.
pub fn int_token(key: &FeedbackKey, dest_qp: u32, psn: u32) -> u64 {
    let mut h = keyed(key, b"rnic-int");
    h.write_u32(dest_qp & 0xFF_FFFF);
    h.write_u32(psn & 0xFF_FFFF);
    h.finish()
}

/// The newest feedback of each kind a keyed sender took: anything not
/// newer is a replay and refused.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Freshness {
    ack_psn: Option<u32>,
    probe_id: Option<u32>,
    notify_seq: Option<u32>,
    /// Per position of the answering switch on the path (the response's
    /// nhop - 1), the newest PSN answered from there.
    int_response: [Option<u32>; MAX_HOPS + 1],
}

/// Is `x` after `last` in a sequence space of `bits` that wraps?
fn after(x: u32, last: Option<u32>, bits: u32) -> bool {
    let half = 1u32 << (bits - 1);
    let mask = if bits == 32 {
        u32::MAX
    } else {
        (1 << bits) - 1
    };
    last.is_none_or(|l| {
        let d = x.wrapping_sub(l) & mask;
        d != 0 && d < half
    })
}

impl Freshness {
    /// An ACK of `psn` (24 bits): takes it when newer.
    pub fn ack(&mut self, psn: u32) -> bool {
        Self::take(&mut self.ack_psn, psn & 0xFF_FFFF, 24)
    }

    /// A probe answer for probe `id` (HPCC++ probe mode's sequence).
    pub fn probe(&mut self, id: u32) -> bool {
        Self::take(&mut self.probe_id, id, 32)
    }

    /// A notification of sequence `seq`.
    pub fn notify(&mut self, seq: u32) -> bool {
        Self::take(&mut self.notify_seq, seq, 32)
    }

    /// An INT response for `psn` whose stack has `nhop` records (the
    /// answering switch's last): newer when its PSN is newer than the last
    /// one answered by a switch at that position on the path. Responses
    /// of different switches interleave out of PSN order (a switch further
    /// along answers an earlier packet later), those of one switch do not.
    /// A last PSN no longer `in_flight` (acknowledged) is forgotten: any
    /// PSN in flight is newer, however long ago that switch last answered
    /// (the PSN space wraps).
    pub fn int_response(&mut self, psn: u32, nhop: u8, in_flight: impl Fn(u32) -> bool) -> bool {
        let slot = &mut self.int_response[usize::from(nhop).min(MAX_HOPS)];
        if slot.is_some_and(|l| !in_flight(l)) {
            *slot = None;
        }
        Self::take(slot, psn & 0xFF_FFFF, 24)
    }

    fn take(slot: &mut Option<u32>, x: u32, bits: u32) -> bool {
        let fresh = after(x, *slot, bits);
        if fresh {
            *slot = Some(x);
        }
        fresh
    }
}

/// A connection's key derived from a domain key shared by every NIC of a
/// domain (a daemon's `feedback_domain_key`): both ends compute the same
/// key from the two (address, QPN) ends, in either order, so that
/// applications that know nothing of keys (an unmodified verbs binary)
/// get authenticated feedback.
pub fn connection_key(
    domain: &FeedbackKey,
    a: (std::net::Ipv4Addr, u32),
    b: (std::net::Ipv4Addr, u32),
) -> FeedbackKey {
    let (lo, hi) = if (a.0.octets(), a.1) <= (b.0.octets(), b.1) {
        (a, b)
    } else {
        (b, a)
    };
    let half = |tag: &[u8]| {
        let mut h = keyed(domain, tag);
        for (ip, qpn) in [lo, hi] {
            h.write(&ip.octets());
            h.write_u32(qpn & 0xFF_FFFF);
        }
        h.finish()
    };
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&half(b"rnic-conn-0").to_le_bytes());
    k[8..].copy_from_slice(&half(b"rnic-conn-1").to_le_bytes());
    FeedbackKey(k)
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

    #[test]
    fn a_boundary_rewriting_the_stack_to_relative_load_keeps_the_mac() {
        let key = FeedbackKey([9; 16]);
        let mut t = stack();
        t.hops[0].tx_bytes = 123_456;
        let mac = ack_mac(&key, ID, &t);
        assert_eq!(mac, ack_mac(&key, ID, &t.relative()));
        // What the sender acts on is covered: the load relative to B.
        let mut u = t;
        u.hops[0].tx_bytes += 8 * 1024;
        assert_ne!(mac, ack_mac(&key, ID, &u));
    }

    #[test]
    fn each_kind_of_feedback_has_its_own_mac_and_tokens_name_their_psn() {
        let key = FeedbackKey([1; 16]);
        let t = stack();
        let probe = ProbeRepr {
            probe_id: 7,
            snd_psn: 100,
            sender_ts_ns: 5,
        };
        let notify = NotifyRepr {
            window_bytes: 7,
            rate_mbps: 100,
            seq: 5,
        };
        let macs = [
            ack_mac(&key, ID, &t),
            feedback_mac(
                &key,
                Feedback::Probe {
                    dest_qp: 0x12,
                    probe,
                },
                &t,
            ),
            feedback_mac(
                &key,
                Feedback::Notify {
                    dest_qp: 0x12,
                    notify,
                },
                &t,
            ),
        ];
        assert!(macs[0] != macs[1] && macs[1] != macs[2] && macs[0] != macs[2]);
        let other = ProbeRepr {
            sender_ts_ns: 6,
            ..probe
        };
        assert_ne!(
            macs[1],
            feedback_mac(
                &key,
                Feedback::Probe {
                    dest_qp: 0x12,
                    probe: other
                },
                &t
            )
        );
        assert_ne!(int_token(&key, 0x12, 100), int_token(&key, 0x12, 101));
        assert_ne!(int_token(&key, 0x12, 100), int_token(&key, 0x13, 100));
        assert_ne!(
            int_token(&key, 0x12, 100),
            int_token(&FeedbackKey([2; 16]), 0x12, 100)
        );
    }

    #[test]
    fn only_newer_feedback_is_fresh() {
        let mut f = Freshness::default();
        assert!(f.ack(0xFF_FFFE) && f.ack(1), "the PSN wraps");
        assert!(!f.ack(1) && !f.ack(0xFF_FFFF));
        assert!(f.probe(5) && !f.probe(5) && !f.probe(4) && f.probe(6));
        assert!(f.notify(u32::MAX) && f.notify(0) && !f.notify(u32::MAX));
        let all = |_| true;
        assert!(f.int_response(10, 1, all));
        assert!(
            f.int_response(10, 2, all),
            "the same packet, a switch further on"
        );
        assert!(
            f.int_response(8, 3, all),
            "an earlier packet answered later by a switch further on"
        );
        assert!(!f.int_response(10, 2, all) && !f.int_response(10, 1, all));
        assert!(!f.int_response(8, 3, all) && !f.int_response(7, 3, all));
        assert!(!f.int_response(9, 1, all));
        assert!(f.int_response(11, 1, all) && f.int_response(9, 3, all));
        // 2^23 PSNs later, that switch answers again: its last PSN was
        // acknowledged long ago, so the new one is fresh.
        let later = (11 + (1 << 23) + 5) & 0xFF_FFFF;
        assert!(f.int_response(later, 1, |p| p == later));
        assert!(!f.int_response(later, 1, |p| p == later));
    }

    #[test]
    fn keys_parse_from_hex_and_derive_the_same_for_both_ends() {
        let k = FeedbackKey::from_hex("000102030405060708090a0b0c0d0e0F").unwrap();
        assert_eq!(k.0[15], 15);
        let e = FeedbackKey::from_hex("0001").unwrap_err();
        assert_eq!(e, BadKey::Length(4));
        assert!(e.to_string().contains("32 hex digits"), "{e}");
        let e = FeedbackKey::from_hex("zz0102030405060708090a0b0c0d0e0f").unwrap_err();
        assert_eq!(e, BadKey::NotHex(0));
        let e = FeedbackKey::from_hex("0z0102030405060708090a0b0c0d0e0f").unwrap_err();
        assert_eq!(e, BadKey::NotHex(1));
        assert!(e.to_string().contains("character 1"), "{e}");
        // from_str_radix would take a sign.
        let e = FeedbackKey::from_hex("+f0102030405060708090a0b0c0d0e0f").unwrap_err();
        assert_eq!(e, BadKey::NotHex(0));
        assert_eq!(
            FeedbackKey::from_hex("é0102030405060708090a0b0c0d0e0f"),
            Err(BadKey::NotAscii)
        );
        let a = (std::net::Ipv4Addr::new(10, 0, 0, 1), 0x11);
        let b = (std::net::Ipv4Addr::new(10, 0, 0, 2), 0x22);
        assert_eq!(connection_key(&k, a, b), connection_key(&k, b, a));
        assert_ne!(connection_key(&k, a, b), connection_key(&k, a, (b.0, 0x23)));
        assert_ne!(connection_key(&k, a, b), k);
    }
}
