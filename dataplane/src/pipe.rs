//! The pipelined layout's frame port: the engine lcore's side of the RX
//! and TX pipes. The RX pipe thread bursts frames off a port's [`RxHalf`]
//! into a bounded queue; the engine lcore runs the one NIC pipeline
//! (`nic::Nic::poll`) over a [`PipePort`], which receives from that queue
//! and transmits into another; the TX pipe thread bursts those out of the
//! port's [`TxHalf`]. Queues are bounded: a full TX queue holds frames in
//! the pipeline (backpressure), nothing is dropped.
//!
//! [`RxHalf`]: crate::dpdk::RxHalf
//! [`TxHalf`]: crate::dpdk::TxHalf

use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender};
use nic::FramePort;
use transport::wire::MacAddr;

use crate::dpdk::{Mbuf, Mempool};

/// The engine side of one port's RX and TX pipes.
pub struct PipePort {
    rx: Receiver<Mbuf>,
    tx: Sender<Mbuf>,
    pool: Arc<Mempool>,
    mac: MacAddr,
    mtu: u32,
}

impl PipePort {
    /// The port whose frames arrive on `rx` and leave on `tx`; frames are
    /// built in mbufs of `pool`.
    pub fn new(
        rx: Receiver<Mbuf>,
        tx: Sender<Mbuf>,
        pool: Arc<Mempool>,
        mac: MacAddr,
        mtu: u32,
    ) -> Self {
        PipePort {
            rx,
            tx,
            pool,
            mac,
            mtu,
        }
    }
}

impl PipePort {
    /// Frames waiting in the RX queue.
    pub fn queued(&self) -> usize {
        self.rx.len()
    }
}

impl FramePort for PipePort {
    type Frame = Mbuf;

    fn rx_burst(&mut self, _now: u64, out: &mut Vec<Mbuf>, max: usize) -> usize {
        let mut n = 0;
        while n < max {
            let Ok(m) = self.rx.try_recv() else {
                break;
            };
            out.push(m);
            n += 1;
        }
        n
    }

    /// Queues frames from the front while the TX queue has room; what it
    /// refuses stays in `frames`, in order.
    fn tx_burst(&mut self, _now: u64, frames: &mut Vec<Mbuf>) -> usize {
        let mut sent = 0;
        let mut back = Vec::new();
        let mut rest = frames.drain(..);
        for m in rest.by_ref() {
            match self.tx.try_send(m) {
                Ok(()) => sent += 1,
                Err(e) => {
                    back.push(e.into_inner());
                    break;
                }
            }
        }
        back.extend(rest);
        frames.extend(back);
        sent
    }

    fn alloc(&mut self) -> Option<Mbuf> {
        self.pool.alloc()
    }

    fn tx_ready(&self, _now: u64) -> usize {
        self.tx
            .capacity()
            .map_or(usize::MAX, |c| c.saturating_sub(self.tx.len()))
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
