//! The operations `bench torture` runs and how each is checked: what it
//! puts in memory before the post, which work request it posts, which
//! receive WQE the peer needs, and what memory and completions must show.

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use transport::rc::{Cqe, RecvWr, SendWr, SgList, Sge, WcOpcode, WcStatus, WrOp};

use super::pattern;

/// An operation kind of `--mix`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OpKind {
    Write,
    Read,
    Send,
    #[value(name = "send_imm")]
    SendImm,
    #[value(name = "write_imm")]
    WriteImm,
    #[value(name = "cmp_swap")]
    CmpSwap,
    #[value(name = "fetch_add")]
    FetchAdd,
}

impl OpKind {
    pub const ALL: [OpKind; 7] = [
        OpKind::Write,
        OpKind::Read,
        OpKind::Send,
        OpKind::SendImm,
        OpKind::WriteImm,
        OpKind::CmpSwap,
        OpKind::FetchAdd,
    ];

    /// Consumes a receive WQE at the responder.
    pub fn needs_recv(self) -> bool {
        matches!(self, OpKind::Send | OpKind::SendImm | OpKind::WriteImm)
    }

    pub fn is_atomic(self) -> bool {
        matches!(self, OpKind::CmpSwap | OpKind::FetchAdd)
    }
}

impl std::fmt::Display for OpKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use clap::ValueEnum;
        let v = self.to_possible_value().expect("no skipped variants");
        f.write_str(v.get_name())
    }
}

/// One operation: what was posted and what it must produce.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    pub kind: OpKind,
    pub len: u32,
    /// The immediate the peer must report.
    pub imm: u32,
    /// CMP_SWAP: the value at the target before, and whether the compare
    /// matches it; FETCH_ADD: the addend.
    pub before: u64,
    pub compare_hits: bool,
    pub add: u64,
    /// Where the local buffer and the receive buffer are cut into
    /// scatter/gather entries (fractions of the length, in 1/256ths).
    pub cuts: [u8; 2],
    pub recv_cuts: [u8; 2],
}

/// `[va, va + len)` as up to three entries, cut at `cuts` (in 1/256ths of
/// the length; repeated or zero cuts give fewer entries).
fn split(lkey: u32, va: u64, len: u32, cuts: [u8; 2]) -> SgList {
    let mut at: Vec<u32> = cuts
        .iter()
        .map(|&c| (u64::from(len) * u64::from(c) / 256) as u32)
        .collect();
    at.sort_unstable();
    let mut sg = SgList::EMPTY;
    let mut start = 0;
    for end in at.into_iter().chain([len]) {
        if end > start || (len == 0 && sg.as_slice().is_empty()) {
            let piece = Sge {
                lkey,
                va: va + u64::from(start),
                len: end - start,
            };
            sg.push(piece).expect("at most three entries");
            start = end;
        }
    }
    sg
}

impl Plan {
    pub fn new(kind: OpKind, id: u64, len: u32, rng: &mut ChaCha8Rng) -> Plan {
        Plan {
            kind,
            len: if kind.is_atomic() { 8 } else { len },
            imm: (id as u32) ^ 0x5a5a_0000,
            before: rng.gen(),
            compare_hits: rng.gen_bool(0.5),
            add: rng.gen_range(1..=1000),
            // A third of the WRs use one entry; the others two or three.
            cuts: if rng.gen_bool(0.33) {
                [0, 0]
            } else {
                rng.gen()
            },
            recv_cuts: rng.gen(),
        }
    }

    /// The value a CMP_SWAP writes when its compare hits.
    fn swap(&self, id: u64) -> u64 {
        id.wrapping_mul(0x9e37_79b9_7f4a_7c15)
    }

    /// The bytes the responder's slot must hold after the operation (and
    /// keep until the slot is used again), if it writes there.
    pub fn responder_slot(&self, id: u64) -> Option<Vec<u8>> {
        match self.kind {
            OpKind::Write | OpKind::WriteImm | OpKind::Send | OpKind::SendImm => {
                Some(pattern(id, self.len as usize))
            }
            OpKind::CmpSwap => {
                let v = if self.compare_hits {
                    self.swap(id)
                } else {
                    self.before
                };
                Some(v.to_ne_bytes().to_vec())
            }
            OpKind::Read | OpKind::FetchAdd => None,
        }
    }

    /// The work request, over the requester's slot `local` and the
    /// responder's `remote` (FETCH_ADD: the shared counter).
    pub fn wr(
        &self,
        id: u64,
        lkey: u32,
        local: u64,
        rkey: u32,
        remote: u64,
        counter: u64,
    ) -> SendWr {
        let buf = Sge {
            lkey,
            va: local,
            len: self.len,
        };
        let (op, remote) = match self.kind {
            OpKind::Write => (WrOp::Write, remote),
            OpKind::Read => (WrOp::Read, remote),
            OpKind::Send => (WrOp::Send, 0),
            OpKind::SendImm => (WrOp::SendImm(self.imm), 0),
            OpKind::WriteImm => (WrOp::WriteImm(self.imm), remote),
            OpKind::CmpSwap => (
                WrOp::CmpSwap {
                    compare: if self.compare_hits {
                        self.before
                    } else {
                        !self.before
                    },
                    swap: self.swap(id),
                },
                remote,
            ),
            OpKind::FetchAdd => (WrOp::FetchAdd { add: self.add }, counter),
        };
        let sg = if self.kind.is_atomic() {
            SgList::one(buf)
        } else {
            split(lkey, local, self.len, self.cuts)
        };
        SendWr {
            sg,
            ..SendWr::new(id, op, buf, rkey, remote)
        }
    }

    /// The receive WQE the responder needs: SENDs land in its slot.
    pub fn recv_wr(&self, id: u64, lkey: u32, slot: u64) -> Option<RecvWr> {
        let sg = match self.kind {
            OpKind::Send | OpKind::SendImm => split(lkey, slot, self.len, self.recv_cuts),
            OpKind::WriteImm => SgList::EMPTY,
            _ => return None,
        };
        Some(RecvWr { wr_id: id, sg })
    }

    /// Whether the responder's receive completion is the one this
    /// operation must produce.
    pub fn recv_ok(&self, c: &Cqe) -> bool {
        let (opcode, imm) = match self.kind {
            OpKind::Send => (WcOpcode::Recv, None),
            OpKind::SendImm => (WcOpcode::Recv, Some(self.imm)),
            OpKind::WriteImm => (WcOpcode::RecvRdmaWithImm, Some(self.imm)),
            _ => return false,
        };
        c.status == WcStatus::Success
            && c.opcode == opcode
            && c.imm == imm
            && c.byte_len == self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_splits_into_up_to_three_entries_covering_it() {
        for (len, cuts, n) in [
            (100u32, [0u8, 0], 1usize),
            (100, [128, 128], 2),
            (100, [200, 64], 3),
            (0, [10, 20], 1),
            (1, [255, 3], 1),
        ] {
            let sg = split(7, 1000, len, cuts);
            assert_eq!(sg.as_slice().len(), n, "{len} {cuts:?}");
            assert_eq!(sg.total(), u64::from(len));
            let mut va = 1000;
            for s in sg.as_slice() {
                assert_eq!((s.va, s.lkey), (va, 7));
                va += u64::from(s.len);
            }
        }
    }
}
