//! Ethernet II header, untagged (14 bytes) or with one 802.1Q VLAN tag (18
//! bytes): view and representation. The view's EtherType and payload are
//! those after the tag, so every layer above reads a tagged frame as it
//! reads an untagged one; which VLAN a device accepts is [`check_vlan`].

use super::bytes::{check_len, get_u16, set_u16};
use super::{Layer, WireError};

/// Untagged Ethernet header length.
pub const HEADER_LEN: usize = 14;
/// Length of one 802.1Q tag (TPID and TCI).
pub const VLAN_TAG_LEN: usize = 4;
/// EtherType of IPv4.
pub const ETHERTYPE_IPV4: u16 = 0x0800;
/// TPID of an 802.1Q (C-)tag, where an untagged frame has its EtherType.
pub const TPID_8021Q: u16 = 0x8100;

/// A MAC address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// Its modified EUI-64 (a RoCE device's node GUID and the interface
    /// ID of its link-local GID, as rxe derives them), network order.
    pub fn eui64(&self) -> [u8; 8] {
        let m = self.0;
        [m[0] ^ 2, m[1], m[2], 0xff, 0xfe, m[3], m[4], m[5]]
    }
}

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

/// A MAC address that is not six `:`-separated hex bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a MAC address (aa:bb:cc:dd:ee:ff)")]
pub struct BadMac(pub String);

impl core::str::FromStr for MacAddr {
    type Err = BadMac;

    /// `aa:bb:cc:dd:ee:ff`.
    fn from_str(v: &str) -> Result<MacAddr, BadMac> {
        let bad = || BadMac(v.to_string());
        let mut m = [0u8; 6];
        let mut parts = v.split(':');
        for b in m.iter_mut() {
            let p = parts
                .next()
                .filter(|p| (1..=2).contains(&p.len()))
                .ok_or_else(bad)?;
            *b = u8::from_str_radix(p, 16).map_err(|_| bad())?;
        }
        match parts.next() {
            Some(_) => Err(bad()),
            None => Ok(MacAddr(m)),
        }
    }
}

/// The TCI of an 802.1Q tag: priority code point (0..7), drop eligible
/// indicator and VLAN id (0..4095; 0 = priority-tagged, no VLAN).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct VlanTag {
    pub pcp: u8,
    pub dei: bool,
    pub vid: u16,
}

impl VlanTag {
    /// The 16-bit TCI as on the wire (out-of-range fields are masked).
    pub fn tci(&self) -> u16 {
        (u16::from(self.pcp & 7) << 13) | (u16::from(self.dei) << 12) | (self.vid & 0x0fff)
    }

    pub fn from_tci(tci: u16) -> VlanTag {
        VlanTag {
            pcp: (tci >> 13) as u8,
            dei: tci & 0x1000 != 0,
            vid: tci & 0x0fff,
        }
    }
}

/// Whether a frame belongs to a device on VLAN `want` (`None`: untagged).
/// VLAN id 0 (a priority-only tag) counts as untagged, on the frame and in
/// `want`. Reads only the TPID and TCI; a frame too short to tell is left
/// to the parser.
pub fn check_vlan(frame: &[u8], want: Option<u16>) -> Result<(), WireError> {
    let want = want.filter(|&v| v != 0);
    let found = match EthernetFrame::new_checked(frame) {
        Ok(f) => f.vlan().map(|t| t.vid).filter(|&v| v != 0),
        Err(_) => return Ok(()),
    };
    if found == want {
        Ok(())
    } else {
        Err(WireError::WrongVlan(found.unwrap_or(0)))
    }
}

/// Zero-copy view of an Ethernet frame.
#[derive(Debug, Clone, Copy)]
pub struct EthernetFrame<T> {
    buffer: T,
}

impl<T: AsRef<[u8]>> EthernetFrame<T> {
    /// Wraps `buffer` after checking it holds the header (and the tag, when
    /// the frame has one).
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let b = buffer.as_ref();
        check_len(b, HEADER_LEN, Layer::Ethernet)?;
        if get_u16(b, 12) == TPID_8021Q {
            check_len(b, HEADER_LEN + VLAN_TAG_LEN, Layer::Ethernet)?;
        }
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

    /// The frame's 802.1Q tag, if it has one.
    #[inline]
    pub fn vlan(&self) -> Option<VlanTag> {
        let b = self.buffer.as_ref();
        (get_u16(b, 12) == TPID_8021Q).then(|| VlanTag::from_tci(get_u16(b, 14)))
    }

    /// 14, or 18 with a tag.
    pub fn header_len(&self) -> usize {
        HEADER_LEN + self.vlan().map_or(0, |_| VLAN_TAG_LEN)
    }

    /// The EtherType of the payload (after the tag, when there is one).
    pub fn ethertype(&self) -> u16 {
        get_u16(self.buffer.as_ref(), self.header_len() - 2)
    }

    /// The bytes after the header.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> EthernetFrame<T> {
    pub fn set_dst(&mut self, a: MacAddr) {
        self.buffer.as_mut()[0..6].copy_from_slice(&a.0);
    }

    pub fn set_src(&mut self, a: MacAddr) {
        self.buffer.as_mut()[6..12].copy_from_slice(&a.0);
    }

    /// Writes the tag (or not) and the EtherType after it; the caller has
    /// checked that the buffer holds a header of that length.
    fn set_vlan_and_ethertype(&mut self, vlan: Option<VlanTag>, ethertype: u16) {
        let b = self.buffer.as_mut();
        match vlan {
            Some(t) => {
                set_u16(b, 12, TPID_8021Q);
                set_u16(b, 14, t.tci());
                set_u16(b, 16, ethertype);
            }
            None => set_u16(b, 12, ethertype),
        }
    }

    /// The bytes after the header, writable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let at = self.header_len();
        &mut self.buffer.as_mut()[at..]
    }
}

/// Writes an Ethernet header (with the tag when `vlan` is set) at the start
/// of `buf`; returns its length. Refuses a buffer shorter than the header.
pub fn emit_header(
    buf: &mut [u8],
    dst: MacAddr,
    src: MacAddr,
    vlan: Option<VlanTag>,
    ethertype: u16,
) -> Result<usize, WireError> {
    let len = HEADER_LEN + vlan.map_or(0, |_| VLAN_TAG_LEN);
    if buf.len() < len {
        return Err(WireError::BufferTooSmall {
            need: len,
            have: buf.len(),
        });
    }
    let mut f = EthernetFrame { buffer: buf };
    f.set_dst(dst);
    f.set_src(src);
    f.set_vlan_and_ethertype(vlan, ethertype);
    Ok(len)
}

/// The Ethernet header of a RoCEv2 frame (EtherType is always IPv4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct EthernetRepr {
    pub src: MacAddr,
    pub dst: MacAddr,
    /// The 802.1Q tag, exactly as on the wire (VLAN id 0 included).
    pub vlan: Option<VlanTag>,
}

impl EthernetRepr {
    /// Reads the header; refuses anything but IPv4.
    #[inline]
    pub fn parse<T: AsRef<[u8]>>(f: &EthernetFrame<T>) -> Result<Self, WireError> {
        if f.ethertype() != ETHERTYPE_IPV4 {
            return Err(WireError::NotIpv4(f.ethertype()));
        }
        Ok(EthernetRepr {
            src: f.src(),
            dst: f.dst(),
            vlan: f.vlan(),
        })
    }

    /// 14, or 18 with a tag.
    pub fn header_len(&self) -> usize {
        HEADER_LEN + self.vlan.map_or(0, |_| VLAN_TAG_LEN)
    }

    /// Writes the header at the start of `buf`; returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        emit_header(buf, self.dst, self.src, self.vlan, ETHERTYPE_IPV4)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mac_parses_from_its_text_and_prints_back() {
        let m: MacAddr = "02:77:00:0a:ff:3".parse().unwrap();
        assert_eq!(m, MacAddr([2, 0x77, 0, 0x0a, 0xff, 3]));
        assert_eq!(m.to_string(), "02:77:00:0a:ff:03");
        for bad in [
            "",
            "02:77:00:0a:ff",
            "02:77:00:0a:ff:03:04",
            "02:77:00:0a:ff:x3",
            "002:77:00:0a:ff:03",
        ] {
            assert_eq!(bad.parse::<MacAddr>(), Err(BadMac(bad.into())), "{bad}");
        }
    }

    fn repr(vlan: Option<VlanTag>) -> EthernetRepr {
        EthernetRepr {
            src: MacAddr([2, 0, 0, 0, 0, 1]),
            dst: MacAddr([2, 0, 0, 0, 0, 2]),
            vlan,
        }
    }

    #[test]
    fn round_trip() {
        let r = repr(None);
        let mut b = [0u8; 14];
        assert_eq!(r.emit(&mut b), Ok(14));
        assert_eq!(b, [2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00]);
        let f = EthernetFrame::new_checked(&b[..]).unwrap();
        assert_eq!(EthernetRepr::parse(&f).unwrap(), r);
    }

    #[test]
    fn a_tagged_header_round_trips_with_its_tci_and_inner_ethertype() {
        let tag = VlanTag {
            pcp: 3,
            dei: true,
            vid: 100,
        };
        let r = repr(Some(tag));
        let mut b = [0u8; 18];
        assert_eq!(r.emit(&mut b), Ok(18));
        assert_eq!(&b[12..], &[0x81, 0x00, 0x70, 0x64, 0x08, 0x00]);
        let f = EthernetFrame::new_checked(&b[..]).unwrap();
        assert_eq!(f.header_len(), 18);
        assert_eq!(f.ethertype(), ETHERTYPE_IPV4);
        assert_eq!(f.vlan(), Some(tag));
        assert_eq!(EthernetRepr::parse(&f).unwrap(), r);
        assert_eq!(r.header_len(), 18);
        assert_eq!(VlanTag::from_tci(tag.tci()), tag);
        assert_eq!(
            r.emit(&mut [0u8; 17]),
            Err(WireError::BufferTooSmall { need: 18, have: 17 })
        );
    }

    #[test]
    fn refuses_short_and_non_ip() {
        assert_eq!(
            EthernetFrame::new_checked(&[0u8; 13][..]).unwrap_err(),
            WireError::Truncated(Layer::Ethernet)
        );
        let mut b = [0u8; 18];
        b[12] = 0x86;
        b[13] = 0xdd;
        let f = EthernetFrame::new_checked(&b[..14]).unwrap();
        assert_eq!(EthernetRepr::parse(&f), Err(WireError::NotIpv4(0x86dd)));
        // A tag cut short, and a tagged frame whose inner type is not IPv4.
        b[12..18].copy_from_slice(&[0x81, 0x00, 0x00, 0x64, 0x86, 0xdd]);
        assert_eq!(
            EthernetFrame::new_checked(&b[..17]).unwrap_err(),
            WireError::Truncated(Layer::Ethernet)
        );
        let f = EthernetFrame::new_checked(&b[..]).unwrap();
        assert_eq!(EthernetRepr::parse(&f), Err(WireError::NotIpv4(0x86dd)));
    }

    #[test]
    fn a_device_takes_only_frames_of_its_own_vlan() {
        let mut untagged = [0u8; 14];
        repr(None).emit(&mut untagged).unwrap();
        let tagged = |vid| {
            let mut b = [0u8; 18];
            repr(Some(VlanTag {
                pcp: 5,
                dei: false,
                vid,
            }))
            .emit(&mut b)
            .unwrap();
            b
        };
        assert_eq!(check_vlan(&untagged, None), Ok(()));
        assert_eq!(check_vlan(&tagged(100), Some(100)), Ok(()));
        // VLAN id 0 carries a priority only: it is untagged traffic.
        assert_eq!(check_vlan(&tagged(0), None), Ok(()));
        assert_eq!(
            check_vlan(&tagged(0), Some(100)),
            Err(WireError::WrongVlan(0))
        );
        assert_eq!(check_vlan(&untagged, Some(0)), Ok(()));
        assert_eq!(
            check_vlan(&untagged, Some(100)),
            Err(WireError::WrongVlan(0))
        );
        assert_eq!(
            check_vlan(&tagged(200), Some(100)),
            Err(WireError::WrongVlan(200))
        );
        assert_eq!(
            check_vlan(&tagged(100), None),
            Err(WireError::WrongVlan(100))
        );
        // Too short to tell: the parser names what is wrong with it.
        assert_eq!(check_vlan(&[0u8; 3], Some(100)), Ok(()));
    }

    #[test]
    fn mac_display() {
        assert_eq!(
            MacAddr([0xe4, 0x1d, 0x2d, 0xab, 0x2b, 0xc2]).to_string(),
            "e4:1d:2d:ab:2b:c2"
        );
    }
}
