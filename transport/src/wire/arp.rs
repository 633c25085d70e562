//! ARP for IPv4 over Ethernet (RFC 826): the 28-byte message after an
//! Ethernet header of EtherType 0x0806, as a representation with `parse`
//! and `emit`. A NIC answers requests for its own address and learns its
//! peers' MACs from what it hears (the neighbour table lives with the
//! pipeline, `nic::neighbour`).

use core::net::Ipv4Addr;

use super::bytes::{check_len, get_u16, set_u16};
use super::ethernet::{self, EthernetFrame, VlanTag, VLAN_TAG_LEN};
use super::{Layer, MacAddr, WireError};

/// EtherType of ARP.
pub const ETHERTYPE_ARP: u16 = 0x0806;
/// ARP message length for IPv4 over Ethernet.
pub const MESSAGE_LEN: usize = 28;
/// Shortest Ethernet frame without FCS: ARP frames are padded to it.
pub const MIN_FRAME_LEN: usize = 60;
/// An ARP frame with an 802.1Q tag: the minimum plus the tag, as a bridge
/// that adds a tag to a minimum frame makes it.
pub const MIN_TAGGED_FRAME_LEN: usize = MIN_FRAME_LEN + VLAN_TAG_LEN;

const HTYPE_ETHERNET: u16 = 1;
const PTYPE_IPV4: u16 = 0x0800;

/// Request or reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ArpOp {
    Request,
    Reply,
}

/// An ARP message for IPv4 over Ethernet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ArpRepr {
    pub op: ArpOp,
    pub sender_mac: MacAddr,
    pub sender_ip: Ipv4Addr,
    pub target_mac: MacAddr,
    pub target_ip: Ipv4Addr,
}

/// Whether a whole Ethernet frame carries ARP.
pub fn is_arp(frame: &[u8]) -> bool {
    EthernetFrame::new_checked(frame).is_ok_and(|f| f.ethertype() == ETHERTYPE_ARP)
}

impl ArpRepr {
    /// The ARP message of a whole Ethernet frame.
    pub fn parse(frame: &[u8]) -> Result<ArpRepr, WireError> {
        let eth = EthernetFrame::new_checked(frame)?;
        if eth.ethertype() != ETHERTYPE_ARP {
            return Err(WireError::NotArp(eth.ethertype()));
        }
        let b = eth.payload();
        check_len(b, MESSAGE_LEN, Layer::Arp)?;
        let op = match get_u16(b, 6) {
            1 => ArpOp::Request,
            2 => ArpOp::Reply,
            _ => return Err(WireError::UnsupportedArp),
        };
        if get_u16(b, 0) != HTYPE_ETHERNET || get_u16(b, 2) != PTYPE_IPV4 || b[4] != 6 || b[5] != 4
        {
            return Err(WireError::UnsupportedArp);
        }
        let mac = |at: usize| {
            let mut m = [0; 6];
            m.copy_from_slice(&b[at..at + 6]);
            MacAddr(m)
        };
        let ip = |at: usize| Ipv4Addr::new(b[at], b[at + 1], b[at + 2], b[at + 3]);
        Ok(ArpRepr {
            op,
            sender_mac: mac(8),
            sender_ip: ip(14),
            target_mac: mac(18),
            target_ip: ip(24),
        })
    }

    /// A request from `mac`/`ip` for `target`, broadcast.
    pub fn request(mac: MacAddr, ip: Ipv4Addr, target: Ipv4Addr) -> ArpRepr {
        ArpRepr {
            op: ArpOp::Request,
            sender_mac: mac,
            sender_ip: ip,
            target_mac: MacAddr::default(),
            target_ip: target,
        }
    }

    /// The reply to this request from the owner of its target address.
    pub fn reply_from(&self, mac: MacAddr) -> ArpRepr {
        ArpRepr {
            op: ArpOp::Reply,
            sender_mac: mac,
            sender_ip: self.target_ip,
            target_mac: self.sender_mac,
            target_ip: self.sender_ip,
        }
    }

    /// Writes the whole untagged frame (Ethernet header, message, zero
    /// padding to [`MIN_FRAME_LEN`]) into `buf`: a request is broadcast, a
    /// reply goes to its target. Returns the frame's length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        self.emit_tagged(None, buf)
    }

    /// [`emit`](Self::emit), with an 802.1Q tag when `vlan` is set (then
    /// padded to [`MIN_TAGGED_FRAME_LEN`]).
    pub fn emit_tagged(&self, vlan: Option<VlanTag>, buf: &mut [u8]) -> Result<usize, WireError> {
        let len = MIN_FRAME_LEN + vlan.map_or(0, |_| VLAN_TAG_LEN);
        if buf.len() < len {
            return Err(WireError::BufferTooSmall {
                need: len,
                have: buf.len(),
            });
        }
        let f = &mut buf[..len];
        f.fill(0);
        let dst = match self.op {
            ArpOp::Request => MacAddr([0xff; 6]),
            ArpOp::Reply => self.target_mac,
        };
        let at = ethernet::emit_header(f, dst, self.sender_mac, vlan, ETHERTYPE_ARP)?;
        let b = &mut f[at..at + MESSAGE_LEN];
        set_u16(b, 0, HTYPE_ETHERNET);
        set_u16(b, 2, PTYPE_IPV4);
        b[4] = 6;
        b[5] = 4;
        set_u16(
            b,
            6,
            match self.op {
                ArpOp::Request => 1,
                ArpOp::Reply => 2,
            },
        );
        b[8..14].copy_from_slice(&self.sender_mac.0);
        b[14..18].copy_from_slice(&self.sender_ip.octets());
        b[18..24].copy_from_slice(&self.target_mac.0);
        b[24..28].copy_from_slice(&self.target_ip.octets());
        Ok(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);
    const B: MacAddr = MacAddr([0x52, 0x54, 0, 0x77, 0, 2]);

    #[test]
    fn a_request_and_its_reply_round_trip_and_are_padded_to_60_bytes() {
        let req = ArpRepr::request(A, Ipv4Addr::new(10, 77, 0, 1), Ipv4Addr::new(10, 77, 0, 2));
        let mut buf = [0xaa; 80];
        assert_eq!(req.emit(&mut buf), Ok(60));
        assert_eq!(&buf[0..6], &[0xff; 6], "broadcast");
        assert!(is_arp(&buf[..60]));
        assert!(buf[42..60].iter().all(|&b| b == 0), "zero padding");
        assert_eq!(ArpRepr::parse(&buf[..60]), Ok(req));
        let rep = req.reply_from(B);
        assert_eq!(rep.emit(&mut buf), Ok(60));
        assert_eq!(&buf[0..6], &A.0, "a reply goes to the asker");
        let back = ArpRepr::parse(&buf[..42]).unwrap();
        assert_eq!(back, rep);
        assert_eq!(
            (back.sender_mac, back.sender_ip),
            (B, Ipv4Addr::new(10, 77, 0, 2))
        );
    }

    #[test]
    fn a_tagged_request_carries_its_tag_and_is_padded_to_64_bytes() {
        let tag = VlanTag {
            pcp: 3,
            dei: false,
            vid: 100,
        };
        let req = ArpRepr::request(A, Ipv4Addr::new(10, 77, 0, 1), Ipv4Addr::new(10, 77, 0, 2));
        let mut buf = [0xaa; 80];
        assert_eq!(req.emit_tagged(Some(tag), &mut buf), Ok(64));
        assert_eq!(&buf[12..18], &[0x81, 0x00, 0x60, 0x64, 0x08, 0x06]);
        assert!(buf[46..64].iter().all(|&b| b == 0), "zero padding");
        assert!(is_arp(&buf[..64]));
        assert_eq!(
            EthernetFrame::new_checked(&buf[..]).unwrap().vlan(),
            Some(tag)
        );
        assert_eq!(ArpRepr::parse(&buf[..64]), Ok(req));
        assert!(req.emit_tagged(Some(tag), &mut [0; 63]).is_err());
    }

    #[test]
    fn other_frames_and_other_arp_are_refused_by_name() {
        let req = ArpRepr::request(A, Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
        let mut buf = [0; 60];
        req.emit(&mut buf).unwrap();
        for n in 0..42 {
            assert!(ArpRepr::parse(&buf[..n]).is_err(), "truncated at {n}");
        }
        let mut ipv6 = buf;
        ipv6[16..18].copy_from_slice(&0x86ddu16.to_be_bytes());
        assert_eq!(ArpRepr::parse(&ipv6), Err(WireError::UnsupportedArp));
        let mut op3 = buf;
        op3[21] = 3;
        assert_eq!(ArpRepr::parse(&op3), Err(WireError::UnsupportedArp));
        let mut ip = buf;
        ip[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        assert_eq!(ArpRepr::parse(&ip), Err(WireError::NotArp(0x0800)));
        assert!(req.emit(&mut [0; 59]).is_err());
    }
}
