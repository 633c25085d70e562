//! Fuzz the frame parsers (RoCEv2, ARP and PFC): no input may panic, and
//! whatever parses must emit again and parse back to the same headers and
//! payload; a frame template of its outer headers emits the same bytes; an
//! INT response built from any input is a valid frame carrying its PSN;
//! the fixed-offset parse of common frames agrees with the layered one,
//! and so does that parse of the input cut in three pieces anywhere (a
//! frame received in pieces) whenever it takes them; a template's headers
//! with the payload apart and the tail are the frame emitted whole; a
//! switch's record pushed into any stack reads back in the stack's units;
//! a domain boundary's rewrite of any stack into relative load is what
//! `TlmRepr::relative` computes and rewriting again changes nothing;
//! steering's DestQP read from the headers alone is the frame's; a CM
//! message (the input as a 256-byte MAD) emits and parses back the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use transport::wire::{
    emit_int_response, steering_dest_qp, ArpRepr, EthernetFrame, FrameTemplate, HopRecord, MacAddr,
    Opcode, Packet, PfcRepr, RoceFrame,
};

fuzz_target!(|data: &[u8]| {
    // A CM MAD: what parses emits again and parses back the same.
    let mut mad = [0u8; 256];
    let n = data.len().min(256);
    mad[..n].copy_from_slice(&data[..n]);
    if let Ok((h, m)) = transport::wire::cm::CmMsg::parse(&mad) {
        let again = transport::wire::cm::CmMsg::parse(&m.emit(h.tid));
        assert_eq!(again.map(|(_, m)| m), Ok(m));
    }
    let _ = transport::wire::cm::CmaHeader::parse(data);
    if let Ok(a) = ArpRepr::parse(data) {
        let vlan = EthernetFrame::new_checked(data).ok().and_then(|e| e.vlan());
        let mut out = [0u8; 64];
        let n = a
            .emit_tagged(vlan, &mut out)
            .expect("a parsed ARP message emits");
        assert_eq!(ArpRepr::parse(&out[..n]), Ok(a));
        let back = EthernetFrame::new_checked(&out[..n]).map(|e| e.vlan());
        assert_eq!(back, Ok(vlan));
    }
    if let Ok(p) = PfcRepr::parse(data) {
        let src = MacAddr([2, 0, 0, 0, 0, 1]);
        assert_eq!(PfcRepr::parse(&p.to_frame(src)), Ok(p));
    }
    // The fixed-offset path for common frames says what the layered
    // parse says.
    assert_eq!(Packet::parse(data), Packet::parse_layered(data));
    // In three pieces, cut where the first two bytes say: what the pieces
    // parse to, when taken, is what the whole parses to.
    if let [a, b, rest @ ..] = data {
        let head = usize::from(*a).min(rest.len());
        let tail = usize::from(*b % 16).min(rest.len() - head);
        let (h, r) = rest.split_at(head);
        let (p, t) = r.split_at(r.len() - tail);
        if let Some(split) = Packet::parse_split(h, p, t) {
            assert_eq!(Ok(split), Packet::parse(rest));
        }
    }
    // Steering's DestQP, read from the headers alone, is the frame's.
    let steered = steering_dest_qp(data);
    if let Ok(f) = RoceFrame::new_checked(data) {
        assert_eq!(steered, Some(f.dest_qp()));
    }
    let mut copy = data.to_vec();
    let mut frame = RoceFrame::new_checked(&mut copy[..]).ok();
    if let Some(mut t) = frame.as_mut().and_then(|f| f.tlm_mut()) {
        let hop = HopRecord {
            qlen: 1000,
            rate: 1000,
            ..HopRecord::default()
        };
        let at = usize::from(t.nhop());
        if t.push_hop(&hop) {
            // Full records keep qlen; compact ones count 128 B, or 16 ns
            // under SOJOURN.
            let want = match (t.compact(), t.sojourn()) {
                (false, _) => 1000,
                (true, false) => 896,
                (true, true) => 992,
            };
            assert_eq!(t.hop(at).map(|h| h.qlen), Some(want));
        }
    }
    let mut copy = data.to_vec();
    let mut frame = RoceFrame::new_checked(&mut copy[..]).ok();
    if let Some(mut t) = frame.as_mut().and_then(|f| f.tlm_mut()) {
        let before = transport::wire::TlmRepr::parse(&t);
        t.make_relative();
        let after = transport::wire::TlmRepr::parse(&t);
        if let (Ok(b), Ok(a)) = (before, after) {
            assert_eq!(a, b.relative());
            assert_eq!(a.relative(), a);
        }
    }
    let mut resp = vec![0u8; data.len() + 64];
    if let Ok(n) = emit_int_response(data, &HopRecord::default(), &mut resp) {
        let r = Packet::parse(&resp[..n]).expect("an INT response parses");
        let d = Packet::parse_unverified(data).expect("it came from a frame");
        assert_eq!(r.repr.bth.opcode, Opcode::IntResponse);
        assert_eq!(r.repr.bth.psn, d.repr.bth.psn);
        let t = r.repr.tlm.expect("with its stack");
        assert!(t.echo && !t.subscribe && t.nhop == d.repr.tlm.unwrap().nhop + 1);
    }
    if let Ok(p) = Packet::parse_unverified(data) {
        let _ = p.icrc_ok();
        let mut out = vec![0u8; p.repr.frame_len(p.payload.len())];
        let n = p
            .repr
            .emit(p.payload, &mut out)
            .expect("a parsed frame emits");
        let q = Packet::parse(&out[..n]).expect("an emitted frame parses");
        assert_eq!(q.repr.eth, p.repr.eth);
        assert_eq!(q.repr.bth, p.repr.bth);
        assert_eq!(q.repr.tlm, p.repr.tlm);
        assert_eq!(q.repr.reth, p.repr.reth);
        assert_eq!(q.repr.aeth, p.repr.aeth);
        assert_eq!(q.payload, p.payload);
        let t = FrameTemplate::new(&p.repr.eth, &p.repr.ip, &p.repr.udp);
        let mut again = vec![0u8; n];
        let m = t
            .emit_with(
                &p.repr.transport(),
                p.repr.ip.ident,
                p.payload.len(),
                &mut again,
                |b| b.copy_from_slice(p.payload),
            )
            .expect("a template emits what the headers emit");
        assert_eq!(&again[..m], &out[..n]);
        // Sent from where the payload lies: headers, payload, tail.
        let (h, tail) = t
            .emit_head(&p.repr.transport(), p.repr.ip.ident, p.payload, &mut again)
            .expect("a template emits the headers alone");
        let pieces = [&again[..h], p.payload, tail.as_slice()].concat();
        assert_eq!(&pieces[..], &out[..n]);
    }
});
