//! Ethernet II header (14 bytes, no VLAN tag): view and representation.

use super::bytes::{check_len, get_u16, set_u16};
use super::{Layer, WireError};

/// Ethernet header length.
pub const HEADER_LEN: usize = 14;
/// EtherType of IPv4.
pub const ETHERTYPE_IPV4: u16 = 0x0800;

/// A MAC address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MacAddr(pub [u8; 6]);

impl core::fmt::Display for MacAddr {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

/// Zero-copy view of an Ethernet frame.
#[derive(Debug, Clone, Copy)]
pub struct EthernetFrame<T> {
    buffer: T,
}

impl<T: AsRef<[u8]>> EthernetFrame<T> {
    /// Wraps `buffer` after checking it holds the header.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        check_len(buffer.as_ref(), HEADER_LEN, Layer::Ethernet)?;
        Ok(EthernetFrame { buffer })
    }

    pub fn dst(&self) -> MacAddr {
        let mut a = [0; 6];
        a.copy_from_slice(&self.buffer.as_ref()[0..6]);
        MacAddr(a)
    }

    pub fn src(&self) -> MacAddr {
        let mut a = [0; 6];
        a.copy_from_slice(&self.buffer.as_ref()[6..12]);
        MacAddr(a)
    }

    pub fn ethertype(&self) -> u16 {
        get_u16(self.buffer.as_ref(), 12)
    }

    /// The bytes after the header.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> EthernetFrame<T> {
    pub fn set_dst(&mut self, a: MacAddr) {
        self.buffer.as_mut()[0..6].copy_from_slice(&a.0);
    }

    pub fn set_src(&mut self, a: MacAddr) {
        self.buffer.as_mut()[6..12].copy_from_slice(&a.0);
    }

    pub fn set_ethertype(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), 12, v);
    }

    /// The bytes after the header, writable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[HEADER_LEN..]
    }
}

/// The Ethernet header of a RoCEv2 frame (EtherType is always IPv4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct EthernetRepr {
    pub src: MacAddr,
    pub dst: MacAddr,
}

impl EthernetRepr {
    /// Reads the header; refuses anything but IPv4.
    pub fn parse<T: AsRef<[u8]>>(f: &EthernetFrame<T>) -> Result<Self, WireError> {
        if f.ethertype() != ETHERTYPE_IPV4 {
            return Err(WireError::NotIpv4(f.ethertype()));
        }
        Ok(EthernetRepr {
            src: f.src(),
            dst: f.dst(),
        })
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, f: &mut EthernetFrame<T>) {
        f.set_dst(self.dst);
        f.set_src(self.src);
        f.set_ethertype(ETHERTYPE_IPV4);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let r = EthernetRepr {
            src: MacAddr([2, 0, 0, 0, 0, 1]),
            dst: MacAddr([2, 0, 0, 0, 0, 2]),
        };
        let mut b = [0u8; 14];
        r.emit(&mut EthernetFrame::new_checked(&mut b[..]).unwrap());
        assert_eq!(b, [2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00]);
        let f = EthernetFrame::new_checked(&b[..]).unwrap();
        assert_eq!(EthernetRepr::parse(&f).unwrap(), r);
    }

    #[test]
    fn refuses_short_and_non_ip() {
        assert_eq!(
            EthernetFrame::new_checked(&[0u8; 13][..]).unwrap_err(),
            WireError::Truncated(Layer::Ethernet)
        );
        let mut b = [0u8; 14];
        b[12] = 0x86;
        b[13] = 0xdd;
        let f = EthernetFrame::new_checked(&b[..]).unwrap();
        assert_eq!(EthernetRepr::parse(&f), Err(WireError::NotIpv4(0x86dd)));
    }

    #[test]
    fn mac_display() {
        assert_eq!(
            MacAddr([0xe4, 0x1d, 0x2d, 0xab, 0x2b, 0xc2]).to_string(),
            "e4:1d:2d:ab:2b:c2"
        );
    }
}
