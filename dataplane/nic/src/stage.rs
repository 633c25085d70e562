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
use transport::wire::{ethernet, ipv4, udp, Bth, EthernetFrame};

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
    /// The key of a RoCEv2 frame; `None` for anything else (ARP). A frame
    /// held in pieces is keyed by its first, which holds every header.
    pub fn of(frame: &[u8]) -> Option<FrameKey> {
        match RoceFrame::new_checked(frame) {
            Ok(f) => Some(FrameKey {
                opcode: f.opcode_raw(),
                dest_qp: f.dest_qp(),
                psn: f.psn(),
            }),
            Err(_) => Self::of_headers(frame),
        }
    }

    /// The key read from the headers alone, without the lengths they
    /// state (which count the pieces after them): IPv4 over UDP to the
    /// RoCEv2 port, then BTH.
    fn of_headers(frame: &[u8]) -> Option<FrameKey> {
        let e = EthernetFrame::new_checked(frame).ok()?;
        let ip = e.payload();
        let first = *ip.first()?;
        let ihl = usize::from(first & 0x0f) * 4;
        if e.ethertype() != ethernet::ETHERTYPE_IPV4
            || first >> 4 != 4
            || ihl < ipv4::HEADER_LEN
            || *ip.get(9)? != ipv4::PROTO_UDP
        {
            return None;
        }
        let l4 = ip.get(ihl..)?;
        if u16::from_be_bytes([*l4.get(2)?, *l4.get(3)?]) != udp::ROCE_PORT {
            return None;
        }
        let bth = Bth::new_checked(l4.get(udp::HEADER_LEN..)?).ok()?;
        Some(FrameKey {
            opcode: bth.opcode_raw(),
            dest_qp: bth.dest_qp(),
            psn: bth.psn(),
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

    /// A frame held in pieces is keyed by its headers: the same key as
    /// the whole frame, and none for a headers piece that is not RoCEv2.
    #[test]
    fn the_headers_of_a_frame_in_pieces_have_its_key() {
        use std::net::Ipv4Addr;
        use transport::wire::{
            EthernetRepr, FrameTemplate, Ipv4Repr, MacAddr, Opcode, RethRepr, TransportRepr,
            UdpRepr,
        };
        let eth = EthernetRepr {
            src: MacAddr([2, 0, 0, 0, 0, 1]),
            dst: MacAddr([2, 0, 0, 0, 0, 2]),
            vlan: None,
        };
        let ip = Ipv4Repr {
            src: Ipv4Addr::new(10, 0, 0, 1),
            dst: Ipv4Addr::new(10, 0, 0, 2),
            ..Ipv4Repr::default()
        };
        let t = FrameTemplate::new(&eth, &ip, &UdpRepr { src_port: 49152 });
        let mut tr = TransportRepr::new(Opcode::RdmaWriteOnly, 0x12_3456, 0xab_cdef);
        tr.reth = Some(RethRepr {
            va: 0x1000,
            r_key: 7,
            dma_len: 2048,
        });
        let payload = [0x5a; 2048];
        let mut whole = vec![0u8; t.frame_len(&tr, payload.len())];
        t.emit_with(&tr, 1, payload.len(), &mut whole, |p| {
            p.copy_from_slice(&payload)
        })
        .unwrap();
        let mut head = [0u8; 128];
        let (n, _) = t.emit_head(&tr, 1, &payload, &mut head).unwrap();
        let want = Some(FrameKey {
            opcode: Opcode::RdmaWriteOnly as u8,
            dest_qp: 0x12_3456,
            psn: 0xab_cdef,
        });
        assert_eq!(FrameKey::of(&whole), want);
        assert_eq!(FrameKey::of(&head[..n]), want);
        let mut not_roce = head;
        not_roce[14 + 20 + 3] ^= 1; // UDP destination port
        assert_eq!(FrameKey::of(&not_roce[..n]), None);
    }
}
