//! The daemon's one typed configuration: the TOML file of `dataplane
//! --config` as serde structs (unknown keys refused), and [`Config::check`],
//! which validates all of it before any port starts and resolves it into
//! the settings the testbeds and the service take. `dataplane --check`
//! runs exactly this. Every error names the file, the key and the value.

use std::path::{Path, PathBuf};

use nic::{Direction, FaultConfig};
use pacer::HpccSettings;
use serde::Deserialize;
use transport::rc::{CcMode, PathMtu};
use transport::wire::{MacAddr, VlanTag};

use crate::incast::IncastConfig;
use crate::service::sleep::PollPolicy;
use crate::service::{HostSpec, ServiceConfig};
use crate::testbed::{HostFaults, LoopbackConfig};

/// The file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub eal: EalSection,
    pub loopback: Option<LoopbackSection>,
    pub incast: Option<IncastSection>,
    pub replay: Option<ReplaySection>,
    pub service: Option<ServiceSection>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EalSection {
    /// EAL arguments (vdevs, memory, logging); `--file-prefix` is added.
    pub args: Vec<String>,
}

/// Two hosts on two ports that reach each other.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoopbackSection {
    /// Two existing ports (from vdevs or PCI devices in `[eal]`) instead of a
    /// net_ring pair.
    pub ports: Option<[u16; 2]>,
    /// Mbufs in the pool both ports share [default: 4095].
    pub mbufs: Option<u32>,
    /// RX/TX queues per port, up to what the device offers [default: 1].
    pub queues: Option<u16>,
    pub mem_bytes: usize,
    pub mtu: u32,
    pub sizes: Vec<u32>,
    pub tap: Option<PathBuf>,
    /// Seeded faults on one host's port (a lossy link).
    pub faults: Option<FaultsSection>,
}

/// Faults injected on one host's port, both directions by default.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultsSection {
    /// The host whose port misbehaves (0 or 1).
    pub host: usize,
    #[serde(default = "one")]
    pub seed: u64,
    #[serde(default)]
    pub loss: f64,
    #[serde(default)]
    pub duplicate: f64,
    #[serde(default)]
    pub reorder: f64,
    /// Probability that one ICRC-protected bit of a frame is flipped.
    #[serde(default)]
    pub corrupt: f64,
    /// Probability that a connection-setup MAD (to QP1, not a CM DREQ or
    /// DREP) is lost, besides `loss`.
    #[serde(default)]
    pub mad_loss: f64,
    /// Latency added to every frame, microseconds.
    #[serde(default)]
    pub delay_us: f64,
    /// rx, tx or both [default: both].
    pub direction: Option<String>,
    /// Record every frame the faults lose into this pcap (the evidence of
    /// what the lossy link took, read by the interop judge).
    pub lost_pcap: Option<PathBuf>,
}

fn one() -> u64 {
    1
}

/// `[incast] int_response_threshold_bytes` when absent.
fn default_int_response_threshold() -> u64 {
    32_768
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IncastSection {
    /// Mirror the bottleneck port to this pcap (one file per controller:
    /// the controller's name is appended).
    pub tap: Option<PathBuf>,
    /// Mbufs in the pool [default: 16383].
    pub mbufs: Option<u32>,
    pub senders: usize,
    pub host_gbps: f64,
    pub bottleneck_gbps: f64,
    pub buffer_bytes: u64,
    /// Lossless switch: `buffer_bytes` is the switch's buffer, shared by
    /// its ports with priority flow control (PAUSE/RESUME frames to the
    /// senders' NICs) [default: false, drop-tail per port].
    #[serde(default)]
    pub pfc: bool,
    /// Switch INT responses (HPCC++ draft-00 s6.3): senders subscribe
    /// their data packets, the switch answers those that join a queue of
    /// `int_response_threshold_bytes` or more, once per flow per base RTT
    /// [default: false].
    #[serde(default)]
    pub int_response: bool,
    /// [default: 32768]
    #[serde(default = "default_int_response_threshold")]
    pub int_response_threshold_bytes: u64,
    /// Receiver-measured N (HPCC++ draft-00 s6.2): the receiver counts the
    /// flows through its last hop and reports N in its ACKs; senders take
    /// W_AI = W_init (1 - eta) / N [default: false].
    #[serde(default)]
    pub receiver_n: bool,
    /// QoS classes at the switch ports (`[incast.qos]`, the keys of the
    /// simulator's `[qos]`: scheduler, weights, dscp, quantum_bytes)
    /// [default: one FIFO per port].
    #[serde(default)]
    pub qos: Option<netsim::sim::scenario::QosSpec>,
    /// DSCP of each sender in turn [default: the engines' 26].
    #[serde(default)]
    pub sender_dscp: Vec<u8>,
    /// Senders ask the switch for each packet's sojourn time instead of
    /// the queue length (HPCC++ 2023 s9.3) [default: false].
    #[serde(default)]
    pub int_sojourn: bool,
    /// Authenticated feedback: every connection gets a key and its ACKs a
    /// MAC over the echoed telemetry [default: false].
    #[serde(default)]
    pub feedback_auth: bool,
    /// The switch is a telemetry domain's boundary: every stack it sends
    /// is rewritten into relative load, no port rate, byte count or switch
    /// id leaves it (HPCC++ 2023 s9.1) [default: false].
    #[serde(default)]
    pub relative_telemetry: bool,
    pub base_rtt_us: u64,
    pub mtu: u32,
    pub message_bytes: u32,
    pub depth: usize,
    pub seconds: f64,
    pub cc: Vec<String>,
}

/// Reads every frame a port receives until it stays idle, decodes each,
/// and forwards it to `out_port`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplaySection {
    pub port: u16,
    pub out_port: Option<u16>,
}

/// The application service of `--serve` (devices rnic0 and rnic1, one per
/// loopback host).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceSection {
    pub socket: PathBuf,
    /// Largest shared segment an application may ask for [default: 1 GiB].
    pub max_shm_bytes: Option<u64>,
    /// Try hugepage-backed segments first [default: true].
    pub hugepages: Option<bool>,
    /// Congestion control of every QP [default: none].
    pub cc: Option<String>,
    /// Line rate the engines pace at, Gb/s [default: 10].
    pub line_gbps: Option<f64>,
    /// After a long idle stretch (no frame, doorbell or request for
    /// 20000 passes), the dataplane sleeps this long between passes so
    /// that processes sharing its CPU run; 0 busy-polls forever, yielding
    /// the CPU each pass [default: 50 us].
    pub idle_sleep_us: Option<u32>,
    /// What an idle dataplane lcore does, each lcore for itself: "spin"
    /// polls (with `idle_sleep_us` rests after a long idle stretch: for
    /// lcores with cores of their own); "event" sleeps as soon as a pass
    /// finds nothing to do, until an application's doorbell, a frame, a
    /// control request or its next timer wakes it; "adaptive" spins while
    /// work keeps coming and it has its core to itself, and sleeps as
    /// "event" does once idle for 200 us, or at once while it shares its
    /// core (more runnable threads than CPUs, or its thread preempted)
    /// [default: adaptive].
    pub poll: Option<String>,
    /// A sleeping lcore whose port may receive frames it is not woken for
    /// (any port but the loopback testbed's ring pair) looks at it after
    /// a nap: 20 us after work, doubling while naps find nothing, up to
    /// this [default: 1000 us].
    pub nap_us: Option<u32>,
    /// ACK coalescing between our own NICs: a QP towards a peer that
    /// speaks our telemetry asks for an ACK at least every this many
    /// messages, and always on a signaled WR's last packet; the peer's
    /// responder ACKs the rest after 20 us. 1 asks on every message end,
    /// as towards a standard peer (which always gets 1). Every peer in
    /// `telemetry_peers` must be a daemon that ACKs by itself so (this
    /// one or later): a peer that ACKs only what asks leaves the last
    /// unasked messages of a burst to the retransmission timeout
    /// [default: 16, at most 64].
    pub ack_coalesce: Option<u32>,
    /// Zero-copy TX: a data packet whose payload is at least this many
    /// bytes of one memory region is sent from the application's memory
    /// where it lies (an mbuf pointing into its segment, chained behind
    /// the headers) instead of copied into the frame; 0 copies every
    /// payload. Only on ports whose driver reads frames in software
    /// (net_ring, net_tap, net_af_packet); others always copy
    /// [default: 1024].
    pub zero_copy_tx_min: Option<u32>,
    /// Dataplane lcores: each runs the pipelines of its share of the
    /// devices (device `i` on lcore `i % lcores`; with `qp_shards`, its
    /// share of the devices' shards) and serves the applications that
    /// opened them; no more lcores run than there are engines
    /// [default: 1]. `dataplane --lcores N` overrides it.
    pub lcores: Option<u32>,
    /// Engines each device's QPs are sharded over (QP shards), each with
    /// its own RX and TX queue of the device's port; frames reach the
    /// shard owning their QP (its QPN says which). Shard `k` of device `i`
    /// runs on lcore `(i * qp_shards + k) % lcores`. The port must offer a
    /// queue pair per shard (the loopback testbed's net_ring ports up to
    /// 16), and gets exactly that many (`[loopback] queues` is not used).
    /// Each shard's inbox holds up to 1024 frames passed to it: with many
    /// shards, raise `[loopback] mbufs` [default: 1, at most 64].
    /// `dataplane --qp-shards N` overrides it.
    pub qp_shards: Option<u32>,
    /// Subnets (`a.b.c.d/n`) whose peers speak our telemetry, besides the
    /// daemon's own hosts [default: none]. A QP towards any other peer
    /// runs `standard_cc` instead of an HPCC++ mode: a standard RoCEv2
    /// peer never gets a TLM block, probe or notify frame.
    pub telemetry_peers: Option<Vec<String>>,
    /// Congestion control of QPs towards peers that do not speak our
    /// telemetry [default: dcqcn, at line rate until CNPs come].
    pub standard_cc: Option<String>,
    /// Authenticated feedback (HPCC++ draft-00 s9) for every application,
    /// unmodified verbs binaries included: 32 hex digits, a 128-bit key
    /// shared by every daemon of the domain. A QP connecting to a peer
    /// that speaks our telemetry gets a key both ends derive from it and
    /// the two (address, QPN) ends; its ACKs, probe answers and
    /// notifications carry a MAC, its subscribed data packets a token
    /// (docs/wire.md). A key an application sets (rnicdv) wins
    /// [default: none, feedback not authenticated].
    pub feedback_domain_key: Option<String>,
    /// The devices to serve, each on a port of `[eal]` with its own IPv4
    /// address [default: rnic0 and rnic1, the loopback testbed's hosts].
    pub devices: Option<Vec<DeviceSection>>,
    /// Static neighbour entries (IPv4 to MAC) every device uses instead of
    /// asking ARP; they never expire [default: none].
    pub neighbours: Option<Vec<NeighbourSection>>,
    /// Mirror every frame the devices receive and send into this pcap
    /// (`bench decode FILE` and tshark read it) [default: none].
    pub tap: Option<PathBuf>,
    /// Frames the tap records at most; later ones are counted, not
    /// written [default: 1000000].
    pub tap_frames: Option<u64>,
}

/// One static neighbour of `[[service.neighbours]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NeighbourSection {
    /// The peer's IPv4 address.
    pub ip: String,
    /// Its MAC.
    pub mac: String,
}

/// One device of `[[service.devices]]`: a port with an address.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceSection {
    /// The name applications open (`ibv_devices` lists it).
    pub name: String,
    /// The DPDK port (from a vdev or PCI device of `[eal]`).
    pub port: u16,
    /// Its IPv4 address: the RoCE v2 GID `::ffff:a.b.c.d`, answered by ARP.
    pub ip: String,
    /// Its MAC [default: the port's own].
    pub mac: Option<String>,
    /// 802.1Q VLAN id (1..4094) of every frame it sends; it takes only
    /// frames of this VLAN [default: untagged].
    pub vlan: Option<i64>,
    /// Priority (802.1Q PCP, 0..7) of its frames; needs `vlan`, the tag
    /// carries it [default: 0].
    pub priority: Option<i64>,
}

/// A configuration that cannot be used, naming the file, the key and the
/// bad value.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{file}: {source}")]
    Read {
        file: PathBuf,
        source: std::io::Error,
    },
    /// Syntax, an unknown key or a value of the wrong type (toml's message
    /// names the key and shows the line).
    #[error("{file}: {message}")]
    Toml { file: PathBuf, message: String },
    #[error("{file}: {key} = {value}: {why}")]
    Invalid {
        file: PathBuf,
        key: String,
        value: String,
        why: String,
    },
    #[error("{file}: {why}")]
    Sections { file: PathBuf, why: String },
}

/// What a checked configuration runs.
#[derive(Debug, Clone)]
pub enum Plan {
    /// The loopback testbed's own WRITEs and READs of `sizes`.
    Loopback {
        cfg: LoopbackConfig,
        ports: Option<[u16; 2]>,
        sizes: Vec<u32>,
        /// The service, when the file has one (`--serve`).
        service: Option<Box<ServiceConfig>>,
    },
    /// One incast run per controller.
    Incast {
        runs: Vec<(String, IncastConfig)>,
        seconds: f64,
    },
    Replay {
        port: u16,
        out_port: Option<u16>,
    },
}

/// A configuration checked in full.
#[derive(Debug, Clone)]
pub struct Checked {
    pub eal_args: Vec<String>,
    pub plan: Plan,
}

const MTUS: &str = "not 256, 512, 1024, 2048 or 4096";
/// Rates from 1 Mb/s to 10 Tb/s.
const MIN_GBPS: f64 = 0.001;
const MAX_GBPS: f64 = 10_000.0;
/// Most memory one testbed host registers (it is allocated up front).
const MAX_HOST_MEMORY: u64 = 1 << 33;
/// Longest added latency of a fault injector, microseconds (frames wait
/// in port buffers meanwhile).
const MAX_DELAY_US: f64 = 1_000_000.0;
/// Longest Unix socket path (sun_path holds 108 bytes with the NUL).
const MAX_SOCKET_PATH: usize = 107;
/// Probe timeout and HPCC++ T of the service's engines (a testbed's RTT).
pub const SERVICE_RTT_NS: u64 = 10_000;

struct Ctx<'a> {
    file: &'a Path,
}

impl Ctx<'_> {
    fn bad(&self, key: &str, value: impl std::fmt::Display, why: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            file: self.file.to_owned(),
            key: key.into(),
            value: value.to_string(),
            why: why.into(),
        }
    }

    fn mtu(&self, key: &str, b: u32) -> Result<PathMtu, ConfigError> {
        PathMtu::from_bytes(b).ok_or_else(|| self.bad(key, b, MTUS))
    }

    fn rate_bps(&self, key: &str, gbps: f64) -> Result<u64, ConfigError> {
        if !(gbps.is_finite() && (MIN_GBPS..=MAX_GBPS).contains(&gbps)) {
            return Err(self.bad(
                key,
                gbps,
                format!("a rate is a number of Gb/s from {MIN_GBPS} to {MAX_GBPS}"),
            ));
        }
        Ok((gbps * 1e9) as u64)
    }

    fn cc(&self, key: &str, name: &str, base_rtt_ns: u64) -> Result<CcMode, ConfigError> {
        CcMode::from_name(name, 3, base_rtt_ns)
            .map_err(|e| self.bad(key, format!("{name:?}"), e.to_string()))
    }

    fn at_most(&self, key: &str, v: u64, max: u64) -> Result<(), ConfigError> {
        if v > max {
            return Err(self.bad(key, v, format!("at most {max}")));
        }
        Ok(())
    }

    fn positive(&self, key: &str, v: u64) -> Result<(), ConfigError> {
        if v == 0 {
            return Err(self.bad(key, v, "must be at least 1"));
        }
        Ok(())
    }
}

/// Devices the EAL arguments make available, when they say: vdevs plus
/// allow-listed PCI devices; `None` when PCI devices are probed at large
/// (they can only be counted once the EAL runs).
fn devices(args: &[String]) -> (Vec<String>, Option<usize>) {
    let mut vdevs = Vec::new();
    let (mut allowed, mut no_pci) = (0, false);
    let mut it = args.iter().peekable();
    while let Some(a) = it.next() {
        if let Some(v) = a.strip_prefix("--vdev=") {
            vdevs.push(v.to_string());
        } else if a == "--vdev" {
            vdevs.extend(it.next().cloned());
        } else if a == "-a" || a == "--allow" {
            allowed += usize::from(it.next().is_some());
        } else if a.starts_with("--allow=") {
            allowed += 1;
        } else if a == "--no-pci" {
            no_pci = true;
        }
    }
    let known = (no_pci || allowed > 0).then_some(vdevs.len() + allowed);
    (vdevs, known)
}

impl Config {
    /// Reads and checks `file`.
    pub fn load(file: &Path) -> Result<Checked, ConfigError> {
        let text = std::fs::read_to_string(file).map_err(|source| ConfigError::Read {
            file: file.to_owned(),
            source,
        })?;
        let cfg: Config = toml::from_str(&text).map_err(|e| ConfigError::Toml {
            file: file.to_owned(),
            message: e.to_string(),
        })?;
        cfg.check(file)
    }

    /// Validates everything (sizes, MTUs, rates, congestion control and
    /// its parameters, faults, sockets, the devices ports name) and
    /// resolves the settings.
    pub fn check(&self, file: &Path) -> Result<Checked, ConfigError> {
        let c = Ctx { file };
        let sections = ConfigError::Sections {
            file: file.to_owned(),
            why: "needs exactly one of [loopback], [incast] and [replay]".into(),
        };
        let (vdevs, known) = devices(&self.eal.args);
        for (i, v) in vdevs.iter().enumerate() {
            if !v.starts_with("net_") {
                return Err(c.bad(
                    &format!("eal.args (vdev {i})"),
                    v,
                    "a network vdev's name starts with net_ (net_ring, net_memif, net_af_packet, net_pcap, ...)",
                ));
            }
        }
        let port = |key: &str, id: u16| -> Result<(), ConfigError> {
            match known {
                Some(n) if usize::from(id) >= n => Err(c.bad(
                    key,
                    id,
                    format!("no such port: [eal] args make {n} device(s) (add a --vdev)"),
                )),
                _ => Ok(()),
            }
        };
        let plan = match (&self.loopback, &self.incast, &self.replay) {
            (Some(l), None, None) => {
                if let Some([a, b]) = l.ports {
                    port("loopback.ports", a)?;
                    port("loopback.ports", b)?;
                    if a == b {
                        return Err(c.bad(
                            "loopback.ports",
                            format!("[{a}, {b}]"),
                            "two different ports",
                        ));
                    }
                }
                let mtu = c.mtu("loopback.mtu", l.mtu)?;
                if l.mem_bytes < 2 {
                    return Err(c.bad(
                        "loopback.mem_bytes",
                        l.mem_bytes,
                        "too small to hold a buffer",
                    ));
                }
                c.at_most("loopback.mem_bytes", l.mem_bytes as u64, MAX_HOST_MEMORY)?;
                let half = l.mem_bytes / 2;
                if let Some(&s) = l.sizes.iter().find(|&&s| s as usize > half) {
                    return Err(c.bad(
                        "loopback.sizes",
                        s,
                        format!("larger than half of mem_bytes ({half})"),
                    ));
                }
                let mbufs = l.mbufs.unwrap_or(LoopbackConfig::default().mbufs);
                if mbufs < 64 {
                    return Err(c.bad(
                        "loopback.mbufs",
                        mbufs,
                        "at least 64 (a burst each way and a cache)",
                    ));
                }
                let queues = l.queues.unwrap_or(1);
                c.positive("loopback.queues", u64::from(queues))?;
                let faults = l.faults.as_ref().map(|f| f.check(&c)).transpose()?;
                let cfg = LoopbackConfig {
                    mem_bytes: l.mem_bytes,
                    mtu,
                    tap: l.tap.clone(),
                    mbufs,
                    queues,
                    faults,
                    ..LoopbackConfig::default()
                };
                let service = self
                    .service
                    .as_ref()
                    .map(|s| s.check(&c, &cfg).map(Box::new))
                    .transpose()?;
                Plan::Loopback {
                    cfg,
                    ports: l.ports,
                    sizes: l.sizes.clone(),
                    service,
                }
            }
            (None, Some(i), None) => {
                if self.service.is_some() {
                    return Err(ConfigError::Sections {
                        file: file.to_owned(),
                        why: "[service] goes with [loopback] (its hosts are the devices)".into(),
                    });
                }
                i.check(&c)?
            }
            (None, None, Some(r)) => {
                port("replay.port", r.port)?;
                if let Some(o) = r.out_port {
                    port("replay.out_port", o)?;
                }
                Plan::Replay {
                    port: r.port,
                    out_port: r.out_port,
                }
            }
            _ => return Err(sections),
        };
        Ok(Checked {
            eal_args: self.eal.args.clone(),
            plan,
        })
    }
}

impl FaultsSection {
    fn check(&self, c: &Ctx<'_>) -> Result<HostFaults, ConfigError> {
        if self.host > 1 {
            return Err(c.bad(
                "loopback.faults.host",
                self.host,
                "the testbed has hosts 0 and 1",
            ));
        }
        let direction = match self.direction.as_deref().unwrap_or("both") {
            "rx" => Direction::Rx,
            "tx" => Direction::Tx,
            "both" => Direction::Both,
            d => {
                return Err(c.bad(
                    "loopback.faults.direction",
                    format!("{d:?}"),
                    "rx, tx or both",
                ))
            }
        };
        if !(self.delay_us.is_finite() && (0.0..=MAX_DELAY_US).contains(&self.delay_us)) {
            return Err(c.bad(
                "loopback.faults.delay_us",
                self.delay_us,
                format!("a delay from 0 to {MAX_DELAY_US} us"),
            ));
        }
        let f = FaultConfig {
            seed: self.seed,
            loss: self.loss,
            duplicate: self.duplicate,
            reorder: self.reorder,
            corrupt: self.corrupt,
            mad_loss: self.mad_loss,
            delay_ns: (self.delay_us * 1e3) as u64,
            direction,
            ..FaultConfig::default()
        };
        f.validate().map_err(|e| {
            c.bad(
                &format!("loopback.faults.{}", e.name),
                e.value,
                "not a probability in [0, 1]",
            )
        })?;
        Ok(HostFaults {
            host: self.host,
            faults: f,
            lost_pcap: self.lost_pcap.clone(),
        })
    }
}

/// Most dataplane lcores of the service.
pub const MAX_LCORES: u32 = 64;

/// A count of dataplane lcores: 1 to [`MAX_LCORES`].
fn check_lcores(c: &Ctx<'_>, key: &str, n: u32) -> Result<(), ConfigError> {
    if (1..=MAX_LCORES).contains(&n) {
        Ok(())
    } else {
        Err(c.bad(key, n, format!("1 to {MAX_LCORES}")))
    }
}

/// A count of QP shards per device: 1 to `transport::rc::MAX_SHARDS`.
fn check_qp_shards(c: &Ctx<'_>, key: &str, n: u32) -> Result<(), ConfigError> {
    if (1..=transport::rc::MAX_SHARDS).contains(&n) {
        Ok(())
    } else {
        Err(c.bad(key, n, format!("1 to {}", transport::rc::MAX_SHARDS)))
    }
}

/// Longest idle sleep of the service's loop, us.
const MAX_IDLE_SLEEP_US: u32 = 100_000;

impl ServiceSection {
    fn check(&self, c: &Ctx<'_>, l: &LoopbackConfig) -> Result<ServiceConfig, ConfigError> {
        check_socket(c, "service.socket", &self.socket)?;
        let max_shm_bytes = self.max_shm_bytes.unwrap_or(1 << 30);
        c.positive("service.max_shm_bytes", max_shm_bytes)?;
        let line_rate_bps = c.rate_bps("service.line_gbps", self.line_gbps.unwrap_or(10.0))?;
        let idle_sleep_us = self.idle_sleep_us.unwrap_or(50);
        if idle_sleep_us > MAX_IDLE_SLEEP_US {
            return Err(c.bad(
                "service.idle_sleep_us",
                idle_sleep_us,
                format!("at most {MAX_IDLE_SLEEP_US} (100 ms)"),
            ));
        }
        let poll = match &self.poll {
            None => PollPolicy::default(),
            Some(p) => p
                .parse::<PollPolicy>()
                .map_err(|why| c.bad("service.poll", format!("{p:?}"), why))?,
        };
        let nap_us = self.nap_us.unwrap_or(1000);
        if !(20..=MAX_IDLE_SLEEP_US).contains(&nap_us) {
            return Err(c.bad(
                "service.nap_us",
                nap_us,
                format!("20 to {MAX_IDLE_SLEEP_US} (100 ms)"),
            ));
        }
        let lcores = self.lcores.unwrap_or(1);
        check_lcores(c, "service.lcores", lcores)?;
        let qp_shards = self.qp_shards.unwrap_or(1);
        check_qp_shards(c, "service.qp_shards", qp_shards)?;
        let ack_coalesce = self.ack_coalesce.unwrap_or(transport::rc::ACK_REQ_MSGS);
        if !(1..=transport::rc::ACK_REQ_MSGS_MAX).contains(&ack_coalesce) {
            return Err(c.bad(
                "service.ack_coalesce",
                ack_coalesce,
                format!(
                    "messages per AckReq must be 1..={}",
                    transport::rc::ACK_REQ_MSGS_MAX
                ),
            ));
        }
        let zero_copy_tx_min = self.zero_copy_tx_min.unwrap_or(1024);
        if zero_copy_tx_min > u32::from(u16::MAX) {
            return Err(c.bad(
                "service.zero_copy_tx_min",
                zero_copy_tx_min,
                "payload bytes, at most 65535 (0: always copy)".to_string(),
            ));
        }
        let cc = c.cc(
            "service.cc",
            self.cc.as_deref().unwrap_or("none"),
            SERVICE_RTT_NS,
        )?;
        let telemetry_peers = self
            .telemetry_peers
            .iter()
            .flatten()
            .map(|v| {
                parse_cidr(v).ok_or_else(|| {
                    c.bad(
                        "service.telemetry_peers",
                        format!("{v:?}"),
                        "a subnet is a.b.c.d/n with n from 0 to 32",
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let feedback_domain_key = self
            .feedback_domain_key
            .as_deref()
            .map(|v| {
                transport::rc::auth::FeedbackKey::from_hex(v).map_err(|why| {
                    c.bad(
                        "service.feedback_domain_key",
                        "(a key, not shown)",
                        why.to_string(),
                    )
                })
            })
            .transpose()?;
        let std_name = self.standard_cc.as_deref().unwrap_or("dcqcn");
        let standard_cc = c.cc("service.standard_cc", std_name, SERVICE_RTT_NS)?;
        if standard_cc.uses_telemetry() {
            return Err(c.bad(
                "service.standard_cc",
                format!("{std_name:?}"),
                "peers without our telemetry need dcqcn or none",
            ));
        }
        let mut devices = Vec::new();
        for (k, d) in self.devices.iter().flatten().enumerate() {
            let key = |f: &str| format!("service.devices[{k}].{f}");
            if d.name.is_empty() || devices.iter().any(|h: &HostSpec| h.name == d.name) {
                return Err(c.bad(
                    &key("name"),
                    format!("{:?}", d.name),
                    "names are unique and not empty",
                ));
            }
            let ip = d
                .ip
                .parse()
                .map_err(|_| c.bad(&key("ip"), format!("{:?}", d.ip), "an IPv4 address a.b.c.d"))?;
            let mac = match &d.mac {
                None => MacAddr::default(),
                Some(m) => parse_mac(m).ok_or_else(|| {
                    c.bad(
                        &key("mac"),
                        format!("{m:?}"),
                        "a MAC aa:bb:cc:dd:ee:ff, not multicast",
                    )
                })?,
            };
            let vlan = match (d.vlan, d.priority) {
                (None, None) => None,
                (None, Some(p)) => {
                    return Err(c.bad(
                        &key("priority"),
                        p,
                        "needs vlan: the priority travels in the 802.1Q tag",
                    ))
                }
                (Some(v), p) => {
                    let vid = u16::try_from(v)
                        .ok()
                        .filter(|v| (1..=4094).contains(v))
                        .ok_or_else(|| c.bad(&key("vlan"), v, "a VLAN id from 1 to 4094"))?;
                    let pcp = p.unwrap_or(0);
                    let pcp = u8::try_from(pcp)
                        .ok()
                        .filter(|p| *p <= 7)
                        .ok_or_else(|| c.bad(&key("priority"), pcp, "a priority from 0 to 7"))?;
                    Some(VlanTag {
                        pcp,
                        dei: false,
                        vid,
                    })
                }
            };
            devices.push(HostSpec {
                name: d.name.clone(),
                mac,
                ip,
                port: d.port,
                vlan,
                internal: false,
            });
        }
        let mut neighbours = Vec::new();
        for (k, n) in self.neighbours.iter().flatten().enumerate() {
            let key = |f: &str| format!("service.neighbours[{k}].{f}");
            let ip = n
                .ip
                .parse()
                .map_err(|_| c.bad(&key("ip"), format!("{:?}", n.ip), "an IPv4 address a.b.c.d"))?;
            let mac = parse_mac(&n.mac).ok_or_else(|| {
                c.bad(
                    &key("mac"),
                    format!("{:?}", n.mac),
                    "a MAC aa:bb:cc:dd:ee:ff, not multicast",
                )
            })?;
            neighbours.push((ip, mac));
        }
        let tap_frames = self.tap_frames.unwrap_or(1_000_000);
        c.positive("service.tap_frames", tap_frames)?;
        if let Some(t) = &self.tap {
            if t.as_os_str().is_empty() {
                return Err(c.bad("service.tap", "\"\"", "a pcap file path"));
            }
        }
        Ok(ServiceConfig {
            devices,
            neighbours,
            tap: self.tap.clone().map(|p| (p, tap_frames)),
            telemetry_peers,
            standard_cc,
            feedback_domain_key,
            socket: self.socket.clone(),
            max_mtu: l.mtu,
            mbufs: l.mbufs,
            line_rate_bps,
            max_shm_bytes,
            hugepages: self.hugepages.unwrap_or(true),
            idle_sleep_us,
            poll,
            nap_us,
            ack_coalesce,
            zero_copy_tx_min: zero_copy_tx_min as usize,
            lcores: lcores as usize,
            qp_shards: qp_shards as usize,
            cc,
            queues: l.queues,
            faults: l.faults.clone(),
        })
    }
}

/// `aa:bb:cc:dd:ee:ff` as a unicast MAC.
fn parse_mac(v: &str) -> Option<MacAddr> {
    let m: MacAddr = v.parse().ok()?;
    (m.0[0] & 1 == 0 && m.0 != [0; 6]).then_some(m)
}

/// `a.b.c.d/n` as (network, prefix length).
fn parse_cidr(v: &str) -> Option<(std::net::Ipv4Addr, u8)> {
    let (ip, n) = v.split_once('/')?;
    let n: u8 = n.parse().ok().filter(|&n| n <= 32)?;
    Some((ip.parse().ok()?, n))
}

/// A control socket path the daemon can bind: not empty, short enough for
/// a Unix socket address.
fn check_socket(c_file: &Ctx<'_>, key: &str, p: &Path) -> Result<(), ConfigError> {
    let n = p.as_os_str().len();
    if n == 0 || n > MAX_SOCKET_PATH {
        return Err(c_file.bad(
            key,
            p.display(),
            format!("a Unix socket path has 1 to {MAX_SOCKET_PATH} bytes, this one {n}"),
        ));
    }
    Ok(())
}

/// Checks a control socket given on the command line (`--socket`).
pub fn check_socket_arg(p: &Path) -> Result<(), ConfigError> {
    check_socket(
        &Ctx {
            file: Path::new("--socket"),
        },
        "--socket",
        p,
    )
}

impl IncastSection {
    fn check(&self, c: &Ctx<'_>) -> Result<Plan, ConfigError> {
        if !(1..=200).contains(&self.senders) {
            return Err(c.bad("incast.senders", self.senders, "between 1 and 200"));
        }
        let host_bps = c.rate_bps("incast.host_gbps", self.host_gbps)?;
        let bottleneck_bps = c.rate_bps("incast.bottleneck_gbps", self.bottleneck_gbps)?;
        let mtu = c.mtu("incast.mtu", self.mtu)?;
        c.positive("incast.buffer_bytes", self.buffer_bytes)?;
        c.positive("incast.base_rtt_us", self.base_rtt_us)?;
        c.positive("incast.message_bytes", u64::from(self.message_bytes))?;
        c.positive("incast.depth", self.depth as u64)?;
        let memory = u64::from(self.message_bytes).saturating_mul(self.depth as u64);
        if memory > MAX_HOST_MEMORY {
            return Err(c.bad(
                "incast.depth",
                self.depth,
                format!(
                    "message_bytes x depth = {memory} bytes per sender, at most {MAX_HOST_MEMORY}"
                ),
            ));
        }
        let mbufs = self.mbufs.unwrap_or(16383);
        if mbufs < 64 {
            return Err(c.bad(
                "incast.mbufs",
                mbufs,
                "at least 64 (a burst each way and a cache)",
            ));
        }
        c.at_most("incast.base_rtt_us", self.base_rtt_us, 1_000_000)?;
        if !(self.seconds.is_finite() && self.seconds > 0.0) {
            return Err(c.bad(
                "incast.seconds",
                self.seconds,
                "a positive number of seconds",
            ));
        }
        if self.cc.is_empty() {
            return Err(c.bad("incast.cc", "[]", "name at least one controller"));
        }
        let base_rtt_ns = self.base_rtt_us * 1000;
        let hpcc = HpccSettings {
            t_ns: base_rtt_ns,
            n: self.senders as u32,
            ..HpccSettings::default()
        };
        hpcc.params(host_bps, mtu.bytes()).map_err(|e| {
            c.bad(
                "incast.base_rtt_us",
                self.base_rtt_us,
                format!(
                    "HPCC++ parameters with host_gbps = {} and mtu = {}: {e}",
                    self.host_gbps, self.mtu
                ),
            )
        })?;
        let qos = match &self.qos {
            Some(q) => Some(
                q.config()
                    .map_err(|e| c.bad("incast.qos", format!("{:?}", q.weights), e.to_string()))?,
            ),
            None => None,
        };
        if let Some(&d) = self.sender_dscp.iter().find(|&&d| d > 63) {
            return Err(c.bad("incast.sender_dscp", d, "DSCP values 0..=63"));
        }
        let mut runs = Vec::new();
        for (k, name) in self.cc.iter().enumerate() {
            let cc = c.cc(&format!("incast.cc[{k}]"), name, base_rtt_ns)?;
            runs.push((
                name.clone(),
                IncastConfig {
                    senders: self.senders,
                    host_bps,
                    bottleneck_bps,
                    buffer_bytes: self.buffer_bytes,
                    pfc: self.pfc,
                    receiver_n: self.receiver_n,
                    qos: qos.clone(),
                    sender_dscp: self.sender_dscp.clone(),
                    int_sojourn: self.int_sojourn,
                    feedback_auth: self.feedback_auth,
                    relative_telemetry: self.relative_telemetry,
                    int_response: self.int_response.then(|| {
                        netsim::int_response::IntResponseConfig::new(
                            self.int_response_threshold_bytes,
                            base_rtt_ns,
                        )
                    }),
                    cc,
                    base_rtt_ns,
                    mtu,
                    message_bytes: self.message_bytes,
                    depth: self.depth,
                    ecn: (cc == CcMode::Dcqcn).then_some(netsim::switch::EcnConfig {
                        kmin: self.buffer_bytes / 10,
                        kmax: self.buffer_bytes / 2,
                        pmax: 0.2,
                    }),
                    name: format!("incast{k}"),
                    mbufs,
                    tap: self
                        .tap
                        .as_ref()
                        .map(|p| PathBuf::from(format!("{}.{name}", p.display()))),
                    stats: None,
                },
            ));
        }
        Ok(Plan::Incast {
            runs,
            seconds: self.seconds,
        })
    }
}
