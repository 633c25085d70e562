//! What the simulator measures: the monitored port's queue (time-weighted
//! percentiles and a time series), its utilization, per-flow rates and
//! Jain's fairness index per sample bucket, and per-flow completion times
//! and slowdowns by size bucket.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use serde::Serialize;

use super::topology::End;
use super::SimConfig;
use crate::qos::QosConfig;
use crate::switch::Switch;

/// Most points kept per time series (longer runs are thinned).
const MAX_POINTS: usize = 4000;

/// The monitored queue's first burst ends when it falls back to this many
/// bytes (HPCC++'s target of a near-empty queue: a few packets).
pub const BURST_DRAINED_BYTES: u64 = 4096;

pub(crate) struct Monitor {
    pub end: End,
    rate_bps: u64,
    measure_from: u64,
    /// The end of the measured window (the run's duration: a draining run
    /// goes on without it).
    measure_until: u64,
    sample_ns: u64,
    hist: Histogram<u64>,
    last_t: u64,
    last_q: u64,
    tx_bytes: u64,
    bucket: BTreeMap<usize, u64>,
    pub queue_series: Vec<(u64, u64)>,
    pub jain_series: Vec<(u64, f64)>,
    pub rate_series: Vec<(u64, Vec<(usize, f64)>)>,
    /// The first burst: the highest queue until it first falls back to
    /// [`BURST_DRAINED_BYTES`] after rising above, and when it did.
    burst_peak: u64,
    burst_rose: bool,
    burst_drained_at: Option<u64>,
    /// With QoS: the monitored port's classes' bytes sent and sojourn sums
    /// at the last sample, when the measured window opened and closed (time
    /// and bytes per class), and per sample each class's rate (Gb/s) and
    /// mean sojourn (ns).
    qos: bool,
    class_last: Vec<(u64, u64, u64)>,
    class_from: Option<(u64, Vec<u64>)>,
    class_until: Option<(u64, Vec<u64>)>,
    pub class_series: Vec<(u64, Vec<(f64, f64)>)>,
}

/// Jain's fairness index of `xs` (1 when all equal; 1/n when one has all).
pub fn jain(xs: &[f64]) -> f64 {
    let sum: f64 = xs.iter().sum();
    let sq: f64 = xs.iter().map(|x| x * x).sum();
    if xs.is_empty() || sq == 0.0 {
        return 1.0;
    }
    sum * sum / (xs.len() as f64 * sq)
}

impl Monitor {
    pub fn new(end: End, rate_bps: u64, cfg: &SimConfig) -> Self {
        Monitor {
            end,
            rate_bps,
            measure_from: cfg.measure_from_ns,
            measure_until: cfg.duration_ns.max(cfg.measure_from_ns),
            sample_ns: cfg.sample_ns.max(1),
            hist: Histogram::new_with_bounds(1, 1 << 40, 3).expect("valid bounds"),
            last_t: 0,
            last_q: 0,
            tx_bytes: 0,
            bucket: BTreeMap::new(),
            queue_series: Vec::new(),
            jain_series: Vec::new(),
            rate_series: Vec::new(),
            burst_peak: 0,
            burst_rose: false,
            burst_drained_at: None,
            qos: cfg.qos.is_some(),
            class_last: Vec::new(),
            class_from: None,
            class_until: None,
            class_series: Vec::new(),
        }
    }

    /// At a sample time `t`: the monitored port's classes (QoS on only).
    pub fn classes_at(&mut self, t: u64, sw: &mut Switch) {
        if !self.qos {
            return;
        }
        let n = sw.class_count();
        let now: Vec<(u64, u64, u64)> = (0..n)
            .filter_map(|c| sw.class_counters(self.end.port, c))
            .map(|k| (k.tx_bytes, k.sojourn_sum_ns, k.tx_packets))
            .collect();
        let bytes = || now.iter().map(|k| k.0).collect::<Vec<u64>>();
        if self.class_from.is_none() && t >= self.measure_from {
            self.class_from = Some((t, bytes()));
            sw.reset_class_sojourn(self.end.port);
        }
        if self.class_until.is_none() && t >= self.measure_until {
            self.class_until = Some((t, bytes()));
        }
        if self.class_last.len() == now.len() && t <= self.measure_until {
            let point = now
                .iter()
                .zip(&self.class_last)
                .map(|(k, l)| {
                    let packets = k.2 - l.2;
                    let gbps = (k.0 - l.0) as f64 * 8.0 / self.sample_ns as f64;
                    let mean = if packets == 0 {
                        0.0
                    } else {
                        (k.1 - l.1) as f64 / packets as f64
                    };
                    (gbps, mean)
                })
                .collect();
            if self.class_series.len() < MAX_POINTS {
                self.class_series.push((t, point));
            }
        }
        self.class_last = now;
    }

    /// Each class of the monitored port over the measured window.
    pub fn class_results(&self, now: u64, sw: &Switch, q: &QosConfig) -> Vec<ClassResult> {
        let port = self.end.port;
        let Some((t0, from)) = self.class_from.as_ref() else {
            return Vec::new();
        };
        let (t1, until) = self.class_until.clone().unwrap_or_else(|| {
            let b = (0..from.len())
                .map(|c| sw.class_counters(port, c).map_or(0, |k| k.tx_bytes))
                .collect();
            (now, b)
        });
        let sent: Vec<u64> = until.iter().zip(from).map(|(u, f)| u - f).collect();
        let total = sent.iter().sum::<u64>().max(1);
        let window = t1.saturating_sub(*t0).max(1);
        sent.iter()
            .enumerate()
            .filter_map(|(c, &bytes)| {
                let k = sw.class_counters(port, c)?;
                Some(ClassResult {
                    class: c,
                    weight: q.weights.get(c).copied().unwrap_or(0),
                    flows: 0,
                    gbps: bytes as f64 * 8.0 / window as f64,
                    share: bytes as f64 / total as f64,
                    sojourn_p50_ns: k.sojourn_at(0.5),
                    sojourn_p99_ns: k.sojourn_at(0.99),
                    sojourn_max_ns: k.sojourn_at(1.0),
                    max_qlen_bytes: k.max_qlen,
                })
            })
            .collect()
    }

    /// The queue became `q` bytes at `now`.
    pub fn queue_changed(&mut self, now: u64, q: u64) {
        if self.burst_drained_at.is_none() {
            self.burst_peak = self.burst_peak.max(q);
            if q > BURST_DRAINED_BYTES {
                self.burst_rose = true;
            } else if self.burst_rose {
                self.burst_drained_at = Some(now);
            }
        }
        let from = self.last_t.max(self.measure_from);
        let to = now.min(self.measure_until);
        if to > from {
            self.hist.saturating_record_n(self.last_q, to - from);
        }
        self.last_t = now;
        self.last_q = q;
    }

    /// `bytes` of `flow` left the port at `now`.
    pub fn sent(&mut self, now: u64, bytes: u64, flow: Option<usize>) {
        if now >= self.measure_from && now < self.measure_until {
            self.tx_bytes += bytes;
        }
        if let Some(f) = flow {
            *self.bucket.entry(f).or_default() += bytes;
        }
    }

    /// End of a sample bucket at `t`: queue `q`, flows `active`.
    pub fn sample(&mut self, t: u64, q: u64, active: &[usize]) {
        self.queue_changed(t, q);
        if t > self.measure_until {
            // Draining: the series end with the measured window.
            self.bucket.clear();
            return;
        }
        let rates: Vec<(usize, f64)> = active
            .iter()
            .map(|f| {
                (
                    *f,
                    *self.bucket.get(f).unwrap_or(&0) as f64 * 8e9 / self.sample_ns as f64,
                )
            })
            .collect();
        let xs: Vec<f64> = rates.iter().map(|r| r.1).collect();
        if self.queue_series.len() < MAX_POINTS {
            self.queue_series.push((t, q));
            self.jain_series.push((t, jain(&xs)));
            if rates.len() <= 64 {
                self.rate_series.push((t, rates));
            }
        }
        self.bucket.clear();
    }
}

/// One flow's outcome.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FlowResult {
    pub src: usize,
    pub dst: usize,
    pub size: u64,
    pub start_ns: u64,
    /// Completion time (None: unfinished or failed).
    pub fct_ns: Option<u64>,
    /// The FCT alone on an idle path (`Simulator::ideal_fct_ns`).
    pub ideal_ns: u64,
    /// FCT / ideal FCT, at least 1.
    pub slowdown: Option<f64>,
}

/// A group of flows by count, as the HPCC authors' `fct_analysis.py`
/// groups them: the finished flows sorted by size, cut into groups of an
/// equal share of the count; each group's largest size and its slowdown
/// percentiles.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CountGroup {
    /// Share of the flows below the group (0.00, 0.05, ...).
    pub from: f64,
    pub max_size: u64,
    pub flows: usize,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
}

/// Share of the flows in one group of [`CountGroup`] (fct_analysis.py's
/// default step, 5%).
pub const GROUP_STEP: f64 = 0.05;

/// One switch egress port over the run (`--port-stats`): where it
/// leads, how busy it was, its deepest queue, what it dropped.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PortStat {
    pub node: usize,
    pub port: usize,
    /// Tier of the two ends, e.g. `tor->agg` (switch tiers by their
    /// distance from the hosts: tor, agg, core).
    pub tier: String,
    pub tx_bytes: u64,
    /// Share of the port's capacity used over the simulated time.
    pub utilization: f64,
    pub max_qlen_bytes: u64,
    pub drops: u64,
    pub ecn_marked: u64,
    /// PFC: frames this port sent upstream (PAUSE with refreshes, RESUME)
    /// and PAUSE frames it received; the time its data was held, the
    /// longest single hold, and the head-of-line delay its frames saw
    /// (sum over frames and largest).
    pub pause_tx: u64,
    pub resume_tx: u64,
    pub pause_rx: u64,
    pub paused_ns: u64,
    pub longest_pause_ns: u64,
    pub hol_ns: u64,
    pub hol_max_ns: u64,
}

/// Priority flow control over a run, all switches and NICs together.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PfcSummary {
    /// PAUSE (refreshes included) and RESUME frames switches sent.
    pub pause_frames: u64,
    pub resume_frames: u64,
    /// Switch ports whose data was held at some time, and for how long in
    /// all.
    pub ports_paused: usize,
    pub switch_paused_ns: u64,
    /// Host NICs held, and for how long in all.
    pub hosts_paused: usize,
    pub host_paused_ns: u64,
    /// Head-of-line delay of the frames switches sent: mean over the
    /// frames that waited through a pause, and the largest.
    pub hol_mean_ns: u64,
    pub hol_max_ns: u64,
    /// Ports (switch node, port) held without a break for at least the
    /// storm threshold, with that longest hold: a PFC storm.
    pub storm_ports: Vec<(usize, usize, u64)>,
    /// Frames stuck hosts did not take.
    pub stuck_drops: u64,
}

/// INT responses over a run (present when switches send them).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct IntResponseSummary {
    /// Responses switches sent.
    pub sent: u64,
    /// Subscribed packets above a threshold left unanswered: their flow
    /// was answered this period already.
    pub suppressed: u64,
    /// Subscribed packets above a threshold with a full stack.
    pub no_room: u64,
    /// Responses senders' controllers took, and ones for a PSN no longer
    /// in flight.
    pub taken: u64,
    pub stale: u64,
}

/// One QoS class of the monitored port over the measured window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClassResult {
    pub class: usize,
    pub weight: u32,
    /// Flows of the run whose DSCP maps to the class.
    pub flows: usize,
    /// What the class sent through the port, and its share of the port's
    /// bytes.
    pub gbps: f64,
    pub share: f64,
    /// Sojourn time (egress minus ingress) of the class's frames from the
    /// window's opening to the end of the run.
    pub sojourn_p50_ns: u64,
    pub sojourn_p99_ns: u64,
    pub sojourn_max_ns: u64,
    /// The class's deepest queue over the run.
    pub max_qlen_bytes: u64,
}

/// Path choice over a run (present when flows choose paths).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PathSummary {
    /// Probes flows sent on paths they were not using, and answers.
    pub probes: u64,
    pub answered: u64,
    /// Moves to another path.
    pub moves: u64,
}

/// Authenticated feedback over a run (present when connections are
/// keyed): feedback refused for a bad MAC or token, or as a replay.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct FeedbackSummary {
    pub forged: u64,
    pub replayed: u64,
    pub unkeyed: u64,
}

/// FCT slowdown percentiles of the flows in a size range.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Bucket {
    pub label: String,
    /// Finished flows (the percentiles are theirs).
    pub flows: usize,
    /// Flows that started and did not finish (or failed).
    pub unfinished: usize,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
}

/// Everything one run reports (serialized as the JSON object of one run).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SimResult {
    pub cc: String,
    pub simulated_ns: u64,
    pub queue_p50_bytes: u64,
    pub queue_p95_bytes: u64,
    pub queue_p99_bytes: u64,
    pub queue_max_bytes: u64,
    /// The monitored queue's first burst (an incast's first round trip):
    /// its peak and when it fell back to `BURST_DRAINED_BYTES` (None: it
    /// never rose above, or never fell back).
    pub first_burst_peak_bytes: u64,
    pub first_burst_drained_ns: Option<u64>,
    /// Fraction of the monitored port's capacity used while measuring.
    pub utilization: f64,
    /// Mean Jain index over the last quarter of the samples.
    pub jain_fairness: f64,
    /// Frames the switches' buffers dropped.
    pub drops: u64,
    /// Frames a switch could not route (not RoCEv2, or to no host).
    pub unroutable: u64,
    pub retransmitted: u64,
    /// Share of the bytes hosts sent that were telemetry probes.
    pub probe_overhead: f64,
    pub flows_total: usize,
    pub flows_done: usize,
    pub slowdown: Vec<Bucket>,
    /// Slowdown by groups of 5% of the flows (see [`CountGroup`]).
    pub count_groups: Vec<CountGroup>,
    pub events: u64,
    /// Every switch egress port (see [`PortStat`]).
    pub ports: Vec<PortStat>,
    pub pfc: PfcSummary,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub int_response: Option<IntResponseSummary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paths: Option<PathSummary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub feedback: Option<FeedbackSummary>,
    /// With a relative-telemetry boundary: frames whose stack the
    /// boundary ports rewrote into relative load.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub relative_rewrites: Option<u64>,
    /// The monitored port's QoS classes (with QoS on).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub classes: Vec<ClassResult>,
    /// Per sample: each class's rate (Gb/s) and mean sojourn (ns).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub class_series: Vec<(u64, Vec<(f64, f64)>)>,
    pub queue_series: Vec<(u64, u64)>,
    pub jain_series: Vec<(u64, f64)>,
    pub rate_series: Vec<(u64, Vec<(usize, f64)>)>,
    pub flows: Vec<FlowResult>,
}

/// Nearest-rank percentile of sorted values.
fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Size ranges of the slowdown table.
pub const BUCKETS: [(&str, u64, u64); 4] = [
    ("<3KB", 0, 3_000),
    ("3KB-100KB", 3_000, 100_000),
    ("100KB-1MB", 100_000, 1_000_000),
    (">1MB", 1_000_000, u64::MAX),
];

impl SimResult {
    pub(crate) fn new(
        cc: &str,
        now: u64,
        m: Option<&Monitor>,
        flows: Vec<FlowResult>,
        drops: u64,
        retransmitted: u64,
        events: u64,
    ) -> Self {
        let (q50, q95, q99, qmax, util, jain_fairness, qs, js, rs) = match m {
            Some(m) => {
                let mut h = m.hist.clone();
                // Count the time since the last change too.
                let from = m.last_t.max(m.measure_from);
                let to = now.min(m.measure_until);
                if to > from {
                    h.saturating_record_n(m.last_q, to - from);
                }
                let window = now
                    .min(m.measure_until)
                    .saturating_sub(m.measure_from)
                    .max(1);
                let util = m.tx_bytes as f64 * 8e9 / (m.rate_bps as f64 * window as f64);
                let tail = &m.jain_series[m.jain_series.len() * 3 / 4..];
                let j = if tail.is_empty() {
                    1.0
                } else {
                    tail.iter().map(|x| x.1).sum::<f64>() / tail.len() as f64
                };
                (
                    h.value_at_quantile(0.50),
                    h.value_at_quantile(0.95),
                    h.value_at_quantile(0.99),
                    h.max(),
                    util,
                    j,
                    m.queue_series.clone(),
                    m.jain_series.clone(),
                    m.rate_series.clone(),
                )
            }
            None => (0, 0, 0, 0, 0.0, 1.0, vec![], vec![], vec![]),
        };
        let slowdown = BUCKETS
            .iter()
            .map(|&(label, lo, hi)| {
                let mut s: Vec<f64> = flows
                    .iter()
                    .filter(|f| f.size >= lo && f.size < hi)
                    .filter_map(|f| f.slowdown)
                    .collect();
                s.sort_by(f64::total_cmp);
                Bucket {
                    label: label.to_string(),
                    flows: s.len(),
                    unfinished: flows
                        .iter()
                        .filter(|f| f.size >= lo && f.size < hi && f.slowdown.is_none())
                        .count(),
                    p50: pct(&s, 50.0),
                    p95: pct(&s, 95.0),
                    p99: pct(&s, 99.0),
                }
            })
            .collect();
        let count_groups = count_groups(&flows);
        let (first_burst_peak_bytes, first_burst_drained_ns) = m
            .filter(|m| m.burst_rose)
            .map_or((0, None), |m| (m.burst_peak, m.burst_drained_at));
        SimResult {
            cc: cc.to_string(),
            simulated_ns: now,
            queue_p50_bytes: q50,
            queue_p95_bytes: q95,
            queue_p99_bytes: q99,
            queue_max_bytes: qmax,
            first_burst_peak_bytes,
            first_burst_drained_ns,
            utilization: util,
            jain_fairness,
            drops,
            unroutable: 0,
            retransmitted,
            probe_overhead: 0.0,
            flows_total: flows.len(),
            flows_done: flows.iter().filter(|f| f.fct_ns.is_some()).count(),
            slowdown,
            count_groups,
            events,
            ports: Vec::new(),
            pfc: PfcSummary::default(),
            int_response: None,
            paths: None,
            feedback: None,
            relative_rewrites: None,
            classes: Vec::new(),
            class_series: m.map_or_else(Vec::new, |m| m.class_series.clone()),
            queue_series: qs,
            jain_series: js,
            rate_series: rs,
            flows,
        }
    }
}

/// The finished flows' slowdowns in groups of [`GROUP_STEP`] of their
/// count, by size.
fn count_groups(flows: &[FlowResult]) -> Vec<CountGroup> {
    let mut done: Vec<(u64, f64)> = flows
        .iter()
        .filter_map(|f| f.slowdown.map(|s| (f.size, s)))
        .collect();
    done.sort_by_key(|d| d.0);
    let n = done.len();
    let groups = (1.0 / GROUP_STEP).round() as usize;
    (0..groups)
        .filter_map(|g| {
            let part = &done[g * n / groups..(g + 1) * n / groups];
            let max_size = part.last()?.0;
            let mut s: Vec<f64> = part.iter().map(|d| d.1).collect();
            s.sort_by(f64::total_cmp);
            Some(CountGroup {
                from: g as f64 * GROUP_STEP,
                max_size,
                flows: s.len(),
                p50: pct(&s, 50.0),
                p95: pct(&s, 95.0),
                p99: pct(&s, 99.0),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jain_index_bounds() {
        assert_eq!(jain(&[5.0, 5.0, 5.0]), 1.0);
        assert!((jain(&[1.0, 0.0, 0.0, 0.0]) - 0.25).abs() < 1e-12);
        assert_eq!(jain(&[]), 1.0);
    }

    #[test]
    fn count_groups_cut_the_finished_flows_by_size_into_twentieths() {
        let flows: Vec<FlowResult> = (0..100u64)
            .map(|i| FlowResult {
                src: 0,
                dst: 1,
                size: 1000 - i,
                start_ns: 0,
                fct_ns: (i != 7).then_some(10),
                ideal_ns: 5,
                slowdown: (i != 7).then_some(i as f64),
            })
            .collect();
        let g = count_groups(&flows);
        assert_eq!(g.len(), 20);
        assert_eq!(
            g.iter().map(|x| x.flows).sum::<usize>(),
            99,
            "the unfinished one left out"
        );
        // 99 flows in twentieths: the first group holds the 4 smallest
        // sizes (901..=904).
        assert_eq!((g[0].flows, g[0].max_size), (4, 904));
        assert_eq!(g[19].max_size, 1000);
        assert!((g[1].from - 0.05).abs() < 1e-12);
    }

    #[test]
    fn the_first_burst_ends_when_the_queue_falls_back() {
        let cfg = SimConfig::new(transport::rc::CcMode::None, 1_000_000);
        let mut m = Monitor::new(End { node: 0, port: 0 }, 100_000_000_000, &cfg);
        for (t, q) in [
            (0, 2_000),
            (10, 10_000),
            (20, 20_000),
            (30, 3_000),
            (40, 50_000),
        ] {
            m.queue_changed(t, q);
        }
        assert_eq!((m.burst_peak, m.burst_drained_at), (20_000, Some(30)));
        // A queue that never rose above the mark has no burst.
        let mut calm = Monitor::new(End { node: 0, port: 0 }, 100_000_000_000, &cfg);
        calm.queue_changed(5, 4_000);
        calm.queue_changed(6, 0);
        assert!(!calm.burst_rose && calm.burst_drained_at.is_none());
    }

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(pct(&v, 50.0), 50.0);
        assert_eq!(pct(&v, 99.0), 99.0);
        assert_eq!(pct(&[3.0], 95.0), 3.0);
    }
}
