//! The pipeline's trace points: the stages a frame passes through a NIC
//! and the key that names the frame (opcode, DestQP, PSN) so that one
//! message can be followed from the application's doorbell to the peer's
//! placement and back (`bench write-lat --breakdown`).
//!
//! The pipeline calls [`crate::Host::stamp`] at each stage only when the
//! host asks for it ([`crate::Host::tracing`]); the host owns the clock
//! (the pipeline has none) and the record. Off, the cost is one branch per
//! burst.

use transport::wire::inflight::RoceFrame;

/// Where in the pipeline a stamp was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Stage {
    /// The application side took a WQE from its ring into the engine (key:
    /// the QP's own number and the PSN its next packet gets).
    Doorbell = 0,
    /// The engine built the frame in a port buffer.
    Built = 1,
    /// The port took the frame (after the TX burst).
    Sent = 2,
    /// The frame came out of an RX burst.
    Received = 3,
    /// The engine handled the frame (data placed, ACK processed).
    Handled = 4,
    /// A completion entered the application's CQ ring (key: the QP and
    /// the low 24 bits of the WR id).
    CqePublished = 5,
}

impl Stage {
    pub const ALL: [Stage; 6] = [
        Stage::Doorbell,
        Stage::Built,
        Stage::Sent,
        Stage::Received,
        Stage::Handled,
        Stage::CqePublished,
    ];

    pub fn from_code(c: u8) -> Option<Stage> {
        Stage::ALL.get(usize::from(c)).copied()
    }
}

/// What names a frame in a trace: its BTH opcode, DestQP and PSN.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FrameKey {
    pub opcode: u8,
    pub dest_qp: u32,
    pub psn: u32,
}

/// Opcode of keys that name no frame (doorbells, CQEs).
pub const NO_OPCODE: u8 = 0xff;

impl FrameKey {
    /// The key of a RoCEv2 frame; `None` for anything else (ARP).
    pub fn of(frame: &[u8]) -> Option<FrameKey> {
        let f = RoceFrame::new_checked(frame).ok()?;
        Some(FrameKey {
            opcode: f.opcode_raw(),
            dest_qp: f.dest_qp(),
            psn: f.psn(),
        })
    }

    /// Packs the key with a host index (0..16) and a stage into 64 bits:
    /// host 4, stage 4, opcode 8, QPN 24, PSN 24.
    pub fn pack(self, host: usize, stage: Stage) -> u64 {
        ((host as u64 & 0xf) << 60)
            | ((stage as u64 & 0xf) << 56)
            | (u64::from(self.opcode) << 48)
            | (u64::from(self.dest_qp & 0xff_ffff) << 24)
            | u64::from(self.psn & 0xff_ffff)
    }

    /// The host, stage and key [`FrameKey::pack`] packed; `None` for a
    /// stage code no stage has.
    pub fn unpack(v: u64) -> Option<(usize, Stage, FrameKey)> {
        let stage = Stage::from_code(((v >> 56) & 0xf) as u8)?;
        Some((
            (v >> 60) as usize,
            stage,
            FrameKey {
                opcode: (v >> 48) as u8,
                dest_qp: ((v >> 24) & 0xff_ffff) as u32,
                psn: (v & 0xff_ffff) as u32,
            },
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_packed_key_unpacks_to_itself() {
        let k = FrameKey {
            opcode: 0x0a,
            dest_qp: 0x12_3456,
            psn: 0xab_cdef,
        };
        for (h, s) in [(0, Stage::Doorbell), (15, Stage::CqePublished)] {
            assert_eq!(FrameKey::unpack(k.pack(h, s)), Some((h, s, k)));
        }
        assert_eq!(FrameKey::unpack(0x0f << 56), None);
    }

    #[test]
    fn only_roce_frames_have_a_key() {
        assert_eq!(FrameKey::of(&[0u8; 60]), None);
    }
}
