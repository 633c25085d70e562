//! Two engines joined by a wire stepped in virtual time, with a hook that
//! may drop, duplicate or rewrite each frame (quinn-proto's `Pair`).

#![allow(dead_code)]

use std::collections::VecDeque;
use std::net::Ipv4Addr;

use transport::mr::{Access, MrKeys, VecMemory};
use transport::rc::{
    Cqe, Engine, EngineConfig, PathMtu, QpAccess, Qpn, RtrAttr, RtsAttr, SendWr, WrOp,
};
use transport::wire::{
    AethRepr, HopRecord, Ipv4Packet, MacAddr, Opcode, Packet, PacketRepr, RethRepr, Tlm,
};

pub const MAC_A: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);
pub const MAC_B: MacAddr = MacAddr([2, 0, 0, 0, 0, 2]);
pub const IP_A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
pub const IP_B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
/// One-way delay of the wire.
pub const DELAY_NS: u64 = 1_000;
/// Each engine has one region of this size at this VA.
pub const MR_BASE: u64 = 0x10_0000;
pub const MR_LEN: usize = 16 << 20;

/// Where a frame goes: from A to B or from B to A.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    AtoB,
    BtoA,
}

/// What the wire does with a frame.
pub enum Fate {
    Deliver,
    Drop,
    Duplicate,
    /// Flip bit 0 of the byte at this offset.
    Corrupt(usize),
    /// Deliver after a switch pushed this hop record into the TLM block.
    PushHop(HopRecord),
    /// Deliver with ECN set to CE, as a congested switch marks it.
    MarkCe,
}

/// Decides the fate of each frame: direction, parsed frame, frame number.
pub type Hook = Box<dyn FnMut(Dir, &Packet<'_>, usize) -> Fate>;

/// A wire that loses every frame going `lost` and delivers the rest.
pub fn cut(lost: Dir) -> Hook {
    Box::new(move |dir, _, _| {
        if dir == lost {
            Fate::Drop
        } else {
            Fate::Deliver
        }
    })
}

pub struct Side {
    pub engine: Engine<VecMemory>,
    pub qpn: Qpn,
    pub mr: MrKeys,
}

pub struct Pair {
    pub a: Side,
    pub b: Side,
    pub now: u64,
    /// (arrival time, direction, frame)
    pub in_flight: VecDeque<(u64, Dir, Vec<u8>)>,
    /// Frames seen on the wire, for inspection.
    pub log: Vec<(Dir, Vec<u8>)>,
    pub hook: Hook,
    pub frames_sent: usize,
}

pub struct Setup {
    pub mtu: PathMtu,
    pub psn_a: u32,
    pub psn_b: u32,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub access_b: QpAccess,
    pub cfg: fn(MacAddr, Ipv4Addr) -> EngineConfig,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            mtu: PathMtu::Mtu1024,
            psn_a: 100,
            psn_b: 5000,
            timeout: 8, // 1 ms
            retry_cnt: 7,
            access_b: QpAccess {
                remote_write: true,
                remote_read: true,
            },
            cfg: |mac, ip| EngineConfig::new(mac, ip, 100_000_000_000),
        }
    }
}

fn side(mac: MacAddr, ip: Ipv4Addr, s: &Setup) -> Side {
    let mut mem = VecMemory::new();
    mem.add(MR_BASE, MR_LEN);
    let mut engine = Engine::new((s.cfg)(mac, ip), mem, 0);
    let mr = engine
        .register_mr(MR_BASE, MR_LEN as u64, Access::ALL)
        .unwrap();
    let qpn = engine.create_qp(1024, 0).unwrap();
    Side { engine, qpn, mr }
}

impl Pair {
    pub fn new(s: Setup) -> Pair {
        let mut a = side(MAC_A, IP_A, &s);
        let mut b = side(MAC_B, IP_B, &s);
        let rtr = |qpn, mac, ip, psn| RtrAttr {
            path_mtu: s.mtu,
            dest_qpn: qpn,
            dest_mac: mac,
            dest_ip: ip,
            rq_psn: psn,
            max_dest_rd_atomic: 16,
        };
        let rts = |psn| RtsAttr {
            sq_psn: psn,
            timeout: s.timeout,
            retry_cnt: s.retry_cnt,
            rnr_retry: 7,
            max_rd_atomic: 16,
        };
        let all = QpAccess {
            remote_write: true,
            remote_read: true,
        };
        a.engine
            .connect(a.qpn, all, rtr(b.qpn, MAC_B, IP_B, s.psn_b), rts(s.psn_a))
            .unwrap();
        b.engine
            .connect(
                b.qpn,
                s.access_b,
                rtr(a.qpn, MAC_A, IP_A, s.psn_a),
                rts(s.psn_b),
            )
            .unwrap();
        Pair {
            a,
            b,
            now: 0,
            in_flight: VecDeque::new(),
            log: Vec::new(),
            hook: Box::new(|_, _, _| Fate::Deliver),
            frames_sent: 0,
        }
    }

    /// A WRITE (or READ) from A's region at `local` to B's at `remote`.
    pub fn wr(&self, wr_id: u64, op: WrOp, local: u64, remote: u64, len: u32) -> SendWr {
        SendWr {
            wr_id,
            op,
            lkey: self.a.mr.lkey,
            local_va: MR_BASE + local,
            len,
            rkey: self.b.mr.rkey,
            remote_va: MR_BASE + remote,
            signaled: true,
        }
    }

    pub fn post(&mut self, wr: SendWr) {
        let now = self.now;
        self.a.engine.post_send(self.a.qpn, wr, now).unwrap();
    }

    fn transmit(&mut self) {
        let mut buf = vec![0u8; 9000];
        for dir in [Dir::AtoB, Dir::BtoA] {
            loop {
                let e = match dir {
                    Dir::AtoB => &mut self.a.engine,
                    Dir::BtoA => &mut self.b.engine,
                };
                let Some(n) = e.poll_transmit(self.now, &mut buf) else {
                    break;
                };
                let frame = buf[..n].to_vec();
                let p = Packet::parse(&frame).expect("engines emit valid frames");
                let idx = self.frames_sent;
                self.frames_sent += 1;
                let fate = (self.hook)(dir, &p, idx);
                self.log.push((dir, frame.clone()));
                match fate {
                    Fate::Deliver => self.in_flight.push_back((self.now + DELAY_NS, dir, frame)),
                    Fate::Drop => {}
                    Fate::Duplicate => {
                        self.in_flight
                            .push_back((self.now + DELAY_NS, dir, frame.clone()));
                        self.in_flight
                            .push_back((self.now + DELAY_NS + 10, dir, frame));
                    }
                    Fate::Corrupt(at) => {
                        let mut f = frame;
                        f[at] ^= 1;
                        self.in_flight.push_back((self.now + DELAY_NS, dir, f));
                    }
                    Fate::PushHop(hop) => {
                        let mut f = frame;
                        if let Ok(mut t) = Tlm::new_checked(&mut f[54..]) {
                            t.push_hop(&hop);
                        }
                        self.in_flight.push_back((self.now + DELAY_NS, dir, f));
                    }
                    Fate::MarkCe => {
                        let mut f = frame;
                        let mut ip = Ipv4Packet::new_checked(&mut f[14..]).unwrap();
                        ip.set_ecn(3);
                        ip.fill_checksum();
                        self.in_flight.push_back((self.now + DELAY_NS, dir, f));
                    }
                }
            }
        }
    }

    /// Advances to the next event (arrival, timer or pacing); false when
    /// nothing is left to happen before `limit`.
    pub fn step(&mut self, limit: u64) -> bool {
        self.transmit();
        let next_arrival = self.in_flight.iter().map(|f| f.0).min();
        let next_timer = [self.a.engine.poll_timeout(), self.b.engine.poll_timeout()]
            .into_iter()
            .flatten()
            .min();
        let Some(t) = [next_arrival, next_timer].into_iter().flatten().min() else {
            return false;
        };
        if t > limit {
            return false;
        }
        self.now = self.now.max(t);
        let now = self.now;
        let mut i = 0;
        while i < self.in_flight.len() {
            if self.in_flight[i].0 <= now {
                let (_, dir, f) = self.in_flight.remove(i).unwrap();
                match dir {
                    Dir::AtoB => self.b.engine.handle_packet(now, &f),
                    Dir::BtoA => self.a.engine.handle_packet(now, &f),
                }
            } else {
                i += 1;
            }
        }
        self.a.engine.handle_timeout(now);
        self.b.engine.handle_timeout(now);
        true
    }

    /// Runs until nothing is pending or `limit` ns of virtual time pass.
    pub fn run(&mut self, limit: u64) {
        let end = self.now + limit;
        while self.step(end) {}
    }

    pub fn completions_a(&mut self) -> Vec<Cqe> {
        std::iter::from_fn(|| self.a.engine.poll_completion()).collect()
    }

    pub fn fill_a(&mut self, off: u64, len: usize, seed: u8) {
        let s = self.a.engine.mem_mut().slice_mut(MR_BASE + off, len);
        for (i, b) in s.iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(7) ^ seed;
        }
    }

    pub fn fill_b(&mut self, off: u64, len: usize, seed: u8) {
        let s = self.b.engine.mem_mut().slice_mut(MR_BASE + off, len);
        for (i, b) in s.iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(13) ^ seed;
        }
    }

    pub fn a_bytes(&self, off: u64, len: usize) -> Vec<u8> {
        self.a.engine.mem().slice(MR_BASE + off, len).to_vec()
    }

    pub fn b_bytes(&self, off: u64, len: usize) -> Vec<u8> {
        self.b.engine.mem().slice(MR_BASE + off, len).to_vec()
    }

    /// A frame from A's QP to B's QP, as A would send it.
    pub fn frame_to_b(
        &self,
        op: Opcode,
        psn: u32,
        ack_req: bool,
        reth: Option<RethRepr>,
        payload: &[u8],
    ) -> Vec<u8> {
        let mut r = PacketRepr::new(op, self.b.qpn, psn);
        r.eth.src = MAC_A;
        r.eth.dst = MAC_B;
        r.ip.src = IP_A;
        r.ip.dst = IP_B;
        r.bth.ack_req = ack_req;
        r.reth = reth;
        let mut buf = vec![0u8; r.frame_len(payload.len())];
        let n = r.emit(payload, &mut buf).unwrap();
        buf.truncate(n);
        buf
    }

    /// A frame from B's QP to A's QP.
    pub fn frame_to_a(&self, op: Opcode, psn: u32, aeth: Option<AethRepr>) -> Vec<u8> {
        let mut r = PacketRepr::new(op, self.a.qpn, psn);
        r.eth.src = MAC_B;
        r.eth.dst = MAC_A;
        r.ip.src = IP_B;
        r.ip.dst = IP_A;
        r.aeth = aeth;
        let mut buf = vec![0u8; r.frame_len(0)];
        r.emit(&[], &mut buf).unwrap();
        buf
    }

    /// Every frame B wants to send now, parsed to (opcode, PSN, AETH).
    pub fn drain_b(&mut self) -> Vec<(Opcode, u32, Option<AethRepr>)> {
        let mut out = vec![];
        let mut buf = vec![0u8; 9000];
        while let Some(n) = self.b.engine.poll_transmit(self.now, &mut buf) {
            let p = Packet::parse(&buf[..n]).unwrap();
            out.push((p.repr.bth.opcode, p.repr.bth.psn, p.repr.aeth));
        }
        out
    }

    /// Frames logged in one direction, parsed by `f`.
    pub fn logged<T>(&self, dir: Dir, f: impl Fn(&Packet<'_>) -> T) -> Vec<T> {
        self.log
            .iter()
            .filter(|(d, _)| *d == dir)
            .map(|(_, fr)| f(&Packet::parse(fr).unwrap()))
            .collect()
    }

    /// Opcodes of the frames logged in one direction.
    pub fn ops(&self, dir: Dir) -> Vec<Opcode> {
        self.log
            .iter()
            .filter(|(d, _)| *d == dir)
            .map(|(_, f)| Packet::parse(f).unwrap().repr.bth.opcode)
            .collect()
    }
}
