//! The shared-memory ABI between an application and the dataplane daemon:
//! the fixed-size work queue entry ([`Wqe`]) and completion queue entry
//! ([`Cqe`]) as `#[repr(C)]` plain-old-data, and single-producer
//! single-consumer rings of them ([`RingLayout`], [`Producer`],
//! [`Consumer`]) laid out in a shared segment.
//!
//! A ring is a header of three cache lines — the producer index, the
//! consumer index, and the consumer's "wake me" flag, each on its own line
//! so that the two sides never write the same line — followed by a
//! power-of-two number of slots. Indices are free-running `u32`s; a slot is
//! `index & (capacity - 1)`. The producer writes a slot and stamps it; it
//! stores its index with a release store every half lap.
//!
//! Every entry carries a stamp ([`RingEntry::STAMP_WORD`]): a byte that
//! names the lap of the index it was written at ([`stamp_of`], never 0),
//! written last with a release store, as a hardware NIC's owner bit. The
//! consumer learns of new entries from their stamps, in the entry's own
//! first cache line, which it reads anyway: the line of the producer index
//! (which the producer has just written, a cross-core miss) is read only
//! when no stamp is ready, to tell an empty ring from a scribbled index.
//! Rings are zeroed when they are made (no entry is ready). The producer
//! stores its index once it lags by half a lap (so the consumer's reads
//! of it rarely miss), never a whole lap behind: a published index behind
//! the stamped entries by more than the capacity is a scribbled one.
//!
//! Each side keeps its own index privately and only *reads* the other's
//! from shared memory, which the other process may have scribbled on: an
//! index that claims more than `capacity` entries is reported as
//! [`RingError::Corrupt`], never trusted. Slots are addressed by masking,
//! so no value in shared memory can move an access outside the ring.
//!
//! The memory itself is behind [`SharedMem`]: this module has no unsafe
//! code; the mapping is [`crate::segment`]'s. The layouts' version is the
//! contract's [`crate::VERSION`].

use bytemuck::{Pod, Zeroable};

use transport::rc::{
    RecvWr, SendWr, SgList, Sge, UdDest, UdSource, WcOpcode, WcStatus, WrHead, WrOp, WrParts,
    WrPayload,
};

/// Cache line size the ring header separates indices by.
pub const CACHE_LINE: usize = 64;

/// WQE opcodes.
pub mod wqe_op {
    pub const RDMA_WRITE: u8 = 1;
    pub const RDMA_WRITE_WITH_IMM: u8 = 2;
    pub const RDMA_READ: u8 = 3;
    pub const SEND: u8 = 4;
    pub const SEND_WITH_IMM: u8 = 5;
    pub const ATOMIC_CMP_AND_SWP: u8 = 6;
    pub const ATOMIC_FETCH_AND_ADD: u8 = 7;
}

/// WQE flag: report a successful completion (errors always are).
pub const WQE_SIGNALED: u8 = 1;
/// WQE flag: wait for earlier READs and atomics (IBV_SEND_FENCE).
pub const WQE_FENCE: u8 = 2;
/// WQE flag: the message's bytes are in the WQE (IBV_SEND_INLINE).
pub const WQE_INLINE: u8 = 4;
/// WQE flag: the message's last packet carries the Solicited Event bit
/// (IBV_SEND_SOLICITED).
pub const WQE_SOLICITED: u8 = 8;
/// WQE flag: a UD SEND; `compare` holds the address handle and
/// `swap_add` the remote Q_Key (high 32 bits) and QPN (low 24).
pub const WQE_UD: u8 = 16;

/// Scatter/gather entries a send WQE carries (max_send_sge).
pub const WQE_MAX_SGE: usize = 13;
/// Bytes of a send WQE before its entries.
pub const WQE_HEADER_LEN: usize = 48;
/// Bytes of inline data a send WQE carries: the room of its entries.
pub const WQE_INLINE_ROOM: usize = WQE_MAX_SGE * 16;

/// One scatter/gather entry of a WQE: the engine's [`Sge`] itself (VA,
/// L_Key, length; 16 bytes).
pub type WqeSge = Sge;

/// A send work queue entry, 256 bytes: the operation, then up to
/// [`WQE_MAX_SGE`] scatter/gather entries, or with [`WQE_INLINE`] the
/// message itself in their place. Addresses are the device's virtual
/// addresses of registered memory (what a memory region's `va` says).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Pod, Zeroable)]
pub struct Wqe {
    pub wr_id: u64,
    pub remote_va: u64,
    /// CMP_SWAP: the value compared with; a UD SEND ([`WQE_UD`]): the
    /// address handle.
    pub compare: u64,
    /// CMP_SWAP: the value swapped in; FETCH_ADD: the addend; a UD SEND:
    /// the remote Q_Key (high 32 bits) and QPN (low 24).
    pub swap_add: u64,
    pub rkey: u32,
    /// SEND/WRITE with immediate: the value posted.
    pub imm: u32,
    pub opcode: u8,
    pub flags: u8,
    /// Entries used in `sges`.
    pub num_sge: u8,
    /// The ring's stamp (see [`RingEntry`]); 0 as built.
    pub _pad: u8,
    /// With [`WQE_INLINE`]: the message's length.
    pub inline_len: u32,
    pub sges: [WqeSge; WQE_MAX_SGE],
}

/// Why a WQE read from shared memory cannot be posted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WqeError {
    #[error("unknown WQE opcode {0}")]
    UnknownOpcode(u8),
    #[error("unknown WQE flags {0:#04x}")]
    UnknownFlags(u8),
    #[error("the WQE has {have} scatter/gather entries (at most {max})")]
    TooManySges { have: usize, max: usize },
    #[error("the WQE has {0} bytes of inline data (at most {max})", max = transport::rc::MAX_INLINE_DATA)]
    InlineTooLong(usize),
}

impl Wqe {
    /// The WQE of a work request.
    pub fn from_wr(wr: &SendWr) -> Result<Wqe, WqeError> {
        Wqe::build(&WrParts::of(wr))
    }

    /// Whether a WQE of `payload` fits (the check of [`Wqe::build`], with
    /// nothing built).
    pub fn fits(payload: WrPayload<'_>) -> Result<(), WqeError> {
        match payload {
            WrPayload::Sges(s) if s.len() > WQE_MAX_SGE => Err(WqeError::TooManySges {
                have: s.len(),
                max: WQE_MAX_SGE,
            }),
            WrPayload::Inline(d) if d.len() > transport::rc::MAX_INLINE_DATA => {
                Err(WqeError::InlineTooLong(d.len()))
            }
            _ => Ok(()),
        }
    }

    /// The WQE of an operation and its payload.
    pub fn build(wr: &WrParts<'_>) -> Result<Wqe, WqeError> {
        let mut w = Wqe::zeroed();
        w.build_into(wr)?;
        Ok(w)
    }

    /// Makes this WQE the one of `op` and `payload`, writing its used
    /// bytes only (the rest keeps older bytes that are not read).
    #[inline]
    pub fn build_into(&mut self, op: &WrParts<'_>) -> Result<(), WqeError> {
        Wqe::fits(op.payload)?;
        let (opcode, imm, compare, swap_add) = match op.head.op {
            WrOp::Write => (wqe_op::RDMA_WRITE, 0, 0, 0),
            WrOp::WriteImm(imm) => (wqe_op::RDMA_WRITE_WITH_IMM, imm, 0, 0),
            WrOp::Read => (wqe_op::RDMA_READ, 0, 0, 0),
            WrOp::Send => (wqe_op::SEND, 0, 0, 0),
            WrOp::SendImm(imm) => (wqe_op::SEND_WITH_IMM, imm, 0, 0),
            WrOp::CmpSwap { compare, swap } => (wqe_op::ATOMIC_CMP_AND_SWP, 0, compare, swap),
            WrOp::FetchAdd { add } => (wqe_op::ATOMIC_FETCH_AND_ADD, 0, 0, add),
        };
        self.wr_id = op.head.wr_id;
        self.remote_va = op.head.remote_va;
        self.compare = compare;
        self.swap_add = swap_add;
        self.rkey = op.head.rkey;
        self.imm = imm;
        self.opcode = opcode;
        self.flags = if op.head.signaled { WQE_SIGNALED } else { 0 }
            | if op.head.fence { WQE_FENCE } else { 0 }
            | if op.head.solicited { WQE_SOLICITED } else { 0 };
        if let Some(d) = op.head.ud {
            self.flags |= WQE_UD;
            self.compare = u64::from(d.ah);
            self.swap_add = u64::from(d.remote_qkey) << 32 | u64::from(d.remote_qpn & 0xff_ffff);
        }
        self._pad = 0;
        match op.payload {
            WrPayload::Inline(data) => {
                self.flags |= WQE_INLINE;
                self.num_sge = 0;
                self.inline_len = data.len() as u32;
                bytemuck::bytes_of_mut(&mut self.sges)[..data.len()].copy_from_slice(data);
            }
            WrPayload::Sges(sges) => {
                self.inline_len = 0;
                self.num_sge = put_sges(&mut self.sges, sges);
            }
        }
        Ok(())
    }

    /// Bytes of the WQE that carry meaning: the operation and its entries
    /// or inline bytes (at least one cache line). Only these cross between
    /// the application and the daemon.
    #[inline]
    pub fn used_len(&self) -> usize {
        let body = if self.flags & WQE_INLINE != 0 {
            self.inline_len as usize
        } else {
            16 * usize::from(self.num_sge).max(1)
        };
        (WQE_HEADER_LEN + body).clamp(CACHE_LINE, core::mem::size_of::<Wqe>())
    }

    /// An all-zero WQE (a buffer to read WQEs into).
    pub fn empty() -> Wqe {
        Wqe::zeroed()
    }

    /// The operation this WQE names, if it is one.
    #[inline]
    pub fn op(&self) -> Result<WrOp, WqeError> {
        Ok(match self.opcode {
            wqe_op::RDMA_WRITE => WrOp::Write,
            wqe_op::RDMA_WRITE_WITH_IMM => WrOp::WriteImm(self.imm),
            wqe_op::RDMA_READ => WrOp::Read,
            wqe_op::SEND => WrOp::Send,
            wqe_op::SEND_WITH_IMM => WrOp::SendImm(self.imm),
            wqe_op::ATOMIC_CMP_AND_SWP => WrOp::CmpSwap {
                compare: self.compare,
                swap: self.swap_add,
            },
            wqe_op::ATOMIC_FETCH_AND_ADD => WrOp::FetchAdd { add: self.swap_add },
            other => return Err(WqeError::UnknownOpcode(other)),
        })
    }

    /// The work request this WQE describes, borrowed from it, if it is well
    /// formed (what the daemon posts: no copy of the entries).
    #[inline]
    pub fn parts(&self) -> Result<WrParts<'_>, WqeError> {
        let op = self.op()?;
        if self.flags & !(WQE_SIGNALED | WQE_FENCE | WQE_INLINE | WQE_SOLICITED | WQE_UD) != 0 {
            return Err(WqeError::UnknownFlags(self.flags));
        }
        let ud = (self.flags & WQE_UD != 0).then_some(UdDest {
            ah: self.compare as u32,
            remote_qpn: (self.swap_add & 0xff_ffff) as u32,
            remote_qkey: (self.swap_add >> 32) as u32,
        });
        let payload = if self.flags & WQE_INLINE != 0 {
            let n = self.inline_len as usize;
            if n > transport::rc::MAX_INLINE_DATA {
                return Err(WqeError::InlineTooLong(n));
            }
            WrPayload::Inline(&bytemuck::bytes_of(&self.sges)[..n])
        } else {
            let n = usize::from(self.num_sge);
            let sges = self.sges.get(..n).ok_or(WqeError::TooManySges {
                have: n,
                max: WQE_MAX_SGE,
            })?;
            WrPayload::Sges(sges)
        };
        Ok(WrParts {
            head: WrHead {
                wr_id: self.wr_id,
                op,
                rkey: self.rkey,
                remote_va: self.remote_va,
                signaled: self.flags & WQE_SIGNALED != 0,
                fence: self.flags & WQE_FENCE != 0,
                solicited: self.flags & WQE_SOLICITED != 0,
                ud,
            },
            payload,
        })
    }

    /// The work request this WQE describes, if it is well formed.
    pub fn to_wr(&self) -> Result<SendWr, WqeError> {
        let p = self.parts()?;
        let (sg, inline) = match p.payload {
            WrPayload::Inline(d) => (
                SgList::EMPTY,
                Some(transport::rc::InlineData::new(d).map_err(|e| WqeError::InlineTooLong(e.0))?),
            ),
            WrPayload::Sges(s) => (
                SgList::new(s).map_err(|_| WqeError::TooManySges {
                    have: s.len(),
                    max: WQE_MAX_SGE,
                })?,
                None,
            ),
        };
        let h = p.head;
        Ok(SendWr {
            wr_id: h.wr_id,
            op: h.op,
            sg,
            rkey: h.rkey,
            remote_va: h.remote_va,
            signaled: h.signaled,
            fence: h.fence,
            solicited: h.solicited,
            inline,
            ud: h.ud,
        })
    }
}

/// Scatter/gather entries a receive WQE carries (max_recv_sge).
pub const RECV_WQE_MAX_SGE: usize = 7;

/// A receive work queue entry, 128 bytes: up to [`RECV_WQE_MAX_SGE`]
/// local buffers (none: for WRITE with immediate).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Pod, Zeroable)]
pub struct RecvWqe {
    pub wr_id: u64,
    pub num_sge: u8,
    /// Byte 2 is the ring's stamp (see [`RingEntry`]).
    pub _pad: [u8; 7],
    pub sges: [WqeSge; RECV_WQE_MAX_SGE],
}

impl RecvWqe {
    pub fn from_wr(wr: &RecvWr) -> Result<RecvWqe, WqeError> {
        let sges = wr.sg.as_slice();
        if sges.len() > RECV_WQE_MAX_SGE {
            return Err(WqeError::TooManySges {
                have: sges.len(),
                max: RECV_WQE_MAX_SGE,
            });
        }
        let mut w = RecvWqe {
            wr_id: wr.wr_id,
            ..RecvWqe::zeroed()
        };
        w.num_sge = put_sges(&mut w.sges, sges);
        Ok(w)
    }

    /// Bytes of the receive WQE that carry meaning (at least one cache
    /// line): only these cross between the application and the daemon.
    #[inline]
    pub fn used_len(&self) -> usize {
        (16 + 16 * usize::from(self.num_sge)).clamp(CACHE_LINE, core::mem::size_of::<RecvWqe>())
    }

    /// The receive request, if its entry count is one this ABI carries.
    pub fn to_wr(&self) -> Result<RecvWr, WqeError> {
        let sg = sg_of(&self.sges, self.num_sge)?;
        Ok(RecvWr {
            wr_id: self.wr_id,
            sg,
        })
    }
}

/// Writes `sges` into a WQE's entries (the caller checked they fit);
/// returns how many.
fn put_sges(dst: &mut [Sge], sges: &[Sge]) -> u8 {
    let n = sges.len().min(dst.len());
    dst[..n].copy_from_slice(&sges[..n]);
    n as u8
}

/// The scatter/gather list of a WQE's first `n` entries, if it has that
/// many.
fn sg_of(entries: &[Sge], n: u8) -> Result<SgList, WqeError> {
    let n = usize::from(n);
    let too_many = WqeError::TooManySges {
        have: n,
        max: entries.len(),
    };
    let sges = entries.get(..n).ok_or(too_many)?;
    SgList::new(sges).map_err(|_| too_many)
}

/// A completion queue entry, 32 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Pod, Zeroable)]
pub struct Cqe {
    pub wr_id: u64,
    pub qpn: u32,
    pub byte_len: u32,
    /// [`status_code`] of a [`WcStatus`].
    pub status: u8,
    /// [`opcode_code`] of a [`WcOpcode`] (ibverbs' `ibv_wc_opcode`).
    pub opcode: u8,
    /// [`CQE_WITH_IMM`]: `imm` holds immediate data.
    pub flags: u8,
    pub _pad: u8,
    /// The immediate value the sender posted.
    pub imm: u32,
    /// With [`CQE_GRH`] (a UD receive): the sender's QPN in bytes 0..3
    /// (little-endian) and its IPv4 address in bytes 4..8. Byte 3 is the
    /// ring's stamp (see [`RingEntry`]).
    pub src: [u8; 8],
}

/// CQE flag: the completion carries immediate data.
pub const CQE_WITH_IMM: u8 = 1;
/// CQE flag: a receive completion of a message whose sender asked for a
/// solicited event (a solicited-only armed CQ signals it).
pub const CQE_SOLICITED: u8 = 2;
/// CQE flag: a UD receive; the receive buffer starts with the 40-byte GRH
/// and `src` names the sender (ibverbs' IBV_WC_GRH).
pub const CQE_GRH: u8 = 4;

/// Completion statuses and their `ibv_wc_status` values.
const STATUSES: [(WcStatus, u8); 10] = [
    (WcStatus::Success, 0),
    (WcStatus::LocLenErr, 1),
    (WcStatus::LocQpOpErr, 2),
    (WcStatus::LocProtErr, 4),
    (WcStatus::WrFlushErr, 5),
    (WcStatus::RemInvReqErr, 9),
    (WcStatus::RemAccessErr, 10),
    (WcStatus::RemOpErr, 11),
    (WcStatus::RetryExcErr, 12),
    (WcStatus::RnrRetryExcErr, 13),
];

/// The ABI code of a completion status: its `ibv_wc_status` value.
#[inline]
pub fn status_code(s: WcStatus) -> u8 {
    STATUSES.iter().find(|x| x.0 == s).map_or(0, |x| x.1)
}

/// The completion status of an ABI code.
#[inline]
pub fn status_from_code(c: u8) -> Option<WcStatus> {
    STATUSES.iter().find(|x| x.1 == c).map(|x| x.0)
}

/// The `ibv_wc_status_str` name of a status code (ibverbs' spelling).
pub fn status_name(c: u8) -> &'static str {
    match status_from_code(c) {
        Some(WcStatus::Success) => "success",
        Some(WcStatus::LocLenErr) => "local length error",
        Some(WcStatus::LocQpOpErr) => "local QP operation error",
        Some(WcStatus::LocProtErr) => "local protection error",
        Some(WcStatus::WrFlushErr) => "Work Request Flushed Error",
        Some(WcStatus::RemInvReqErr) => "remote invalid request error",
        Some(WcStatus::RemAccessErr) => "remote access error",
        Some(WcStatus::RemOpErr) => "remote operation error",
        Some(WcStatus::RetryExcErr) => "transport retry counter exceeded",
        Some(WcStatus::RnrRetryExcErr) => "RNR retry counter exceeded",
        None => "unknown",
    }
}

/// Completion opcodes and their `ibv_wc_opcode` values.
const OPCODES: [(WcOpcode, u8); 7] = [
    (WcOpcode::Send, 0),
    (WcOpcode::RdmaWrite, 1),
    (WcOpcode::RdmaRead, 2),
    (WcOpcode::CompSwap, 3),
    (WcOpcode::FetchAdd, 4),
    (WcOpcode::Recv, 128),
    (WcOpcode::RecvRdmaWithImm, 129),
];

/// The ABI code of a completion opcode: its `ibv_wc_opcode` value.
#[inline]
pub fn opcode_code(o: WcOpcode) -> u8 {
    OPCODES.iter().find(|x| x.0 == o).map_or(1, |x| x.1)
}

/// The completion opcode of an ABI code.
#[inline]
pub fn opcode_from_code(c: u8) -> Option<WcOpcode> {
    OPCODES.iter().find(|x| x.1 == c).map(|x| x.0)
}

impl Cqe {
    #[inline]
    pub fn from_rc(c: &transport::rc::Cqe) -> Cqe {
        Cqe {
            wr_id: c.wr_id,
            qpn: c.qpn,
            byte_len: c.byte_len,
            status: status_code(c.status),
            opcode: opcode_code(c.opcode),
            flags: if c.imm.is_some() { CQE_WITH_IMM } else { 0 }
                | if c.solicited { CQE_SOLICITED } else { 0 }
                | if c.src.is_some() { CQE_GRH } else { 0 },
            _pad: 0,
            imm: c.imm.unwrap_or(0),
            src: match c.src {
                Some(s) => {
                    let q = s.qpn.to_le_bytes();
                    let ip = s.ip.octets();
                    [q[0], q[1], q[2], 0, ip[0], ip[1], ip[2], ip[3]]
                }
                None => [0; 8],
            },
        }
    }

    /// The sender of a UD receive completion.
    #[inline]
    pub fn source(&self) -> Option<UdSource> {
        let s = &self.src;
        (self.flags & CQE_GRH != 0).then(|| UdSource {
            qpn: u32::from_le_bytes([s[0], s[1], s[2], 0]),
            ip: core::net::Ipv4Addr::new(s[4], s[5], s[6], s[7]),
        })
    }

    /// The completion this entry carries (a status code this version does
    /// not know reads as WR_FLUSH_ERR, an unknown opcode as WRITE).
    #[inline]
    pub fn to_rc(&self) -> transport::rc::Cqe {
        transport::rc::Cqe {
            wr_id: self.wr_id,
            qpn: self.qpn,
            status: status_from_code(self.status).unwrap_or(WcStatus::WrFlushErr),
            opcode: opcode_from_code(self.opcode).unwrap_or(WcOpcode::RdmaWrite),
            byte_len: self.byte_len,
            imm: (self.flags & CQE_WITH_IMM != 0).then_some(self.imm),
            solicited: self.flags & CQE_SOLICITED != 0,
            src: self.source(),
        }
    }
}

/// Word and byte access to a shared segment. Offsets are in bytes from
/// the segment's start; an implementation checks bounds (out of range:
/// reads give zeros, writes do nothing) so that no offset can reach
/// outside the segment.
pub trait SharedMem {
    fn load_acquire(&self, off: usize) -> u32;
    fn store_release(&self, off: usize, v: u32);
    /// Sequentially consistent: also a full barrier between the stores
    /// before it and the loads after it (the doorbell handshake needs it).
    fn swap(&self, off: usize, v: u32) -> u32;
    /// Sets bits; sequentially consistent like [`SharedMem::swap`].
    fn fetch_or(&self, off: usize, v: u32) -> u32;
    fn read_bytes(&self, off: usize, dst: &mut [u8]);
    fn write_bytes(&self, off: usize, src: &[u8]);
}

/// A segment in this process's own memory (one thread), bounds-checked
/// as [`SharedMem`] asks: for unit tests, property tests and fuzzing of
/// the rings.
#[derive(Debug, Clone, Default)]
pub struct HeapSegment(core::cell::RefCell<Vec<u8>>);

impl HeapSegment {
    /// `len` zero bytes.
    pub fn new(len: usize) -> Self {
        HeapSegment(core::cell::RefCell::new(vec![0; len]))
    }

    /// A segment holding these bytes.
    pub fn from_bytes(bytes: Vec<u8>) -> Self {
        HeapSegment(core::cell::RefCell::new(bytes))
    }

    fn word(&self, off: usize) -> u32 {
        let b = self.0.borrow();
        b.get(off..off.saturating_add(4))
            .map_or(0, |w| u32::from_le_bytes(w.try_into().expect("4 bytes")))
    }
}

impl SharedMem for HeapSegment {
    fn load_acquire(&self, off: usize) -> u32 {
        self.word(off)
    }

    fn store_release(&self, off: usize, v: u32) {
        if let Some(w) = self.0.borrow_mut().get_mut(off..off.saturating_add(4)) {
            w.copy_from_slice(&v.to_le_bytes());
        }
    }

    fn swap(&self, off: usize, v: u32) -> u32 {
        let old = self.word(off);
        self.store_release(off, v);
        old
    }

    fn fetch_or(&self, off: usize, v: u32) -> u32 {
        let old = self.word(off);
        self.store_release(off, old | v);
        old
    }

    fn read_bytes(&self, off: usize, dst: &mut [u8]) {
        match self.0.borrow().get(off..off.saturating_add(dst.len())) {
            Some(src) => dst.copy_from_slice(src),
            None => dst.fill(0),
        }
    }

    fn write_bytes(&self, off: usize, src: &[u8]) {
        if let Some(dst) = self
            .0
            .borrow_mut()
            .get_mut(off..off.saturating_add(src.len()))
        {
            dst.copy_from_slice(src);
        }
    }
}

/// An entry of a ring: where its stamp is. The stamp is the top byte
/// (little-endian) of the 4-byte-aligned word at `STAMP_WORD`; the other
/// three bytes of that word are the entry's own, written with it.
pub trait RingEntry: Pod {
    const STAMP_WORD: usize;
}

impl RingEntry for Wqe {
    /// `opcode`, `flags`, `num_sge`, and the stamp in `_pad`.
    const STAMP_WORD: usize = 40;
}

impl RingEntry for RecvWqe {
    /// `num_sge`, `_pad[0..2]`, and the stamp in `_pad[2]`.
    const STAMP_WORD: usize = 8;
}

impl RingEntry for Cqe {
    /// `src[0..3]`, and the stamp in `src[3]`.
    const STAMP_WORD: usize = 24;
}

/// The stamp of the entry at `index` of a ring of `capacity` slots: its
/// lap (`index / capacity`, modulo 128) with the top bit set, so that a
/// zeroed slot and the previous lap's entry are never ready.
pub fn stamp_of(index: u32, capacity: u32) -> u8 {
    let lap = index >> capacity.trailing_zeros();
    0x80 | (lap & 0x7f) as u8
}

/// Where a ring lives in a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingLayout {
    /// Offset of the header, a multiple of [`CACHE_LINE`].
    pub offset: usize,
    /// Slots, a power of two.
    pub capacity: u32,
    /// Bytes per slot.
    pub slot: usize,
}

/// Header bytes before the slots.
pub const RING_HEADER: usize = 3 * CACHE_LINE;

/// Why a ring cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RingError {
    #[error("ring capacity {0} is not a power of two in 1..=65536")]
    BadCapacity(u32),
    #[error("the other side's index claims {0} entries, more than the capacity")]
    Corrupt(u32),
    #[error("the other side's index announces {0} entries it never stamped")]
    Unstamped(u32),
}

impl RingLayout {
    pub fn new(offset: usize, capacity: u32, slot: usize) -> Result<Self, RingError> {
        if !capacity.is_power_of_two() || capacity > 1 << 16 {
            return Err(RingError::BadCapacity(capacity));
        }
        Ok(RingLayout {
            offset,
            capacity,
            slot,
        })
    }

    /// Bytes the ring occupies.
    pub fn bytes(capacity: u32, slot: usize) -> usize {
        RING_HEADER + capacity as usize * slot
    }

    /// Offset of the producer index.
    pub fn prod(&self) -> usize {
        self.offset
    }

    /// Offset of the consumer index.
    pub fn cons(&self) -> usize {
        self.offset + CACHE_LINE
    }

    fn armed(&self) -> usize {
        self.offset + 2 * CACHE_LINE
    }

    fn slot_at(&self, index: u32) -> usize {
        self.offset + RING_HEADER + (index & (self.capacity - 1)) as usize * self.slot
    }

    /// Offset of the stamp word of the entry at `index`.
    fn stamp_at<T: RingEntry>(&self, index: u32) -> usize {
        self.slot_at(index) + T::STAMP_WORD
    }

    /// Whether the entry at `index` carries its stamp (acquire: its bytes
    /// are visible once it does).
    fn stamped<T: RingEntry>(&self, mem: &impl SharedMem, index: u32) -> bool {
        let w = mem.load_acquire(self.stamp_at::<T>(index));
        (w >> 24) as u8 == stamp_of(index, self.capacity)
    }
}

/// An application's doorbells, a block in its segment: a bit per QP
/// (by QPN, from [`transport::rc::QPN_BASE`]) in 32-bit words, and above them
/// a summary bit per group of 32 words, so that the daemon reads one
/// cache line per application and pass while no bell rings. A producer
/// rings the QP's bell only when the daemon parked the QP
/// ([`Producer::take_armed`]); the daemon takes the bells, clearing them,
/// and watches the QPs' rings again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Doorbells {
    /// Offset of the block, a multiple of [`CACHE_LINE`].
    pub offset: usize,
}

/// QPs a doorbell block has bits for.
const BELLS: usize = transport::rc::MAX_QPS;
/// Words of QP bits.
const BELL_WORDS: usize = BELLS / 32;
/// Words of summary bits (a bit per 32 words).
const BELL_SUMMARY_WORDS: usize = BELL_WORDS / 32 / 32;

impl Doorbells {
    /// Bytes of the block: the summary's line, the QP bits, then the wake
    /// line ([`Doorbells::set_asleep`]).
    pub const BYTES: usize = CACHE_LINE + BELL_WORDS * 4 + CACHE_LINE;

    /// Offset of the wake line: the lcore's "asleep" word, then the time
    /// (two words, low first) the application rang the lcore's wake-up.
    fn wake_line(&self) -> usize {
        self.offset + CACHE_LINE + BELL_WORDS * 4
    }

    /// The daemon, before its lcore sleeps: says so to the application
    /// (which then wakes it after ringing a bell). The swap is a full
    /// barrier between this word and every ring the lcore reads after
    /// it: either the lcore sees the application's new entries, or the
    /// application sees this word ([`Doorbells::take_asleep`]).
    pub fn set_asleep(&self, mem: &impl SharedMem) {
        mem.swap(self.wake_line(), 1);
    }

    /// The daemon, once its lcore is awake again.
    pub fn clear_asleep(&self, mem: &impl SharedMem) {
        mem.store_release(self.wake_line(), 0);
    }

    /// The application, after ringing a bell (or writing an SRQ ring the
    /// lcore armed): clears the lcore's "asleep" word and says whether
    /// it was set, in which case the application wakes the lcore (its
    /// eventfd). Only the first poster after the lcore fell asleep pays
    /// for the system call.
    pub fn take_asleep(&self, mem: &impl SharedMem) -> bool {
        mem.swap(self.wake_line(), 0) != 0
    }

    /// The application, when it wakes the lcore: the time it did (ns of
    /// `CLOCK_MONOTONIC`), for the daemon's wake-up latency.
    pub fn stamp_rung(&self, mem: &impl SharedMem, ns: u64) {
        mem.store_release(self.wake_line() + 8, ns as u32);
        mem.store_release(self.wake_line() + 12, (ns >> 32) as u32);
    }

    /// The application, once its segment is mapped: its process id, which
    /// the daemon looks at (`/proc/PID/stat`) to tell an application that
    /// polls from one that sleeps.
    pub fn set_owner_pid(&self, mem: &impl SharedMem, pid: u32) {
        mem.store_release(self.wake_line() + 16, pid);
    }

    /// The daemon: the process id [`Doorbells::set_owner_pid`] wrote (any
    /// value: 0 when none was).
    pub fn owner_pid(&self, mem: &impl SharedMem) -> u32 {
        mem.load_acquire(self.wake_line() + 16)
    }

    /// The daemon: the time last stamped by [`Doorbells::stamp_rung`] (any
    /// value: the application's to scribble on, or torn by a race).
    pub fn rung_at(&self, mem: &impl SharedMem) -> u64 {
        let lo = mem.load_acquire(self.wake_line() + 8);
        let hi = mem.load_acquire(self.wake_line() + 12);
        u64::from(hi) << 32 | u64::from(lo)
    }

    /// Rings the bell of QP `qpn` (its bit, then its group's summary
    /// bit). A QPN outside the block rings nothing.
    pub fn ring(&self, mem: &impl SharedMem, qpn: u32) {
        let Some(i) = qpn.checked_sub(transport::rc::QPN_BASE).map(|i| i as usize) else {
            return;
        };
        if i >= BELLS {
            return;
        }
        let word = i / 32;
        mem.fetch_or(self.offset + CACHE_LINE + 4 * word, 1 << (i % 32));
        let group = word / 32;
        mem.fetch_or(self.offset + 4 * (group / 32), 1 << (group % 32));
    }

    /// Takes every bell rung since the last call, clearing them, and
    /// hands each QPN to `woken` (any value: the block is the
    /// application's to scribble on). Reads one line when none rang.
    pub fn take(&self, mem: &impl SharedMem, mut woken: impl FnMut(u32)) {
        for t in 0..BELL_SUMMARY_WORDS {
            // The summary is cleared before the words are read: a bit set
            // after it sets the summary again.
            take_bits(mem, self.offset + 4 * t, |g| {
                let group = t * 32 + g;
                for word in group * 32..(group + 1) * 32 {
                    take_bits(mem, self.offset + CACHE_LINE + 4 * word, |b| {
                        woken(transport::rc::QPN_BASE + (word * 32 + b) as u32)
                    });
                }
            });
        }
    }
}

/// The value of a ring's wake-up flag armed for solicited events only.
const ARMED_SOLICITED: u32 = 2;

/// The producer's side of a ring of `T`.
#[derive(Debug)]
pub struct Producer<T> {
    layout: RingLayout,
    /// Next index to fill (private; published on [`Producer::publish`]).
    prod: u32,
    /// The consumer index as last read: shared memory is read again only
    /// when this shows the ring full (so the consumer's cache line is not
    /// pulled over on every push).
    cons_seen: u32,
    /// The index as last stored in shared memory.
    published: u32,
    _t: core::marker::PhantomData<T>,
}

impl<T: RingEntry> Producer<T> {
    /// The producer of a ring whose indices start at 0.
    pub fn new(layout: RingLayout) -> Self {
        Producer {
            layout,
            prod: 0,
            cons_seen: 0,
            published: 0,
            _t: core::marker::PhantomData,
        }
    }

    pub fn layout(&self) -> RingLayout {
        self.layout
    }

    /// Slots free now, as far as needed to tell whether `want` fit: the
    /// consumer index is read again only when the one read last leaves
    /// fewer than `want` slots.
    pub fn free(&mut self, mem: &impl SharedMem, want: u32) -> Result<u32, RingError> {
        let used = self.prod.wrapping_sub(self.cons_seen);
        if used <= self.layout.capacity && self.layout.capacity - used >= want.max(1) {
            return Ok(self.layout.capacity - used);
        }
        let cons = mem.load_acquire(self.layout.cons());
        let used = self.prod.wrapping_sub(cons);
        if used > self.layout.capacity {
            return Err(RingError::Corrupt(used));
        }
        self.cons_seen = cons;
        Ok(self.layout.capacity - used)
    }

    /// Writes `item` into the next slot and stamps it (the consumer sees
    /// it from then on); the caller checked [`Producer::free`].
    pub fn write(&mut self, mem: &impl SharedMem, item: &T) {
        self.write_prefix(mem, item, core::mem::size_of::<T>());
    }

    /// Writes the first `len` bytes of `item` into the next slot (the rest
    /// of the slot keeps older bytes the consumer will not read).
    /// The entry is ready for the consumer once this returns: its stamp
    /// word is written last, with a release store.
    #[inline]
    pub fn write_prefix(&mut self, mem: &impl SharedMem, item: &T, len: usize) {
        let bytes = bytemuck::bytes_of(item);
        let len = len.clamp(T::STAMP_WORD + 4, bytes.len());
        let at = self.layout.slot_at(self.prod);
        let w = T::STAMP_WORD;
        mem.write_bytes(at, &bytes[..w]);
        mem.write_bytes(at + w + 4, &bytes[w + 4..len]);
        let word = u32::from_le_bytes([bytes[w], bytes[w + 1], bytes[w + 2], 0]);
        let stamp = u32::from(stamp_of(self.prod, self.layout.capacity)) << 24;
        mem.store_release(at + w, word | stamp);
        self.prod = self.prod.wrapping_add(1);
        // The index is stored once it lags by half a lap: read by the
        // consumer only when no stamp is ready, it is then rarely a line
        // the other core has just written, and it never lags by a lap
        // (what the consumer would take for a scribble).
        if self.prod.wrapping_sub(self.published) >= (self.layout.capacity / 2).max(1) {
            self.publish(mem);
        }
    }

    /// Stores the index now. Entries need no such doorbell (their stamps
    /// make them visible as they are written, and [`Producer::write_prefix`]
    /// stores the index every half lap): this is for a producer that wants
    /// the index exact, such as a test.
    pub fn publish(&mut self, mem: &impl SharedMem) {
        mem.store_release(self.layout.prod(), self.prod);
        self.published = self.prod;
    }

    /// Writes one item; `Ok(false)` when the ring is full.
    pub fn push(&mut self, mem: &impl SharedMem, item: &T) -> Result<bool, RingError> {
        if self.free(mem, 1)? == 0 {
            return Ok(false);
        }
        self.write(mem, item);
        Ok(true)
    }

    /// After writing entries: clears the consumer's wake-up flag and says
    /// whether it was set (the consumer waits for an event, or parked the
    /// ring and wants a doorbell, [`Doorbells::ring`]). The swap orders
    /// the entries' stamps before the flag's read, the mirror of
    /// [`Consumer::arm`]: either the consumer sees the entries or this
    /// sees its flag. The flag's line is the producer's own unless the
    /// consumer has just armed it.
    pub fn take_armed(&self, mem: &impl SharedMem) -> bool {
        mem.swap(self.layout.armed(), 0) != 0
    }

    /// [`Producer::take_armed`] for a CQ, after CQEs of which `solicited`
    /// says whether any is a solicited event (a solicited receive or an
    /// error): a consumer armed with [`Consumer::arm_solicited`] keeps its
    /// flag, and is not woken, until one is. The first read is a full
    /// barrier as the swap is.
    pub fn take_armed_for(&self, mem: &impl SharedMem, solicited: bool) -> bool {
        match mem.fetch_or(self.layout.armed(), 0) {
            0 => false,
            ARMED_SOLICITED if !solicited => false,
            _ => self.take_armed(mem),
        }
    }
}

/// The consumer's side of a ring of `T`.
#[derive(Debug)]
pub struct Consumer<T> {
    layout: RingLayout,
    /// Next index to read (private; published after each pop).
    cons: u32,
    /// The producer index as last read: read again only once every entry
    /// it announced has been consumed.
    prod_seen: u32,
    _t: core::marker::PhantomData<T>,
}

/// Entries [`Consumer::available`] counts by their stamps at most (it is
/// asked again once they are consumed).
const STAMP_SCAN: u32 = 32;

impl<T: RingEntry> Consumer<T> {
    pub fn new(layout: RingLayout) -> Self {
        Consumer {
            layout,
            cons: 0,
            prod_seen: 0,
            _t: core::marker::PhantomData,
        }
    }

    pub fn layout(&self) -> RingLayout {
        self.layout
    }

    /// Entries waiting now: those the producer index announced last time
    /// and not consumed yet, else those whose stamps are ready (up to 32),
    /// else those the producer index announces now (read only then, to
    /// tell an empty ring from a scribbled index).
    #[inline]
    pub fn available(&mut self, mem: &impl SharedMem) -> Result<u32, RingError> {
        let n = self.prod_seen.wrapping_sub(self.cons);
        if n > 0 && n <= self.layout.capacity {
            return Ok(n);
        }
        let scan = self.layout.capacity.min(STAMP_SCAN);
        let mut n = 0;
        while n < scan && self.layout.stamped::<T>(mem, self.cons.wrapping_add(n)) {
            n += 1;
        }
        if n > 0 {
            self.prod_seen = self.cons.wrapping_add(n);
            return Ok(n);
        }
        let prod = mem.load_acquire(self.layout.prod());
        let n = prod.wrapping_sub(self.cons);
        if n == 0 || self.cons.wrapping_sub(prod) <= self.layout.capacity {
            // Behind the entries taken by their stamps by at most a lap:
            // the producer has not published them yet (it publishes at
            // least once a lap). Nothing is taken on its word alone.
            return Ok(0);
        }
        if n > self.layout.capacity {
            return Err(RingError::Corrupt(n));
        }
        // The producer stamps before it publishes: an entry the index
        // announces is stamped by now, or the index was scribbled.
        if !self.layout.stamped::<T>(mem, self.cons) {
            return Err(RingError::Unstamped(n));
        }
        self.prod_seen = prod;
        Ok(n)
    }

    /// The next entry without consuming it (the caller checked
    /// [`Consumer::available`]).
    /// The entry at the consumer index, reading its first cache line and
    /// then only as many more bytes as `used` says the entry fills (so a
    /// large slot's unused tail never crosses between cores).
    pub fn peek_used(&self, mem: &impl SharedMem, used: impl Fn(&T) -> usize) -> T {
        let mut v = T::zeroed();
        let at = self.layout.slot_at(self.cons);
        let bytes = bytemuck::bytes_of_mut(&mut v);
        let first = CACHE_LINE.min(bytes.len());
        mem.read_bytes(at, &mut bytes[..first]);
        let n = used(&v).clamp(first, core::mem::size_of::<T>());
        let bytes = bytemuck::bytes_of_mut(&mut v);
        mem.read_bytes(at + first, &mut bytes[first..n]);
        v
    }

    /// [`Consumer::peek_used`] into `out` (no zeroing: bytes past what
    /// `used` says keep whatever they held).
    #[inline]
    pub fn peek_used_into(&self, mem: &impl SharedMem, out: &mut T, used: impl Fn(&T) -> usize) {
        let at = self.layout.slot_at(self.cons);
        let size = core::mem::size_of::<T>();
        let first = CACHE_LINE.min(size);
        mem.read_bytes(at, &mut bytemuck::bytes_of_mut(out)[..first]);
        let n = used(out).clamp(first, size);
        mem.read_bytes(at + first, &mut bytemuck::bytes_of_mut(out)[first..n]);
    }

    pub fn peek(&self, mem: &impl SharedMem) -> T {
        let mut item = T::zeroed();
        mem.read_bytes(
            self.layout.slot_at(self.cons),
            bytemuck::bytes_of_mut(&mut item),
        );
        item
    }

    /// Consumes the entry [`Consumer::peek`] returned and frees its slot.
    #[inline]
    pub fn advance(&mut self, mem: &impl SharedMem) {
        self.cons = self.cons.wrapping_add(1);
        mem.store_release(self.layout.cons(), self.cons);
    }

    /// Consumes every entry waiting now without reading it (a QP moved
    /// to RESET forgets its WRs); returns how many.
    pub fn discard_all(&mut self, mem: &impl SharedMem) -> Result<u32, RingError> {
        let mut total = 0u32;
        loop {
            let n = self.available(mem)?;
            if n == 0 || total >= self.layout.capacity {
                break;
            }
            self.cons = self.cons.wrapping_add(n);
            total += n;
        }
        if total > 0 {
            mem.store_release(self.layout.cons(), self.cons);
        }
        Ok(total)
    }

    /// Pops the next entry, if any.
    pub fn pop(&mut self, mem: &impl SharedMem) -> Result<Option<T>, RingError> {
        if self.available(mem)? == 0 {
            return Ok(None);
        }
        let item = self.peek(mem);
        self.advance(mem);
        Ok(Some(item))
    }

    /// Asks the producer to signal its next entries
    /// ([`Producer::take_armed`]); the caller then reads the ring once
    /// more, as [`Consumer::park`] does. The swap is a full barrier
    /// between the flag and the stamps read after it.
    pub fn arm(&self, mem: &impl SharedMem) {
        mem.swap(self.layout.armed(), 1);
    }

    /// [`Consumer::arm`] for solicited events only (a CQ armed by
    /// `ibv_req_notify_cq` with `solicited_only`): the producer signals
    /// the next solicited or error completion
    /// ([`Producer::take_armed_for`]). Arming for every completion while
    /// armed for solicited ones widens it, as verbs asks.
    pub fn arm_solicited(&self, mem: &impl SharedMem) {
        let at = self.layout.armed();
        if mem.fetch_or(at, 0) != 1 {
            mem.swap(at, ARMED_SOLICITED);
        }
    }

    /// Stops watching the ring: arms it (the producer rings the doorbell
    /// for its next entries) and says whether the ring is still empty.
    /// When it is not (an entry raced in before the flag was seen), keep
    /// watching: the flag stays set and costs the producer one needless
    /// doorbell.
    pub fn park(&mut self, mem: &impl SharedMem) -> Result<bool, RingError> {
        self.arm(mem);
        Ok(self.available(mem)? == 0)
    }
}

/// Clears the word at `at` and hands `each` the index of every bit that
/// was set in it (nothing, and no write, when none was).
fn take_bits(mem: &impl SharedMem, at: usize, mut each: impl FnMut(usize)) {
    if mem.load_acquire(at) == 0 {
        return;
    }
    let mut bits = mem.swap(at, 0);
    while bits != 0 {
        each(bits.trailing_zeros() as usize);
        bits &= bits - 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rung_bell_is_taken_once_and_names_its_qp() {
        let mem = HeapSegment::new(Doorbells::BYTES + 64);
        let bells = Doorbells { offset: 64 };
        let base = transport::rc::QPN_BASE;
        let qpns = [base, base + 31, base + 32, base + 5000, base + 65535];
        for q in qpns {
            bells.ring(&mem, q);
        }
        bells.ring(&mem, base + 5000);
        bells.ring(&mem, base - 1);
        bells.ring(&mem, base + 65536);
        let mut got = Vec::new();
        bells.take(&mem, |q| got.push(q));
        assert_eq!(got, qpns, "each rung QP once, none outside the block");
        bells.take(&mem, |q| panic!("{q:#x} taken twice"));
        let mut raw = vec![0u8; Doorbells::BYTES + 64];
        mem.read_bytes(0, &mut raw);
        assert!(raw.iter().all(|&b| b == 0), "every bit cleared");
    }

    #[test]
    fn a_cq_armed_for_solicited_events_is_signaled_by_the_first_one_only() {
        let mem = HeapSegment::new(4096);
        let layout = RingLayout::new(0, 8, core::mem::size_of::<Cqe>()).unwrap();
        let (p, c) = (Producer::<Cqe>::new(layout), Consumer::<Cqe>::new(layout));
        assert!(!p.take_armed_for(&mem, true), "not armed");
        c.arm_solicited(&mem);
        assert!(!p.take_armed_for(&mem, false), "an unsolicited CQE");
        assert!(p.take_armed_for(&mem, true), "the solicited one");
        assert!(!p.take_armed_for(&mem, true), "once");
        c.arm(&mem);
        c.arm_solicited(&mem);
        assert!(
            p.take_armed_for(&mem, false),
            "armed for every completion: the narrower arming does not narrow it"
        );
    }

    #[test]
    fn a_sleeping_lcore_is_woken_by_the_first_poster_only() {
        let mem = HeapSegment::new(Doorbells::BYTES + 64);
        let bells = Doorbells { offset: 64 };
        assert!(!bells.take_asleep(&mem), "awake: no wake-up");
        bells.set_asleep(&mem);
        assert!(bells.take_asleep(&mem), "asleep: the first poster wakes it");
        assert!(!bells.take_asleep(&mem), "the next one does not");
        bells.set_asleep(&mem);
        bells.clear_asleep(&mem);
        assert!(!bells.take_asleep(&mem), "woken by something else");
        bells.stamp_rung(&mem, 0x1234_5678_9abc_def0);
        assert_eq!(bells.rung_at(&mem), 0x1234_5678_9abc_def0);
        bells.set_owner_pid(&mem, 4321);
        assert_eq!(bells.owner_pid(&mem), 4321);
        assert_eq!(bells.rung_at(&mem), 0x1234_5678_9abc_def0);
        bells.ring(&mem, transport::rc::QPN_BASE + 65535);
        let mut got = Vec::new();
        bells.take(&mem, |q| got.push(q));
        assert_eq!(
            got,
            [transport::rc::QPN_BASE + 65535],
            "the wake line is not a bell"
        );
    }

    #[test]
    fn a_parked_ring_asks_its_producer_for_a_bell_and_only_then() {
        let mem = HeapSegment::new(4096);
        let layout = RingLayout::new(0, 8, core::mem::size_of::<Cqe>()).unwrap();
        let (mut p, mut c) = (Producer::<Cqe>::new(layout), Consumer::<Cqe>::new(layout));
        p.push(&mem, &cqe(1)).unwrap();
        assert!(!p.take_armed(&mem), "watched: no bell");
        assert_eq!(c.park(&mem), Ok(false), "not empty: keep watching");
        c.advance(&mem);
        assert_eq!(c.park(&mem), Ok(true), "empty: parked");
        p.push(&mem, &cqe(2)).unwrap();
        assert!(p.take_armed(&mem), "parked: the producer rings");
        assert!(!p.take_armed(&mem), "once");
    }

    fn cqe(i: u64) -> Cqe {
        Cqe {
            wr_id: i,
            ..Cqe::zeroed()
        }
    }

    #[test]
    fn entries_have_fixed_sizes() {
        assert_eq!(core::mem::size_of::<Wqe>(), 256);
        assert_eq!(core::mem::size_of::<Cqe>(), 32);
        assert_eq!(core::mem::size_of::<RecvWqe>(), 128);
        assert_eq!(core::mem::offset_of!(Wqe, sges), WQE_HEADER_LEN);
    }

    #[test]
    fn only_the_used_bytes_of_a_wqe_cross_the_ring() {
        let l = RingLayout::new(0, 4, core::mem::size_of::<Wqe>()).unwrap();
        let seg = HeapSegment::new(RingLayout::bytes(4, core::mem::size_of::<Wqe>()));
        let mut p = Producer::<Wqe>::new(l);
        let mut c = Consumer::<Wqe>::new(l);
        let local = transport::rc::Sge {
            lkey: 1,
            va: 2,
            len: 3,
        };
        let one = SendWr::new(1, WrOp::Send, local, 0, 0);
        let many = SendWr {
            sg: SgList::new(&[local; 5]).unwrap(),
            ..one
        };
        let inline = SendWr {
            sg: SgList::EMPTY,
            inline: Some(transport::rc::InlineData::new(&[9; 100]).unwrap()),
            ..one
        };
        // A full slot of garbage first: only the used prefix is rewritten.
        let mut junk = Wqe::zeroed();
        bytemuck::bytes_of_mut(&mut junk).fill(0xee);
        for wr in [one, many, inline] {
            p.write(&seg, &junk);
            p.publish(&seg);
            c.available(&seg).unwrap();
            c.advance(&seg);
            let w = Wqe::from_wr(&wr).unwrap();
            p.write_prefix(&seg, &w, w.used_len());
            p.publish(&seg);
            c.available(&seg).unwrap();
            let got = c.peek_used(&seg, Wqe::used_len);
            assert_eq!(got.to_wr(), Ok(wr));
            c.advance(&seg);
        }
        let w = Wqe::from_wr(&one).unwrap();
        assert_eq!(w.used_len(), CACHE_LINE, "one SGE: one cache line");
    }

    #[test]
    fn a_ring_passes_entries_in_order_across_index_wrap() {
        let l = RingLayout::new(64, 8, 32).unwrap();
        let seg = HeapSegment::new(64 + RingLayout::bytes(8, 32));
        let mut p = Producer::<Cqe>::new(l);
        let mut c = Consumer::<Cqe>::new(l);
        // Start both sides just below the u32 wrap.
        p.prod = u32::MAX - 3;
        c.cons = u32::MAX - 3;
        seg.store_release(l.cons(), c.cons);
        seg.store_release(l.prod(), p.prod);
        let mut next = 0;
        for round in 0..5u64 {
            for i in 0..8 {
                assert!(p.push(&seg, &cqe(round * 8 + i)).unwrap());
            }
            assert!(!p.push(&seg, &cqe(99)).unwrap(), "full at capacity");
            // Half drained: the producer sees the room when it asks for it.
            for _ in 0..4 {
                assert_eq!(c.pop(&seg).unwrap().unwrap().wr_id, next);
                next += 1;
            }
            assert_eq!(p.free(&seg, 4).unwrap(), 4);
            assert_eq!(p.free(&seg, 5).unwrap(), 4, "never more than there is");
            while let Some(e) = c.pop(&seg).unwrap() {
                assert_eq!(e.wr_id, next);
                next += 1;
            }
        }
        assert_eq!(next, 40);
    }

    #[test]
    fn a_scribbled_index_is_reported_not_trusted() {
        let l = RingLayout::new(0, 4, 64).unwrap();
        let seg = HeapSegment::new(RingLayout::bytes(4, 64));
        let mut c = Consumer::<Wqe>::new(l);
        seg.store_release(l.prod(), 5);
        assert_eq!(c.available(&seg), Err(RingError::Corrupt(5)));
        // The producer reads the consumer index when its view is full.
        let mut p = Producer::<Wqe>::new(l);
        for _ in 0..4 {
            p.write(&seg, &Wqe::zeroed());
        }
        seg.store_release(l.cons(), 9);
        assert_eq!(
            p.free(&seg, 1),
            Err(RingError::Corrupt(4u32.wrapping_sub(9)))
        );
    }

    /// The consumer learns of an entry from its stamp, before (and
    /// without) the producer index; a zeroed slot, the previous lap's
    /// entry and an entry whose item carried a stray stamp byte are told
    /// apart from a ready one.
    #[test]
    fn entries_are_seen_by_their_stamps() {
        let l = RingLayout::new(0, 4, 32).unwrap();
        let seg = HeapSegment::new(RingLayout::bytes(4, 32));
        let mut p = Producer::<Cqe>::new(l);
        let mut c = Consumer::<Cqe>::new(l);
        assert_eq!(c.available(&seg), Ok(0), "a zeroed ring is empty");
        let mut e = cqe(7);
        e.src[3] = stamp_of(1, 4); // a stray stamp of the wrong index
        p.write(&seg, &e);
        assert_eq!(seg.load_acquire(l.prod()), 0, "not published");
        assert_eq!(c.available(&seg), Ok(1));
        assert_eq!(c.pop(&seg).unwrap().map(|e| e.wr_id), Some(7));
        assert_eq!(c.available(&seg), Ok(0), "the next slot is not stamped");
        // Around the ring: slot 0 holds lap 0's entry, which is not lap 1's.
        for i in 1..4 {
            p.write(&seg, &cqe(i));
        }
        for i in 1..4 {
            assert_eq!(c.pop(&seg).unwrap().map(|e| e.wr_id), Some(i));
        }
        assert_eq!(c.available(&seg), Ok(0), "lap 0's entry in slot 0 is stale");
        p.write(&seg, &cqe(4));
        assert_eq!(c.pop(&seg).unwrap().map(|e| e.wr_id), Some(4));
    }

    #[test]
    fn an_index_that_announces_an_unstamped_entry_is_refused() {
        let l = RingLayout::new(0, 4, 256).unwrap();
        let seg = HeapSegment::new(RingLayout::bytes(4, 256));
        let mut c = Consumer::<Wqe>::new(l);
        seg.store_release(l.prod(), 2);
        assert_eq!(c.available(&seg), Err(RingError::Unstamped(2)));
    }

    #[test]
    fn stamps_name_the_lap_and_are_never_zero() {
        assert_eq!(stamp_of(0, 4), 0x80);
        assert_eq!(stamp_of(3, 4), 0x80);
        assert_eq!(stamp_of(4, 4), 0x81);
        assert_eq!(stamp_of(4 * 128, 4), 0x80, "128 laps later");
        assert_eq!(stamp_of(u32::MAX, 1), 0xff);
        for i in 0..2000u32 {
            assert_ne!(stamp_of(i, 8), 0);
            assert_ne!(stamp_of(i, 8), stamp_of(i.wrapping_sub(8), 8));
        }
    }

    #[test]
    fn wake_flag_is_taken_once() {
        let l = RingLayout::new(0, 4, 32).unwrap();
        let seg = HeapSegment::new(RingLayout::bytes(4, 32));
        let p = Producer::<Cqe>::new(l);
        let c = Consumer::<Cqe>::new(l);
        assert!(!p.take_armed(&seg));
        c.arm(&seg);
        assert!(p.take_armed(&seg));
        assert!(!p.take_armed(&seg));
    }

    #[test]
    fn capacities_must_be_powers_of_two() {
        assert_eq!(RingLayout::new(0, 6, 64), Err(RingError::BadCapacity(6)));
        assert!(RingLayout::new(0, 1 << 17, 64).is_err());
    }

    #[test]
    fn wqe_round_trips_and_bad_opcodes_are_named() {
        let local = transport::rc::Sge {
            lkey: 1,
            va: 2,
            len: 8,
        };
        for op in [
            WrOp::Write,
            WrOp::WriteImm(0xdead),
            WrOp::Read,
            WrOp::Send,
            WrOp::SendImm(7),
            WrOp::CmpSwap {
                compare: 1 << 40,
                swap: 3,
            },
            WrOp::FetchAdd { add: u64::MAX },
        ] {
            let mut wr = SendWr::new(9, op, local, 4, 5);
            wr.fence = true;
            assert_eq!(Wqe::from_wr(&wr).unwrap().to_wr(), Ok(wr));
        }
        let wr = SendWr::new(9, WrOp::Write, local, 4, 5);
        let mut w = Wqe::from_wr(&wr).unwrap();
        w.opcode = 77;
        assert_eq!(w.to_wr(), Err(WqeError::UnknownOpcode(77)));
        w.opcode = wqe_op::RDMA_READ;
        w.flags = 0x80;
        assert_eq!(w.to_wr(), Err(WqeError::UnknownFlags(0x80)));
        // Up to WQE_MAX_SGE entries, or the bytes inline.
        let many = SendWr {
            sg: transport::rc::SgList::new(&[local; WQE_MAX_SGE]).unwrap(),
            ..wr
        };
        assert_eq!(Wqe::from_wr(&many).unwrap().to_wr(), Ok(many));
        let too_many = SendWr {
            sg: transport::rc::SgList::new(&[local; WQE_MAX_SGE + 1]).unwrap(),
            ..wr
        };
        assert_eq!(
            Wqe::from_wr(&too_many),
            Err(WqeError::TooManySges {
                have: WQE_MAX_SGE + 1,
                max: WQE_MAX_SGE
            })
        );
        let inline = SendWr {
            sg: SgList::EMPTY,
            inline: Some(transport::rc::InlineData::new(&[7; 100]).unwrap()),
            ..wr
        };
        let w = Wqe::from_wr(&inline).unwrap();
        assert_eq!(w.to_wr(), Ok(inline));
        let mut bad = w;
        bad.inline_len = 300;
        assert_eq!(bad.to_wr(), Err(WqeError::InlineTooLong(300)));
        bad.flags = WQE_SIGNALED;
        bad.num_sge = 14;
        assert_eq!(
            bad.to_wr(),
            Err(WqeError::TooManySges {
                have: 14,
                max: WQE_MAX_SGE
            })
        );
    }

    #[test]
    fn every_completion_opcode_has_its_ibverbs_code() {
        for (o, code) in OPCODES {
            assert_eq!(opcode_code(o), code);
            assert_eq!(opcode_from_code(code), Some(o));
        }
        assert_eq!(opcode_from_code(5), None);
    }

    #[test]
    fn every_status_has_its_ibverbs_code() {
        for (s, code) in STATUSES {
            assert_eq!(status_code(s), code);
            assert_eq!(status_from_code(code), Some(s));
            assert_ne!(status_name(code), "unknown");
        }
        assert_eq!(status_code(WcStatus::WrFlushErr), 5);
        assert_eq!(status_code(WcStatus::RetryExcErr), 12);
        assert_eq!(status_from_code(3), None, "LOC_EEC_OP_ERR is not ours");
        assert_eq!(status_name(200), "unknown");
    }
}
