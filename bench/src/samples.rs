//! Example frames: one of every opcode of wire.md, between two hosts of the
//! loopback testbed, with realistic headers (used by `bench demo` and the
//! tshark conformance test).

use std::net::Ipv4Addr;

use transport::wire::{
    AethRepr, AtomicEthRepr, EthernetRepr, HopRecord, MacAddr, NotifyRepr, Opcode, PacketRepr,
    ProbeRepr, RethRepr, TlmRepr,
};

/// Host A (requester) and host B (responder).
pub const MAC_A: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0x01]);
pub const MAC_B: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0x02]);
pub const IP_A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
pub const IP_B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
pub const QPN_A: u32 = 0x11;
pub const QPN_B: u32 = 0x000d_0022;
/// Path MTU of the examples.
pub const PMTU: usize = 1024;

/// A frame to emit: headers and payload.
#[derive(Debug, Clone)]
pub struct Sample {
    pub repr: PacketRepr,
    pub payload: Vec<u8>,
}

impl Sample {
    /// The frame's bytes.
    pub fn frame(&self) -> Vec<u8> {
        let mut buf = vec![0u8; self.repr.frame_len(self.payload.len())];
        let n = self
            .repr
            .emit(&self.payload, &mut buf)
            .expect("sample headers match their opcode");
        buf.truncate(n);
        buf
    }
}

fn payload(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

/// A packet from A to B (`to_b`) or from B to A.
fn packet(op: Opcode, to_b: bool, psn: u32) -> PacketRepr {
    let mut r = PacketRepr::new(op, if to_b { QPN_B } else { QPN_A }, psn);
    let (src, dst, sip, dip) = if to_b {
        (MAC_A, MAC_B, IP_A, IP_B)
    } else {
        (MAC_B, MAC_A, IP_B, IP_A)
    };
    r.eth = EthernetRepr {
        src,
        dst,
        vlan: None,
    };
    r.ip.src = sip;
    r.ip.dst = dip;
    r.ip.ecn = 2; // ECT(0), so switches can mark CE
    r.ip.ident = psn as u16;
    r
}

fn reth(va: u64, len: usize) -> Option<RethRepr> {
    Some(RethRepr {
        va,
        r_key: 0x0000_1a2b,
        dma_len: len as u32,
    })
}

fn aeth(syndrome: u8, msn: u32) -> Option<AethRepr> {
    Some(AethRepr { syndrome, msn })
}

fn stack(nhop: u8, maxhop: u8, echo: bool) -> TlmRepr {
    let mut t = TlmRepr::empty(maxhop);
    t.echo = echo;
    for i in 0..nhop {
        let h = HopRecord {
            ts_ns: 1_000_000 + 850 * u32::from(i),
            tx_bytes: 0xfff0_0000 + 4096 * u32::from(i),
            qlen: 12_000 - 4_000 * u32::from(i),
            rate: 250, // 25 Gb/s
            switch_id: 1 + i,
            port_id: 3,
        };
        t.hops[usize::from(i)] = h;
        t.path_id ^= u16::from(h.switch_id);
    }
    t.nhop = nhop;
    t
}

/// One frame of each standard IBA opcode (SEND, WRITE, READ, ACK, CNP,
/// atomics, SEND with invalidate).
pub fn standard() -> Vec<Sample> {
    use Opcode::*;
    let va = 0x7f3a_0000_1000;
    let mut v = Vec::new();
    let mut add = |repr: PacketRepr, len: usize| {
        let seed = repr.bth.psn as u8;
        v.push(Sample {
            repr,
            payload: payload(len, seed),
        });
    };
    let data = |op, psn, ack_req| {
        let mut r = packet(op, true, psn);
        r.bth.ack_req = ack_req;
        r
    };

    add(data(SendFirst, 100, false), PMTU);
    add(data(SendMiddle, 101, false), PMTU);
    add(data(SendLast, 102, true), 300);
    add(data(SendOnly, 103, true), 64);
    add(
        PacketRepr {
            imm: Some(0x1234_5678),
            ..data(SendLastWithImmediate, 104, true)
        },
        17,
    );
    add(
        PacketRepr {
            imm: Some(0x0bad_cafe),
            ..data(SendOnlyWithImmediate, 105, true)
        },
        1,
    );
    add(
        PacketRepr {
            reth: reth(va, 3 * PMTU - 5),
            ..data(RdmaWriteFirst, 106, false)
        },
        PMTU,
    );
    add(data(RdmaWriteMiddle, 107, false), PMTU);
    add(data(RdmaWriteLast, 108, true), PMTU - 5);
    add(
        PacketRepr {
            reth: reth(va + 0x10000, 0),
            ..data(RdmaWriteOnly, 109, true)
        },
        0,
    );
    add(
        PacketRepr {
            imm: Some(7),
            ..data(RdmaWriteLastWithImmediate, 110, true)
        },
        5,
    );
    add(
        PacketRepr {
            reth: reth(va + 0x20000, 200),
            imm: Some(0xffff_ffff),
            ..data(RdmaWriteOnlyWithImmediate, 111, true)
        },
        200,
    );
    add(
        PacketRepr {
            reth: reth(va + 0x30000, 2 * PMTU + 1),
            ..data(RdmaReadRequest, 112, true)
        },
        0,
    );
    let resp = |op, psn, syndrome, msn| PacketRepr {
        aeth: aeth(syndrome, msn),
        ..packet(op, false, psn)
    };
    add(resp(RdmaReadResponseFirst, 112, 0x1f, 9), PMTU);
    add(packet(RdmaReadResponseMiddle, false, 113), PMTU);
    add(resp(RdmaReadResponseLast, 114, 0x1f, 10), 1);
    add(resp(RdmaReadResponseOnly, 115, 0x1f, 11), 512);
    add(resp(Acknowledge, 111, 0x1f, 8), 0);
    add(resp(Acknowledge, 120, 0x60, 12), 0); // NAK: PSN sequence error
    add(resp(Acknowledge, 121, 0x62, 12), 0); // NAK: remote access error
    let mut cnp = packet(Cnp, false, 0);
    cnp.bth.becn = true;
    add(cnp, 0);
    let atomic = |swap_add, compare| {
        Some(AtomicEthRepr {
            va: va + 0x40000,
            r_key: 0x0000_1a2b,
            swap_add,
            compare,
        })
    };
    add(
        PacketRepr {
            atomic: atomic(0x0102_0304_0506_0708, 0x1111),
            ..data(CompareSwap, 122, true)
        },
        0,
    );
    add(
        PacketRepr {
            atomic: atomic(5, 0),
            ..data(FetchAdd, 123, true)
        },
        0,
    );
    add(
        PacketRepr {
            atomic_ack: Some(0x1111),
            ..resp(AtomicAcknowledge, 122, 0x1f, 13)
        },
        0,
    );
    add(
        PacketRepr {
            ieth: Some(0x0000_1a2b),
            ..data(SendLastWithInvalidate, 124, true)
        },
        33,
    );
    add(
        PacketRepr {
            ieth: Some(0x0000_3c4d),
            ..data(SendOnlyWithInvalidate, 125, true)
        },
        8,
    );
    v
}

/// Frames that carry this project's telemetry: inband data and ACK, and the
/// three telemetry opcodes.
pub fn telemetry() -> Vec<Sample> {
    use Opcode::*;
    let probe = ProbeRepr {
        probe_id: 42,
        snd_psn: 300,
        sender_ts_ns: 5_000_000_123,
    };
    let mut write = packet(RdmaWriteOnly, true, 200);
    write.bth.ack_req = true;
    write.reth = reth(0x7f3a_0004_0000, 256);
    write.tlm = Some(stack(2, 4, false));
    let mut ack = packet(Acknowledge, false, 200);
    ack.aeth = aeth(0x1f, 13);
    // A receiver behind a congested last hop reports N = 37 flows.
    let mut counted = stack(2, 4, true);
    counted.nflows = true;
    counted.path_id = 37;
    ack.tlm = Some(counted);
    let mut req = packet(TlmRequest, true, 0);
    req.tlm = Some(stack(1, 4, false));
    req.probe = Some(probe);
    let mut resp = packet(TlmResponse, false, 0);
    resp.tlm = Some(stack(3, 4, true));
    resp.probe = Some(probe);
    let mut notify = packet(CcNotify, false, 0);
    notify.tlm = Some(stack(2, 2, true));
    notify.notify = Some(NotifyRepr {
        window_bytes: 31_250,
        rate_mbps: 23_750,
        seq: 6,
    });
    // A data packet with compact hop records that subscribes to INT
    // responses, and a switch's response to it.
    let mut subscribed = packet(RdmaWriteOnly, true, 210);
    subscribed.reth = reth(0x7f3a_0005_0000, 128);
    let mut compact = TlmRepr::empty_compact(4);
    compact.subscribe = true;
    compact.nhop = 1;
    compact.hops[0] = HopRecord {
        ts_ns: 123_456,
        tx_bytes: 128 * 1000,
        qlen: 128 * 300,
        rate: 1000,
        switch_id: 0,
        port_id: 0,
    };
    subscribed.tlm = Some(compact);
    let congested = HopRecord {
        ts_ns: 124_000,
        tx_bytes: 128 * 2000,
        qlen: 128 * 400,
        rate: 1000,
        switch_id: 0,
        port_id: 0,
    };
    // A data packet whose compact stack asks for sojourn times (16 ns
    // units in the qlen field): 4 us at the first hop, 1 us at the second.
    let mut timed = packet(RdmaWriteOnly, true, 220);
    timed.reth = reth(0x7f3a_0006_0000, 64);
    let mut sojourn = TlmRepr::empty_compact(3);
    sojourn.sojourn = true;
    sojourn.nhop = 2;
    for (i, ns) in [4_000, 1_008].into_iter().enumerate() {
        sojourn.hops[i] = HopRecord {
            ts_ns: 200_000 + 1_000 * i as u32,
            tx_bytes: 128 * (5000 + i as u32),
            qlen: ns,
            rate: 1000,
            switch_id: 0,
            port_id: 0,
        };
    }
    timed.tlm = Some(sojourn);
    // An ACK of a keyed connection: its echoed stack ends with the MAC.
    let mut keyed_ack = packet(Acknowledge, false, 220);
    keyed_ack.aeth = aeth(0x1f, 14);
    let mut echoed = stack(2, 4, true);
    echoed.mac = Some(transport::rc::auth::ack_mac(
        &transport::rc::auth::FeedbackKey([0x42; 16]),
        transport::rc::auth::AckId {
            dest_qp: keyed_ack.bth.dest_qp,
            psn: 220,
            syndrome: 0x1f,
            msn: 14,
        },
        &echoed,
    ));
    keyed_ack.tlm = Some(echoed);
    let data = Sample {
        payload: payload(128, 2),
        repr: subscribed,
    };
    let mut out = vec![0u8; 256];
    let n = transport::wire::emit_int_response(&data.frame(), &congested, &mut out)
        .expect("the sample subscribes and has a free slot");
    let int_response = transport::wire::Packet::parse(&out[..n])
        .expect("an INT response parses")
        .repr;
    vec![
        Sample {
            payload: payload(256, 1),
            repr: write,
        },
        data,
        Sample {
            repr: int_response,
            payload: vec![],
        },
        Sample {
            payload: payload(64, 3),
            repr: timed,
        },
        Sample {
            repr: keyed_ack,
            payload: vec![],
        },
        Sample {
            repr: ack,
            payload: vec![],
        },
        Sample {
            repr: req,
            payload: vec![],
        },
        Sample {
            repr: resp,
            payload: vec![],
        },
        Sample {
            repr: notify,
            payload: vec![],
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use transport::wire::Packet;

    #[test]
    fn every_opcode_has_a_sample_that_parses() {
        let all: Vec<Sample> = standard().into_iter().chain(telemetry()).collect();
        for op in Opcode::ALL {
            assert!(
                all.iter().any(|s| s.repr.bth.opcode == op),
                "no sample of {op}"
            );
        }
        for s in &all {
            let f = s.frame();
            let p = Packet::parse(&f).unwrap();
            assert_eq!(p.repr, s.repr);
            assert_eq!(p.payload, &s.payload[..]);
        }
        assert!(standard().iter().all(|s| s.repr.bth.opcode.is_standard()));
    }
}
