//! Telemetry as the controllers see it: the hop records of one event
//! (an ACK, a probe response or a data packet), in a fixed-size stack.
//!
//! These mirror the TLM hop records of wire.md; `transport` converts its
//! wire representation into these (pacer depends on nothing of ours).

/// Most hops a stack holds (wire.md allows 15 slots).
pub const MAX_HOPS: usize = 15;

/// One switch egress snapshot (wire.md hop record).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Hop {
    /// Egress timestamp, nanoseconds, wrapping mod 2^32.
    pub ts_ns: u32,
    /// Bytes sent by the port before this packet, wrapping mod 2^32.
    pub tx_bytes: u32,
    /// Egress queue bytes after the dequeue.
    pub qlen: u32,
    /// Link capacity B in units of 100 Mb/s.
    pub rate_100mbps: u16,
    pub switch_id: u8,
    pub port_id: u8,
}

impl Hop {
    /// Link capacity in bytes per nanosecond.
    pub fn bytes_per_ns(&self) -> f64 {
        f64::from(self.rate_100mbps) * 1e8 / 8e9
    }

    /// Is this the same egress port as `other`?
    pub fn same_port(&self, other: &Hop) -> bool {
        self.switch_id == other.switch_id && self.port_id == other.port_id
    }
}

/// Where a stack's counters wrap: ts_ns and tx_bytes deltas are taken
/// modulo these masks + 1 (2^32 for full-width hops; compact hop records
/// carry 24 bits of nanoseconds and 2^27 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wrap {
    pub ts_mask: u32,
    pub bytes_mask: u32,
}

impl Wrap {
    /// Full 32-bit counters.
    pub const FULL: Wrap = Wrap {
        ts_mask: u32::MAX,
        bytes_mask: u32::MAX,
    };

    /// `now - then` of timestamps, modulo the timestamp's width.
    pub fn ts_delta(&self, now: u32, then: u32) -> u32 {
        now.wrapping_sub(then) & self.ts_mask
    }

    /// `now - then` of byte counters, modulo the counter's width.
    pub fn bytes_delta(&self, now: u32, then: u32) -> u32 {
        now.wrapping_sub(then) & self.bytes_mask
    }
}

impl Default for Wrap {
    fn default() -> Self {
        Wrap::FULL
    }
}

/// The hops of one telemetry event, path order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HopStack {
    len: u8,
    hops: [Hop; MAX_HOPS],
    wrap: Wrap,
}

impl HopStack {
    /// An empty stack.
    pub const fn new() -> Self {
        HopStack {
            len: 0,
            hops: [Hop {
                ts_ns: 0,
                tx_bytes: 0,
                qlen: 0,
                rate_100mbps: 0,
                switch_id: 0,
                port_id: 0,
            }; MAX_HOPS],
            wrap: Wrap::FULL,
        }
    }

    /// The same hops with counters that wrap at `wrap`.
    pub fn with_wrap(mut self, wrap: Wrap) -> Self {
        self.wrap = wrap;
        self
    }

    pub fn wrap(&self) -> Wrap {
        self.wrap
    }

    /// A stack of the first `MAX_HOPS` hops of `hops`.
    pub fn from_slice(hops: &[Hop]) -> Self {
        let mut s = HopStack::new();
        for h in hops.iter().take(MAX_HOPS) {
            s.push(*h);
        }
        s
    }

    /// Appends a hop; returns false when the stack is full.
    pub fn push(&mut self, hop: Hop) -> bool {
        if usize::from(self.len) >= MAX_HOPS {
            return false;
        }
        self.hops[usize::from(self.len)] = hop;
        self.len += 1;
        true
    }

    pub fn len(&self) -> usize {
        usize::from(self.len)
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_slice(&self) -> &[Hop] {
        &self.hops[..self.len()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn narrow_counters_wrap_at_their_width() {
        let w = Wrap {
            ts_mask: (1 << 24) - 1,
            bytes_mask: (1 << 27) - 1,
        };
        // 100 ns across the 2^24 wrap, 256 bytes across the 2^27 wrap.
        assert_eq!(w.ts_delta(50, (1 << 24) - 50), 100);
        assert_eq!(w.bytes_delta(128, (1 << 27) - 128), 256);
        assert_eq!(Wrap::FULL.ts_delta(5, u32::MAX), 6);
        assert_eq!(HopStack::new().wrap(), Wrap::FULL);
    }

    #[test]
    fn stack_holds_at_most_fifteen_hops() {
        let mut s = HopStack::new();
        for i in 0..20u8 {
            let pushed = s.push(Hop {
                switch_id: i,
                ..Hop::default()
            });
            assert_eq!(pushed, i < 15);
        }
        assert_eq!(s.len(), 15);
        assert_eq!(s.as_slice()[14].switch_id, 14);
    }

    #[test]
    fn rate_units() {
        let h = Hop {
            rate_100mbps: 1000,
            ..Hop::default()
        };
        assert_eq!(h.bytes_per_ns(), 12.5, "100 Gb/s is 12.5 bytes/ns");
    }
}
