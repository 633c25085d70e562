//! Whole RoCEv2 frames: `Eth | IPv4 | UDP | BTH | [TLM] | [ext] | payload |
//! pad | ICRC`, parsed into a [`Packet`] and emitted from a [`PacketRepr`].
//!
//! Parse order: Ethernet, IPv4, UDP, BTH, TLM length, ICRC, then the
//! meaning of BTH, TLM and the extension headers, then the payload length.
//! Checking the ICRC before the opcode means a corrupted frame is counted
//! as `bad_icrc` rather than by whatever field the corruption hit.

use super::{
    aeth, atomic, bth, cnp, deth, ethernet, icrc, immdt, ipv4, probe, reth, udp, Aeth, AethRepr,
    AtomicEth, AtomicEthRepr, Bth, BthRepr, Cnp, Deth, DethRepr, EthernetFrame, EthernetRepr,
    ImmDt, Ipv4Packet, Ipv4Repr, Layer, Layout, MacAddr, Notify, NotifyRepr, Opcode, Probe,
    ProbeRepr, Reth, RethRepr, Tlm, TlmRepr, UdpPacket, UdpRepr, WireError,
};

/// Bytes of Ethernet + IPv4 + UDP in front of BTH in untagged frames we
/// emit (an 802.1Q tag adds [`ethernet::VLAN_TAG_LEN`]).
pub const OUTER_LEN: usize = ethernet::HEADER_LEN + ipv4::HEADER_LEN + udp::HEADER_LEN;

/// Every header of a RoCEv2 frame. The `Option`s present must be exactly
/// those the opcode's [`Layout`] lists; a TLM block is present
/// when `tlm` is `Some` (BTH's T bit is derived from it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PacketRepr {
    pub eth: EthernetRepr,
    pub ip: Ipv4Repr,
    pub udp: UdpRepr,
    pub bth: BthRepr,
    pub tlm: Option<TlmRepr>,
    /// DETH: the Q_Key and source QP of a UD packet.
    pub deth: Option<DethRepr>,
    pub reth: Option<RethRepr>,
    pub atomic: Option<AtomicEthRepr>,
    pub imm: Option<u32>,
    /// IETH: the R_Key a SEND_WITH_INVALIDATE invalidates.
    pub ieth: Option<u32>,
    pub aeth: Option<AethRepr>,
    /// AtomicAckETH: the original value at the atomic's address.
    pub atomic_ack: Option<u64>,
    pub probe: Option<ProbeRepr>,
    pub notify: Option<NotifyRepr>,
}

/// A parsed frame: its headers, a borrow of its payload (pad excluded) and
/// the ICRC as found on the wire and as computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<'a> {
    pub repr: PacketRepr,
    pub payload: &'a [u8],
    /// PadCnt from BTH.
    pub pad: u8,
    pub icrc_wire: u32,
    pub icrc_computed: u32,
}

/// The T bit of an untagged frame's BTH: which instance of the
/// fixed-offset parse may take the frame. Each refuses the other's
/// frames by it before any other check.
#[inline(always)]
fn t_bit(frame: &[u8]) -> bool {
    const AT: usize = ethernet::HEADER_LEN + ipv4::HEADER_LEN + udp::HEADER_LEN + 4;
    frame.get(AT).is_some_and(|b| b & 0x20 != 0)
}

impl<'a> Packet<'a> {
    /// Parses and verifies a frame; a bad ICRC is an error.
    #[inline(always)]
    pub fn parse(frame: &'a [u8]) -> Result<Self, WireError> {
        if let Some(p) = Self::parse_common(frame) {
            return Ok(p);
        }
        if let Some(p) = Self::parse_with_tlm(frame, None) {
            return Ok(p);
        }
        Self::parse_inner(frame, true)
    }

    /// The frames a connected QP exchanges most, read at fixed offsets:
    /// untagged, a 20-byte IPv4 header ending where the frame's ICRC
    /// does, a TLM block or none (HPCC++ inband data and their ACKs carry
    /// one), and an opcode with at most a RETH or an AETH (SEND, WRITE,
    /// READ request and response, ACK). Anything else, and
    /// anything this path would refuse (a bad checksum, ICRC or length),
    /// is `None`: the layered parse takes it and names the error. What it
    /// returns is what the layered parse returns (a property test holds
    /// the two to it).
    #[inline(always)]
    fn parse_common(frame: &'a [u8]) -> Option<Self> {
        Self::parse_fixed::<false>(frame, None)
    }

    /// [`Packet::parse_fixed`] of a frame with a TLM block: a second
    /// instance, tried after the first refused (which it does first
    /// thing for a frame with the T bit), so that the path of frames
    /// without one carries no TLM code.
    #[inline(always)]
    fn parse_with_tlm(frame: &'a [u8], split: Option<(&'a [u8], &'a [u8])>) -> Option<Self> {
        Self::parse_fixed::<true>(frame, split)
    }

    /// Parses and verifies a frame that arrives in three pieces: its
    /// headers (`head`, exactly up to the payload), its payload where it
    /// lies, and its `tail` (pad and ICRC), as a frame sent from separate
    /// buffers arrives when the port hands the buffers on. Only the
    /// frames [`Packet::parse`] reads at fixed offsets are taken (a data
    /// packet of a connected QP); `None` for anything else, or anything
    /// refused, which the caller parses from one buffer to learn why.
    pub fn parse_split(head: &'a [u8], payload: &'a [u8], tail: &'a [u8]) -> Option<Self> {
        let split = Some((payload, tail));
        Self::parse_fixed::<false>(head, split).or_else(|| Self::parse_with_tlm(head, split))
    }

    /// The fixed-offset parse of `frame`, or with `split` of the headers
    /// in `frame` and the payload and tail apart: of a frame without a
    /// TLM block, or with `TLM` of one with.
    #[inline(always)]
    fn parse_fixed<const TLM: bool>(
        frame: &'a [u8],
        split: Option<(&'a [u8], &'a [u8])>,
    ) -> Option<Self> {
        const IP: usize = ethernet::HEADER_LEN;
        const UDP: usize = IP + ipv4::HEADER_LEN;
        const BTH: usize = UDP + udp::HEADER_LEN;
        const EXT: usize = BTH + bth::HEADER_LEN;
        if t_bit(frame) != TLM {
            return None;
        }
        let h: &[u8; EXT] = frame.first_chunk()?;
        let frame_len = match split {
            None => frame.len(),
            Some((payload, tail)) => frame.len() + payload.len() + tail.len(),
        };
        // Ethernet: IPv4, untagged. IPv4: version 4, no options, its total
        // length the rest of the frame, its checksum good (fragments and
        // anything but UDP are refused by `from_fixed`).
        if h[12..15] != [0x08, 0x00, 0x45] {
            return None;
        }
        let ip_len = usize::from(u16::from_be_bytes([h[16], h[17]]));
        let ip_header: &[u8; ipv4::HEADER_LEN] = h[IP..UDP].try_into().ok()?;
        if IP + ip_len != frame_len || ipv4::checksum(ip_header) != 0 {
            return None;
        }
        let ip = Ipv4Repr::from_fixed(ip_header).ok()?;
        // UDP: to the RoCEv2 port, its length the rest of the packet.
        let udp_len = usize::from(u16::from_be_bytes([h[UDP + 4], h[UDP + 5]]));
        if u16::from_be_bytes([h[UDP + 2], h[UDP + 3]]) != udp::ROCE_PORT
            || udp_len != ip_len - ipv4::HEADER_LEN
        {
            return None;
        }
        // BTH: version 0, a plain request or response, with or without a
        // TLM block.
        let bth_bytes: &[u8; bth::HEADER_LEN] = h[BTH..EXT].try_into().ok()?;
        let bth = BthRepr::from_fixed(bth_bytes).ok()?;
        let layout = bth.layout();
        if layout.tlm_required
            || layout.deth
            || layout.atomic_eth
            || layout.immdt
            || layout.ieth
            || layout.atomic_ack_eth
            || layout.probe
            || layout.notify
            || layout.cnp
        {
            return None;
        }
        // The TLM block right after BTH, when the T bit says so (checked
        // first thing); it ends before the ICRC (and, apart, within the
        // headers).
        let tlm_view = if TLM {
            let body_end = match split {
                None => frame.len().checked_sub(icrc::ICRC_LEN)?,
                Some(_) => frame.len(),
            };
            let v = Tlm::new_checked(frame.get(EXT..body_end)?).ok()?;
            TlmRepr::check(&v).ok()?;
            Some(v)
        } else {
            None
        };
        let tlm_len = tlm_view.as_ref().map_or(0, |v| v.block_len());
        let ext_at = EXT + tlm_len;
        let ext_len = usize::from(layout.reth) * reth::HEADER_LEN
            + usize::from(layout.aeth) * aeth::HEADER_LEN;
        let pad = usize::from((h[BTH + 1] >> 4) & 3);
        // Where the headers end (`end`: the payload, pad and ICRC too when
        // they are in `frame`), the ICRC as sent and as computed, and the
        // payload when it lies apart.
        let (end, icrc_wire, icrc_computed, apart) = match split {
            None => {
                let end = frame.len().checked_sub(icrc::ICRC_LEN)?;
                if end < ext_at + ext_len {
                    return None;
                }
                let t = &frame[end..];
                let wire = u32::from_le_bytes([t[0], t[1], t[2], t[3]]);
                (
                    end,
                    wire,
                    icrc::compute_in_frame(frame, IP, end, tlm_len).ok()?,
                    None,
                )
            }
            Some((payload, tail)) => {
                if frame.len() != ext_at + ext_len || !layout.payload {
                    return None;
                }
                let (pad_bytes, t) =
                    tail.split_at_checked(tail.len().checked_sub(icrc::ICRC_LEN)?)?;
                if pad_bytes.len() != pad {
                    return None;
                }
                let wire = u32::from_le_bytes([t[0], t[1], t[2], t[3]]);
                let computed =
                    icrc::compute_split(&frame[IP..], tlm_len, payload, pad_bytes).ok()?;
                (frame.len(), wire, computed, Some(payload))
            }
        };
        if icrc_wire != icrc_computed {
            return None;
        }
        let mut at = ext_at;
        let reth = if layout.reth {
            let r = RethRepr::parse(&Reth::new_checked(&frame[at..end]).ok()?);
            at += reth::HEADER_LEN;
            Some(r)
        } else {
            None
        };
        let aeth = if layout.aeth {
            let r = AethRepr::parse(&Aeth::new_checked(&frame[at..end]).ok()?);
            at += aeth::HEADER_LEN;
            Some(r)
        } else {
            None
        };
        let rest = &frame[at..end];
        let payload = if let Some(payload) = apart {
            payload
        } else if layout.payload {
            rest.get(..rest.len().checked_sub(pad)?)?
        } else if rest.is_empty() && pad == 0 {
            rest
        } else {
            return None;
        };
        let mut out = Some(Packet {
            repr: PacketRepr {
                eth: EthernetRepr {
                    dst: MacAddr([h[0], h[1], h[2], h[3], h[4], h[5]]),
                    src: MacAddr([h[6], h[7], h[8], h[9], h[10], h[11]]),
                    vlan: None,
                },
                ip,
                udp: UdpRepr {
                    src_port: u16::from_be_bytes([h[UDP], h[UDP + 1]]),
                },
                bth,
                tlm: None,
                deth: None,
                reth,
                atomic: None,
                imm: None,
                ieth: None,
                aeth,
                atomic_ack: None,
                probe: None,
                notify: None,
            },
            payload,
            pad: pad as u8,
            icrc_wire,
            icrc_computed,
        });
        // A TLM block is parsed into the result where it lies, not moved
        // there (~270 bytes); without one the result is built once.
        if let (Some(v), Some(p)) = (&tlm_view, out.as_mut()) {
            p.repr.tlm = Some(TlmRepr::parse(v).ok()?);
        }
        out
    }

    /// [`Packet::parse`] without its fixed-offset path: every frame goes
    /// through the layered parse (for the property test that holds the
    /// two equal).
    #[doc(hidden)]
    pub fn parse_layered(frame: &'a [u8]) -> Result<Self, WireError> {
        Self::parse_inner(frame, true)
    }

    /// Parses a frame and reports the ICRC in [`Packet::icrc_ok`] instead of
    /// refusing it (for decoders and taps that show corrupted frames).
    pub fn parse_unverified(frame: &'a [u8]) -> Result<Self, WireError> {
        Self::parse_inner(frame, false)
    }

    /// Does the ICRC on the wire match the one computed?
    pub fn icrc_ok(&self) -> bool {
        self.icrc_wire == self.icrc_computed
    }

    #[inline(always)]
    fn parse_inner(frame: &'a [u8], verify: bool) -> Result<Self, WireError> {
        let eth_view = EthernetFrame::new_checked(frame)?;
        let eth = EthernetRepr::parse(&eth_view)?;
        let ip_at = eth_view.header_len();
        let ip_view = Ipv4Packet::new_checked(&frame[ip_at..])?;
        let ip = Ipv4Repr::parse(&ip_view)?;
        // The IP packet ends at its total length (Ethernet may pad after it).
        let ip_bytes: &'a [u8] = &frame[ip_at..ip_at + usize::from(ip_view.total_len())];
        let udp_bytes = &ip_bytes[ip_view.header_len()..];
        let udp = UdpRepr::parse(&UdpPacket::new_checked(udp_bytes)?)?;

        let l4 = &udp_bytes[udp::HEADER_LEN..];
        let bth_view = Bth::new_checked(l4)?;
        if l4.len() < bth::HEADER_LEN + icrc::ICRC_LEN {
            return Err(WireError::Truncated(Layer::Icrc));
        }
        let body = &l4[..l4.len() - icrc::ICRC_LEN];
        let tlm_view = if bth_view.has_tlm() {
            Some(Tlm::new_checked(&body[bth::HEADER_LEN..])?)
        } else {
            None
        };
        let tlm_len = tlm_view.map_or(0, |t| t.block_len());

        let t = &l4[l4.len() - icrc::ICRC_LEN..];
        let icrc_wire = u32::from_le_bytes([t[0], t[1], t[2], t[3]]);
        let icrc_computed = icrc::compute(&ip_bytes[..ip_bytes.len() - icrc::ICRC_LEN], tlm_len)?;
        if verify && icrc_wire != icrc_computed {
            return Err(WireError::BadIcrc {
                wire: icrc_wire,
                computed: icrc_computed,
            });
        }

        let bth = BthRepr::parse(&bth_view)?;
        // The TLM block (15 hop records at most) is parsed straight into
        // the result below, not moved there.
        if let Some(v) = &tlm_view {
            TlmRepr::check(v)?;
        }
        let layout = bth.layout();
        let mut at = bth::HEADER_LEN + tlm_len;

        let deth = if layout.deth {
            let r = DethRepr::parse(&Deth::new_checked(&body[at..])?);
            at += deth::HEADER_LEN;
            Some(r)
        } else {
            None
        };
        let reth = if layout.reth {
            let r = RethRepr::parse(&Reth::new_checked(&body[at..])?);
            at += reth::HEADER_LEN;
            Some(r)
        } else {
            None
        };
        let atomic = if layout.atomic_eth {
            let r = AtomicEthRepr::parse(&AtomicEth::new_checked(&body[at..])?);
            at += atomic::ATOMIC_ETH_LEN;
            Some(r)
        } else {
            None
        };
        let imm = if layout.immdt {
            let v = ImmDt::new_checked(&body[at..])?.imm();
            at += immdt::HEADER_LEN;
            Some(v)
        } else {
            None
        };
        let ieth = if layout.ieth {
            let v = ImmDt::new_checked_as(&body[at..], Layer::Ieth)?.imm();
            at += immdt::HEADER_LEN;
            Some(v)
        } else {
            None
        };
        let aeth = if layout.aeth {
            let r = AethRepr::parse(&Aeth::new_checked(&body[at..])?);
            at += aeth::HEADER_LEN;
            Some(r)
        } else {
            None
        };
        let atomic_ack = if layout.atomic_ack_eth {
            let v = atomic::parse_ack(&body[at..])?;
            at += atomic::ATOMIC_ACK_ETH_LEN;
            Some(v)
        } else {
            None
        };
        let probe = if layout.probe {
            let r = ProbeRepr::parse(&Probe::new_checked(&body[at..])?);
            at += probe::BLOCK_LEN;
            Some(r)
        } else {
            None
        };
        let notify = if layout.notify {
            let r = NotifyRepr::parse(&Notify::new_checked(&body[at..])?);
            at += probe::BLOCK_LEN;
            Some(r)
        } else {
            None
        };
        if layout.cnp {
            Cnp::new_checked(&body[at..])?;
            at += cnp::BODY_LEN;
        }

        let rest = &body[at..];
        let pad = bth_view.pad_count();
        let payload = if layout.payload {
            if rest.len() < pad {
                return Err(WireError::LengthMismatch(Layer::Payload));
            }
            &rest[..rest.len() - pad]
        } else {
            if !rest.is_empty() || pad != 0 {
                return Err(WireError::LengthMismatch(Layer::Payload));
            }
            rest
        };

        let mut packet = Packet {
            repr: PacketRepr {
                eth,
                ip,
                udp,
                bth,
                tlm: None,
                deth,
                reth,
                atomic,
                imm,
                ieth,
                aeth,
                atomic_ack,
                probe,
                notify,
            },
            payload,
            pad: pad as u8,
            icrc_wire,
            icrc_computed,
        };
        if let Some(v) = &tlm_view {
            packet.repr.tlm = Some(TlmRepr::parse(v)?);
        }
        Ok(packet)
    }
}

/// Pad bytes that align a payload of `len` bytes to 4.
pub const fn pad_for(len: usize) -> usize {
    len.wrapping_neg() & 3
}

impl PacketRepr {
    /// A frame of `opcode` with default Ethernet/IP/UDP fields, the given
    /// DestQP and PSN, and no extension headers; callers fill in what the
    /// opcode needs.
    pub fn new(opcode: Opcode, dest_qp: u32, psn: u32) -> Self {
        PacketRepr {
            eth: EthernetRepr::default(),
            ip: Ipv4Repr::default(),
            udp: UdpRepr {
                // The local QPN is not known here: the pair's stand-in.
                src_port: udp::entropy_port(dest_qp, dest_qp),
            },
            bth: BthRepr::new(opcode, dest_qp, psn),
            tlm: None,
            deth: None,
            reth: None,
            atomic: None,
            imm: None,
            ieth: None,
            aeth: None,
            atomic_ack: None,
            probe: None,
            notify: None,
        }
    }

    /// Bytes from BTH up to the payload.
    pub fn transport_header_len(&self) -> usize {
        transport_header_len(self.bth.layout(), self.tlm.map_or(0, |t| t.block_len()))
    }

    /// Length of the whole frame with `payload_len` bytes of payload.
    pub fn frame_len(&self, payload_len: usize) -> usize {
        self.tag_len()
            + frame_len_of(
                self.bth.layout(),
                self.tlm.map_or(0, |t| t.block_len()),
                payload_len,
            )
    }

    /// Bytes the 802.1Q tag adds (0 untagged).
    fn tag_len(&self) -> usize {
        self.eth.header_len() - ethernet::HEADER_LEN
    }
}

/// Bytes from BTH up to the payload of a frame with the headers `l`
/// (an opcode's [`Layout`] in its service) carrying a TLM block of
/// `tlm_len` bytes (0: none).
pub fn transport_header_len(l: Layout, tlm_len: usize) -> usize {
    {
        bth::HEADER_LEN
            + tlm_len
            + usize::from(l.deth) * deth::HEADER_LEN
            + usize::from(l.reth) * reth::HEADER_LEN
            + usize::from(l.atomic_eth) * atomic::ATOMIC_ETH_LEN
            + usize::from(l.immdt || l.ieth) * immdt::HEADER_LEN
            + usize::from(l.aeth) * aeth::HEADER_LEN
            + usize::from(l.atomic_ack_eth) * atomic::ATOMIC_ACK_ETH_LEN
            + usize::from(l.probe) * probe::BLOCK_LEN
            + usize::from(l.notify) * probe::BLOCK_LEN
            + usize::from(l.cnp) * cnp::BODY_LEN
    }
}

/// Length of a whole untagged frame with the headers `l` (an opcode's
/// [`Layout`] in its service), a TLM block of `tlm_len` bytes and
/// `payload_len` bytes of payload, without building its headers (what a
/// pacer asks for every packet; a tag adds [`ethernet::VLAN_TAG_LEN`]).
pub fn frame_len_of(l: Layout, tlm_len: usize, payload_len: usize) -> usize {
    OUTER_LEN
        + transport_header_len(l, tlm_len)
        + payload_len
        + pad_for(payload_len)
        + icrc::ICRC_LEN
}

impl PacketRepr {
    /// Bytes from the start of the frame up to the payload.
    pub fn header_len(&self) -> usize {
        OUTER_LEN + self.tag_len() + self.transport_header_len()
    }

    /// The transport part (BTH and what follows it), borrowing the TLM
    /// block.
    pub fn transport(&self) -> TransportRepr<'_> {
        TransportRepr {
            bth: self.bth,
            tlm: self.tlm.as_ref(),
            deth: self.deth,
            reth: self.reth,
            atomic: self.atomic,
            imm: self.imm,
            ieth: self.ieth,
            aeth: self.aeth,
            atomic_ack: self.atomic_ack,
            probe: self.probe,
            notify: self.notify,
        }
    }

    /// Checks that the headers match the opcode and the frame fits IPv4.
    pub fn check(&self, payload_len: usize) -> Result<(), WireError> {
        self.transport().check(payload_len)?;
        check_ipv4_len(self.frame_len(payload_len) - self.eth.header_len())
    }

    /// Emits the frame with `payload` into `buf`; returns the frame length.
    pub fn emit(&self, payload: &[u8], buf: &mut [u8]) -> Result<usize, WireError> {
        self.emit_with(payload.len(), buf, |p| p.copy_from_slice(payload))
    }

    /// Emits the frame, letting `fill` write the `payload_len` payload bytes
    /// in place (so that memory-region data is copied once, straight into
    /// the frame). Pad and ICRC are written after `fill` returns.
    pub fn emit_with(
        &self,
        payload_len: usize,
        buf: &mut [u8],
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<usize, WireError> {
        self.check(payload_len)?;
        let need = self.frame_len(payload_len);
        let frame = take_frame(buf, need)?;
        let ip_at = self.eth.header_len();
        let udp_at = ip_at + ipv4::HEADER_LEN;
        let bth_at = udp_at + udp::HEADER_LEN;
        self.eth.emit(frame)?;
        self.ip.emit(&mut frame[ip_at..], need - udp_at);
        self.udp.emit(&mut frame[udp_at..], need - bth_at);
        self.transport()
            .emit_after_outer(frame, ip_at, payload_len, fill)
    }
}

fn take_frame(buf: &mut [u8], need: usize) -> Result<&mut [u8], WireError> {
    let have = buf.len();
    buf.get_mut(..need)
        .ok_or(WireError::BufferTooSmall { need, have })
}

/// An IPv4 packet of `ip_len` bytes must fit the 16-bit total length.
fn check_ipv4_len(ip_len: usize) -> Result<(), WireError> {
    if ip_len > usize::from(u16::MAX) {
        return Err(WireError::LengthMismatch(Layer::Ipv4));
    }
    Ok(())
}

/// The transport part of a frame to emit: BTH and the headers after it.
/// The TLM block (up to ~370 bytes) is borrowed, so that building one of
/// these per packet copies no telemetry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransportRepr<'t> {
    pub bth: BthRepr,
    pub tlm: Option<&'t TlmRepr>,
    pub deth: Option<DethRepr>,
    pub reth: Option<RethRepr>,
    pub atomic: Option<AtomicEthRepr>,
    pub imm: Option<u32>,
    pub ieth: Option<u32>,
    pub aeth: Option<AethRepr>,
    pub atomic_ack: Option<u64>,
    pub probe: Option<ProbeRepr>,
    pub notify: Option<NotifyRepr>,
}

impl<'t> TransportRepr<'t> {
    /// BTH of `opcode` to `dest_qp` at `psn`, no other header; callers fill
    /// in what the opcode needs.
    pub fn new(opcode: Opcode, dest_qp: u32, psn: u32) -> Self {
        TransportRepr {
            bth: BthRepr::new(opcode, dest_qp, psn),
            tlm: None,
            deth: None,
            reth: None,
            atomic: None,
            imm: None,
            ieth: None,
            aeth: None,
            atomic_ack: None,
            probe: None,
            notify: None,
        }
    }

    fn tlm_len(&self) -> usize {
        self.tlm.map_or(0, |t| t.block_len())
    }

    /// Bytes from BTH up to the payload.
    pub fn header_len(&self) -> usize {
        transport_header_len(self.bth.layout(), self.tlm_len())
    }

    /// Bytes from BTH to the end of the frame with `payload_len` bytes of
    /// payload (pad and ICRC included).
    pub fn len_with(&self, payload_len: usize) -> usize {
        self.header_len() + payload_len + pad_for(payload_len) + icrc::ICRC_LEN
    }

    /// `Some` of its RETH when the frame is plain ([`Layout::is_plain`]):
    /// BTH and exactly the RETH its opcode wants, no TLM or other header,
    /// and a payload only where the opcode allows one. Such a frame passes
    /// [`TransportRepr::check`].
    #[inline(always)]
    fn plain(&self, payload_len: usize) -> Option<Option<&RethRepr>> {
        let l = self.bth.layout();
        let plain = self.tlm.is_none()
            && self.atomic.is_none()
            && self.imm.is_none()
            && self.ieth.is_none()
            && self.aeth.is_none()
            && self.atomic_ack.is_none()
            && self.probe.is_none()
            && self.notify.is_none()
            && l.is_plain()
            && l.reth == self.reth.is_some()
            && (l.payload || payload_len == 0);
        plain.then_some(self.reth.as_ref())
    }

    /// Checks that the headers present are those the opcode's layout lists
    /// and that a payload is allowed.
    pub fn check(&self, payload_len: usize) -> Result<(), WireError> {
        let op = self.bth.opcode;
        let l = self.bth.layout();
        if l.deth != self.deth.is_some()
            || l.reth != self.reth.is_some()
            || l.atomic_eth != self.atomic.is_some()
            || l.immdt != self.imm.is_some()
            || l.ieth != self.ieth.is_some()
            || l.aeth != self.aeth.is_some()
            || l.atomic_ack_eth != self.atomic_ack.is_some()
            || l.probe != self.probe.is_some()
            || l.notify != self.notify.is_some()
        {
            return Err(WireError::HeadersMismatch(op));
        }
        match self.tlm {
            None if l.tlm_required => return Err(WireError::BadTlm(op)),
            Some(t) if !t.is_valid() => return Err(WireError::BadTlm(op)),
            _ => {}
        }
        if payload_len > 0 && !l.payload {
            return Err(WireError::LengthMismatch(Layer::Payload));
        }
        Ok(())
    }

    /// Writes BTH and what follows it into `frame` (the whole frame, its
    /// outer headers written, the IPv4 header at `ip_at`), `fill` writing
    /// the payload in place, then the pad and the ICRC. Checked already.
    fn emit_after_outer(
        &self,
        frame: &mut [u8],
        ip_at: usize,
        payload_len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<usize, WireError> {
        let pad = pad_for(payload_len);
        let mut at = self.emit_headers(frame, ip_at, pad);
        fill(&mut frame[at..at + payload_len]);
        at += payload_len;
        if pad > 0 {
            // Not a call into memset for the usual none.
            frame[at..at + pad].fill(0);
            at += pad;
        }
        let crc = icrc::compute_in_frame(frame, ip_at, at, self.tlm_len())?;
        frame[at..at + icrc::ICRC_LEN].copy_from_slice(&crc.to_le_bytes());
        Ok(at + icrc::ICRC_LEN)
    }

    /// Writes BTH and what follows it up to the payload into `frame` (the
    /// headers only, the outer ones written, the IPv4 header at `ip_at`);
    /// the pad, the ICRC over the headers, `payload` (which stays where
    /// it is) and the pad go in the returned tail. Checked already.
    fn emit_head_after_outer(
        &self,
        frame: &mut [u8],
        ip_at: usize,
        payload: &[u8],
    ) -> Result<(usize, FrameTail), WireError> {
        let pad = pad_for(payload.len());
        let at = self.emit_headers(frame, ip_at, pad);
        let zeros = [0u8; 3];
        let crc = icrc::compute_split(&frame[ip_at..at], self.tlm_len(), payload, &zeros[..pad])?;
        let mut tail = FrameTail {
            bytes: [0; 7],
            len: (pad + icrc::ICRC_LEN) as u8,
        };
        tail.bytes[pad..pad + icrc::ICRC_LEN].copy_from_slice(&crc.to_le_bytes());
        Ok((at, tail))
    }

    /// Writes BTH and the headers after it (up to the payload) for a
    /// payload padded with `pad` bytes; returns where the payload starts.
    #[inline(always)]
    fn emit_headers(&self, frame: &mut [u8], ip_at: usize, pad: usize) -> usize {
        let bth_at = ip_at + ipv4::HEADER_LEN + udp::HEADER_LEN;
        self.bth.emit(&mut frame[bth_at..], pad, self.tlm.is_some());

        let mut at = bth_at + bth::HEADER_LEN;
        let tlm_len = self.tlm_len();
        if let Some(t) = self.tlm {
            t.emit(&mut frame[at..]);
            at += tlm_len;
        }
        if let Some(d) = &self.deth {
            d.emit(&mut frame[at..]);
            at += deth::HEADER_LEN;
        }
        if let Some(r) = &self.reth {
            r.emit(&mut frame[at..]);
            at += reth::HEADER_LEN;
        }
        if let Some(r) = &self.atomic {
            r.emit(&mut frame[at..]);
            at += atomic::ATOMIC_ETH_LEN;
        }
        if let Some(v) = self.imm.or(self.ieth) {
            immdt::emit(v, &mut frame[at..]);
            at += immdt::HEADER_LEN;
        }
        if let Some(r) = &self.aeth {
            r.emit(&mut frame[at..]);
            at += aeth::HEADER_LEN;
        }
        if let Some(v) = self.atomic_ack {
            atomic::emit_ack(v, &mut frame[at..]);
            at += atomic::ATOMIC_ACK_ETH_LEN;
        }
        if let Some(r) = &self.probe {
            r.emit(&mut frame[at..]);
            at += probe::BLOCK_LEN;
        }
        if let Some(r) = &self.notify {
            r.emit(&mut frame[at..]);
            at += probe::BLOCK_LEN;
        }
        if self.bth.layout().cnp {
            cnp::emit(&mut frame[at..]);
            at += cnp::BODY_LEN;
        }
        at
    }
}

/// The end of a frame whose payload is sent from where it lies: the pad
/// bytes and the ICRC (over the headers, the payload and the pad).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameTail {
    bytes: [u8; 7],
    len: u8,
}

impl FrameTail {
    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

/// The outer headers (Ethernet with its tag, IPv4, UDP) every frame of one
/// QP shares, emitted once and copied in front of each packet with only
/// the lengths, the IP ident and the IP checksum patched: what a NIC's
/// QP context holds, so that no packet builds its headers from fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameTemplate {
    head: [u8; ethernet::HEADER_LEN + ethernet::VLAN_TAG_LEN + ipv4::HEADER_LEN + udp::HEADER_LEN],
    /// Bytes of `head` used (42 untagged, 46 tagged).
    len: u8,
    /// One's complement sum of the IPv4 header's 16-bit words with total
    /// length, ident and checksum zero.
    ip_sum: u32,
}

impl FrameTemplate {
    /// The template of frames with these outer headers (`ip.ident` is
    /// ignored: every packet brings its own).
    pub fn new(eth: &EthernetRepr, ip: &Ipv4Repr, udp: &UdpRepr) -> Self {
        let mut head = [0; ethernet::HEADER_LEN + ethernet::VLAN_TAG_LEN + OUTER_IP_UDP];
        let ip_at = eth.header_len();
        // Cannot fail: `head` holds the longest Ethernet header.
        let _ = eth.emit(&mut head);
        let ip0 = Ipv4Repr { ident: 0, ..*ip };
        ip0.emit(&mut head[ip_at..], 0);
        udp.emit(&mut head[ip_at + ipv4::HEADER_LEN..], 0);
        let mut h = [0u8; ipv4::HEADER_LEN];
        h.copy_from_slice(&head[ip_at..ip_at + ipv4::HEADER_LEN]);
        h[2..4].fill(0); // total length
        h[10..12].fill(0); // checksum
        let ip_sum = h
            .chunks_exact(2)
            .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
            .sum();
        FrameTemplate {
            head,
            len: (ip_at + OUTER_IP_UDP) as u8,
            ip_sum,
        }
    }

    /// The same headers with UDP source port `port` (another ECMP path).
    pub fn with_src_port(&self, port: u16) -> Self {
        let mut t = *self;
        let at = usize::from(t.len) - udp::HEADER_LEN;
        t.head[at..at + 2].copy_from_slice(&port.to_be_bytes());
        t
    }

    /// The UDP source port of the frames.
    pub fn src_port(&self) -> u16 {
        let at = usize::from(self.len) - udp::HEADER_LEN;
        u16::from_be_bytes([self.head[at], self.head[at + 1]])
    }

    /// Length of the frame `t` with `payload_len` payload bytes.
    pub fn frame_len(&self, t: &TransportRepr<'_>, payload_len: usize) -> usize {
        usize::from(self.len) + t.len_with(payload_len)
    }

    /// Emits the frame `t` with the IP ident `ident` into `buf`, `fill`
    /// writing the payload in place; the same bytes as
    /// [`PacketRepr::emit_with`] of the same headers.
    pub fn emit_with(
        &self,
        t: &TransportRepr<'_>,
        ident: u16,
        payload_len: usize,
        buf: &mut [u8],
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<usize, WireError> {
        if let Some(reth) = t.plain(payload_len) {
            return self.emit_short(&t.bth, Ext::reth(reth), ident, payload_len, buf, fill);
        }
        t.check(payload_len)?;
        let need = self.frame_len(t, payload_len);
        let ip_at = usize::from(self.len) - OUTER_IP_UDP;
        check_ipv4_len(need - ip_at)?;
        let frame = take_frame(buf, need)?;
        self.emit_outer(frame, need - ip_at, ident);
        t.emit_after_outer(frame, ip_at, payload_len, fill)
    }

    /// Emits a plain frame ([`Layout::is_plain`](super::Layout::is_plain)):
    /// BTH of `bth`, the RETH its opcode wants (`reth`) and `payload_len`
    /// bytes `fill` writes, with the IP ident `ident`, into `buf`. The
    /// bytes [`FrameTemplate::emit_with`] writes for a [`TransportRepr`]
    /// of just these headers, without building one, as a requester sends
    /// most of its packets; any other layout is refused.
    #[inline]
    pub fn emit_plain(
        &self,
        bth: &BthRepr,
        reth: Option<&RethRepr>,
        ident: u16,
        payload_len: usize,
        buf: &mut [u8],
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<usize, WireError> {
        let l = bth.layout();
        if !l.is_plain() || l.reth != reth.is_some() || (!l.payload && payload_len > 0) {
            return Err(WireError::HeadersMismatch(bth.opcode));
        }
        self.emit_short(bth, Ext::reth(reth), ident, payload_len, buf, fill)
    }

    /// A frame of BTH, at most one extension header (`ext` and its
    /// length) and `payload_len` bytes `fill` writes: outer headers, BTH,
    /// the header, the payload, the pad and the ICRC, with no TLM and no
    /// other header (the caller knows the opcode's layout is that).
    #[inline(always)]
    fn emit_short(
        &self,
        bth: &BthRepr,
        (ext, ext_len): (Ext<'_>, usize),
        ident: u16,
        payload_len: usize,
        buf: &mut [u8],
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<usize, WireError> {
        let bth_at = usize::from(self.len);
        let ip_at = bth_at - OUTER_IP_UDP;
        let pad = pad_for(payload_len);
        let at = bth_at + bth::HEADER_LEN + ext_len;
        let end = at + payload_len + pad;
        let need = end + icrc::ICRC_LEN;
        check_ipv4_len(need - ip_at)?;
        let frame = take_frame(buf, need)?;
        self.emit_outer(frame, need - ip_at, ident);
        bth.emit(&mut frame[bth_at..], pad, false);
        let ext_at = bth_at + bth::HEADER_LEN;
        match ext {
            Ext::None => {}
            Ext::Reth(r) => r.emit(&mut frame[ext_at..at]),
            Ext::Aeth(a) => a.emit(&mut frame[ext_at..at]),
        }
        fill(&mut frame[at..at + payload_len]);
        if pad > 0 {
            frame[at + payload_len..end].fill(0);
        }
        let crc = icrc::compute_in_frame(frame, ip_at, end, 0)?;
        frame[end..need].copy_from_slice(&crc.to_le_bytes());
        Ok(need)
    }

    /// Emits an ACK or NAK without TLM (BTH of `bth`, which must be an
    /// Acknowledge, and `aeth`) with the IP ident `ident` into `buf`: the
    /// bytes [`FrameTemplate::emit_with`] writes for the same headers,
    /// without its general checks and layout walk, as a responder sends
    /// one per message.
    pub fn emit_ack(
        &self,
        bth: &BthRepr,
        aeth: &AethRepr,
        ident: u16,
        buf: &mut [u8],
    ) -> Result<usize, WireError> {
        if bth.opcode != Opcode::Acknowledge {
            return Err(WireError::HeadersMismatch(bth.opcode));
        }
        let ext = (Ext::Aeth(aeth), aeth::HEADER_LEN);
        self.emit_short(bth, ext, ident, 0, buf, |_| ())
    }

    /// Emits the headers of the frame `t` with `payload` into `buf`, and
    /// returns their length and the frame's tail (pad and ICRC): the
    /// headers, then `payload` from where it lies, then the tail, are the
    /// bytes [`FrameTemplate::emit_with`] writes into one buffer.
    pub fn emit_head(
        &self,
        t: &TransportRepr<'_>,
        ident: u16,
        payload: &[u8],
        buf: &mut [u8],
    ) -> Result<(usize, FrameTail), WireError> {
        t.check(payload.len())?;
        let need = self.frame_len(t, payload.len());
        let ip_at = usize::from(self.len) - OUTER_IP_UDP;
        check_ipv4_len(need - ip_at)?;
        let head = usize::from(self.len) + t.header_len();
        let frame = take_frame(buf, head)?;
        self.emit_outer(frame, need - ip_at, ident);
        t.emit_head_after_outer(frame, ip_at, payload)
    }

    /// Copies the outer headers into `frame` with the lengths of an IPv4
    /// packet of `ip_len` bytes, the ident and the IPv4 checksum patched.
    #[inline(always)]
    fn emit_outer(&self, frame: &mut [u8], ip_len: usize, ident: u16) {
        let len = usize::from(self.len);
        let ip_at = len - OUTER_IP_UDP;
        frame[..len].copy_from_slice(&self.head[..len]);
        let total = ip_len as u16;
        let mut sum = self.ip_sum + u32::from(total) + u32::from(ident);
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        let ip = &mut frame[ip_at..];
        ip[2..4].copy_from_slice(&total.to_be_bytes());
        ip[4..6].copy_from_slice(&ident.to_be_bytes());
        ip[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
        let udp_len = (ip_len - ipv4::HEADER_LEN) as u16;
        ip[ipv4::HEADER_LEN + 4..ipv4::HEADER_LEN + 6].copy_from_slice(&udp_len.to_be_bytes());
    }
}

/// IPv4 and UDP header bytes.
const OUTER_IP_UDP: usize = ipv4::HEADER_LEN + udp::HEADER_LEN;

/// The one extension header after BTH of a frame [`FrameTemplate`]
/// writes without the general walk.
#[derive(Clone, Copy)]
enum Ext<'a> {
    None,
    Reth(&'a RethRepr),
    Aeth(&'a AethRepr),
}

impl<'a> Ext<'a> {
    /// A plain frame's header after BTH, its RETH or none, and its length.
    #[inline(always)]
    fn reth(reth: Option<&'a RethRepr>) -> (Ext<'a>, usize) {
        match reth {
            Some(r) => (Ext::Reth(r), reth::HEADER_LEN),
            None => (Ext::None, 0),
        }
    }
}
