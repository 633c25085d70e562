//! A switch's INT responses (HPCC++ draft-00 s6.3): when a data packet
//! that subscribed to them (TLM flag SUBSCRIBE) joins an egress queue at or
//! above a threshold, the switch sends its sender the packet's stack with
//! the congested port's record, straight back (`wire::emit_int_response`).
//! A Bloom filter of the flows answered, cleared every period, keeps a
//! flow to one response per period: the sender commits a reference window
//! once per round trip anyway, and a burst of responses to one sender
//! would only load the way back.

use transport::wire::int_response::subscribed;
use transport::wire::{emit_int_response, HopRecord, NoResponse, RoceFrame};

/// When and how often a switch answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IntResponseConfig {
    /// Egress queue bytes (the arriving packet included) at or above which
    /// a subscribed packet is answered.
    pub threshold_bytes: u64,
    /// The Bloom filter is cleared at every multiple of this (ns): a flow
    /// gets at most one response per period from this switch.
    pub period_ns: u64,
    /// Bits of the filter (rounded up to a multiple of 64, at least 64).
    pub bloom_bits: usize,
}

impl IntResponseConfig {
    /// Answers above `threshold_bytes`, one response per flow per
    /// `period_ns` (use the base RTT), a 4096-bit filter.
    pub fn new(threshold_bytes: u64, period_ns: u64) -> Self {
        IntResponseConfig {
            threshold_bytes,
            period_ns,
            bloom_bits: 4096,
        }
    }
}

/// Hashes per flow in the filter.
const HASHES: u32 = 3;

/// Counters of a switch's INT responses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IntResponseCounters {
    /// Responses built.
    pub sent: u64,
    /// Subscribed packets above the threshold whose flow was already
    /// answered this period (or that the filter mistook for one).
    pub suppressed: u64,
    /// Subscribed packets above the threshold with no free TLM slot.
    pub no_room: u64,
}

/// The filter, its period and the responses built, for one switch.
#[derive(Debug, Clone)]
pub struct IntResponder {
    cfg: IntResponseConfig,
    bits: Vec<u64>,
    /// The period the filter's bits belong to (now / period_ns).
    epoch: u64,
    counters: IntResponseCounters,
}

impl IntResponder {
    /// The filter has 64 to 2^24 bits (the configuration is clamped).
    pub fn new(cfg: IntResponseConfig) -> Self {
        let words = cfg.bloom_bits.clamp(64, 1 << 24).div_ceil(64);
        IntResponder {
            cfg: IntResponseConfig {
                period_ns: cfg.period_ns.max(1),
                bloom_bits: words * 64,
                ..cfg
            },
            bits: vec![0; words],
            epoch: 0,
            counters: IntResponseCounters::default(),
        }
    }

    pub fn config(&self) -> &IntResponseConfig {
        &self.cfg
    }

    pub fn counters(&self) -> &IntResponseCounters {
        &self.counters
    }

    /// A frame joined an egress queue of `qlen` bytes at `now`; `hop` is
    /// the port's record. Returns the response to send, if one is due.
    pub fn offer(&mut self, now: u64, frame: &[u8], qlen: u64, hop: &HopRecord) -> Option<Vec<u8>> {
        if qlen < self.cfg.threshold_bytes {
            return None;
        }
        let f = RoceFrame::new_checked(frame).ok()?;
        if !subscribed(&f) {
            return None;
        }
        if f.tlm().is_some_and(|t| t.nhop() >= t.maxhop()) {
            // No slot for this switch's record: nothing to send, and the
            // flow stays out of the filter.
            self.counters.no_room += 1;
            return None;
        }
        let flow = [
            u32::from(f.src_ip()),
            u32::from(f.dst_ip()),
            f.dest_qp() ^ u32::from(f.entropy()) << 24,
        ];
        if !self.insert(now, flow) {
            self.counters.suppressed += 1;
            return None;
        }
        let mut out = vec![0u8; frame.len() + 2 * transport::wire::tlm::HOP_LEN];
        match emit_int_response(frame, hop, &mut out) {
            Ok(n) => {
                out.truncate(n);
                self.counters.sent += 1;
                Some(out)
            }
            Err(NoResponse::NoRoom) => {
                self.counters.no_room += 1;
                None
            }
            Err(_) => None,
        }
    }

    /// Adds `flow` to this period's filter; false when it was there.
    fn insert(&mut self, now: u64, flow: [u32; 3]) -> bool {
        let epoch = now / self.cfg.period_ns;
        if epoch != self.epoch {
            self.bits.fill(0);
            self.epoch = epoch;
        }
        let n = self.cfg.bloom_bits as u32;
        let mut fresh = false;
        for k in 0..HASHES {
            let bit = crate::switch::ecmp_hash(flow, 0xB100_0000 + k) % n;
            let (w, m) = ((bit / 64) as usize, 1u64 << (bit % 64));
            fresh |= self.bits[w] & m == 0;
            self.bits[w] |= m;
        }
        fresh
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use transport::wire::{Opcode, PacketRepr, RethRepr, TlmRepr};

    fn data(src: u8, subscribe: bool) -> Vec<u8> {
        let mut r = PacketRepr::new(Opcode::RdmaWriteOnly, 0x11, 7);
        r.ip.src = core::net::Ipv4Addr::new(10, 0, 0, src);
        r.ip.dst = core::net::Ipv4Addr::new(10, 0, 0, 99);
        r.reth = Some(RethRepr {
            va: 0,
            r_key: 1,
            dma_len: 8,
        });
        r.tlm = Some(TlmRepr {
            subscribe,
            ..TlmRepr::empty(4)
        });
        let mut b = vec![0; 256];
        let n = r.emit(&[0; 8], &mut b).unwrap();
        b.truncate(n);
        b
    }

    fn responder() -> IntResponder {
        IntResponder::new(IntResponseConfig::new(10_000, 1_000))
    }

    #[test]
    fn a_response_only_at_or_above_the_threshold_and_only_when_subscribed() {
        let mut r = responder();
        let hop = HopRecord::default();
        assert!(r.offer(0, &data(1, true), 9_999, &hop).is_none());
        assert!(r.offer(0, &data(1, false), 50_000, &hop).is_none());
        assert!(r.offer(0, &data(1, true), 10_000, &hop).is_some());
        assert_eq!(r.counters().sent, 1);
    }

    #[test]
    fn at_most_one_response_per_flow_per_period() {
        let mut r = responder();
        let hop = HopRecord::default();
        assert!(r.offer(100, &data(1, true), 20_000, &hop).is_some());
        assert!(r.offer(500, &data(1, true), 20_000, &hop).is_none());
        assert!(r.offer(999, &data(1, true), 20_000, &hop).is_none());
        assert_eq!(r.counters().suppressed, 2);
        // Another sender in the same period is answered.
        assert!(r.offer(999, &data(2, true), 20_000, &hop).is_some());
        // The next period clears the filter.
        assert!(r.offer(1_000, &data(1, true), 20_000, &hop).is_some());
        assert_eq!(r.counters().sent, 3);
    }

    #[test]
    fn many_flows_in_one_period_are_mostly_answered() {
        let mut r = responder();
        let hop = HopRecord::default();
        let answered = (1..=100u8)
            .filter(|&s| r.offer(0, &data(s, true), 20_000, &hop).is_some())
            .count();
        // 100 flows x 3 bits in 4096: false positives are rare.
        assert!(answered >= 97, "{answered} of 100");
    }
}
