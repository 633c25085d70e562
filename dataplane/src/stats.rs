//! Counters of a running testbed, per port and per QP, as a JSON snapshot
//! the daemon rewrites atomically (`--stats FILE`) and `dataplane stats
//! FILE` prints while it runs.

use std::fmt::Write as _;
use std::path::Path;

use nic::Nic;
use serde::{Deserialize, Serialize};
use transport::mr::Memory;
use transport::rc::Qpn;

use crate::dpdk::PortStats;
use crate::host_port::{link, HostPort};

/// Why counters could not be read, naming the file or socket.
#[derive(Debug, thiserror::Error)]
pub enum StatsError {
    #[error("{path}: {source}")]
    Io {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a stats snapshot: {why}")]
    NotSnapshot {
        path: std::path::PathBuf,
        why: String,
    },
    /// The daemon on the socket answered with an error or not at all.
    #[error("{path}: {why}")]
    Daemon {
        path: std::path::PathBuf,
        why: String,
    },
}

/// One port, the pipeline and the engine behind it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PortEntry {
    pub host: usize,
    /// Its QP shard (0 unless the device's QPs are sharded over several
    /// engines), and what its port passed between the shards.
    #[serde(default)]
    pub qp_shard: u32,
    #[serde(default)]
    pub steer: crate::shard_port::SteerCounters,
    pub port: u16,
    /// The driver's counters.
    #[serde(flatten)]
    pub stats: PortStats,
    /// Frames the engine refused (all wire-codec reasons, ICRC included).
    pub wire_drops: u64,
    pub icrc_drops: u64,
    pub unknown_qp: u64,
    pub wrong_state: u64,
    /// Frames of another transport service than their QP's.
    #[serde(default)]
    pub wrong_service: u64,
    /// Frames the pipeline lost for want of a buffer.
    #[serde(default)]
    pub tx_no_buffer: u64,
    /// Frames the NIC addressed to itself and received without the port
    /// (local loopback).
    #[serde(default)]
    pub looped: u64,
    /// ARP frames received and sent; frames dropped while their
    /// destination's MAC was not resolved.
    #[serde(default)]
    pub arp_rx: u64,
    #[serde(default)]
    pub arp_tx: u64,
    #[serde(default)]
    pub tx_unresolved: u64,
    /// Frames held while ARP asked for their destination, sent after.
    #[serde(default)]
    pub tx_held: u64,
    /// QP1: MADs received, sent, dropped, and what the agents did.
    #[serde(default)]
    pub gsi: GsiEntry,
    /// The connection manager's counters and connections.
    #[serde(default)]
    pub cm: CmEntry,
    /// The rdma_cm sessions on the device's CM.
    #[serde(default)]
    pub rdma_cm: RdmaCmEntry,
    /// Frames whose payload was sent from the application's memory where
    /// it lies (zero-copy TX), and those copied for want of an mbuf.
    #[serde(default)]
    pub tx_zero_copy: u64,
    #[serde(default)]
    pub tx_zero_copy_fallback: u64,
    /// PFC frames the NIC received (PAUSE, RESUME of its priority; other
    /// priorities' and malformed ones) and the time its TX was held.
    #[serde(default)]
    pub pfc: PfcEntry,
    /// What the port's fault injector did (all zero without faults).
    #[serde(default)]
    pub faults: FaultEntry,
    /// The non-zero wire drops by reason (`not_ipv4` for IPv6 and other
    /// EtherTypes, `not_roce` for UDP to other ports, ...).
    #[serde(default)]
    pub wire_drop_reasons: Vec<(String, u64)>,
    /// Every QP's counters summed, closed QPs included.
    #[serde(default)]
    pub qp_totals: QpTotalsEntry,
}

/// A NIC's PFC counters (all zero when no PFC frame came).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PfcEntry {
    pub pause_rx: u64,
    pub resume_rx: u64,
    pub other_rx: u64,
    pub bad: u64,
    pub paused_ns: u64,
}

/// The engine's QP counters summed over all QPs it ever had.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct QpTotalsEntry {
    pub tx_packets: u64,
    pub rx_packets: u64,
    pub retransmitted: u64,
    pub timeouts: u64,
    pub duplicates: u64,
    pub out_of_order: u64,
    pub naks_sent: [u64; 4],
    pub naks_received: [u64; 4],
    pub rnr_naks_sent: u64,
    pub rnr_naks_received: u64,
    pub read_replays: u64,
    pub ignored_responses: u64,
    pub cnps_sent: u64,
    pub cnps_received: u64,
    /// Authenticated feedback refused by keyed QPs: a bad MAC or token,
    /// a replay, none at all (the peer holds no key).
    #[serde(default)]
    pub feedback_forged: u64,
    #[serde(default)]
    pub feedback_replayed: u64,
    #[serde(default)]
    pub feedback_unkeyed: u64,
    /// UC packets dropped with their message; UD datagrams dropped for
    /// a wrong Q_Key, no receive WQE, a payload over the MTU; UD
    /// datagrams whose address handle went before they were sent.
    #[serde(default)]
    pub uc_dropped: u64,
    #[serde(default)]
    pub qkey_violations: u64,
    #[serde(default)]
    pub datagrams_no_wqe: u64,
    #[serde(default)]
    pub datagrams_too_long: u64,
    #[serde(default)]
    pub datagrams_unaddressed: u64,
    /// UD congestion control towards our own NICs: samples sent, given
    /// up, echoes taken, refused (stale); echoes this host sent for
    /// others' samples, and dropped for a full queue.
    #[serde(default)]
    pub ud_samples: u64,
    #[serde(default)]
    pub ud_samples_lost: u64,
    #[serde(default)]
    pub ud_echoes_taken: u64,
    #[serde(default)]
    pub ud_echoes_stale: u64,
    #[serde(default)]
    pub ud_echoes_sent: u64,
    #[serde(default)]
    pub ud_echoes_dropped: u64,
}

/// QP1's counters and its management agents' (`transport::mad`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct GsiEntry {
    pub rx_mads: u64,
    pub tx_mads: u64,
    /// Dropped by QP1: not a UD SEND_ONLY, bad P_Key, bad Q_Key, not
    /// 256 bytes, the agents' queue full; refused: the send queue full.
    pub not_ud_send: u64,
    pub bad_pkey: u64,
    pub bad_qkey: u64,
    pub bad_length: u64,
    pub rx_overflow: u64,
    pub tx_overflow: u64,
    /// The agents: requests and responses taken, Gets and Sets answered
    /// unsupported; dropped: bad base version, subnet management, a CM
    /// MAD that is not a Send, other unmatched requests, stray responses.
    pub requests: u64,
    pub responses: u64,
    pub answered_unsupported: u64,
    pub bad_base_version: u64,
    pub subnet_mgmt: u64,
    pub cm_method: u64,
    pub unmatched: u64,
    pub stray_responses: u64,
}

impl GsiEntry {
    /// QP1's and the agents' counters.
    pub fn of(g: &transport::rc::GsiCounters, m: &transport::mad::MadCounters) -> GsiEntry {
        GsiEntry {
            rx_mads: g.rx_mads,
            tx_mads: g.tx_mads,
            not_ud_send: g.not_ud_send,
            bad_pkey: g.bad_pkey,
            bad_qkey: g.bad_qkey,
            bad_length: g.bad_length,
            rx_overflow: g.rx_overflow,
            tx_overflow: g.tx_overflow,
            requests: m.requests,
            responses: m.responses,
            answered_unsupported: m.answered_unsupported,
            bad_base_version: m.bad_base_version,
            subnet_mgmt: m.subnet_mgmt,
            cm_method: m.cm_method,
            unmatched: m.unmatched,
            stray_responses: m.stray_responses,
        }
    }
}

/// The connection manager's counters (`transport::cm::CmCounters`) and
/// the connections it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CmEntry {
    pub connections: u64,
    pub received: u64,
    pub sent: u64,
    pub retransmitted: u64,
    pub malformed: u64,
    pub unsupported: u64,
    pub unmatched: u64,
    pub duplicates: u64,
    pub stale: u64,
    pub no_listener: u64,
    pub rejects_sent: u64,
    pub rejects_received: u64,
    pub timeouts: u64,
}

impl CmEntry {
    pub fn of(c: &transport::cm::CmCounters, connections: usize) -> CmEntry {
        CmEntry {
            connections: connections as u64,
            received: c.received,
            sent: c.sent,
            retransmitted: c.retransmitted,
            malformed: c.malformed,
            unsupported: c.unsupported,
            unmatched: c.unmatched,
            duplicates: c.duplicates,
            stale: c.stale,
            no_listener: c.no_listener,
            rejects_sent: c.rejects_sent,
            rejects_received: c.rejects_received,
            timeouts: c.timeouts,
        }
    }
}

/// A device's rdma_cm sessions (`librdmacm.so.1`'s) and what they did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RdmaCmEntry {
    pub sessions: u64,
    pub ids: u64,
    pub events: u64,
    /// CM events for ids destroyed meanwhile.
    pub events_unclaimed: u64,
    pub addr_resolved: u64,
    pub addr_errors: u64,
    /// Connection requests the listener's checks refused (REJ).
    pub requests_refused: u64,
    /// Connections that agreed with their peer on our telemetry.
    #[serde(default)]
    pub telemetry_negotiated: u64,
}

/// The fault injector's counters, by reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct FaultEntry {
    pub frames: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub reordered: u64,
    pub corrupted: u64,
}

/// One QP.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QpEntry {
    pub host: usize,
    pub qpn: Qpn,
    pub state: String,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub retransmitted: u64,
    pub naks_sent: [u64; 4],
    pub naks_received: [u64; 4],
    pub timeouts: u64,
    pub duplicates: u64,
    pub out_of_order: u64,
    pub icrc_drops: u64,
    pub window_bytes: u64,
    pub rate_bps: u64,
    pub cc: String,
    /// Feedback refused by a keyed QP: bad MAC or token, replayed.
    #[serde(default)]
    pub feedback_forged: u64,
    #[serde(default)]
    pub feedback_replayed: u64,
    /// Feedback without any MAC on a keyed QP (the peer has no key).
    #[serde(default)]
    pub feedback_unkeyed: u64,
}

/// One egress port of the software INT switch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SwitchPortEntry {
    pub port: usize,
    pub qlen: u64,
    pub max_qlen: u64,
    pub enqueued: u64,
    pub dropped: u64,
    pub ecn_marked: u64,
    pub tx_packets: u64,
    pub tlm_stamped: u64,
    /// PFC frames this port sent upstream (PAUSE with refreshes, RESUME).
    #[serde(default)]
    pub pause_tx: u64,
    #[serde(default)]
    pub resume_tx: u64,
}

/// Everything at one instant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Snapshot {
    /// Nanoseconds since the testbed started.
    pub at_ns: u64,
    pub ports: Vec<PortEntry>,
    pub qps: Vec<QpEntry>,
    /// QPs left out of `qps` (a reply over the control socket lists at
    /// most [`Snapshot::LISTED_QPS`]; the hosts' totals count them all).
    #[serde(default)]
    pub qps_omitted: u64,
    #[serde(default)]
    pub switch_ports: Vec<SwitchPortEntry>,
    /// The application service's counters, when the daemon serves apps.
    #[serde(default)]
    pub service: Option<crate::service::ServiceCounters>,
    /// Each dataplane lcore's loop: time working, spinning and sleeping,
    /// wake-ups by cause, wake-up latency.
    #[serde(default)]
    pub lcores: Vec<crate::service::sleep::LcoreCounters>,
}

impl PortEntry {
    /// How tables name it: its host, or `host.k` for a device's QP shard
    /// k > 0.
    pub fn label(&self) -> String {
        match self.qp_shard {
            0 => self.host.to_string(),
            k => format!("{}.{k}", self.host),
        }
    }
}

impl Snapshot {
    /// One snapshot of the parts each dataplane lcore took of its own
    /// hosts: ports and QPs in host order, service counters summed, the
    /// latest time.
    pub fn merge(parts: Vec<Snapshot>) -> Snapshot {
        let mut all = Snapshot::default();
        for p in parts {
            all.at_ns = all.at_ns.max(p.at_ns);
            all.ports.extend(p.ports);
            all.qps.extend(p.qps);
            all.qps_omitted += p.qps_omitted;
            all.switch_ports.extend(p.switch_ports);
            if let Some(c) = p.service {
                all.service.get_or_insert_with(Default::default).add(&c);
            }
            all.lcores.extend(p.lcores);
        }
        all.lcores.sort_by_key(|l| l.lcore);
        all.ports.sort_by_key(|e| (e.host, e.qp_shard));
        all.qps.sort_by_key(|e| (e.host, e.qpn));
        all
    }

    /// QPs a snapshot sent over the control socket lists, so that the
    /// reply stays well within a message's limit (up to ~740 bytes of
    /// JSON each; `shm::proto::MAX_MESSAGE` is 1 MiB).
    pub const LISTED_QPS: usize = 512;

    /// The JSON of a reply over the control socket: at most
    /// [`Snapshot::LISTED_QPS`] QPs listed ([`Snapshot::limit_qps`]).
    pub fn listed_json(mut self) -> serde_json::Result<String> {
        self.limit_qps(Self::LISTED_QPS);
        serde_json::to_string(&self)
    }

    /// Keeps the first `max` QPs (in host and QPN order) and counts the
    /// rest in `qps_omitted`.
    pub fn limit_qps(&mut self, max: usize) {
        self.qps.sort_by_key(|e| (e.host, e.qpn));
        if self.qps.len() > max {
            self.qps_omitted += (self.qps.len() - max) as u64;
            self.qps.truncate(max);
        }
    }

    /// Adds a host: its port's counters, its pipeline's and fault
    /// injector's, its engine's and its QPs'.
    pub fn add_nic<M: Memory>(&mut self, host: usize, nic: &Nic<HostPort, M>, qpns: &[Qpn]) {
        let e = nic.engine();
        let c = e.counters();
        let dev = link(nic.port()).stats();
        let f = nic.port().inner().counters();
        let steer = match link(nic.port()) {
            crate::host_port::DpdkLink::Shard(s) => *s.counters(),
            _ => Default::default(),
        };
        self.ports.push(PortEntry {
            host,
            qp_shard: e.config().qpns.shard(),
            steer,
            port: dev.map_or(u16::MAX, |p| p.0),
            stats: dev.map(|p| p.1).unwrap_or_default(),
            wire_drops: c.wire_drops.iter().sum(),
            icrc_drops: c.icrc_drops(),
            unknown_qp: c.unknown_qp,
            wrong_state: c.wrong_state,
            wrong_service: c.wrong_service,
            tx_no_buffer: nic.counters().tx_no_buffer + nic.counters().tx_buffer_too_small,
            // A QP shard's frames to its own device go through the port.
            looped: nic.counters().looped_frames + steer.looped,
            arp_rx: nic.counters().arp_rx,
            arp_tx: nic.counters().arp_tx,
            tx_unresolved: nic.counters().tx_unresolved,
            tx_held: nic.counters().tx_held,
            gsi: GsiEntry::of(&e.gsi_counters(), &Default::default()),
            cm: CmEntry::default(),
            rdma_cm: RdmaCmEntry::default(),
            tx_zero_copy: nic.counters().tx_zero_copy,
            tx_zero_copy_fallback: nic.counters().tx_zero_copy_fallback,
            pfc: PfcEntry {
                pause_rx: nic.counters().pfc_pause_rx,
                resume_rx: nic.counters().pfc_resume_rx,
                other_rx: nic.counters().pfc_other_rx,
                bad: nic.counters().pfc_bad,
                paused_ns: nic.pause().paused_ns(self.at_ns),
            },
            faults: FaultEntry {
                frames: f.frames,
                lost: f.lost,
                duplicated: f.duplicated,
                reordered: f.reordered,
                corrupted: f.corrupted,
            },
            wire_drop_reasons: transport::wire::ErrorKind::ALL
                .iter()
                .filter(|k| c.wire_drops[k.index()] > 0)
                .map(|k| (k.name().to_string(), c.wire_drops[k.index()]))
                .collect(),
            qp_totals: {
                let t = e.qp_totals();
                QpTotalsEntry {
                    tx_packets: t.tx_packets,
                    rx_packets: t.rx_packets,
                    retransmitted: t.retransmitted,
                    timeouts: t.timeouts,
                    duplicates: t.duplicates,
                    out_of_order: t.out_of_order,
                    naks_sent: t.naks_sent,
                    naks_received: t.naks_received,
                    rnr_naks_sent: t.rnr_naks_sent,
                    rnr_naks_received: t.rnr_naks_received,
                    read_replays: t.read_replays,
                    ignored_responses: t.ignored_responses,
                    cnps_sent: t.cnps_sent,
                    cnps_received: t.cnps_received,
                    feedback_forged: t.feedback_forged,
                    feedback_replayed: t.feedback_replayed,
                    feedback_unkeyed: t.feedback_unkeyed,
                    uc_dropped: t.uc_dropped,
                    qkey_violations: t.qkey_violations,
                    datagrams_no_wqe: t.datagrams_no_wqe,
                    datagrams_too_long: t.datagrams_too_long,
                    datagrams_unaddressed: t.datagrams_unaddressed,
                    ud_samples: t.ud_samples,
                    ud_samples_lost: t.ud_samples_lost,
                    ud_echoes_taken: t.ud_echoes_taken,
                    ud_echoes_stale: t.ud_echoes_stale,
                    ud_echoes_sent: t.ud_echoes_sent,
                    ud_echoes_dropped: t.ud_echoes_dropped,
                }
            },
        });
        let cc = e.config().cc.name();
        for &q in qpns {
            let (Ok(k), Ok(state), Ok((w, r))) = (e.qp_counters(q), e.qp_state(q), e.qp_cc(q))
            else {
                continue;
            };
            self.qps.push(QpEntry {
                host,
                qpn: q,
                state: format!("{state:?}").to_uppercase(),
                tx_packets: k.tx_packets,
                tx_bytes: k.tx_bytes,
                rx_packets: k.rx_packets,
                rx_bytes: k.rx_bytes,
                retransmitted: k.retransmitted,
                naks_sent: k.naks_sent,
                naks_received: k.naks_received,
                timeouts: k.timeouts,
                duplicates: k.duplicates,
                out_of_order: k.out_of_order,
                icrc_drops: k.icrc_drops,
                window_bytes: w,
                rate_bps: r,
                cc: cc.into(),
                feedback_forged: k.feedback_forged,
                feedback_replayed: k.feedback_replayed,
                feedback_unkeyed: k.feedback_unkeyed,
            });
        }
    }

    /// Adds every egress port of a switch.
    pub fn add_switch<F: AsRef<[u8]> + AsMut<[u8]>>(&mut self, sw: &netsim::switch::Switch<F>) {
        for p in 0..sw.port_count() {
            let c = sw.counters(p);
            self.switch_ports.push(SwitchPortEntry {
                port: p,
                qlen: sw.qlen(p),
                max_qlen: c.max_qlen,
                enqueued: c.enqueued,
                dropped: c.dropped,
                ecn_marked: c.ecn_marked,
                tx_packets: c.tx_packets,
                tlm_stamped: c.tlm_stamped,
                pause_tx: c.pause_tx,
                resume_tx: c.resume_tx,
            });
        }
    }

    /// Writes the snapshot to `path` atomically (a temporary file renamed
    /// over it), so a reader never sees half a file.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = path.with_extension("tmp");
        let text = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, path)
    }

    pub fn read(path: &Path) -> Result<Snapshot, StatsError> {
        let text = std::fs::read_to_string(path).map_err(|source| StatsError::Io {
            path: path.to_owned(),
            source,
        })?;
        serde_json::from_str(&text).map_err(|e| StatsError::NotSnapshot {
            path: path.to_owned(),
            why: e.to_string(),
        })
    }

    /// The table `dataplane stats` prints.
    pub fn table(&self) -> String {
        let mut s = format!("at {:.3} ms\n", self.at_ns as f64 / 1e6);
        let _ = writeln!(
            s,
            "{:<5} {:>5} {:>10} {:>10} {:>12} {:>12} {:>7} {:>7} {:>10} {:>10} {:>10}",
            "host",
            "port",
            "rx_pkts",
            "tx_pkts",
            "rx_bytes",
            "tx_bytes",
            "missed",
            "errors",
            "wire_drops",
            "icrc_drops",
            "looped"
        );
        for p in &self.ports {
            let host = p.label();
            let _ = writeln!(
                s,
                "{:<5} {:>5} {:>10} {:>10} {:>12} {:>12} {:>7} {:>7} {:>10} {:>10} {:>10}",
                host,
                p.port,
                p.stats.ipackets,
                p.stats.opackets,
                p.stats.ibytes,
                p.stats.obytes,
                p.stats.imissed,
                p.stats.ierrors + p.stats.oerrors,
                p.wire_drops,
                p.icrc_drops,
                p.looped
            );
        }
        for p in &self.ports {
            let host = p.label();
            if p.arp_rx + p.arp_tx + p.tx_unresolved > 0 {
                let _ = writeln!(
                    s,
                    "host {} arp: rx {} tx {}; frames held for a neighbour's MAC and sent {}, dropped awaiting one {}",
                    host, p.arp_rx, p.arp_tx, p.tx_held, p.tx_unresolved
                );
            }
            let c = &p.pfc;
            if c.pause_rx + c.resume_rx + c.other_rx + c.bad > 0 {
                let _ = writeln!(
                    s,
                    "host {} pfc: pause {} resume {} other priorities {} malformed {}; tx held {:.3} ms",
                    host,
                    c.pause_rx,
                    c.resume_rx,
                    c.other_rx,
                    c.bad,
                    c.paused_ns as f64 / 1e6
                );
            }
            if p.tx_zero_copy + p.tx_zero_copy_fallback > 0 {
                let _ = writeln!(
                    s,
                    "host {} zero-copy TX: {} frames sent from the application's memory, {} copied (no mbuf)",
                    host, p.tx_zero_copy, p.tx_zero_copy_fallback
                );
            }
            let st = &p.steer;
            if p.qp_shard > 0 || st.passed + st.taken + st.looped > 0 {
                let _ = writeln!(
                    s,
                    "host {} steering: frames passed to their QP's shard {}, sent to its own device {}, taken from its inbox {}, ARP/PFC copied {}; waited for a full inbox {}; copies not made for want of a buffer {}",
                    host, st.passed, st.looped, st.taken, st.copied, st.waited_full, st.copy_no_buffer
                );
            }
            let (f, d) = (
                &p.faults,
                p.stats.rx_bad_checksum + p.stats.rx_unjoinable + p.tx_no_buffer,
            );
            if f.frames > 0 || d > 0 {
                let _ = writeln!(
                    s,
                    "host {} drops: faults lost {} duplicated {} reordered {} corrupted {} (of {} frames); rx_bad_ip_checksum {}; rx_unjoinable {}; tx_no_buffer {}; by the engine: wire_drops {} (icrc {}) unknown_qp {} wrong_state {} wrong_service {}",
                    host, f.lost, f.duplicated, f.reordered, f.corrupted, f.frames,
                    p.stats.rx_bad_checksum, p.stats.rx_unjoinable, p.tx_no_buffer, p.wire_drops, p.icrc_drops,
                    p.unknown_qp, p.wrong_state, p.wrong_service
                );
            }
            if !p.wire_drop_reasons.is_empty() {
                let reasons: Vec<String> = p
                    .wire_drop_reasons
                    .iter()
                    .map(|(k, n)| format!("{k} {n}"))
                    .collect();
                let _ = writeln!(
                    s,
                    "host {} wire drops by reason: {}",
                    host,
                    reasons.join(", ")
                );
            }
            let g = &p.gsi;
            if g.rx_mads + g.tx_mads + g.not_ud_send + g.bad_pkey + g.bad_qkey + g.bad_length > 0 {
                let _ = writeln!(
                    s,
                    "host {} QP1: MADs received {} sent {}; dropped: not a UD SEND {}, P_Key {}, Q_Key {}, not 256 B {}, queue full {} (send {}); agents: requests {} responses {}, answered unsupported {}; dropped: base version {}, subnet management {}, CM non-Send {}, unmatched {}, stray responses {}",
                    host, g.rx_mads, g.tx_mads, g.not_ud_send, g.bad_pkey, g.bad_qkey,
                    g.bad_length, g.rx_overflow, g.tx_overflow, g.requests, g.responses,
                    g.answered_unsupported, g.bad_base_version, g.subnet_mgmt, g.cm_method,
                    g.unmatched, g.stray_responses
                );
            }
            let c = &p.cm;
            if c.received + c.sent + c.connections > 0 {
                let _ = writeln!(
                    s,
                    "host {} CM: connections {}; MADs received {} sent {} (retransmitted {}); dropped: malformed {}, unsupported {}, for no connection or state {}, duplicates {}; REJ sent {} received {}: stale {}, no listener {}; requests unanswered {}",
                    host, c.connections, c.received, c.sent, c.retransmitted, c.malformed,
                    c.unsupported, c.unmatched, c.duplicates, c.rejects_sent,
                    c.rejects_received, c.stale, c.no_listener, c.timeouts
                );
            }
            let r = &p.rdma_cm;
            if r.sessions + r.events + r.addr_errors + r.requests_refused > 0 {
                let _ = writeln!(
                    s,
                    "host {} rdma_cm: sessions {}, ids {}; events {} (for destroyed ids {}); addresses resolved {}, unresolved {}; requests refused by a listener {}; connections with our telemetry {}",
                    host, r.sessions, r.ids, r.events, r.events_unclaimed, r.addr_resolved,
                    r.addr_errors, r.requests_refused, r.telemetry_negotiated
                );
            }
            let t = &p.qp_totals;
            if t.tx_packets + t.rx_packets > 0 {
                let _ = writeln!(
                    s,
                    "host {} all QPs (closed included): tx_pkts {} rx_pkts {} retx {} timeouts {} dups {} out_of_order {} naks_sent {:?} naks_rcvd {:?} rnr_naks sent {} rcvd {} read_replays {} ignored_responses {} cnps sent {} rcvd {}",
                    host, t.tx_packets, t.rx_packets, t.retransmitted, t.timeouts,
                    t.duplicates, t.out_of_order, t.naks_sent, t.naks_received,
                    t.rnr_naks_sent, t.rnr_naks_received, t.read_replays,
                    t.ignored_responses, t.cnps_sent, t.cnps_received
                );
                let unreliable = t.uc_dropped
                    + t.qkey_violations
                    + t.datagrams_no_wqe
                    + t.datagrams_too_long
                    + t.datagrams_unaddressed;
                if unreliable > 0 {
                    let _ = writeln!(
                        s,
                        "host {} dropped: UC packets {} (their messages cut); UD datagrams: wrong Q_Key {}, no receive WQE {}, over the MTU {}, address handle gone {}",
                        host, t.uc_dropped, t.qkey_violations, t.datagrams_no_wqe,
                        t.datagrams_too_long, t.datagrams_unaddressed
                    );
                }
                if t.ud_samples + t.ud_echoes_sent + t.ud_echoes_stale > 0 {
                    let _ = writeln!(
                        s,
                        "host {} UD telemetry: samples {} (echoed {}, given up {}), stale echoes {}; echoes sent {} (dropped {})",
                        host, t.ud_samples, t.ud_echoes_taken, t.ud_samples_lost,
                        t.ud_echoes_stale, t.ud_echoes_sent, t.ud_echoes_dropped
                    );
                }
                if t.feedback_forged + t.feedback_replayed + t.feedback_unkeyed > 0 {
                    let _ = writeln!(
                        s,
                        "host {} feedback refused: {} bad MAC or token, {} replayed, {} without a MAC",
                        host, t.feedback_forged, t.feedback_replayed, t.feedback_unkeyed
                    );
                }
            }
        }
        let _ = writeln!(
            s,
            "{:<5} {:>8} {:>6} {:>10} {:>10} {:>7} {:>14} {:>14} {:>6} {:>7} {:>10} {:>12}",
            "host",
            "qpn",
            "state",
            "tx_pkts",
            "rx_pkts",
            "retx",
            "naks_sent",
            "naks_rcvd",
            "tmo",
            "dups",
            "window",
            "rate_bps"
        );
        for q in &self.qps {
            let _ = writeln!(
                s,
                "{:<5} {:>#8x} {:>6} {:>10} {:>10} {:>7} {:>14} {:>14} {:>6} {:>7} {:>10} {:>12}",
                q.host,
                q.qpn,
                q.state,
                q.tx_packets,
                q.rx_packets,
                q.retransmitted,
                format!("{:?}", q.naks_sent),
                format!("{:?}", q.naks_received),
                q.timeouts,
                q.duplicates,
                if q.window_bytes == u64::MAX {
                    "-".to_string()
                } else {
                    q.window_bytes.to_string()
                },
                q.rate_bps
            );
        }
        if self.qps_omitted > 0 {
            let _ = writeln!(
                s,
                "({} more QPs not listed: a reply lists the first {}; the totals above count them)",
                self.qps_omitted,
                self.qps.len()
            );
        }
        if let Some(c) = &self.service {
            let _ = writeln!(
                s,
                "service: apps {} (opened {} closed {})  qps {}  mrs {}  cqs {}  requests {} (errors {})  wqes_posted {}  wqe_errors {}  sq_corrupt {}  cqes_delivered {}  cq_overruns {}  tx_alloc_failures {}  passes {} (idle {}, rests {})  busy {:.3} ms",
                c.apps, c.apps_opened, c.apps_closed, c.qps, c.mrs, c.cqs, c.requests,
                c.request_errors, c.wqes_posted, c.wqe_errors, c.sq_corrupt,
                c.cqes_delivered, c.cq_overruns, c.tx_alloc_failures, c.passes, c.idle_passes,
                c.rests,
                c.busy_ns as f64 / 1e6
            );
        }
        for l in &self.lcores {
            let ms = |ns: u64| ns as f64 / 1e6;
            let us = |ns: u64| ns as f64 / 1e3;
            let _ = writeln!(
                s,
                "lcore {} poll {}{}: working {:.3} ms  spinning {:.3} ms  sleeping {:.3} ms  sleeps {} (aborted {})  woken by bell {} nudge {} rx {} timer {} nap {} limit {}  core shared {}/{} looks",
                l.lcore,
                l.poll,
                if l.realtime {
                    format!(
                        " (real-time while it sleeps at once when idle; {} returns to normal after 2 ms of work)",
                        l.realtime_demotions
                    )
                } else {
                    String::new()
                },
                ms(l.working_ns),
                ms(l.spinning_ns),
                ms(l.sleeping_ns),
                l.sleeps,
                l.sleeps_aborted,
                l.woken_bell,
                l.woken_nudge,
                l.woken_rx,
                l.woken_timer,
                l.woken_nap,
                l.woken_limit,
                l.sharing_found,
                l.sharing_looks
            );
            if !l.bell_latency.is_empty() {
                let buckets: Vec<String> = l
                    .bell_latency
                    .iter()
                    .map(|(upto, n)| format!("<={:.0}us:{n}", us(*upto)))
                    .collect();
                let _ = writeln!(
                    s,
                    "lcore {} bell-to-running latency: p50 {:.1} us  p99 {:.1} us  max {:.1} us  [{}]",
                    l.lcore,
                    us(l.bell_latency_p50_ns),
                    us(l.bell_latency_p99_ns),
                    us(l.bell_latency_max_ns),
                    buckets.join(" ")
                );
            }
            if l.woken_timer > 0 {
                let _ = writeln!(
                    s,
                    "lcore {} timer lateness: p50 {:.1} us  p99 {:.1} us  max {:.1} us",
                    l.lcore,
                    us(l.timer_late_p50_ns),
                    us(l.timer_late_p99_ns),
                    us(l.timer_late_max_ns)
                );
            }
        }
        if !self.switch_ports.is_empty() {
            let _ = writeln!(
                s,
                "{:<6} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>12} {:>9} {:>10}",
                "swport",
                "qlen",
                "max_qlen",
                "enqueued",
                "dropped",
                "ecn",
                "tx_pkts",
                "tlm_stamped",
                "pause_tx",
                "resume_tx"
            );
            for p in &self.switch_ports {
                let _ = writeln!(
                    s,
                    "{:<6} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>12} {:>9} {:>10}",
                    p.port,
                    p.qlen,
                    p.max_qlen,
                    p.enqueued,
                    p.dropped,
                    p.ecn_marked,
                    p.tx_packets,
                    p.tlm_stamped,
                    p.pause_tx,
                    p.resume_tx
                );
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qp(host: usize, qpn: Qpn) -> QpEntry {
        QpEntry {
            host,
            qpn,
            state: "RTS".into(),
            tx_packets: u64::MAX,
            tx_bytes: u64::MAX,
            rx_packets: u64::MAX,
            rx_bytes: u64::MAX,
            retransmitted: u64::MAX,
            naks_sent: [u64::MAX; 4],
            naks_received: [u64::MAX; 4],
            timeouts: u64::MAX,
            duplicates: u64::MAX,
            out_of_order: u64::MAX,
            icrc_drops: u64::MAX,
            window_bytes: u64::MAX,
            rate_bps: u64::MAX,
            cc: "hpcc".into(),
            feedback_forged: u64::MAX,
            feedback_replayed: u64::MAX,
            feedback_unkeyed: u64::MAX,
        }
    }

    #[test]
    fn a_reply_lists_at_most_the_first_qps_and_counts_the_rest() {
        // Two lcores' parts of 10 000 QPs each, every counter at its
        // widest: the merged reply fits a control message.
        let part = |host: usize| {
            let mut s = Snapshot {
                qps: (0..10_000).rev().map(|q| qp(host, q)).collect(),
                ..Snapshot::default()
            };
            s.limit_qps(Snapshot::LISTED_QPS);
            s
        };
        let mut all = Snapshot::merge(vec![part(1), part(0)]);
        assert_eq!(all.qps_omitted, 2 * (10_000 - Snapshot::LISTED_QPS as u64));
        all.limit_qps(Snapshot::LISTED_QPS);
        assert_eq!(all.qps.len(), Snapshot::LISTED_QPS);
        assert_eq!(all.qps_omitted, 20_000 - Snapshot::LISTED_QPS as u64);
        // The lowest QPNs of the first host, in order.
        assert!(all
            .qps
            .iter()
            .enumerate()
            .all(|(i, e)| e.host == 0 && e.qpn == i as Qpn));
        let json = serde_json::to_string(&all).unwrap();
        assert!(
            json.len() < shm::proto::MAX_MESSAGE / 2,
            "{} bytes",
            json.len()
        );
        let table = all.table();
        assert!(
            table.contains("(19488 more QPs not listed: a reply lists the first 512;"),
            "{table}"
        );
    }

    #[test]
    fn snapshots_round_trip_through_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("not/yet/there/stats.json");
        let mut s = Snapshot {
            at_ns: 5,
            ..Snapshot::default()
        };
        s.ports.push(PortEntry {
            host: 0,
            qp_shard: 1,
            steer: crate::shard_port::SteerCounters {
                passed: 4,
                ..Default::default()
            },
            port: 1,
            stats: PortStats {
                ipackets: 2,
                opackets: 3,
                ..PortStats::default()
            },
            wire_drops: 1,
            icrc_drops: 1,
            unknown_qp: 0,
            wrong_state: 0,
            wrong_service: 0,
            tx_no_buffer: 0,
            looped: 0,
            arp_rx: 0,
            arp_tx: 0,
            tx_unresolved: 0,
            tx_held: 0,
            gsi: GsiEntry::default(),
            cm: CmEntry::default(),
            rdma_cm: RdmaCmEntry::default(),
            tx_zero_copy: 6,
            tx_zero_copy_fallback: 1,
            pfc: PfcEntry {
                pause_rx: 4,
                resume_rx: 3,
                paused_ns: 2_500_000,
                ..PfcEntry::default()
            },
            faults: FaultEntry::default(),
            wire_drop_reasons: vec![("bad_icrc".into(), 1)],
            qp_totals: QpTotalsEntry {
                tx_packets: 3,
                retransmitted: 1,
                feedback_unkeyed: 2,
                ..QpTotalsEntry::default()
            },
        });
        s.write(&path).unwrap();
        assert_eq!(Snapshot::read(&path).unwrap(), s);
        let table = s.table();
        assert!(table.contains("icrc_drops"));
        assert!(
            table.contains("wire drops by reason: bad_icrc 1"),
            "{table}"
        );
        assert!(
            table.contains("closed included): tx_pkts 3 rx_pkts 0 retx 1"),
            "{table}"
        );
        assert!(
            table.contains(
                "host 0.1 feedback refused: 0 bad MAC or token, 0 replayed, 2 without a MAC"
            ),
            "{table}"
        );
        assert!(
            table.contains("host 0.1 steering: frames passed to their QP's shard 4,"),
            "{table}"
        );
        assert!(
            table.contains(
                "host 0.1 pfc: pause 4 resume 3 other priorities 0 malformed 0; tx held 2.500 ms"
            ),
            "{table}"
        );
        std::fs::write(&path, "{").unwrap();
        assert!(Snapshot::read(&path)
            .unwrap_err()
            .to_string()
            .contains("not a stats snapshot"));
    }
}
