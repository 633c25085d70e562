//! IPv4 header: view (with options, checksum) and the representation a
//! RoCEv2 frame uses (UDP, no options).

use core::net::Ipv4Addr;

use super::bytes::{check_len, get_u16, set_u16};
use super::{Layer, WireError};

/// Length of a header without options.
pub const HEADER_LEN: usize = 20;
/// IP protocol number of UDP.
pub const PROTO_UDP: u8 = 17;

/// Zero-copy view of an IPv4 packet.
///
/// `new_checked` guarantees the whole header (including options) and the
/// total length lie within the buffer, so no accessor can panic.
#[derive(Debug, Clone, Copy)]
pub struct Ipv4Packet<T> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ipv4Packet<T> {
    /// Checks version, header length and total length against the buffer.
    /// The buffer may be longer than the packet (Ethernet padding).
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let b = buffer.as_ref();
        check_len(b, HEADER_LEN, Layer::Ipv4)?;
        let p = Ipv4Packet { buffer };
        if p.version() != 4 {
            return Err(WireError::BadIpVersion(p.version()));
        }
        if p.ihl() < 5 {
            return Err(WireError::BadIpHeaderLen(p.ihl()));
        }
        let b = p.buffer.as_ref();
        check_len(b, p.header_len(), Layer::Ipv4)?;
        let total = usize::from(p.total_len());
        if total < p.header_len() || total > b.len() {
            return Err(WireError::LengthMismatch(Layer::Ipv4));
        }
        Ok(p)
    }

    /// Wraps a buffer without checks; only for emitting into a buffer known
    /// to hold at least `HEADER_LEN` bytes.
    pub fn new_unchecked(buffer: T) -> Self {
        Ipv4Packet { buffer }
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    pub fn version(&self) -> u8 {
        self.b()[0] >> 4
    }

    /// Header length in 32-bit words.
    pub fn ihl(&self) -> u8 {
        self.b()[0] & 0x0f
    }

    pub fn header_len(&self) -> usize {
        usize::from(self.ihl()) * 4
    }

    pub fn dscp(&self) -> u8 {
        self.b()[1] >> 2
    }

    pub fn ecn(&self) -> u8 {
        self.b()[1] & 3
    }

    pub fn total_len(&self) -> u16 {
        get_u16(self.b(), 2)
    }

    pub fn ident(&self) -> u16 {
        get_u16(self.b(), 4)
    }

    pub fn dont_frag(&self) -> bool {
        self.b()[6] & 0x40 != 0
    }

    pub fn more_frags(&self) -> bool {
        self.b()[6] & 0x20 != 0
    }

    pub fn frag_offset(&self) -> u16 {
        get_u16(self.b(), 6) & 0x1fff
    }

    pub fn ttl(&self) -> u8 {
        self.b()[8]
    }

    pub fn protocol(&self) -> u8 {
        self.b()[9]
    }

    pub fn checksum(&self) -> u16 {
        get_u16(self.b(), 10)
    }

    pub fn src(&self) -> Ipv4Addr {
        let b = self.b();
        Ipv4Addr::new(b[12], b[13], b[14], b[15])
    }

    pub fn dst(&self) -> Ipv4Addr {
        let b = self.b();
        Ipv4Addr::new(b[16], b[17], b[18], b[19])
    }

    /// Does the header checksum verify?
    #[inline]
    pub fn verify_checksum(&self) -> bool {
        checksum(&self.b()[..self.header_len()]) == 0
    }

    /// The header bytes, options included.
    pub fn header(&self) -> &[u8] {
        &self.b()[..self.header_len()]
    }

    /// The bytes between the header and the total length.
    pub fn payload(&self) -> &[u8] {
        &self.b()[self.header_len()..usize::from(self.total_len())]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv4Packet<T> {
    fn bm(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }

    /// Sets the ECN bits, as a switch does when it marks CE. The caller
    /// refreshes the checksum with [`Ipv4Packet::fill_checksum`].
    pub fn set_ecn(&mut self, ecn: u8) {
        let b = self.bm();
        b[1] = (b[1] & !3) | (ecn & 3);
    }

    /// The bytes between the header and the total length, writable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let (hl, total) = (self.header_len(), usize::from(self.total_len()));
        &mut self.bm()[hl..total]
    }

    /// Recomputes the header checksum.
    pub fn fill_checksum(&mut self) {
        let hl = usize::from(self.bm()[0] & 0x0f) * 4;
        set_u16(self.bm(), 10, 0);
        let c = checksum(&self.bm()[..hl]);
        set_u16(self.bm(), 10, c);
    }
}

/// The Internet checksum (one's complement of the one's complement sum).
/// Over a header that carries a correct checksum it returns 0.
pub fn checksum(data: &[u8]) -> u16 {
    // Summed four bytes at a time and folded (RFC 1071: 2^16 is 1 modulo
    // 2^16 - 1, so the 32-bit words' sum folds to the 16-bit words' sum).
    let mut sum: u64 = 0;
    let mut words = data.chunks_exact(4);
    for w in &mut words {
        sum += u64::from(u32::from_be_bytes([w[0], w[1], w[2], w[3]]));
    }
    let mut halves = words.remainder().chunks_exact(2);
    for c in &mut halves {
        sum += u64::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = halves.remainder() {
        sum += u64::from(*last) << 8;
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// The IPv4 header of a RoCEv2 frame: protocol UDP, no options.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv4Repr {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    /// Differentiated services code point (6 bits).
    pub dscp: u8,
    /// ECN (2 bits): 0 not ECT, 1/2 ECT, 3 CE.
    pub ecn: u8,
    pub ident: u16,
    pub ttl: u8,
    pub dont_frag: bool,
}

impl Default for Ipv4Repr {
    fn default() -> Self {
        Ipv4Repr {
            src: Ipv4Addr::UNSPECIFIED,
            dst: Ipv4Addr::UNSPECIFIED,
            dscp: 0,
            ecn: 0,
            ident: 0,
            ttl: 64,
            dont_frag: true,
        }
    }
}

impl Ipv4Repr {
    /// Reads a checked header: refuses bad checksums, fragments and anything
    /// but UDP.
    #[inline]
    pub fn parse<T: AsRef<[u8]>>(p: &Ipv4Packet<T>) -> Result<Self, WireError> {
        if !p.verify_checksum() {
            return Err(WireError::BadIpChecksum);
        }
        // The fixed 20 bytes as one array (`new_checked` saw them), so
        // that no field pays a bounds check.
        let Some(b) = p.b().first_chunk::<HEADER_LEN>() else {
            return Err(WireError::Truncated(Layer::Ipv4));
        };
        Self::from_fixed(b)
    }

    /// The fields of a 20-byte header whose checksum verified: refuses
    /// fragments and anything but UDP.
    #[inline(always)]
    pub fn from_fixed(b: &[u8; HEADER_LEN]) -> Result<Self, WireError> {
        let flags_frag = u16::from_be_bytes([b[6], b[7]]);
        if flags_frag & 0x3fff != 0 {
            return Err(WireError::IpFragment);
        }
        if b[9] != PROTO_UDP {
            return Err(WireError::NotUdp(b[9]));
        }
        Ok(Ipv4Repr {
            src: Ipv4Addr::new(b[12], b[13], b[14], b[15]),
            dst: Ipv4Addr::new(b[16], b[17], b[18], b[19]),
            dscp: b[1] >> 2,
            ecn: b[1] & 3,
            ident: u16::from_be_bytes([b[4], b[5]]),
            ttl: b[8],
            dont_frag: flags_frag & 0x4000 != 0,
        })
    }

    /// Writes a 20-byte header for a UDP payload of `payload_len` bytes,
    /// checksum included. `buf` must hold at least `HEADER_LEN` bytes.
    pub fn emit(&self, buf: &mut [u8], payload_len: usize) {
        let total = (HEADER_LEN + payload_len) as u16;
        buf[0] = 0x45;
        buf[1] = (self.dscp << 2) | (self.ecn & 3);
        set_u16(buf, 2, total);
        set_u16(buf, 4, self.ident);
        set_u16(buf, 6, if self.dont_frag { 0x4000 } else { 0 });
        buf[8] = self.ttl;
        buf[9] = PROTO_UDP;
        buf[12..16].copy_from_slice(&self.src.octets());
        buf[16..20].copy_from_slice(&self.dst.octets());
        Ipv4Packet::new_unchecked(&mut buf[..HEADER_LEN]).fill_checksum();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // IPv4 header of the ConnectX-4 Lx CNP in wire.md.
    const CNP_IP: [u8; 20] = [
        0x45, 0xc2, 0x00, 0x3c, 0x71, 0x8c, 0x40, 0x00, 0x40, 0x11, 0x91, 0x61, 0x0a, 0x00, 0x11,
        0x01, 0x0a, 0x00, 0x12, 0x01,
    ];

    #[test]
    fn parses_captured_header_and_verifies_checksum() {
        let mut b = CNP_IP.to_vec();
        b.resize(0x3c, 0);
        let p = Ipv4Packet::new_checked(&b[..]).unwrap();
        let r = Ipv4Repr::parse(&p).unwrap();
        assert_eq!(r.src, Ipv4Addr::new(10, 0, 17, 1));
        assert_eq!(r.dst, Ipv4Addr::new(10, 0, 18, 1));
        assert_eq!((r.dscp, r.ecn, r.ttl, r.dont_frag), (0x30, 2, 64, true));
        assert_eq!(r.ident, 0x718c);
    }

    #[test]
    fn emit_reproduces_captured_header() {
        let r = Ipv4Repr {
            src: Ipv4Addr::new(10, 0, 17, 1),
            dst: Ipv4Addr::new(10, 0, 18, 1),
            dscp: 0x30,
            ecn: 2,
            ident: 0x718c,
            ttl: 64,
            dont_frag: true,
        };
        let mut b = [0u8; 20];
        r.emit(&mut b, 0x3c - 20);
        assert_eq!(b, CNP_IP);
    }

    #[test]
    fn refuses_bad_checksum_fragments_and_lengths() {
        let mut b = CNP_IP.to_vec();
        b.resize(0x3c, 0);
        b[10] ^= 1;
        let p = Ipv4Packet::new_checked(&b[..]).unwrap();
        assert_eq!(Ipv4Repr::parse(&p), Err(WireError::BadIpChecksum));
        b[10] ^= 1;
        b[6] = 0x20;
        Ipv4Packet::new_checked(&mut b[..]).unwrap().fill_checksum();
        let p = Ipv4Packet::new_checked(&b[..]).unwrap();
        assert_eq!(Ipv4Repr::parse(&p), Err(WireError::IpFragment));
        assert_eq!(
            Ipv4Packet::new_checked(&b[..0x3b]).unwrap_err(),
            WireError::LengthMismatch(Layer::Ipv4)
        );
        b[0] = 0x65;
        assert_eq!(
            Ipv4Packet::new_checked(&b[..]).unwrap_err(),
            WireError::BadIpVersion(6)
        );
        b[0] = 0x44;
        assert_eq!(
            Ipv4Packet::new_checked(&b[..]).unwrap_err(),
            WireError::BadIpHeaderLen(4)
        );
        b[0] = 0x4f;
        assert_eq!(
            Ipv4Packet::new_checked(&b[..40]).unwrap_err(),
            WireError::Truncated(Layer::Ipv4)
        );
    }

    #[test]
    fn ecn_marking_keeps_checksum_valid() {
        let mut b = CNP_IP.to_vec();
        b.resize(0x3c, 0);
        let mut p = Ipv4Packet::new_checked(&mut b[..]).unwrap();
        p.set_ecn(3);
        p.fill_checksum();
        assert!(p.verify_checksum());
        assert_eq!(p.ecn(), 3);
        assert_eq!(p.dscp(), 0x30);
    }
}
