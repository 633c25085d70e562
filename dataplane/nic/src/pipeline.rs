//! The one NIC pipeline: an RC engine on a frame port, moved by
//! [`Nic::poll`]. Every driver of the engine goes through it: the daemon's
//! lcores (run-to-completion and pipelined), the DPDK testbeds, the
//! simulator's hosts, `bench torture`, the tests and the fuzz target.
//! Outside `transport`, this is the only module that calls the engine's
//! receive, transmit and timer entry points.
//!
//! One pass, in the order of the HPCC++ drafts' NIC figure:
//!
//! 1. RX burst; each frame parsed and handled by the engine (a frame the
//!    engine refuses is counted there, by reason);
//! 2. timers due (retransmission, congestion control, probes);
//! 3. doorbells: the application side posts new work ([`Host::doorbells`]);
//! 4. the scheduler and TX pipe: frames built in port buffers, as many as
//!    the port takes now, then a TX burst (frames it refuses wait, in
//!    order, for the next pass);
//! 5. completions handed to the application side ([`Host::completion`]).
//!
//! A frame addressed to the NIC's own MAC (a QP connected to another QP of
//! the same device) does not go out: it comes back into this NIC's own RX
//! at the start of the next pass, as hardware NICs and rxe loop them back.
//! A NIC that is one of several engines of a device ([`Nic::as_shard`]:
//! QP shards on one link) sends such frames out through its port, which
//! brings each to the engine owning its QP.
//!
//! ARP is the pipeline's too: it answers requests for the NIC's own
//! address, learns its peers' MACs into the neighbour table, and resolves
//! frames the engine addressed to the zero MAC (a QP moved to RTR before
//! its peer's MAC was known): those wait for nothing; they are dropped and
//! counted while a request goes out, and RC's retransmission sends them
//! again once the table has the answer.
//!
//! Priority flow control is the pipeline's too: a PAUSE frame from the
//! link's far end naming the engine's priority (its DSCP's class bits)
//! holds the TX pipe, nothing is built or sent, until the time it names
//! runs out or a RESUME comes; timers still run.
//!
//! Nothing is lost silently: a frame that finds no buffer is built anyway
//! (so the engine moves on and recovers it like any loss) and counted.

use std::net::Ipv4Addr;
use transport::mr::Memory;
use transport::rc::{Apart, Cqe, Engine, TxFrame};
use transport::wire::arp::{self, ArpOp, ArpRepr};
use transport::wire::pfc::{self, PfcRepr};

use transport::wire::{EthernetFrame, Ipv4Packet, MacAddr};

use crate::neighbour::{NeighbourConfig, NeighbourTable, Resolution};
use crate::pfc::PauseState;

use crate::port::{Frame, FramePort};
use crate::stage::{FrameKey, Stage};

/// Longest headers the engine puts around a payload (Ethernet with an
/// 802.1Q tag, IPv4, UDP, BTH, RETH, a full TLM block, ICRC), rounded up.
pub const MAX_HEADERS: usize = 512;

/// Frames per RX and TX burst by default.
pub const BURST: usize = 32;

/// Frames held while their destinations are asked for by ARP, at most.
pub const HELD_FRAMES: usize = 16;
/// How long a frame is held at most: the neighbour table's three
/// requests a second apart.
pub const HELD_NS: u64 = 3_000_000_000;

/// The application side of a NIC: where new work comes from and where
/// completions go.
pub trait Host<M: Memory> {
    /// Posts new work into the engine (reads doorbells, SQ rings);
    /// returns whether anything was posted.
    fn doorbells(&mut self, _engine: &mut Engine<M>, _now: u64) -> bool {
        false
    }

    /// One completion of the engine.
    fn completion(&mut self, engine: &mut Engine<M>, cqe: Cqe);

    /// Whether the host wants [`Host::stamp`] called at every stage of
    /// every frame (a latency trace); asked once per burst.
    fn tracing(&self) -> bool {
        false
    }

    /// The frame `key` reached `stage` now (the host reads its clock).
    fn stamp(&mut self, _stage: Stage, _key: FrameKey) {}
}

/// Stamps every RoCEv2 frame of `frames` at `stage`.
fn stamp_all<M: Memory, F: AsRef<[u8]>>(host: &mut impl Host<M>, stage: Stage, frames: &[F]) {
    for f in frames {
        if let Some(k) = FrameKey::of(f.as_ref()) {
            host.stamp(stage, k);
        }
    }
}

/// A host that keeps completions for the caller to read.
#[derive(Debug, Default)]
pub struct Completions(pub Vec<Cqe>);

impl<M: Memory> Host<M> for Completions {
    fn completion(&mut self, _: &mut Engine<M>, cqe: Cqe) {
        self.0.push(cqe);
    }
}

/// What the pipeline counted (the engine counts what it refuses, by
/// reason, in its own counters).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NicCounters {
    pub rx_frames: u64,
    /// Frames the port took.
    pub tx_frames: u64,
    /// Frames lost because the port had no buffer for them.
    pub tx_no_buffer: u64,
    /// Frames lost because a port buffer was smaller than the longest
    /// frame (a misconfigured pool).
    pub tx_buffer_too_small: u64,
    /// Frames addressed to the NIC's own MAC, handed back to this NIC's
    /// RX instead of the port (local loopback; counted in `rx_frames`
    /// too when received, never in `tx_frames`).
    pub looped_frames: u64,
    /// ARP frames received on the device's VLAN (malformed ones in
    /// `arp_bad`; another VLAN's are the engine's `wrong_vlan` drops).
    pub arp_rx: u64,
    pub arp_bad: u64,
    /// ARP requests and replies sent.
    pub arp_tx: u64,
    /// Frames dropped because their destination's MAC is not resolved:
    /// it never answered, or more frames waited for it than are held
    /// (the oldest goes); RC sends them again, UD loses them.
    pub tx_unresolved: u64,
    /// Frames held while their destination was asked for by ARP, and
    /// sent once it answered (as a host's neighbour table queues them).
    pub tx_held: u64,
    /// Completions handed to the host by `poll` (a host that drains the
    /// engine itself, outside a pass, counts its own).
    pub completions: u64,
    /// PFC frames received: PAUSE and RESUME of the engine's priority,
    /// frames naming only other priorities (ignored), and MAC control
    /// frames that are not PFC or are malformed.
    pub pfc_pause_rx: u64,
    pub pfc_resume_rx: u64,
    pub pfc_other_rx: u64,
    pub pfc_bad: u64,
    /// Frames built with their payload where it lies (zero-copy TX; a
    /// fault or a neighbour lookup may still join one into one buffer
    /// before it leaves), and frames meant to be that were copied (no
    /// mbuf for the payload).
    pub tx_zero_copy: u64,
    pub tx_zero_copy_fallback: u64,
}

/// An RC engine on a frame port.
pub struct Nic<P: FramePort, M: Memory> {
    // Field order is drop order: frames before the port that owns their
    // buffers' pool.
    rx: Vec<P::Frame>,
    tx: Vec<P::Frame>,
    /// Frames to the NIC's own MAC, received at the next pass.
    looped: Vec<P::Frame>,
    /// ARP messages to send.
    arp_out: Vec<ArpRepr>,
    /// Frames waiting for their destination's MAC, with when they came
    /// (at most [`HELD_FRAMES`]).
    held: Vec<(Ipv4Addr, u64, P::Frame)>,
    neighbours: NeighbourTable,
    spare: Option<P::Frame>,
    engine: Engine<M>,
    port: P,
    scratch: Vec<u8>,
    max_frame: usize,
    burst: usize,
    /// The last pass stopped at the burst limit with more to send.
    tx_more: bool,
    counters: NicCounters,
    /// Keys of the frames of a traced TX burst (empty unless tracing).
    trace_keys: Vec<Option<FrameKey>>,
    /// The TX pipe held by PFC.
    pause: PauseState,
    /// Frames with payloads of at least this many bytes are sent from
    /// where the payload lies, attached to the frame by the function.
    split_tx: Option<(usize, AttachPayload<P::Frame, M>)>,
    /// One of several engines of a device on one link ([`Nic::as_shard`]).
    shard: Option<Shard>,
}

/// The part a NIC plays as one of several engines (QP shards) of one
/// device sharing a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Shard {
    /// Answers ARP requests for the device's address (one shard does).
    answers_arp: bool,
}

/// Attaches to a frame holding the headers of a [`TxFrame::Split`] the
/// `len` bytes of `M` at a device address and then the tail (pad and ICRC):
/// where they lie when the buffer can refer to them, else copied. `None`
/// when neither is possible (the frame is dropped, and counted).
pub type AttachPayload<F, M> = fn(&M, &mut F, u64, usize, &[u8]) -> Option<Attached>;

/// How a payload joined its frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attached {
    /// Sent from where it lies (zero-copy).
    InPlace,
    /// Copied into the frame.
    Copied,
}

impl<P: FramePort, M: Memory> Nic<P, M> {
    /// The pipeline over `engine` and `port`, building frames of up to
    /// `max_mtu` payload bytes (the largest path MTU its QPs use).
    pub fn new(engine: Engine<M>, port: P, max_mtu: u32) -> Self {
        let max_frame = max_mtu as usize + MAX_HEADERS;
        Nic {
            rx: Vec::with_capacity(BURST),
            tx: Vec::with_capacity(BURST),
            looped: Vec::with_capacity(BURST),
            arp_out: Vec::new(),
            held: Vec::new(),
            neighbours: NeighbourTable::new(NeighbourConfig::default()),
            spare: None,
            engine,
            port,
            scratch: vec![0; max_frame],
            max_frame,
            burst: BURST,
            tx_more: false,
            counters: NicCounters::default(),
            trace_keys: Vec::new(),
            pause: PauseState::default(),
            split_tx: None,
            shard: None,
        }
    }

    /// Makes this NIC one of several engines of a device that share its
    /// address and link, each with its own QPs (QP shards): frames to the
    /// device's own MAC go out through the port, which brings each to the
    /// engine owning its QP, instead of back into this NIC's RX; only the
    /// shard that `answers_arp` replies to ARP requests (every shard
    /// learns from the ARP frames the port gives it).
    pub fn as_shard(mut self, answers_arp: bool) -> Self {
        self.shard = Some(Shard { answers_arp });
        self
    }

    /// Sends the payloads of at least `min` bytes that lie in one range of
    /// the engine's memory from where they lie, attached to each frame by
    /// `attach` (a port whose buffers can refer to memory they do not own,
    /// and whose driver sends frames in pieces).
    pub fn with_split_tx(mut self, min: usize, attach: AttachPayload<P::Frame, M>) -> Self {
        self.split_tx = Some((min, attach));
        self
    }

    /// Frames per burst (at least 1).
    pub fn with_burst(mut self, burst: usize) -> Self {
        self.burst = burst.max(1);
        self
    }

    pub fn engine(&self) -> &Engine<M> {
        &self.engine
    }

    /// The engine, for the control path (QPs, regions, posting work).
    pub fn engine_mut(&mut self) -> &mut Engine<M> {
        &mut self.engine
    }

    pub fn port(&self) -> &P {
        &self.port
    }

    pub fn port_mut(&mut self) -> &mut P {
        &mut self.port
    }

    pub fn counters(&self) -> &NicCounters {
        &self.counters
    }

    /// The TX pipe's PFC state (whether held, time held so far).
    pub fn pause(&self) -> &PauseState {
        &self.pause
    }

    pub fn neighbours(&self) -> &NeighbourTable {
        &self.neighbours
    }

    /// The neighbour table, for static entries.
    pub fn neighbours_mut(&mut self) -> &mut NeighbourTable {
        &mut self.neighbours
    }

    /// Resolves `ip` as a frame to it would (rdma_cm's address
    /// resolution): the MAC the table has, or an ARP request broadcast
    /// when the table says to ask (at most one per retry interval), and
    /// the answer meanwhile.
    pub fn resolve_neighbour(&mut self, ip: Ipv4Addr, now: u64) -> Resolution {
        let r = self.neighbours.resolve(ip, now);
        if r == Resolution::Ask {
            let c = self.engine.config();
            self.arp_out.push(ArpRepr::request(c.mac, c.ip, ip));
        }
        r
    }

    /// Frames built and waiting for the port.
    pub fn tx_waiting(&self) -> usize {
        self.tx.len()
    }

    /// Frames waiting for their destination's MAC (ARP asked for it).
    pub fn held_for_arp(&self) -> usize {
        self.held.len()
    }

    /// Port buffers the pipeline holds (a spare kept for the next frame,
    /// frames waiting for the port, fresh ones the port keeps for it).
    pub fn buffers_held(&self) -> usize {
        self.tx.len()
            + self.looped.len()
            + self.held.len()
            + usize::from(self.spare.is_some())
            + self.port.buffers_held()
    }

    /// The next time this NIC has work without new input: an engine timer
    /// or pacing deadline, a port event, or `now` again when the last pass
    /// stopped at the burst limit.
    /// While PFC holds the TX pipe, the frames to send wait for the end
    /// of the pause, and only timers and arrivals matter.
    pub fn next_wakeup(&self, now: u64) -> Option<u64> {
        let paused = self.pause.is_paused(now);
        let to_send = self.tx_more || !self.tx.is_empty() || !self.arp_out.is_empty();
        let again = (!self.looped.is_empty() || (to_send && !paused)).then_some(now);
        let engine = if paused {
            Some(
                self.engine
                    .next_timer()
                    .map_or(self.pause.until(), |t| t.min(self.pause.until())),
            )
        } else {
            self.engine.poll_timeout()
        };
        [again, engine, self.port.next_event()]
            .into_iter()
            .flatten()
            .min()
    }

    /// One pass of the pipeline at `now`; returns whether anything moved.
    pub fn poll(&mut self, now: u64, host: &mut impl Host<M>) -> bool {
        // Work requests first: a receive WQE posted before a datagram (or
        // a UC message) arrives must be in the engine when it does, or
        // the datagram is dropped for want of one (an RC SEND would get
        // an RNR NAK).
        let mut moved = host.doorbells(&mut self.engine, now);
        moved |= self.receive(now, host);
        // Cheap when nothing is due (a peek at the timer heap); pacing
        // deadlines are the TX pipe's, below.
        self.engine.handle_timeout(now);
        moved |= self.transmit(now, host);
        while let Some(c) = self.engine.poll_completion() {
            self.counters.completions += 1;
            moved = true;
            host.completion(&mut self.engine, c);
        }
        moved
    }

    fn receive(&mut self, now: u64, host: &mut impl Host<M>) -> bool {
        // Frames this NIC sent to itself first: they left before anything
        // the port holds now arrived.
        std::mem::swap(&mut self.rx, &mut self.looped);
        let looped = self.rx.len();
        let n = looped + self.port.rx_burst(now, &mut self.rx, self.burst);
        if n == 0 {
            return false;
        }
        self.counters.rx_frames += n as u64;
        let tracing = host.tracing();
        if tracing {
            stamp_all(host, Stage::Received, &self.rx);
        }
        let mut rx = std::mem::take(&mut self.rx);
        for f in &rx {
            // One look at the EtherType sorts ARP and MAC control out.
            let ethertype = EthernetFrame::new_checked(f.as_ref()).map_or(0, |e| e.ethertype());
            if ethertype == arp::ETHERTYPE_ARP {
                self.on_arp(now, f.as_ref());
            } else if ethertype == pfc::ETHERTYPE_MAC_CONTROL {
                self.on_pfc(now, f.as_ref());
            } else {
                match f.rest() {
                    Some((payload, tail)) => {
                        self.engine
                            .handle_packet_split(now, f.as_ref(), payload, tail)
                    }
                    None => self.engine.handle_packet(now, f.as_ref()),
                }
                if tracing {
                    stamp_all(host, Stage::Handled, &[f]);
                }
            }
        }
        // Done with: back to the port (to their pool in one call).
        self.port.recycle(&mut rx);
        self.rx = rx;
        true
    }

    /// Answers a request for our address; learns the sender's MAC when
    /// the message is for us or comes from a peer the table holds.
    fn on_arp(&mut self, now: u64, frame: &[u8]) {
        if !self.engine.on_own_vlan(frame) {
            return;
        }
        self.counters.arp_rx += 1;
        let Ok(a) = ArpRepr::parse(frame) else {
            self.counters.arp_bad += 1;
            return;
        };
        let (mac, ip) = (self.engine.config().mac, self.engine.config().ip);
        let for_us = a.target_ip == ip;
        if (for_us || self.neighbours.knows(a.sender_ip))
            && self.neighbours.learn(a.sender_ip, a.sender_mac, now)
        {
            self.engine.set_neighbour(a.sender_ip, a.sender_mac);
            self.release_held(a.sender_ip, a.sender_mac, now);
        }
        let answers = self.shard.is_none_or(|s| s.answers_arp);
        if for_us && a.op == ArpOp::Request && answers {
            self.arp_out.push(a.reply_from(mac));
        }
    }

    /// A PFC frame: holds or frees the TX pipe when it names the engine's
    /// priority (pause times in quanta at the engine's line rate).
    fn on_pfc(&mut self, now: u64, frame: &[u8]) {
        let Ok(p) = PfcRepr::parse(frame) else {
            self.counters.pfc_bad += 1;
            return;
        };
        let c = self.engine.config();
        match p.quanta_for(pfc::priority_of_dscp(c.dscp)) {
            None => self.counters.pfc_other_rx += 1,
            Some(0) => {
                self.counters.pfc_resume_rx += 1;
                self.pause.resume(now);
            }
            Some(q) => {
                self.counters.pfc_pause_rx += 1;
                self.pause.pause(now, pfc::quanta_ns(q, c.line_rate_bps));
            }
        }
    }

    /// A frame the engine addressed to the zero MAC: sent to the MAC the
    /// table has for its IPv4 destination, or dropped (and counted) while
    /// the address is asked for.
    fn resolve(&mut self, now: u64, mut f: P::Frame) {
        if !f.linearize() {
            self.counters.tx_unresolved += 1;
            return;
        }
        let ip = EthernetFrame::new_checked(f.as_ref())
            .and_then(|e| Ipv4Packet::new_checked(e.payload()).map(|p| p.dst()));
        let Ok(ip) = ip else {
            self.counters.tx_unresolved += 1;
            return;
        };
        match self.neighbours.resolve(ip, now) {
            Resolution::Known(mac) => {
                f.as_mut()[..6].copy_from_slice(&mac.0);
                self.engine.set_neighbour(ip, mac);
                self.tx.push(f);
            }
            Resolution::Ask => {
                let c = self.engine.config();
                self.arp_out.push(ArpRepr::request(c.mac, c.ip, ip));
                self.hold(ip, now, f);
            }
            Resolution::Waiting => self.hold(ip, now, f),
            Resolution::Failed => {
                self.counters.tx_unresolved += 1;
                // Those held for it will not go either.
                let before = self.held.len();
                self.held.retain(|h| h.0 != ip);
                self.counters.tx_unresolved += (before - self.held.len()) as u64;
            }
        }
    }

    /// Holds a frame until `ip` answers ARP: the oldest held frame goes
    /// when [`HELD_FRAMES`] wait, and any held longer than
    /// [`HELD_NS`].
    fn hold(&mut self, ip: Ipv4Addr, now: u64, f: P::Frame) {
        let before = self.held.len();
        self.held.retain(|h| now.saturating_sub(h.1) < HELD_NS);
        let mut dropped = before - self.held.len();
        if self.held.len() >= HELD_FRAMES {
            self.held.remove(0);
            dropped += 1;
        }
        self.counters.tx_unresolved += dropped as u64;
        self.held.push((ip, now, f));
    }

    /// `ip` answered with `mac`: its held frames go, in the order they
    /// came.
    fn release_held(&mut self, ip: Ipv4Addr, mac: MacAddr, now: u64) {
        if self.held.is_empty() {
            return;
        }
        let mut keep = Vec::with_capacity(self.held.len());
        for (dst, t, mut f) in std::mem::take(&mut self.held) {
            if now.saturating_sub(t) >= HELD_NS {
                // Too old to go now.
                self.counters.tx_unresolved += 1;
            } else if dst == ip {
                f.as_mut()[..6].copy_from_slice(&mac.0);
                self.counters.tx_held += 1;
                self.tx.push(f);
            } else {
                keep.push((dst, t, f));
            }
        }
        self.held = keep;
    }

    /// Keeps a built frame for the port, or for this NIC's own RX when
    /// it is addressed to itself, or resolves its destination first.
    fn queue(&mut self, now: u64, mut f: P::Frame) {
        let dst = f.as_ref().get(..6);
        let group = dst.is_some_and(|d| d[0] & 1 == 1);
        if dst == Some(&self.engine.config().mac.0[..]) && self.shard.is_none() {
            self.counters.looped_frames += 1;
            self.looped.push(f);
        } else if dst == Some(&MacAddr::default().0[..]) {
            self.resolve(now, f);
        } else {
            if group && self.shard.is_none() {
                self.loop_multicast(&mut f);
            }
            self.tx.push(f);
        }
    }

    /// A datagram to a multicast group this NIC's QPs joined: a copy comes
    /// back to its own RX (as IP multicast loops back to local members),
    /// the frame itself goes on the wire for the others.
    fn loop_multicast(&mut self, f: &mut P::Frame) {
        if !f.linearize() {
            return;
        }
        let group = EthernetFrame::new_checked(f.as_ref())
            .and_then(|e| Ipv4Packet::new_checked(e.payload()).map(|p| p.dst()));
        if !group.is_ok_and(|g| self.engine.joined(g)) {
            return;
        }
        let Some(mut copy) = self.port.alloc() else {
            self.counters.tx_no_buffer += 1;
            return;
        };
        if copy.set(f.as_ref()) {
            self.counters.looped_frames += 1;
            self.looped.push(copy);
        } else {
            self.counters.tx_buffer_too_small += 1;
        }
    }

    /// Puts the ARP messages waiting into port buffers (before the
    /// engine's frames: they unblock them).
    fn transmit_arp(&mut self, room: usize) {
        while self.tx.len() < room {
            let Some(a) = self.arp_out.pop() else {
                break;
            };
            let mut bytes = [0u8; arp::MIN_TAGGED_FRAME_LEN];
            let Some(mut f) = self.spare.take().or_else(|| self.port.alloc()) else {
                self.counters.tx_no_buffer += 1;
                continue;
            };
            let emitted = a.emit_tagged(self.engine.config().vlan, &mut bytes);
            if emitted.is_ok_and(|n| f.set(&bytes[..n])) {
                self.counters.arp_tx += 1;
                self.tx.push(f);
            } else {
                self.counters.tx_buffer_too_small += 1;
            }
        }
    }

    /// Appends to a frame built in pieces (`apart`: its payload and tail)
    /// what follows its headers, and counts how; false when it could not
    /// be (the frame is dropped and counted: RC recovers it like any
    /// loss). A frame built whole needs nothing.
    fn attach_apart(&mut self, f: &mut P::Frame, apart: Option<Apart>) -> bool {
        let (Some(a), Some((_, attach))) = (apart, self.split_tx) else {
            return true;
        };
        let len = a.payload_len as usize;
        match attach(self.engine.mem(), f, a.payload, len, a.tail.as_slice()) {
            Some(Attached::InPlace) => self.counters.tx_zero_copy += 1,
            Some(Attached::Copied) => self.counters.tx_zero_copy_fallback += 1,
            None => {
                self.counters.tx_no_buffer += 1;
                return false;
            }
        }
        true
    }

    /// Builds frames in port buffers while the port takes them, then
    /// bursts them out.
    fn transmit(&mut self, now: u64, host: &mut impl Host<M>) -> bool {
        if self.pause.is_paused(now) {
            // Held by PFC: frames built wait, nothing new is built.
            self.tx_more = false;
            return false;
        }
        let tracing = host.tracing();
        let room = self.port.tx_ready(now).min(self.burst);
        self.tx_more = false;
        if !self.arp_out.is_empty() {
            self.transmit_arp(room);
        }
        // Every frame built takes a place in the burst (looped back,
        // dropped for want of a buffer or a MAC too), so a pass builds at
        // most a burst whatever becomes of them.
        let mut built = self.tx.len();
        // An idle pass takes no buffer and builds nothing.
        let wanted = built < room && self.engine.may_transmit(now);
        while wanted && built < room {
            let Some(mut f) = self.spare.take().or_else(|| self.port.alloc()) else {
                // No buffer: build the frame anyway so that the engine
                // moves on (RC recovers it like any loss), and count it.
                if self.engine.poll_transmit(now, &mut self.scratch).is_some() {
                    self.counters.tx_no_buffer += 1;
                    built += 1;
                    continue;
                }
                break;
            };
            if f.capacity() >= self.max_frame {
                // Built in place (an mbuf): no copy.
                let engine = &mut self.engine;
                let mut apart = None;
                let built_in_place = match self.split_tx {
                    None => f.build(self.max_frame, |buf| engine.poll_transmit(now, buf)),
                    Some((min, _)) => f.build(self.max_frame, |buf| {
                        match engine.poll_transmit_split(now, buf, min)? {
                            TxFrame::Whole(n) => Some(n),
                            TxFrame::Split { head, apart: a } => {
                                apart = Some(a);
                                Some(head)
                            }
                        }
                    }),
                };
                match built_in_place {
                    Ok(Some(_)) => {
                        if self.attach_apart(&mut f, apart) {
                            if tracing {
                                stamp_all(host, Stage::Built, &[&f]);
                            }
                            self.queue(now, f)
                        }
                    }
                    Ok(None) => {
                        self.spare = Some(f);
                        break;
                    }
                    // Not reached (capacity checked); nothing was built.
                    Err(_) => break,
                }
            } else {
                // Built in the scratch buffer and copied into a buffer of
                // the frame's size (a `Vec`; an mbuf of a pool sized for a
                // smaller MTU is refused by `set` and counted).
                let Some(n) = self.engine.poll_transmit(now, &mut self.scratch) else {
                    self.spare = Some(f);
                    break;
                };
                if f.set(&self.scratch[..n]) {
                    if tracing {
                        stamp_all(host, Stage::Built, &[&f]);
                    }
                    self.queue(now, f);
                } else {
                    self.counters.tx_buffer_too_small += 1;
                }
            }
            built += 1;
            if built == room && room == self.burst {
                self.tx_more = true;
            }
        }
        if self.tx.is_empty() {
            return !self.looped.is_empty();
        }
        if tracing {
            self.trace_keys.clear();
            self.trace_keys
                .extend(self.tx.iter().map(|f| FrameKey::of(f.as_ref())));
        }
        let sent = self.port.tx_burst(now, &mut self.tx);
        self.counters.tx_frames += sent as u64;
        if tracing {
            for k in self.trace_keys.iter().take(sent).flatten() {
                host.stamp(Stage::Sent, *k);
            }
        }
        sent > 0
    }
}
