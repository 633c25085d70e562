//! Property tests of the wire codec: parse(emit(x)) == x for arbitrary
//! headers of every opcode, and parsing never panics on arbitrary or
//! mutated bytes.

use std::net::Ipv4Addr;

use proptest::prelude::*;
use transport::wire::{
    icrc, steering_dest_qp, AethRepr, AtomicEthRepr, BthRepr, DethRepr, EthernetFrame,
    EthernetRepr, FrameTemplate, HopRecord, Ipv4Packet, Ipv4Repr, MacAddr, NotifyRepr, Opcode,
    Packet, PacketRepr, ProbeRepr, RethRepr, RoceFrame, Service, Tlm, TlmRepr, UdpRepr, VlanTag,
};

/// Every (service, operation) pair an opcode byte names: RC's opcodes,
/// UC's SENDs and WRITEs, UD's two SENDs.
fn codes() -> Vec<(Service, Opcode)> {
    (0..=255u8).filter_map(Opcode::decode).collect()
}

fn opcode() -> impl Strategy<Value = (Service, Opcode)> {
    prop::sample::select(codes())
}

fn hop() -> impl Strategy<Value = HopRecord> {
    (
        any::<u32>(),
        any::<u32>(),
        any::<u32>(),
        any::<u16>(),
        any::<u8>(),
        any::<u8>(),
    )
        .prop_map(
            |(ts_ns, tx_bytes, qlen, rate, switch_id, port_id)| HopRecord {
                ts_ns,
                tx_bytes,
                qlen,
                rate,
                switch_id,
                port_id,
            },
        )
}

fn tlm() -> impl Strategy<Value = TlmRepr> {
    (1u8..=15)
        .prop_flat_map(|maxhop| {
            (
                Just(maxhop),
                prop::collection::vec(hop(), 0..=usize::from(maxhop)),
                any::<bool>(),
                any::<bool>(),
                any::<bool>(),
                any::<u16>(),
            )
        })
        .prop_map(|(maxhop, hops, echo, subscribe, nflows, path_id)| {
            let mut t = TlmRepr::empty(maxhop);
            t.nhop = hops.len() as u8;
            t.hops[..hops.len()].copy_from_slice(&hops);
            t.echo = echo;
            t.subscribe = subscribe;
            t.nflows = nflows;
            t.path_id = path_id;
            t
        })
}

fn outer() -> impl Strategy<Value = (EthernetRepr, Ipv4Repr, UdpRepr)> {
    (
        any::<[u8; 6]>(),
        any::<[u8; 6]>(),
        any::<[u8; 4]>(),
        any::<[u8; 4]>(),
        0u8..64,
        0u8..4,
        any::<u16>(),
        any::<u8>(),
        any::<bool>(),
        any::<u16>(),
        prop::option::of((0u8..8, any::<bool>(), 0u16..4096)),
    )
        .prop_map(|(s, d, ips, ipd, dscp, ecn, ident, ttl, df, sport, tag)| {
            (
                EthernetRepr {
                    src: MacAddr(s),
                    dst: MacAddr(d),
                    vlan: tag.map(|(pcp, dei, vid)| VlanTag { pcp, dei, vid }),
                },
                Ipv4Repr {
                    src: Ipv4Addr::from(ips),
                    dst: Ipv4Addr::from(ipd),
                    dscp,
                    ecn,
                    ident,
                    ttl,
                    dont_frag: df,
                },
                UdpRepr { src_port: sport },
            )
        })
}

fn bth((service, op): (Service, Opcode)) -> impl Strategy<Value = BthRepr> {
    (
        any::<[bool; 5]>(),
        any::<u16>(),
        0u32..1 << 24,
        0u32..1 << 24,
    )
        .prop_map(move |(f, pkey, dest_qp, psn)| BthRepr {
            opcode: op,
            service,
            solicited: f[0],
            migreq: f[1],
            pkey,
            fecn: f[2],
            becn: f[3],
            dest_qp,
            ack_req: f[4],
            psn,
        })
}

fn ext() -> impl Strategy<Value = (RethRepr, u32, AethRepr, ProbeRepr, NotifyRepr)> {
    (
        any::<(u64, u32, u32)>(),
        any::<u32>(),
        any::<u8>(),
        0u32..1 << 24,
        any::<(u32, u32, u64)>(),
        any::<(u32, u32, u32)>(),
    )
        .prop_map(|(reth, imm, syndrome, msn, probe, notify)| {
            (
                RethRepr {
                    va: reth.0,
                    r_key: reth.1,
                    dma_len: reth.2,
                },
                imm,
                AethRepr { syndrome, msn },
                ProbeRepr {
                    probe_id: probe.0,
                    snd_psn: probe.1,
                    sender_ts_ns: probe.2,
                },
                NotifyRepr {
                    window_bytes: notify.0,
                    rate_mbps: notify.1,
                    seq: notify.2,
                },
            )
        })
}

/// Any frame the codec can emit, with its payload.
fn frame() -> impl Strategy<Value = (PacketRepr, Vec<u8>)> {
    opcode().prop_flat_map(|op| {
        let l = op.1.layout_in(op.0);
        let max_payload = if l.payload { 4200 } else { 0 };
        (
            outer(),
            bth(op),
            prop::option::of(tlm()),
            tlm(),
            ext(),
            prop::collection::vec(any::<u8>(), 0..=max_payload),
        )
            .prop_map(move |((eth, ip, udp), bth, tlm_opt, tlm_req, e, payload)| {
                let repr = PacketRepr {
                    eth,
                    ip,
                    udp,
                    bth,
                    tlm: if l.tlm_required {
                        Some(tlm_req)
                    } else {
                        tlm_opt
                    },
                    deth: l.deth.then_some(DethRepr {
                        q_key: e.1.rotate_left(3),
                        src_qp: e.0.r_key & 0xff_ffff,
                    }),
                    reth: l.reth.then_some(e.0),
                    atomic: l.atomic_eth.then_some(AtomicEthRepr {
                        va: e.0.va,
                        r_key: e.0.r_key,
                        swap_add: u64::from(e.1) << 7 | u64::from(e.0.dma_len),
                        compare: !e.0.va,
                    }),
                    imm: l.immdt.then_some(e.1),
                    ieth: l.ieth.then_some(e.1 ^ 0x5a5a_5a5a),
                    aeth: l.aeth.then_some(e.2),
                    atomic_ack: l.atomic_ack_eth.then_some(e.0.va.rotate_left(13)),
                    probe: l.probe.then_some(e.3),
                    notify: l.notify.then_some(e.4),
                };
                (repr, payload)
            })
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn parse_of_emit_is_identity((repr, payload) in frame()) {
        let mut buf = vec![0u8; repr.frame_len(payload.len())];
        let n = repr.emit(&payload, &mut buf).unwrap();
        prop_assert_eq!(n, buf.len());
        let p = Packet::parse(&buf).unwrap();
        prop_assert_eq!(p.repr, repr);
        prop_assert_eq!(p.payload, &payload[..]);
        prop_assert!(p.icrc_ok());
    }

    /// The DestQP steering reads from the headers alone is the frame's,
    /// from the whole frame and from its headers cut anywhere past the
    /// BTH (a first segment); a frame cut inside its headers has none.
    #[test]
    fn steering_reads_the_dest_qp_from_the_headers((repr, payload) in frame(), cut in 0usize..64) {
        let mut buf = vec![0u8; repr.frame_len(payload.len())];
        repr.emit(&payload, &mut buf).unwrap();
        let want = RoceFrame::new_checked(&buf[..]).unwrap().dest_qp();
        prop_assert_eq!(want, repr.bth.dest_qp);
        prop_assert_eq!(steering_dest_qp(&buf), Some(want));
        let eth = EthernetFrame::new_checked(&buf[..]).unwrap().header_len();
        let ip = Ipv4Packet::new_checked(&buf[eth..]).unwrap().header_len();
        let bth_end = eth + ip + 8 + 12;
        let head = (bth_end + cut).min(buf.len());
        prop_assert_eq!(steering_dest_qp(&buf[..head]), Some(want));
        prop_assert_eq!(steering_dest_qp(&buf[..bth_end - 1 - cut.min(bth_end - 1)]), None);
    }

    /// A QP's frame template with the packet's outer headers emits the
    /// very bytes the field-by-field path emits, whatever the ident.
    #[test]
    fn a_template_emits_what_the_headers_emit((repr, payload) in frame()) {
        let mut want = vec![0u8; repr.frame_len(payload.len())];
        repr.emit(&payload, &mut want).unwrap();
        // Built from other idents: the packet's own is patched in.
        let mut ip = repr.ip;
        ip.ident = ip.ident.wrapping_add(12345);
        let t = FrameTemplate::new(&repr.eth, &ip, &repr.udp);
        let transport = repr.transport();
        prop_assert_eq!(t.frame_len(&transport, payload.len()), want.len());
        let mut got = vec![0xA5u8; want.len() + 7];
        let n = t
            .emit_with(&transport, repr.ip.ident, payload.len(), &mut got, |p| {
                p.copy_from_slice(&payload)
            })
            .unwrap();
        prop_assert_eq!(n, want.len());
        prop_assert_eq!(&got[..n], &want[..]);
        // Too small a buffer is an error, not a panic.
        let short = t.emit_with(&transport, 0, payload.len(), &mut got[..n - 1], |_| ());
        prop_assert!(short.is_err());
    }

    /// An ACK or NAK without TLM from the template's own emitter is the
    /// frame the general emitter writes for the same headers (any BTH
    /// fields, AETH, outer headers and ident); any other opcode is
    /// refused, and a short buffer is an error, not a panic.
    #[test]
    fn a_templates_ack_is_the_general_frame(
        (repr, _) in frame(),
        syndrome in any::<u8>(),
        msn in 0u32..1 << 24,
    ) {
        let aeth = AethRepr { syndrome, msn };
        let mut ack = repr;
        ack.bth.opcode = Opcode::Acknowledge;
        ack.bth.service = Service::Rc;
        ack.tlm = None;
        ack.deth = None;
        ack.reth = None;
        ack.atomic = None;
        ack.imm = None;
        ack.ieth = None;
        ack.aeth = Some(aeth);
        ack.atomic_ack = None;
        ack.probe = None;
        ack.notify = None;
        let mut want = vec![0u8; ack.frame_len(0)];
        ack.emit(&[], &mut want).unwrap();
        let t = FrameTemplate::new(&ack.eth, &ack.ip, &ack.udp);
        let mut got = vec![0xA5u8; want.len() + 5];
        let n = t.emit_ack(&ack.bth, &aeth, ack.ip.ident, &mut got).unwrap();
        prop_assert_eq!(&got[..n], &want[..]);
        prop_assert!(t.emit_ack(&ack.bth, &aeth, 0, &mut got[..n - 1]).is_err());
        if repr.bth.opcode != Opcode::Acknowledge {
            prop_assert!(t.emit_ack(&repr.bth, &aeth, 0, &mut got).is_err());
        }
    }

    /// A plain frame (BTH, the RETH its opcode wants, a payload where it
    /// may have one) from the template's plain emitter is the frame the
    /// general emitter writes for the same headers; any frame with other
    /// headers is refused, and a short buffer is an error, not a panic.
    #[test]
    fn a_templates_plain_frame_is_the_general_frame((repr, payload) in frame()) {
        let t = FrameTemplate::new(&repr.eth, &repr.ip, &repr.udp);
        let mut got = vec![0xA5u8; repr.frame_len(payload.len()) + 5];
        let emitted = t.emit_plain(
            &repr.bth,
            repr.reth.as_ref(),
            repr.ip.ident,
            payload.len(),
            &mut got,
            |dst| dst.copy_from_slice(&payload),
        );
        let l = repr.bth.layout();
        let plain = l.is_plain()
            && repr.tlm.is_none()
            && l.reth == repr.reth.is_some()
            && (l.payload || payload.is_empty());
        if !plain {
            // Only the opcode's layout and the RETH reach emit_plain: a
            // layout with other headers is refused.
            if !l.is_plain() || l.reth != repr.reth.is_some() {
                prop_assert!(emitted.is_err());
            }
            return Ok(());
        }
        let mut want = vec![0u8; repr.frame_len(payload.len())];
        repr.emit(&payload, &mut want).unwrap();
        let n = emitted.unwrap();
        prop_assert_eq!(&got[..n], &want[..]);
        let short = t.emit_plain(&repr.bth, repr.reth.as_ref(), 0, payload.len(), &mut got[..n - 1], |_| ());
        prop_assert!(short.is_err());
        // A RETH the opcode does not want, or none where it wants one.
        let other = RethRepr { va: 1, r_key: 2, dma_len: 3 };
        let wrong = if repr.reth.is_some() { None } else { Some(&other) };
        let refused = t.emit_plain(&repr.bth, wrong, 0, payload.len(), &mut got, |_| ());
        prop_assert!(refused.is_err());
    }

    /// A frame sent from separate buffers: the headers the template
    /// emits, the payload where it lies and the tail (pad, ICRC) are the
    /// bytes of the frame emitted into one buffer.
    #[test]
    fn headers_payload_and_tail_apart_are_the_whole_frame((repr, payload) in frame()) {
        let mut want = vec![0u8; repr.frame_len(payload.len())];
        repr.emit(&payload, &mut want).unwrap();
        let t = FrameTemplate::new(&repr.eth, &repr.ip, &repr.udp);
        let transport = repr.transport();
        let head_len = repr.header_len();
        let mut head = vec![0xA5u8; head_len + 3];
        let (n, tail) = t.emit_head(&transport, repr.ip.ident, &payload, &mut head).unwrap();
        prop_assert_eq!(n, head_len);
        let mut got = head[..n].to_vec();
        got.extend_from_slice(&payload);
        got.extend_from_slice(tail.as_slice());
        prop_assert_eq!(&got[..], &want[..]);
        // A buffer shorter than the headers is an error, not a panic.
        prop_assert!(t.emit_head(&transport, 0, &payload, &mut head[..n - 1]).is_err());
    }

    /// A frame that arrives in three pieces (headers, payload, tail) parses
    /// to what the frame in one buffer parses to, or is left to the
    /// one-buffer parse (`None`); an untagged data frame of the kinds the
    /// fixed-offset parse reads is always taken, and any change to it that
    /// breaks a checksum or a length is refused.
    #[test]
    fn a_frame_in_pieces_parses_as_the_whole(
        (repr, payload) in frame(),
        plain in any::<bool>(),
        edit in prop::option::of((any::<prop::sample::Index>(), any::<u8>())),
        mend in any::<bool>(),
        shift in 0usize..3,
    ) {
        let mut repr = repr;
        if plain {
            repr.eth.vlan = None;
            if !repr.bth.opcode.layout().tlm_required {
                repr.tlm = None;
            }
        }
        let mut buf = vec![0u8; repr.frame_len(payload.len())];
        repr.emit(&payload, &mut buf).unwrap();
        if let Some((at, v)) = edit {
            let i = at.index(buf.len());
            buf[i] = v;
        }
        if mend {
            mend_checksums(&repr, &mut buf);
        }
        let whole = Packet::parse(&buf);
        let head = repr.header_len();
        let tail = 4 + (buf[43] >> 4 & 3) as usize;
        // The pieces cut where the frame says, or a little off.
        let cut = (head + shift).min(buf.len().saturating_sub(tail));
        if buf.len() >= tail && cut + tail <= buf.len() {
            let (h, rest) = buf.split_at(cut);
            let (p, t) = rest.split_at(rest.len() - tail);
            match Packet::parse_split(h, p, t) {
                Some(split) => prop_assert_eq!(Ok(split), whole),
                None => {
                    let fast = edit.is_none()
                        && plain
                        && shift == 0
                        && whole.is_ok()
                        && repr.bth.service != Service::Ud
                        && [
                            Opcode::SendFirst, Opcode::SendMiddle, Opcode::SendLast, Opcode::SendOnly,
                            Opcode::RdmaWriteFirst, Opcode::RdmaWriteMiddle, Opcode::RdmaWriteLast,
                            Opcode::RdmaWriteOnly, Opcode::RdmaReadResponseFirst,
                            Opcode::RdmaReadResponseMiddle, Opcode::RdmaReadResponseLast,
                            Opcode::RdmaReadResponseOnly,
                        ]
                        .contains(&repr.bth.opcode);
                    prop_assert!(!fast, "an untouched {:?} frame in pieces was not taken", repr.bth.opcode);
                }
            }
        }
    }

    #[test]
    fn parse_never_panics_on_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..600)) {
        let _ = Packet::parse(&bytes);
        let _ = Packet::parse_unverified(&bytes);
    }

    /// The fixed-offset path of `Packet::parse` returns what the layered
    /// parse returns: for frames as emitted, and with bytes changed (the
    /// IPv4 checksum and the ICRC mended or not, so that a change also
    /// gets past them), cut short or padded.
    #[test]
    fn the_fixed_offset_parse_equals_the_layered_parse(
        (repr, payload) in frame(),
        edits in prop::collection::vec(
            (any::<bool>(), any::<prop::sample::Index>(), any::<u8>()),
            0..4
        ),
        mend in any::<bool>(),
        cut in prop::option::of(any::<prop::sample::Index>()),
        pad in 0usize..3,
    ) {
        let mut buf = vec![0u8; repr.frame_len(payload.len())];
        repr.emit(&payload, &mut buf).unwrap();
        for (in_headers, at, v) in edits {
            // Half the changes in the first 70 bytes, where the headers are.
            let i = at.index(if in_headers { buf.len().min(70) } else { buf.len() });
            buf[i] = v;
        }
        if let Some(c) = cut {
            buf.truncate(c.index(buf.len()));
        }
        buf.resize(buf.len() + pad, 0);
        if mend {
            mend_checksums(&repr, &mut buf);
        }
        prop_assert_eq!(Packet::parse(&buf), Packet::parse_layered(&buf));
    }

    #[test]
    fn parse_never_panics_on_mutated_frames(
        (repr, payload) in frame(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
        truncate in any::<bool>(),
    ) {
        let mut buf = vec![0u8; repr.frame_len(payload.len())];
        repr.emit(&payload, &mut buf).unwrap();
        for (at, v) in edits {
            let i = at.index(buf.len());
            buf[i] = v;
        }
        if truncate {
            buf.truncate(cut.index(buf.len()));
        }
        if let Ok(p) = Packet::parse_unverified(&buf) {
            // Whatever parses can be emitted again.
            let mut out = vec![0u8; p.repr.frame_len(p.payload.len())];
            prop_assert!(p.repr.emit(p.payload, &mut out).is_ok());
        }
        let _ = Packet::parse(&buf);
    }
}

/// A stack as it arrives: any flags, any records, through the wire once.
fn arrived_stack() -> impl Strategy<Value = TlmRepr> {
    (tlm(), any::<bool>(), any::<bool>()).prop_map(|(mut t, compact, sojourn)| {
        t.compact = compact;
        t.sojourn = sojourn;
        let mut b = vec![0u8; t.block_len()];
        t.emit(&mut b);
        TlmRepr::parse(&Tlm::new_checked(&b[..]).unwrap()).unwrap()
    })
}

proptest! {
    /// The same for frames the fixed-offset path takes (untagged, no
    /// TLM block), each with one header bit flipped or BTH's PadCnt changed and
    /// both checksums mended: where a frame breaks a rule of the layered
    /// parse past the checksums, the fast path must refuse it too.
    #[test]
    fn the_fixed_offset_parse_equals_the_layered_parse_past_the_checksums(
        (repr, payload) in frame(),
        pad_bits in 0u8..4,
        flip in prop::option::of((0usize..70, 0u8..8)),
    ) {
        let mut repr = repr;
        repr.eth.vlan = None;
        if !repr.bth.opcode.layout().tlm_required {
            repr.tlm = None;
        }
        let mut buf = vec![0u8; repr.frame_len(payload.len())];
        repr.emit(&payload, &mut buf).unwrap();
        buf[43] = (buf[43] & !0x30) | (pad_bits << 4);
        if let Some((at, bit)) = flip {
            let n = buf.len();
            buf[at.min(n - 1)] ^= 1 << bit;
        }
        mend_checksums(&repr, &mut buf);
        prop_assert_eq!(Packet::parse(&buf), Packet::parse_layered(&buf));
    }
}

/// Every single-bit change of the headers of a frame of each opcode the
/// fixed-offset path takes (and of each PadCnt), checksums mended: the
/// fast path and the layered parse agree on every one.
#[test]
fn the_fixed_offset_parse_equals_the_layered_parse_for_every_header_bit() {
    // Each opcode without and with a TLM block (HPCC++ inband's data and
    // ACKs carry one: three slots, one filled).
    let tlm = {
        let mut t = TlmRepr::empty(3);
        t.nhop = 1;
        t
    };
    for ((service, op), tlm) in codes()
        .into_iter()
        .flat_map(|c| [(c, None), (c, Some(tlm))])
    {
        let l = op.layout_in(service);
        let mut repr = PacketRepr::new(op, 0x12_3456, 0xAB_CDEF);
        if l.tlm_required {
            continue;
        }
        repr.bth.service = service;
        repr.tlm = tlm;
        repr.deth = l.deth.then_some(DethRepr {
            q_key: 0x1111_2222,
            src_qp: 0x33,
        });
        repr.reth = l.reth.then_some(RethRepr {
            va: 0x1000,
            r_key: 7,
            dma_len: 64,
        });
        repr.aeth = l.aeth.then_some(AethRepr {
            syndrome: 0,
            msn: 3,
        });
        repr.atomic = l.atomic_eth.then_some(AtomicEthRepr {
            va: 8,
            r_key: 7,
            swap_add: 1,
            compare: 2,
        });
        repr.imm = l.immdt.then_some(5);
        repr.ieth = l.ieth.then_some(6);
        repr.atomic_ack = l.atomic_ack_eth.then_some(9);
        let payload: &[u8] = if l.payload { &[0x5A; 61] } else { &[] };
        let mut frame = vec![0u8; repr.frame_len(payload.len())];
        repr.emit(payload, &mut frame).unwrap();
        for pad_bits in 0..4u8 {
            let headers = 74 + repr.tlm.map_or(0, |t| t.block_len());
            for at in 0..frame.len().min(headers) {
                for bit in 0..8 {
                    let mut buf = frame.clone();
                    buf[43] = (buf[43] & !0x30) | (pad_bits << 4);
                    buf[at] ^= 1 << bit;
                    mend_checksums(&repr, &mut buf);
                    assert_eq!(
                        Packet::parse(&buf),
                        Packet::parse_layered(&buf),
                        "{op:?}, PadCnt {pad_bits}, bit {bit} of byte {at} flipped"
                    );
                }
            }
        }
    }
}

/// Makes the IPv4 header checksum and the ICRC (at the frame's end)
/// right again after a frame was changed, as far as its bytes allow.
fn mend_checksums(repr: &PacketRepr, buf: &mut [u8]) {
    let ip_at = repr.eth.header_len();
    if buf.len() >= ip_at + 20 {
        buf[ip_at + 10..ip_at + 12].fill(0);
        let sum = transport::wire::ipv4::checksum(&buf[ip_at..ip_at + 20]);
        buf[ip_at + 10..ip_at + 12].copy_from_slice(&sum.to_be_bytes());
    }
    let n = buf.len();
    if n >= ip_at + 4 {
        let tlm_len = repr.tlm.map_or(0, |t| t.block_len());
        if let Ok(crc) = transport::wire::icrc::compute(&buf[ip_at..n - 4], tlm_len) {
            buf[n - 4..].copy_from_slice(&crc.to_le_bytes());
        }
    }
}

/// The Internet checksum as RFC 1071 states it: 16-bit words, an odd
/// last byte padded with zero, the sum folded and complemented.
fn checksum_by_halves(data: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for c in data.chunks(2) {
        sum += u32::from(u16::from_be_bytes([c[0], c.get(1).copied().unwrap_or(0)]));
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

proptest! {
    #[test]
    fn ipv4_checksum_summed_by_words_equals_rfc1071_by_halves(
        data in prop::collection::vec(any::<u8>(), 0..80)
    ) {
        prop_assert_eq!(transport::wire::ipv4::checksum(&data), checksum_by_halves(&data));
    }

    /// wire.md "ICRC": hashed where it lies in its frame, an IPv4 packet
    /// gives the ICRC of its masked copy, whatever comes before it and
    /// however long it is.
    #[test]
    fn the_icrc_in_the_frame_is_the_icrc_of_the_masked_copy(
        mut frame in prop::collection::vec(any::<u8>(), 0..1600),
        ip_at in 0usize..40,
        len in 0usize..1600,
        tlm_len in prop::sample::select(vec![0usize, 0, 0, 4, 36]),
        options in any::<bool>(),
    ) {
        if let Some(b) = frame.get_mut(ip_at) {
            *b = if options { 0x46 } else { 0x45 };
        }
        let end = ip_at + len;
        let copied = frame.get(ip_at..end).map(|ip| icrc::compute(ip, tlm_len));
        let in_frame = icrc::compute_in_frame(&frame, ip_at, end, tlm_len);
        match copied {
            Some(c) => prop_assert_eq!(in_frame, c),
            None => prop_assert!(in_frame.is_err()),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// wire.md "Relative telemetry": a boundary's rewrite is what
    /// `relative` computes, survives the wire unchanged, and rewriting
    /// again changes nothing (so a MAC over the relative form verifies
    /// whether or not a boundary rewrote the stack on its way).
    #[test]
    fn relative_telemetry_is_stable_across_the_wire_and_a_second_boundary(t in arrived_stack()) {
        let rel = t.relative();
        prop_assert_eq!(rel.relative(), rel);
        let mut b = vec![0u8; t.block_len()];
        t.emit(&mut b);
        let mut view = Tlm::new_checked(&mut b[..]).unwrap();
        prop_assert_eq!(view.make_relative(), usize::from(t.nhop));
        let back = TlmRepr::parse(&Tlm::new_checked(&b[..]).unwrap()).unwrap();
        prop_assert_eq!(back, rel);
        for h in rel.filled() {
            prop_assert_eq!((h.switch_id, h.port_id), (0, 0));
            prop_assert!(h.rate == 0 || h.rate == transport::wire::tlm::RELATIVE_RATE);
        }
    }
}

proptest! {
    /// Any DETH reads back as it was written (the source QP's 24 bits),
    /// and any 8 bytes parse, re-emit and parse to the same fields.
    #[test]
    fn a_deth_round_trips(q_key in any::<u32>(), src_qp in 0u32..1 << 24, raw in any::<[u8; 8]>()) {
        use transport::wire::{Deth, DethRepr};
        let d = DethRepr { q_key, src_qp };
        let mut b = [0u8; 8];
        d.emit(&mut b);
        prop_assert_eq!(DethRepr::parse(&Deth::new_checked(&b[..]).unwrap()), d);
        let p = DethRepr::parse(&Deth::new_checked(&raw[..]).unwrap());
        p.emit(&mut b);
        prop_assert_eq!(DethRepr::parse(&Deth::new_checked(&b[..]).unwrap()), p);
        prop_assert_eq!(b[4], 0);
    }
}

/// A CM MAD with a valid header for attribute `attr` and arbitrary
/// message bytes.
fn cm_mad() -> impl Strategy<Value = Vec<u8>> {
    use transport::wire::cm::attr;
    let attrs = vec![
        attr::REQ,
        attr::MRA,
        attr::REJ,
        attr::REP,
        attr::RTU,
        attr::DREQ,
        attr::DREP,
        attr::SIDR_REQ,
        attr::SIDR_REP,
    ];
    (
        prop::sample::select(attrs),
        any::<u64>(),
        prop::collection::vec(any::<u8>(), 232),
    )
        .prop_map(|(a, tid, body)| {
            let mut mad = vec![1, 0x07, 2, 0x03, 0, 0, 0, 0];
            mad.extend_from_slice(&tid.to_be_bytes());
            mad.extend_from_slice(&a.to_be_bytes());
            mad.extend_from_slice(&[0; 6]);
            mad.extend_from_slice(&body);
            mad
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Every field the CM reads is written back where it was: parsing the
    /// emitted message of a parsed MAD gives the same message (reserved
    /// bits are the only bytes allowed to differ).
    #[test]
    fn a_cm_message_survives_emit_and_parse(mad in cm_mad()) {
        use transport::wire::cm::CmMsg;
        let (h, m) = CmMsg::parse(&mad).unwrap();
        let again = m.emit(h.tid);
        let (h2, m2) = CmMsg::parse(&again).unwrap();
        prop_assert_eq!(h.tid, h2.tid);
        prop_assert_eq!(&m, &m2);
        // And nothing the parse saw is lost: emitting the second parse
        // gives the very bytes of the first emit.
        prop_assert_eq!(&again[..], &m2.emit(h.tid)[..]);
    }

    #[test]
    fn the_cm_parse_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let _ = transport::wire::cm::CmMsg::parse(&bytes);
        let _ = transport::wire::cm::CmaHeader::parse(&bytes);
    }
}
