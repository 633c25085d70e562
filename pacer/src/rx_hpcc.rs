//! Receiver-based HPCC++ (Rx-HPCC, draft section 6.3.2): the receiver runs
//! MeasureInflight/ComputeWind on the telemetry of arriving data (NewINT)
//! and, at most once per T, tells the sender its window in a CC_NOTIFY;
//! the sender adopts it.

use crate::hpcc::{HpccCore, HpccParams, Update};
use crate::telemetry::HopStack;

/// A window the receiver sends (the NOTIFY block of CC_NOTIFY).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Notification {
    pub window_bytes: u32,
    pub rate_mbps: u32,
    /// Increments per notification, so the sender can drop stale ones.
    pub seq: u32,
}

/// Receiver side of one flow.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RxHpcc {
    core: HpccCore,
    last_update_time: Option<u64>,
    seq: u32,
}

impl RxHpcc {
    pub fn new(params: HpccParams) -> Self {
        RxHpcc {
            core: HpccCore::new(params),
            last_update_time: None,
            seq: 0,
        }
    }

    pub fn core(&self) -> &HpccCore {
        &self.core
    }

    /// NewINT at time `now` with the telemetry of an arriving data packet.
    /// Commits Wc and returns the window to send when more than T has passed
    /// since the last commit (or there was none); otherwise updates W
    /// locally and returns `None`. The first telemetry only stores L.
    pub fn new_int(&mut self, now: u64, hops: &HopStack) -> Option<Notification> {
        let t = self.core.params().t_ns;
        let last = self.last_update_time;
        let due = last.is_none_or(|l| now > l.saturating_add(t));
        match self.core.event(hops, || due) {
            Update::Window { committed: true } => {
                self.last_update_time = Some(now);
                self.seq = self.seq.wrapping_add(1);
                Some(Notification {
                    window_bytes: self.core.w().min(f64::from(u32::MAX)) as u32,
                    rate_mbps: (self.core.rate_bps() / 1e6).min(f64::from(u32::MAX)) as u32,
                    seq: self.seq,
                })
            }
            _ => None,
        }
    }
}

/// Sender side of Rx-HPCC: the window and rate the receiver last sent.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RxHpccSender {
    params: HpccParams,
    w: f64,
    last_seq: Option<u32>,
}

impl RxHpccSender {
    /// Starts at W_init, as every HPCC++ flow does.
    pub fn new(params: HpccParams) -> Self {
        RxHpccSender {
            params,
            w: params.w_init,
            last_seq: None,
        }
    }

    /// Adopts the notified window (clamped to [W_min, W_init]) unless the
    /// notification is older than one already adopted. Returns whether it
    /// was adopted.
    pub fn on_notify(&mut self, n: &Notification) -> bool {
        if let Some(last) = self.last_seq {
            if (n.seq.wrapping_sub(last) as i32) <= 0 {
                return false;
            }
        }
        self.last_seq = Some(n.seq);
        self.w = f64::from(n.window_bytes).clamp(self.params.w_min, self.params.w_init);
        true
    }

    pub fn w(&self) -> f64 {
        self.w
    }

    /// R = W / T.
    pub fn rate_bps(&self) -> f64 {
        self.params.rate_bps(self.w)
    }
}
