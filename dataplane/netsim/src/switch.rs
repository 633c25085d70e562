//! The software INT switch: per-egress-port FIFO queues drained at the
//! port's capacity B, a drop-tail buffer or a shared buffer with priority
//! flow control ([`crate::mmu`]), RED-style ECN marking for the DCQCN
//! baseline, telemetry stamping at dequeue per wire.md, and ECMP by a
//! seeded hash of the 5-tuple.
//!
//! Pure logic with time passed in: the simulator drives it in virtual time
//! with `Vec<u8>` frames, the DPDK dataplane on real ports with wall time
//! and mbufs (any `F: AsRef<[u8]> + AsMut<[u8]>`), so frames are queued
//! and stamped in place, never copied. It reads and writes frames through
//! the wire codec's in-flight view ([`RoceFrame`]) and no further.
//!
//! PFC: with [`Switch::enable_pfc`], frames of the lossless priority are
//! admitted by the shared buffer's rules per ingress port; when an
//! ingress port must be held, the switch asks its driver to send a PAUSE
//! out of that port ([`Switch::take_pfc`]), refreshes it before it runs
//! out ([`Switch::refresh_pauses`]) and sends a RESUME when the port's
//! bytes drain. A PAUSE received on a port ([`Switch::receive_pfc`])
//! stops that port's data queue for the time it names. Control frames
//! (ACKs, NAKs, CNPs) can be given a queue of their own, sent first and
//! never paused ([`Switch::set_control_first`]), as the HPCC authors'
//! switches do for DCQCN.
//!
//! QoS: with [`Switch::set_qos`], each port's data frames are sorted by
//! DSCP into classes scheduled by DWRR or strict priority
//! ([`crate::qos`]); a packet's telemetry then describes its own class
//! (the class's bytes queued and bytes sent, the port's rate), and a
//! stack with SOJOURN gets the packet's sojourn time instead of a queue
//! length. A PAUSE holds every data class of the port.

use std::collections::VecDeque;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use transport::wire::pfc::{priority_of_dscp, quanta_ns, PfcRepr};
use transport::wire::{HopRecord, MacAddr, Opcode, RoceFrame};

use nic::PauseState;

use crate::int_response::{IntResponder, IntResponseConfig, IntResponseCounters};
use crate::mmu::{IngressLimits, Mmu, PfcConfig};
use crate::qos::{ClassCounters, Classes, QosConfig, QosError, Queued};

/// ECN marking (DCQCN): probability rises linearly from 0 at `kmin` bytes
/// of queue to `pmax` at `kmax`, and is 1 above `kmax`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EcnConfig {
    pub kmin: u64,
    pub kmax: u64,
    pub pmax: f64,
}

impl EcnConfig {
    /// Thresholds times `factor` (a port `factor` times as fast).
    pub fn scaled(self, factor: f64) -> Self {
        EcnConfig {
            kmin: (self.kmin as f64 * factor) as u64,
            kmax: (self.kmax as f64 * factor) as u64,
            ..self
        }
    }
}

/// One egress port.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PortConfig {
    /// Capacity B, bits per second (stamped in units of 100 Mb/s).
    pub rate_bps: u64,
    /// Queue limit in bytes (drop-tail; with PFC, for frames not of the
    /// lossless priority only).
    pub buffer_bytes: u64,
    pub ecn: Option<EcnConfig>,
}

/// Counters of one port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PortCounters {
    pub enqueued: u64,
    pub dropped: u64,
    pub ecn_marked: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    /// Packets whose telemetry stack was full (nothing stamped).
    pub tlm_full: u64,
    pub tlm_stamped: u64,
    /// Frames whose telemetry this port rewrote into relative load (a
    /// domain's boundary: [`Switch::set_relative_telemetry`]).
    pub tlm_relative: u64,
    pub max_qlen: u64,
    /// PFC frames this port sent upstream: PAUSE (refreshes included)
    /// and RESUME.
    pub pause_tx: u64,
    pub resume_tx: u64,
    /// PFC frames this port received: PAUSE and RESUME of the lossless
    /// priority, and frames ignored (naming only other priorities, or
    /// any PFC frame while the switch has PFC off).
    pub pause_rx: u64,
    pub resume_rx: u64,
    pub pfc_ignored_rx: u64,
    /// Head-of-line delay PFC caused: over the frames this port sent,
    /// the time the port was paused while each waited in its queue (sum
    /// and largest).
    pub hol_ns: u64,
    pub hol_max_ns: u64,
    /// Frames that waited through a pause (those `hol_ns` sums over).
    pub hol_frames: u64,
}

/// What happened to an offered frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enqueue {
    Queued,
    /// The buffer was full; the frame is gone.
    Dropped,
}

/// Why PFC cannot be set up as asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SwitchError {
    #[error("PFC limits for {given} ports; the switch has {ports}")]
    PfcPorts { given: usize, ports: usize },
    #[error("PFC: a buffer of {buffer} bytes cannot hold the ports' headroom and reserves ({set_aside} bytes)")]
    PfcBuffer { buffer: u64, set_aside: u64 },
}

const NOT_LOSSLESS: u32 = u32::MAX;

#[derive(Debug)]
struct Port<F> {
    cfg: PortConfig,
    /// Data frames, by class (one class without QoS).
    data: Classes<F>,
    /// Control frames (with [`Switch::set_control_first`]) and PFC frames
    /// the driver chose to queue: sent first, never paused.
    control: VecDeque<F>,
    qlen: u64,
    /// Bytes sent before the packet being sent now (wire.md: tx_bytes).
    tx_bytes: u64,
    busy_until: u64,
    counters: PortCounters,
    pause: PauseState,
    /// As an ingress port whose upstream is paused: when to send PAUSE
    /// again.
    refresh_at: Option<u64>,
    /// A domain's boundary: every stack leaving here is made relative.
    relative_out: bool,
}

/// A switch: its ports, forwarding by destination IPv4 address, ECMP.
#[derive(Debug)]
pub struct Switch<F = Vec<u8>> {
    pub id: u8,
    /// Seed of this switch's ECMP hash.
    ecmp_seed: u32,
    ports: Vec<Port<F>>,
    rng: ChaCha8Rng,
    catch_up_ns: u64,
    mmu: Option<Mmu>,
    control_first: bool,
    /// PFC messages to send, by port.
    pfc_out: Vec<(usize, PfcRepr)>,
    int_resp: Option<IntResponder>,
    /// INT responses built, for the driver to route back to their senders.
    responses: VecDeque<Vec<u8>>,
    qos: Option<QosConfig>,
}

/// Time to put `bytes` on a link of `rate_bps`, in nanoseconds (rounded up).
pub fn serialization_ns(bytes: usize, rate_bps: u64) -> u64 {
    (bytes as u64 * 8 * 1_000_000_000).div_ceil(rate_bps.max(1))
}

/// The ECMP key of a frame: its IPv4 addresses and UDP ports (every
/// RoCEv2 frame is UDP to port 4791, so the protocol adds nothing); all
/// zero for a frame that is not RoCEv2.
pub fn flow_tuple(frame: &[u8]) -> [u32; 3] {
    RoceFrame::new_checked(frame).map_or([0; 3], |f| tuple_of(&f))
}

/// The ECMP key of a frame already viewed.
pub fn tuple_of<T: AsRef<[u8]>>(f: &RoceFrame<T>) -> [u32; 3] {
    [
        u32::from(f.src_ip()),
        u32::from(f.dst_ip()),
        u32::from(f.entropy()) | u32::from(transport::wire::udp::ROCE_PORT) << 16,
    ]
}

/// A seeded hash of an ECMP key: each word mixed in with a multiply and a
/// rotation, then a full avalanche (the "lowbias32" finalizer), so that
/// every bit of the addresses and ports moves the result and switches with
/// other seeds split the same flows differently (no polarization across
/// tiers).
pub fn ecmp_hash(key: [u32; 3], seed: u32) -> u32 {
    let mut h = seed ^ 0x9E37_79B9;
    for w in key {
        h = (h ^ w.wrapping_mul(0xCC9E_2D51)).rotate_left(13);
        h = h.wrapping_mul(5).wrapping_add(0xE654_6B64);
    }
    h ^= h >> 16;
    h = h.wrapping_mul(0x7FEB_352D);
    h ^= h >> 15;
    h = h.wrapping_mul(0x846C_A68B);
    h ^ (h >> 16)
}

/// What the switch's queues need to know of a frame: whether it is an
/// acknowledgement or a congestion notification (what a switch may send
/// ahead of data), its priority (the top bits of its DSCP) and its DSCP
/// (its QoS class).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FrameClass {
    pub control: bool,
    pub priority: u8,
    pub dscp: u8,
}

/// The class of a frame already viewed.
pub fn class_of<T: AsRef<[u8]>>(f: &RoceFrame<T>) -> FrameClass {
    let op = f.opcode_raw();
    FrameClass {
        control: [
            Opcode::Acknowledge as u8,
            Opcode::AtomicAcknowledge as u8,
            Opcode::Cnp as u8,
            Opcode::IntResponse as u8,
        ]
        .contains(&op),
        priority: priority_of_dscp(f.dscp()),
        dscp: f.dscp(),
    }
}

/// The class of a frame; priority 0, not control, when it is not RoCEv2.
fn classify(frame: &[u8]) -> FrameClass {
    RoceFrame::new_checked(frame).map_or(FrameClass::default(), |f| class_of(&f))
}

impl<F: AsRef<[u8]> + AsMut<[u8]>> Switch<F> {
    /// A switch with `ports`; `seed` drives ECN marking.
    pub fn new(id: u8, ports: &[PortConfig], seed: u64) -> Self {
        Switch {
            id,
            ecmp_seed: u32::from(id),
            ports: ports
                .iter()
                .map(|&cfg| Port {
                    cfg,
                    data: Classes::single(),
                    control: VecDeque::new(),
                    qlen: 0,
                    tx_bytes: 0,
                    busy_until: 0,
                    counters: PortCounters::default(),
                    pause: PauseState::default(),
                    refresh_at: None,
                    relative_out: false,
                })
                .collect(),
            rng: ChaCha8Rng::seed_from_u64(
                seed ^ u64::from(id).wrapping_mul(0x9E37_79B9_7F4A_7C15),
            ),
            catch_up_ns: 0,
            mmu: None,
            control_first: false,
            pfc_out: Vec::new(),
            int_resp: None,
            responses: VecDeque::new(),
            qos: None,
        }
    }

    /// Gives every port the data classes of `cfg` (before any frame is
    /// queued: queued frames would be dropped).
    pub fn set_qos(&mut self, cfg: QosConfig) -> Result<(), QosError> {
        cfg.check()?;
        for p in &mut self.ports {
            p.data = Classes::new(&cfg);
        }
        self.qos = Some(cfg);
        Ok(())
    }

    /// Makes `port` a boundary of the telemetry domain (HPCC++ 2023
    /// s9.1): every telemetry stack leaving through it, forward or echoed,
    /// is rewritten into relative load (docs/wire.md, "Relative
    /// telemetry"), after this switch's own record is stamped. A port out
    /// of range is ignored.
    pub fn set_relative_telemetry(&mut self, port: usize, on: bool) {
        if let Some(p) = self.ports.get_mut(port) {
            p.relative_out = on;
        }
    }

    /// Data classes per port (1 without QoS).
    pub fn class_count(&self) -> usize {
        self.qos.as_ref().map_or(1, |q| q.weights.len())
    }

    /// Forgets the sojourn times `port`'s classes recorded so far.
    pub fn reset_class_sojourn(&mut self, port: usize) {
        if let Some(p) = self.ports.get_mut(port) {
            p.data.reset_sojourn();
        }
    }

    /// Counters of `class` at `port` (sojourn times recorded with QoS on).
    pub fn class_counters(&self, port: usize, class: usize) -> Option<&ClassCounters> {
        let p = self.ports.get(port)?;
        (class < p.data.len()).then(|| p.data.counters(class))
    }

    /// Answers subscribed data packets that join a queue at or above
    /// `cfg.threshold_bytes` with an INT response (see
    /// [`crate::int_response`]); the driver takes them with
    /// [`Switch::pop_int_response`] and routes them like any frame.
    pub fn enable_int_responses(&mut self, cfg: IntResponseConfig) {
        self.int_resp = Some(IntResponder::new(cfg));
    }

    /// The next INT response to send back, oldest first.
    pub fn pop_int_response(&mut self) -> Option<Vec<u8>> {
        self.responses.pop_front()
    }

    /// INT response counters, when the switch sends them.
    pub fn int_response_counters(&self) -> Option<&IntResponseCounters> {
        self.int_resp.as_ref().map(IntResponder::counters)
    }

    /// Makes the switch lossless for `cfg.priority`: a shared buffer with
    /// PFC, `limits` per port (headroom and share, see
    /// [`IngressLimits::for_link`]).
    pub fn enable_pfc(
        &mut self,
        cfg: PfcConfig,
        limits: &[IngressLimits],
    ) -> Result<(), SwitchError> {
        if limits.len() != self.ports.len() {
            return Err(SwitchError::PfcPorts {
                given: limits.len(),
                ports: self.ports.len(),
            });
        }
        // A PAUSE of 0 quanta would be a RESUME.
        let cfg = PfcConfig {
            pause_quanta: cfg.pause_quanta.max(1),
            ..cfg
        };
        let mmu = Mmu::new(cfg, limits);
        if mmu.set_aside() >= cfg.buffer_bytes {
            return Err(SwitchError::PfcBuffer {
                buffer: cfg.buffer_bytes,
                set_aside: mmu.set_aside(),
            });
        }
        self.mmu = Some(mmu);
        Ok(())
    }

    /// The shared buffer, when PFC is on.
    pub fn mmu(&self) -> Option<&Mmu> {
        self.mmu.as_ref()
    }

    /// ACKs, NAKs and CNPs go to a queue of their own per port, sent
    /// before data and never paused (ns-3's ACK_HIGH_PRIO); off, they
    /// wait behind data like any frame.
    pub fn set_control_first(&mut self, on: bool) {
        self.control_first = on;
    }

    /// On wall time a poll loop visits a port late; a port that fell behind
    /// by at most `ns` sends its next frame as if on time (back to back with
    /// the previous one), so the port keeps its rate B. 0 (the default, for
    /// virtual time, where the port is visited exactly when it frees) sends
    /// every frame at `now`.
    pub fn set_catch_up(&mut self, ns: u64) {
        self.catch_up_ns = ns;
    }

    /// Seeds the ECMP hash (by default the switch id; the simulator gives
    /// each switch its node number, as ns-3 does).
    pub fn set_ecmp_seed(&mut self, seed: u32) {
        self.ecmp_seed = seed;
    }

    /// Chooses among equal-cost egress ports by the hash of the frame's
    /// 5-tuple with this switch's seed: a flow keeps its path, flows
    /// spread over the choices.
    pub fn ecmp(&self, frame: &[u8], choices: &[usize]) -> Option<usize> {
        self.ecmp_by_key(flow_tuple(frame), choices)
    }

    /// [`Switch::ecmp`] of a frame whose key ([`tuple_of`]) is known.
    pub fn ecmp_by_key(&self, key: [u32; 3], choices: &[usize]) -> Option<usize> {
        if choices.is_empty() {
            return None;
        }
        let h = ecmp_hash(key, self.ecmp_seed);
        Some(choices[h as usize % choices.len()])
    }

    pub fn port_count(&self) -> usize {
        self.ports.len()
    }

    pub fn counters(&self, port: usize) -> PortCounters {
        self.ports[port].counters
    }

    /// Bytes queued at `port` (not counting the packet on the wire).
    pub fn qlen(&self, port: usize) -> u64 {
        self.ports[port].qlen
    }

    pub fn port_config(&self, port: usize) -> &PortConfig {
        &self.ports[port].cfg
    }

    /// The MAC address PFC frames of `port` come from.
    pub fn port_mac(&self, port: usize) -> MacAddr {
        let p = (port as u16).to_be_bytes();
        MacAddr([0x02, 0xFC, 0, self.id, p[0], p[1]])
    }

    /// Offers a frame that came in on `ingress` (`None`: from nowhere the
    /// switch accounts, e.g. a test) to `port`'s queue. Frames of the
    /// lossless priority are admitted by the shared buffer when PFC is on
    /// (and may make the switch pause `ingress`); others are held to the
    /// port's drop-tail limit. ECN CE marking for ECN-capable data frames
    /// when configured.
    pub fn enqueue(&mut self, now: u64, ingress: Option<usize>, port: usize, frame: F) -> Enqueue {
        // Only PFC, the control queue and QoS look at what a frame is.
        let class = if self.mmu.is_some() || self.control_first || self.qos.is_some() {
            classify(frame.as_ref())
        } else {
            FrameClass::default()
        };
        self.enqueue_as(now, ingress, port, frame, class)
    }

    /// [`Switch::enqueue`] of a frame whose class ([`class_of`]) the caller
    /// has from its own view of it.
    pub fn enqueue_as(
        &mut self,
        now: u64,
        ingress: Option<usize>,
        port: usize,
        mut frame: F,
        class: FrameClass,
    ) -> Enqueue {
        let len = frame.as_ref().len() as u64;
        let FrameClass {
            control,
            priority,
            dscp,
        } = class;
        let qclass = self.qos.as_ref().map_or(0, |q| q.class_of(dscp));
        let lossless = self
            .mmu
            .as_ref()
            .filter(|m| m.config().priority == priority)
            .and(ingress.filter(|&i| i < self.ports.len()));
        let p = &mut self.ports[port];
        if control && self.control_first {
            if self.mmu.is_none() && p.qlen + len > p.cfg.buffer_bytes {
                p.counters.dropped += 1;
                return Enqueue::Dropped;
            }
            p.qlen += len;
            p.counters.max_qlen = p.counters.max_qlen.max(p.qlen);
            p.counters.enqueued += 1;
            p.control.push_back(frame);
            return Enqueue::Queued;
        }
        match (lossless, self.mmu.as_mut()) {
            (Some(i), Some(mmu)) => {
                if !mmu.admit(i, len) {
                    p.counters.dropped += 1;
                    return Enqueue::Dropped;
                }
            }
            _ => {
                if p.qlen + len > p.cfg.buffer_bytes {
                    p.counters.dropped += 1;
                    return Enqueue::Dropped;
                }
            }
        }
        if let Some(ecn) = p.cfg.ecn {
            let q = p.qlen;
            let prob = if q <= ecn.kmin {
                0.0
            } else if q >= ecn.kmax {
                1.0
            } else {
                ecn.pmax * (q - ecn.kmin) as f64 / (ecn.kmax - ecn.kmin) as f64
            };
            if prob > 0.0 && self.rng.gen_bool(prob.min(1.0)) && mark_ce(frame.as_mut()) {
                p.counters.ecn_marked += 1;
            }
        }
        p.qlen += len;
        p.counters.max_qlen = p.counters.max_qlen.max(p.qlen);
        p.counters.enqueued += 1;
        if let Some(r) = self.int_resp.as_mut() {
            // The packet's own class, counting the packet; a sojourn is
            // how long the class's head has waited.
            let qos = self.qos.is_some();
            let (tx, q) = if qos {
                (p.data.tx_bytes(qclass), p.data.bytes(qclass) + len)
            } else {
                (p.tx_bytes, p.qlen)
            };
            // Below the threshold nothing is sent: no record, no view of
            // the frame.
            if q >= r.config().threshold_bytes {
                let mut hop = hop_record(self.id, port, p, now, tx, q);
                if sojourn_wanted(frame.as_ref()) {
                    hop.qlen = saturate(p.data.head_wait(qclass, now));
                }
                if let Some(resp) = r.offer(now, frame.as_ref(), q, &hop) {
                    self.responses.push_back(resp);
                }
            }
        }
        p.data.push(
            qclass,
            Queued {
                frame,
                ingress: lossless.map_or(NOT_LOSSLESS, |i| i as u32),
                paused_clock: p.pause.paused_ns(now),
                arrived: now,
            },
        );
        if let Some(i) = lossless {
            if self.mmu.as_ref().is_some_and(|m| m.should_pause(i)) {
                self.send_pause(now, i);
            }
        }
        Enqueue::Queued
    }

    /// Asks for a PAUSE out of ingress `port` and remembers to refresh it.
    fn send_pause(&mut self, now: u64, port: usize) {
        let Some(mmu) = self.mmu.as_mut() else { return };
        mmu.set_paused(port, true);
        let cfg = *mmu.config();
        self.pfc_out
            .push((port, PfcRepr::one(cfg.priority, cfg.pause_quanta)));
        let p = &mut self.ports[port];
        p.counters.pause_tx += 1;
        let lasts = quanta_ns(cfg.pause_quanta, p.cfg.rate_bps);
        p.refresh_at = Some(now + (lasts / 2).max(1));
    }

    /// The PFC frames to send, by port: the driver puts each on the wire
    /// of that port (towards the upstream neighbour), ahead of its queue.
    pub fn take_pfc(&mut self) -> std::vec::Drain<'_, (usize, PfcRepr)> {
        self.pfc_out.drain(..)
    }

    /// Whether PFC frames wait to be taken.
    pub fn has_pfc(&self) -> bool {
        !self.pfc_out.is_empty()
    }

    /// The earliest time a PAUSE this switch sent must be refreshed.
    pub fn next_refresh(&self) -> Option<u64> {
        self.ports.iter().filter_map(|p| p.refresh_at).min()
    }

    /// Sends PAUSE again on every port still holding its upstream whose
    /// refresh time has come (before the last one runs out).
    pub fn refresh_pauses(&mut self, now: u64) {
        for port in 0..self.ports.len() {
            if self.ports[port].refresh_at.is_some_and(|t| t <= now) {
                self.ports[port].refresh_at = None;
                if self.mmu.as_ref().is_some_and(|m| m.is_paused(port)) {
                    self.send_pause(now, port);
                }
            }
        }
    }

    /// A PFC frame received on `port` from its downstream neighbour: a
    /// PAUSE of the lossless priority stops the port's data queue for the
    /// time it names (in quanta at the port's rate), a RESUME lets it go.
    /// Returns when the pause ends (the driver looks at the port again
    /// then), `None` when nothing changed. A switch with PFC off ignores
    /// PFC frames (and counts them).
    pub fn receive_pfc(&mut self, now: u64, port: usize, pfc: &PfcRepr) -> Option<u64> {
        let priority = self.mmu.as_ref().map(|m| m.config().priority);
        let p = self.ports.get_mut(port)?;
        let Some(quanta) = priority.and_then(|prio| pfc.quanta_for(prio)) else {
            p.counters.pfc_ignored_rx += 1;
            return None;
        };
        if quanta == 0 {
            p.counters.resume_rx += 1;
            p.pause.resume(now);
        } else {
            p.counters.pause_rx += 1;
            p.pause.pause(now, quanta_ns(quanta, p.cfg.rate_bps));
        }
        Some(p.pause.until().max(now))
    }

    /// Whether `port`'s data queue is held by PFC at `now`.
    pub fn is_paused(&self, now: u64, port: usize) -> bool {
        self.ports[port].pause.is_paused(now)
    }

    /// Time `port`'s data queue has been held by PFC up to `now`, and the
    /// longest single pause (a stuck receiver shows as one long pause).
    pub fn paused_ns(&self, now: u64, port: usize) -> (u64, u64) {
        let p = &self.ports[port].pause;
        (p.paused_ns(now), p.longest_ns(now))
    }

    /// Whether `port` can start sending at `now` (idle, and a control
    /// frame waits or a data frame and the port is not paused).
    pub fn can_send(&self, now: u64, port: usize) -> bool {
        let p = &self.ports[port];
        p.busy_until <= now
            && (!p.control.is_empty() || (!p.data.is_empty() && !p.pause.is_paused(now)))
    }

    /// When `port` finishes the frame it is sending.
    pub fn busy_until(&self, port: usize) -> u64 {
        self.ports[port].busy_until
    }

    /// Starts sending the head of `port`'s queue at `now` (control frames
    /// first): stamps its telemetry (ts, tx_bytes before it, qlen after
    /// this dequeue, B, switch and port ids) and returns it with the time
    /// its last bit leaves. `None` when nothing may go: the queue is
    /// empty, the port is busy, or its data is paused.
    pub fn dequeue(&mut self, now: u64, port: usize) -> Option<(F, u64)> {
        if !self.can_send(now, port) {
            return None;
        }
        let id = self.id;
        let catch_up = self.catch_up_ns;
        let qos = self.qos.is_some();
        let p = &mut self.ports[port];
        // Catching up never reaches back into a pause that held the port.
        let start = if now - p.busy_until <= catch_up {
            p.busy_until.max(p.pause.until().min(now))
        } else {
            now
        };
        let (mut frame, ingress, sojourn, class) = match p.control.pop_front() {
            Some(f) => (f, NOT_LOSSLESS, 0, None),
            None => {
                let (q, class) = p.data.pop(start)?;
                let hol = p.pause.paused_ns(now).saturating_sub(q.paused_clock);
                p.counters.hol_ns += hol;
                p.counters.hol_frames += u64::from(hol > 0);
                p.counters.hol_max_ns = p.counters.hol_max_ns.max(hol);
                let sojourn = start.saturating_sub(q.arrived);
                (q.frame, q.ingress, sojourn, Some(class))
            }
        };
        let len = frame.as_ref().len() as u64;
        p.qlen -= len;
        let (tx, q) = match class.filter(|_| qos) {
            // The class's bytes before this frame and left behind it.
            Some(c) => (p.data.tx_bytes(c) - len, p.data.bytes(c)),
            None => (p.tx_bytes, p.qlen),
        };
        let hop = hop_record(id, port, p, start, tx, q);
        match stamp(frame.as_mut(), &hop, sojourn) {
            Stamp::Stamped => p.counters.tlm_stamped += 1,
            Stamp::Full => p.counters.tlm_full += 1,
            Stamp::NoTelemetry => {}
        }
        if p.relative_out && make_relative(frame.as_mut()) {
            p.counters.tlm_relative += 1;
        }
        p.tx_bytes += len;
        p.counters.tx_packets += 1;
        p.counters.tx_bytes += len;
        p.busy_until = start + serialization_ns(len as usize, p.cfg.rate_bps);
        let done = p.busy_until;
        if ingress != NOT_LOSSLESS {
            self.release(ingress as usize, len);
        }
        Some((frame, done))
    }

    /// Gives a lossless frame's bytes back to its ingress port; resumes
    /// the port's upstream when it has drained enough.
    fn release(&mut self, ingress: usize, len: u64) {
        let Some(mmu) = self.mmu.as_mut() else { return };
        mmu.release(ingress, len);
        if mmu.should_resume(ingress) {
            mmu.set_paused(ingress, false);
            let priority = mmu.config().priority;
            self.pfc_out.push((ingress, PfcRepr::one(priority, 0)));
            let p = &mut self.ports[ingress];
            p.counters.resume_tx += 1;
            p.refresh_at = None;
        }
    }
}

/// Port `port`'s telemetry record at `ts`: `tx_bytes` sent and `qlen`
/// queued (the port's, or with QoS the packet's class's).
fn hop_record<F>(
    switch_id: u8,
    port: usize,
    p: &Port<F>,
    ts: u64,
    tx_bytes: u64,
    qlen: u64,
) -> HopRecord {
    HopRecord {
        ts_ns: ts as u32,
        tx_bytes: tx_bytes as u32,
        qlen: saturate(qlen),
        rate: (p.cfg.rate_bps / 100_000_000).min(u64::from(u16::MAX)) as u16,
        switch_id,
        port_id: port as u8,
    }
}

/// What stamping did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stamp {
    Stamped,
    /// nhop == maxhop: the stack was left alone.
    Full,
    NoTelemetry,
}

fn saturate(v: u64) -> u32 {
    v.min(u64::from(u32::MAX)) as u32
}

/// Whether a frame's stack asks for sojourn times.
fn sojourn_wanted(frame: &[u8]) -> bool {
    RoceFrame::new_checked(frame).is_ok_and(|f| f.tlm().is_some_and(|t| t.sojourn()))
}

/// Pushes `hop` into the frame's TLM block, if it has one with room and it
/// is not an echoed stack (ACKs, probe responses, CC_NOTIFY carry the
/// forward path's telemetry back and are left alone); when the stack asks
/// for sojourn times (wire.md, SOJOURN), the record's qlen is the frame's
/// `sojourn_ns` at this hop.
pub fn stamp(frame: &mut [u8], hop: &HopRecord, sojourn_ns: u64) -> Stamp {
    let Ok(mut f) = RoceFrame::new_checked(frame) else {
        return Stamp::NoTelemetry;
    };
    let Some(mut t) = f.tlm_mut() else {
        return Stamp::NoTelemetry;
    };
    if t.echo() {
        // A reflected stack describes the forward path; the way back must
        // not add its own hops to it.
        return Stamp::NoTelemetry;
    }
    let hop = if t.sojourn() {
        HopRecord {
            qlen: saturate(sojourn_ns),
            ..*hop
        }
    } else {
        *hop
    };
    if t.push_hop(&hop) {
        Stamp::Stamped
    } else {
        Stamp::Full
    }
}

/// Rewrites the frame's telemetry stack, if it has one, into relative
/// load (`Tlm::make_relative`); whether it had one.
pub fn make_relative(frame: &mut [u8]) -> bool {
    let Ok(mut f) = RoceFrame::new_checked(frame) else {
        return false;
    };
    let Some(mut t) = f.tlm_mut() else {
        return false;
    };
    t.make_relative();
    true
}

/// Sets ECN to CE on an ECN-capable RoCEv2 frame (and fixes the checksum).
pub fn mark_ce(frame: &mut [u8]) -> bool {
    RoceFrame::new_checked(frame).is_ok_and(|mut f| f.mark_ce())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mmu::{IngressLimits, PfcConfig};
    use std::net::Ipv4Addr;
    use transport::wire::{Packet, PacketRepr, RethRepr, TlmRepr};

    fn frame(maxhop: Option<u8>, payload: usize, sport: u16) -> Vec<u8> {
        frame_from(Ipv4Addr::new(10, 0, 0, 1), maxhop, payload, sport)
    }

    fn frame_from(src: Ipv4Addr, maxhop: Option<u8>, payload: usize, sport: u16) -> Vec<u8> {
        let mut r = PacketRepr::new(Opcode::RdmaWriteOnly, 0x12, 7);
        r.ip.src = src;
        r.ip.dst = Ipv4Addr::new(10, 0, 0, 2);
        r.ip.ecn = 2;
        r.udp.src_port = sport;
        r.reth = Some(RethRepr {
            va: 0,
            r_key: 1,
            dma_len: payload as u32,
        });
        r.tlm = maxhop.map(TlmRepr::empty);
        let mut b = vec![0u8; r.frame_len(payload)];
        r.emit(&vec![0u8; payload], &mut b).unwrap();
        b
    }

    fn port(rate_gbps: u64, buffer: u64) -> PortConfig {
        PortConfig {
            rate_bps: rate_gbps * 1_000_000_000,
            buffer_bytes: buffer,
            ecn: None,
        }
    }

    #[test]
    fn stamping_fields_match_hand_computed_values() {
        // 25 Gb/s port, three frames of 1,070 bytes queued at t = 0.
        let mut s = Switch::new(9, &[port(25, 1 << 20), port(25, 1 << 20)], 1);
        let f = frame(Some(2), 1000, 1);
        let len = f.len() as u64;
        assert_eq!(len, 14 + 20 + 8 + 12 + 4 + 2 * 16 + 16 + 1000 + 4);
        for _ in 0..3 {
            assert_eq!(s.enqueue(0, None, 1, f.clone()), Enqueue::Queued);
        }
        // First dequeue at t = 1,000 ns: nothing sent before, two frames
        // left behind it.
        let (a, done) = s.dequeue(1_000, 1).unwrap();
        let ser = (len * 8 * 1_000_000_000).div_ceil(25_000_000_000);
        assert_eq!(done, 1_000 + ser);
        assert!(
            s.dequeue(done - 1, 1).is_none(),
            "busy until the last bit leaves"
        );
        let (b, _) = s.dequeue(done, 1).unwrap();
        let ha = Packet::parse(&a).unwrap().repr.tlm.unwrap();
        let hb = Packet::parse(&b).unwrap().repr.tlm.unwrap();
        assert_eq!(ha.nhop, 1);
        assert_eq!(ha.path_id, 9);
        assert_eq!(
            ha.hops[0],
            HopRecord {
                ts_ns: 1_000,
                tx_bytes: 0,
                qlen: 2 * len as u32,
                rate: 250,
                switch_id: 9,
                port_id: 1
            }
        );
        assert_eq!(
            hb.hops[0],
            HopRecord {
                ts_ns: done as u32,
                tx_bytes: len as u32,
                qlen: len as u32,
                rate: 250,
                switch_id: 9,
                port_id: 1
            }
        );
        // The ICRC still holds: TLM bytes are masked.
        assert!(Packet::parse(&a).is_ok());
    }

    #[test]
    fn a_late_poll_catches_up_within_the_window() {
        let f = frame(None, 1000, 1);
        let ser = serialization_ns(f.len(), 1_000_000_000);
        let mut s = Switch::new(1, &[port(1, 1 << 20)], 1);
        s.set_catch_up(10 * ser);
        for _ in 0..4 {
            s.enqueue(0, None, 0, f.clone());
        }
        let (_, d1) = s.dequeue(0, 0).unwrap();
        assert_eq!(d1, ser);
        // Visited 2.5 frame times late: the backlog leaves back to back.
        let late = ser * 5 / 2;
        let (_, d2) = s.dequeue(late, 0).unwrap();
        assert_eq!(d2, 2 * ser);
        let (_, d3) = s.dequeue(late, 0).unwrap();
        assert_eq!(d3, 3 * ser);
        assert!(s.dequeue(late, 0).is_none(), "busy until 3 frame times");
        // Without catch-up (virtual time), the frame starts at the visit.
        let mut v = Switch::new(1, &[port(1, 1 << 20)], 1);
        v.enqueue(0, None, 0, f.clone());
        v.enqueue(0, None, 0, f.clone());
        v.dequeue(0, 0).unwrap();
        assert_eq!(v.dequeue(late, 0).unwrap().1, late + ser);
    }

    /// A frame of DSCP `dscp` whose stack asks for sojourn times or not.
    fn frame_qos(dscp: u8, sojourn: bool, payload: usize) -> Vec<u8> {
        let base = frame(Some(2), payload, 1);
        let mut p = Packet::parse(&base).unwrap();
        p.repr.ip.dscp = dscp;
        p.repr.tlm.as_mut().unwrap().sojourn = sojourn;
        let mut b = vec![0u8; p.repr.frame_len(payload)];
        p.repr.emit(&vec![0u8; payload], &mut b).unwrap();
        b
    }

    fn hop0(f: &[u8]) -> HopRecord {
        Packet::parse(f).unwrap().repr.tlm.unwrap().hops[0]
    }

    #[test]
    fn with_qos_classes_share_the_port_by_weight_and_telemetry_is_per_class() {
        let mut s = Switch::new(1, &[port(100, 1 << 24)], 1);
        s.set_qos(QosConfig::dwrr(&[3, 1]).map_dscp(26, 0).map_dscp(10, 1))
            .unwrap();
        let (a, b) = (frame_qos(26, false, 1000), frame_qos(10, false, 1000));
        let len = a.len() as u64;
        for _ in 0..400 {
            s.enqueue(0, None, 0, a.clone());
            s.enqueue(0, None, 0, b.clone());
        }
        let mut now = 0;
        let mut sent = [0u64; 2];
        let mut last = [HopRecord::default(); 2];
        for _ in 0..400 {
            let (f, done) = s.dequeue(now, 0).unwrap();
            now = done;
            let c = usize::from(Packet::parse(&f).unwrap().repr.ip.dscp == 10);
            let h = hop0(&f);
            // Each class's bytes sent before it, and its own queue.
            assert_eq!(u64::from(h.tx_bytes), sent[c] * len);
            assert_eq!(u64::from(h.qlen), (400 - sent[c] - 1) * len);
            sent[c] += 1;
            last[c] = h;
        }
        let share = sent[0] as f64 / 400.0;
        assert!((share - 0.75).abs() <= 0.05 * 0.75, "class 0 sent {sent:?}");
        assert_eq!(s.class_counters(0, 1).unwrap().tx_packets, sent[1]);
        assert!(s.class_counters(0, 2).is_none());
        assert!(
            last[1].qlen > last[0].qlen,
            "the lighter class's queue is longer"
        );
    }

    #[test]
    fn a_sojourn_stack_gets_egress_minus_ingress_time() {
        let mut s = Switch::new(1, &[port(100, 1 << 24)], 1);
        s.set_qos(QosConfig::dwrr(&[1])).unwrap();
        let f = frame_qos(0, true, 1000);
        s.enqueue(1_000, None, 0, f.clone());
        s.enqueue(1_500, None, 0, f.clone());
        let (x, done) = s.dequeue(4_000, 0).unwrap();
        let (y, _) = s.dequeue(done, 0).unwrap();
        assert_eq!(hop0(&x).qlen, 3_000);
        assert_eq!(u64::from(hop0(&y).qlen), done - 1_500);
        let h = s.class_counters(0, 0).unwrap().sojourn_ns.as_ref().unwrap();
        assert!(h.equivalent(h.max(), 3_000), "3 significant digits");
        // Without QoS the same stack still gets sojourn times.
        let mut plain = Switch::new(1, &[port(100, 1 << 24)], 1);
        plain.enqueue(0, None, 0, f);
        assert_eq!(hop0(&plain.dequeue(700, 0).unwrap().0).qlen, 700);
    }

    #[test]
    fn bad_qos_is_refused_by_name() {
        let mut s: Switch = Switch::new(1, &[port(100, 1 << 24)], 1);
        assert_eq!(
            s.set_qos(QosConfig::dwrr(&[2, 0])),
            Err(QosError::Weight { class: 1 })
        );
        assert_eq!(s.class_count(), 1);
    }

    #[test]
    fn a_full_stack_is_left_alone_and_counted() {
        let mut s = Switch::new(3, &[port(100, 1 << 20)], 1);
        let mut f = frame(Some(1), 10, 1);
        stamp(
            &mut f,
            &HopRecord {
                switch_id: 1,
                ..HopRecord::default()
            },
            0,
        );
        s.enqueue(0, None, 0, f.clone());
        let (out, _) = s.dequeue(0, 0).unwrap();
        assert_eq!(out, f, "unchanged");
        assert_eq!(s.counters(0).tlm_full, 1);
        // Frames without telemetry pass untouched, and so do echoed stacks.
        let g = frame(None, 10, 1);
        s.enqueue(0, None, 0, g.clone());
        assert_eq!(s.dequeue(10_000, 0).unwrap().0, g);
        let mut e = frame(Some(3), 10, 1);
        let mut v = RoceFrame::new_checked(&mut e[..]).unwrap();
        v.tlm_mut().unwrap().set_echo(true);
        assert_eq!(stamp(&mut e, &HopRecord::default(), 0), Stamp::NoTelemetry);
    }

    /// wire.md "Relative telemetry": a boundary port sends every stack,
    /// its own record included, as relative load; other ports do not.
    #[test]
    fn a_boundary_port_sends_relative_load_only() {
        let mut s = Switch::new(4, &[port(25, 1 << 20), port(25, 1 << 20)], 1);
        s.set_relative_telemetry(1, true);
        for p in [0, 1] {
            s.enqueue(0, None, p, frame(Some(2), 1000, 1));
            s.enqueue(0, None, p, frame(Some(2), 1000, 1));
        }
        let hop = |p: usize, t: u64, s: &mut Switch| {
            let (out, _) = s.dequeue(t, p).unwrap();
            Packet::parse(&out).unwrap().repr.tlm.unwrap().hops[0]
        };
        let (raw, rel) = (hop(0, 0, &mut s), hop(1, 0, &mut s));
        assert_eq!((raw.rate, raw.switch_id, raw.port_id), (250, 4, 0));
        assert_eq!(rel, raw.relative(false, false));
        assert_eq!((rel.rate, rel.switch_id, rel.port_id), (16000, 0, 0));
        let (raw2, rel2) = (hop(0, 1_000_000, &mut s), hop(1, 1_000_000, &mut s));
        assert!(raw2.qlen == 0 && rel2.qlen == 0);
        // 64 x the bytes sent: the same share of a port 64 x as fast.
        let k = 16000 / 250;
        let sent = u64::from(raw2.tx_bytes - raw.tx_bytes) * k;
        assert!(sent.abs_diff(u64::from(rel2.tx_bytes - rel.tx_bytes)) < 1024);
        assert_eq!(
            (s.counters(0).tlm_relative, s.counters(1).tlm_relative),
            (0, 2)
        );
    }

    #[test]
    fn timestamps_and_tx_bytes_wrap_mod_2_pow_32() {
        let mut s = Switch::new(1, &[port(100, 1 << 20)], 1);
        let f = frame(Some(1), 10, 1);
        s.enqueue(0, None, 0, f.clone());
        let t = (1u64 << 32) + 5;
        let (out, _) = s.dequeue(t, 0).unwrap();
        assert_eq!(
            Packet::parse(&out).unwrap().repr.tlm.unwrap().hops[0].ts_ns,
            5
        );
    }

    #[test]
    fn drop_tail_at_the_buffer_limit() {
        let f = frame(None, 1000, 1);
        let mut s = Switch::new(1, &[port(100, 2 * f.len() as u64 + 10)], 1);
        assert_eq!(s.enqueue(0, None, 0, f.clone()), Enqueue::Queued);
        assert_eq!(s.enqueue(0, None, 0, f.clone()), Enqueue::Queued);
        assert_eq!(s.enqueue(0, None, 0, f.clone()), Enqueue::Dropped);
        assert_eq!(s.counters(0).dropped, 1);
        assert_eq!(s.qlen(0), 2 * f.len() as u64);
    }

    #[test]
    fn ecn_marks_above_kmax_and_never_below_kmin() {
        let f = frame(None, 1000, 1);
        let ecn = EcnConfig {
            kmin: 5 * f.len() as u64,
            kmax: 10 * f.len() as u64,
            pmax: 0.2,
        };
        let mut s = Switch::new(
            1,
            &[PortConfig {
                ecn: Some(ecn),
                ..port(100, 1 << 30)
            }],
            1,
        );
        for _ in 0..6 {
            s.enqueue(0, None, 0, f.clone());
        }
        assert_eq!(
            s.counters(0).ecn_marked,
            0,
            "queue at most kmin when they arrived"
        );
        for _ in 0..100 {
            s.enqueue(0, None, 0, f.clone());
        }
        assert!(
            s.counters(0).ecn_marked >= 90,
            "{}",
            s.counters(0).ecn_marked
        );
        // Marked frames leave with CE and a valid IP checksum.
        let (mut t, mut marked) = (0, 0);
        while let Some((out, done)) = s.dequeue(t, 0) {
            marked += u64::from(Packet::parse(&out).unwrap().repr.ip.ecn == 3);
            t = done;
        }
        assert_eq!(marked, s.counters(0).ecn_marked);
    }

    #[test]
    fn ecn_thresholds_scale_with_the_port_rate() {
        let e = EcnConfig {
            kmin: 400_000,
            kmax: 1_600_000,
            pmax: 0.2,
        };
        assert_eq!(
            e.scaled(4.0),
            EcnConfig {
                kmin: 1_600_000,
                kmax: 6_400_000,
                pmax: 0.2
            }
        );
    }

    #[test]
    fn ecmp_keeps_a_flow_on_one_port_and_spreads_flows() {
        let s: Switch = Switch::new(1, &[port(100, 1 << 20)], 1);
        let ports = [2, 3, 4, 5];
        let a = frame(None, 10, 0xC001);
        assert_eq!(s.ecmp(&a, &ports), s.ecmp(&a, &ports));
        let used: std::collections::HashSet<usize> = (0..64u16)
            .map(|i| s.ecmp(&frame(None, 10, 0xC000 | i), &ports).unwrap())
            .collect();
        assert_eq!(used.len(), 4);
        assert_eq!(s.ecmp(&a, &[]), None);
    }

    #[test]
    fn ecmp_hashes_addresses_too_and_each_switch_its_own_way() {
        // One source port from 64 senders (QPNs reused alike): the source
        // addresses alone spread them.
        let from = |host: u8| frame_from(Ipv4Addr::new(10, 0, 0, host), None, 10, 0xC001);
        let ports = [0, 1, 2, 3];
        let a: Switch = Switch::new(1, &[port(100, 1 << 20)], 1);
        let mut b: Switch = Switch::new(2, &[port(100, 1 << 20)], 1);
        b.set_ecmp_seed(77);
        let pa: Vec<usize> = (1..=64)
            .map(|h| a.ecmp(&from(h), &ports).unwrap())
            .collect();
        let pb: Vec<usize> = (1..=64)
            .map(|h| b.ecmp(&from(h), &ports).unwrap())
            .collect();
        for p in ports {
            let n = pa.iter().filter(|&&x| x == p).count();
            assert!((8..=24).contains(&n), "port {p}: {n} of 64 flows");
        }
        // A second tier with another seed does not repeat the first's split.
        assert!(pa.iter().zip(&pb).filter(|(x, y)| x == y).count() < 32);
    }

    fn lossless(ports: usize, buffer: u64, headroom: u64) -> Switch {
        let mut s = Switch::new(4, &vec![port(100, 1 << 30); ports], 1);
        let limits = vec![
            IngressLimits {
                headroom_bytes: headroom,
                shift: 1
            };
            ports
        ];
        s.enable_pfc(PfcConfig::new(buffer), &limits).unwrap();
        s
    }

    /// A frame of priority 3 (DSCP 26), as the engine sends.
    fn data(payload: usize) -> Vec<u8> {
        let mut f = frame(None, payload, 7);
        f[15] = (26 << 2) | (f[15] & 3);
        let mut v = RoceFrame::new_checked(&mut f[..]).unwrap();
        // Keep the IPv4 checksum right: marking CE recomputes it.
        v.mark_ce();
        f
    }

    #[test]
    fn pfc_limits_must_name_every_port() {
        let mut s: Switch = Switch::new(1, &[port(100, 1 << 20); 3], 1);
        let l = IngressLimits {
            headroom_bytes: 1,
            shift: 1,
        };
        assert_eq!(
            s.enable_pfc(PfcConfig::new(1 << 20), &[l; 2]),
            Err(SwitchError::PfcPorts { given: 2, ports: 3 })
        );
        let big = IngressLimits {
            headroom_bytes: 400_000,
            shift: 1,
        };
        let e = s
            .enable_pfc(PfcConfig::new(1 << 20), &[big; 3])
            .unwrap_err();
        assert_eq!(
            e,
            SwitchError::PfcBuffer {
                buffer: 1 << 20,
                set_aside: 3 * (400_000 + 4096)
            }
        );
        assert!(e.to_string().contains("1048576"), "{e}");
        // Without PFC, PFC frames are ignored and counted.
        assert_eq!(s.receive_pfc(0, 1, &PfcRepr::one(3, 0xFFFF)), None);
        assert!(!s.is_paused(0, 1));
        assert_eq!(s.counters(1).pfc_ignored_rx, 1);
    }

    #[test]
    fn a_paused_port_sends_no_data_of_that_priority_until_the_pause_ends() {
        let mut s = lossless(2, 1 << 20, 1 << 16);
        s.set_control_first(true);
        let f = data(1000);
        for _ in 0..3 {
            s.enqueue(0, Some(0), 1, f.clone());
        }
        // 100 quanta at 100 Gb/s = 512 ns.
        let end = s.receive_pfc(1_000, 1, &PfcRepr::one(3, 100));
        assert_eq!(end, Some(1_512));
        assert!(s.is_paused(1_000, 1));
        assert!(s.dequeue(1_000, 1).is_none(), "paused");
        assert!(s.dequeue(1_511, 1).is_none(), "still paused");
        // A control frame still goes while data is held.
        let mut ack = frame(None, 0, 7);
        ack[14 + 20 + 8] = Opcode::Acknowledge as u8;
        assert!(classify(&ack).control);
        s.enqueue(1_100, Some(0), 1, ack.clone());
        let (out, _) = s.dequeue(1_100, 1).unwrap();
        assert_eq!(out, ack);
        // Other priorities' PAUSE frames do not hold it.
        assert_eq!(s.receive_pfc(1_200, 1, &PfcRepr::one(5, 0xFFFF)), None);
        assert_eq!(s.counters(1).pfc_ignored_rx, 1);
        // The pause runs out: data goes again.
        let (_, done) = s.dequeue(1_512, 1).unwrap();
        // A PAUSE then a RESUME: held, then free at once.
        s.receive_pfc(done, 1, &PfcRepr::one(3, 0xFFFF));
        assert!(s.dequeue(done, 1).is_none());
        s.receive_pfc(done + 50, 1, &PfcRepr::one(3, 0));
        assert!(s.dequeue(done + 50, 1).is_some());
        let c = s.counters(1);
        assert_eq!((c.pause_rx, c.resume_rx), (2, 1));
        // Time paused: 512 ns, then 50 ns; the longest single pause 512.
        assert_eq!(s.paused_ns(done + 1_000, 1), (562, 512));
        // The frames that waited through the pauses carry it as HOL delay.
        assert_eq!(c.hol_max_ns, 512 + 50);
    }

    #[test]
    fn an_ingress_over_its_share_is_paused_then_resumed_and_nothing_drops() {
        // Two ingress ports at 100G into one egress at 100G; the senders
        // stop the moment a PAUSE is sent and go on at the RESUME.
        let mut s = lossless(3, 256 * 1024, 16 * 1024);
        let f = data(1000);
        let ser = serialization_ns(f.len(), 100_000_000_000);
        let mut held = [false; 2];
        let (mut pauses, mut resumes) = (0, 0);
        let mut t = 0;
        let mut sent = 0u64;
        while t < 2_000_000 {
            for (i, h) in held.iter().enumerate() {
                if !h {
                    assert_eq!(s.enqueue(t, Some(i), 2, f.clone()), Enqueue::Queued);
                }
            }
            // The egress drains one frame per frame time: half the offer.
            if s.dequeue(t, 2).is_some() {
                sent += 1;
            }
            for (p, m) in s.take_pfc().collect::<Vec<_>>() {
                let q = m.quanta_for(3).unwrap();
                held[p] = q > 0;
                if q > 0 {
                    pauses += 1
                } else {
                    resumes += 1
                }
            }
            t += ser;
        }
        assert_eq!(s.counters(2).dropped, 0, "lossless");
        assert!(pauses >= 2 && resumes >= 2, "{pauses} {resumes}");
        assert!(sent > 1_000);
        // The buffer never held more than the pool allows.
        assert!(s.counters(2).max_qlen <= 256 * 1024);
    }

    #[test]
    fn a_pause_is_refreshed_while_the_port_must_stay_held() {
        let mut s = lossless(2, 128 * 1024, 32 * 1024);
        let f = data(1000);
        let mut t = 0;
        while !s.has_pfc() {
            s.enqueue(t, Some(0), 1, f.clone());
            t += 1;
        }
        let sent: Vec<_> = s.take_pfc().collect();
        assert_eq!(sent, vec![(0, PfcRepr::one(3, 0xFFFF))]);
        // Nothing drains (the egress is paused from downstream).
        s.receive_pfc(t, 1, &PfcRepr::one(3, 0xFFFF));
        let due = s.next_refresh().unwrap();
        assert_eq!(due, t - 1 + quanta_ns(0xFFFF, 100_000_000_000) / 2);
        s.refresh_pauses(due - 1);
        assert!(!s.has_pfc(), "not yet");
        s.refresh_pauses(due);
        assert_eq!(s.take_pfc().collect::<Vec<_>>(), sent, "again");
        assert_eq!(s.counters(0).pause_tx, 2);
    }

    #[test]
    fn without_pfc_the_buffer_is_drop_tail_per_port() {
        // The same overload without PFC drops (and sends no PFC).
        let f = data(1000);
        let mut s = Switch::new(1, &[port(100, 8 * f.len() as u64); 2], 1);
        for _ in 0..20 {
            s.enqueue(0, Some(0), 1, f.clone());
        }
        assert_eq!(s.counters(1).dropped, 12);
        assert!(!s.has_pfc());
    }
}
