//! A host's port as its NIC pipeline sees it on DPDK: the port itself (or,
//! in the pipelined layout, the engine side of its pipes, or, for one of a
//! device's QP shards, its queue pair and the steering between shards), inside the
//! fault injector (a pass-through unless the configuration makes the link
//! lossy), inside the pcap tap (a pass-through unless a capture is asked
//! for). One type for every host, whatever is configured.

use nic::{FaultInjector, FramePort, Tap};
use transport::wire::MacAddr;

use crate::dpdk::{Mbuf, Port, PortStats};
use crate::pipe::PipePort;
use crate::shard_port::ShardPort;

/// The DPDK end of a host's port.
pub enum DpdkLink {
    /// Run-to-completion: the lcore drives the port's queues.
    Port(Port),
    /// Pipelined: RX and TX pipe threads drive the queues.
    Pipe(PipePort),
    /// One of a device's QP shards: its own queue pair of the port.
    Shard(ShardPort),
}

/// A host's port with its optional faults and tap.
pub type HostPort = Tap<FaultInjector<DpdkLink>>;

impl DpdkLink {
    /// Whether a QP shard's port passed frames to other shards since the
    /// last call (see `ShardPort::take_moved`); false for any other port.
    pub fn take_moved(&mut self) -> bool {
        match self {
            DpdkLink::Shard(s) => s.take_moved(),
            DpdkLink::Port(_) | DpdkLink::Pipe(_) => false,
        }
    }

    /// The interrupt descriptors of the RX queues this end polls, when
    /// each has one (none while pipelined: the RX pipe thread polls).
    pub fn rx_wakeups(&self) -> Option<Vec<crate::dpdk::RxWakeup>> {
        match self {
            DpdkLink::Port(p) => p.rx_wakeups(),
            DpdkLink::Shard(s) => s.queue().rx_wakeups(),
            DpdkLink::Pipe(_) => None,
        }
    }

    /// The DPDK port, when the lcore drives it (not while pipelined, nor
    /// for a QP shard, which drives one queue pair of it).
    pub fn port(&self) -> Option<&Port> {
        match self {
            DpdkLink::Port(p) => Some(p),
            DpdkLink::Pipe(_) | DpdkLink::Shard(_) => None,
        }
    }

    /// The whole port's counters (none while pipelined).
    pub fn port_stats(&self) -> Option<PortStats> {
        match self {
            DpdkLink::Port(p) => Some(p.port_stats()),
            DpdkLink::Pipe(_) => None,
            DpdkLink::Shard(s) => Some(s.queue().port_stats()),
        }
    }

    /// The port's id and counters (a shard's part of them: the driver's
    /// on shard 0, so that the shards' sum is the port's); none while
    /// pipelined.
    pub fn stats(&self) -> Option<(u16, PortStats)> {
        match self {
            DpdkLink::Port(p) => Some((p.id, p.stats())),
            DpdkLink::Pipe(_) => None,
            DpdkLink::Shard(s) => Some((s.queue().id, s.queue().stats())),
        }
    }
}

/// The DPDK end under a host's faults and tap.
pub fn link(p: &HostPort) -> &DpdkLink {
    p.inner().inner()
}

/// The DPDK end under a host's faults and tap, writable (to switch
/// layouts).
pub fn link_mut(p: &mut HostPort) -> &mut DpdkLink {
    p.inner_mut().inner_mut()
}

macro_rules! each {
    ($self:ident, $p:ident => $e:expr) => {
        match $self {
            DpdkLink::Port($p) => $e,
            DpdkLink::Pipe($p) => $e,
            DpdkLink::Shard($p) => $e,
        }
    };
}

impl FramePort for DpdkLink {
    type Frame = Mbuf;

    fn rx_burst(&mut self, now: u64, out: &mut Vec<Mbuf>, max: usize) -> usize {
        each!(self, p => p.rx_burst(now, out, max))
    }

    fn tx_burst(&mut self, now: u64, frames: &mut Vec<Mbuf>) -> usize {
        each!(self, p => p.tx_burst(now, frames))
    }

    fn alloc(&mut self) -> Option<Mbuf> {
        each!(self, p => p.alloc())
    }

    fn recycle(&mut self, frames: &mut Vec<Mbuf>) {
        each!(self, p => p.recycle(frames))
    }

    fn buffers_held(&self) -> usize {
        each!(self, p => p.buffers_held())
    }

    fn tx_ready(&self, now: u64) -> usize {
        each!(self, p => p.tx_ready(now))
    }

    fn next_event(&self) -> Option<u64> {
        each!(self, p => p.next_event())
    }

    fn mac(&self) -> MacAddr {
        each!(self, p => FramePort::mac(p))
    }

    fn mtu(&self) -> u32 {
        each!(self, p => FramePort::mtu(p))
    }

    fn link_up(&self) -> bool {
        each!(self, p => FramePort::link_up(p))
    }
}
