//! Fuzz the connection manager: two CMs run a sequence of the consumer's
//! calls (listen, connect, accept, reject, establish, disconnect, destroy,
//! SIDR's resolve and reply) chosen by the input, their MADs crossing a
//! wire that the input drops,
//! duplicates and delays, with time stepping and MADs crafted from the
//! input (valid CM headers with arbitrary bodies, and real MADs with
//! bytes flipped) thrown in. Nothing may panic; every event names a
//! connection the CM announced; a connection ends at most once.
#![no_main]

use std::collections::HashSet;
use std::net::Ipv4Addr;

use libfuzzer_sys::fuzz_target;
use transport::cm::{AcceptParams, Cm, CmConfig, CmEvent, CommId, ConnectParams, Peer};
use transport::rc::{OutMad, ReceivedMad, GRH_LEN};
use transport::wire::cm::{self as wcm, PortSpace};
use transport::wire::MacAddr;

const IPS: [Ipv4Addr; 2] = [Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2)];

fn peer(i: usize) -> Peer {
    Peer {
        ip: IPS[i],
        mac: MacAddr([2, 0, 0, 0, 0, i as u8 + 1]),
    }
}

fn received(from: usize, mad: [u8; 256]) -> ReceivedMad {
    ReceivedMad {
        src_ip: IPS[from],
        src_mac: peer(from).mac,
        src_qpn: 1,
        pkey: 0xFFFF,
        grh: [0; GRH_LEN],
        mad,
    }
}

/// What each side's consumer knows: connections announced, ended.
#[derive(Default)]
struct Seen {
    live: HashSet<CommId>,
    ended: HashSet<CommId>,
}

impl Seen {
    fn take(&mut self, e: &CmEvent) {
        match e {
            CmEvent::ConnectRequest { id, .. } | CmEvent::SidrRequest { id, .. } => {
                self.live.insert(*id);
            }
            CmEvent::SidrReply { id, .. } => {
                self.live.remove(id);
            }
            CmEvent::Rejected { id, .. }
            | CmEvent::Unreachable { id }
            | CmEvent::TimewaitExit { id } => {
                assert!(
                    self.ended.insert(*id) || !self.live.contains(id),
                    "{e:?} twice"
                );
                self.live.remove(id);
            }
            CmEvent::RepReceived { .. }
            | CmEvent::Established { .. }
            | CmEvent::Disconnected { .. } => {}
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut it = data.iter().copied();
    let mut cms = [
        Cm::new(CmConfig::new(IPS[0], 1)),
        Cm::new(CmConfig::new(IPS[1], 2)),
    ];
    let service = wcm::service_id(PortSpace::Tcp, 1);
    let _ = cms[1].listen(service, 9);
    let mut wire: Vec<(usize, OutMad)> = Vec::new();
    let mut ids: [Vec<CommId>; 2] = [Vec::new(), Vec::new()];
    let mut seen = [Seen::default(), Seen::default()];
    let mut now = 0u64;
    while let Some(op) = it.next() {
        let side = usize::from(op >> 7);
        let arg = it.next().unwrap_or(0);
        let pick = |ids: &Vec<CommId>| ids.get(usize::from(arg) % ids.len().max(1)).copied();
        match op & 0x0f {
            0 => {
                let p = ConnectParams {
                    peer: peer(1 - side),
                    service_id: if arg & 1 == 0 {
                        service
                    } else {
                        u64::from(arg)
                    },
                    qpn: u32::from(arg % 4) + 0x10,
                    starting_psn: u32::from(arg) << 8,
                    path_mtu: 3,
                    responder_resources: arg,
                    initiator_depth: arg,
                    retry_count: arg,
                    rnr_retry_count: arg,
                    srq: arg & 2 != 0,
                    flow_control: true,
                    transport: 0,
                    traffic_class: 0,
                    flow_label: 0,
                    private_data: vec![arg; usize::from(arg) % 100],
                    telemetry: arg & 4 != 0,
                };
                if let Ok(id) = cms[side].connect(now, &p) {
                    ids[side].push(id);
                }
            }
            1 => {
                if let Some(id) = pick(&ids[side]) {
                    let a = AcceptParams {
                        qpn: 0x20 + u32::from(arg % 4),
                        starting_psn: 7,
                        responder_resources: 1,
                        initiator_depth: 1,
                        rnr_retry_count: 7,
                        srq: false,
                        flow_control: true,
                        private_data: vec![1; usize::from(arg) % 200],
                        telemetry: arg & 4 != 0,
                    };
                    let _ = cms[side].accept(now, id, &a);
                }
            }
            2 => {
                if let Some(id) = pick(&ids[side]) {
                    let _ = cms[side].reject(id, u16::from(arg), &[arg; 3]);
                }
            }
            3 => {
                if let Some(id) = pick(&ids[side]) {
                    let _ = cms[side].establish(id);
                }
            }
            4 => {
                if let Some(id) = pick(&ids[side]) {
                    let _ = cms[side].disconnect(now, id);
                }
            }
            5 => {
                if let Some(id) = pick(&ids[side]) {
                    cms[side].destroy(now, id);
                }
            }
            6 => now += u64::from(arg) * 50_000_000,
            7 => {
                // Deliver the wire: each MAD dropped, duplicated or passed
                // as the next input bytes say, in order or reversed.
                let mut batch = std::mem::take(&mut wire);
                if arg & 1 == 1 {
                    batch.reverse();
                }
                for (from, m) in batch {
                    let fate = it.next().unwrap_or(0) % 4;
                    let copies = match fate {
                        0 => 0,
                        1 => 2,
                        _ => 1,
                    };
                    for _ in 0..copies {
                        cms[1 - from].on_mad(now, &received(from, m.mad));
                    }
                }
            }
            8 => {
                // A crafted CM MAD: a valid header, bytes from the input.
                let mut mad = [0u8; 256];
                mad[..4].copy_from_slice(&[1, 0x07, 2, 0x03]);
                mad[16..18].copy_from_slice(&(0x10 + u16::from(arg % 12)).to_be_bytes());
                for b in mad[24..].iter_mut() {
                    *b = it.next().unwrap_or(0);
                }
                // Now and then naming a connection that exists.
                if let Some(id) = pick(&ids[1 - side]) {
                    if arg & 0x80 != 0 {
                        mad[28..32].copy_from_slice(&id.to_be_bytes());
                    }
                }
                cms[1 - side].on_mad(now, &received(side, mad));
            }
            9 => {
                // A real MAD in flight with a byte flipped.
                if let Some((from, m)) = wire.first() {
                    let mut mad = m.mad;
                    let at = usize::from(it.next().unwrap_or(0));
                    mad[at] ^= arg | 1;
                    let from = *from;
                    cms[1 - from].on_mad(now, &received(from, mad));
                }
            }
            10 => {
                let _ = cms[side].listen(u64::from(arg), 1);
            }
            11 => cms[side].unlisten(service),
            12 => {
                let svc = if arg & 1 == 0 {
                    service
                } else {
                    u64::from(arg)
                };
                if let Ok(id) =
                    cms[side].resolve(now, peer(1 - side), svc, &vec![arg; usize::from(arg)])
                {
                    ids[side].push(id);
                }
            }
            13 => {
                if let Some(id) = pick(&ids[side]) {
                    let _ = cms[side].sidr_reply(id, arg % 6, 0x30, 0x0123_4567, &[arg; 9]);
                }
            }
            _ => {}
        }
        for s in 0..2 {
            if cms[s].poll_timeout().is_some_and(|t| t <= now) {
                cms[s].on_timeout(now);
            }
            while let Some(m) = cms[s].poll_mad() {
                wire.push((s, m));
            }
            while let Some(e) = cms[s].poll_event() {
                if let CmEvent::ConnectRequest { id, .. } | CmEvent::SidrRequest { id, .. } = &e {
                    ids[s].push(*id);
                }
                seen[s].take(&e);
            }
            assert!(cms[s].len() <= 4096, "connections pile up");
        }
        // Bounded: a run of connects must not keep the wire growing.
        if wire.len() > 10_000 {
            wire.clear();
        }
    }
});
