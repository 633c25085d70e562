//! Sender-based HPCC++ (draft section 4.2): MeasureInflight, ComputeWind and
//! NewAck for one flow, with the care list of hpcc.md.
//!
//! [`HpccCore`] holds what sender- and receiver-based HPCC++ share (U, W,
//! Wc, incStage, the last hop records L); [`Hpcc`] adds lastUpdateSeq and
//! the NewAck rule. Floating point, no allocation, no clock: callers pass
//! PSNs and hop records.

use crate::psn::{psn_gt, PSN_MASK};
use crate::telemetry::HopStack;

/// U is floored at this before dividing by it.
pub const U_FLOOR: f64 = 1e-6;
/// Upper bound on U and on any hop's u' (sanity bound, far above any real
/// link: u' = 1e6 is a queue a million BDPs long).
pub const U_MAX: f64 = 1e6;
/// A reported flow count holds for this many T after the last report.
pub const FLOW_COUNT_TTL_T: u64 = 4;
/// Queue lengths above this (1 GiB, larger than any switch buffer) are
/// treated as this.
pub const QLEN_MAX: u32 = 1 << 30;

/// HPCC++ parameters (hpcc.md, "Sender-based algorithm").
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HpccParams {
    /// T: known base RTT, nanoseconds.
    pub t_ns: u64,
    /// eta: target utilization.
    pub eta: f64,
    /// maxStage: additive-increase stages before multiplicative increase.
    pub max_stage: u32,
    /// W_init: initial and largest window, bytes.
    pub w_init: f64,
    /// W_ai: additive increase, bytes.
    pub w_ai: f64,
    /// W_min: smallest window, bytes.
    pub w_min: f64,
}

/// A parameter set that cannot work, naming the bad value.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
pub enum ParamError {
    #[error("T must be positive, got {0} ns")]
    ZeroT(u64),
    #[error("eta must be in (0, 1], got {0}")]
    Eta(f64),
    #[error("W_min must be positive and at most W_init, got W_min {w_min} with W_init {w_init}")]
    Window { w_min: f64, w_init: f64 },
    #[error("W_ai must be finite and not negative, got {0}")]
    WAi(f64),
    #[error("N (expected flows per link) must be at least 1, got {0}")]
    ZeroN(u32),
    #[error("line rate must be positive, got {0} b/s")]
    ZeroRate(u64),
}

/// The HPCC++ settings a configuration chooses (T, N, eta, maxStage);
/// the windows follow from the link. The one place HPCC++ parameters are
/// built from a configuration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HpccSettings {
    /// T: known base RTT, nanoseconds.
    pub t_ns: u64,
    /// N: expected flows per link (W_ai = W_init (1 - eta) / N).
    pub n: u32,
    pub eta: f64,
    pub max_stage: u32,
}

impl Default for HpccSettings {
    /// hpcc.md's defaults: T = 5 us, N = 16, eta = 0.95, maxStage = 5.
    fn default() -> Self {
        HpccSettings {
            t_ns: 5_000,
            n: 16,
            eta: 0.95,
            max_stage: 5,
        }
    }
}

impl HpccSettings {
    /// The parameters for a NIC of `line_rate_bps` and path MTU `mtu`:
    /// W_init = line rate x T, W_ai = W_init (1 - eta) / N, W_min = one
    /// MTU. Errors name the bad value (a zero rate, N or T, eta outside
    /// (0, 1], a BDP smaller than one MTU).
    pub fn params(&self, line_rate_bps: u64, mtu: u32) -> Result<HpccParams, ParamError> {
        self.build(line_rate_bps, mtu, false)
    }

    /// Like [`HpccSettings::params`], but a BDP smaller than one MTU
    /// raises W_init to one MTU instead of failing (defaults that must
    /// work on any link).
    pub fn params_at_least_one_mtu(
        &self,
        line_rate_bps: u64,
        mtu: u32,
    ) -> Result<HpccParams, ParamError> {
        self.build(line_rate_bps, mtu, true)
    }

    fn build(&self, line_rate_bps: u64, mtu: u32, raise: bool) -> Result<HpccParams, ParamError> {
        if line_rate_bps == 0 {
            return Err(ParamError::ZeroRate(line_rate_bps));
        }
        if self.n == 0 {
            return Err(ParamError::ZeroN(self.n));
        }
        let mut w_init = line_rate_bps as f64 * self.t_ns as f64 / 8e9;
        if raise {
            w_init = w_init.max(f64::from(mtu));
        }
        let p = HpccParams {
            t_ns: self.t_ns,
            eta: self.eta,
            max_stage: self.max_stage,
            w_init,
            w_ai: w_init * (1.0 - self.eta) / f64::from(self.n),
            w_min: f64::from(mtu),
        };
        p.validate()?;
        Ok(p)
    }
}

impl HpccParams {
    /// Defaults of hpcc.md for a NIC of `line_rate_bps` and base RTT `t_ns`:
    /// eta 0.95, maxStage 5, W_init = line rate x T, W_ai = W_init (1 - eta)
    /// / N, W_min = one MTU.
    pub fn new(line_rate_bps: u64, t_ns: u64, n: u32, mtu: u32) -> Result<Self, ParamError> {
        HpccSettings {
            t_ns,
            n,
            ..HpccSettings::default()
        }
        .params(line_rate_bps, mtu)
    }

    /// Checks every parameter.
    pub fn validate(&self) -> Result<(), ParamError> {
        if self.t_ns == 0 {
            return Err(ParamError::ZeroT(self.t_ns));
        }
        if !(self.eta > 0.0 && self.eta <= 1.0) {
            return Err(ParamError::Eta(self.eta));
        }
        if !(self.w_min > 0.0 && self.w_min <= self.w_init && self.w_init.is_finite()) {
            return Err(ParamError::Window {
                w_min: self.w_min,
                w_init: self.w_init,
            });
        }
        if !(self.w_ai >= 0.0 && self.w_ai.is_finite()) {
            return Err(ParamError::WAi(self.w_ai));
        }
        Ok(())
    }

    /// R = W / T in bits per second.
    pub fn rate_bps(&self, w: f64) -> f64 {
        w * 8e9 / self.t_ns as f64
    }
}

/// What one telemetry event did to the flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Update {
    /// The flow's first telemetry: L stored, nothing else.
    FirstTelemetry,
    /// No hop gave a sample (new hops, changed ports, zero ts deltas):
    /// L stored, U, W, Wc and incStage unchanged.
    NoSample,
    /// U and W updated; `committed` says whether Wc and incStage were too.
    Window { committed: bool },
}

/// The most utilized hop of `hops` against the earlier stack `last` of
/// the same path, as MeasureInflight samples it: per hop at the same index
/// and the same (switch_id, port_id) with a non-zero ts delta and B > 0,
/// u' = min(qlen, last qlen) / (B T) + txRate / B (deltas wrapping at the
/// stack's widths); returns the largest u' (the first on ties) and its ts
/// delta, `None` when no hop gives a sample.
pub fn busiest_hop(hops: &HopStack, last: &HopStack, t_ns: f64) -> Option<(f64, f64)> {
    let mut best: Option<(f64, f64)> = None;
    for (u, _, dt) in hop_samples(hops, last, t_ns) {
        if best.is_none_or(|(bu, _)| u > bu) {
            best = Some((u, dt));
        }
    }
    best
}

/// Each hop's sample of `hops` against `last` (see [`busiest_hop`]): its
/// u', its capacity B (bytes per ns) and its ts delta (ns).
pub fn hop_samples<'a>(
    hops: &'a HopStack,
    last: &'a HopStack,
    t_ns: f64,
) -> impl Iterator<Item = (f64, f64, f64)> + 'a {
    let wrap = hops.wrap();
    hops.as_slice()
        .iter()
        .zip(last.as_slice())
        .filter(|(now, then)| now.same_port(then))
        .filter_map(move |(now, then)| {
            let dt = wrap.ts_delta(now.ts_ns, then.ts_ns);
            let b = now.bytes_per_ns();
            if dt == 0 || b <= 0.0 {
                return None;
            }
            let dt = f64::from(dt);
            let tx_rate = f64::from(wrap.bytes_delta(now.tx_bytes, then.tx_bytes)) / dt;
            let qlen = f64::from(now.qlen.min(then.qlen).min(QLEN_MAX));
            let u = (qlen / (b * t_ns) + tx_rate / b).min(U_MAX);
            Some((u, b, dt))
        })
}

/// State shared by sender- and receiver-based HPCC++.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HpccCore {
    params: HpccParams,
    w: f64,
    wc: f64,
    u: f64,
    inc_stage: u32,
    /// L: the hop records of the last event; `None` before the first.
    last: Option<HopStack>,
}

impl HpccCore {
    /// W = Wc = W_init, U = 1, incStage = 0, no L.
    pub fn new(params: HpccParams) -> Self {
        HpccCore {
            params,
            w: params.w_init,
            wc: params.w_init,
            u: 1.0,
            inc_stage: 0,
            last: None,
        }
    }

    pub fn params(&self) -> &HpccParams {
        &self.params
    }

    /// Window W, bytes.
    pub fn w(&self) -> f64 {
        self.w
    }

    /// Reference window Wc, bytes.
    pub fn wc(&self) -> f64 {
        self.wc
    }

    /// Normalized inflight U (EWMA).
    pub fn u(&self) -> f64 {
        self.u
    }

    pub fn inc_stage(&self) -> u32 {
        self.inc_stage
    }

    /// Pacing rate R = W / T, bits per second.
    pub fn rate_bps(&self) -> f64 {
        self.params.rate_bps(self.w)
    }

    /// MeasureInflight: the new U for `hops` against L, or `None` when no
    /// hop gives a sample. Does not change any state.
    ///
    /// A hop gives a sample when L has a hop at the same index with the
    /// same (switch_id, port_id), a non-zero ts delta and B > 0. Deltas of
    /// ts and txBytes wrap at the stack's widths (mod 2^32, or the compact
    /// records' 2^24 ns and 2^27 bytes). The hop with the largest u' wins
    /// (the first one on ties) and gives tau.
    pub fn measure_inflight(&self, hops: &HopStack) -> Option<f64> {
        let last = self.last.as_ref()?;
        let t = self.params.t_ns as f64;
        let (u, tau) = busiest_hop(hops, last, t)?;
        let tau = tau.min(t);
        Some(((1.0 - tau / t) * self.u + tau / t * u).clamp(0.0, U_MAX))
    }

    /// ComputeWind with U already measured; W is clamped to [W_min, W_init]
    /// and, when `update_wc`, Wc takes the clamped W.
    pub fn compute_wind(&mut self, u: f64, update_wc: bool) -> f64 {
        let p = &self.params;
        let multiplicative = u >= p.eta || self.inc_stage >= p.max_stage;
        let w = if multiplicative {
            self.wc / (u.max(U_FLOOR) / p.eta) + p.w_ai
        } else {
            self.wc + p.w_ai
        };
        let w = w.clamp(p.w_min, p.w_init);
        if update_wc {
            self.inc_stage = if multiplicative {
                0
            } else {
                self.inc_stage + 1
            };
            self.wc = w;
        }
        self.u = u;
        self.w = w;
        w
    }

    /// Measures `hops`, stores them as L, and, when a sample exists,
    /// computes W (committing Wc when `commit()` says so). Shared by
    /// NewAck and NewINT, which differ only in when they commit.
    pub(crate) fn event(&mut self, hops: &HopStack, commit: impl FnOnce() -> bool) -> Update {
        if self.last.is_none() {
            self.last = Some(*hops);
            return Update::FirstTelemetry;
        }
        let sample = self.measure_inflight(hops);
        self.last = Some(*hops);
        match sample {
            None => Update::NoSample,
            Some(u) => {
                let committed = commit();
                self.compute_wind(u, committed);
                Update::Window { committed }
            }
        }
    }
}

/// Sender-based HPCC++ for one flow.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hpcc {
    core: HpccCore,
    last_update_seq: u32,
    /// Some feedback (telemetry or an INT response) has set lastUpdateSeq.
    fed: bool,
    /// W_AI as configured, and when the receiver last reported N (W_AI
    /// follows the reports while they come).
    base_w_ai: f64,
    n_at: Option<u64>,
}

impl Hpcc {
    pub fn new(params: HpccParams) -> Self {
        Hpcc {
            core: HpccCore::new(params),
            last_update_seq: 0,
            fed: false,
            base_w_ai: params.w_ai,
            n_at: None,
        }
    }

    pub fn core(&self) -> &HpccCore {
        &self.core
    }

    /// Drops L (the reference stack): the next telemetry starts over, as
    /// the first did (the flow changed routes).
    pub fn forget_reference(&mut self) {
        self.core.last = None;
    }

    /// lastUpdateSeq: snd_nxt when Wc was last committed.
    pub fn last_update_seq(&self) -> u32 {
        self.last_update_seq
    }

    /// NewAck: `ack_seq` is the PSN the event acknowledges (for probes, the
    /// probe's snd_psn), `snd_nxt` the flow's next PSN now, `hops` the
    /// telemetry. The first telemetry only stores L and sets lastUpdateSeq
    /// = snd_nxt. Wc is committed at most once per RTT: when ack_seq is past
    /// lastUpdateSeq (24-bit comparison), after which lastUpdateSeq = snd_nxt.
    pub fn new_ack(&mut self, ack_seq: u32, snd_nxt: u32, hops: &HopStack) -> Update {
        let first = self.core.last.is_none();
        let last_update_seq = &mut self.last_update_seq;
        let r = self.core.event(hops, || {
            let commit = psn_gt(ack_seq, *last_update_seq);
            if commit {
                *last_update_seq = snd_nxt & PSN_MASK;
            }
            commit
        });
        if first && !self.fed {
            self.last_update_seq = snd_nxt & PSN_MASK;
        }
        self.fed = true;
        r
    }

    /// The receiver reported `n` concurrent flows through its last hop at
    /// `now` (draft-00 s6.2): W_AI = W_init (1 - eta) / N (n = 0 is taken
    /// as 1) until [`FLOW_COUNT_TTL_T`] T pass without a report.
    pub fn set_flow_count(&mut self, now: u64, n: u16) {
        let p = &mut self.core.params;
        p.w_ai = p.w_init * (1.0 - p.eta) / f64::from(n.max(1));
        self.n_at = Some(now);
    }

    /// Back to the configured W_AI when no report came for
    /// [`FLOW_COUNT_TTL_T`] T (the last hop stopped being the bottleneck).
    pub fn expire_flow_count(&mut self, now: u64) {
        let ttl = self.core.params.t_ns.saturating_mul(FLOW_COUNT_TTL_T);
        if self.n_at.is_some_and(|t| now.saturating_sub(t) > ttl) {
            self.core.params.w_ai = self.base_w_ai;
            self.n_at = None;
        }
    }

    /// W_AI now.
    pub fn w_ai(&self) -> f64 {
        self.core.params.w_ai
    }

    /// An INT response (draft-00 s6.3) for the packet of PSN `psn`: a
    /// switch whose egress queue passed its threshold sent `hops` (the
    /// packet's stack, the congested port's record last) straight back.
    /// Reacted to as to an ACK's telemetry for that PSN, with U from the
    /// congested hop alone: its queue is above the threshold, so the port
    /// sends at B and u' = qlen / (B T) + 1 with no earlier record to take
    /// a delta from (which also makes the flow's first telemetry count);
    /// tau = T. Wc is committed by NewAck's rule (once per RTT: `psn` past
    /// lastUpdateSeq, or the flow's first feedback). L is left alone: a
    /// partial stack taken at enqueue is no reference for the ACKs' deltas.
    /// Returns `None` (nothing changed) for an empty stack or a hop without
    /// a rate.
    pub fn new_int_response(&mut self, psn: u32, snd_nxt: u32, hops: &HopStack) -> Option<Update> {
        let hop = hops.as_slice().last()?;
        let b = hop.bytes_per_ns();
        if b <= 0.0 {
            return None;
        }
        let t = self.core.params.t_ns as f64;
        let qlen = f64::from(hop.qlen.min(QLEN_MAX));
        let u = (qlen / (b * t) + 1.0).min(U_MAX);
        let committed = !self.fed || psn_gt(psn, self.last_update_seq);
        if committed {
            self.last_update_seq = snd_nxt & PSN_MASK;
        }
        self.fed = true;
        self.core.compute_wind(u, committed);
        Some(Update::Window { committed })
    }
}
