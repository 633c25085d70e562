//! Receiver-measured N (HPCC++ draft-00 s6.2, last paragraph): when the
//! last hop before this NIC is the congestion point, the receiver counts the
//! flows that cross it (every QP that delivered data recently) and reports
//! the count in the ACKs' echoed telemetry (TLM flag NFLOWS, `path_id` =
//! N), so that senders set W_AI = W_init (1 - eta) / N from the real number
//! of flows instead of a configured guess.
//!
//! The last hop is the congestion point when its utilization, from the
//! deltas of its own records across the data this NIC receives, is within
//! [`NEAR_TARGET`] of eta, and no earlier hop of the packet's stack has a
//! longer queue. Sans-IO: time is passed in.

use crate::wire::{HopRecord, TlmRepr};

/// The last hop counts as saturated at utilization eta - this or more.
pub const NEAR_TARGET: f64 = 0.1;

/// The last hop's state as the receiver sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LastHop {
    t_ns: u64,
    eta: f64,
    prev: Option<HopRecord>,
    /// Utilization of the last hop (EWMA over T, as HPCC++'s U).
    u: f64,
    /// No earlier hop of the newest stack had a longer queue.
    deepest: bool,
}

impl LastHop {
    pub fn new(t_ns: u64, eta: f64) -> Self {
        LastHop {
            t_ns: t_ns.max(1),
            eta,
            prev: None,
            u: 0.0,
            deepest: false,
        }
    }

    /// A data packet's (not echoed) stack arrived.
    pub fn on_data(&mut self, t: &TlmRepr) {
        let hops = t.filled();
        let Some(&last) = hops.last() else {
            return;
        };
        let queue = |h: &crate::wire::HopRecord| h.queue_bytes(t.sojourn);
        self.deepest = hops.iter().all(|h| queue(h) <= queue(&last));
        // Kept in bytes: the next stack may come from a sender that asks
        // for the other unit.
        let last = crate::wire::HopRecord {
            qlen: queue(&last),
            ..last
        };
        if let Some(prev) = self.prev.filter(|p| {
            (p.switch_id, p.port_id) == (last.switch_id, last.port_id) && p.rate == last.rate
        }) {
            let wrap = super::qp::wrap_of(t);
            let mask_ts = wrap.ts_mask;
            let dt = wrap.ts_delta(last.ts_ns, prev.ts_ns);
            let b = last.rate_bps() as f64 / 8e9;
            // A record a little behind the reference (less than T) was
            // reordered: keep the newer reference. Any other backwards
            // delta is an idle gap that wrapped the timestamp: start over
            // from this record.
            if dt > mask_ts / 2 && mask_ts - dt < self.t_ns.min(u64::from(mask_ts)) as u32 {
                return;
            }
            if dt > 0 && dt <= mask_ts / 2 && b > 0.0 {
                let t = self.t_ns as f64;
                let dtx = f64::from(wrap.bytes_delta(last.tx_bytes, prev.tx_bytes));
                let q = f64::from(last.qlen.min(prev.qlen));
                let u = q / (b * t) + dtx / (f64::from(dt) * b);
                let tau = f64::from(dt).min(t);
                self.u = (1.0 - tau / t) * self.u + tau / t * u.min(1e6);
            }
        }
        self.prev = Some(last);
    }

    /// Is the last hop the congestion point?
    pub fn is_bottleneck(&self) -> bool {
        self.deepest && self.u >= self.eta - NEAR_TARGET
    }

    pub fn utilization(&self) -> f64 {
        self.u
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stack whose last hop is a 100G port that sent `tx` bytes by `ts`.
    fn stack(ts: u32, tx: u32, last_q: u32, first_q: u32) -> TlmRepr {
        let mut t = TlmRepr::empty(3);
        t.hops[0] = HopRecord {
            ts_ns: ts,
            tx_bytes: tx,
            qlen: first_q,
            rate: 1000,
            switch_id: 1,
            port_id: 1,
        };
        t.hops[1] = HopRecord {
            ts_ns: ts,
            tx_bytes: tx,
            qlen: last_q,
            rate: 1000,
            switch_id: 2,
            port_id: 5,
        };
        t.nhop = 2;
        t
    }

    #[test]
    fn a_saturated_last_hop_with_the_deepest_queue_is_the_bottleneck() {
        let mut h = LastHop::new(10_000, 0.95);
        // 12.5 B/ns = 100G: the port sends at line rate for 10 us.
        for k in 0..5u32 {
            h.on_data(&stack(k * 10_000, k * 125_000, 2_000, 0));
        }
        assert!(h.utilization() > 0.95, "{}", h.utilization());
        assert!(h.is_bottleneck());
    }

    #[test]
    fn a_reordered_record_is_skipped_and_a_wrapped_idle_gap_restarts() {
        let mut h = LastHop::new(10_000, 0.95);
        for k in 1..5u32 {
            h.on_data(&stack(k * 10_000, k * 125_000, 2_000, 0));
        }
        let u = h.utilization();
        // 1 us behind the reference: reordered, nothing changes.
        h.on_data(&stack(39_000, 480_000, 2_000, 0));
        assert_eq!(h.utilization(), u);
        // Far behind (the clock wrapped over an idle gap): the record is
        // the new reference, and the next one gives a sample again.
        h.on_data(&stack(5_000, 0, 0, 0));
        h.on_data(&stack(15_000, 12_500, 0, 0));
        assert!(h.utilization() < u, "{} then {}", u, h.utilization());
    }

    #[test]
    fn an_idle_last_hop_or_a_deeper_queue_upstream_is_not() {
        let mut idle = LastHop::new(10_000, 0.95);
        for k in 0..5u32 {
            // 10% of the line rate.
            idle.on_data(&stack(k * 10_000, k * 12_500, 0, 0));
        }
        assert!(!idle.is_bottleneck(), "u = {}", idle.utilization());
        let mut upstream = LastHop::new(10_000, 0.95);
        for k in 0..5u32 {
            upstream.on_data(&stack(k * 10_000, k * 125_000, 2_000, 50_000));
        }
        assert!(!upstream.is_bottleneck(), "an earlier hop queues more");
    }
}
