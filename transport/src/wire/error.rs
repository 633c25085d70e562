//! Why a frame could not be parsed or emitted.
//!
//! [`WireError`] is small and `Copy` so that the data path can return it by
//! value; [`WireError::kind`] maps it to a fieldless [`ErrorKind`] that indexes
//! drop counters.

use super::Opcode;

/// The header (or part of a frame) an error refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layer {
    Ethernet,
    Ipv4,
    Udp,
    Bth,
    Tlm,
    Reth,
    Deth,
    Aeth,
    ImmDt,
    Ieth,
    AtomicEth,
    AtomicAckEth,
    Probe,
    Notify,
    Cnp,
    Payload,
    Icrc,
    Arp,
    Pfc,
    /// A management datagram's header.
    Mad,
}

impl Layer {
    /// Lower-case name as used in messages.
    pub const fn name(self) -> &'static str {
        match self {
            Layer::Ethernet => "ethernet",
            Layer::Ipv4 => "ipv4",
            Layer::Udp => "udp",
            Layer::Bth => "bth",
            Layer::Tlm => "tlm",
            Layer::Reth => "reth",
            Layer::Deth => "deth",
            Layer::Aeth => "aeth",
            Layer::ImmDt => "immdt",
            Layer::Ieth => "ieth",
            Layer::AtomicEth => "atomic_eth",
            Layer::AtomicAckEth => "atomic_ack_eth",
            Layer::Probe => "probe",
            Layer::Notify => "notify",
            Layer::Cnp => "cnp",
            Layer::Payload => "payload",
            Layer::Icrc => "icrc",
            Layer::Arp => "arp",
            Layer::Pfc => "pfc",
            Layer::Mad => "mad",
        }
    }
}

impl core::fmt::Display for Layer {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// A frame the codec refuses, with the reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum WireError {
    /// The buffer ends inside this header.
    #[error("truncated {0} header")]
    Truncated(Layer),
    /// The Ethernet frame does not carry IPv4.
    #[error("not IPv4: ethertype {0:#06x}")]
    NotIpv4(u16),
    /// The IP version nibble is not 4.
    #[error("bad IP version {0}")]
    BadIpVersion(u8),
    /// IHL below 5 words.
    #[error("bad IPv4 header length {0} words")]
    BadIpHeaderLen(u8),
    /// The IPv4 header checksum does not verify.
    #[error("bad IPv4 header checksum")]
    BadIpChecksum,
    /// The datagram is a fragment (MF set or offset non-zero).
    #[error("IPv4 fragment")]
    IpFragment,
    /// The IP payload is not UDP.
    #[error("not UDP: IP protocol {0}")]
    NotUdp(u8),
    /// The UDP destination port is not 4791.
    #[error("not RoCEv2: UDP destination port {0}")]
    NotRoce(u16),
    /// BTH TVer is not 0.
    #[error("bad BTH transport version {0}")]
    BadTransportVersion(u8),
    /// The BTH opcode is not one of wire.md's tables.
    #[error("unknown opcode {0:#04x}")]
    UnknownOpcode(u8),
    /// The TLM header's version is not 0.
    #[error("bad TLM version {0}")]
    BadTlmVersion(u8),
    /// maxhop is 0 or nhop exceeds maxhop.
    #[error("bad TLM hop counts: nhop {nhop}, maxhop {maxhop}")]
    BadTlmHops { nhop: u8, maxhop: u8 },
    /// A length field disagrees with the bytes present, or a payload has a
    /// length its opcode does not allow.
    #[error("length mismatch at {0}")]
    LengthMismatch(Layer),
    /// The invariant CRC does not match.
    #[error("bad ICRC: wire {wire:#010x}, computed {computed:#010x}")]
    BadIcrc { wire: u32, computed: u32 },
    /// Emit: the output buffer is smaller than the frame.
    #[error("buffer too small: need {need} bytes, have {have}")]
    BufferTooSmall { need: usize, have: usize },
    /// Emit: the extension headers given do not match what the opcode carries.
    #[error("extension headers do not match opcode {0}")]
    HeadersMismatch(Opcode),
    /// Emit: a TLM header with impossible hop counts or one missing where
    /// the opcode requires it.
    #[error("bad TLM for opcode {0}")]
    BadTlm(Opcode),
    /// The Ethernet frame does not carry ARP.
    #[error("not ARP: ethertype {0:#06x}")]
    NotArp(u16),
    /// ARP other than an IPv4-over-Ethernet request or reply.
    #[error("ARP that is not an IPv4-over-Ethernet request or reply")]
    UnsupportedArp,
    /// The frame's 802.1Q VLAN is not the device's (0: untagged or VLAN id
    /// 0).
    #[error("VLAN {0} is not this device's (0: untagged)")]
    WrongVlan(u16),
    /// The Ethernet frame is not a MAC control frame (EtherType 0x8808).
    #[error("not MAC control: ethertype {0:#06x}")]
    NotMacControl(u16),
    /// A MAC control frame that is not priority flow control (opcode
    /// 0x0101), e.g. an 802.3x PAUSE (0x0001).
    #[error("MAC control opcode {0:#06x} is not priority flow control (0x0101)")]
    UnsupportedMacControl(u16),
}

/// Fieldless reason for counting drops; one counter per variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ErrorKind {
    Truncated,
    NotIpv4,
    BadIpVersion,
    BadIpHeaderLen,
    BadIpChecksum,
    IpFragment,
    NotUdp,
    NotRoce,
    BadTransportVersion,
    UnknownOpcode,
    BadTlmVersion,
    BadTlmHops,
    LengthMismatch,
    BadIcrc,
    BufferTooSmall,
    HeadersMismatch,
    BadTlm,
    NotArp,
    UnsupportedArp,
    WrongVlan,
    NotMacControl,
    UnsupportedMacControl,
}

impl ErrorKind {
    /// Every kind, in counter order.
    pub const ALL: [ErrorKind; 22] = [
        ErrorKind::Truncated,
        ErrorKind::NotIpv4,
        ErrorKind::BadIpVersion,
        ErrorKind::BadIpHeaderLen,
        ErrorKind::BadIpChecksum,
        ErrorKind::IpFragment,
        ErrorKind::NotUdp,
        ErrorKind::NotRoce,
        ErrorKind::BadTransportVersion,
        ErrorKind::UnknownOpcode,
        ErrorKind::BadTlmVersion,
        ErrorKind::BadTlmHops,
        ErrorKind::LengthMismatch,
        ErrorKind::BadIcrc,
        ErrorKind::BufferTooSmall,
        ErrorKind::HeadersMismatch,
        ErrorKind::BadTlm,
        ErrorKind::NotArp,
        ErrorKind::UnsupportedArp,
        ErrorKind::WrongVlan,
        ErrorKind::NotMacControl,
        ErrorKind::UnsupportedMacControl,
    ];

    /// Index into a counter array of length `ErrorKind::ALL.len()`.
    pub const fn index(self) -> usize {
        self as usize
    }

    /// snake_case name, usable as a counter or log key.
    pub const fn name(self) -> &'static str {
        match self {
            ErrorKind::Truncated => "truncated",
            ErrorKind::NotIpv4 => "not_ipv4",
            ErrorKind::BadIpVersion => "bad_ip_version",
            ErrorKind::BadIpHeaderLen => "bad_ip_header_len",
            ErrorKind::BadIpChecksum => "bad_ip_checksum",
            ErrorKind::IpFragment => "ip_fragment",
            ErrorKind::NotUdp => "not_udp",
            ErrorKind::NotRoce => "not_roce",
            ErrorKind::BadTransportVersion => "bad_transport_version",
            ErrorKind::UnknownOpcode => "unknown_opcode",
            ErrorKind::BadTlmVersion => "bad_tlm_version",
            ErrorKind::BadTlmHops => "bad_tlm_hops",
            ErrorKind::LengthMismatch => "length_mismatch",
            ErrorKind::BadIcrc => "bad_icrc",
            ErrorKind::BufferTooSmall => "buffer_too_small",
            ErrorKind::HeadersMismatch => "headers_mismatch",
            ErrorKind::BadTlm => "bad_tlm",
            ErrorKind::NotArp => "not_arp",
            ErrorKind::UnsupportedArp => "unsupported_arp",
            ErrorKind::WrongVlan => "wrong_vlan",
            ErrorKind::NotMacControl => "not_mac_control",
            ErrorKind::UnsupportedMacControl => "unsupported_mac_control",
        }
    }
}

impl WireError {
    /// The counter this error increments.
    pub const fn kind(&self) -> ErrorKind {
        match self {
            WireError::Truncated(_) => ErrorKind::Truncated,
            WireError::NotIpv4(_) => ErrorKind::NotIpv4,
            WireError::BadIpVersion(_) => ErrorKind::BadIpVersion,
            WireError::BadIpHeaderLen(_) => ErrorKind::BadIpHeaderLen,
            WireError::BadIpChecksum => ErrorKind::BadIpChecksum,
            WireError::IpFragment => ErrorKind::IpFragment,
            WireError::NotUdp(_) => ErrorKind::NotUdp,
            WireError::NotRoce(_) => ErrorKind::NotRoce,
            WireError::BadTransportVersion(_) => ErrorKind::BadTransportVersion,
            WireError::UnknownOpcode(_) => ErrorKind::UnknownOpcode,
            WireError::BadTlmVersion(_) => ErrorKind::BadTlmVersion,
            WireError::BadTlmHops { .. } => ErrorKind::BadTlmHops,
            WireError::LengthMismatch(_) => ErrorKind::LengthMismatch,
            WireError::BadIcrc { .. } => ErrorKind::BadIcrc,
            WireError::BufferTooSmall { .. } => ErrorKind::BufferTooSmall,
            WireError::HeadersMismatch(_) => ErrorKind::HeadersMismatch,
            WireError::BadTlm(_) => ErrorKind::BadTlm,
            WireError::NotArp(_) => ErrorKind::NotArp,
            WireError::UnsupportedArp => ErrorKind::UnsupportedArp,
            WireError::WrongVlan(_) => ErrorKind::WrongVlan,
            WireError::NotMacControl(_) => ErrorKind::NotMacControl,
            WireError::UnsupportedMacControl(_) => ErrorKind::UnsupportedMacControl,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_listed_in_counter_order() {
        for (i, k) in ErrorKind::ALL.iter().enumerate() {
            assert_eq!(k.index(), i, "{}", k.name());
        }
    }

    #[test]
    fn messages_name_the_bad_value() {
        assert_eq!(
            WireError::UnknownOpcode(0x42).to_string(),
            "unknown opcode 0x42"
        );
        assert_eq!(
            WireError::NotRoce(53).to_string(),
            "not RoCEv2: UDP destination port 53"
        );
    }
}
