//! The RC responder of one QP: checks each request in rc.md's order (PSN,
//! opcode sequence, opcode allowed, resources, length, R_Key + bounds +
//! access), executes SENDs into receive WQEs, WRITEs and atomics into
//! memory, queues READ responses and atomic acknowledgements, remembers
//! recent READs and atomics (max_dest_rd_atomic of them) to replay
//! duplicates, answers a SEND that finds no receive WQE with an RNR NAK,
//! sends one NAK per out-of-order episode, and coalesces ACKs.
//!
//! ACKs and NAKs wait while responses are queued, so that nothing the
//! responder sends acknowledges a PSN before the responses that precede it.
//!
//! An unreliable responder (UC, IBA 9.7.5.2) checks the same rules but
//! answers nothing: a packet beyond the one expected (packets were
//! lost), or one that breaks a rule or finds no receive WQE, drops the
//! message it belongs to (the rest of it is dropped too), and the next
//! message's first packet starts clean at its PSN. A packet behind the
//! one expected is a duplicate (or a stale one) and is dropped alone,
//! leaving the message in progress as it was: UC delivers a message at
//! most once. A SEND's receive WQE whose message was dropped is kept for
//! the next SEND (it did not complete).

use std::collections::VecDeque;

use pacer::psn::{psn_add, psn_diff};

use super::recv::RecvQueue;
use super::types::{RecvWr, UdSource, WcOpcode, WcStatus};
use crate::mr::{AtomicOp, Memory, MrView};
use crate::wire::{aeth, Opcode, Packet};

/// Largest DMA length of one message.
pub const MAX_DMA_LEN: u64 = 1 << 31;

/// UC: a packet at most this many PSNs behind the expected one is a
/// duplicate (dropped alone); one further behind is a peer that started
/// again at a new PSN (its first packet starts a message, as rxe takes
/// it), so that a re-connected peer is not ignored for 2^23 packets.
pub const UC_DUPLICATE_WINDOW: i32 = 1 << 12;

/// NAK syndromes.
pub const NAK_PSN_SEQ: u8 = 0x60;
pub const NAK_INVALID_REQUEST: u8 = 0x61;
pub const NAK_REMOTE_ACCESS: u8 = 0x62;
pub const NAK_REMOTE_OP: u8 = 0x63;
/// RNR NAK syndrome: `001` and the 5-bit timer code.
pub const RNR_NAK: u8 = 0x20;

/// Whether a request may reach `[va, va + len)` of the region `rkey` names:
/// R_Key, bounds and access right. A zero-length RDMA WRITE or READ
/// reaches no memory, and its R_Key is not checked (IBA C9-88).
pub(crate) fn remote_ok(mrs: MrView<'_>, rkey: u32, va: u64, len: u64, write: bool) -> bool {
    remote_addr(mrs, rkey, va, len, write).is_some()
}

/// The device address of `va` when [`remote_ok`] (`va` itself for a
/// zero-length access, which reaches no memory).
pub(crate) fn remote_addr(
    mrs: MrView<'_>,
    rkey: u32,
    va: u64,
    len: u64,
    write: bool,
) -> Option<u64> {
    if len == 0 {
        return Some(va);
    }
    mrs.check_remote(rkey, va, len, write).ok()
}

/// The message being received, between its FIRST and LAST packets (one
/// per QP, so the receive WQE is held in place rather than boxed).
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum InMsg {
    /// An RDMA WRITE: where the next byte goes, bytes left, and the whole
    /// length (the byte_len of a WRITE_WITH_IMM completion).
    Write { va: u64, left: u64, total: u64 },
    /// A SEND into this receive WQE, `off` bytes placed so far.
    Send { wqe: RecvWr, off: u64 },
}

/// A READ whose responses are queued or were sent, or an atomic whose
/// acknowledgement is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReadJob {
    /// PSN of the request being answered (responses are numbered from it).
    pub req_psn: u32,
    /// Next response PSN to send.
    pub next_psn: u32,
    /// VA and length of the data from `req_psn` on.
    pub va: u64,
    pub len: u64,
    pub rkey: u32,
    /// MSN of the READ (carried in its responses' AETH).
    pub msn: u32,
    /// An atomic: the original value its ATOMIC_ACKNOWLEDGE carries.
    pub atomic: Option<u64>,
    /// A replay starting inside the READ's responses: they continue as
    /// MIDDLE/LAST, as rxe replays them (a new READ starts FIRST/ONLY).
    pub resumed: bool,
}

impl ReadJob {
    fn packets(&self, mtu: u32) -> u32 {
        if self.atomic.is_some() {
            return 1;
        }
        (self.len.div_ceil(u64::from(mtu)).max(1)) as u32
    }
}

/// A READ or atomic remembered for duplicate requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Memo {
    first_psn: u32,
    npsn: u32,
    va: u64,
    len: u64,
    rkey: u32,
    msn: u32,
    /// An atomic's saved result (never executed twice).
    atomic: Option<u64>,
}

/// One response packet to send: READ response or ATOMIC_ACKNOWLEDGE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RespItem {
    pub psn: u32,
    pub rkey: u32,
    pub opcode: Opcode,
    pub va: u64,
    pub len: u32,
    pub msn: u32,
    pub atomic: Option<u64>,
}

/// An ACK or NAK to send: (BTH PSN, AETH syndrome, MSN).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AckItem {
    pub psn: u32,
    pub syndrome: u8,
    pub msn: u32,
}

/// A receive WQE the responder finished (successfully or not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RecvDone {
    pub wr_id: u64,
    pub status: WcStatus,
    pub opcode: WcOpcode,
    pub byte_len: u32,
    pub imm: Option<u32>,
    /// The message's last packet carried the Solicited Event bit.
    pub solicited: bool,
    /// A datagram's sender (UD only).
    pub src: Option<UdSource>,
}

/// What the responder made of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Executed (data placed, READ or atomic queued).
    Accepted,
    /// A duplicate: not re-executed (re-ACKed or replayed).
    Duplicate,
    /// Beyond the expected PSN: dropped (NAK sent once per episode).
    OutOfOrder,
    /// No receive WQE: RNR NAK sent, nothing executed.
    ReceiverNotReady,
    /// Refused with this NAK; the QP goes to ERR.
    Fatal(u8),
    /// Not a request this responder handles; dropped.
    Ignored,
    /// UC: the packet was dropped, with the rest of its message.
    Dropped,
}

#[derive(Debug)]
pub(crate) struct Responder {
    /// UC: no ACKs or NAKs, messages with a loss dropped whole.
    unreliable: bool,
    /// UC: dropping packets until a message's first one.
    dropping: bool,
    /// UC: the receive WQE of a SEND that was dropped, for the next.
    spare: Option<RecvWr>,
    pub epsn: u32,
    pub msn: u32,
    pub mtu: u32,
    pub remote_write: bool,
    pub remote_read: bool,
    pub remote_atomic: bool,
    /// RNR NAK timer code sent with RNR NAKs.
    pub min_rnr_timer: u8,
    nak_sent: bool,
    msg: Option<InMsg>,
    memos: VecDeque<Memo>,
    max_memos: usize,
    pub jobs: VecDeque<ReadJob>,
    /// Coalesced ACK waiting to go.
    ack: Option<AckItem>,
    /// The ACK owed to requests accepted without AckReq (sent when an
    /// AckReq comes, or after the QP's ACK delay).
    owed: Option<AckItem>,
    /// NAK waiting to go (sent before any ACK).
    nak: Option<AckItem>,
    /// Send the pending ACK twice: it answers a retransmission, so the
    /// previous ACK was probably lost.
    ack_twice: bool,
    /// Receive WQEs finished by the last request (a SEND's, or one failed
    /// with it), and whether an SRQ limit was crossed taking one.
    pub done: Option<RecvDone>,
    pub srq_limit_crossed: bool,
}

impl Responder {
    pub fn new() -> Self {
        Responder {
            unreliable: false,
            dropping: false,
            spare: None,
            epsn: 0,
            msn: 0,
            mtu: 1024,
            remote_write: false,
            remote_read: false,
            remote_atomic: false,
            min_rnr_timer: 0,
            nak_sent: false,
            msg: None,
            memos: VecDeque::new(),
            max_memos: 1,
            jobs: VecDeque::new(),
            ack: None,
            owed: None,
            nak: None,
            ack_twice: false,
            done: None,
            srq_limit_crossed: false,
        }
    }

    /// Settings of the RTR transition.
    pub fn configure(&mut self, mtu: u32, rq_psn: u32, max_dest_rd_atomic: u8, min_rnr_timer: u8) {
        self.mtu = mtu;
        self.epsn = rq_psn;
        self.min_rnr_timer = min_rnr_timer & 31;
        self.max_memos = usize::from(max_dest_rd_atomic.max(1));
        self.memos = VecDeque::with_capacity(self.max_memos);
        self.jobs = VecDeque::with_capacity(self.max_memos + 1);
    }

    /// Makes this an unreliable (UC) responder: see the module doc.
    pub fn make_unreliable(&mut self) {
        self.unreliable = true;
    }

    /// The ACK or NAK to send now, if any and if no response must go
    /// before it.
    pub fn take_ack(&mut self) -> Option<AckItem> {
        if !self.jobs.is_empty() {
            return None;
        }
        if let Some(n) = self.nak.take() {
            return Some(n);
        }
        if std::mem::take(&mut self.ack_twice) {
            return self.ack;
        }
        self.ack.take()
    }

    pub fn has_ack(&self) -> bool {
        self.jobs.is_empty() && (self.nak.is_some() || self.ack.is_some())
    }

    /// Requests were accepted without AckReq and not acknowledged yet.
    pub fn ack_owed(&self) -> bool {
        self.owed.is_some()
    }

    /// The ACK delay ran out: acknowledge what was accepted without
    /// AckReq.
    pub fn send_owed_ack(&mut self) {
        if let Some(a) = self.owed.take() {
            self.ack = Some(a);
        }
    }

    fn nak(&mut self, psn: u32, syndrome: u8) {
        self.owed = None;
        self.nak = Some(AckItem {
            psn,
            syndrome,
            msn: self.msn,
        });
    }

    fn ack_now(&mut self, psn: u32) {
        self.owed = None;
        self.ack = Some(AckItem {
            psn,
            syndrome: aeth::ACK_UNLIMITED,
            msn: self.msn,
        });
    }

    /// Handles a request packet (SEND, WRITE, READ request, atomic).
    /// Receive WQEs come from `rq`; a finished one is left in `done`.
    pub fn on_request(
        &mut self,
        p: &Packet<'_>,
        mrs: MrView<'_>,
        mem: &mut impl Memory,
        rq: &mut RecvQueue,
    ) -> Verdict {
        let op = p.repr.bth.opcode;
        if !op.is_request() {
            return Verdict::Ignored;
        }
        if self.unreliable {
            return self.on_unreliable(p, mrs, mem, rq);
        }
        self.on_reliable(p, mrs, mem, rq)
    }

    /// UC: see the module doc.
    fn on_unreliable(
        &mut self,
        p: &Packet<'_>,
        mrs: MrView<'_>,
        mem: &mut impl Memory,
        rq: &mut RecvQueue,
    ) -> Verdict {
        use Opcode::*;
        let op = p.repr.bth.opcode;
        let starts = matches!(
            op,
            SendFirst
                | SendOnly
                | SendOnlyWithImmediate
                | RdmaWriteFirst
                | RdmaWriteOnly
                | RdmaWriteOnlyWithImmediate
        );
        let d = psn_diff(p.repr.bth.psn, self.epsn);
        if d < 0 && d > -UC_DUPLICATE_WINDOW {
            return Verdict::Dropped;
        }
        if self.dropping || d != 0 {
            if !starts {
                self.drop_message();
                return Verdict::Dropped;
            }
            // A message cut short ends here; this one starts clean.
            self.drop_message();
            self.dropping = false;
            self.epsn = p.repr.bth.psn;
        }
        match self.on_reliable(p, mrs, mem, rq) {
            v @ (Verdict::Accepted | Verdict::Ignored | Verdict::Dropped) => v,
            Verdict::Fatal(_)
            | Verdict::ReceiverNotReady
            | Verdict::OutOfOrder
            | Verdict::Duplicate => {
                // Nothing is answered; the message goes.
                self.nak = None;
                self.nak_sent = false;
                self.drop_message();
                Verdict::Dropped
            }
        }
    }

    /// UC: forgets the message in progress (a SEND's receive WQE is kept
    /// for the next SEND) and drops packets until the next message.
    fn drop_message(&mut self) {
        self.dropping = true;
        if let Some(InMsg::Send { wqe, .. }) = self.msg.take() {
            self.spare = Some(wqe);
        }
    }

    /// RC: rc.md's checks in order, then the request is executed.
    fn on_reliable(
        &mut self,
        p: &Packet<'_>,
        mrs: MrView<'_>,
        mem: &mut impl Memory,
        rq: &mut RecvQueue,
    ) -> Verdict {
        let op = p.repr.bth.opcode;
        let psn = p.repr.bth.psn;
        let d = psn_diff(psn, self.epsn);
        if d > 0 {
            if !self.nak_sent {
                self.nak_sent = true;
                self.nak(self.epsn, NAK_PSN_SEQ);
            }
            return Verdict::OutOfOrder;
        }
        if d < 0 {
            return self.duplicate(p, mrs);
        }

        // Opcode sequence: inside a multi-packet message only its own
        // MIDDLE/LAST; outside one, no MIDDLE/LAST.
        use Opcode::*;
        let seq_ok = match (self.msg, op) {
            (Some(InMsg::Write { .. }), RdmaWriteMiddle | RdmaWriteLast)
            | (Some(InMsg::Write { .. }), RdmaWriteLastWithImmediate)
            | (Some(InMsg::Send { .. }), SendMiddle | SendLast | SendLastWithImmediate)
            | (Some(InMsg::Send { .. }), SendLastWithInvalidate) => true,
            (Some(_), _) => false,
            (None, RdmaWriteMiddle | RdmaWriteLast | RdmaWriteLastWithImmediate) => false,
            (None, SendMiddle | SendLast | SendLastWithImmediate | SendLastWithInvalidate) => false,
            (None, _) => true,
        };
        if !seq_ok {
            return self.fatal(psn, NAK_INVALID_REQUEST);
        }
        // Opcode allowed by the QP's access flags; SEND with invalidate
        // needs memory windows, which this NIC does not have.
        let allowed = match op {
            RdmaReadRequest => self.remote_read,
            RdmaWriteFirst
            | RdmaWriteMiddle
            | RdmaWriteLast
            | RdmaWriteLastWithImmediate
            | RdmaWriteOnly
            | RdmaWriteOnlyWithImmediate => self.remote_write,
            CompareSwap | FetchAdd => self.remote_atomic,
            SendFirst
            | SendMiddle
            | SendLast
            | SendLastWithImmediate
            | SendOnly
            | SendOnlyWithImmediate => true,
            _ => false,
        };
        if !allowed {
            return self.fatal(psn, NAK_INVALID_REQUEST);
        }
        match op {
            RdmaReadRequest => self.read_request(p, mrs),
            CompareSwap | FetchAdd => self.atomic(p, mrs, mem),
            SendFirst
            | SendMiddle
            | SendLast
            | SendLastWithImmediate
            | SendOnly
            | SendOnlyWithImmediate => self.send(p, mrs, mem, rq),
            _ => self.write(p, mrs, mem, rq),
        }
    }

    /// The request at ePSN was executed: expect the next, ACK if asked.
    fn accepted(&mut self, p: &Packet<'_>, npsn: u32) -> Verdict {
        let psn = p.repr.bth.psn;
        self.epsn = psn_add(psn, npsn);
        self.nak_sent = false;
        if self.unreliable {
            return Verdict::Accepted;
        }
        let answered = matches!(
            p.repr.bth.opcode,
            Opcode::RdmaReadRequest | Opcode::CompareSwap | Opcode::FetchAdd
        );
        if answered {
            // Its responses acknowledge what came before it.
            self.owed = None;
        } else if p.repr.bth.ack_req {
            self.ack_now(psn);
        } else if self.msg.is_none() {
            // A message ended without AckReq (a coalescing requester's):
            // acknowledged by the next AckReq or after the ACK delay.
            self.owed = Some(AckItem {
                psn,
                syndrome: aeth::ACK_UNLIMITED,
                msn: self.msn,
            });
        }
        Verdict::Accepted
    }

    fn bump_msn(&mut self) {
        self.msn = (self.msn + 1) & 0x00FF_FFFF;
    }

    fn remember(&mut self, m: Memo) {
        if self.memos.len() == self.max_memos {
            self.memos.pop_front();
        }
        self.memos.push_back(m);
    }

    /// Responder resources are used up: more READs and atomics queued than
    /// max_dest_rd_atomic allows (the requester broke its max_rd_atomic).
    fn resources_exhausted(&self) -> bool {
        self.jobs.len() >= self.max_memos
    }

    fn read_request(&mut self, p: &Packet<'_>, mrs: MrView<'_>) -> Verdict {
        let psn = p.repr.bth.psn;
        if self.resources_exhausted() {
            return self.fatal(psn, NAK_INVALID_REQUEST);
        }
        let Some(reth) = p.repr.reth else {
            return self.fatal(psn, NAK_INVALID_REQUEST);
        };
        let len = u64::from(reth.dma_len);
        if len > MAX_DMA_LEN {
            return self.fatal(psn, NAK_INVALID_REQUEST);
        }
        if !remote_ok(mrs, reth.r_key, reth.va, len, false) {
            return self.fatal(psn, NAK_REMOTE_ACCESS);
        }
        self.bump_msn();
        let job = ReadJob {
            req_psn: psn,
            next_psn: psn,
            va: reth.va,
            len,
            rkey: reth.r_key,
            msn: self.msn,
            atomic: None,
            resumed: false,
        };
        let npsn = job.packets(self.mtu);
        self.remember(Memo {
            first_psn: psn,
            npsn,
            va: reth.va,
            len,
            rkey: reth.r_key,
            msn: self.msn,
            atomic: None,
        });
        self.jobs.push_back(job);
        self.accepted(p, npsn)
    }

    /// CMP_SWAP or FETCH_ADD: 8-byte aligned (else invalid request), R_Key
    /// with remote-atomic right (else remote access error), executed once
    /// and its result remembered for duplicates.
    fn atomic(&mut self, p: &Packet<'_>, mrs: MrView<'_>, mem: &mut impl Memory) -> Verdict {
        let psn = p.repr.bth.psn;
        if self.resources_exhausted() {
            return self.fatal(psn, NAK_INVALID_REQUEST);
        }
        let Some(a) = p.repr.atomic else {
            return self.fatal(psn, NAK_INVALID_REQUEST);
        };
        if a.va % 8 != 0 {
            return self.fatal(psn, NAK_INVALID_REQUEST);
        }
        let Ok(dev) = mrs.check_remote_atomic(a.r_key, a.va) else {
            return self.fatal(psn, NAK_REMOTE_ACCESS);
        };
        let op = if p.repr.bth.opcode == Opcode::CompareSwap {
            AtomicOp::CmpSwap {
                compare: a.compare,
                swap: a.swap_add,
            }
        } else {
            AtomicOp::FetchAdd { add: a.swap_add }
        };
        let orig = mem.atomic(dev, op);
        self.bump_msn();
        self.remember(Memo {
            first_psn: psn,
            npsn: 1,
            va: a.va,
            len: 8,
            rkey: a.r_key,
            msn: self.msn,
            atomic: Some(orig),
        });
        self.jobs.push_back(ReadJob {
            req_psn: psn,
            next_psn: psn,
            va: a.va,
            len: 8,
            rkey: a.r_key,
            msn: self.msn,
            atomic: Some(orig),
            resumed: false,
        });
        self.accepted(p, 1)
    }

    /// No receive WQE for a SEND (or WRITE with immediate): RNR NAK with
    /// this QP's timer for the packet's PSN; later packets are dropped
    /// without NAKs until it comes again.
    fn not_ready(&mut self, psn: u32) -> Verdict {
        self.nak(psn, RNR_NAK | self.min_rnr_timer);
        self.nak_sent = true;
        Verdict::ReceiverNotReady
    }

    fn take_wqe(&mut self, rq: &mut RecvQueue) -> Option<RecvWr> {
        if let Some(w) = self.spare.take() {
            return Some(w);
        }
        let (wqe, crossed) = rq.pop()?;
        self.srq_limit_crossed |= crossed;
        Some(wqe)
    }

    fn send(
        &mut self,
        p: &Packet<'_>,
        mrs: MrView<'_>,
        mem: &mut impl Memory,
        rq: &mut RecvQueue,
    ) -> Verdict {
        use Opcode::*;
        let op = p.repr.bth.opcode;
        let psn = p.repr.bth.psn;
        let plen = p.payload.len() as u64;
        let mtu = u64::from(self.mtu);
        let first = matches!(op, SendFirst | SendOnly | SendOnlyWithImmediate);
        let last = op != SendFirst && op != SendMiddle;
        let len_ok = match (first, last) {
            (true, true) => plen <= mtu,
            (_, false) => plen == mtu,
            (false, true) => (1..=mtu).contains(&plen),
        };
        if !len_ok {
            return self.fatal(psn, NAK_INVALID_REQUEST);
        }
        // The receive WQE stays in the message state while the message
        // lasts: each packet updates its offset in place.
        if !matches!(self.msg, Some(InMsg::Send { .. })) {
            match self.take_wqe(rq) {
                Some(wqe) => self.msg = Some(InMsg::Send { wqe, off: 0 }),
                None => return self.not_ready(psn),
            }
        }
        let Some(InMsg::Send { wqe, off }) = &mut self.msg else {
            return self.fatal(psn, NAK_INVALID_REQUEST);
        };
        let (wr_id, at) = (wqe.wr_id, *off);
        let failed = if at + plen > wqe.sg.total() {
            Some((WcStatus::LocLenErr, NAK_INVALID_REQUEST))
        } else if wqe.sg.scatter(mrs, mem, at, p.payload).is_err() {
            Some((WcStatus::LocProtErr, NAK_REMOTE_OP))
        } else {
            *off = at + plen;
            None
        };
        if let Some((status, nak)) = failed {
            self.msg = None;
            self.finish(wr_id, status, WcOpcode::Recv, 0, None, false);
            return self.fatal(psn, nak);
        }
        if last {
            self.msg = None;
            self.bump_msn();
            self.finish(
                wr_id,
                WcStatus::Success,
                WcOpcode::Recv,
                at + plen,
                p.repr.imm,
                p.repr.bth.solicited,
            );
        }
        self.accepted(p, 1)
    }

    fn finish(
        &mut self,
        wr_id: u64,
        status: WcStatus,
        opcode: WcOpcode,
        len: u64,
        imm: Option<u32>,
        solicited: bool,
    ) {
        self.done = Some(RecvDone {
            wr_id,
            status,
            opcode,
            byte_len: len.min(u64::from(u32::MAX)) as u32,
            imm,
            solicited,
            src: None,
        });
    }

    /// RDMA WRITE: length rules, R_Key + bounds + access, a receive WQE
    /// for the immediate, then execute.
    fn write(
        &mut self,
        p: &Packet<'_>,
        mrs: MrView<'_>,
        mem: &mut impl Memory,
        rq: &mut RecvQueue,
    ) -> Verdict {
        use Opcode::*;
        let op = p.repr.bth.opcode;
        let psn = p.repr.bth.psn;
        let mtu = u64::from(self.mtu);
        let plen = p.payload.len() as u64;
        let (va, left, total, last) = match op {
            RdmaWriteFirst | RdmaWriteOnly | RdmaWriteOnlyWithImmediate => {
                let Some(reth) = p.repr.reth else {
                    return self.fatal(psn, NAK_INVALID_REQUEST);
                };
                let total = u64::from(reth.dma_len);
                let only = op != RdmaWriteFirst;
                let ok = total <= MAX_DMA_LEN
                    && if only {
                        plen <= mtu && plen == total
                    } else {
                        plen == mtu && total > mtu
                    };
                if !ok {
                    return self.fatal(psn, NAK_INVALID_REQUEST);
                }
                // The message's bytes are contiguous in one region, so its
                // device address is kept for the packets that follow.
                let Some(dev) = remote_addr(mrs, reth.r_key, reth.va, total, true) else {
                    return self.fatal(psn, NAK_REMOTE_ACCESS);
                };
                (dev, total, total, only)
            }
            _ => {
                let Some(InMsg::Write { va, left, total }) = self.msg else {
                    return self.fatal(psn, NAK_INVALID_REQUEST);
                };
                let last = op != RdmaWriteMiddle;
                let ok = if last {
                    plen >= 1 && plen <= mtu && plen == left
                } else {
                    plen == mtu && left > mtu
                };
                if !ok {
                    return self.fatal(psn, NAK_INVALID_REQUEST);
                }
                (va, left, total, last)
            }
        };
        let wqe = if p.repr.imm.is_some() {
            match self.take_wqe(rq) {
                Some(w) => Some(w),
                None => return self.not_ready(psn),
            }
        } else {
            None
        };
        mem.write(va, p.payload);
        if last {
            self.msg = None;
            self.bump_msn();
            if let Some(w) = wqe {
                self.finish(
                    w.wr_id,
                    WcStatus::Success,
                    WcOpcode::RecvRdmaWithImm,
                    total,
                    p.repr.imm,
                    p.repr.bth.solicited,
                );
            }
        } else {
            self.msg = Some(InMsg::Write {
                va: va + plen,
                left: left - plen,
                total,
            });
        }
        self.accepted(p, 1)
    }

    fn fatal(&mut self, psn: u32, syndrome: u8) -> Verdict {
        self.nak(psn, syndrome);
        Verdict::Fatal(syndrome)
    }

    /// A request below ePSN: SENDs and WRITEs are re-ACKed whatever their
    /// AckReq bit (the requester retransmits because an ACK went missing,
    /// as rxe answers); READs inside a remembered READ are replayed from
    /// memory; atomics answer with their saved result.
    fn duplicate(&mut self, p: &Packet<'_>, mrs: MrView<'_>) -> Verdict {
        let psn = p.repr.bth.psn;
        let op = p.repr.bth.opcode;
        if !matches!(
            op,
            Opcode::RdmaReadRequest | Opcode::CompareSwap | Opcode::FetchAdd
        ) {
            self.ack_now(psn_add(self.epsn, 0xFF_FFFF));
            self.ack_twice = true;
            return Verdict::Duplicate;
        }
        let Some(m) = self.memos.iter().copied().find(|m| {
            let d = psn_diff(psn, m.first_psn);
            d >= 0 && (d as u32) < m.npsn
        }) else {
            return Verdict::Ignored;
        };
        if m.atomic.is_some() {
            if op == Opcode::RdmaReadRequest || m.first_psn != psn {
                return Verdict::Ignored;
            }
            self.jobs.retain(|j| j.req_psn != psn);
            self.jobs.push_back(ReadJob {
                req_psn: psn,
                next_psn: psn,
                va: m.va,
                len: 8,
                rkey: m.rkey,
                msn: m.msn,
                atomic: m.atomic,
                resumed: false,
            });
            return Verdict::Duplicate;
        }
        let Some(reth) = p.repr.reth else {
            return Verdict::Ignored;
        };
        // As rxe: the retried request must ask for the same bytes or a part
        // of them, with the same R_Key.
        let len = u64::from(reth.dma_len);
        let inside = reth.va >= m.va
            && reth
                .va
                .checked_add(len)
                .is_some_and(|end| end <= m.va.saturating_add(m.len));
        if !inside || reth.r_key != m.rkey {
            return Verdict::Ignored;
        }
        if !remote_ok(mrs, m.rkey, reth.va, u64::from(reth.dma_len), false) {
            return Verdict::Ignored;
        }
        // Replace any queued responses of the same READ by the replay.
        self.jobs.retain(|j| {
            let d = psn_diff(j.req_psn, m.first_psn);
            !(d >= 0 && (d as u32) < m.npsn)
        });
        self.jobs.push_back(ReadJob {
            req_psn: psn,
            next_psn: psn,
            va: reth.va,
            len: u64::from(reth.dma_len),
            rkey: m.rkey,
            msn: m.msn,
            atomic: None,
            resumed: psn != m.first_psn,
        });
        Verdict::Duplicate
    }

    /// Whether a READ response or atomic ACK waits to be sent: when not,
    /// [`Responder::peek_response`] is `None`.
    pub fn has_response(&self) -> bool {
        !self.jobs.is_empty()
    }

    /// The next response packet, if any.
    pub fn peek_response(&self) -> Option<RespItem> {
        let j = self.jobs.front()?;
        if j.atomic.is_some() {
            return Some(RespItem {
                psn: j.next_psn,
                rkey: j.rkey,
                opcode: Opcode::AtomicAcknowledge,
                va: j.va,
                len: 0,
                msn: j.msn,
                atomic: j.atomic,
            });
        }
        let n = j.packets(self.mtu);
        let i = psn_diff(j.next_psn, j.req_psn) as u32;
        let mtu = u64::from(self.mtu);
        let off = u64::from(i) * mtu;
        let len = (j.len - off.min(j.len)).min(mtu) as u32;
        let opcode = match (i == 0 && !j.resumed, i + 1 == n) {
            (true, true) => Opcode::RdmaReadResponseOnly,
            (true, false) => Opcode::RdmaReadResponseFirst,
            (false, true) => Opcode::RdmaReadResponseLast,
            (false, false) => Opcode::RdmaReadResponseMiddle,
        };
        Some(RespItem {
            psn: j.next_psn,
            rkey: j.rkey,
            opcode,
            va: j.va + off,
            len,
            msn: j.msn,
            atomic: None,
        })
    }

    /// The response `peek_response` returned was sent.
    pub fn response_sent(&mut self) {
        let mtu = self.mtu;
        if let Some(j) = self.jobs.front_mut() {
            j.next_psn = psn_add(j.next_psn, 1);
            if psn_diff(j.next_psn, j.req_psn) as u32 >= j.packets(mtu) {
                self.jobs.pop_front();
            }
        }
    }

    /// The region of a queued READ is gone: NAK remote access error for the
    /// response PSN; the QP goes to ERR.
    pub fn refuse_read(&mut self, psn: u32) {
        self.jobs.clear();
        self.nak(psn, NAK_REMOTE_ACCESS);
    }

    /// Drops everything queued (the QP went to ERR); returns the receive
    /// WQE a SEND in progress held, to be flushed.
    pub fn reset_queues(&mut self) -> Option<RecvWr> {
        self.jobs.clear();
        self.ack = None;
        match self.msg.take() {
            Some(InMsg::Send { wqe, .. }) => Some(wqe),
            _ => self.spare.take(),
        }
    }
}
