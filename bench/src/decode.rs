//! `bench decode`: one line per captured frame, `key=value` tokens separated
//! by spaces, and a summary line.
//!
//! A RoCEv2 frame gives `op=NAME qpn=N psn=N ... icrc=ok|bad` followed by
//! the RETH, ImmDt, AETH, PROBE, NOTIFY fields and telemetry hops it
//! carries. Anything else gives `op=? error=KIND reason="..."`.

use std::fmt::Write as _;

use transport::wire::{HopRecord, Packet, Syndrome, TlmRepr};

use crate::pcap::Record;

/// Counts over a decoded capture.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    /// Records read.
    pub frames: u64,
    /// Frames that decode as RoCEv2 (whatever their ICRC).
    pub roce: u64,
    /// RoCEv2 frames whose ICRC does not match.
    pub icrc_bad: u64,
    /// Frames of other protocols (ARP, IPv6, other EtherTypes, IPv4 that
    /// is not UDP, UDP to another port): not errors.
    pub other: u64,
    /// Frames that look like RoCEv2 but cannot be decoded (truncated,
    /// bad headers or lengths).
    pub errors: u64,
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "frames={} roce={} icrc_bad={} other={} errors={}",
            self.frames, self.roce, self.icrc_bad, self.other, self.errors
        )
    }
}

impl Summary {
    /// Decodes record number `n` (1-based), counts it and returns its line.
    pub fn decode(&mut self, n: u64, rec: &Record) -> String {
        self.frames += 1;
        let mut s = format!("#{n} len={}", rec.orig_len);
        if (rec.data.len() as u64) < u64::from(rec.orig_len) {
            let _ = write!(s, " caplen={}", rec.data.len());
        }
        match Packet::parse_unverified(&rec.data) {
            Ok(p) => {
                self.roce += 1;
                if !p.icrc_ok() {
                    self.icrc_bad += 1;
                }
                describe(&mut s, &p);
            }
            Err(e) => {
                use transport::wire::ErrorKind;
                match e.kind() {
                    ErrorKind::NotIpv4 | ErrorKind::NotUdp | ErrorKind::NotRoce => self.other += 1,
                    _ => self.errors += 1,
                }
                let _ = write!(s, " op=? error={} reason=\"{e}\"", e.kind().name());
            }
        }
        s
    }
}

fn describe(s: &mut String, p: &Packet<'_>) {
    let r = &p.repr;
    let b = &r.bth;
    let _ = write!(
        s,
        " op={}{} qpn={} psn={} ackreq={} icrc={} src={}:{} dst={} ecn={} se={} fecn={} becn={} pad={} payload={}",
        match b.service {
            transport::wire::Service::Rc => "",
            transport::wire::Service::Uc => "UC_",
            transport::wire::Service::Ud => "UD_",
        },
        b.opcode.name(),
        b.dest_qp,
        b.psn,
        u8::from(b.ack_req),
        if p.icrc_ok() { "ok" } else { "bad" },
        r.ip.src,
        r.udp.src_port,
        r.ip.dst,
        r.ip.ecn,
        u8::from(b.solicited),
        u8::from(b.fecn),
        u8::from(b.becn),
        p.pad,
        p.payload.len(),
    );
    if let Some(d) = r.deth {
        let _ = write!(s, " qkey={:#x} srcqp={}", d.q_key, d.src_qp);
    }
    if let Some(t) = r.eth.vlan {
        let _ = write!(s, " vlan={} pcp={}", t.vid, t.pcp);
    }
    if !p.icrc_ok() {
        let _ = write!(
            s,
            " icrc_wire={:#010x} icrc_computed={:#010x}",
            p.icrc_wire, p.icrc_computed
        );
    }
    if let Some(x) = r.reth {
        let _ = write!(
            s,
            " reth.va={:#x} reth.rkey={:#x} reth.len={}",
            x.va, x.r_key, x.dma_len
        );
    }
    if let Some(x) = r.atomic {
        let _ = write!(
            s,
            " atomic.va={:#x} atomic.rkey={:#x} atomic.swap_add={:#x} atomic.compare={:#x}",
            x.va, x.r_key, x.swap_add, x.compare
        );
    }
    if let Some(imm) = r.imm {
        let _ = write!(s, " imm={imm:#010x}");
    }
    if let Some(k) = r.ieth {
        let _ = write!(s, " ieth.rkey={k:#010x}");
    }
    if let Some(a) = r.aeth {
        let kind = match a.decoded() {
            Syndrome::Ack { .. } => "ACK".to_string(),
            Syndrome::RnrNak { timer } => format!("RNR_NAK({timer})"),
            Syndrome::Nak(code) => format!("NAK({code:?})"),
            Syndrome::Reserved(_) => "RESERVED".to_string(),
        };
        let _ = write!(
            s,
            " aeth.syndrome={:#04x} aeth.kind={kind} aeth.msn={}",
            a.syndrome, a.msn
        );
    }
    if let Some(orig) = r.atomic_ack {
        let _ = write!(s, " atomic_ack.orig={orig:#x}");
    }
    if let Some(x) = r.probe {
        let _ = write!(
            s,
            " probe.id={} probe.snd_psn={} probe.ts_ns={}",
            x.probe_id,
            x.snd_psn & 0x00ff_ffff,
            x.sender_ts_ns
        );
    }
    if let Some(x) = r.notify {
        let _ = write!(
            s,
            " notify.window={} notify.rate_mbps={} notify.seq={}",
            x.window_bytes, x.rate_mbps, x.seq
        );
    }
    if let Some(t) = &r.tlm {
        tlm(s, t);
    }
    if b.dest_qp == transport::wire::mad::GSI_QPN && r.deth.is_some() {
        mad(s, p.payload);
    }
}

/// A MAD to a QP1: its header, and a CM message's identifying fields.
fn mad(s: &mut String, m: &[u8]) {
    use transport::wire::cm::CmMsg;
    let Ok(h) = transport::wire::MadHeader::parse(m) else {
        return;
    };
    let _ = write!(
        s,
        " mad.class={:#04x} mad.version={} mad.method={:#04x} mad.status={:#06x} mad.tid={:#018x} mad.attr={:#06x}",
        h.mgmt_class, h.class_version, h.method, h.status, h.tid, h.attr_id
    );
    let Ok((_, msg)) = CmMsg::parse(m) else {
        return;
    };
    let _ = write!(s, " cm={}", msg.name());
    let _ = match &msg {
        CmMsg::Req(r) => write!(
            s,
            " cm.local_comm={:#x} cm.service={:#018x} cm.qpn={:#x} cm.psn={} cm.mtu={} cm.guid={:#018x}",
            r.local_comm_id, r.service_id, r.local_qpn, r.starting_psn, r.path_mtu, r.local_ca_guid
        ),
        CmMsg::Rep(r) => write!(
            s,
            " cm.local_comm={:#x} cm.remote_comm={:#x} cm.qpn={:#x} cm.psn={}",
            r.local_comm_id, r.remote_comm_id, r.local_qpn, r.starting_psn
        ),
        CmMsg::Rej(r) => write!(
            s,
            " cm.local_comm={:#x} cm.remote_comm={:#x} cm.reason={} cm.rejected={}",
            r.local_comm_id, r.remote_comm_id, r.reason, r.message_rejected
        ),
        CmMsg::Mra(r) => write!(
            s,
            " cm.local_comm={:#x} cm.remote_comm={:#x} cm.mraed={} cm.timeout={}",
            r.local_comm_id, r.remote_comm_id, r.message_mraed, r.service_timeout
        ),
        CmMsg::Rtu(r) => write!(
            s,
            " cm.local_comm={:#x} cm.remote_comm={:#x}",
            r.local_comm_id, r.remote_comm_id
        ),
        CmMsg::Dreq(r) => write!(
            s,
            " cm.local_comm={:#x} cm.remote_comm={:#x} cm.remote_qpn={:#x}",
            r.local_comm_id, r.remote_comm_id, r.remote_qpn
        ),
        CmMsg::Drep(r) => write!(
            s,
            " cm.local_comm={:#x} cm.remote_comm={:#x}",
            r.local_comm_id, r.remote_comm_id
        ),
        CmMsg::SidrReq(r) => write!(
            s,
            " cm.request={:#x} cm.service={:#018x}",
            r.request_id, r.service_id
        ),
        CmMsg::SidrRep(r) => write!(
            s,
            " cm.request={:#x} cm.status={} cm.qpn={:#x} cm.qkey={:#x}",
            r.request_id, r.status, r.qpn, r.qkey
        ),
    };
}

fn tlm(s: &mut String, t: &TlmRepr) {
    let _ = write!(
        s,
        " tlm.nhop={} tlm.maxhop={} tlm.echo={} tlm.path_id={:#06x}",
        t.nhop,
        t.maxhop,
        u8::from(t.echo),
        t.path_id
    );
    if t.compact {
        // 8-byte records: no switch or port id, 24-bit ns, 128 B units.
        s.push_str(" tlm.compact=1");
    }
    if t.subscribe {
        // The sender wants INT responses from congested switches.
        s.push_str(" tlm.subscribe=1");
    }
    if t.nflows {
        // path_id holds the receiver's flow count N.
        let _ = write!(s, " tlm.nflows=1 tlm.n={}", t.path_id);
    }
    if let Some(m) = t.mac {
        // AUTH: the feedback MAC after the slots.
        let _ = write!(s, " tlm.mac={m:#018x}");
    }
    // Under SOJOURN the qlen field holds the packet's sojourn time.
    let queue = if t.sojourn {
        s.push_str(" tlm.sojourn=1");
        "sojourn_ns"
    } else {
        "qlen"
    };
    for (i, h) in t.filled().iter().enumerate() {
        let HopRecord {
            ts_ns,
            tx_bytes,
            qlen,
            rate,
            switch_id,
            port_id,
        } = *h;
        let _ = write!(
            s,
            " hop{i}={{switch={switch_id},port={port_id},ts_ns={ts_ns},tx_bytes={tx_bytes},{queue}={qlen},rate_mbps={}}}",
            u32::from(rate) * 100
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::samples;
    use std::time::Duration;

    fn rec(data: Vec<u8>) -> Record {
        Record {
            timestamp: Duration::ZERO,
            orig_len: data.len() as u32,
            data,
        }
    }

    #[test]
    fn a_write_line_has_the_required_fields() {
        let s = &samples::standard()[6]; // RDMA_WRITE_FIRST
        let mut sum = Summary::default();
        let line = sum.decode(7, &rec(s.frame()));
        for tok in [
            "#7 ",
            " op=RDMA_WRITE_FIRST ",
            &format!(" qpn={} ", samples::QPN_B),
            " psn=106 ",
            " icrc=ok ",
            " reth.va=0x7f3a00001000 ",
            " reth.rkey=0x1a2b ",
            &format!(" reth.len={}", 3 * samples::PMTU - 5),
        ] {
            assert!(line.contains(tok), "{tok:?} missing from {line}");
        }
        assert_eq!(
            sum,
            Summary {
                frames: 1,
                roce: 1,
                icrc_bad: 0,
                other: 0,
                errors: 0
            }
        );
    }

    #[test]
    fn a_cm_mad_to_qp1_is_decoded_with_its_message() {
        use transport::wire::cm::{self, CmMsg};
        use transport::wire::{DethRepr, Opcode, PacketRepr, Service};
        let rej = cm::Rej {
            local_comm_id: 0x11,
            remote_comm_id: 0x22,
            message_rejected: cm::msg::REQ,
            ari_length: 0,
            reason: cm::rej::INVALID_SERVICE_ID,
            ari: [0; cm::REJ_ARI],
            private_data: [0; cm::REJ_PRIVATE],
        };
        let mad = CmMsg::Rej(Box::new(rej)).emit(0x0000_0001_0000_0005);
        let mut r = PacketRepr::new(Opcode::SendOnly, 1, 0);
        r.bth.service = Service::Ud;
        r.deth = Some(DethRepr {
            q_key: 0x8001_0000,
            src_qp: 1,
        });
        let mut f = vec![0u8; r.frame_len(mad.len())];
        r.emit(&mad, &mut f).unwrap();
        let line = Summary::default().decode(1, &rec(f));
        for tok in [
            " op=UD_SEND_ONLY ",
            " mad.class=0x07 ",
            " mad.tid=0x0000000100000005 ",
            " cm=REJ ",
            " cm.remote_comm=0x22 ",
            " cm.reason=8 ",
        ] {
            assert!(line.contains(tok), "{tok:?} missing from {line}");
        }
    }

    #[test]
    fn a_tagged_frame_is_roce_with_its_vlan_and_priority() {
        let mut s = samples::standard().swap_remove(6);
        s.repr.eth.vlan = Some(transport::wire::VlanTag {
            pcp: 3,
            dei: false,
            vid: 100,
        });
        let mut sum = Summary::default();
        let line = sum.decode(1, &rec(s.frame()));
        assert!(line.contains(" icrc=ok "), "{line}");
        assert!(line.contains(" vlan=100 pcp=3"), "{line}");
        assert_eq!(sum.roce, 1);
    }

    #[test]
    fn telemetry_hops_are_listed() {
        let all = samples::telemetry();
        let s = all
            .iter()
            .find(|s| s.repr.bth.opcode == transport::wire::Opcode::TlmResponse)
            .expect("a TLM_RESPONSE sample, 3 hops");
        let line = Summary::default().decode(1, &rec(s.frame()));
        assert!(line.contains(" op=TLM_RESPONSE "), "{line}");
        assert!(
            line.contains(" tlm.nhop=3 tlm.maxhop=4 tlm.echo=1 "),
            "{line}"
        );
        assert!(line.contains(" hop2={switch=3,port=3,"), "{line}");
        assert!(line.contains(" probe.id=42 probe.snd_psn=300 "), "{line}");
    }

    #[test]
    fn bad_frames_say_why_and_are_counted() {
        let mut sum = Summary::default();
        let mut f = samples::standard()[0].frame();
        let last = f.len() - 1;
        f[last] ^= 1;
        let line = sum.decode(1, &rec(f.clone()));
        assert!(line.contains(" icrc=bad "), "{line}");
        let line = sum.decode(2, &rec(f[..30].to_vec()));
        assert!(line.contains(" op=? error=truncated "), "{line}");
        let line = sum.decode(3, &rec(vec![0xff; 60]));
        assert!(
            line.contains(" op=? error=not_ipv4 reason=\"not IPv4: ethertype 0xffff\""),
            "{line}"
        );
        let line = sum.decode(4, &rec(vec![]));
        assert!(line.contains("error=truncated"), "{line}");
        assert_eq!(
            sum.to_string(),
            "frames=4 roce=1 icrc_bad=1 other=1 errors=2"
        );
    }
}
