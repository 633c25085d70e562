//! UDP header: view and the representation a RoCEv2 frame uses
//! (destination port 4791, checksum 0).

use super::bytes::{check_len, get_u16, set_u16};
use super::{Layer, WireError};

/// UDP header length.
pub const HEADER_LEN: usize = 8;
/// The RoCEv2 destination port.
pub const ROCE_PORT: u16 = 4791;

/// Zero-copy view of a UDP datagram; `new_checked` guarantees the length
/// field matches the buffer exactly.
#[derive(Debug, Clone, Copy)]
pub struct UdpPacket<T> {
    buffer: T,
}

impl<T: AsRef<[u8]>> UdpPacket<T> {
    /// `buffer` must be the IP payload: the UDP length must equal its size.
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let b = buffer.as_ref();
        check_len(b, HEADER_LEN, Layer::Udp)?;
        if usize::from(get_u16(b, 4)) != b.len() {
            return Err(WireError::LengthMismatch(Layer::Udp));
        }
        Ok(UdpPacket { buffer })
    }

    pub fn src_port(&self) -> u16 {
        get_u16(self.buffer.as_ref(), 0)
    }

    pub fn dst_port(&self) -> u16 {
        get_u16(self.buffer.as_ref(), 2)
    }

    pub fn len(&self) -> u16 {
        get_u16(self.buffer.as_ref(), 4)
    }

    /// Never true for a checked packet (the header alone is 8 bytes).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn checksum(&self) -> u16 {
        get_u16(self.buffer.as_ref(), 6)
    }

    pub fn header(&self) -> &[u8] {
        &self.buffer.as_ref()[..HEADER_LEN]
    }

    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }
}

/// Source port of a RoCEv2 UDP header (per-QP entropy, see
/// [`entropy_port`]); the destination is always 4791.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct UdpRepr {
    pub src_port: u16,
}

impl UdpRepr {
    /// Refuses datagrams not addressed to the RoCEv2 port. The checksum is
    /// not checked (RoCEv2 senders put 0; the ICRC protects the data).
    #[inline]
    pub fn parse<T: AsRef<[u8]>>(p: &UdpPacket<T>) -> Result<Self, WireError> {
        if p.dst_port() != ROCE_PORT {
            return Err(WireError::NotRoce(p.dst_port()));
        }
        Ok(UdpRepr {
            src_port: p.src_port(),
        })
    }

    /// Writes the header for `payload_len` bytes after it; `buf` holds at
    /// least `HEADER_LEN` bytes.
    pub fn emit(&self, buf: &mut [u8], payload_len: usize) {
        set_u16(buf, 0, self.src_port);
        set_u16(buf, 2, ROCE_PORT);
        set_u16(buf, 4, (HEADER_LEN + payload_len) as u16);
        set_u16(buf, 6, 0);
    }
}

/// The UDP source port of a connection, from the QPN pair as RoCEv2 NICs
/// derive it (Linux's `rdma_get_udp_sport`, used by rxe and mlx5): a
/// 20-bit flow label from the product of the two QPNs, folded to 14 bits
/// in the dynamic range `0xC000..`. All packets of a QP take one ECMP path,
/// both directions of a connection carry the same port, and QPs that reuse
/// a QPN towards another peer get another port.
pub fn entropy_port(local_qpn: u32, remote_qpn: u32) -> u16 {
    let mut v = u64::from(local_qpn) * u64::from(remote_qpn);
    v ^= v >> 20;
    v ^= v >> 40;
    let label = (v & 0xF_FFFF) as u32;
    let low = (label & 0x3FFF) ^ (label >> 14);
    0xC000 | low as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_length_rule() {
        let mut b = [0u8; 20];
        UdpRepr { src_port: 0xc123 }.emit(&mut b, 12);
        let p = UdpPacket::new_checked(&b[..]).unwrap();
        assert_eq!(p.dst_port(), ROCE_PORT);
        assert_eq!(UdpRepr::parse(&p).unwrap().src_port, 0xc123);
        assert_eq!(
            UdpPacket::new_checked(&b[..19]).unwrap_err(),
            WireError::LengthMismatch(Layer::Udp)
        );
        assert_eq!(
            UdpPacket::new_checked(&b[..7]).unwrap_err(),
            WireError::Truncated(Layer::Udp)
        );
    }

    #[test]
    fn other_ports_are_not_roce() {
        let mut b = [0u8; 8];
        UdpRepr { src_port: 1 }.emit(&mut b, 0);
        b[2] = 0;
        b[3] = 53;
        let p = UdpPacket::new_checked(&b[..]).unwrap();
        assert_eq!(UdpRepr::parse(&p), Err(WireError::NotRoce(53)));
    }

    #[test]
    fn entropy_port_is_in_the_dynamic_range_and_stable() {
        for qpn in 0..1000 {
            let p = entropy_port(qpn, 17);
            assert_eq!(p & 0xC000, 0xC000);
            assert_eq!(p, entropy_port(qpn, 17));
            assert_eq!(p, entropy_port(17, qpn), "both ends agree");
        }
        assert_ne!(entropy_port(2, 3), entropy_port(2, 4));
    }

    #[test]
    fn entropy_port_matches_the_kernel_derivation() {
        // Values of rdma_get_udp_sport(rdma_calc_flow_label(l, r), l, r)
        // worked by hand: 0x11 * 0x12 = 0x132 (below 2^14: itself);
        // 0x1234 * 0x5678 = 0x6260060; v ^= v >> 20 gives 0x6260002,
        // label 0x60002, and 0x0002 ^ (0x60002 >> 14 = 0x18) = 0x1a.
        assert_eq!(entropy_port(0x11, 0x12), 0xC000 | 0x132);
        assert_eq!(entropy_port(0x1234, 0x5678), 0xC000 | 0x1a);
    }
}
