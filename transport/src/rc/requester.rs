//! The RC requester of one QP: segments SEND, WRITE, READ and atomic work
//! requests into packets, keeps PSNs, bytes in flight and the outstanding
//! READs and atomics bounded, holds fenced WRs behind earlier READs and
//! atomics, and recovers with go-back-N on NAK(PSN sequence error), on
//! local ACK timeout, on implied NAKs (an ACK past a READ or atomic whose
//! responses were lost) and, after the peer's RNR timer, on RNR NAKs.
//! Completions leave in post order.
//!
//! An unreliable requester (UC, UD) segments the same way and numbers
//! packets the same way, but asks for no ACK, keeps no timer, and takes
//! each packet as acknowledged when it is sent: a WR completes once its
//! last packet has left.
//!
//! It never touches memory or builds frames: it says which packet is next
//! ([`Requester::peek`]) and learns what was sent and what came back.

use std::collections::VecDeque;

use pacer::psn::{psn_add, psn_diff, psn_ge, psn_gt};

use super::read_recovery::ReadRecovery;
use super::sgl::Sge;
use super::types::{
    rnr_timer_ns, Cqe, InlineData, Qpn, SendLimits, UdDest, WcOpcode, WcStatus, WrHead, WrOp,
    WrParts, WrPayload,
};
use crate::wire::{AtomicEthRepr, Opcode, RethRepr};

/// Packets between AckReq flags, within a message or across unasked
/// message ends (rc.md: at least every 64).
pub const ACK_REQ_EVERY: u32 = 64;

/// Unsignaled messages whose ends may go without AckReq at most, towards
/// a peer that ACKs on its own after an idle delay (our NIC's responder:
/// [`super::ACK_DELAY_NS`]).
pub const ACK_REQ_MSGS_MAX: u32 = 64;

/// Coalescing needs a local ACK timeout well above the peer's ACK delay,
/// or a tail of unasked messages would time out before its ACK comes.
const MIN_RTO_TO_COALESCE_NS: u64 = 2 * super::ACK_DELAY_NS;

#[derive(Debug, Clone, Copy)]
pub(crate) struct SqEntry {
    /// The operation (its local buffers are kept apart, so that an entry
    /// stays small: it is copied and scanned per packet).
    pub wr: WrHead,
    /// The first local buffer (the only one of most WRs).
    first: Sge,
    /// Local buffers (the rest wait in the requester's side buffer).
    nsge: u8,
    /// The message is inline (in the requester's inline buffer).
    inline: bool,
    /// Position of this WR's extra buffers or inline bytes in the side
    /// buffers (a running count).
    side: u64,
    pub first_psn: u32,
    /// PSNs the request uses: packets (SEND, WRITE) or response packets
    /// (READ); an atomic uses one.
    pub npsn: u32,
    /// Message length (bytes of the local buffers).
    pub len: u32,
    /// READ or atomic: response packets received in order (more may have
    /// landed beyond, see [`ReadRecovery`]).
    pub rd_got: u32,
    pub rd_requested: bool,
    pub done: bool,
    /// Fails with this status once every WR before it has completed (a bad
    /// local buffer found at post or at send time); nothing after it goes
    /// out.
    pub fail: Option<WcStatus>,
}

impl SqEntry {
    fn last_psn(&self) -> u32 {
        psn_add(self.first_psn, self.npsn - 1)
    }

    /// A READ or atomic: answered by responses, not ACKs.
    fn is_read(&self) -> bool {
        self.wr.op.is_read_or_atomic()
    }

    fn contains(&self, psn: u32) -> bool {
        let d = psn_diff(psn, self.first_psn);
        d >= 0 && (d as u32) < self.npsn
    }

    /// Payload bytes of its packets with PSNs in `[from, to)` at `mtu`.
    fn bytes_in(&self, from: u32, to: u32, mtu: u32) -> u64 {
        let k1 = psn_diff(from, self.first_psn).clamp(0, self.npsn as i32) as u32;
        let k2 = psn_diff(to, self.first_psn).clamp(0, self.npsn as i32) as u32;
        if k2 > k1 {
            bytes_of(self.len, mtu, k1, k2)
        } else {
            0
        }
    }
}

/// The packet the requester wants to send next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TxItem {
    pub psn: u32,
    pub opcode: Opcode,
    pub ack_req: bool,
    /// Payload (SEND and WRITE): bytes `[off, off + len)` of the message,
    /// gathered from the WR's local buffers.
    pub off: u64,
    pub len: u32,
    /// RETH (FIRST/ONLY/READ request): remote VA, R_Key, DMA length.
    pub reth: Option<(u64, u32, u32)>,
    /// AtomicETH (CMP_SWAP, FETCH_ADD).
    pub atomic: Option<AtomicEthRepr>,
    pub imm: Option<u32>,
    /// The BTH's Solicited Event bit: the last packet of a SEND or RDMA
    /// WRITE with immediate whose WR asked for it (IBV_SEND_SOLICITED).
    pub solicited: bool,
    /// A packet sent before (after go-back-N).
    pub retransmit: bool,
    /// A UD SEND: where it goes.
    pub ud: Option<UdDest>,
}

impl TxItem {
    /// Its RETH, when it has one.
    #[inline(always)]
    pub fn reth_repr(&self) -> Option<RethRepr> {
        self.reth
            .map(|(va, r_key, dma_len)| RethRepr { va, r_key, dma_len })
    }
}

/// The packet [`Requester::peek`] would build: the WR, its packet index
/// and what the gates computed on the way.
struct Next<'a> {
    e: &'a SqEntry,
    /// The packet's index in its message (READ: response packets asked
    /// for before it).
    k: u32,
    /// Payload bytes (0 for a READ request or an atomic).
    len: u32,
    opcode: Opcode,
    /// PSNs sent and not acknowledged.
    outstanding: u32,
    retransmit: bool,
}

/// What the requester decided about an incoming response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fatal {
    /// The WQE failed with this status; the QP goes to ERR.
    Fail(WcStatus),
}

#[derive(Debug)]
pub(crate) struct Requester {
    /// UC or UD: no ACKs, a packet counts as acknowledged once sent.
    unreliable: bool,
    sq: VecDeque<SqEntry>,
    cap: usize,
    /// First PSN of the next posted WR.
    next_psn: u32,
    /// Oldest PSN not yet acknowledged.
    pub una: u32,
    /// Next PSN to transmit.
    tx_psn: u32,
    /// Index in `sq` of the entry holding `tx_psn` (`sq.len()`: all sent).
    tx_idx: usize,
    /// One past the highest PSN ever transmitted.
    hi: u32,
    pub mtu: u32,
    retry_cnt: u8,
    retries_left: u8,
    rnr_retry: u8,
    rnr_left: u8,
    rto_ns: u64,
    timer: Option<u64>,
    max_outstanding_psns: u32,
    max_rd: u32,
    rd_outstanding: u32,
    /// Payload bytes of WRITE packets in [una, tx_psn).
    pub inflight: u64,
    /// AckReq at least every this many packets.
    ack_req_every: u32,
    /// AckReq at least every this many messages (1: on every message end).
    ack_req_msgs: u32,
    /// Messages ended without AckReq since the last AckReq went out.
    unasked_msgs: u32,
    /// Packets sent without AckReq since the last AckReq went out.
    unasked_pkts: u32,
    /// Which responses of the oldest incomplete READ landed, and when to
    /// ask for the missing ones again.
    rd_recovery: ReadRecovery,
    /// Packets below this PSN were sent before (retransmissions).
    resend_until: u32,
    /// Something (an ACK, NAK or response, even a stale one) came from the
    /// peer since the last timeout: the peer is alive, only the path lossy.
    heard: bool,
    /// Timeouts in a row without progress while the peer was heard.
    stalls: u32,
    /// After a timeout with nothing heard, the first packet goes twice, so
    /// that one lost copy does not cost a whole retry on a lossy path.
    repeat_next: bool,
    /// After an RNR NAK: nothing is sent before this time.
    rnr_wait: Option<u64>,
    /// After a timeout only the packet at this PSN goes (twice when
    /// nothing was heard) until the peer acknowledges something new,
    /// answers with a NAK or a READ response, or the timer fires again.
    /// The originals may only be slow: a peer under load (rxe in a VM)
    /// can take longer than the timeout to work through a full window, and
    /// resending all of it would queue a window of duplicates behind them
    /// (the idea of TCP's F-RTO, RFC 5682).
    probe_psn: Option<u32>,
    /// READ responses beyond the expected one came since the last timeout:
    /// the responder is still sending an earlier answer, and the request
    /// asking again from the gap waits behind it at the responder.
    responses_streaming: bool,
    /// Local buffers of queued WRs beyond their first, in queue order;
    /// `extra_front` counts those already released.
    extra: VecDeque<Sge>,
    extra_front: u64,
    /// Inline messages of queued WRs, in queue order.
    inline: VecDeque<InlineData>,
    inline_front: u64,
}

/// The local buffers of a queued WR.
pub(crate) type Sges<'a> = std::iter::Chain<
    std::iter::Take<std::iter::Once<Sge>>,
    std::iter::Copied<std::collections::vec_deque::Iter<'a, Sge>>,
>;

/// Where a queued WR's message is.
pub(crate) enum Payload<'a> {
    /// One local buffer (most WRs).
    One(Sge),
    Sges(Sges<'a>),
    Inline(&'a [u8]),
}

/// Timeouts without progress tolerated while the peer keeps answering (so a
/// live peer behind a very lossy path is not given up on after retry_cnt
/// rounds, yet a peer that answers but never lets us progress is).
pub const MAX_STALLS: u32 = 64;

/// Payload bytes of packets `k1..k2` of a message of `len` bytes.
fn bytes_of(len: u32, mtu: u32, k1: u32, k2: u32) -> u64 {
    let l = u64::from(len);
    let m = u64::from(mtu);
    (u64::from(k2) * m).min(l) - (u64::from(k1) * m).min(l)
}

fn packets(len: u32, mtu: u32) -> u32 {
    // Path MTUs are powers of two: a shift, not a division, per post.
    if mtu.is_power_of_two() {
        let n = (u64::from(len) + u64::from(mtu) - 1) >> mtu.trailing_zeros();
        return (n as u32).max(1);
    }
    len.div_ceil(mtu).max(1)
}

impl Requester {
    pub fn new(cap: usize) -> Self {
        Requester {
            unreliable: false,
            sq: VecDeque::with_capacity(cap),
            cap,
            next_psn: 0,
            una: 0,
            tx_psn: 0,
            tx_idx: 0,
            hi: 0,
            mtu: 1024,
            retry_cnt: 7,
            retries_left: 7,
            rnr_retry: 7,
            rnr_left: 7,
            rto_ns: 0,
            timer: None,
            max_outstanding_psns: 1 << 16,
            max_rd: 1,
            rd_outstanding: 0,
            inflight: 0,
            ack_req_every: ACK_REQ_EVERY,
            ack_req_msgs: 1,
            unasked_msgs: 0,
            unasked_pkts: 0,
            rd_recovery: ReadRecovery::default(),
            resend_until: 0,
            heard: false,
            probe_psn: None,
            responses_streaming: false,
            stalls: 0,
            repeat_next: false,
            rnr_wait: None,
            extra: VecDeque::new(),
            extra_front: 0,
            inline: VecDeque::new(),
            inline_front: 0,
        }
    }

    /// Settings of the RTS transition.
    #[allow(clippy::too_many_arguments)]
    pub fn configure(
        &mut self,
        mtu: u32,
        sq_psn: u32,
        timeout: u8,
        retry_cnt: u8,
        rnr_retry: u8,
        max_rd: u8,
        limits: SendLimits,
    ) {
        self.set_limits(limits);
        self.mtu = mtu;
        self.next_psn = sq_psn;
        self.una = sq_psn;
        self.tx_psn = sq_psn;
        self.hi = sq_psn;
        self.resend_until = sq_psn;
        self.rto_ns = if timeout == 0 {
            0
        } else {
            4096u64 << timeout.min(31)
        };
        self.retry_cnt = retry_cnt;
        self.retries_left = retry_cnt;
        self.rnr_retry = rnr_retry;
        self.rnr_left = rnr_retry;
        self.max_rd = u32::from(max_rd.max(1));
    }

    /// Makes this an unreliable requester (UC, UD; see the module doc),
    /// from RTS on: no timer, no AckReq.
    pub fn make_unreliable(&mut self) {
        self.unreliable = true;
        self.rto_ns = 0;
    }

    /// New bounds on PSNs outstanding and on packets between AckReqs,
    /// from the next packet on.
    pub fn set_limits(&mut self, limits: SendLimits) {
        self.ack_req_every = limits.ack_req_every.clamp(1, ACK_REQ_EVERY);
        self.ack_req_msgs = limits.ack_req_msgs.clamp(1, ACK_REQ_MSGS_MAX);
        self.max_outstanding_psns = limits.max_outstanding_psns.clamp(1, 1 << 22);
    }

    /// Send WRs it holds at most.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// WRs taken and not yet completed.
    pub fn queued(&self) -> usize {
        self.sq.len()
    }

    /// No WR taken and not yet completed (the send queue is drained).
    pub fn is_empty(&self) -> bool {
        self.sq.is_empty()
    }

    /// New retry settings (RTS->RTS, SQD->RTS): they count from the next
    /// timeout or RNR NAK on.
    pub fn set_retry(&mut self, timeout: Option<u8>, retry_cnt: Option<u8>, rnr_retry: Option<u8>) {
        if let Some(t) = timeout {
            self.rto_ns = if t == 0 { 0 } else { 4096u64 << t.min(31) };
        }
        if let Some(r) = retry_cnt {
            self.retry_cnt = r;
            self.retries_left = r;
        }
        if let Some(r) = rnr_retry {
            self.rnr_retry = r;
            self.rnr_left = r;
        }
    }

    pub fn is_full(&self) -> bool {
        self.sq.len() >= self.cap
    }

    /// Whether a WR is queued that was not sent yet (or is being sent
    /// again): the next packet is its, whatever is posted behind it.
    pub fn has_unsent(&self) -> bool {
        self.tx_idx < self.sq.len()
    }

    /// snd_nxt for congestion control: the next new PSN to transmit.
    pub fn snd_nxt(&self) -> u32 {
        self.hi
    }

    /// Whether data is in flight (for probe pacing).
    pub fn has_outstanding(&self) -> bool {
        self.una != self.hi
    }

    /// Whether `psn` was sent and is not acknowledged yet: in [una, hi).
    pub fn in_flight(&self, psn: u32) -> bool {
        psn_ge(psn, self.una) && psn_gt(self.hi, psn)
    }

    /// The WR about to be sent fails with `status` when its turn comes.
    pub fn fail_tx(&mut self, status: WcStatus) {
        if let Some(e) = self.sq.get_mut(self.tx_idx) {
            e.fail = Some(status);
        }
    }

    /// The status to fail the QP with: the oldest WR is a failed one.
    pub fn failed_front(&self) -> Option<WcStatus> {
        self.sq.front().and_then(|e| e.fail)
    }

    /// Queues a validated WR; with `fail`, it fails with that status when
    /// its turn comes (a bad local buffer).
    pub fn post(&mut self, wr: &WrParts<'_>, fail: Option<WcStatus>) {
        let len = wr.total().min(u64::from(u32::MAX)) as u32;
        let npsn = if wr.head.op.is_atomic() {
            1
        } else {
            packets(len, self.mtu)
        };
        let (inline, side, sges) = match wr.payload {
            WrPayload::Inline(d) => {
                let d = InlineData::new(d).unwrap_or(InlineData::EMPTY);
                self.inline.push_back(d);
                (
                    true,
                    self.inline_front + self.inline.len() as u64 - 1,
                    &[][..],
                )
            }
            WrPayload::Sges(sges) => {
                let side = self.extra_front + self.extra.len() as u64;
                if let Some(rest) = sges.get(1..).filter(|r| !r.is_empty()) {
                    self.extra.extend(rest.iter().copied());
                }
                (false, side, sges)
            }
        };
        self.sq.push_back(SqEntry {
            wr: wr.head,
            first: sges.first().copied().unwrap_or_default(),
            nsge: if inline { 0 } else { sges.len() as u8 },
            inline,
            side,
            first_psn: self.next_psn,
            npsn,
            len,
            rd_got: 0,
            rd_requested: false,
            done: false,
            fail,
        });
        self.next_psn = psn_add(self.next_psn, npsn);
    }

    /// Whether the next packet may go, and which: the PSN window, the
    /// READ limit and the byte window `window` decide; nothing is built.
    fn next(&self, window: u64) -> Option<Next<'_>> {
        if self.rnr_wait.is_some() || self.probe_psn.is_some_and(|p| p != self.tx_psn) {
            return None;
        }
        let e = self.sq.get(self.tx_idx)?;
        if e.fail.is_some() {
            return None;
        }
        // A fence holds a WR until the READs and atomics before it are done.
        if e.wr.fence
            && self
                .sq
                .iter()
                .take(self.tx_idx)
                .any(|p| !p.done && p.is_read())
        {
            return None;
        }
        let outstanding = psn_diff(self.tx_psn, self.una).max(0) as u32;
        if outstanding > 0 && outstanding >= self.max_outstanding_psns {
            return None;
        }
        let retransmit = psn_gt(self.resend_until, self.tx_psn);
        if e.is_read() {
            if !e.rd_requested && self.rd_outstanding >= self.max_rd {
                return None;
            }
            let opcode = match e.wr.op {
                WrOp::CmpSwap { .. } => Opcode::CompareSwap,
                WrOp::FetchAdd { .. } => Opcode::FetchAdd,
                _ => Opcode::RdmaReadRequest,
            };
            return Some(Next {
                e,
                k: psn_diff(self.tx_psn, e.first_psn) as u32,
                len: 0,
                opcode,
                outstanding,
                retransmit,
            });
        }
        let k = psn_diff(self.tx_psn, e.first_psn) as u32;
        let len = bytes_of(e.len, self.mtu, k, k + 1) as u32;
        if self.inflight > 0 && self.inflight + u64::from(len) > window {
            return None;
        }
        let last = k + 1 == e.npsn;
        let imm = last && matches!(e.wr.op, WrOp::WriteImm(_) | WrOp::SendImm(_));
        let opcode = segment_opcode(e.wr.op.is_send(), e.npsn == 1, k == 0, last, imm);
        Some(Next {
            e,
            k,
            len,
            opcode,
            outstanding,
            retransmit,
        })
    }

    /// The opcode and payload length of the next packet, if one may go
    /// (see [`Requester::peek`]): what sizing it takes, without building
    /// the rest.
    pub fn peek_frame(&self, window: u64) -> Option<(Opcode, u32, bool)> {
        self.next(window).map(|n| (n.opcode, n.len, n.retransmit))
    }

    /// The next packet to send, if the PSN window, the READ limit and the
    /// byte window `window` allow one.
    pub fn peek(&self, window: u64) -> Option<TxItem> {
        let Next {
            e,
            k,
            len,
            opcode,
            outstanding,
            retransmit,
        } = self.next(window)?;
        if e.is_read() {
            let reth = (opcode == Opcode::RdmaReadRequest).then(|| {
                let off = u64::from(k) * u64::from(self.mtu);
                let rest = (u64::from(e.len) - off.min(u64::from(e.len))) as u32;
                (e.wr.remote_va.wrapping_add(off), e.wr.rkey, rest)
            });
            let atomic = match e.wr.op {
                WrOp::CmpSwap { compare, swap } => Some((compare, swap)),
                WrOp::FetchAdd { add } => Some((0, add)),
                _ => None,
            };
            return Some(TxItem {
                psn: self.tx_psn,
                opcode,
                // As rxe sets it on every READ request and atomic.
                ack_req: true,
                off: 0,
                len: 0,
                reth,
                atomic: atomic.map(|(compare, swap_add)| AtomicEthRepr {
                    va: e.wr.remote_va,
                    r_key: e.wr.rkey,
                    swap_add,
                    compare,
                }),
                imm: None,
                solicited: false,
                retransmit,
                ud: None,
            });
        }
        let last = k + 1 == e.npsn;
        let imm = match e.wr.op {
            WrOp::WriteImm(v) | WrOp::SendImm(v) if last => Some(v),
            _ => None,
        };
        let send = e.wr.op.is_send();
        Some(TxItem {
            psn: self.tx_psn,
            opcode,
            // Retransmissions ask for an ACK each, so that recovery on a
            // lossy path does not hinge on one AckReq packet and its ACK; so
            // does a packet after which the byte or PSN window is full, or
            // the window would wait for an ACK nobody asked for.
            ack_req: !self.unreliable
                && ((last && self.asks_at_end(e))
                    || self.unasked_pkts + 1 >= self.ack_req_every
                    || retransmit
                    || self.inflight + u64::from(len) + u64::from(self.mtu) > window
                    || outstanding + 1 >= self.max_outstanding_psns),
            off: u64::from(k) * u64::from(self.mtu),
            len,
            reth: (k == 0 && !send).then_some((e.wr.remote_va, e.wr.rkey, e.len)),
            atomic: None,
            imm,
            solicited: last
                && e.wr.solicited
                && matches!(e.wr.op, WrOp::Send | WrOp::SendImm(_) | WrOp::WriteImm(_)),
            retransmit,
            ud: e.wr.ud,
        })
    }

    /// Whether the last packet of `e`'s message asks for an ACK. It does
    /// unless ACKs are coalesced (a peer that ACKs by itself after a
    /// delay, and a timeout well above that delay); then an unsignaled
    /// message's end goes without one, at most `ack_req_msgs - 1` in a
    /// row and while the send queue is less than half full (so that
    /// completions keep freeing it). A signaled WR always asks: its
    /// application may be waiting for the completion.
    fn asks_at_end(&self, e: &SqEntry) -> bool {
        if e.wr.signaled || self.ack_req_msgs <= 1 {
            return true;
        }
        (self.rto_ns != 0 && self.rto_ns < MIN_RTO_TO_COALESCE_NS)
            || self.unasked_msgs + 1 >= self.ack_req_msgs
            || 2 * (self.tx_idx + 1) >= self.cap
    }

    /// The packet `peek` returned has been sent at `now`.
    pub fn sent(&mut self, item: &TxItem, now: u64) {
        if std::mem::take(&mut self.repeat_next) {
            return; // the same packet once more
        }
        let Some(e) = self.sq.get_mut(self.tx_idx) else {
            return;
        };
        if e.is_read() {
            if !e.rd_requested {
                e.rd_requested = true;
                self.rd_outstanding += 1;
            }
            if item.retransmit {
                let k = psn_diff(item.psn, e.first_psn).max(0) as u32;
                self.rd_recovery.asked(e.first_psn, k);
            }
            self.tx_psn = psn_add(e.first_psn, e.npsn);
            self.tx_idx += 1;
        } else {
            self.inflight += u64::from(item.len);
            self.tx_psn = psn_add(self.tx_psn, 1);
            if !e.contains(self.tx_psn) {
                self.tx_idx += 1;
                if !item.ack_req {
                    self.unasked_msgs = self.unasked_msgs.saturating_add(1);
                }
            }
        }
        if item.ack_req {
            self.unasked_msgs = 0;
            self.unasked_pkts = 0;
        } else {
            self.unasked_pkts = self.unasked_pkts.saturating_add(1);
        }
        if psn_gt(self.tx_psn, self.hi) {
            self.hi = self.tx_psn;
        }
        if self.unreliable {
            // Nothing comes back: sent is as good as acknowledged.
            self.ack_through(item.psn);
            return;
        }
        if self.timer.is_none() && self.rto_ns > 0 {
            self.timer = Some(now + self.rto_ns);
        }
    }

    /// The message of the WR whose packet [`Requester::peek`] returns.
    pub fn tx_payload(&self) -> Option<Payload<'_>> {
        self.sq.get(self.tx_idx).map(|e| self.payload(e))
    }

    /// Where a WR's message is: its local buffers or its inline bytes.
    fn payload<'a>(&'a self, e: &SqEntry) -> Payload<'a> {
        if e.inline {
            let i = (e.side - self.inline_front) as usize;
            let d = self.inline.get(i).map_or(&[][..], InlineData::as_slice);
            return Payload::Inline(d);
        }
        self.local(e)
    }

    /// A WR's local buffers: one, or a list.
    fn local<'a>(&'a self, e: &SqEntry) -> Payload<'a> {
        if e.nsge <= 1 {
            let mut one = e.first;
            one.len = if e.nsge == 0 { 0 } else { one.len };
            return Payload::One(one);
        }
        Payload::Sges(self.sges(e))
    }

    /// A WR's local buffers.
    fn sges<'a>(&'a self, e: &SqEntry) -> Sges<'a> {
        let n = usize::from(e.nsge);
        let at = ((e.side - self.extra_front) as usize).min(self.extra.len());
        let end = (at + n.saturating_sub(1)).min(self.extra.len());
        std::iter::once(e.first)
            .take(n.min(1))
            .chain(self.extra.range(at..end).copied())
    }

    /// Drops the side-buffer contents of the entry leaving the queue's
    /// front.
    fn release(&mut self, e: &SqEntry) {
        if e.inline {
            self.inline.pop_front();
            self.inline_front += 1;
        } else {
            let n = usize::from(e.nsge).saturating_sub(1).min(self.extra.len());
            if n > 0 {
                self.extra.drain(..n);
                self.extra_front += n as u64;
            }
        }
    }

    /// The earliest of the retransmission timer and the RNR wait.
    pub fn timer(&self) -> Option<u64> {
        self.rnr_wait.or(self.timer)
    }

    /// Restarts the retransmission timer after progress.
    fn progress(&mut self, now: u64) {
        self.probe_psn = None;
        self.stalls = 0;
        self.retries_left = self.retry_cnt;
        self.rnr_left = self.rnr_retry;
        self.timer = (self.rto_ns > 0 && self.una != self.hi).then_some(now + self.rto_ns);
    }

    /// Goes back to `psn` (go-back-N); inside a READ, to its first missing
    /// response.
    fn go_back(&mut self, psn: u32) {
        let Some(idx) = self
            .sq
            .iter()
            .position(|e| !e.done && (e.contains(psn) || psn_gt(e.first_psn, psn)))
        else {
            return;
        };
        let e = &self.sq[idx];
        let target = if e.contains(psn) {
            if e.is_read() {
                psn_add(e.first_psn, e.rd_got)
            } else {
                psn
            }
        } else {
            e.first_psn
        };
        if psn_gt(self.tx_psn, self.resend_until) {
            self.resend_until = self.tx_psn;
        }
        self.tx_psn = target;
        self.tx_idx = idx;
        self.inflight = 0;
    }

    /// Marks everything up to and including `psn` acknowledged (cumulative
    /// ACK), stopping at a READ that is not complete. When the ACK passes
    /// that READ's last PSN its responses were lost (implied NAK): returns
    /// the READ's first missing PSN, unless a request asked again for it
    /// still waits for its answer.
    ///
    /// The bytes the ACK takes out of flight are counted in the same walk:
    /// those of each WR it reaches, from `una` to where the ACK ends in
    /// it. WRs it skips count none (a completed one lies wholly before
    /// `una`, a READ is not in `inflight`, and the walk ends at the first
    /// WR past the ACK). When the ACK passes `tx_psn` (go-back-N left it
    /// behind), [`Requester::advance_una`] counts them instead.
    fn ack_through(&mut self, psn: u32) -> Option<u32> {
        let mut implied_nak = None;
        let (una, mtu) = (self.una, self.mtu);
        let mut new_una = una;
        let mut acked = 0u64;
        for e in self.sq.iter_mut() {
            if e.done {
                continue;
            }
            if psn_gt(e.first_psn, psn) {
                break;
            }
            if e.is_read() {
                if psn_ge(psn, e.last_psn()) && e.rd_requested {
                    implied_nak = Some((e.first_psn, psn_add(e.first_psn, e.rd_got)));
                }
                break;
            }
            let whole = psn_ge(psn, e.last_psn());
            new_una = if whole {
                e.done = true;
                psn_add(e.last_psn(), 1)
            } else {
                psn_add(psn, 1)
            };
            acked += e.bytes_in(una, new_una, mtu);
            if !whole {
                break;
            }
        }
        if psn_gt(new_una, self.tx_psn) {
            self.advance_una(new_una);
        } else if psn_gt(new_una, una) {
            debug_assert_eq!(acked, self.bytes_between(una, new_una), "ACK of {psn}");
            self.inflight = self.inflight.saturating_sub(acked);
            self.una = new_una;
        }
        let (read_psn, missing) = implied_nak?;
        (!self.rd_recovery.waiting(read_psn)).then_some(missing)
    }

    /// Moves `una` forward, dropping acknowledged bytes from `inflight` and
    /// skipping acknowledged packets if go-back-N left `tx_psn` behind.
    fn advance_una(&mut self, new_una: u32) {
        if !psn_gt(new_una, self.una) {
            return;
        }
        let acked_to = if psn_gt(new_una, self.tx_psn) {
            self.tx_psn
        } else {
            new_una
        };
        let acked = self.bytes_between(self.una, acked_to);
        self.inflight = self.inflight.saturating_sub(acked);
        self.una = new_una;
        if psn_gt(new_una, self.tx_psn) {
            self.tx_psn = new_una;
            self.tx_idx = self
                .sq
                .iter()
                .position(|e| e.contains(new_una) || psn_gt(e.first_psn, new_una))
                .unwrap_or(self.sq.len());
        }
    }

    /// Bytes of the send queue's packets with PSNs in `[from, to)`, READs
    /// excluded: what moving `una` from `from` to `to` takes out of flight.
    fn bytes_between(&self, from: u32, to: u32) -> u64 {
        let mut bytes = 0u64;
        for e in self.sq.iter() {
            // WRs hold ascending PSNs: none past this one is in the range
            // (a deep queue is not walked to its end on every ACK).
            if !psn_gt(to, e.first_psn) {
                break;
            }
            if e.is_read() {
                continue;
            }
            bytes += e.bytes_in(from, to, self.mtu);
        }
        bytes
    }

    fn valid_ack_psn(&self, psn: u32) -> bool {
        psn_ge(psn, psn_add(self.una, 0xFF_FFFF)) && psn_gt(self.hi, psn)
    }

    /// An ACK (syndrome ACK) for `psn`. Returns false when the PSN is
    /// outside what is outstanding (a stale or bogus ACK).
    pub fn on_ack(&mut self, psn: u32, now: u64) -> bool {
        if !self.valid_ack_psn(psn) {
            return false;
        }
        self.heard = true;
        let before = self.una;
        if let Some(missing) = self.ack_through(psn) {
            self.go_back(missing);
        } else if self
            .probe_psn
            .is_some_and(|p| psn_gt(self.una, psn_add(p, 1)))
        {
            // The ACK covers more than the packet resent after the
            // timeout: the originals are arriving, the timeout was
            // spurious. Send on after them instead of resending them.
            self.skip_resends();
        }
        if self.una != before {
            self.progress(now);
        }
        true
    }

    /// Gives up the go-back-N resends still to go: the next packet is the
    /// first never sent, and every packet in [una, hi) counts in flight.
    fn skip_resends(&mut self) {
        if !psn_gt(self.hi, self.tx_psn) {
            return;
        }
        let (una, hi, mtu) = (self.una, self.hi, self.mtu);
        let mut inflight = 0;
        for e in self.sq.iter().filter(|e| !e.done && !e.is_read()) {
            let k1 = psn_diff(una, e.first_psn).clamp(0, e.npsn as i32) as u32;
            let k2 = psn_diff(hi, e.first_psn).clamp(0, e.npsn as i32) as u32;
            if k2 > k1 {
                inflight += bytes_of(e.len, mtu, k1, k2);
            }
        }
        self.inflight = inflight;
        self.tx_psn = hi;
        self.tx_idx = self
            .sq
            .iter()
            .position(|e| e.contains(hi) || psn_gt(e.first_psn, hi))
            .unwrap_or(self.sq.len());
    }

    /// A NAK with `code` (low 5 bits of the syndrome) for `psn`.
    pub fn on_nak(&mut self, psn: u32, code: u8, now: u64) -> Result<bool, Fatal> {
        if !(self.valid_ack_psn(psn) || psn == self.hi) {
            return Ok(false);
        }
        self.heard = true;
        let missing = self.ack_through(psn_add(psn, 0xFF_FFFF));
        match code {
            0 => {
                self.go_back(missing.unwrap_or(psn));
                self.progress(now);
                Ok(true)
            }
            1 => Err(Fatal::Fail(WcStatus::RemInvReqErr)),
            2 => Err(Fatal::Fail(WcStatus::RemAccessErr)),
            _ => Err(Fatal::Fail(WcStatus::RemOpErr)),
        }
    }

    /// An RNR NAK for `psn` with the responder's timer `code`: everything
    /// before `psn` is acknowledged; after the wait the code names, resend
    /// from `psn`, while rnr_retry lasts (7: for ever).
    pub fn on_rnr_nak(&mut self, psn: u32, code: u8, now: u64) -> Result<bool, Fatal> {
        if !self.valid_ack_psn(psn) {
            return Ok(false);
        }
        self.heard = true;
        // An incomplete READ before `psn` whose responses were lost is asked
        // again first.
        let missing = self.ack_through(psn_add(psn, 0xFF_FFFF));
        if self.rnr_retry != 7 {
            if self.rnr_left == 0 {
                return Err(Fatal::Fail(WcStatus::RnrRetryExcErr));
            }
            self.rnr_left -= 1;
        }
        self.go_back(missing.unwrap_or(psn));
        self.probe_psn = None;
        self.timer = None;
        self.rnr_wait = Some(now + rnr_timer_ns(code));
        Ok(true)
    }

    /// A READ response or atomic acknowledgement (whose `len` is the 8
    /// bytes of its original value). Returns the local buffers and the
    /// message offset to write the `len` bytes to when the packet belongs to
    /// the oldest incomplete READ and has not landed yet, in order or not
    /// (the caller checks and copies, then calls
    /// [`Requester::read_landed`]); `None` to drop it.
    pub fn on_read_response(
        &mut self,
        psn: u32,
        opcode: Opcode,
        len: usize,
    ) -> Option<(Payload<'_>, u64)> {
        let mtu = self.mtu;
        // Responses answer the oldest incomplete READ; anything else is an
        // earlier answer still streaming or a later READ's.
        let idx = self.sq.iter().position(|e| !e.done && e.is_read())?;
        let e = self.sq[idx];
        if !e.rd_requested {
            return None;
        }
        // A response of the wrong kind for this request is a stale one.
        if (opcode == Opcode::AtomicAcknowledge) != e.wr.op.is_atomic() {
            return None;
        }
        // Even a stale response says the peer is alive.
        self.heard = true;
        let k = psn_diff(psn, e.first_psn);
        if k < 0 {
            // An answer to an earlier request, still streaming: a request
            // asked again now would only wait behind it.
            self.responses_streaming = true;
            return None;
        }
        let k = k as u32;
        let seen = self.rd_recovery.response(e.first_psn, k, e.rd_got, e.npsn);
        if seen.ask_again {
            // The stream went past a response that is still missing.
            self.go_back(psn_add(e.first_psn, e.rd_got));
            self.probe_psn = None;
        }
        if !seen.fresh {
            self.responses_streaming = true;
            return None;
        }
        if e.wr.op.is_atomic() {
            return (len == 8).then(|| (self.local(&e), 0));
        }
        // Data lands by PSN, so any response carrying a PSN and length of
        // this READ is good, whichever request (the first or a retry) it
        // answers; only the end of the READ must be marked as such.
        let last = k + 1 == e.npsn;
        let ends = matches!(
            opcode,
            Opcode::RdmaReadResponseLast | Opcode::RdmaReadResponseOnly
        );
        if last != ends || bytes_of(e.len, mtu, k, k + 1) != len as u64 {
            return None;
        }
        Some((self.local(&e), u64::from(k) * u64::from(mtu)))
    }

    /// The response for `psn` (accepted by `on_read_response`) was copied.
    pub fn read_landed(&mut self, psn: u32, now: u64) {
        let Some(idx) = self.sq.iter().position(|e| !e.done && e.is_read()) else {
            return;
        };
        if !self.sq[idx].contains(psn) {
            return;
        }
        // Everything before the READ is implicitly acknowledged.
        for e in self.sq.iter_mut().take(idx) {
            e.done = true;
        }
        let e = &mut self.sq[idx];
        let k = psn_diff(psn, e.first_psn) as u32;
        e.rd_got = self.rd_recovery.land(k, e.rd_got, e.npsn);
        if e.rd_got == e.npsn {
            e.done = true;
            self.rd_outstanding = self.rd_outstanding.saturating_sub(1);
            self.rd_recovery.clear();
        }
        let una = psn_add(e.first_psn, e.rd_got);
        self.advance_una(una);
        // New data, in order or not: the responder is getting through.
        self.progress(now);
    }

    /// Runs the retransmission timer: go back to the oldest unacknowledged
    /// PSN. A timeout with nothing heard from the peer uses up one of
    /// retry_cnt retries; one while the peer was heard counts towards
    /// [`MAX_STALLS`]. `Err` when either runs out.
    pub fn on_timer(&mut self, now: u64) -> Result<bool, Fatal> {
        if let Some(t) = self.rnr_wait {
            if t <= now {
                self.rnr_wait = None;
            }
            return Ok(false);
        }
        match self.timer {
            Some(t) if t <= now => {}
            _ => return Ok(false),
        }
        if self.una == self.hi {
            self.timer = None;
            return Ok(false);
        }
        if std::mem::take(&mut self.responses_streaming) {
            // Asking once more would only queue another replay behind the
            // answer still coming (rxe answers READs one after another):
            // wait a timeout more, as a stall.
            self.heard = false;
            self.stall()?;
            self.timer = Some(now + self.rto_ns);
            return Ok(false);
        }
        if std::mem::take(&mut self.heard) {
            self.stall()?;
        } else {
            if self.retries_left == 0 {
                return Err(Fatal::Fail(WcStatus::RetryExcErr));
            }
            self.retries_left -= 1;
            self.repeat_next = true;
        }
        self.go_back(self.una);
        self.probe_psn = Some(self.tx_psn);
        self.timer = Some(now + self.rto_ns);
        Ok(true)
    }

    /// One more timeout without progress while the peer is alive.
    fn stall(&mut self) -> Result<(), Fatal> {
        self.stalls += 1;
        if self.stalls > MAX_STALLS {
            return Err(Fatal::Fail(WcStatus::RetryExcErr));
        }
        Ok(())
    }

    /// Completed WRs at the front, in post order.
    pub fn pop_completed(&mut self) -> Option<Done> {
        let e = self.sq.front()?;
        if !e.done {
            return None;
        }
        let (d, e) = (Done::of(e), *e);
        self.sq.pop_front();
        self.release(&e);
        self.tx_idx = self.tx_idx.saturating_sub(1);
        Some(d)
    }

    /// Fails the oldest WR with `status` and every other one with
    /// WR_FLUSH_ERR (the QP goes to ERR); completed ones keep SUCCESS.
    pub fn flush(&mut self, first_status: WcStatus, out: &mut impl FnMut(Done, WcStatus)) {
        let mut first = true;
        for e in self.sq.iter() {
            let status = if e.done {
                WcStatus::Success
            } else if std::mem::take(&mut first) {
                first_status
            } else {
                WcStatus::WrFlushErr
            };
            out(Done::of(e), status);
        }
        self.sq.clear();
        self.extra.clear();
        self.inline.clear();
        self.tx_idx = 0;
        self.timer = None;
        self.rnr_wait = None;
        self.probe_psn = None;
        self.responses_streaming = false;
        self.rd_recovery.clear();
        self.inflight = 0;
        self.rd_outstanding = 0;
    }
}

/// The opcode of packet `k` of a SEND (`send`) or WRITE message: ONLY when
/// it is the one packet, else FIRST, MIDDLE or LAST; the last one carries
/// the immediate when there is one.
fn segment_opcode(send: bool, only: bool, first: bool, last: bool, imm: bool) -> Opcode {
    use Opcode::*;
    match (send, only, first, last, imm) {
        (false, true, _, _, false) => RdmaWriteOnly,
        (false, true, _, _, true) => RdmaWriteOnlyWithImmediate,
        (false, false, true, _, _) => RdmaWriteFirst,
        (false, false, false, true, false) => RdmaWriteLast,
        (false, false, false, true, true) => RdmaWriteLastWithImmediate,
        (false, false, false, false, _) => RdmaWriteMiddle,
        (true, true, _, _, false) => SendOnly,
        (true, true, _, _, true) => SendOnlyWithImmediate,
        (true, false, true, _, _) => SendFirst,
        (true, false, false, true, false) => SendLast,
        (true, false, false, true, true) => SendLastWithImmediate,
        (true, false, false, false, _) => SendMiddle,
    }
}

/// What a completion of a send WR reports (the WR itself stays behind).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Done {
    pub wr_id: u64,
    pub opcode: WcOpcode,
    pub byte_len: u32,
    pub signaled: bool,
}

impl Done {
    fn of(e: &SqEntry) -> Done {
        Done {
            wr_id: e.wr.wr_id,
            opcode: e.wr.op.wc_opcode(),
            byte_len: e.len,
            signaled: e.wr.signaled,
        }
    }
}

/// A completion for `wr` on QP `qpn`.
pub(crate) fn cqe(qpn: Qpn, wr: &Done, status: WcStatus) -> Cqe {
    Cqe {
        wr_id: wr.wr_id,
        qpn,
        status,
        opcode: wr.opcode,
        byte_len: if status == WcStatus::Success {
            wr.byte_len
        } else {
            0
        },
        imm: None,
        solicited: false,
        src: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rc::types::WrPayload;

    /// Posts WR `wr_id` of `len` bytes from one local buffer.
    fn post_one(r: &mut Requester, wr_id: u64, op: WrOp, len: u32, signaled: bool) {
        let sge = [Sge {
            va: 0,
            len,
            lkey: 1,
        }];
        let wr = WrParts {
            head: WrHead {
                wr_id,
                op,
                rkey: 2,
                remote_va: 0,
                signaled,
                fence: false,
                solicited: false,
                ud: None,
            },
            payload: WrPayload::Sges(&sge),
        };
        r.post(&wr, None);
    }

    /// A requester with one WR of `len` bytes posted, PSNs from 100.
    fn with_wr(op: WrOp, len: u32) -> Requester {
        let mut r = Requester::new(4);
        let limits = SendLimits {
            max_outstanding_psns: 1 << 16,
            ack_req_every: 64,
            ack_req_msgs: 1,
        };
        r.configure(1024, 100, 8, 7, 7, 1, limits);
        post_one(&mut r, 1, op, len, true);
        r
    }

    #[test]
    fn ack_coalescing_asks_once_half_the_send_queue_waits_for_acks() {
        let mut r = Requester::new(8);
        let limits = SendLimits {
            max_outstanding_psns: 1 << 16,
            ack_req_every: 64,
            ack_req_msgs: 16,
        };
        r.configure(1024, 0, 14, 7, 7, 1, limits);
        for i in 0..8 {
            post_one(&mut r, i, WrOp::Write, 64, false);
        }
        let mut asked = Vec::new();
        while let Some(item) = r.peek(u64::MAX) {
            r.sent(&item, 0);
            asked.push(item.ack_req);
        }
        // The 4th WR sent fills half the queue with WRs waiting for ACKs.
        assert_eq!(asked, [false, false, false, true, true, true, true, true]);
    }

    /// A packet sent: its PSN and RETH (VA, R_Key, DMA length).
    type Sent = (u32, Option<(u64, u32, u32)>);

    /// Sends what the requester lets go at `now`.
    fn send(r: &mut Requester, now: u64) -> Vec<Sent> {
        let mut out = Vec::new();
        while let Some(item) = r.peek(u64::MAX) {
            r.sent(&item, now);
            out.push((item.psn, item.reth));
        }
        out
    }

    /// Delivers READ response `psn` of a READ starting at 100; whether it
    /// landed.
    fn respond(r: &mut Requester, psn: u32, npsn: u32, now: u64) -> bool {
        let op = match psn - 100 {
            0 => Opcode::RdmaReadResponseFirst,
            k if k + 1 == npsn => Opcode::RdmaReadResponseLast,
            _ => Opcode::RdmaReadResponseMiddle,
        };
        let landed = r.on_read_response(psn, op, 1024).is_some();
        if landed {
            r.read_landed(psn, now);
        }
        landed
    }

    #[test]
    fn read_responses_land_out_of_order_and_one_replay_fills_every_hole() {
        let mut r = with_wr(WrOp::Read, 10 * 1024);
        assert_eq!(send(&mut r, 0), [(100, Some((0, 2, 10 * 1024)))]);
        // 102 and 105 are lost; the others land where their PSN says.
        for psn in [100, 101, 103, 104] {
            assert!(respond(&mut r, psn, 10, 1));
        }
        assert_eq!(send(&mut r, 1), [], "103 and 104 may only be early");
        assert!(respond(&mut r, 106, 10, 1));
        // The stream is past 102 by more than reordering explains: asked
        // again from there, once.
        assert_eq!(send(&mut r, 1), [(102, Some((2048, 2, 8 * 1024)))]);
        for psn in 107..110 {
            assert!(respond(&mut r, psn, 10, 2));
        }
        assert_eq!(send(&mut r, 2), []);
        // The replay: 102 and 105 fill the holes, the rest are duplicates.
        let landed: Vec<bool> = (102..110).map(|psn| respond(&mut r, psn, 10, 3)).collect();
        assert_eq!(
            landed,
            [true, false, false, true, false, false, false, false]
        );
        assert!(r.pop_completed().is_some());
        assert_eq!(send(&mut r, 3), []);
    }

    #[test]
    fn a_timeout_while_an_earlier_read_answer_still_streams_asks_nothing_again() {
        let mut r = with_wr(WrOp::Read, 100 * 1024);
        assert_eq!(send(&mut r, 0), [(100, Some((0, 2, 100 * 1024)))]);
        for psn in (100..110).filter(|&p| p != 101) {
            respond(&mut r, psn, 100, 1);
        }
        assert_eq!(send(&mut r, 2), [(101, Some((1024, 2, 99 * 1024)))]);
        // Only duplicates come past a timeout (the responder is replaying
        // an older request): nothing is asked again, the timer waits once
        // more.
        assert!(!respond(&mut r, 105, 100, 3));
        let t = r.timer().unwrap();
        assert_eq!(r.on_timer(t), Ok(false));
        assert_eq!(send(&mut r, t), []);
        // A timeout with nothing at all heard asks again (twice, as after
        // any silent timeout).
        let t = r.timer().unwrap();
        assert_eq!(r.on_timer(t), Ok(true));
        let again = (101, Some((1024, 2, 99 * 1024)));
        assert_eq!(send(&mut r, t), [again, again]);
    }

    #[test]
    fn an_ack_past_the_packet_resent_after_a_timeout_skips_the_other_resends() {
        let mut r = with_wr(WrOp::Write, 16 * 1024);
        let mut now = 0;
        let send = |r: &mut Requester, now: u64| -> Vec<u32> {
            send(r, now).into_iter().map(|(psn, _)| psn).collect()
        };
        assert_eq!(send(&mut r, now), (100..116).collect::<Vec<_>>());
        now += r.rto_ns;
        assert_eq!(r.on_timer(now), Ok(true));
        // Nothing heard: the oldest packet goes twice, then nothing more.
        assert_eq!(send(&mut r, now), [100, 100]);
        // The peer was only slow: its ACK reaches past the resent packet.
        assert!(r.on_ack(107, now + 1));
        assert_eq!(send(&mut r, now + 1), Vec::<u32>::new());
        assert_eq!(r.inflight, 8 * 1024, "PSNs 108..116 are still in flight");
        assert!(r.on_ack(115, now + 2));
        assert!(r.pop_completed().is_some());
        assert_eq!(r.inflight, 0);
    }

    #[test]
    fn bytes_of_packet_ranges() {
        assert_eq!(bytes_of(2500, 1024, 0, 1), 1024);
        assert_eq!(bytes_of(2500, 1024, 2, 3), 452);
        assert_eq!(bytes_of(2500, 1024, 0, 3), 2500);
        assert_eq!(bytes_of(0, 1024, 0, 1), 0);
        assert_eq!(packets(0, 1024), 1);
        assert_eq!(packets(1024, 1024), 1);
        assert_eq!(packets(1025, 1024), 2);
        assert_eq!(packets(u32::MAX, 256), u32::MAX.div_ceil(256));
        assert_eq!(packets(3000, 1000), 3);
    }
}
