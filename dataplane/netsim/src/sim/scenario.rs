//! Scenarios: a topology, a workload and run settings from TOML
//! (`configs/sim/*.toml`, embedded here so that `bench sim` runs anywhere),
//! turned into a [`Simulator`] with flows.

use pacer::HpccSettings;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Deserialize;
use transport::rc::{CcMode, PathMtu, UnknownCc};

use super::topology::{End, Topology, TopologyError, TopologySpec};
use super::{FlowSpec, SimConfig, SimError, Simulator};
use crate::int_response::IntResponseConfig;
use crate::mmu::PfcConfig;
use crate::qos::{QosConfig, QosError, Scheduler};
use crate::switch::EcnConfig;

/// The scenario files shipped in `configs/sim/`.
pub const BUILTIN: [(&str, &str); 10] = [
    (
        "incast",
        include_str!("../../../../configs/sim/incast.toml"),
    ),
    (
        "dumbbell",
        include_str!("../../../../configs/sim/dumbbell.toml"),
    ),
    (
        "converge",
        include_str!("../../../../configs/sim/converge.toml"),
    ),
    (
        "fb_hadoop",
        include_str!("../../../../configs/sim/fb_hadoop.toml"),
    ),
    (
        "websearch",
        include_str!("../../../../configs/sim/websearch.toml"),
    ),
    (
        "paper-fig11a",
        include_str!("../../../../configs/sim/paper-fig11a.toml"),
    ),
    (
        "paper-incast",
        include_str!("../../../../configs/sim/paper-incast.toml"),
    ),
    (
        "fat-incast",
        include_str!("../../../../configs/sim/fat-incast.toml"),
    ),
    (
        "qos-2class",
        include_str!("../../../../configs/sim/qos-2class.toml"),
    ),
    (
        "hot-core",
        include_str!("../../../../configs/sim/hot-core.toml"),
    ),
];

/// The flow-size CDFs of `configs/workloads/`.
pub const CDFS: [(&str, &str); 2] = [
    (
        "fb_hadoop",
        include_str!("../../../../configs/workloads/fb_hadoop.cdf"),
    ),
    (
        "websearch",
        include_str!("../../../../configs/workloads/websearch.cdf"),
    ),
];

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ScenarioSpec {
    pub topology: TopologySpec,
    pub workload: WorkloadSpec,
    #[serde(default)]
    pub sim: RunSpec,
    /// QoS classes at every switch port (absent: one FIFO per port).
    #[serde(default)]
    pub qos: Option<QosSpec>,
}

/// `[qos]`: the data classes of every switch egress port (HPCC++ 2023
/// s9.3).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct QosSpec {
    /// `dwrr` (deficit weighted round robin, the default) or `strict`
    /// (class 0 first).
    #[serde(default = "dwrr")]
    pub scheduler: String,
    /// One weight per class, each at least 1 (1 to 8 classes).
    pub weights: Vec<u32>,
    /// Per class, the DSCP values it takes; others go to the last class.
    #[serde(default)]
    pub dscp: Vec<Vec<u8>>,
    /// Bytes per unit of weight per DWRR round.
    #[serde(default = "quantum")]
    pub quantum_bytes: u32,
}

fn dwrr() -> String {
    "dwrr".into()
}

fn quantum() -> u32 {
    4096
}

impl QosSpec {
    /// The switches' configuration, or what is wrong with this one.
    pub fn config(&self) -> Result<QosConfig, ScenarioError> {
        let scheduler = match self.scheduler.as_str() {
            "dwrr" => Scheduler::Dwrr,
            "strict" => Scheduler::Strict,
            other => return Err(ScenarioError::QosScheduler(other.into())),
        };
        if self.dscp.len() > self.weights.len() {
            return Err(ScenarioError::QosDscpClasses {
                lists: self.dscp.len(),
                classes: self.weights.len(),
            });
        }
        let mut cfg = QosConfig {
            scheduler,
            quantum_bytes: self.quantum_bytes,
            ..QosConfig::dwrr(&self.weights)
        };
        for (class, list) in self.dscp.iter().enumerate() {
            for &d in list {
                if d > 63 {
                    return Err(ScenarioError::Dscp(d));
                }
                cfg = cfg.map_dscp(d, class as u8);
            }
        }
        cfg.check().map_err(ScenarioError::Qos)?;
        Ok(cfg)
    }
}

/// What the hosts send.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WorkloadSpec {
    /// `incast` (senders -> the last host), `dumbbell` (left hosts -> right
    /// hosts), `converge` (flows -> the last host, one more joins later),
    /// `poisson` (flow sizes from a CDF at a load, optional incasts).
    pub kind: String,
    #[serde(default)]
    pub senders: Option<usize>,
    /// Size of each flow; 0 = long (lasts the whole run).
    #[serde(default)]
    pub size_bytes: u64,
    #[serde(default)]
    pub flows: Option<usize>,
    #[serde(default)]
    pub join_us: u64,
    #[serde(default)]
    pub cdf: Option<String>,
    #[serde(default)]
    pub load: Option<f64>,
    #[serde(default)]
    pub incast_senders: usize,
    #[serde(default)]
    pub incast_size_bytes: u64,
    #[serde(default)]
    pub incast_load: f64,
    /// When incasts start: `poisson` (exponential gaps, the default) or
    /// `even` (one every mean gap from a random phase, so that a short run
    /// offers the incast load it names on every seed).
    #[serde(default)]
    pub incast_arrivals: Arrivals,
    /// DSCP values the flows take in turn (flow i gets `dscp[i % len]`);
    /// empty: every flow the engines' default.
    #[serde(default)]
    pub dscp: Vec<u8>,
}

/// How the incasts of a `poisson` workload are spaced.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Arrivals {
    /// Exponential gaps with the mean that the load gives.
    #[default]
    Poisson,
    /// The mean gap exactly, after a uniformly random first start.
    Even,
}

/// Run settings.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RunSpec {
    /// Flows start within this; the monitored port is measured up to it.
    pub duration_us: u64,
    /// Then run up to this much longer while started flows are unfinished
    /// (0: stop at the duration; long-flow scenarios never drain).
    pub drain_us: u64,
    pub measure_from_us: u64,
    pub sample_us: u64,
    pub base_rtt_ns: u64,
    pub hpcc_n: u32,
    pub eta: f64,
    pub max_stage: u32,
    pub mtu: u32,
    pub maxhop: u8,
    /// DCQCN ECN thresholds at the switches (bytes) and top probability.
    pub ecn_kmin_bytes: u64,
    pub ecn_kmax_bytes: u64,
    pub ecn_pmax: f64,
    /// The ECN thresholds are for host-rate ports and scale with a port's
    /// rate (x4 at a 400G port of a 100G fabric), as the HPCC authors'
    /// run.py sets KMIN_MAP and KMAX_MAP.
    pub ecn_scale_by_rate: bool,
    /// DCQCN: R_AI and R_HAI (Mb/s), the rate-increase timer and the alpha
    /// update interval (us), the byte counter (bytes; 0 = none), the fast
    /// recovery stages F, the gain g, the lowest rate (Mb/s), and the
    /// notification point's CNP interval (us; one rate cut per interval).
    pub dcqcn_rai_mbps: f64,
    pub dcqcn_rhai_mbps: f64,
    pub dcqcn_timer_us: u64,
    pub dcqcn_alpha_us: u64,
    pub dcqcn_byte_counter_bytes: u64,
    pub dcqcn_f: u32,
    pub dcqcn_g: f64,
    pub dcqcn_min_rate_mbps: f64,
    pub dcqcn_cnp_interval_us: u64,
    pub timeout: u8,
    /// Lossless switches: `[topology] buffer_bytes` is each switch's
    /// shared buffer, with PFC (802.1Qbb) by the HPCC authors' rules:
    /// a reserve per port, a dynamic share of the free buffer, headroom
    /// of 3 x each link's bandwidth-delay product. Off: drop-tail per port.
    pub pfc: bool,
    pub pfc_reserve_bytes: u64,
    pub pfc_resume_offset_bytes: u64,
    /// Pause time each PAUSE asks for (quanta of 512 bit times).
    pub pfc_pause_quanta: u16,
    /// Local ACK timeout exponent of runs with PFC on [default:
    /// `timeout`]: lossless fabrics run long timeouts, which a lossy run
    /// (`--buffer drop-tail`) would pay at every drop.
    pub lossless_timeout: Option<u8>,
    /// Controllers whose runs have switches send ACKs, NAKs and CNPs
    /// before data, never paused (the authors' run.py: dcqcn yes, hp no);
    /// with PFC on or off.
    pub ack_high_priority: Vec<String>,
    /// Hosts whose NIC gets stuck at `stuck_from_us` (takes no frame,
    /// holds its link with PAUSE for ever): a PFC storm.
    pub stuck_hosts: Vec<usize>,
    pub stuck_from_us: u64,
    /// A port held this long without a break is reported as a storm.
    pub storm_us: u64,
    /// Bytes per telemetry hop record: 16 (ours) or 8 (compact, as the
    /// HPCC authors' simulator: 24-bit timestamps, bytes in 128 B units,
    /// a rate code, no switch/port id).
    pub int_hop_bytes: u32,
    /// Switches answer subscribed data packets that find a queue at or
    /// above `int_response_threshold_bytes` with an INT response (HPCC++
    /// draft-00 s6.3), at most once per flow per `int_response_period_us`
    /// (0: the base RTT); senders subscribe their data packets.
    pub int_response: bool,
    pub int_response_threshold_bytes: u64,
    pub int_response_period_us: u64,
    pub int_response_bloom_bits: usize,
    /// Payload bytes per packet (0: the path MTU). The HPCC authors' ns-3
    /// sends 1000; RoCE peers would refuse anything but the path MTU, so
    /// only the simulator (our engines at both ends) offers this.
    pub payload_bytes: u32,
    /// Receiver-measured N (HPCC++ draft-00 s6.2): receivers whose last
    /// hop is the bottleneck report how many flows cross it, and senders
    /// set W_AI = W_init (1 - eta) / N from that instead of `hpcc_n`.
    pub receiver_n: bool,
    /// Senders ask switches for each packet's sojourn time instead of
    /// the queue length (HPCC++ 2023 s9.3; meant for `[qos]` classes).
    pub int_sojourn: bool,
    /// Path choice from telemetry (HPCC++ 2023 s9.4): each flow probes
    /// `paths - 1` other UDP source ports, one per `path_probe_rtts` base
    /// RTTs, and moves to the one with the most spare capacity when that
    /// exceeds what it has (its rate and its path's spare) by
    /// `path_margin` (0.5: half as much again), at most once per
    /// `path_dwell_rtts`.
    pub path_choice: bool,
    /// Every connection authenticates the telemetry its ACKs echo
    /// (a per-connection key, a SipHash MAC per ACK).
    pub feedback_auth: bool,
    /// The switches' ports facing hosts rewrite every telemetry stack into
    /// relative load (a domain's boundary, HPCC++ 2023 s9.1).
    pub relative_boundary: bool,
    pub paths: u8,
    pub path_probe_rtts: f64,
    pub path_margin: f64,
    pub path_dwell_rtts: f64,
}

impl Default for RunSpec {
    fn default() -> Self {
        // DCQCN's documented defaults (the line rate is set per host).
        let d = pacer::dcqcn::DcqcnParams::new(100e9);
        let pfc = PfcConfig::new(0);
        RunSpec {
            duration_us: 2_000,
            drain_us: 0,
            measure_from_us: 0,
            sample_us: 10,
            base_rtt_ns: 8_000,
            hpcc_n: 16,
            eta: 0.95,
            max_stage: 5,
            mtu: 1024,
            maxhop: 5,
            // The HPCC paper's DCQCN: Kmin 100 KB, Kmax 400 KB at 25G, scaled
            // to 100G.
            ecn_kmin_bytes: 400_000,
            ecn_kmax_bytes: 1_600_000,
            ecn_pmax: 0.2,
            ecn_scale_by_rate: false,
            dcqcn_rai_mbps: d.rai_bps / 1e6,
            dcqcn_rhai_mbps: d.rhai_bps / 1e6,
            dcqcn_timer_us: d.timer_ns / 1_000,
            dcqcn_alpha_us: d.alpha_period_ns / 1_000,
            dcqcn_byte_counter_bytes: d.byte_counter,
            dcqcn_f: d.f,
            dcqcn_g: d.g,
            dcqcn_min_rate_mbps: d.min_rate_bps / 1e6,
            dcqcn_cnp_interval_us: pacer::dcqcn::CnpLimiter::DEFAULT_INTERVAL_NS / 1_000,
            timeout: 10,
            pfc: false,
            pfc_reserve_bytes: pfc.reserve_bytes,
            pfc_resume_offset_bytes: pfc.resume_offset_bytes,
            pfc_pause_quanta: pfc.pause_quanta,
            lossless_timeout: None,
            ack_high_priority: Vec::new(),
            stuck_hosts: Vec::new(),
            stuck_from_us: 0,
            storm_us: 1_000,
            int_hop_bytes: 16,
            int_response: false,
            int_response_threshold_bytes: 32_768,
            int_response_period_us: 0,
            int_response_bloom_bits: 4096,
            payload_bytes: 0,
            receiver_n: false,
            int_sojourn: false,
            path_choice: false,
            feedback_auth: false,
            relative_boundary: false,
            paths: 4,
            path_probe_rtts: 1.0,
            path_margin: 0.5,
            path_dwell_rtts: 20.0,
        }
    }
}

/// Why a scenario cannot be read or built, naming the bad value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ScenarioError {
    /// The TOML does not parse, or a key is unknown or of the wrong type
    /// (toml's message names the key and the line).
    #[error("{0}")]
    Toml(String),
    #[error("[sim] mtu = {0} is not 256, 512, 1024, 2048 or 4096")]
    Mtu(u32),
    #[error("[sim] payload_bytes = {payload} is not between 256 and the path MTU {mtu}")]
    PayloadBytes { payload: u32, mtu: u32 },
    #[error("[sim] int_hop_bytes = {0} is not 16 or 8")]
    IntHopBytes(u32),
    #[error("[topology] {0}")]
    Topology(#[from] TopologyError),
    #[error("[workload] converge with {flows} flows needs {need} hosts, the topology has {hosts}")]
    ConvergeHosts {
        flows: usize,
        need: usize,
        hosts: usize,
    },
    #[error("[workload] dumbbell without a switch-to-switch link")]
    DumbbellLink,
    #[error("[workload] cdf {name:?}: {why}")]
    Cdf { name: String, why: String },
    #[error("[workload] cdf {name:?}: {source}")]
    CdfData { name: String, source: CdfError },
    #[error("[workload] load = {0} must be in (0, 1)")]
    Load(f64),
    #[error("[workload] kind = {0:?} is unknown (incast, dumbbell, converge, poisson)")]
    UnknownWorkload(String),
    #[error("[qos] scheduler = {0:?} is unknown (dwrr, strict)")]
    QosScheduler(String),
    #[error("[qos] dscp has {lists} lists for {classes} classes")]
    QosDscpClasses { lists: usize, classes: usize },
    #[error("DSCP {0} is not 0..=63")]
    Dscp(u8),
    #[error("[sim] paths = {0} is not 2..=16")]
    Paths(u8),
    #[error("[sim] {key} = {value} must be a finite number, at least 0 (path_probe_rtts above 0)")]
    PathSetting { key: &'static str, value: f64 },
    #[error("[qos] {0}")]
    Qos(QosError),
    #[error(transparent)]
    Cc(#[from] UnknownCc),
    #[error(transparent)]
    Sim(#[from] SimError),
}

impl RunSpec {
    /// The congestion control `name` with this run's maxhop and base RTT.
    pub fn cc(&self, name: &str) -> Result<CcMode, UnknownCc> {
        CcMode::from_name(name, self.maxhop, self.base_rtt_ns)
    }
}

/// A CDF file that cannot be used, naming the line.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CdfError {
    #[error("line {line}: {why}: {text:?}")]
    Line {
        line: usize,
        text: String,
        why: &'static str,
    },
    #[error("a CDF needs at least two points and must end at 100%")]
    Shape,
}

/// An empirical CDF: (size, cumulative fraction) points.
#[derive(Debug, Clone, PartialEq)]
pub struct Cdf(Vec<(f64, f64)>);

impl Cdf {
    /// Parses `size percent` lines; the error names the line.
    pub fn parse(text: &str) -> Result<Cdf, CdfError> {
        let mut pts = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |why| CdfError::Line {
                line: i + 1,
                text: line.to_string(),
                why,
            };
            let mut it = line.split_whitespace();
            let (Some(a), Some(b), None) = (it.next(), it.next(), it.next()) else {
                return Err(bad("expected `size percent`"));
            };
            let (Ok(s), Ok(p)) = (a.parse::<f64>(), b.parse::<f64>()) else {
                return Err(bad("not numbers"));
            };
            if pts
                .last()
                .is_some_and(|&(ls, lp): &(f64, f64)| s < ls || p / 100.0 < lp)
            {
                return Err(bad("not increasing"));
            }
            pts.push((s, p / 100.0));
        }
        if pts.len() < 2 || pts.last().map(|p| p.1) != Some(1.0) {
            return Err(CdfError::Shape);
        }
        Ok(Cdf(pts))
    }

    /// Inverse CDF at `u` in [0, 1], linear between points.
    pub fn sample(&self, u: f64) -> f64 {
        let pts = &self.0;
        for w in pts.windows(2) {
            let ((s0, p0), (s1, p1)) = (w[0], w[1]);
            if u <= p1 {
                if p1 <= p0 {
                    return s1;
                }
                return s0 + (s1 - s0) * (u - p0) / (p1 - p0);
            }
        }
        pts.last().map_or(0.0, |p| p.0)
    }

    /// Mean size (integral of the piecewise-linear inverse).
    pub fn mean(&self) -> f64 {
        self.0
            .windows(2)
            .map(|w| (w[1].1 - w[0].1) * (w[0].0 + w[1].0) / 2.0)
            .sum()
    }
}

/// A built scenario: the simulator with its flows, and what it measures.
pub struct Built {
    pub sim: Simulator,
    pub flows: usize,
    /// The load the flows offer, as drawn (a `poisson` workload).
    pub offered: Option<Offered>,
}

/// What a `poisson` workload's flows add up to over the run: the drawn
/// loads, which differ from the configured ones by chance in a short run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Offered {
    /// Background bytes / (hosts x host rate x duration).
    pub background_load: f64,
    pub incasts: usize,
    /// Incast bytes / (hosts x host rate x duration).
    pub incast_load: f64,
}

/// Overrides from the command line.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub seed: Option<u64>,
    pub duration_us: Option<u64>,
    pub drain_us: Option<u64>,
    /// HPCC++ maxStage instead of the scenario's.
    pub max_stage: Option<u32>,
    pub senders: Option<usize>,
    pub load: Option<f64>,
    /// PFC on or off instead of the scenario's `pfc`.
    pub pfc: Option<bool>,
    /// INT responses on or off instead of the scenario's `int_response`.
    pub int_response: Option<bool>,
    /// Receiver-measured N on or off instead of the scenario's `receiver_n`.
    pub receiver_n: Option<bool>,
    /// Sojourn times on or off instead of the scenario's `int_sojourn`.
    pub sojourn: Option<bool>,
    /// Off: one FIFO per port even when the scenario has `[qos]`.
    pub qos: Option<bool>,
    /// Path choice on or off instead of the scenario's `path_choice`.
    pub path_choice: Option<bool>,
    /// Authenticated feedback on or off instead of `feedback_auth`.
    pub feedback_auth: Option<bool>,
    /// A relative-telemetry boundary on or off instead of
    /// `relative_boundary`.
    pub relative_boundary: Option<bool>,
}

fn find(topo: &Topology, host: usize) -> usize {
    topo.hosts()[host]
}

impl ScenarioSpec {
    pub fn parse(text: &str) -> Result<ScenarioSpec, ScenarioError> {
        toml::from_str(text).map_err(|e| ScenarioError::Toml(e.to_string()))
    }

    /// Builds the simulator for congestion control `cc`.
    pub fn build(&self, cc: CcMode, o: &Overrides) -> Result<Built, ScenarioError> {
        let mut topo_spec = self.topology.clone();
        let w = &self.workload;
        let senders = o.senders.or(w.senders);
        if w.kind == "incast" {
            topo_spec.hosts = senders.unwrap_or(topo_spec.hosts.saturating_sub(1)) + 1;
        }
        let topo = topo_spec.build()?;
        let hosts = topo.hosts().len();
        let r = &self.sim;
        let seed = o.seed.unwrap_or(1);
        let duration_ns = o.duration_us.unwrap_or(r.duration_us) * 1_000;
        let mut cfg = SimConfig::new(cc, duration_ns);
        cfg.drain_ns = o.drain_us.unwrap_or(r.drain_us) * 1_000;
        cfg.seed = seed;
        cfg.mtu = PathMtu::from_bytes(r.mtu).ok_or(ScenarioError::Mtu(r.mtu))?;
        cfg.hpcc = HpccSettings {
            t_ns: r.base_rtt_ns,
            n: r.hpcc_n,
            eta: r.eta,
            max_stage: r.max_stage,
        };
        cfg.timeout = r.timeout;
        cfg.sample_ns = r.sample_us.max(1) * 1_000;
        cfg.measure_from_ns = r.measure_from_us * 1_000;
        if cc == CcMode::Dcqcn {
            cfg.ecn = Some(EcnConfig {
                kmin: r.ecn_kmin_bytes,
                kmax: r.ecn_kmax_bytes,
                pmax: r.ecn_pmax,
            });
            cfg.ecn_ref_bps = r
                .ecn_scale_by_rate
                .then_some((topo_spec.host_gbps * 1e9) as u64);
        }
        cfg.dcqcn = pacer::dcqcn::DcqcnParams {
            rai_bps: r.dcqcn_rai_mbps * 1e6,
            rhai_bps: r.dcqcn_rhai_mbps * 1e6,
            timer_ns: r.dcqcn_timer_us.max(1) * 1_000,
            alpha_period_ns: r.dcqcn_alpha_us.max(1) * 1_000,
            byte_counter: match r.dcqcn_byte_counter_bytes {
                0 => u64::MAX,
                b => b,
            },
            f: r.dcqcn_f,
            g: r.dcqcn_g,
            min_rate_bps: r.dcqcn_min_rate_mbps * 1e6,
            ..cfg.dcqcn
        };
        cfg.cnp_interval_ns = r.dcqcn_cnp_interval_us * 1_000;
        if let Some(m) = o.max_stage {
            cfg.hpcc.max_stage = m;
        }
        if o.pfc.unwrap_or(r.pfc) {
            cfg.pfc = Some(PfcConfig {
                reserve_bytes: r.pfc_reserve_bytes,
                resume_offset_bytes: r.pfc_resume_offset_bytes,
                pause_quanta: r.pfc_pause_quanta.max(1),
                ..PfcConfig::new(topo_spec.buffer_bytes)
            });
            cfg.timeout = r.lossless_timeout.unwrap_or(r.timeout);
        }
        for name in &r.ack_high_priority {
            cfg.control_first |= r.cc(name)? == cc;
        }
        cfg.stuck_hosts = r
            .stuck_hosts
            .iter()
            .map(|&h| (h, r.stuck_from_us * 1_000))
            .collect();
        cfg.storm_ns = r.storm_us * 1_000;
        cfg.compact_int = match r.int_hop_bytes {
            16 => false,
            8 => true,
            n => return Err(ScenarioError::IntHopBytes(n)),
        };
        cfg.payload_bytes = match r.payload_bytes {
            0 => None,
            p if p > r.mtu || p < transport::rc::MIN_SEGMENT => {
                return Err(ScenarioError::PayloadBytes {
                    payload: p,
                    mtu: r.mtu,
                })
            }
            p => Some(p),
        };
        cfg.receiver_n = o.receiver_n.unwrap_or(r.receiver_n);
        cfg.int_sojourn = o.sojourn.unwrap_or(r.int_sojourn);
        cfg.feedback_auth = o.feedback_auth.unwrap_or(r.feedback_auth);
        cfg.relative_boundary = o.relative_boundary.unwrap_or(r.relative_boundary);
        if o.path_choice.unwrap_or(r.path_choice) {
            if !(2..=16).contains(&r.paths) {
                return Err(ScenarioError::Paths(r.paths));
            }
            for (key, v, positive) in [
                ("path_probe_rtts", r.path_probe_rtts, true),
                ("path_margin", r.path_margin, false),
                ("path_dwell_rtts", r.path_dwell_rtts, false),
            ] {
                if !v.is_finite() || v < 0.0 || (positive && v == 0.0) {
                    return Err(ScenarioError::PathSetting { key, value: v });
                }
            }
            let t = r.base_rtt_ns as f64;
            cfg.path_choice = Some(pacer::path::PathConfig {
                paths: r.paths,
                probe_interval_ns: (r.path_probe_rtts * t).max(1.0) as u64,
                margin: r.path_margin,
                dwell_ns: (r.path_dwell_rtts * t) as u64,
                stale_ns: (4.0 * f64::from(r.paths) * r.path_probe_rtts * t) as u64,
            });
        }
        if o.qos != Some(false) {
            cfg.qos = self.qos.as_ref().map(QosSpec::config).transpose()?;
        }
        if let Some(&d) = w.dscp.iter().find(|&&d| d > 63) {
            return Err(ScenarioError::Dscp(d));
        }
        if o.int_response.unwrap_or(r.int_response) {
            let period_ns = match r.int_response_period_us {
                0 => r.base_rtt_ns,
                us => us.saturating_mul(1_000),
            };
            cfg.int_response = Some(IntResponseConfig {
                threshold_bytes: r.int_response_threshold_bytes,
                period_ns,
                bloom_bits: r.int_response_bloom_bits,
            });
        }
        // A long flow: twice what a host link carries in the whole run.
        let long = if w.size_bytes == 0 {
            (topo_spec.host_gbps * 1e9 / 8.0 * duration_ns as f64 / 1e9 * 2.0) as u64 + 1
        } else {
            w.size_bytes
        };
        let mut flows = Vec::new();
        let mut offered = None;
        // The monitored port: the switch port towards `host`.
        let towards = |host: usize| {
            let node = find(&topo, host);
            let (e, _) = topo.peer(node, 0);
            End {
                node: e.node,
                port: e.port,
            }
        };
        let monitor = match w.kind.as_str() {
            "incast" => {
                // The last host receives; on a topology of fixed size (a
                // fat tree) `senders` hosts drawn at random send.
                let recv = hosts - 1;
                let n = senders.unwrap_or(recv).min(recv);
                let mut pool: Vec<usize> = (0..recv).collect();
                if n < recv {
                    let mut rng = ChaCha8Rng::seed_from_u64(seed);
                    for k in 0..n {
                        let j = rng.gen_range(k..pool.len());
                        pool.swap(k, j);
                    }
                    pool.truncate(n);
                    pool.sort_unstable();
                }
                for &s in &pool {
                    flows.push(FlowSpec {
                        src: s,
                        dst: recv,
                        size: long,
                        start_ns: 0,
                        dscp: None,
                    });
                }
                towards(recv)
            }
            "converge" => {
                let n = w.flows.unwrap_or(2);
                if n + 2 > hosts {
                    return Err(ScenarioError::ConvergeHosts {
                        flows: n,
                        need: n + 2,
                        hosts,
                    });
                }
                let recv = hosts - 1;
                for s in 0..=n {
                    let start_ns = if s < n { 0 } else { w.join_us * 1_000 };
                    flows.push(FlowSpec {
                        src: s,
                        dst: recv,
                        size: long,
                        start_ns,
                        dscp: None,
                    });
                }
                towards(recv)
            }
            "dumbbell" => {
                let half = hosts.div_ceil(2);
                for s in 0..half {
                    flows.push(FlowSpec {
                        src: s,
                        dst: half + s % (hosts - half),
                        size: long,
                        start_ns: 0,
                        dscp: None,
                    });
                }
                // The left switch's port towards the right switch.
                let left = towards(0).node;
                let port = (0..topo.ports[left].len())
                    .find(|&p| {
                        topo.nodes[topo.peer(left, p).0.node] == super::topology::NodeKind::Switch
                    })
                    .ok_or(ScenarioError::DumbbellLink)?;
                End { node: left, port }
            }
            "poisson" => {
                let name = w.cdf.as_deref().unwrap_or("fb_hadoop");
                let text = CDFS
                    .iter()
                    .find(|c| c.0 == name)
                    .map(|c| c.1.to_string())
                    .map_or_else(|| std::fs::read_to_string(name), Ok)
                    .map_err(|e| ScenarioError::Cdf {
                        name: name.into(),
                        why: e.to_string(),
                    })?;
                let cdf = Cdf::parse(&text).map_err(|source| ScenarioError::CdfData {
                    name: name.into(),
                    source,
                })?;
                let load = o.load.or(w.load).unwrap_or(0.3);
                if !(load > 0.0 && load < 1.0) {
                    return Err(ScenarioError::Load(load));
                }
                let bw = topo_spec.host_gbps * 1e9;
                let mut rng = ChaCha8Rng::seed_from_u64(seed);
                // Per host: exponential gaps with mean = mean size / (load x B).
                let gap_ns = cdf.mean() * 8.0 / (load * bw) * 1e9;
                for src in 0..hosts {
                    let mut t = 0.0f64;
                    loop {
                        t += -gap_ns * (1.0 - rng.gen::<f64>()).ln();
                        if t >= duration_ns as f64 {
                            break;
                        }
                        let mut dst = rng.gen_range(0..hosts - 1);
                        if dst >= src {
                            dst += 1;
                        }
                        let size = cdf.sample(rng.gen::<f64>()).max(1.0) as u64;
                        flows.push(FlowSpec {
                            src,
                            dst,
                            size,
                            start_ns: t as u64,
                            dscp: None,
                        });
                    }
                }
                let background = flows.iter().map(|f| f.size).sum::<u64>();
                let mut incasts = 0usize;
                if w.incast_senders > 0 && w.incast_load > 0.0 {
                    let n = w.incast_senders.min(hosts - 1);
                    let bytes = (n as u64 * w.incast_size_bytes) as f64;
                    let gap = bytes * 8.0 / (w.incast_load * bw * hosts as f64) * 1e9;
                    let mut t = match w.incast_arrivals {
                        Arrivals::Poisson => 0.0f64,
                        Arrivals::Even => gap * rng.gen::<f64>() - gap,
                    };
                    loop {
                        t += match w.incast_arrivals {
                            Arrivals::Poisson => -gap * (1.0 - rng.gen::<f64>()).ln(),
                            Arrivals::Even => gap,
                        };
                        if t >= duration_ns as f64 {
                            break;
                        }
                        incasts += 1;
                        let dst = rng.gen_range(0..hosts);
                        let mut pool: Vec<usize> = (0..hosts).filter(|&h| h != dst).collect();
                        for k in 0..n {
                            let j = rng.gen_range(k..pool.len());
                            pool.swap(k, j);
                            flows.push(FlowSpec {
                                src: pool[k],
                                dst,
                                size: w.incast_size_bytes,
                                start_ns: t as u64,
                                dscp: None,
                            });
                        }
                    }
                }
                let capacity = bw / 8.0 * hosts as f64 * duration_ns as f64 / 1e9;
                let incast_bytes = flows.iter().map(|f| f.size).sum::<u64>() - background;
                offered = Some(Offered {
                    background_load: background as f64 / capacity.max(1.0),
                    incasts,
                    incast_load: incast_bytes as f64 / capacity.max(1.0),
                });
                towards(0)
            }
            other => return Err(ScenarioError::UnknownWorkload(other.into())),
        };
        if !w.dscp.is_empty() {
            for (i, f) in flows.iter_mut().enumerate() {
                f.dscp = Some(w.dscp[i % w.dscp.len()]);
            }
        }
        cfg.monitor = Some(monitor);
        let buffer = topo_spec.buffer_bytes;
        let mut sim = Simulator::new(cfg, topo, buffer)?;
        for f in &flows {
            sim.add_flow(*f)?;
        }
        Ok(Built {
            sim,
            flows: flows.len(),
            offered,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_scenarios_parse_and_build() {
        for (name, text) in BUILTIN {
            let s = ScenarioSpec::parse(text).unwrap_or_else(|e| panic!("{name}: {e}"));
            if name == "paper-fig11a" {
                continue; // large; built by the benchmark
            }
            let o = Overrides {
                duration_us: Some(50),
                ..Overrides::default()
            };
            assert!(s.build(CcMode::None, &o).is_ok(), "{name}");
        }
    }

    #[test]
    fn cdfs_parse_and_sample_within_their_range() {
        for (name, text) in CDFS {
            let c = Cdf::parse(text).unwrap();
            assert_eq!(c.sample(0.0), 0.0, "{name}");
            assert!(c.sample(1.0) >= 1e6, "{name}");
            assert!(c.mean() > 0.0);
        }
        let c = Cdf::parse("0 0\n100 50\n300 100").unwrap();
        assert_eq!(c.sample(0.25), 50.0);
        assert_eq!(c.sample(0.75), 200.0);
        assert_eq!(c.mean(), 0.5 * 50.0 + 0.5 * 200.0);
        assert_eq!(Cdf::parse("0 0\n10 50"), Err(CdfError::Shape));
        let e = Cdf::parse("0 0\nx 100").unwrap_err().to_string();
        assert!(e.contains("line 2"), "{e}");
    }

    /// A small fabric under a Poisson workload with incasts: `even`
    /// arrivals offer the configured incast load on every seed, Poisson
    /// ones only on average.
    #[test]
    fn even_incast_arrivals_offer_the_configured_load_on_every_seed() {
        let text = r#"
[topology]
kind = "fat-tree"
k = 4
[workload]
kind = "poisson"
cdf = "fb_hadoop"
load = 0.3
incast_senders = 4
incast_size_bytes = 100000
incast_load = 0.05
incast_arrivals = "even"
[sim]
duration_us = 1000
"#;
        let spec = ScenarioSpec::parse(text).unwrap();
        let poisson = ScenarioSpec {
            workload: WorkloadSpec {
                incast_arrivals: Arrivals::Poisson,
                ..spec.workload.clone()
            },
            ..spec.clone()
        };
        let mut poisson_counts = Vec::new();
        for seed in 1..=8 {
            let o = Overrides {
                seed: Some(seed),
                ..Overrides::default()
            };
            let even = spec.build(CcMode::None, &o).unwrap().offered.unwrap();
            // 16 hosts x 100G x 5% = 80 Gb/s of 3.2 Mb incasts: one per
            // 40 us, 25 in 1 ms.
            assert_eq!(even.incasts, 25, "seed {seed}");
            assert!((even.incast_load - 0.05).abs() < 0.002, "{even:?}");
            poisson_counts.push(
                poisson
                    .build(CcMode::None, &o)
                    .unwrap()
                    .offered
                    .unwrap()
                    .incasts,
            );
        }
        assert!(
            poisson_counts.iter().any(|&n| n != 25),
            "Poisson arrivals vary: {poisson_counts:?}"
        );
        let bad = text.replace("\"even\"", "\"often\"");
        let e = ScenarioSpec::parse(&bad).unwrap_err().to_string();
        assert!(e.contains("often"), "{e}");
    }

    #[test]
    fn unknown_names_are_refused_by_name() {
        let spec = ScenarioSpec::parse(BUILTIN[0].1).unwrap();
        assert!(spec
            .sim
            .cc("bbr")
            .unwrap_err()
            .to_string()
            .contains("\"bbr\""));
        let mut s = ScenarioSpec::parse(BUILTIN[0].1).unwrap();
        s.workload.kind = "alltoall".into();
        assert!(s
            .build(CcMode::None, &Overrides::default())
            .err()
            .unwrap()
            .to_string()
            .contains("alltoall"));
    }
}
