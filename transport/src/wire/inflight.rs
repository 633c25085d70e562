//! The view network elements take of a RoCEv2 frame in flight: where it
//! goes (destination IPv4 address), its ECMP entropy (UDP source port), its
//! DestQP and opcode, its telemetry stack and ECN bits, and which bytes
//! are rewritten in flight (those the ICRC masks).
//!
//! Switches, the simulator and fault injectors use [`RoceFrame`] instead of
//! byte offsets of their own. It checks the header lengths through the
//! header views and never the ICRC (a switch forwards what it cannot
//! verify; the receiving NIC drops it).

use core::net::Ipv4Addr;
use core::ops::Range;

use super::{
    bth, ethernet, icrc, ipv4, udp, Bth, EthernetFrame, Ipv4Packet, Layer, Tlm, UdpPacket,
    WireError,
};

/// The DestQP of a RoCEv2 frame read from its headers alone (Ethernet,
/// an optional 802.1Q tag, IPv4 with any options, UDP to port 4791, the
/// BTH), to steer the frame to the engine owning its QP. `head` may be
/// only the frame's first segment: nothing past the BTH is looked at, and
/// nothing is checked that the engine checks on the whole frame (lengths,
/// checksums, ICRC). None for any other frame. An INT response's DestQP
/// is the QP it answers, on the far end: it does not name a QP of the
/// receiver (the daemon's QP shards do not subscribe to INT responses).
pub fn steering_dest_qp(head: &[u8]) -> Option<u32> {
    let eth = EthernetFrame::new_checked(head).ok()?;
    if eth.ethertype() != ethernet::ETHERTYPE_IPV4 {
        return None;
    }
    let ip = eth.payload();
    let first = *ip.first()?;
    let ihl = usize::from(first & 0x0f) * 4;
    if first >> 4 != 4 || ihl < ipv4::HEADER_LEN || *ip.get(9)? != ipv4::PROTO_UDP {
        return None;
    }
    let udp = ip.get(ihl..)?;
    let port = u16::from_be_bytes([*udp.get(2)?, *udp.get(3)?]);
    if port != udp::ROCE_PORT {
        return None;
    }
    let bth = Bth::new_checked(udp.get(udp::HEADER_LEN..)?).ok()?;
    Some(bth.dest_qp())
}

/// A RoCEv2 frame whose Ethernet, IPv4, UDP and BTH headers (and TLM block,
/// when BTH says there is one) lie within the buffer.
#[derive(Debug, Clone, Copy)]
pub struct RoceFrame<T> {
    buffer: T,
    udp_at: usize,
    bth_at: usize,
    tlm_len: usize,
    ip_at: usize,
    ip_end: usize,
}

impl<T: AsRef<[u8]>> RoceFrame<T> {
    /// Checks the headers of an IPv4/UDP frame to port 4791 with room for a
    /// BTH, its TLM block and an ICRC.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let eth = EthernetFrame::new_checked(buffer.as_ref())?;
        if eth.ethertype() != ethernet::ETHERTYPE_IPV4 {
            return Err(WireError::NotIpv4(eth.ethertype()));
        }
        let ip = Ipv4Packet::new_checked(eth.payload())?;
        if ip.protocol() != ipv4::PROTO_UDP {
            return Err(WireError::NotUdp(ip.protocol()));
        }
        let udp = UdpPacket::new_checked(ip.payload())?;
        if udp.dst_port() != udp::ROCE_PORT {
            return Err(WireError::NotRoce(udp.dst_port()));
        }
        let l4 = udp.payload();
        let bth = Bth::new_checked(l4)?;
        let tlm_len = if bth.has_tlm() {
            Tlm::new_checked(&l4[bth::HEADER_LEN..])?.block_len()
        } else {
            0
        };
        if l4.len() < bth::HEADER_LEN + tlm_len + icrc::ICRC_LEN {
            return Err(WireError::Truncated(Layer::Icrc));
        }
        let ip_at = eth.header_len();
        let udp_at = ip_at + ip.header_len();
        Ok(RoceFrame {
            udp_at,
            bth_at: udp_at + udp::HEADER_LEN,
            tlm_len,
            ip_at,
            ip_end: ip_at + usize::from(ip.total_len()),
            buffer,
        })
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    fn ip(&self) -> Ipv4Packet<&[u8]> {
        Ipv4Packet::new_unchecked(&self.b()[self.ip_at..self.ip_end])
    }

    fn bth(&self) -> Bth<&[u8]> {
        Bth::new_checked(&self.b()[self.bth_at..]).expect("checked in new_checked")
    }

    pub fn src_ip(&self) -> Ipv4Addr {
        self.ip().src()
    }

    pub fn dst_ip(&self) -> Ipv4Addr {
        self.ip().dst()
    }

    /// The IPv4 DSCP (its top three bits are the frame's priority).
    pub fn dscp(&self) -> u8 {
        self.ip().dscp()
    }

    /// The IPv4 ECN bits.
    pub fn ecn(&self) -> u8 {
        self.ip().ecn()
    }

    /// The UDP source port: RoCEv2's ECMP entropy.
    pub fn entropy(&self) -> u16 {
        UdpPacket::new_checked(&self.b()[self.udp_at..self.ip_end]).map_or(0, |u| u.src_port())
    }

    pub fn dest_qp(&self) -> u32 {
        self.bth().dest_qp()
    }

    /// The BTH PSN.
    pub fn psn(&self) -> u32 {
        self.bth().psn()
    }

    /// The BTH opcode byte.
    pub fn opcode_raw(&self) -> u8 {
        self.bth().opcode_raw()
    }

    /// The telemetry stack, when the frame carries one.
    pub fn tlm(&self) -> Option<Tlm<&[u8]>> {
        let at = self.bth_at + bth::HEADER_LEN;
        (self.tlm_len > 0)
            .then(|| Tlm::new_checked(&self.b()[at..at + self.tlm_len]).ok())
            .flatten()
    }

    /// The bytes the ICRC covers: the IPv4 packet, ICRC included.
    pub fn icrc_covered(&self) -> Range<usize> {
        self.ip_at..self.ip_end
    }

    /// Whether the byte at `at` (from the start of the frame) is one that
    /// switches rewrite in flight: TOS (ECN), TTL, the IPv4 checksum, the
    /// UDP checksum, BTH byte 4 (FECN, BECN, T) and the TLM block. The ICRC
    /// masks exactly these.
    pub fn rewritten_in_flight(&self, at: usize) -> bool {
        let tlm_at = self.bth_at + bth::HEADER_LEN;
        matches!(at.wrapping_sub(self.ip_at), 1 | 8 | 10 | 11)
            || (self.udp_at + 6..self.udp_at + 8).contains(&at)
            || at == self.bth_at + 4
            || (tlm_at..tlm_at + self.tlm_len).contains(&at)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> RoceFrame<T> {
    /// The telemetry stack, writable (a switch pushes its hop record).
    pub fn tlm_mut(&mut self) -> Option<Tlm<&mut [u8]>> {
        let at = self.bth_at + bth::HEADER_LEN;
        let len = self.tlm_len;
        (len > 0)
            .then(|| Tlm::new_checked(&mut self.buffer.as_mut()[at..at + len]).ok())
            .flatten()
    }

    /// Marks an ECN-capable frame Congestion Experienced and refreshes the
    /// IPv4 checksum; false (frame unchanged) when it is not ECN-capable.
    pub fn mark_ce(&mut self) -> bool {
        let (start, end) = (self.ip_at, self.ip_end);
        let mut ip = Ipv4Packet::new_unchecked(&mut self.buffer.as_mut()[start..end]);
        if ip.ecn() == 0 {
            return false;
        }
        ip.set_ecn(3);
        ip.fill_checksum();
        true
    }

    /// The whole frame.
    pub fn into_inner(self) -> T {
        self.buffer
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Opcode, Packet, PacketRepr, RethRepr, TlmRepr, VlanTag};

    const TAG: VlanTag = VlanTag {
        pcp: 3,
        dei: false,
        vid: 100,
    };

    fn frame(tlm: bool) -> Vec<u8> {
        frame_on(tlm, None)
    }

    fn frame_on(tlm: bool, vlan: Option<VlanTag>) -> Vec<u8> {
        let mut r = PacketRepr::new(Opcode::RdmaWriteOnly, 0x12, 7);
        r.eth.vlan = vlan;
        r.ip.dst = Ipv4Addr::new(10, 0, 0, 9);
        r.ip.ecn = 2;
        r.udp.src_port = 0xC0DE;
        r.reth = Some(RethRepr {
            va: 0,
            r_key: 1,
            dma_len: 16,
        });
        r.tlm = tlm.then(|| TlmRepr::empty(2));
        let mut b = vec![0u8; r.frame_len(16)];
        r.emit(&[7u8; 16], &mut b).unwrap();
        b
    }

    #[test]
    fn reads_what_a_switch_needs() {
        for (vlan, ip_at) in [(None, 14), (Some(TAG), 18)] {
            let f = frame_on(true, vlan);
            let v = RoceFrame::new_checked(&f[..]).unwrap();
            assert_eq!(v.dst_ip(), Ipv4Addr::new(10, 0, 0, 9));
            assert_eq!(v.entropy(), 0xC0DE);
            assert_eq!(v.dest_qp(), 0x12);
            assert_eq!(v.opcode_raw(), Opcode::RdmaWriteOnly as u8);
            assert_eq!(v.tlm().unwrap().maxhop(), 2);
            assert_eq!(v.icrc_covered(), ip_at..f.len());
        }
    }

    #[test]
    fn bytes_rewritten_in_flight_are_exactly_those_the_icrc_masks() {
        for vlan in [None, Some(TAG)] {
            rewritten_bytes_are_masked(vlan);
        }
    }

    fn rewritten_bytes_are_masked(vlan: Option<VlanTag>) {
        let f = frame_on(true, vlan);
        let v = RoceFrame::new_checked(&f[..]).unwrap();
        let ip_at = v.icrc_covered().start;
        for at in v.icrc_covered() {
            for bit in 0..8 {
                let mut g = f.clone();
                g[at] ^= 1 << bit;
                let icrc_ok = Packet::parse_unverified(&g).is_ok_and(|p| p.icrc_ok());
                let masked = v.rewritten_in_flight(at);
                // An unmasked byte always changes the ICRC. Masked IP and
                // UDP bytes never do (in BTH and TLM some masked bits, T
                // and the hop counts, move where the TLM block ends).
                if masked {
                    let p = Packet::parse_unverified(&g);
                    let layout = at >= ip_at + 20 + 8;
                    assert!(p.is_err() || icrc_ok || layout, "byte {at} bit {bit}");
                } else {
                    assert!(!icrc_ok, "byte {at} bit {bit} went unnoticed");
                }
            }
        }
    }

    #[test]
    fn marks_ce_and_pushes_hops_in_place() {
        let mut f = frame_on(true, Some(TAG));
        let mut v = RoceFrame::new_checked(&mut f[..]).unwrap();
        assert!(v.mark_ce());
        assert!(v.tlm_mut().unwrap().push_hop(&Default::default()));
        let p = Packet::parse(&f).unwrap();
        assert_eq!(p.repr.eth.vlan, Some(TAG));
        assert_eq!(p.repr.ip.ecn, 3);
        assert_eq!(p.repr.tlm.unwrap().nhop, 1);
        let mut g = frame(false);
        g[15] &= !3; // not ECN-capable
        assert!(!RoceFrame::new_checked(&mut g[..]).unwrap().mark_ce());
    }

    #[test]
    fn refuses_what_is_not_roce_without_panicking() {
        let f = frame(false);
        for n in 0..f.len() {
            let _ = RoceFrame::new_checked(&f[..n]);
        }
        let mut g = f.clone();
        g[12] = 0x86;
        assert!(matches!(
            RoceFrame::new_checked(&g[..]),
            Err(WireError::NotIpv4(_))
        ));
        assert!(RoceFrame::new_checked(&f[..f.len() - 1]).is_err());
    }
}
