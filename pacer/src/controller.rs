//! One small trait over every congestion controller, and an enum of them
//! for static dispatch on the per-packet path (a `match`, no `dyn`).
//!
//! The transport engine tells its flow's controller what happened
//! (telemetry, a receiver's window, a CNP, bytes sent, timers) and reads
//! back the window W (bytes in flight) and pacing rate R that gate the
//! flow scheduler.

use crate::dcqcn::Dcqcn;
use crate::fixed::Fixed;
use crate::hpcc::Hpcc;
use crate::rx_hpcc::{Notification, RxHpccSender};
use crate::telemetry::HopStack;

/// What a congestion controller reacts to and what it decides.
pub trait CongestionControl {
    /// Bytes the flow may have in flight.
    fn window_bytes(&self) -> u64;
    /// Pacing rate, bits per second.
    fn rate_bps(&self) -> u64;
    /// Telemetry acknowledging `ack_seq` (an ACK with TLM, or a probe
    /// response with ack_seq = its snd_psn); `snd_nxt` is the flow's next PSN.
    fn on_telemetry(&mut self, _now: u64, _ack_seq: u32, _snd_nxt: u32, _hops: &HopStack) {}
    /// An INT response from a congested switch for the packet of `psn`
    /// (the congested port's record last in `hops`).
    fn on_int_response(&mut self, _now: u64, _psn: u32, _snd_nxt: u32, _hops: &HopStack) {}
    /// The receiver counted `n` concurrent flows through its last hop.
    fn on_flow_count(&mut self, _now: u64, _n: u16) {}
    /// A window computed by the receiver (CC_NOTIFY).
    fn on_notify(&mut self, _now: u64, _n: &Notification) {}
    /// A CNP for this flow.
    fn on_cnp(&mut self, _now: u64) {}
    /// Bytes put on the wire.
    fn on_sent(&mut self, _now: u64, _bytes: u64) {}
    /// The next time `handle_timeout` must run, if any.
    fn poll_timeout(&self) -> Option<u64> {
        None
    }
    /// Runs timers due at `now`.
    fn handle_timeout(&mut self, _now: u64) {}
    /// The flow moved to another route: telemetry from before describes
    /// other switches, and is no reference for what comes next.
    fn on_path_change(&mut self) {}
}

fn saturate(x: f64) -> u64 {
    if x >= u64::MAX as f64 {
        u64::MAX
    } else {
        x.max(0.0) as u64
    }
}

impl CongestionControl for Hpcc {
    fn window_bytes(&self) -> u64 {
        saturate(self.core().w())
    }
    fn rate_bps(&self) -> u64 {
        saturate(self.core().rate_bps())
    }
    fn on_telemetry(&mut self, now: u64, ack_seq: u32, snd_nxt: u32, hops: &HopStack) {
        self.expire_flow_count(now);
        self.new_ack(ack_seq, snd_nxt, hops);
    }
    fn on_int_response(&mut self, _now: u64, psn: u32, snd_nxt: u32, hops: &HopStack) {
        self.new_int_response(psn, snd_nxt, hops);
    }
    fn on_flow_count(&mut self, now: u64, n: u16) {
        self.set_flow_count(now, n);
    }
    fn on_path_change(&mut self) {
        self.forget_reference();
    }
}

impl CongestionControl for RxHpccSender {
    fn window_bytes(&self) -> u64 {
        saturate(self.w())
    }
    fn rate_bps(&self) -> u64 {
        saturate(RxHpccSender::rate_bps(self))
    }
    fn on_notify(&mut self, _now: u64, n: &Notification) {
        RxHpccSender::on_notify(self, n);
    }
}

impl CongestionControl for Dcqcn {
    fn window_bytes(&self) -> u64 {
        Dcqcn::window_bytes(self)
    }
    fn rate_bps(&self) -> u64 {
        saturate(Dcqcn::rate_bps(self))
    }
    fn on_cnp(&mut self, now: u64) {
        Dcqcn::on_cnp(self, now);
    }
    fn on_sent(&mut self, _now: u64, bytes: u64) {
        Dcqcn::on_sent(self, bytes);
    }
    fn poll_timeout(&self) -> Option<u64> {
        Dcqcn::poll_timeout(self)
    }
    fn handle_timeout(&mut self, now: u64) {
        Dcqcn::handle_timeout(self, now);
    }
}

impl CongestionControl for Fixed {
    fn window_bytes(&self) -> u64 {
        self.window_bytes
    }
    fn rate_bps(&self) -> u64 {
        self.rate_bps
    }
}

/// Every controller, chosen per flow at run time, dispatched by `match`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Controller {
    /// Sender-based HPCC++ (inband or probe telemetry).
    Hpcc(Hpcc),
    /// Receiver-based HPCC++, sender side.
    RxHpcc(RxHpccSender),
    Dcqcn(Dcqcn),
    /// No congestion control.
    Fixed(Fixed),
}

macro_rules! dispatch {
    ($self:ident, $c:ident => $e:expr) => {
        match $self {
            Controller::Hpcc($c) => $e,
            Controller::RxHpcc($c) => $e,
            Controller::Dcqcn($c) => $e,
            Controller::Fixed($c) => $e,
        }
    };
}

impl CongestionControl for Controller {
    fn window_bytes(&self) -> u64 {
        dispatch!(self, c => CongestionControl::window_bytes(c))
    }
    fn rate_bps(&self) -> u64 {
        dispatch!(self, c => CongestionControl::rate_bps(c))
    }
    fn on_telemetry(&mut self, now: u64, ack_seq: u32, snd_nxt: u32, hops: &HopStack) {
        dispatch!(self, c => CongestionControl::on_telemetry(c, now, ack_seq, snd_nxt, hops))
    }
    fn on_int_response(&mut self, now: u64, psn: u32, snd_nxt: u32, hops: &HopStack) {
        dispatch!(self, c => CongestionControl::on_int_response(c, now, psn, snd_nxt, hops))
    }
    fn on_flow_count(&mut self, now: u64, n: u16) {
        dispatch!(self, c => CongestionControl::on_flow_count(c, now, n))
    }
    fn on_notify(&mut self, now: u64, n: &Notification) {
        dispatch!(self, c => CongestionControl::on_notify(c, now, n))
    }
    fn on_cnp(&mut self, now: u64) {
        dispatch!(self, c => CongestionControl::on_cnp(c, now))
    }
    fn on_sent(&mut self, now: u64, bytes: u64) {
        dispatch!(self, c => CongestionControl::on_sent(c, now, bytes))
    }
    fn poll_timeout(&self) -> Option<u64> {
        dispatch!(self, c => CongestionControl::poll_timeout(c))
    }
    fn handle_timeout(&mut self, now: u64) {
        dispatch!(self, c => CongestionControl::handle_timeout(c, now))
    }
    fn on_path_change(&mut self) {
        dispatch!(self, c => CongestionControl::on_path_change(c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dcqcn::DcqcnParams;
    use crate::hpcc::HpccParams;

    #[test]
    fn every_controller_starts_at_its_initial_window_and_rate() {
        let p = HpccParams::new(100_000_000_000, 5_000, 16, 1024).unwrap();
        let cs = [
            Controller::Hpcc(Hpcc::new(p)),
            Controller::RxHpcc(RxHpccSender::new(p)),
            Controller::Dcqcn(Dcqcn::new(DcqcnParams::new(100e9))),
            Controller::Fixed(Fixed::line_rate(100_000_000_000)),
        ];
        for c in cs {
            assert_eq!(c.rate_bps(), 100_000_000_000, "{c:?}");
            assert!(c.window_bytes() >= 62_500, "{c:?}");
            assert_eq!(c.poll_timeout(), None);
        }
    }

    #[test]
    fn a_cnp_only_moves_dcqcn() {
        let p = HpccParams::new(100_000_000_000, 5_000, 16, 1024).unwrap();
        let mut h = Controller::Hpcc(Hpcc::new(p));
        let mut d = Controller::Dcqcn(Dcqcn::new(DcqcnParams::new(100e9)));
        h.on_cnp(10);
        d.on_cnp(10);
        assert_eq!(h.rate_bps(), 100_000_000_000);
        assert_eq!(d.rate_bps(), 50_000_000_000);
        assert_eq!(d.poll_timeout(), Some(10 + 55_000));
    }
}
