//! One run-to-completion pass between an RC engine and its DPDK port: the
//! RX half (burst in, hand every frame to the engine, run due timers) and
//! the TX half (poll the engine for frames up to a burst, copy each into
//! an mbuf, burst out). The loopback testbed and the daemon's hosts both
//! run their engines through these.

use transport::mr::Memory;
use transport::rc::Engine;

use crate::dpdk::port::BURST;
use crate::dpdk::{Mbuf, Mempool, Port};

/// Receives a burst into `engine` and runs its due timers; returns
/// whether any frame arrived.
pub fn rx_pass<M: Memory>(
    port: &Port,
    rx: &mut Vec<Mbuf>,
    engine: &mut Engine<M>,
    now: u64,
) -> bool {
    rx.clear();
    port.rx_burst(rx);
    let moved = !rx.is_empty();
    for m in rx.drain(..) {
        engine.handle_packet(now, m.data());
    }
    if engine.poll_timeout().is_some_and(|t| t <= now) {
        engine.handle_timeout(now);
    }
    moved
}

/// Where a TX pass builds frames and what it reports.
pub struct TxScratch<'a> {
    pub pool: &'a Mempool,
    /// At least MTU + headers.
    pub buf: &'a mut [u8],
    /// Keeps a copy of every frame sent, when set.
    pub tap: Option<&'a mut Vec<Vec<u8>>>,
    /// Frames dropped because the pool had no mbuf.
    pub alloc_failures: &'a mut u64,
}

/// Sends up to a burst of the engine's frames; frames the port does not
/// take stay in `tx` for the next pass. Returns whether any frame left.
pub fn tx_pass<M: Memory>(
    engine: &mut Engine<M>,
    port: &Port,
    tx: &mut Vec<Mbuf>,
    s: &mut TxScratch<'_>,
    now: u64,
) -> bool {
    while tx.len() < BURST {
        let Some(n) = engine.poll_transmit(now, s.buf) else {
            break;
        };
        if let Some(tap) = s.tap.as_mut() {
            tap.push(s.buf[..n].to_vec());
        }
        let Some(mut m) = s.pool.alloc() else {
            *s.alloc_failures += 1;
            continue;
        };
        match m.append(n) {
            Some(dst) => dst.copy_from_slice(&s.buf[..n]),
            None => {
                *s.alloc_failures += 1;
                continue;
            }
        }
        tx.push(m);
    }
    !tx.is_empty() && port.tx_burst(tx) > 0
}
