//! Whole-frame tests of the wire codec: every opcode round-trips, the
//! ConnectX-4 Lx CNP parses, corruption is caught, and each refusal names
//! its reason.

use std::net::Ipv4Addr;

use transport::wire::{
    AethRepr, AtomicEthRepr, ErrorKind, EthernetRepr, HopRecord, Layer, MacAddr, NotifyRepr,
    Opcode, Packet, PacketRepr, ProbeRepr, RethRepr, Tlm, TlmRepr, VlanTag, WireError,
};

const CX4_CNP: &str = "e41d2dab2bc2 7cfe90643b32 0800 \
    45c2003c718c40004011 9161 0a001101 0a001201 \
    000012b700280000 \
    8100ffff40000118 00000000 \
    00000000000000000000000000000000 \
    82fd002a";

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// A frame of `op` with every header the opcode needs, and `tlm` slots.
fn sample(op: Opcode, tlm_slots: u8) -> PacketRepr {
    let mut r = PacketRepr::new(op, 0x12_3456, 0xFF_FFFE);
    r.eth = EthernetRepr {
        src: MacAddr([2, 0, 0, 0, 0, 1]),
        dst: MacAddr([2, 0, 0, 0, 0, 2]),
        vlan: None,
    };
    r.ip.src = Ipv4Addr::new(10, 0, 0, 1);
    r.ip.dst = Ipv4Addr::new(10, 0, 0, 2);
    r.ip.dscp = 26;
    r.ip.ecn = 2;
    r.bth.ack_req = true;
    let l = op.layout();
    if l.reth {
        r.reth = Some(RethRepr {
            va: 0x7f00_dead_beef_0000,
            r_key: 0x1234_5678,
            dma_len: 70_000,
        });
    }
    if l.atomic_eth {
        r.atomic = Some(AtomicEthRepr {
            va: 0x7f00_dead_beef_0008,
            r_key: 0x1234_5678,
            swap_add: 0x0102_0304_0506_0708,
            compare: u64::MAX - 1,
        });
    }
    if l.immdt {
        r.imm = Some(0xcafe_f00d);
    }
    if l.ieth {
        r.ieth = Some(0x8765_4321);
    }
    if l.atomic_ack_eth {
        r.atomic_ack = Some(0xfeed_face_0000_0001);
    }
    if l.aeth {
        r.aeth = Some(AethRepr {
            syndrome: 0x1f,
            msn: 77,
        });
    }
    if l.probe {
        r.probe = Some(ProbeRepr {
            probe_id: 3,
            snd_psn: 0x00ab_cdef,
            sender_ts_ns: 123_456_789,
        });
    }
    if l.notify {
        r.notify = Some(NotifyRepr {
            window_bytes: 50_000,
            rate_mbps: 80_000,
            seq: 4,
        });
    }
    if tlm_slots > 0 || l.tlm_required {
        let mut t = TlmRepr::empty(tlm_slots.max(1));
        t.echo = op == Opcode::TlmResponse || op == Opcode::CcNotify;
        t.nhop = t.maxhop.min(2);
        for i in 0..usize::from(t.nhop) {
            t.hops[i] = HopRecord {
                ts_ns: 1_000 + i as u32,
                tx_bytes: u32::MAX - 10,
                qlen: 4096,
                rate: 1000,
                switch_id: 10 + i as u8,
                port_id: 1,
            };
            t.path_id ^= u16::from(t.hops[i].switch_id);
        }
        r.tlm = Some(t);
    }
    r
}

fn emit(r: &PacketRepr, payload: &[u8]) -> Vec<u8> {
    let mut buf = vec![0u8; r.frame_len(payload.len())];
    let n = r.emit(payload, &mut buf).unwrap();
    assert_eq!(n, buf.len());
    buf
}

#[test]
fn connectx4_cnp_test_vector_parses_with_good_icrc() {
    let f = hex(CX4_CNP);
    let p = Packet::parse(&f).unwrap();
    assert!(p.icrc_ok());
    assert_eq!(p.icrc_computed, 0x2a00_fd82);
    assert_eq!(p.repr.bth.opcode, Opcode::Cnp);
    assert_eq!(p.repr.bth.dest_qp, 0x118);
    assert!(p.repr.bth.becn);
    assert_eq!(p.repr.udp.src_port, 0);
    assert!(p.payload.is_empty());
}

#[test]
fn every_opcode_round_trips_with_and_without_telemetry() {
    for op in Opcode::ALL {
        let sizes: &[usize] = if op.layout().payload {
            &[0, 1, 2, 3, 4, 1023, 1024, 4096]
        } else {
            &[0]
        };
        for &len in sizes {
            for slots in [0u8, 1, 5, 15] {
                let r = sample(op, slots);
                let payload: Vec<u8> = (0..len).map(|i| i as u8 ^ 0x5a).collect();
                let f = emit(&r, &payload);
                assert_eq!(
                    f.len() % 2,
                    0,
                    "{op} {len}: frames are even ({} bytes)",
                    f.len()
                );
                let p = Packet::parse(&f).unwrap_or_else(|e| panic!("{op} len {len}: {e}"));
                assert_eq!(p.repr, r, "{op} len {len} slots {slots}");
                assert_eq!(p.payload, &payload[..]);
                assert_eq!(usize::from(p.pad), (4 - len % 4) % 4);
                assert!(p.icrc_ok());
            }
        }
    }
}

#[test]
fn emit_refuses_headers_that_do_not_match_the_opcode() {
    let mut r = sample(Opcode::RdmaWriteOnly, 0);
    r.aeth = Some(AethRepr::default());
    let mut buf = [0u8; 2048];
    assert_eq!(
        r.emit(&[], &mut buf),
        Err(WireError::HeadersMismatch(Opcode::RdmaWriteOnly))
    );
    let mut r = sample(Opcode::TlmRequest, 0);
    r.tlm = None;
    assert_eq!(
        r.emit(&[], &mut buf),
        Err(WireError::BadTlm(Opcode::TlmRequest))
    );
    let r = sample(Opcode::Acknowledge, 0);
    assert_eq!(
        r.emit(&[1], &mut buf),
        Err(WireError::LengthMismatch(Layer::Payload))
    );
    let r = sample(Opcode::SendOnly, 0);
    assert_eq!(
        r.emit(&[0; 100], &mut buf[..100]),
        Err(WireError::BufferTooSmall {
            need: 100 + 54 + 4,
            have: 100
        })
    );
    assert!(r.emit(&vec![0; 70_000], &mut vec![0; 80_000]).is_err());
}

#[test]
fn every_truncation_is_refused_without_panic() {
    for op in Opcode::ALL {
        let f = emit(
            &sample(op, 2),
            &[7; 33][..if op.layout().payload { 33 } else { 0 }],
        );
        for cut in 0..f.len() {
            assert!(
                Packet::parse_unverified(&f[..cut]).is_err(),
                "{op} cut {cut}"
            );
        }
    }
}

#[test]
fn ethernet_padding_after_the_ip_packet_is_ignored() {
    let r = sample(Opcode::Acknowledge, 0);
    let mut f = emit(&r, &[]);
    f.resize(f.len() + 6, 0xee);
    assert_eq!(Packet::parse(&f).unwrap().repr, r);
}

#[test]
fn a_flip_of_any_protected_bit_is_refused() {
    let r = sample(Opcode::RdmaWriteFirst, 3);
    let f = emit(&r, &[0x11; 64]);
    let bth = 14 + 20 + 8;
    for byte in 14..f.len() {
        let masked = byte == 14 + 1 // TOS
            || byte == 14 + 8 // TTL: the IP checksum still catches it
            || (14 + 10..14 + 12).contains(&byte) // IP checksum
            || (34 + 6..34 + 8).contains(&byte) // UDP checksum
            || byte == bth + 4 // FECN/BECN/T
            || (bth + 12..bth + 12 + 4 + 3 * 16).contains(&byte); // TLM, rewritten in flight
        for bit in 0..8 {
            let mut g = f.clone();
            g[byte] ^= 1 << bit;
            let res = Packet::parse(&g);
            if !masked {
                assert!(res.is_err(), "flip of byte {byte} bit {bit} went unnoticed");
            }
        }
    }
}

#[test]
fn corruption_is_counted_as_bad_icrc() {
    let f = emit(&sample(Opcode::RdmaWriteOnly, 0), &[1, 2, 3, 4, 5]);
    let mut g = f.clone();
    let at = g.len() - 6;
    g[at] ^= 0x80;
    let e = Packet::parse(&g).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::BadIcrc);
    // The unverified parse reports the same frame with icrc_ok() false.
    let p = Packet::parse_unverified(&g).unwrap();
    assert!(!p.icrc_ok());
    // Corrupting the opcode is also bad_icrc, not unknown_opcode.
    let mut g = f.clone();
    g[42] = 0x6A;
    assert_eq!(Packet::parse(&g).unwrap_err().kind(), ErrorKind::BadIcrc);
    assert_eq!(
        Packet::parse_unverified(&g).unwrap_err(),
        WireError::UnknownOpcode(0x6A)
    );
}

#[test]
fn refusals_name_their_reason() {
    let f = emit(&sample(Opcode::RdmaWriteOnly, 0), &[9; 8]);
    let case = |at: usize, v: u8| {
        let mut g = f.clone();
        g[at] = v;
        Packet::parse_unverified(&g).unwrap_err()
    };
    assert_eq!(case(12, 0x86), WireError::NotIpv4(0x8600));
    assert_eq!(case(14, 0x65), WireError::BadIpVersion(6));
    assert_eq!(case(14 + 12, 11), WireError::BadIpChecksum);
    assert_eq!(case(34 + 3, 0xb8), WireError::NotRoce(4792));
    assert_eq!(case(42 + 1, 0x01), WireError::BadTransportVersion(1));
    // T set on a frame without room for the TLM block it announces.
    let mut g = f.clone();
    g[42 + 4] = 0x20;
    g[54 + 1] = 0x0f;
    assert_eq!(
        Packet::parse_unverified(&g).unwrap_err(),
        WireError::Truncated(Layer::Tlm)
    );
}

#[test]
fn tlm_version_and_hop_counts_are_checked_after_the_icrc() {
    let r = sample(Opcode::TlmRequest, 4);
    let f = emit(&r, &[]);
    let mut g = f.clone();
    g[54] = 0x80; // ver 2
    assert_eq!(Packet::parse(&g), Err(WireError::BadTlmVersion(2)));
    let mut g = f.clone();
    g[55] = 0x54; // nhop 5 > maxhop 4
    assert_eq!(
        Packet::parse(&g),
        Err(WireError::BadTlmHops { nhop: 5, maxhop: 4 })
    );
}

#[test]
fn a_switch_can_push_hops_without_breaking_the_icrc() {
    let r = sample(Opcode::RdmaWriteMiddle, 3);
    let mut f = emit(&r, &[3; 1024]);
    let mut t = Tlm::new_checked(&mut f[54..]).unwrap();
    assert!(t.push_hop(&HopRecord {
        ts_ns: 5,
        tx_bytes: 6,
        qlen: 7,
        rate: 4000,
        switch_id: 99,
        port_id: 3
    }));
    let p = Packet::parse(&f).unwrap();
    let tlm = p.repr.tlm.unwrap();
    assert_eq!(tlm.nhop, 3);
    assert_eq!(tlm.filled()[2].switch_id, 99);
    assert_eq!(tlm.path_id, 10 ^ 11 ^ 99);
}

#[test]
fn non_payload_opcodes_refuse_trailing_bytes() {
    // A READ request with 4 extra bytes before the ICRC (ICRC recomputed by
    // parsing unverified, which still applies the length rules).
    let r = sample(Opcode::RdmaReadRequest, 0);
    let mut f = emit(&r, &[]);
    let icrc = f.split_off(f.len() - 4);
    f.extend_from_slice(&[0; 4]);
    f.extend_from_slice(&icrc);
    let total = (f.len() - 14) as u16;
    f[16..18].copy_from_slice(&total.to_be_bytes());
    f[24..26].copy_from_slice(&[0, 0]);
    let c = transport::wire::ipv4::checksum(&f[14..34]);
    f[24..26].copy_from_slice(&c.to_be_bytes());
    let ulen = (f.len() - 34) as u16;
    f[38..40].copy_from_slice(&ulen.to_be_bytes());
    assert_eq!(
        Packet::parse_unverified(&f),
        Err(WireError::LengthMismatch(Layer::Payload))
    );
}

#[test]
fn frame_len_of_an_opcode_is_the_built_frames_length() {
    for op in Opcode::ALL {
        for slots in [0u8, 1, 5] {
            let r = sample(op, slots);
            let tlm = r.tlm.map_or(0, |t| t.block_len());
            for n in [0usize, 1, 3, 1024] {
                let n = if op.layout().payload { n } else { 0 };
                assert_eq!(
                    transport::wire::packet::frame_len_of(op.layout(), tlm, n),
                    r.frame_len(n),
                    "{op} tlm {slots} payload {n}"
                );
            }
        }
    }
}

#[test]
fn an_8021q_tag_adds_four_bytes_in_front_of_ip_and_leaves_the_icrc_unchanged() {
    let tag = VlanTag {
        pcp: 3,
        dei: false,
        vid: 100,
    };
    for op in Opcode::ALL {
        for slots in [0u8, 5] {
            let plain = sample(op, slots);
            let mut tagged = plain;
            tagged.eth.vlan = Some(tag);
            let len = if op.layout().payload { 1021 } else { 0 };
            let payload = vec![0xa5u8; len];
            let (u, t) = (emit(&plain, &payload), emit(&tagged, &payload));
            assert_eq!(t.len(), u.len() + 4, "{op}");
            assert_eq!(tagged.header_len(), plain.header_len() + 4, "{op}");
            assert_eq!(&t[12..16], &[0x81, 0x00, 0x60, 0x64], "{op}");
            assert_eq!(&t[..12], &u[..12]);
            // From the inner EtherType on, the frames are the same bytes:
            // the ICRC covers IP and up, not the Ethernet header.
            assert_eq!(&t[16..], &u[12..], "{op}");
            let p = Packet::parse(&t).unwrap_or_else(|e| panic!("{op}: {e}"));
            assert_eq!(p.repr, tagged, "{op}");
            assert_eq!(p.payload, &payload[..]);
        }
    }
}
