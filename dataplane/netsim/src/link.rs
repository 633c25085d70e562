//! A simulated host's link as a frame port: frames the simulator delivers
//! wait in an inbox for the NIC's RX burst; the NIC's TX burst puts one
//! frame at a time on the wire, serialized at the link's rate, and the
//! simulator collects what left (with the time its last bit leaves) to
//! schedule its arrival at the far end.

use std::collections::VecDeque;

use nic::FramePort;
use transport::wire::MacAddr;

use crate::switch::serialization_ns;

/// One host's side of its link.
#[derive(Debug)]
pub struct SimLink {
    mac: MacAddr,
    mtu: u32,
    rate_bps: u64,
    busy_until: u64,
    inbox: VecDeque<Vec<u8>>,
    /// The frame put on the wire by the last TX burst (one at a time).
    sent: Option<(u64, Vec<u8>)>,
}

impl SimLink {
    pub fn new(mac: MacAddr, mtu: u32, rate_bps: u64) -> Self {
        SimLink {
            mac,
            mtu,
            rate_bps,
            busy_until: 0,
            inbox: VecDeque::new(),
            sent: None,
        }
    }

    /// A frame arrives from the wire.
    pub fn deliver(&mut self, frame: Vec<u8>) {
        self.inbox.push_back(frame);
    }

    /// The frame put on the wire since the last call, with the time its
    /// last bit leaves (the link serializes one frame at a time, and the
    /// NIC builds one only when the link is free).
    pub fn take_sent(&mut self) -> Option<(u64, Vec<u8>)> {
        self.sent.take()
    }

    /// When the frame on the wire has left (the link is free from then).
    pub fn busy_until(&self) -> u64 {
        self.busy_until
    }

    pub fn rate_bps(&self) -> u64 {
        self.rate_bps
    }
}

impl FramePort for SimLink {
    type Frame = Vec<u8>;

    fn rx_burst(&mut self, _now: u64, out: &mut Vec<Vec<u8>>, max: usize) -> usize {
        let n = max.min(self.inbox.len());
        out.extend(self.inbox.drain(..n));
        n
    }

    fn tx_burst(&mut self, now: u64, frames: &mut Vec<Vec<u8>>) -> usize {
        if self.tx_ready(now) == 0 || frames.is_empty() || self.sent.is_some() {
            return 0;
        }
        let f = frames.remove(0);
        self.busy_until = now + serialization_ns(f.len(), self.rate_bps);
        self.sent = Some((self.busy_until, f));
        1
    }

    fn alloc(&mut self) -> Option<Vec<u8>> {
        Some(Vec::new())
    }

    /// Frames waiting in the inbox are due now.
    fn next_event(&self) -> Option<u64> {
        (!self.inbox.is_empty()).then_some(0)
    }

    /// One frame when the wire is free: frames are built when they can
    /// leave, as the NIC's TX pipe does.
    fn tx_ready(&self, now: u64) -> usize {
        usize::from(self.busy_until <= now)
    }

    fn mac(&self) -> MacAddr {
        self.mac
    }

    fn mtu(&self) -> u32 {
        self.mtu
    }

    fn link_up(&self) -> bool {
        true
    }
}
