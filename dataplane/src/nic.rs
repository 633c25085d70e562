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
    if moved {
        for m in rx.drain(..) {
            engine.handle_packet(now, m.data());
        }
    }
    if engine.poll_timeout().is_some_and(|t| t <= now) {
        engine.handle_timeout(now);
    }
    moved
}

/// Where a TX pass builds frames and what it reports.
pub struct TxScratch<'a> {
    pub pool: &'a Mempool,
    /// At least MTU + headers: frames are built here when an mbuf's
    /// tailroom is smaller than `max_frame`, then copied.
    pub buf: &'a mut [u8],
    /// The longest frame the engine may emit (path MTU + headers).
    pub max_frame: usize,
    /// An mbuf kept from a pass that had nothing to send.
    pub spare: &'a mut Option<Mbuf>,
    /// Keeps a copy of every frame sent, when set.
    pub tap: Option<&'a mut Vec<Vec<u8>>>,
    /// Frames dropped because the pool had no mbuf.
    pub alloc_failures: &'a mut u64,
}

/// Longest headers the engine puts around a payload (Ethernet, IPv4,
/// UDP, BTH, RETH, a full TLM block, ICRC), rounded up.
pub const MAX_HEADERS: usize = 512;

/// Sends up to a burst of the engine's frames, built in place in mbufs
/// when they fit (no copy) and in `s.buf` otherwise; frames the port does
/// not take stay in `tx` for the next pass. Returns whether any frame
/// left.
pub fn tx_pass<M: Memory>(
    engine: &mut Engine<M>,
    port: &Port,
    tx: &mut Vec<Mbuf>,
    s: &mut TxScratch<'_>,
    now: u64,
) -> bool {
    while tx.len() < BURST {
        let Some(mut m) = s.spare.take().or_else(|| s.pool.alloc()) else {
            // No mbuf: build the frame anyway so that the engine moves on
            // (the loss is recovered like any other), and count it.
            if engine.poll_transmit(now, s.buf).is_some() {
                *s.alloc_failures += 1;
                continue;
            }
            break;
        };
        let room = m.tailroom();
        if room >= s.max_frame {
            let dst = m.append(room).expect("tailroom checked");
            match engine.poll_transmit(now, dst) {
                Some(n) => {
                    m.trim(room - n);
                    if let Some(tap) = s.tap.as_mut() {
                        tap.push(m.data().to_vec());
                    }
                    tx.push(m);
                }
                None => {
                    m.trim(room);
                    *s.spare = Some(m);
                    break;
                }
            }
            continue;
        }
        let Some(n) = engine.poll_transmit(now, s.buf) else {
            *s.spare = Some(m);
            break;
        };
        if let Some(tap) = s.tap.as_mut() {
            tap.push(s.buf[..n].to_vec());
        }
        match m.append(n) {
            Some(dst) => {
                dst.copy_from_slice(&s.buf[..n]);
                tx.push(m);
            }
            None => *s.alloc_failures += 1,
        }
    }
    !tx.is_empty() && port.tx_burst(tx) > 0
}
