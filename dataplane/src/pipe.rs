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

    /// Queues as many frames as the TX queue has room for (this thread is
    /// its only producer, so the room seen stays available).
    fn tx_burst(&mut self, now: u64, frames: &mut Vec<Mbuf>) -> usize {
        let n = self.tx_ready(now).min(frames.len());
        let mut sent = 0;
        for m in frames.drain(..n) {
            // Fails only once the TX pipe has stopped (shutdown): the
            // frame is freed with the error.
            sent += usize::from(self.tx.try_send(m).is_ok());
        }
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
