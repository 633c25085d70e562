//! The General Services Interface of an engine: QP1 (IBA 13.5.1), which
//! every RoCE port has and which carries management datagrams (MADs) —
//! the connection manager's among them. It is the engine's, not an
//! application's: a datagram to QP1 that is a UD SEND_ONLY with the GSI
//! Q_Key and a 256-byte payload is queued for the management agents
//! (`poll_mad`); anything else to QP1 is dropped and counted by reason.
//! MADs the agents send (`send_mad`) leave as UD SEND_ONLYs from QP1,
//! ahead of the paced traffic, with their own PSNs.

use std::collections::VecDeque;
use std::net::Ipv4Addr;

use super::ah::{self, AhAttr};
use super::datagram::{grh_of, GRH_LEN};
use super::types::RcError;
use super::EngineConfig;
use crate::mr::DEFAULT_PD;
use crate::wire::mad::{GSI_QKEY, GSI_QPN, MAD_LEN};
use crate::wire::{udp, DethRepr, MacAddr, Opcode, Packet, Service, TransportRepr};

/// MADs waiting each way at most; more are dropped and counted.
pub const GSI_QUEUE: usize = 1024;

/// A MAD received on QP1.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ReceivedMad {
    /// The sender: its IPv4 address (the GRH's source), its MAC (the
    /// frame's) and QP (the DETH's).
    pub src_ip: Ipv4Addr,
    pub src_mac: MacAddr,
    pub src_qpn: u32,
    /// The BTH's P_Key.
    pub pkey: u16,
    /// The GRH area a receive buffer would get (the IPv4 header in its
    /// last 20 bytes): what `ib_init_ah_attr_from_wc` reads.
    pub grh: [u8; GRH_LEN],
    pub mad: [u8; MAD_LEN],
}

impl std::fmt::Debug for ReceivedMad {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ReceivedMad {{ from {}:{:#x}, class {:#04x}, method {:#04x} }}",
            self.src_ip, self.src_qpn, self.mad[1], self.mad[3]
        )
    }
}

/// A MAD to send from QP1.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct OutMad {
    pub dest_ip: Ipv4Addr,
    /// The zero MAC: not known (the pipeline resolves it by ARP).
    pub dest_mac: MacAddr,
    pub dest_qpn: u32,
    /// The Q_Key in the DETH (the GSI's to another QP1).
    pub qkey: u32,
    /// DSCP of the datagram; `None`: the engine's.
    pub dscp: Option<u8>,
    pub mad: [u8; MAD_LEN],
}

impl std::fmt::Debug for OutMad {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "OutMad {{ to {}:{:#x}, class {:#04x}, method {:#04x} }}",
            self.dest_ip, self.dest_qpn, self.mad[1], self.mad[3]
        )
    }
}

/// What QP1 received, sent and dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GsiCounters {
    pub rx_mads: u64,
    pub tx_mads: u64,
    /// Dropped: not a UD SEND_ONLY (another service or opcode).
    pub not_ud_send: u64,
    /// Dropped: a P_Key other than the default partition's.
    pub bad_pkey: u64,
    /// Dropped: a Q_Key other than the GSI's.
    pub bad_qkey: u64,
    /// Dropped: a payload that is not one 256-byte MAD.
    pub bad_length: u64,
    /// Dropped: the agents left [`GSI_QUEUE`] MADs untaken.
    pub rx_overflow: u64,
    /// Refused: [`GSI_QUEUE`] MADs already waiting to go.
    pub tx_overflow: u64,
}

/// QP1's queues, PSN and counters.
#[derive(Debug, Default)]
pub(crate) struct Gsi {
    rx: VecDeque<ReceivedMad>,
    tx: VecDeque<OutMad>,
    psn: u32,
    pub counters: GsiCounters,
}

impl Gsi {
    /// A frame that named QP1.
    pub fn on_packet(&mut self, p: &Packet<'_>) {
        let bth = &p.repr.bth;
        let send = matches!(bth.opcode, Opcode::SendOnly | Opcode::SendOnlyWithImmediate);
        if bth.service != Service::Ud || !send {
            self.counters.not_ud_send += 1;
            return;
        }
        // The default partition only (rxe: the low 15 bits all ones).
        if bth.pkey & 0x7FFF != 0x7FFF {
            self.counters.bad_pkey += 1;
            return;
        }
        if p.repr.deth.map(|d| d.q_key) != Some(GSI_QKEY) {
            self.counters.bad_qkey += 1;
            return;
        }
        let Ok(mad) = <[u8; MAD_LEN]>::try_from(p.payload) else {
            self.counters.bad_length += 1;
            return;
        };
        if self.rx.len() >= GSI_QUEUE {
            self.counters.rx_overflow += 1;
            return;
        }
        self.counters.rx_mads += 1;
        self.rx.push_back(ReceivedMad {
            src_ip: p.repr.ip.src,
            src_mac: p.repr.eth.src,
            src_qpn: p.repr.deth.map_or(0, |d| d.src_qp),
            pkey: bth.pkey,
            grh: grh_of(p),
            mad,
        });
    }

    pub fn poll(&mut self) -> Option<ReceivedMad> {
        self.rx.pop_front()
    }

    pub fn send(&mut self, m: OutMad) -> Result<(), RcError> {
        if self.tx.len() >= GSI_QUEUE {
            self.counters.tx_overflow += 1;
            return Err(RcError::SendQueueFull(GSI_QPN));
        }
        if let Some(d) = m.dscp.filter(|&d| d > 63) {
            return Err(RcError::OutOfRange {
                what: "dscp",
                value: u64::from(d),
                max: 63,
            });
        }
        self.tx.push_back(m);
        Ok(())
    }

    pub fn has_tx(&self) -> bool {
        !self.tx.is_empty()
    }

    /// Builds the next MAD to send into `buf`; `None` when none waits (or
    /// `buf` is too small: it then waits).
    pub fn emit(&mut self, cfg: &EngineConfig, ident: u16, buf: &mut [u8]) -> Option<usize> {
        let m = self.tx.front()?;
        let dest = AhAttr {
            pd: DEFAULT_PD,
            dest_ip: m.dest_ip,
            dest_mac: m.dest_mac,
            dscp: m.dscp,
            telemetry: false,
        };
        let tpl = ah::template(&dest, cfg).with_src_port(udp::entropy_port(GSI_QPN, m.dest_qpn));
        let mut t = TransportRepr::new(Opcode::SendOnly, m.dest_qpn, self.psn);
        t.bth.service = Service::Ud;
        t.deth = Some(DethRepr {
            q_key: m.qkey,
            src_qp: GSI_QPN,
        });
        let n = tpl
            .emit_with(&t, ident, MAD_LEN, buf, |d| d.copy_from_slice(&m.mad))
            .ok()?;
        self.tx.pop_front();
        self.psn = (self.psn + 1) & 0xFF_FFFF;
        self.counters.tx_mads += 1;
        Some(n)
    }
}
