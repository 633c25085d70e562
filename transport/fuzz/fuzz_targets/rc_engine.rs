//! Fuzz the RC engine with sequences of QP operations (posts, deliveries,
//! drops, time steps, QP errors, MR deregistration) and arbitrary packets
//! (raw bytes, and well-formed frames with fuzz-chosen headers, so that
//! they pass the ICRC and reach the QP logic). Nothing may panic, and every
//! work request completes at most once.
#![no_main]

use std::collections::{HashSet, VecDeque};
use std::net::Ipv4Addr;

use libfuzzer_sys::fuzz_target;
use transport::mr::{Access, VecMemory};
use transport::rc::{
    Engine, EngineConfig, PathMtu, QpAccess, RtrAttr, RtsAttr, SendWr, WrOp,
};
use transport::wire::{AethRepr, MacAddr, Opcode, PacketRepr, RethRepr};

const BASE: u64 = 0x1_0000;
const SIZE: usize = 1 << 16;

struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u8(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes([self.u8()?, self.u8()?, self.u8()?, self.u8()?]))
    }
    fn take(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        a
    }
}

fn engine(mac: MacAddr, ip: Ipv4Addr) -> Engine<VecMemory> {
    let mut mem = VecMemory::new();
    mem.add(BASE, SIZE);
    Engine::new(EngineConfig::new(mac, ip, 10_000_000_000), mem, 0)
}

fuzz_target!(|data: &[u8]| {
    let mut input = Bytes(data);
    let (ma, mb) = (MacAddr([2, 0, 0, 0, 0, 1]), MacAddr([2, 0, 0, 0, 0, 2]));
    let (ia, ib) = (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
    let mut e = [engine(ma, ia), engine(mb, ib)];
    let keys = [
        e[0].register_mr(BASE, SIZE as u64, Access::ALL).unwrap(),
        e[1].register_mr(BASE, SIZE as u64, Access::ALL).unwrap(),
    ];
    let q = [e[0].create_qp(8, 0).unwrap(), e[1].create_qp(8, 0).unwrap()];
    let mtu = [PathMtu::Mtu256, PathMtu::Mtu1024][usize::from(input.u8().unwrap_or(0) & 1)];
    for (i, (mac, ip)) in [(mb, ib), (ma, ia)].into_iter().enumerate() {
        e[i].modify_to_init(q[i], QpAccess { remote_write: true, remote_read: true }).unwrap();
        let rtr = RtrAttr {
            path_mtu: mtu,
            dest_qpn: q[1 - i],
            dest_mac: mac,
            dest_ip: ip,
            rq_psn: 0xFF_FFF0,
            max_dest_rd_atomic: 4,
        };
        e[i].modify_to_rtr(q[i], rtr).unwrap();
        let rts = RtsAttr { sq_psn: 0xFF_FFF0, timeout: 3, retry_cnt: 2, rnr_retry: 1, max_rd_atomic: 4 };
        e[i].modify_to_rts(q[i], rts).unwrap();
    }
    let mut wire: [VecDeque<Vec<u8>>; 2] = [VecDeque::new(), VecDeque::new()];
    let mut now = 0u64;
    let mut posted = HashSet::new();
    let mut completed = HashSet::new();
    let mut next_id = 0u64;
    let mut buf = vec![0u8; 9000];
    while let Some(op) = input.u8() {
        let side = usize::from(op >> 7);
        match op & 0x0f {
            0 | 1 => {
                let len = input.u32().unwrap_or(0) % 9000;
                let off = u64::from(input.u32().unwrap_or(0) % (SIZE as u32));
                let wr = SendWr {
                    wr_id: next_id,
                    op: if op & 1 == 0 { WrOp::Write } else { WrOp::Read },
                    lkey: keys[side].lkey ^ u32::from(op & 0x40 != 0),
                    local_va: BASE + off,
                    len,
                    rkey: keys[1 - side].rkey,
                    remote_va: BASE + u64::from(input.u32().unwrap_or(0) % (SIZE as u32)),
                    signaled: op & 0x20 == 0,
                };
                if e[side].post_send(q[side], wr, now).is_ok() {
                    posted.insert((side, next_id));
                }
                next_id += 1;
            }
            2 | 3 => {
                // Deliver (2) or drop (3) the oldest frame towards `side`.
                if let Some(f) = wire[side].pop_front() {
                    if op & 0x0f == 2 {
                        e[side].handle_packet(now, &f);
                    }
                }
            }
            4 => {
                let n = usize::from(input.u8().unwrap_or(0));
                let raw = input.take(n).to_vec();
                e[side].handle_packet(now, &raw);
            }
            5 => {
                // A well-formed frame with fuzz-chosen headers.
                let opcode = Opcode::ALL[usize::from(input.u8().unwrap_or(0)) % Opcode::ALL.len()];
                let psn = input.u32().unwrap_or(0);
                let mut r = PacketRepr::new(opcode, q[side], psn);
                let (smac, sip) = if side == 0 { (mb, ib) } else { (ma, ia) };
                r.eth.src = smac;
                r.ip.src = sip;
                r.bth.ack_req = psn & 1 == 1;
                let l = opcode.layout();
                if l.reth {
                    r.reth = Some(RethRepr {
                        va: BASE + u64::from(input.u32().unwrap_or(0) % (2 * SIZE as u32)),
                        r_key: if psn & 2 == 0 { keys[side].rkey } else { input.u32().unwrap_or(0) },
                        dma_len: input.u32().unwrap_or(0) % 20_000,
                    });
                }
                if l.aeth {
                    r.aeth = Some(AethRepr { syndrome: input.u8().unwrap_or(0), msn: psn >> 8 });
                }
                if l.immdt {
                    r.imm = Some(psn);
                }
                if l.probe {
                    r.probe = Some(Default::default());
                }
                if l.notify {
                    r.notify = Some(Default::default());
                }
                if l.tlm_required {
                    r.tlm = Some(transport::wire::TlmRepr::empty(2));
                }
                let n = if l.payload { usize::from(input.u8().unwrap_or(0)) * 8 } else { 0 };
                let payload = vec![0xA5u8; n];
                let mut f = vec![0u8; r.frame_len(n)];
                if r.emit(&payload, &mut f).is_ok() {
                    e[side].handle_packet(now, &f);
                }
            }
            6 => {
                now += u64::from(input.u32().unwrap_or(0) % 1_000_000);
                e[0].handle_timeout(now);
                e[1].handle_timeout(now);
            }
            7 => {
                let _ = e[side].modify_to_err(q[side]);
            }
            8 => {
                let _ = e[side].deregister_mr(keys[side].lkey);
            }
            _ => {
                // Transmit everything both sides want to send.
                for s in 0..2 {
                    let mut n = 0;
                    while let Some(len) = e[s].poll_transmit(now, &mut buf) {
                        wire[1 - s].push_back(buf[..len].to_vec());
                        n += 1;
                        if n > 10_000 {
                            break;
                        }
                    }
                }
            }
        }
        for s in 0..2 {
            let _ = e[s].poll_timeout();
            while let Some(c) = e[s].poll_completion() {
                assert!(posted.contains(&(s, c.wr_id)), "completion for a WR never posted");
                assert!(completed.insert((s, c.wr_id)), "WR {} completed twice", c.wr_id);
            }
        }
    }
});
