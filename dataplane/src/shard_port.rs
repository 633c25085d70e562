//! A device's port as one of its QP shards sees it: when a device's QPs are
//! sharded over several engines (one per dataplane lcore, each with its own
//! RX and TX queue of the port), this port brings every frame to the
//! engine that owns its QP.
//!
//! A RoCEv2 frame's DestQP, read from its headers (a frame sent from the
//! application's memory is headers, payload and tail in three segments),
//! names its shard ([`QpnSpace::owner`]: the QPNs of shard `k` of `n` are
//! `QPN_BASE + i * n + k`). A frame that
//! arrives on another shard's queue (a port without steering spreads
//! frames by the sender's queue or its RSS hash, not by our QPN), or that
//! a shard sends to the device's own MAC (a QP connected to another QP of
//! the device), goes into its owner's inbox, a bounded channel the owner
//! reads before its RX queue. ARP and MAC control (PFC) frames are every
//! shard's business: each gets a copy. Anything else stays where it
//! arrived, for the engine to count its drop. Nothing is dropped but a
//! copy that finds no buffer (counted): a frame for a full inbox waits,
//! as for a full TX ring, and while a received one waits the shard reads
//! no more of its RX queue.

use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender, TrySendError};
use nic::{Frame, FramePort};
use serde::{Deserialize, Serialize};
use transport::rc::QpnSpace;
use transport::wire::arp::ETHERTYPE_ARP;
use transport::wire::pfc::ETHERTYPE_MAC_CONTROL;
use transport::wire::{steering_dest_qp, EthernetFrame, MacAddr};

use crate::dpdk::{Mbuf, Port};

/// Frames one shard's inbox holds (as many as a port's RX ring).
pub const INBOX_FRAMES: usize = 1024;

/// The inboxes of a device's shards, by shard.
pub struct Inboxes {
    tx: Vec<Sender<Mbuf>>,
    rx: Vec<Receiver<Mbuf>>,
}

impl Inboxes {
    /// An inbox for each of `shards` shards.
    pub fn new(shards: usize) -> Arc<Inboxes> {
        let (tx, rx) = (0..shards)
            .map(|_| crossbeam_channel::bounded(INBOX_FRAMES))
            .unzip();
        Arc::new(Inboxes { tx, rx })
    }

    fn shards(&self) -> u32 {
        self.tx.len() as u32
    }
}

/// What a shard's port moved between shards.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SteerCounters {
    /// Frames received on this shard's queue for another shard's QP,
    /// passed to it.
    pub passed: u64,
    /// Frames this shard sent to the device's own MAC (to a QP of the
    /// device, on any shard).
    pub looped: u64,
    /// Frames taken from this shard's inbox.
    pub taken: u64,
    /// ARP and MAC control frames copied to the other shards.
    pub copied: u64,
    /// Frames that found their owner's inbox full and waited (none is
    /// dropped for it).
    pub waited_full: u64,
    /// Copies not made for want of a buffer.
    pub copy_no_buffer: u64,
}

impl SteerCounters {
    pub fn add(&mut self, o: &SteerCounters) {
        self.passed += o.passed;
        self.looped += o.looped;
        self.taken += o.taken;
        self.copied += o.copied;
        self.waited_full += o.waited_full;
        self.copy_no_buffer += o.copy_no_buffer;
    }
}

/// Where a frame goes.
enum Route {
    /// To shard `k` (possibly this one).
    Shard(u32),
    /// To every shard.
    Everyone,
}

/// Shard `shard`'s view of a device's port.
pub struct ShardPort {
    queue: Port,
    /// The device's MAC (its engines' source MAC, not always the port's).
    device_mac: MacAddr,
    shard: u32,
    inboxes: Arc<Inboxes>,
    counters: SteerCounters,
    /// Frames passed or copied since [`ShardPort::take_moved`].
    moved: bool,
    /// Frames of the last RX burst, before they are routed.
    burst: Vec<Mbuf>,
    /// Frames for other shards (received, or copies) waiting for room in
    /// their inboxes, in order: at most a burst and its copies.
    waiting: std::collections::VecDeque<(u32, Mbuf)>,
    /// A TX burst's frames for the queue and those held for a full inbox
    /// (empty between bursts; kept for their capacity).
    tx_out: Vec<Mbuf>,
    tx_held: Vec<Mbuf>,
}

impl ShardPort {
    /// Shard `shard` of the device with MAC `device_mac` whose shards
    /// have `inboxes`, on its own queue pair of the device's port.
    pub fn new(queue: Port, device_mac: MacAddr, shard: u32, inboxes: Arc<Inboxes>) -> ShardPort {
        ShardPort {
            queue,
            device_mac,
            shard,
            inboxes,
            counters: SteerCounters::default(),
            moved: false,
            burst: Vec::with_capacity(nic::BURST),
            waiting: std::collections::VecDeque::new(),
            tx_out: Vec::with_capacity(nic::BURST),
            tx_held: Vec::new(),
        }
    }

    pub fn queue(&self) -> &Port {
        &self.queue
    }

    pub fn counters(&self) -> &SteerCounters {
        &self.counters
    }

    fn route(&self, frame: &[u8]) -> Route {
        if let Some(qpn) = steering_dest_qp(frame) {
            return Route::Shard(QpnSpace::owner(qpn, self.inboxes.shards()));
        }
        let ethertype = EthernetFrame::new_checked(frame).map_or(0, |e| e.ethertype());
        if ethertype == ETHERTYPE_ARP || ethertype == ETHERTYPE_MAC_CONTROL {
            Route::Everyone
        } else {
            Route::Shard(self.shard)
        }
    }

    /// Into shard `k`'s inbox, or, when it is full (or frames wait
    /// already), to wait in order for the next burst.
    fn pass(&mut self, k: u32, f: Mbuf) {
        self.moved = true;
        if !self.waiting.is_empty() {
            self.waiting.push_back((k, f));
            return;
        }
        if let Err(TrySendError::Full(f) | TrySendError::Disconnected(f)) =
            self.inboxes.tx[k as usize].try_send(f)
        {
            self.counters.waited_full += 1;
            self.waiting.push_back((k, f));
        }
    }

    /// Passes the frames that wait, in order, until an inbox is full.
    fn pass_waiting(&mut self) {
        while let Some((k, f)) = self.waiting.pop_front() {
            self.moved = true;
            if let Err(TrySendError::Full(f) | TrySendError::Disconnected(f)) =
                self.inboxes.tx[k as usize].try_send(f)
            {
                self.waiting.push_front((k, f));
                break;
            }
        }
    }

    /// Whether the port passed or copied frames to other shards since the
    /// last call: work for the lcore even when none of the frames was
    /// this shard's (so that the lcore does not rest as if idle).
    pub fn take_moved(&mut self) -> bool {
        std::mem::take(&mut self.moved)
    }

    /// Up to `max` frames from this shard's inbox into `out`.
    fn take_inbox(&mut self, out: &mut Vec<Mbuf>, max: usize) {
        for _ in 0..max {
            match self.inboxes.rx[self.shard as usize].try_recv() {
                Ok(f) => {
                    self.counters.taken += 1;
                    out.push(f);
                }
                Err(_) => break,
            }
        }
    }

    /// A copy of `f` into every other shard's inbox.
    fn copy_to_others(&mut self, f: &Mbuf) {
        let me = self.shard;
        for k in (0..self.inboxes.shards()).filter(|&k| k != me) {
            let copy = self
                .queue
                .alloc()
                .and_then(|mut c| c.set(f.data()).then_some(c));
            match copy {
                Some(c) => {
                    self.counters.copied += 1;
                    self.pass(k, c);
                }
                None => self.counters.copy_no_buffer += 1,
            }
        }
    }
}

impl FramePort for ShardPort {
    type Frame = Mbuf;

    /// Frames from the inbox first (up to half the burst, so that a busy
    /// inbox cannot starve the queue), then the queue's, routed, then the
    /// inbox again while there is room. While frames wait for a full
    /// inbox the queue is not read: its ring holds the rest (and a sender
    /// on net_ring waits, as for any full ring).
    fn rx_burst(&mut self, now: u64, out: &mut Vec<Mbuf>, max: usize) -> usize {
        let start = out.len();
        self.pass_waiting();
        self.take_inbox(out, max.div_ceil(2));
        let room = max - (out.len() - start);
        if room > 0 && self.waiting.is_empty() {
            let mut burst = std::mem::take(&mut self.burst);
            self.queue.rx_burst(now, &mut burst, room);
            for f in burst.drain(..) {
                match self.route(f.data()) {
                    Route::Shard(k) if k == self.shard => out.push(f),
                    Route::Shard(k) => {
                        self.counters.passed += 1;
                        self.pass(k, f);
                    }
                    Route::Everyone => {
                        self.copy_to_others(&f);
                        out.push(f);
                    }
                }
            }
            self.burst = burst;
        }
        let room = max - (out.len() - start);
        self.take_inbox(out, room);
        out.len() - start
    }

    /// Frames to the device's own MAC go to their QP's shard, the others
    /// to this shard's TX queue (the count returned includes both; the
    /// frames taken are not always the first ones of `frames`, so a
    /// latency trace may stamp the wrong frames of such a burst "sent").
    /// A full inbox takes no more of them, as a full TX ring: they stay in
    /// `frames`, in order, for the next burst (the receiving shard paces
    /// the sending one, and the frames do not pile up in inboxes until the
    /// pool runs dry).
    fn tx_burst(&mut self, now: u64, frames: &mut Vec<Mbuf>) -> usize {
        let mac = self.device_mac;
        let own = |f: &Mbuf| f.data().get(..6) == Some(&mac.0[..]);
        if !frames.iter().any(own) {
            return self.queue.tx_burst(now, frames);
        }
        // Reused buffers: no allocation per burst.
        let mut out = std::mem::take(&mut self.tx_out);
        let mut held = std::mem::take(&mut self.tx_held);
        let mut looped = 0;
        for f in frames.drain(..) {
            if !own(&f) {
                out.push(f);
            } else if !held.is_empty() {
                held.push(f);
            } else {
                let k = match self.route(f.data()) {
                    Route::Shard(k) => k,
                    Route::Everyone => {
                        self.copy_to_others(&f);
                        self.shard
                    }
                };
                match self.inboxes.tx[k as usize].try_send(f) {
                    Ok(()) => looped += 1,
                    Err(TrySendError::Full(f) | TrySendError::Disconnected(f)) => held.push(f),
                }
            }
        }
        self.counters.looped += looped as u64;
        let sent = self.queue.tx_burst(now, &mut out);
        out.append(&mut held);
        // `frames` (empty now) becomes the next call's buffer.
        self.tx_out = std::mem::replace(frames, out);
        self.tx_held = held;
        looped + sent
    }

    fn alloc(&mut self) -> Option<Mbuf> {
        self.queue.alloc()
    }

    fn recycle(&mut self, frames: &mut Vec<Mbuf>) {
        self.queue.recycle(frames)
    }

    fn buffers_held(&self) -> usize {
        self.queue.buffers_held()
    }

    fn tx_ready(&self, now: u64) -> usize {
        self.queue.tx_ready(now)
    }

    fn mac(&self) -> MacAddr {
        self.queue.mac()
    }

    fn mtu(&self) -> u32 {
        self.queue.mtu()
    }

    fn link_up(&self) -> bool {
        self.queue.link_up()
    }
}
