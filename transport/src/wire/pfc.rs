//! Priority flow control (IEEE 802.1Qbb): the MAC control frame a switch
//! (or a receiving NIC) sends to the port upstream of it to stop one or
//! more of the eight priorities for a while, and sends again with a time
//! of zero to let them go (RESUME). EtherType 0x8808, opcode 0x0101, a
//! class-enable vector and eight pause times in quanta of 512 bit times
//! at the link's speed, padded to the 60-byte minimum frame, to the
//! reserved multicast address 01:80:C2:00:00:01 (never forwarded by a
//! bridge: it stops at the next hop).
//!
//! A RoCEv2 frame's priority is its DSCP's top three bits ([`priority_of_dscp`]:
//! DSCP 26 is priority 3, the usual lossless class).

use super::bytes::{check_len, get_u16, set_u16};
use super::ethernet::{self, EthernetFrame};
use super::{Layer, MacAddr, WireError};

/// EtherType of MAC control frames.
pub const ETHERTYPE_MAC_CONTROL: u16 = 0x8808;
/// MAC control opcode of priority flow control.
pub const OPCODE_PFC: u16 = 0x0101;
/// Where PFC frames go: the reserved "MAC control" multicast address.
pub const PFC_DST: MacAddr = MacAddr([0x01, 0x80, 0xC2, 0x00, 0x00, 0x01]);
/// Opcode, class-enable vector, eight times.
pub const MESSAGE_LEN: usize = 2 + 2 + 8 * 2;
/// A PFC frame is padded to the shortest Ethernet frame (without FCS).
pub const FRAME_LEN: usize = 60;
/// Bit times in one pause quantum.
pub const QUANTUM_BITS: u64 = 512;
/// The longest pause one frame asks for.
pub const MAX_QUANTA: u16 = u16::MAX;

/// A PFC message: for each priority whose bit is set in `enable`, pause it
/// for `quanta[p]` quanta (0: resume it now).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PfcRepr {
    pub enable: u8,
    pub quanta: [u16; 8],
}

/// The priority (0..=7) of a DSCP value: its class selector bits.
pub const fn priority_of_dscp(dscp: u8) -> u8 {
    (dscp >> 3) & 7
}

/// How long `quanta` pause quanta last on a link of `rate_bps`, ns
/// (rounded up; a link of rate 0 counts as 1 b/s).
pub fn quanta_ns(quanta: u16, rate_bps: u64) -> u64 {
    (u64::from(quanta) * QUANTUM_BITS * 1_000_000_000).div_ceil(rate_bps.max(1))
}

/// Whether a whole Ethernet frame is a MAC control frame (PFC or not).
pub fn is_mac_control(frame: &[u8]) -> bool {
    EthernetFrame::new_checked(frame).is_ok_and(|f| f.ethertype() == ETHERTYPE_MAC_CONTROL)
}

impl PfcRepr {
    /// Pauses `priority` for `quanta` (0: resumes it).
    pub fn one(priority: u8, quanta: u16) -> PfcRepr {
        let p = usize::from(priority & 7);
        let mut q = [0; 8];
        q[p] = quanta;
        PfcRepr {
            enable: 1 << p,
            quanta: q,
        }
    }

    /// The time this message sets for `priority`: `None` when the message
    /// does not name it, `Some(0)` for a resume.
    pub fn quanta_for(&self, priority: u8) -> Option<u16> {
        let p = usize::from(priority & 7);
        (self.enable & (1 << p) != 0).then_some(self.quanta[p])
    }

    /// The PFC message of a whole Ethernet frame (tagged or not).
    pub fn parse(frame: &[u8]) -> Result<PfcRepr, WireError> {
        let eth = EthernetFrame::new_checked(frame)?;
        if eth.ethertype() != ETHERTYPE_MAC_CONTROL {
            return Err(WireError::NotMacControl(eth.ethertype()));
        }
        let b = eth.payload();
        check_len(b, MESSAGE_LEN, Layer::Pfc)?;
        let op = get_u16(b, 0);
        if op != OPCODE_PFC {
            return Err(WireError::UnsupportedMacControl(op));
        }
        let mut quanta = [0; 8];
        for (i, q) in quanta.iter_mut().enumerate() {
            *q = get_u16(b, 4 + 2 * i);
        }
        // The vector's upper byte is reserved (transmitted as zero,
        // ignored on receipt).
        Ok(PfcRepr {
            enable: b[3],
            quanta,
        })
    }

    /// Writes the whole frame (untagged, from `src`, padded to
    /// [`FRAME_LEN`]) into `buf`; returns its length.
    pub fn emit(&self, src: MacAddr, buf: &mut [u8]) -> Result<usize, WireError> {
        if buf.len() < FRAME_LEN {
            return Err(WireError::BufferTooSmall {
                need: FRAME_LEN,
                have: buf.len(),
            });
        }
        let f = &mut buf[..FRAME_LEN];
        f.fill(0);
        let at = ethernet::emit_header(f, PFC_DST, src, None, ETHERTYPE_MAC_CONTROL)?;
        let b = &mut f[at..at + MESSAGE_LEN];
        set_u16(b, 0, OPCODE_PFC);
        set_u16(b, 2, u16::from(self.enable));
        for (i, q) in self.quanta.iter().enumerate() {
            set_u16(b, 4 + 2 * i, *q);
        }
        Ok(FRAME_LEN)
    }

    /// The whole frame as a vector.
    pub fn to_frame(&self, src: MacAddr) -> Vec<u8> {
        let mut v = vec![0; FRAME_LEN];
        // FRAME_LEN bytes always hold the frame.
        let n = self.emit(src, &mut v).unwrap_or(0);
        v.truncate(n);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SRC: MacAddr = MacAddr([2, 0, 0, 0, 0, 9]);

    #[test]
    fn a_pause_of_priority_3_has_the_802_1qbb_layout() {
        let p = PfcRepr::one(3, 0xFFFF);
        let f = p.to_frame(SRC);
        assert_eq!(f.len(), 60);
        assert_eq!(&f[0..6], &[0x01, 0x80, 0xC2, 0, 0, 1]);
        assert_eq!(&f[6..12], &SRC.0);
        assert_eq!(&f[12..14], &[0x88, 0x08], "MAC control");
        assert_eq!(&f[14..16], &[0x01, 0x01], "PFC opcode");
        assert_eq!(&f[16..18], &[0x00, 0x08], "class 3 enabled");
        assert_eq!(&f[18 + 6..18 + 8], &[0xFF, 0xFF], "time of class 3");
        assert!(f[18..24].iter().all(|&b| b == 0));
        assert!(f[34..].iter().all(|&b| b == 0), "zero padding");
        assert!(is_mac_control(&f));
        assert_eq!(PfcRepr::parse(&f), Ok(p));
        assert_eq!(p.quanta_for(3), Some(0xFFFF));
        assert_eq!(p.quanta_for(4), None);
        assert_eq!(PfcRepr::one(3, 0).quanta_for(3), Some(0), "a resume");
    }

    #[test]
    fn a_quantum_is_512_bit_times() {
        assert_eq!(quanta_ns(1, 100_000_000_000), 6, "5.12 ns rounded up");
        assert_eq!(quanta_ns(0xFFFF, 100_000_000_000), 335_540);
        assert_eq!(quanta_ns(100, 1_000_000_000), 51_200);
        assert_eq!(priority_of_dscp(26), 3);
        assert_eq!(priority_of_dscp(48), 6);
    }

    #[test]
    fn other_frames_are_refused_by_name() {
        let mut f = PfcRepr::one(3, 1).to_frame(SRC);
        f[14] = 0x00; // opcode 0x0001: 802.3x PAUSE
        assert_eq!(PfcRepr::parse(&f), Err(WireError::UnsupportedMacControl(1)));
        f[12] = 0x08;
        f[13] = 0x06;
        assert_eq!(PfcRepr::parse(&f), Err(WireError::NotMacControl(0x0806)));
        let g = PfcRepr::one(3, 1).to_frame(SRC);
        assert_eq!(
            PfcRepr::parse(&g[..20]),
            Err(WireError::Truncated(Layer::Pfc))
        );
        assert!(PfcRepr::one(3, 1).emit(SRC, &mut [0; 59]).is_err());
    }

    proptest! {
        #[test]
        fn every_message_round_trips(enable in any::<u8>(), quanta in any::<[u16; 8]>()) {
            let p = PfcRepr { enable, quanta };
            prop_assert_eq!(PfcRepr::parse(&p.to_frame(SRC)), Ok(p));
        }

        #[test]
        fn parsing_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..80)) {
            let _ = PfcRepr::parse(&bytes);
        }
    }
}
