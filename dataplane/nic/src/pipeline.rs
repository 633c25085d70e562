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
//!
//! Nothing is lost silently: a frame that finds no buffer is built anyway
//! (so the engine moves on and recovers it like any loss) and counted.

use transport::mr::Memory;
use transport::rc::{Cqe, Engine};

use crate::port::{Frame, FramePort};

/// Longest headers the engine puts around a payload (Ethernet, IPv4,
/// UDP, BTH, RETH, a full TLM block, ICRC), rounded up.
pub const MAX_HEADERS: usize = 512;

/// Frames per RX and TX burst by default.
pub const BURST: usize = 32;

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
    /// Completions handed to the host by `poll` (a host that drains the
    /// engine itself, outside a pass, counts its own).
    pub completions: u64,
}

/// An RC engine on a frame port.
pub struct Nic<P: FramePort, M: Memory> {
    // Field order is drop order: frames before the port that owns their
    // buffers' pool.
    rx: Vec<P::Frame>,
    tx: Vec<P::Frame>,
    /// Frames to the NIC's own MAC, received at the next pass.
    looped: Vec<P::Frame>,
    spare: Option<P::Frame>,
    engine: Engine<M>,
    port: P,
    scratch: Vec<u8>,
    max_frame: usize,
    burst: usize,
    /// The last pass stopped at the burst limit with more to send.
    tx_more: bool,
    counters: NicCounters,
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
            spare: None,
            engine,
            port,
            scratch: vec![0; max_frame],
            max_frame,
            burst: BURST,
            tx_more: false,
            counters: NicCounters::default(),
        }
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

    /// Frames built and waiting for the port.
    pub fn tx_waiting(&self) -> usize {
        self.tx.len()
    }

    /// Port buffers the pipeline holds (a spare kept for the next frame,
    /// frames waiting for the port).
    pub fn buffers_held(&self) -> usize {
        self.tx.len() + self.looped.len() + usize::from(self.spare.is_some())
    }

    /// The next time this NIC has work without new input: an engine timer
    /// or pacing deadline, a port event, or `now` again when the last pass
    /// stopped at the burst limit.
    pub fn next_wakeup(&self, now: u64) -> Option<u64> {
        let again = (self.tx_more || !self.tx.is_empty() || !self.looped.is_empty()).then_some(now);
        [again, self.engine.poll_timeout(), self.port.next_event()]
            .into_iter()
            .flatten()
            .min()
    }

    /// One pass of the pipeline at `now`; returns whether anything moved.
    pub fn poll(&mut self, now: u64, host: &mut impl Host<M>) -> bool {
        let mut moved = self.receive(now);
        // Cheap when nothing is due (a peek at the timer heap); pacing
        // deadlines are the TX pipe's, below.
        self.engine.handle_timeout(now);
        moved |= host.doorbells(&mut self.engine, now);
        moved |= self.transmit(now);
        while let Some(c) = self.engine.poll_completion() {
            self.counters.completions += 1;
            moved = true;
            host.completion(&mut self.engine, c);
        }
        moved
    }

    fn receive(&mut self, now: u64) -> bool {
        // Frames this NIC sent to itself first: they left before anything
        // the port holds now arrived.
        std::mem::swap(&mut self.rx, &mut self.looped);
        let looped = self.rx.len();
        let n = looped + self.port.rx_burst(now, &mut self.rx, self.burst);
        if n == 0 {
            return false;
        }
        self.counters.rx_frames += n as u64;
        for f in self.rx.drain(..) {
            self.engine.handle_packet(now, f.as_ref());
        }
        true
    }

    /// Whether a built frame is addressed to this NIC's own MAC (the
    /// engine's: a DPDK port may carry another address).
    fn is_own(&self, f: &P::Frame) -> bool {
        f.as_ref().get(..6) == Some(&self.engine.config().mac.0[..])
    }

    /// Keeps a built frame for the port, or for this NIC's own RX when
    /// it is addressed to itself.
    fn queue(&mut self, f: P::Frame) {
        if self.is_own(&f) {
            self.counters.looped_frames += 1;
            self.looped.push(f);
        } else {
            self.tx.push(f);
        }
    }

    /// Builds frames in port buffers while the port takes them, then
    /// bursts them out.
    fn transmit(&mut self, now: u64) -> bool {
        let room = self.port.tx_ready(now).min(self.burst);
        self.tx_more = false;
        // Frames looped back to this NIC take a place in the burst too, so
        // a pass builds at most a burst whatever their addresses.
        while self.tx.len() + self.looped.len() < room {
            let Some(mut f) = self.spare.take().or_else(|| self.port.alloc()) else {
                // No buffer: build the frame anyway so that the engine
                // moves on (RC recovers it like any loss), and count it.
                if self.engine.poll_transmit(now, &mut self.scratch).is_some() {
                    self.counters.tx_no_buffer += 1;
                    continue;
                }
                break;
            };
            if f.capacity() >= self.max_frame {
                // Built in place (an mbuf): no copy.
                let engine = &mut self.engine;
                match f.build(self.max_frame, |buf| engine.poll_transmit(now, buf)) {
                    Ok(Some(_)) => self.queue(f),
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
                    self.queue(f);
                } else {
                    self.counters.tx_buffer_too_small += 1;
                }
            }
            if self.tx.len() + self.looped.len() == room && room == self.burst {
                self.tx_more = true;
            }
        }
        if self.tx.is_empty() {
            return !self.looped.is_empty();
        }
        let sent = self.port.tx_burst(now, &mut self.tx);
        self.counters.tx_frames += sent as u64;
        sent > 0
    }
}
