//! DCQCN (Zhu et al., SIGCOMM 2015), the congestion control RoCE NICs ship
//! with, as the baseline HPCC++ is compared against.
//!
//! Reaction point (sender, [`Dcqcn`]): on a CNP, Rt = Rc, Rc = Rc (1 -
//! alpha/2), alpha = (1 - g) alpha + g; without CNPs alpha decays by (1 - g)
//! every alpha period; a rate timer and a byte counter each count stages of
//! increase: fast recovery (Rc = (Rt + Rc) / 2) while both counts are below
//! F, hyper increase (Rt += i R_HAI, i = min(counts) - F) when both exceed
//! F, additive increase (Rt += R_AI) otherwise; every increase then sets
//! Rc = (Rt + Rc) / 2. Notification point (receiver, [`CnpLimiter`]):
//! at most one CNP per flow per interval for CE-marked arrivals.
//!
//! Defaults ([`DcqcnParams::new`]): g = 1/256, alpha period 55 us, rate
//! timer 55 us, byte counter 10 MB, F = 5, R_AI = 40 Mb/s (all from the
//! DCQCN paper), R_HAI = 10 R_AI (our choice), minimum rate 10 Mb/s, CNP
//! interval 50 us (paper). ConnectX firmware uses other values (timer
//! 300 us, R_AI 5 Mb/s, R_HAI 50 Mb/s, F = 1); every field can be set.

/// At most this many missed timer periods are replayed in one call (enough
/// to go from the minimum rate back to line rate at any sane setting).
const MAX_CATCH_UP: u64 = 256;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DcqcnParams {
    pub line_rate_bps: f64,
    pub min_rate_bps: f64,
    /// g: alpha gain.
    pub g: f64,
    pub alpha_init: f64,
    /// Alpha decays once per period without CNP (K in the paper).
    pub alpha_period_ns: u64,
    /// Rate increase timer period.
    pub timer_ns: u64,
    /// Rate increase byte counter (B in the paper), bytes.
    pub byte_counter: u64,
    /// F: fast recovery stages.
    pub f: u32,
    /// R_AI: additive increase step, b/s.
    pub rai_bps: f64,
    /// R_HAI: hyper increase step, b/s.
    pub rhai_bps: f64,
    /// Bytes in flight allowed (DCQCN is rate-based: unlimited by default).
    pub window_bytes: u64,
}

impl DcqcnParams {
    /// The documented defaults for a NIC of `line_rate_bps`.
    pub fn new(line_rate_bps: f64) -> Self {
        DcqcnParams {
            line_rate_bps,
            min_rate_bps: 10e6,
            g: 1.0 / 256.0,
            alpha_init: 1.0,
            alpha_period_ns: 55_000,
            timer_ns: 55_000,
            byte_counter: 10_000_000,
            f: 5,
            rai_bps: 40e6,
            rhai_bps: 400e6,
            window_bytes: u64::MAX,
        }
    }
}

/// Reaction point of one flow.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dcqcn {
    p: DcqcnParams,
    /// Rc: current rate.
    rc: f64,
    /// Rt: target rate.
    rt: f64,
    alpha: f64,
    timer_count: u32,
    byte_count: u32,
    bytes: u64,
    next_alpha: Option<u64>,
    next_timer: Option<u64>,
    /// CNPs reacted to.
    pub cnps: u64,
}

impl Dcqcn {
    /// Starts at line rate with alpha = alpha_init and no timers running.
    pub fn new(p: DcqcnParams) -> Self {
        Dcqcn {
            p,
            rc: p.line_rate_bps,
            rt: p.line_rate_bps,
            alpha: p.alpha_init,
            timer_count: 0,
            byte_count: 0,
            bytes: 0,
            next_alpha: None,
            next_timer: None,
            cnps: 0,
        }
    }

    /// Current rate Rc, b/s.
    pub fn rate_bps(&self) -> f64 {
        self.rc
    }

    /// Target rate Rt, b/s.
    pub fn target_bps(&self) -> f64 {
        self.rt
    }

    pub fn alpha(&self) -> f64 {
        self.alpha
    }

    pub fn window_bytes(&self) -> u64 {
        self.p.window_bytes
    }

    /// A CNP arrived: cut the rate and restart the increase machinery.
    pub fn on_cnp(&mut self, now: u64) {
        self.cnps += 1;
        self.rt = self.rc;
        self.rc = (self.rc * (1.0 - self.alpha / 2.0)).max(self.p.min_rate_bps);
        self.alpha = (1.0 - self.p.g) * self.alpha + self.p.g;
        self.timer_count = 0;
        self.byte_count = 0;
        self.bytes = 0;
        self.next_alpha = Some(now + self.p.alpha_period_ns);
        self.next_timer = Some(now + self.p.timer_ns);
    }

    /// Counts sent bytes for the byte counter.
    pub fn on_sent(&mut self, bytes: u64) {
        if self.next_timer.is_none() {
            return; // at line rate, nothing to recover
        }
        self.bytes += bytes;
        while self.bytes >= self.p.byte_counter && self.next_timer.is_some() {
            self.bytes -= self.p.byte_counter;
            self.increase();
            self.byte_count += 1;
        }
    }

    /// The earliest timer deadline.
    pub fn poll_timeout(&self) -> Option<u64> {
        match (self.next_alpha, self.next_timer) {
            (Some(a), Some(t)) => Some(a.min(t)),
            (a, t) => a.or(t),
        }
    }

    /// Runs the alpha and rate-increase timers due at `now`.
    pub fn handle_timeout(&mut self, now: u64) {
        if let Some(at) = self.next_alpha.filter(|&at| at <= now) {
            let periods = (now - at) / self.p.alpha_period_ns + 1;
            self.alpha *= (1.0 - self.p.g).powf(periods as f64);
            self.next_alpha = Some(at + periods * self.p.alpha_period_ns);
        }
        if let Some(at) = self.next_timer.filter(|&at| at <= now) {
            let periods = (now - at) / self.p.timer_ns + 1;
            for _ in 0..periods.min(MAX_CATCH_UP) {
                self.increase();
                self.timer_count += 1;
                if self.next_timer.is_none() {
                    break;
                }
            }
            if self.next_timer.is_some() {
                self.next_timer = Some(at + periods * self.p.timer_ns);
            }
        }
        if self.next_timer.is_none() {
            self.next_alpha = None;
        }
    }

    /// One increase event; the counters are the events seen before this one
    /// (so the first F events of each kind are fast recovery).
    fn increase(&mut self) {
        let (t, b, f) = (self.timer_count, self.byte_count, self.p.f);
        if t.max(b) < f {
            // fast recovery: Rt unchanged
        } else if t.min(b) > f {
            let i = f64::from(t.min(b) - f);
            self.rt += i * self.p.rhai_bps;
        } else {
            self.rt += self.p.rai_bps;
        }
        self.rt = self.rt.min(self.p.line_rate_bps);
        self.rc = ((self.rt + self.rc) / 2.0).min(self.p.line_rate_bps);
        if self.p.line_rate_bps - self.rc < 1.0 {
            // Recovered: back to line rate, timers off until the next CNP.
            self.rc = self.p.line_rate_bps;
            self.rt = self.rc;
            self.next_timer = None;
        }
    }
}

/// Notification point of one flow: CNP at most once per interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CnpLimiter {
    interval_ns: u64,
    last: Option<u64>,
    /// CE-marked packets that did not produce a CNP.
    pub suppressed: u64,
}

impl CnpLimiter {
    /// The paper's interval is 50 us.
    pub const DEFAULT_INTERVAL_NS: u64 = 50_000;

    pub fn new(interval_ns: u64) -> Self {
        CnpLimiter {
            interval_ns,
            last: None,
            suppressed: 0,
        }
    }

    /// A CE-marked packet of the flow arrived: send a CNP now?
    pub fn on_ce(&mut self, now: u64) -> bool {
        match self.last {
            Some(l) if now < l.saturating_add(self.interval_ns) => {
                self.suppressed += 1;
                false
            }
            _ => {
                self.last = Some(now);
                true
            }
        }
    }
}
