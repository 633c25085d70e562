//! The RC responder of one QP: checks each request in rc.md's order (PSN,
//! opcode sequence, opcode allowed, resources, length, R_Key + bounds +
//! access), executes WRITEs into memory, queues READ responses, remembers
//! recent READs to replay duplicates, sends one NAK per out-of-order
//! episode, and coalesces ACKs.
//!
//! ACKs and NAKs wait while READ responses are queued, so that nothing the
//! responder sends acknowledges a PSN before the responses that precede it.

use std::collections::VecDeque;

use pacer::psn::{psn_add, psn_diff};

use crate::mr::{Memory, MrView};
use crate::wire::{aeth, Opcode, Packet};

/// Largest DMA length of one message.
pub const MAX_DMA_LEN: u64 = 1 << 31;

/// NAK syndromes.
pub const NAK_PSN_SEQ: u8 = 0x60;
pub const NAK_INVALID_REQUEST: u8 = 0x61;
pub const NAK_REMOTE_ACCESS: u8 = 0x62;

/// Whether a request may reach `[va, va + len)` of the region `rkey` names:
/// R_Key, bounds and access right. A zero-length RDMA WRITE or READ
/// reaches no memory, and its R_Key is not checked (IBA C9-88).
pub(crate) fn remote_ok(mrs: MrView<'_>, rkey: u32, va: u64, len: u64, write: bool) -> bool {
    len == 0 || mrs.check_remote(rkey, va, len, write).is_ok()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct WriteCtx {
    va: u64,
    left: u64,
}

/// A READ whose responses are queued or were sent.
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
}

impl ReadJob {
    fn packets(&self, mtu: u32) -> u32 {
        (self.len.div_ceil(u64::from(mtu)).max(1)) as u32
    }
}

/// A READ remembered for duplicate requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ReadMemo {
    first_psn: u32,
    npsn: u32,
    va: u64,
    len: u64,
    rkey: u32,
    msn: u32,
}

/// One READ response packet to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RespItem {
    pub psn: u32,
    pub rkey: u32,
    pub opcode: Opcode,
    pub va: u64,
    pub len: u32,
    pub msn: u32,
}

/// An ACK or NAK to send: (BTH PSN, AETH syndrome, MSN).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AckItem {
    pub psn: u32,
    pub syndrome: u8,
    pub msn: u32,
}

/// What the responder made of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Executed (WRITE data applied, READ queued).
    Accepted,
    /// A duplicate: not re-executed (re-ACKed or replayed).
    Duplicate,
    /// Beyond the expected PSN: dropped (NAK sent once per episode).
    OutOfOrder,
    /// Refused with this NAK; the QP goes to ERR.
    Fatal(u8),
    /// Not a request this responder handles; dropped.
    Ignored,
}

#[derive(Debug)]
pub(crate) struct Responder {
    pub epsn: u32,
    pub msn: u32,
    pub mtu: u32,
    pub remote_write: bool,
    pub remote_read: bool,
    nak_sent: bool,
    write: Option<WriteCtx>,
    memos: VecDeque<ReadMemo>,
    max_memos: usize,
    pub jobs: VecDeque<ReadJob>,
    /// Coalesced ACK waiting to go.
    ack: Option<AckItem>,
    /// NAK waiting to go (sent before any ACK).
    nak: Option<AckItem>,
    /// Send the pending ACK twice: it answers a retransmission, so the
    /// previous ACK was probably lost.
    ack_twice: bool,
}

impl Responder {
    pub fn new() -> Self {
        Responder {
            epsn: 0,
            msn: 0,
            mtu: 1024,
            remote_write: false,
            remote_read: false,
            nak_sent: false,
            write: None,
            memos: VecDeque::new(),
            max_memos: 1,
            jobs: VecDeque::new(),
            ack: None,
            nak: None,
            ack_twice: false,
        }
    }

    /// Settings of the RTR transition.
    pub fn configure(&mut self, mtu: u32, rq_psn: u32, max_dest_rd_atomic: u8) {
        self.mtu = mtu;
        self.epsn = rq_psn;
        self.max_memos = usize::from(max_dest_rd_atomic.max(1));
        self.memos = VecDeque::with_capacity(self.max_memos);
        self.jobs = VecDeque::with_capacity(self.max_memos + 1);
    }

    /// The ACK or NAK to send now, if any and if no READ response must go
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

    fn nak(&mut self, psn: u32, syndrome: u8) {
        self.nak = Some(AckItem {
            psn,
            syndrome,
            msn: self.msn,
        });
    }

    fn ack_now(&mut self, psn: u32) {
        self.ack = Some(AckItem {
            psn,
            syndrome: aeth::ACK_UNLIMITED,
            msn: self.msn,
        });
    }

    /// Handles a request packet (WRITE or READ request; SEND is not
    /// supported and refused as an invalid request).
    pub fn on_request(
        &mut self,
        p: &Packet<'_>,
        mrs: MrView<'_>,
        mem: &mut impl Memory,
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

        // Opcode sequence: inside a multi-packet WRITE only MIDDLE/LAST.
        let continues = matches!(
            op,
            Opcode::RdmaWriteMiddle | Opcode::RdmaWriteLast | Opcode::RdmaWriteLastWithImmediate
        );
        if continues != self.write.is_some() {
            return self.fatal(psn, NAK_INVALID_REQUEST);
        }
        // Opcode allowed by the QP's access flags (SEND: no receive queue).
        let allowed = match op {
            Opcode::RdmaReadRequest => self.remote_read,
            Opcode::RdmaWriteFirst
            | Opcode::RdmaWriteMiddle
            | Opcode::RdmaWriteLast
            | Opcode::RdmaWriteLastWithImmediate
            | Opcode::RdmaWriteOnly
            | Opcode::RdmaWriteOnlyWithImmediate => self.remote_write,
            _ => false,
        };
        if !allowed {
            return self.fatal(psn, NAK_INVALID_REQUEST);
        }

        let mtu = u64::from(self.mtu);
        let plen = p.payload.len() as u64;
        if op == Opcode::RdmaReadRequest {
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
            self.msn = (self.msn + 1) & 0x00FF_FFFF;
            let job = ReadJob {
                req_psn: psn,
                next_psn: psn,
                va: reth.va,
                len,
                rkey: reth.r_key,
                msn: self.msn,
            };
            let npsn = job.packets(self.mtu);
            if self.memos.len() == self.max_memos {
                self.memos.pop_front();
            }
            self.memos.push_back(ReadMemo {
                first_psn: psn,
                npsn,
                va: reth.va,
                len,
                rkey: reth.r_key,
                msn: self.msn,
            });
            self.jobs.push_back(job);
            self.epsn = psn_add(psn, npsn);
            self.nak_sent = false;
            return Verdict::Accepted;
        }

        // WRITE: length rules, then R_Key + bounds + access, then execute.
        let (va, last) = match op {
            Opcode::RdmaWriteFirst | Opcode::RdmaWriteOnly | Opcode::RdmaWriteOnlyWithImmediate => {
                let Some(reth) = p.repr.reth else {
                    return self.fatal(psn, NAK_INVALID_REQUEST);
                };
                let total = u64::from(reth.dma_len);
                let only = op != Opcode::RdmaWriteFirst;
                let ok = total <= MAX_DMA_LEN
                    && if only {
                        plen <= mtu && plen == total
                    } else {
                        plen == mtu && total > mtu
                    };
                if !ok {
                    return self.fatal(psn, NAK_INVALID_REQUEST);
                }
                if !remote_ok(mrs, reth.r_key, reth.va, total, true) {
                    return self.fatal(psn, NAK_REMOTE_ACCESS);
                }
                if !only {
                    self.write = Some(WriteCtx {
                        va: reth.va + plen,
                        left: total - plen,
                    });
                }
                (reth.va, only)
            }
            _ => {
                let Some(w) = self.write else {
                    return self.fatal(psn, NAK_INVALID_REQUEST);
                };
                let last = op != Opcode::RdmaWriteMiddle;
                let ok = if last {
                    plen >= 1 && plen <= mtu && plen == w.left
                } else {
                    plen == mtu && w.left > mtu
                };
                if !ok {
                    return self.fatal(psn, NAK_INVALID_REQUEST);
                }
                self.write = (!last).then_some(WriteCtx {
                    va: w.va + plen,
                    left: w.left - plen,
                });
                (w.va, last)
            }
        };
        mem.write(va, p.payload);
        if last {
            self.write = None;
            self.msn = (self.msn + 1) & 0x00FF_FFFF;
        }
        self.epsn = psn_add(psn, 1);
        self.nak_sent = false;
        if p.repr.bth.ack_req {
            self.ack_now(psn);
        }
        Verdict::Accepted
    }

    fn fatal(&mut self, psn: u32, syndrome: u8) -> Verdict {
        self.nak(psn, syndrome);
        self.write = None;
        Verdict::Fatal(syndrome)
    }

    /// A request below ePSN: WRITEs are re-ACKed whatever their AckReq
    /// bit (the requester retransmits because an ACK went missing, as rxe
    /// answers), READs inside a remembered READ are replayed from memory.
    fn duplicate(&mut self, p: &Packet<'_>, mrs: MrView<'_>) -> Verdict {
        let psn = p.repr.bth.psn;
        if p.repr.bth.opcode != Opcode::RdmaReadRequest {
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
        let off = u64::from(psn_diff(psn, m.first_psn) as u32) * u64::from(self.mtu);
        let Some(reth) = p.repr.reth else {
            return Verdict::Ignored;
        };
        // The retried request must ask for the rest of the remembered READ.
        if reth.va != m.va + off
            || u64::from(reth.dma_len) != m.len - off.min(m.len)
            || reth.r_key != m.rkey
        {
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
        });
        Verdict::Duplicate
    }

    /// The next READ response packet, if any.
    pub fn peek_response(&self) -> Option<RespItem> {
        let j = self.jobs.front()?;
        let n = j.packets(self.mtu);
        let i = psn_diff(j.next_psn, j.req_psn) as u32;
        let mtu = u64::from(self.mtu);
        let off = u64::from(i) * mtu;
        let len = (j.len - off.min(j.len)).min(mtu) as u32;
        let opcode = match (n == 1, i == 0, i + 1 == n) {
            (true, _, _) => Opcode::RdmaReadResponseOnly,
            (false, true, _) => Opcode::RdmaReadResponseFirst,
            (false, false, true) => Opcode::RdmaReadResponseLast,
            _ => Opcode::RdmaReadResponseMiddle,
        };
        Some(RespItem {
            psn: j.next_psn,
            rkey: j.rkey,
            opcode,
            va: j.va + off,
            len,
            msn: j.msn,
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

    /// Drops everything queued (the QP went to ERR).
    pub fn reset_queues(&mut self) {
        self.jobs.clear();
        self.ack = None;
        self.write = None;
    }
}
