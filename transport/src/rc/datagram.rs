//! What a UD QP does with a datagram that reaches it (IBA 9.6 and 10.2.5,
//! RoCEv2 annex A17.4.5): a SEND_ONLY or SEND_ONLY_WITH_IMMEDIATE whose
//! DETH carries the QP's Q_Key and whose payload fits the path MTU takes
//! one receive WQE. The WQE's first 40 bytes get the GRH as a RoCEv2 NIC
//! over IPv4 writes it (20 zero bytes, then the datagram's IPv4 header),
//! the payload follows. No ACK, no NAK, no PSN check: a datagram with no
//! receive WQE, a wrong Q_Key or too long a payload is dropped and
//! counted, and the QP stays as it was.

use super::recv::RecvQueue;
use super::responder::RecvDone;
use super::types::{UdSource, WcOpcode, WcStatus};
use crate::mr::{Memory, MrView};
use crate::wire::packet::pad_for;
use crate::wire::{icrc, ipv4, packet::transport_header_len, udp, Opcode, Packet};

/// Bytes at the start of every UD receive buffer that hold the GRH.
pub const GRH_LEN: usize = 40;

/// Why a datagram was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dropped {
    /// Its Q_Key is not the QP's (IBA C10-14).
    QKey,
    /// No receive WQE was posted (UD has no RNR NAK).
    NoWqe,
    /// Its payload is longer than the path MTU.
    TooLong,
}

/// What receiving a datagram did: a WQE finished (successfully, or with
/// LOC_LEN_ERR when the datagram and its GRH do not fit it, or
/// LOC_PROT_ERR when its buffers are not writable), or a drop.
pub(crate) type Received = Result<RecvDone, Dropped>;

/// The GRH of a RoCEv2 datagram over IPv4 as a receiver's buffer gets it:
/// 20 zero bytes, then the IPv4 header the frame carried (re-emitted from
/// its fields, which the parse kept whole: options and fragments are
/// refused before a packet gets here).
pub fn grh_of(p: &Packet<'_>) -> [u8; GRH_LEN] {
    // (QP1's MADs get the same: see `gsi`.)
    let tlm = p.repr.tlm.map_or(0, |t| t.block_len());
    let plen = p.payload.len();
    let after_ip = udp::HEADER_LEN
        + transport_header_len(p.repr.bth.layout(), tlm)
        + plen
        + pad_for(plen)
        + icrc::ICRC_LEN;
    let mut g = [0u8; GRH_LEN];
    p.repr
        .ip
        .emit(&mut g[GRH_LEN - ipv4::HEADER_LEN..], after_ip);
    g
}

/// Receives datagram `p` on a UD QP with Q_Key `qkey` and path MTU `mtu`,
/// into a receive WQE of `rq`.
pub(crate) fn receive(
    p: &Packet<'_>,
    qkey: u32,
    mtu: u32,
    mrs: MrView<'_>,
    mem: &mut impl Memory,
    rq: &mut RecvQueue,
    srq_limit_crossed: &mut bool,
) -> Received {
    let Some(deth) = p.repr.deth else {
        return Err(Dropped::QKey);
    };
    if deth.q_key != qkey {
        return Err(Dropped::QKey);
    }
    let plen = p.payload.len();
    if plen > mtu as usize {
        return Err(Dropped::TooLong);
    }
    let Some((wqe, crossed)) = rq.pop() else {
        return Err(Dropped::NoWqe);
    };
    *srq_limit_crossed |= crossed;
    let op = p.repr.bth.opcode;
    let done = |status, byte_len: usize| RecvDone {
        wr_id: wqe.wr_id,
        status,
        opcode: WcOpcode::Recv,
        byte_len: byte_len as u32,
        imm: if op == Opcode::SendOnlyWithImmediate {
            p.repr.imm
        } else {
            None
        },
        solicited: p.repr.bth.solicited,
        src: Some(UdSource {
            qpn: deth.src_qp,
            ip: p.repr.ip.src,
        }),
    };
    if (GRH_LEN + plen) as u64 > wqe.sg.total() {
        return Ok(done(WcStatus::LocLenErr, 0));
    }
    let grh = grh_of(p);
    let placed = wqe
        .sg
        .scatter(mrs, mem, 0, &grh)
        .and_then(|()| wqe.sg.scatter(mrs, mem, GRH_LEN as u64, p.payload));
    Ok(match placed {
        Ok(()) => done(WcStatus::Success, GRH_LEN + plen),
        Err(_) => done(WcStatus::LocProtErr, 0),
    })
}
